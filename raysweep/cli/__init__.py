"""The `raysweep` command; only it prints.

Commands by what the user is doing: running a campaign (`running`: run, resume; `profile`: an endpoint
that runs already, in one line; `jobs`: submit, jobs, stop; `crosscheck`), inspecting one (`status`; `inspecting`:
results, sla), analysing results (`analysing`: plot, pareto, report, import; `comparing`: compare; `exporting`:
export; `cataloguing`: catalog, history, site), checking a campaign file (`campaign_file`: schema, validate) and cluster
operations (`cluster`: preflight, tiny-model; `acceptance`: acceptance, checklist).

Exit codes: 0 everything done; 1 some points failed or the campaign stopped early; 2 bad input (nothing
was started); 3 Ray did not start or could not be joined (one message says what to try; nothing was run);
130 interrupted (finished points are kept; `raysweep resume` continues).

A face. May import: every room; every mode is imported (`raysweep.modes`) so that what it registers is
there.
"""

import raysweep.modes  # noqa: F401 - every mode registered (the report's sections)
from raysweep.cli import (  # noqa: F401  # noqa: F401  # noqa: F401
    acceptance,
    analysing,
    campaign_file,
    cataloguing,
    cluster,
    comparing,
    crosscheck,
    exporting,
    inspecting,
    jobs,
    kuberay,
    lab,
    profile,
    running,
    slurm,
    status,
    tuning,
)
from raysweep.cli._common import main

__all__ = ["main"]

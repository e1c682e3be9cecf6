"""What the faces plug into the stages. The optional modes of a campaign, each a package above the stages:
tuning (`tune`), SLA search (`sla`), load levels (`levels`), offline points (`offline`) and the winner's
confirmation (`confirm`). Importing this module imports every mode's package, which registers what the mode adds
to the stages (the report's sections, the run's parts in `raysweep.drive.hooks`, the estimate's in
`raysweep.plan.hooks`), and lends the run what it calls of the stages above it: live tracking
(`report.tracking`). The faces (`cli`, `api`) import it.
"""

from __future__ import annotations

from typing import Any

from raysweep import confirm, levels, offline, sla, tune
from raysweep.drive import hooks

__all__ = ["confirm", "levels", "offline", "sla", "tune"]


def _tracking() -> Any:
    from raysweep.report import tracking  # loads the exporters' code: only for a campaign with `tracking:`

    return tracking


hooks.register("tracking", _tracking)

"""What the faces plug into the stages. The optional modes of a campaign, each a package above the stages:
tuning (`tune`), SLA search (`sla`), load levels (`levels`) and offline points (`offline`). Importing this
module imports every mode's package, which registers what the mode adds to the stages (the report's sections,
the run's parts in `raysweep.drive.hooks`), and lends the run what it calls of the stages above it: live
tracking (`report.tracking`) and the winners `confirm:` runs again (`results.data.winner_pairs`). The faces
(`cli`, `api`) import it.
"""

from __future__ import annotations

from typing import Any

from raysweep import levels, offline, sla, tune
from raysweep.drive import hooks

__all__ = ["levels", "offline", "sla", "tune"]


def _tracking() -> Any:
    from raysweep.report import tracking  # loads the exporters' code: only for a campaign with `tracking:`

    return tracking


def _winners() -> Any:
    from raysweep.results.data import winner_pairs  # loads pandas and scipy: only for a campaign with `confirm:`

    return winner_pairs


hooks.register("tracking", _tracking)
hooks.register("winners", _winners)

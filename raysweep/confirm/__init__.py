"""The winner's confirmation (`confirm:`): after the sweep, each bench shape's leader and runner-up measured again
on fresh server starts, interleaved, and the headline's verdict taken from those runs, not from the selection.

Rooms: `runs` (the runs it adds after the sweep, recorded before they start so a resume confirms the same pairs;
what the dry run says of it), `estimate` (the pairs, what they cost, whether a campaign confirms its winner),
`winners` (the leaders and runners-up it re-runs, as the conclusions name them), `verdict` (the pure statistics:
the model of a measurement over the fresh starts alone) and `conclusions` (a shape's verdict from those runs).
The run reaches `runs` and the conclusions `conclusions.confirmed` through `raysweep.drive.hooks`, the estimate
`estimate.with_confirmation` through `raysweep.plan.hooks`, where this package lends them when it is imported.
The section's schema (`ConfirmSpec`) is the campaign's (`raysweep.maths.order`), its check `raysweep.campaign`'s.

A mode. May import: every stage and the stage-free rooms; never another mode.
"""

from __future__ import annotations

from typing import Any

from raysweep.drive import hooks
from raysweep.plan import hooks as plan_hooks


def _runs() -> Any:
    from raysweep.confirm import runs  # imports the run's parts: only when a campaign runs

    return runs


def _confirmed() -> Any:
    from raysweep.confirm.conclusions import confirmed  # loads pandas and scipy: only with confirmation runs

    return confirmed


def _with_confirmation() -> Any:
    from raysweep.confirm.estimate import with_confirmation

    return with_confirmation


hooks.register("confirmation", _runs)
hooks.register("confirmed", _confirmed)
plan_hooks.register("confirmation", _with_confirmation)

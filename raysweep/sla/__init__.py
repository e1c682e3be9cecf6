"""The SLA mode: targets, their judgment over runs, the search for the largest concurrency or request rate
that meets them (`sla.search`), its probes against a live server (`sla.probe`), and its bookkeeping in a running
campaign (`sla.book`: the searches still open, closed when their configuration is given up), the configs
ranked by their capacity for the conclusions (`sla.capacities`) and as the report shows them under its cards
(`sla.report`).

The run calls its searches and its bookkeeping, the conclusions and the report its capacities, through
`raysweep.drive.hooks`; the plan its probes' runs and its dry-run lines (`sla.plan`) through `raysweep.plan.hooks`:
this package lends them there when it is imported.

A mode. May import: every stage and the stage-free rooms; never another mode.
"""

from __future__ import annotations

from typing import Any

from raysweep.drive import hooks
from raysweep.plan import hooks as plan_hooks


def _searches() -> Any:
    from raysweep.sla.probe import SlaSearches  # imports the run's parts: only when a campaign runs

    return SlaSearches


def _book() -> Any:
    from raysweep.sla import book

    return book


def _capacities() -> Any:
    from raysweep.sla.capacities import capacities  # loads pandas: only for a campaign with SLA searches

    return capacities


def _plan() -> Any:
    from raysweep.sla import plan

    return plan


def _capacities_html() -> Any:
    from raysweep.sla.report import capacities_html

    return capacities_html


hooks.register("sla", _searches)
hooks.register("sla_book", _book)
hooks.register("sla_capacities", _capacities)
hooks.register("sla_capacities_html", _capacities_html)
plan_hooks.register("sla", _plan)

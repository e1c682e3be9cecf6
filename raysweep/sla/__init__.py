"""The SLA mode: targets, their judgment over runs, the search for the largest concurrency or request rate
that meets them (`sla.search`), its probes against a live server (`sla.probe`), and its bookkeeping in a running
campaign (`sla.book`: the searches still open, closed when their configuration is given up), and the configs
ranked by their capacity for the conclusions (`sla.capacities`). The report's SLA section is `report_section`,
registered with the report when this package is imported.

The run calls its searches and its bookkeeping, the conclusions its capacities, through `raysweep.drive.hooks`;
the plan its probes' runs and its dry-run lines (`sla.plan`) through `raysweep.plan.hooks`: this package lends
them there when it is imported.

A mode. May import: every stage and the stage-free rooms; never another mode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raysweep.drive import hooks
from raysweep.plan import hooks as plan_hooks
from raysweep.report.registry import Section, register

if TYPE_CHECKING:
    from raysweep.results.data import ReportData


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


def _sla_section(data: ReportData) -> str | None:
    from raysweep.sla.report_section import sla_section

    return sla_section(data)


register(Section("sla", "SLA", _sla_section, order=70))  # shown in every report: "no SLA search" without one
hooks.register("sla", _searches)
hooks.register("sla_book", _book)
hooks.register("sla_capacities", _capacities)
plan_hooks.register("sla", _plan)

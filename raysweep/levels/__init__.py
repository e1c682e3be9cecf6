"""The load-levels mode (`bench.workload`): serial, batch and levels in between, found from the server itself
as `vllm bench sweep serve_workload` finds them. The YAML schema and vLLM's rule for the levels are the
campaign's (`campaign.levels`).

The run decides the levels through `raysweep.drive.hooks`, where this package lends `levels.search` when it is
imported.

A mode. May import: every stage and the stage-free rooms; never another mode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raysweep.drive import hooks
from raysweep.report.registry import Section, register

if TYPE_CHECKING:
    from raysweep.results.data import ReportData


def _levels_section(data: ReportData) -> str | None:
    from raysweep.levels.search import report_section

    return report_section(data.directory)


def _search() -> Any:
    from raysweep.levels import search

    return search


register(Section("workload", "Load levels", _levels_section,
                 lambda d: bool((d.campaign.get("bench") or {}).get("workload")), order=80))
hooks.register("levels", _search)

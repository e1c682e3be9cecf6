"""The report's SLA section: every SLA search of the campaign, as the ledger recorded it (per server config,
bench point and target: its state, the largest load that met the target and the smallest that did not), read once
with the report's data (`raysweep.results.data.ReportData.sla`)."""

from __future__ import annotations

from raysweep.report.markup import frame_table, nothing
from raysweep.results.data import ReportData

__all__ = ["sla_section"]


def sla_section(data: ReportData) -> str:
    if data.sla.empty:
        return nothing("no SLA search in this campaign")
    return frame_table(data.sla, sortable=True)

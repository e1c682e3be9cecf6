"""What the report shows, read once from an output dir (the ledger's campaign, points, servers, events and
drivers, the records and their table, the SLA searches), and what more than one section derives from it: the
parameters that vary, and the conclusions, made once per report. The winner's confirmation (`confirm:`,
`raysweep.confirm`) reads its leaders and runners-up the same way (`answer_of`)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from raysweep.errors import UserError
from raysweep.ledger import PointRow, PointState, ServerRow
from raysweep.record.directory import CampaignDir
from raysweep.results import aggregate, conclusions
from raysweep.results.importer import read_sla
from raysweep.results.table import load_records, records_table

log = logging.getLogger(__name__)


@dataclass
class ReportData:
    """Everything the report shows, read once from the output dir."""

    directory: CampaignDir
    name: str
    campaign: dict[str, Any]
    points: list[PointRow]
    servers: list[ServerRow]
    out_of_plan: int
    df: pd.DataFrame
    sla: pd.DataFrame
    sla_variable: str
    records: list[dict[str, Any]]
    events: list[dict[str, Any]]   # the ledger's events and drivers (the report's Events section)
    drivers: list[dict[str, Any]]
    objective: str | None = None
    answer: conclusions.Conclusions | None = None  # made once, by `answer_of`


    @property
    def output_dir(self) -> Path:
        return self.directory.path


def read_data(directory: CampaignDir, objective: str | None = None) -> ReportData:
    ledger = directory.ledger
    campaign = ledger.stored_campaign()
    name = ledger.meta("name") or campaign.get("name", "")
    points, servers, extra = ledger.points(), ledger.servers(), ledger.out_of_plan()
    events, drivers = ledger.events(), ledger.drivers()
    sla, variable = read_sla(directory)
    records = load_records(directory)
    return ReportData(directory, name, campaign, points, servers, extra, records_table(records), sla, variable,
                      records, events, drivers, objective)


def param_names(points: list[PointRow], df: pd.DataFrame) -> tuple[list[str], list[str]]:
    """The serve and bench parameter names that take several values in the results."""
    def varying(names: Iterable[str]) -> list[str]:
        return [n for n in dict.fromkeys(names) if n in df.columns and df[n].astype(str).nunique() > 1]
    return (varying(k for p in points for k in p.serve_params), varying(k for p in points for k in p.bench_params))


def answer_of(data: ReportData) -> conclusions.Conclusions:
    """The conclusions of the report's results (made once per report)."""
    if data.answer is None:
        _, bench_vars = param_names(data.points, data.df)
        params = list(dict.fromkeys(k for p in data.points for k in (*p.serve_params, *p.bench_params)))
        # t-intervals over the runs (the raw-sample bootstrap of summary.csv would cost seconds per point)
        summary = aggregate.summarize(data.df, confidence=conclusions.CONFIDENCE, params=params)
        from raysweep.results.precision import precision_columns  # bench.precision: where each point stopped

        summary = precision_columns(data.directory, summary)
        slo = _slo(data.campaign)
        if slo is not None:
            summary = _with_pooled(data, summary, [t.metric for t in slo.thresholds])
        data.answer = conclusions.conclude(data.df, bench_vars, data.objective, data.sla, data.sla_variable,
                                           summary=summary, slo=slo, serve_params=[p.serve_params for p in data.points],
                                           failed_points=sum(p.in_plan and p.state == PointState.FAILED
                                                             for p in data.points))
    return data.answer


def _with_pooled(data: ReportData, summary: pd.DataFrame, metrics: list[str]) -> pd.DataFrame:
    """The summary with the pooled percentiles of the slo's metrics and their two-level bootstrap intervals
    from summary.parquet as the campaign's end wrote it (when it is current), so that a latency bound is
    judged on the pooled requests' percentile (`conclusions.slo_judgement`)."""
    from raysweep.results.table import kept_summary

    try:
        kept = kept_summary(data.directory, conclusions.CONFIDENCE)
    except (OSError, ValueError) as exc:
        log.info("summary.parquet not read for the slo's pooled percentiles (%s)", exc)
        return summary
    cols = [f"{m}_{k}" for m in metrics for k in ("pooled", "pooled_ci_low", "pooled_ci_high")]
    cols = [c for c in cols if kept is not None and c in kept.columns and c not in summary.columns]
    if kept is None or not cols or not {"serve_id", "bench_id"} <= set(summary.columns):
        return summary
    out = summary.merge(kept[["serve_id", "bench_id", *cols]], on=["serve_id", "bench_id"], how="left")
    out.attrs.update(summary.attrs)
    return out


def _slo(campaign: dict[str, Any]) -> Any:
    """The campaign's service-level objective (`slo:`), None without one or when it no longer parses."""
    from raysweep.campaign.slo import parse_slo

    raw = campaign.get("slo") if isinstance(campaign, dict) else None
    if not raw:
        return None
    try:
        return parse_slo(raw)
    except UserError as exc:
        log.warning("the campaign's slo is not used: %s", exc)
        return None

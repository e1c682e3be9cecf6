"""The HTML report of a raysweep output dir: one self-contained file (figures embedded, no network).

It leads with the answer and ends with the record. In order (`SECTIONS`):
- Conclusions (`raysweep.conclusions`): per bench shape, the best configuration for the objective (default
  output tokens/s per GPU) and the load it reaches it at, its lead over the best other configuration and
  whether that lead exceeds the noise (95% confidence intervals over the runs overlap or not), the ranking
  of the configurations, the Pareto front of the point means; the SLA capacities when the campaign searched
  for them; the points too noisy to trust and how many runs would tighten them.
- Warnings: the runs that fail a check of their validity record (client-limited, niced, shared CPUs,
  throttled, transport, ..., see `raysweep.validity`).
- Figures: latency against throughput per server config, the main metrics and the server-side metrics
  against the load, the Pareto front, SLA bars.
- The results table (sortable by a small inline script), the SLA table, the transport per server config,
  the failures with their log tails.
- The campaign as stored in the ledger, the plan (points by state, per server config), and the
  environment: the provenance each server recorded when it started (versions, GPUs and driver, model path
  and revision, hosts) and the nodes; never what is installed where the report is made.
Flagged runs carry a mark in the results table and a red cross in the figures. A figure or a section that
cannot be made costs only itself: its place says why. Other modules add sections with one entry in
`SECTIONS`: `Section(id, title, "package.module:function")`, the function taking the output dir and
returning the section's HTML (without its heading), or None to leave it out.

Its parts: `report_data` (what the report shows, read once; the conclusions made once), `report_cards`
(the Conclusions section's cards), `report_figures` (which figures, drawn and embedded), `report_cache` (the
figures of a written report kept in OUTPUT_DIR/.figures/ and drawn again only when what they are drawn from
changes), `report_sections` (the record sections), `report_markup` (style, escaping, tables); `report_tuning`
(the Tuning section).
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from raysweep import conclusions, report_cache
from raysweep.energy_report import report_section as energy_section
from raysweep.files import write_text_atomic
from raysweep.ledger import Ledger
from raysweep.report_cards import conclusions_section
from raysweep.report_data import ReportData, answer_of, read_data
from raysweep.report_figures import card_figure, figure_list, figures_section
from raysweep.report_markup import CSS, SORT_JS, esc
from raysweep.report_sections import (
    campaign_section,
    environment_section,
    failures_section,
    plan_section,
    results_section,
    sla_section,
    transport_section,
    validity_section,
)

__all__ = ["REPORT_FILE", "SECTIONS", "Section", "build_report", "conclusions_of", "write_report",
           "write_report_with_headlines"]

log = logging.getLogger(__name__)

REPORT_FILE = "report.html"


@dataclass(frozen=True)
class Section:
    """One section of the report: its anchor, its title, and what makes its HTML (without the heading):
    a function of the report's data (`report_data.ReportData`), or `"package.module:function"`, a function of the
    output dir (a `Path`) returning the HTML, or None to leave the section out. `applies`, when given, says
    from the report's data whether the section can have anything to show; when it says no, the section is
    left out without importing its module (a campaign without `tune:` does not import Optuna and Ray)."""

    sid: str
    title: str
    make: Callable[[ReportData], str | None] | str
    applies: Callable[[ReportData], bool] | None = None


def write_report(output_dir: str | Path, out: str | Path | None = None, objective: str | None = None) -> Path:
    """Write the report to `out` (default OUTPUT_DIR/report.html), whole or not at all.

    :raises UserError: `objective` is not an aggregated metric (see `raysweep.conclusions`).
    """
    return write_report_with_headlines(output_dir, out, objective)[0]


def write_report_with_headlines(output_dir: str | Path, out: str | Path | None = None,
                                objective: str | None = None) -> tuple[Path, list[str]]:
    """`write_report`, and the conclusions in one line per bench shape (`conclusions.headlines`; empty when
    there is nothing to conclude or they could not be made). The figures kept in OUTPUT_DIR/.figures/ are
    embedded while what they are drawn from is unchanged (`raysweep.report_cache`); a report written into the
    output dir (the default `out`) keeps what it draws there, one written elsewhere keeps nothing."""
    data = read_data(Path(output_dir), objective)
    target = Path(out) if out else data.output_dir / REPORT_FILE
    keep = target.resolve().is_relative_to(data.output_dir.resolve())
    figures = report_cache.FigureCache(data.output_dir / report_cache.FOLDER, keep=keep)
    with report_cache.using(figures):
        text = _build(data)
    if keep:
        figures.prune()
    log.info("report figures: %d kept ones used, %d drawn", figures.hits, figures.drawn)
    try:
        lines = conclusions.headlines(answer_of(data)) if not data.df.empty else []
    except Exception as exc:  # the report says why; the lines are a courtesy
        log.warning("conclusions not made: %s", exc)
        lines = []
    return write_text_atomic(target, text), lines


def conclusions_of(output_dir: str | Path, objective: str | None = None) -> conclusions.Conclusions | None:
    """The conclusions the report leads with (None when no run is done), without drawing the report."""
    data = read_data(Path(output_dir), objective)
    return None if data.df.empty else answer_of(data)


def build_report(output_dir: str | Path, objective: str | None = None) -> str:
    """The report of a raysweep output dir as one HTML document; `objective` as `raysweep.conclusions` reads it
    (default output_throughput_per_gpu).

    :raises UserError: `objective` is not an aggregated metric.
    """
    return _build(read_data(Path(output_dir), objective))


def _build(data: ReportData) -> str:
    if data.objective and not data.df.empty:
        answer_of(data)  # a wrong --objective is the user's error, not a section that failed
    made = [(sec, body) for sec in SECTIONS if (body := _make(sec, data)) is not None]
    nav = "".join(f'<a href="#{sec.sid}">{esc(sec.title)}</a>' for sec, _ in made)
    body = "\n".join(f'<section id="{sec.sid}"><h2>{esc(sec.title)}</h2>\n{inner}\n</section>' for sec, inner in made)
    when = time.strftime("%Y-%m-%d %H:%M:%S")
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>raysweep report: {esc(data.name)}</title>"
            f"<style>{CSS}</style></head><body>\n<h1>raysweep report: {esc(data.name)}</h1>"
            f'<p class="muted">{esc(_overview(data))} · {esc(str(data.output_dir))} · made {when}</p><nav>{nav}</nav>\n'
            + body + f"\n<script>{SORT_JS}</script></body></html>\n")


def _make(sec: Section, data: ReportData) -> str | None:
    """A section's HTML; what went wrong instead when it cannot be made (it costs only itself)."""
    if sec.applies is not None and not sec.applies(data):
        return None
    try:
        if isinstance(sec.make, str):
            module, _, func = sec.make.partition(":")
            return getattr(importlib.import_module(module), func)(data.output_dir)
        return sec.make(data)
    except Exception as exc:
        log.warning("report section %r not made: %s", sec.sid, exc)
        log.debug("report section %r", sec.sid, exc_info=True)
        return f'<p class="note">This section could not be made: {esc(type(exc).__name__)}: {esc(exc)}</p>'


def _overview(data: ReportData) -> str:
    serves = len({p.serve_id for p in data.points})
    benches = len({p.bench_id for p in data.points})
    return (f"{len(data.df)} finished run(s) of {len(data.points)} planned: {serves} server config(s) x "
            f"{benches} bench point(s)")


# The figures a report draws, looked up here when it is made (a caller may draw fewer: tests draw none)
_figure_list = figure_list
_card_figure = card_figure


def _figures(data: ReportData) -> str:
    return figures_section(data, _figure_list)


def _conclusions(data: ReportData) -> str:
    return conclusions_section(data, _card_figure)


def _any_events(output_dir: Path) -> bool:
    """Whether the ledger recorded an event or a lost driver (the Events section's rows; its module imports
    Ray)."""
    ledger = Ledger.open_existing(output_dir)
    try:
        return bool(ledger.events()) or any(d["outcome"] == "lost" for d in ledger.drivers())
    finally:
        ledger.close()


# -- the sections, in order ----------------------------------------------------------------------------------

SECTIONS: list[Section] = [
    Section("conclusions", "Conclusions", _conclusions),
    Section("validity", "Warnings", validity_section),
    Section("comparison", "Comparison with the baseline", "raysweep.compare:report_section",
            lambda d: (d.output_dir / "compare" / "baseline.json").is_file()),  # compare.COMPARE_DIR, BASELINE_FILE
    Section("figures", "Figures", _figures),
    Section("timeseries", "Time series", "raysweep.bench.timeseries:report_section"),
    Section("results", "Results", results_section),
    Section("energy", "Energy and cost", energy_section),
    Section("sla", "SLA", sla_section),
    Section("workload", "Load levels", "raysweep.workload_levels:report_section",
            lambda d: bool((d.campaign.get("bench") or {}).get("workload"))),
    Section("tuning", "Tuning", "raysweep.report_tuning:report_section", lambda d: bool(d.campaign.get("tune"))),
    Section("transport", "Transport", transport_section),
    Section("multinode", "Multi-node and GPUs", "raysweep.telemetry:report_section"),
    Section("startup", "Server starts", "raysweep.startup:report_section"),
    Section("failures", "Failures", failures_section),
    Section("events", "Events", "raysweep.recovery:report_section", lambda d: _any_events(d.output_dir)),
    Section("campaign", "Campaign", campaign_section),
    Section("plan", "Plan", plan_section),
    Section("environment", "Environment", environment_section),
]

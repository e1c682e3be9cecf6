"""The HTML report of a raysweep output dir: one self-contained file (figures embedded, no network).

It leads with the answer and ends with the record. In order (`SECTIONS`):
- Conclusions (`raysweep.results.conclusions`): per bench shape, the best configuration for the objective (default
  output tokens/s per GPU) and the load it reaches it at, its lead over the best other configuration and
  whether that lead exceeds the noise (95% confidence intervals over the runs overlap or not), the ranking
  of the configurations, the Pareto front of the point means; the SLA capacities when the campaign searched
  for them; the points too noisy to trust and how many runs would tighten them.
- Warnings: the runs that fail a check of their validity record (client-limited, niced, shared CPUs,
  throttled, transport, ..., see `raysweep.drive.validity`).
- Figures: latency against throughput per server config, the main metrics and the server-side metrics
  against the load, the Pareto front, SLA bars.
- The results table (sortable by a small inline script), the SLA table, the transport per server config,
  the failures with their log tails.
- The campaign as stored in the ledger, the plan (points by state, per server config), and the
  environment: the provenance each server recorded when it started (versions, GPUs and driver, model path
  and revision, hosts) and the nodes; never what is installed where the report is made.
Flagged runs carry a mark in the results table and a red cross in the figures. A figure or a section that
cannot be made costs only itself: its place says why. A section is registered in `report.registry`
(`register(Section(id, title, make, applies, order))`): the report's own below, a mode's by its package
(the Tuning section by `raysweep.tune`, Load levels by `raysweep.levels`).

Its parts: `data` (what the report shows, read once; the conclusions made once), `cards` (the Conclusions
section's cards), `figures` (which figures, drawn and embedded), `cache` (the figures of a written report kept
in OUTPUT_DIR/.figures/ and drawn again only when what they are drawn from changes), `sections` (the record
sections), `run_sections` (time series, multi-node and GPUs, server starts, events), `markup` (style,
escaping, tables).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from raysweep.record.files import write_text_atomic
from raysweep.report import cache as report_cache
from raysweep.report.cards import conclusions_section
from raysweep.report.energy import report_section as energy_section
from raysweep.report.figures import CardsBeside, card_figure, figure_list, figures_section
from raysweep.report.markup import CSS, SORT_JS, esc, notes_once, nothing_said
from raysweep.report.registry import Section, register, sections
from raysweep.report.sections import (
    campaign_section,
    environment_section,
    failures_section,
    plan_section,
    results_section,
    sla_section,
    transport_section,
    validity_section,
)
from raysweep.results import conclusions
from raysweep.results.data import ReportData, answer_of, read_data

__all__ = ["REPORT_FILE", "Section", "build_report", "conclusions_of", "write_report",
           "write_report_with_headlines"]

log = logging.getLogger(__name__)

REPORT_FILE = "report.html"


def write_report(output_dir: str | Path, out: str | Path | None = None, objective: str | None = None) -> Path:
    """Write the report to `out` (default OUTPUT_DIR/report.html), whole or not at all.

    :raises UserError: `objective` is not an aggregated metric (see `raysweep.results.conclusions`).
    """
    return write_report_with_headlines(output_dir, out, objective)[0]


def write_report_with_headlines(output_dir: str | Path, out: str | Path | None = None,
                                objective: str | None = None) -> tuple[Path, list[str]]:
    """`write_report`, and the answer in one line per bench shape (`conclusions.headlines`; empty when there is
    nothing to conclude or it could not be made)."""
    path, found = write_report_with_answer(output_dir, out, objective)
    return path, found.lines() if found is not None else []


def write_report_with_answer(output_dir: str | Path, out: str | Path | None = None,
                             objective: str | None = None) -> tuple[Path, Any]:
    """`write_report`, and the campaign's answer (`raysweep.results.answer.Answer`; None when there is nothing
    to conclude or it could not be made). The figures kept in OUTPUT_DIR/.figures/ are
    embedded while what they are drawn from is unchanged (`raysweep.report.cache`); a report written into the
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
        found = answer_of(data).answer if not data.df.empty else None
    except Exception as exc:  # the report says why; the answer is a courtesy
        log.warning("conclusions not made: %s", exc)
        found = None
    return write_text_atomic(target, text), found


def conclusions_of(output_dir: str | Path, objective: str | None = None) -> conclusions.Conclusions | None:
    """The conclusions the report leads with (None when no run is done), without drawing the report."""
    data = read_data(Path(output_dir), objective)
    return None if data.df.empty else answer_of(data)


def build_report(output_dir: str | Path, objective: str | None = None) -> str:
    """The report of a raysweep output dir as one HTML document; `objective` as `raysweep.results.conclusions` reads it
    (default output_throughput_per_gpu).

    :raises UserError: `objective` is not an aggregated metric.
    """
    return _build(read_data(Path(output_dir), objective))


def _build(data: ReportData) -> str:
    if data.objective and not data.df.empty:
        answer_of(data)  # a wrong --objective is the user's error, not a section that failed
    made = _arranged(data, [(sec, body) for sec in sections() if (body := _make(sec, data)) is not None])
    made = list(zip([sec for sec, _ in made], notes_once([body for _, body in made]), strict=True))
    nav = "".join(f'<a href="#{sec.sid}">{esc(sec.title)}</a>' for sec, _ in made)
    body = "\n".join(f'<section id="{sec.sid}"><h2>{esc(sec.title)}</h2>\n{inner}\n</section>' for sec, inner in made)
    when = time.strftime("%Y-%m-%d %H:%M:%S")
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>raysweep report: {esc(data.name)}</title>"
            f"<style>{CSS}</style></head><body>\n<h1>raysweep report: {esc(data.name)}</h1>"
            f'<p class="muted">{esc(_overview(data))} · {esc(str(data.output_dir))} · made {when}</p><nav>{nav}</nav>\n'
            + body + f"\n<script>{SORT_JS}</script></body></html>\n")


def _arranged(data: ReportData, made: list[tuple[Section, str]]) -> list[tuple[Section, str]]:
    """The sections as the page shows them: one with nothing to show (`markup.nothing`) is left out, named with
    its reason in one line at the end of the first section; with no finished run, the Failures section comes
    second, where the conclusions send the reader."""
    empty = [(sec.title, why) for sec, body in made if (why := nothing_said(body)) is not None]
    kept = [(sec, body) for sec, body in made if nothing_said(body) is None]
    if data.df.empty:
        kept.sort(key=lambda m: (m[0].sid != "conclusions", m[0].sid != "failures"))
    if empty and kept:
        said = "; ".join(f"{title} ({why})" for title, why in empty)
        kept[0] = (kept[0][0], kept[0][1] + f'\n<p class="muted">Not shown, nothing to show: {esc(said)}.</p>')
    return kept


def _make(sec: Section, data: ReportData) -> str | None:
    """A section's HTML; what went wrong instead when it cannot be made (it costs only itself)."""
    if sec.applies is not None and not sec.applies(data):
        return None
    try:
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
    figure = CardsBeside(data, _card_figure)
    try:
        return conclusions_section(data, figure)
    finally:
        figure.close()


# -- the report's own sections, in order (a mode's section registers with its package) ------------------------


def _comparison(data: ReportData) -> str | None:
    from raysweep.report.comparison import report_section

    return report_section(data.output_dir)


def _events(data: ReportData) -> str | None:
    from raysweep.report.run_sections import events_section

    return events_section(data.events, data.drivers)


def _startup(data: ReportData) -> str | None:
    from raysweep.serve.startup import report_section

    return report_section(data.servers)


def _timeseries(data: ReportData) -> str | None:
    from raysweep.report.run_sections import timeseries_section

    return timeseries_section(data.output_dir, data.records)  # the records read once for the whole report


def _timeline(data: ReportData) -> str | None:
    from raysweep.report.timeline import timeline_section

    return timeline_section(data)


def _multinode(data: ReportData) -> str | None:
    from raysweep.report.run_sections import multinode_section

    return multinode_section(data.output_dir, data.df)


for _section in [
    Section("conclusions", "Conclusions", _conclusions, order=10),
    Section("validity", "Warnings", validity_section, order=20),
    Section("drift", "Runs over time", _timeline, order=25),
    Section("comparison", "Comparison with the baseline", _comparison,
            lambda d: (d.output_dir / "compare" / "baseline.json").is_file(), order=30),  # compare's files
    Section("figures", "Figures", _figures, order=40),
    Section("timeseries", "Time series", _timeseries, order=50),
    Section("results", "Results", results_section, order=60),
    Section("energy", "Energy and cost", energy_section, order=65),
    Section("sla", "SLA", sla_section, order=70),
    # 80: Load levels (raysweep.levels), 90: Tuning (raysweep.tune)
    Section("transport", "Transport", transport_section, order=100),
    Section("multinode", "Multi-node and GPUs", _multinode, order=110),
    Section("startup", "Server starts", _startup, order=120),
    Section("failures", "Failures", failures_section, order=130),
    Section("events", "Events", _events, order=140),
    Section("campaign", "Campaign", campaign_section, order=150),
    Section("plan", "Plan", plan_section, order=160),
    Section("environment", "Environment", environment_section, order=170),
]:
    register(_section)

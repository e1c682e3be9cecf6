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
"""

from __future__ import annotations

import base64
import html
import importlib
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from matplotlib.figure import Figure

from raysweep import aggregate, conclusions, plots, transport
from raysweep.errors import UserError
from raysweep.files import write_text_atomic
from raysweep.grid import combo_label
from raysweep.importer import read_sla
from raysweep.ledger import Ledger, PointRow, PointState, ServerRow
from raysweep.results import flagged, load_records, records_table
from raysweep.validity import CHECKS, unknown_checks

__all__ = ["REPORT_FILE", "SECTIONS", "Section", "build_report", "conclusions_of", "write_report",
           "write_report_with_headlines"]

log = logging.getLogger(__name__)

REPORT_FILE = "report.html"
CURVE_METRICS = ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_e2el_ms")
LATENCY_THROUGHPUT = ("output_throughput", "median_ttft_ms")  # x, y of the first figure
# What a reader can look at: figures of the first bench shapes only, and the first runs of the results table
# (every shape and run is in results.csv and `raysweep plot`); the report's cost stops growing with the runs
MAX_SHAPES_DRAWN = 6
MAX_TABLE_ROWS = 500
TABLE_METRICS = ("gpu_count", "num_nodes", "client_limited", "completed", "failed", "request_throughput",
                 "output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms",
                 "median_e2el_ms", "p99_e2el_ms", *plots.SERVER_METRICS,
                 *(m for ms in plots.OFFLINE_METRICS.values() for m in ms if m not in ("request_throughput",
                                                                                     "output_throughput")),
                 "total_input_tokens", "total_output_tokens", "duration")

_CSS = """
body{font-family:system-ui,sans-serif;margin:1em auto;max-width:1400px;padding:0 1em;color:#222}
h1{margin:.2em 0 .1em;font-size:1.6em} h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.4em}
h3{margin:.2em 0 .4em;font-size:1.05em}
nav{margin:.4em 0 .6em} nav a{margin-right:1em} pre{background:#f6f6f6;padding:.6em;overflow-x:auto;font-size:12px}
table{border-collapse:collapse;font-size:12px} th,td{border:1px solid #ddd;padding:3px 6px;text-align:right}
th{background:#f0f0f0;position:sticky;top:0} td.t,th.t{text-align:left}
table.sortable th{cursor:pointer} .wide{overflow-x:auto;max-height:70vh}
figure{margin:1em 0} figcaption{font-size:12px;color:#555} img{max-width:100%}
.note{color:#7a5a00} .muted{color:#777} .flag{color:#b00;font-weight:bold}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(430px,1fr));gap:1em;margin-bottom:1em}
.card{border:1px solid #cfd8e3;border-radius:6px;padding:.7em .9em;background:#f8fbff}
.win{font-size:1.1em;margin:.2em 0} .win b{color:#0b5394}
.sig{color:#1e7b34;font-weight:bold} .insig{color:#9a6700;font-weight:bold}
.card figure{margin:.3em 0} .card table{margin:.4em 0} .card td{white-space:nowrap} .card .wide{max-height:none}
"""
_SORT_JS = """
document.querySelectorAll('table.sortable').forEach(function(t){
  t.querySelectorAll('th').forEach(function(th,i){
    th.addEventListener('click',function(){
      var body=t.tBodies[0], rows=Array.from(body.rows), asc=th.dataset.dir!=='asc';
      t.querySelectorAll('th').forEach(function(h){delete h.dataset.dir;});
      th.dataset.dir=asc?'asc':'desc';
      function key(r){var c=r.cells[i], v=c.dataset.v; return v!==undefined?Number(v):c.textContent;}
      rows.sort(function(a,b){var x=key(a),y=key(b);
        var r=(typeof x==='number'&&typeof y==='number')?x-y:String(x).localeCompare(String(y));
        return asc?r:-r;});
      rows.forEach(function(r){body.appendChild(r);});
    });
  });
});
"""


@dataclass
class _Data:
    """Everything the report shows, read once from the output dir."""

    output_dir: Path
    name: str
    campaign: dict[str, Any]
    points: list[PointRow]
    servers: list[ServerRow]
    out_of_plan: int
    df: pd.DataFrame
    sla: pd.DataFrame
    sla_variable: str
    records: list[dict[str, Any]]
    objective: str | None = None
    answer: conclusions.Conclusions | None = None  # made once, by `_conclusions_of`


def _read(output_dir: Path, objective: str | None = None) -> _Data:
    ledger = Ledger.open_existing(output_dir)
    try:
        campaign = ledger.stored_campaign()
        name = ledger.meta("name") or campaign.get("name", "")
        points, servers, extra = ledger.points(), ledger.servers(), ledger.out_of_plan()
    finally:
        ledger.close()
    sla, variable = read_sla(output_dir)
    records = load_records(output_dir)
    return _Data(output_dir, name, campaign, points, servers, extra, records_table(records), sla, variable, records,
                 objective)


@dataclass(frozen=True)
class Section:
    """One section of the report: its anchor, its title, and what makes its HTML (without the heading):
    a function of the report's data in this module, or `"package.module:function"`, a function of the
    output dir (a `Path`) returning the HTML, or None to leave the section out."""

    sid: str
    title: str
    make: Callable[[_Data], str | None] | str


def write_report(output_dir: str | Path, out: str | Path | None = None, objective: str | None = None) -> Path:
    """Write the report to `out` (default OUTPUT_DIR/report.html), whole or not at all.

    :raises UserError: `objective` is not an aggregated metric (see `raysweep.conclusions`).
    """
    return write_report_with_headlines(output_dir, out, objective)[0]


def write_report_with_headlines(output_dir: str | Path, out: str | Path | None = None,
                                objective: str | None = None) -> tuple[Path, list[str]]:
    """`write_report`, and the conclusions in one line per bench shape (`conclusions.headlines`; empty when
    there is nothing to conclude or they could not be made)."""
    data = _read(Path(output_dir), objective)
    text = _build(data)
    try:
        lines = conclusions.headlines(_conclusions_of(data)) if not data.df.empty else []
    except Exception as exc:  # the report says why; the lines are a courtesy
        log.warning("conclusions not made: %s", exc)
        lines = []
    return write_text_atomic(Path(out) if out else Path(output_dir) / REPORT_FILE, text), lines


def conclusions_of(output_dir: str | Path, objective: str | None = None) -> conclusions.Conclusions | None:
    """The conclusions the report leads with (None when no run is done), without drawing the report."""
    data = _read(Path(output_dir), objective)
    return None if data.df.empty else _conclusions_of(data)


def build_report(output_dir: str | Path, objective: str | None = None) -> str:
    """The report of a raysweep output dir as one HTML document; `objective` as `raysweep.conclusions` reads it
    (default output_throughput_per_gpu).

    :raises UserError: `objective` is not an aggregated metric.
    """
    return _build(_read(Path(output_dir), objective))


def _build(data: _Data) -> str:
    if data.objective and not data.df.empty:
        _conclusions_of(data)  # a wrong --objective is the user's error, not a section that failed
    made = [(sec, body) for sec in SECTIONS if (body := _make(sec, data)) is not None]
    nav = "".join(f'<a href="#{sec.sid}">{_e(sec.title)}</a>' for sec, _ in made)
    body = "\n".join(f'<section id="{sec.sid}"><h2>{_e(sec.title)}</h2>\n{inner}\n</section>' for sec, inner in made)
    when = time.strftime("%Y-%m-%d %H:%M:%S")
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>raysweep report: {_e(data.name)}</title>"
            f"<style>{_CSS}</style></head><body>\n<h1>raysweep report: {_e(data.name)}</h1>"
            f'<p class="muted">{_e(_overview(data))} · {_e(str(data.output_dir))} · made {when}</p><nav>{nav}</nav>\n'
            + body + f"\n<script>{_SORT_JS}</script></body></html>\n")


def _make(sec: Section, data: _Data) -> str | None:
    """A section's HTML; what went wrong instead when it cannot be made (it costs only itself)."""
    try:
        if isinstance(sec.make, str):
            module, _, func = sec.make.partition(":")
            return getattr(importlib.import_module(module), func)(data.output_dir)
        return sec.make(data)
    except Exception as exc:
        log.warning("report section %r not made: %s", sec.sid, exc)
        log.debug("report section %r", sec.sid, exc_info=True)
        return f'<p class="note">This section could not be made: {_e(type(exc).__name__)}: {_e(exc)}</p>'


def _overview(data: _Data) -> str:
    serves = len({p.serve_id for p in data.points})
    benches = len({p.bench_id for p in data.points})
    return (f"{len(data.df)} finished run(s) of {len(data.points)} planned: {serves} server config(s) x "
            f"{benches} bench point(s)")


# -- small HTML helpers ----------------------------------------------------------------------------------

def _e(value: Any) -> str:
    return html.escape(str(value))



def _cell(value: Any) -> str:
    """A table cell: numbers right-aligned with their exact value kept for sorting, text escaped."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return '<td class="t"></td>'
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        shown = f"{value:.6g}" if isinstance(value, float) else str(value)
        sort = value if math.isfinite(value) else ("1e308" if value > 0 else "-1e308")
        return f'<td data-v="{sort}">{shown}</td>'
    return f'<td class="t">{_e(value)}</td>'


def _table(columns: Sequence[str], rows: Iterable[Sequence[Any]], sortable: bool = False) -> str:
    head = "".join(f'<th class="t">{_e(c)}</th>' for c in columns)
    body = "".join("<tr>" + "".join(_cell(_plain(v)) for v in row) + "</tr>\n" for row in rows)
    cls = ' class="sortable"' if sortable else ""
    return f'<div class="wide"><table{cls}><thead><tr>{head}</tr></thead><tbody>\n{body}</tbody></table></div>'


def _plain(value: Any) -> Any:
    """numpy scalars as Python ones, so cells format them as numbers."""
    return value.item() if hasattr(value, "item") and not isinstance(value, (str, bytes)) else value


def _frame_table(df: pd.DataFrame, sortable: bool = False) -> str:
    return _table(list(df.columns), df.itertuples(index=False, name=None), sortable)


# -- sections ----------------------------------------------------------------------------------------------

def _validity(data: _Data) -> str:
    """The runs that fail a check of their validity record, and the checks nothing could judge."""
    recs = data.records
    if not recs:
        return "<p>No finished run yet.</p>"
    checks = ", ".join(CHECKS)
    unknown = Counter(c for r in recs for c in unknown_checks(r))
    gaps = ("<p class=\"muted\">Not judged (nothing recorded): "
            + "; ".join(f"{c} for {n} run(s)" for c, n in unknown.items()) + ".</p>") if unknown else ""
    bad = flagged(recs)
    if not bad:
        return f"<p>All {len(recs)} run(s) pass every check ({_e(checks)}).</p>{gaps}"
    return (f'<p class="flag">{len(bad)} of {len(recs)} run(s) fail a check ({_e(checks)}); their numbers may '
            "not be the server's, so the conclusions leave them out of every ranking and comparison. They are "
            "marked &#9888; in the results table and, with the check's name, in the figures.</p>"
            + _grouped_by_check(bad) + gaps)


def _grouped_by_check(bad: list[dict[str, Any]]) -> str:
    """One line per check with how many runs it flagged, the runs listed on demand."""
    by_check: dict[str, list[dict[str, Any]]] = {}
    for r in bad:
        for name in aggregate.check_names(r.get("validity_issues")) or ["flagged"]:
            by_check.setdefault(name, []).append(r)
    parts = []
    for name, runs in sorted(by_check.items(), key=lambda kv: -len(kv[1])):
        rows = [[r.get("serve_label", r.get("serve_id")), r.get("bench_label", r.get("bench_id")),
                 r.get("run_number"), r.get("validity_issues")] for r in runs]
        parts.append(f'<details><summary class="flag">{_e(name)}: {len(runs)} run(s)</summary>'
                     + _table(["server config", "bench point", "run", "failed checks"], rows) + "</details>")
    return "".join(parts)


def _campaign(data: _Data) -> str:
    text = yaml.safe_dump(data.campaign, sort_keys=False, default_flow_style=False)
    return f"<p>As stored in the ledger (secrets masked).</p><pre>{_e(text)}</pre>"


def _plan(data: _Data) -> str:
    states = Counter(p.state.value for p in data.points)
    counts = _table([s.value for s in PointState] + ["total"],
                    [[states.get(s.value, 0) for s in PointState] + [len(data.points)]])
    shapes = _shapes(data.df)
    rows = []
    for serve_id, mine in _by_serve(data.points).items():
        st = Counter(p.state.value for p in mine)
        rows.append([combo_label(mine[0].serve_params), serve_id, shapes.get(serve_id, ""),
                     len({p.bench_id for p in mine}), *(st.get(s.value, 0) for s in PointState)])
    configs = _table(["server config", "id", "tp x pp x dp", "bench points", *(s.value for s in PointState)], rows)
    probes = sum(1 for p in data.points if p.probe_of)
    extra = (f"<p>{probes} of the points are SLA search probes.</p>" if probes else "") + (
        f"<p>{data.out_of_plan} point(s) in the ledger are no longer in the campaign (not shown).</p>"
        if data.out_of_plan else "")
    return (f"<p>{len(_by_serve(data.points))} server config(s), {len({p.bench_id for p in data.points})} bench "
            f"point(s), {len({p.run for p in data.points})} run(s) each.</p>{counts}{configs}{extra}")


def _by_serve(points: list[PointRow]) -> dict[str, list[PointRow]]:
    out: dict[str, list[PointRow]] = {}
    for p in points:
        out.setdefault(p.serve_id, []).append(p)
    return out


def _shapes(df: pd.DataFrame) -> dict[str, str]:
    """`tp x pp x dp` per server config, from its results."""
    cols = ["tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"]
    if df.empty or not set(cols) <= set(df.columns):
        return {}
    first = df.drop_duplicates("serve_id").set_index("serve_id")[cols]
    return {sid: " x ".join(plots.fmt_value(v) for v in row) for sid, row in first.iterrows()}


def _param_names(points: list[PointRow], df: pd.DataFrame) -> tuple[list[str], list[str]]:
    """The serve and bench parameter names that take several values in the results."""
    def varying(names: Iterable[str]) -> list[str]:
        return [n for n in dict.fromkeys(names) if n in df.columns and df[n].astype(str).nunique() > 1]
    return (varying(k for p in points for k in p.serve_params), varying(k for p in points for k in p.bench_params))


def _figures(data: _Data) -> str:
    if data.df.empty:
        return "<p>No finished run yet.</p>"
    return "\n".join(_figure(title, draw) for title, draw in _figure_list(data))


def _figure_list(data: _Data) -> list[tuple[str, Callable[[], tuple[Figure | None, list[str]]]]]:
    """(caption, drawing function) of every figure the report shows."""
    df = data.df
    if plots.is_offline(df):
        base = plots.PlotSpec(fig_height=3.2)
        return [(f"{spec.var_y} against {spec.var_x}", partial(_curves, df, spec))
                for spec in plots.offline_specs(df, base)]
    serve_vars, bench_vars = _param_names(data.points, df)
    load = plots.load_variable(df, "total_token_throughput")
    cols = tuple(conclusions.shape_keys(df, bench_vars, load, data.sla_variable))
    df, shown = _first_shapes(df, list(cols))
    out: list[tuple[str, Callable[[], tuple[Figure | None, list[str]]]]] = []
    x, y = LATENCY_THROUGHPUT
    if {x, y} <= set(df.columns):
        spec = plots.PlotSpec(var_x=x, var_y=y, col_by=cols, curve_by=tuple(serve_vars), fig_height=3.2)
        out.append((f"latency against throughput: {y} against {x}, one point per {load} (mean of its runs)"
                    if load != "total_token_throughput" else f"{y} against {x}",
                    partial(_curves, df, spec)))
    for metric in (m for m in CURVE_METRICS if m in df.columns):
        spec = plots.PlotSpec(var_x=load, var_y=metric, col_by=cols, curve_by=tuple(serve_vars), fig_height=3.2)
        out.append((f"{metric} against {load}", partial(_curves, df, spec)))
    spec = plots.PlotSpec(col_by=(), row_by=cols, curve_by=tuple(serve_vars), fig_height=3.0)
    out.append((f"server-side metrics against {load}",
                lambda: _one(plots.plan_server_metrics(df, spec, load), spec)))
    out.append(("Pareto front (every run; front without dominated ties)", lambda: _pareto(df)))
    if not data.sla.empty:
        out.append(("SLA: largest passing value per server config and target",
                    lambda: (plots.sla_figure(data.sla, data.sla_variable), [])))
    if shown:
        out = [(f"{caption} ({shown})", draw) for caption, draw in out]
    return out


def _curves(df: pd.DataFrame, spec: plots.PlotSpec) -> tuple[Figure | None, list[str]]:
    return _one(plots.plan_curves(df, spec), spec)


def _first_shapes(df: pd.DataFrame, cols: list[str]) -> tuple[pd.DataFrame, str]:
    """The runs of the first MAX_SHAPES_DRAWN bench shapes (in the order of their values), and what that
    leaves out ("" when nothing)."""
    if not cols:
        return df, ""
    shapes = df[cols].drop_duplicates()
    if len(shapes) <= MAX_SHAPES_DRAWN:
        return df, ""
    keep = shapes.sort_values(cols, key=lambda col: col.map(plots.sort_key)).head(MAX_SHAPES_DRAWN)
    return (df.merge(keep, on=cols), f"the first {MAX_SHAPES_DRAWN} of {len(shapes)} bench shapes; "
            f"`raysweep plot OUTPUT_DIR --col-by {','.join(cols)}` draws every one")


def _one(plans: list[plots.FigurePlan], spec: plots.PlotSpec) -> tuple[Figure | None, list[str]]:
    if not plans:
        return None, []
    return plots.render(plans[0], spec), plans[0].notes


def _pareto(df: pd.DataFrame) -> tuple[Figure | None, list[str]]:
    result = plots.pareto(df)
    return plots.pareto_figure(result, ["max_concurrency", "gpus"]), result.notes


def _figure(caption: str, draw: Callable[[], tuple[Figure | None, list[str]]]) -> str:
    """One embedded PNG with its caption and notes; the reason instead when it cannot be drawn."""
    try:
        fig, notes = draw()
    except Exception as exc:  # a figure that fails costs only itself
        log.warning("report figure %r not drawn: %s", caption, exc)
        return f'<p class="note">{_e(caption)}: not drawn ({_e(exc)})</p>'
    if fig is None:
        return f'<p class="muted">{_e(caption)}: no data for it in these results.</p>'
    return _img(fig, caption, notes)


def _img(fig: Figure, caption: str, notes: Sequence[str] = (), dpi: int = 110) -> str:
    """The figure as an embedded PNG with its caption and notes."""
    png = base64.b64encode(plots.figure_bytes(fig, "png", dpi=dpi)).decode()
    note = "".join(f'<br><span class="note">{_e(n)}</span>' for n in notes)
    return (f'<figure><img alt="{_e(caption)}" src="data:image/png;base64,{png}">'
            f"<figcaption>{_e(caption)}{note}</figcaption></figure>")


def _results(data: _Data) -> str:
    df = data.df
    if df.empty:
        return "<p>No finished run yet.</p>"
    params = [k for p in data.points for k in (*p.serve_params, *p.bench_params)]
    if "validity_ok" in df.columns:
        issues = df["validity_issues"] if "validity_issues" in df.columns else pd.Series([""] * len(df))
        mark = ["" if ok is None or (isinstance(ok, float) and math.isnan(ok)) else "ok" if bool(ok)
                else "\u26a0 " + str(i) for ok, i in zip(df["validity_ok"], issues)]
        df = df.assign(validity=mark)
    cols = [c for c in dict.fromkeys(["serve_label", "bench_label", "run_number", "validity", *params,
                                      *TABLE_METRICS]) if c in df.columns]
    cut = (f' The first {MAX_TABLE_ROWS} are shown; every run is in <a href="results.csv">results.csv</a>.'
           if len(df) > MAX_TABLE_ROWS else "")
    return (f"<p>{len(df)} run(s); click a column to sort. Every column is in results.csv / results.parquet; "
            f"the per-point aggregates are in summary.csv.{cut}</p>"
            f"{_frame_table(df[cols].head(MAX_TABLE_ROWS), sortable=True)}")


def _sla(data: _Data) -> str:
    if data.sla.empty:
        return '<p class="muted">No SLA search in this campaign.</p>'
    return _frame_table(data.sla, sortable=True)


def _transport(data: _Data) -> str:
    """Per server config, the NCCL verdict of its latest server: links, gate, and the evidence lines."""
    latest = {s.serve_id: s for s in data.servers if s.transport}
    if not latest:
        return '<p class="muted">Not checked: no server of this campaign has a transport verdict.</p>'
    require = (data.campaign.get("transport") or {}).get("require", "any")
    labels = {p.serve_id: combo_label(p.serve_params) for p in data.points}
    rows, evidence = [], []
    for serve_id, s in latest.items():
        v = s.transport_verdict() or {}
        refused = transport.refusal(v, require)
        one_node = int(v.get("nnodes") or 1) < 2
        rows.append([labels.get(serve_id, serve_id), s.server_id, v.get("nnodes", 1),
                     "n/a" if one_node else v.get("inter"), v.get("intra"), ", ".join(v.get("plugins") or []),
                     ", ".join(v.get("ib_devices") or []), ", ".join(v.get("versions") or []),
                     "refused" if refused else "ok"])
        lines = "\n".join(str(e) for e in v.get("evidence") or []) or "no NCCL line in the server logs"
        evidence.append(f"<details><summary>{_e(labels.get(serve_id, serve_id))}: evidence</summary>"
                        f"<pre>{_e(lines)}</pre></details>")
    table = _table(["server config", "server", "nodes", "inter-node", "intra-node", "NET plugins", "IB devices",
                    "NCCL", f"gate ({require})"], rows)
    return table + "\n".join(evidence)


def _failures(data: _Data) -> str:
    failed = [p for p in data.points if p.state == PointState.FAILED]
    if not failed:
        return "<p>No failed point.</p>"
    items = []
    for p in failed:
        tail = f"<pre>{_e(p.log_tail)}</pre>" if p.log_tail else '<p class="muted">no log tail recorded</p>'
        items.append(f'<div class="failure"><h3>{_e(combo_label(p.serve_params))} / '
                     f"{_e(combo_label(p.bench_params))}, run {p.run}</h3><p>point {_e(p.point_id)}, "
                     f"{p.attempts} attempt(s): {_e(p.error or '')}</p>{tail}</div>")
    return f"<p>{len(failed)} failed point(s).</p>" + "\n".join(items)


_PROVENANCE = (("vLLM", "vllm"), ("torch", "torch"), ("NCCL", "nccl"), ("Ray", "ray"), ("raysweep", "raysweep"),
               ("Python", "python"), ("GPUs", "gpu"), ("GPU driver", "gpu_driver"), ("model path", "model_path"),
               ("model revision", "model_revision"))


def _environment(data: _Data) -> str:
    """What each server recorded when it started, and the versions the runs recorded themselves."""
    recorded = {c: sorted(map(str, data.df[c].dropna().unique())) for c in data.df.columns
                if c.endswith("_version")} if not data.df.empty else {}
    parts = []
    provs = [(s, rec) for s in data.servers if (rec := s.provenance_record()) is not None]
    if provs:
        labels = {p.serve_id: combo_label(p.serve_params) for p in data.points}
        rows = [[labels.get(s.serve_id, s.serve_id), s.server_id,
                 ",".join(p.get("hostnames") or [p.get("hostname", "")]),
                 *(p.get(k) for _, k in _PROVENANCE)] for s, p in provs]
        parts.append("<p>Recorded on each server's node when it started.</p>"
                     + _table(["server config", "server", "hosts", *(t for t, _ in _PROVENANCE)], rows))
    if recorded:
        parts.append(_table(["recorded with the runs", "value(s)"], [[k, ", ".join(v)] for k, v in recorded.items()]))
    if not parts:
        parts.append('<p class="muted">No provenance was recorded with these runs (their servers started before '
                     "raysweep recorded it).</p>")
    return "".join(parts) + _nodes(data.servers)


def _nodes(servers: list[ServerRow]) -> str:
    """Every node a server ran on: host, IP, node id, the GPU ids it was given, and how many servers."""
    nodes: dict[str, dict[str, Any]] = {}
    for s in servers:
        for rank in s.rank_list():
            n = nodes.setdefault(rank.get("node_id") or "?", {"hostname": rank.get("hostname"),
                                                              "ip": rank.get("node_ip"), "gpus": set(), "servers": 0})
            n["gpus"].update(g for g in (rank.get("gpu_ids") or "").split(",") if g)
            n["servers"] += 1
    if not nodes:
        return "<p>No server was started.</p>"
    rows = [[n["hostname"] or "", n["ip"] or "", nid, ",".join(sorted(n["gpus"], key=_gpu_key)) or "none",
             n["servers"]] for nid, n in nodes.items()]
    gpus = sum(len(n["gpus"]) for n in nodes.values())
    return (f"<p>{len(nodes)} node(s), {gpus} GPU(s) used.</p>"
            + _table(["host", "IP", "node id", "GPU ids used", "server starts"], rows))


def _gpu_key(gpu: str) -> tuple[int, str]:
    return (int(gpu), "") if gpu.isdigit() else (1 << 30, gpu)


# -- conclusions -------------------------------------------------------------------------------------------

def _conclusions_of(data: _Data) -> conclusions.Conclusions:
    """The conclusions of the report's results (made once per report)."""
    if data.answer is None:
        _, bench_vars = _param_names(data.points, data.df)
        params = list(dict.fromkeys(k for p in data.points for k in (*p.serve_params, *p.bench_params)))
        # t-intervals over the runs (the raw-sample bootstrap of summary.csv would cost seconds per point)
        summary = aggregate.summarize(data.df, confidence=conclusions.CONFIDENCE, params=params)
        data.answer = conclusions.conclude(data.df, bench_vars, data.objective, data.sla, data.sla_variable,
                                           summary=summary, slo=_slo(data.campaign))
    return data.answer


def _slo(campaign: dict[str, Any]) -> Any:
    """The campaign's service-level objective (`slo:`), None without one or when it no longer parses."""
    from raysweep.sla import parse_slo

    raw = campaign.get("slo") if isinstance(campaign, dict) else None
    if not raw:
        return None
    try:
        return parse_slo(raw)
    except UserError as exc:
        log.warning("the campaign's slo is not used: %s", exc)
        return None


def _conclusions(data: _Data) -> str:
    """The answer first: the best configuration per bench shape, its lead and the noise, the Pareto fronts,
    the SLA capacities and the noisy points."""
    if data.df.empty:
        return "<p>No finished run yet.</p>"
    try:
        c = _conclusions_of(data)
    except UserError as exc:  # the default objective does not fit these results (a latency-only sweep)
        return f'<p class="muted">No conclusions: {_e(exc)}</p>'
    pct = f"{conclusions.CONFIDENCE:.0%}"
    slo = (f" Only points whose means meet the campaign's service-level objective <b>{_e(c.slo.label)}</b> are "
           "ranked." if c.slo is not None else " No service-level objective (<code>slo:</code>): the leader is "
           "the raw best, whatever its latency; each card names the knee beside it.")
    head = (f'<p class="muted">Objective: <b>{_e(c.objective.text)}</b> (<code>raysweep report --objective</code> '
            f"chooses another).{slo} A point is a server config at one bench point; its value is the mean over its "
            f"runs that passed their checks, with a {pct} confidence interval. The leader is tested against every "
            f"other config with Welch's t over runs and Holm's correction over the configs. Load: "
            f"{_e(c.load or 'not swept')}; bench shape: {_e(', '.join(c.shape_keys) or 'one')}.</p>")
    cards = "".join(_shape_card(data, c, v) for v in c.verdicts)
    if not cards:
        cards = f'<p class="note">No point has a value of {_e(c.objective.name)}.</p>'
    notes = "".join(f'<p class="note">{_e(n)}</p>' for n in dict.fromkeys([*c.notes, *c.front_notes]))
    return head + f'<div class="cards">{cards}</div>' + _sla_capacities(c) + _noise(c) + notes


def _shape_card(data: _Data, c: conclusions.Conclusions, v: conclusions.ShapeVerdict) -> str:
    lead = v.leader
    value = (f"{_e(c.objective.name)} {conclusions.fmt(lead['objective_mean'])} {_e(c.objective.unit)} "
             f"({_interval(lead)}, {_backing(lead)})")
    parts = [f"<h3>{_e(v.shape)}</h3>"]
    if v.slo_met is False and c.slo is not None:
        parts.append(f'<p class="flag">No point of this shape meets the service-level objective '
                     f"{_e(c.slo.label)}; the ranking below ignores it.</p>")
    parts.append(f'<p class="win">Best: <b>{_e(conclusions.at_load(lead, c.load))}</b>: {value}</p>')
    parts.append(_latencies(lead))
    if v.runner_up is not None:
        cls = "sig" if v.clear else "insig"
        amount = f"{v.lead:+.1%}" if v.lead is not None else "ahead"
        flag = (" Some runs of these points were flagged (see Warnings): the verdict rests on the others."
                if v.flagged else "")
        parts.append(f"<p>{_e(amount)} over {_e(conclusions.at_load(v.runner_up, c.load))} "
                     f"({conclusions.fmt(v.runner_up['objective_mean'])}, {_interval(v.runner_up)}): "
                     f'<span class="{cls}">{_e(conclusions.verdict_text(v))}</span>.{_e(flag)}</p>')
    if v.knee is not None:
        same = v.knee["serve_id"] == lead["serve_id"] and v.knee["bench_id"] == lead["bench_id"]
        parts.append(f"<p>Knee (best among points with {_e(v.knee_bound)}): "
                     f"<b>{_e(conclusions.at_load(v.knee, c.load))}</b>, {conclusions.fmt(v.knee['objective_mean'])} "
                     f"{_e(c.objective.unit)}{' (the leader itself)' if same else ''}.</p>" + _latencies(v.knee))
    parts.append(_card_figure(data, c, v))
    rows = [[i + 1, r.get("serve_label"), *([r.get(c.load)] if c.load else []),
             conclusions.rounded(r["objective_mean"]), _interval(r, bare=True), r.get("runs"),
             _left_out(r)] for i, (_, r) in enumerate(v.ranking.iterrows())]
    unit = f" ({c.objective.unit})" if c.objective.unit else ""
    cols = ["#", "server config", *([f"at {c.load}"] if c.load else []), f"mean{unit}",
            f"{conclusions.CONFIDENCE:.0%} CI", "runs used", "left out"]
    parts.append(_table(cols, rows))
    front = c.fronts.get(v.shape)
    if front is not None and len(front):
        frows = [[r.get("serve_label"), r.get("max_concurrency"), conclusions.rounded(r["tokens_per_user"]),
                  conclusions.rounded(r["tokens_per_gpu"])] for _, r in front.iterrows()]
        parts.append(f"<p>Pareto front ({len(front)} point(s), none better on both):</p>"
                     + _table(["server config", "max_concurrency", "output tok/s per user", "output tok/s per GPU"],
                              frows))
    return f'<div class="card">{"".join(parts)}</div>'


def _backing(row: Any) -> str:
    """`backed by 3 run(s); 2 left out (shared CPUs 2)`, or that every run is flagged."""
    if row.get("on_flagged_runs") is True:
        return f"{_runs(row)}, every one flagged (see Warnings)"
    text = f"backed by {_runs(row)}"
    left = row.get("runs_left_out")
    if conclusions.finite(left) and int(left) > 0:
        text += f"; {int(left)} left out ({row.get('left_out_reasons') or 'flagged'})"
    return text


def _left_out(row: Any) -> str:
    if row.get("on_flagged_runs") is True:
        return "all flagged"
    left = row.get("runs_left_out")
    return f"{int(left)} ({row.get('left_out_reasons')})" if conclusions.finite(left) and int(left) > 0 else "0"


def _latencies(row: Any) -> str:
    """The latencies of a card's point: median and p99 TTFT and TPOT (means over its runs)."""
    have = [(m, row.get(f"{m}_mean")) for m in conclusions.CARD_LATENCIES if conclusions.finite(row.get(f"{m}_mean"))]
    if not have:
        return ""
    return ('<p class="muted">At this point: ' + ", ".join(f"{_e(m[:-3])} {conclusions.fmt(x)} ms" for m, x in have)
            + ".</p>")


def _card_figure(data: _Data, c: conclusions.Conclusions, v: conclusions.ShapeVerdict) -> str:
    """Latency against throughput of one bench shape: a curve per server config, a point per load value (the
    mean of its runs), the best point starred. Empty without those metrics; the reason when it fails."""
    x, y = LATENCY_THROUGHPUT
    if not {x, y, "serve_label"} <= set(data.df.columns):
        return ""
    if next(i for i, w in enumerate(c.verdicts) if w is v) >= MAX_SHAPES_DRAWN:
        return (f'<p class="muted">Figure drawn for the first {MAX_SHAPES_DRAWN} bench shapes only; '
                "<code>raysweep plot</code> draws any.</p>")
    caption = f"{y} against {x}, one point per {c.load or 'bench point'}; \u2605 the best point"
    try:
        mine = c.points.loc[c.points["shape"] == v.shape, ["serve_id", "bench_id"]]
        # no validity crosses here: the Warnings section lists those runs, the Figures mark them
        rows = data.df.merge(mine, on=["serve_id", "bench_id"]).drop(columns=["validity_ok"], errors="ignore")
        spec = plots.PlotSpec(var_x=x, var_y=y, curve_by=("serve_label",), fig_height=2.3)
        fig = plots.render(plots.plan_curves(rows, spec)[0], spec)
        best = rows[(rows["serve_id"] == v.leader["serve_id"]) & (rows["bench_id"] == v.leader["bench_id"])
                    & ~plots.client_limited_mask(rows)]
        fig.axes[0].scatter(best[x].mean(), best[y].mean(), marker="*", s=200, color="gold", edgecolors="black",
                            linewidths=0.8, zorder=5)
    except Exception as exc:  # the card stays without its figure
        log.warning("conclusions figure of %s not drawn: %s", v.shape, exc)
        return f'<p class="note">{_e(caption)}: not drawn ({_e(exc)})</p>'
    return _img(fig, caption, dpi=90)


def _interval(row: Any, bare: bool = False) -> str:
    low, high = row.get("objective_ci_low"), row.get("objective_ci_high")
    if not (conclusions.finite(low) and conclusions.finite(high)):
        return "no interval: one run" if not bare else "n/a"
    text = f"{conclusions.fmt(low)} to {conclusions.fmt(high)}"
    return text if bare else f"{conclusions.CONFIDENCE:.0%} CI {text}"


def _runs(row: Any) -> str:
    n = row.get("runs")
    return f"{int(n)} run(s)" if conclusions.finite(n) else "runs unknown"


def _sla_capacities(c: conclusions.Conclusions) -> str:
    if c.sla.empty:
        return ""
    rows = [[r["bench_label"], r["target"], r["serve_label"], r["largest_pass"], r["state"]]
            for _, r in c.sla.iterrows()]
    return ("<h3>SLA capacities</h3><p>Per bench point and target, the largest load each server config meets it "
            "at, best first (inf: met at every load tried).</p>"
            + _table(["bench point", "target", "server config", "largest passing value", "search"], rows))


def _noise(c: conclusions.Conclusions) -> str:
    noisy = c.noisy
    if not len(c.points):
        return ""
    if not len(noisy):
        return (f'<p class="muted">Noise: no point has a spread above the threshold over its runs '
                f"({len(c.points)} point(s)).</p>")
    rows = [[r.get("serve_label"), r.get("bench_label"), r.get("runs"), r.get("noisy_metrics", ""),
             r.get("runs_needed")] for _, r in noisy.iterrows()]
    return (f'<details><summary class="note">Noise: {len(noisy)} of {len(c.points)} point(s) are noisy (a '
            "coefficient of variation over their runs above the threshold); more runs would tighten them."
            "</summary>" + _table(["server config", "bench point", "runs", "noisy metrics", "runs needed"], rows)
            + "</details>")


# -- the sections, in order ----------------------------------------------------------------------------------

SECTIONS: list[Section] = [
    Section("conclusions", "Conclusions", _conclusions),
    Section("validity", "Warnings", _validity),
    Section("comparison", "Comparison with the baseline", "raysweep.compare:report_section"),
    Section("figures", "Figures", _figures),
    Section("timeseries", "Time series", "raysweep.bench.timeseries:report_section"),
    Section("results", "Results", _results),
    Section("sla", "SLA", _sla),
    Section("workload", "Load levels", "raysweep.workload_levels:report_section"),
    Section("tuning", "Tuning", "raysweep.report_tuning:report_section"),
    Section("transport", "Transport", _transport),
    Section("multinode", "Multi-node and GPUs", "raysweep.telemetry:report_section"),
    Section("startup", "Server starts", "raysweep.startup:report_section"),
    Section("failures", "Failures", _failures),
    Section("events", "Events", "raysweep.recovery:report_section"),
    Section("campaign", "Campaign", _campaign),
    Section("plan", "Plan", _plan),
    Section("environment", "Environment", _environment),
]

"""The HTML report of a raysweep output dir: one self-contained file (figures embedded, no network).

Sections: the validity warnings (runs that fail a check of their validity record, see `raysweep.validity`),
the campaign as stored in the ledger, the plan (points by state, per server config), the figures
(curves of the main metrics against the load, server-side metrics, the Pareto front, SLA bars), the results
table (sortable by a small inline script), the SLA table, the transport per server config, the failures with
their log tails, and the environment: the provenance each server recorded when it started (versions, GPUs
and driver, model path and revision, hosts) and the nodes; never what is installed where the report is made.
Flagged runs carry a mark in the results table and a red cross in the figures. A figure that cannot be drawn
costs only itself: its place says why.
"""

from __future__ import annotations

import base64
import html
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from matplotlib.figure import Figure

from raysweep import plots, transport
from raysweep.grid import combo_label
from raysweep.files import write_text_atomic
from raysweep.ledger import Ledger, PointRow, PointState, ServerRow
from raysweep.importer import read_sla
from raysweep.results import flagged, load_records, records_table
from raysweep.validity import CHECKS, unknown_checks

__all__ = ["REPORT_FILE", "build_report", "write_report"]

log = logging.getLogger(__name__)

REPORT_FILE = "report.html"
CURVE_METRICS = ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_e2el_ms")
TABLE_METRICS = ("gpu_count", "num_nodes", "client_limited", "completed", "failed", "request_throughput",
                 "output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms",
                 "median_e2el_ms", "p99_e2el_ms", *plots.SERVER_METRICS,
                 *(m for ms in plots.OFFLINE_METRICS.values() for m in ms if m not in ("request_throughput",
                                                                                     "output_throughput")),
                 "total_input_tokens", "total_output_tokens", "duration")
_SECTIONS = (("validity", "Validity"), ("campaign", "Campaign"), ("plan", "Plan"), ("figures", "Figures"), ("results", "Results"),
             ("sla", "SLA"), ("transport", "Transport"), ("failures", "Failures"), ("environment", "Environment"))

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1400px;padding:0 1em;color:#222}
h1{margin-bottom:.2em} h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.6em}
nav a{margin-right:1em} pre{background:#f6f6f6;padding:.6em;overflow-x:auto;font-size:12px}
table{border-collapse:collapse;font-size:12px} th,td{border:1px solid #ddd;padding:3px 6px;text-align:right}
th{background:#f0f0f0;position:sticky;top:0} td.t,th.t{text-align:left}
table.sortable th{cursor:pointer} .wide{overflow-x:auto;max-height:70vh}
figure{margin:1em 0} figcaption{font-size:12px;color:#555} img{max-width:100%}
.note{color:#7a5a00} .muted{color:#777} .flag{color:#b00;font-weight:bold}
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


def _read(output_dir: Path) -> _Data:
    ledger = Ledger.open_existing(output_dir)
    try:
        campaign = ledger.stored_campaign()
        name = ledger.meta("name") or campaign.get("name", "")
        points, servers, extra = ledger.points(), ledger.servers(), ledger.out_of_plan()
    finally:
        ledger.close()
    sla, variable = read_sla(output_dir)
    records = load_records(output_dir)
    return _Data(output_dir, name, campaign, points, servers, extra, records_table(records), sla, variable, records)


def write_report(output_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write the report to `out` (default OUTPUT_DIR/report.html), whole or not at all."""
    return write_text_atomic(Path(out) if out else Path(output_dir) / REPORT_FILE, build_report(output_dir))


def build_report(output_dir: str | Path) -> str:
    """The report of a raysweep output dir as one HTML document."""
    data = _read(Path(output_dir))
    body = [_validity(data), _campaign(data), _plan(data), _figures(data), _results(data), _sla(data), _transport(data),
            _failures(data), _environment(data)]
    nav = "".join(f'<a href="#{sid}">{title}</a>' for sid, title in _SECTIONS)
    made = time.strftime("%Y-%m-%d %H:%M:%S")
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>raysweep report: {_e(data.name)}</title>"
            f"<style>{_CSS}</style></head><body>\n<h1>raysweep report: {_e(data.name)}</h1>"
            f'<p class="muted">{_e(str(data.output_dir))} · made {made}</p><nav>{nav}</nav>\n'
            + "\n".join(body) + f"\n<script>{_SORT_JS}</script></body></html>\n")


# -- small HTML helpers ----------------------------------------------------------------------------------

def _e(value: Any) -> str:
    return html.escape(str(value))


def _section(sid: str, inner: str) -> str:
    title = dict(_SECTIONS)[sid]
    return f'<section id="{sid}"><h2>{title}</h2>\n{inner}\n</section>'


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
        return _section("validity", "<p>No finished run yet.</p>")
    checks = ", ".join(CHECKS)
    unknown = Counter(c for r in recs for c in unknown_checks(r))
    gaps = ("<p class=\"muted\">Not judged (nothing recorded): "
            + "; ".join(f"{c} for {n} run(s)" for c, n in unknown.items()) + ".</p>") if unknown else ""
    bad = flagged(recs)
    if not bad:
        return _section("validity", f"<p>All {len(recs)} run(s) pass every check ({_e(checks)}).</p>{gaps}")
    rows = [[r.get("serve_label", r.get("serve_id")), r.get("bench_label", r.get("bench_id")), r.get("run_number"),
             r.get("validity_issues")] for r in bad]
    return _section("validity", f'<p class="flag">{len(bad)} of {len(recs)} run(s) fail a check '
                                f"({_e(checks)}); their numbers may not be the server's. They are marked "
                                "&#9888; in the results table and with a red cross in the figures.</p>"
                                + _table(["server config", "bench point", "run", "failed checks"], rows) + gaps)


def _campaign(data: _Data) -> str:
    text = yaml.safe_dump(data.campaign, sort_keys=False, default_flow_style=False)
    return _section("campaign", f"<p>As stored in the ledger (secrets masked).</p><pre>{_e(text)}</pre>")


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
    return _section("plan", f"<p>{len(_by_serve(data.points))} server config(s), "
                            f"{len({p.bench_id for p in data.points})} bench point(s), "
                            f"{len({p.run for p in data.points})} run(s) each.</p>{counts}{configs}{extra}")


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
        return _section("figures", "<p>No finished run yet.</p>")
    parts = [_figure(title, draw) for title, draw in _figure_list(data)]
    return _section("figures", "\n".join(parts))


def _figure_list(data: _Data) -> list[tuple[str, Callable[[], tuple[Figure | None, list[str]]]]]:
    """(caption, drawing function) of every figure the report shows."""
    df = data.df
    if plots.is_offline(df):
        base = plots.PlotSpec(fig_height=3.2)
        return [(f"{spec.var_y} against {spec.var_x}", lambda spec=spec: _one(plots.plan_curves(df, spec), spec))
                for spec in plots.offline_specs(df, base)]
    serve_vars, bench_vars = _param_names(data.points, df)
    load = plots.load_variable(df, "total_token_throughput")
    cols = tuple(v for v in bench_vars if v not in (load, data.sla_variable))
    out: list[tuple[str, Callable[[], tuple[Figure | None, list[str]]]]] = []
    for metric in (m for m in CURVE_METRICS if m in df.columns):
        spec = plots.PlotSpec(var_x=load, var_y=metric, col_by=cols, curve_by=tuple(serve_vars), fig_height=3.2)
        out.append((f"{metric} against {load}", lambda spec=spec: _one(plots.plan_curves(df, spec), spec)))
    spec = plots.PlotSpec(col_by=(), row_by=cols, curve_by=tuple(serve_vars), fig_height=3.0)
    out.append((f"server-side metrics against {load}",
                lambda: _one(plots.plan_server_metrics(df, spec, load), spec)))
    out.append(("Pareto front (every run; front without dominated ties)", lambda: _pareto(df)))
    if not data.sla.empty:
        out.append(("SLA: largest passing value per server config and target",
                    lambda: (plots.sla_figure(data.sla, data.sla_variable), [])))
    return out


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
    png = base64.b64encode(plots.figure_bytes(fig, "png", dpi=110)).decode()
    note = "".join(f'<br><span class="note">{_e(n)}</span>' for n in notes)
    return (f'<figure><img alt="{_e(caption)}" src="data:image/png;base64,{png}">'
            f"<figcaption>{_e(caption)}{note}</figcaption></figure>")


def _results(data: _Data) -> str:
    df = data.df
    if df.empty:
        return _section("results", "<p>No finished run yet.</p>")
    params = [k for p in data.points for k in (*p.serve_params, *p.bench_params)]
    if "validity_ok" in df.columns:
        issues = df["validity_issues"] if "validity_issues" in df.columns else pd.Series([""] * len(df))
        mark = ["" if ok is None or (isinstance(ok, float) and math.isnan(ok)) else "ok" if bool(ok)
                else "\u26a0 " + str(i) for ok, i in zip(df["validity_ok"], issues)]
        df = df.assign(validity=mark)
    cols = [c for c in dict.fromkeys(["serve_label", "bench_label", "run_number", "validity", *params,
                                      *TABLE_METRICS]) if c in df.columns]
    return _section("results", f"<p>{len(df)} run(s); click a column to sort. Every column is in "
                               f"results.csv / results.parquet.</p>{_frame_table(df[cols], sortable=True)}")


def _sla(data: _Data) -> str:
    if data.sla.empty:
        return _section("sla", '<p class="muted">No SLA search in this campaign.</p>')
    return _section("sla", _frame_table(data.sla, sortable=True))


def _transport(data: _Data) -> str:
    """Per server config, the NCCL verdict of its latest server: links, gate, and the evidence lines."""
    latest = {s.serve_id: s for s in data.servers if s.transport}
    if not latest:
        return _section("transport", '<p class="muted">Not checked: no server of this campaign has a transport '
                                     "verdict.</p>")
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
    return _section("transport", table + "\n".join(evidence))


def _failures(data: _Data) -> str:
    failed = [p for p in data.points if p.state == PointState.FAILED]
    if not failed:
        return _section("failures", "<p>No failed point.</p>")
    items = []
    for p in failed:
        tail = f"<pre>{_e(p.log_tail)}</pre>" if p.log_tail else '<p class="muted">no log tail recorded</p>'
        items.append(f'<div class="failure"><h3>{_e(combo_label(p.serve_params))} / '
                     f"{_e(combo_label(p.bench_params))}, run {p.run}</h3><p>point {_e(p.point_id)}, "
                     f"{p.attempts} attempt(s): {_e(p.error or '')}</p>{tail}</div>")
    return _section("failures", f"<p>{len(failed)} failed point(s).</p>" + "\n".join(items))


_PROVENANCE = (("vLLM", "vllm"), ("torch", "torch"), ("NCCL", "nccl"), ("Ray", "ray"), ("raysweep", "raysweep"),
               ("Python", "python"), ("GPUs", "gpu"), ("GPU driver", "gpu_driver"), ("model path", "model_path"),
               ("model revision", "model_revision"))


def _environment(data: _Data) -> str:
    """What each server recorded when it started, and the versions the runs recorded themselves."""
    recorded = {c: sorted(map(str, data.df[c].dropna().unique())) for c in data.df.columns
                if c.endswith("_version")} if not data.df.empty else {}
    parts = []
    provs = [(s, s.provenance_record()) for s in data.servers if s.provenance]
    if provs:
        labels = {p.serve_id: combo_label(p.serve_params) for p in data.points}
        rows = [[labels.get(s.serve_id, s.serve_id), s.server_id, ",".join(p.get("hostnames") or [p.get("hostname", "")]),
                 *(p.get(k) for _, k in _PROVENANCE)] for s, p in provs]
        parts.append("<p>Recorded on each server's node when it started.</p>"
                     + _table(["server config", "server", "hosts", *(t for t, _ in _PROVENANCE)], rows))
    if recorded:
        parts.append(_table(["recorded with the runs", "value(s)"], [[k, ", ".join(v)] for k, v in recorded.items()]))
    if not parts:
        parts.append('<p class="muted">No provenance was recorded with these runs (their servers started before '
                     "raysweep recorded it).</p>")
    return _section("environment", "".join(parts) + _nodes(data.servers))


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

"""The report's record sections: Warnings (runs failing a validity check), Results (the runs' table),
SLA, Transport, Failures, Campaign, Plan and Environment (provenance and nodes)."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pandas as pd
import yaml

from raysweep.drive.validity import CHECKS
from raysweep.grid import combo_label
from raysweep.ledger import PointRow, PointState, ServerRow
from raysweep.place import transport
from raysweep.report import plots
from raysweep.report.markup import esc, frame_table, html_table, nothing
from raysweep.results import aggregate
from raysweep.results.data import ReportData
from raysweep.results.labels import fmt_value
from raysweep.results.table import flagged
from raysweep.results.validity_story import validity_counts

# The first runs of the results table only (every run is in results.csv): the report's cost stops
# growing with the runs
MAX_TABLE_ROWS = 500
TABLE_METRICS = ("gpu_count", "num_nodes", "client_limited", "completed", "failed", "request_throughput",
                 "output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms",
                 "median_e2el_ms", "p99_e2el_ms", *plots.SERVER_METRICS,
                 *(m for ms in plots.OFFLINE_METRICS.values() for m in ms if m not in ("request_throughput",
                                                                                     "output_throughput")),
                 "total_input_tokens", "total_output_tokens", "duration")


def validity_section(data: ReportData) -> str:
    """The runs that fail a check of their validity record, and the checks nothing could judge."""
    recs = data.records
    if not recs:
        return nothing("no finished run yet")
    checks = ", ".join(CHECKS)
    counts = validity_counts(recs)  # the count `status` prints: a check not judged is never a check passed
    gaps = (f'<p class="muted">Not judged: {esc(counts.gaps())}.</p>' if counts.not_judged
            else "")
    bad = flagged(recs)
    spans = _hardware_spans(recs)
    if not bad and not counts.partly_judged:
        return f"<p>All {len(recs)} run(s) pass every check ({esc(checks)}).</p>{gaps}"
    if not bad:
        return (f"<p>None of the {len(recs)} run(s) fails a check ({esc(checks)}): {counts.passed} pass every "
                f"check; {counts.partly_judged} could not be judged on every check, so they are not counted as "
                f"passing it.</p>{gaps}")
    return spans + (f'<p class="flag">{len(bad)} of {len(recs)} run(s) fail a check ({esc(checks)}); their numbers may '
            "not be the server's, so the conclusions leave them out of every ranking and comparison. They are "
            "marked &#9888; in the results table and, with the check's name, in the figures.</p>"
            + _grouped_by_check(bad) + gaps)


def _hardware_spans(recs: list[dict[str, Any]]) -> str:
    """The configurations whose runs span more than one hardware, with their runs per hardware."""
    from raysweep.serve.hardware import mixed

    spans = mixed(recs)
    if not spans:
        return ""
    rows = [[sid, h, n] for sid, kinds in spans.items() for h, n in kinds.items()]
    return (f'<p class="flag">{len(spans)} server config(s) ran on more than one hardware (a node lost, a resume '
            "on other nodes): the runs off each one's main hardware fail the <em>other hardware</em> check and are "
            "left out of its aggregates.</p>" + html_table(["server config", "hardware", "runs"], rows))


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
        parts.append(f'<details><summary class="flag">{esc(name)}: {len(runs)} run(s)</summary>'
                     + html_table(["server config", "bench point", "run", "failed checks"], rows) + "</details>")
    return "".join(parts)


def campaign_section(data: ReportData) -> str:
    text = yaml.safe_dump(data.campaign, sort_keys=False, default_flow_style=False)
    return f"<p>As stored in the ledger (secrets masked).</p><pre>{esc(text)}</pre>"


def plan_section(data: ReportData) -> str:
    states = Counter(p.state.value for p in data.points)
    counts = html_table([s.value for s in PointState] + ["total"],
                    [[states.get(s.value, 0) for s in PointState] + [len(data.points)]])
    shapes = _shapes(data.df)
    rows = []
    for serve_id, mine in _by_serve(data.points).items():
        st = Counter(p.state.value for p in mine)
        rows.append([combo_label(mine[0].serve_params), serve_id, shapes.get(serve_id, ""),
                     len({p.bench_id for p in mine}), *(st.get(s.value, 0) for s in PointState)])
    configs = html_table(["server config", "id", "tp x pp x dp", "bench points", *(s.value for s in PointState)], rows)
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
    return {sid: " x ".join(fmt_value(v) for v in row) for sid, row in first.iterrows()}


def results_section(data: ReportData) -> str:
    df = data.df
    if df.empty:
        return nothing("no finished run yet")
    params = [k for p in data.points for k in (*p.serve_params, *p.bench_params)]
    if "validity_ok" in df.columns:
        issues = df["validity_issues"] if "validity_issues" in df.columns else pd.Series([""] * len(df))
        mark = ["" if ok is None or (isinstance(ok, float) and math.isnan(ok)) else "ok" if bool(ok)
                else "\u26a0 " + str(i) for ok, i in zip(df["validity_ok"], issues)]
        df = df.assign(validity=mark)
    where = ["hardware"] if "hardware_mixed" in df.columns and df["hardware_mixed"].fillna(False).astype(bool).any() \
        else []  # shown when a configuration's runs span hardware
    cols = [c for c in dict.fromkeys(["serve_label", "bench_label", "run_number", "validity", *where, *params,
                                      *TABLE_METRICS]) if c in df.columns]
    cut = (f' The first {MAX_TABLE_ROWS} are shown; every run is in <a href="results.csv">results.csv</a>.'
           if len(df) > MAX_TABLE_ROWS else "")
    return (f"<p>{len(df)} run(s); click a column to sort. Every column is in results.csv / results.parquet; "
            f"the per-point aggregates are in summary.csv.{cut}</p>"
            f"{frame_table(df[cols].head(MAX_TABLE_ROWS), sortable=True)}")


def sla_section(data: ReportData) -> str:
    if data.sla.empty:
        return nothing("no SLA search in this campaign")
    return frame_table(data.sla, sortable=True)


def transport_section(data: ReportData) -> str:
    """Per server config, the NCCL verdict of its latest server: links, gate, and the evidence lines."""
    latest = {s.serve_id: s for s in data.servers if s.transport}
    if not latest:
        return nothing("not checked: no server of this campaign has a transport verdict")
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
        evidence.append(f"<details><summary>{esc(labels.get(serve_id, serve_id))}: evidence</summary>"
                        f"<pre>{esc(lines)}</pre></details>")
    table = html_table(["server config", "server", "nodes", "inter-node", "intra-node", "NET plugins", "IB devices",
                    "NCCL", f"gate ({require})"], rows)
    links = [[labels.get(s.serve_id, s.serve_id), s.server_id, line] for s in data.servers
             for line in transport.describe_probe_links(s.fabric_record())]
    if links:
        table += "<h3>Links measured by the fabric probe</h3>" + html_table(["server config", "server", "link"], links)
    return table + "\n".join(evidence)


def failures_section(data: ReportData) -> str:
    """The failed points, grouped by server config and error: a configuration that failed the same way on
    every point is one entry listing its points, with one log tail."""
    failed = [p for p in data.points if p.state == PointState.FAILED]
    if not failed:
        return nothing("no failed point")
    groups: dict[tuple[str, str], list[Any]] = {}
    for p in failed:
        groups.setdefault((combo_label(p.serve_params), p.error or ""), []).append(p)
    items = []
    for (serve, error), points in groups.items():
        first = points[0]
        tail = f"<pre>{esc(first.log_tail)}</pre>" if first.log_tail else '<p class="muted">no log tail recorded</p>'
        which = "; ".join(f"{combo_label(p.bench_params)} run {p.run}, {p.attempts_made} attempt(s), point {p.point_id}"
                          for p in points)
        whose = f"The log tail of point {first.point_id}:" if len(points) > 1 else "Its log tail:"
        items.append(f'<div class="failure"><h3>{esc(serve)}: {len(points)} point(s)</h3><p>{esc(error)}</p>'
                     f'<p class="muted">{esc(which)}.</p><p class="muted">{esc(whose)}</p>{tail}</div>')
    return (f"<p>{len(failed)} failed point(s), {len(groups)} way(s) of failing (by server config and "
            "error).</p>" + "\n".join(items))


_PROVENANCE = (("vLLM", "vllm"), ("torch", "torch"), ("NCCL", "nccl"), ("Ray", "ray"), ("raysweep", "raysweep"),
               ("Python", "python"), ("GPUs", "gpu"), ("GPU driver", "gpu_driver"), ("model path", "model_path"),
               ("model revision", "model_revision"))


def environment_section(data: ReportData) -> str:
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
                     + html_table(["server config", "server", "hosts", *(t for t, _ in _PROVENANCE)], rows))
    if recorded:
        parts.append(html_table(["recorded with the runs", "value(s)"],
                                [[k, ", ".join(v)] for k, v in recorded.items()]))
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
            + html_table(["host", "IP", "node id", "GPU ids used", "server starts"], rows))


def _gpu_key(gpu: str) -> tuple[int, str]:
    return (int(gpu), "") if gpu.isdigit() else (1 << 30, gpu)

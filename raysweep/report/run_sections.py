"""The report's sections of what happened while the campaign ran: the time series of each bench point, the
multi-node and GPU record of each server (links, fabric probe, topology, cluster events, GPU telemetry) and
the events the ledger recorded.
"""

from __future__ import annotations

import base64
import datetime
import html
import json
import logging
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysweep.bench import timeseries
from raysweep.place import transport
from raysweep.record.directory import CampaignDir
from raysweep.report.cache import cached
from raysweep.report.plots import figure_bytes
from raysweep.report.plots.style import config_colors
from raysweep.results.table import load_records, results_table
from raysweep.serve.telemetry import THROTTLED_FRACTION

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["events_section", "multinode_section", "timeseries_section"]

log = logging.getLogger(__name__)

_MAX_FIGURES = 40


def timeseries_section(directory: CampaignDir, records: Sequence[dict[str, Any]] | None = None) -> str | None:
    """The report's time-series section: one figure per bench point of each server config (its first
    run), the steady-state window shaded; None when no point has a time series. `records`: the output dir's
    (`load_records`), when the caller has read them already."""
    records = sorted((r for r in (load_records(directory) if records is None else records)
                      if r.get("timeseries_path")),
                     key=lambda r: (str(r.get("serve_id")), str(r.get("bench_id")), r.get("run_number") or 0))
    firsts: dict[tuple[str, str], dict[str, Any]] = {}
    for r in records:
        firsts.setdefault((str(r.get("serve_id")), str(r.get("bench_id"))), r)
    if not firsts:
        return None
    e = html.escape
    parts = ['<p>Per bench point (its first run): output throughput and requests in flight, TTFT and ITL '
             'percentiles per bin, and the server\'s gauges; the shaded band is the steady-state window over '
             'which the <code>steady_*</code> fields are computed (see docs/workloads.md).</p>']
    for r in list(firsts.values())[:_MAX_FIGURES]:
        caption = f"{r.get('serve_label') or r.get('serve_id')} · {r.get('bench_label') or r.get('bench_id')}"
        window = ("no steady-state window" if r.get("steady_window_start_s") is None else
                  f"steady {r['steady_window_start_s']:g} to {r['steady_window_end_s']:g} s")
        try:
            path = directory.path / r["timeseries_path"]
            # kept by a written report while the record and its time series are unchanged (raysweep.report.cache)
            parts.append(cached(partial(_figure_key, path, r, caption, window),
                                partial(_figure_html, path, r, caption, window)))
        except Exception as exc:
            log.warning("time series of %s not drawn: %s", r.get("point_id"), exc)
            parts.append(f'<p class="note">{e(caption)}: not drawn ({e(str(exc))})</p>')
    if len(firsts) > _MAX_FIGURES:
        parts.append(f'<p class="muted">{len(firsts) - _MAX_FIGURES} more points have a time series (their '
                     "parquet files are under points/).</p>")
    return "\n".join(parts)


def _figure_html(path: Path, record: dict[str, Any], caption: str, window: str) -> str:
    """A point's time-series figure drawn, as the report embeds it."""
    fig = timeseries.figure(timeseries.read_timeseries(path), record)
    png = base64.b64encode(figure_bytes(fig, "png", dpi=90)).decode()
    return (f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,{png}">'
            f"<figcaption>{html.escape(caption)} ({html.escape(window)})</figcaption></figure>")


def _figure_key(path: Path, record: dict[str, Any], caption: str, window: str) -> tuple[Any, ...]:
    """What a time-series figure is drawn from: its record, its file's bytes (None when unreadable: then
    drawing fails and says why), its caption."""
    try:
        data: bytes | None = path.read_bytes()
    except OSError:
        data = None
    return ("timeseries", json.dumps(record, sort_keys=True, default=str), data, caption, window)


def multinode_section(directory: CampaignDir, results: pd.DataFrame | None = None) -> str | None:
    """The report's multi-node section: per server, its node-pair links and fabric probe, GPU topology
    warnings, the cluster events (node losses, re-placements, tail replicas), and the GPU telemetry of every
    point (a figure; throttled points crossed in red). None when there is nothing of the kind. `results`: the
    output dir's results table (`results_table`), when the caller has made it already."""
    e = html.escape
    ledger = directory.ledger
    servers, events = ledger.servers(), ledger.events()
    parts: list[str] = []
    rows = []
    for s in servers:
        v, probe, topo = s.transport_verdict() or {}, s.fabric_record(), s.topology_record() or []
        names = [str(r.get("node_ip") or "?") for r in s.rank_list()]
        links = transport.describe_links(v, names)
        warnings = [w for t in topo for w in t.get("warnings") or []]
        if not (links or probe or warnings) and int(v.get("nnodes", 1) or 1) < 2:
            continue
        bw = ("" if probe is None else f"{probe['busbw_gbps']:.2f} GB/s ({probe.get('backend')}, {probe.get('world')} "
              f"ranks)" if probe.get("busbw_gbps") is not None else f"failed: {probe.get('error')}")
        rows.append(f"<tr><td>{e(s.serve_id)}</td><td>{e(s.server_id)}</td>"
                    f"<td>{'<br>'.join(e(x) for x in links) or '-'}</td>"
                    f"<td>{e(bw or '-')}</td><td>{e('; '.join(warnings) or '-')}</td></tr>")
    if rows:
        parts.append("<p>Per server: the links NCCL chose between each pair of nodes, the all-reduce bus bandwidth "
                     "the fabric probe measured before it started, and GPU topology warnings.</p><table><tr>"
                     "<th>server config</th><th>server</th><th>node-pair links</th><th>fabric probe</th>"
                     "<th>topology</th></tr>" + "".join(rows) + "</table>")
    if events:
        parts.append("<h3>Cluster events</h3><table><tr><th>time</th><th>event</th><th>server config</th>"
                     "<th>nodes</th><th>detail</th></tr>" + "".join(
                         f"<tr><td>{datetime.datetime.fromtimestamp(ev['at']):%Y-%m-%d %H:%M:%S}</td>"
                         f"<td>{e(ev['kind'])}</td><td>{e(','.join(ev['serve_ids']))}</td>"
                         f"<td>{e(', '.join(n[:12] for n in ev['nodes']))}</td><td>{e(str(ev['detail']))}</td></tr>"
                         for ev in events) + "</table>")
    try:
        df = results_table(directory) if results is None else results
    except Exception:
        df = None
    if df is not None and "gpu_util_mean_pct" in df.columns and df["gpu_util_mean_pct"].notna().any():
        whole, df = df, df[df["gpu_util_mean_pct"].notna()].sort_values("started_at")
        if "gpu_throttled_fraction" not in df.columns:
            df["gpu_throttled_fraction"] = 0.0
        png = base64.b64encode(figure_bytes(_telemetry_figure(df, config_colors(whole)), "png", dpi=90)).decode()
        hot = int((df["gpu_throttled_fraction"].fillna(0) > THROTTLED_FRACTION).sum())
        parts.append(f'<h3>GPU telemetry</h3><figure><img alt="GPU telemetry" src="data:image/png;base64,{png}">'
                     f"<figcaption>NVML samples of each server's own GPUs during every point; {hot} point(s) "
                     "throttled (red crosses).</figcaption></figure>")
    elif df is not None and "gpu_telemetry" in df.columns and len(df):
        sources = sorted({str(x) for x in df["gpu_telemetry"].dropna()})
        parts.append(f'<p class="muted">GPU telemetry: {e(", ".join(sources))}.</p>')
    return "\n".join(parts) or None


def _telemetry_figure(df: pd.DataFrame, palette: dict[str, Any]) -> Any:
    """Utilisation, power and SM clock per point (throttled points in red), each server config in the campaign's
    colour (`config_colors`: the same as on every other figure of the page)."""
    from matplotlib.figure import Figure

    from raysweep.results.labels import fmt_value

    cols = [("gpu_util_mean_pct", "GPU utilisation %"), ("gpu_power_mean_w", "power W (mean)"),
            ("gpu_sm_clock_mean_mhz", "SM clock MHz (mean)")]
    fig = Figure(figsize=(11, 3.2), layout="constrained")
    axes = fig.subplots(1, 3)
    for ax, (col, title) in zip(axes, cols, strict=True):
        for i, (label, g) in enumerate(df.groupby("serve_label", sort=False)):
            color = palette.get(fmt_value(label), f"C{i % 10}")
            ax.plot(range(len(g)), g[col], "o-", label=str(label)[:40], color=color, ms=4)
            hot = g["gpu_throttled_fraction"].fillna(0).to_numpy() > THROTTLED_FRACTION
            if hot.any():
                ax.plot([j for j, h in enumerate(hot) if h], g[col].to_numpy()[hot], "x", color="red", ms=9)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("point (in run order)", fontsize=8)
    axes[0].legend(fontsize=6)
    return fig


def events_section(events: Sequence[dict[str, Any]], drivers: Sequence[dict[str, Any]]) -> str | None:
    """The report's Events section: every event the ledger recorded (node losses, replaced servers, accepted
    settings changes, ...) and every driver that was lost (killed, crashed), in time order; None when none.
    `events` and `drivers`: the ledger's (`Ledger.events`, `Ledger.drivers`)."""
    rows = [(e["at"], e["kind"], ", ".join(e["serve_ids"]), ", ".join(e["nodes"]), e["detail"] or "") for e in events]
    rows += [(d["ended_at"] or d["started_at"], "driver_lost", "", d["hostname"],
              f"driver pid {d['pid']} (started {_clock(d['started_at'])}) ended without releasing the campaign")
             for d in drivers if d["outcome"] == "lost"]
    if not rows:
        return None
    body = "".join(f"<tr><td>{_clock(at)}</td>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in rest) + "</tr>"
                   for at, *rest in sorted(rows, key=lambda r: r[0]))
    return (f"<p>{len(rows)} event(s).</p><table><thead><tr><th>time (UTC)</th><th>event</th><th>server config</th>"
            f"<th>nodes</th><th>detail</th></tr></thead><tbody>{body}</tbody></table>")


def _clock(at: float | None) -> str:
    return datetime.datetime.fromtimestamp(at, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S") if at else ""

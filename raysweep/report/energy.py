"""The report's Energy and cost section: per point the energy per token and the price per million tokens,
each with its interval across runs, how and over which window they were measured; the Pareto front of
energy (and cost) per token against tokens/s per user; the campaign's own GPU-hours and cost. Where no
point has an energy reading, the section says why (never a zero)."""

from __future__ import annotations

import base64
import math
from typing import Any

import pandas as pd

from raysweep.bench.load import CONCURRENCY
from raysweep.campaign import CostSpec
from raysweep.maths import pareto as geometry
from raysweep.plan import cost
from raysweep.report.markup import esc, html_table
from raysweep.report.plots.style import config_colors
from raysweep.results import aggregate
from raysweep.results.data import ReportData
from raysweep.results.labels import fmt_value

__all__ = ["front", "report_section", "spend_line"]

_SHOWN = (("j_per_output_token", "J / output token"), ("net_j_per_output_token", "net J / output token"),
          ("output_tokens_per_j", "output tokens / J"), ("power_mean_w", "mean power W"),
          ("cost_per_m_output_tokens", "cost / M output tokens"), ("cost_per_m_total_tokens", "cost / M total tokens"))


def _num(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _cell(row: pd.Series, metric: str) -> str:
    mean, lo, hi = (_num(row.get(f"{metric}_{s}")) for s in ("mean", "ci_low", "ci_high"))
    if not math.isfinite(mean):
        return "-"
    ci = f" [{lo:.4g}, {hi:.4g}]" if math.isfinite(lo) and math.isfinite(hi) else ""
    return f"{mean:.4g}{ci}"


def front(points: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The points no other beats on both tokens/s per user (higher) and `metric` per token (lower)."""
    usable = points[points["tokens_per_user"].notna() & points[metric].notna()].reset_index(drop=True)
    if usable.empty:
        return usable
    idx = geometry.pareto_front(usable[["tokens_per_user", metric]].to_numpy().tolist(), ["maximize", "minimize"])
    return usable.iloc[sorted(idx)].sort_values("tokens_per_user")


def _points(df: pd.DataFrame) -> pd.DataFrame:
    """One row per point: its labels, the aggregates of the energy and cost columns and tokens/s per user."""
    summary = aggregate.summarize(df)
    firsts = df.drop_duplicates(["serve_id", "bench_id"])
    keep = [c for c in ("serve_id", "bench_id", "serve_label", "bench_label", CONCURRENCY, "energy_method",
                        "energy_window", "energy_source") if c in firsts.columns]
    pts = firsts[keep].merge(summary, on=["serve_id", "bench_id"], how="inner", suffixes=("", "_agg"))
    users = pd.to_numeric(pts.get(CONCURRENCY, pd.Series(math.nan, index=pts.index)), errors="coerce")
    rate = pd.to_numeric(pts.get("output_throughput_mean", pd.Series(math.nan, index=pts.index)), errors="coerce")
    pts["tokens_per_user"] = rate / users
    for metric, _ in _SHOWN:
        if f"{metric}_mean" in pts.columns:
            pts[metric] = pd.to_numeric(pts[f"{metric}_mean"], errors="coerce")
    return pts


def spend_line(data: ReportData) -> str:
    """The campaign's own GPU-hours (every server, start to stop, failed starts too) and their cost."""
    block = data.campaign.get("cost")
    spec = CostSpec.model_validate(block) if block else None
    s = cost.campaign_spend(spec, data.servers, now=max([x.stopped_at or x.started_at for x in data.servers],
                                                           default=0.0))
    text = (f"The campaign held {s['gpu_hours']:.2f} GPU-hour(s) ({s['node_hours']:.2f} node-hour(s)) over "
            f"{s['servers']} server start(s), weights loading, warmups and failed starts included")
    if spec is None:
        return text + "; no <code>cost:</code> block prices them."
    unpriced = f"; {s['unpriced']} server(s) not priced" if s["unpriced"] else ""
    return text + f": {s['cost']:.2f} {esc(s['currency'])}{unpriced}."


def _figure(pts: pd.DataFrame, metrics: list[str], palette: dict[str, Any]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from raysweep.report.plots import figure_bytes

    fig, axes = plt.subplots(1, len(metrics), figsize=(5.2 * len(metrics), 3.4), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        for i, (label, g) in enumerate(pts.groupby("serve_label", sort=False)):
            ax.plot(g["tokens_per_user"], g[metric], "o", color=palette.get(fmt_value(label), f"C{i % 10}"),
                    label=str(label)[:40], ms=5)
        f = front(pts, metric)
        if len(f):
            ax.plot(f["tokens_per_user"], f[metric], "-", color="black", lw=1, label="Pareto front")
        ax.set_xlabel("output tokens/s per user", fontsize=8)
        ax.set_ylabel(dict(_SHOWN)[metric], fontsize=8)
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    png = base64.b64encode(figure_bytes(fig, "png", dpi=90)).decode()
    plt.close(fig)
    return (f'<figure><img alt="energy and cost per token" src="data:image/png;base64,{png}"><figcaption>'
            "Per point (mean over its runs): energy and cost per output token against output tokens/s per user; "
            "the line is the front (none of its points is beaten on both).</figcaption></figure>")


def report_section(data: ReportData) -> str | None:
    """The section (see the module docstring); None when the campaign has no result yet."""
    df = data.df
    if df is None or df.empty or not {"serve_id", "bench_id"} <= set(df.columns):
        return None
    has_energy = "energy_j" in df.columns and pd.to_numeric(df["energy_j"], errors="coerce").notna().any()
    has_cost = "cost_per_m_output_tokens" in df.columns and \
        pd.to_numeric(df["cost_per_m_output_tokens"], errors="coerce").notna().any()
    parts = [f"<p>{spend_line(data)}</p>"]
    if not has_energy:
        why = sorted({str(n) for n in df.get("energy_note", pd.Series(dtype=str)).dropna()})
        parts.append('<p class="note">No energy was measured: ' + esc("; ".join(why) or "no energy reading "
                     "recorded (results from before energy was measured)") + ". The energy fields are absent, "
                     "not zero (docs/energy.md).</p>")
    if not has_energy and not has_cost:
        return "\n".join(parts)
    pts = _points(df)
    shown = [(m, t) for m, t in _SHOWN if f"{m}_mean" in pts.columns and pts[f"{m}_mean"].notna().any()]
    rows = [[r.get("serve_label"), r.get("bench_label"), *[_cell(r, m) for m, _ in shown],
             r.get("energy_method", ""), r.get("energy_window", "")] for _, r in pts.iterrows()]
    parts.append("<p>Per point, the mean over its runs and its 95 % interval across runs. Energy is the sum over "
                 "the server's GPUs (every node) over the window the steady-state test judged, gross and net of "
                 "the idle power measured before the server's first load; cost is the GPU-hour price over the "
                 "tokens made per hour (plus energy at the power price, where set).</p>")
    parts.append(html_table(["server config", "bench point", *[t for _, t in shown], "method", "window"], rows,
                            sortable=True))
    metrics = [m for m in ("j_per_output_token", "cost_per_m_output_tokens")
               if m in pts.columns and pts[m].notna().any()]
    if metrics and pts["tokens_per_user"].notna().any():
        parts.append(_figure(pts, metrics, config_colors(df)))
    return "\n".join(parts)

"""The report's Runs over time section: where the runs drift.

Every point's runs get the trend test over the order they were measured in (`results.aggregate.runs_over_time`,
`over_time.trend`), and every server configuration's runs, and the campaign's, the same test over their time
order with one level per point (`over_time.timeline`). The section draws each run's value relative to its
point's mean against when it started, a colour per server configuration, the runs of drifting points ringed,
and lists the drifting points with their slopes.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pandas as pd

from raysweep.maths import over_time
from raysweep.report.markup import esc, html_table, nothing
from raysweep.report.plots.style import config_colors
from raysweep.results import aggregate
from raysweep.results.data import ReportData, answer_of
from raysweep.results.labels import fmt_value

__all__ = ["timeline_section", "timelines"]

log = logging.getLogger(__name__)


def _used(df: pd.DataFrame) -> pd.DataFrame:
    left = aggregate.left_out_mask(df)
    return df[~left] if (~left).any() else df


def timelines(df: pd.DataFrame, metric: str) -> list[tuple[str, over_time.Trend]]:
    """(server configuration, its timeline's trend) per configuration, then ("all servers", the campaign's)."""
    if df.empty or metric not in df.columns or "started_at" not in df.columns:
        return []
    runs = _used(df).sort_values("started_at", kind="stable")
    key = runs["serve_id"].astype(str) + "/" + runs["bench_id"].astype(str)
    values = pd.to_numeric(runs[metric], errors="coerce")
    out = []
    for sid, part in runs.groupby("serve_id", sort=True):
        label = str(part["serve_label"].iloc[0]) if "serve_label" in part.columns else str(sid)
        out.append((label, over_time.timeline(list(key[part.index]), list(values[part.index]))))
    if runs["serve_id"].nunique() > 1:
        out.append(("all servers", over_time.timeline(list(key), list(values))))
    return out


def _figure(df: pd.DataFrame, metric: str, drifting: set[tuple[str, str]]) -> Any:
    from matplotlib.figure import Figure  # only where the figure is drawn: a report of kept figures needs none

    palette = config_colors(df)
    runs = _used(df)
    t0 = float(pd.to_numeric(runs["started_at"], errors="coerce").min())
    fig = Figure(figsize=(9.0, 3.6), layout="constrained")
    ax = fig.subplots()
    for i, (sid, part) in enumerate(runs.groupby("serve_id", sort=True)):
        label = str(part["serve_label"].iloc[0]) if "serve_label" in part.columns else str(sid)
        color = palette.get(fmt_value(part["serve_label"].iloc[0]) if palette else "", f"C{i % 10}")
        values = pd.to_numeric(part[metric], errors="coerce")
        mean = values.groupby(part["bench_id"]).transform("mean")
        x = (pd.to_numeric(part["started_at"], errors="coerce") - t0) / 60.0
        y = 100.0 * (values / mean - 1.0)
        ax.scatter(x, y, s=14, color=color, label=label)
        ring = np.asarray([(str(sid), str(b)) in drifting for b in part["bench_id"]])
        if ring.any():
            ax.scatter(x[ring], y[ring], s=60, facecolors="none", edgecolors="red", linewidths=1.2)
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set_xlabel("run started (minutes into the campaign)")
    ax.set_ylabel(f"{metric}: % from its point's mean")
    ax.legend(loc="best", fontsize="small", title="ringed: a drifting point")
    return fig


def timeline_section(data: ReportData) -> str:
    """The section (a line saying why when the runs do not say when they started)."""
    from raysweep.report.figures import figure_html

    df = data.df
    metric = next((m for m in aggregate.TREND_METRICS if m in df.columns), None)
    if df.empty or metric is None or "started_at" not in df.columns:
        return nothing("no run says when it started")
    try:
        points = answer_of(data).points
    except Exception as exc:  # the conclusions' own section says why they fail
        log.info("runs over time without the conclusions: %s", exc)
        points = pd.DataFrame()
    drift = points[points["drift"] == "drifts"] if "drift" in points.columns else points.iloc[0:0]
    judged = int((points["drift"].isin(["drifts", "no drift shown"])).sum()) if "drift" in points.columns else 0
    head = (f"<p>Every point's runs are tested for a trend over the order they ran in (least-squares slope of "
            f"{esc(metric)}, Student's t at 5 %): {len(drift)} of {judged} point(s) judged drift. A drifting point "
            "is never green in the conclusions nor reached by <code>bench.precision</code>; its interval does not "
            "hold a level that a later run would see.</p>")
    rows = [[r.get("serve_label"), r.get("bench_label") or r.get("bench_id"), f"{float(r['drift_pct_per_run']):+.2f}",
             r.get("drift_text")] for _, r in drift.iterrows()]
    table = html_table(["server config", "bench point", "%/run", "trend"], rows) if rows else ""
    outliers = points[points["outlier_text"].astype(str).str.startswith("run ")] \
        if "outlier_text" in points.columns else points.iloc[0:0]
    if len(outliers):
        table += ("<p>Outlier runs (Grubbs' test at 1 %, left out of their point's statistics):</p>"
                  + html_table(["server config", "bench point", "outlier"],
                               [[r.get("serve_label"), r.get("bench_label") or r.get("bench_id"), r.get("outlier_text")]
                                for _, r in outliers.iterrows()]))
    lines = timelines(df, metric)
    servers = ("<p>Over each server's timeline (every run relative to its point's mean, in time order): "
               + "; ".join(f"{esc(name)}: {esc(t.text)}" for name, t in lines) + ".</p>") if lines else ""
    keys = {(str(r["serve_id"]), str(r["bench_id"])) for _, r in drift.iterrows()}
    drawn = df[[c for c in ("serve_id", "serve_label", "bench_id", "started_at", metric, "validity_ok",
                            "client_limited") if c in df.columns]]
    figure = figure_html(f"{metric} of every run against its start, relative to its point's mean",
                         lambda: (_figure(drawn, metric, keys), []), ("timeline", drawn, sorted(keys)))
    return head + table + servers + figure

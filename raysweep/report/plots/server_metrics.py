"""Server-side metrics against the load: KV cache usage peak, waiting requests peak, preemptions, and a
latency beside them.
"""

from __future__ import annotations

import pandas as pd

from raysweep.report.plots.curves import (
    FigurePlan,
    Panel,
    PlotSpec,
    _curves,
    _figure_groups,
    _mixing_note,
    _panel_title,
    _prepare,
    _require_numeric,
)
from raysweep.report.plots.style import curve_colors
from raysweep.results.labels import axis_label
from raysweep.results.rows import _curve_title, _flagged_note, _groups, _limited_note, _numeric

SERVER_METRICS: tuple[str, ...] = ("server_kv_cache_usage_perc_peak", "server_num_requests_waiting_peak",
                                   "server_num_preemptions")
_LATENCY_PANEL = ("p99_ttft_ms", "median_ttft_ms")  # the latency beside the server metrics, first present


def plan_server_metrics(df: pd.DataFrame, spec: PlotSpec, load_var: str) -> list[FigurePlan]:
    """Server-side metrics (KV cache usage peak, waiting requests peak, preemptions) and a latency beside
    them against the load variable: one column per metric, rows by `row_by` then `col_by`, curves by
    `curve_by` (by server config when none is given). Empty when the table has none of the server metrics."""
    metrics = [m for m in SERVER_METRICS if m in df.columns and pd.to_numeric(df[m], errors="coerce").notna().any()]
    # a metric that is 0 on every run (preemptions where there were none, a CPU server's KV cache) is a flat
    # line: said in a note, not drawn
    flat = [m for m in metrics if (pd.to_numeric(df[m], errors="coerce").dropna() == 0).all()]
    metrics = [m for m in metrics if m not in flat]
    if not metrics:
        return []
    flat_note = [f"{', '.join(flat)}: 0 on every run, no panel of its own"] if flat else []
    whole = df
    metrics += [m for m in _LATENCY_PANEL if m in df.columns][:1]
    curve_by = spec.curve_by or (("serve_label",) if "serve_label" in df.columns else ())
    row_by = (*spec.row_by, *spec.col_by)
    df = _prepare(df, spec, {"--load-var": [load_var], "--row-by": spec.row_by, "--col-by": spec.col_by,
                             "--curve-by": curve_by, "--fig-by": spec.fig_by})
    _require_numeric(df, {"--load-var": load_var})
    plans = []
    for stem, title, fdf in _figure_groups(df, spec, "SERVER"):
        rows, row_order = _groups(fdf, row_by)
        curves, curve_order = _groups(fdf, curve_by)
        panels, notes = [], flat_note + _limited_note(fdf) + _flagged_note(fdf)
        for r in row_order:
            row = []
            for metric in metrics:
                cell, dropped = _numeric(fdf[rows == r], [load_var, metric])
                notes += dropped
                row.append(Panel(_panel_title(r, metric), axis_label(load_var), axis_label(metric),
                                 _curves(cell, load_var, metric, curves[cell.index]), from_zero=True))
            panels.append(row)
        notes += _mixing_note(fdf, [rows, curves], load_var)
        plans.append(FigurePlan(stem, title or "server-side metrics", panels, curve_order, _curve_title(curve_by),
                                len(fdf), list(dict.fromkeys(notes)),
                                curve_colors(whole, fdf, curve_by)))
    return plans

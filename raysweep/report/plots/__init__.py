"""Figures from a results table: curves, server metrics, Pareto fronts and SLA bars (matplotlib, no display).

Rooms: `curves` (the curves of `vllm bench sweep plot`, planned then rendered), `server_metrics` (KV cache,
waiting requests, preemptions against the load), `pareto` (tokens/s per user against tokens/s per GPU),
`sla_bars` (the largest load meeting each SLA target), `table` (options, filters and the rows a figure
draws), `style` (one figure style, labels, figures written whole).
"""

from raysweep.report.plots.curves import (
    OFFLINE_METRICS,
    Curve,
    FigurePlan,
    Panel,
    PlotSpec,
    default_layout,
    describe,
    is_offline,
    load_linked,
    load_variable,
    offline_specs,
    plan_curves,
    render,
    write_plots,
)
from raysweep.report.plots.pareto import ParetoResult, gpu_counts, pareto, pareto_figure, pareto_front, write_pareto
from raysweep.report.plots.server_metrics import SERVER_METRICS, plan_server_metrics
from raysweep.report.plots.sla_bars import SLA_COLUMNS, sla_figure
from raysweep.report.plots.style import axis_label, figure_bytes, fmt_value, save_figure, sort_key, styled
from raysweep.report.plots.table import apply_filters, check_columns, client_limited_mask, split_list

__all__ = ["OFFLINE_METRICS", "SERVER_METRICS", "SLA_COLUMNS", "Curve", "FigurePlan", "Panel", "ParetoResult",
           "PlotSpec", "apply_filters", "axis_label", "check_columns", "client_limited_mask", "default_layout",
           "describe", "figure_bytes", "fmt_value", "gpu_counts", "is_offline", "load_linked", "load_variable",
           "offline_specs", "pareto", "pareto_figure", "pareto_front", "plan_curves", "plan_server_metrics", "render",
           "save_figure", "sla_figure", "sort_key", "split_list", "styled", "write_pareto", "write_plots"]

"""Figures from a results table: curves, server metrics, Pareto fronts and SLA bars (matplotlib, no display).

Rooms: `curves` (the curves of `vllm bench sweep plot`, planned then rendered), `server_metrics` (KV cache,
waiting requests, preemptions against the load), `pareto` (the figure of the front `raysweep.results.front`
finds), `sla_bars` (the largest load meeting each SLA target), `style` (one figure style, figures written
whole). The rows a figure draws (options, filters, the load variable) are `raysweep.results.rows`, and how a
value reads in a label `raysweep.results.labels`: the conclusions read them too.
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
    offline_specs,
    plan_curves,
    render,
    write_plots,
)
from raysweep.report.plots.pareto import pareto_figure, write_pareto
from raysweep.report.plots.server_metrics import SERVER_METRICS, plan_server_metrics
from raysweep.report.plots.sla_bars import sla_figure
from raysweep.report.plots.style import figure_bytes, save_figure, styled

__all__ = ["OFFLINE_METRICS", "SERVER_METRICS", "Curve", "FigurePlan", "Panel", "PlotSpec", "default_layout",
           "describe", "figure_bytes", "is_offline", "offline_specs", "pareto_figure", "plan_curves",
           "plan_server_metrics", "render", "save_figure", "sla_figure", "styled", "write_pareto", "write_plots"]

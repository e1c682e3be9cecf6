"""Figures from a results table: curves, server metrics, Pareto fronts and SLA bars (matplotlib, no display).

Rooms: `curves` (the curves of `vllm bench sweep plot`, planned then rendered), `server_metrics` (KV cache,
waiting requests, preemptions against the load), `pareto` (the figure of the front `raysweep.results.front`
finds), `sla_bars` (the largest load meeting each SLA target), `style` (one figure style, figures written
whole). The rows a figure draws (options, filters, the load variable) are `raysweep.results.rows`, and how a
value reads in a label `raysweep.results.labels`: the conclusions read them too.

Each name is imported from its room when first used (`raysweep pareto` needs the Pareto figure alone, not
the curves' planning), so that a command pays only for the rooms it draws with.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_ROOMS = {"curves": ("OFFLINE_METRICS", "Curve", "FigurePlan", "Panel", "PlotSpec", "default_layout", "describe",
                     "is_offline", "offline_specs", "plan_curves", "render", "write_plots"),
          "pareto": ("pareto_figure", "write_pareto"), "server_metrics": ("SERVER_METRICS", "plan_server_metrics"),
          "sla_bars": ("sla_figure",), "style": ("figure_bytes", "save_figure", "styled")}
_ROOM_OF = {name: room for room, names in _ROOMS.items() for name in names}


def __getattr__(name: str) -> Any:
    """A name of `__all__` from its room, imported on first use."""
    room = _ROOM_OF.get(name)
    if room is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{room}"), name)
    globals()[name] = value
    return value


__all__ = ["OFFLINE_METRICS", "SERVER_METRICS", "Curve", "FigurePlan", "Panel", "PlotSpec", "default_layout",
           "describe", "figure_bytes", "is_offline", "offline_specs", "pareto_figure", "plan_curves",
           "plan_server_metrics", "render", "save_figure", "sla_figure", "styled", "write_pareto", "write_plots"]

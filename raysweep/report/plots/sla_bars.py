"""SLA bars: per server configuration and bench point, the largest load that met each target.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from raysweep.report.plots.style import _COLORS, styled
from raysweep.results.labels import fmt_value
from raysweep.results.rows import SLA_COLUMNS, check_columns

if TYPE_CHECKING:  # imported where the figure is drawn
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure



@styled
def sla_figure(sla: pd.DataFrame, variable: str, fig_height: float = 3.0) -> Figure:
    """The largest passing value of `variable` per server config, one panel per target, one bar per bench
    point. `sla` has one row per server config x bench point x target with at least `SLA_COLUMNS`
    (`results.sla_table`): `largest_pass` is inf when the target held at unbounded load, empty when no
    value passed; any state but `found` is written beside its bar."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    check_columns(sla, SLA_COLUMNS, "(SLA table)")
    targets = list(dict.fromkeys(sla["target"]))
    configs = list(dict.fromkeys(sla["serve_label"]))
    benches = list(dict.fromkeys(sla["bench_label"]))
    finite = pd.to_numeric(sla["largest_pass"], errors="coerce")
    top = float(finite[np.isfinite(finite)].max()) if np.isfinite(finite).any() else 1.0
    ncols = min(len(targets), 3)
    nrows = math.ceil(len(targets) / ncols)
    height = max(fig_height, 0.35 * len(configs) * len(benches) + 1.2)
    fig = Figure(figsize=(4.8 * ncols + 2.0, height * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for i, (ax, target) in enumerate(zip(axes, targets, strict=False)):
        _sla_panel(ax, sla[sla["target"] == target], configs, benches, top)
        ax.tick_params(labelleft=i % ncols == 0)  # the configs are named once per row of panels
        ax.set_title(target)
        ax.set_xlabel(f"largest passing {variable}")
    for ax in axes[len(targets):]:
        ax.set_visible(False)
    handles = [Line2D([], [], color=_COLORS[i % len(_COLORS)], linewidth=6, label=b) for i, b in enumerate(benches)]
    fig.legend(handles=handles, loc="outside right upper", title="bench point", frameon=False)
    fig.suptitle(f"SLA: largest {variable} that meets each target")
    return fig


def _sla_panel(ax: Axes, rows: pd.DataFrame, configs: list[str], benches: list[str], top: float) -> None:
    height = 0.8 / len(benches)
    for r in rows.itertuples(index=False):
        b = benches.index(r.bench_label)
        y = configs.index(r.serve_label) + (b - (len(benches) - 1) / 2) * height
        value = float(r.largest_pass) if r.largest_pass is not None else math.nan
        unbounded = math.isinf(value)
        width = top * 1.1 if unbounded else (0.0 if math.isnan(value) else value)
        ax.barh(y, width, height=height * 0.9, color=_COLORS[b % len(_COLORS)], hatch="//" if unbounded else None)
        text = "unbounded" if unbounded else ("none" if math.isnan(value) else fmt_value(value))
        if r.state != "found":
            text += f" ({r.state})"
        ax.text(width, y, f" {text}", va="center", fontsize=7)
    ax.set_yticks(range(len(configs)), configs)
    ax.set_xlim(0, top * 1.45)
    ax.invert_yaxis()
    ax.grid(axis="y", visible=False)

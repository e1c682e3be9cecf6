"""The figure of the Pareto front (`raysweep.results.front` finds the front): every run, the point means with
their intervals and the front through them, written with the front as `pareto_front.csv`.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from raysweep.record.files import write_text_atomic
from raysweep.report.plots.style import _COLORS, _FLAG_STYLE, save_figure, styled
from raysweep.results.front import PER_GPU, ParetoResult
from raysweep.results.labels import fmt_value
from raysweep.results.rows import _flagged, check_columns

if TYPE_CHECKING:  # imported where the figure is drawn
    from matplotlib.figure import Figure

__all__ = ["pareto_figure", "write_pareto"]


@styled
def pareto_figure(result: ParetoResult, label_by: Sequence[str], fig_height: float = 4.5) -> Figure:
    """Every run (grey; client-limited hollow), the point means with their intervals, the front through them
    (line), its points labelled by `label_by`."""
    from matplotlib.figure import Figure

    check_columns(result.points, label_by, "--label-by")
    notes = result.notes + result.drawn_notes
    fig = Figure(figsize=(fig_height * 1.6, fig_height + 0.4 + 0.18 * len(notes)), layout="constrained")
    ax = fig.subplots()
    pts, front, y = result.points, result.front, result.y
    ok = pts[~pts["client_limited"]]
    ax.scatter(ok["tokens_per_user"], ok[y], color="0.6", alpha=0.6, s=22, label="all runs")
    lim = pts[pts["client_limited"]]
    if len(lim):
        ax.scatter(lim["tokens_per_user"], lim[y], facecolors="none", edgecolors="0.4", s=30,
                   label="client-limited run (not on the front)")
    bad = pts[_flagged(pts)]
    if len(bad):
        ax.scatter(bad["tokens_per_user"], bad[y], label="fails a validity check", **_FLAG_STYLE)
    means = result.means
    if result.per == "point" and means is not None and (means["n_runs"] > 1).any():
        x_err = _bars(means, "tokens_per_user")
        y_err = _bars(means, y)
        ax.errorbar(means["tokens_per_user"], means[y], xerr=x_err, yerr=y_err, fmt="o", color="0.3", ms=4, alpha=0.8,
                    elinewidth=0.8, capsize=2, label="point mean (95 % interval across runs)")
    ax.plot(front["tokens_per_user"], front[y], marker="o", color=_COLORS[0], label="Pareto front")
    for _, row in front.iterrows():
        text = "\n".join(f"{k}={fmt_value(row[k])}" for k in label_by)
        ax.annotate(text, (row["tokens_per_user"], row[y]), textcoords="offset points",
                    xytext=(5, 4), fontsize=7)
    ax.set_xlabel("output tokens/s per user")
    ax.set_ylabel(result.y_label)
    ax.legend(frameon=False)
    fig.suptitle("Pareto front: per-user speed against " + ("per-GPU throughput" if y == PER_GPU else result.y_label))
    if notes:
        fig.supxlabel("\n".join(textwrap.fill(n, 120) for n in notes), fontsize=7, color="0.3", ha="left",
                      x=0.01)
    return fig


def _bars(means: pd.DataFrame, axis: str) -> np.ndarray:
    """Error bar lengths below and above each mean (0 where the interval is unknown: one run)."""
    mid = means[axis].to_numpy(float)
    low = np.nan_to_num(mid - means[f"{axis}_low"].to_numpy(float))
    high = np.nan_to_num(means[f"{axis}_high"].to_numpy(float) - mid)
    return np.vstack([np.clip(low, 0, None), np.clip(high, 0, None)])


def write_pareto(result: ParetoResult, label_by: Sequence[str], out_dir: str | Path, fmt: str = "png",
                 dpi: int = 150) -> list[Path]:
    """The figure (`PARETO.<fmt>`) and the front as `pareto_front.csv`, in `out_dir`."""
    out = Path(out_dir)
    ids = ("serve_label", "bench_label", "run_number", "point_id") if result.per == "run" else \
        ("serve_label", "bench_label", "serve_id", "bench_id")
    extra = ("n_runs", "tokens_per_user_low", "tokens_per_user_high", f"{result.y}_low", f"{result.y}_high")
    cols = list(dict.fromkeys([*(c for c in ids if c in result.front.columns), *label_by, "output_throughput",
                               "user_count", "user_count_from", "gpus", "gpus_from", "tokens_per_user",
                               "tokens_per_gpu", result.y, *(c for c in extra if c in result.front.columns)]))
    fig = pareto_figure(result, label_by)
    return [save_figure(fig, out / f"PARETO.{fmt}", fmt, dpi),
            write_text_atomic(out / "pareto_front.csv", result.front[cols].to_csv(index=False))]

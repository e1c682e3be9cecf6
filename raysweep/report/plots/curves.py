"""Figures from a results table: curves, server metrics, Pareto fronts and SLA bars (matplotlib, no display).

The curves follow `vllm bench sweep plot` (reference/vllm.md §1.14): one figure per `fig_by` group, a grid of
`row_by` x `col_by` panels, one curve per `curve_by` combination, the mean over the runs that share an x
value with a band of ± one standard deviation. Two things differ on purpose:
- runs marked `client_limited` (the load generator, not the server, was the bottleneck) never enter a
  mean: they are drawn as hollow markers of their curve's colour, and counted in the notes;
- other runs that fail a validity check (`validity_ok` false: niced, shared CPUs, errors, not steady, ...;
  see `raysweep.drive.validity`) stay in the curves but carry a red cross with the name of the check beside it,
  and are counted in the notes;
- what would silently change a figure is said in its notes: rows left out for a non-finite value, and
  means that pool runs of several configurations at one x.

Every figure is a `matplotlib.figure.Figure` built inside one style (`raysweep.report.plots.style.styled`), so tests
can inspect it and the report can embed it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from raysweep.errors import UserError
from raysweep.report.plots.style import (
    _FLAG_STYLE,
    _curve_styles,
    _file_stem,
    curve_colors,
    save_figure,
    styled,
)
from raysweep.results.labels import axis_label
from raysweep.results.rows import (
    _POINT,
    _apply_bins,
    _curve_title,
    _flagged,
    _flagged_note,
    _groups,
    _limited_note,
    _measured_x,
    _numeric,
    apply_filters,
    check_columns,
    client_limited_mask,
    load_linked,
)

# matplotlib is imported where a figure is drawn, not with this module: planning a figure, and a report whose
# figures are all kept (`raysweep.report.cache`), do without it
if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.typing import ColorType

_SCALES = ("linear", "log", "symlog", "logit", "asinh")


@dataclass(frozen=True)
class PlotSpec:
    """What `raysweep plot` draws; the options of `vllm bench sweep plot` (defaults differ only in size)."""

    var_x: str = "total_token_throughput"
    var_y: str = "median_ttft_ms"
    row_by: tuple[str, ...] = ()
    col_by: tuple[str, ...] = ()
    curve_by: tuple[str, ...] = ()
    fig_by: tuple[str, ...] = ()
    filter_by: tuple[str, ...] = ()
    bin_by: tuple[str, ...] = ()
    scale_x: str | None = None
    scale_y: str | None = None
    error_bars: bool = True
    fig_name: str = "FIGURE"
    fig_height: float = 4.0


@dataclass
class Curve:
    """One curve of a panel: `points` (x, y = mean, sd, n runs) and the client-limited runs (x, y)."""

    label: str
    points: pd.DataFrame
    limited: pd.DataFrame
    flagged: pd.DataFrame = field(default_factory=lambda: pd.DataFrame({"x": [], "y": []}))  # failing a check


@dataclass
class Panel:
    title: str
    xlabel: str
    ylabel: str
    curves: list[Curve]
    from_zero: bool = False  # y axis from 0 to at least 1 (counts and fractions)


@dataclass
class FigurePlan:
    """A figure before drawing: its file stem, panels (rows x columns), curve labels and notes."""

    name: str
    title: str
    panels: list[list[Panel]]
    curve_labels: list[str]
    curve_title: str
    runs: int
    notes: list[str] = field(default_factory=list)
    colors: dict[str, ColorType] = field(default_factory=dict)  # curve label -> colour, the same in every figure


def _prepare(df: pd.DataFrame, spec: PlotSpec, needed: dict[str, Sequence[str]]) -> pd.DataFrame:
    """Check every named column, the scales, then filter and bin, as vLLM's plot does."""
    if df.empty:
        raise UserError("OUTPUT_DIR: the results table has no finished run to plot")
    for option, names in needed.items():
        check_columns(df, names, option)
    for option, scale in (("--scale-x", spec.scale_x), ("--scale-y", spec.scale_y)):
        if scale is not None and scale not in _SCALES:
            raise UserError(f"{option} {scale}: unknown scale; accepted: {', '.join(_SCALES)}")
    kept = _apply_bins(apply_filters(df, spec.filter_by), spec.bin_by)
    if kept.empty:
        raise UserError(f"--filter-by {','.join(spec.filter_by)}: no run is left (of {len(df)})")
    return kept


def _require_numeric(df: pd.DataFrame, options: dict[str, str]) -> None:
    """:raises UserError: a column named by an option (option -> column) holds no number at all."""
    for option, name in options.items():
        if not pd.to_numeric(df[name], errors="coerce").notna().any():
            raise UserError(f"{option} {name}: not a numeric column")


def _curves(df: pd.DataFrame, x: str, y: str, labels: pd.Series) -> list[Curve]:
    """The curves of one panel: per label, the mean and SD over the runs at each x (client-limited apart).
    When x is itself measured (a throughput, say), the runs of one point are its repeats: they make one
    point at their mean x and mean y, rather than one point each."""
    limited = client_limited_mask(df)
    by_point = _measured_x(df, x)
    curves = []
    for label in dict.fromkeys(labels):
        mine = labels == label
        ok = df[mine & ~limited]
        if by_point:
            pts = (ok.groupby(_POINT, dropna=False).agg(x=(x, "mean"), y=(y, "mean"), sd=(y, "std"), n=(y, "count"))
                   .reset_index(drop=True))
        else:
            pts = (ok.groupby(x)[y].agg(["mean", "std", "count"]).reset_index()
                   .rename(columns={x: "x", "mean": "y", "std": "sd", "count": "n"}))
        lim = df[mine & limited][[x, y]].rename(columns={x: "x", y: "y"})
        bad = df[mine & _flagged(df)]
        bad = bad[[x, y]].rename(columns={x: "x", y: "y"}).assign(check=_check_label(bad))
        curves.append(Curve(str(label), pts.sort_values("x", ignore_index=True), lim.reset_index(drop=True),
                            bad.reset_index(drop=True)))
    return curves


def _check_label(runs: pd.DataFrame) -> list[str]:
    """Per flagged run, the names of the checks it failed (`shared CPUs, not steady`), from its
    `validity_issues`; empty when the table has none."""
    if "validity_issues" not in runs.columns:
        return [""] * len(runs)
    return [", ".join(dict.fromkeys(i.split(" (")[0].strip() for i in str(v).split("; ") if i.strip()))
            if isinstance(v, str) else "" for v in runs["validity_issues"]]


def _mixing_note(df: pd.DataFrame, keys: list[pd.Series], x: str) -> list[str]:
    """A note when one mean pools runs of different configurations (vLLM pools them silently). A measured
    x pools nothing: each point is one configuration's runs."""
    if not {"serve_label", "bench_label"} <= set(df.columns) or df.empty or _measured_x(df, x):
        return []
    config = df["serve_label"].astype(str) + " / " + df["bench_label"].astype(str)
    cells = pd.DataFrame({**{f"k{i}": k for i, k in enumerate(keys)}, "x": df[x], "config": config})
    counts = cells.groupby([c for c in cells.columns if c != "config"], dropna=False)["config"].nunique()
    mixed = counts[counts > 1]
    if mixed.empty:
        return []
    return [f"{len(mixed)} point(s) average runs of several configurations at one {x} (up to {mixed.max()}); "
            "add what differs to --curve-by, --row-by, --col-by or --fig-by, or narrow with --filter-by"]


def _figure_groups(df: pd.DataFrame, spec: PlotSpec, prefix: str) -> list[tuple[str, str, pd.DataFrame]]:
    """(file stem, title, rows) per `fig_by` group."""
    labels, order = _groups(df, spec.fig_by)
    out = []
    for label in order:
        stem = prefix if not spec.fig_by else f"{prefix}-{label.replace(', ', '-')}"
        out.append((_file_stem(stem), "" if not spec.fig_by else label, df[labels == label]))
    return out


def plan_curves(df: pd.DataFrame, spec: PlotSpec) -> list[FigurePlan]:
    """The figures `raysweep plot` draws for `spec`, one per `fig_by` group. A curve keeps its colour in every
    figure: a server configuration has the campaign's (`curve_colors`: also where the curves are the server
    parameters that tell the configurations apart), any other curve label its place among all the figures' labels.

    :raises UserError: a named column is missing, a filter or bin is malformed, or nothing is left.
    """
    whole = df
    df = _prepare(df, spec, {"--var-x": [spec.var_x], "--var-y": [spec.var_y], "--row-by": spec.row_by,
                             "--col-by": spec.col_by, "--curve-by": spec.curve_by, "--fig-by": spec.fig_by})
    _require_numeric(df, {"--var-x": spec.var_x, "--var-y": spec.var_y})
    df, notes = _numeric(df, [spec.var_x, spec.var_y])
    colors = curve_colors(whole, df, spec.curve_by)
    plans = []
    for stem, title, fdf in _figure_groups(df, spec, spec.fig_name):
        rows, row_order = _groups(fdf, spec.row_by)
        cols, col_order = _groups(fdf, spec.col_by)
        curves, curve_order = _groups(fdf, spec.curve_by)
        drawn = fdf[[c for c in dict.fromkeys((spec.var_x, spec.var_y, *_CURVE_COLUMNS)) if c in fdf.columns]]
        panels = [[_cell_panel(drawn, (rows == r) & (cols == c), _panel_title(r, c), spec, curves)
                   for c in col_order] for r in row_order]
        fig_notes = (notes + _limited_note(fdf) + _flagged_note(fdf)
                     + _mixing_note(fdf, [rows, cols, curves], spec.var_x))
        plans.append(FigurePlan(stem, title, panels, curve_order, _curve_title(spec.curve_by), len(fdf), fig_notes,
                                colors))
    return plans


# What `_curves` reads of a panel's runs beside x and y: a panel cut from these columns alone, not from the
# whole results table (a hundred columns and more)
_CURVE_COLUMNS = (*_POINT, "client_limited", "validity_ok", "validity_issues")


def _cell_panel(df: pd.DataFrame, cell: pd.Series, title: str, spec: PlotSpec, curves: pd.Series) -> Panel:
    return Panel(title, axis_label(spec.var_x), axis_label(spec.var_y),
                 _curves(df[cell], spec.var_x, spec.var_y, curves[cell]))


def _panel_title(row: str, col: str) -> str:
    return "\n".join(t for t in (row, col) if t != "(all)")


def default_layout(df: pd.DataFrame, spec: PlotSpec, load_var: str) -> PlotSpec:
    """`spec` with a layout when the user gave none (no --row-by, --col-by, --curve-by or --fig-by): one
    curve per server config and one column of panels per bench shape (its parameters but the load
    variable), so that no curve joins runs of unrelated configurations."""
    if spec.row_by or spec.col_by or spec.curve_by or spec.fig_by:
        return spec
    curve = ("serve_label",) if "serve_label" in df.columns and df["serve_label"].nunique() > 1 else ()
    bench_keys: dict[str, None] = {}
    for label in df["bench_label"].dropna().astype(str).unique() if "bench_label" in df.columns else ():
        for part in label.split("-"):
            key = part.split("=", 1)[0]
            if "=" in part and key in df.columns and key not in (load_var, spec.var_x, spec.var_y):
                bench_keys[key] = None
    varying = [k for k in bench_keys if df[k].astype(str).nunique() > 1]
    linked = set(load_linked(df, load_var, varying))  # a num_prompts that follows the load is no shape
    return replace(spec, curve_by=curve, col_by=tuple(k for k in varying if k not in linked))


OFFLINE_METRICS: dict[str, tuple[str, ...]] = {
    "throughput": ("request_throughput", "total_token_throughput", "output_throughput"),
    "latency": ("mean_latency_ms", "p99_latency_ms")}


def is_offline(df: pd.DataFrame) -> bool:
    return "offline_kind" in df.columns and df["offline_kind"].notna().any()


def offline_specs(df: pd.DataFrame, base: PlotSpec) -> list[PlotSpec]:
    """The figures of an offline sweep: each of its metrics against the first swept parameter that varies
    (numeric first), one curve per combination of the others; `base` gives the style and filters."""
    names = dict.fromkeys(n for text in df.get("offline_params", pd.Series(dtype=str)).dropna()
                          for n in str(text).split(",") if n and n in df.columns)
    varying = [n for n in names if df[n].astype(str).nunique() > 1]
    numeric = [n for n in varying if pd.to_numeric(df[n], errors="coerce").notna().all()]
    x = (numeric or varying or ["run_number"])[0]
    curves = tuple(n for n in varying if n != x)
    kinds = [k for k in OFFLINE_METRICS if (df["offline_kind"] == k).any()]
    metrics = [m for k in kinds for m in OFFLINE_METRICS[k] if m in df.columns]
    return [replace(base, var_x=x, var_y=m, curve_by=base.curve_by or curves, fig_name=f"{m}-vs-{x}")
            for m in metrics]


@styled
def render(plan: FigurePlan, spec: PlotSpec) -> Figure:
    """Draw a planned figure: panels, curves with their bands, hollow client-limited runs, one legend."""
    from matplotlib.figure import Figure

    nrows, ncols = len(plan.panels), len(plan.panels[0])
    fig = Figure(figsize=(spec.fig_height * 1.3 * ncols + 2.2, spec.fig_height * nrows + 0.5), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    styles = _curve_styles(plan.curve_labels, plan.colors)
    shared_y = len({p.ylabel for row in plan.panels for p in row}) == 1
    for i, row in enumerate(plan.panels):
        for j, panel in enumerate(row):
            ax = axes[i][j]
            _draw_panel(ax, panel, styles, spec.error_bars)
            ax.set_xlabel(panel.xlabel if i == nrows - 1 else "")
            ax.set_ylabel(panel.ylabel if j == 0 or not shared_y else "")
            for scale, setter in ((spec.scale_x, ax.set_xscale), (spec.scale_y, ax.set_yscale)):
                if scale:
                    setter(scale)
    _legend(fig, plan, styles)
    if plan.title:
        fig.suptitle(plan.title)
    return fig


def _draw_panel(ax: Axes, panel: Panel, styles: dict[str, tuple[ColorType, str]], band: bool) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.set_title(panel.title)
    for curve in panel.curves:
        color, marker = styles[curve.label]
        p = curve.points
        if len(p):
            ax.plot(p["x"], p["y"], marker=marker, color=color, label=curve.label)
            if band and (p["n"] > 1).any():
                _spread(ax, p, color)
        if len(curve.limited):
            ax.scatter(curve.limited["x"], curve.limited["y"], marker=marker, facecolors="none", edgecolors=color,
                       linewidths=1.2, s=40, zorder=3)
        if len(curve.flagged):
            ax.scatter(curve.flagged["x"], curve.flagged["y"], **_FLAG_STYLE)
            for _, f in curve.flagged.iterrows():   # the cross says which check failed
                if f.get("check"):
                    ax.annotate(str(f["check"]), (f["x"], f["y"]), xytext=(4, 3), textcoords="offset points",
                                fontsize=6, color=_FLAG_STYLE["color"])
    if not any(len(c.points) or len(c.limited) for c in panel.curves):
        ax.text(0.5, 0.5, "no runs", transform=ax.transAxes, ha="center", va="center", color="grey")
        return
    xs = np.concatenate([np.r_[c.points["x"], c.limited["x"]] for c in panel.curves])
    if np.all(np.mod(xs, 1) == 0):  # concurrencies, lengths: no ticks between whole numbers
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if panel.from_zero:
        top = max(ax.get_ylim()[1], 1)
        ax.set_ylim(bottom=-0.03 * top, top=top)  # a margin, so that a line at 0 is not hidden by the axis


def _spread(ax: Axes, points: pd.DataFrame, color: ColorType) -> None:
    """± one SD: a band along a curve, whiskers for a curve of one x value (a band would have no width)."""
    sd = points["sd"].fillna(0)
    if len(points) > 1:
        ax.fill_between(points["x"], points["y"] - sd, points["y"] + sd, color=color, alpha=0.18, linewidth=0)
    else:
        ax.errorbar(points["x"], points["y"], yerr=sd, fmt="none", ecolor=color, capsize=4)


def _legend(fig: Figure, plan: FigurePlan, styles: dict[str, tuple[ColorType, str]]) -> None:
    from matplotlib.lines import Line2D

    handles = [] if plan.curve_labels == ["(all)"] else [Line2D([], [], color=c, marker=m, label=lab)
                                                          for lab, (c, m) in styles.items()]
    if any(len(c.limited) for row in plan.panels for p in row for c in p.curves):
        handles.append(Line2D([], [], color="grey", marker="o", markerfacecolor="none", linestyle="none",
                              label="client-limited run\n(not in the curve)"))
    if any(len(c.flagged) for row in plan.panels for p in row for c in p.curves):
        handles.append(Line2D([], [], color=_FLAG_STYLE["color"], marker="x", linestyle="none",
                              label="fails a validity check"))
    if handles:
        fig.legend(handles=handles, loc="outside right upper", title=plan.curve_title or None, frameon=False)


def describe(plans: Sequence[FigurePlan], fmt: str = "png") -> str:
    """The dry-run text: each figure, its grid, its curves (points and runs) and its notes."""
    lines = []
    for plan in plans:
        nrows, ncols = len(plan.panels), len(plan.panels[0])
        lines.append(f"{plan.name}.{fmt}: {nrows} row(s) x {ncols} column(s), {len(plan.curve_labels)} curve(s), "
                     f"{plan.runs} run(s)")
        for label in plan.curve_labels:
            mine = [c for row in plan.panels for p in row for c in p.curves if c.label == label]
            points = sum(len(c.points) for c in mine)
            runs = sum(int(c.points["n"].sum()) for c in mine)
            limited = sum(len(c.limited) for c in mine)
            lines.append(f"  {label}: {points} point(s) from {runs} run(s)"
                         + (f", {limited} client-limited run(s) apart" if limited else ""))
        lines += [f"  note: {n}" for n in plan.notes]
    return "\n".join(lines)


def write_plots(plans: Sequence[FigurePlan], spec: PlotSpec, out_dir: str | Path, fmt: str = "png",
                dpi: int = 150) -> list[Path]:
    """Draw and save planned figures as `<name>.<fmt>` in `out_dir`; returns the paths."""
    return [save_figure(render(plan, spec), Path(out_dir) / f"{plan.name}.{fmt}", fmt, dpi) for plan in plans]

"""Figures from a results table: curves, server metrics, Pareto fronts and SLA bars (matplotlib, no display).

The curves follow `vllm bench sweep plot` (reference/vllm.md §1.14): one figure per `fig_by` group, a grid of
`row_by` x `col_by` panels, one curve per `curve_by` combination, the mean over the runs that share an x
value with a band of ± one standard deviation. Two things differ on purpose:
- runs marked `client_limited` (the load generator, not the server, was the bottleneck) never enter a
  mean: they are drawn as hollow markers of their curve's colour, and counted in the notes;
- other runs that fail a validity check (`validity_ok` false: niced, shared CPUs, errors, not steady, ...;
  see `raysweep.validity`) stay in the curves but carry a red cross, and are counted in the notes;
- what would silently change a figure is said in its notes: rows left out for a non-finite value, and
  means that pool runs of several configurations at one x.

The Pareto front follows `plot_pareto` (x = output tokens/s per user, y = output tokens/s per GPU) without
its dominated ties (vLLM issue #55561), and takes the GPU count as recorded (see `pareto`).
Every figure is a `matplotlib.figure.Figure` built inside one style (`styled`), so tests can inspect it
and the report can embed it.
"""

from __future__ import annotations

import functools
import io
import math
import operator
import re
import textwrap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from raysweep.errors import UserError
from raysweep.files import write_bytes_atomic, write_text_atomic

__all__ = ["FigurePlan", "ParetoResult", "PlotSpec", "SERVER_METRICS", "SLA_COLUMNS", "apply_filters",
           "axis_label", "check_columns", "client_limited_mask", "describe", "figure_bytes", "fmt_value",
           "gpu_counts", "load_linked", "load_variable", "pareto", "pareto_figure", "plan_curves",
           "plan_server_metrics", "render", "save_figure", "sla_figure", "sort_key", "split_list", "styled",
           "write_pareto", "write_plots"]

P = ParamSpec("P")
R = TypeVar("R")

SERVER_METRICS = ("server_kv_cache_usage_perc_peak", "server_num_requests_waiting_peak", "server_num_preemptions")
_LATENCY_PANEL = ("p99_ttft_ms", "median_ttft_ms")  # the latency beside the server metrics, first present
SLA_COLUMNS = ("serve_label", "bench_label", "target", "state", "largest_pass")
_PARALLEL = {"tensor_parallel_size": "tp", "pipeline_parallel_size": "pp", "data_parallel_size": "dp"}
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_COLORS = tuple(matplotlib.colormaps["tab10"].colors)  # type: ignore[attr-defined]
_STYLE = {"font.size": 9, "axes.titlesize": 9, "axes.labelsize": 9, "legend.fontsize": 8, "figure.titlesize": 11,
          "axes.grid": True, "grid.linestyle": "--", "grid.alpha": 0.5, "axes.spines.top": False,
          "axes.spines.right": False, "lines.linewidth": 1.6, "lines.markersize": 5, "figure.facecolor": "white",
          "savefig.facecolor": "white"}
_UNITS = {"request_throughput": "req/s", "request_rate": "req/s", "request_goodput": "req/s",
          "output_throughput": "tok/s", "total_token_throughput": "tok/s", "max_output_tokens_per_s": "tok/s",
          "output_throughput_per_gpu": "tok/s", "duration": "s", "server_kv_cache_usage_perc_peak": "1 = full",
          "server_kv_cache_usage_perc_mean": "1 = full"}
_FILTER = re.compile(r"^\s*([^<>=!]+?)\s*(==|!=|<=|>=|<|>)\s*(.*?)\s*$")  # longest operator first
_OPS: dict[str, Callable[[Any, Any], Any]] = {"==": operator.eq, "!=": operator.ne, "<=": operator.le,
                                              ">=": operator.ge, "<": operator.lt, ">": operator.gt}
_SCALES = ("linear", "log", "symlog", "logit", "asinh")


# -- style and output ----------------------------------------------------------------------------------

def styled(fn: Callable[P, R]) -> Callable[P, R]:
    """Run a figure-building function inside raysweep's one figure style (fonts, grid, spines)."""
    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with matplotlib.rc_context(_STYLE):
            return fn(*args, **kwargs)
    return wrapper


def axis_label(column: str) -> str:
    """A column name with its unit, e.g. `median_ttft_ms (ms)`; the name stays so users can filter by it."""
    unit = _UNITS.get(column) or ("ms" if column.endswith("_ms") else None)
    return f"{column} ({unit})" if unit else column


def figure_bytes(fig: Figure, fmt: str = "png", dpi: int = 150) -> bytes:
    """The figure encoded as `fmt` (png, svg, pdf)."""
    buf = io.BytesIO()
    with matplotlib.rc_context(_STYLE):
        fig.savefig(buf, format=fmt, dpi=dpi, bbox_inches="tight")
    return buf.getvalue()


def save_figure(fig: Figure, path: str | Path, fmt: str = "png", dpi: int = 150) -> Path:
    """Write the figure whole or not at all."""
    return write_bytes_atomic(path, figure_bytes(fig, fmt, dpi))


def _file_stem(text: str) -> str:
    """vLLM's `sanitize_filename`, plus characters no file system likes."""
    return re.sub(r"[\\/:*?\"<>|\s]", "_", text.replace("..", "__")).strip("'\"")


# -- options shared by the commands --------------------------------------------------------------------

def split_list(text: str | Iterable[str] | None) -> tuple[str, ...]:
    """A comma list option (`a,b`), or several of them, as a tuple of names."""
    parts = [text] if isinstance(text, str) else list(text or ())
    return tuple(n.strip() for p in parts for n in p.split(",") if n.strip())


def _columns_text(df: pd.DataFrame) -> str:
    return ", ".join(map(str, df.columns))


def check_columns(df: pd.DataFrame, names: Iterable[str], option: str) -> None:
    """:raises UserError: a name is not a column (naming `option` and listing the columns)."""
    missing = [n for n in names if n not in df.columns]
    if missing:
        raise UserError(f"{option} {','.join(missing)}: no such column; available columns: {_columns_text(df)}")


def apply_filters(df: pd.DataFrame, exprs: Iterable[str], option: str = "--filter-by") -> pd.DataFrame:
    """Keep the rows that meet every `column<op>value` (ops `==, !=, <, <=, >, >=`), as vLLM's plot does:
    `==`/`!=` compare as booleans on a boolean column, as numbers when the value is one, else as text;
    the ordering operators always compare numbers."""
    for expr in split_list(exprs):
        m = _FILTER.match(expr)
        if not m:
            raise UserError(f"{option} {expr!r}: expected COLUMN<op>VALUE with op one of ==, !=, <, <=, >, >=")
        name, op, raw = m.groups()
        check_columns(df, [name], f"{option} {expr!r}:")
        df = df[_compare(df[name], op, raw, f"{option} {expr!r}")]
    return df


def _compare(col: pd.Series, op: str, raw: str, where: str) -> pd.Series:
    number = _number(raw)
    if op in ("==", "!=") and _is_bool(col) and raw.lower() in ("true", "false", "1", "0"):
        return _OPS[op](col.fillna(False).astype(bool), raw.lower() in ("true", "1"))
    if number is not None:
        return _OPS[op](pd.to_numeric(col, errors="coerce"), number)
    if op in ("==", "!="):
        return _OPS[op](col.map(fmt_value), raw)
    raise UserError(f"{where}: {op} needs a number, not {raw!r}")


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _is_bool(col: pd.Series) -> bool:
    values = col.dropna()
    return len(values) > 0 and all(isinstance(v, (bool, np.bool_)) for v in values)


def _apply_bins(df: pd.DataFrame, exprs: Iterable[str]) -> pd.DataFrame:
    """vLLM's `--bin-by var%size`: the column becomes floor(v / size) * size, pooling nearby x values."""
    for expr in split_list(exprs):
        name, _, size = expr.partition("%")
        step = _number(size)
        if not step or step <= 0:
            raise UserError(f"--bin-by {expr!r}: expected COLUMN%SIZE with a positive SIZE")
        check_columns(df, [name], f"--bin-by {expr!r}:")
        df = df.assign(**{name: np.floor(pd.to_numeric(df[name], errors="coerce") / step) * step})
    return df


# -- grouping ------------------------------------------------------------------------------------------

def fmt_value(value: Any) -> str:
    """A value as a label shows it: whole floats as integers, missing values as `none`."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "none"
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return f"{float(value):g}"
    return str(value)


def sort_key(value: Any) -> tuple[int, float, str]:
    """Numbers in numeric order, then text, then missing values."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return (2, 0.0, "")
    if isinstance(value, (int, float, np.number)) and not isinstance(value, (bool, np.bool_)):
        return (0, float(value), "")
    return (1, 0.0, str(value))


def _label(keys: Sequence[str], values: Sequence[Any]) -> str:
    """`k=v, k2=v2`; a label column alone (`serve_label`, itself `k=v-...`) shows its value only."""
    if len(keys) == 1 and keys[0].endswith("_label"):
        return fmt_value(values[0])
    return ", ".join(f"{k}={fmt_value(v)}" for k, v in zip(keys, values, strict=True))


def _groups(df: pd.DataFrame, keys: Sequence[str]) -> tuple[pd.Series, list[str]]:
    """Each row's group label (`k=v, k2=v2`, or `(all)` without keys) and the labels in natural order."""
    if not keys:
        return pd.Series("(all)", index=df.index, dtype=object), ["(all)"]
    tuples = list(df[list(keys)].itertuples(index=False, name=None))
    labels = [_label(keys, t) for t in tuples]
    first: dict[str, tuple[Any, ...]] = {}
    for label, t in zip(labels, tuples, strict=True):
        first.setdefault(label, t)
    order = sorted(first, key=lambda lab: tuple(sort_key(v) for v in first[lab]))
    return pd.Series(labels, index=df.index, dtype=object), order


def _curve_title(keys: Sequence[str]) -> str:
    return "server config" if tuple(keys) == ("serve_label",) else ", ".join(keys)


def client_limited_mask(df: pd.DataFrame) -> pd.Series:
    if "client_limited" not in df.columns:
        return pd.Series(False, index=df.index)
    return df["client_limited"].map(lambda v: v is True or v == 1 or str(v).lower() == "true")


# -- curves --------------------------------------------------------------------------------------------

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


def _numeric(df: pd.DataFrame, names: Sequence[str]) -> tuple[pd.DataFrame, list[str]]:
    """Rows whose `names` are finite numbers (as floats), and a note on the rows left out."""
    values = {n: pd.to_numeric(df[n], errors="coerce").astype(float) for n in names}
    finite = np.logical_and.reduce([np.isfinite(v.to_numpy()) for v in values.values()])
    dropped = int((~finite).sum())
    notes = [f"{dropped} run(s) with a non-finite or missing {' or '.join(names)} left out"] if dropped else []
    return df[finite].assign(**{n: v[finite] for n, v in values.items()}), notes


_POINT = ["serve_id", "bench_id"]


def _measured_x(df: pd.DataFrame, x: str) -> bool:
    """Whether x is a measurement (it differs between the runs of one point), not a parameter."""
    if not set(_POINT) <= set(df.columns) or df.empty:
        return False
    return bool(df.groupby(_POINT, dropna=False)[x].nunique().max() > 1)


def _flagged(df: pd.DataFrame) -> pd.Series:
    """Runs that fail a validity check, client-limited ones aside (they are drawn hollow)."""
    if "validity_ok" not in df.columns:
        return pd.Series(False, index=df.index)
    bad = df["validity_ok"].map(lambda v: v is False or v == 0 or str(v).lower() == "false")
    return bad & ~client_limited_mask(df)


def _flagged_note(df: pd.DataFrame) -> list[str]:
    n = int(_flagged(df).sum())
    return [f"{n} run(s) fail a validity check (niced, shared CPUs, errors, not steady, ...), marked with a red "
            "cross (validity_issues in the results)"] if n else []


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
        bad = df[mine & _flagged(df)][[x, y]].rename(columns={x: "x", y: "y"})
        curves.append(Curve(str(label), pts.sort_values("x", ignore_index=True), lim.reset_index(drop=True),
                            bad.reset_index(drop=True)))
    return curves


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


def _limited_note(df: pd.DataFrame, where: str = "in the curves") -> list[str]:
    n = int(client_limited_mask(df).sum())
    return [f"{n} client-limited run(s) drawn hollow, not {where}"] if n else []


def _figure_groups(df: pd.DataFrame, spec: PlotSpec, prefix: str) -> list[tuple[str, str, pd.DataFrame]]:
    """(file stem, title, rows) per `fig_by` group."""
    labels, order = _groups(df, spec.fig_by)
    out = []
    for label in order:
        stem = prefix if not spec.fig_by else f"{prefix}-{label.replace(', ', '-')}"
        out.append((_file_stem(stem), "" if not spec.fig_by else label, df[labels == label]))
    return out


def plan_curves(df: pd.DataFrame, spec: PlotSpec) -> list[FigurePlan]:
    """The figures `raysweep plot` draws for `spec`, one per `fig_by` group.

    :raises UserError: a named column is missing, a filter or bin is malformed, or nothing is left.
    """
    df = _prepare(df, spec, {"--var-x": [spec.var_x], "--var-y": [spec.var_y], "--row-by": spec.row_by,
                             "--col-by": spec.col_by, "--curve-by": spec.curve_by, "--fig-by": spec.fig_by})
    _require_numeric(df, {"--var-x": spec.var_x, "--var-y": spec.var_y})
    df, notes = _numeric(df, [spec.var_x, spec.var_y])
    plans = []
    for stem, title, fdf in _figure_groups(df, spec, spec.fig_name):
        rows, row_order = _groups(fdf, spec.row_by)
        cols, col_order = _groups(fdf, spec.col_by)
        curves, curve_order = _groups(fdf, spec.curve_by)
        panels = [[_cell_panel(fdf, (rows == r) & (cols == c), _panel_title(r, c), spec, curves)
                   for c in col_order] for r in row_order]
        fig_notes = notes + _limited_note(fdf) + _flagged_note(fdf) + _mixing_note(fdf, [rows, cols, curves], spec.var_x)
        plans.append(FigurePlan(stem, title, panels, curve_order, _curve_title(spec.curve_by), len(fdf), fig_notes))
    return plans


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


def load_linked(df: pd.DataFrame, load: str | None, names: Iterable[str]) -> list[str]:
    """The parameters among `names` that only follow the load: one value per load value (a num_prompts
    scaled with max_concurrency); they tell nothing apart that the load does not."""
    if not load or load not in df.columns:
        return []
    return [n for n in names if n != load and n in df.columns
            and df.groupby(df[load].astype(str))[n].agg(lambda s: s.astype(str).nunique()).max() <= 1]


def load_variable(df: pd.DataFrame, fallback: str) -> str:
    """The load variable of a table: `max_concurrency` or `request_rate`, whichever takes several finite
    values, else `fallback`."""
    for name in ("max_concurrency", "request_rate"):
        if name in df.columns:
            values = pd.to_numeric(df[name], errors="coerce")
            if values[np.isfinite(values)].nunique() > 1:
                return name
    return fallback


OFFLINE_METRICS = {"throughput": ("request_throughput", "total_token_throughput", "output_throughput"),
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


def plan_server_metrics(df: pd.DataFrame, spec: PlotSpec, load_var: str) -> list[FigurePlan]:
    """Server-side metrics (KV cache usage peak, waiting requests peak, preemptions) and a latency beside
    them against the load variable: one column per metric, rows by `row_by` then `col_by`, curves by
    `curve_by` (by server config when none is given). Empty when the table has none of the server metrics."""
    metrics = [m for m in SERVER_METRICS if m in df.columns and pd.to_numeric(df[m], errors="coerce").notna().any()]
    if not metrics:
        return []
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
        panels, notes = [], _limited_note(fdf) + _flagged_note(fdf)
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
                                len(fdf), list(dict.fromkeys(notes))))
    return plans


def _curve_styles(labels: Sequence[str]) -> dict[str, tuple[Any, str]]:
    """A colour and marker per curve label, the same in every panel of a figure."""
    return {lab: (_COLORS[i % len(_COLORS)], _MARKERS[i % len(_MARKERS)]) for i, lab in enumerate(labels)}


@styled
def render(plan: FigurePlan, spec: PlotSpec) -> Figure:
    """Draw a planned figure: panels, curves with their bands, hollow client-limited runs, one legend."""
    nrows, ncols = len(plan.panels), len(plan.panels[0])
    fig = Figure(figsize=(spec.fig_height * 1.3 * ncols + 2.2, spec.fig_height * nrows + 0.5), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    styles = _curve_styles(plan.curve_labels)
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


def _draw_panel(ax: Axes, panel: Panel, styles: dict[str, tuple[Any, str]], band: bool) -> None:
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
    if not any(len(c.points) or len(c.limited) for c in panel.curves):
        ax.text(0.5, 0.5, "no runs", transform=ax.transAxes, ha="center", va="center", color="grey")
        return
    xs = np.concatenate([np.r_[c.points["x"], c.limited["x"]] for c in panel.curves])
    if np.all(np.mod(xs, 1) == 0):  # concurrencies, lengths: no ticks between whole numbers
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if panel.from_zero:
        top = max(ax.get_ylim()[1], 1)
        ax.set_ylim(bottom=-0.03 * top, top=top)  # a margin, so that a line at 0 is not hidden by the axis


_FLAG_STYLE = {"marker": "x", "color": "#d62728", "linewidths": 1.4, "s": 55, "zorder": 4}


def _spread(ax: Axes, points: pd.DataFrame, color: Any) -> None:
    """± one SD: a band along a curve, whiskers for a curve of one x value (a band would have no width)."""
    sd = points["sd"].fillna(0)
    if len(points) > 1:
        ax.fill_between(points["x"], points["y"] - sd, points["y"] + sd, color=color, alpha=0.18, linewidth=0)
    else:
        ax.errorbar(points["x"], points["y"], yerr=sd, fmt="none", ecolor=color, capsize=4)


def _legend(fig: Figure, plan: FigurePlan, styles: dict[str, tuple[Any, str]]) -> None:
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


# -- Pareto --------------------------------------------------------------------------------------------

@dataclass
class ParetoResult:
    """Every usable run with `user_count`, `gpus`, `tokens_per_user`, `tokens_per_gpu` (and where the counts
    came from), the front (a subset, by tokens per user), and notes on what was left out or derived."""

    points: pd.DataFrame
    front: pd.DataFrame
    notes: list[str]


def pareto(df: pd.DataFrame, user_count_var: str = "max_concurrency", gpu_count_var: str = "gpu_count",
           filter_by: Sequence[str] = ()) -> ParetoResult:
    """Tokens/s per user against tokens/s per GPU for every run, and the front of the non-dominated runs.

    - users: `user_count_var`; where it is empty, 0 or infinite (a rate-limited run), the observed
      `max_concurrent_requests`, as vLLM does. Runs with neither are left out and counted.
    - GPUs: `gpu_count_var` as recorded. Where it is 0 or missing (a CPU-only cluster reserves no GPU; a
      vLLM sweep records none), tensor x pipeline x data parallel size from the record (sizes not recorded
      count as 1, as vLLM's plot_pareto does), said in the notes and in `gpus_from`. A table without either
      is refused: the GPU count is never guessed.
    - client-limited runs are kept in `points` but never on the front; ties that another run dominates
      (same tokens/s per GPU at fewer tokens/s per user) are not on the front.
    """
    if df.empty:
        raise UserError("OUTPUT_DIR: the results table has no finished run")
    check_columns(df, [user_count_var], "--user-count-var")
    check_columns(df, ["output_throughput"], "(needed by the Pareto plot)")
    df = apply_filters(df, filter_by)
    users, user_from = _user_counts(df, user_count_var)
    gpus, gpus_from, notes = gpu_counts(df, gpu_count_var)
    pts = df.assign(user_count=users, user_count_from=user_from, gpus=gpus, gpus_from=gpus_from)
    usable = np.isfinite(pts["user_count"]) & (pts["user_count"] > 0)
    if (~usable).any():
        notes.append(f"{int((~usable).sum())} run(s) without a user count ({user_count_var} or "
                     "max_concurrent_requests) left out")
    pts = pts[usable]
    thr = pd.to_numeric(pts["output_throughput"], errors="coerce")
    pts = pts.assign(tokens_per_user=thr / pts["user_count"], tokens_per_gpu=thr / pts["gpus"],
                     client_limited=client_limited_mask(pts))
    notes += _limited_note(pts, "on the front") + _flagged_note(pts)
    return ParetoResult(pts.reset_index(drop=True), pareto_front(pts[~pts["client_limited"]]), notes)


def _user_counts(df: pd.DataFrame, var: str) -> tuple[pd.Series, pd.Series]:
    given = pd.to_numeric(df[var], errors="coerce")
    ok = np.isfinite(given) & (given > 0)
    seen = pd.to_numeric(df.get("max_concurrent_requests", pd.Series(np.nan, index=df.index)), errors="coerce")
    return given.where(ok, seen), pd.Series(np.where(ok, var, "max_concurrent_requests (observed)"), index=df.index)


def gpu_counts(df: pd.DataFrame, var: str) -> tuple[pd.Series, pd.Series, list[str]]:
    """GPUs per run as recorded in `var`, else TP x PP x DP from the record (see `pareto`)."""
    if var != "gpu_count":
        check_columns(df, [var], "--gpu-count-var")
    recorded = pd.to_numeric(df[var], errors="coerce") if var in df.columns else pd.Series(np.nan, index=df.index)
    ok = np.isfinite(recorded) & (recorded > 0)
    if ok.all():
        return recorded, pd.Series(var, index=df.index), []
    sizes = [c for c in _PARALLEL if c in df.columns]
    if not sizes:
        raise UserError(f"--gpu-count-var {var}: {int((~ok).sum())} run(s) have no GPU count (0 or missing: a "
                        f"CPU-only cluster, or a vLLM sweep that did not record it) and the table has none of "
                        f"{', '.join(_PARALLEL)} to take it from; name a column that holds it. Available columns: "
                        f"{_columns_text(df)}")
    product = np.prod([pd.to_numeric(df[c], errors="coerce").fillna(1) for c in sizes], axis=0)
    source = " x ".join(_PARALLEL[c] for c in sizes) + " (record)"
    note = (f"{int((~ok).sum())} run(s) have no {var} (0 or missing: no GPU reserved or recorded); their "
            f"GPUs are {' x '.join(sizes)} from the record" + ("" if len(sizes) == 3 else ", other sizes taken as 1"))
    return recorded.where(ok, product), pd.Series(np.where(ok, var, source), index=df.index), [note]


def pareto_front(points: pd.DataFrame) -> pd.DataFrame:
    """The runs no other run dominates (at least as good on both axes, better on one), by tokens per user.

    Sorted by tokens per user then per GPU, both descending, a run is on the front only if its tokens per
    GPU beat every run before it: a tie on tokens per GPU at fewer tokens per user is dominated, and of two
    identical runs one is kept.
    """
    order = points.sort_values(["tokens_per_user", "tokens_per_gpu"], ascending=False, kind="stable")
    best, keep = -math.inf, []
    for idx, y in zip(order.index, order["tokens_per_gpu"], strict=True):
        if y > best:
            keep.append(idx)
            best = y
    return order.loc[keep].sort_values("tokens_per_user", ignore_index=True)


@styled
def pareto_figure(result: ParetoResult, label_by: Sequence[str], fig_height: float = 4.5) -> Figure:
    """Every run (grey; client-limited hollow), the front (line), front runs labelled by `label_by`."""
    check_columns(result.points, label_by, "--label-by")
    fig = Figure(figsize=(fig_height * 1.6, fig_height + 0.4 + 0.18 * len(result.notes)), layout="constrained")
    ax = fig.subplots()
    pts, front = result.points, result.front
    ok = pts[~pts["client_limited"]]
    ax.scatter(ok["tokens_per_user"], ok["tokens_per_gpu"], color="0.6", alpha=0.6, s=22, label="all runs")
    lim = pts[pts["client_limited"]]
    if len(lim):
        ax.scatter(lim["tokens_per_user"], lim["tokens_per_gpu"], facecolors="none", edgecolors="0.4", s=30,
                   label="client-limited run (not on the front)")
    bad = pts[_flagged(pts)]
    if len(bad):
        ax.scatter(bad["tokens_per_user"], bad["tokens_per_gpu"], label="fails a validity check", **_FLAG_STYLE)
    ax.plot(front["tokens_per_user"], front["tokens_per_gpu"], marker="o", color=_COLORS[0], label="Pareto front")
    for _, row in front.iterrows():
        text = "\n".join(f"{k}={fmt_value(row[k])}" for k in label_by)
        ax.annotate(text, (row["tokens_per_user"], row["tokens_per_gpu"]), textcoords="offset points",
                    xytext=(5, 4), fontsize=7)
    ax.set_xlabel("output tokens/s per user")
    ax.set_ylabel("output tokens/s per GPU")
    ax.legend(frameon=False)
    fig.suptitle("Pareto front: per-user speed against per-GPU throughput")
    if result.notes:
        fig.supxlabel("\n".join(textwrap.fill(n, 120) for n in result.notes), fontsize=7, color="0.3", ha="left",
                      x=0.01)
    return fig


def write_pareto(result: ParetoResult, label_by: Sequence[str], out_dir: str | Path, fmt: str = "png",
                 dpi: int = 150) -> list[Path]:
    """The figure (`PARETO.<fmt>`) and the front as `pareto_front.csv`, in `out_dir`."""
    out = Path(out_dir)
    cols = list(dict.fromkeys([*(c for c in ("serve_label", "bench_label", "run_number", "point_id")
                                 if c in result.front.columns), *label_by, "output_throughput", "user_count",
                               "user_count_from", "gpus", "gpus_from", "tokens_per_user", "tokens_per_gpu"]))
    fig = pareto_figure(result, label_by)
    return [save_figure(fig, out / f"PARETO.{fmt}", fmt, dpi),
            write_text_atomic(out / "pareto_front.csv", result.front[cols].to_csv(index=False))]


# -- SLA -----------------------------------------------------------------------------------------------

@styled
def sla_figure(sla: pd.DataFrame, variable: str, fig_height: float = 3.0) -> Figure:
    """The largest passing value of `variable` per server config, one panel per target, one bar per bench
    point. `sla` has one row per server config x bench point x target with at least `SLA_COLUMNS`
    (`results.sla_table`): `largest_pass` is inf when the target held at unbounded load, empty when no
    value passed; any state but `found` is written beside its bar."""
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


# -- writing a plot command's figures ------------------------------------------------------------------

def write_plots(plans: Sequence[FigurePlan], spec: PlotSpec, out_dir: str | Path, fmt: str = "png",
                dpi: int = 150) -> list[Path]:
    """Draw and save planned figures as `<name>.<fmt>` in `out_dir`; returns the paths."""
    return [save_figure(render(plan, spec), Path(out_dir) / f"{plan.name}.{fmt}", fmt, dpi) for plan in plans]

"""raysweep's one figure style: fonts, colours and markers, figures encoded and written whole. How values and
columns read in labels (units, numbers, order) is `raysweep.results.labels`.
"""

from __future__ import annotations

import functools
import io
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from raysweep.record.files import write_bytes_atomic
from raysweep.results.labels import fmt_value, natural_key
from raysweep.results.rows import _groups

if TYPE_CHECKING:  # matplotlib is imported where a figure is drawn or encoded, not with this module
    import pandas as pd
    from matplotlib.figure import Figure
    from matplotlib.typing import ColorType

P = ParamSpec("P")
R = TypeVar("R")


_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
# matplotlib's "tab10" colormap, written out so that this module does not import matplotlib (a test checks
# they are the same)
_COLORS: tuple[ColorType, ...] = (
    (0.12156862745098039, 0.4666666666666667, 0.7058823529411765), (1.0, 0.4980392156862745, 0.054901960784313725),
    (0.17254901960784313, 0.6274509803921569, 0.17254901960784313),
    (0.8392156862745098, 0.15294117647058825, 0.1568627450980392),
    (0.5803921568627451, 0.403921568627451, 0.7411764705882353),
    (0.5490196078431373, 0.33725490196078434, 0.29411764705882354),
    (0.8901960784313725, 0.4666666666666667, 0.7607843137254902),
    (0.4980392156862745, 0.4980392156862745, 0.4980392156862745),
    (0.7372549019607844, 0.7411764705882353, 0.13333333333333333),
    (0.09019607843137255, 0.7450980392156863, 0.8117647058823529))
_STYLE: dict[Any, Any] = {
    "font.size": 9, "axes.titlesize": 9, "axes.labelsize": 9, "legend.fontsize": 8, "figure.titlesize": 11,
    "axes.grid": True, "grid.linestyle": "--", "grid.alpha": 0.5, "axes.spines.top": False, "axes.spines.right": False,
    "lines.linewidth": 1.6, "lines.markersize": 5, "figure.facecolor": "white", "savefig.facecolor": "white"}



def styled(fn: Callable[P, R]) -> Callable[P, R]:
    """Run a figure-building function inside raysweep's one figure style (fonts, grid, spines)."""
    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        import matplotlib

        with matplotlib.rc_context(_STYLE):
            return fn(*args, **kwargs)
    return wrapper


def figure_bytes(fig: Figure, fmt: str = "png", dpi: int = 150, png_compression: int | None = None) -> bytes:
    """The figure encoded as `fmt` (png, svg, pdf); `png_compression`: zlib's level for a PNG (0 to 9, default
    Pillow's 6; the same pixels, 1 encodes the report's figures in about a fifth less time, 11 % larger)."""
    import matplotlib

    buf = io.BytesIO()
    extra: dict[str, Any] = ({"pil_kwargs": {"compress_level": png_compression}}
                             if png_compression is not None and fmt == "png" else {})
    # A figure laid out by matplotlib's constrained layout (all of raysweep's) already fits its legends and titles
    # inside it; "tight" would draw it once more only to measure it (a third of the report's drawing time).
    from matplotlib.layout_engine import ConstrainedLayoutEngine

    tight = None if isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine) else "tight"
    with matplotlib.rc_context(_STYLE):
        fig.savefig(buf, format=fmt, dpi=dpi, bbox_inches=tight, **extra)
    return buf.getvalue()


def save_figure(fig: Figure, path: str | Path, fmt: str = "png", dpi: int = 150) -> Path:
    """Write the figure whole or not at all."""
    return write_bytes_atomic(path, figure_bytes(fig, fmt, dpi))


def _file_stem(text: str) -> str:
    """vLLM's `sanitize_filename`, plus characters no file system likes."""
    return re.sub(r"[\\/:*?\"<>|\s]", "_", text.replace("..", "__")).strip("'\"")


def _curve_styles(labels: Sequence[str],
                  palette: dict[str, ColorType] | None = None) -> dict[str, tuple[ColorType, str]]:
    """A colour and marker per curve label, the same in every panel of a figure; a label in `palette` (the
    campaign's, `config_colors`) keeps its colour and marker there, so that they are the same in every figure."""
    palette = palette or {}
    place = {lab: i for i, lab in enumerate(palette)}
    return {lab: (palette.get(lab, _COLORS[i % len(_COLORS)]), _MARKERS[place.get(lab, i) % len(_MARKERS)])
            for i, lab in enumerate(labels)}


def config_colors(df: pd.DataFrame) -> dict[str, ColorType]:
    """One colour per server configuration (`serve_label`), the same on every figure of a campaign and in
    `raysweep plot`: the campaign's configurations in the order the figures list them, over the palette in
    turn. Made from the whole results table, so a figure of a few configurations keeps their colours."""
    if "serve_label" not in getattr(df, "columns", ()):
        return {}
    labels = sorted({fmt_value(v) for v in df["serve_label"]}, key=natural_key)
    return {lab: _COLORS[i % len(_COLORS)] for i, lab in enumerate(labels)}


def curve_colors(whole: pd.DataFrame, df: pd.DataFrame, curve_by: Sequence[str]) -> dict[str, ColorType]:
    """The colour of each curve of a figure drawn from `df` (a part of the campaign's table `whole`), by curve
    label, in the campaign's order: where each curve is one server configuration (curves by `serve_label`, or by
    the server parameters that tell the configurations apart), that configuration's colour (`config_colors`),
    so that a configuration looks alike on a card and in the figures; else each curve's place among them."""
    curves, order = _groups(df, curve_by)
    palette = config_colors(whole)
    if tuple(curve_by) == ("serve_label",):
        return palette
    if palette and "serve_label" in df.columns:
        configs = {lab: set(df.loc[curves == lab, "serve_label"].map(fmt_value)) for lab in order}
        one = [next(iter(c)) for c in configs.values() if len(c) == 1]
        if len(one) == len(order) == len(set(one)):  # each curve one configuration, each configuration one curve
            ranked = sorted(order, key=lambda lab: list(palette).index(next(iter(configs[lab]))))
            return {lab: palette[next(iter(configs[lab]))] for lab in ranked}
    return {lab: c for lab, (c, _) in _curve_styles(order).items()}


_FLAG_STYLE: dict[str, Any] = {"marker": "x", "color": "#d62728", "linewidths": 1.4, "s": 55, "zorder": 4}

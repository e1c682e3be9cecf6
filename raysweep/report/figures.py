"""The report's figures: which ones it draws (curves against the load, server-side metrics, the Pareto
front, SLA bars; the first bench shapes only), each drawn on its own and embedded as a PNG, and the
latency-throughput figure of a conclusions card. Each names what it is drawn from, so that a written report
keeps it and draws it again only when that changes (`raysweep.report.cache`); matplotlib is imported only
when a figure is drawn."""

from __future__ import annotations

import base64
import logging
import os
import re
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import pandas as pd

from raysweep.bench.load import CONCURRENCY
from raysweep.report import cache as report_cache
from raysweep.report import plots
from raysweep.report.markup import SHARED_NOTE, esc, nothing
from raysweep.results import conclusions
from raysweep.results.data import ReportData, answer_of, param_names
from raysweep.results.front import pareto
from raysweep.results.labels import sort_key
from raysweep.results.rows import client_limited_mask, load_variable

if TYPE_CHECKING:
    from concurrent.futures import Future, ProcessPoolExecutor

    from matplotlib.figure import Figure

log = logging.getLogger(__name__)

CURVE_METRICS = ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_e2el_ms")
LATENCY_THROUGHPUT = ("output_throughput", "median_ttft_ms")  # x, y of the first figure
# Figures of the first bench shapes only (`raysweep plot` draws every one): the report's cost stops
# growing with the runs
MAX_SHAPES_DRAWN = 6

Draw = Callable[[], "tuple[Figure | None, list[str]]"]
"""A figure's drawing: the figure (None when there is nothing to draw) and its notes."""
Listed = tuple[str, Draw] | tuple[str, Draw, tuple[Any, ...]]
"""A figure of the section: its caption, its drawing and, to keep it, what it is drawn from (the frames,
options and values its drawing reads; without them it is drawn every time)."""


def figures_section(data: ReportData, figures: Callable[[ReportData], Sequence[Listed]]) -> str:
    """The Figures section: every figure `figures` lists for the data, drawn one by one (or kept)."""
    if data.df.empty:
        return nothing("no finished run yet")
    entries = list(figures(data))
    beside = _Beside([(partial(_figure_body, e[0], e[1]), None if (p := _parts(e)) is None else (*p, e[0]))
                      for e in entries] if len(data.df) >= BESIDE_FROM_RUNS else [])
    html: dict[int, str] = {i: figure_html(*entry) for i, entry in enumerate(entries) if i not in beside.mine}
    made = beside.result()
    html.update({i: figure_html(entries[i][0], entries[i][1], _parts(entries[i]), made.get(i)) for i in beside.mine})
    return shared_notes_once([html[i] for i in range(len(entries))])


# From this many finished runs, half of the figures a report draws are drawn by a second process (`_Beside`);
# below, forking would cost more than it saves
BESIDE_FROM_RUNS = 400
# The figures the second process draws (`_Beside`), set before it starts: it inherits them
_BESIDE: list[Callable[[], str]] = []


class _Beside:
    """Half of the figures to be drawn (not kept) drawn by a second process while this one draws the other
    half: a figure's drawing and encoding is all matplotlib's CPU time, and a large campaign's figures were
    most of its report's time. Nothing is forked when there are fewer than two figures to draw, one CPU, no
    `fork`, or Ray runs in this process; a figure the second process could not draw is drawn here, as any
    other."""

    def __init__(self, entries: Sequence[tuple[Callable[[], str], tuple[Any, ...] | None]]) -> None:
        """`entries`: each figure's making (its HTML) and what it is kept by (None: never kept); the second
        process draws the later half (the server-side metrics, the largest figure, among them), this one the
        first half and the rest of the report."""
        self.mine: list[int] = []  # the indices of `entries` drawn beside
        self._future: Future[Any] | None = None
        self._pool: ProcessPoolExecutor | None = None
        import multiprocessing

        kept = report_cache.active()
        todo = [i for i, (_, key) in enumerate(entries) if key is None or kept is None or not kept.has(key)]
        ray = sys.modules.get("ray")
        if (len(todo) < 2 or len(os.sched_getaffinity(0)) < 2
                or "fork" not in multiprocessing.get_all_start_methods()
                or (ray is not None and getattr(ray, "is_initialized", lambda: False)())):
            return
        from concurrent.futures import ProcessPoolExecutor

        import matplotlib.backends.backend_agg  # noqa: F401 - imported once, before the fork, for both processes
        import matplotlib.figure  # noqa: F401

        mine = todo[len(todo) // 2:]
        _BESIDE[:] = [entries[i][0] for i in mine]
        try:
            self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork"))
            self._future = self._pool.submit(_draw_beside)
            self.mine = mine
        except Exception as exc:  # every figure is then drawn here
            log.info("figures not drawn beside: %s", exc)
            self._close()

    def result(self) -> dict[int, str]:
        """Index -> HTML of the figures drawn beside (a figure that failed there is missing)."""
        if self._future is None:
            return {}
        try:
            drawn = self._future.result()
        except Exception as exc:
            log.info("figures not drawn beside: %s", exc)
            return {}
        finally:
            self._close()
        return {i: html for i, html in zip(self.mine, drawn, strict=True) if html is not None}

    def _close(self) -> None:
        _BESIDE.clear()
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


def _parts(entry: Listed) -> tuple[Any, ...] | None:
    return entry[2] if len(entry) > 2 else None


def _draw_beside() -> list[str | None]:
    """In the second process: the HTML of each figure of `_BESIDE` (None for one that failed)."""
    out: list[str | None] = []
    for make in _BESIDE:
        try:
            out.append(make())
        except Exception:  # drawn again in the report's process, which says why
            out.append(None)
    return out


_NOTE = re.compile(r'<br><span class="note">(.*?)</span>')


def shared_notes_once(parts: Sequence[str]) -> str:
    """The figures' HTML with each note said once: a note under two or more figures (the same client-limited
    runs drawn hollow on each) is lifted above them all, and the rest stay under their figure."""
    seen = Counter(n for part in parts for n in dict.fromkeys(_NOTE.findall(part)))
    shared = [n for n, k in seen.items() if k > 1]
    if not shared:
        return "\n".join(parts)
    head = "".join(f'<p class="note">{SHARED_NOTE}{n}</p>' for n in shared)
    kept = [_NOTE.sub(lambda m: "" if m.group(1) in shared else m.group(0), part) for part in parts]
    return "\n".join([head, *kept])


def figure_list(data: ReportData) -> list[tuple[str, Draw, tuple[Any, ...]]]:
    """(caption, drawing function, what it is drawn from) of every figure the report shows."""
    df = data.df
    if plots.is_offline(df):
        base = plots.PlotSpec(fig_height=3.2)
        return [(f"{spec.var_y} against {spec.var_x}", partial(_curves, df, spec), ("curves", df, spec))
                for spec in plots.offline_specs(df, base)]
    serve_vars, bench_vars = param_names(data.points, df)
    load = load_variable(df, "total_token_throughput")
    cols = tuple(conclusions.shape_keys(df, bench_vars, load, data.sla_variable))
    df, shown = _first_shapes(df, list(cols))
    out: list[tuple[str, Draw, tuple[Any, ...]]] = []
    x, y = LATENCY_THROUGHPUT
    if {x, y} <= set(df.columns):
        spec = plots.PlotSpec(var_x=x, var_y=y, col_by=cols, curve_by=tuple(serve_vars), fig_height=3.2)
        out.append((f"latency against throughput: {y} against {x}, one point per {load} (mean of its runs)"
                    if load != "total_token_throughput" else f"{y} against {x}",
                    partial(_curves, df, spec), ("curves", df, spec)))
    for metric in (m for m in CURVE_METRICS if m in df.columns):
        spec = plots.PlotSpec(var_x=load, var_y=metric, col_by=cols, curve_by=tuple(serve_vars), fig_height=3.2)
        out.append((f"{metric} against {load}", partial(_curves, df, spec), ("curves", df, spec)))
    spec = plots.PlotSpec(col_by=(), row_by=cols, curve_by=tuple(serve_vars), fig_height=3.0)
    out.append((f"server-side metrics against {load}",
                lambda: _one(plots.plan_server_metrics(df, spec, load), spec), ("server metrics", df, spec, load)))
    out.append(("Pareto front (point means over their runs, 95 % intervals; every run in grey; no dominated "
                "ties)", lambda: _pareto(df), ("pareto", df)))
    if not data.sla.empty:
        out.append(("SLA: largest passing value per server config and target",
                    lambda: (plots.sla_figure(data.sla, data.sla_variable), []),
                    ("sla", data.sla, data.sla_variable)))
    if shown:
        out = [(f"{caption} ({shown})", draw, parts) for caption, draw, parts in out]
    return out


def _curves(df: pd.DataFrame, spec: plots.PlotSpec) -> tuple[Figure | None, list[str]]:
    return _one(plots.plan_curves(df, spec), spec)


def _first_shapes(df: pd.DataFrame, cols: list[str]) -> tuple[pd.DataFrame, str]:
    """The runs of the first MAX_SHAPES_DRAWN bench shapes (in the order of their values), and what that
    leaves out ("" when nothing)."""
    if not cols:
        return df, ""
    shapes = df[cols].drop_duplicates()
    if len(shapes) <= MAX_SHAPES_DRAWN:
        return df, ""
    keep = shapes.sort_values(cols, key=lambda col: col.map(sort_key)).head(MAX_SHAPES_DRAWN)
    return (df.merge(keep, on=cols), f"the first {MAX_SHAPES_DRAWN} of {len(shapes)} bench shapes; "
            f"`raysweep plot OUTPUT_DIR --col-by {','.join(cols)}` draws every one")


def _one(plans: list[plots.FigurePlan], spec: plots.PlotSpec) -> tuple[Figure | None, list[str]]:
    if not plans:
        return None, []
    return plots.render(plans[0], spec), plans[0].notes


def _pareto(df: pd.DataFrame) -> tuple[Figure | None, list[str]]:
    result = pareto(df)
    return plots.pareto_figure(result, [CONCURRENCY, "gpus"]), result.notes + result.drawn_notes


def figure_html(caption: str, draw: Draw, parts: tuple[Any, ...] | None = None, made: str | None = None) -> str:
    """One embedded PNG with its caption and notes; the reason instead when it cannot be drawn. With `parts`
    (what the figure is drawn from), kept by the report being written and drawn only when they change;
    `made`: its HTML already drawn (by `_Beside`), used in place of drawing it."""
    def make() -> str:
        return made if made is not None else _figure_body(caption, draw)

    try:
        return make() if parts is None else report_cache.cached((*parts, caption), make)
    except Exception as exc:  # a figure that fails costs only itself
        log.warning("report figure %r not drawn: %s", caption, exc)
        return f'<p class="note">{esc(caption)}: not drawn ({esc(exc)})</p>'


def _figure_body(caption: str, draw: Draw) -> str:
    fig, notes = draw()
    if fig is None:
        return f'<p class="muted">{esc(caption)}: no data for it in these results.</p>'
    return img_html(fig, caption, notes)


def img_html(fig: Figure, caption: str, notes: Sequence[str] = (), dpi: int = 110) -> str:
    """The figure as an embedded PNG with its caption and notes (encoded fast: the report is read once, and
    its encoding was a tenth of its time)."""
    png = base64.b64encode(plots.figure_bytes(fig, "png", dpi=dpi, png_compression=1)).decode()
    note = "".join(f'<br><span class="note">{esc(n)}</span>' for n in notes)
    return (f'<figure><img alt="{esc(caption)}" src="data:image/png;base64,{png}">'
            f"<figcaption>{esc(caption)}{note}</figcaption></figure>")


def card_figure(data: ReportData, c: conclusions.Conclusions, v: conclusions.ShapeVerdict,
                made: str | None = None) -> str:
    """Latency against throughput of one bench shape: a curve per server config, a point per load value (the
    mean of its runs), the best point starred. Empty without those metrics; the reason when it fails. `made`:
    its HTML already drawn (`cards_beside`), used in place of drawing it."""
    x, y = LATENCY_THROUGHPUT
    if not {x, y, "serve_label"} <= set(data.df.columns):
        return ""
    if next(i for i, w in enumerate(c.verdicts) if w is v) >= MAX_SHAPES_DRAWN:
        return (f'<p class="muted">Figure drawn for the first {MAX_SHAPES_DRAWN} bench shapes only; '
                "<code>raysweep plot</code> draws any.</p>")
    caption = _card_caption(c)
    try:
        key, draw = _card(data, c, v, caption)
        return report_cache.cached(key, draw if made is None else lambda: made)
    except Exception as exc:  # the card stays without its figure
        log.warning("conclusions figure of %s not drawn: %s", v.shape, exc)
        return f'<p class="note">{esc(caption)}: not drawn ({esc(exc)})</p>'


def _card(data: ReportData, c: conclusions.Conclusions, v: conclusions.ShapeVerdict,
          caption: str) -> tuple[tuple[Any, ...], Callable[[], str]]:
    """What a card's figure is drawn from (its key in the kept figures) and its drawing."""
    x, y = LATENCY_THROUGHPUT
    mine = c.points.loc[c.points["shape"] == v.shape, ["serve_id", "bench_id"]]
    # no validity crosses here: the Warnings section lists those runs, the Figures mark them
    rows = data.df.merge(mine, on=["serve_id", "bench_id"]).drop(columns=["validity_ok"], errors="ignore")
    spec = plots.PlotSpec(var_x=x, var_y=y, curve_by=("serve_label",), fig_height=2.3)
    leader = (v.leader["serve_id"], v.leader["bench_id"])
    return ("card", rows, spec, leader, caption), partial(_card_html, rows, spec, leader, caption)


class CardsBeside:
    """`card_figure` with the later half of the cards' figures to be drawn (not kept) drawn by a second
    process (`_Beside`) while this one makes the first cards, from BESIDE_FROM_RUNS finished runs. `close`
    when the cards are made."""

    def __init__(self, data: ReportData, card_figure: Callable[..., str]) -> None:
        self.card_figure = card_figure
        self._mine: dict[int, int] = {}  # id of a verdict drawn beside -> its index
        self._made: dict[int, str] | None = None
        self._beside: _Beside | None = None
        if len(data.df) < BESIDE_FROM_RUNS or not {*LATENCY_THROUGHPUT, "serve_label"} <= set(data.df.columns):
            return
        try:
            c = answer_of(data)
            drawn = c.verdicts[:MAX_SHAPES_DRAWN]
            entries = [_card(data, c, v, _card_caption(c))[::-1] for v in drawn]
        except Exception:  # the conclusions section says why
            return
        self._beside = _Beside(entries)
        self._mine = {id(drawn[i]): i for i in self._beside.mine}

    def __call__(self, data: ReportData, c: conclusions.Conclusions, v: conclusions.ShapeVerdict) -> str:
        i = self._mine.get(id(v))
        made = self.close().get(i) if i is not None else None
        return self.card_figure(data, c, v) if made is None else self.card_figure(data, c, v, made)

    def close(self) -> dict[int, str]:
        """The figures drawn beside (index -> HTML), waited for once."""
        if self._made is None:
            self._made = self._beside.result() if self._beside is not None else {}
        return self._made


def _card_caption(c: conclusions.Conclusions) -> str:
    x, y = LATENCY_THROUGHPUT
    return f"{y} against {x}, one point per {c.load or 'bench point'}; \u2605 the best point"


def _card_html(rows: pd.DataFrame, spec: plots.PlotSpec, leader: tuple[Any, Any], caption: str) -> str:
    """A card's figure drawn, the leader's point starred."""
    x, y = spec.var_x, spec.var_y
    fig = plots.render(plots.plan_curves(rows, spec)[0], spec)
    best = rows[(rows["serve_id"] == leader[0]) & (rows["bench_id"] == leader[1]) & ~client_limited_mask(rows)]
    fig.axes[0].scatter(best[x].mean(), best[y].mean(), marker="*", s=200, color="gold", edgecolors="black",
                        linewidths=0.8, zorder=5)
    return img_html(fig, caption, dpi=90)

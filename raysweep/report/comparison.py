"""What `raysweep compare` draws and writes, and the report's Comparison section: the curves of all sides in
one figure (`comparison_figure`), the tables and the figure written whole (`write_comparison`), and the
comparison of an output dir with its recorded baseline (`report_section`). The comparison itself (matching,
verdicts, totals) is `raysweep.results.compare`.
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from raysweep.bench.load import VARIABLES
from raysweep.errors import UserError
from raysweep.record.files import write_text_atomic
from raysweep.report.plots.style import figure_bytes, save_figure, styled
from raysweep.results.compare import (
    BASELINE_FILE,
    COMPARE_DIR,
    Comparison,
    Side,
    _norm,
    campaign_slo,
    compare,
    family_text,
    load_side,
    totals,
)
from raysweep.results.labels import axis_label, fmt_value

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["FIGURE_METRICS", "comparison_figure", "deployments_html", "report_section", "write_comparison"]

FIGURE_METRICS = ("output_throughput", "median_ttft_ms", "median_tpot_ms", "p99_e2el_ms")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def _x_column(on: list[str], summaries: list[pd.DataFrame]) -> str | None:
    """The load variable when it is matched on and varies, else the first numeric matched column that
    varies (None: the points are drawn one after another)."""
    def varies(c: str) -> bool:
        values = pd.concat([pd.to_numeric(s[c], errors="coerce") for s in summaries if c in s.columns])
        return bool(values.notna().all() and values[np.isfinite(values)].nunique() > 1)

    for c in (*VARIABLES, *on):
        if c in on and varies(c):
            return c
    return None


@styled
def comparison_figure(comparisons: Sequence[Comparison], metrics: Sequence[str] | None = None,
                      fig_height: float = 3.2) -> Figure:
    """One panel per metric (default `FIGURE_METRICS` that both sides have) against the load variable: a
    curve per side and server config, the baseline dashed, error bars from the confidence intervals."""
    import matplotlib  # only where the figure is drawn: `compare` without one needs none
    from matplotlib.figure import Figure

    colours = tuple(matplotlib.colormaps["tab10"].colors)  # type: ignore[attr-defined]

    first = comparisons[0]
    names = [m for m in (metrics or FIGURE_METRICS) if m in first.metrics] or first.metrics[:4]
    sides = [first.baseline, *(c.other for c in comparisons)]
    x = _x_column(first.on, [s.summary for s in sides])
    others = [c for c in first.on if c != x]
    fig = Figure(figsize=(fig_height * 1.35 * len(names) + 2.6, fig_height + 0.6), layout="constrained")
    axes = fig.subplots(1, len(names), squeeze=False)[0]
    keys = _curve_keys(sides, comparisons, others)
    colors = {k: colours[i % len(colours)] for i, k in enumerate(dict.fromkeys(group for _, group, _ in keys))}
    for ax, m in zip(axes, names):
        for n, group, pts in keys:
            label = " · ".join(p for p in (sides[n].name, group) if p)
            _draw_curve(ax, pts, x, m, (colors[group], _MARKERS[n % len(_MARKERS)]), dashed=n == 0, label=label)
        ax.set_title(m)
        ax.set_xlabel(axis_label(x) if x else "point")
        ax.set_ylabel(axis_label(m))
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", title="baseline dashed")
    fig.suptitle(" vs ".join(s.name for s in sides))
    return fig


def _curve_keys(sides: list[Side], comparisons: Sequence[Comparison],
                others: list[str]) -> list[tuple[int, str, pd.DataFrame]]:
    """(side number, group label, its points) per curve: one per side, server config and value of the other
    matched columns (the group, coloured alike on every side); only points that take part in a comparison
    are drawn."""
    on = comparisons[0].on
    out = []
    for n, side in enumerate(sides):
        tables = [c.table for c in comparisons] if n == 0 else [comparisons[n - 1].table]
        wanted = {tuple(_norm(v) for v in r) for t in tables if not t.empty for r in t[on].itertuples(index=False)}
        df = side.summary
        df = df[[tuple(_norm(v) for v in r) in wanted for r in df[on].itertuples(index=False)]]
        group_by = [c for c in others if c in df.columns] or [c for c in ("serve_label",) if c in df.columns]
        for values, pts in (df.groupby(group_by, dropna=False, sort=True) if group_by else [((), df)]):
            values = values if isinstance(values, tuple) else (values,)
            out.append((n, " · ".join(f"{c}={fmt_value(v)}" if c in others else fmt_value(v)
                                      for c, v in zip(group_by, values)), pts))
    return out


def _draw_curve(ax: Axes, pts: pd.DataFrame, x: str | None, metric: str, style: tuple[Any, str], dashed: bool,
                label: str) -> None:
    if f"{metric}_mean" not in pts.columns or pts.empty:
        return
    xs = pd.to_numeric(pts[x], errors="coerce") if x else pd.Series(range(len(pts)), index=pts.index, dtype=float)
    order = np.argsort(xs.to_numpy(), kind="stable")
    xs = xs.to_numpy()[order]
    y = pd.to_numeric(pts[f"{metric}_mean"], errors="coerce")
    y = y.to_numpy()[order]
    lo = pd.to_numeric(pts.get(f"{metric}_ci_low"), errors="coerce").to_numpy()[order]
    hi = pd.to_numeric(pts.get(f"{metric}_ci_high"), errors="coerce").to_numpy()[order]
    color, marker = style
    ax.plot(xs, y, linestyle="--" if dashed else "-", marker=marker, color=color, label=label,
            markerfacecolor="none" if dashed else color)
    has = np.isfinite(lo) & np.isfinite(hi)
    if has.any():
        ax.errorbar(xs[has], y[has], yerr=[y[has] - lo[has], hi[has] - y[has]], fmt="none", ecolor=color, capsize=3,
                    alpha=0.7)


# ---------------------------------------------------------------------------------------------------
# Writing, recording the baseline, the report section
# ---------------------------------------------------------------------------------------------------

def write_comparison(comparisons: Sequence[Comparison], out_dir: str | Path, fmt: str = "png",
                     dpi: int = 150) -> list[Path]:
    """comparison.csv (every compared pair, with `campaign_a`, `campaign_b`), comparison_totals.csv,
    COMPARE.<fmt> and, where P/D deployments were matched, deployments.csv (one row per difference between
    two matched deployments: shape or a role server's setting), each whole or not at all."""
    out = Path(out_dir)
    tables = [c.table.assign(campaign_a=c.baseline.name, campaign_b=c.other.name) for c in comparisons]
    sums = [totals(c).assign(campaign_a=c.baseline.name, campaign_b=c.other.name) for c in comparisons]
    paths = [write_text_atomic(out / "comparison.csv", pd.concat(tables).to_csv(index=False)),
             write_text_atomic(out / "comparison_totals.csv", pd.concat(sums).to_csv(index=False))]
    if any(not c.table.empty for c in comparisons):
        paths.append(save_figure(comparison_figure(comparisons), out / f"COMPARE.{fmt}", fmt, dpi))
    rows = [{"campaign_a": c.baseline.name, "campaign_b": c.other.name, "serve_id_a": d["baseline_serve_id"],
             "serve_id_b": d["other_serve_id"], "settings_recorded": d["settings_recorded"], "difference": diff}
            for c in comparisons for d in c.deployments for diff in (d["differences"] or [""])]
    if rows:
        paths.append(write_text_atomic(out / "deployments.csv", pd.DataFrame(rows).to_csv(index=False)))
    return paths


def deployments_html(cmp: Comparison) -> str:
    """What differs between the matched P/D deployments of a comparison, one line per pair ("" without any)."""
    items = []
    for d in cmp.deployments:
        what = "; ".join(d["differences"]) or "no difference in shape or in any role server's settings"
        note = "" if d["settings_recorded"] else " (role settings not recorded on both sides)"
        items.append(f"<li>deployment {html.escape(d['other_serve_id'])} against "
                     f"{html.escape(d['baseline_serve_id'])}{note}: {html.escape(what)}</li>")
    return f"<p>P/D deployments compared:</p><ul>{''.join(items)}</ul>" if items else ""


def report_section(output_dir: Path) -> str | None:
    """The comparison of this output dir with its recorded baseline (`raysweep compare BASELINE OUTPUT_DIR`):
    totals per metric, the figure and the matched points; None when no baseline is recorded."""
    path = Path(output_dir) / COMPARE_DIR / BASELINE_FILE
    if not path.is_file():
        return None
    meta = json.loads(path.read_text())
    try:
        base = load_side(meta["baseline"], "baseline")
    except UserError as exc:
        return f'<p class="note">The recorded baseline cannot be read: {html.escape(str(exc))}</p>'
    cmp = compare(base, load_side(output_dir), meta.get("match_on") or None, meta.get("metrics") or None,
                  campaign_slo(output_dir))
    head = (f"<p>Against the baseline <b>{html.escape(base.name)}</b> ({html.escape(str(base.source))}), matched "
            f"on {html.escape(', '.join(cmp.on))}: {len(cmp.table)} point(s) compared, "
            f"{cmp.unmatched_other} here and {cmp.unmatched_baseline} in the baseline without a match. Ratio = "
            f"this campaign / baseline; better or worse only when {family_text(cmp)} rejects equal means, "
            "not shown when the runs cannot tell them apart (or a side has fewer than 3 runs).</p>")
    notes = "".join(f'<p class="note">{html.escape(n)}</p>' for n in cmp.notes) + deployments_html(cmp)
    if cmp.table.empty:
        return head + notes
    png = base64.b64encode(figure_bytes(comparison_figure([cmp]), "png", dpi=110)).decode()
    figure = (f'<figure><img alt="comparison with the baseline" src="data:image/png;base64,{png}">'
              "<figcaption>this campaign (solid) and the baseline (dashed), mean and confidence interval per "
              "point</figcaption></figure>")
    return head + notes + _html_table(totals(cmp)) + figure + _html_table(_point_view(cmp))


def _point_view(cmp: Comparison) -> pd.DataFrame:
    """The matched points with, per metric, `ratio (verdict)`."""
    view = cmp.table[[*cmp.on, "serve_label_b"]].copy()
    for m in cmp.metrics:
        view[m] = [f"{r:.3f} ({v})" if math.isfinite(r) else v
                   for r, v in zip(cmp.table[f"{m}_ratio"], cmp.table[f"{m}_verdict"])]
    return view


def _html_table(df: pd.DataFrame) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_text(v))}</td>" for v in row) + "</tr>"
                   for row in df.itertuples(index=False))
    return f'<div class="wide"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _text(value: object) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.4g}"
    return fmt_value(value) if value is not None else ""

"""Aggregates and comparisons: `compare` (campaigns against a baseline) and the table `results --aggregate` prints."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import click
import pandas as pd
from rich.markup import escape
from rich.table import Table

from raysweep.cli._common import _FORMAT, _print_paths, main, out
from raysweep.errors import UserError

_SHOWN = ("output_throughput", "median_ttft_ms", "median_tpot_ms", "p99_e2el_ms")
_VERDICT_STYLE = {"better": "green", "worse": "red", "within noise": "yellow", "not judged": "dim"}


def _num(value: Any) -> str:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return "-"
    return "-" if math.isnan(v) else f"{v:.4g}"


def print_aggregates(output_dir: str, results: pd.DataFrame, formats: tuple[str, ...], confidence: float,
                     threshold: float, noise_metrics: str | None) -> None:
    """Print the aggregates per point (`results --aggregate`) and write summary.* with these settings."""
    from raysweep import aggregate, plots

    names = plots.split_list(noise_metrics) or None
    summary = aggregate.summary_table(output_dir, confidence, threshold, results=results, noise_metrics=names)
    paths = aggregate.write_summary(output_dir, [f for f in formats if f in aggregate.SUMMARY_FORMATS],
                                    summary=summary)
    shown = [m for m in _SHOWN if f"{m}_mean" in summary.columns]
    table = Table("server config", "bench point", "runs", *(f"{m}\n[{confidence:.0%} CI]" for m in shown),
                  "noisy", "runs needed", title=f"{len(summary)} point(s); noisy: coefficient of variation above "
                                                f"{threshold:g}")
    for _, r in summary.iterrows():
        cells = [f"{_num(_value(r, m))} [{_num(r[f'{m}_ci_low'])}, {_num(r[f'{m}_ci_high'])}]" for m in shown]
        noisy = f"[yellow]{escape(str(r['noisy_metrics']))}[/]" if r["noisy"] else "no"
        needed = "-" if pd.isna(r["runs_needed"]) else str(int(r["runs_needed"]))
        table.add_row(escape(str(r.get("serve_label", ""))), escape(str(r.get("bench_label", ""))), str(r["runs"]),
                      *cells, noisy, needed)
    out.print(table)
    methods = sorted(set(summary.get("ci_method", pd.Series(dtype=str)).dropna()))
    notes = [f"intervals: {m}" for m in methods]
    if any(f"{m}_pooled" in summary.columns for m in shown):
        notes.append("a bootstrapped percentile shows its value over the pooled requests of the runs; every other "
                     "value is the mean over the runs")
    _print_paths(paths, notes)


def _value(row: pd.Series, metric: str) -> Any:
    """The value an interval is about: the pooled percentile where it was bootstrapped, else the mean."""
    pooled = row.get(f"{metric}_pooled")
    return pooled if pooled is not None and not pd.isna(pooled) else row[f"{metric}_mean"]


@main.command("compare")
@click.argument("dirs", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--baseline", type=click.Path(exists=True), default=None,
              help="The baseline: an output dir, or a summary/results .parquet or .csv file. Default: the first "
                   "DIR, the others compared against it.")
@click.option("--match-on", default=None, help="Comma list of the parameter columns points are matched on "
                                               "(default: the parameters all sides have).")
@click.option("--metrics", default=None, help="Comma list of the metrics compared (default: throughputs, median "
                                              "and p99 TTFT, TPOT and E2EL).")
@click.option("--confidence", type=float, default=0.95, show_default=True,
              help="Confidence level of the intervals that decide significance.")
@click.option("--out", "out_path", default=None, help="Directory for comparison.csv, comparison_totals.csv and "
                                                     "COMPARE.<format> (default: FIRST_COMPARED_DIR/compare).")
@click.option("--format", "fmt", type=_FORMAT, default="png", show_default=True)
@click.option("--fig-dpi", type=int, default=150, show_default=True)
@click.option("--no-record", is_flag=True, help="Do not record the baseline in the compared output dirs (their "
                                                "report then shows no comparison).")
def compare_cmd(dirs: tuple[str, ...], baseline: str | None, match_on: str | None, metrics: str | None,
                confidence: float, out_path: str | None, fmt: str, fig_dpi: int, no_record: bool) -> None:
    """Compare campaigns with a baseline: points matched by their parameters, per metric the ratio and whether
    the difference exceeds the noise (confidence intervals), and one figure with the curves of all."""
    from raysweep import compare, plots
    from raysweep.ledger import LEDGER_FILE

    sources = ([baseline] if baseline else []) + list(dirs)
    if len(sources) < 2:
        raise UserError("compare: give at least two campaigns (DIR_A DIR_B), or one DIR and --baseline FILE")
    sides = compare.distinct_names([compare.load_side(s, "--baseline" if baseline and i == 0 else "DIR", confidence)
                                    for i, s in enumerate(sources)])
    on = plots.split_list(match_on) or compare.common_params(sides)
    wanted = plots.split_list(metrics) or None
    comparisons = [compare.compare(sides[0], other, on, wanted) for other in sides[1:]]
    for cmp in comparisons:
        _print_comparison(cmp)
    first = Path(sources[1])
    dest = Path(out_path) if out_path else (first if first.is_dir() else first.parent) / compare.COMPARE_DIR
    paths = compare.write_comparison(comparisons, dest, fmt, fig_dpi)
    if not no_record:
        paths += [compare.record_baseline(s.source, sides[0].source, plots.split_list(match_on), wanted)
                  for s in sides[1:] if (s.source / LEDGER_FILE).is_file()]
    _print_paths(paths, [n for c in comparisons for n in c.notes])


def _print_comparison(cmp: Any) -> None:
    from raysweep import compare

    out.print(f"[bold]{escape(cmp.other.name)}[/] against [bold]{escape(cmp.baseline.name)}[/]: {len(cmp.table)} "
              f"point(s) matched on {escape(', '.join(cmp.on))}; without a match: {cmp.unmatched_other} of "
              f"{escape(cmp.other.name)}, {cmp.unmatched_baseline} of {escape(cmp.baseline.name)}")
    if cmp.table.empty:
        return
    sums = Table("metric", "ratio (geomean)", "min", "max", "better", "worse", "within noise", "not judged",
                 title="ratio = compared / baseline; better or worse: confidence intervals do not overlap")
    for _, r in compare.totals(cmp).iterrows():
        sums.add_row(r["metric"], _num(r["ratio_geomean"]), _num(r["ratio_min"]), _num(r["ratio_max"]),
                     f"[green]{r['better']}[/]", f"[red]{r['worse']}[/]", str(r["within_noise"]), str(r["not_judged"]))
    out.print(sums)
    shown = [m for m in cmp.metrics if m in _SHOWN] or cmp.metrics[:4]
    points = Table(*cmp.on, *(f"{m}\nratio" for m in shown), title="per point")
    for _, r in cmp.table.iterrows():
        cells = [f"[{_VERDICT_STYLE[r[f'{m}_verdict']]}]{_num(r[f'{m}_ratio'])} {r[f'{m}_verdict']}[/]"
                 for m in shown]
        points.add_row(*(escape(str(r[c])) for c in cmp.on), *cells)
    out.print(points)

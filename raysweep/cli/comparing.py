"""Aggregates and comparisons: `compare` (campaigns against a baseline) and the table `results --aggregate` prints.

Tables for people: one column per parameter, rows sorted by the parameter values, and a few metrics (chosen
with `--metrics`); nothing is cut when piped (`print_table`). Both write nothing unless asked (`--out`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.markup import escape
from rich.table import Table

from raysweep.cli._common import _print_paths, _say, fig_format_option, main, out, print_table
from raysweep.cli.jsonout import json_option, print_json
from raysweep.errors import UserError, unknown_names

if TYPE_CHECKING:
    import pandas as pd

    from raysweep.results.compare import Comparison

_SHOWN = ("output_throughput", "median_ttft_ms", "median_tpot_ms", "p99_e2el_ms")
_VERDICT_STYLE = {"better": "green", "worse": "red", "not shown": "yellow", "not judged": "dim", "not compared": "dim",
                  "outside slo": "dim"}
_STATS = ("mean", "median", "std", "cv", "ci_low", "ci_high")


def _num(value: Any) -> str:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return "-"
    return "-" if math.isnan(v) else f"{v:.4g}"


def _sorted_by(df: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """Rows in the order of their parameter values (numbers as numbers, then text)."""
    import pandas as pd

    cols = [c for c in columns if c in df.columns]
    if not cols or df.empty:
        return df

    def key(col: pd.Series) -> pd.Series:
        num = pd.to_numeric(col, errors="coerce")
        return num if num.notna().all() else col.astype(str)

    return df.sort_values(cols, key=key, kind="stable", ignore_index=True)


def shown_metrics(option: str, given: str | None, available: list[str], default: tuple[str, ...] = _SHOWN) -> list[str]:
    """The metrics a table shows: `given` (a comma list, each checked) or the defaults that are there."""
    from raysweep.results.rows import split_list

    names = list(split_list(given))
    if not names:
        return [m for m in default if m in available] or available[:4]
    missing = [m for m in names if m not in available]
    if missing:
        raise UserError(unknown_names(option, missing, available, "metric"))
    return names


def method_notes(methods: list[str]) -> list[str]:
    """One note per way the points' intervals were made, never the same long text once per point: texts that
    differ only in their numbers (a point's request count) are one note, with how many points it covers."""
    import re

    groups: dict[str, list[str]] = {}
    for m in methods:
        groups.setdefault(re.sub(r"\d+(?:\.\d+)?", "N", str(m)), []).append(str(m))
    notes = []
    for texts in groups.values():
        first, many = texts[0], len(set(texts)) > 1
        if many:  # the numbers differ point by point: say the text once, without them
            first = re.sub(r"[;,]? ?\d+(?:\.\d+)? requests?", "", first)
        count = f" ({len(texts)} point(s))" if len(groups) > 1 or many else ""
        notes.append(f"intervals{count}: {first}")
    return notes


def print_aggregates(output_dir: str, results: pd.DataFrame | None, formats: tuple[str, ...], confidence: float,
                     threshold: float, noise_metrics: str | None, metrics: str | None = None,
                     dest: Path | None = None, as_json: bool = False, written: list[Path] | None = None,
                     tell_unwritten: bool = True) -> None:
    """Print the aggregates per point (`results --aggregate`), and write summary.* into `dest` when given;
    `results`: the results table (None: read where the kept summary does not serve)."""
    import pandas as pd

    from raysweep.results import aggregate
    from raysweep.results.labels import fmt_value
    from raysweep.results.rows import split_list
    from raysweep.results.table import kept_summary, kept_summary_at

    names = split_list(noise_metrics) or None
    kept = None  # as the run's end wrote it; printed at other settings, its intervals made again from it
    if names is None:
        kept = kept_summary(output_dir, confidence, threshold) if dest is not None else \
            kept_summary_at(output_dir, confidence, threshold)
    summary = kept if kept is not None else aggregate.summary_table(output_dir, confidence, threshold,
                                                                    results=results, noise_metrics=names)
    params = aggregate.summary_params(summary)
    summary = _sorted_by(summary, params)
    available = [c[: -len("_mean")] for c in summary.columns if c.endswith("_mean")]
    shown = shown_metrics("--metrics", metrics, available)
    paths = list(written or [])
    if dest is not None:
        paths += aggregate.write_summary(dest, [f for f in formats if f in aggregate.SUMMARY_FORMATS],
                                         summary=summary)
    notes = method_notes(list(summary.get("ci_method", pd.Series(dtype=str)).dropna()))
    if any(f"{m}_pooled" in summary.columns for m in shown):
        notes.append("a percentile shows the mean of its per-run values with their t-interval (what compare tests); "
                     "the summary also holds the pooled percentile and its two-level bootstrap interval (M_pooled*)")
    if as_json:
        print_json("summary", _summary_document(output_dir, summary, params, available, confidence, threshold, paths,
                                          notes))
        return
    table = Table(*params, "runs", *(f"{m}\n[{confidence:.0%} CI]" for m in shown), "noisy", "runs needed",
                  title=f"{len(summary)} point(s); noisy: coefficient of variation above {threshold:g}")
    for r in summary.to_dict("records"):  # plain dicts: a row Series' lookups cost many times more
        cells = [f"{_num(_value(r, m))} [{_num(r.get(f'{m}_ci_low'))}, {_num(r.get(f'{m}_ci_high'))}]"
                 for m in shown]
        noisy = f"[yellow]{escape(str(r['noisy_metrics']))}[/]" if r["noisy"] else "no"
        needed = "-" if pd.isna(r["runs_needed"]) else str(int(r["runs_needed"]))
        table.add_row(*(escape(fmt_value(r[p])) for p in params), str(r["runs"]), *cells, noisy, needed)
    print_table(table, out)
    _print_paths(paths, notes)
    if dest is None and tell_unwritten:
        _say("summary not written (write it with --out DIR)", err=True)


def _summary_document(output_dir: str, summary: pd.DataFrame, params: list[str], metrics: list[str],
                      confidence: float, threshold: float, paths: list[Path], notes: list[str]) -> dict[str, Any]:
    import pandas as pd

    points = []
    for r in summary.to_dict("records"):
        points.append({
            "serve_id": r.get("serve_id"), "bench_id": r.get("bench_id"),
            "params": {p: r[p] for p in params}, "runs": int(r["runs"]), "noisy": bool(r["noisy"]),
            "noisy_metrics": [m for m in str(r.get("noisy_metrics") or "").split(",") if m],
            "runs_needed": None if pd.isna(r["runs_needed"]) else int(r["runs_needed"]),
            "metrics": {m: {k: r.get(f"{m}_{k}") for k in (*_STATS, "pooled") if f"{m}_{k}" in summary.columns}
                        for m in metrics}})
    return {"output_dir": output_dir, "confidence": confidence, "noise_threshold": threshold, "params": params,
            "metrics": metrics, "points": points, "notes": notes, "written": paths}


def _value(row: Mapping[str, Any], metric: str) -> Any:
    """The value the interval shown is about: the mean over the runs (of the per-run percentiles, for one)."""
    return row[f"{metric}_mean"]


_ACCEPTED = ("a raysweep output dir, a `vllm bench sweep` dir, a dir written by `raysweep import`, a summary/results "
             ".parquet or .csv file, or the name or id of a campaign of --catalog CATALOG")


def _resolve(arg: str, option: str, catalog_dir: str | None) -> tuple[str, str]:
    """Where a side of `compare` is read from: the path itself when it is one here, else the output dir of the
    catalogue's campaign of that name or id (`Catalog.output_dir`); with what it was, in words ("" for a path).

    :raises UserError: neither (exit 2, naming the option and what is accepted)."""
    from pathlib import Path

    if Path(arg).exists():
        return arg, ""
    if catalog_dir is None:
        raise UserError(f"{option} {arg}: no such file or directory, and no --catalog CATALOG to find a campaign of "
                        f"that name in; accepted: {_ACCEPTED}")
    from raysweep.catalog.store import Catalog

    cat = Catalog(catalog_dir)
    known = cat.campaigns
    if arg not in known and not any(c["name"] == arg for c in known.values()):
        names = sorted({c["name"] for c in known.values()})
        shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
        raise UserError(f"{option} {arg}: neither a file or directory here nor a campaign of the catalogue "
                        f"{catalog_dir} (its campaigns: {shown or 'none'}); accepted: {_ACCEPTED}")
    entry = cat.entry(arg, option)
    path = cat.output_dir(arg, option)
    return str(path), f"{option} {arg}: the campaign {entry['name']} of the catalogue {catalog_dir}, read from {path}"


@main.command("compare")
@click.argument("dirs", nargs=-1, required=True)
@click.option("--baseline", default=None,
              help="The baseline: an output dir, a summary/results .parquet or .csv file, or a campaign of "
                   "--catalog. Default: the first DIR, the others compared against it.")
@click.option("--catalog", "catalog_dir", default=None, metavar="CATALOG",
              help="A catalogue (`raysweep catalog add`): a DIR or --baseline that is not a path here names one of "
                   "its campaigns (its name or id), read from the output dir it was added from.")
@click.option("--match-on", default=None, help="Comma list of the parameter columns points are matched on "
                                               "(default: the parameters all sides have).")
@click.option("--metrics", default=None, help="Comma list of the metrics compared (default: throughputs, median "
                                              "and p99 TTFT, TPOT and E2EL); the per-point table shows the first four.")
@click.option("--confidence", type=float, default=0.95, show_default=True,
              help="Confidence level of the intervals shown (the verdicts are Welch's t-test at 5 %).")
@click.option("--slo", default=None, help="A service-level objective, METRIC=BOUND,... (e.g. p99_ttft_ms=500,"
                                          "median_tpot_ms=50): only points meeting it on both sides are judged. "
                                          "Default: the baseline's campaign's slo: when it has one.")
@click.option("--out", "out_path", default=None, help="Directory for comparison.csv, comparison_totals.csv and "
                                                     "COMPARE.<fig-format>. Without it nothing is written.")
@fig_format_option
@click.option("--fig-dpi", type=int, default=150, show_default=True)
@click.option("--record", is_flag=True, help="Record the baseline in the compared output dirs "
                                             "(compare/baseline.json), so that their report shows the comparison.")
@click.option("--no-record", is_flag=True, hidden=True, deprecated="nothing is recorded without --record")
@json_option
def compare_cmd(dirs: tuple[str, ...], baseline: str | None, catalog_dir: str | None, match_on: str | None,
                metrics: str | None, confidence: float, slo: str | None, out_path: str | None, fmt: str, fig_dpi: int,
                record: bool, no_record: bool, as_json: bool) -> None:
    """Compare campaigns with a baseline: points matched by their parameters, per metric the ratio and Welch's
    verdict over the runs (better, worse, not shown with N runs, not judged). Writes the tables and one figure with
    the curves
    of all with --out, and records the baseline with --record; nothing otherwise."""
    from raysweep.ledger import LEDGER_FILE
    from raysweep.report.comparison import write_comparison
    from raysweep.results import compare
    from raysweep.results.rows import split_list

    if record and no_record:
        raise UserError("--record and --no-record: accepted: one of them")
    given = ([("--baseline", baseline)] if baseline else []) + [("DIR", d) for d in dirs]
    if len(given) < 2:
        raise UserError("compare: give at least two campaigns (DIR_A DIR_B), or one DIR and --baseline FILE")
    resolved = [_resolve(arg, option, catalog_dir) for option, arg in given]  # every side checked before reading
    sides = compare.distinct_names([compare.load_side(path, option, confidence)
                                    for (option, _), (path, _) in zip(given, resolved)])
    on = split_list(match_on) or compare.common_params(sides)
    wanted = split_list(metrics) or None
    target = compare.parse_slo_option(slo) if slo else compare.campaign_slo(sides[0].source)
    comparisons = [compare.compare(sides[0], other, on, wanted, target) for other in sides[1:]]
    paths = write_comparison(comparisons, Path(out_path), fmt, fig_dpi) if out_path else []
    if record:
        paths += [compare.record_baseline(s.source, sides[0].source, split_list(match_on), wanted)
                  for s in sides[1:] if (s.source / LEDGER_FILE).is_file()]
    notes = [said for _, said in resolved if said] + [n for c in comparisons for n in c.notes]
    from raysweep.results.answer_file import kept_answer

    answers = {s.name: kept_answer(s.source) if s.source.is_dir() else None for s in sides}
    if as_json:
        print_json("compare", {"comparisons": [_comparison_document(c) for c in comparisons], "notes": notes,
                               "written": paths,
                               "answers": {k: (v or {}).get("answer") for k, v in answers.items()}})
        return
    for name, kept in answers.items():  # each campaign's own answer, as its run gave it (answer.json)
        for line in (kept or {}).get("lines", [])[:4]:
            _say(f"{name}'s answer: {line}")
    for cmp in comparisons:
        _print_comparison(cmp)
    _print_paths(paths, notes)


def _comparison_document(cmp: Comparison) -> dict[str, Any]:
    from raysweep.results import compare

    table = _sorted_by(cmp.table, list(cmp.on))
    points = []
    for r in table.to_dict("records"):  # plain dicts: a row Series' lookups cost many times more
        points.append({"params": {c: r[c] for c in cmp.on}, "runs_baseline": r.get("runs_a"),
                       "runs_other": r.get("runs_b"),
                       "metrics": {m: {"baseline": r.get(f"{m}_a"), "other": r.get(f"{m}_b"),
                                       "ratio": r.get(f"{m}_ratio"), "verdict": r.get(f"{m}_verdict"),
                                       "test": r.get(f"{m}_test"), "p_adjusted": r.get(f"{m}_p_adjusted"),
                                       "ratio_low": r.get(f"{m}_ratio_low"), "ratio_high": r.get(f"{m}_ratio_high"),
                                       "why": r.get(f"{m}_why") or None}
                                   for m in cmp.metrics}})
    totals = compare.totals(cmp).to_dict(orient="records") if not cmp.table.empty else []
    return {"baseline": cmp.baseline.name, "baseline_source": cmp.baseline.source, "other": cmp.other.name,
            "other_source": cmp.other.source, "match_on": list(cmp.on), "metrics": list(cmp.metrics),
            "unmatched_baseline": cmp.unmatched_baseline, "unmatched_other": cmp.unmatched_other,
            "tests": compare.family_text(cmp), "totals": totals, "points": points,
            "deployments": cmp.deployments}


def _print_comparison(cmp: Comparison) -> None:
    from raysweep.results import compare
    from raysweep.results.labels import fmt_value


    out.print(f"[bold]{escape(cmp.other.name)}[/] against [bold]{escape(cmp.baseline.name)}[/]: {len(cmp.table)} "
              f"point(s) matched on {escape(', '.join(cmp.on))}; without a match: {cmp.unmatched_other} of "
              f"{escape(cmp.other.name)}, {cmp.unmatched_baseline} of {escape(cmp.baseline.name)}")
    _print_deployments(cmp)
    if cmp.table.empty:
        return
    out.print(f"verdicts by {escape(compare.family_text(cmp))}", highlight=False)
    words = [w for w in _VERDICT_STYLE if w != "outside slo" or cmp.slo is not None]
    slo = f"; judged only where both meet the slo {cmp.slo.label}" if cmp.slo is not None else ""
    sums = Table("metric", "ratio (geomean)", "min", "max", *words,
                 title="ratio = compared / baseline; better or worse: Welch's t-test over the runs at 5 %; not "
                       f"shown: the runs cannot tell them apart{slo}")
    for _, r in compare.totals(cmp).iterrows():
        sums.add_row(r["metric"], _num(r["ratio_geomean"]), _num(r["ratio_min"]), _num(r["ratio_max"]),
                     *(f"[{_VERDICT_STYLE[w]}]{r.get(w.replace(' ', '_'), 0)}[/]" for w in words))
    print_table(sums, out)
    shown = [m for m in cmp.metrics if m in _SHOWN] or cmp.metrics[:4]
    points = Table(*cmp.on, *(f"{m}\nratio" for m in shown), title="per point")
    for r in _sorted_by(cmp.table, list(cmp.on)).to_dict("records"):  # plain dicts, not a Series per row
        cells = [f"[{_VERDICT_STYLE.get(str(r[f'{m}_verdict']), 'default')}]{_num(r[f'{m}_ratio'])} "
                 f"{escape(str(r[f'{m}_verdict']))}[/]" for m in shown]
        points.add_row(*(escape(fmt_value(r[c])) for c in cmp.on), *cells)
    print_table(points, out)


def _print_deployments(cmp: Comparison) -> None:
    """P/D deployments matched: what differs between them, shape and each role server's settings."""
    for d in cmp.deployments:
        what = "; ".join(d["differences"]) or "no difference in shape or in any role server's settings"
        unrecorded = "" if d["settings_recorded"] else " (role settings not recorded on both sides)"
        out.print(f"deployment {escape(d['other_serve_id'])} against {escape(d['baseline_serve_id'])}{unrecorded}: "
                  f"{escape(what)}", highlight=False)

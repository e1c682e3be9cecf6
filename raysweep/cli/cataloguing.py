"""The catalogue of campaigns: `catalog add/list/query/compare`, `history` and `site`.

`catalog add CATALOG DIR...` records every campaign found under each DIR (recursively) in CATALOG (made
when new); `catalog list` prints its campaigns; `catalog query` the points (runs averaged) that its filters
select, or the result of `--sql` (DuckDB, over the views `runs` and `campaigns`); `catalog compare` sets two
campaigns' like-for-like points side by side. `history` follows configurations over campaigns and flags
regressions; `--fail-on-regression` exits 1 when the newest campaign of a series is shown worse.
"""

from __future__ import annotations

import datetime
import math
import sys
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table

from raysweep.cli._common import _say, main, print_table
from raysweep.cli.jsonout import json_option, print_json
from raysweep.errors import UserError

if TYPE_CHECKING:
    from raysweep.cli.jsonout import F

_FILTER_OPTIONS = ("model", "config", "hardware", "dataset", "input_len", "output_len", "campaign")


def _filters(f: F) -> F:
    for name in reversed(_FILTER_OPTIONS):
        f = click.option(f"--{name.replace('_', '-')}", name, default=None,
                         help=f"Only runs whose {name.replace('_', ' ')} is this (exactly).")(f)
    return f


def _day(ts: Any) -> str:
    try:
        v = float(ts)
    except (TypeError, ValueError):
        return "-"
    if math.isnan(v):
        return "-"
    return datetime.datetime.fromtimestamp(v, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")


def _num(value: Any) -> str:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return "-" if value is None else str(value)
    return "-" if math.isnan(v) else f"{v:.4g}"


@main.group("catalog")
def catalog() -> None:
    """A catalogue of campaigns (and other tools' results): add, list, query, compare."""


@catalog.command("add")
@click.argument("catalog_dir", metavar="CATALOG")
@click.argument("dirs", nargs=-1, required=True)
def add(catalog_dir: str, dirs: tuple[str, ...]) -> None:
    """Record every campaign found under DIR... (recursively) in CATALOG; a campaign already there is updated
    when it changed (one that was still running) and otherwise left alone. Exit 2 when a DIR holds no
    campaign or cannot be read: nothing is added."""
    from raysweep.catalog.store import Catalog

    cat = Catalog(catalog_dir, create=True)
    report = cat.add(list(dirs))
    for word, names in (("added", report.added), ("updated", report.updated), ("unchanged", report.unchanged)):
        for name in names:
            _say(f"{word}: {name}")
    _say(f"{len(report.added)} added, {len(report.updated)} updated, {len(report.unchanged)} unchanged "
         f"({report.runs} runs written); {len(cat.campaigns)} campaigns in {catalog_dir}")


@catalog.command("list")
@click.argument("catalog_dir", metavar="CATALOG")
@json_option
def list_(catalog_dir: str, as_json: bool) -> None:
    """The campaigns of CATALOG: source, runs, models, hardware, vLLM versions, dates."""
    from raysweep.catalog.store import Catalog, state_of

    cat = Catalog(catalog_dir)
    if as_json:
        entries = sorted(cat.campaigns.values(), key=lambda c: (c.get("first_date") or 0.0, c["name"]))
        print_json("catalog", {"catalog": str(cat.path), "campaigns": entries})
        return
    table = Table("campaign", "source", "state", "runs", "points", "models", "hardware", "vLLM", "first run", "path")
    for c in sorted(cat.campaigns.values(), key=lambda c: (c.get("first_date") or 0.0, c["name"])):
        table.add_row(c["name"], c["source"], state_of(c), str(c["runs"]),
                      str(c["points"]), ", ".join(c["models"]) or "-", ", ".join(c["hardware"]) or "-",
                      ", ".join(c["vllm"]) or "-", _day(c.get("first_date")), c["path"])
    print_table(table)
    for c in sorted(cat.campaigns.values(), key=lambda c: (c.get("first_date") or 0.0, c["name"])):
        for line in c.get("answer") or []:  # the campaign's own answer, as its run gave it
            _say(f"{c['name']}'s answer: {line}")


@catalog.command("query")
@click.argument("catalog_dir", metavar="CATALOG")
@_filters
@click.option("--metric", "metrics", multiple=True, default=("output_throughput", "median_ttft_ms"),
              show_default=True, help="Metrics to show (mean over a point's valid runs); repeatable.")
@click.option("--sql", default=None, help="A DuckDB query over the views `runs` (one row per run) and "
                                          "`campaigns` (the index), printed instead.")
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV instead of a table.")
def query(catalog_dir: str, metrics: tuple[str, ...], sql: str | None, as_csv: bool, **filters: str | None) -> None:
    """Points of CATALOG, one row each (campaign, configuration, workload, load, hardware), with the mean of
    each metric over the point's valid runs; or the result of --sql."""
    from raysweep.catalog import queries
    from raysweep.catalog.store import Catalog

    cat = Catalog(catalog_dir)
    df = cat.query(sql) if sql else queries.points(cat, list(metrics), filters)
    if df.empty and not sql:  # an empty table with exit 0 reads as "nothing wrong": say what selected nothing
        raise UserError(queries.nothing_selected(cat, filters))
    if as_csv:
        sys.stdout.write(df.to_csv(index=False))
        return
    table = Table(*[str(c) for c in df.columns])
    for row in df.itertuples(index=False):
        table.add_row(*[_num(v) if isinstance(v, float) else str(v) for v in row])
    print_table(table)


@catalog.command("compare")
@click.argument("catalog_dir", metavar="CATALOG")
@click.argument("baseline")
@click.argument("other")
@click.option("--metric", default="output_throughput", show_default=True)
@json_option
def compare(catalog_dir: str, baseline: str, other: str, metric: str, as_json: bool) -> None:
    """OTHER against BASELINE (campaign names or ids): points matched like for like (model, workload,
    load, hardware, server settings), each judged over its runs; points without a like are listed with why
    they are not comparable. Exit 1 when no point is like one of the baseline (nothing was compared)."""
    from raysweep.catalog import queries
    from raysweep.catalog.store import Catalog

    result = queries.compare(Catalog(catalog_dir), baseline, other, metric)
    if as_json:
        print_json("catalog_compare", {"baseline": baseline, "other": other, "metric": metric,
                                       "matched": result.matched, "family": result.family,
                                       "unmatched": [{"point": p, "why": why} for p, why in result.unmatched]})
        if not result.matched:
            sys.exit(1)
        return
    if not result.matched:
        for point, why in result.unmatched:
            _say(f"{point}: {'; '.join(why)}")
        _say(f"nothing compared: no point of {other} is like a point of {baseline} (model, workload, load, "
             "hardware and server settings)" + ("; why each is not comparable is above" if result.unmatched
                                                 else f"; {other} has no valid run of {metric}"), err=True)
        sys.exit(1)
    table = Table("point", "baseline", "other", "ratio", "verdict")
    for m in result.matched:
        table.add_row(m["point"], _num(m["baseline"]), _num(m["other"]), _num(m["ratio"]), m["verdict"])
    print_table(table)
    if result.matched:
        _say(f"{result.family}: a difference is called only where its adjusted p-value is under 5 %")
    for point, why in result.unmatched:
        _say(f"{point}: {'; '.join(why)}")


@main.command("history")
@click.argument("catalog_dir", metavar="CATALOG")
@_filters
@click.option("--metric", default="output_throughput", show_default=True, help="The metric judged.")
@click.option("--margin", type=click.FloatRange(0.0, 1.0), default=0.05, show_default=True,
              help="A change smaller than this fraction is not a regression: `worse` only when the whole "
                   "interval of the ratio lies beyond it.")
@click.option("--fail-on-regression", is_flag=True,
              help="Exit 1 when the newest campaign of a series is shown worse than the one before it.")
@json_option
def history_cmd(catalog_dir: str, metric: str, margin: float, fail_on_regression: bool, as_json: bool,
                **filters: str | None) -> None:
    """A configuration's measurements over campaigns (time and versions), series by series: only like-for-like
    points (model, server settings, workload, load, hardware) share a series; each campaign judged against
    the one before it with the ratio's confidence interval."""
    from raysweep.catalog.history import answers, history
    from raysweep.catalog.store import Catalog

    cat = Catalog(catalog_dir)
    series = history(cat, metric, margin, filters)
    bad = [s for s in series if s.regressed]
    judged = sum(1 for s in series if len(s.points) > 1)
    said = answers(cat, series)  # each campaign's own answer, as its run gave it: never a second wording
    if as_json:
        print_json("history", {"metric": metric, "margin": margin, "judged": judged, "regressed": len(bad),
                               "series": [s.as_dict() for s in series], "answers": said})
        if fail_on_regression and bad:
            sys.exit(1)
        return
    if not series:
        _say("no run matches")
    lines = []
    for s in series:  # plain aligned text: a catalogue's history runs to thousands of lines, rich tables are slow
        k = s.key
        lines.append(f"{s.config} | {k['model']} | data set {s.dataset}, input {s.input_len}, output {s.output_len}, "
                     f"{k['load_variable']}={_num(k['load_value'])} | {k['hardware']}")
        rows = [("campaign", "date", "vLLM", "raysweep", "runs", f"{metric} (mean)", "against the one before")]
        rows += [(j.campaign, _day(j.date), j.vllm or "-", j.raysweep or "-", str(j.runs), _num(j.mean), j.text)
                 for j in s.points]
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        lines.append("")
    for a in said:
        lines += [f"{a['campaign']}'s answer: {line}" for line in a["lines"]] or [
            f"{a['campaign']}: no answer kept ("
            + ("its run did not end, or a point finished after it" if a["source"] == "raysweep"
               else f"a {a['source']} output: raysweep did not run it") + ")"]
    if lines:
        sys.stdout.write("\n".join(lines) + "\n")
    _say(f"{len(series)} series, {judged} judged (one-sided at 5 % over all of them, margin {margin:.0%}); "
         f"{len(bad)} with the newest campaign worse")
    if fail_on_regression and bad:
        sys.exit(1)


@main.command("site")
@click.argument("catalog_dir", metavar="CATALOG")
@click.argument("out", metavar="OUT")
def site(catalog_dir: str, out: str) -> None:
    """Write a static site of CATALOG into OUT (replaced whole): the campaigns with filters and their reports,
    overlays of chosen campaigns' Pareto fronts (like for like only), the history of every configuration
    measured more than once. Open OUT/index.html; no server needed."""
    from raysweep.catalog.site import write_site
    from raysweep.catalog.store import Catalog

    path = write_site(Catalog(catalog_dir), out)
    _say(str(path / "index.html"))

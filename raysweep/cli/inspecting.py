"""The tables of a campaign: `results` (the merged table) and `sla`; `status` is in `status`. They write
nothing unless asked (`--out`, or `results --format`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.markup import escape
from rich.table import Table

from raysweep.cli._common import OUTPUT_DIR, _say, main, out, print_table
from raysweep.cli.jsonout import json_option, print_json
from raysweep.errors import UserError

if TYPE_CHECKING:
    import pandas as pd


@main.command()
@click.argument("output_dir", type=OUTPUT_DIR)
@click.option("--format", "formats", type=click.Choice(["csv", "parquet", "json"]), multiple=True,
              help="Table format(s) to write (repeatable): results.<format>, and summary.<format> for parquet "
                   "and csv. Into --out, else OUTPUT_DIR.")
@click.option("--out", "out_path", type=click.Path(file_okay=False), default=None,
              help="Directory to write results.* and summary.* into (default formats: parquet and csv). Without "
                   "--out or --format nothing is written.")
@click.option("--aggregate", is_flag=True, help="Print the aggregates per point (mean, confidence interval, "
                                                "noisy points); with --out or --format, summary.* gets these settings.")
@click.option("--metrics", default=None, help="With --aggregate: comma list of the metrics shown (default: "
                                              "output_throughput, median_ttft_ms, median_tpot_ms, p99_e2el_ms).")
@click.option("--confidence", type=float, default=0.95, show_default=True, help="With --aggregate: the "
                                                                              "confidence level of the intervals.")
@click.option("--noise-threshold", type=float, default=0.05, show_default=True,
              help="With --aggregate: a point is noisy above this coefficient of variation.")
@click.option("--noise-metrics", default=None, help="With --aggregate: comma list of the metrics judged for noise "
                                                    "(default: throughputs, mean and median latencies).")
@json_option
def results(output_dir: str, formats: tuple[str, ...], out_path: str | None, aggregate: bool, metrics: str | None,
            confidence: float, noise_threshold: float, noise_metrics: str | None, as_json: bool) -> None:
    """The merged results table (one row per run) and, with --aggregate, the aggregates per point. Writes
    results.* and summary.* only when asked (--out DIR, or --format)."""
    from raysweep.record.directory import CampaignDir
    from raysweep.results.table import results_table, write_results

    with CampaignDir(output_dir) as directory:
        directory.check()
        dest = Path(out_path) if out_path else Path(output_dir) if formats else None
        # the aggregates alone need no table where the run's end kept them (`print_aggregates` reads it if not)
        df = results_table(directory) if dest or not aggregate else None
        wanted = formats or ("parquet", "csv")
        paths = write_results(directory, wanted, dest=dest, summary=not aggregate, table=df) if dest else []
        if aggregate:
            from raysweep.cli.comparing import print_aggregates

            print_aggregates(directory, df, wanted, confidence, noise_threshold, noise_metrics, metrics=metrics,
                             dest=dest, as_json=as_json, written=paths)
            return
    assert df is not None  # read above: no --aggregate
    if as_json:
        print_json("results", {"output_dir": output_dir, "rows": len(df), "columns": list(df.columns),
                         "runs": df.to_dict(orient="records"), "written": paths})
        return
    out.print(f"{len(df)} row(s), {len(df.columns)} column(s)")
    for p in paths:
        out.print(str(p), highlight=False)
    if not paths:
        _say("nothing written (write the table with --out DIR or --format FORMAT)", err=True)


def _with_costs(df: pd.DataFrame, output_dir: str) -> pd.DataFrame:
    """The SLA table with the cost (else energy) per output token at each largest pass, where the runs have it
    (`raysweep.sla.capacities.sla_costs`; docs/energy.md)."""
    from raysweep.record.directory import CampaignDir
    from raysweep.results.table import results_table
    from raysweep.sla.capacities import sla_costs

    try:
        with CampaignDir(output_dir) as directory:
            runs = results_table(directory)
    except Exception:  # noqa: BLE001 - no finished run: the table as it is
        return df
    return sla_costs(df, runs)


@main.command()
@click.argument("output_dir", type=OUTPUT_DIR)
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the table to this CSV file (nothing is written without it).")
@json_option
def sla(output_dir: str, out_path: str | None, as_json: bool) -> None:
    """The SLA table: per server config x bench point x target, the largest load that meets the target."""
    from raysweep.record.directory import CampaignDir
    from raysweep.record.files import write_text_atomic
    from raysweep.results.table import sla_table

    with CampaignDir(output_dir) as directory:
        df = sla_table(directory)
    if df.empty:
        raise UserError(f"{output_dir}: no SLA search has finished here (does the campaign have `sla:`?)")
    df = _with_costs(df, output_dir)
    path = write_text_atomic(Path(out_path), df.to_csv(index=False)) if out_path else None
    if as_json:
        print_json("sla", {"output_dir": output_dir, "searches": df.to_dict(orient="records"),
                     "written": [path] if path else []})
        return
    metric = str(df["cheapest_metric"].iloc[0]) if "cheapest_metric" in df.columns else ""
    table = Table("server config", "bench point", "target", "state", "largest pass", "smallest fail", "probes",
                  "at pass: req/s", *([f"at pass: {metric}", "cheapest"] if metric else []), "notes")

    def num(v: object) -> str:
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:g}"

    for r in df.itertuples():
        cost = [num(getattr(r, f"{metric}_at_pass")), "cheapest" if r.cheapest else ""] if metric else []
        table.add_row(escape(r.serve_label), escape(r.bench_label), escape(r.target), r.state, num(r.largest_pass),
                      num(r.smallest_fail), str(r.probes), num(getattr(r, "at_pass_request_throughput", None)),
                      *cost, escape(r.notes))
    print_table(table, out)
    if path:
        out.print(str(path), highlight=False)

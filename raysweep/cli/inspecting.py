"""The tables of a campaign: `results` (the merged table) and `sla`; `status` is in `status`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from raysweep.cli._common import OUTPUT_DIR, main, out
from raysweep.errors import UserError


@main.command()
@click.argument("output_dir", type=OUTPUT_DIR)
@click.option("--format", "formats", type=click.Choice(["csv", "parquet", "json"]), multiple=True,
              help="Format(s) to write (default: parquet and csv).")
@click.option("--aggregate", is_flag=True, help="Print the aggregates per point (mean, confidence interval, "
                                                "noisy points) and write summary.parquet/csv with these settings.")
@click.option("--confidence", type=float, default=0.95, show_default=True, help="With --aggregate: the "
                                                                              "confidence level of the intervals.")
@click.option("--noise-threshold", type=float, default=0.05, show_default=True,
              help="With --aggregate: a point is noisy above this coefficient of variation.")
@click.option("--noise-metrics", default=None, help="With --aggregate: comma list of the metrics judged for noise "
                                                    "(default: throughputs, mean and median latencies).")
def results(output_dir: str, formats: tuple[str, ...], aggregate: bool, confidence: float, noise_threshold: float,
            noise_metrics: str | None) -> None:
    """Write the merged results table (one row per run) and the aggregates per point (summary.*), and print
    where they are."""
    from raysweep.ledger import Ledger
    from raysweep.results import results_table, write_results

    Ledger.open_existing(output_dir).close()
    paths = write_results(output_dir, formats or ("parquet", "csv"))
    df = results_table(output_dir)
    out.print(f"{len(df)} row(s), {len(df.columns)} column(s)")
    for p in paths:
        out.print(str(p), highlight=False)
    if aggregate:
        from raysweep.cli.comparing import print_aggregates

        print_aggregates(output_dir, df, formats or ("parquet", "csv"), confidence, noise_threshold, noise_metrics)


@main.command()
@click.argument("output_dir", type=OUTPUT_DIR)
def sla(output_dir: str) -> None:
    """The SLA table: per server config x bench point x target, the largest load that meets the target."""
    import math

    from raysweep.files import write_text_atomic
    from raysweep.results import sla_table

    df = sla_table(output_dir)
    if df.empty:
        raise UserError(f"{output_dir}: no SLA search has finished here (does the campaign have `sla:`?)")
    table = Table("server config", "bench point", "target", "state", "largest pass", "smallest fail", "probes",
                  "at pass: req/s", "notes")

    def num(v: Any) -> str:
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:g}"

    for r in df.itertuples():
        table.add_row(escape(r.serve_label), escape(r.bench_label), escape(r.target), r.state, num(r.largest_pass),
                      num(r.smallest_fail), str(r.probes), num(getattr(r, "at_pass_request_throughput", None)),
                      escape(r.notes))
    out.print(table)
    path = write_text_atomic(Path(output_dir) / "sla.csv", df.to_csv(index=False))
    out.print(str(path), highlight=False)

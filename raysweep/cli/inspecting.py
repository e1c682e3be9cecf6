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
def results(output_dir: str, formats: tuple[str, ...]) -> None:
    """Write the merged results table (one row per run) and print where it is."""
    from raysweep.ledger import Ledger
    from raysweep.results import results_table, write_results

    Ledger.open_existing(output_dir).close()
    paths = write_results(output_dir, formats or ("parquet", "csv"))
    df = results_table(output_dir)
    out.print(f"{len(df)} row(s), {len(df.columns)} column(s)")
    for p in paths:
        out.print(str(p), highlight=False)


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

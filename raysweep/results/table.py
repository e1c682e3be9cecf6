"""The merged results table: one row per finished run, built with pandas from the ledger and result files
(`raysweep.results.records`, whose names this module keeps), and written out beside its summary per point.

Columns: every serve and bench parameter, `run_number`, every metric with vLLM's field names, the GPU
shape and placement (tensor/pipeline/data parallel sizes, gpu_count, node, GPU ids, server id) and
timings, the validity record of each run (`validity_ok`, `validity_issues`, see `raysweep.drive.validity`; worked
out here for result files written before it existed) and its server's provenance (`provenance_*`).
Per-request arrays stay in the result files; the table keeps the scalars.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from raysweep.record.files import write_bytes_atomic, write_text_atomic
from raysweep.results.records import (
    PER_REQUEST_KEYS,
    flagged,
    load_records,
    records_table,
    results_table,
    sla_table,
)

if TYPE_CHECKING:
    from raysweep.record.directory import CampaignDir

__all__ = ["FORMATS", "PER_REQUEST_KEYS", "flagged", "kept_summary", "kept_summary_at", "load_records", "records_table",
           "results_table", "sla_table", "write_results"]

log = logging.getLogger(__name__)

FORMATS = ("parquet", "csv", "json")


def write_results(directory: CampaignDir, formats: tuple[str, ...] = ("parquet", "csv"), *,
                  dest: str | Path | None = None, summary: bool = True,
                  table: pd.DataFrame | None = None) -> list[Path]:
    """Write the table as results.<format> in `dest` (default: the output directory; each file whole or not
    at all), and beside it, with `summary`, the aggregates per point as summary.parquet / summary.csv
    (`raysweep.results.aggregate`). `table`: the results table when the caller has it already."""
    dest = Path(dest) if dest is not None else directory.path
    df = table if table is not None else results_table(directory)
    written = []
    for fmt in formats:
        path = dest / f"results.{fmt}"
        if fmt == "csv":
            write_text_atomic(path, df.to_csv(index=False))
        elif fmt == "json":
            finite = df.astype(object).replace({math.inf: "inf", -math.inf: "-inf"})  # JSON has no infinity
            write_text_atomic(path, finite.to_json(orient="records", indent=2))
        elif fmt == "parquet":
            write_bytes_atomic(path, df.to_parquet(index=False) if not df.empty else _empty_parquet())
        else:
            raise ValueError(f"unknown format {fmt!r}; accepted: {', '.join(FORMATS)}")
        written.append(path)
    from raysweep.results.aggregate import SUMMARY_FORMATS, summary_table, write_summary  # the aggregates, beside them

    wanted = [f for f in formats if f in SUMMARY_FORMATS]
    if not summary or not wanted:
        return written
    try:
        write_summary(dest, wanted, summary=summary_table(directory, results=df))
    except Exception as exc:  # the results stand without their summary
        log.warning("summary.* not written: %s: %s", type(exc).__name__, exc, exc_info=True)
    return written


def kept_summary(directory: CampaignDir, confidence: float | None = 0.95,
                 threshold: float | None = None) -> pd.DataFrame | None:
    """summary.parquet as `run` (or `results --out`) left it, when it holds these settings (None: any) and was
    written after the last point of the campaign finished: the aggregates are computed once per point and kept,
    and readers (`compare`, `results --aggregate`) take them from there. None when it is missing or stale."""
    from raysweep.ledger import LEDGER_FILE

    path = directory.path / "summary.parquet"
    if not path.is_file() or not (directory.path / LEDGER_FILE).is_file():
        return None
    done, last = directory.ledger.finished()
    if not done or path.stat().st_mtime < last:
        return None
    try:
        summary = pd.read_parquet(path)
    except Exception as exc:  # noqa: BLE001 - a damaged file is computed again
        log.info("summary.parquet not read (%s): computed again", exc)
        return None
    attrs = summary.attrs
    if (confidence is not None and attrs.get("confidence") != confidence) or \
            (threshold is not None and attrs.get("threshold") != threshold):
        return None
    if "runs_total" in summary.columns and int(summary["runs_total"].sum()) != done:
        return None
    return summary


def kept_summary_at(directory: CampaignDir, confidence: float, threshold: float | None = None) -> pd.DataFrame | None:
    """The kept summary (`kept_summary`, whatever its settings) at `confidence` and `threshold` (None: its own),
    its intervals and noise columns made again from the statistics it keeps (`aggregate.at_level`), the
    precision record applied again: the numbers the summary made afresh at these settings holds, without the
    pooled percentiles' bootstrap intervals (only the raw samples give those at another level). None when no
    fresh summary is kept.

    :raises UserError: a confidence or threshold out of range.
    """
    from raysweep.results.aggregate import at_level
    from raysweep.results.precision import precision_columns

    kept = kept_summary(directory, None)
    if kept is None:
        return None
    if kept.attrs.get("confidence") == confidence and threshold in (None, kept.attrs.get("threshold")):
        return kept
    again = at_level(kept, confidence, threshold)
    return None if again is None else precision_columns(directory, again)


def _empty_parquet() -> bytes:
    return pd.DataFrame({"point_id": pd.Series([], dtype=str)}).to_parquet(index=False)

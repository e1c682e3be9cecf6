"""The records of an output dir as a table: one row per finished run, built with pandas from the ledger and
result files; the SLA searches' table. The records and the raw per-request samples as a run wrote them are
`raysweep.record.runs`.

Columns: every serve and bench parameter, `run_number`, every metric with vLLM's field names, the GPU
shape and placement (tensor/pipeline/data parallel sizes, gpu_count, node, GPU ids, server id) and
timings, the validity record of each run (`validity_ok`, `validity_issues`, see `raysweep.drive.validity`; worked
out here for result files written before it existed) and its server's provenance (`provenance_*`).
Per-request arrays stay in the result files; the table keeps the scalars. `raysweep.results.table` writes the
table and its summary out; the readers of any output dir (`raysweep.results.importer`,
`raysweep.results.aggregate`) build on this module, below it.
"""

from __future__ import annotations

import json
import logging
import math
import re
from typing import TYPE_CHECKING, Any

import pandas as pd

from raysweep.drive.validity import validity_fields
from raysweep.grid import combo_label
from raysweep.record.runs import read_records
from raysweep.serve import hardware

if TYPE_CHECKING:
    from raysweep.record.directory import CampaignDir

__all__ = ["PER_REQUEST_KEYS", "RESULTS_FILE", "flagged", "kept_results", "load_records", "records_table",
           "results_table", "sla_table"]

log = logging.getLogger(__name__)

PER_REQUEST_KEYS = frozenset({"latencies", "queue_times", "input_lens", "output_lens", "ttfts", "itls",
                              "start_times", "generated_texts", "errors", "server_queue_times", "server_ttfts"})
_FIRST = ["campaign", "serve_id", "bench_id", "point_id", "run_number", "serve_label", "bench_label"]


def load_records(directory: CampaignDir) -> list[dict[str, Any]]:
    """The records of every done point of the current plan, read from their result files
    (`raysweep.record.runs.read_records`), with their validity record (worked out here for result files written
    before it existed), `hardware` and `hardware_mixed` (`raysweep.serve.hardware.mark`)."""
    records = read_records(directory)
    for record in records:
        if "validity_ok" not in record:
            record.update(validity_fields(record))
    return hardware.mark(records)  # a configuration's runs on other hardware are flagged


def flagged(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records that fail a validity check."""
    return [r for r in records if r.get("validity_ok") is False]


def results_table(directory: CampaignDir) -> pd.DataFrame:
    """One row per finished run; per-request arrays dropped, nested values as JSON text."""
    return records_table(load_records(directory))


RESULTS_FILE = "results.parquet"


def kept_results(directory: CampaignDir) -> pd.DataFrame | None:
    """results.parquet as the campaign's end (or `results --out` into the dir) left it, when it was written after
    the last point finished and holds a row per done point: the table `results_table` would build again from
    every result file (reading 2,000 result files took 0.28 s of CPU, the kept table 0.06 s). None when it is
    missing, stale or unreadable."""
    path = directory.path / RESULTS_FILE
    if not path.is_file():
        return None
    done, last = directory.ledger.finished()
    if not done or path.stat().st_mtime < last:
        return None
    try:
        table = pd.read_parquet(path)
    except Exception as exc:  # noqa: BLE001 - a damaged file is built again
        log.info("%s not read (%s): the table is built from the result files", path, exc)
        return None
    return table if len(table) == done else None


def records_table(records: list[dict[str, Any]], sort_by: tuple[str, ...] = ("serve_id", "bench_id", "run_number"),
                  first: tuple[str, ...] = ()) -> pd.DataFrame:
    """Result records as a typed table: per-request arrays dropped, numbers as numbers (vLLM's "inf" too),
    nested values as JSON text, identifying columns first."""
    df = pd.DataFrame.from_records([{k: v for k, v in r.items() if k not in PER_REQUEST_KEYS} for r in records])
    if df.empty:
        return df
    for col in df.columns:
        df[col] = _clean_column(df[col])
    lead = [c for c in (*_FIRST, *first) if c in df.columns]
    df = df[lead + [c for c in df.columns if c not in lead]]
    return df.sort_values([c for c in sort_by if c in df.columns], ignore_index=True)


def _clean_column(col: pd.Series) -> pd.Series:
    """Make a column storable: numbers (incl. vLLM's "inf" rate) as floats, nested values as JSON text."""
    if col.dtype != object:
        return col
    values = [v for v in col if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if all(isinstance(v, bool) for v in values):
        return col
    if values and all(isinstance(v, (int, float)) and not isinstance(v, bool) or v in ("inf", "-inf") for v in values):
        return pd.to_numeric(col.replace({"inf": math.inf, "-inf": -math.inf}), errors="coerce")
    return col.map(lambda v: json.dumps(v) if isinstance(v, (dict, list)) else (None if v is None else str(v)))


def sla_table(directory: CampaignDir) -> pd.DataFrame:
    """One row per SLA search (server config x bench point x target): the largest passing value, the
    smallest failing one, the state, the number of probes and the pooled metrics at the passing value."""
    ledger = directory.ledger
    searches = ledger.searches()
    variable = (ledger.stored_campaign().get("sla") or {}).get("variable")
    labels: dict[str, str] = {}
    for p in ledger.points(in_plan_only=False):
        labels.setdefault(p.serve_id, combo_label(p.serve_params))
        base = {k: v for k, v in p.bench_params.items() if k != variable}
        labels.setdefault(p.probe_of or p.bench_id, combo_label(base))
    rows = []
    for r in searches:
        target, _, settings = r["target"].partition(" [")
        names = [re.match(r"[\w.]+", t.strip()).group(0) for t in target.split("&")]  # type: ignore[union-attr]
        unbounded = r["state"] == "above max" and r["largest_pass"] is None
        rows.append({"serve_id": r["serve_id"], "serve_label": labels.get(r["serve_id"], ""),
                     "bench_id": r["bench_id"], "bench_label": labels.get(r["bench_id"], ""), "target": target,
                     "search": settings.rstrip("]"), "state": r["state"],
                     "largest_pass": math.inf if unbounded else r["largest_pass"],
                     "smallest_fail": r["smallest_fail"], "probes": r["probes"], "notes": "; ".join(r["notes"]),
                     **{f"at_pass_{k}": r["metrics"].get(k) for k in dict.fromkeys([*names, *_SLA_METRICS])}})
    return pd.DataFrame.from_records(rows)


_SLA_METRICS = ("request_throughput", "output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms",
                "p99_e2el_ms")

"""The records a run wrote, as it wrote them: the result file of every done point of the current plan, and the
raw per-request samples of a native point beside it.

This is the reading below the results (`raysweep.results.records` builds the table on it, adding the validity
record and the hardware marks); the run stage writes the samples here, and the plan's estimates read the
wall times of the records.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from raysweep.ledger import PointState
from raysweep.record.files import write_bytes_atomic

if TYPE_CHECKING:
    from raysweep.record.directory import CampaignDir

__all__ = ["read_records", "read_samples", "write_samples"]

log = logging.getLogger(__name__)


def read_records(directory: CampaignDir) -> list[dict[str, Any]]:
    """The records of every done point of the current plan, read from their result files as they were written
    (a file that cannot be read is logged and left out)."""
    rows = [p for p in directory.ledger.points() if p.state == PointState.DONE]
    records = []
    for row in rows:
        path = directory.path / (row.result_path or "")
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            log.warning("point %s is done but its result file %s cannot be read: %s", row.point_id, path, exc)
    return records


def write_samples(path: str | Path, samples: dict[str, Any]) -> Path:
    """The raw per-request samples of a native point (times in s from the point's start; `chunks` holds each
    request's chunk arrival offsets from its send) as a parquet file, written whole or not at all."""
    cols = {k: v for k, v in samples.items() if k not in ("loop_lag", "start_late_s")}
    table = pa.table({k: pa.array(v, type=pa.list_(pa.float64()) if k == "chunks" else None)
                      for k, v in cols.items()})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return write_bytes_atomic(path, sink.getvalue().to_pybytes())


def read_samples(path: str | Path) -> dict[str, list[Any]]:
    """Samples written by `write_samples`, as columns of Python values (the form `bench.stats` pools)."""
    return pq.read_table(path).to_pydict()

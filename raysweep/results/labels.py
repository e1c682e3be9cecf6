"""How a value or a column reads in a label, a table or a sentence: a column with its unit, numbers as a label
shows them, values in their natural order, `k=v` lists. The figures (`raysweep.report.plots`), the conclusions and
the comparison all write them so.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from raysweep.bench.load import RATE

__all__ = ["axis_label", "fmt_value", "keyed_label", "natural_key", "sort_key"]

_UNITS = {"request_throughput": "req/s", RATE: "req/s", "request_goodput": "req/s",
          "output_throughput": "tok/s", "total_token_throughput": "tok/s", "max_output_tokens_per_s": "tok/s",
          "output_throughput_per_gpu": "tok/s", "duration": "s", "server_kv_cache_usage_perc_peak": "1 = full",
          "server_kv_cache_usage_perc_mean": "1 = full"}


def axis_label(column: str) -> str:
    """A column name with its unit, e.g. `median_ttft_ms (ms)`; the name stays so users can filter by it."""
    unit = _UNITS.get(column) or ("ms" if column.endswith("_ms") else None)
    return f"{column} ({unit})" if unit else column


def fmt_value(value: object) -> str:
    """A value as a label shows it: whole floats as integers, missing values as `none`."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "none"
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return f"{float(value):g}"
    return str(value)


_NUMBERS = re.compile(r"(\d+(?:\.\d+)?)")


def natural_key(text: str) -> tuple[tuple[int, float, str], ...]:
    """A label's order with its numbers read as numbers: `max_num_seqs=8` before `max_num_seqs=16`."""
    return tuple((0, float(part), "") if i % 2 else (1, 0.0, part) for i, part in enumerate(_NUMBERS.split(text)))


SortKey = tuple[int, float, tuple[tuple[int, float, str], ...]]


def sort_key(value: object) -> SortKey:
    """Numbers in numeric order, then text (the numbers in it read as numbers: `max_num_seqs=8` before
    `max_num_seqs=16`), then missing values."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return (2, 0.0, ())
    if isinstance(value, (int, float, np.number)) and not isinstance(value, (bool, np.bool_)):
        return (0, float(value), ())
    return (1, 0.0, natural_key(str(value)))


def keyed_label(keys: Sequence[str], values: Sequence[Any]) -> str:
    """`k=v, k2=v2`; a label column alone (`serve_label`, itself `k=v-...`) shows its value only."""
    if len(keys) == 1 and keys[0].endswith("_label"):
        return fmt_value(values[0])
    return ", ".join(f"{k}={fmt_value(v)}" for k, v in zip(keys, values, strict=True))

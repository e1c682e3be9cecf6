"""Plain JSON values of what raysweep reads and computes (`--json`, the Python API's status): numpy and pandas
scalars as Python ones, NaN and missing as null, infinities as "inf" / "-inf" (an unbounded SLA capacity,
vLLM's infinite request rate), as results.json writes them."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

__all__ = ["jsonable"]


def jsonable(value: object) -> Any:
    """Plain JSON values: numpy and pandas scalars as Python ones, NaN and missing as null, infinities as
    "inf" / "-inf", paths as text, containers recursively."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # numpy scalar
        try:
            value = value.item()
        except (TypeError, ValueError):
            return str(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return None
        return value if math.isfinite(value) else ("inf" if value > 0 else "-inf")
    try:
        import pandas as pd

        if pd.isna(value):
            return None
    except (TypeError, ValueError, ImportError):
        pass
    return str(value)

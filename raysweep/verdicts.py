"""Intervals and verdicts over runs, on `scipy.stats`.

Every comparison raysweep prints rests on a test of the quantity itself. This module holds the shared
building blocks: the t-interval of a mean over per-run values (used by the per-point aggregates and by
`bench.precision`'s stopping rule).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

__all__ = ["mean_interval", "relative_half_width"]


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the Student t-interval of the mean of `values` (NaNs dropped).

    With fewer than 2 finite values the interval is (nan, nan) around the mean (nan for none)."""
    x = np.asarray([v for v in values if v is not None], dtype=float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return math.nan, math.nan, math.nan
    mean = float(x.mean())
    if x.size < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf(0.5 + confidence / 2.0, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return mean, mean - half, mean + half


def relative_half_width(values: Sequence[float], confidence: float = 0.95) -> float:
    """The t-interval's half-width over |mean|; nan with fewer than 2 values or a zero mean."""
    mean, low, high = mean_interval(values, confidence)
    if not (math.isfinite(low) and mean):
        return math.nan
    return (high - low) / 2.0 / abs(mean)

"""The percentiles of the pooled bootstrap read by a compiled loop (numba), where numba is installed.

`raysweep.maths.bootstrap.stacked_percentiles` reads each resample's percentiles with a few numpy calls over
all resamples at once; at thousands of points those calls are bound by memory (temporaries of resamples x
values). This loop reads the same numbers row by row: the running count of a row over a set's sorted values
(each value's owner's count), the first value whose running count passes each wanted rank (a binary search),
and numpy's linear interpolation between the two ranks around the percentile, with the same float operations
in the same order, so that its results equal the numpy reading's to the bit (`tests/test_bootstrap.py`).

numba comes with vLLM; this module imports it, so import this module only where numba may be missing inside
`try` (`raysweep.maths.bootstrap` does, and reads with numpy where the import fails). Compiled once per machine
(numba's cache beside this module, or its user-wide one where this module's folder is read-only).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numba
import numpy as np

__all__ = ["walk_percentiles"]


def walk_percentiles(sorted_values: Sequence[np.ndarray], owners: Sequence[np.ndarray], counts: np.ndarray,
                     qs: Sequence[float]) -> np.ndarray:
    """`raysweep.maths.bootstrap.stacked_percentiles` by the compiled loop: rows x sets x len(qs), NaN where a
    row draws nothing of a set."""
    rows, sets = counts.shape[0], len(sorted_values)
    out = np.full((rows, sets, len(qs)), math.nan)
    if rows == 0 or sets == 0 or not qs:
        return out
    sizes = np.array([v.size for v in sorted_values], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    values = np.concatenate([np.asarray(v, dtype=float) for v in sorted_values]) if sizes.sum() else np.zeros(0)
    own = (np.concatenate([np.asarray(o, dtype=np.int64) for o in owners]) if sizes.sum()
           else np.zeros(0, dtype=np.int64))
    fractions = np.asarray(qs, dtype=float) / 100.0
    _walk(values, own, starts, np.ascontiguousarray(counts, dtype=np.int64), fractions, out)
    return out


@numba.njit(cache=True, nogil=True)
def _first_past(cum: np.ndarray, n: int, rank: float) -> int:
    """The first index whose running count exceeds `rank` (numpy's searchsorted, side right), at most n - 1."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        if cum[mid] <= rank:
            lo = mid + 1
        else:
            hi = mid
    return min(lo, n - 1)


@numba.njit(cache=True, nogil=True)
def _walk(values: np.ndarray, owners: np.ndarray, starts: np.ndarray, counts: np.ndarray, fractions: np.ndarray,
          out: np.ndarray) -> None:
    """Into `out[r, s, k]`: percentile `fractions[k]` of set s (`values[starts[s]:starts[s + 1]]`, sorted, each
    owned by `owners`) each repeated its owner's count in row r of `counts`; left as it is where r draws none."""
    rows = counts.shape[0]
    sets = starts.size - 1
    longest = 0
    for s in range(sets):
        longest = max(longest, starts[s + 1] - starts[s])
    cum = np.empty(max(longest, 1), dtype=np.int64)
    for s in range(sets):
        first = starts[s]
        n = starts[s + 1] - first
        if n == 0:
            continue
        for r in range(rows):
            total = 0
            for j in range(n):
                total += counts[r, owners[first + j]]
                cum[j] = total
            if total <= 0:
                continue
            last = float(total) - 1.0
            for k in range(fractions.size):
                h = last * fractions[k]
                lo = math.floor(h)
                hi = min(lo + 1.0, last)
                a = values[first + _first_past(cum, n, lo)]
                b = values[first + _first_past(cum, n, hi)]
                out[r, s, k] = a + (h - lo) * (b - a)

"""The two-level bootstrap of pooled percentiles, every resample of a point at once.

A point's runs share nothing but their configuration; the requests of one run share its server's state. So a
resample draws the runs with replacement, then within each drawn run its requests with replacement, and pools
them; a percentile of the pool is one draw of the statistic. Drawing run j `m` times and `n_j` requests within
each copy is `m * n_j` draws among its requests, so a resample is a row of how often each request was drawn
(`two_level_counts`: a block of resamples in a few calls of the generator, no loop per resample). A request's
value (its TTFT, TPOT or E2EL), or each of its ITL gaps, repeated its count of times is the resampled pool;
`weighted_percentiles` reads the pool's percentiles from the values sorted once (numpy's linear method on the
repeated values, without building them): each row's weight per block of consecutive sorted values by one
sparse matrix product, then the wanted rank among the values of the block that holds it.

For given counts the percentiles equal `numpy.percentile` of the repeated values, and the counts follow the
distribution of drawing runs and requests one resample at a time (`tests/test_bootstrap.py` checks both).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse

__all__ = ["Pooled", "intervals", "two_level_counts", "weighted_percentiles"]

_BLOCK_CELLS = 2_000_000  # resamples x requests generated at once, at most


@dataclass
class Pooled:
    """The values of one latency metric over a point's runs: `values[j]` of run j, each owned by request
    `owners[j][i]` of that run's `sizes[j]` requests (one value per request, or an ITL gap per gap); `qs` the
    percentiles wanted; `resamples` how many."""
    values: list[np.ndarray]
    owners: list[np.ndarray]
    sizes: list[int]
    qs: list[float]
    resamples: int
    draws: list[np.ndarray] = field(default_factory=list)

    def prepared(self) -> tuple[np.ndarray, np.ndarray]:
        """The values of all runs sorted, with their owners numbered in one sequence over the runs."""
        first = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)
        flat = np.concatenate([np.asarray(v, dtype=float) for v in self.values])
        own = np.concatenate([np.asarray(o, dtype=np.int64) + f for o, f in zip(self.owners, first)])
        order = np.argsort(flat, kind="stable")
        return flat[order], own[order]


def two_level_counts(sizes: Sequence[int], resamples: int, rng: np.random.Generator) -> np.ndarray:
    """`resamples` x sum(sizes) draw counts: per row the runs (of `sizes[j]` requests each, numbered in one
    sequence) drawn with replacement, then each drawn run's requests drawn with replacement, as many as it has."""
    k, total = len(sizes), int(sum(sizes))
    if k == 0 or total == 0 or resamples < 1:
        return np.zeros((max(resamples, 0), total), dtype=np.int64)
    picks = rng.integers(0, k, (resamples, k))
    times = np.bincount((np.arange(resamples)[:, None] * k + picks).ravel(), minlength=resamples * k)
    times = times.reshape(resamples, k)  # copies of each run drawn in each resample
    cells, first = [], 0
    for j, n in enumerate(sizes):
        if n:
            rows = np.repeat(np.arange(resamples, dtype=np.int64), times[:, j] * n)
            cells.append(rows * total + first + rng.integers(0, n, rows.size))
        first += n
    return np.bincount(np.concatenate(cells), minlength=resamples * total).reshape(resamples, total)


def weighted_percentiles(sorted_values: np.ndarray, owner: np.ndarray, counts: np.ndarray,
                         qs: Sequence[float]) -> np.ndarray:
    """Per row of `counts` (rows x owners), the `qs` percentiles (numpy's linear method) of `sorted_values`
    each repeated as often as its owner's count in the row: rows x len(qs); NaN where a row draws nothing."""
    values = np.asarray(sorted_values, dtype=float)
    owner = np.asarray(owner, dtype=np.int64)
    rows, owners = counts.shape
    out = np.full((rows, len(qs)), math.nan)
    g = values.size
    if g == 0 or rows == 0:
        return out
    blocks = max(1, min(g, math.isqrt(16 * g)))  # about 4 sqrt(g) blocks of sqrt(g) / 4 values
    size = -(-g // blocks)
    blocks = -(-g // size)
    pad = blocks * size - g
    # each row's weight per block of `size` consecutive sorted values: counts x (owners x blocks)
    member = scipy.sparse.csr_matrix((np.ones(g), (owner, np.arange(g) // size)), shape=(owners, blocks))
    cum = np.cumsum(np.asarray(counts.astype(float) @ member), axis=1)
    count = cum[:, -1]
    live = count > 0
    if not live.any():
        return out
    last = np.maximum(count, 1.0) - 1.0
    h = last[:, None] * (np.asarray(qs, dtype=float) / 100.0)[None, :]
    lo = np.floor(h)
    ranks = np.concatenate([lo, np.minimum(lo + 1.0, last[:, None])], axis=1)
    block_owner = np.concatenate([owner, np.full(pad, owners)]).reshape(blocks, size)  # `owners`: padding
    block_value = np.concatenate([values, np.full(pad, values[-1])]).reshape(blocks, size)
    found = _kth(ranks, cum, np.concatenate([counts, np.zeros((rows, 1), dtype=counts.dtype)], axis=1),
                 block_owner, block_value)
    a, b = found[:, : len(qs)], found[:, len(qs):]
    out[live] = (a + (h - lo) * (b - a))[live]
    return out


def _kth(ranks: np.ndarray, cum: np.ndarray, padded: np.ndarray, block_owner: np.ndarray,
         block_value: np.ndarray) -> np.ndarray:
    """The value of 0-based rank `ranks[r, j]` in row r's repeated values (rows x ranks): the block whose
    running weight passes the rank (one search over all rows laid end to end), then the value within it."""
    rows, blocks = cum.shape
    size = block_owner.shape[1]
    span = float(cum[:, -1].max()) + 1.0
    offset = span * np.arange(rows)[:, None]
    block = np.searchsorted((cum + offset).ravel(), ranks + offset, side="right") - blocks * np.arange(rows)[:, None]
    block = np.clip(block, 0, blocks - 1)
    before = np.where(block > 0, cum.ravel()[np.maximum(block - 1, 0) + blocks * np.arange(rows)[:, None]], 0.0)
    width = padded.shape[1]
    weight = padded.ravel()[(np.arange(rows) * width)[:, None, None] + block_owner[block]]  # rows x ranks x size
    pos = (np.cumsum(weight, axis=2) <= (ranks - before)[:, :, None]).sum(axis=2)
    return block_value.ravel()[block * size + np.minimum(pos, size - 1)]


def intervals(metrics: Sequence[Pooled], confidence: float,
              rng: np.random.Generator) -> list[list[tuple[float, float]]]:
    """Per metric, per percentile in its `qs`, the two-level bootstrap interval (`confidence`, percentile
    method; NaN with fewer than two runs). Metrics over the same requests (the same `sizes`) share their
    resamples, drawn a block at a time."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, m in enumerate(metrics):
        if len(m.sizes) > 1 and sum(m.sizes) > 0:
            groups.setdefault(tuple(m.sizes), []).append(i)
    for sizes, members in groups.items():
        prepared = {i: metrics[i].prepared() for i in members}
        most = max(metrics[i].resamples for i in members)
        step = max(1, _BLOCK_CELLS // max(1, sum(sizes)))
        for start in range(0, most, step):
            counts = two_level_counts(sizes, min(step, most - start), rng)
            for i in members:
                m = metrics[i]
                if m.resamples > start:
                    m.draws.append(weighted_percentiles(*prepared[i], counts[: m.resamples - start], m.qs))
    out = []
    for m in metrics:
        draws = np.concatenate(m.draws) if m.draws else np.zeros((0, len(m.qs)))
        draws = draws[np.isfinite(draws).all(axis=1)]
        if not len(draws):
            out.append([(math.nan, math.nan)] * len(m.qs))
            continue
        ends = np.percentile(draws, [50.0 - 50.0 * confidence, 50.0 + 50.0 * confidence], axis=0)
        out.append([(float(ends[0, j]), float(ends[1, j])) for j in range(len(m.qs))])
    return out

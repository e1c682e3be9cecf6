"""The two-level bootstrap of pooled percentiles, every resample of a point at once.

A point's runs share nothing but their configuration; the requests of one run share its server's state. So a
resample draws the runs with replacement, then within each drawn run its requests with replacement, and pools
them; a percentile of the pool is one draw of the statistic. Drawing run j `m` times and `n_j` requests within
each copy is `m * n_j` draws among its requests, so a resample is a row of how often each request was drawn
(`two_level_counts`: a block of resamples in a few calls of the generator, no loop per resample). A request's
value (its TTFT, TPOT or E2EL), or each of its ITL gaps, repeated its count of times is the resampled pool;
`weighted_percentiles` reads the pool's percentiles from the values sorted once (numpy's linear method on the
repeated values, without building them): for a value per request, the running count of every row over them
searched once; for the many ITL gaps, each row's weight per block of consecutive sorted values by one
sparse matrix product, then the wanted rank among the values of the block that holds it.

For given counts the percentiles equal `numpy.percentile` of the repeated values, and the counts follow the
distribution of drawing runs and requests one resample at a time (`tests/test_bootstrap.py` checks both).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse

log = logging.getLogger(__name__)

__all__ = ["Pooled", "intervals", "stacked_percentiles", "two_level_counts", "weighted_percentiles"]

_BLOCK_CELLS = 2_000_000  # resamples x requests generated at once, at most
_BATCH_CELLS = 300_000  # resamples x sets x blocks read at once, about: small enough to stay in the CPU's cache
_ENDS_AT_ONCE = 256  # metrics whose interval ends are read from their draws in one call
_DIRECT_MAX = 256  # a set of at most this many values is read directly (`_direct`), a longer one by blocks
# resamples x values over all metrics from which the compiled loop reads the percentiles, where numba is
# installed (`raysweep.maths.bootstrap_walk`: the same numbers; below this, numba's import and cache load,
# about 0.3 s, cost more than the numpy reading saves: about 90 points of 2 runs of 32 requests)
_WALK_CELLS = 100_000_000


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
    return stacked_percentiles([np.asarray(sorted_values, dtype=float)], [np.asarray(owner, dtype=np.int64)],
                               counts, qs)[:, 0, :]


def stacked_percentiles(sorted_values: Sequence[np.ndarray], owners: Sequence[np.ndarray], counts: np.ndarray,
                        qs: Sequence[float], walk: bool = False) -> np.ndarray:
    """`weighted_percentiles` of several sets of sorted values (one per metric of a point) drawn with the
    same counts: rows x sets x len(qs).

    A short set (`_DIRECT_MAX` values at most: a value per request) is read directly: each row's running
    count over its sorted values, searched for the wanted ranks. A longer one (ITL gaps) is cut into blocks
    of a few consecutive sorted values; one sparse product gives every row's weight per block of every such
    set, the block holding a wanted rank is found from their running sum, and the rank among that block's
    values alone. Both give the same numbers (`tests/test_bootstrap.py`). `walk`: by the compiled loop
    (`raysweep.maths.bootstrap_walk`, where numba is installed; the same numbers again)."""
    walker = _walker() if walk else None
    if walker is not None:
        return walker(sorted_values, owners, counts, qs)
    rows = counts.shape[0]
    out = np.full((rows, len(sorted_values), len(qs)), math.nan)
    short = [i for i, v in enumerate(sorted_values) if v.size <= _DIRECT_MAX]
    long = [i for i, v in enumerate(sorted_values) if v.size > _DIRECT_MAX]
    for i in short:
        out[:, i, :] = _direct(sorted_values[i], owners[i], counts, qs)
    if long:
        out[:, long, :] = _blocked([sorted_values[i] for i in long], [owners[i] for i in long], counts, qs)
    return out


@functools.cache
def _walker() -> Callable[..., np.ndarray] | None:
    """`raysweep.maths.bootstrap_walk.walk_percentiles`, None where numba is missing or does not load."""
    try:
        from raysweep.maths.bootstrap_walk import walk_percentiles
    except Exception as exc:  # noqa: BLE001 - numba missing, or failing to load: numpy reads the same numbers
        log.info("percentiles of the bootstrap read with numpy (numba: %s)", exc)
        return None
    return walk_percentiles


def _direct(sorted_values: np.ndarray, owner: np.ndarray, counts: np.ndarray, qs: Sequence[float]) -> np.ndarray:
    """`weighted_percentiles` of a short set, rows x len(qs): the running count over the sorted values (their
    owners' counts) of all rows laid end to end, and every row's wanted ranks found in it by one search."""
    rows = counts.shape[0]
    out = np.full((rows, len(qs)), math.nan)
    size = sorted_values.size
    if size == 0 or rows == 0:
        return out
    flat = np.cumsum(counts[:, owner], dtype=np.int64)  # the running count over all rows laid end to end
    ends = flat[size - 1::size]
    before = np.concatenate([[0], ends[:-1]])  # what the rows above drew
    count = ends - before
    live = count > 0
    last = np.maximum(count, 1).astype(float) - 1.0
    h = last[:, None] * (np.asarray(qs, dtype=float) / 100.0)
    lo = np.floor(h)
    ranks = np.concatenate([lo, np.minimum(lo + 1.0, last[:, None])], axis=1).astype(np.int64)
    pos = np.searchsorted(flat, (ranks + before[:, None]).ravel(), side="right").reshape(rows, -1)
    found = sorted_values[np.minimum(pos - size * np.arange(rows)[:, None], size - 1)]
    a, b = found[:, : len(qs)], found[:, len(qs):]
    out[live] = (a + (h - lo) * (b - a))[live]
    return out


def _blocked(sorted_values: Sequence[np.ndarray], owners: Sequence[np.ndarray], counts: np.ndarray,
             qs: Sequence[float]) -> np.ndarray:
    """`stacked_percentiles` of long sets by blocks of consecutive sorted values (see there)."""
    rows, n_owners = counts.shape
    sets = len(sorted_values)
    out = np.full((rows, sets, len(qs)), math.nan)
    longest = max((v.size for v in sorted_values), default=0)
    if longest == 0 or rows == 0:
        return out
    blocks = max(1, min(longest, math.isqrt(16 * longest)))  # about 4 sqrt(g) blocks of sqrt(g) / 4 values
    size = -(-longest // blocks)
    blocks = -(-longest // size)
    cells = blocks * size
    block_owner = np.full((sets, cells), n_owners, dtype=np.int64)  # `n_owners`: padding, never drawn
    block_value = np.zeros((sets, cells))
    for i, (v, o) in enumerate(zip(sorted_values, owners)):
        block_owner[i, : v.size], block_value[i, : v.size] = o, v
        block_value[i, v.size:] = v[-1] if v.size else 0.0
    real = block_owner < n_owners
    set_of, cell = np.nonzero(real)
    member = scipy.sparse.csr_matrix((np.ones(set_of.size), (block_owner[real], set_of * blocks + cell // size)),
                                     shape=(n_owners, sets * blocks))
    cum = np.cumsum(np.asarray(counts.astype(float) @ member).reshape(rows, sets, blocks), axis=2)
    count = cum[:, :, -1]
    live = count > 0
    if not live.any():
        return out
    last = np.maximum(count, 1.0) - 1.0
    h = last[:, :, None] * (np.asarray(qs, dtype=float) / 100.0)
    lo = np.floor(h)
    ranks = np.concatenate([lo, np.minimum(lo + 1.0, last[:, :, None])], axis=2)
    padded = np.concatenate([counts, np.zeros((rows, 1), dtype=counts.dtype)], axis=1)
    found = _kth(ranks.reshape(rows * sets, -1), cum.reshape(rows * sets, blocks), padded, sets,
                 block_owner.reshape(sets, blocks, size), block_value.reshape(sets, blocks, size))
    found = found.reshape(rows, sets, -1)
    a, b = found[:, :, : len(qs)], found[:, :, len(qs):]
    out[live] = (a + (h - lo) * (b - a))[live]
    return out


def _kth(ranks: np.ndarray, cum: np.ndarray, padded: np.ndarray, sets: int, block_owner: np.ndarray,
         block_value: np.ndarray) -> np.ndarray:
    """The value of 0-based rank `ranks[i, j]` in line i's repeated values, line i being row i // sets of
    `padded` (its counts) and set i % sets: the block whose running weight passes the rank (one search over
    all lines laid end to end), then the value within it."""
    lines, blocks = cum.shape
    size = block_owner.shape[2]
    line = np.arange(lines)[:, None]
    span = float(cum[:, -1].max()) + 1.0
    block = np.searchsorted((cum + span * line).ravel(), ranks + span * line, side="right") - blocks * line
    block = np.clip(block, 0, blocks - 1)
    before = np.where(block > 0, cum.ravel()[np.maximum(block - 1, 0) + blocks * line], 0.0)
    which = (line % sets) * blocks + block  # the block among all sets' blocks
    owners = block_owner.reshape(sets * blocks, size)[which]  # lines x ranks x size
    weight = padded.ravel()[((line // sets) * padded.shape[1])[:, :, None] + owners]
    pos = (np.cumsum(weight, axis=2) <= (ranks - before)[:, :, None]).sum(axis=2)
    return block_value.ravel()[which * size + np.minimum(pos, size - 1)]


def intervals(metrics: Sequence[Pooled], confidence: float, seed: int = 0) -> list[list[tuple[float, float]]]:
    """Per metric, per percentile in its `qs`, the two-level bootstrap interval (`confidence`, percentile
    method; NaN with fewer than two runs).

    The resamples depend only on the runs' sizes and the seed: metrics over the same requests (the same
    `sizes`), of one point or of many, are read from the same draw counts, made once (a block of resamples at
    a time, each from a generator seeded `seed` afresh per set of sizes). So a point's interval is the same
    whatever other points are summarized with it, and the points of a campaign, whose runs mostly hold as
    many requests, are done together: one sparse product and one search for a batch of them."""
    groups: dict[tuple[int, ...], list[int]] = {}
    walk = sum(m.resamples * sum(len(v) for v in m.values) for m in metrics) >= _WALK_CELLS
    for i, m in enumerate(metrics):
        if len(m.sizes) > 1 and sum(m.sizes) > 0:
            groups.setdefault(tuple(m.sizes), []).append(i)
    for sizes, members in groups.items():
        rng = np.random.default_rng(seed)
        most = max(metrics[i].resamples for i in members)
        step = max(1, _BLOCK_CELLS // max(1, sum(sizes)))
        for start in range(0, most, step):
            counts = two_level_counts(sizes, min(step, most - start), rng)
            _draw_batches([i for i in members if metrics[i].resamples > start], metrics, counts, start, walk)
    out: list[list[tuple[float, float]]] = [[(math.nan, math.nan)] * len(m.qs) for m in metrics]
    for start in range(0, len(metrics), _ENDS_AT_ONCE):  # a few metrics' draws at a time, not all of them
        alike: dict[tuple[int, ...], list[tuple[int, np.ndarray]]] = {}  # the metrics' draws by their shape
        for i in range(start, min(start + _ENDS_AT_ONCE, len(metrics))):
            m = metrics[i]
            draws = np.concatenate(m.draws) if m.draws else np.zeros((0, len(m.qs)))
            draws = draws[np.isfinite(draws).all(axis=1)]
            if len(draws):
                alike.setdefault(draws.shape, []).append((i, draws))
        for part in alike.values():  # the ends of draws of one shape in one call: the same numbers as one by one
            ends = np.percentile(np.stack([d for _, d in part]), [50.0 - 50.0 * confidence,
                                                                  50.0 + 50.0 * confidence], axis=1).tolist()
            for k, (i, _) in enumerate(part):
                out[i] = list(zip(ends[0][k], ends[1][k]))
    return out


def _draw_batches(members: list[int], metrics: Sequence[Pooled], counts: np.ndarray, start: int,
                  walk: bool = False) -> None:
    """Append to each member metric its percentiles of these counts' resamples (those within its number),
    members with the same percentiles and resamples a batch at a time."""
    same: dict[tuple[tuple[float, ...], int], list[int]] = {}
    for i in members:
        same.setdefault((tuple(metrics[i].qs), min(len(counts), metrics[i].resamples - start)), []).append(i)
    for (qs, rows), batch in same.items():
        length = {i: sum(len(v) for v in metrics[i].values) for i in batch}
        batch.sort(key=length.__getitem__)
        while batch:  # sets of like lengths together (each is padded to the longest of its batch)
            per = max(1, _BATCH_CELLS // max(1, rows * math.isqrt(16 * max(1, length[batch[0]]))))
            part = [i for i in batch[:per] if length[i] <= 1.5 * length[batch[0]] + 8]
            batch = batch[len(part):]
            prepared = [metrics[i].prepared() for i in part]
            got = stacked_percentiles([v for v, _ in prepared], [o for _, o in prepared], counts[:rows], list(qs),
                                      walk)
            for k, i in enumerate(part):
                metrics[i].draws.append(got[:, k, :])



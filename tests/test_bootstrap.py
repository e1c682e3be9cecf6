"""The two-level bootstrap of pooled percentiles (`raysweep.maths.bootstrap`) against the implementation it
replaced, which drew one resample at a time in Python (kept below as the reference, unchanged but for its
names).

Exact where exactness is expected: for given draw counts the percentiles are numpy's on the repeated values.
In distribution elsewhere (the two draw the generator's numbers in a different order, so the same seed gives
other resamples): the resampled percentiles of both, many thousands each, are one distribution by the
two-sample Kolmogorov-Smirnov test, and the same test tells apart a bootstrap that ignores the runs (so the
check can fail). No Ray, no vLLM.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from scipy import stats

from raysweep.maths import bootstrap
from raysweep.results import aggregate

_MAX_BOOTSTRAP_VALUES = 5_000_000
_MIN_RESAMPLES = 100


# ---------------------------------------------------------------------------------------------------
# The reference: the summary's bootstrap before it drew every resample at once
# ---------------------------------------------------------------------------------------------------

def ref_two_level(parts: list[Any], qs: list[float], resamples: int, rng: np.random.Generator,
               itl: bool) -> np.ndarray:
    """`resamples` rows of the `qs` percentiles: each row draws the runs with replacement, then the
    requests within each drawn run (`_itl_draws` / `_draws` with one resample)."""
    if itl:
        gaps = sum(sum(len(g) for g in p) for p in parts)
        resamples = min(resamples, max(_MIN_RESAMPLES, _MAX_BOOTSTRAP_VALUES // max(1, gaps)))
    rows = []
    for _ in range(resamples):
        drawn = [parts[i] for i in rng.integers(0, len(parts), len(parts))]
        one = ref_itl_draws(drawn, qs, 1, rng) if itl else ref_draws(drawn, qs, 1, rng)
        if len(one):
            rows.append(one[0])
    return np.asarray(rows).reshape(-1, len(qs))


def ref_draws(parts: list[np.ndarray], qs: list[float], resamples: int, rng: np.random.Generator) -> np.ndarray:
    """The `qs` percentiles (columns) of `resamples` resamples (rows) of the pooled values, each run
    resampled within itself."""
    out = np.empty((resamples, len(qs)))
    block = max(1, 2_000_000 // max(1, sum(len(p) for p in parts)))
    for start in range(0, resamples, block):
        b = min(block, resamples - start)
        drawn = np.concatenate([p[rng.integers(0, len(p), (b, len(p)))] for p in parts if len(p)], axis=1)
        out[start:start + b] = np.percentile(drawn, qs, axis=1).T
    return out


def ref_itl_draws(parts: list[list[np.ndarray]], qs: list[float], resamples: int,
                  rng: np.random.Generator) -> np.ndarray:
    """As `_draws` for ITL: whole requests (with all their gaps) resampled within each run; fewer resamples
    (never under `_MIN_RESAMPLES`) when the gaps are many. A resample repeats each gap as often as its
    request was drawn, so its percentiles are read from the gaps sorted once, weighted by those counts
    (numpy's linear interpolation on the repeated values, without building them)."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return np.zeros((0, len(qs)))
    gaps = np.concatenate([np.concatenate(p) if p else np.zeros(0) for p in parts])
    sizes = [len(p) for p in parts]
    first = np.cumsum([0, *sizes[:-1]])  # the requests of all runs, numbered in one sequence
    owner = np.concatenate([f + np.repeat(np.arange(len(p)), [len(g) for g in p]) for f, p in zip(first, parts)])
    order = np.argsort(gaps, kind="stable")
    gaps, owner = gaps[order], owner[order]
    total = max(1, gaps.size)
    resamples = min(resamples, max(_MIN_RESAMPLES, _MAX_BOOTSTRAP_VALUES // total))
    out = np.full((resamples, len(qs)), math.nan)
    block = max(1, 4_000_000 // total)
    for start in range(0, resamples, block):
        b = min(block, resamples - start)
        counts = np.concatenate([np.stack([np.bincount(rng.integers(0, n, n), minlength=n) for _ in range(b)])
                                 if n else np.zeros((b, 0), dtype=int) for n in sizes], axis=1)
        out[start:start + b] = ref_weighted_percentiles(gaps, counts[:, owner], qs)
    return out[np.isfinite(out).all(axis=1)]


def ref_weighted_percentiles(sorted_values: np.ndarray, weights: np.ndarray, qs: list[float]) -> np.ndarray:
    """Per row of `weights`, the `qs` percentiles (numpy's linear method) of `sorted_values` each repeated
    its weight's number of times: rows x len(qs)."""
    rows, n = weights.shape
    cum = np.cumsum(weights, axis=1)
    count = cum[:, -1]
    out = np.full((rows, len(qs)), math.nan)
    live = count > 0
    if not live.any():
        return out
    span = int(count.max()) + 1  # rows laid end to end: one search finds the k-th value of every row
    flat = (cum + span * np.arange(rows)[:, None]).ravel()

    def kth(k: np.ndarray) -> np.ndarray:
        pos = np.searchsorted(flat, k + span * np.arange(rows), side="right") - n * np.arange(rows)
        return sorted_values[np.clip(pos, 0, n - 1)]

    for j, q in enumerate(qs):
        h = (count - 1) * q / 100.0
        lo = np.floor(h)
        a, b = kth(lo.astype(np.int64)), kth(np.minimum(lo + 1, count - 1).astype(np.int64))
        out[live, j] = (a + (h - lo) * (b - a))[live]
    return out




# ---------------------------------------------------------------------------------------------------
# Exact: the percentiles of given draw counts
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(5))
def test_weighted_percentiles_are_numpys_on_the_repeated_values(seed):
    """Values with ties, owners with no value, rows that draw nothing: each row's percentiles are
    np.percentile (linear) of the values repeated by their owner's count; NaN for a row that draws none."""
    rng = np.random.default_rng(seed)
    owners = int(rng.integers(1, 40))
    per = rng.integers(0, 5, owners)
    values = np.sort(np.round(rng.normal(10, 3, int(per.sum())), 1))  # rounded: ties
    owner = rng.permutation(np.repeat(np.arange(owners), per))
    counts = rng.integers(0, 4, (60, owners))
    counts[::7] = 0
    qs = [0, 1, 25, 50, 90, 99, 99.9, 100]
    got = bootstrap.weighted_percentiles(values, owner, counts, qs)
    for row, c in zip(got, counts):
        repeated = np.repeat(values, c[owner])
        if repeated.size == 0:
            assert np.isnan(row).all()
        else:
            np.testing.assert_allclose(row, np.percentile(repeated, qs), rtol=1e-12, atol=1e-12)


def test_the_old_percentiles_of_given_counts_are_the_new_ones():
    """The same counts give the same percentiles through both implementations."""
    rng = np.random.default_rng(3)
    values = np.sort(rng.random(300))
    owner = rng.integers(0, 50, 300)
    counts = rng.integers(0, 3, (40, 50))
    qs = [50.0, 90.0, 99.0]
    np.testing.assert_allclose(bootstrap.weighted_percentiles(values, owner, counts, qs),
                               ref_weighted_percentiles(values, counts[:, owner], qs), rtol=1e-12)


def test_sets_stacked_on_the_same_counts_are_each_alone():
    """Several sets of values of different lengths (a batch of points' metrics) drawn with one count matrix:
    each set's percentiles are exactly those it gets alone."""
    rng = np.random.default_rng(9)
    counts = rng.integers(0, 4, (30, 25))
    sets = []
    for g in (1, 7, 40, 300):
        owner = rng.integers(0, 25, g)
        sets.append((np.sort(rng.gamma(2.0, 3.0, g)), owner))
    qs = [10.0, 50.0, 99.0]
    stacked = bootstrap.stacked_percentiles([v for v, _ in sets], [o for _, o in sets], counts, qs)
    for k, (v, o) in enumerate(sets):
        np.testing.assert_array_equal(stacked[:, k, :], bootstrap.weighted_percentiles(v, o, counts, qs))
        for r in range(len(counts)):
            repeated = np.repeat(v, counts[r, o])
            want = np.percentile(repeated, qs) if repeated.size else np.full(len(qs), np.nan)
            np.testing.assert_allclose(stacked[r, k], want, rtol=1e-12)


def test_a_points_interval_does_not_depend_on_the_points_beside_it():
    """The resamples depend on the runs' sizes and the seed only: a point bootstrapped alone and among
    others (of the same and of other sizes) gets the same interval, and the same seed the same again."""
    def pooled(seed: int, name: str = "ttft") -> bootstrap.Pooled:
        runs = runs_of(seed)
        parts = [aggregate._owned(r, name) for r in runs]
        return bootstrap.Pooled([v for v, _, _ in parts], [o for _, o, _ in parts], [k for _, _, k in parts],
                                [50.0, 99.0], 400)

    alone = bootstrap.intervals([pooled(1)], 0.95)
    among = bootstrap.intervals([pooled(2), pooled(3, "itl"), pooled(1), pooled(4)], 0.95)
    assert [among[2]] == alone and bootstrap.intervals([pooled(1)], 0.95) == alone
    assert [among[0]] != alone  # other values, other interval


def test_the_counts_are_two_level_draws():
    """Each row draws as many requests as the runs it drew hold: a multiple of a run's size per run, the
    run's total a multiple of its size, and each request drawn once on average, with the two-level variance
    2 - 1/n - 1/k (Var of the copies of its run, 1 - 1/k, plus the binomial within, 1 - 1/n)."""
    sizes = [5, 8, 3]
    counts = bootstrap.two_level_counts(sizes, 40_000, np.random.default_rng(1))
    edges = np.cumsum([0, *sizes])
    per_run = np.stack([counts[:, a:b].sum(axis=1) for a, b in zip(edges[:-1], edges[1:])], axis=1)
    assert (per_run % np.asarray(sizes) == 0).all()
    assert ((per_run // np.asarray(sizes)).sum(axis=1) == len(sizes)).all()  # k runs drawn per row
    assert counts.mean(axis=0) == pytest.approx(np.ones(sum(sizes)), abs=0.03)
    want = np.concatenate([[2 - 1 / n - 1 / len(sizes)] * n for n in sizes])
    assert counts.var(axis=0) == pytest.approx(want, rel=0.05)


# ---------------------------------------------------------------------------------------------------
# In distribution: the resampled percentiles, old and new
# ---------------------------------------------------------------------------------------------------

def runs_of(seed: int) -> list[dict[str, Any]]:
    """Per-request values of three runs of different sizes and levels (a run effect), as the summary's
    `_request_values` gives them: TTFT in ms, and each request's ITL gaps (some requests of one chunk), as
    the reference takes them (`itl`: a list per request) and as the summary does (`itl_gaps`, `itl_owner`)."""
    rng = np.random.default_rng(seed)
    out = []
    for n, level in ((12, 20.0), (20, 26.0), (9, 17.0)):
        ttft = rng.gamma(4.0, level / 4.0, n)
        itl = [rng.gamma(3.0, level / 30.0, int(k)) for k in rng.integers(0, 6, n)]
        out.append({"n": n, "ttft": ttft, "itl": itl, "itl_gaps": np.concatenate(itl),
                    "itl_owner": np.repeat(np.arange(n), [len(g) for g in itl])})
    return out


def new_draws(runs: list[dict[str, Any]], name: str, qs: list[float], resamples: int, seed: int) -> np.ndarray:
    parts = [aggregate._owned(r, name) for r in runs]
    pooled = bootstrap.Pooled([v for v, _, _ in parts], [o for _, o, _ in parts], [k for _, _, k in parts], qs,
                              resamples)
    bootstrap.intervals([pooled], 0.95, seed)
    draws = np.concatenate(pooled.draws)
    return draws[np.isfinite(draws).all(axis=1)]


def one_level(runs: list[dict[str, Any]], qs: list[float], resamples: int, seed: int) -> np.ndarray:
    """A bootstrap that ignores the runs (requests pooled, then drawn): too narrow, the wrong distribution."""
    rng = np.random.default_rng(seed)
    pooled = np.concatenate([r["ttft"] for r in runs])
    return np.percentile(pooled[rng.integers(0, pooled.size, (resamples, pooled.size))], qs, axis=1).T


@pytest.mark.parametrize("name", ["ttft", "itl"])
def test_the_resampled_percentiles_have_the_old_distribution(name):
    """6,000 resamples of each: per percentile, the two-sample KS test does not tell old from new (p above
    0.001; the draws are discrete, which makes the test conservative), and at the reference's 2.5 and 97.5 %
    points, the interval's ends, both put the same share of their draws at or below (within 0.01: about 3.5
    standard errors of the difference of two shares near 2.5 % from 6,000 draws each)."""
    runs, qs, n = runs_of(11), [50.0, 90.0, 99.0], 6000
    parts = [r[name] for r in runs]
    old = ref_two_level(parts, qs, n, np.random.default_rng(1), name == "itl")
    new = new_draws(runs, name, qs, n, seed=2)
    assert len(old) == len(new) == n
    for j in range(len(qs)):
        assert stats.ks_2samp(old[:, j], new[:, j]).pvalue > 0.001, (name, qs[j])
        for end in np.percentile(old[:, j], [2.5, 97.5]):
            share_old, share_new = (old[:, j] <= end).mean(), (new[:, j] <= end).mean()
            assert abs(share_old - share_new) < 0.01, (name, qs[j], end, share_old, share_new)


def test_the_check_tells_apart_a_bootstrap_that_ignores_the_runs():
    """The same KS test rejects the one-level bootstrap against the two-level reference: it can fail."""
    runs, qs, n = runs_of(11), [50.0], 6000
    old = ref_two_level([r["ttft"] for r in runs], qs, n, np.random.default_rng(1), False)
    assert stats.ks_2samp(old[:, 0], one_level(runs, qs, n, seed=3)[:, 0]).pvalue < 0.001


def test_a_single_run_has_no_interval():
    """One run: no interval (its requests are not independent draws of the configuration)."""
    runs = runs_of(5)
    parts = [aggregate._owned(r, "ttft") for r in runs[:1]]
    pooled = bootstrap.Pooled([parts[0][0]], [parts[0][1]], [parts[0][2]], [50.0], 100)
    [[(low, high)]] = bootstrap.intervals([pooled], 0.95, 0)
    assert math.isnan(low) and math.isnan(high) and not pooled.draws


def test_the_gaps_read_from_a_samples_file_are_those_of_each_request(tmp_path):
    """ITL gaps from the Arrow columns of a samples file (as the summary reads them) and from lists of
    numbers: per successful request, np.diff of its chunks in ms, a request of one chunk or none drawing none."""
    from test_aggregate import samples

    from raysweep.record.runs import write_samples

    s = samples(4)
    s["chunks"][3], s["chunks"][5] = s["chunks"][3][:1], []
    ok = np.asarray(s["ok"], dtype=bool)
    per_request = [np.diff(np.asarray(c, dtype=float)) * 1000.0 for c, good in zip(s["chunks"], ok) if good]
    write_samples(tmp_path / "run.samples.parquet", s)
    for source in (s, aggregate._read_samples(tmp_path / "run.samples.parquet")):
        got = aggregate._request_values(source)
        assert got["n"] == len(per_request) == ok.sum()
        np.testing.assert_array_equal(got["itl_gaps"], np.concatenate(per_request))
        np.testing.assert_array_equal(got["itl_owner"], np.repeat(np.arange(len(per_request)),
                                                                  [len(g) for g in per_request]))


@pytest.mark.parametrize("seed", range(3))
def test_short_sets_read_directly_equal_the_blocks(seed):
    """A short set (a value per request) is read directly, a long one by blocks: on the same sets and counts
    (ties, rows that draw nothing, owners with no value) both give the same numbers."""
    rng = np.random.default_rng(seed)
    counts = bootstrap.two_level_counts([20, 13, 31], 200, rng)
    counts[::9] = 0
    qs = [0.0, 2.5, 50.0, 90.0, 99.0, 100.0]
    for g in (1, 2, 17, 64, 256):
        owner = rng.integers(0, counts.shape[1], g)
        values = np.sort(np.round(rng.gamma(2.0, 3.0, g), 1))
        direct = bootstrap._direct(values, owner, counts, qs)
        np.testing.assert_array_equal(direct, bootstrap._blocked([values], [owner], counts, qs)[:, 0, :])
        np.testing.assert_allclose(direct, ref_weighted_percentiles(values, counts[:, owner], qs), rtol=1e-12)


# ---------------------------------------------------------------------------------------------------
# The compiled loop (numba, where installed) reads the same numbers as numpy
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(4))
def test_the_compiled_loop_reads_the_numpy_percentiles_to_the_bit(seed):
    """Sets short and long (read directly and by blocks with numpy), ties, empty sets, rows that draw nothing,
    owners with no value, percentiles 0 to 100: the compiled loop gives exactly numpy's numbers."""
    walk = pytest.importorskip("raysweep.maths.bootstrap_walk")
    rng = np.random.default_rng(seed)
    counts = bootstrap.two_level_counts([20, 13, 31, 0], 150, rng)
    counts[::11] = 0
    qs = [0.0, 2.5, 50.0, 90.0, 99.0, 100.0, float(rng.uniform(0, 100))]
    sets, owners = [], []
    for g in (0, 1, 2, 17, 64, 257, 960):
        owners.append(rng.integers(0, counts.shape[1] - 5, g))
        sets.append(np.sort(np.round(rng.gamma(2.0, 3.0, g), int(rng.integers(0, 3)))))
    numpy_read = bootstrap.stacked_percentiles(sets, owners, counts, qs)
    np.testing.assert_array_equal(walk.walk_percentiles(sets, owners, counts, qs), numpy_read)
    np.testing.assert_array_equal(bootstrap.stacked_percentiles(sets, owners, counts, qs, walk=True), numpy_read)


def test_intervals_are_the_same_whichever_reads_the_percentiles(monkeypatch):
    """`intervals` of many points (TTFT and ITL, ITL with fewer resamples) by the compiled loop and by numpy:
    the same intervals for the same seed, to the bit; and numpy's where numba cannot be imported."""
    pytest.importorskip("raysweep.maths.bootstrap_walk")

    def points() -> list[bootstrap.Pooled]:
        out = []
        for seed in range(6):
            runs = runs_of(seed)
            for name, n in (("ttft", 300), ("itl", 120)):
                parts = [aggregate._owned(r, name) for r in runs]
                out.append(bootstrap.Pooled([v for v, _, _ in parts], [o for _, o, _ in parts],
                                            [k for _, _, k in parts], [50.0, 90.0, 99.0], n))
        return out

    monkeypatch.setattr(bootstrap, "_WALK_CELLS", math.inf)
    by_numpy = bootstrap.intervals(points(), 0.95, seed=7)
    monkeypatch.setattr(bootstrap, "_WALK_CELLS", 0)
    assert bootstrap.intervals(points(), 0.95, seed=7) == by_numpy
    monkeypatch.setattr(bootstrap, "_walker", lambda: None)  # numba missing
    assert bootstrap.intervals(points(), 0.95, seed=7) == by_numpy

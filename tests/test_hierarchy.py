"""The one model of a measurement (`raysweep.maths.hierarchy`): values, intervals and verdicts over server starts,
and the edges that get a stated reason instead of a p-value."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from raysweep.maths import hierarchy
from raysweep.maths.hierarchy import Estimate


def test_a_configuration_is_the_mean_of_its_start_means_with_t_over_the_starts():
    values = np.array([100.0, 104.0, 120.0, 90.0, 92.0, 94.0])
    starts = np.array([0, 0, 1, 2, 2, 2])
    e = Estimate.of_runs(values, starts)
    means = np.array([102.0, 120.0, 92.0])
    assert (e.mean, e.starts, e.runs, e.df) == (pytest.approx(means.mean()), 3, 6, 2)
    assert e.se == pytest.approx(means.std(ddof=1) / math.sqrt(3))
    low, high = e.interval(0.95)
    assert high - e.mean == pytest.approx(stats.t.ppf(0.975, 2) * e.se) and low < e.mean < high


def test_one_start_keeps_the_interval_of_its_runs_and_is_never_compared():
    one = Estimate.of_runs([100.0, 101.0, 99.0], ["s", "s", "s"])
    assert (one.starts, one.df) == (1, 2) and one.se == pytest.approx(1.0 / math.sqrt(3))
    other = Estimate.of_runs([120.0, 121.0, 119.0], ["t", "t", "t"])
    v = hierarchy.compare(one, other)
    assert (v.word, v.reason) == ("not compared", "one server start each") and math.isnan(v.p_value)
    many = Estimate.of_runs([120.0, 121.0, 119.0], ["a", "b", "c"])
    assert hierarchy.compare(one, many).text == "not compared: one server start on a side (1 and 3 starts)"


def test_the_verdict_is_better_exactly_when_the_interval_of_the_lead_excludes_no_lead():
    rng = np.random.default_rng(3)
    for _ in range(200):
        a = Estimate.of_runs(1000 * np.exp(0.05 * rng.standard_normal(6)), np.arange(6))
        b = Estimate.of_runs(1040 * np.exp(0.05 * rng.standard_normal(4)), np.arange(4))
        v = hierarchy.compare(a, b)
        assert v.low < v.ratio < v.high and v.level == 0.95
        assert (v.word == "better") == (v.low > 1.0) and (v.word == "worse") == (v.high < 1.0)
        assert (v.word in ("better", "worse")) == (v.p_value < 0.05)


def test_edges_give_a_stated_reason_never_a_tiny_p_value():
    flat_a = Estimate.of_runs([1000.0] * 4, [0, 1, 2, 3])
    flat_b = Estimate.of_runs([1000.001] * 4, [0, 1, 2, 3])
    v = hierarchy.compare(flat_a, flat_b)
    assert v.word == "not judged" and "no spread at all" in v.reason and math.isnan(v.p_value)
    neg = hierarchy.compare(Estimate(-5.0, 1.0, 3, 4, 4), Estimate(10.0, 1.0, 3, 4, 4))
    assert neg.word == "not judged" and "not positive and finite" in neg.reason
    none = hierarchy.compare(Estimate.of_runs([math.inf, math.nan], [0, 1]), flat_b)
    assert none.word == "not judged" and none.reason == "no run with a finite value on a side"


def test_few_starts_read_hsu_s_degrees_of_freedom():
    a, b = Estimate(100.0, 2.0, 2, 3, 6), Estimate(110.0, 1.0, 3, 4, 8)
    v = hierarchy.compare(a, b)
    ra, rb = 2.0 / 100.0, 1.0 / 110.0
    t = math.log(1.1) / math.sqrt(ra ** 2 + rb ** 2)
    assert v.p_value == pytest.approx(2 * stats.t.sf(t, 2))   # min(starts) - 1 = 2


def _starts(rng: np.random.Generator, starts: int, runs: int, warm: float) -> tuple[np.ndarray, ...]:
    """Runs of one configuration: `starts` server starts (5 % start effects) of `runs` runs each (2 % noise), the
    first run of each `warm` slower; (values, cells, ranks)."""
    values, cells, ranks = [], [], []
    for s in range(starts):
        effect = math.exp(0.05 * rng.standard_normal())
        for j in range(runs):
            values.append(1000.0 * effect * (1 + 0.02 * rng.standard_normal()) * (1 - warm if j == 0 else 1.0))
            cells.append(s)
            ranks.append(10 * s + j)
    return np.array(values), np.array(cells), np.array(ranks, dtype=float)


def test_a_warm_up_of_every_start_is_found_and_its_first_runs_cut():
    rng = np.random.default_rng(7)
    v, cells, ranks = _starts(rng, 8, 2, 0.10)
    shuffled = rng.permutation(v.size)   # the order of measurement is read from the ranks, not the table's order
    w = hierarchy.warmup(v[shuffled], np.zeros(v.size), cells[shuffled], np.zeros(v.size), ranks[shuffled], 1)
    assert w.starts[0] == 8 and w.p[0] < 1e-4 and w.pct[0] == pytest.approx(-10.0, abs=2.5)
    assert w.cut.sum() == 8 and set(ranks[shuffled][w.cut] % 10) == {0.0}
    kept = Estimate.of_runs(v[shuffled][~w.cut], cells[shuffled][~w.cut])
    assert kept.runs == 8 and kept.starts == 8


def test_no_warm_up_is_cut_where_none_is_shown_or_it_cannot_be_judged():
    rng = np.random.default_rng(8)
    v, cells, ranks = _starts(rng, 8, 2, 0.0)
    calm = hierarchy.warmup(v, np.zeros(v.size), cells, np.zeros(v.size), ranks, 1)
    assert calm.p[0] > 0.05 and not calm.cut.any()
    one_run = hierarchy.warmup(_starts(rng, 8, 1, 0.10)[0], np.zeros(8), np.arange(8), np.zeros(8), np.arange(8.0), 1)
    assert one_run.starts[0] == 0 and math.isnan(one_run.p[0]) and not one_run.cut.any()   # one run per start
    two = hierarchy.warmup(_starts(rng, 2, 3, 0.10)[0], np.zeros(6), np.repeat([0, 1], 3), np.zeros(6),
                           np.arange(6.0), 1)
    assert math.isnan(two.p[0]) and not two.cut.any()   # under WARMUP_MIN_STARTS starts: not judged


def test_a_warm_up_is_judged_per_configuration():
    rng = np.random.default_rng(9)
    a, b = _starts(rng, 6, 3, 0.10), _starts(rng, 6, 3, 0.0)
    values = np.concatenate([a[0], b[0]])
    configs = np.repeat([0, 1], a[0].size)
    w = hierarchy.warmup(values, configs, np.concatenate([a[1], 100 + b[1]]), np.zeros(values.size),
                         np.concatenate([a[2], b[2]]), 2)
    assert w.shown.tolist() == [True, False] and w.cut[:a[0].size].sum() == 6 and not w.cut[a[0].size:].any()
    flat = hierarchy.warmup(np.array([90.0, 100, 100] * 3), np.zeros(9), np.repeat([0, 1, 2], 3), np.zeros(9),
                            np.arange(9.0), 1)
    assert flat.p[0] == 0.0 and flat.cut.sum() == 3   # alike in every start: shown without a spread
    none = hierarchy.warmup(np.full(9, 100.0), np.zeros(9), np.repeat([0, 1, 2], 3), np.zeros(9), np.arange(9.0), 1)
    assert none.p[0] == 1.0 and not none.cut.any()


def test_only_the_first_run_of_a_server_s_life_is_a_warm_up_never_the_first_run_of_each_later_point():
    # 4 starts, each serving two bench points one after another (3 runs each); the first run at the second point
    # is slow on every start, but it is not the first of the start's life: nothing is cut
    rng = np.random.default_rng(10)
    values, starts, points, ranks = [], [], [], []
    for s in range(4):
        for pt in range(2):
            for j in range(3):
                slow = 0.8 if (pt == 1 and j == 0) else 1.0
                values.append(1000.0 * (1 + pt) * slow * (1 + 0.01 * rng.standard_normal()))
                starts.append(s), points.append(pt), ranks.append(100 * s + 10 * pt + j)
    w = hierarchy.warmup(np.array(values), np.zeros(24), np.array(starts), np.array(points), np.array(ranks), 1)
    assert w.starts[0] == 4 and not w.shown[0] and not w.cut.any()
    values[::6] = [v * 0.8 for v in values[::6]]   # now the first run of each start's life is slow as well
    w = hierarchy.warmup(np.array(values), np.zeros(24), np.array(starts), np.array(points), np.array(ranks), 1)
    assert w.shown[0] and sorted(np.flatnonzero(w.cut)) == [0, 6, 12, 18]


def test_two_drifts_apart_only_where_their_difference_is_shown():
    assert hierarchy.drift_apart(-2.0, 0.3, 6, -2.1, 0.3, 6, 12) == 0.0          # alike: the machine's, shared
    apart = hierarchy.drift_apart(-2.0, 0.3, 6, 0.5, 0.3, 6, 12)
    assert apart == pytest.approx(0.025 * 11)                                     # 2.5 %/run apart over 12 runs
    assert hierarchy.drift_apart(-2.0, 3.0, 6, 0.5, 3.0, 6, 12) == 0.0           # not shown at this spread
    assert hierarchy.drift_apart(math.nan, 0.3, 6, 0.5, 0.3, 6, 12) == 0.0

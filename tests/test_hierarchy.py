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

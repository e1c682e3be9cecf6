"""Unit tests for raysweep.maths.verdicts: Welch's verdicts, the leader among many (Holm), equivalence of a ratio,
the slope test. Synthetic data; the calibration of each is measured by benchmarks/bench_verdicts.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from raysweep.maths import verdicts


def test_welch_verdict_words_and_its_p_value_is_scipys():
    a, b = [100.0, 101.0, 99.0, 100.5, 99.5], [104.0, 105.0, 103.0, 104.5, 103.5]
    v = verdicts.compare_values(a, b)
    assert v.word == "better" and v.text == "better" and v.ratio == pytest.approx(104.0 / 100.0)
    assert v.p_value == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue)
    assert verdicts.compare_values(a, b, higher_is_better=False).word == "worse"
    close = verdicts.compare_values(a, [100.4, 101.2, 99.1, 100.9, 99.8])
    assert close.word == "not shown" and close.text == "not shown with 5 runs"
    assert verdicts.compare_values(a, [100.0, 101.0, 99.0]).text in ("not shown with 5 and 3 runs",)
    one = verdicts.compare_values(a, [200.0])
    assert one.word == "not judged" and "fewer than 2 runs" in one.text
    # "within the noise" claims an equality that a test cannot show
    assert all("noise" not in v.text for v in (close, one))


def test_no_spread_at_all_decides_any_difference():
    assert verdicts.compare_values([5.0] * 3, [6.0] * 3).word == "better"
    assert verdicts.compare_values([5.0] * 3, [5.0] * 3).word == "not shown"


def test_a_side_with_fewer_than_3_runs_is_not_shown_whatever_its_p_value():
    # Welch with 2 runs on the noisier side errs about twice as often as it says (benchmarks/bench_verdicts.py)
    v = verdicts.compare_values([5.0, 5.0], [6.0, 6.0, 6.0])
    assert v.word == "not shown" and v.p_value < 0.05 and v.test == "Welch's t over runs"
    assert v.text == "not shown with 2 and 3 runs (fewer than 3 runs on a side)"
    lead = verdicts.tied_with_leader([(10.0, 0.1, 5), (5.0, 0.1, 2), (9.0, 0.1, 5)])
    assert lead.tied == [1] and lead.behind == [2] and lead.clear is False


def test_the_leader_names_every_candidate_it_is_not_shown_to_beat():
    rng = np.random.default_rng(1)
    runs = [rng.normal(mu, 1.0, 5) for mu in (100.0, 99.8, 90.0, 80.0)]
    cands = [(float(r.mean()), float(r.std(ddof=1)), 5) for r in runs]
    lead = verdicts.tied_with_leader(cands)
    assert lead.leader == int(np.argmax([c[0] for c in cands]))
    assert set(lead.tied) == {0, 1} - {lead.leader} and set(lead.behind) == {2, 3}
    assert lead.clear is False
    # Holm: the adjusted p-values are monotone in the raw ones and never under them
    raw = {i: verdicts.compare_means(cands[lead.leader], cands[i]).p_value for i in lead.adjusted_p}
    assert all(lead.adjusted_p[i] >= raw[i] for i in raw)
    order = sorted(raw, key=raw.get)
    assert [lead.adjusted_p[i] for i in order] == sorted(lead.adjusted_p[i] for i in order)
    # lower is better: the smallest mean leads
    low = verdicts.tied_with_leader(cands, higher_is_better=False)
    assert low.leader == 3 and low.clear is True


def test_holm_is_stricter_than_testing_the_runner_up_alone():
    # p ~ 0.03 against each of three candidates: each alone would be beaten, Holm beats none (3 x 0.03 > 0.05)
    leader = (10.0, 1.0, 5)
    other = (10.0 - 1.6, 1.0, 5)
    p = verdicts.compare_means(leader, other).p_value
    assert 0.0167 < p < 0.05
    lead = verdicts.tied_with_leader([leader, other, other, other])
    assert lead.leader == 0 and len(lead.tied) == 3 and not lead.behind


def test_a_candidate_with_one_run_is_not_judged():
    lead = verdicts.tied_with_leader([(10.0, 1.0, 5), (5.0, math.nan, 1)])
    assert lead.not_judged == [1] and lead.clear is None


def test_equivalence_needs_the_whole_interval_inside_the_tolerance():
    rng = np.random.default_rng(3)
    a = rng.normal(100.0, 1.0, 8)
    same = verdicts.equivalence(a, a * 1.01)
    assert same.word == "equivalent" and same.text == "equivalent within 5%"
    assert same.low < 1.01 < same.high and 0.95 <= same.low and same.high <= 1.05
    far = verdicts.equivalence(a, a * 1.3)
    assert far.word == "different" and far.low > 1.05
    noisy = verdicts.equivalence(rng.normal(100.0, 10.0, 3), rng.normal(100.0, 10.0, 3))
    assert noisy.word == "not shown" and "not shown within 5% with 3 and 3 runs" in noisy.text
    assert noisy.runs_needed is None or noisy.runs_needed > 3
    assert verdicts.equivalence([1.0], [1.0, 2.0]).word == "not judged"


def test_slope_is_flagged_only_when_its_interval_lies_beyond_the_drift():
    rng = np.random.default_rng(4)
    flat = 100 + rng.normal(0, 20, 30)          # noisy but stationary: a fitted slope, not a shown drift
    s = verdicts.slope_test(flat, 10.0)
    assert s is not None and not s.drifts and s.low < s.pct_per_step < s.high
    ramp = 100 * (1 + 0.5 * np.arange(30) / 29) + rng.normal(0, 2, 30)   # +50 % over the series
    r = verdicts.slope_test(ramp, 10.0)
    assert r is not None and r.drifts and r.low * 29 > 10.0
    assert verdicts.slope_test([1.0, 2.0], 10.0) is None


def test_runs_for_half_width_uses_the_t_quantile():
    n = verdicts.runs_for_half_width(0.1, 0.05)
    assert stats.t.ppf(0.975, n - 1) * 0.1 / math.sqrt(n) <= 0.05 < stats.t.ppf(0.975, n - 2) * 0.1 / math.sqrt(n - 1)


def _bench_verdicts():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        import bench_verdicts
    finally:
        sys.path.pop(0)
    return bench_verdicts


def test_a_noisy_stationary_load_is_never_flagged_and_a_short_one_is_not_judged():
    from raysweep.bench import stats as bench_stats

    bench_verdicts = _bench_verdicts()
    rng = np.random.default_rng(7)
    few = [bench_stats.steady_state(bench_verdicts.poisson_samples(rng, 20.0, 30.0)) for _ in range(12)]
    # the fitted line of a 600-request Poisson load moves by more than 10 % over the point by chance alone
    # (a rule judging the line without its interval flags it); the test flags none, and calls none steady
    # either: it could not have seen a 30 % drift with so few requests
    old_rule = sum(abs(f["steady_state_drift_pct"]) > 10.0 for f in few)
    assert old_rule >= 3 and all(f["steady_state"] is None for f in few), old_rule
    assert all(f["steady_state_note"].startswith("not judged: too few requests") for f in few)
    assert all(f["steady_state_detectable_pct"] > bench_stats.STEADY_DETECT_DRIFT_PCT for f in few)
    tiny = bench_stats.steady_state(bench_verdicts.poisson_samples(rng, 3.0, 30.0))
    assert tiny["steady_state"] is None and tiny["steady_state_note"] == "not judged: too short"
    many = [bench_stats.steady_state(bench_verdicts.poisson_samples(rng, 100.0, 90.0)) for _ in range(2)]
    assert all(m["steady_state"] is True and m["steady_state_note"] is None for m in many), many
    assert all(m["steady_state_detectable_pct"] <= bench_stats.STEADY_DETECT_DRIFT_PCT for m in many)


def test_a_30_pct_drift_over_a_long_enough_point_is_flagged_either_way():
    from raysweep.bench import stats as bench_stats

    bench_verdicts = _bench_verdicts()
    rng = np.random.default_rng(8)
    rise = bench_stats.steady_state(bench_verdicts.poisson_samples(rng, 100.0, 90.0, drift=0.3))
    assert rise["steady_state"] is False and 15.0 < rise["steady_state_drift_pct"] < 50.0, rise
    assert rise["steady_state_slope_pct_per_s"] > 0
    fall = bench_stats.steady_state(bench_verdicts.poisson_samples(rng, 100.0, 90.0, drift=-0.3))
    assert fall["steady_state"] is False and fall["steady_state_drift_pct"] < -15.0, fall
    # a drift shown however few the requests: flagged, not "not judged"
    ramp = bench_stats.steady_state(bench_verdicts.poisson_samples(rng, 20.0, 30.0, drift=3.0))
    assert ramp["steady_state"] is False and ramp["steady_state_drift_pct"] > 100.0, ramp


def test_a_not_shown_equivalence_that_no_number_of_runs_settles_still_has_its_text():
    # A ratio on the tolerance itself: no run count settles it (runs_needed is None), as with two runs of a
    # real server whose clients differed by 5 % in one crosscheck.
    eq = verdicts.Equivalence("not shown", 1.05, 0.8, 1.3, 0.05, 2, 2, None)
    assert eq.text == ("not shown within 5% with 2 and 2 runs; "
                       "the ratio sits on the tolerance: no number of runs settles it")

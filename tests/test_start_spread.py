"""The spread between server starts (`raysweep.maths.start_spread`) and the summary's intervals that include it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from raysweep.maths.start_spread import StartSpread, start_spread, starts_per_point, widened_intervals
from raysweep.results import aggregate


def _runs(rng: np.random.Generator, level: float, starts: int, runs: int, between: float, within: float,
          ) -> tuple[np.ndarray, np.ndarray]:
    effects = rng.normal(0.0, between, starts)
    values = np.concatenate([level * np.exp(e + rng.normal(0.0, within, runs)) for e in effects])
    return values, np.repeat(np.arange(starts), runs)


def test_the_spread_between_starts_is_estimated_from_the_points_with_two_or_more_starts():
    rng = np.random.default_rng(7)
    values, points, starts = [], [], []
    for p in range(40):  # 40 points on 3 starts of 4 runs: 10 % between starts, 2 % within
        v, s = _runs(rng, 1000.0 + 50 * p, 3, 4, 0.10, 0.02)
        values.append(v), points.append(np.full(v.size, p)), starts.append(s + 10 * p)
    values.append(np.full(5, 7.0)), points.append(np.full(5, 40)), starts.append(np.full(5, 999))  # one start
    got = start_spread(np.concatenate(values), np.concatenate(points), np.concatenate(starts))
    assert got is not None and got.points == 40 and got.df == 80
    # a start's mean of 4 runs: sqrt(10 %^2 + 2 %^2 / 4) = 10.05 %
    assert 8.5 < got.pct < 11.5
    same = start_spread(np.full(12, 5.0) * np.exp(rng.normal(0, 0.02, 12)), np.zeros(12, int),
                        np.repeat([0, 1, 2], 4))
    assert same is not None and same.pct < 2.0  # no start effect: about the runs' noise over 4 runs (1 %)


def test_no_spread_without_a_point_on_two_starts():
    assert start_spread(np.arange(1.0, 7.0), np.array([0, 0, 0, 1, 1, 1]), np.array([0, 0, 0, 1, 1, 1])) is None
    assert start_spread(np.array([np.nan, -1.0]), np.array([0, 0]), np.array([0, 1])) is None
    one_run_each = start_spread(np.array([100.0, 110.0]), np.array([0, 0]), np.array([0, 1]))
    assert one_run_each is not None and one_run_each.df == 1  # a start's mean is its one run
    assert starts_per_point(np.array([0, 0, 1, 2, 2, 2]), np.array([5, 6, 5, 1, 1, 3]), 4).tolist() == [2, 1, 2, 0]


def test_a_widened_interval_takes_the_larger_of_the_start_variance_and_the_runs_variance():
    spread = StartSpread(var=0.1 ** 2, df=4, points=2)
    low, high = widened_intervals(np.array([1000.0, 1000.0, 1000.0, 5.0]), np.array([20.0, 20.0, 20.0, 1.0]),
                                  np.array([4, 4, 4, 1]), np.array([1, 2, 4, 1]), spread, 0.95)
    half = (high - low) / 2
    t4 = 2.776  # Student's t at 97.5 %, 4 degrees of freedom (the spread's)
    assert half[:3] == pytest.approx([t4 * 100.0, t4 * 100.0 / np.sqrt(2), t4 * 50.0], rel=1e-3)
    assert np.isnan(low[3]) and np.isnan(high[3])  # one run: no interval
    none = widened_intervals(np.array([1000.0]), np.array([20.0]), np.array([4]), np.array([1]),
                             StartSpread(0.0, 4, 1), 0.95)
    assert none[1][0] - 1000.0 == pytest.approx(3.182 * 10.0, rel=1e-3)  # runs noisier: their own t-interval


def _table(rng: np.random.Generator, between: float) -> pd.DataFrame:
    rows = []
    for serve in ("a", "b"):
        for bench, starts in (("low", 1), ("high", 1), ("confirm", 2)):
            for s in range(starts):
                effect = rng.normal(0.0, between)
                for r in range(3):
                    rows.append({"serve_id": serve, "bench_id": bench, "serve_label": serve, "bench_label": bench,
                                 "point_id": f"{serve}{bench}{s}{r}", "run_number": r, "server_id": f"{serve}-{s}",
                                 "output_throughput": 1000.0 * np.exp(effect + rng.normal(0.0, 0.01))})
    return pd.DataFrame(rows)


def test_the_summary_widens_every_interval_by_the_spread_its_campaign_measured():
    df = _table(np.random.default_rng(3), 0.15)
    plain = aggregate.summarize(df.assign(server_id="one"))  # one start for all: nothing to widen with
    wide = aggregate.summarize(df)
    assert plain.attrs["start_spread"] == {} and (plain["ci_method"] == "t").all()
    assert set(wide.attrs["start_spread"]) == {"output_throughput", "output_throughput_per_gpu"}
    assert wide["ci_method"].str.startswith("t over runs and server starts (output_throughput: ").all()
    assert wide.set_index(["serve_id", "bench_id"])["server_starts"].to_dict() == {
        ("a", "confirm"): 2, ("a", "high"): 1, ("a", "low"): 1, ("b", "confirm"): 2, ("b", "high"): 1,
        ("b", "low"): 1}
    w = (wide["output_throughput_ci_high"] - wide["output_throughput_ci_low"]).to_numpy()
    p = (plain["output_throughput_ci_high"] - plain["output_throughput_ci_low"]).to_numpy()
    assert (w > p).all()
    assert (wide["output_throughput_mean"].to_numpy() == pytest.approx(plain["output_throughput_mean"].to_numpy()))


def _with_confirmation(rng: np.random.Generator, between: float) -> pd.DataFrame:
    """Two configurations at two loads on one start each (the sweep), then each one's high load again on two
    fresh starts (the winner's confirmation: `phase` confirm, `confirms_bench_id`)."""
    rows = []
    for serve in ("a", "b"):
        for bench, phase, starts in (("low", None, 1), ("high", None, 1), ("c-high", "confirm", 2)):
            for s in range(starts):
                effect = rng.normal(0.0, between)
                for r in range(3):
                    rows.append({"serve_id": serve, "bench_id": bench, "serve_label": serve, "bench_label": bench,
                                 "max_concurrency": 4 if bench == "low" else 16, "phase": phase,
                                 "confirms_bench_id": "high" if phase else None, "point_id": f"{serve}{bench}{s}{r}",
                                 "run_number": r, "server_id": f"{serve}-{bench}-{s}",
                                 "output_throughput": 1000.0 * np.exp(effect + rng.normal(0.0, 0.01))})
    return pd.DataFrame(rows)


def test_a_confirmation_counts_as_more_starts_of_the_point_it_confirms():
    df = _with_confirmation(np.random.default_rng(5), 0.1)
    summary = aggregate.summarize(df)
    spread = summary.attrs["start_spread"]["output_throughput"]
    assert spread[1:] == [4, 2]  # the sweep's start and the confirmation's 2, for each of 2 points: 2 x 2 df
    assert summary["ci_method"].str.contains("output_throughput: a start's mean varies").all()


def test_the_conclusions_say_that_their_intervals_cover_server_starts():
    from raysweep.results import conclusions

    c = conclusions.conclude(_with_confirmation(np.random.default_rng(5), 0.1), ["max_concurrency"])
    said = [n for n in c.notes if n.startswith("Intervals cover the level over server starts")]
    assert len(said) == 1 and "more server starts narrow them" in said[0]
    plain = conclusions.conclude(_with_confirmation(np.random.default_rng(5), 0.1).assign(server_id="one"),
                                 ["max_concurrency"])
    assert not [n for n in plain.notes if "server starts" in n]


def test_the_precision_rule_s_reported_interval_keeps_the_spread_between_starts():
    from raysweep.maths.precision import PrecisionSpec
    from raysweep.results.precision import _widen_for_looks

    summary = aggregate.summarize(_with_confirmation(np.random.default_rng(5), 0.1))
    spec = PrecisionSpec(metric="output_throughput", rel_half_width=0.05, min_runs=2, max_runs=3)
    out = summary.copy()
    _widen_for_looks(out, [True] * len(out), spec)
    spread = StartSpread(*summary.attrs["start_spread"]["output_throughput"])
    low, high = widened_intervals(summary["output_throughput_mean"].to_numpy(),
                                  summary["output_throughput_std"].to_numpy(), summary["runs"].to_numpy(),
                                  summary["server_starts"].to_numpy(), spread, out["precision_confidence"].iloc[0])
    assert out["output_throughput_ci_low"].to_numpy() == pytest.approx(low)
    assert out["output_throughput_ci_high"].to_numpy() == pytest.approx(high)
    assert (out["output_throughput_ci_high"] - out["output_throughput_ci_low"] >
            summary["output_throughput_ci_high"] - summary["output_throughput_ci_low"]).all()  # 97.5 %: wider


def test_two_levels_are_compared_over_their_starts():
    from raysweep.maths.start_spread import OVER_STARTS, compare_over_starts

    spread = StartSpread(var=0.1 ** 2, df=4, points=2)
    tight = compare_over_starts((1000.0, 10.0, 4, 1), (1300.0, 10.0, 4, 1), spread)
    assert tight.test == OVER_STARTS and tight.word == "not shown"  # 30 % on one start each: within the spread
    assert compare_over_starts((1000.0, 10.0, 4, 1), (1300.0, 10.0, 4, 1), StartSpread(0.01 ** 2, 40, 20)
                               ).word == "better"
    assert compare_over_starts((1000.0, 10.0, 4, 1), (700.0, 10.0, 4, 1), StartSpread(0.01 ** 2, 40, 20),
                               higher_is_better=True).word == "worse"
    few = compare_over_starts((1000.0, 10.0, 2, 1), (2000.0, 10.0, 4, 1), StartSpread(0.0, 4, 2))
    assert few.word == "not shown" and few.reason == "fewer than 3 runs on a side"
    assert compare_over_starts((1000.0, float("nan"), 4, 1), (1000.0, 1.0, 4, 1), spread).word == "not judged"


def test_the_confirmation_compares_over_starts_where_the_spread_is_known():
    from raysweep.maths.confirmation import confirmed_verdict

    leader, runner = [1320.0, 1290.0, 1310.0, 1300.0], [1000.0, 1010.0, 990.0, 1005.0]
    welch = confirmed_verdict(leader, runner, True, (2, 2))
    over = confirmed_verdict(leader, runner, True, (2, 2), spread=StartSpread(0.15 ** 2, 2, 2))
    assert welch is not None and welch.significant and welch.test == "Welch's t"
    assert over is not None and over.significant is False and over.test == "t over server starts"
    assert "t over server starts p=" in over.text()
    assert over.ci_high - over.ci_low > welch.ci_high - welch.ci_low


def test_runs_whose_start_is_not_recorded_count_as_one_start_and_measure_no_spread():
    df = _with_confirmation(np.random.default_rng(5), 0.1)
    sweep = df["phase"].isna()
    summary = aggregate.summarize(df.assign(server_id=df["server_id"].where(~sweep)))
    starts = summary.set_index(["serve_id", "bench_id"])["server_starts"].to_dict()
    assert starts[("a", "low")] == 1 and starts[("a", "c-high")] == 2
    assert summary.attrs["start_spread"]["output_throughput"][1:] == [2, 2]  # the confirmation's starts only

"""Levels at the server's start: the drift of a server's life fitted over all its points' runs
(`raysweep.maths.start_level`), and the summary's intervals that use it (`raysweep.results.aggregate`)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

from raysweep.maths.start_level import start_levels
from raysweep.results import aggregate


def _life(rng: np.random.Generator, points: int, rounds: int, drift: float, spread: float = 0.02,
          alone: int | None = None, levels: tuple[float, ...] = (1000.0, 2000.0, 500.0, 800.0)):
    """A server's life in rounds (every point once per round, shuffled): values, point codes, places."""
    order = np.concatenate([rng.permutation(points) for _ in range(rounds)])
    places = np.arange(order.size, dtype=float)
    slope = (1.0 + drift) ** places - 1.0   # a relative drift per place
    slope = slope if alone is None else np.where(order == alone, slope, 0.0)
    level = np.asarray(levels, dtype=float)[order]
    return level * (1.0 + slope) * (1.0 + spread * rng.standard_normal(order.size)), order, places


def _interval(fit, p: int) -> tuple[float, float]:
    q = stats.t.ppf(0.975, fit.df[p])
    return math.exp(fit.log_level[p] - q * fit.log_se[p]), math.exp(fit.log_level[p] + q * fit.log_se[p])


def test_a_common_drift_is_fitted_out_of_every_point_s_level():
    values, order, places = _life(np.random.default_rng(3), 4, 5, drift=-0.01, spread=0.005)
    fit = start_levels(values, order, places, 4)
    assert (fit.df == 20 - 4 - 1).all() and not fit.alone.any()
    assert (-1.2 < fit.slope_pct).all() and (fit.slope_pct < -0.8).all()
    for p, true in enumerate((1000.0, 2000.0, 500.0, 800.0)):
        low, high = _interval(fit, p)
        assert low <= true <= high
        assert values[order == p].mean() < 0.95 * true   # the mean over the drifting life is well below it


def test_one_point_alone_on_its_server_gets_its_own_line():
    rng = np.random.default_rng(4)
    values = 1000.0 * (1 - 0.01 * np.arange(5.0)) * (1 + 0.02 * rng.standard_normal(5))
    fit = start_levels(values, np.zeros(5, dtype=int), np.arange(5.0), 1)
    line = stats.linregress(np.arange(5.0), np.log(values))
    assert fit.df[0] == 3
    assert math.isclose(fit.log_level[0], line.intercept, rel_tol=1e-12)
    assert math.isclose(fit.log_se[0], line.intercept_stderr, rel_tol=1e-9)


def test_a_point_drifting_alone_is_fitted_alone_and_does_not_pull_the_others():
    values, order, places = _life(np.random.default_rng(5), 4, 6, drift=-0.01, spread=0.005, alone=0)
    fit = start_levels(values, order, places, 4)
    assert fit.alone.tolist() == [True, False, False, False]
    assert (abs(fit.slope_pct) < 0.1).all()
    for p, true in enumerate((1000.0, 2000.0, 500.0, 800.0)):
        low, high = _interval(fit, p)
        assert low <= true <= high


def test_what_cannot_be_fitted_says_so():
    def fitted(values, points, k):
        values = np.asarray(values, dtype=float)
        return np.isfinite(start_levels(values, np.asarray(points), np.arange(float(values.size)), k).log_level)

    assert not fitted([1000.0, 0.0, 990.0, 1010.0], [0, 0, 0, 0], 1).any()   # a logarithm is taken
    assert not fitted([1000.0, 990.0, 1005.0, 998.0], [0, 0, 0, 0], 1).any()   # 2 residual degrees of freedom
    assert fitted([1000.0, 990.0, 1005.0, 998.0, 1001.0], [0, 0, 0, 0, 0], 1).all()   # 3
    assert fitted([], [], 0).size == 0
    assert fitted([1000.0, 990.0, 1010.0, 995.0, 1002.0, 700.0], [0, 0, 0, 0, 0, 1], 2).tolist() == [True, False]


def test_servers_are_fitted_apart_in_one_call():
    rng = np.random.default_rng(8)
    a, pa, xa = _life(rng, 3, 5, drift=-0.01, spread=0.005)
    b, pb, xb = _life(rng, 3, 5, drift=0.0, spread=0.005)
    both = start_levels(np.concatenate([a, b]), np.concatenate([pa, pb + 3]), np.concatenate([xa, xb]), 6,
                        np.repeat([0, 1], 15))
    one = start_levels(a, pa, xa, 3)
    other = start_levels(b, pb, xb, 3)
    assert np.allclose(both.log_level, np.concatenate([one.log_level, other.log_level]))
    assert np.allclose(both.log_se, np.concatenate([one.log_se, other.log_se]))
    assert np.allclose(both.slope_pct[:3], one.slope_pct) and np.allclose(both.slope_pct[3:], other.slope_pct)


def _table(rng: np.random.Generator, drift: float, with_order: bool = True) -> pd.DataFrame:
    rows, t = [], 1.8e9
    for server, serve in (("s1-a", "s1"), ("s2-a", "s2")):
        values, order, places = _life(rng, 3, 5, drift, spread=0.005, levels=(1000.0, 2000.0, 500.0))
        for v, p, k in zip(values, order, places):
            t += 10.0
            rows.append({"serve_id": serve, "bench_id": f"b{p}", "max_concurrency": [1, 4, 16][p],
                         "server_id": server, "output_throughput": v, "run_number": int(k) // 3,
                         **({"started_at": t} if with_order else {})})
    return pd.DataFrame(rows)


def test_the_summary_quotes_each_point_s_level_at_its_server_s_start():
    summary = aggregate.summarize(_table(np.random.default_rng(6), -0.01))
    assert summary["ci_method"].str.contains(aggregate.AT_START, regex=False).all()
    assert len(summary.attrs["start_level"]["output_throughput"][0]) == len(summary)
    for _, row in summary.iterrows():
        true = {"b0": 1000.0, "b1": 2000.0, "b2": 500.0}[row["bench_id"]]
        assert row["output_throughput_ci_low"] <= true <= row["output_throughput_ci_high"]
        assert row["output_throughput_mean"] < row["output_throughput_ci_low"]   # the drifted mean is left out
        assert -1.2 < row["server_drift_pct_per_run"] < -0.8   # and the drift that was fitted out is said


def test_without_the_runs_order_the_summary_keeps_the_plain_interval():
    summary = aggregate.summarize(_table(np.random.default_rng(6), -0.01, with_order=False))
    assert (summary["ci_method"] == "t").all() and not summary.attrs["start_level"]
    centre = (summary["output_throughput_ci_low"] + summary["output_throughput_ci_high"]) / 2
    assert np.allclose(centre, summary["output_throughput_mean"])   # the t-interval of each point's mean


def test_a_point_on_two_server_starts_keeps_the_interval_of_its_mean():
    df = _table(np.random.default_rng(7), -0.01)
    df.loc[(df["serve_id"] == "s1") & (df["bench_id"] == "b0") & (df["run_number"] >= 3), "server_id"] = "s1-b"
    summary = aggregate.summarize(df)
    fitted = summary.attrs["start_level"]["output_throughput"][0]
    two = summary.index[(summary["serve_id"] == "s1") & (summary["bench_id"] == "b0")][0]
    assert math.isnan(fitted[two]) and sum(math.isfinite(x) for x in fitted) == len(summary) - 1
    assert aggregate.AT_START not in summary.loc[two, "ci_method"]   # each row says how its interval was made
    assert summary.drop(index=two)["ci_method"].str.contains(aggregate.AT_START, regex=False).all()


def test_the_precision_rule_s_reported_interval_is_of_the_level_at_the_start():
    from raysweep.maths.precision import PrecisionSpec
    from raysweep.results.precision import _widen_for_looks

    summary = aggregate.summarize(_table(np.random.default_rng(6), -0.01))
    out = summary.copy()
    _widen_for_looks(out, [True] * len(out), PrecisionSpec(metric="output_throughput", rel_half_width=0.05))
    level = np.asarray(summary.attrs["start_level"]["output_throughput"][0])
    low, high = out["output_throughput_ci_low"].to_numpy(), out["output_throughput_ci_high"].to_numpy()
    assert np.allclose((low + high) / 2, level)
    wider = (high - low) > (summary["output_throughput_ci_high"] - summary["output_throughput_ci_low"]).to_numpy()
    assert wider.all()   # at 97.5 %, the rule's reported level, on the same estimate

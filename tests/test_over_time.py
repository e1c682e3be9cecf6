"""raysweep.maths.over_time and its use: the trend test over a point's runs, Grubbs' outlier rule, the paired verdict,
families of verdicts, bounds judged on intervals; the summary's drift and outlier columns and bench.precision's
stopping rule on a drifting point. Synthetic data; the error rates are measured by
benchmarks/bench_verdicts.py (and its seeded quick version in tests/test_bench_verdicts.py)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from raysweep.maths import over_time, precision
from raysweep.record.directory import CampaignDir
from raysweep.results import aggregate


def test_the_demo_point_that_lost_15_percent_over_its_runs_drifts():
    # a real CPU demo point of 2026-11-28, every run of which passed its validity record
    t = over_time.trend([101.0, 100.1, 94.7, 90.1, 85.6])
    assert t.drifts and t.p_value == pytest.approx(0.0025, abs=0.001)
    assert t.pct_per_run == pytest.approx(-4.2, abs=0.2) and t.high < 0
    assert t.text.startswith("drifts -4.") and "over 5 runs" in t.text
    fit = stats.linregress(np.arange(5), [101.0, 100.1, 94.7, 90.1, 85.6])
    assert t.p_value == pytest.approx(fit.pvalue)


def test_stationary_runs_show_no_drift_and_too_few_are_not_judged():
    assert over_time.trend([100.0, 101.0, 99.5, 100.4, 99.8]).word == "no drift shown"
    short = over_time.trend([100.0, 90.0])
    assert short.word == "not judged" and short.text == "not judged: fewer than 3 runs with a value"
    assert over_time.trend([100.0, math.nan, 100.0, 100.0]).word == "no drift shown"


def test_one_slow_run_in_ten_is_an_outlier_and_a_normal_spread_has_none():
    rng = np.random.default_rng(5)
    v = list(1000 * (1 + 0.02 * rng.standard_normal(10)))
    v[6] *= 0.8
    o = over_time.outliers(v)
    assert o.mask == [i == 6 for i in range(10)] and o.deviation_pct < -15
    assert "run 6 of 10 is an outlier" in o.text
    assert over_time.outliers(list(1000 * (1 + 0.02 * rng.standard_normal(10)))).count == 0
    assert over_time.outliers([1.0, 2.0]).text.startswith("not judged")


def test_the_paired_verdict_removes_a_drift_common_to_both_arms():
    # a 5 % lead of B, both arms drifting down 3 % per block, little noise within a block
    rng = np.random.default_rng(2)
    blocks = np.arange(6)
    level = 1000 * (1 - 0.03 * blocks)
    a = level * (1 + 0.005 * rng.standard_normal(6))
    b = 1.05 * level * (1 + 0.005 * rng.standard_normal(6))
    v = over_time.paired_verdict(blocks, a, blocks, b)
    assert v.word == "better" and v.ratio == pytest.approx(1.05, abs=0.01)
    assert v.test == "paired t over 6 blocks"
    from raysweep.maths import verdicts

    assert verdicts.compare_values(a, b).word == "not shown"   # unpaired, the drift hides it
    two = over_time.paired_verdict([0, 1], a[:2], [0, 1], b[:2])
    assert two.word == "not shown" and "fewer than 3 pairs" in two.text
    none = over_time.paired_verdict([0, 1, 2], a[:3], [7, 8, 9], b[:3])
    assert none.word == "not judged"


def test_families_holm_and_benjamini_hochberg():
    p = [0.01, 0.02, 0.03, 0.5, math.nan]
    holm = over_time.adjust(p, "holm")
    assert holm.adjusted[:4] == pytest.approx([0.04, 0.06, 0.06, 0.5]) and math.isnan(holm.adjusted[4])
    bh = over_time.adjust(p, "bh")
    assert bh.adjusted[:4] == pytest.approx(list(stats.false_discovery_control([0.01, 0.02, 0.03, 0.5])))
    assert bh.text == "4 tests, false discovery rate (Benjamini-Hochberg) at 5%"


@pytest.mark.parametrize("low, high, op, word", [(400, 480, "<=", "met"), (480, 520, "<=", "not shown"),
                                                 (510, 600, "<=", "missed"), (10, 12, ">=", "met"),
                                                 (math.nan, 1, "<=", "not shown")])
def test_a_bound_is_met_only_when_the_whole_interval_is_inside(low, high, op, word):
    assert over_time.bound_verdict(low, high, op, 500 if op == "<=" else 9) == word


def _runs(values, started=None):
    n = len(values)
    return pd.DataFrame({"serve_id": "s", "bench_id": "b", "point_id": [f"p{i}" for i in range(n)],
                         "run_number": range(n), "max_concurrency": 4, "output_throughput": values,
                         "started_at": started if started is not None else [100.0 * i for i in range(n)],
                         "validity_ok": True, "validity_issues": ""})


def test_the_summary_flags_a_drifting_point_and_leaves_an_outlier_run_out():
    drifting = aggregate.summarize(_runs([101.0, 100.1, 94.7, 90.1, 85.6])).iloc[0]
    assert drifting["drift"] == "drifts" and drifting["drift_pct_per_run"] < -3
    assert drifting["outlier_text"] == "not judged: the runs drift" and drifting["runs"] == 5
    # the runs' order is their start time, not their run number
    shuffled = aggregate.summarize(_runs([85.6, 101.0, 90.1, 100.1, 94.7], [400.0, 0.0, 300.0, 100.0, 200.0]))
    assert shuffled.iloc[0]["drift"] == "drifts"
    rng = np.random.default_rng(1)
    v = list(1000 * (1 + 0.01 * rng.standard_normal(8)))
    v[3] *= 0.8
    s = aggregate.summarize(_runs(v)).iloc[0]
    assert s["runs"] == 7 and s["runs_left_out"] == 1 and "outlier run 1" in s["left_out_reasons"]
    assert s["output_throughput_mean"] == pytest.approx(np.mean(np.delete(v, 3)))


def test_many_points_outliers_at_once_are_the_rule_of_one():
    rng = np.random.default_rng(4)
    sizes = rng.integers(2, 12, size=300)
    groups = np.repeat(np.arange(sizes.size), sizes)
    values = 100 * (1 + 0.02 * rng.standard_normal(groups.size))
    values[rng.random(groups.size) < 0.05] *= 0.8   # some slow runs
    values[groups == 7] = 50.0                        # a group whose runs do not differ
    got = over_time.outlier_runs(values, groups, sizes.size)
    for g in range(sizes.size):
        assert got[groups == g].tolist() == over_time.outliers(values[groups == g]).mask, g
    assert got.sum() > 5


def test_an_outlier_in_one_metric_leaves_that_value_out_of_that_metric_only():
    rng = np.random.default_rng(1)
    df = _runs(list(1000 * (1 + 0.01 * rng.standard_normal(8))))
    df["p99_ttft_ms"] = 50 * (1 + 0.01 * rng.standard_normal(8))
    df.loc[5, "p99_ttft_ms"] *= 3                      # one run's tail, not its throughput
    s = aggregate.summarize(df).iloc[0]
    assert s["outlier_metrics"] == "p99_ttft_ms" and s["runs"] == 8 and s["runs_left_out"] == 0
    assert s["p99_ttft_ms_mean"] == pytest.approx(df["p99_ttft_ms"].drop(5).mean())
    assert s["output_throughput_mean"] == pytest.approx(df["output_throughput"].mean())
    calm = aggregate.summarize(_runs(list(1000 * (1 + 0.01 * rng.standard_normal(8))))).iloc[0]
    assert calm["outlier_metrics"] == ""


def test_a_point_on_several_server_starts_is_tested_for_drift_on_its_start_means():
    rng = np.random.default_rng(12)

    def starts(step: float, effects: np.ndarray) -> pd.DataFrame:   # 10 starts x 2 runs, in order
        v = [1000 * (1 + step * b) * e * (1 + 0.005 * rng.standard_normal()) for b, e in enumerate(effects)
             for _ in range(2)]
        df = _runs(v)
        return df.assign(server_id=[f"s{i // 2}" for i in range(len(v))])

    # start effects that happen to rise from the first starts to the last: its runs' test on 20 runs reads a
    # drift, the 10 start means' test does not
    effects = np.array([1.01, 0.95, 1.05, 0.94, 0.93, 1.03, 1.08, 1.08, 1.08, 1.02])
    calm = aggregate.summarize(starts(0.0, effects)).iloc[0]
    assert over_time.trend(starts(0.0, effects)["output_throughput"].tolist()).p_value < 0.05
    assert calm["drift"] == "no drift shown" and calm["output_throughput_drift_p"] > 0.05
    assert calm["drift_text"].endswith("over the means of 10 server starts)")
    assert calm["outlier_text"] == "not judged: runs of 10 server starts (their spread is the model's)"
    falling = aggregate.summarize(starts(-0.02, np.ones(10))).iloc[0]
    assert falling["drift"] == "drifts" and falling["output_throughput_drift_p"] < 0.001
    assert falling["drift_pct_per_run"] < -0.5


def test_a_drifting_point_is_never_reached_by_the_precision_rule_and_says_so():
    spec = precision.PrecisionSpec(metric="output_throughput", rel_half_width=0.05, min_runs=3, max_runs=6)
    values = [100.0, 98.6, 97.0, 95.5, 94.1]   # narrow enough, but falling 1.5 % a run
    d = precision.decide(values, 5, spec)
    assert d.state == "measuring" and d.drift.startswith("drifts")
    assert "never reached while they do" in d.text(spec)
    d6 = precision.decide([*values, 92.6], 6, spec)
    assert d6.state == "max_runs" and d6.text(spec).endswith("stopped at max_runs")


def test_the_rules_state_in_words_quotes_the_intervals_it_read():
    spec = precision.PrecisionSpec(metric="output_throughput", rel_half_width=0.05, min_runs=3, max_runs=5)
    values = [100.0, 108.0, 93.0, 104.0, 97.0]
    d = precision.decide(values, 5, spec)
    from raysweep.maths.verdicts import relative_half_width

    w5, w4 = (relative_half_width(values[:n], 0.975) for n in (5, 4))
    assert d.state == "max_runs"
    assert d.text(spec) == ("95 % interval (widened for the rule's looks: t at 97.5 %) of output_throughput's mean: "
                            f"+-{100 * w5:.1f} % at run 5, "
                            f"+-{100 * w4:.1f} % at run 4: the rule needs 2 successive runs within +-5.0 %; "
                            "stopped at max_runs")


def _side(blocks, rounds, starts, length=30.0):
    return pd.DataFrame({"block": blocks, "round": rounds, "started_at": starts,
                         "ended_at": [t + length for t in starts]})


def test_runs_pair_only_where_they_were_measured_side_by_side():
    # configurations measured at once: each run of A overlaps B's run of the same block and round
    a = _side([0, 0, 1, 1], [0, 1, 2, 3], [0.0, 40.0, 80.0, 120.0])
    b = _side([0, 0, 1, 1], [0, 1, 2, 3], [5.0, 45.0, 85.0, 125.0])
    what, ka, kb = over_time.pairs(a, b)
    assert what == "runs measured at once" and ka == ["0/0", "0/1", "1/2", "1/3"] and ka == kb
    # one after another in AB BA blocks of server starts: the blocks pair
    b_later = _side([0, 0, 1, 1], [0, 1, 2, 3], [60.0, 70.0, 300.0, 310.0])
    assert over_time.pairs(a, b_later)[0] == "blocks"
    # the default order (every run in block 0): one block, no pairs; nor across campaigns of other days
    one = _side([0] * 4, [0, 1, 2, 3], [200.0, 240.0, 280.0, 320.0])
    assert over_time.pairs(_side([0] * 4, [0, 1, 2, 3], [0.0, 40.0, 80.0, 120.0]), one) is None
    assert over_time.pairs(a, _side([0, 0, 1, 1], [0, 1, 2, 3], [1e6, 1e6 + 40, 1e6 + 80, 1e6 + 120])) is None
    assert over_time.pairs(a.drop(columns="block"), b) is None


def _summary_side(name, means, std=10.0, runs=5):
    from pathlib import Path

    from raysweep.results import compare

    # each run on a server start of its own: the model's standard error is that of the runs' mean
    df = pd.DataFrame({"max_concurrency": [2 ** i for i in range(len(means))], "runs": runs, "server_starts": runs,
                       "output_throughput_mean": means, "output_throughput_std": std,
                       "output_throughput_se": std / np.sqrt(runs), "output_throughput_df": runs - 1})
    return compare.Side(name, Path(name), df, ["max_concurrency"])


def test_compare_controls_its_verdicts_as_one_family_and_says_how_many_it_tested():
    from raysweep.maths import hierarchy
    from raysweep.results import compare

    base = _summary_side("a", [1000.0] * 6)
    # one load far ahead (p ~ 1e-6), one just under 5 % alone (p ~ 0.04), four alike: one family of 6 tests
    other = _summary_side("b", [1060.0, 1015.5, 1000.0, 1000.0, 1000.0, 1000.0])
    alone = hierarchy.compare(hierarchy.Estimate(1000.0, 10.0 / np.sqrt(5), 4, 5, 5),
                              hierarchy.Estimate(1015.5, 10.0 / np.sqrt(5), 4, 5, 5)).p_value
    assert 0.02 < alone < 0.05
    cmp = compare.compare(base, other, ["max_concurrency"], ["output_throughput"])
    words = list(cmp.table["output_throughput_verdict"])
    assert words == ["better"] + ["not shown"] * 5
    assert cmp.family is not None and cmp.family.tested == 6
    assert compare.family_text(cmp) == ("t over server starts, 6 tests, false discovery rate (Benjamini-Hochberg) "
                                        "at 5%")
    assert (cmp.table["output_throughput_p_adjusted"] >= cmp.table["output_throughput_p"]).all()


def test_compare_tests_start_means_and_a_shared_drift_stays_in_their_spread():
    from pathlib import Path

    from raysweep.results import aggregate, compare

    # A and B, 6 server starts each measured at the same moments, while the machine slows 3 % a start: B's
    # 3 % lead is within the spread the drift gives the start means, so it is not shown (never a false green)
    rng = np.random.default_rng(9)
    rows = []
    for sid, level in (("A", 1000.0), ("B", 1030.0)):
        for r in range(6):
            t = 100.0 * r + (5.0 if sid == "B" else 0.0)
            rows.append({"serve_id": sid, "bench_id": "c8", "point_id": f"{sid}{r}", "run_number": r, "round": r,
                         "server_id": f"{sid}-{r}", "max_concurrency": 8, "started_at": t, "ended_at": t + 60.0,
                         "output_throughput": level * (1 - 0.03 * r) * (1 + 0.002 * rng.standard_normal())})
    df = pd.DataFrame(rows)
    sides = [compare.Side(s, Path(s), aggregate.summarize(df[df.serve_id == s], params=["max_concurrency"]),
                          ["max_concurrency"], df[df.serve_id == s]) for s in ("A", "B")]
    cmp = compare.compare(sides[0], sides[1], ["max_concurrency"], ["output_throughput"])
    assert cmp.table.at[0, "output_throughput_test"] == "t over server starts"
    assert cmp.table.at[0, "output_throughput_verdict"] == "not shown"
    assert cmp.table.at[0, "output_throughput_ratio_low"] < 1.0 < cmp.table.at[0, "output_throughput_ratio_high"]


def test_crosscheck_judges_its_alternating_clients_in_pairs():
    # the server's pace drifts 4 % a round; the clients differ by 1 %: in pairs equivalent within 5 %, unpaired
    # the drift's spread leaves it not shown
    from raysweep.drive import crosscheck

    runs = []
    for rnd in range(5):
        pace = 1000.0 * (1 - 0.04 * rnd)
        for tool, f in (("native", 1.01), ("vllm", 1.0)):
            runs.append({"tool": tool, "round": rnd, "bench_id": "b", "ok": True, "output_throughput": pace * f})
    row = next(r for r in crosscheck.compare(runs, crosscheck.Tolerances(0.05, 0.10))
               if r.metric == "output_throughput")
    assert row.word == "equivalent" and row.ratio == pytest.approx(1.01)
    unpaired = [dict(r, round=None) for r in runs]
    row = next(r for r in crosscheck.compare(unpaired, crosscheck.Tolerances(0.05, 0.10))
               if r.metric == "output_throughput")
    assert row.word == "not shown"


def test_a_servers_timeline_drifts_where_its_points_each_cannot_show_it():
    # 6 points x 3 runs in rounds, the machine slowing 0.5 % a run slot: each point's 3 runs cannot show it,
    # the server's 18 runs in time order do
    rng = np.random.default_rng(11)
    points = [f"b{p}" for r in range(3) for p in range(6)]
    level = {f"b{p}": 100.0 * (p + 1) for p in range(6)}
    values = [level[b] * (1 - 0.005 * i) * (1 + 0.002 * rng.standard_normal()) for i, b in enumerate(points)]
    t = over_time.timeline(points, values)
    assert t.drifts and t.pct_per_run == pytest.approx(-0.5, abs=0.15)
    flat = [level[b] * (1 + 0.002 * rng.standard_normal()) for b in points]
    assert over_time.timeline(points, flat).word == "no drift shown"
    assert over_time.timeline(["a", "b"], [1.0, 2.0]).word == "not judged"


def test_the_report_shows_where_the_runs_drift(tmp_path):
    from test_plots import build_output_dir

    from raysweep.record.files import write_json_atomic
    from raysweep.report import page as report

    out = build_output_dir(tmp_path / "out")
    paths = sorted((out / "points").rglob("run=*.json"))
    for i, path in enumerate(paths):   # one after another, the first point's runs falling 10 % a run
        rec = json.loads(path.read_text())
        rec["started_at"] = 1000.0 + 60.0 * i
        write_json_atomic(path, rec)
    html = report.build_report(CampaignDir(out), objective="output_throughput")
    part = html[html.index('id="drift"'):html.index('id="figures"')]
    assert "Runs over time" in part and "point(s) judged drift" in part
    assert "Over each server&#x27;s timeline" in part or "Over each server's timeline" in part
    assert "<img" in part

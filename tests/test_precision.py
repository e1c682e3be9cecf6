"""bench.precision: the stopping rule, its bad input, and the runs it adds to a point exactly once (ledger,
resume, dry run, estimate)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from helpers import standin_campaign
from scipy import stats

from raysweep.campaign import load_campaign
from raysweep.cli import main
from raysweep.drive import sequential
from raysweep.drive.state import RunState
from raysweep.errors import CampaignError
from raysweep.ledger import LEDGER_FILE, Ledger
from raysweep.maths import precision
from raysweep.maths.precision import (
    AT_DURATION,
    AT_MAX,
    MEASURING,
    PrecisionSpec,
    decide,
    expected_runs,
    most_runs,
    reported_confidence,
    runs_to_reach,
)
from raysweep.plan.estimate import estimate, precision_runs
from raysweep.plan.plan import build_plan, dry_run_text, point_id
from raysweep.record.directory import CampaignDir
from raysweep.results.importer import read_table
from raysweep.results.precision import REACHED

SPEC = PrecisionSpec(metric="output_throughput", rel_half_width=0.03, min_runs=3, max_runs=6)


def test_decide_reached_measuring_and_max_runs():
    assert decide([100.0, 100.5, 99.5, 100.2], 4, SPEC).state == REACHED
    # narrow at its first look (3 values) but not yet confirmed by a second one: one more run
    assert decide([100.0, 100.5, 99.5], 3, SPEC).state == MEASURING
    # narrow at 4 values after a wide look at 3: not two successive narrow looks yet
    assert decide([100.0, 102.0, 99.0, 100.0], 4, SPEC).state == MEASURING
    wide = decide([100.0, 120.0, 80.0], 3, SPEC)
    assert wide.state == MEASURING and wide.wants_more and wide.rel_half_width > 0.03
    assert decide([100.0, 120.0, 80.0, 110.0, 90.0, 100.0], 6, SPEC).state == AT_MAX
    # narrow but fewer than min_runs values: a failed run spent a run number without a value
    assert decide([100.0, 100.5], 3, SPEC).state == MEASURING
    assert decide([100.0, 100.5], 6, SPEC).state == AT_MAX


def test_max_duration_stops_adding_runs_once_the_runs_measured_that_long():
    spec = SPEC.model_copy(update={"max_duration_s": 25.0})
    wide = [100.0, 120.0, 80.0]
    assert decide(wide, 3, spec, seconds=24.9).state == MEASURING  # under the budget: one more run
    assert decide(wide, 3, spec, seconds=25.0).state == AT_DURATION
    assert decide([100.0, 100.5, 99.5, 100.2], 4, spec, seconds=40.0).state == REACHED  # reached says reached
    assert decide(wide + [110.0, 90.0, 100.0], 6, spec, seconds=60.0).state == AT_MAX  # max_runs first
    assert decide(wide, 3, SPEC, seconds=1e9).state == MEASURING  # no budget: seconds do not count
    # the most runs: the run that reaches the budget still runs, min_runs always do
    assert [most_runs(spec, s) for s in (10.0, 12.5, 5.0, 1.0, None)] == [3, 3, 5, 6, 6]
    assert expected_runs([100.0, 150.0, 50.0], spec, run_s=10.0) == 3
    assert "3 to 6 run(s) per point, or 25 s of measured runs, until" in precision.describe(spec)


def test_the_reported_interval_is_wider_for_the_sequential_looks_and_covers_by_simulation():
    """The one interval of a stopped point's precision metric, the one the rule judges (its t quantile at
    `reported_confidence`, 97.5 % for 95 %), covers the true mean at least 93 % of the time at the noisiest
    level bench_verdicts --precision simulates, and more often than a plain 95 % interval of the same runs."""
    from raysweep.maths.verdicts import mean_interval

    spec = PrecisionSpec(metric="output_throughput", rel_half_width=0.03, min_runs=3, max_runs=12)
    assert reported_confidence(spec) == pytest.approx(0.975)
    rng = np.random.default_rng(11)
    covered = plain = 0
    for _ in range(600):
        values = [float(v) for v in rng.normal(100.0, 4.0, spec.min_runs)]
        while decide(values, len(values), spec).wants_more:
            values.append(float(rng.normal(100.0, 4.0)))
        _, low, high = mean_interval(values, reported_confidence(spec))
        covered += low <= 100.0 <= high
        _, low, high = mean_interval(values, spec.confidence)
        plain += low <= 100.0 <= high
    assert covered / 600 >= 0.93 and covered > plain, (covered, plain)


def test_expected_runs_grows_with_the_spread():
    assert expected_runs([], SPEC) == 4  # no spread known yet: the fewest the rule allows
    assert expected_runs([100.0, 100.5, 99.5], SPEC) == 4  # narrow at 3 runs, confirmed at 4
    assert expected_runs([100.0, 104.0, 96.0], SPEC) in (5, 6)
    assert expected_runs([100.0, 150.0, 50.0], SPEC) == 6


def _campaign(tmp_path: Path, precision: dict | None = None, **fields) -> Path:
    f = standin_campaign(tmp_path, **fields)
    data = yaml.safe_load(f.read_text())
    data.pop("runs")
    data["bench"]["precision"] = precision if precision is not None else {
        "metric": "output_throughput", "rel_half_width": 0.03, "min_runs": 3, "max_runs": 6}
    f.write_text(yaml.safe_dump(data))
    return f


@pytest.mark.parametrize("precision, field, says", [
    ({"metric": "output_thruput", "rel_half_width": 0.03}, "bench.precision.metric", "did you mean output_throughput"),
    ({"metric": "p101_ttft_ms", "rel_half_width": 0.03}, "bench.precision.metric", "0 < NN < 100"),
    ({"metric": "output_throughput", "rel_half_width": 0}, "bench.precision.rel_half_width", "greater than 0"),
    ({"metric": "output_throughput", "rel_half_width": -0.1}, "bench.precision.rel_half_width", "greater than 0"),
    ({"metric": "output_throughput", "rel_half_width": 0.03, "min_runs": 1}, "bench.precision.min_runs", "2"),
    ({"metric": "output_throughput", "rel_half_width": 0.03, "min_runs": 5, "max_runs": 4}, "bench.precision",
     "max_runs (4) must be at least min_runs (5)"),
    ({"metric": "output_throughput", "rel_half_width": 0.03, "max_run": 4}, "bench.precision", "max_run"),
    ({"metric": "output_throughput", "rel_half_width": 0.03, "max_duration_s": 0}, "bench.precision.max_duration_s",
     "greater than 0"),
    ({"metric": "output_throughput", "rel_half_width": 0.03, "max_duration_s": -30}, "bench.precision.max_duration_s",
     "greater than 0"),
])
def test_bad_precision_is_refused_naming_the_field(tmp_path, precision, field, says):
    f = _campaign(tmp_path, precision)
    with pytest.raises(CampaignError) as err:
        load_campaign(f)
    assert err.value.field.startswith(field) and says in str(err.value)
    res = CliRunner().invoke(main, ["run", str(f)])
    assert res.exit_code == 2 and field in res.output
    assert not (tmp_path / "out").exists()  # nothing started, nothing written


def test_precision_refuses_runs_and_sla(tmp_path):
    f = _campaign(tmp_path)
    data = yaml.safe_load(f.read_text())
    f.write_text(yaml.safe_dump({**data, "runs": 5}))
    with pytest.raises(CampaignError, match="^runs: 5 cannot be used with bench.precision"):
        load_campaign(f)
    data["bench"].update(backend="native", cmd="vllm bench serve --model m --num-prompts 10")
    f.write_text(yaml.safe_dump({**data, "sla": {"targets": [{"p99_ttft_ms": "<=100"}]}}))
    with pytest.raises(CampaignError, match="^bench.precision: cannot be used with `sla:`"):
        load_campaign(f)


def _work(tmp_path: Path, **precision) -> RunState:
    f = _campaign(tmp_path, {"metric": "output_throughput", "rel_half_width": 0.03, "min_runs": 3, "max_runs": 5,
                             **precision}, bench_params={"grid": {"random_input_len": [16]}})
    plan = build_plan(load_campaign(f))
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    ledger = Ledger(out / LEDGER_FILE)
    sequential.restore_plan(plan, ledger)
    ledger.sync(name="t", fingerprint=plan.fingerprint, meaning={}, campaign={}, campaign_file="",
                points=[(p.id, p.serve.id, p.bench.id, p.run, p.serve.params, p.bench.params) for p in plan.points])
    events: list[tuple[str, dict]] = []
    run_dir = CampaignDir.around(out, ledger)
    work = RunState(plan, run_dir, lambda kind, **data: events.append((kind, data)), with_gpus=False)
    work.events = events  # type: ignore[attr-defined]
    return work


def _finish(work: RunState, run_id: str, value: float | None, duration: float = 1.0) -> None:
    """A run ends as a point runner ends it: claimed, its result file written, then done (or failed for good)."""
    assert work.ledger.claim(run_id, "s", work.c.max_attempts) is not None
    if value is None:
        work.ledger.give_up(run_id, "broken", work.c.max_attempts)
        return
    path = work.output_dir / f"{run_id}.json"
    path.write_text(json.dumps({"output_throughput": value, "duration": duration}))
    work.ledger.mark_done(run_id, path.name)


def test_runs_are_added_one_at_a_time_exactly_once_until_reached(tmp_path):
    work = _work(tmp_path)
    first = work.plan.points
    assert [p.run for p in first] == [0, 1, 2]
    serve, bench = first[0].serve, first[0].bench
    values = iter([100.0, 130.0, 70.0, 101.0, 99.0])
    for p in first[:2]:
        _finish(work, p.id, next(values))
        assert sequential.settle(work, serve, bench.id) is None  # runs still to end: nothing decided
    _finish(work, first[2].id, next(values))
    added = sequential.settle(work, serve, bench.id)
    assert added is not None and added.run == 3 and added.id == point_id(serve.id, bench.id, 3)
    # deciding again (another server of the config, a restarted driver) adds nothing more: the run is open
    assert sequential.settle(work, serve, bench.id) is None
    assert len(work.ledger.points()) == 4 and work.plan.point(added.id) is added
    assert work.ledger.precision()[0]["state"] == MEASURING
    _finish(work, added.id, next(values))
    fifth = sequential.settle(work, serve, bench.id)
    assert fifth is not None and fifth.run == 4
    _finish(work, fifth.id, next(values))
    assert sequential.settle(work, serve, bench.id) is None  # 5 runs: max_runs
    row = work.ledger.precision()[0]
    assert (row["state"], row["runs_done"], row["runs_spent"]) == (AT_MAX, 5, 5)
    assert [p.state for p in work.ledger.points()] == ["done"] * 5
    assert work.events[-1][0] == "precision" and work.events[-1][1]["state"] == AT_MAX  # type: ignore[attr-defined]


def test_a_narrow_point_stops_early_and_a_failed_run_counts_against_max(tmp_path):
    work = _work(tmp_path, max_runs=6)
    pts = work.plan.points
    for p, v in zip(pts, (100.0, 100.2, None)):
        _finish(work, p.id, v)
    serve, bench_id = pts[0].serve, pts[0].bench.id
    for run, value in ((3, 99.9), (4, 100.1)):  # 2 values, then 3 (a first narrow look): a run added each time
        added = sequential.settle(work, serve, bench_id)
        assert added is not None and added.run == run
        _finish(work, added.id, value)
    assert sequential.settle(work, serve, bench_id) is None  # a second narrow look at 4 values: reached
    row = work.ledger.precision()[0]
    assert (row["state"], row["runs_done"], row["runs_spent"]) == (REACHED, 4, 5)
    assert len(work.ledger.points()) == 5


def test_resume_keeps_added_runs_and_decides_what_a_dead_driver_left(tmp_path):
    work = _work(tmp_path)
    serve, bench = work.plan.points[0].serve, work.plan.points[0].bench
    for p, v in zip(work.plan.points, (100.0, 130.0, 70.0)):
        _finish(work, p.id, v)
    added = sequential.settle(work, serve, bench.id)
    assert added is not None
    _finish(work, added.id, 100.0)  # the driver dies here, before deciding
    work.ledger.close()
    again = _work(tmp_path)  # a new driver: the plan from the file, the added run from the ledger
    assert [p.run for p in again.plan.points] == [0, 1, 2, 3]
    assert {p.point_id for p in again.ledger.points()} == {p.id for p in again.plan.points}  # all in the plan
    assert sequential.settle_all(again) == 1
    runnable = again.ledger.runnable(serve.id, again.c.max_attempts)
    assert [r.run for r in runnable] == [4]  # only the new run: nothing done runs again
    assert sequential.settle_all(again) == 0


def test_max_duration_is_decided_from_the_runs_durations_and_a_resume_keeps_it(tmp_path):
    work = _work(tmp_path, max_duration_s=25.0)
    serve, bench = work.plan.points[0].serve, work.plan.points[0].bench
    for p, v in zip(work.plan.points, (100.0, 130.0, 70.0)):
        _finish(work, p.id, v, duration=10.0)   # 30 s measured: over the budget after min_runs
    assert sequential.settle(work, serve, bench.id) is None  # wide, but no run added
    row = work.ledger.precision()[0]
    assert (row["state"], row["runs_done"], row["runs_spent"]) == (AT_DURATION, 3, 3)
    assert work.events[-1][1]["state"] == AT_DURATION  # type: ignore[attr-defined]
    work.ledger.close()
    again = _work(tmp_path, max_duration_s=25.0)  # a new driver decides the same, and adds nothing
    assert sequential.settle_all(again) == 0 and again.ledger.precision()[0]["state"] == AT_DURATION
    again.ledger.close()
    longer = _work(tmp_path, max_duration_s=35.0)  # a larger budget: the point continues its count
    added = sequential.settle_all(longer)
    assert added == 1 and [r.run for r in longer.ledger.runnable(serve.id, longer.c.max_attempts)] == [3]
    # the estimate's most runs per point: what the budget allows at the seconds a run takes
    pair = (serve.id, bench.id)
    assert precision_runs(longer.plan, decided=set(), most=True, run_s={pair: 20.0}) == []  # 3 runs: 60 s
    assert precision_runs(longer.plan, most=True, run_s={pair: 9.0}) == []  # run 3 in the plan: 4 runs reach 35 s
    assert [p.run for p in precision_runs(longer.plan, most=True, run_s={pair: 5.0})] == [4]  # max_runs 5 first
    assert "or 35 s of measured runs" in dry_run_text(longer.plan)


def test_dry_run_and_estimate_know_the_range_of_runs(tmp_path):
    work = _work(tmp_path)
    text = dry_run_text(work.plan)
    assert "x 3 to 5 run(s) = 3 run(s) to start with" in text
    assert ("Precision: 3 to 5 run(s) per point, until the 95 % interval (widened for the rule's looks: t at "
            "97.5 %) of output_throughput's mean is within") in text
    est = estimate(work.plan)
    assert est.points == 4 and est.most_points == 5 and est.most_wall_s > est.wall_s
    assert "at most 5 run(s)" in est.text()
    pair = (work.plan.points[0].serve.id, work.plan.points[0].bench.id)
    assert len(precision_runs(work.plan, {pair: [100.0, 110.0, 90.0]})) == 2  # a wide spread: to max_runs
    assert [p.run for p in precision_runs(work.plan, {pair: [100.0, 100.1, 99.9]})] == [3]  # the confirming run
    assert [p.run for p in precision_runs(work.plan)] == [3]  # nothing measured: the fewest runs the rule allows
    assert precision_runs(work.plan, decided={pair}, most=True) == []


def test_stopping_rule_coverage_by_simulation():
    """On points of mixed noise the sequential rule's 95 % intervals still cover the true mean at least 93 %
    of the time (benchmarks/bench_verdicts.py --precision measures it per noise level, with 2000 points each)."""
    from raysweep.maths.verdicts import mean_interval

    rng = np.random.default_rng(7)
    spec = PrecisionSpec(metric="output_throughput", rel_half_width=0.03, min_runs=3, max_runs=12)
    covered = total = 0
    for cv in (0.01, 0.02, 0.03, 0.04):
        for _ in range(300):
            values = [float(v) for v in rng.normal(100.0, 100.0 * cv, spec.min_runs)]
            while decide(values, len(values), spec).wants_more:
                values.append(float(rng.normal(100.0, 100.0 * cv)))
            _, low, high = mean_interval(values)
            covered, total = covered + (low <= 100.0 <= high), total + 1
    assert covered / total >= 0.93


@pytest.mark.timing
@pytest.mark.ray
def test_campaign_adds_runs_on_the_cluster_and_a_resume_continues_the_count(gpu_cluster, tmp_path):
    """On the stand-in server: every point stops at its second narrow look (a wide width); resumed with a
    width no point reaches, each point continues from its count to max_runs, and no finished run runs again.
    The stand-in reports the throughputs 100, 103, 97, 101, 99 for a point's runs in turn: measured ones
    once drifted on a loaded machine, and a drifting point is never reached."""
    from helpers import run_file

    from raysweep.results.aggregate import summary_table

    f = _campaign(tmp_path, {"metric": "request_throughput", "rel_half_width": 0.99, "min_runs": 3, "max_runs": 5},
                  bench_params={"grid": {"random_input_len": [16, 32]}},
                  bench_args=f"--report-throughput 100,103,97,101,99 --count-file {tmp_path / 'calls'}")
    summary, out = run_file(f)
    assert summary.counts == {"pending": 0, "running": 0, "done": 8, "failed": 0}
    led = Ledger.open_existing(out)
    first = {p.point_id: p.attempts for p in led.points()}
    assert sorted(p.run for p in led.points()) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all(p.point_id == point_id(p.serve_id, p.bench_id, p.run) for p in led.points())
    assert [(r["state"], r["runs_done"]) for r in led.precision()] == [(REACHED, 4)] * 2
    led.close()
    data = yaml.safe_load(f.read_text())
    data["bench"]["precision"]["rel_half_width"] = 1e-9  # no point reaches it: each runs on to max_runs
    f.write_text(yaml.safe_dump(data))
    summary, out = run_file(f)
    assert summary.counts == {"pending": 0, "running": 0, "done": 10, "failed": 0}
    led = Ledger.open_existing(out)
    assert sorted(p.run for p in led.points()) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert all(p.attempts == 1 for p in led.points()) and all(first[k] == 1 for k in first)
    assert [(r["state"], r["runs_done"], r["runs_spent"]) for r in led.precision()] == [(AT_MAX, 5, 5)] * 2
    led.close()
    table = summary_table(CampaignDir(out))
    assert list(table["precision_state"]) == [AT_MAX] * 2 and not table["precision_reached"].any()
    assert list(table["runs"]) == [5, 5]
    # the precision metric's interval at the confidence raised for the sequential looks (97.5 %)
    assert list(table["precision_confidence"]) == [pytest.approx(0.975)] * 2
    m = "request_throughput"
    # the resume started each configuration's server again: 2 server starts (4 runs and 1), and the interval
    # shown is the model's over those starts (t on 1 degree of freedom), at the rule's level
    runs = read_table(out).df
    assert list(table["server_starts"]) == [2, 2]
    for (_, row), (_, mine) in zip(table.iterrows(), runs.groupby("bench_id", sort=True), strict=True):
        means = mine.groupby("server_id")[m].mean().to_numpy()
        assert row[f"{m}_mean"] == pytest.approx(means.mean())
        half = stats.t.ppf(0.9875, 1) * means.std(ddof=1) / np.sqrt(2)
        assert row[f"{m}_ci_high"] - row[f"{m}_mean"] == pytest.approx(half)
        assert row[f"{m}_ci_level"] == pytest.approx(0.975) and row["ci_level"] == pytest.approx(0.95)
    # the rule's last look, as the ledger records it, is over the point's runs as they came
    spec = PrecisionSpec.model_validate(data["bench"]["precision"])
    rule = stats.t.ppf(0.9875, 4) * table[f"{m}_std"] / np.sqrt(5) / runs.groupby("bench_id")[m].mean().to_numpy()
    assert np.allclose(table["precision_rel_half_width"].astype(float), rule)
    assert list(table["runs_needed"]) == [runs_to_reach(cv, spec) for cv in table[f"{m}_cv"]]
    assert all(n > 5 for n in table["runs_needed"])  # a width no point reaches: more than its 5 runs
    res = CliRunner().invoke(main, ["status", str(out)])
    assert "0 point(s) reached it, 2 stopped at max_runs without it, 0 measuring" in res.output
    summary, _ = run_file(f)  # a third run: nothing left, nothing runs again
    assert summary.counts["done"] == 10
    led = Ledger.open_existing(out)
    assert all(p.attempts == 1 for p in led.points())
    led.close()
    # a time budget the points have already measured: with room for more runs, none is added (max_duration)
    data["bench"]["precision"].update(max_runs=8, max_duration_s=0.001)
    f.write_text(yaml.safe_dump(data))
    summary, _ = run_file(f)
    assert summary.counts["done"] == 10
    led = Ledger.open_existing(out)
    assert [(r["state"], r["runs_spent"]) for r in led.precision()] == [(AT_DURATION, 5)] * 2
    led.close()
    assert "2 at max_duration_s without it" in CliRunner().invoke(main, ["status", str(out)]).output
    assert list(summary_table(CampaignDir(out))["precision_state"]) == [AT_DURATION] * 2


def test_the_summary_reports_a_decided_points_interval_at_the_raised_confidence():
    import pandas as pd

    from raysweep.results.precision import _widen_for_looks

    spec = PrecisionSpec(metric="request_throughput", rel_half_width=0.5)
    # the model's estimate of each point (`M_se`, `M_df`: here one start of 5, 1 and 4 runs)
    table = pd.DataFrame({"runs": np.array([5, 1, 4]), "request_throughput_mean": [10.0, 10.0, 10.0],
                          "request_throughput_std": [1.0, np.nan, 2.0], "request_throughput_ci_low": [9.0, np.nan, 8.0],
                          "request_throughput_ci_high": [11.0, np.nan, 12.0], "ci_level": 0.95,
                          "request_throughput_se": [1.0 / np.sqrt(5), np.nan, 1.0],
                          "request_throughput_df": [4.0, np.nan, 3.0]})
    _widen_for_looks(table, [True, True, False], spec)
    half = stats.t.ppf(0.9875, 4) / np.sqrt(5)
    assert table["request_throughput_ci_low"][0] == pytest.approx(10.0 - half)
    assert table["request_throughput_ci_high"][0] == pytest.approx(10.0 + half)
    # one run has no interval, and a point without a decision keeps the summary's own
    assert np.isnan(table["request_throughput_ci_low"][1]) and table["request_throughput_ci_high"][2] == 12.0
    assert list(table["precision_confidence"].fillna(0)) == [pytest.approx(0.975), 0, 0]
    # the level printed is the level used: the metric's own beside the summary's
    assert list(table["request_throughput_ci_level"]) == [pytest.approx(0.975), 0.95, 0.95]

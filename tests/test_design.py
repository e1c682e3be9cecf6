"""The design of a campaign that asks for verdicts (raysweep.plan.design, `design:`): the starts and runs per start
chosen from the spreads and costs, the pilot where nothing is known, the plan and the driver's interleaved blocks it
becomes, what the dry run, the estimate and `validate` say of it, its bad input, and the confirmation's `auto`
held to its stated share of the sweep."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from helpers import finish_runnable, plan_workload, standin_campaign
from scipy import stats

from raysweep.campaign import load_campaign
from raysweep.campaign.design import DesignSpec
from raysweep.cli import main
from raysweep.confirm.estimate import confirm_cost, confirm_pairs
from raysweep.drive.state import RunState
from raysweep.errors import CampaignError
from raysweep.plan import design as d
from raysweep.plan.design import choose, components, design_of
from raysweep.plan.estimate import estimate
from raysweep.plan.plan import build_plan, dry_run_text
from raysweep.record.directory import CampaignDir

TWO_SERVES = {"grid": {"max_num_seqs": [4, 8]}}
TWO_LOADS = {"grid": {"max_concurrency": [2, 4]}}


def _campaign(tmp_path: Path, design=None, **fields) -> Path:
    f = standin_campaign(tmp_path, serve_params=fields.pop("serve_params", TWO_SERVES),
                         bench_params=fields.pop("bench_params", TWO_LOADS), **fields)
    data = yaml.safe_load(f.read_text())
    if design is not None:
        data["design"] = design
        data.pop("runs", None)
    f.write_text(yaml.safe_dump(data))
    return f


# -- the allocation, pure ------------------------------------------------------------------------------------

def test_runs_per_start_follow_the_spreads_and_the_costs_of_a_start_and_a_run():
    # Kalibera and Jones: n = sqrt((C / c) * (r^2 / s^2))
    assert d.runs_per_start(0.09, 0.03, 60.0, 10.0, 5) == 1  # starts vary most: one run each, more starts
    assert d.runs_per_start(0.02, 0.06, 60.0, 10.0, 10) == round(math.sqrt(6 * 9)) == 7  # runs vary most, starts dear
    assert d.runs_per_start(0.02, 0.06, 60.0, 10.0, 5) == 5  # at most max_runs_per_start
    assert d.runs_per_start(0.05, 0.05, 10.0, 10.0, 5) == 1  # the same spread, the same cost
    assert d.runs_per_start(0.05, 0.05, 400.0, 1.0, 50) == 20  # a dear start buys more runs on it
    assert d.runs_per_start(0.0, 0.05, 60.0, 10.0, 4) == 4 and d.runs_per_start(0.05, 0.0, 60.0, 10.0, 4) == 1


def test_the_starts_are_the_fewest_whose_interval_reaches_the_precision_asked():
    k, hw, capped = d.starts_for(0.09, 0.03, 1, 0.10, 0.95, 3, 16)
    assert (k, capped) == (6, False) and hw <= 0.10 < d.half_width(0.09, 0.03, k - 1, 1, 0.95)
    assert d.starts_for(0.01, 0.01, 1, 0.10, 0.95, 3, 16)[0] == 3  # at least 3
    k, hw, capped = d.starts_for(0.20, 0.05, 1, 0.05, 0.95, 3, 6)
    assert k == 6 and capped and hw > 0.05
    assert d.half_width(0.09, 0.03, 1, 1, 0.95) == math.inf


def test_the_interval_of_the_design_covers_a_configurations_value_as_it_says():
    rng = np.random.default_rng(5)
    start_cv, run_cv, k, n = 0.08, 0.04, 4, 2
    hw = d.half_width(start_cv, run_cv, k, n, 0.95)  # the expected half-width: t over starts
    starts = 1 + start_cv * rng.standard_normal((4000, k, 1))
    values = starts + run_cv * rng.standard_normal((4000, k, n))
    means = values.mean(axis=2)  # each start's mean
    mean = means.mean(axis=1)
    half = stats.t.ppf(0.975, k - 1) * means.std(axis=1, ddof=1) / math.sqrt(k)
    assert 0.935 <= np.mean(np.abs(mean - 1) <= half) <= 0.965  # t over starts holds the value 95 % of the time
    assert np.median(half) == pytest.approx(hw, rel=0.15)  # and is as wide as the design said


def test_the_lead_the_design_quotes_is_shown_that_often():
    rng = np.random.default_rng(11)
    start_cv, run_cv, k, n = 0.08, 0.03, 3, 1
    lead = d.detectable_lead(start_cv, run_cv, k, n)
    sd = math.sqrt(start_cv ** 2 + run_cv ** 2 / n)
    a = 1 + sd * rng.standard_normal((4000, k))
    b = 1 + lead + sd * rng.standard_normal((4000, k))
    t = (b.mean(axis=1) - a.mean(axis=1)) / np.sqrt(b.var(axis=1, ddof=1) / k + a.var(axis=1, ddof=1) / k)
    shown = np.abs(t) > stats.t.ppf(0.975, d.test_df(k))  # 3 starts a side: Hsu's 2 degrees of freedom
    assert 0.77 <= shown.mean() <= 0.85 and 0.3 < lead < 0.5
    assert d.detectable_lead(start_cv, run_cv, 6, n) < 0.2 < lead  # more starts, a smaller lead shown
    assert d.test_df(3) == 2 and d.test_df(6) == 10


def test_auto_chooses_from_the_spreads_and_a_pilot_where_they_are_not_known():
    pilot = choose(DesignSpec(), start_s=24.0, run_s=10.0, points=2)
    assert (pilot.starts, pilot.runs_per_start, pilot.basis) == (3, 2, "pilot") and pilot.expected is None
    assert "the pilot design" in pilot.text()
    chosen = choose(DesignSpec(start_cv=0.09, run_cv=0.03, rel_half_width=0.16), start_s=24.0, run_s=10.0, points=2)
    assert (chosen.starts, chosen.runs_per_start, chosen.basis) == (4, 1, "chosen")
    assert chosen.expected is not None and chosen.expected <= 0.16 and "a lead of" in chosen.text()
    capped = choose(DesignSpec(start_cv=0.09, run_cv=0.03, rel_half_width=0.02, max_starts=5), 24.0, 10.0, 2)
    assert capped.starts == 5 and capped.capped and "design.max_starts reached" in capped.text()
    given = choose(DesignSpec(starts=3, runs_per_start=1, start_cv=0.09, run_cv=0.03), 24.0, 10.0, 2)
    assert (given.starts, given.runs_per_start, given.basis) == (3, 1, "given") and given.expected is not None
    assert given.cost_s(2) == pytest.approx(2 * 3 * (24 + 2 * 10))
    dear = choose(DesignSpec(start_cv=0.03, run_cv=0.09), start_s=300.0, run_s=5.0, points=1)
    assert dear.runs_per_start == 5 and dear.starts >= 3  # a dear start and noisy runs: more runs per start


def test_the_spreads_are_read_from_runs_on_several_starts():
    rng = np.random.default_rng(3)
    rows = []
    for g in range(40):
        for s in range(3):
            level = 1000 * (1 + 0.08 * rng.standard_normal())
            rows += [(f"g{g}", s, level * (1 + 0.03 * rng.standard_normal())) for _ in range(2)]
    start_cv, run_cv, used = components(rows)
    assert used == 40 and start_cv == pytest.approx(0.08, abs=0.015) and run_cv == pytest.approx(0.03, abs=0.005)
    assert components([("g", 0, 1.0), ("g", 0, 1.1)]) is None  # one start: no spread between starts
    one_run = components([("g", 0, 1.0), ("g", 1, 1.2), ("g", 2, 1.1)])
    assert one_run is not None and one_run[1] is None  # one run per start: the runs' spread is not measured
    assert one_run[0] == pytest.approx(0.1 / 1.1)


# -- the plan and the driver -----------------------------------------------------------------------------------

def test_the_design_becomes_starts_in_blocks_and_runs_dealt_to_them(tmp_path):
    plan = build_plan(load_campaign(_campaign(tmp_path, {"starts": 3, "runs_per_start": 2})))
    assert plan.spec.campaign.order.instances == 3 and plan.spec.campaign.runs == 6
    assert len(plan.points) == 2 * 2 * 6
    text = dry_run_text(plan)
    assert "Design: 3 server start(s) x 2 run(s) per start of each point, per configuration (as given)" in text
    assert "6 server start(s), 24 run(s); blocks ordered AB BA" in text and "A B | B A | A B" in text
    assert "Instances:" not in text  # said once, by the design
    est = estimate(plan)
    assert est.server_starts == 6 and est.points == 24
    again = build_plan(load_campaign(_campaign(tmp_path, {"starts": 3, "runs_per_start": 2})))
    assert [p.id for p in again.points] == [p.id for p in plan.points]  # a resume gets the same design


def _work(tmp_path: Path, design: dict, with_gpus: bool = False) -> RunState:
    plan = build_plan(load_campaign(_campaign(tmp_path, design, bench_params={"grid": {"max_concurrency": [2]}})))
    return plan_workload(plan, tmp_path, with_gpus)


def test_the_starts_go_in_interleaved_blocks_one_after_another_without_room(tmp_path):
    work = _work(tmp_path, {"starts": 3, "runs_per_start": 1})
    a, b = (s.id for s in work.serves)
    seen = []
    for _ in range(6):
        due = [s for s in (a, b) if work.work_left(s)]
        assert len(due) == 1
        seen.append((due[0], finish_runnable(work, due[0])))
    assert seen == [(a, [0]), (b, [0]), (b, [1]), (a, [1]), (a, [2]), (b, [2])]  # A B | B A | A B
    work.ledger.close()


def test_a_blocks_configurations_run_together_where_the_cluster_has_room(tmp_path):
    work = _work(tmp_path, {"starts": 3, "runs_per_start": 2}, with_gpus=True)
    a, b = (s.id for s in work.serves)
    for instance in range(3):
        assert [r.run for r in work.runnable(a)] == [r.run for r in work.runnable(b)] == [instance, instance + 3]
        finish_runnable(work, a)
        finish_runnable(work, b)
    assert not work.work_left(a) and not work.work_left(b)
    work.ledger.close()


# -- what the user is told -------------------------------------------------------------------------------------

def test_validate_states_every_run_and_start_the_campaign_will_make(tmp_path):
    f = _campaign(tmp_path, {"starts": 3, "runs_per_start": 2})
    res = CliRunner().invoke(main, ["validate", str(f)])
    assert res.exit_code == 0, res.output
    assert ("2 server config(s) x 2 bench point(s) x 6 run(s) = 24 run(s) (design: 3 server start(s) x 2 run(s) "
            "per start per configuration): 24 run(s) on 6 server start(s) in all") in res.output
    (tmp_path / "p").mkdir()
    p = standin_campaign(tmp_path / "p", serve_params=TWO_SERVES, bench_params=TWO_LOADS,
                         bench={"precision": {"metric": "output_throughput", "rel_half_width": 0.05, "min_runs": 3,
                                              "max_runs": 4}}, confirm={"enabled": True, "starts": 2, "runs": 2})
    data = yaml.safe_load(p.read_text())
    data.pop("runs")
    p.write_text(yaml.safe_dump(data))
    res = CliRunner().invoke(main, ["validate", str(p)])
    assert res.exit_code == 0, res.output  # the demo's former design: 12 first runs, 16 at most, 8 to confirm
    assert ("x 3 to 4 run(s) = 12 run(s) (up to 16 with bench.precision; then the winner's confirmation: 8 run(s) on 4 "
            "fresh server start(s)): 24 run(s) on 6 server start(s) in all") in res.output
    assert "note: bench.precision adds its runs inside one server start" in res.output
    assert "`design:` replaces it for verdicts" in res.output


def test_the_dry_run_shows_the_design_and_its_cost_before_anything_starts(tmp_path):
    f = _campaign(tmp_path, {"start_cv": 0.09, "run_cv": 0.03, "rel_half_width": 0.16, "start_s": 24, "run_s": 10})
    res = CliRunner().invoke(main, ["run", str(f), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "Design: 4 server start(s) x 1 run(s) per start of each point, per configuration (chosen from a spread " \
           "between starts of 9.0% and between runs of 3.0%" in res.output
    assert "8 server start(s), 16 run(s); blocks ordered AB BA" in res.output and "A B | B A | A B | B A" in res.output
    assert "cost: about 352 s of starts and runs (a start 24 s, a run 10 s)" in res.output
    assert "Estimate (defaults): 8 server start(s), 16 run(s)" in res.output
    assert not (tmp_path / "out").exists()


# -- bad input ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("design, fields, field, says", [
    ({"starts": 1}, {}, "design.starts", "one start per configuration gives no verdict"),
    ({"min_runs": 3}, {}, "design", "design.starts and design.runs_per_start"),
    ({"max_duration_s": 60}, {}, "design", "design.max_starts"),
    ({"rel_half_width": 2}, {}, "design.rel_half_width", "less than 1"),
    ({"metric": "throughput"}, {}, "design.metric", "unknown metric"),
    ({}, {"runs": 4}, "runs", "cannot be used with design:"),
    ({}, {"order": {"instances": 2}}, "order.instances", "cannot be used with design:"),
    ({}, {"bench": {"precision": {"metric": "output_throughput", "rel_half_width": 0.05}}}, "bench.precision",
     "design:, which replaces it"),
    ({}, {"placement": {"tail_replicas": 1}}, "design", "placement.tail_replicas"),
])
def test_bad_design_is_refused_naming_the_field_and_nothing_is_written(tmp_path, design, fields, field, says):
    f = _campaign(tmp_path, design)
    data = yaml.safe_load(f.read_text())
    for key, value in fields.items():
        if key == "bench":
            data["bench"].update(value)
        else:
            data[key] = value
    f.write_text(yaml.safe_dump(data))
    with pytest.raises(CampaignError) as err:
        load_campaign(f)
    assert err.value.field.startswith(field) and says in str(err.value), str(err.value)
    res = CliRunner().invoke(main, ["run", str(f)])
    assert res.exit_code == 2 and field in res.output
    assert not (tmp_path / "out").exists()


def test_design_auto_is_the_pilot_and_a_campaign_without_it_has_none(tmp_path):
    spec = load_campaign(_campaign(tmp_path, "auto"))
    pilot = design_of(spec)
    assert pilot is not None and (pilot.starts, pilot.runs_per_start) == (3, 2)
    (tmp_path / "n").mkdir()
    assert design_of(load_campaign(_campaign(tmp_path / "n"))) is None


# -- the confirmation's auto, held to a quarter of the sweep -----------------------------------------------

def test_auto_confirmation_counts_every_shape_it_would_re_measure(tmp_path):
    """A stub campaign of 2 configurations x 250 bench shapes (1,000 runs): the confirmation would re-measure the
    leader and the runner-up of every shape (2,000 runs), so auto leaves it off; with one shape it fits."""
    from raysweep.confirm.runs import wanted

    f = _campaign(tmp_path, runs=2, bench_params={"grid": {"random_input_len": list(range(16, 16 + 250))}})
    plan = build_plan(load_campaign(f))
    assert len(plan.points) == 1000 and confirm_pairs(plan) == 250
    starts, runs, _ = confirm_cost(plan)
    assert (starts, runs) == (4, 2000)
    assert not wanted(plan, estimate(plan).wall_s) and estimate(plan).confirm is None
    (tmp_path / "one").mkdir()
    one = build_plan(load_campaign(_campaign(tmp_path / "one", runs=60,
                                             bench_params={"grid": {"max_concurrency": [2]}})))
    sweep = estimate(one).wall_s
    assert confirm_pairs(one) == 1 and wanted(one, sweep) and confirm_cost(one)[2] <= 0.25 * sweep


# -- on the stand-in servers ------------------------------------------------------------------------------------

def _records(out: Path) -> list[dict]:
    import json

    recs = [json.loads(p.read_text()) for p in (out / "points").rglob("run=*.json")]
    return sorted(recs, key=lambda r: r["started_at"])


@pytest.mark.ray
def test_a_designed_campaign_starts_its_servers_in_interleaved_blocks_on_the_cluster(gpu_cluster, tmp_path):
    """2 configurations x 1 point, `design: {starts: 3, runs_per_start: 1}`, one server at a time: 6 separate server
    starts in the order A B | B A | A B, each running its run of the point, every run recording its start."""
    from helpers import run_file

    f = _campaign(tmp_path, {"starts": 3, "runs_per_start": 1}, placement={"max_servers": 1},
                  bench_params={"grid": {"max_concurrency": [2]}})
    summary, out = run_file(f)
    assert summary.counts["done"] == 6 and summary.counts["failed"] == 0
    recs = _records(out)
    a, b = (s.id for s in build_plan(load_campaign(f)).serves)
    starts = list(dict.fromkeys((r["server_id"], r["serve_id"], r["instance"]) for r in recs))
    assert [(s, i) for _, s, i in starts] == [(a, 0), (b, 0), (b, 1), (a, 1), (a, 2), (b, 2)]
    assert len({sid for sid, _, _ in starts}) == 6  # six separate server starts
    assert [(r["run_number"], r["block"]) for r in recs if r["serve_id"] == a] == [(0, 0), (1, 1), (2, 2)]
    # the dry run reads the spread between the starts it measured and says what design it chooses
    res = CliRunner().invoke(main, ["run", str(f), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert f"Measured in {out}: a start's mean varies by" in res.output and "would choose" in res.output
    assert "a run within a start not measured (one run per start" in res.output


@pytest.mark.ray
def test_two_instances_give_a_verdict_over_server_starts_on_the_cluster(gpu_cluster, tmp_path):
    """`order.instances: 2`, one run per start: two configurations far apart (a request takes 0.05 s against
    0.5 s) are called apart by t over their starts' means (1 degree of freedom with 2 starts a side), where one
    start each could only rank them."""
    from helpers import run_file

    from raysweep.maths.hierarchy import MODEL
    from raysweep.results.data import answer_of, read_data

    f = _campaign(tmp_path, None, runs=2, placement={"max_servers": 1}, order={"instances": 2},
                  serve_params={"grid": {"request_delay": [0.05, 0.5]}},
                  bench_params={"grid": {"max_concurrency": [4]}})
    summary, out = run_file(f)
    assert summary.counts["done"] == 4 and summary.counts["failed"] == 0
    assert len({r["server_id"] for r in _records(out)}) == 4
    (v,) = answer_of(read_data(CampaignDir(out))).verdicts
    assert str(v.leader["serve_label"]) == "request_delay=0.05"
    assert v.test == MODEL and v.significant is True and v.p_value is not None and v.p_value < 0.05

"""The order runs go in by design (raysweep.maths.order): rounds within a server's life, instances in AB BA blocks,
their bad input, the dry run and the estimate, and on the stand-in servers the order the runs really took,
what each records, and a resume in the middle of a round."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from helpers import finish_runnable, plan_workload, standin_campaign

from raysweep.campaign import load_campaign
from raysweep.cli import main
from raysweep.drive.state import RunState
from raysweep.errors import CampaignError
from raysweep.ledger import Ledger
from raysweep.maths.order import Turn, in_rounds, instance_of, open_turns, turns
from raysweep.plan.estimate import estimate
from raysweep.plan.plan import build_plan, dry_run_text

TWO_SERVES = {"grid": {"max_num_seqs": [4, 8]}}
THREE_BENCHES = {"grid": {"random_input_len": [16, 32, 48]}}


def _campaign(tmp_path: Path, order: dict | None = None, **fields) -> Path:
    f = standin_campaign(tmp_path, serve_params=fields.pop("serve_params", TWO_SERVES),
                         bench_params=fields.pop("bench_params", THREE_BENCHES), **fields)
    if order is not None:
        data = yaml.safe_load(f.read_text())
        data["order"] = order
        f.write_text(yaml.safe_dump(data))
    return f


# -- the design, pure -------------------------------------------------------------------------------------

def test_rounds_run_every_point_once_per_round_in_a_seeded_order(tmp_path):
    plan = build_plan(load_campaign(_campaign(tmp_path, runs=4)))
    serve = plan.serves[0]
    ordered = in_rounds(plan.points_of(serve.id), seed=0)
    rounds = [[p.bench.id for p in ordered if p.run == r] for r in range(4)]
    assert [p.run for p in ordered] == sorted(p.run for p in ordered)  # round after round
    assert all(sorted(r) == sorted(b.id for b in plan.benches) for r in rounds)  # every point once per round
    assert len({tuple(r) for r in rounds}) > 1  # the order within a round is drawn afresh for each round
    assert in_rounds(list(reversed(plan.points_of(serve.id))), seed=0) == ordered  # the same seed, the same order
    others = [in_rounds(plan.points_of(serve.id), seed=s) for s in range(1, 6)]
    assert any(o != ordered for o in others)  # another seed, another order


def test_instances_deal_first_runs_in_turn_and_order_blocks_ab_ba():
    assert [instance_of(r, 2, 4) for r in range(6)] == [0, 1, 0, 1, 1, 1]  # added runs: the last instance
    assert [instance_of(r, 1, 4) for r in range(5)] == [0] * 5
    design = turns(["A", "B"], 4)
    assert [(t.serve_id, t.instance) for t in design] == [("A", 0), ("B", 0), ("B", 1), ("A", 1), ("A", 2), ("B", 2),
                                                          ("B", 3), ("A", 3)]
    left = {("A", 0), ("B", 0), ("B", 1), ("A", 1)}
    assert open_turns(design[:4], lambda s, i: (s, i) in left, together=False) == [Turn("A", 0, 0, 0)]
    assert open_turns(design[:4], lambda s, i: (s, i) in left, together=True) == [Turn("A", 0, 0, 0),
                                                                                   Turn("B", 0, 0, 1)]
    left -= {("A", 0), ("B", 0)}
    assert open_turns(design[:4], lambda s, i: (s, i) in left, together=False) == [Turn("B", 1, 1, 0)]
    assert open_turns(design[:4], lambda s, i: False, together=False) == []


@pytest.mark.parametrize("order, field, says", [
    ({"instances": 0}, "order.instances", "greater than or equal to 1"),
    ({"instances": "two"}, "order.instances", "integer"),
    ({"instances": 3}, "order.instances", "only 2 first run(s) (runs)"),
    ({"instance": 2}, "order", "instance"),
    ({"rounds": "sometimes"}, "order.rounds", "boolean"),
])
def test_bad_order_is_refused_naming_the_field_and_nothing_is_written(tmp_path, order, field, says):
    f = _campaign(tmp_path, order, runs=2)
    with pytest.raises(CampaignError) as err:
        load_campaign(f)
    assert err.value.field.startswith(field) and says in str(err.value)
    res = CliRunner().invoke(main, ["run", str(f)])
    assert res.exit_code == 2 and field in res.output
    assert not (tmp_path / "out").exists()  # nothing started, nothing written


def test_instances_are_refused_where_there_is_no_start_to_deal_runs_to(tmp_path):
    f = _campaign(tmp_path, {"instances": 2}, runs=2, placement={"tail_replicas": 1})
    with pytest.raises(CampaignError, match="^order.instances: cannot be used with placement.tail_replicas"):
        load_campaign(f)
    data = yaml.safe_load(f.read_text())
    data.pop("runs")
    data["placement"] = {}
    data["bench"]["precision"] = {"metric": "output_throughput", "rel_half_width": 0.05, "min_runs": 2}
    f.write_text(yaml.safe_dump({**data, "order": {"instances": 3}}))
    with pytest.raises(CampaignError, match=r"only 2 first run\(s\) \(bench.precision.min_runs\)"):
        load_campaign(f)


def test_dry_run_and_estimate_show_the_order_and_what_instances_cost(tmp_path):
    one = build_plan(load_campaign(_campaign(tmp_path, runs=2)))
    text = dry_run_text(one)
    assert "Order: in rounds (every point once per round, 2 round(s) to start with" in text
    assert "round 0 of the first server: " in text
    (tmp_path / "b").mkdir()
    two = build_plan(load_campaign(_campaign(tmp_path / "b", {"instances": 2}, runs=2)))
    text = dry_run_text(two)
    a, b = (s.label for s in two.serves)
    assert f"in blocks ordered AB BA: {a}#0 {b}#0 | {b}#1 {a}#1" in text and "4 start(s) instead of 2" in text
    assert estimate(one).server_starts == 2 and estimate(two).server_starts == 4
    assert estimate(two).wall_s > estimate(one).wall_s  # the starts cost time
    (tmp_path / "c").mkdir()
    off = build_plan(load_campaign(_campaign(tmp_path / "c", {"rounds": False}, runs=2)))
    assert "each point's runs back to back" in dry_run_text(off)


# -- the turns of a running campaign, on its ledger ---------------------------------------------------------

def _work(tmp_path: Path, order: dict, runs: int = 4, with_gpus: bool = False) -> RunState:
    plan = build_plan(load_campaign(_campaign(tmp_path, order, runs=runs,
                                              bench_params={"grid": {"random_input_len": [16]}})))
    return plan_workload(plan, tmp_path, with_gpus)


def test_each_configuration_measures_its_instance_when_its_turn_comes(tmp_path):
    work = _work(tmp_path, {"instances": 2})
    a, b = (s.id for s in work.serves)
    seen = []
    for _ in range(4):
        due = [s for s in (a, b) if work.work_left(s)]
        assert len(due) == 1  # one server at a time on a cluster without GPUs
        seen.append((due[0], finish_runnable(work, due[0])))
    assert seen == [(a, [0, 2]), (b, [0, 2]), (b, [1, 3]), (a, [1, 3])]
    assert not work.work_left(a) and not work.work_left(b)
    assert work.order_fields(b, "x", 3, 1) == {"round": 3, "instance": 1, "block": 1, "turn": 0, "slot": 1,
                                          "order_seed": 0, "order_rounds": True}
    work.ledger.close()


def test_a_block_runs_together_where_the_cluster_has_room_and_a_failed_run_holds_its_turn(tmp_path):
    work = _work(tmp_path, {"instances": 2}, with_gpus=True)
    a, b = (s.id for s in work.serves)
    assert work.work_left(a) == 2 and work.work_left(b) == 2  # block 0: both at once, paired in time
    row = work.runnable(a)[0]
    work.ledger.claim(row.point_id, "s", work.c.max_attempts)
    work.ledger.mark_failed(row.point_id, "broken")  # an attempt left: the block waits for it
    finish_runnable(work, b)
    rest = [r for r in work.runnable(a) if r.point_id != row.point_id]
    for r in rest:
        work.ledger.claim(r.point_id, "s", work.c.max_attempts)
        work.ledger.mark_done(r.point_id, "x.json")
    assert [r.run for r in work.runnable(a)] == [row.run] and not work.runnable(b)
    finish_runnable(work, a)
    assert sorted(r.run for r in work.runnable(a)) == [1, 3] and sorted(r.run for r in work.runnable(b)) == [1, 3]
    work.ledger.close()


# -- on the stand-in servers ----------------------------------------------------------------------------

def _records(out: Path) -> list[dict]:
    recs = [json.loads(p.read_text()) for p in (out / "points").rglob("run=*.json")]
    return sorted(recs, key=lambda r: r["started_at"])


@pytest.mark.ray
def test_runs_go_in_rounds_and_instances_in_ab_ba_order_on_the_cluster(gpu_cluster, tmp_path):
    """2 configurations x 3 bench points x 4 runs on 2 instances, one server at a time: the server starts go
    A B B A, each server runs its 2 rounds one after the other with every point once per round, and every
    run records where it sat."""
    from helpers import run_file

    f = _campaign(tmp_path, {"instances": 2, "seed": 7}, runs=4, placement={"max_servers": 1})
    summary, out = run_file(f)
    assert summary.counts["done"] == 24 and summary.counts["failed"] == 0
    recs = _records(out)
    a, b = (s.id for s in build_plan(load_campaign(f)).serves)
    starts = list(dict.fromkeys((r["server_id"], r["serve_id"], r["instance"]) for r in recs))
    assert [(s, i) for _, s, i in starts] == [(a, 0), (b, 0), (b, 1), (a, 1)]
    assert len({sid for sid, _, _ in starts}) == 4  # four separate server starts
    for server_id, _, instance in starts:
        mine = [r for r in recs if r["server_id"] == server_id]
        assert [r["slot"] for r in mine] == list(range(6))
        assert [r["round"] for r in mine] == sorted(r["round"] for r in mine)  # round after round
        assert {r["round"] for r in mine} == {instance, instance + 2}
        for rnd in {instance, instance + 2}:  # every point once per round
            assert sorted(r["bench_id"] for r in mine if r["round"] == rnd) == sorted(
                {r["bench_id"] for r in recs})
        assert {r["block"] for r in mine} == {instance} and all(r["run_number"] == r["round"] for r in mine)
    assert {(r["serve_id"], r["block"], r["turn"]) for r in recs} == {(a, 0, 0), (b, 0, 1), (b, 1, 0), (a, 1, 1)}


@pytest.mark.ray
def test_precision_runs_come_in_rounds_and_a_resume_mid_round_runs_nothing_twice(gpu_cluster, tmp_path):
    """bench.precision in rounds: a point's added run waits for the round before it to end. The campaign is
    stopped in the middle of a round (a failed run, continue_on_error false); the resumed one runs what was
    left, in the rounds' order, and nothing that was done runs again."""
    from helpers import run_file

    calls, fail = tmp_path / "calls.log", tmp_path / "fail"
    f = _campaign(tmp_path, {"seed": 3}, serve_params={"grid": {"max_num_seqs": [8]}},
                  bench_args=f"--log-file {calls} --fail-while {fail} --report-throughput 100",
                  continue_on_error=False)
    data = yaml.safe_load(f.read_text())
    data.pop("runs")
    data["bench"]["precision"] = {"metric": "request_throughput", "rel_half_width": 0.99, "min_runs": 3,
                                  "max_runs": 5}
    f.write_text(yaml.safe_dump(data))

    def stop_after(n: int) -> None:  # the (n+1)th run fails: the campaign stops in round 1
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if calls.exists() and len(calls.read_text().splitlines()) >= n:
                fail.touch()
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=stop_after, args=(4,), daemon=True)
    watcher.start()
    summary, out = run_file(f)
    watcher.join()
    assert summary.stopped_early and "continue_on_error is false" in summary.stopped_early
    led = Ledger.open_existing(out)
    done_first = {p.point_id for p in led.points() if p.state == "done"}
    led.close()
    assert 4 <= len(done_first) < 9  # stopped before the first rounds ended (in round 1, unless the machine lags)
    fail.unlink()
    summary, out = run_file(f)
    assert summary.counts["failed"] == 0 and summary.counts["pending"] == 0
    led = Ledger.open_existing(out)
    rows = led.points()
    assert all(p.attempts == 1 for p in rows if p.point_id in done_first)  # nothing done ran again
    decided = led.precision()
    # every point decided by the rule after the round that confirms it: the stand-in reports one throughput for
    # every run (--report-throughput), so that its timing on a loaded machine cannot make the runs drift
    assert len(decided) == 3
    assert all(r["state"] == "reached" and r["runs_done"] == 4 for r in decided), decided
    led.close()
    recs = _records(out)
    total = sum(r["runs_done"] for r in decided)
    assert len(recs) == total and len({(r["bench_id"], r["run_number"]) for r in recs}) == total
    second = [r for r in recs if r["point_id"] not in done_first]
    assert [r["round"] for r in second] == sorted(r["round"] for r in second)  # the rounds' order, resumed
    first = [r for r in recs if r["point_id"] in done_first]
    assert [r["round"] for r in first] == sorted(r["round"] for r in first)
    # the added runs (round 3) came after every run of round 2: a point's runs are not back to back
    last_of_round_2 = max(r["started_at"] for r in recs if r["round"] == 2)
    assert all(r["started_at"] > last_of_round_2 for r in recs if r["round"] == 3)


@pytest.mark.ray
@pytest.mark.vllm
def test_the_real_vllm_server_measures_its_points_in_rounds(vllm_server, gpu_cluster, tmp_path):
    """The session's real `vllm serve`, swept as an endpoint: 3 loads x 2 runs go round after round, every
    load once per round in the seeded order, each run recording its round and its slot in the server's life."""
    out = tmp_path / "rounds"
    res = CliRunner().invoke(main, ["profile", vllm_server["url"], "--grid", "max_concurrency=1,2,4", "--runs", "2",
                                    "--bench-cmd", f"vllm bench serve --model {vllm_server['model']} --dataset-name "
                                                   "random --random-input-len 32 --random-output-len 8 --num-prompts 8 "
                                                   "--ignore-eos", "--output-dir", str(out)])
    assert res.exit_code == 0, res.output
    recs = _records(out)
    assert len(recs) == 6 and len({r["server_id"] for r in recs}) == 1
    assert [r["round"] for r in recs] == [0, 0, 0, 1, 1, 1] and [r["slot"] for r in recs] == list(range(6))
    assert all(r["run_number"] == r["round"] and r["completed"] == 8 for r in recs)
    assert sorted(r["max_concurrency"] for r in recs[:3]) == [1, 2, 4] == sorted(r["max_concurrency"] for r in recs[3:])
    expected = in_rounds(build_plan(load_campaign(out / "campaign.yaml")).points, seed=0)
    assert [r["point_id"] for r in recs] == [p.id for p in expected]  # the seeded order, as planned

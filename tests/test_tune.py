"""Tuning (raysweep.tune): the space and its refusals, the sampler asked and told, early stopping, the
budget, resume from the ledger, the leaderboard, dry run and report section. Pure: the real scheduler and
ledger against the benchmark's simulated cluster (benchmarks/bench_tune.py), no Ray, no server."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from raysweep.campaign import campaign_from_dict
from raysweep.cli import main
from raysweep.drive.driver import open_campaign
from raysweep.errors import CampaignError
from raysweep.maths.pareto import beaten, hypervolume, pareto_front
from raysweep.place.scheduler import Scheduler
from raysweep.record.directory import CampaignDir
from raysweep.tune import (
    TunedCluster,
    Tuner,
    TuneWork,
    leaderboard,
    rung_sizes,
)
from raysweep.tune.report_section import report_section

_spec = importlib.util.spec_from_file_location("bench_tune",
                                               Path(__file__).parent.parent / "benchmarks" / "bench_tune.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules["bench_tune"] = bench
_spec.loader.exec_module(bench)


def campaign(**tune: Any) -> dict[str, Any]:
    data = bench.campaign("single", 3, 1.0)
    data["tune"].update(tune)
    return data


def refused(data: dict[str, Any]) -> CampaignError:
    with pytest.raises(CampaignError) as exc:
        campaign_from_dict(data, base_dir=Path("."))
    return exc.value


@pytest.mark.parametrize("space, field, words", [
    ({"max_num_seqs": {"low": 256, "high": 64}}, "tune.space.max_num_seqs", "above high"),
    ({"max_num_seqs": {"low": 0, "high": 64, "log": True}}, "tune.space.max_num_seqs.low", "log scale"),
    ({"max_num_seqs": {"choices": []}}, "tune.space.max_num_seqs.choices", "at least one"),
    ({"max_num_seqs": {"choices": [64], "low": 1, "high": 2}}, "tune.space.max_num_seqs", "not both"),
    ({"max_num_seqs": {"high": 2}}, "tune.space.max_num_seqs", "both low"),
    ({"tensor_parallel_size": {"low": 1.5, "high": 4}}, "tune.space.tensor_parallel_size", "positive integers"),
    ({"tensor_parallel_size": {"choices": [1, 2.5]}}, "tune.space.tensor_parallel_size.choices", "positive integers"),
])
def test_a_bad_space_is_refused_naming_the_field(space, field, words):
    err = refused(campaign(space=space))
    assert err.field == field and words in err.message


def test_other_refusals_name_their_field():
    data = campaign()
    data["serve"]["params"] = {"grid": {"max_model_len": [1024, 2048]}}
    assert refused(data).field == "serve.params"
    data = campaign()
    data["serve"]["params"] = [{"max_num_seqs": 8}]
    assert refused(data).field == "tune.space.max_num_seqs"
    assert refused(campaign(exclude=[{"max_num_sqs": 64}])).field == "tune.exclude[0].max_num_sqs"
    err = refused(campaign(objective={"metric": "sla_capacity"}))
    assert err.field == "tune.objective.metric" and "sla:" in err.message
    data = campaign(objective={"metric": "output_throughput", "per": "user"})
    data["bench"]["params"] = {"grid": {"random_input_len": [16, 32]}}
    assert refused(data).field == "tune.objective.per"
    assert "exactly two" in str(refused(campaign(objective=None, pareto=[{"metric": "output_throughput"}])))
    assert "at least one of" in str(refused(campaign(budget={})))
    assert "exactly one of" in str(refused(campaign(pareto=[{"metric": "a"}, {"metric": "b"}])))


def test_the_cli_refuses_a_bad_space_with_exit_2(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(campaign(space={"max_num_seqs": {"low": 9, "high": 1}})))
    res = CliRunner().invoke(main, ["validate", str(f)])
    assert res.exit_code == 2 and "tune.space.max_num_seqs" in res.output


def test_the_sampler_asks_within_the_space_and_a_rebuild_knows_what_was_told():
    spec = campaign_from_dict(campaign(space={"max_num_seqs": {"choices": [64, 128, 256, 512]},
                                              "gpu_memory_utilization": {"low": 0.8, "high": 0.95},
                                              "block_size": {"low": 8, "high": 64, "log": True}}), Path("."))
    tuner = Tuner(spec.campaign.tune)
    asked = [tuner.ask() for _ in range(12)]
    for _, p in asked:
        assert p["max_num_seqs"] in (64, 128, 256, 512) and 0.8 <= p["gpu_memory_utilization"] <= 0.95
        assert isinstance(p["block_size"], int) and 8 <= p["block_size"] <= 64
    for n, p in asked[:5]:
        tuner.tell(n, "complete", [float(p["max_num_seqs"])])
    again = Tuner(spec.campaign.tune)
    for _, p in asked[:5]:
        again.add(p, "complete", [float(p["max_num_seqs"])])
    assert again.study.best_value == tuner.study.best_value and again.study.best_params == {
        **tuner.study.best_params}


def test_rungs_and_the_pareto_front():
    assert rung_sizes(4, 3) == [1, 2] and rung_sizes(12, 3) == [1, 2, 4] and rung_sizes(1, 3) == []
    assert rung_sizes(9, 3) == [1, 3]
    pts = [(1.0, 5.0), (2.0, 4.0), (1.5, 3.0), (3.0, 1.0), (2.0, 4.0)]
    assert pareto_front(pts, ["maximize", "maximize"]) == [0, 1, 3, 4]
    assert pareto_front(pts, ["minimize", "maximize"]) == [0]


def test_neighbours_are_one_step_in_one_dimension_unordered_choices_first():
    spec = campaign_from_dict(campaign(space={"max_num_seqs": {"choices": [64, 128, 256, 512]},
                                              "kv_cache_dtype": {"choices": ["auto", "fp8", "fp8_e5m2"]},
                                              "block_size": {"low": 8, "high": 64, "log": True},
                                              "gpu_memory_utilization": {"low": 0.8, "high": 0.96}}), Path("."))
    tuner = Tuner(spec.campaign.tune)
    at = {"max_num_seqs": 64, "kv_cache_dtype": "fp8", "block_size": 16, "gpu_memory_utilization": 0.94}
    near = tuner.neighbours(at)
    changed = [[(k, p[k]) for k in at if p[k] != at[k]] for p in near]
    assert changed == [[("kv_cache_dtype", "auto")], [("kv_cache_dtype", "fp8_e5m2")],   # unordered: every other
                       [("max_num_seqs", 128)],                                          # a scale's end: one way
                       [("block_size", 10)], [("block_size", 27)],                       # log range: x/÷ 8^(1/4)
                       [("gpu_memory_utilization", pytest.approx(0.90))],                # range: a quarter of it,
                       [("gpu_memory_utilization", 0.96)]]                               # kept inside
    # the sampler's trial holds the parameters it is given
    number, params = tuner.ask(near[2])
    assert params == near[2] and tuner.study.trials[number].params["max_num_seqs"] == 1   # its rank on the scale


def test_a_point_is_beaten_only_beyond_the_margin_and_the_hypervolume_it_spans():
    up = ["maximize", "maximize"]
    assert beaten((100.0, 100.0), [(104.0, 104.0)], up, 0.03)
    assert not beaten((100.0, 100.0), [(102.0, 102.0)], up, 0.03) and beaten((100.0, 100.0), [(102.0, 102.0)], up, 0.0)
    assert not beaten((100.0, 10.0), [(104.0, 9.0)], up, 0.0)
    assert beaten((100.0, 10.0), [(104.0, 9.0)], ["maximize", "minimize"], 0.03)
    assert hypervolume([(1, 3), (2, 2), (3, 1), (1, 1)], up, (0, 0)) == 6
    assert hypervolume([(1, 3), (2, 2), (3, 1)], ["maximize", "minimize"], (0, 4)) == 3 * 3   # (3, 1) holds the rest
    assert hypervolume([], up, (0, 0)) == 0


def test_a_pareto_campaign_spends_the_end_of_its_budget_on_neighbours_of_the_front(tmp_path):
    import math

    from raysweep import tune

    data = bench.campaign("pareto", 6, 1.0)
    data["tune"]["budget"] = {"candidates": 24}
    work, ledger, started = simulate(tmp_path, data, seed=6)
    rows = {r["number"]: r for r in ledger.candidates()}
    assert len(rows) == 24 and len(started) == len(set(started)) == 24     # every configuration once
    # in the last share of the budget, each candidate is one step from a configuration on or near the front
    first = math.ceil(24 * (1 - tune.POLISH_SHARE) - 1e-9)
    assert 0 < first < 24 and sorted(work.polished) == list(range(first, 24))
    for number, owner in work.polished.items():
        assert owner < number and rows[number]["params"] in work.tuner.neighbours(rows[owner]["params"])
    ledger.close()


def wide(monkeypatch):
    from io import StringIO

    from rich.console import Console

    from raysweep.cli import tuning

    buf = StringIO()
    monkeypatch.setattr(tuning, "out", Console(file=buf, width=400, force_terminal=False))
    return buf


def simulate(root: Path, data: dict[str, Any], seed: int = 0, stop_after: int | None = None
             ) -> tuple[TuneWork, Any, list[str]]:
    """Run (or resume) a tuning campaign on the simulated 4 x 8 GPU cluster; `stop_after` events: interrupt."""
    spec = campaign_from_dict(data, base_dir=root)
    plan, ledger = open_campaign(spec, CampaignDir(root / "out"))
    sim = bench.SimCluster(nodes=4, gpus=8, rng=random.Random(seed))
    run_dir = CampaignDir.around(root / "out", ledger)
    work = sim.work = TuneWork(plan, run_dir, lambda kind, **d: None, with_gpus=True, clock=sim.clock)
    started: list[str] = []
    inner_start, inner_wait = sim.start, sim.wait
    events = [0]

    def start(serve, layout, node_ids):
        started.append(serve.id)
        inner_start(serve, layout, node_ids)

    def wait(timeout_s):
        events[0] += 1
        if stop_after is not None and events[0] >= stop_after:
            work.stop_reason = "interrupted by the test"
            for sid in list(sim.queue):  # every running configuration ends at once, its points kept as they are
                sim.ended.append((sid, "stopped"))
                del sim.queue[sid]
            sim.events.clear()
            return
        inner_wait(timeout_s)

    sim.start, sim.wait = start, wait
    Scheduler(TunedCluster(sim, work), work, lambda kind, **d: None, max_servers=None, clock=sim.clock).run()
    return work, ledger, started


def test_a_tuning_campaign_runs_stops_candidates_early_and_keeps_to_its_budget(tmp_path):
    data = campaign(budget={"candidates": 24}, seed=1)
    work, ledger, started = simulate(tmp_path, data, seed=1)
    rows = ledger.candidates()
    states = [r["state"] for r in rows]
    assert len([s for s in states if s != "refused"]) == 24 and set(states) <= {"complete", "pruned"}
    assert states.count("pruned") >= 5 and states.count("complete") >= 3
    pruned = [r for r in rows if r["state"] == "pruned"]
    assert all("rung" in r["reason"] and r["rungs"] for r in pruned)
    # a pruned candidate ran fewer points than a complete one; its unrun points are out of the plan
    by_serve: dict[str, list[str]] = {}
    for p in ledger.points():
        by_serve.setdefault(p.serve_id, []).append(p.state)
    assert all(set(s) == {"done"} for s in by_serve.values())
    assert max(len(by_serve[r["serve_id"]]) for r in pruned) < len(bench.CONCURRENCY)
    assert all(len(by_serve[r["serve_id"]]) == len(bench.CONCURRENCY) for r in rows if r["state"] == "complete")
    # every candidate ran once, several at once on the 32 GPUs, and its GPU time is accounted
    assert len(started) == len(set(started)) == 24
    assert all(r["gpu_s"] > 0 for r in rows)
    # the best complete candidate leads the leaderboard, pruned ones follow
    board = leaderboard(ledger.stored_campaign(), rows)
    assert board[0]["objective"][0] == max(r["objective"][0] for r in rows if r["objective"])
    assert [r["state"] for r in board][:states.count("complete")] == ["complete"] * states.count("complete")
    ledger.close()


def test_an_interrupted_tuning_campaign_resumes_without_running_a_finished_candidate_again(tmp_path, monkeypatch):
    data = campaign(budget={"candidates": 20}, seed=2)
    work, ledger, started_first = simulate(tmp_path, data, seed=2, stop_after=25)
    before = {r["number"]: r for r in ledger.candidates()}
    ledger.close()
    assert any(r["state"] == "running" for r in before.values())
    ended = {r["serve_id"] for r in before.values() if r["state"] in ("complete", "pruned")}
    assert ended
    work, ledger, started_again = simulate(tmp_path, data, seed=3)
    after = {r["number"]: r for r in ledger.candidates()}
    assert not ended & set(started_again)                      # no finished candidate runs again
    for n, r in before.items():                               # nor is its record changed
        if r["state"] in ("complete", "pruned"):
            assert after[n]["objective"] == r["objective"] and after[n]["state"] == r["state"]
    assert len([r for r in after.values() if r["state"] != "refused"]) == 20
    assert all(r["state"] in ("complete", "pruned") for r in after.values())
    # the sampler was rebuilt from the ledger: it knows every candidate, each once
    assert len(work.tuner.study.trials) >= len(after)
    assert ledger.counts()["pending"] == 0
    buf = wide(monkeypatch)
    res = CliRunner().invoke(main, ["tune", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    text = buf.getvalue()
    assert "complete" in text and "pruned" in text and "output_throughput per GPU" in text
    best = max((r for r in after.values() if r["state"] == "complete"), key=lambda r: r["objective"][0])
    first_row = next(line for line in text.splitlines() if line.strip().startswith("│ 1 "))
    assert f"{best['objective'][0]:.4g}" in first_row
    html = report_section(CampaignDir(tmp_path / "out"))
    assert "<table>" in html and html.count("data:image/png;base64,") >= 2   # leaderboard, objective, importance
    from raysweep.report.page import build_report

    assert '<section id="tuning"><h2>Tuning</h2>' in build_report(CampaignDir(tmp_path / "out"))
    ledger.close()


def test_a_pareto_campaign_tells_two_objectives_and_marks_the_front(tmp_path, monkeypatch):
    data = bench.campaign("pareto", 4, 1.0)
    data["tune"]["budget"] = {"candidates": 24}
    work, ledger, _ = simulate(tmp_path, data, seed=4)
    rows = ledger.candidates()
    done = [r for r in rows if r["state"] == "complete"]
    assert {r["state"] for r in rows} == {"complete", "pruned"} and all(len(r["objective"]) == 2 for r in done)
    # both ends of the load run first (512, then 8): a candidate stopped at its first rungs ran 512 and not all
    points = ledger.points()
    by_serve: dict[str, set[int]] = {}
    for p in points:
        by_serve.setdefault(p.serve_id, set()).add(int(p.bench_params["max_concurrency"]))
    pruned = [r for r in rows if r["state"] == "pruned"]
    assert pruned and all(512 in by_serve[r["serve_id"]] and len(by_serve[r["serve_id"]]) < 4 for r in pruned)
    # a pruned candidate: every point it ran is dominated by another candidate's point
    measured = _measured(tmp_path, points)
    pairs = {sid: [(v / c, v / g) for v, c, g in vals] for sid, vals in measured.items()}
    for r in pruned:
        assert "is dominated by another candidate's" in r["reason"] and r["rungs"]
        rung = [512, 8][:int(r["reason"].split()[1])]    # the loads its rung held
        judged = [(v / c, v / g) for v, c, g in measured[r["serve_id"]] if c in rung]
        assert judged and all(any(q[0] >= a and q[1] >= b and q != (a, b) for sid, qs in pairs.items()
                                  if sid != r["serve_id"] for q in qs) for a, b in judged)
    # the sampler learned every bench point of every candidate that ran, not one value per candidate
    told = [tuple(t.values) for t in work.tuner.study.trials if t.state.name == "COMPLETE"]
    assert set(told) <= {xy for xys in pairs.values() for xy in xys}
    assert all(set(pairs[r["serve_id"]]) <= set(told) and len(pairs[r["serve_id"]]) == 4 for r in done)
    board = leaderboard(ledger.stored_campaign(), rows)
    front = [r for r in board if r.get("on_front")]
    assert front and board[:len(front)] == front
    pts = [tuple(r["objective"]) for r in done]
    for r in front:   # nothing dominates a front candidate
        assert not any(p[0] >= r["objective"][0] and p[1] >= r["objective"][1] and list(p) != r["objective"]
                       for p in pts)
    ledger.close()
    # rebuilt from the ledger, the sampler knows the same points
    work, ledger, started = simulate(tmp_path, data, seed=5)
    again = [tuple(t.values) for t in work.tuner.study.trials if t.state.name == "COMPLETE"]
    assert not started and sorted(again) == sorted(xy for xys in pairs.values() for xy in xys)
    ledger.close()
    buf = wide(monkeypatch)
    res = CliRunner().invoke(main, ["tune", str(tmp_path / "out")])
    assert res.exit_code == 0 and "Pareto front" in buf.getvalue()


def _measured(root: Path, points: list[Any]) -> dict[str, list[tuple[float, int, int]]]:
    """serve id -> (output_throughput, max_concurrency, GPUs) of each finished point."""
    import json

    out: dict[str, list[tuple[float, int, int]]] = {}
    for p in points:
        rec = json.loads((root / "out" / p.result_path).read_text())
        out.setdefault(p.serve_id, []).append((rec["output_throughput"], rec["max_concurrency"],
                                               int(p.serve_params["tensor_parallel_size"])))
    return out


def test_excluded_and_unplaceable_candidates_are_refused_with_the_reason(tmp_path):
    data = campaign(budget={"candidates": 6}, seed=5, sampler="random",
                    exclude=[{"tensor_parallel_size": 8, "max_num_seqs": 64}])
    data["tune"]["space"]["tensor_parallel_size"] = {"choices": [1, 16]}   # 16 GPUs: no 8-GPU node holds it
    work, ledger, started = simulate(tmp_path, data, seed=5)
    rows = ledger.candidates()
    refused_rows = [r for r in rows if r["state"] == "refused"]
    assert refused_rows and all("can never be placed" in r["reason"] for r in refused_rows)
    assert len({r["serve_id"] for r in refused_rows}) == len(refused_rows)   # each refused once, not per proposal
    assert all(r["params"]["tensor_parallel_size"] == 16 for r in refused_rows)
    assert not {r["serve_id"] for r in refused_rows} & set(started)
    assert len([r for r in rows if r["state"] != "refused"]) == 6
    ledger.close()


def test_dry_run_shows_the_space_the_budget_and_the_first_candidates(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(campaign(budget={"candidates": 30, "gpu_hours": 12}, sampler="grid",
                                         exclude=[{"tensor_parallel_size": 1}])))
    res = CliRunner().invoke(main, ["run", str(f), "--dry-run"])
    assert res.exit_code == 0, res.output
    out = res.output
    assert "tensor_parallel_size: choices [1, 2, 4, 8]" in out and "Budget: 30 candidates" in out
    assert "12 GPU-hours" in out and "Objective: output_throughput per GPU (maximize)" in out
    assert out.count("[candidate ") == 4 and "First candidates" in out and "whichever comes first" in out
    assert "refused: matches tune.exclude" in out   # the grid sampler starts at tensor_parallel_size 1
    assert "one candidate about" in out and "30 candidates at most about" in out


@pytest.mark.vllm
def test_a_real_vllm_tuning_campaign_killed_mid_way_then_resumed(tiny_model, gpu_cluster, tmp_path, monkeypatch):
    """configs/tune-cpu.yaml (3 candidates of the tiny model, one at a time) on the session's simulated cluster
    (`raysweep run --address`): its driver SIGKILLed once the first candidate's point is done, every server
    gone with it and every GPU free again; `raysweep resume` then completes every candidate, the first one
    never run again."""
    import os
    import signal
    import subprocess

    from test_vllm_integration import MARK, REPO, _ours, _sha

    from raysweep import procs
    from raysweep.ledger import Ledger

    data = yaml.safe_load((REPO / "configs/tune-cpu.yaml").read_text())
    data["serve"]["env"][MARK] = str(tmp_path)     # marks the servers (and their children) as this test's
    data["tune"]["parallel"] = 1
    cfg, out = tmp_path / "tune.yaml", tmp_path / "tune"
    cfg.write_text(yaml.safe_dump(data))
    env = {**os.environ, "RAYSWEEP_DEMO_MODEL": str(tiny_model), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           "RAY_AUTH_MODE": "disabled", "VLLM_HOST_IP": "127.0.0.1"}
    cli = [sys.executable, "-m", "raysweep"]
    with (tmp_path / "run.log").open("w") as log:
        proc = subprocess.Popen([*cli, "run", str(cfg), "--output-dir", str(out), "--address", gpu_cluster.address],
                                env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        def second_starting() -> bool:   # the first candidate's point is done and the next server is starting
            return (out.exists() and len(list((out / "points").rglob("*.json"))) == 1
                    and len(list((out / "logs").glob("server-*.log"))) >= 2 and bool(_ours(str(tmp_path))))

        assert procs.wait_for(second_starting, 300, 0.2), \
            (tmp_path / "run.log").read_text()[-3000:]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    first = {p: _sha(p) for p in (out / "points").rglob("*.json")}
    assert len(first) == 1
    # the killed driver's servers go with it, and the cluster takes its GPUs back
    import ray

    assert procs.wait_for(lambda: not _ours(str(tmp_path)), 60), f"left running: {_ours(str(tmp_path))}"
    assert procs.wait_for(lambda: ray.available_resources().get("GPU", 0) == ray.cluster_resources()["GPU"], 60)
    done = subprocess.run([*cli, "resume", str(out), "--address", gpu_cluster.address], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert not _ours(str(tmp_path)), "a server outlived the campaign"
    assert all(_sha(p) == h for p, h in first.items()), "a finished result was rewritten"
    led = Ledger.open_existing(out)
    rows, points, servers = led.candidates(), led.points(), led.servers()
    led.close()
    assert [r["state"] for r in rows] == ["complete"] * 3
    assert sorted(r["params"]["max_num_seqs"] for r in rows) == [2, 4, 8]
    assert all(r["objective"][0] > 0 and r["gpu_count"] == 1 and r["gpu_s"] > 0 for r in rows)
    assert len(points) == 3 and all(p.state == "done" and p.attempts == 1 for p in points)
    # the server running at the kill is recorded lost, every other one stopped
    assert {s.state for s in servers} <= {"stopped", "lost"} and 1 <= sum(s.state == "lost" for s in servers) <= 2
    assert {s.serve_id for s in servers} == {r["serve_id"] for r in rows} and len(servers) == 4
    buf = wide(monkeypatch)
    res = CliRunner().invoke(main, ["tune", str(out)])
    assert res.exit_code == 0 and buf.getvalue().count("complete") == 3


def test_the_sla_capacity_objective_is_the_largest_load_meeting_every_target(tmp_path):
    data = campaign(objective={"metric": "sla_capacity", "per": "gpu"}, parallel=2, budget={"candidates": 2},
                    space={"tensor_parallel_size": {"choices": [1, 2]}, "max_num_seqs": {"choices": [64, 128]}},
                    sampler="grid")
    data["bench"]["params"] = {"grid": {"random_input_len": [128, 256]}}
    data["sla"] = {"variable": "max_concurrency", "targets": [{"p99_e2el_ms": "<=200"}, {"p99_ttft_ms": "<=50"}]}
    plan, ledger = open_campaign(campaign_from_dict(data, base_dir=tmp_path), CampaignDir(tmp_path / "out"))
    work = TuneWork(plan, CampaignDir.around(tmp_path / "out", ledger), lambda kind, **d: None, with_gpus=True)
    work.nodes_now = bench.SimCluster(nodes=1, gpus=8, rng=random.Random(0)).nodes()
    work.refill()
    cands = list(work.cands.values())
    assert len(cands) == 2 and work.budget_left() is not None and "2 candidate(s) tried" in work.budget_left()
    targets = sorted({t for _, t in work.open_searches(cands[0].serve.id)}, key=str)
    assert work.work_left(cands[0].serve.id) == 2 * 2   # 2 bench points x 2 targets, one run each
    for cand, caps in zip(cands, ([(40, 16), (24, 32)], [(None, 8), (64, 64)])):
        for bench_point, (cap_a, cap_b) in zip(plan.benches, caps):
            for target, cap in zip(targets, (cap_a, cap_b)):
                ledger.record_search(cand.serve.id, bench_point.id, work_key(work, target), "done", cap, None, 3,
                                     [], {})
        work.started(cand.serve.id, cand.serve.shape.gpu_count)
        work.ended(cand.serve.id, "finished")
    gpus = [c.serve.shape.gpu_count for c in cands]
    # per bench point the smallest over the targets (every target must hold), then the best bench point, per GPU
    assert [c.state for c in cands] == ["complete", "complete"]
    assert cands[0].objective == [24 / gpus[0]] and cands[1].objective == [64 / gpus[1]]
    assert work.work_left(cands[0].serve.id) == 0
    ledger.close()


def work_key(work: TuneWork, target: Any) -> str:
    from raysweep.sla import search as sla

    return sla.search_key(work.c.sla, target)


def test_a_candidate_no_node_can_hold_any_more_fails_and_frees_its_place(tmp_path):
    data = campaign(budget={"candidates": 3}, parallel=1, sampler="grid",
                    space={"tensor_parallel_size": {"choices": [8]}, "max_num_seqs": {"choices": [64, 128, 256]}})
    spec = campaign_from_dict(data, base_dir=tmp_path)
    plan, ledger = open_campaign(spec, CampaignDir(tmp_path / "out"))
    sim = bench.SimCluster(nodes=1, gpus=8, rng=random.Random(0))
    run_dir = CampaignDir.around(tmp_path / "out", ledger)
    work = sim.work = TuneWork(plan, run_dir, lambda kind, **d: None, with_gpus=True, clock=sim.clock)
    sched = Scheduler(TunedCluster(sim, work), work, lambda kind, **d: None, max_servers=None, clock=sim.clock)
    sim.node_list = [bench.NodeInfo("small", "10.0.0.9", 4, 64.0)]   # only 4 GPUs left: tp 8 no longer fits
    work.nodes_now = bench.SimCluster(nodes=1, gpus=8, rng=random.Random(0)).nodes()
    work.refill()                                                      # asked while the 8-GPU node was there
    [first] = work.live()
    sched.step()                                                       # it waits for nodes it fits first
    assert work.cands[first.number].state == "running"
    sim.now += sched.replace_wait_s + 1                                # no such node came back in time
    sched.step()
    assert work.cands[first.number].state == "failed" and "can no longer be placed" in work.cands[first.number].reason
    assert not work.live() or work.live()[0].number != first.number
    ledger.close()


def test_after_the_start_up_a_pareto_campaign_takes_the_surrogates_proposals(tmp_path):
    import math

    from raysweep import tune

    data = bench.campaign("pareto", 6, 1.0)
    data["tune"]["budget"] = {"candidates": 24}
    work, ledger, started = simulate(tmp_path, data, seed=6)
    first_polish = math.ceil(24 * (1 - tune.POLISH_SHARE) - 1e-9)
    # the sampler's start-up, then the surrogate's proposals until the polishing share, each once
    assert work.modelled == set(range(tune.STARTUP, first_polish)) and len(started) == len(set(started)) == 24
    ledger.close()
    data["tune"]["pareto_model"] = False
    work, ledger, started = simulate(tmp_path / "off", data, seed=6)
    assert work.modelled == set() and len(started) == 24
    ledger.close()


def test_a_tuning_campaign_on_energy_per_output_token_minimises_it(tmp_path, monkeypatch):
    """`{metric: j_per_output_token, direction: minimize}`: each candidate's objective is the least J per output
    token of its points, and the leaderboard leads with the least, not the most."""
    import json
    import math
    import re

    joules: dict[str, list[float]] = {}

    def record(self, point):  # the simulated point also measures 400 W per GPU over its tokens
        c = int(point.bench.params["max_concurrency"])
        value = bench.true_throughput(point.serve.params, c) * math.exp(self.rng.gauss(0, bench.NOISE))
        j = 400.0 * int(point.serve.params.get("tensor_parallel_size", 1)) / value
        joules.setdefault(point.serve.id, []).append(j)
        rel = f"points/{point.id}.json"
        path = self.work.output_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"output_throughput": value, "max_concurrency": c, "j_per_output_token": j}))
        self.work.ledger.mark_running(point.id, "sim")
        self.work.ledger.mark_done(point.id, rel)

    monkeypatch.setattr(bench.SimCluster, "_record", record)
    data = campaign(budget={"candidates": 12}, seed=7)
    data["tune"]["objective"] = {"metric": "j_per_output_token", "direction": "minimize"}
    work, ledger, _ = simulate(tmp_path, data, seed=7)
    rows = [r for r in ledger.candidates() if r["objective"]]
    done = [r for r in rows if r["state"] == "complete"]
    assert len(ledger.candidates()) == 12 and done
    pruned = [r for r in ledger.candidates() if r["state"] == "pruned"]
    assert pruned and all("j_per_output_token" in r["reason"] for r in pruned)
    # the rungs rank by it too, the least first: the most J per output token at a rung is ranked last there
    first = [r for r in pruned if r["reason"].startswith("rung 1 ")]
    worst = max(first, key=lambda r: joules[r["serve_id"]][0])
    assert first and re.search(r"ranks (\d+) of \1;", worst["reason"])
    for r in done:
        assert r["objective"][0] == pytest.approx(min(joules[r["serve_id"]]))
    board = leaderboard(ledger.stored_campaign(), ledger.candidates())
    assert board[0]["state"] == "complete"
    assert board[0]["objective"][0] == min(r["objective"][0] for r in done)
    assert board[0]["objective"][0] < max(r["objective"][0] for r in done)
    ledger.close()

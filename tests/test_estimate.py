"""raysweep.plan.estimate (pure) and the estimate of `raysweep run --dry-run`."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import standin_campaign

from raysweep.campaign import load_campaign
from raysweep.cli import main
from raysweep.ledger import LEDGER_FILE, Ledger
from raysweep.plan.estimate import DEFAULTS, Measured, estimate, eta_s, format_duration, guess_point_s, measured_from
from raysweep.plan.plan import build_plan
from raysweep.record.directory import CampaignDir

REQ_S = DEFAULTS.ttft_s + 31 * DEFAULTS.itl_s  # one request of 32 output tokens


def test_guess_from_concurrency_rate_and_defaults():
    by_concurrency = guess_point_s(["vllm", "bench", "serve", "--num-prompts", "100", "--max-concurrency", "10",
                                    "--random-output-len", "32"])
    assert by_concurrency == pytest.approx(10 * REQ_S + DEFAULTS.point_overhead_s)
    by_rate = guess_point_s(["--num-prompts=100", "--request-rate", "2", "--random-output-len", "32"])
    assert by_rate == pytest.approx(50 + REQ_S + DEFAULTS.point_overhead_s)  # 100 prompts at 2/s
    everything_default = guess_point_s([])
    waves = -(-DEFAULTS.num_prompts // DEFAULTS.unbounded_concurrency)
    assert everything_default == pytest.approx(
        waves * (DEFAULTS.ttft_s + (DEFAULTS.output_len - 1) * DEFAULTS.itl_s) + DEFAULTS.point_overhead_s)


def test_offline_points_each_start_an_engine():
    assert guess_point_s(["vllm", "bench", "throughput", "--num-prompts", "10"], offline=True) > DEFAULTS.server_start_s


def _plan(tmp_path: Path, servers: int = 2, benches: int = 2, runs: int = 1):
    f = standin_campaign(tmp_path, serve_params={"grid": {"max_num_seqs": [8, 16, 32][:servers]}},
                         bench_params={"grid": {"max_concurrency": [1, 2, 5][:benches]}}, runs=runs,
                         bench={"cmd": "vllm bench serve --model m --num-prompts 10 --random-output-len 32"})
    return build_plan(load_campaign(f))


def test_estimate_from_defaults_counts_starts_gpu_hours_and_lanes(tmp_path):
    plan = _plan(tmp_path)
    point = {1: 10 * REQ_S, 2: 5 * REQ_S}
    per_config = DEFAULTS.server_start_s + sum(point.values()) + 2 * DEFAULTS.point_overhead_s
    one_lane = estimate(plan)
    assert (one_lane.server_starts, one_lane.points, one_lane.basis) == (2, 4, "defaults")
    assert one_lane.wall_s == pytest.approx(2 * per_config)
    assert one_lane.gpu_hours == pytest.approx(2 * per_config / 3600)  # tp 1: one GPU each
    two_lanes = estimate(plan, lanes=2, gpus_of={s.id: 8 for s in plan.serves})
    assert two_lanes.wall_s == pytest.approx(per_config)
    assert two_lanes.gpu_hours == pytest.approx(16 * per_config / 3600)


def test_done_points_and_running_servers_are_not_counted_again(tmp_path):
    plan = _plan(tmp_path)
    first = plan.serves[0].id
    done = {p.id for p in plan.points if p.serve.id == first}
    est = estimate(plan, done=done)
    assert (est.server_starts, est.points, list(est.per_serve_s)) == (1, 2, [plan.serves[1].id])
    assert estimate(plan, running={first, plan.serves[1].id}).server_starts == 0


def test_measured_durations_win_and_calibrate_the_rest(tmp_path):
    plan = _plan(tmp_path)
    s0, s1 = plan.serves
    b0, b1 = plan.benches
    m = Measured()
    m.add_start(s0.id, 30.0)
    m.add_point(s0.id, b0.id, 7.0)
    m.add_point(s0.id, b0.id, 9.0)  # median 8
    est = estimate(plan, measured=m)
    assert est.basis == "calibrated"
    scale = 8.0 / guess_point_s(b0.argv)
    # s0: its measured start and point, the other point scaled; s1: the measured start of another config
    expected_s0 = 30 + 8 + scale * guess_point_s(b1.argv)
    expected_s1 = 30 + scale * (guess_point_s(b0.argv) + guess_point_s(b1.argv))
    assert est.per_serve_s[s0.id] == pytest.approx(expected_s0)
    assert est.per_serve_s[s1.id] == pytest.approx(expected_s1)
    for s in plan.serves:
        for b in plan.benches:
            m.add_point(s.id, b.id, 4.0)
    assert estimate(plan, measured=m).basis == "measured"


def test_eta_from_measured_durations_only():
    m = Measured()
    assert eta_s([("a", "x")], m, set(), 1) is None
    m.add_point("a", "x", 10.0)
    m.add_point("b", "y", 20.0)
    m.add_start("a", 60.0)
    # a runs: two runs of x (10 each); b waits: a start (median of a's) and y (20) and z (no measure: median 15)
    assert eta_s([("a", "x"), ("a", "x"), ("b", "y"), ("b", "z")], m, {"a"}, 1) == pytest.approx(20 + 60 + 35)
    assert eta_s([("a", "x"), ("a", "x"), ("b", "y"), ("b", "z")], m, {"a"}, 2) == pytest.approx(95)


def test_format_duration():
    assert [format_duration(s) for s in (42, 600, 3 * 3600 + 5 * 60)] == ["42 s", "10 min", "3 h 05 min"]


def _ledger_with_times(out: Path, points: list[tuple[str, str, str, str, float | None]],
                       servers: list[tuple[str, str, float | None]]) -> None:
    """points: (point id, serve id, bench id, state, duration); servers: (server id, serve id, start seconds)."""
    out.mkdir(parents=True, exist_ok=True)
    led = Ledger(out / LEDGER_FILE)
    try:
        led.sync(name="camp", fingerprint="fp", meaning={}, campaign={"name": "camp"}, campaign_file="c.yaml",
                 points=[(pid, sid, bid, 0, {"max_num_seqs": 8}, {}) for pid, sid, bid, _, _ in points])
        for server_id, serve_id, _ in servers:
            led.add_server(server_id, serve_id, "vllm serve m")
    finally:
        led.close()
    with sqlite3.connect(out / LEDGER_FILE) as c:
        for pid, _, _, state, duration in points:
            if duration is not None:
                c.execute("UPDATE points SET state = ?, started_at = 1000, ended_at = ? WHERE point_id = ?",
                          (state, 1000 + duration, pid))
            else:
                c.execute("UPDATE points SET state = ? WHERE point_id = ?", (state, pid))
        for server_id, _, start in servers:
            c.execute("UPDATE servers SET started_at = 500, ready_at = ?, stopped_at = 900 WHERE server_id = ?",
                      (None if start is None else 500 + start, server_id))


def test_measured_from_a_ledger(tmp_path):
    out = tmp_path / "out"
    _ledger_with_times(out, [("p1", "s1", "b1", "done", 12.0), ("p2", "s1", "b2", "pending", None)],
                       [("s1-aa", "s1", 45.0), ("s1-bb", "s1", None)])
    m = measured_from(CampaignDir(out))
    assert m.point_s == {("s1", "b1"): [12.0]}
    assert m.server_start_s == {"s1": [45.0]}  # the server that never got ready is not a start time


def test_dry_run_prints_an_estimate_and_uses_measured_durations(tmp_path):
    f = standin_campaign(tmp_path, bench_params={"grid": {"max_concurrency": [1, 2]}})
    runner = CliRunner()
    first = runner.invoke(main, ["run", str(f), "--dry-run"])
    assert first.exit_code == 0, first.output
    assert "Estimate (defaults): 1 server start(s), 2 run(s)" in first.output
    plan = build_plan(load_campaign(f))
    earlier = tmp_path / "earlier"
    _ledger_with_times(earlier, [("x", plan.serves[0].id, b.id, "done", 300.0) for b in plan.benches][:1]
                       + [("y", plan.serves[0].id, plan.benches[1].id, "done", 300.0)],
                       [("srv", plan.serves[0].id, 100.0)])
    second = runner.invoke(main, ["run", str(f), "--dry-run", "--estimate-from", str(earlier)])
    assert second.exit_code == 0, second.output
    assert "Estimate (measured): 1 server start(s), 2 run(s)" in second.output
    assert "wall time about 12 min" in second.output  # 100 s start + 2 x 300 s
    assert f"measured in {earlier}" in second.output
    refused = runner.invoke(main, ["run", str(f), "--estimate-from", str(earlier)])
    assert refused.exit_code == 2 and "--estimate-from" in refused.output


def test_dry_run_counts_only_what_is_left_in_its_own_output_dir(tmp_path):
    f = standin_campaign(tmp_path, bench_params={"grid": {"max_concurrency": [1, 2]}})
    plan = build_plan(load_campaign(f))
    p0 = plan.points[0]
    _ledger_with_times(tmp_path / "out", [(p0.id, p0.serve.id, p0.bench.id, "done", 30.0)], [])
    result = CliRunner().invoke(main, ["run", str(f), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "1 server start(s), 1 run(s)" in result.output
    assert "1 run(s) already done are not counted" in result.output

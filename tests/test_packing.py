"""Packing and node loss as data, without Ray: the scheduler's re-placement after a node loss recorded as
events, the safeguard policies of the packing simulation (benchmarks/bench_packing.py), and its point-by-point
simulation of tail replicas."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from test_scheduler import FakeCluster, FakeWork, serve

from raysweep.place.placement import Demand, Layout
from raysweep.place.scheduler import Scheduler, with_event_log

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import bench_packing


def test_a_node_loss_and_the_re_placement_are_recorded_with_nodes_and_configs():
    cluster = FakeCluster(a=2, b=2)
    rows: list[tuple[str, list[str], list[str], str]] = []
    seen: list[str] = []
    emit = with_event_log(lambda kind, **d: seen.append(kind), lambda *row: rows.append(row))
    sched = Scheduler(cluster, FakeWork(serve("x", 2), work={"x": 5}), emit, max_servers=None)
    sched.step()
    [(_, first)] = cluster.started
    cluster.lose(first[0])
    sched.step()
    cluster.end("x", "aborted")
    sched.step()
    second = cluster.started[1][1]
    assert [r[0] for r in rows] == ["node_lost", "replaced"] and seen == ["node_lost", "replaced"]
    assert rows[0][1:3] == (["x"], [first[0]]) and "was lost" in rows[0][3]
    assert rows[1][1:3] == (["x"], list(second)) and f"after losing {first[0]}" in rows[1][3]
    cluster.end("x", "finished")
    sched.step()
    assert len(rows) == 2  # an ordinary end is no event


def _demand(key: str, gpus: int, nnodes: int = 1, work: float = 1.0) -> Demand:
    return Demand(key, Layout(nnodes, gpus, "nnodes" if nnodes > 1 else "single"), ("a", "b", "c"), work)


def test_the_reservation_safeguard_holds_the_emptiest_nodes_for_a_large_config_that_waited():
    big, small = _demand("big", 4, nnodes=2, work=9), _demand("small", 1)
    free = {"a": 3, "b": 1, "c": 2}  # the 2 x 4 GPU config fits nowhere now
    policy = bench_packing.ReserveAfter(300.0)
    assert [d.key for d, _ in policy([big, small], dict(free))] == ["small"]  # not waited long: gaps filled
    policy.now = 301.0
    chosen = policy([big, small], dict(free))
    assert [(d.key, nodes) for d, nodes in chosen] == [("small", ["b"])]  # a and c are held for big


def test_the_exact_lpt_oracle_starts_the_longest_configuration_first():
    oracle = bench_packing.ExactLpt()
    oracle.duration = {"short": 10.0, "long": 100.0}
    chosen = oracle([_demand("short", 2, work=50), _demand("long", 2, work=1)], {"a": 2, "b": 0, "c": 0})
    assert [d.key for d, _ in chosen] == ["long"]


def test_the_ledger_keeps_events_and_every_failed_attempts_error_after_success(tmp_path):
    from raysweep.ledger import Ledger

    led = Ledger(tmp_path / "ledger.sqlite")
    led.sync(name="t", fingerprint="f", meaning={}, campaign={}, campaign_file="c.yaml",
             points=[("p1", "s1", "b1", 0, {}, {})], force=False, searches=[])
    led.mark_running("p1", "srv-a")
    led.requeue("p1", "node n1 (10.0.0.1) was lost during the point", max_attempts=3)
    led.mark_running("p1", "srv-b")
    led.mark_failed("p1", "server died during the point (exit code 1)")
    led.mark_running("p1", "srv-c")
    led.mark_done("p1", "points/p1.json")
    led.add_event("node_lost", ["s1"], ["n1"], "node n1 (10.0.0.1) was lost")
    led.add_event("replaced", ["s1"], ["n2", "n3"], "placed again after losing n1")
    assert led.point("p1").error is None  # the point itself is clean once done ...
    kept = led.attempt_errors("p1")  # ... and its earlier attempts keep their errors
    assert [(e["attempt"], e["server_id"]) for e in kept] == [(1, "srv-a"), (2, "srv-b")]
    assert "was lost" in kept[0]["error"] and "exit code 1" in kept[1]["error"]
    events = led.events()
    assert [(e["kind"], e["serve_ids"], e["nodes"]) for e in events] == [
        ("node_lost", ["s1"], ["n1"]), ("replaced", ["s1"], ["n2", "n3"])]
    led.close()


def test_the_point_by_point_simulation_without_tail_replicas_is_the_same_campaign():
    sc = bench_packing.SCENARIOS[3]   # one wave
    nodes, configs = bench_packing.make_nodes(sc), bench_packing.make_campaign(sc, sc.seed)
    plain = bench_packing.simulate(configs, nodes)
    shared = bench_packing.simulate_shared(configs, nodes, bench_packing.TailReplicas(0), sc.seed)
    assert shared == pytest.approx(plain, rel=1e-12)


def test_tail_replicas_shorten_a_campaign_held_up_by_one_long_configuration():
    sc = bench_packing.SCENARIOS[2]   # 8 configurations, one of 60 points: it alone sets the end
    nodes, configs = bench_packing.make_nodes(sc), bench_packing.make_campaign(sc, sc.seed)
    policy = bench_packing.TailReplicas(3)
    shared, _ = bench_packing.simulate_shared(configs, nodes, policy, sc.seed)
    longest = max(c.duration_s for c in configs)
    assert policy.extra_servers >= 1 and shared < 0.8 * longest   # up to four servers share its points

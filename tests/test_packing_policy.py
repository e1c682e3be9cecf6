"""The packer's reservation (`choose_starts` given the running configurations' time left): the first
configuration in order that does not fit holds the nodes where it will fit soonest; later ones use those
nodes only when they end before it can start. And the tail (`tail_starts`): more servers of a running
configuration while each server's share of its points takes longer than a server start."""

from __future__ import annotations

from raysweep.place.placement import Busy, Demand, Layout, Share, choose_starts, tail_starts

NODES = ("a", "b", "c")


def _demand(key: str, gpus: int, nnodes: int = 1, work: float = 1.0) -> Demand:
    return Demand(key, Layout(nnodes, gpus, "nnodes" if nnodes > 1 else "single"), NODES, work)


def test_without_running_estimates_the_gaps_are_filled_as_before():
    free = {"a": 2, "b": 2, "c": 0}
    ds = [_demand("big", 4, nnodes=2, work=900), _demand("small", 2, work=500)]
    assert [(d.key, n) for d, n in choose_starts(ds, dict(free))] == [("small", ["a"])]


def test_the_head_holds_the_nodes_it_fits_soonest_and_only_configs_ending_before_keep_using_them():
    free = {"a": 2, "b": 0, "c": 0}
    busy = [Busy(("a",), 2, 100.0), Busy(("b",), 4, 100.0), Busy(("c",), 4, 300.0)]
    big = _demand("big", 4, nnodes=2, work=900)  # 2 nodes x 4 GPUs: fits on a and b at 100 s
    long_small, short_small = _demand("long", 2, work=500), _demand("short", 2, work=80)
    assert [d.key for d, _ in choose_starts([big, long_small], dict(free))] == ["long"]  # no estimates: gap filled
    assert choose_starts([big, long_small], dict(free), busy=busy) == []  # would hold a past 100 s
    assert [(d.key, n) for d, n in choose_starts([big, short_small], dict(free), busy=busy)] == [("short", ["a"])]


def test_only_the_held_nodes_are_kept_free():
    free = {"a": 4, "b": 2, "c": 2}
    busy = [Busy(("b",), 2, 100.0), Busy(("c",), 2, 300.0)]
    # 2 x 4 GPUs fits first at 100 s, on a and b: c stays open to a long config, b does not
    ds = [_demand("big", 4, nnodes=2, work=900), _demand("long", 2, work=500), _demand("long2", 2, work=400)]
    chosen = choose_starts(ds, dict(free), busy=busy)
    assert [(d.key, n) for d, n in chosen] == [("long", ["c"])]


def _bench():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import bench_packing

    return bench_packing


def test_the_simulation_estimates_from_measured_points_only_once_they_exist():
    bp = _bench()
    nodes = [bp.NodeInfo(node_id="a", ip="1", gpus=8, cpus=8.0)]
    configs = [bp.Config("many-fast", bp.Shape(1), 10, 110.0, 100.0, 1.0),     # 10 points of 1 s
               bp.Config("few-slow", bp.Shape(2), 3, 400.0, 100.0, 100.0),     # 3 points of 100 s
               bp.Config("probe-1", bp.Shape(1), 1, 101.0, 100.0, 1.0),
               bp.Config("probe-2", bp.Shape(2), 1, 200.0, 100.0, 100.0)]
    layouts = {c.key: bp.layout_of(c, nodes) for c in configs}
    policy = bp.Estimated("campaign")
    policy.bind(configs, layouts, seed=1)
    demands = [Demand(c.key, layouts[c.key], ("a",), float(c.points)) for c in configs[:2]]
    # nothing measured yet: points decide, and only one of the two fits the 2 free GPUs
    assert [d.key for d, _ in policy(demands, {"a": 2})] == ["many-fast"]
    # one point measured on 1 GPU (1 s) and one on 2 GPUs (100 s): the slow configuration goes first
    policy.started, policy.now = {"probe-1": (0.0, ["a"]), "probe-2": (0.0, ["a"])}, 201.0
    assert [d.key for d, _ in policy(demands, {"a": 2})] == ["few-slow"]
    # an earlier campaign's ledger knows each configuration's own point time: the slow one goes first
    history = bp.Estimated("history")
    history.bind(configs, layouts, seed=1)
    assert [d.key for d, _ in history(demands, {"a": 2})] == ["few-slow"]


def share(key: str, gpus: int, servers: int, left: int, point_s: float, start_s: float, most: int = 4) -> Share:
    return Share(key, Layout(1, gpus, "single"), ("a", "b"), servers, left, point_s, start_s, most)


def test_tail_servers_start_while_each_share_takes_longer_than_a_server_start():
    # 10 points of 30 s left: 300 s for one server, 150 each for two, 100 for three; a start takes 120 s:
    # one server's 300 > 120 adds a second, two servers' 150 > 120 a third, three servers' 100 < 120 stops
    free = {"a": 4, "b": 4}
    assert tail_starts([share("x", 2, 1, 10, 30.0, 120.0)], free) == [("x", ["a"]), ("x", ["a"])]   # best fit
    assert free == {"a": 0, "b": 4}
    # at 90 s a start: 300 / 3 = 100 > 90 -> a fourth server, but max_servers stops it at 3
    assert len(tail_starts([share("x", 1, 1, 10, 30.0, 90.0, most=3)], {"a": 4, "b": 4})) == 2
    # a share shorter than a start: nothing
    assert tail_starts([share("x", 1, 1, 3, 30.0, 120.0)], {"a": 4, "b": 4}) == []


def test_the_configuration_whose_points_end_last_gets_the_free_gpus_first():
    free = {"a": 2, "b": 0}
    got = tail_starts([share("soon", 2, 1, 10, 30.0, 60.0), share("late", 2, 2, 40, 30.0, 60.0)], free)
    assert got == [("late", ["a"])] and free == {"a": 0, "b": 0}   # 40 x 30 / 2 = 600 s before 300 s


def test_a_tail_server_that_fits_nowhere_is_not_started():
    assert tail_starts([share("x", 4, 1, 20, 30.0, 60.0)], {"a": 3, "b": 2}) == []

"""The scheduler against a fake cluster, without Ray: packing, concurrency, retries, node loss, stopping."""

from __future__ import annotations

import pytest

from raysweep.place.placement import Layout, NodeInfo
from raysweep.place.scheduler import (
    HOST_LOSS_LIMIT,
    INTERRUPTED,
    NODE_LOSS_WINDOW_S,
    NOT_PLACED_RETRY_S,
    Scheduler,
    replica_key,
    with_event_log,
)
from raysweep.plan.plan import ServeConfig, Shape


def serve(sid: str, gpus: int = 1, tp: int | None = None, pp: int = 1) -> ServeConfig:
    shape = Shape(tp=tp or gpus, pp=pp)
    return ServeConfig(sid, {}, ["vllm", "serve", "m"], {}, shape, sid)


class FakeCluster:
    """Nodes that can come and go; configurations that end when the test says so."""

    def __init__(self, **gpus: int) -> None:
        self.alive = [NodeInfo(name, f"10.0.0.{i}", g, 8.0) for i, (name, g) in enumerate(gpus.items())]
        self.started: list[tuple[str, tuple[str, ...]]] = []
        self.layouts: list[Layout] = []
        self.running: set[str] = set()
        self.aborted: dict[str, str] = {}
        self.ended: list[tuple[str, str]] = []
        self.joined = False

    def nodes(self) -> list[NodeInfo]:
        return list(self.alive)

    def start(self, serve: ServeConfig, layout: Layout, node_ids: list[str], replica: int = 0) -> None:
        self.started.append((replica_key(serve.id, replica), tuple(node_ids)))
        self.layouts.append(layout)
        self.running.add(replica_key(serve.id, replica))

    def finished(self) -> list[tuple[str, str]]:
        out, self.ended = self.ended, []
        return out

    def abort(self, serve_id: str, reason: str) -> None:
        self.aborted[serve_id] = reason

    def wait(self, timeout_s: float) -> None:
        pass

    def join(self) -> None:
        self.joined = True

    # what the test does to it
    def end(self, serve_id: str, outcome: str) -> None:
        self.running.discard(serve_id)
        self.ended.append((serve_id, outcome))

    def lose(self, node_id: str) -> None:
        self.alive = [n for n in self.alive if n.node_id != node_id]

    def add(self, node_id: str, gpus: int) -> None:
        self.alive.append(NodeInfo(node_id, f"10.0.1.{len(self.alive)}", gpus, 8.0))


class FakeWork:
    def __init__(self, *serves: ServeConfig, work: dict[str, int] | None = None) -> None:
        self._serves = list(serves)
        self.left = {s.id: (work or {}).get(s.id, 1) for s in serves}
        self.stop_reason: str | None = None
        self.given_up: dict[str, str] = {}

    @property
    def serves(self) -> list[ServeConfig]:
        return self._serves

    def work_left(self, serve_id: str) -> int:
        return self.left[serve_id]

    def give_up(self, serve: ServeConfig, reason: str) -> None:
        self.given_up[serve.id] = reason
        self.left[serve.id] = 0

    paces: dict[str, tuple[float, float]] = {}

    def pace(self, serve_id: str) -> tuple[float, float] | None:
        return self.paces.get(serve_id)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make(cluster: FakeCluster, work: FakeWork, max_servers: int | None = None,
         tail_replicas: int = 0, **kw) -> tuple[Scheduler, list, Clock]:
    events: list[tuple[str, dict]] = []
    clock = Clock()
    sched = Scheduler(cluster, work, lambda kind, **data: events.append((kind, data)), max_servers, clock=clock,
                      tail_replicas=tail_replicas, **kw)
    return sched, events, clock


def finish(cluster: FakeCluster, work: FakeWork, sid: str, outcome: str = "finished") -> None:
    if outcome == "finished":
        work.left[sid] = 0
    cluster.end(sid, outcome)


def test_most_work_first_then_largest_then_gap_filling():
    cluster = FakeCluster(a=4, b=5)
    work = FakeWork(serve("small", 1), serve("big", 4), serve("mid", 2), serve("busy", 2),
                    work={"small": 3, "big": 3, "mid": 3, "busy": 9})
    sched, _, _ = make(cluster, work)
    assert sched.step() is True
    # busy (most work) first; among equal work the 4-GPU one before the 2- and 1-GPU ones; all 9 GPUs used
    assert [sid for sid, _ in cluster.started] == ["busy", "big", "mid", "small"]
    # each on the node it fills most tightly: busy on a (2 left there), big on b (1 left), then the gaps
    assert dict(cluster.started) == {"busy": ("a",), "big": ("b",), "mid": ("a",), "small": ("b",)}


def test_several_configs_run_at_once_and_the_next_starts_when_gpus_free_up():
    cluster = FakeCluster(a=2)
    work = FakeWork(serve("x"), serve("y"), serve("z"))
    sched, _, _ = make(cluster, work)
    sched.step()
    assert [s for s, _ in cluster.started] == ["x", "y"] and set(sched.running) == {"x", "y"}
    sched.step()  # nothing ended: z still has no GPU
    assert len(cluster.started) == 2
    finish(cluster, work, "x")
    sched.step()
    assert [s for s, _ in cluster.started] == ["x", "y", "z"] and set(sched.running) == {"y", "z"}
    finish(cluster, work, "y")
    finish(cluster, work, "z")
    assert sched.step() is False


def test_max_servers_caps_how_many_run_at_once():
    cluster = FakeCluster(a=8)
    work = FakeWork(serve("x"), serve("y"), serve("z"))
    sched, _, _ = make(cluster, work, max_servers=1)
    sched.step()
    assert [s for s, _ in cluster.started] == ["x"]
    finish(cluster, work, "x")
    sched.step()
    assert [s for s, _ in cluster.started] == ["x", "y"]


def test_a_config_not_placed_waits_before_it_is_tried_again():
    cluster = FakeCluster(a=1)
    work = FakeWork(serve("x"))
    sched, _, clock = make(cluster, work)
    sched.step()
    cluster.end("x", "not placed")
    sched.step()
    assert len(cluster.started) == 1 and sched.running == {}     # not yet: it waits
    clock.t += NOT_PLACED_RETRY_S - 1
    assert sched.step() is True and len(cluster.started) == 1
    clock.t += 1
    sched.step()
    assert [s for s, _ in cluster.started] == ["x", "x"]


def test_a_lost_node_tears_the_config_down_and_it_is_placed_again_on_the_nodes_left():
    cluster = FakeCluster(a=2, b=2)
    work = FakeWork(serve("x", 2), work={"x": 5})
    sched, events, _ = make(cluster, work)
    sched.step()
    [(_, first)] = cluster.started
    cluster.lose(first[0])
    sched.step()
    assert "was lost" in cluster.aborted["x"] and first[0] in cluster.aborted["x"]
    assert [k for k, _ in events] == ["node_lost"] and events[0][1]["nodes"] == [first[0]]
    sched.step()  # still tearing down: not aborted twice, not started twice
    assert len(events) == 1 and len(cluster.started) == 1
    cluster.end("x", "aborted")
    sched.step()
    assert len(cluster.started) == 2 and cluster.started[1][1] != first


def test_a_config_that_no_node_left_can_hold_waits_for_nodes_then_is_given_up_with_the_reason():
    cluster = FakeCluster(a=2, b=1)
    work = FakeWork(serve("x", 2))
    sched, events, clock = make(cluster, work, replace_wait_s=60)
    sched.step()
    cluster.lose("a")
    sched.step()
    cluster.end("x", "aborted")
    assert sched.step() is True            # it had work left: it waits for nodes rather than starting elsewhere
    assert [k for k, _ in events] == ["node_lost", "waiting_for_nodes"] and events[1][1]["nodes"] == ["a"]
    assert "waiting up to 60 s" in events[1][1]["reason"] and "x" not in work.given_up
    clock.t += 59
    assert sched.step() is True and len(cluster.started) == 1
    clock.t += 1
    sched.step()
    assert sched.step() is False
    assert "can no longer be placed" in work.given_up["x"] and "waited 60 s" in work.given_up["x"]
    assert [k for k, _ in events][-1] == "cannot_place" and len(cluster.started) == 1


def test_a_gpu_config_whose_gpu_nodes_are_all_lost_never_falls_back_to_cpu_and_waits_for_a_gpu_node():
    """The lab's finding: the head without GPUs was all that was left, and a one-GPU configuration was placed
    again there with 0 GPUs (the CPU fallback, meant for a cluster that never had a GPU)."""
    cluster = FakeCluster(head=0, w=1)
    work = FakeWork(serve("x", 1), serve("y", 1), work={"x": 3, "y": 3})
    sched, events, clock = make(cluster, work, replace_wait_s=300)
    sched.step()
    assert cluster.started == [("x", ("w",))] and cluster.layouts == [Layout(1, 1)]
    cluster.lose("w")
    sched.step()
    cluster.end("x", "aborted")
    for _ in range(3):
        clock.t += 10
        assert sched.step() is True
    assert len(cluster.started) == 1, "placed on the head without GPUs"
    assert sorted(d["serve"].id for k, d in events if k == "waiting_for_nodes") == ["x", "y"]
    assert "no alive node has GPUs" in next(d["reason"] for k, d in events if k == "waiting_for_nodes")
    cluster.add("w2", 1)                   # the node comes back (or another joins): placed there, 1 GPU
    sched.step()
    assert cluster.started[1:] == [("x", ("w2",))] and cluster.layouts[1:] == [Layout(1, 1)]
    replaced = next(d for k, d in events if k == "replaced")
    assert replaced["lost"] == ["w"] and replaced["nodes"] == ["w2"] and "10.0.1.1" in replaced["where"]
    assert not work.given_up


def test_a_cluster_that_never_had_gpus_runs_every_config_on_one_cpu_bundle():
    cluster = FakeCluster(head=0, w=0)
    work = FakeWork(serve("x", 2))
    sched, _, _ = make(cluster, work, max_servers=1)
    sched.step()
    assert cluster.layouts == [Layout(1, 0)]
    # decided for the campaign: a campaign told it has GPUs does not fall back on such a cluster
    cluster2, work2 = FakeCluster(head=0), FakeWork(serve("x", 1))
    sched2, events2, _ = make(cluster2, work2, with_gpus=True)
    assert sched2.step() is True and cluster2.started == [] and [k for k, _ in events2] == ["waiting_for_nodes"]


def test_a_config_is_placed_again_only_in_the_layout_it_ran_with():
    """tp=1 pp=2 ran on one node with 2 GPUs; the nodes left have one GPU each: across two nodes would be
    other hardware (its stages then talk over the network), so it waits."""
    cluster = FakeCluster(a=2, b=1, c=1)
    work = FakeWork(serve("x", tp=1, pp=2), work={"x": 4})
    sched, events, _ = make(cluster, work)
    sched.step()
    assert cluster.started == [("x", ("a",))] and cluster.layouts == [Layout(1, 2)]
    cluster.lose("a")
    sched.step()
    cluster.end("x", "aborted")
    sched.step()
    assert len(cluster.started) == 1
    why = next(d["reason"] for k, d in events if k == "waiting_for_nodes")
    assert "cannot hold the layout it ran with (1 node x 2 GPU(s))" in why and "2 nodes x 1 GPU(s)" in why, why
    cluster.add("d", 4)
    sched.step()
    assert cluster.started[-1] == ("x", ("d",)) and cluster.layouts[-1] == Layout(1, 2)


def test_the_event_log_records_the_points_in_flight_and_where_a_config_went_again():
    rows: list[tuple] = []
    sink = with_event_log(lambda kind, **d: None, lambda *a: rows.append(a),
                          in_flight=lambda sid: ["x/b1/run=0"] if sid == "x" else [])
    cluster = FakeCluster(a=1, b=1)
    work = FakeWork(serve("x"), work={"x": 3})
    sched = Scheduler(cluster, work, sink, None, clock=Clock())
    sched.step()
    first = cluster.started[0][1][0]
    cluster.lose(first)
    sched.step()
    cluster.end("x", "aborted")
    sched.step()
    (k1, s1, n1, d1), (k2, s2, n2, d2) = rows
    assert (k1, s1, n1) == ("node_lost", ["x"], [first]) and "points in flight: x/b1/run=0" in d1
    assert (k2, s2) == ("replaced", ["x"]) and n2 != [first] and "(1 node x 1 GPU(s)) after losing" in d2


def test_host_actors_lost_again_and_again_give_the_config_up():
    cluster = FakeCluster(a=1)
    work = FakeWork(serve("x"))
    sched, _, clock = make(cluster, work)
    for _ in range(HOST_LOSS_LIMIT):
        sched.step()
        cluster.end("x", "host lost")
    sched.step()  # the limit is reached: judged once a node loss that explains it would have been seen
    assert "x" not in work.given_up
    clock.t += NODE_LOSS_WINDOW_S
    assert sched.step() is False
    assert len(cluster.started) == HOST_LOSS_LIMIT and f"lost {HOST_LOSS_LIMIT} times" in work.given_up["x"]


def test_host_actors_lost_with_their_nodes_do_not_count():
    """A node leaving the cluster kills its actors at once and is seen gone seconds later: starts lost that
    way, before or after the loss is seen, are not host losses of the configuration."""
    cluster = FakeCluster(a=1, b=1, c=1, d=1, e=1)
    work = FakeWork(serve("x"))
    sched, _, clock = make(cluster, work)
    for node in "abcd":
        sched.step()
        assert cluster.started[-1][0] == "x"
        cluster.end("x", "host lost")
        if node in "ac":  # the start's host actors are lost first, the node seen gone after
            sched.step()
        clock.t += 5
        cluster.lose(cluster.started[-1][1][0])
        sched.step()
        clock.t += 2 * NODE_LOSS_WINDOW_S
    sched.step()
    assert "x" not in work.given_up and len(cluster.started) == 5


def test_an_error_stops_the_campaign_after_the_running_configs_end():
    cluster = FakeCluster(a=1, b=1)
    work = FakeWork(serve("x"), serve("y"), serve("z"))
    sched, _, _ = make(cluster, work)
    sched.step()
    cluster.end("x", "error: RuntimeError: boom")
    assert sched.step() is True           # y still runs; z never starts
    assert work.stop_reason == "server config x: error: RuntimeError: boom"
    assert [s for s, _ in cluster.started] == ["x", "y"]
    finish(cluster, work, "y")
    assert sched.step() is False and [s for s, _ in cluster.started] == ["x", "y"]


def test_run_interrupts_what_still_runs_and_waits_for_it():
    cluster = FakeCluster(a=2, b=2)
    work = FakeWork(serve("x", 2), serve("y", 2))

    def interrupted(timeout_s: float) -> None:
        raise KeyboardInterrupt

    cluster.wait = interrupted  # type: ignore[method-assign]
    sched, _, _ = make(cluster, work)
    with pytest.raises(KeyboardInterrupt):
        sched.run()
    assert cluster.aborted == {"x": INTERRUPTED, "y": INTERRUPTED} and cluster.joined


def test_tail_replicas_start_only_once_nothing_waits_and_share_the_points_of_the_slowest():
    cluster = FakeCluster(a=2, b=2)
    work = FakeWork(serve("long", 1), serve("short", 1), serve("next", 2), work={"long": 20, "short": 2, "next": 2})
    work.paces = {"long": (30.0, 100.0), "short": (30.0, 100.0)}
    sched, events, _ = make(cluster, work, tail_replicas=2)
    sched.step()
    assert [k for k, _ in cluster.started] == ["long", "next", "short"]   # 2 GPUs on b for next, a shared
    sched.step()
    assert len(cluster.started) == 3                        # nothing waits, but no GPU is free either
    finish(cluster, work, "next")
    sched.step()                                            # b is free and nothing waits: long's 20 x 30 s
    assert cluster.started[3:] == [("long~1", ("b",)), ("long~2", ("b",))]   # 600 > 100, 300 > 100: cap 1 + 2
    assert [(k, d["replica"], d["points_left"]) for k, d in events if k == "replica"] == [("replica", 1, 20),
                                                                                          ("replica", 2, 20)]
    sched.step()
    assert len(cluster.started) == 5                        # no more than the cap, no GPU left
    cluster.end("long~1", "finished")                       # a replica ending leaves the configuration running
    sched.step()
    assert "long" in sched.running and "long~1" not in sched.running
    assert cluster.started[5:] == [("long~3", ("b",))]     # its GPU goes to a new replica while worth it


def test_without_tail_replicas_or_a_measured_pace_no_further_server_starts():
    for tail, paces in ((0, {"x": (30.0, 10.0)}), (2, {})):
        cluster = FakeCluster(a=4)
        work = FakeWork(serve("x", 1), work={"x": 50})
        work.paces = paces
        sched, _, _ = make(cluster, work, tail_replicas=tail)
        sched.step()
        sched.step()
        assert [k for k, _ in cluster.started] == ["x"]


def test_a_replica_is_not_placed_again_after_a_node_loss_and_its_error_stops_the_campaign():
    cluster = FakeCluster(a=1, b=1)
    work = FakeWork(serve("x", 1), work={"x": 50})
    work.paces = {"x": (30.0, 10.0)}
    sched, _, _ = make(cluster, work, tail_replicas=1)
    sched.step()
    sched.step()
    assert cluster.started == [("x", ("a",)), ("x~1", ("b",))]
    cluster.lose("b")
    sched.step()
    assert "was lost" in cluster.aborted["x~1"] and "x" not in cluster.aborted
    cluster.end("x~1", "aborted")
    sched.step()
    assert sched.lost_from == {} and set(sched.running) == {"x"}
    cluster.alive.append(cluster.alive[0].__class__("b", "10.0.0.9", 1, 8.0))
    sched.step()
    assert cluster.started[-1] == ("x~2", ("b",))
    cluster.end("x~2", "error: RuntimeError: boom")
    sched.step()
    assert work.stop_reason == "server config x (replica 2): error: RuntimeError: boom"

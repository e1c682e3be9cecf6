"""What starts where and when: server configurations packed onto free GPUs, stepped one event at a time.

Each `step` looks at the cluster's nodes, tears down configurations whose nodes were lost, collects the
ones that ended (a configuration not placed yet waits `NOT_PLACED_RETRY_S` before it is tried again; one
whose host actors keep getting lost is given up after `HOST_LOSS_LIMIT` starts; an error stops the
campaign), and starts what fits: most work first, largest shapes first among equals, smaller ones filling
the gaps (`placement.choose_starts`), never more than `max_servers` at once.

A configuration is placed again (after a node loss) only where its shape fits: the GPUs it asks for, in
the layout it first ran with. Whether the campaign runs on GPUs is decided once (`with_gpus`): the CPU
fallback (one CPU bundle per configuration) is for a cluster without any GPU, never for GPU nodes that are
gone. A configuration that fits none of the nodes left waits for nodes up to `replace_wait_s` (a
`waiting_for_nodes` event), then its points fail with the reason (`cannot_place`). With `tail_replicas`, once
nothing is waiting, GPUs that would idle start more servers of running configurations to share their
unclaimed points (`placement.tail_starts`, from each one's measured pace: `Work.pace`).

The scheduler knows nothing of how a server or a benchmark works inside. It talks to two small
interfaces: a `Cluster` (nodes, start a configuration, the ones that ended, abort; Ray in production, a
fake in tests) and a `Work` (which configurations have work left, and giving one up).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from raysweep.place import pd as pd_place
from raysweep.place import placement
from raysweep.place.placement import Layout, NodeInfo
from raysweep.plan.plan import ServeConfig

__all__ = ["Cluster", "HOST_LOSS_LIMIT", "INTERRUPTED", "NOT_PLACED_RETRY_S", "REPLACE_WAIT_S", "Running", "Scheduler",
           "Work", "replica_key", "with_event_log"]

log = logging.getLogger(__name__)

INTERRUPTED = "interrupted"  # the abort reason when the campaign itself stops: the running point does not count
HOST_LOSS_LIMIT = 3          # starts lost to host actors before a configuration's points fail
NODE_LOSS_WINDOW_S = 30.0    # a host loss this close to a node leaving the cluster is the node's, not counted
NOT_PLACED_RETRY_S = 10.0    # how long a configuration Ray could not place waits before it is tried again
REPLACE_WAIT_S = 300.0       # how long a configuration that fits none of the nodes left waits for nodes (default)


class Cluster(Protocol):
    """Where configurations run. `start` returns at once; the configuration runs until it ends by itself
    (its outcome: "finished", "stopped", "aborted", "not placed", "host lost" or "error: ...") or is aborted."""

    def nodes(self) -> list[NodeInfo]:
        """The nodes alive now, with their GPUs and CPUs."""
        ...

    def start(self, serve: ServeConfig, layout: Layout, node_ids: list[str], replica: int = 0) -> None:
        """Start running a configuration on these nodes (`replica` > 0: one more server of a running one,
        known as `replica_key(serve.id, replica)`, sharing its unclaimed points)."""
        ...

    def finished(self) -> list[tuple[str, str]]:
        """(configuration id or replica key, outcome) of each run that ended since the last call."""
        ...

    def abort(self, serve_id: str, reason: str) -> None:
        """Ask a running configuration (or replica key) to stop now."""
        ...

    def wait(self, timeout_s: float) -> None:
        """Until a configuration ends, or `timeout_s` passes."""
        ...

    def join(self) -> None:
        """Until every configuration started has ended."""
        ...


class Work(Protocol):
    """What the campaign still has to do, and why it stops (None while it goes on)."""

    stop_reason: str | None

    @property
    def serves(self) -> list[ServeConfig]:
        """Every configuration of the plan, in plan order."""
        ...

    def work_left(self, serve_id: str) -> int:
        """How much a configuration still has to run (0: nothing)."""
        ...

    def give_up(self, serve: ServeConfig, reason: str) -> None:
        """Fail a configuration's remaining work for good."""
        ...

    def pace(self, serve_id: str) -> tuple[float, float] | None:
        """Its measured seconds per point and per server start, or None (not measured yet, or its work
        cannot be shared between servers). Asked only with `tail_replicas`."""
        ...


def replica_key(serve_id: str, replica: int) -> str:
    """How the scheduler and the cluster know a configuration's further server at the tail."""
    return f"{serve_id}~{replica}" if replica else serve_id


def with_event_log(emit: Callable[..., None], add_event: Callable[[str, list[str], list[str], str], None],
                   in_flight: Callable[[str], list[str]] | None = None) -> Callable[..., None]:
    """The event sink that also records node losses (with the points in flight on the configuration then,
    `in_flight(serve id)`), re-placements, waits for nodes, configurations that cannot be placed and tail
    replicas (`add_event(kind, serve ids, nodes, detail)`, e.g. `Ledger.add_event`) before passing every
    event on."""
    def sink(kind: str, **data: object) -> None:
        if kind == "node_lost":
            points = in_flight(data["serve"].id) if in_flight is not None else []  # type: ignore[attr-defined]
            data["points"] = points
            add_event(kind, [data["serve"].id], list(data["nodes"]),  # type: ignore[attr-defined,call-overload]
                      f"{data['reason']}; points in flight: {', '.join(points) or 'none'}")
        elif kind in ("waiting_for_nodes", "cannot_place"):
            add_event(kind, [data["serve"].id], list(data.get("nodes") or []),  # type: ignore[attr-defined,call-overload]
                      str(data["reason"]))
        elif kind == "replica":
            add_event(kind, [data["serve"].id], list(data["nodes"]),  # type: ignore[attr-defined,call-overload]
                      f"one more server of it (replica {data['replica']}) to share its {data['points_left']} "
                      "points left")
        elif kind == "replaced":
            add_event(kind, [data["serve"].id], list(data["nodes"]),  # type: ignore[attr-defined,call-overload]
                      f"placed again on {data.get('where') or ', '.join(n[:12] for n in data['nodes'])} "  # type: ignore[attr-defined]
                      f"({data['layout'].describe()}) after losing "  # type: ignore[attr-defined]
                      f"{', '.join(n[:12] for n in data['lost'])}")  # type: ignore[attr-defined]
        emit(kind, **data)
    return sink


@dataclass
class Running:
    """A configuration started on the cluster and not yet seen to end."""

    serve: ServeConfig
    layout: Layout
    node_ids: list[str]
    abort: str | None = None
    replica: int = 0  # > 0: a further server of a running configuration, at the campaign's tail


class Scheduler:
    """Decides which configurations run where; `run` steps until nothing is left to start or running."""

    def __init__(self, cluster: Cluster, work: Work, emit: Callable[..., None], max_servers: int | None,
                 clock: Callable[[], float] = time.monotonic, tail_replicas: int = 0, with_gpus: bool | None = None,
                 replace_wait_s: float = REPLACE_WAIT_S) -> None:
        self.cluster, self.work, self.emit, self.max_servers, self.clock = cluster, work, emit, max_servers, clock
        self.tail_replicas = tail_replicas
        self.with_gpus = with_gpus  # the campaign's decision (None: taken from the nodes at the first step)
        self.replace_wait_s = replace_wait_s
        self.layouts: dict[str, Layout] = {}  # the layout each configuration first ran with: kept
        self.waiting: dict[str, float] = {}  # configurations that fit none of the nodes left: since when
        self.replicas: dict[str, int] = {}  # further servers started per configuration, for their keys
        self.running: dict[str, Running] = {}
        self.not_before: dict[str, float] = {}
        self.host_losses: dict[str, list[float]] = {}  # when each start of a configuration lost its host actors
        self.judge_at: dict[str, float] = {}  # configurations at the limit, given up then unless a node loss explains
        self.node_losses: list[float] = []  # when nodes left the cluster
        self.alive_before: set[str] = set()
        self.node_ips: dict[str, str] = {}
        self.lost_from: dict[str, list[str]] = {}  # configurations torn down by a node loss: the nodes lost

    def run(self) -> None:
        """Step until done; whatever still runs at the end (an exception, an interrupt) is aborted and awaited."""
        try:
            while self.step():
                self.cluster.wait(1.0)
        finally:
            for key, r in self.running.items():
                if not r.abort:
                    r.abort = INTERRUPTED
                    self.cluster.abort(key, INTERRUPTED)
            self.cluster.join()

    def step(self) -> bool:
        """One look at the cluster: lost nodes, ended configurations, new starts. False when done."""
        nodes = self.cluster.nodes()
        if self.with_gpus is None:
            self.with_gpus = placement.has_gpus(nodes)
        self.node_ips.update({n.node_id: n.ip for n in nodes})
        self._notice_lost_nodes({n.node_id for n in nodes})
        self._collect_finished()
        self._judge_host_losses()
        pending = [] if self.work.stop_reason else self._pending()
        if not pending and not self.running:
            return False
        now = self.clock()
        self._start_what_fits([(s, w) for s, w in pending if self.not_before.get(s.id, 0) <= now], nodes)
        if self.tail_replicas and not pending and not self.work.stop_reason:
            self._start_tail_replicas(nodes)
        return True

    def _pending(self) -> list[tuple[ServeConfig, int]]:
        out = []
        for s in self.work.serves:
            if s.id not in self.running:
                n = self.work.work_left(s.id)
                if n:
                    out.append((s, n))
        return out

    def _notice_lost_nodes(self, alive: set[str]) -> None:
        if self.alive_before - alive:  # host actors lost about now went with the node: not counted
            now = self.clock()
            self.node_losses.append(now)
            for times in self.host_losses.values():
                times[:] = [t for t in times if abs(t - now) > NODE_LOSS_WINDOW_S]
        self.alive_before = alive
        for key, r in self.running.items():
            lost = [n for n in r.node_ids if n not in alive]
            if lost and not r.abort:
                where = ", ".join(f"{n[:12]} ({self.node_ips.get(n, '?')})" for n in lost)
                r.abort = f"node {where} was lost"
                self.cluster.abort(key, r.abort)
                log.warning("server config %s: %s; tearing its server down", key, r.abort)
                self.emit("node_lost", serve=r.serve, nodes=lost, reason=r.abort, replica=r.replica)
                if not r.replica:  # a replica is not placed again: the configuration's other servers go on
                    self.lost_from[key] = lost

    def _collect_finished(self) -> None:
        for sid, outcome in self.cluster.finished():
            r = self.running.pop(sid)
            if r.replica:
                if outcome.startswith("error"):
                    self.work.stop_reason = f"server config {r.serve.id} (replica {r.replica}): {outcome}"
                continue
            if outcome == "not placed":
                self.not_before[sid] = self.clock() + NOT_PLACED_RETRY_S
            elif outcome == "host lost":
                now = self.clock()
                if not any(abs(now - t) <= NODE_LOSS_WINDOW_S for t in self.node_losses):
                    self.host_losses.setdefault(sid, []).append(now)
                if len(self.host_losses.get(sid, [])) >= HOST_LOSS_LIMIT:  # judged once a node loss would show
                    self.judge_at[sid] = self.not_before[sid] = now + NODE_LOSS_WINDOW_S
            elif outcome.startswith("error"):
                self.work.stop_reason = f"server config {sid}: {outcome}"

    def _judge_host_losses(self) -> None:
        """Give up a configuration whose starts lost their host actors `HOST_LOSS_LIMIT` times, unless node
        losses explain them: a node leaving the cluster kills its actors at once but is known to be gone only
        seconds later, so the limit is judged `NODE_LOSS_WINDOW_S` after it was reached (the configuration
        waits meanwhile), and host losses that close to a node loss are not counted."""
        now = self.clock()
        for sid, when in list(self.judge_at.items()):
            if now < when:
                continue
            del self.judge_at[sid]
            lost = len(self.host_losses.get(sid, []))
            serve = next((s for s in self.work.serves if s.id == sid), None)
            if lost >= HOST_LOSS_LIMIT and serve is not None:
                self.work.give_up(serve, f"its host actors were lost {lost} times while starting")

    def _start_what_fits(self, ready: list[tuple[ServeConfig, int]], nodes: list[NodeInfo]) -> None:
        demands, by_id = [], {}
        for serve, work in ready:
            lay = self._layout(serve, nodes)
            if isinstance(lay, str):
                self._cannot_place_now(serve, lay)
                continue
            self.waiting.pop(serve.id, None)
            eligible = tuple(n.node_id for n in placement.eligible_nodes(serve.rule, nodes))
            demands.append(placement.Demand(serve.id, lay, eligible, float(work)))
            by_id[serve.id] = serve
        if not demands:
            return
        free = self._free_gpus(nodes)
        slots = None if self.max_servers is None else max(0, self.max_servers - len(self.running))
        for d, node_ids in placement.choose_starts(demands, free, slots):
            self.running[d.key] = Running(by_id[d.key], d.layout, node_ids)
            self.layouts.setdefault(d.key, d.layout)
            if d.key in self.lost_from:  # placed again after a node loss
                where = ", ".join(f"{n[:12]} ({self.node_ips.get(n, '?')})" for n in node_ids)
                self.emit("replaced", serve=by_id[d.key], nodes=node_ids, lost=self.lost_from.pop(d.key),
                          layout=d.layout, where=where)
            self.cluster.start(by_id[d.key], d.layout, node_ids)

    def _layout(self, serve: ServeConfig, nodes: list[NodeInfo]) -> Layout | str:
        """Where a configuration can go on these nodes: the layout it first ran with, as long as the nodes
        can hold it; or why it fits none of them now."""
        lay = pd_place.layout_of(serve, nodes, self.with_gpus)  # a P/D deployment: its bundles (place.pd)
        first = self.layouts.get(serve.id)
        if first is None or lay == first:
            return lay
        if placement.layout_fits(first, serve.rule, nodes):
            return first
        if isinstance(lay, str):
            return lay
        return (f"the nodes left cannot hold the layout it ran with ({first.describe()}); they would give "
                f"{lay.describe()}, other hardware")

    def _cannot_place_now(self, serve: ServeConfig, why: str) -> None:
        """A configuration that fits none of the nodes left: it waits for nodes (they may come back, or be
        added) up to `replace_wait_s`, then its points fail with the reason."""
        now = self.clock()
        if serve.id not in self.waiting:
            self.waiting[serve.id] = now
            log.warning("server config %s fits none of the nodes left (%s); waiting up to %.0f s for nodes",
                        serve.id, why, self.replace_wait_s)
            self.emit("waiting_for_nodes", serve=serve, reason=f"{why}; waiting up to {self.replace_wait_s:g} s "
                      "for nodes it fits", nodes=self.lost_from.get(serve.id, []), wait_s=self.replace_wait_s)
        if now - self.waiting[serve.id] < self.replace_wait_s:
            return
        del self.waiting[serve.id]
        reason = (f"can no longer be placed on the nodes left: {why} (waited {self.replace_wait_s:g} s for nodes "
                  "it fits)")
        self.lost_from.pop(serve.id, None)
        self.work.give_up(serve, reason)
        self.emit("cannot_place", serve=serve, reason=reason, nodes=[])

    def _start_tail_replicas(self, nodes: list[NodeInfo]) -> None:
        """Nothing waits: more servers of running configurations on the GPUs left free (see the module)."""
        servers: dict[str, int] = {}
        for r in self.running.values():
            servers[r.serve.id] = servers.get(r.serve.id, 0) + 1
        shares, by_id = [], {}
        for key, r in self.running.items():
            if r.replica or r.abort or r.serve.deployment is not None:  # a P/D deployment is not replicated
                continue
            left = self.work.work_left(key)
            pace = self.work.pace(key) if left else None
            if pace is None:
                continue
            eligible = tuple(n.node_id for n in placement.eligible_nodes(r.serve.rule, nodes))
            shares.append(placement.Share(key, r.layout, eligible, servers[key], left, pace[0], pace[1],
                                          1 + self.tail_replicas))
            by_id[key] = r
        if not shares:
            return
        free = self._free_gpus(nodes)
        slots = None if self.max_servers is None else max(0, self.max_servers - len(self.running))
        for sid, node_ids in placement.tail_starts(shares, free)[:slots]:
            r = by_id[sid]
            n = self.replicas[sid] = self.replicas.get(sid, 0) + 1
            self.running[replica_key(sid, n)] = Running(r.serve, r.layout, node_ids, replica=n)
            self.emit("replica", serve=r.serve, nodes=node_ids, replica=n, points_left=self.work.work_left(sid))
            self.cluster.start(r.serve, r.layout, node_ids, replica=n)

    def _free_gpus(self, nodes: list[NodeInfo]) -> dict[str, int]:
        """GPUs per node less those of the configurations running there."""
        free = {n.node_id: n.gpus for n in nodes}
        for r in self.running.values():
            placement.take(free, r.layout, r.node_ids)
        return free

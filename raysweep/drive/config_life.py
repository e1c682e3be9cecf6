"""The life of one server configuration, from its placement group to its last stop.

`ConfigLife.main` reserves the placement group on the nodes the scheduler chose, checks its hosts'
interface and address variables (`netcheck.start_refusal`: a misconfiguration gives the configuration up
with the fix), then (server mode) starts the server (`Servers.start`), warms it up, checks its transport
(a refused one gives the configuration up), runs its pending points one after another with caches reset
between them (or its open SLA searches), with the runs `bench.precision` adds to a point right after its last one
(`raysweep.drive.sequential`), and stops it; a server that died is started again for the points it had left, a lost host
actor sends the configuration back to the scheduler. Offline configurations run their points through
the offline mode's `OfflinePoints`. The group is always released. What it ended with is `ConfigRun.outcome`
("finished", "stopped", "aborted", "not placed", "host lost" or "error: ..."), which the scheduler acts on.
The SLA searches, the offline points and `bench.workload`'s levels are the modes' parts, which the run calls
through `raysweep.drive.hooks` (the modes register them there).
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

from raysweep.bench import backend_for
from raysweep.drive import hooks, sequential
from raysweep.drive.point import PointRunner, heaviest
from raysweep.drive.state import RunState
from raysweep.ledger import PointRow
from raysweep.maths.order import in_rounds, round_key
from raysweep.place import netcheck, placement
from raysweep.place import pd as pd_place
from raysweep.plan.plan import PointRun, ServeConfig
from raysweep.serve.live_server import ConfigRun, Server, Servers

__all__ = ["ConfigLife"]

log = logging.getLogger(__name__)


class ConfigLife:
    """Runs one configuration at a time per call to `main` (one thread per configuration); its parts
    (`servers`, `points`, `offline`, `searches`) can be used alone, as `raysweep crosscheck` does."""

    def __init__(self, work: RunState) -> None:
        self.work = work
        self.c = work.c
        self.servers = Servers(work)
        self.points = PointRunner(work)
        self.offline = hooks.offline_points()(work, self.servers, self.points)  # the modes' parts (drive.hooks)
        self.searches = hooks.sla_searches()(work, self.points)

    def new_run(self, serve: ServeConfig, layout: placement.Layout, node_ids: list[str],
                replica: int = 0) -> ConfigRun:
        """A configuration about to run on these nodes, with its bench backend's client side (server mode);
        `replica` > 0: one more server of a running configuration, sharing its points."""
        run = ConfigRun(serve, layout, node_ids, replica=replica)
        if not self.work.plan.spec.offline:
            run.bench = backend_for(self.c.bench, self.work.plan.spec.bench_env)
        return run

    def main(self, run: ConfigRun) -> None:
        """The whole life of `run`; its outcome is left in `run.outcome` (never raises)."""
        try:
            try:
                run.res = self._reserve(run)
            except placement.NotPlaced as exc:
                log.info("server config %s not placed yet: %s", run.serve.id, exc)
                run.outcome = "not placed"
                return
            try:
                run.outcome = self._run_config(run)
            finally:
                run.drop_client()
                if run.serve.deployment is not None:
                    pd_place.release_deployment(run.res)
                else:
                    placement.release(run.res)
        except Exception as exc:
            log.exception("server config %s", run.serve.id)
            run.outcome = f"error: {type(exc).__name__}: {exc}"

    def _reserve(self, run: ConfigRun) -> Any:
        """The run's placement group on the nodes the scheduler chose: a P/D deployment's bundles, one per role
        server and its router's, each on its node (`raysweep.place.pd`); else the configuration's."""
        dep = run.serve.deployment
        if dep is None:
            return placement.reserve(run.serve, run.layout, run.node_ids, replica=run.replica)
        return pd_place.reserve_deployment(dep, run.serve.rule, f"raysweep-pd-{run.serve.id}",
                                           gpus=run.layout.gpu_count > 0, node_ids=run.node_ids)

    def _run_config(self, run: ConfigRun) -> str:
        w = self.work
        assert run.res is not None
        refused = netcheck.start_refusal(run.res.node_ids, run.serve.env)  # GLOO/NCCL_SOCKET_IFNAME, VLLM_HOST_IP
        if refused is not None:
            w.give_up(run.serve, f"refused before its server started:\n{refused}", search_state="host check refused")
            return "finished"
        if w.plan.spec.offline:
            return self.offline.run(run)
        refused = self.servers.probe_fabric(run)  # transport.probe: before the server takes the GPUs
        if refused is not None:
            w.give_up(run.serve, refused, search_state="transport refused")
            return "finished"
        while not run.abort and not w.stopping():
            runnable = w.runnable(run.serve.id)  # with order.instances: those of its instance due now
            if not w.work_left(run.serve.id):
                return "finished"
            server = self.servers.start(run, runnable)
            if server is None:
                if run.abort:
                    break
                if run.outcome == "host lost":
                    return run.outcome
                continue
            try:
                self._run_points(run, server, runnable)
            finally:
                why = server.down()
                self.servers.stop(server, state="stopped" if why is None else f"died ({why})")
            if server.host_lost and not run.abort:  # an actor lost without its node: place it again
                return "host lost"
        return "aborted" if run.abort else "stopped"

    def _hung(self, run: ConfigRun, server: Server) -> bool:
        """After a failed point: whether its server still runs but no longer answers (then it is replaced,
        with a `server_unresponsive` event)."""
        why = server.unresponsive()
        if why is None:
            return False
        log.warning("server %s of config %s is unresponsive (%s); replacing it", server.server_id, run.serve.id, why)
        self.work.ledger.add_event("server_unresponsive", [run.serve.id], [], f"server {server.server_id}: {why}; "
                                   "replaced by a new start")
        return True

    def _run_points(self, run: ConfigRun, server: Server, runnable: list[PointRow]) -> None:
        w = self.work
        points = [p for p in (w.plan.point(r.point_id) for r in runnable) if p is not None]
        if hasattr(w, "in_order"):  # a tuning candidate: its most informative points first
            points = w.in_order(points)
        elif w.order.rounds:  # every point once per round, in the seeded order (raysweep.maths.order)
            points = in_rounds(points, w.order.seed)
        instance = w.instance_of(points[0].run) if points else 0
        if self.c.warmup and (points or self.c.sla is not None):
            self.points.warmup(run, server, heaviest(points or w.plan.points_of(run.serve.id)))
        refused = self.servers.check_transport(run, server)
        if refused is not None:
            w.give_up(run.serve, refused, search_state="transport refused")
            return
        if self.c.sla is not None:  # with bench.workload its points run first, then the searches start from them
            points = [p for p in points if p.bench.workload_role is not None]
            if not points:
                self.searches.run(run, server)
                return
        reset = self.points.reset(run, server)
        queue = deque(points)
        while queue:
            point = queue.popleft()
            if run.abort or w.stopping():
                return
            # each point goes to one server: several of one configuration share them (placement.tail_replicas)
            attempt = w.ledger.claim(point.id, server.server_id, self.c.max_attempts)
            if attempt is None:
                continue
            ok = self.points.run(run, server, point, reset, attempt)
            if not ok and not run.abort and server.hosts and server.down() is None and self._hung(run, server):
                return  # replaced: the caller stops it and starts another
            if not ok and not self.c.continue_on_error and not run.abort:
                w.stop_reason = f"point {point.id} failed and continue_on_error is false"
            more = sequential.settle(w, point.serve, point.bench.id) if getattr(w, "adds_runs", True) else None
            if more is not None and w.instance_of(more.run) == instance:
                _place(queue, more, w.order.seed if w.order.rounds and not hasattr(w, "in_order") else None)
            queue.extendleft(reversed(hooks.levels().settle(w, point.serve, point.bench)))  # bench.workload
            if run.abort or w.stopping() or server.down() is not None:
                return
            reset = self.points.reset(run, server)
        if self.c.sla is not None and not run.abort and not w.stopping() and server.down() is None:
            self.searches.run(run, server)


def _place(queue: deque[PointRun], run: PointRun, seed: int | None) -> None:
    """A run `bench.precision` added: in rounds (`seed`), at its place in the next round, after every run of
    the rounds before it; else right away (the point's runs back to back)."""
    if seed is None:
        queue.appendleft(run)
        return
    key = round_key(seed, run.serve.id, run.run, run.bench.id)
    at = next((i for i, q in enumerate(queue) if round_key(seed, q.serve.id, q.run, q.bench.id) > key), len(queue))
    queue.insert(at, run)

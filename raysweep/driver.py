"""The driver: connects to Ray, syncs the plan with the ledger, and runs every pending point.

A scheduling loop starts as many server configurations at once as the free GPUs allow (the packer in
`placement` picks which and where) and watches the cluster's nodes. Each configuration runs in its own
thread: reserve its placement group, start a host actor per node that launches that node's part of the
server, wait until it is ready, run a warmup, then each pending point from the configuration's client
actor, writing each result file whole before the point is marked done, and resetting caches between
points. Every rank is watched while a point runs: a server that dies anywhere spoils the point and is
restarted for the points it had left; a lost node tears the server down everywhere and the
configuration is placed again on the nodes left. Servers are always stopped and groups freed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import ray

from raysweep import metrics, placement, procs, sla, storage, transport
from raysweep.bench import backend_for
from raysweep.bench import offline, stats
from raysweep.bench.command import CommandBench, result_record
from raysweep.bench.options import parse_load_options
from raysweep.campaign import CampaignSpec
from raysweep.errors import UserError
from raysweep.files import write_json_atomic
from raysweep.grid import shell_join
from raysweep.ledger import LEDGER_FILE, Ledger, PointRow, ServerRow
from raysweep.plan import BenchPoint, Plan, PointRun, ServeConfig, build_plan, meaning, probe_runs
from raysweep.results import read_samples, write_results, write_samples
from raysweep.server import ServerHost, expected_model, rank_argv

__all__ = ["RunSummary", "check_placement", "driver_alive", "placement_lines", "embedded_temp_dir", "open_campaign", "ray_session", "run_campaign"]

log = logging.getLogger(__name__)

EventSink = Callable[..., None]
NAMESPACE = "raysweep"


@dataclass
class RunSummary:
    output_dir: Path
    counts: dict[str, int]
    failures: list[PointRow] = field(default_factory=list)
    stopped_early: str | None = None


# ---------------------------------------------------------------------------------------------------
# Ray connection
# ---------------------------------------------------------------------------------------------------

def embedded_temp_dir(pid: int) -> str:
    """Where the embedded Ray of driver `pid` keeps its session (short: AF_UNIX paths are limited)."""
    return f"/tmp/rs-{pid}"


@contextlib.contextmanager
def ray_session(address: str | None) -> Iterator[None]:
    """Join the cluster at `address`, or start an embedded local Ray (on loopback) when there is none."""
    if ray.is_initialized():
        yield
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    temp_dir = None
    if address is None:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        temp_dir = embedded_temp_dir(os.getpid())
        ray.init(address="local", include_dashboard=False, namespace=NAMESPACE, log_to_driver=False,
                 num_cpus=max(os.cpu_count() or 1, 4), _temp_dir=temp_dir)
    else:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
        if temp_dir:
            shutil.rmtree(temp_dir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------
# The campaign
# ---------------------------------------------------------------------------------------------------

def open_campaign(spec: CampaignSpec, output_dir: Path, force: bool = False) -> tuple[Plan, Ledger]:
    """Build the plan and bring the ledger in line with it (refusing a changed meaning unless `force`)."""
    plan = build_plan(spec)
    if spec.campaign.storage:
        storage.restore(spec.campaign.storage, output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(output_dir / LEDGER_FILE)
    try:
        ledger.sync(name=spec.campaign.name, fingerprint=plan.fingerprint, meaning=meaning(spec),
                    campaign=spec.stored_form(), campaign_file=spec.source_path,
                    points=[(p.id, p.serve.id, p.bench.id, p.run, p.serve.params, p.bench.params) for p in plan.points],
                    force=force, searches=plan.searches)
    except BaseException:
        ledger.close()
        raise
    return plan, ledger


def run_campaign(spec: CampaignSpec, output_dir: Path, *, force: bool = False, retry_failed: bool = False,
                 on_event: EventSink | None = None) -> RunSummary:
    """Run every pending point of a campaign on the connected Ray cluster. Resumes from the ledger;
    `retry_failed` gives points that used up their attempts a fresh set."""
    emit = on_event or (lambda kind, **data: None)
    mirror = storage.Mirror(spec.campaign.storage, output_dir) if spec.campaign.storage else None
    if mirror is not None:
        emit = _mirrored(emit, mirror)
    plan, ledger = open_campaign(spec, output_dir, force=force)
    try:
        nodes = placement.cluster_nodes()
        check_placement(plan, nodes)
        me = psutil.Process()
        driver_id = ledger.acquire_driver(me.pid, me.create_time(), driver_alive, force=force)
        ledger.record_driver_helpers(driver_id, _helper_processes(me))
        outcome = "interrupted"
        try:
            if retry_failed:
                log.info("%d failed point(s) get a fresh set of attempts", ledger.retry_failed())
            requeued, lost = ledger.recover()
            if requeued:
                log.info("%d point(s) of an earlier driver went back to pending", requeued)
            _reap_lost(lost)
            _reap_lost_drivers(ledger.lost_drivers())
            driver = Driver(plan, ledger, output_dir, emit, with_gpus=placement.has_gpus(nodes))
            stopped = driver.run()
            outcome = "stopped" if stopped else "finished"
        finally:
            ledger.release_driver(driver_id, outcome)
        return RunSummary(output_dir=output_dir, counts=ledger.counts(),
                          failures=[p for p in ledger.points() if p.state == "failed"], stopped_early=stopped)
    finally:
        ledger.close()
        if mirror is not None:
            write_results(output_dir)
            mirror.close()


_MIRROR_AFTER = ("point_done", "point_failed", "config_failed", "sla_done")


def _mirrored(emit: EventSink, mirror: storage.Mirror) -> EventSink:
    """The event sink that also mirrors the output dir after every finished or failed point."""
    def sink(kind: str, **data: Any) -> None:
        emit(kind, **data)
        if kind in _MIRROR_AFTER:
            mirror.request()
    return sink


def check_placement(plan: Plan, nodes: list[placement.NodeInfo]) -> dict[str, placement.Layout]:
    """The layout of every configuration with points on this cluster; refuses (a UserError naming each
    configuration and why) those that can never be placed."""
    layouts, bad = {}, []
    for serve in plan.serves:
        if not plan.points_of(serve.id):
            continue
        lay = placement.layout_for(serve.shape, serve.rule, nodes)
        if isinstance(lay, str):
            bad.append(f"server config {serve.id} ({serve.label}): {lay}")
        else:
            layouts[serve.id] = lay
    if bad:
        raise UserError("can never be placed on this cluster:\n  " + "\n  ".join(bad))
    return layouts


def placement_lines(serve: ServeConfig, layout: placement.Layout, offline_mode: bool = False) -> list[str]:
    """Where a configuration goes and the command each of its nodes runs (for the dry run)."""
    rule = placement.rule_text(serve.rule)
    lines = [f"  placement: {layout.describe()}" + (f" on nodes with {rule}" if rule else "")]
    for rank in range(layout.nnodes):
        base = offline.worker_argv(serve.display_argv()) if offline_mode and rank else serve.display_argv()
        argv = rank_argv(base, layout, rank, "<rank 0 ip>", 0)
        text = shell_join(argv).replace("--master-port 0", "--master-port <free port>").replace(
            "--data-parallel-rpc-port 0", "--data-parallel-rpc-port <free port>")
        http = "" if rank else " --output-json <result file>" if offline_mode else " --host <node ip> --port <free port>"
        lines.append(f"  command{f' (rank {rank})' if layout.nnodes > 1 else ''}: {text}{http}")
    return lines


def driver_alive(hostname: str, pid: int, create_time: float) -> bool:
    """Whether a driver recorded in the ledger still runs (one on another host is assumed to)."""
    if hostname != socket.gethostname():
        return True
    return procs.is_alive(pid, create_time)


def _helper_processes(me: psutil.Process) -> list[tuple[int, float]]:
    """The processes this driver started on its host: the embedded Ray's GCS, raylet, agents and workers."""
    found = []
    for p in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            found.append((p.pid, p.create_time()))
    return found


def _reap_lost_drivers(drivers: list[dict[str, Any]]) -> None:
    """Stop what killed drivers on this host left behind (their embedded Ray outlives them by a minute or
    more: its agents wait on the dead GCS before exiting) and remove their session directories."""
    for d in drivers:
        if d["hostname"] != socket.gethostname() or procs.is_alive(d["pid"], d["pid_create_time"]):
            continue
        for pid, created in json.loads(d.get("helpers") or "[]"):
            if procs.is_alive(pid, created):
                log.info("stopping pid %d left by driver %d", pid, d["pid"])
                procs.kill_tree(pid, grace_s=5)
        if not procs.is_alive(d["pid"], None):
            shutil.rmtree(embedded_temp_dir(d["pid"]), ignore_errors=True)


@ray.remote(num_cpus=0)
def _reap_on_node(pid: int, create_time: float) -> list[int]:
    return procs.kill_tree(pid) if procs.is_alive(pid, create_time) else []


def _reap_lost(servers: list[ServerRow]) -> None:
    """Kill what is left of servers a dead driver never stopped, every node's part of them (matched by
    pid and start time)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    alive = {n.node_id for n in placement.cluster_nodes()}
    for s in servers:
        for r in s.rank_list():
            if not r.get("pid"):
                continue
            if r.get("hostname") == socket.gethostname():
                if procs.is_alive(r["pid"], r["pid_create_time"]):
                    log.warning("stopping server %s rank %s (pid %d) left by an earlier driver", s.server_id,
                                r["rank"], r["pid"])
                    procs.kill_tree(r["pid"])
            elif r.get("node_id") in alive:
                strategy = NodeAffinitySchedulingStrategy(r["node_id"], soft=False)
                with contextlib.suppress(Exception):
                    ray.get(_reap_on_node.options(scheduling_strategy=strategy).remote(r["pid"], r["pid_create_time"]),
                            timeout=60)


# ---------------------------------------------------------------------------------------------------
# A running server: every node's part of one server configuration
# ---------------------------------------------------------------------------------------------------

class _Aborted(Exception):
    """The scheduler asked a configuration to stop (node lost, interrupted)."""


@dataclass
class _Server:
    server_id: str
    hosts: list[Any]                 # one ServerHost actor per rank; rank 0 serves HTTP
    nodes: list[dict[str, Any]] = field(default_factory=list)
    infos: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""
    host_lost: bool = False          # a host actor (or its node) went away, not just the server process
    transport: dict[str, Any] | None = None  # the NCCL transport verdict (raysweep.transport.server_verdict)

    def down(self) -> str | None:
        """None while every rank's process runs; otherwise what ended it."""
        refs = [h.exit_code.remote() for h in self.hosts]
        for rank, ref in enumerate(refs):
            try:
                code = ray.get(ref, timeout=30)
            except ray.exceptions.RayError as exc:
                self.host_lost = True
                return f"the host actor of rank {rank} was lost ({type(exc).__name__})"
            if code is not None:
                return f"exit code {code}" if len(self.hosts) == 1 else f"rank {rank} exited with code {code}"
        return None

    def log_tail(self, lines: int = 40) -> str:
        tails = []
        for rank, h in enumerate(self.hosts):
            try:
                tail = ray.get(h.log_tail.remote(lines), timeout=30)
            except ray.exceptions.RayError:
                path = self.infos[rank].get("log_path", "") if rank < len(self.infos) else ""
                tail = procs.tail(path, lines) if path else ""
            tails.append(tail if len(self.hosts) == 1 else f"== rank {rank} ==\n{tail}")
        return "\n".join(tails)

    def rank_rows(self) -> list[dict[str, Any]]:
        return [{"rank": r, "hostname": n.get("hostname"), "node_id": n.get("node_id"), "node_ip": n.get("node_ip"),
                 "gpu_ids": n.get("gpu_ids"), "pid": i.get("pid"), "pid_create_time": i.get("pid_create_time"),
                 "log_path": i.get("log_path")} for r, (n, i) in enumerate(zip(self.nodes, self.infos))]


@dataclass
class _ConfigRun:
    """One server configuration being run in its own thread, on the nodes the packer chose for it."""

    serve: ServeConfig
    layout: placement.Layout
    node_ids: list[str]
    thread: Any = None
    res: placement.Reservation | None = None
    abort: str | None = None         # set by the scheduler: stop now (node lost, interrupted)
    outcome: str = "running"
    bench: Any = None                # the bench backend's client side (its actors stay warm between points)
    helper: Any = None               # runs after_bench_cmd

    def drop_client(self) -> None:
        """Stop the client actors (a point was abandoned); the next point starts fresh ones."""
        for b in (self.bench, self.helper):
            if b is not None:
                b.close()


class _SearchStopped(Exception):
    """A probe could not run (the server went down, the run was aborted or the campaign stops)."""


@dataclass
class _ProbeData:
    metrics: dict[str, Any]
    per_request: dict[str, Any]
    client_limited: bool


@dataclass
class _SearchState:
    reset: str
    probes: dict[str, dict[tuple[float, int], _ProbeData | None]] = field(default_factory=dict)


def transport_fields(verdict: dict[str, Any] | None) -> dict[str, Any]:
    """The `transport_*` columns of a result from its server's verdict."""
    if verdict is None:
        return {}
    one_node = int(verdict.get("nnodes") or 1) < 2
    return {"transport_inter": "n/a" if one_node else verdict["inter"], "transport_intra": verdict["intra"],
            "transport_plugins": ",".join(verdict.get("plugins") or []),
            "transport_ib_devices": ",".join(verdict.get("ib_devices") or []),
            "transport_nccl": ",".join(verdict.get("versions") or []), "transport": transport.describe(verdict)}


def search_key(cfg: Any, target: sla.Target) -> str:
    """How a search is recorded: its target and the settings that decide its answer."""
    return (f"{target.label} [{cfg.variable}, {cfg.judge}"
            + (f" {cfg.attainment:g}" if cfg.judge == "attainment" else "")
            + f", precision {cfg.precision:g}, {cfg.start:g}..{cfg.max_value:g}]")


def _probe_value(setting: Any) -> float:
    return math.inf if setting is None or setting == "inf" else float(setting)


def _pool_probe(output_dir: Path, result_paths: list[str | None], argv: list[str]) -> _ProbeData:
    """Metrics of a probe from the pooled raw samples of all its runs (not from per-run summaries)."""
    records = [json.loads((output_dir / (p or "")).read_text()) for p in result_paths]
    samples = stats.pool([read_samples(output_dir / r["samples_path"]) for r in records])
    opts = parse_load_options(argv)
    return _ProbeData(stats.point_metrics(samples, opts), stats.per_request(samples),
                      any(r.get("client_limited") for r in records))


def _judge(data: _ProbeData | None, target: sla.Target, cfg: Any) -> sla.Verdict:
    if data is None or data.client_limited:  # a probe that did not run, or a client that limited it, decides nothing
        return sla.Verdict.UNRESOLVED
    if cfg.judge == "attainment":
        return sla.judge_attainment(data.per_request, data.metrics, target, cfg.attainment)[0]
    return sla.judge_percentile(data.metrics, target)


def _capacity(data: _ProbeData | None, variable: str) -> float | None:
    """What the unbounded-load probe says the server sustains: its throughput (a rate), or by Little's
    law the requests it keeps in flight (a concurrency)."""
    if data is None:
        return None
    rps = float(data.metrics.get("request_throughput") or 0.0)
    if variable == "request_rate":
        return rps or None
    return rps * float(data.metrics.get("mean_e2el_ms") or 0.0) / 1000.0 or None


INTERRUPTED = "interrupted"
_HOST_LOSS_LIMIT = 3  # starts lost to host actors before a configuration's points fail


# ---------------------------------------------------------------------------------------------------
# The scheduling loop
# ---------------------------------------------------------------------------------------------------

class Driver:
    """Runs the pending points of a plan: as many server configurations at once as free GPUs allow
    (most work first, largest first among equals, smaller ones filling the gaps), each in its own thread
    with its own client actor."""

    def __init__(self, plan: Plan, ledger: Ledger, output_dir: Path, emit: EventSink, with_gpus: bool) -> None:
        self.plan, self.ledger, self.output_dir, self.emit = plan, ledger, output_dir, emit
        self.c = plan.spec.campaign
        self.with_gpus = with_gpus
        self.max_servers = self.c.placement.max_servers or (None if with_gpus else 1)
        self.log_dir = (output_dir / "logs").resolve()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._stop_reason: str | None = None
        self._runs: dict[str, _ConfigRun] = {}
        self._not_before: dict[str, float] = {}
        self._host_losses: dict[str, int] = {}
        self._node_ips: dict[str, str] = {}
        self._wake = threading.Event()
        self._targets = sla.parse_targets(self.c.sla.targets) if self.c.sla is not None else []

    def run(self) -> str | None:
        """Run everything runnable; returns why it stopped early, or None when it went through."""
        self.emit("campaign_start", total=len(self.plan.points), counts=self.ledger.counts())
        try:
            self._schedule()
        finally:
            for r in self._runs.values():
                r.abort = r.abort or INTERRUPTED
            for r in list(self._runs.values()):
                r.thread.join()
        self.emit("campaign_end", counts=self.ledger.counts(), stopped=self._stop_reason)
        return self._stop_reason

    def _schedule(self) -> None:
        while True:
            nodes = placement.cluster_nodes()
            self._node_ips.update({n.node_id: n.ip for n in nodes})
            self._notice_lost_nodes({n.node_id for n in nodes})
            self._collect_finished()
            pending = [] if self._stop_reason else self._pending()
            if not pending and not self._runs:
                return
            now = time.monotonic()
            self._start_what_fits([(s, w) for s, w in pending if self._not_before.get(s.id, 0) <= now], nodes)
            self._wake.wait(1.0)
            self._wake.clear()

    def _pending(self) -> list[tuple[ServeConfig, int]]:
        out = []
        for s in self.plan.serves:
            if s.id not in self._runs:
                n = self._work_left(s.id)
                if n:
                    out.append((s, n))
        return out

    def _work_left(self, serve_id: str) -> int:
        """Points a config still has to run; with SLA searches, a run of one probe per open search (the
        searches run their probes themselves, and a probe no search needs any more is left alone)."""
        if self.c.sla is not None:
            return self.c.runs * len(self._open_searches(serve_id))
        return len(self.ledger.runnable(serve_id, self.c.max_attempts))

    def _open_searches(self, serve_id: str) -> list[tuple[str, Any]]:
        """The (bench id, target) SLA searches of a config without a recorded outcome."""
        if self.c.sla is None:
            return []
        done = {(r["bench_id"], r["target"]) for r in self.ledger.searches() if r["serve_id"] == serve_id}
        return [(bid, t) for sid, bid in self.plan.searches if sid == serve_id
                for t in self._targets if (bid, search_key(self.c.sla, t)) not in done]

    def _notice_lost_nodes(self, alive: set[str]) -> None:
        for r in self._runs.values():
            lost = [n for n in r.node_ids if n not in alive]
            if lost and not r.abort:
                where = ", ".join(f"{n[:12]} ({self._node_ips.get(n, '?')})" for n in lost)
                r.abort = f"node {where} was lost"
                log.warning("server config %s: %s; tearing its server down", r.serve.id, r.abort)
                self.emit("node_lost", serve=r.serve, nodes=lost, reason=r.abort)

    def _collect_finished(self) -> None:
        for sid, r in list(self._runs.items()):
            if r.thread.is_alive():
                continue
            del self._runs[sid]
            if r.outcome == "not placed":
                self._not_before[sid] = time.monotonic() + 10
            elif r.outcome == "host lost":
                self._host_losses[sid] = self._host_losses.get(sid, 0) + 1
                if self._host_losses[sid] >= _HOST_LOSS_LIMIT:
                    self._give_up(r.serve, f"its host actors were lost {self._host_losses[sid]} times while starting")
            elif r.outcome.startswith("error"):
                self._stop_reason = f"server config {sid}: {r.outcome}"

    def _give_up(self, serve: ServeConfig, reason: str, search_state: str = "server failed") -> None:
        """Fail a configuration's points (and SLA searches) for good."""
        for p in self.ledger.runnable(serve.id, self.c.max_attempts):
            self.ledger.give_up(p.point_id, reason, self.c.max_attempts)
        for bench_id, target in self._open_searches(serve.id):
            self.ledger.record_search(serve.id, bench_id, search_key(self.c.sla, target), search_state, None, None,
                                      0, [reason], {})
        log.error("server config %s: %s", serve.id, reason)
        self.emit("config_failed", serve=serve, error=reason)

    def _start_what_fits(self, ready: list[tuple[ServeConfig, int]], nodes: list[placement.NodeInfo]) -> None:
        demands, by_id = [], {}
        for serve, work in ready:
            lay = placement.layout_for(serve.shape, serve.rule, nodes)
            if isinstance(lay, str):
                self._give_up(serve, f"can no longer be placed on the nodes left: {lay}")
                continue
            eligible = tuple(n.node_id for n in placement.eligible_nodes(serve.rule, nodes))
            demands.append(placement.Demand(serve.id, lay, eligible, float(work)))
            by_id[serve.id] = serve
        if not demands:
            return
        free = {n.node_id: n.gpus for n in nodes}
        for r in self._runs.values():
            for n in r.node_ids:
                if n in free:
                    free[n] -= r.layout.gpus_per_node
        slots = None if self.max_servers is None else max(0, self.max_servers - len(self._runs))
        for d, node_ids in placement.choose_starts(demands, free, slots):
            run = _ConfigRun(by_id[d.key], d.layout, node_ids)
            if not self.plan.spec.offline:
                run.bench = backend_for(self.c.bench, self.plan.spec.bench_env)
            run.thread = threading.Thread(target=self._config_main, args=(run,), name=f"config-{d.key}", daemon=True)
            self._runs[d.key] = run
            run.thread.start()

    # -- one server configuration, in its thread -----------------------------------------------------

    def _config_main(self, run: _ConfigRun) -> None:
        try:
            try:
                run.res = placement.reserve(run.serve, run.layout, run.node_ids)
            except placement.NotPlaced as exc:
                log.info("server config %s not placed yet: %s", run.serve.id, exc)
                run.outcome = "not placed"
                return
            try:
                run.outcome = self._run_config(run)
            finally:
                run.drop_client()
                placement.release(run.res)
        except Exception as exc:  # noqa: BLE001 - reported to the scheduler, which stops the campaign
            log.exception("server config %s", run.serve.id)
            run.outcome = f"error: {type(exc).__name__}: {exc}"
        finally:
            self._wake.set()

    def _run_config(self, run: _ConfigRun) -> str:
        if self.plan.spec.offline:
            return self._run_offline(run)
        while not run.abort and not self._stop_reason:
            runnable = self.ledger.runnable(run.serve.id, self.c.max_attempts)
            if not self._work_left(run.serve.id):
                return "finished"
            server = self._start_server(run, runnable)
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
                self._stop_server(server, state="stopped" if why is None else f"died ({why})")
            if server.host_lost and not run.abort:  # an actor lost without its node: place it again
                return "host lost"
        return "aborted" if run.abort else "stopped"

    def _run_points(self, run: _ConfigRun, server: _Server, runnable: list[PointRow]) -> None:
        points = [p for p in (self.plan.point(r.point_id) for r in runnable) if p is not None]
        if self.c.warmup and (points or self.c.sla is not None):
            self._warmup(run, server, (points or self.plan.points_of(run.serve.id))[0])
        refused = self._check_transport(run, server)
        if refused is not None:
            self._give_up(run.serve, refused, search_state="transport refused")
            return
        if self.c.sla is not None:
            self._run_searches(run, server)
            return
        reset = self._after_point(run, server)
        for point in points:
            if run.abort or self._stop_reason:
                return
            ok = self._run_point(run, server, point, reset)
            if not ok and not self.c.continue_on_error and not run.abort:
                self._stop_reason = f"point {point.id} failed and continue_on_error is false"
            if run.abort or self._stop_reason or server.down() is not None:
                return
            reset = self._after_point(run, server)

    def _await(self, run: _ConfigRun, ref: Any, timeout_s: float, server: _Server | None = None) -> Any:
        """Wait for a Ray call (or a list of them), checking every second whether the run was aborted and
        (with `server`) every few seconds whether any of the server's ranks ended. Raises _Aborted, or
        returns `("down", why)` for a server that went down, `("ok", value(s))` otherwise."""
        refs = ref if isinstance(ref, list) else [ref]
        deadline, next_check = time.monotonic() + timeout_s, time.monotonic() + 3
        while True:
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=1.0)
            if len(done) == len(refs):
                values = ray.get(refs)
                return "ok", values if isinstance(ref, list) else values[0]
            if run.abort:
                raise _Aborted(run.abort)
            if server is not None and time.monotonic() >= next_check:
                why = server.down()
                if why is not None:
                    return "down", why
                next_check = time.monotonic() + 3
            if time.monotonic() > deadline:
                raise ray.exceptions.GetTimeoutError(f"no answer after {timeout_s:.0f} s")

    # -- servers -------------------------------------------------------------------------------------

    def _start_server(self, run: _ConfigRun, runnable: list[PointRow]) -> _Server | None:
        serve, lay, res = run.serve, run.layout, run.res
        assert res is not None
        server_id = f"{serve.id}-{uuid.uuid4().hex[:6]}"
        self.emit("server_starting", serve=serve, server_id=server_id, layout=lay)
        server = self._hosts(run, server_id)
        run.bench.warm()  # its worker process starts while the server does
        t0 = time.monotonic()
        try:
            self._launch(run, server, serve.argv, serve_http=True)
            head = server.infos[0]
            server.url = f"http://{head['host']}:{head['port']}"
            ready = self._wait_ready(run, server)
        except _Aborted as exc:
            ready = {"ok": False, "error": f"stopped while starting: {exc}", "aborted": True}
        except ray.exceptions.RayError as exc:
            server.host_lost = True
            ready = {"ok": False, "error": f"host actor failed: {type(exc).__name__}: {exc}"}
        if ready["ok"]:
            self.ledger.update_server(server_id, state="ready", ready_at=time.time())
            self.emit("server_ready", serve=serve, server_id=server_id, elapsed=time.monotonic() - t0)
            return server
        tail = server.log_tail()
        self.ledger.update_server(server_id, state="failed", error=ready["error"], log_tail=tail)
        self._stop_server(server, state="failed")
        self.emit("server_failed", serve=serve, server_id=server_id, error=ready["error"], log_tail=tail)
        if ready.get("aborted"):
            return None
        if server.host_lost:  # not the server's fault: the scheduler places the configuration again
            run.outcome = "host lost"
            return None
        for p in runnable:
            self.ledger.mark_failed(p.point_id, f"server failed to start: {ready['error']}", tail, started=False)
        for bench_id, target in self._open_searches(serve.id):
            self.ledger.record_search(serve.id, bench_id, search_key(self.c.sla, target), "server failed", None, None,
                                      0, [f"server failed to start: {ready['error']}"], {})
        if not self.c.continue_on_error:
            self._stop_reason = f"server config {serve.id} failed to start and continue_on_error is false"
        return None

    def _hosts(self, run: _ConfigRun, server_id: str) -> _Server:
        """One host actor per node of the configuration's placement group, and the server's ledger row."""
        lay, res = run.layout, run.res
        assert res is not None
        hosts = [ServerHost.options(**placement.actor_options(res, r)).remote(
            server_id if lay.nnodes == 1 else f"{server_id}-rank{r}", str(self.log_dir)) for r in range(lay.nnodes)]
        self.ledger.add_server(server_id, run.serve.id, shell_join(run.serve.display_argv()))
        return _Server(server_id, hosts)

    def _launch(self, run: _ConfigRun, server: _Server, argv: list[str], serve_http: bool,
                follower_argv: list[str] | None = None) -> None:
        """Start the command on every rank (the multi-node flags added; ranks > 0 run `follower_argv` when
        given) and record where each runs. Raises _Aborted or a RayError."""
        lay = run.layout
        server.nodes = [self._await(run, h.node_info.remote(), 300)[1] for h in server.hosts]
        master = server.nodes[0]["node_ip"]
        port = self._await(run, server.hosts[0].pick_port.remote(), 60)[1] if lay.nnodes > 1 else 0
        for r, h in enumerate(server.hosts):
            base = follower_argv if r and follower_argv is not None else argv
            ref = h.start.remote(rank_argv(base, lay, r, master, port), run.serve.env, serve_http and r == 0,
                                 self.c.transport.nccl_debug)
            server.infos.append(self._await(run, ref, 120)[1])
        head = server.infos[0]
        self.ledger.update_server(server.server_id, command=head["command"], hostname=server.nodes[0]["hostname"],
                                  node_id=server.nodes[0]["node_id"], node_ip=master, port=head["port"],
                                  pid=head["pid"], pid_create_time=head["pid_create_time"],
                                  gpu_ids=server.nodes[0]["gpu_ids"], log_path=head["log_path"],
                                  ranks=json.dumps(server.rank_rows()))

    def _wait_ready(self, run: _ConfigRun, server: _Server) -> dict[str, Any]:
        """Rank 0 answers /health and /v1/models, while every other rank still runs."""
        limit = self.c.serve.ready_timeout_s
        model = expected_model(run.serve.argv)
        t0 = time.monotonic()
        while True:
            left = limit - (time.monotonic() - t0)
            step = min(5.0, max(left, 0.5))
            _, ans = self._await(run, server.hosts[0].wait_ready.remote(step, model), step + 60)
            if ans["ok"] or not ans.get("timeout"):
                return ans
            why = server.down() if len(server.hosts) > 1 else None
            if why is not None:
                return {"ok": False, "error": f"a rank ended before the server was ready: {why}"}
            if left <= step:
                return {"ok": False, "error": f"server not ready after {limit:.0f} s (/health and /v1/models)"}

    def _check_transport(self, run: _ConfigRun, server: _Server) -> str | None:
        """Read NCCL's lines from every rank and store the verdict with the server. A multi-node config whose
        cross-node links are slower than `transport.require` is refused (the reason, with the evidence):
        its lines are awaited up to `transport.wait_s`, since NCCL may connect channels lazily."""
        cfg = self.c.transport
        gated = len(server.hosts) > 1 and cfg.require != "any"
        deadline = time.monotonic() + (cfg.wait_s if gated else 0.0)
        while True:
            verdict = self._read_transport(run, server)
            if verdict is None:
                return None
            if not gated or transport.meets(verdict, cfg.require) or time.monotonic() >= deadline:
                break
            time.sleep(1.0)
        refused = transport.refusal(verdict, cfg.require)
        if refused:
            log.error("server config %s: %s", run.serve.id, refused)
        self.emit("transport", serve=run.serve, server_id=server.server_id, verdict=verdict, refused=refused)
        return refused

    def _read_transport(self, run: _ConfigRun | None, server: _Server) -> dict[str, Any] | None:
        refs = [h.nccl_lines.remote() for h in server.hosts]
        try:
            lines = self._await(run, refs, 120)[1] if run is not None else ray.get(refs, timeout=60)
        except ray.exceptions.RayError as exc:
            log.info("server %s: NCCL lines not read (%s)", server.server_id, exc)
            return None
        server.transport = transport.server_verdict(lines)
        self.ledger.update_server(server.server_id, transport=json.dumps(server.transport))
        return server.transport

    def _stop_server(self, server: _Server, state: str = "stopped") -> None:
        if server.transport is not None:  # channels connected after the check (lazily) count too
            self._read_transport(None, server)
        refs = [h.stop.remote() for h in server.hosts]
        left: list[int] = []
        for rank, (h, ref) in enumerate(zip(server.hosts, refs)):
            try:
                left += ray.get(ref, timeout=120).get("left", [])
                path = server.infos[rank]["log_path"] if rank < len(server.infos) else ""
                local = self.log_dir / Path(path).name
                if path and not local.exists():  # the server ran where our output dir is not visible
                    local.write_text(ray.get(h.read_log.remote(), timeout=60))
            except ray.exceptions.RayError as exc:
                log.info("server %s rank %d: stop through its host failed (%s)", server.server_id, rank, exc)
            finally:
                with contextlib.suppress(Exception):
                    ray.kill(h)
        fields: dict[str, Any] = {"stopped_at": time.time()}
        if state != "failed":
            fields["state"] = state
        if left:
            fields["error"] = f"processes still alive after stop: {left}"
        self.ledger.update_server(server.server_id, **fields)
        self.emit("server_stopped", server_id=server.server_id, left=left)

    def _after_point(self, run: _ConfigRun, server: _Server) -> str:
        """Reset caches (or run after_bench_cmd); returns what the next point starts from."""
        try:
            if self.plan.spec.after_bench_argv:
                if run.helper is None:
                    run.helper = run.bench if isinstance(run.bench, CommandBench) else \
                        CommandBench(self.plan.spec.bench_env, self.c.bench.timeout_s)
                _, out = self._await(run, run.helper.run_plain(
                    self.plan.spec.after_bench_argv, self.plan.spec.bench_env, self.c.bench.timeout_s),
                    self.c.bench.timeout_s + 120)
                return "after_bench_cmd" if out.get("ok") else f"after_bench_cmd failed: {out.get('error')}"
            _, out = self._await(run, server.hosts[0].reset_caches.remote(), 120)
        except _Aborted:
            return "aborted"
        except ray.exceptions.RayError as exc:
            return f"reset failed: {exc}"
        return "reset" if out["ok"] else f"reset failed: {out['detail']}"

    # -- points --------------------------------------------------------------------------------------

    def _warmup(self, run: _ConfigRun, server: _Server, point: PointRun) -> None:
        ok = False
        with contextlib.suppress(_Aborted, ray.exceptions.RayError):
            status, out = self._bench(run, server, point, num_prompts=self.c.warmup)
            ok = status == "ok" and bool(out.get("ok"))
            if not ok:
                log.warning("warmup against server %s failed: %s", server.server_id, out.get("error", out))
        self.emit("warmup_done", server_id=server.server_id, ok=ok)

    def _bench(self, run: _ConfigRun, server: _Server, point: PointRun,
               num_prompts: int | None = None, clients: int | None = None) -> tuple[str, Any]:
        """One benchmark of a point through the backend, with the server's /metrics scraped meanwhile."""
        try:
            job = run.bench.submit(point.bench.argv, server.url, expected_model(run.serve.argv) or "",
                                   num_prompts=num_prompts, clients=clients)
        except Exception as exc:  # noqa: BLE001 - the point fails with the reason; the campaign goes on
            log.warning("point %s could not be prepared", point.id, exc_info=True)
            return "ok", {"ok": False, "error": f"the point could not be prepared: {exc}"}
        scraper = metrics.Scraper(server.url, self.c.bench.metrics_interval_s).start()
        try:
            status, answers = self._await(run, job.refs, self.c.bench.timeout_s + 120, server)
        finally:
            scraper.stop()
        if status != "ok":
            return status, answers
        out = run.bench.finish(job, answers)
        res = out.get("result") if out.get("ok") else None
        if res is not None:
            end = res.get("end_time") or time.time()
            start = res.get("start_time") or end - float(res.get("duration") or 0.0)
            res.update(scraper.summary((start - 0.01, end + self.c.bench.metrics_interval_s)))
            out["clients"] = job.clients
        return status, out

    def _bench_point(self, run: _ConfigRun, server: _Server, point: PointRun) -> tuple[str, Any]:
        """A point's benchmark; while the client limits it (and that is allowed), again with twice the actors."""
        clients, reruns, used = None, 0, 0
        while True:
            status, out = self._bench(run, server, point, clients=clients)
            res = out.get("result") if status == "ok" and out.get("ok") else None
            if res is None or not res.get("client_limited") or out["clients"] <= used:  # no more actors to be had
                break
            used = out["clients"]
            more = min(2 * used, self.c.bench.max_clients, int(res.get("num_prompts") or 1))
            if not self.c.bench.rerun_client_limited or more <= used:
                break
            log.warning("point %s is client-limited with %d client(s) (%s); running it again with %d",
                        point.id, used, res.get("client_limited_reason"), more)
            self.emit("client_limited", point=point, clients=used, more=more,
                      reason=res.get("client_limited_reason"))
            clients, reruns = more, reruns + 1
            self._after_point(run, server)
        if res is not None:
            res["client_limited_reruns"] = reruns
        return status, out

    def _run_point(self, run: _ConfigRun, server: _Server, point: PointRun, reset: str) -> bool:
        attempt = self.ledger.mark_running(point.id, server.server_id)
        self.emit("point_start", point=point, attempt=attempt, server_id=server.server_id)
        started = time.time()
        try:
            status, out = self._bench_point(run, server, point)
        except _Aborted as exc:
            run.drop_client()
            if str(exc) == INTERRUPTED:  # the point did not run, and the attempt does not count
                self.ledger.mark_pending(point.id)
            else:
                self.ledger.requeue(point.id, f"{exc} during the point", self.c.max_attempts)
                self.emit("point_failed", point=point, error=str(exc), attempt=attempt)
            return False
        except ray.exceptions.RayError as exc:
            run.drop_client()
            status, out = "ok", {"ok": False, "error": f"client actor failed: {type(exc).__name__}: {exc}"}
        if status == "down":
            run.drop_client()  # its benchmark may hang on a server with a dead rank
            why, out = out, {"ok": False, "error": "the benchmark was stopped"}
        else:
            why = server.down()  # a server that died during the point spoils it, whatever the client saw
        error = out.get("error")
        result = out.get("result") if out.get("ok") else None
        if result is not None and not result.get("completed"):
            error = f"no request completed ({result.get('failed', '?')} failed)"
            if result.get("errors_sample"):
                error += f": {result['errors_sample'][0]}"
        if why is not None:
            tail = server.log_tail()
            error = f"server died during the point ({why}); benchmark: {error or 'finished'}"
            if server.host_lost:
                self.ledger.requeue(point.id, error, self.c.max_attempts)
                self.emit("point_failed", point=point, error=error, attempt=attempt)
                return False
        else:
            tail = out.get("output_tail") or server.log_tail()
        if error is None and result is not None:
            base = self.output_dir / "points" / point.serve.id / point.bench.id
            path = base / f"run={point.run}.json"
            if out.get("samples") is not None:
                samples = base / f"run={point.run}.samples.parquet"
                write_samples(samples, out["samples"])
                result["samples_path"] = str(samples.relative_to(self.output_dir))
            write_json_atomic(path, self._record(run, server, point, result, attempt, started, reset, out))
            self.ledger.mark_done(point.id, str(path.relative_to(self.output_dir)))
            self.emit("point_done", point=point, result=result)
            return True
        self.ledger.mark_failed(point.id, error or "unknown failure", tail)
        self.emit("point_failed", point=point, error=error, attempt=attempt)
        return False

    # -- offline points -----------------------------------------------------------------------------

    def _run_offline(self, run: _ConfigRun) -> str:
        """Every runnable point of an offline config, one after another in its placement group: each runs the
        offline command to its end on fresh host actors and leaves one JSON."""
        while not run.abort and not self._stop_reason:
            points = [p for p in (self.plan.point(r.point_id) for r in
                                  self.ledger.runnable(run.serve.id, self.c.max_attempts)) if p is not None]
            if not points:
                return "finished"
            for point in points:
                outcome = self._offline_point(run, point)
                if outcome == "failed" and not self.c.continue_on_error and not run.abort:
                    self._stop_reason = f"point {point.id} failed and continue_on_error is false"
                if outcome in ("refused", "host lost"):
                    return "finished" if outcome == "refused" else outcome
                if run.abort or self._stop_reason:
                    break
        return "aborted" if run.abort else "stopped"

    def _offline_point(self, run: _ConfigRun, point: PointRun) -> str:
        """One offline run: `done`, `failed`, `refused` (transport), `host lost` or `aborted`."""
        server_id = f"{run.serve.id}-{uuid.uuid4().hex[:6]}"
        attempt = self.ledger.mark_running(point.id, server_id)
        self.emit("point_start", point=point, attempt=attempt, server_id=server_id)
        started, t0 = time.time(), time.monotonic()
        server = self._hosts(run, server_id)
        kind = offline.offline_kind(run.serve.argv)
        error, result, command = None, None, None
        try:
            json_path = self._await(run, server.hosts[0].scratch_path.remote(f"{server_id}.json"), 300)[1]
            self._launch(run, server, offline.offline_argv(run.serve.argv, json_path), serve_http=False,
                         follower_argv=offline.worker_argv(run.serve.argv))
            command = server.infos[0]["command"]
            self.ledger.update_server(server_id, state="running")
            code, error = self._offline_wait(run, server)
            if error is None:
                text = self._await(run, server.hosts[0].read_text.remote(json_path), 120)[1]
                log_text = self._await(run, server.hosts[0].read_log.remote(), 120)[1]
                if code != 0:
                    error = f"the command exited with code {code}"
                elif text is None:
                    error = "the command ended without writing its --output-json file"
                else:
                    result = offline.parse_result(kind, text, log_text)
                    result["offline_params"] = ",".join(point.serve.params)
        except _Aborted as exc:
            self._stop_server(server, state="stopped")
            if str(exc) == INTERRUPTED:
                self.ledger.mark_pending(point.id)
            else:
                self.ledger.requeue(point.id, f"{exc} during the point", self.c.max_attempts)
                self.emit("point_failed", point=point, error=str(exc), attempt=attempt)
            return "aborted"
        except ray.exceptions.RayError as exc:
            server.host_lost = True
            error = f"host actor failed: {type(exc).__name__}: {exc}"
        except (ValueError, KeyError, TypeError) as exc:
            error = f"the result JSON could not be read: {type(exc).__name__}: {exc}"
        if server.transport is None and not server.host_lost:
            self._read_transport(run if not run.abort else None, server)
        refused = transport.refusal(server.transport, self.c.transport.require) if server.transport else None
        tail = server.log_tail() if error or refused else None
        self._stop_server(server, state="stopped" if error is None else "failed")
        if refused:
            self.ledger.mark_failed(point.id, refused, tail)
            self._give_up(run.serve, refused, search_state="transport refused")
            self.emit("point_failed", point=point, error=refused, attempt=attempt)
            return "refused"
        if error is not None or result is None:
            error = error or "no result"
            if server.host_lost:
                self.ledger.requeue(point.id, error, self.c.max_attempts)
            else:
                self.ledger.mark_failed(point.id, error, tail)
            self.ledger.update_server(server_id, error=error, log_tail=tail)
            self.emit("point_failed", point=point, error=error, attempt=attempt)
            return "host lost" if server.host_lost else "failed"
        path = self.output_dir / "points" / point.serve.id / point.bench.id / f"run={point.run}.json"
        out = {"command": command, "duration_s": time.monotonic() - t0}
        write_json_atomic(path, self._record(run, server, point, result, attempt, started, "n/a (offline)", out))
        self.ledger.mark_done(point.id, str(path.relative_to(self.output_dir)))
        self.emit("point_done", point=point, result=result)
        return "done"

    def _offline_wait(self, run: _ConfigRun, server: _Server) -> tuple[int | None, str | None]:
        """Wait for rank 0's command to end: (its exit code, None), or (None, why) when it ran past
        `offline.timeout_s`, another rank ended first, or (multi-node, `transport.require` set) NCCL's
        cross-node links turned out slower than required."""
        assert self.c.offline is not None
        limit, cfg = self.c.offline.timeout_s, self.c.transport
        gated = len(server.hosts) > 1 and cfg.require != "any"
        t0 = time.monotonic()
        while True:
            _, code = self._await(run, server.hosts[0].wait_exit.remote(2.0), 120)
            if code is not None:
                return code, None
            for rank, h in enumerate(server.hosts[1:], start=1):
                other = self._await(run, h.exit_code.remote(), 60)[1]
                if other is not None:
                    return None, f"rank {rank} exited with code {other} before rank 0 finished"
            if gated:
                verdict = self._read_transport(run, server)
                if verdict is not None and not transport.meets(verdict, cfg.require) \
                        and time.monotonic() - t0 > cfg.wait_s and verdict["inter"] != "none":
                    return None, "stopped: " + str(transport.refusal(verdict, cfg.require)).split(";")[0]
            if time.monotonic() - t0 > limit:
                return None, f"the command ran past offline.timeout_s ({limit:.0f} s)"

    # -- SLA searches -------------------------------------------------------------------------------

    def _run_searches(self, run: _ConfigRun, server: _Server) -> None:
        """Every open SLA search of this config, probes shared between targets and taken from the ledger
        when they are already done. Returns early (the caller restarts or stops) when a probe could not run."""
        cfg = self.c.sla
        assert cfg is not None
        state = _SearchState(reset=self._after_point(run, server))
        for bench_id, target in self._open_searches(run.serve.id):
            base = next(b for b in self.plan.benches if b.id == bench_id)
            probes = state.probes.setdefault(bench_id, {})
            try:
                if not probes:
                    for value, first in self._ledger_probe_values(run.serve.id, bench_id):
                        self._probe(run, server, base, value, probes, state, first, run_missing=False)
                outcome = self._search(run, server, base, target, probes, state)
            except _SearchStopped:
                return
            at = probes.get((outcome.largest_pass, 0)) if outcome.largest_pass is not None else None
            self.ledger.record_search(run.serve.id, bench_id, search_key(cfg, target), outcome.state,
                                      outcome.largest_pass, outcome.smallest_fail, len(outcome.probes), outcome.notes,
                                      at.metrics if at else {})
            self.emit("sla_done", serve=run.serve, bench_id=bench_id, target=target.label, outcome=outcome)

    def _search(self, run: _ConfigRun, server: _Server, base: BenchPoint, target: sla.Target,
                probes: dict[tuple[float, int], _ProbeData | None], state: _SearchState) -> sla.Outcome:
        cfg = self.c.sla
        assert cfg is not None

        def judged(value: float, first: int = 0) -> sla.Verdict:
            return _judge(self._probe(run, server, base, value, probes, state, first), target, cfg)

        return sla.search(
            judged, start=cfg.start, max_value=cfg.max_value, precision=cfg.precision,
            integer=cfg.variable == "max_concurrency",
            estimate=lambda: _capacity(probes.get((sla.INFINITE, 0)), cfg.variable),
            recheck=lambda v: judged(v, self.c.runs),
            known=lambda: {v: _judge(d, target, cfg) for (v, first), d in probes.items() if first == 0})

    def _ledger_probe_values(self, serve_id: str, bench_id: str) -> list[tuple[float, int]]:
        """The (value, first run) of every probe of a search already in the ledger, done or not."""
        cfg = self.c.sla
        assert cfg is not None
        unbounded = {p.bench.id for p in self.plan.points_of(serve_id) if p.bench.base_id == bench_id}
        return sorted({(_probe_value(row.bench_params.get(cfg.variable)), (row.run // self.c.runs) * self.c.runs)
                       for row in self.ledger.points(serve_id=serve_id)
                       if row.probe_of == bench_id or row.bench_id in unbounded})

    def _probe(self, run: _ConfigRun, server: _Server, base: BenchPoint, value: float,
               probes: dict[tuple[float, int], _ProbeData], state: _SearchState, first: int = 0,
               run_missing: bool = True) -> _ProbeData | None:
        """The pooled data of one probe's runs, running those not done yet (within max_attempts). A
        concurrency of at least the point's prompt count is the unbounded probe itself."""
        if self.c.sla is not None and self.c.sla.variable == "max_concurrency" and math.isfinite(value) \
                and value >= parse_load_options(base.argv).num_prompts:
            value = math.inf
        key = (value, first)
        if key in probes:
            return probes[key]
        pts = probe_runs(self.plan.spec, run.serve, base, value, first)
        self.ledger.add_probes(base.id, [(p.id, p.serve.id, p.bench.id, p.run, p.serve.params, p.bench.params)
                                         for p in pts])
        for p in pts:
            while run_missing:
                row = self.ledger.point(p.id)
                if row is None or row.state == "done" or row.attempts >= self.c.max_attempts:
                    break
                self._run_point(run, server, p, state.reset)
                if run.abort or self._stop_reason or server.down() is not None:
                    raise _SearchStopped()
                state.reset = self._after_point(run, server)
        rows = [self.ledger.point(p.id) for p in pts]
        if not all(r is not None and r.state == "done" for r in rows):
            if run_missing:
                probes[key] = None  # failed for good: it cannot decide anything
            return None
        probes[key] = _pool_probe(self.output_dir, [r.result_path for r in rows if r is not None], pts[0].bench.argv)
        return probes[key]

    def _record(self, run: _ConfigRun, server: _Server, point: PointRun, result: dict[str, Any], attempt: int,
                started: float, reset: str, out: dict[str, Any]) -> dict[str, Any]:
        sh, lay = point.serve.shape, run.layout
        head = server.nodes[0]
        extra = {
            "campaign": self.c.name, "point_id": point.id, "serve_id": point.serve.id, "bench_id": point.bench.id,
            "server_id": server.server_id, "serve_label": point.serve.label, "bench_label": point.bench.label,
            "tensor_parallel_size": sh.tp, "pipeline_parallel_size": sh.pp, "data_parallel_size": sh.dp,
            "gpu_count": lay.gpu_count if self.with_gpus else 0, "num_nodes": lay.nnodes,
            "gpus_per_node": lay.gpus_per_node if self.with_gpus else 0, "placement_mode": lay.mode,
            "node_id": head.get("node_id"), "node_ip": head.get("node_ip"), "hostname": head.get("hostname"),
            "gpu_ids": head.get("gpu_ids"),
            "node_ids": ",".join(n.get("node_id") or "" for n in server.nodes),
            "node_ips": ",".join(n.get("node_ip") or "" for n in server.nodes),
            "gpu_ids_per_node": ";".join(f"{n.get('node_ip')}/{(n.get('node_id') or '')[:8]}={n.get('gpu_ids') or ''}"
                                         for n in server.nodes),
            "attempt": attempt, "started_at": started,
            "ended_at": time.time(), "bench_wall_s": out.get("duration_s"), "cache_state_before": reset,
            "bench_command": out.get("command"),
            **transport_fields(server.transport),
        }
        if point.bench.base_id is not None:
            extra.update(sla_base_id=point.bench.base_id, sla_value=point.bench.sla_value)
        return result_record(result, point.serve.params, point.bench.params, point.run, extra)

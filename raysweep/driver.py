"""The driver: connects to Ray, syncs the plan with the ledger, and runs every pending point.

For each server configuration with points left: reserve its GPUs as a placement group, start a host
actor there that launches the server, wait until it is ready, run a warmup, then each pending point from
a client actor, writing each result file whole before the point is marked done, and resetting caches
between points. A server that dies is restarted for the points it had left; a point fails with the
server-log tail and is retried while attempts remain. Servers are always stopped and groups freed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import ray

from raysweep import placement, procs
from raysweep.bench import CommandClient, result_record
from raysweep.campaign import CampaignSpec
from raysweep.errors import UserError
from raysweep.files import write_json_atomic
from raysweep.grid import shell_join
from raysweep.ledger import LEDGER_FILE, Ledger, PointRow, ServerRow
from raysweep.plan import Plan, PointRun, ServeConfig, build_plan, meaning
from raysweep.server import ServerHost, expected_model

__all__ = ["RunSummary", "driver_alive", "embedded_temp_dir", "open_campaign", "ray_session", "run_campaign"]

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
    output_dir.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(output_dir / LEDGER_FILE)
    try:
        ledger.sync(name=spec.campaign.name, fingerprint=plan.fingerprint, meaning=meaning(spec),
                    campaign=spec.stored_form(), campaign_file=spec.source_path,
                    points=[(p.id, p.serve.id, p.bench.id, p.run, p.serve.params, p.bench.params) for p in plan.points],
                    force=force)
    except BaseException:
        ledger.close()
        raise
    return plan, ledger


def run_campaign(spec: CampaignSpec, output_dir: Path, *, force: bool = False, retry_failed: bool = False,
                 on_event: EventSink | None = None) -> RunSummary:
    """Run every pending point of a campaign on the connected Ray cluster. Resumes from the ledger;
    `retry_failed` gives points that used up their attempts a fresh set."""
    emit = on_event or (lambda kind, **data: None)
    plan, ledger = open_campaign(spec, output_dir, force=force)
    try:
        nodes = placement.cluster_nodes()
        for serve in plan.serves:
            reason = placement.never_fits(serve, nodes) if plan.points_of(serve.id) else None
            if reason:
                raise UserError(f"server config {serve.id} ({serve.label}) can never be placed: {reason}")
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
    """Kill what is left of servers a dead driver never stopped (matched by pid and start time)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    alive = {n.node_id for n in placement.cluster_nodes()}
    for s in servers:
        if not s.pid:
            continue
        if s.hostname == socket.gethostname():
            if procs.is_alive(s.pid, s.pid_create_time):
                log.warning("stopping server %s (pid %d) left by an earlier driver", s.server_id, s.pid)
                procs.kill_tree(s.pid)
        elif s.node_id in alive:
            strategy = NodeAffinitySchedulingStrategy(s.node_id, soft=False)
            with contextlib.suppress(Exception):
                ray.get(_reap_on_node.options(scheduling_strategy=strategy).remote(s.pid, s.pid_create_time), timeout=60)


# ---------------------------------------------------------------------------------------------------
# The scheduling loop
# ---------------------------------------------------------------------------------------------------

@dataclass
class _Server:
    server_id: str
    actor: Any
    url: str
    info: dict[str, Any]
    node: dict[str, Any]
    log_path: str

    def exit_code(self) -> int | None | str:
        try:
            return ray.get(self.actor.exit_code.remote(), timeout=30)
        except ray.exceptions.RayError as exc:
            return f"host actor lost ({type(exc).__name__})"

    def log_tail(self, lines: int = 40) -> str:
        try:
            return ray.get(self.actor.log_tail.remote(lines), timeout=30)
        except ray.exceptions.RayError:
            return procs.tail(self.log_path, lines)


class Driver:
    """Runs the pending points of a plan, one server configuration at a time."""

    def __init__(self, plan: Plan, ledger: Ledger, output_dir: Path, emit: EventSink, with_gpus: bool) -> None:
        self.plan, self.ledger, self.output_dir, self.emit = plan, ledger, output_dir, emit
        self.c = plan.spec.campaign
        self.with_gpus = with_gpus
        self.log_dir = (output_dir / "logs").resolve()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._client: Any = None
        self._stop_reason: str | None = None

    def run(self) -> str | None:
        """Run everything runnable; returns why it stopped early, or None when it went through."""
        self.emit("campaign_start", total=len(self.plan.points), counts=self.ledger.counts())
        try:
            for serve in self.plan.serves:
                if self.ledger.runnable(serve.id, self.c.max_attempts):
                    self._run_config(serve)
                if self._stop_reason:
                    break
        finally:
            if self._client is not None:
                with contextlib.suppress(Exception):
                    ray.kill(self._client)
        self.emit("campaign_end", counts=self.ledger.counts(), stopped=self._stop_reason)
        return self._stop_reason

    # -- one server configuration --------------------------------------------------------------------

    def _run_config(self, serve: ServeConfig) -> None:
        res = placement.reserve(serve, self.with_gpus)
        try:
            while not self._stop_reason:
                runnable = self.ledger.runnable(serve.id, self.c.max_attempts)
                if not runnable:
                    break
                server = self._start_server(serve, res, runnable)
                if server is None:
                    continue
                try:
                    self._run_points(serve, server, runnable)
                finally:
                    code = server.exit_code()
                    self._stop_server(server, state="stopped" if code is None else f"died (exit code {code})")
        finally:
            placement.release(res)

    def _run_points(self, serve: ServeConfig, server: _Server, runnable: list[PointRow]) -> None:
        points = [p for p in (self.plan.point(r.point_id) for r in runnable) if p is not None]
        if self.c.warmup and points:
            self._warmup(server, points[0])
        reset = self._after_point(server)
        for point in points:
            ok = self._run_point(server, point, reset)
            if not ok and not self.c.continue_on_error:
                self._stop_reason = f"point {point.id} failed and continue_on_error is false"
            if self._stop_reason or server.exit_code() is not None:
                return
            reset = self._after_point(server)

    # -- servers -------------------------------------------------------------------------------------

    def _start_server(self, serve: ServeConfig, res: placement.Reservation, runnable: list[PointRow]) -> _Server | None:
        server_id = f"{serve.id}-{uuid.uuid4().hex[:6]}"
        self.emit("server_starting", serve=serve, server_id=server_id)
        actor = ServerHost.options(**placement.actor_options(res)).remote(server_id, str(self.log_dir))
        self.ledger.add_server(server_id, serve.id, shell_join(serve.display_argv()))
        t0 = time.monotonic()
        try:
            node = ray.get(actor.node_info.remote(), timeout=300)
            info = ray.get(actor.start.remote(serve.argv, serve.env), timeout=120)
            self.ledger.update_server(server_id, command=info["command"], hostname=node["hostname"],
                                      node_id=node["node_id"], node_ip=node["node_ip"], port=info["port"],
                                      pid=info["pid"], pid_create_time=info["pid_create_time"],
                                      gpu_ids=node["gpu_ids"], log_path=info["log_path"])
            ready = ray.get(actor.wait_ready.remote(self.c.serve.ready_timeout_s, expected_model(serve.argv)),
                            timeout=self.c.serve.ready_timeout_s + 60)
        except ray.exceptions.RayError as exc:
            ready, info, node = {"ok": False, "error": f"host actor failed: {exc}"}, {}, {}
        server = _Server(server_id, actor, f"http://{info.get('host')}:{info.get('port')}", info, node,
                         info.get("log_path", ""))
        if ready["ok"]:
            self.ledger.update_server(server_id, state="ready", ready_at=time.time())
            self.emit("server_ready", serve=serve, server_id=server_id, elapsed=time.monotonic() - t0)
            return server
        tail = server.log_tail()
        self.ledger.update_server(server_id, state="failed", error=ready["error"], log_tail=tail)
        self._stop_server(server, state="failed")
        for p in runnable:
            self.ledger.mark_failed(p.point_id, f"server failed to start: {ready['error']}", tail, started=False)
        self.emit("server_failed", serve=serve, server_id=server_id, error=ready["error"], log_tail=tail)
        if not self.c.continue_on_error:
            self._stop_reason = f"server config {serve.id} failed to start and continue_on_error is false"
        return None

    def _stop_server(self, server: _Server, state: str = "stopped") -> None:
        result: dict[str, Any] = {}
        try:
            result = ray.get(server.actor.stop.remote(), timeout=120)
            local = self.log_dir / Path(server.log_path).name
            if server.log_path and not local.exists():  # the server ran where our output dir is not visible
                local.write_text(ray.get(server.actor.read_log.remote(), timeout=60))
        except ray.exceptions.RayError as exc:
            result = {"error": str(exc)}
        finally:
            with contextlib.suppress(Exception):
                ray.kill(server.actor)
        fields: dict[str, Any] = {"stopped_at": time.time()}
        if state != "failed":
            fields["state"] = state
        if result.get("left"):
            fields["error"] = f"processes still alive after stop: {result['left']}"
        self.ledger.update_server(server.server_id, **fields)
        self.emit("server_stopped", server_id=server.server_id, result=result)

    def _after_point(self, server: _Server) -> str:
        """Reset caches (or run after_bench_cmd); returns what the next point starts from."""
        if self.plan.spec.after_bench_argv:
            out = self._call_client("run_plain", self.plan.spec.after_bench_argv, self.plan.spec.bench_env,
                                    self.c.bench.timeout_s)
            return "after_bench_cmd" if out.get("ok") else f"after_bench_cmd failed: {out.get('error')}"
        try:
            out = ray.get(server.actor.reset_caches.remote(), timeout=120)
        except ray.exceptions.RayError as exc:
            return f"reset failed: {exc}"
        return "reset" if out["ok"] else f"reset failed: {out['detail']}"

    # -- points --------------------------------------------------------------------------------------

    def _client_actor(self) -> Any:
        if self._client is None:
            self._client = CommandClient.remote()
        return self._client

    def _call_client(self, method: str, *args: Any) -> dict[str, Any]:
        timeout = self.c.bench.timeout_s + 120
        try:
            return ray.get(getattr(self._client_actor(), method).remote(*args), timeout=timeout)
        except (ray.exceptions.RayError, TimeoutError) as exc:
            with contextlib.suppress(Exception):
                ray.kill(self._client)
            self._client = None
            return {"ok": False, "error": f"client actor failed: {type(exc).__name__}: {exc}", "output_tail": ""}

    def _warmup(self, server: _Server, point: PointRun) -> None:
        out = self._call_client("run", point.bench.argv, server.url, self.plan.spec.bench_env,
                                self.c.bench.timeout_s, self.c.warmup)
        if not out.get("ok"):
            log.warning("warmup against server %s failed: %s", server.server_id, out.get("error"))
        self.emit("warmup_done", server_id=server.server_id, ok=bool(out.get("ok")))

    def _run_point(self, server: _Server, point: PointRun, reset: str) -> bool:
        attempt = self.ledger.mark_running(point.id, server.server_id)
        self.emit("point_start", point=point, attempt=attempt)
        started = time.time()
        try:
            out = self._call_client("run", point.bench.argv, server.url, self.plan.spec.bench_env,
                                    self.c.bench.timeout_s)
        except BaseException:  # interrupted: the point did not run, and the attempt does not count
            self.ledger.mark_pending(point.id)
            raise
        error = out.get("error")
        result = out.get("result") if out.get("ok") else None
        if result is not None and not result.get("completed"):
            error = f"no request completed ({result.get('failed', '?')} failed)"
        code = server.exit_code()
        if code is not None:  # a server that died during the point spoils it, whatever the client saw
            error, tail = f"server died during the point (exit code {code}); benchmark: {error or 'finished'}", server.log_tail()
        else:
            tail = out.get("output_tail") or server.log_tail()
        if error is None and result is not None:
            path = self.output_dir / "points" / point.serve.id / point.bench.id / f"run={point.run}.json"
            write_json_atomic(path, self._record(server, point, result, attempt, started, reset, out))
            self.ledger.mark_done(point.id, str(path.relative_to(self.output_dir)))
            self.emit("point_done", point=point, result=result)
            return True
        self.ledger.mark_failed(point.id, error or "unknown failure", tail)
        self.emit("point_failed", point=point, error=error, attempt=attempt)
        return False

    def _record(self, server: _Server, point: PointRun, result: dict[str, Any], attempt: int, started: float,
                reset: str, out: dict[str, Any]) -> dict[str, Any]:
        sh = point.serve.shape
        gpus = sh.gpu_count if self.with_gpus else 0
        extra = {
            "campaign": self.c.name, "point_id": point.id, "serve_id": point.serve.id, "bench_id": point.bench.id,
            "server_id": server.server_id, "serve_label": point.serve.label, "bench_label": point.bench.label,
            "tensor_parallel_size": sh.tp, "pipeline_parallel_size": sh.pp, "data_parallel_size": sh.dp,
            "gpu_count": gpus, "num_nodes": 1, "node_id": server.node.get("node_id"),
            "node_ip": server.node.get("node_ip"), "hostname": server.node.get("hostname"),
            "gpu_ids": server.node.get("gpu_ids"), "attempt": attempt, "started_at": started,
            "ended_at": time.time(), "bench_wall_s": out.get("duration_s"), "cache_state_before": reset,
            "bench_command": out.get("command"),
        }
        return result_record(result, point.serve.params, point.bench.params, point.run, extra)

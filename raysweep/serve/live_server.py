"""A live server: every node's part of one server configuration, seen from the driver.

`ConfigRun` is one configuration being run on the nodes the scheduler chose (its placement group, its
client side, the scheduler's abort request); its `wait` awaits Ray calls while watching for an abort and
for ranks that end. `Server` is one start of its server: a `ServerHost` actor per node (`raysweep.serve.server`),
where each rank runs and what it reported. `Servers` starts one (host actors in the placement group, the
command on every rank with vLLM's multi-node flags, readiness), checks how its GPUs talk (NCCL transport,
refusing a multi-node server slower than `transport.require`) and stops it, recording each step in the
ledger and announcing it as an event.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import ray

from raysweep import procs
from raysweep.grid import shell_join
from raysweep.ledger import Ledger, PointRow
from raysweep.place import fabric, placement, preflight, transport
from raysweep.plan.plan import ServeConfig
from raysweep.serve import caches, telemetry
from raysweep.serve.rapl import POWERCAP, RAPL_ENV
from raysweep.serve.root_cause import deterministic, pick_cause, root_cause, same_cause
from raysweep.serve.server import ServerHost, engine_timeout_env, expected_model, rank_argv

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.actor import ActorHandle

    from raysweep.bench.backend import BenchBackend
    from raysweep.bench.command import CommandBench
    from raysweep.campaign import Campaign

__all__ = ["Aborted", "ConfigRun", "Server", "Servers", "fabric_fields", "new_server_id", "process_columns",
           "record_role_settings", "resolve_provenance", "server_process_fields", "telemetry_fields",
           "transport_fields", "warn_niced"]

log = logging.getLogger(__name__)

PORT_RETRIES = 3  # starts of a one-node server on another port after its port was taken (no failed attempt)


class Aborted(Exception):
    """The scheduler asked a configuration to stop (node lost, interrupted)."""


@dataclass
class Server:
    server_id: str
    hosts: list[Any]                 # one ServerHost actor per rank; rank 0 serves HTTP
    nodes: list[dict[str, Any]] = field(default_factory=list)
    infos: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""
    host_lost: bool = False          # a host actor (or its node) went away, not just the server process
    transport: dict[str, Any] | None = None  # the NCCL transport verdict (raysweep.place.transport.server_verdict)
    facts: list[dict[str, Any]] = field(default_factory=list)  # per rank: the process's nice and CPU affinity
    provenance: dict[str, Any] | None = None  # versions, GPUs, model, hostnames (raysweep.serve.provenance)
    fabric: dict[str, Any] | None = None  # the bandwidth probe of its placement group (raysweep.place.fabric)
    startup: dict[str, float] = field(default_factory=dict)  # the phases of its start (raysweep.serve.startup)
    roles: list[Any] = field(default_factory=list)  # a P/D deployment: the RoleInstance each host runs, in order
    router: ActorHandle | None = None  # a P/D deployment: its router's actor (raysweep.serve.pd.RouterHost)
    failed_rank: int | None = None   # the host whose process `down` found ended (a P/D deployment: its role)
    role_settings: dict[str, Any] | None = None  # a P/D deployment: each role server's effective settings
    cross_node: bool | None = None   # whether its layout links its nodes through NCCL (transport.needs_cross_node)

    def who(self, rank: int) -> str:
        """How a host's process is named in messages: `rank N`, or a P/D role server (`decode server decode-0`)."""
        if self.roles:
            return f"{self.roles[rank].role} server {self.roles[rank].name}"
        return f"rank {rank}"

    @property
    def metrics_url(self) -> str:
        """The server's /metrics; a P/D deployment's first decode server's (a point scrapes every role server's:
        `raysweep.serve.metrics.ServersScraper`)."""
        for inst, info in zip(self.roles, self.infos):
            if inst.role == "decode":
                return f"http://{info['host']}:{info['port']}"
        return self.url

    def server_urls(self) -> dict[str, str]:
        """A P/D deployment: every role server's URL by its name (`prefill-0`, `decode-0`, ...)."""
        return {r.name: f"http://{i['host']}:{i['port']}" for r, i in zip(self.roles, self.infos)}

    def role_urls(self, role: str) -> list[str]:
        """The URLs of a P/D deployment's servers of `role`."""
        return [f"http://{i['host']}:{i['port']}" for r, i in zip(self.roles, self.infos) if r.role == role]

    def down(self) -> str | None:
        """None while every rank's process runs; otherwise what ended it (a P/D deployment: which role's
        server, or its router)."""
        refs = [h.exit_code.remote() for h in self.hosts]
        for rank, ref in enumerate(refs):
            try:
                code = ray.get(ref, timeout=30)
            except ray.exceptions.RayError as exc:
                self.host_lost, self.failed_rank = True, rank
                return f"the host actor of {self.who(rank)} was lost ({type(exc).__name__})"
            if code is not None:
                self.failed_rank = rank
                if self.roles:
                    return f"{self.who(rank)} exited with code {code}"
                return f"exit code {code}" if len(self.hosts) == 1 else f"rank {rank} exited with code {code}"
        if self.router is not None:
            try:
                ray.get(self.router.url.remote(), timeout=30)
            except ray.exceptions.RayError as exc:
                self.host_lost = True
                return f"the P/D router's actor was lost ({type(exc).__name__})"
        return None

    def unresponsive(self, timeout_s: float = 5.0) -> str | None:
        """Why a server whose process still runs no longer answers /health (twice), or None when it does:
        a hung server (stopped, deadlocked) spoils every point after it, and is replaced."""
        import urllib.error
        import urllib.request

        why = ""
        for _ in range(2):
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=timeout_s) as resp:
                    if resp.status == 200:
                        return None
                    why = f"HTTP {resp.status}"
            except (urllib.error.URLError, OSError) as exc:
                why = str(getattr(exc, "reason", exc))
        return f"/health did not answer within {timeout_s:.0f} s ({why})"

    def root_cause(self, exited: int | None = None) -> dict[str, Any] | None:
        """Why the server failed, from every rank's log (`raysweep.serve.root_cause`): the first error line of
        each, the one that says why chosen by `pick_cause` (the rank that `exited` first among equals), with its
        rank (and a P/D deployment's role server). A rank that exits because another failed (its connection
        lost) is never taken for the cause when the other's log says more."""
        causes: list[dict[str, Any]] = []
        for rank, h in enumerate(self.hosts):
            try:
                cause = ray.get(h.root_cause.remote(), timeout=30)
            except ray.exceptions.RayError:
                path = self.infos[rank].get("log_path", "") if rank < len(self.infos) else ""
                found = root_cause(procs.tail(path, 10**9, max_bytes=4 * 1024 * 1024)) if path else None
                cause = asdict(found) if found is not None else None
            if cause is not None:
                causes.append({**cause, "rank": rank, **({"role": self.who(rank)} if self.roles else {})})
        return pick_cause(causes, exited)

    def log_tail(self, lines: int = 40) -> str:
        tails = []
        for rank, h in enumerate(self.hosts):
            try:
                tail = ray.get(h.log_tail.remote(lines), timeout=30)
            except ray.exceptions.RayError:
                path = self.infos[rank].get("log_path", "") if rank < len(self.infos) else ""
                tail = procs.tail(path, lines) if path else ""
            tails.append(tail if len(self.hosts) == 1 else f"== {self.who(rank)} ==\n{tail}")
        return "\n".join(tails)

    def rank_rows(self) -> list[dict[str, Any]]:
        return [{"rank": r, "hostname": n.get("hostname"), "node_id": n.get("node_id"), "node_ip": n.get("node_ip"),
                 "gpu_ids": n.get("gpu_ids"), "pid": i.get("pid"), "pid_create_time": i.get("pid_create_time"),
                 "log_path": i.get("log_path"), "network": i.get("network") or {},
                 **{k: (self.facts[r] if r < len(self.facts) else {}).get(k)
                    for k in ("cuda_visible_devices", "cuda_visible_set", "noset_visible_devices")},
                 **({"role": self.roles[r].role, "server": self.roles[r].name} if self.roles else {})}
                for r, (n, i) in enumerate(zip(self.nodes, self.infos))]


def record_startup(server: Server, ledger: Ledger) -> None:
    """The phases of a server's start from its rank-0 log (`raysweep.serve.startup.phases`), on the server and in
    its ledger row; nothing when the log cannot be read (the start itself is not at stake)."""
    from raysweep.serve.startup import phases

    row = next((s for s in ledger.servers() if s.server_id == server.server_id), None)
    if row is None or not server.hosts:
        return
    try:
        text = ray.get(server.hosts[0].read_log.remote(), timeout=60)
    except ray.exceptions.RayError as exc:
        log.warning("server %s: its log could not be read for the phases of its start (%s)", server.server_id, exc)
        return
    server.startup = phases(text, row.started_at, row.ready_at)
    record: dict[str, Any] = {"compile_cache": caches.compile_cache_state(text)}  # it found compiled graphs?
    try:  # where its compilation caches are and how big
        info = ray.get(server.hosts[0].cache_info.remote(), timeout=60)
    except ray.exceptions.RayError:
        info = {}
    if info.get("cache_dir"):
        server.startup["startup_cache_mb"] = (info.get("cache_bytes") or 0) / 1e6
        record["cache_dir"] = info["cache_dir"]
    ledger.update_server(server.server_id, startup=json.dumps({**server.startup, **record}))


@dataclass
class ConfigRun:
    """One server configuration being run in its own thread, on the nodes the packer chose for it."""

    serve: ServeConfig
    layout: placement.Layout
    node_ids: list[str]
    res: Any = None                  # its placement.Reservation (a P/D deployment: place.pd.PDReservation)
    abort: str | None = None         # set by the scheduler: stop now (node lost, interrupted)
    outcome: str = "running"
    bench: BenchBackend | None = None  # the bench backend's client side (its actors stay warm between points)
    helper: CommandBench | None = None  # runs after_bench_cmd
    fabric: dict[str, Any] | None = None  # the fabric probe of its placement group (transport.probe)
    replica: int = 0                 # > 0: one more server of a running configuration (placement.tail_replicas)

    def drop_client(self) -> None:
        """Stop the client actors (a point was abandoned); the next point starts fresh ones."""
        for b in (self.bench, self.helper):
            if b is not None:
                b.close()

    def wait(self, ref: ObjectRef | list[ObjectRef], timeout_s: float, server: Server | None = None) -> Any:
        """Wait for a Ray call (or a list of them), checking every second whether the run was aborted and
        (with `server`) every few seconds whether any of the server's ranks ended. Raises Aborted, or
        returns `("down", why)` for a server that went down, `("ok", value(s))` otherwise."""
        refs = ref if isinstance(ref, list) else [ref]
        deadline, next_check = time.monotonic() + timeout_s, time.monotonic() + 3
        while True:
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=1.0)
            if len(done) == len(refs):
                values = ray.get(refs)
                return "ok", values if isinstance(ref, list) else values[0]
            if self.abort:
                raise Aborted(self.abort)
            if server is not None and time.monotonic() >= next_check:
                why = server.down()
                if why is not None:
                    return "down", why
                next_check = time.monotonic() + 3
            if time.monotonic() > deadline:
                raise ray.exceptions.GetTimeoutError(f"no answer after {timeout_s:.0f} s")


def new_server_id(serve_id: str) -> str:
    """A fresh id for one start of a configuration's server."""
    return f"{serve_id}-{uuid.uuid4().hex[:6]}"


def transport_fields(verdict: dict[str, Any] | None) -> dict[str, Any]:
    """The `transport_*` columns of a result from its server's verdict."""
    if verdict is None:
        return {}
    one_node = int(verdict.get("nnodes") or 1) < 2
    return {"transport_inter": "n/a" if one_node else verdict["inter"], "transport_intra": verdict["intra"],
            "transport_plugins": ",".join(verdict.get("plugins") or []),
            "transport_ib_devices": ",".join(verdict.get("ib_devices") or []),
            "transport_nccl": ",".join(verdict.get("versions") or []), "transport": transport.describe(verdict)}


def fabric_fields(probe: dict[str, Any] | None) -> dict[str, Any]:
    """The `fabric_*` columns of a result from its server's bandwidth probe."""
    if probe is None:
        return {}
    return {"fabric_busbw_gbps": probe.get("busbw_gbps"), "fabric_backend": probe.get("backend"),
            "fabric_baseline_gbps": probe.get("baseline_gbps"), "fabric_error": probe.get("error")}


def telemetry_fields(server: Server, t0: float, t1: float, enabled: bool) -> dict[str, Any]:
    """The `gpu_*` columns of a point: the NVML samples of every node of the server between t0 and t1."""
    if not enabled:
        return {"gpu_telemetry": "off"}
    try:
        windows = ray.get([h.telemetry_window.remote(t0, t1) for h in server.hosts], timeout=60)
    except ray.exceptions.RayError as exc:
        return {"gpu_telemetry": f"unavailable: {type(exc).__name__}"}
    return telemetry.summarise(windows)


def process_columns(nodes: list[dict[str, Any]], facts: list[dict[str, Any]]) -> dict[str, Any]:
    """The ledger's `nice` (the highest of the ranks) and `cpu_affinity` ("ip=cpus;...") of a server."""
    nices = [f["nice"] for f in facts if f.get("nice") is not None]
    return {"nice": str(max(nices)) if nices else None,
            "cpu_affinity": ";".join(f"{n.get('node_ip')}={f.get('cpu_affinity') or '?'}"
                                     for n, f in zip(nodes, facts))}


def server_process_fields(nodes: list[dict[str, Any]], facts: list[dict[str, Any]]) -> dict[str, Any]:
    """The `server_nice` and `server_cpu_affinity` columns of a result (rank 0's affinity; per node too)."""
    if not facts:
        return {}
    cols = process_columns(nodes, facts)
    renice = facts[0].get("renice") or {}
    return {"server_nice": int(cols["nice"]) if cols["nice"] is not None else None,
            "server_cpu_affinity": facts[0].get("cpu_affinity"), "server_cpu_affinity_per_node": cols["cpu_affinity"],
            "server_renice_error": renice.get("error") or None}


_NICE_WARNED: set[str] = set()


def warn_niced(server: Server) -> None:
    """Warn once per node when a server process runs niced (the guard could not lower it)."""
    for node, f in zip(server.nodes, server.facts):
        host = str(node.get("hostname"))
        if (f.get("nice") or 0) > 0 and host not in _NICE_WARNED:
            _NICE_WARNED.add(host)
            why = (f.get("renice") or {}).get("error") or "the server's niceness could not be lowered"
            log.warning("servers on %s run at niceness %s, not 0: %s. Their numbers are marked 'niced'; start Ray "
                        "there with RAY_worker_niceness=0 in the environment of `ray start`", host, f["nice"], why)


def record_role_settings(server: Server, ledger: Ledger) -> dict[str, Any]:
    """A P/D deployment: the effective settings each role server reported at its start (its `non-default
    args` line, `raysweep.serve.pd_settings.effective_settings`), by server name, kept with the server and stored in
    its ledger row (`role_settings`), as every point's result carries them (`pd_role_settings`)."""
    from raysweep.serve.pd import read_role_settings

    server.role_settings = read_role_settings(server.roles, server.hosts)
    ledger.update_server(server.server_id, role_settings=json.dumps(server.role_settings, sort_keys=True,
                                                                    default=str))
    return server.role_settings


def resolve_provenance(server: Server, ledger: Ledger) -> dict[str, Any] | None:
    """The server's provenance from its rank 0 host (gathered while it started), stored with the server."""
    if server.provenance is None and server.hosts:
        try:
            prov = ray.get(server.hosts[0].provenance.remote(), timeout=180)
        except ray.exceptions.RayError as exc:
            log.info("server %s: provenance not read (%s)", server.server_id, exc)
            return None
        if prov is None:
            return None
        server.provenance = {**prov, "hostnames": [n.get("hostname") or "" for n in server.nodes]}
        ledger.update_server(server.server_id, provenance=json.dumps(server.provenance))
    return server.provenance


class ServingWork(Protocol):
    """What starting and stopping servers asks of the running campaign (the driver's `drive.state.RunState`):
    its campaign, ledger, log directory and event sink, whether it has GPUs, why it stops, and giving a
    configuration (or its open SLA searches) up."""

    c: Campaign
    ledger: Ledger
    log_dir: Path
    with_gpus: bool
    stop_reason: str | None

    def emit(self, kind: str, **fields: Any) -> None: ...

    def close_searches(self, serve_id: str, state: str, note: str) -> None: ...

    def give_up(self, serve: ServeConfig, reason: str, search_state: str = "server failed") -> None: ...


class Servers:
    """Starts, checks and stops the servers of configuration runs (see the module docstring)."""

    def __init__(self, work: ServingWork) -> None:
        self.work = work
        self.c = work.c
        self._warm_lock = threading.Lock()
        self._warmed: set[str] = set()  # nodes whose page cache holds the model (serve.warm_weights)
        self._causes: dict[str, str] = {}  # per configuration, the root cause of its last failed start

    def start(self, run: ConfigRun, runnable: list[PointRow]) -> Server | None:
        """A ready server for the run, or None: aborted, its host actors lost (`run.outcome` says so), or it
        failed to start (its `runnable` points and open searches fail with the reason)."""
        w, serve, lay, res = self.work, run.serve, run.layout, run.res
        assert res is not None
        server_id = new_server_id(serve.id)
        w.emit("server_starting", serve=serve, server_id=server_id, layout=lay)
        server = self.role_hosts(run, server_id) if serve.deployment is not None else self.hosts(run, server_id)
        if run.fabric is not None:
            server.fabric = run.fabric
            w.ledger.update_server(server_id, fabric=json.dumps(run.fabric))
        assert run.bench is not None, "mode serve: its bench backend is made with the run"
        run.bench.warm()  # its worker process starts while the server does
        t0 = time.monotonic()
        try:
            self.launch(run, server, serve.argv, serve_http=True)
            head = server.infos[0]
            server.url = f"http://{head['host']}:{head['port']}"
            ready = self._wait_roles_ready(run, server) if server.roles else self._wait_ready(run, server)
        except Aborted as exc:
            ready = {"ok": False, "error": f"stopped while starting: {exc}", "aborted": True}
        except ray.exceptions.RayError as exc:
            server.host_lost = True
            ready = {"ok": False, "error": f"host actor failed: {type(exc).__name__}: {exc}"}
        if ready["ok"] and ready.get("port_retries") and not server.roles:
            self._moved(run, server, ready)
        if ready["ok"]:
            w.ledger.update_server(server_id, state="ready", ready_at=time.time())
            record_startup(server, w.ledger)
            resolve_provenance(server, w.ledger)
            if server.roles:
                record_role_settings(server, w.ledger)
            w.emit("server_ready", serve=serve, server_id=server_id, elapsed=time.monotonic() - t0)
            return server
        tail = server.log_tail()
        cause = server.root_cause(ready.get("rank")) if ready.get("exited") and not server.host_lost else None
        if cause is not None:
            who = cause.get("role") or f"rank {cause['rank']}"
            if len(server.hosts) > 1 and ready.get("rank") is not None and cause["rank"] != ready.get("rank"):
                # another rank's log says why: its cause first, the rank that happened to exit after it
                ready["error"] = f"{cause['line']} ({who}'s log); {ready['error']}"
            else:
                where = f" ({who})" if len(server.hosts) > 1 else ""
                ready["error"] = f"{ready['error']}: {cause['line']}{where}"
        w.ledger.update_server(server_id, state="failed", error=ready["error"], log_tail=tail)
        self.stop(server, state="failed")
        w.emit("server_failed", serve=serve, server_id=server_id, error=ready["error"], log_tail=tail,
               root_cause=cause)
        if ready.get("aborted"):
            return None
        if server.host_lost:  # not the server's fault: the scheduler places the configuration again
            run.outcome = "host lost"
            return None
        for p in runnable:
            w.ledger.mark_failed(p.point_id, f"server failed to start: {ready['error']}", tail, started=False)
        again = self._no_retry(serve.id, cause)
        if again is not None:
            w.give_up(serve, f"server failed to start: {ready['error']}; not started again: {again}")
        else:
            w.close_searches(serve.id, "server failed", f"server failed to start: {ready['error']}")
        if not self.c.continue_on_error:
            w.stop_reason = f"server config {serve.id} failed to start and continue_on_error is false"
        return None

    def _no_retry(self, serve_id: str, cause: dict[str, Any] | None) -> str | None:
        """Why a configuration whose server just failed to start is not started again, or None: an argument
        error fails the same way every time, and so does a start whose root cause repeats the last one's."""
        if cause is None:
            return None
        before = self._causes.get(serve_id)
        self._causes[serve_id] = cause["line"]
        if cause["kind"] == "argument":
            return "an argument error fails the same way every time"
        if deterministic(cause["kind"], cause["line"]):
            return f"{cause['line'].split(':')[0]} at start fails the same way every time"
        if same_cause(before, cause["line"]):
            return "it failed twice with the same root cause"
        return None

    def _moved(self, run: ConfigRun, server: Server, ready: dict[str, Any]) -> None:
        """The server lost its port to someone else before binding it and was started again on another one
        (no failed attempt): its new port and process in the ledger, and an event that says so."""
        head = server.infos[0]
        head.update(port=ready["port"], pid=ready["pid"], pid_create_time=ready["pid_create_time"])
        server.url = f"http://{head['host']}:{head['port']}"
        self.work.ledger.update_server(server.server_id, port=head["port"], pid=head["pid"],
                                       pid_create_time=head["pid_create_time"], ranks=json.dumps(server.rank_rows()))
        detail = f"server {server.server_id}: its port was taken before it bound it; started again on port " \
                 f"{head['port']} ({ready['port_retries']} time(s))"
        log.warning("%s", detail)
        self.work.ledger.add_event("port_retry", [run.serve.id], [server.nodes[0].get("hostname") or ""], detail)

    def hosts(self, run: ConfigRun, server_id: str) -> Server:
        """One host actor per node of the configuration's placement group, and the server's ledger row."""
        lay, res = run.layout, run.res
        assert res is not None
        hosts = [ServerHost.options(**placement.actor_options(res, r)).remote(  # type: ignore[attr-defined]
            server_id if lay.nnodes == 1 else f"{server_id}-rank{r}", str(self.work.log_dir))
            for r in range(lay.nnodes)]
        self.work.ledger.add_server(server_id, run.serve.id, shell_join(run.serve.display_argv()))
        return Server(server_id, hosts, cross_node=transport.needs_cross_node(lay.mode, lay.nnodes, run.serve.argv))

    def role_hosts(self, run: ConfigRun, server_id: str) -> Server:
        """A P/D deployment: one host actor per role server, each in its own bundle of the deployment's
        placement group (`raysweep.place.pd`), and the deployment's ledger row (one server of raysweep's)."""
        dep, res = run.serve.deployment, run.res
        assert dep is not None and res is not None
        roles = dep.instances(run.serve.argv, {}, run.serve.env)
        hosts = [ServerHost.options(**res.actor_options(i.role, i.index)).remote(  # type: ignore[attr-defined]
            f"{server_id}-{i.name}", str(self.work.log_dir)) for i in roles]
        self.work.ledger.add_server(server_id, run.serve.id, shell_join(run.serve.display_argv()))
        return Server(server_id, hosts, roles=roles)

    def _starts(self, run: ConfigRun, server: Server, argv: list[str], serve_http: bool,
                follower_argv: list[str] | None, env: dict[str, str]) -> list[tuple[list[str], dict[str, str], bool,
                                                                                    int]]:
        """The command, environment, HTTP or not and port retries of every rank (a P/D deployment: of every
        role server, each with its own HTTP port and, with NIXL, side channel)."""
        if server.roles:
            assert run.serve.deployment is not None
            side = {}
            if run.serve.deployment.connector.startswith("Nixl"):
                from raysweep.serve.pd import nixl_side_channels

                side = nixl_side_channels(run.serve.deployment, server.roles, server.hosts)
            return [(i.argv, {**env, **i.env, **side.get(i.name, {})}, True, PORT_RETRIES) for i in server.roles]
        lay = run.layout
        master = server.nodes[0]["node_ip"]
        port = run.wait(server.hosts[0].pick_port.remote(), 60)[1] if lay.nnodes > 1 else 0
        return [(rank_argv(follower_argv if r and follower_argv is not None else argv, lay, r, master, port), env,
                 serve_http and r == 0, PORT_RETRIES if lay.nnodes == 1 else 0) for r in range(len(server.hosts))]

    def launch(self, run: ConfigRun, server: Server, argv: list[str], serve_http: bool,
               follower_argv: list[str] | None = None) -> None:
        """Start the command on every rank (the multi-node flags added; ranks > 0 run `follower_argv` when
        given; a P/D deployment's role servers their own commands) and record where each runs. Raises
        Aborted or a RayError."""
        server.nodes = [run.wait(h.node_info.remote(), 300)[1] for h in server.hosts]
        master = server.nodes[0]["node_ip"]
        self._warm_weights(run, server)
        env = {**run.serve.env, **caches.cache_request(self.c, run.serve.env)}  # compilation caches
        if self.c.serve is not None:  # vLLM's own wait for its engines, never shorter than the campaign's
            env = engine_timeout_env(env, self.c.serve.ready_timeout_s)
        for h, (rank_cmd, rank_env, http, retries) in zip(
                server.hosts, self._starts(run, server, argv, serve_http, follower_argv, env), strict=True):
            ref = h.start.remote(rank_cmd, rank_env, http, self.c.transport.nccl_debug, retries)
            server.infos.append(run.wait(ref, 120)[1])
        head = server.infos[0]
        server.facts = run.wait([h.process_facts.remote() for h in server.hosts], 60)[1]
        warn_niced(server)
        if self.c.transport.telemetry:
            fake = run.serve.env.get(telemetry.FAKE_ENV)  # an NVML stand-in named in serve.env (tests, demos)
            rapl = run.serve.env.get(RAPL_ENV, POWERCAP)  # a fake powercap tree in serve.env (tests)
            run.wait([h.telemetry_start.remote(self.c.transport.telemetry_interval_s, str(fake) if fake else None,
                                               self.c.transport.idle_power_s, str(rapl), self.c.transport.dcgm_url)
                      for h in server.hosts], 60)
        if self.work.with_gpus:
            self._topology(run, server)
        self.work.ledger.update_server(
            server.server_id, command=head["command"], hostname=server.nodes[0]["hostname"],
            node_id=server.nodes[0]["node_id"], node_ip=master, port=head["port"], pid=head["pid"],
            pid_create_time=head["pid_create_time"], gpu_ids=server.nodes[0]["gpu_ids"], log_path=head["log_path"],
            ranks=json.dumps(server.rank_rows()), **process_columns(server.nodes, server.facts))

    def _warm_weights(self, run: ConfigRun, server: Server) -> None:
        """`serve.warm_weights`: the model's files read once per node, before the first server there."""
        if self.c.serve is None or not self.c.serve.warm_weights:
            return
        model = expected_model(run.serve.argv)
        with self._warm_lock:
            todo = [(n, h) for n, h in zip(server.nodes, server.hosts) if n["node_id"] not in self._warmed]
            self._warmed.update(n["node_id"] for n, _ in todo)
        for node, h in todo:
            done = run.wait(h.warm_model.remote(model or ""), 3600)[1]
            log.info("weights of %s read into the page cache of %s: %.0f MB in %.1f s%s", model, node.get("hostname"),
                     done["bytes"] / 1e6, done["seconds"], f" ({done['note']})" if done.get("note") else "")
            self.work.ledger.add_event("weights_warmed", [run.serve.id], [node.get("hostname") or ""],
                                       f"{model}: {done['bytes'] / 1e6:.0f} MB in {done['seconds']:.1f} s"
                                       + (f" ({done['note']})" if done.get("note") else ""))

    def _topology(self, run: ConfigRun, server: Server) -> None:
        """Record `nvidia-smi topo -m` of every node with the server and warn about its tensor-parallel groups
        (GPUs without NVLink between them, or across NUMA nodes)."""
        topo = run.wait([h.gpu_topology.remote() for h in server.hosts], 60)[1]
        tp = run.serve.shape.tp
        for node, t in zip(server.nodes, topo):
            t["warnings"] = preflight.tp_group_warnings(t.get("topology") or {}, list(t.get("gpus") or []), tp)
            for warning in t["warnings"]:
                log.warning("server config %s on %s: %s", run.serve.id, node.get("hostname"), warning)
                self.work.emit("topology_warning", serve=run.serve, server_id=server.server_id, warning=warning)
        self.work.ledger.update_server(server.server_id, topology=json.dumps(topo))

    def probe_fabric(self, run: ConfigRun) -> str | None:
        """With `transport.probe`, measure the all-reduce bandwidth across a multi-node configuration's
        placement group before its server starts; why it is refused by the bandwidth gate, or None."""
        cfg = self.c.transport
        if not cfg.probe or run.layout.nnodes < 2 or run.res is None:
            return None
        run.fabric = fabric.probe(run.res, cfg.probe_mib, cfg.probe_iters, env=dict(run.serve.env))
        refused = fabric.gate(run.fabric, cfg.min_busbw_gbps, cfg.min_busbw_fraction,
                              fabric.load_baseline(cfg.baseline))
        self.work.emit("fabric", serve=run.serve, probe=run.fabric, refused=refused)
        if refused:
            log.error("server config %s: %s", run.serve.id, refused)
        return refused

    def _wait_ready(self, run: ConfigRun, server: Server) -> dict[str, Any]:
        """Rank 0 answers /health and /v1/models, while every other rank still runs."""
        assert self.c.serve is not None, "servers start in mode serve only, which has a serve section"
        limit = self.c.serve.ready_timeout_s
        model = expected_model(run.serve.argv)
        t0 = time.monotonic()
        while True:
            left = limit - (time.monotonic() - t0)
            step = min(5.0, max(left, 0.5))
            _, ans = run.wait(server.hosts[0].wait_ready.remote(step, model), step + 60)
            if ans["ok"] or not ans.get("timeout"):
                return ans
            why = server.down() if len(server.hosts) > 1 else None
            if why is not None:
                return {"ok": False, "exited": True, "error": f"a rank ended before the server was ready: {why}"}
            if left <= step:
                return {"ok": False, "error": f"server not ready after {limit:.0f} s (/health and /v1/models)"}

    def _wait_roles_ready(self, run: ConfigRun, server: Server) -> dict[str, Any]:
        """A P/D deployment: every role server answers /health and /v1/models while the others still run, then
        its router starts in front (the URL the bench runs against). A failure names the role server (`rank`:
        its host, whose log gives the root cause)."""
        assert self.c.serve is not None, "servers start in mode serve only, which has a serve section"
        limit = self.c.serve.ready_timeout_s
        model = expected_model(run.serve.argv)
        t0 = time.monotonic()
        for rank, h in enumerate(server.hosts):
            while True:
                left = limit - (time.monotonic() - t0)
                step = min(5.0, max(left, 0.5))
                _, ans = run.wait(h.wait_ready.remote(step, model), step + 60)
                if ans["ok"]:
                    server.infos[rank].update({k: ans[k] for k in ("port", "pid", "pid_create_time") if k in ans})
                    break
                if not ans.get("timeout"):
                    return {**ans, "error": f"{server.who(rank)}: {ans['error']}", "rank": rank}
                why = server.down()
                if why is not None:
                    return {"ok": False, "exited": True, "rank": server.failed_rank,
                            "error": f"{why} before the deployment was ready"}
                if left <= step:
                    return {"ok": False, "rank": rank, "error": f"{server.who(rank)} not ready after {limit:.0f} s "
                            "(/health and /v1/models)"}
        return self._start_router(run, server)

    def _start_router(self, run: ConfigRun, server: Server) -> dict[str, Any]:
        """raysweep's P/D router in its bundle of the deployment's group, in front of every role server."""
        from raysweep.place.pd import ROUTER
        from raysweep.serve.pd import RouterHost

        assert run.serve.deployment is not None and run.res is not None
        server.router = RouterHost.options(**run.res.actor_options(ROUTER)).remote(  # type: ignore[attr-defined]
            server.role_urls("prefill"), server.role_urls("decode"),
            run.serve.deployment.connector.startswith("Nixl"))
        try:
            server.url = run.wait(server.router.url.remote(), 120)[1]
        except ray.exceptions.RayError as exc:
            return {"ok": False, "error": f"the P/D router did not start: {type(exc).__name__}: {exc}"}
        self.work.ledger.update_server(server.server_id, ranks=json.dumps(server.rank_rows()))
        log.info("server %s: P/D deployment %s ready behind its router at %s", server.server_id,
                 run.serve.deployment.describe(), server.url)
        return {"ok": True}

    def check_transport(self, run: ConfigRun, server: Server) -> str | None:
        """Read NCCL's lines from every rank and store the verdict with the server. A multi-node config whose
        cross-node links are slower than `transport.require` is refused (the reason, with the evidence):
        its lines are awaited up to `transport.wait_s`, since NCCL may connect channels lazily."""
        if server.roles:  # a P/D deployment's servers are each on one node; its KV connector is not NCCL's
            return None
        cfg = self.c.transport
        # a layout without NCCL links between its nodes (data-parallel replicas) has none to wait for
        gated = len(server.hosts) > 1 and cfg.require != "any" and server.cross_node is not False
        deadline = time.monotonic() + (cfg.wait_s if gated else 0.0)
        while True:
            verdict = self.read_transport(run, server)
            if verdict is None:
                return None
            if not gated or transport.meets(verdict, cfg.require) or time.monotonic() >= deadline:
                break
            time.sleep(1.0)
        refused = transport.refusal(verdict, cfg.require)
        if refused:
            log.error("server config %s: %s", run.serve.id, refused)
        self.work.emit("transport", serve=run.serve, server_id=server.server_id, verdict=verdict, refused=refused)
        return refused

    def read_transport(self, run: ConfigRun | None, server: Server) -> dict[str, Any] | None:
        """The server's NCCL transport verdict from every rank's lines now (None when they cannot be read)."""
        refs = [h.nccl_lines.remote() for h in server.hosts]
        try:
            lines = run.wait(refs, 120)[1] if run is not None else ray.get(refs, timeout=60)
        except ray.exceptions.RayError as exc:
            log.info("server %s: NCCL lines not read (%s)", server.server_id, exc)
            return None
        server.transport = transport.server_verdict(lines, server.cross_node)
        self.work.ledger.update_server(server.server_id, transport=json.dumps(server.transport))
        return server.transport

    def stop(self, server: Server, state: str = "stopped") -> None:
        """Stop every rank through its host (no process left behind), keep its log, kill the host actors."""
        if server.transport is not None:  # channels connected after the check (lazily) count too
            self.read_transport(None, server)
        if server.router is not None:  # a P/D deployment: its router first, then every role server
            try:
                ray.get(server.router.stop.remote(), timeout=60)
            except ray.exceptions.RayError as exc:
                log.info("server %s: its P/D router did not stop cleanly (%s)", server.server_id, exc)
            with contextlib.suppress(Exception):
                ray.kill(server.router)
            server.router = None
        refs = [h.stop.remote() for h in server.hosts]
        left: list[int] = []
        for rank, (h, ref) in enumerate(zip(server.hosts, refs)):
            try:
                left += ray.get(ref, timeout=120).get("left", [])
                path = server.infos[rank]["log_path"] if rank < len(server.infos) else ""
                local = self.work.log_dir / Path(path).name
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
        self.work.ledger.update_server(server.server_id, **fields)
        self.work.emit("server_stopped", server_id=server.server_id, left=left)

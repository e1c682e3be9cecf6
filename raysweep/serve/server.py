"""Server host actors: launch the server command on a node, wait until it is ready, reset caches, stop it.

A `ServerHost` actor sits in the placement group bundle that holds the configuration's GPUs (Ray sets
CUDA_VISIBLE_DEVICES for it) and starts the server as a child process through `raysweep.serve.guard`, on a
free port of its own, with its output in a log file. Readiness means `/health` answers 200 and
`/v1/models` lists the expected model. Servers start with `NCCL_DEBUG=INFO` (unless set), so that the
transport check can read, on every node, which links NCCL chose (`nccl_lines`). Stopping terminates the whole
process tree, waits for it to exit
and for the port to be free, then kills what is left.

The guard raises the server to niceness 0 where the OS allows; `process_facts` reads the niceness and CPU
affinity of the running server process (and what the guard could do). While the server starts, the host
gathers its provenance on the node (`raysweep.serve.provenance`), returned by `provenance`.
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import ray

from raysweep import grid, procs
from raysweep.place.placement import Layout
from raysweep.procs import cpu_text
from raysweep.serve import caches, guard, provenance

__all__ = ["ENGINE_READY_ENV", "NETWORK_ENV", "RESET_ENDPOINTS", "ServerHost", "engine_timeout_env", "expected_model",
           "isolation_env", "rank_argv", "reset_caches", "server_argv"]

log = logging.getLogger(__name__)

RESET_ENDPOINTS = ("/reset_prefix_cache", "/reset_mm_cache", "/reset_encoder_cache")


def expected_model(argv: list[str]) -> str | None:
    """The model name the server will list in /v1/models: --served-model-name, --model, or `serve MODEL`."""
    name = grid.find_flag_value(argv, "--served-model-name", "--served_model_name")
    if name:
        return name
    model = grid.find_flag_value(argv, "--model")
    if model:
        return model
    if "serve" in argv:
        i = argv.index("serve")
        if i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            return argv[i + 1]
    return None


def server_argv(argv: list[str], host: str, port: int) -> list[str]:
    """The server command with our own `--host` and `--port` in place of any the user gave."""
    return grid.apply_to_cmd(argv, {"host": host, "port": port})


def rank_argv(argv: list[str], layout: Layout, rank: int, master_addr: str, master_port: int) -> list[str]:
    """The command of one node's part of a multi-node server, by vLLM's multiprocessing multi-node rules.

    mode `nnodes`: `--nnodes N --node-rank r --master-addr A --master-port P`, plus `--headless` on r > 0.
    mode `dp`: `--data-parallel-size-local L --data-parallel-address A --data-parallel-rpc-port P`, plus
    `--headless --data-parallel-start-rank r*L` on r > 0. One node: the command unchanged.
    """
    if layout.nnodes == 1:
        return list(argv)
    if layout.mode == "nnodes":
        extra: dict[str, Any] = {"nnodes": layout.nnodes, "node_rank": rank, "master_addr": master_addr,
                                 "master_port": master_port}
    else:
        extra = {"data_parallel_size_local": layout.dp_local, "data_parallel_address": master_addr,
                 "data_parallel_rpc_port": master_port}
        if rank:
            extra["data_parallel_start_rank"] = rank * layout.dp_local
    if rank:
        extra["headless"] = True
    return grid.apply_to_cmd(argv, extra)


NETWORK_ENV = ("VLLM_HOST_IP", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")

def network_of(env: dict[str, str]) -> dict[str, str | None]:
    """A server's address and interface variables and every variable that steers its fabric (NCCL_*, GLOO_*,
    UCX_*, FI_*; `place.fabric.fabric_env`), from its full environment: the record the fabric probe's matches."""
    from raysweep.place.fabric import fabric_env

    return {**{k: env.get(k) for k in NETWORK_ENV}, **fabric_env(env)}


# vLLM's own wait for its engine processes (`vllm/v1/engine/core_client.py`, 600 s by default): with data
# parallelism or a headless rank the API server gives up on its engines after this long, whatever the campaign waits
ENGINE_READY_ENV = "VLLM_ENGINE_READY_TIMEOUT_S"


def engine_timeout_env(env: dict[str, str], ready_timeout_s: float) -> dict[str, str]:
    """The server's environment `env` (`serve.env`) with vLLM's engine start-up timeout at least the campaign's
    `serve.ready_timeout_s` (a larger value in `serve.env` is kept), so that vLLM never gives up on its engines
    before raysweep gives up on the server. It overrides a value in the node's own environment."""
    want = math.ceil(ready_timeout_s)
    have = env.get(ENGINE_READY_ENV, "")
    try:
        given = int(float(have)) if have else 0
    except ValueError:
        given = 0
    if given >= want:
        return dict(env)
    if have:
        log.warning("serve.env %s=%s is shorter than serve.ready_timeout_s: the server gets %d s", ENGINE_READY_ENV,
                    have, want)
    return {**env, ENGINE_READY_ENV: str(want)}


def isolation_env(environ: dict[str, str]) -> dict[str, str]:
    """Ray's switches that stop it from setting CUDA_VISIBLE_DEVICES (and the like) for its workers, where they are
    on (`RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1`, read as Ray reads it: `1` or `true`). A server started
    under one sees every GPU of its node, not its bundle's: two configurations on a node then share GPUs."""
    return {k: v for k, v in sorted(environ.items())
            if k.startswith("RAY_EXPERIMENTAL_NOSET_") and k.endswith("VISIBLE_DEVICES") and v.lower() in ("1", "true")}


STATE_PREFIX = "raysweep-guard-"
HOST_FILE = "host"  # the host actor's pid and start time, in its guard's state directory


def _remove_orphaned_state() -> None:
    """Remove the guard state directories of host actors on this node that are gone (killed with their
    guard, which then had no chance to clean up)."""
    for d in Path(tempfile.gettempdir()).glob(f"{STATE_PREFIX}*"):
        try:
            pid, created = (d / HOST_FILE).read_text().split()
        except (OSError, ValueError):
            continue
        if not procs.is_alive(int(pid), float(created)):
            shutil.rmtree(d, ignore_errors=True)


def _http(method: str, url: str, timeout: float = 5.0) -> tuple[int, str]:
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(exc)


@ray.remote(max_restarts=0, max_concurrency=4)
class ServerHost:
    """Runs one server process (one node's part of a server configuration)."""

    def __init__(self, server_id: str, log_dir: str | None = None) -> None:
        self.server_id = server_id
        self.ip = ray.util.get_node_ip_address()
        base = Path(log_dir) if log_dir and Path(log_dir).is_dir() else Path(tempfile.gettempdir()) / "raysweep-logs"
        base.mkdir(parents=True, exist_ok=True)
        self.log_path = base / f"server-{server_id}.log"
        self.guard_pid: int | None = None
        self._exit_code: int | None = None
        self.state_dir = Path(tempfile.gettempdir())
        self.port: int | None = None
        self._nccl_file: str | None = None
        self._started_at = 0.0
        self._provenance: dict[str, Any] | None = None
        self._provenance_thread: threading.Thread | None = None
        self._hold: socket.socket | None = None  # the server's port, held until it listens
        self._launch: tuple[list[str], dict[str, str], bool, bool] | None = None
        self._log_offset = 0
        self.port_retries = 0  # starts lost to a port taken by someone else meanwhile
        self._max_port_retries = 0
        self._cache_root: Path | None = None    # its compilation caches (raysweep.serve.caches)
        self._cache_remove: Path | None = None  # ... when they are its own, removed when it stops
        self.network: dict[str, str | None] = {}  # the address and interfaces this rank was started with
        _remove_orphaned_state()

    def node_info(self) -> dict[str, Any]:
        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "node_ip": self.ip, "hostname": socket.gethostname(),
                "gpu_ids": ",".join(str(g) for g in ctx.get_accelerator_ids().get("GPU", [])),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "physical_cores": psutil.cpu_count(logical=False) or os.cpu_count() or 1}

    def cache_info(self) -> dict[str, Any]:
        """Where its compilation caches are and how many bytes they hold now (raysweep.serve.caches)."""
        return {"cache_dir": str(self._cache_root) if self._cache_root else None,
                "cache_bytes": caches.dir_bytes(self._cache_root)}

    def warm_model(self, path: str) -> dict[str, Any]:
        """Read a local model directory once into this node's page cache (`serve.warm_weights`)."""
        return caches.warm_files(path)

    def pick_port(self) -> int:
        """A free port on this node (for the rendezvous of a multi-node server)."""
        return procs.free_port(self.ip)

    def pick_ports(self, n: int, avoid: list[int]) -> int:
        """The first of `n` consecutive free ports on this node, none in `avoid` (a KV connector's side channel:
        one port per data-parallel rank of a server)."""
        return procs.free_port_block(self.ip, n, avoid)

    def start(self, argv: list[str], env: dict[str, str], serve_http: bool = True,
              nccl_debug: bool = True, port_retries: int = 0) -> dict[str, Any]:
        """Start the server under `raysweep.serve.guard`; returns the guard's pid and start time, host, port, log.
        `serve_http=False` for the headless ranks of a multi-node server: no `--host`/`--port` of ours.
        `nccl_debug`: NCCL_DEBUG=INFO unless the campaign or this node's environment sets NCCL_DEBUG.
        Its port is held until the server is ready (`procs.hold_port`); a server that still finds it taken
        (someone outside raysweep bound it) is started again on another port by `wait_ready`, up to
        `port_retries` times, which is no failed attempt."""
        self._launch, self._max_port_retries = (list(argv), dict(env), serve_http, nccl_debug), port_retries
        env = dict(env)
        caches.remove(self._cache_remove)  # a start again after a lost port: fresh caches again
        cache_env, self._cache_root, self._cache_remove = caches.node_dirs(env.pop(caches.CACHE_ENV, None),
                                                                           self.server_id)
        env = {**cache_env, **env}
        self.port = port = self._take_port() if serve_http else None
        full = procs.resolve_executable(server_argv(argv, self.ip, port) if port is not None else list(argv))
        extra = {"VLLM_SERVER_DEV_MODE": "1", **self.rank_network_env(env)}
        if nccl_debug and "NCCL_DEBUG" not in env and "NCCL_DEBUG" not in os.environ:
            extra["NCCL_DEBUG"] = "INFO"
        env_ = procs.child_env({**extra, **env})
        self.network = network_of(env_)
        self._nccl_file = env_.get("NCCL_DEBUG_FILE")
        self._started_at = time.time()
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        me = psutil.Process()
        self.state_dir = Path(tempfile.mkdtemp(prefix=f"{STATE_PREFIX}{self.server_id}-"))
        (self.state_dir / HOST_FILE).write_text(f"{me.pid} {me.create_time()!r}")
        with open(self.log_path, "ab") as logf:
            logf.write(f"# raysweep: {grid.shell_join(grid.mask_argv(full))}\n".encode())
            logf.flush()
            launcher = subprocess.Popen(
                [sys.executable, "-m", "raysweep.serve.guard", str(me.pid), repr(me.create_time()), str(self.state_dir),
                 "--", *full], stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env_)
        launcher.wait(timeout=60)
        self._gather_provenance(argv)
        pid_file = self.state_dir / guard.PID_FILE
        procs.wait_for(pid_file.exists, 30, 0.02)
        self.guard_pid = int(pid_file.read_text())
        return {"pid": self.guard_pid, "pid_create_time": psutil.Process(self.guard_pid).create_time(),
                "host": self.ip, "port": self.port, "log_path": str(self.log_path),
                "command": grid.shell_join(grid.mask_argv(full)), "network": dict(self.network)}

    def network_for(self, env: dict[str, str]) -> dict[str, str | None]:
        """The address and fabric variables a server started here with `serve.env` = `env` runs with (what
        `start` records as `network`)."""
        return network_of(procs.child_env({**self.rank_network_env(env), **env}))

    def rank_network_env(self, env: dict[str, str]) -> dict[str, str]:
        """This rank's own address and interface for vLLM and gloo (NCCL too where the bundle has GPUs), by the
        rule the fabric probe follows too (`place.fabric.rank_network_env`): its node's Ray address as
        VLLM_HOST_IP, the interface that holds it as GLOO_SOCKET_IFNAME (and NCCL_SOCKET_IFNAME), each unless
        the campaign (`serve.env`) or this node's environment sets it. Left to themselves, vLLM guesses its
        address from a default route a host may not have ("using 0.0.0.0"), and gloo from the hostname, which
        Debian's /etc/hosts maps to 127.0.1.1: the ranks then dial each other on loopback."""
        from raysweep.place.fabric import rank_network_env

        gpus = bool(ray.get_runtime_context().get_accelerator_ids().get("GPU"))
        return rank_network_env(self.ip, env, dict(os.environ), gpus)

    def _take_port(self) -> int:
        """A port for the server, held until it is ready; after two starts that lost their port anyway,
        plainly free (a command that does not set SO_REUSEADDR cannot bind a held port)."""
        self._release_port()
        if self.port_retries >= 2:
            return procs.free_port(self.ip)
        self._hold = procs.hold_port(self.ip)
        return int(self._hold.getsockname()[1])

    def _release_port(self) -> None:
        if self._hold is not None:
            self._hold.close()
            self._hold = None

    def _lost_port(self) -> bool:
        """Whether the server that just exited found its port taken (its log since it started says so)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                text = f.read(1 << 20).decode(errors="replace").lower()
        except OSError:
            return False
        return "address already in use" in text or "errno 98" in text

    def _start_again(self) -> None:
        """Start the same command again on another port (the last start lost its port)."""
        assert self._launch is not None
        self.port_retries += 1
        log.warning("server %s: port %s was taken before the server bound it; starting it again on another port",
                    self.server_id, self.port)
        shutil.rmtree(self.state_dir, ignore_errors=True)
        self._exit_code, self.guard_pid = None, None
        argv, env, serve_http, nccl_debug = self._launch
        self.start(argv, env, serve_http, nccl_debug, self._max_port_retries)

    def _gather_provenance(self, argv: list[str]) -> None:
        def gather() -> None:
            try:
                self._provenance = provenance.gather(list(argv))
            except Exception as exc:
                self._provenance = {"hostname": socket.gethostname(), "error": f"{type(exc).__name__}: {exc}"}
        self._provenance_thread = threading.Thread(target=gather, name="provenance", daemon=True)
        self._provenance_thread.start()

    def telemetry_start(self, interval_s: float, fake: str | None = None, idle_s: float = 0.0,
                        rapl_root: str | None = None, dcgm_url: str | None = None) -> str:
        """Start sampling this node's GPUs of the server through NVML (`raysweep.serve.telemetry`; `fake`: the JSON
        file of an NVML stand-in; without NVML, the DCGM exporter at `dcgm_url` or AMD SMI, and on a node without
        GPUs the RAPL packages under `rapl_root`), after reading their
        idle power for `idle_s` (the server is up, nothing loads it yet); its source."""
        from raysweep.serve import telemetry

        if getattr(self, "_telemetry", None) is None:
            gpus = [str(g) for g in ray.get_runtime_context().get_accelerator_ids().get("GPU", [])]
            nvml = telemetry.FileNvml(fake) if fake else None
            dcgm = dcgm_url.replace("{node_ip}", ray.util.get_node_ip_address()) if dcgm_url else None
            sampler = telemetry.Sampler(gpus, interval_s, nvml, "fake NVML" if fake else "", rapl_root=rapl_root,
                                        dcgm_url=dcgm, amd=True)
            if idle_s > 0:
                sampler.measure_idle(idle_s)
            self._telemetry = sampler.start()
        return str(self._telemetry.source)

    def telemetry_energy(self, t0: float, t1: float) -> dict[str, Any]:
        """The energy readings of this node's devices of the server around t0..t1 (`Sampler.energy_window`)."""
        sampler = getattr(self, "_telemetry", None)
        return sampler.energy_window(t0, t1) if sampler is not None else {}

    def telemetry_window(self, t0: float, t1: float) -> dict[str, Any]:
        """The GPU samples taken between t0 and t1 (empty before `telemetry_start`)."""
        sampler = getattr(self, "_telemetry", None)
        return sampler.window(t0, t1) if sampler is not None else {}

    def gpu_topology(self) -> dict[str, Any]:
        """`nvidia-smi topo -m` on this node, parsed, with this server's GPUs (`place.preflight.parse_topo`)."""
        from raysweep.place import preflight

        gpus = [str(g) for g in ray.get_runtime_context().get_accelerator_ids().get("GPU", [])]
        return {"gpus": gpus, **preflight.topo_facts(preflight.run_command(preflight.TOPO_QUERY, 20.0))}

    def provenance(self, timeout_s: float = 120.0) -> dict[str, Any] | None:
        """What the server runs with on this node (gathered while it started); None before `start`."""
        if self._provenance_thread is not None:
            self._provenance_thread.join(timeout_s)
        return self._provenance

    def process_facts(self) -> dict[str, Any]:
        """The running server process's niceness and CPU affinity, and what the guard did to the niceness
        ({before, after, error}); None values once it has ended."""
        facts: dict[str, Any] = {"nice": None, "cpu_affinity": None, "renice": None}
        with contextlib.suppress(OSError, ValueError):
            facts["renice"] = json.loads((self.state_dir / guard.NICE_FILE).read_text())
        pid_file = self.state_dir / guard.SERVER_PID_FILE
        procs.wait_for(pid_file.exists, 10, 0.05)
        with contextlib.suppress(OSError, ValueError, psutil.Error):
            proc = psutil.Process(int(pid_file.read_text()))
            facts["nice"] = proc.nice()
            facts["cpu_affinity"] = cpu_text(proc.cpu_affinity() or [])
            # the GPUs the process itself was given (Ray sets it for the bundle): the acceptance checklist.
            # Unset (Ray told not to set it) means the server sees every GPU of the node.
            penv = proc.environ()
            facts["cuda_visible_devices"] = penv.get("CUDA_VISIBLE_DEVICES")
            facts["cuda_visible_set"] = "CUDA_VISIBLE_DEVICES" in penv
            facts["noset_visible_devices"] = isolation_env(penv)
        return facts

    def url(self) -> str:
        return f"http://{self.ip}:{self.port}"

    def exit_code(self) -> int | None:
        """None while the server runs; its exit code once it has ended."""
        if self.guard_pid is None:
            return None
        if self._exit_code is not None:
            return self._exit_code
        exit_file = self.state_dir / guard.EXIT_FILE
        server_pid = self.state_dir / guard.SERVER_PID_FILE
        if not exit_file.exists():
            if not procs.is_alive(self.guard_pid, None):
                return -9
            if not server_pid.exists() or procs.is_alive(int(server_pid.read_text()), None):
                return None
            # the server's main process is gone; the guard is still ending what it left behind
            procs.wait_for(exit_file.exists, 30, 0.05)
        text = exit_file.read_text().strip() if exit_file.exists() else ""
        self._exit_code = int(text) if text else -1
        return self._exit_code

    def wait_ready(self, timeout_s: float, model: str | None) -> dict[str, Any]:
        """Poll /health and /v1/models until ready, the process exits, or the timeout passes (then the
        answer has `"timeout": True`)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            code = self.exit_code()
            if code is not None and self.port is not None and self.port_retries < self._max_port_retries \
                    and self._lost_port():
                self._start_again()
                continue
            if code is not None:
                self._release_port()
                return {"ok": False, "exited": True,
                        "error": f"server process exited with code {code} before it was ready"}
            status, _ = _http("GET", self.url() + "/health", timeout=2)
            if status == 200:
                status, body = _http("GET", self.url() + "/v1/models", timeout=5)
                if status == 200 and self._lists_model(body, model):
                    self._release_port()
                    return {"ok": True, "elapsed_s": time.monotonic() - t0, **self.started()}
            time.sleep(0.5)
        return {"ok": False, "timeout": True,
                "error": f"server not ready after {timeout_s:.0f} s (/health and /v1/models)"}

    def started(self) -> dict[str, Any]:
        """The running server: its port, guard pid and start time, and how many starts lost their port."""
        pid = self.guard_pid
        created = None
        with contextlib.suppress(psutil.Error, TypeError, ValueError):
            created = psutil.Process(pid).create_time()
        return {"port": self.port, "pid": pid, "pid_create_time": created, "port_retries": self.port_retries}

    @staticmethod
    def _lists_model(body: str, model: str | None) -> bool:
        try:
            ids = [m.get("id") for m in json.loads(body).get("data", [])]
        except (ValueError, AttributeError):
            return False
        return bool(ids) and (model is None or model in ids)

    def reset_caches(self, attempts: int = 5) -> dict[str, Any]:
        return reset_caches(self.url(), attempts)

    def log_tail(self, lines: int = 40) -> str:
        return procs.tail(self.log_path, lines)

    def root_cause(self) -> dict[str, Any] | None:
        """The first error line of the server's log (`raysweep.serve.root_cause`): {line, kind, lineno}, or None."""
        from dataclasses import asdict

        from raysweep.serve.root_cause import root_cause

        cause = root_cause(self.read_log())
        return asdict(cause) if cause is not None else None

    def read_log(self, max_bytes: int = 4 * 1024 * 1024) -> str:
        return procs.tail(self.log_path, lines=10**9, max_bytes=max_bytes)

    def wait_exit(self, timeout_s: float) -> int | None:
        """The process's exit code once it has ended, or None after `timeout_s` (an offline point runs to its end)."""
        deadline = time.monotonic() + timeout_s
        while (code := self.exit_code()) is None and time.monotonic() < deadline:
            time.sleep(0.2)
        return code

    def scratch_path(self, name: str) -> str:
        """A path on this node, beside the log, for a file the process writes (an offline point's JSON)."""
        return str(self.log_path.parent / name)

    def read_text(self, path: str, max_bytes: int = 64 * 1024 * 1024) -> str | None:
        """A file on this node (None when missing): the result JSON of an offline point."""
        try:
            with open(path, "rb") as f:
                return f.read(max_bytes).decode(errors="replace")
        except OSError:
            return None

    def nccl_lines(self, limit: int = 20000) -> list[str]:
        """NCCL's lines of this rank: from its log, and from the files NCCL_DEBUG_FILE names (`%h` and `%p`
        stand for any host and pid) written since the server started."""
        sources = [self.log_path]
        if self._nccl_file:
            sources += sorted(Path(f) for f in glob.glob(re.sub(r"%[hp]", "*", self._nccl_file)))
        lines: list[str] = []
        for src in sources:
            with contextlib.suppress(OSError):
                if src != self.log_path and src.stat().st_mtime < self._started_at - 1:
                    continue  # an earlier server's file
                with open(src, errors="replace") as f:
                    lines += [ln.rstrip("\n") for ln in f if "NCCL" in ln]
        return lines[:limit]

    def stop(self, grace_s: float = 30.0) -> dict[str, Any]:
        """Stop the server tree, wait for it and for the port to be free; kill what is left."""
        self._release_port()
        if self.guard_pid is None:
            return {"exit_code": None, "left": [], "port_free": True}
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.guard_pid, signal.SIGTERM)  # the guard stops the server gracefully, then its leftovers
        procs.wait_for(lambda: not procs.is_alive(self.guard_pid, None), grace_s + 10, 0.1)
        left = procs.kill_tree(self.guard_pid, grace_s=5)
        code = self.exit_code()
        shutil.rmtree(self.state_dir, ignore_errors=True)
        caches.remove(self._cache_remove)
        self._cache_remove = None
        port = self.port
        port_free = port is None or procs.wait_for(lambda: procs.port_is_free(self.ip, port), 15)
        return {"exit_code": code, "left": left, "port_free": port_free}


def reset_caches(url: str, attempts: int = 5) -> dict[str, Any]:
    """POST the cache-reset endpoints of the server at `url`; the prefix-cache reset must answer
    {"success": true} (vLLM serves them with VLLM_SERVER_DEV_MODE=1)."""
    detail = ""
    for i in range(attempts):
        status, body = _http("POST", url + RESET_ENDPOINTS[0] + ("?reset_running_requests=true" if i >= 2 else ""))
        ok = status == 200 and _success(body)
        detail = f"{RESET_ENDPOINTS[0]}: HTTP {status} {body.strip()[:200]}"
        if ok:
            for ep in RESET_ENDPOINTS[1:]:
                _http("POST", url + ep)
            return {"ok": True, "detail": detail}
        if status == 404:
            detail += " (vLLM serves the reset endpoints with VLLM_SERVER_DEV_MODE=1)"
            break
        time.sleep(0.5 * (i + 1))
    return {"ok": False, "detail": detail}


def _success(body: str) -> bool:
    try:
        data = json.loads(body)
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("success") is True

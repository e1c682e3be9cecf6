"""Processes we start: free ports, killing a whole process tree, log tails, liveness by pid + start time, and the
CPU sets they are pinned to (`cpu_set`, `cpu_text`).

Nothing here kills by name: only process ids that we started (and their descendants) are signalled.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import socket
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import psutil

__all__ = ["child_env", "cpu_set", "cpu_text", "free_port", "hold_port", "iface_of", "is_alive", "kill_tree",
           "port_is_free",
           "resolve_executable", "tail"]


RAY_WORKER_ONLY_ENV = ("OMP_NUM_THREADS",)


def child_env(extra: dict[str, str]) -> dict[str, str]:
    """The environment for a process started from a Ray worker: the worker's own, less what Ray sets for its
    workers only (OMP_NUM_THREADS=1 would make vLLM's CPU backend compute on one thread), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in RAY_WORKER_ONLY_ENV}
    env.update(extra)
    return env


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_port_block(host: str = "127.0.0.1", n: int = 1, avoid: Iterable[int] = ()) -> int:
    """The first of `n` consecutive TCP ports that nothing listens on right now, none of them in `avoid`
    (ports already given to another server that has not bound them yet)."""
    avoid = set(avoid)
    for _ in range(200):
        base = free_port(host)
        ports = range(base, base + n)
        if avoid.intersection(ports) or ports[-1] > 65535:
            continue
        if all(_bindable(host, p) for p in ports[1:]):
            return base
    raise OSError(f"no {n} consecutive free ports on {host}")


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def hold_port(host: str = "127.0.0.1") -> socket.socket:
    """A free TCP port, held: a socket bound to it (SO_REUSEADDR, never listening). While it is open no
    other bind to port 0 on this host gets that port, yet a server that sets SO_REUSEADDR itself (vLLM and
    uvicorn, Python's http.server, asyncio) can bind and listen on it. Close it once the server listens."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, 0))
    return s


def iface_of(ip: str) -> str:
    """The network interface that holds `ip` on this host, `lo` for a loopback address, or "" when none does."""
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == ip for a in addrs):
            return name
    return "lo" if ip.startswith("127.") else ""


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def niceness_zero() -> str | None:
    """Niceness 0 for every thread of this process (Linux keeps it per thread, and a child starts at its
    parent thread's), where the OS allows; the reason it could not be lowered otherwise."""
    def lower(tid: int) -> None:
        if os.getpriority(os.PRIO_PROCESS, tid) > 0:
            os.setpriority(os.PRIO_PROCESS, tid, 0)
    return _each_thread(lower, "")


def _threads() -> list[int]:
    """The ids of this process's threads (0, this thread, where /proc cannot tell)."""
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


def _each_thread(apply: Callable[[int], object], what: str) -> str | None:
    """`apply` to every thread of this process; the first failure as text (prefixed with `what`), else None."""
    failure = None
    for tid in _threads():
        try:
            apply(tid)
        except OSError as exc:
            failure = failure or f"{what}{type(exc).__name__}: {exc}"
    return failure


CPUS_ENV = "RAYSWEEP_CPU_AFFINITY"  # CPU ids ("0-3,6") the server guard pins itself (and so the server) to


def pin_cpus(cpus: set[int]) -> str | None:
    """Run every thread of this process (and what it starts later) on `cpus` only (Linux keeps the
    affinity per thread); the reason it could not otherwise (e.g. a CPU this node does not have)."""
    return _each_thread(lambda tid: os.sched_setaffinity(tid, cpus), f"CPU affinity {sorted(cpus)}: ")


def is_alive(pid: int | None, create_time: float | None) -> bool:
    """True if `pid` runs and is the same process (same start time) as when it was recorded."""
    if not pid:
        return False
    try:
        p = psutil.Process(pid)
        if create_time is not None and abs(p.create_time() - create_time) > 0.5:
            return False
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def kill_tree(pid: int, grace_s: float = 10.0, include_root: bool = True) -> list[int]:
    """Terminate a process and all its descendants, wait up to `grace_s`, then kill what is left.

    Returns the pids still alive at the end (normally none).
    """
    try:
        root = psutil.Process(pid)
        procs = root.children(recursive=True)
        if include_root:
            procs.append(root)
    except psutil.Error:
        return []
    for p in procs:
        try:
            p.terminate()
            p.resume()  # a stopped process gets the SIGTERM too
        except psutil.Error:
            pass
    alive = _wait_gone(procs, grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    return [p.pid for p in _wait_gone(alive, 5)]


def _gone(p: psutil.Process) -> bool:
    """Exited: no such process, or a zombie (which only its parent, perhaps init, can reap)."""
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def _wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until every process has exited (zombies count as exited); returns those still running."""
    deadline = time.monotonic() + timeout
    alive = [p for p in procs if not _gone(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if not _gone(p)]
    return alive


def tail(path: str | Path, lines: int = 40, max_bytes: int = 64 * 1024) -> str:
    """The last `lines` lines of a text file (at most `max_bytes` read), or '' if there is none."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


def resolve_executable(argv: list[str]) -> list[str]:
    """`argv` with its program found on PATH, else beside the running interpreter (an unactivated venv)."""
    if not argv or os.sep in argv[0] or shutil.which(argv[0]):
        return list(argv)
    beside = Path(sys.executable).parent / argv[0]
    return [str(beside), *argv[1:]] if beside.exists() else list(argv)


def wait_for(predicate: Callable[[], Any], timeout_s: float, interval_s: float = 0.2) -> bool:
    """Poll `predicate()` until it is true or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return bool(predicate())


def cpu_set(value: object) -> set[int] | None:
    """CPU ids from an affinity as recorded: a list of ints, or text like "0-3,6" (None when unknown)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return {value}
    if isinstance(value, (list, tuple, set)):
        out: set[int] = set()
        for v in value:
            got = cpu_set(v)
            if got is None:
                return None
            out |= got
        return out
    text = str(value).strip().strip("[]{}")
    if not text:
        return None
    out = set()
    for part in re.split(r"[,;|\s]+", text):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            return None
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def cpu_text(cpus: Iterable[int]) -> str:
    """CPU ids as compact ranges: {0, 1, 2, 5} -> "0-2,5"."""
    ids = sorted(set(cpus))
    parts, i = [], 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(parts)

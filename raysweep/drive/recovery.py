"""Recovery of what a dead driver left: its points, its servers on every node, its embedded Ray.

A driver records its pid (and start time) and the processes of its embedded Ray in the ledger. The next
driver puts the points a dead one left running back to pending, kills what is left of the servers it never
stopped (every rank, on every node, matched by pid and start time), stops the processes of its embedded
Ray and removes their session directory.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psutil
import ray

from raysweep import procs
from raysweep.ledger import Ledger, ServerRow
from raysweep.place import placement

__all__ = ["dead_drivers", "driver_alive", "embedded_temp_dir", "helper_processes", "reap_lost", "reap_lost_drivers",
           "recover"]

log = logging.getLogger(__name__)


def embedded_temp_dir(pid: int) -> str:
    """Where the embedded Ray of driver `pid` keeps its session (short: AF_UNIX paths are limited)."""
    return f"/tmp/rs-{pid}"


def driver_alive(hostname: str, pid: int, create_time: float) -> bool:
    """Whether a driver recorded in the ledger still runs (one on another host is assumed to)."""
    if hostname != socket.gethostname():
        return True
    return procs.is_alive(pid, create_time)


def helper_processes(me: psutil.Process) -> list[tuple[int, float]]:
    """The processes this driver started on its host: the embedded Ray's GCS, raylet, agents and workers."""
    found = []
    for p in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            found.append((p.pid, p.create_time()))
    return found


def recover(ledger: Ledger, retry_failed: bool) -> None:
    """Before a run: fresh attempts for failed points (`retry_failed`), and what dead drivers left."""
    if retry_failed:
        log.info("%d failed point(s) get a fresh set of attempts", ledger.retry_failed())
    requeued, lost = ledger.recover()
    if requeued:
        log.info("%d point(s) of an earlier driver went back to pending", requeued)
    reap_lost_drivers(ledger.lost_drivers())
    reap_lost(lost)


def reap_lost_drivers(drivers: list[dict[str, Any]], wait_s: float = 5.0) -> list[int]:
    """Stop what dead drivers on this host left behind and remove their session directories; returns the
    pids stopped. Their embedded Ray is of no use to anyone (its GCS is gone or about to be, and its agents
    would wait on it for a minute or more before exiting): every process of it is killed at once (SIGKILL,
    no grace), all together, and they are waited for together for at most `wait_s`. `drivers`: ledger rows;
    a driver that still runs, or one on another host, is left alone."""
    victims: list[psutil.Process] = []
    dead = []
    for d in drivers:
        if d["hostname"] != socket.gethostname() or procs.is_alive(d["pid"], d["pid_create_time"]):
            continue
        dead.append(d["pid"])
        for pid, created in json.loads(d.get("helpers") or "[]"):
            if procs.is_alive(pid, created):
                with contextlib.suppress(psutil.Error):
                    root = psutil.Process(pid)
                    victims += [root, *root.children(recursive=True)]
    victims = list({p.pid: p for p in victims}.values())
    for p in victims:
        with contextlib.suppress(psutil.Error):
            p.kill()
    if victims:
        alive = _wait_dead(victims, wait_s)
        log.info("stopped %d process(es) left by dead driver(s) %s%s", len(victims), dead,
                 f"; {len(alive)} still there" if alive else "")
    for pid in dead:
        if not procs.is_alive(pid, None):
            shutil.rmtree(embedded_temp_dir(pid), ignore_errors=True)
    return [p.pid for p in victims]


def _wait_dead(victims: list[psutil.Process], wait_s: float) -> list[psutil.Process]:
    """Those of `victims` still running after at most `wait_s`. A killed process counts as dead once it is a
    zombie: orphans are reaped by the host's init, which here took up to 2 s per round (psutil.wait_procs
    waits for the reaping)."""
    deadline = time.monotonic() + wait_s
    alive = victims
    while alive:
        alive = [p for p in alive if not _dead(p)]
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    return alive


def _dead(p: psutil.Process) -> bool:
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def dead_drivers(ledger: Ledger) -> list[dict[str, Any]]:
    """The drivers of the ledger that hold, or held, the campaign without releasing it, whether or not
    they still run (`reap_lost_drivers` leaves the live ones alone). Reads only."""
    return [d for d in ledger.drivers() if d["outcome"] in (None, "lost")]


@ray.remote(num_cpus=0)
def _reap_on_node(pid: int, create_time: float) -> list[int]:
    return procs.kill_tree(pid) if procs.is_alive(pid, create_time) else []


def reap_lost(servers: list[ServerRow]) -> None:
    """Kill what is left of servers a dead driver never stopped, every node's part of them (matched by
    pid and start time), all of them at once."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    alive = {n.node_id for n in placement.cluster_nodes()} if any(s.rank_list() for s in servers) else set()
    local, remote = [], []
    for s in servers:
        for r in s.rank_list():
            if not r.get("pid"):
                continue
            if r.get("hostname") == socket.gethostname():
                if procs.is_alive(r["pid"], r["pid_create_time"]):
                    log.warning("stopping server %s rank %s (pid %d) left by an earlier driver", s.server_id,
                                r["rank"], r["pid"])
                    local.append(r["pid"])
            elif r.get("node_id") in alive:
                strategy = NodeAffinitySchedulingStrategy(r["node_id"], soft=False)
                remote.append(_reap_on_node.options(scheduling_strategy=strategy)
                              .remote(r["pid"], r["pid_create_time"]))
    if local:
        with ThreadPoolExecutor(max_workers=len(local)) as pool:
            list(pool.map(procs.kill_tree, local))
    if remote:
        ray.wait(remote, num_returns=len(remote), timeout=60)

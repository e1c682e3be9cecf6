"""Host network checks: the misconfigurations users hit on clusters of real hosts, caught before hours are spent.

On every node (a Ray task or actor pinned to it, standard library only and shipped by value, like
`preflight.gather_node`), `host_facts` reads the host's interfaces and their addresses, the variables that
choose an interface or an address (`GLOO_SOCKET_IFNAME`, `NCCL_SOCKET_IFNAME`, `VLLM_HOST_IP`) as the
node's Ray workers see them, and its raysweep and vLLM versions. Pure functions judge them, each message
naming the fix:

* `env_problems`: an interface variable naming an interface the host lacks (gloo and NCCL then fail to
  start, or fall back to another interface), `VLLM_HOST_IP` set to an address the host does not have (vLLM
  advertises it to the other ranks, which cannot reach it);
* `version_problems`: a host whose raysweep or vLLM differs from the driver's;
* `reach_problems`: a host that cannot open a TCP connection to another host's port (`Probe`: one actor
  per node listens on its node's address, the address servers advertise, and dials every other one).

`raysweep preflight` runs all of them (`preflight.run_preflight`); before a server starts,
`start_refusal` runs `env_problems` on the configuration's nodes with `serve.env` laid over each node's
environment, and a configuration that would fail is refused with the reason instead of started.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["ENV_NAMES", "Probe", "env_problems", "gather_facts", "host_facts", "interfaces_text", "probe_reachability",
           "reach_problems", "start_refusal", "version_problems"]

log = logging.getLogger(__name__)

ENV_NAMES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "VLLM_HOST_IP")
NOT_INSTALLED = "not installed"
_FACTS_CACHE: dict[str, dict[str, Any]] = {}  # node id -> host facts, read once per driver (interfaces stay)


# ---------------------------------------------------------------------------------------------------
# On the node (standard library only; psutil when the node's Ray provides it)
# ---------------------------------------------------------------------------------------------------

def interfaces() -> dict[str, list[str]]:
    """The host's network interfaces and their addresses (IPv4 and IPv6, without a zone suffix)."""
    try:
        import psutil

        return {name: sorted({a.address.split("%")[0] for a in addrs
                              if a.family in (socket.AF_INET, socket.AF_INET6)})
                for name, addrs in psutil.net_if_addrs().items()}
    except Exception:
        return {name: _ipv4_of(name) for _, name in socket.if_nameindex()}


def _ipv4_of(name: str) -> list[str]:
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))  # SIOCGIFADDR
        except OSError:
            return []
    return [socket.inet_ntoa(packed[20:24])]


def _version(dist: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return NOT_INSTALLED


def host_facts() -> dict[str, Any]:
    """What the checks need to know about the host this runs on."""
    node_id = None
    with contextlib.suppress(Exception):
        import ray

        if ray.is_initialized():
            node_id = ray.get_runtime_context().get_node_id()
    return {"hostname": socket.gethostname(), "node_id": node_id, "interfaces": interfaces(),
            "env": {k: os.environ[k] for k in ENV_NAMES if k in os.environ},
            "versions": {"raysweep": _version("raysweep"), "vllm": _version("vllm")}}


class Probe:
    """A TCP listener and dialer on one node (a Ray actor: `probe_reachability`)."""

    def __init__(self) -> None:
        self.sock: socket.socket | None = None

    def listen(self, ip: str) -> dict[str, Any]:
        """Listen on a free port of `ip` (the node's address); returns where, or why it could not."""
        try:
            family = socket.AF_INET6 if ":" in ip else socket.AF_INET
            self.sock = socket.socket(family, socket.SOCK_STREAM)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind((ip, 0))
            self.sock.listen(64)
            return {"ip": ip, "port": self.sock.getsockname()[1], "hostname": socket.gethostname(), "error": ""}
        except OSError as exc:
            return {"ip": ip, "port": None, "hostname": socket.gethostname(), "error": f"cannot listen on {ip}: {exc}"}

    def dial(self, targets: list[dict[str, Any]], timeout_s: float) -> list[dict[str, Any]]:
        """Connect to each target's (ip, port); each result with `ok`, the time taken or the error."""
        out = []
        for t in targets:
            t0 = time.monotonic()
            try:
                with socket.create_connection((t["ip"], t["port"]), timeout=timeout_s):
                    pass
                out.append({**t, "ok": True, "ms": round((time.monotonic() - t0) * 1000, 2), "error": ""})
            except OSError as exc:
                out.append({**t, "ok": False, "ms": None, "error": str(exc) or type(exc).__name__})
        return out

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


# ---------------------------------------------------------------------------------------------------
# Judging (pure)
# ---------------------------------------------------------------------------------------------------

def _names(facts: Mapping[str, Any]) -> list[str]:
    return sorted(facts.get("interfaces") or {})


def _addresses(facts: Mapping[str, Any]) -> set[str]:
    return {a for addrs in (facts.get("interfaces") or {}).values() for a in addrs}


def interfaces_text(facts: Mapping[str, Any]) -> str:
    """`eth0 10.0.0.5, lo 127.0.0.1`: the host's interfaces with their addresses (link-local IPv6 left out)."""
    def shown(addrs: list[str]) -> str:
        return "/".join(a for a in addrs if not a.lower().startswith("fe80:")) or "(no address)"

    return ", ".join(f"{n} {shown(a)}" for n, a in sorted((facts.get("interfaces") or {}).items()))


def env_problems(facts: Mapping[str, Any], env: Mapping[str, str], source: str = "the node's environment"
                 ) -> list[str]:
    """What is wrong with the interface and address variables `env` sets on this host (`source` says where
    they come from, for the message)."""
    out: list[str] = []
    names = _names(facts)
    if not names:
        return out
    gloo = (env.get("GLOO_SOCKET_IFNAME") or "").strip()
    missing = [n for n in (x.strip() for x in gloo.split(",")) if n and n not in names]
    if missing:
        out.append(f"GLOO_SOCKET_IFNAME={gloo} ({source}) names {', '.join(missing)}, which this host lacks "
                   f"(its interfaces: {interfaces_text(facts)}): gloo cannot start; set it to the interface on the "
                   "cluster network of every host, or leave it unset")
    nccl = (env.get("NCCL_SOCKET_IFNAME") or "").strip()
    if nccl and not nccl.startswith("^"):
        exact = nccl.startswith("=")
        wanted = [x.strip() for x in nccl.lstrip("=").split(",") if x.strip()]
        hit = [n for n in names if any(n == w if exact else n.startswith(w) for w in wanted)]
        if not hit:
            out.append(f"NCCL_SOCKET_IFNAME={nccl} ({source}) matches no interface of this host (its interfaces: "
                       f"{interfaces_text(facts)}): NCCL finds no socket interface and fails to start; set it to the "
                       "interface (or prefix) on the cluster network of every host")
    ip = (env.get("VLLM_HOST_IP") or "").strip()
    if ip and ip not in _addresses(facts):
        out.append(f"VLLM_HOST_IP={ip} ({source}) is not an address of this host (its addresses: "
                   f"{interfaces_text(facts)}): vLLM would advertise it to the other ranks, which cannot reach it; "
                   "set VLLM_HOST_IP per host to that host's own address (not in serve.env, which every host "
                   "shares), or leave it unset")
    return out


def version_problems(facts: Mapping[str, Any], driver: Mapping[str, str]) -> list[str]:
    """Where the host's raysweep or vLLM differs from the driver's (a driver without vLLM compares none)."""
    out = []
    have = facts.get("versions") or {}
    for name in ("raysweep", "vllm"):
        mine, theirs = driver.get(name), have.get(name)
        if not mine or mine == NOT_INSTALLED or theirs is None or theirs == mine:
            continue
        out.append(f"{name} {theirs} on this host, {mine} on the driver: install the driver's version on every host "
                   f"(pip install '{name}=={mine}' in the Python that Ray runs there)")
    return out


def reach_problems(results: Iterable[Mapping[str, Any]], labels: Mapping[str, str]) -> dict[str, list[str]]:
    """{dialing node id: messages} for the connections that failed (`Probe.dial` results with `from` and
    `to` node ids; `labels` names the nodes)."""
    out: dict[str, list[str]] = {}
    for r in results:
        if r.get("ok"):
            continue
        dst = labels.get(r["to"], r["to"][:8])
        out.setdefault(r["from"], []).append(
            f"cannot reach {dst} at {r['ip']}:{r['port']} over TCP ({r['error']}): servers on that host would be "
            "unreachable from clients and ranks here; check the route between the hosts, firewalls, and that "
            "Ray's node address there is one this host can reach")
    return out


# ---------------------------------------------------------------------------------------------------
# On the cluster
# ---------------------------------------------------------------------------------------------------

def _by_value() -> None:
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # hosts need no raysweep to answer


def gather_facts(node_ids: list[str], timeout_s: float = 60.0) -> dict[str, dict[str, Any] | str]:
    """`host_facts` of each node (a task pinned to it, holding no CPU): the facts, or why there are none."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    _by_value()
    task = ray.remote(num_cpus=0, max_retries=0)(host_facts)
    refs = {n: task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False),
                            name="raysweep-netcheck").remote() for n in node_ids}
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    out: dict[str, dict[str, Any] | str] = {}
    for n, ref in refs.items():
        if ref not in ready:
            ray.cancel(ref, force=True)
            out[n] = f"no answer within {timeout_s:g} s"
            continue
        try:
            out[n] = ray.get(ref)
        except Exception as exc:
            out[n] = (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:300]
    return out


def probe_reachability(nodes: list[tuple[str, str]], timeout_s: float = 5.0,
                       between: Callable[[dict[str, Any]], object] | None = None) -> list[dict[str, Any]]:
    """Every node dials every other node's listener: `nodes` are (node id, address) pairs; one result per
    ordered pair (`from`, `to`, `ip`, `port`, `ok`, `ms`, `error`). `between(probes)` runs after the
    listeners are up and before anyone dials (tests close one). The actors hold no CPU and are gone after."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if len(nodes) < 2:
        return []
    _by_value()
    actor = ray.remote(num_cpus=0, max_restarts=0)(Probe)
    probes = {n: actor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote()
              for n, _ in nodes}
    try:
        listening = dict(zip(probes, ray.get([probes[n].listen.remote(ip) for n, ip in nodes], timeout=120)))
        if between is not None:
            between(probes)
        results: list[dict[str, Any]] = []
        for n, p in probes.items():
            targets = [{"to": m, "ip": li["ip"], "port": li["port"]} for m, li in listening.items()
                       if m != n and li["port"] is not None]
            results += [{"from": n, **r} for r in ray.get(p.dial.remote(targets, timeout_s),
                                                         timeout=timeout_s * len(targets) + 60)]
        for m, li in listening.items():
            if li["port"] is None:
                results.append({"from": m, "to": m, "ip": li["ip"], "port": None, "ok": False, "ms": None,
                                "error": li["error"]})
        return results
    finally:
        for p in probes.values():
            with contextlib.suppress(Exception):
                ray.kill(p)


def start_refusal(node_ids: list[str], serve_env: Mapping[str, Any]) -> str | None:
    """Before a server starts on these nodes: why it would fail there (an interface or address variable of
    the node's environment or `serve.env` that does not fit that host), or None. Each node's facts are read
    once per driver; a node that cannot answer is not judged here (its server's start will say)."""
    todo = [n for n in node_ids if n not in _FACTS_CACHE]
    if todo:
        for n, got in gather_facts(todo).items():
            if isinstance(got, dict):
                _FACTS_CACHE[n] = got
            else:
                log.info("host checks of node %s skipped: %s", n[:8], got)
    problems = []
    given = {k: str(v) for k, v in serve_env.items() if k in ENV_NAMES}
    for n in node_ids:
        facts = _FACTS_CACHE.get(n)
        if facts is None:
            continue
        node_env = {k: v for k, v in (facts.get("env") or {}).items() if k not in given}
        where = f"host {facts.get('hostname')} (node {n[:8]})"
        problems += [f"{where}: {p}" for p in env_problems(facts, node_env)]
        problems += [f"{where}: {p}" for p in env_problems(facts, given, "serve.env")]
    return "\n".join(problems) or None

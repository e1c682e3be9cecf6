"""The fabric a configuration got: an all-reduce bus-bandwidth probe across its placement group's GPUs and nodes.

`probe(res, mib, iters)` runs, before a multi-node server starts, one `ProbeRank` actor per GPU of the
placement group (one per node on a cluster without GPUs), each in its bundle, so the probe crosses exactly
the nodes and GPUs the server will use. They form one `torch.distributed` group (NCCL where torch sees CUDA,
gloo otherwise), all-reduce a `mib` MiB float32 tensor once to warm up, then `iters` times timed; the slowest rank's
time is the time. As nccl-tests reports it: algorithm bandwidth = bytes / time, bus bandwidth = algbw x
2 (n - 1) / n, in GB/s (10^9 bytes). The actors are gone before the server's host actors take the bundles.

`bandwidth_baseline(nodes)` is `raysweep preflight --bandwidth`: the probe between neighbouring pairs of
nodes (a ring: node i with node i+1), each node's baseline the slowest pair it is in. `gate(result, cfg,
baseline)` is the check of `transport.min_busbw_gbps` and `transport.min_busbw_fraction` (of the smallest
baseline among the configuration's nodes); it returns why a configuration is refused, or None.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from raysweep import procs
from raysweep.place.transport import describe_probe_links as describe_links
from raysweep.place.transport import link_text

if TYPE_CHECKING:
    from raysweep.place.placement import Reservation

__all__ = ["FABRIC_ENV_PREFIXES", "ProbeRank", "bandwidth_baseline", "bus_bandwidth", "describe_links", "fabric_env",
           "gate", "link_text", "load_baseline", "probe", "probe_nodes", "rank_network_env"]

log = logging.getLogger(__name__)


def bus_bandwidth(nbytes: int, seconds: float, world: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s of one all-reduce of `nbytes` over `world` ranks that took `seconds`."""
    algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
    return algbw, algbw * 2 * (world - 1) / world if world > 1 else algbw


# the variables that choose how NCCL, gloo, UCX and libfabric reach the other nodes (interfaces, HCAs, plugins)
FABRIC_ENV_PREFIXES = ("NCCL_", "GLOO_", "UCX_", "FI_", "TP_SOCKET_IFNAME")
_NOT_FABRIC = ("NCCL_DEBUG",)  # logging, not the path: NCCL_DEBUG, NCCL_DEBUG_FILE, NCCL_DEBUG_SUBSYS


def fabric_env(env: dict[str, str]) -> dict[str, str]:
    """The campaign's (`serve.env`) variables that steer the fabric: what the probe must run with to measure the
    path the server's ranks will take (NCCL_SOCKET_IFNAME, NCCL_IB_HCA, NCCL_NET, GLOO_SOCKET_IFNAME, UCX_*, FI_*)."""
    return {k: v for k, v in env.items() if k.startswith(FABRIC_ENV_PREFIXES) and not k.startswith(_NOT_FABRIC)}


def rank_network_env(ip: str, env: dict[str, str], node_env: dict[str, str], gpus: bool) -> dict[str, str]:
    """What one rank (a server's, or the probe's) is given for its address and interfaces: its node's Ray
    address as VLLM_HOST_IP, the interface that holds it as GLOO_SOCKET_IFNAME (and NCCL_SOCKET_IFNAME with GPUs),
    each unless the campaign's `env` or the node's own environment `node_env` sets it. The server and the fabric
    probe both take theirs from here, so the probe bootstraps NCCL on the interface the server's ranks will."""
    iface = procs.iface_of(ip)
    want = {"VLLM_HOST_IP": ip}
    if iface:
        want["GLOO_SOCKET_IFNAME"] = iface
        if gpus:
            want["NCCL_SOCKET_IFNAME"] = iface
    return {k: v for k, v in want.items() if k not in env and k not in node_env}


@ray.remote(max_restarts=0, num_cpus=0)
class ProbeRank:
    """One rank of the probe's process group."""

    def where(self) -> dict[str, Any]:
        """Its node, address, the interface that holds it (and the interface's MTU) and a free port there."""
        import socket

        import psutil

        ip = ray.util.get_node_ip_address()
        iface = procs.iface_of(ip)
        stats = psutil.net_if_stats().get(iface)
        return {"ip": ip, "node_id": ray.get_runtime_context().get_node_id(), "port": procs.free_port(ip),
                "iface": iface, "mtu": stats.mtu if stats else None, "hostname": socket.gethostname()}

    def network(self, env: dict[str, str] | None = None) -> dict[str, str | None]:
        """Set the interface variables this rank runs with, as a server's rank on this node gets them (the
        campaign's fabric variables, then `rank_network_env`), and return them."""
        gpus = bool(ray.get_runtime_context().get_accelerator_ids().get("GPU"))
        given = fabric_env(env or {})
        os.environ.update(given)
        os.environ.update(rank_network_env(ray.util.get_node_ip_address(), given, dict(os.environ), gpus))
        here = dict(os.environ)
        return {**{k: here.get(k) for k in ("VLLM_HOST_IP", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")},
                **fabric_env(here)}

    def run(self, rank: int, world: int, master: str, port: int, nbytes: int, iters: int,
            timeout_s: float) -> dict[str, Any]:
        import datetime

        import torch
        import torch.distributed as dist

        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://{master}:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
        try:
            device = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
            x = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
            dist.all_reduce(x)
            _sync(backend)
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(x)
            _sync(backend)
            took = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device=device)
            dist.all_reduce(took, op=dist.ReduceOp.MAX)
            return {"rank": rank, "seconds": float(took.item()), "ip": ray.util.get_node_ip_address(),
                    "backend": backend}
        finally:
            dist.destroy_process_group()


def _sync(backend: str) -> None:
    if backend == "nccl":
        import torch

        torch.cuda.synchronize()


def probe_nodes(bundles: list[tuple[Any, int]], gpus_per_node: int, mib: float = 64.0, iters: int = 5,
                timeout_s: float = 300.0, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The probe over the ranks given as (scheduling options, GPUs of that bundle): one rank per GPU (or one
    per bundle without GPUs), each with the interface variables a server's rank there gets (`env`: the
    campaign's `serve.env`), recorded per rank in `network`. Never raises: a probe that failed says why in
    `error`."""
    opts = [o for o, g in bundles for _ in range(max(g, 1))]
    actors = [ProbeRank.options(num_gpus=1 if gpus_per_node else 0, **o).remote()  # type: ignore[attr-defined]
              for o in opts]
    nbytes = int(mib * 2**20) // 4 * 4
    out: dict[str, Any] = {"backend": None, "world": len(actors), "nnodes": len(bundles), "bytes": nbytes,
                           "iters": iters}
    try:
        out["network"] = ray.get([a.network.remote(env) for a in actors], timeout=timeout_s)
        where = ray.get([a.where.remote() for a in actors], timeout=timeout_s)
        master = where[0]
        refs = [a.run.remote(r, len(actors), master["ip"], master["port"], nbytes, iters, timeout_s)
                for r, a in enumerate(actors)]
        ranks = ray.get(refs, timeout=timeout_s + 60)
        seconds = max(r["seconds"] for r in ranks)
        algbw, busbw = bus_bandwidth(nbytes, seconds, len(actors))
        out.update(backend=",".join(sorted({r["backend"] for r in ranks})), seconds=seconds, algbw_gbps=algbw,
                   busbw_gbps=busbw, error=None,
                   node_ids=sorted({w["node_id"] for w in where}, key=[w["node_id"] for w in where].index))
        out["links"] = _links(actors, where, busbw, nbytes, iters, timeout_s)
    except Exception as exc:
        last = (str(exc).strip().splitlines() or [""])[-1]  # a remote traceback ends with its error
        out.update(busbw_gbps=None, error=f"{type(exc).__name__}: {last}"[:300])
        log.warning("fabric probe failed: %s", out["error"])
    finally:
        for a in actors:
            ray.kill(a)
    return out


def _end(w: dict[str, Any]) -> dict[str, Any]:
    return {k: w.get(k) for k in ("node_id", "hostname", "ip", "iface", "mtu")}


def _links(actors: list[Any], where: list[dict[str, Any]], busbw: float, nbytes: int, iters: int,
           timeout_s: float) -> list[dict[str, Any]]:
    """The node pairs of the probe, each with the interface, address and MTU of both ends and its own bus
    bandwidth: with two nodes the probe's; with more, a probe of that pair alone (one rank per node, its
    neighbours in a ring), so that one slow link is seen as that link."""
    first: dict[str, int] = {}
    for i, w in enumerate(where):
        first.setdefault(w["node_id"], i)
    nodes = list(first.values())
    if len(nodes) < 2:
        return []
    if len(nodes) == 2:
        return [{"a": _end(where[nodes[0]]), "b": _end(where[nodes[1]]), "busbw_gbps": busbw}]
    links = []
    for k in range(len(nodes)):
        i, j = nodes[k], nodes[(k + 1) % len(nodes)]
        pair = [actors[i], actors[j]]
        spot = ray.get(pair[0].where.remote(), timeout=timeout_s)
        try:
            got = ray.get([a.run.remote(r, 2, spot["ip"], spot["port"], nbytes, iters, timeout_s)
                           for r, a in enumerate(pair)], timeout=timeout_s + 60)
            bw: float | None = bus_bandwidth(nbytes, max(r["seconds"] for r in got), 2)[1]
            err = None
        except Exception as exc:  # noqa: BLE001 - recorded with the link
            bw, err = None, f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[-1]}"[:300]
        links.append({"a": _end(where[i]), "b": _end(where[j]), "busbw_gbps": bw, "error": err})
    return links


def probe(res: Reservation, mib: float = 64.0, iters: int = 5, timeout_s: float = 300.0,
          env: dict[str, str] | None = None) -> dict[str, Any]:
    """The probe across a configuration's placement group (`placement.Reservation`), recorded with its nodes;
    `env`, the configuration's `serve.env`: its fabric variables reach the probe's ranks as they reach the server's."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    bundles = [({"scheduling_strategy": PlacementGroupSchedulingStrategy(res.pg, placement_group_bundle_index=i)},
                res.layout.gpus_per_node) for i in range(len(res.bundles))]
    out = probe_nodes(bundles, res.layout.gpus_per_node, mib, iters, timeout_s, env)
    out.setdefault("node_ids", list(res.node_ids))
    return out


def bandwidth_baseline(nodes: list[Any], mib: float = 64.0, iters: int = 5, timeout_s: float = 300.0) -> dict[str, Any]:
    """`raysweep preflight --bandwidth`: the probe between neighbouring pairs of the nodes with GPUs (all nodes
    when none has GPUs), each pinned to its node; per node, the slowest pair it is in."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    gpu_nodes = [n for n in nodes if n.gpus > 0] or list(nodes)
    gpus = min((n.gpus for n in gpu_nodes), default=0)
    pairs = [(gpu_nodes[i], gpu_nodes[(i + 1) % len(gpu_nodes)]) for i in range(len(gpu_nodes) if len(gpu_nodes) > 2
                                                                                  else len(gpu_nodes) - 1)]
    rows = []
    for a, b in pairs:
        ranks = [({"scheduling_strategy": NodeAffinitySchedulingStrategy(n.node_id, soft=False)}, gpus) for n in (a, b)]
        r = probe_nodes(ranks, gpus, mib, iters, timeout_s)
        rows.append({"nodes": [a.node_id, b.node_id], "ips": [a.ip, b.ip], "busbw_gbps": r.get("busbw_gbps"),
                     "algbw_gbps": r.get("algbw_gbps"), "backend": r["backend"], "world": r["world"],
                     "error": r.get("error")})
    per_node: dict[str, float] = {}
    for row in rows:
        for n in row["nodes"]:
            if row["busbw_gbps"] is not None:
                per_node[n] = min(per_node.get(n, float("inf")), float(row["busbw_gbps"]))
    return {"measured_at": time.time(), "mib": mib, "iters": iters, "pairs": rows, "per_node": per_node}


def load_baseline(path: str | None) -> dict[str, Any] | None:
    """The baseline in the report of `raysweep preflight --bandwidth --out FILE` (None: no path)."""
    if not path:
        return None
    data = json.loads(Path(path).expanduser().read_text())
    return data.get("bandwidth", data)


def gate(result: dict[str, Any], min_gbps: float | None, min_fraction: float | None,
         baseline: dict[str, Any] | None) -> str | None:
    """Why a configuration's probe fails `transport.min_busbw_gbps` / `min_busbw_fraction`, or None."""
    if min_gbps is None and min_fraction is None:
        return None
    bw = result.get("busbw_gbps")
    if bw is None:
        return f"transport.probe: the fabric probe failed ({result.get('error')}), so the bandwidth cannot be confirmed"
    if min_gbps is not None:
        slow = [lk for lk in result.get("links") or [] if lk.get("busbw_gbps") is None or lk["busbw_gbps"] < min_gbps]
        if slow:
            worst = min(slow, key=lambda lk: lk.get("busbw_gbps") or 0.0)
            got = "no measurement" if worst.get("busbw_gbps") is None else f"{worst['busbw_gbps']:.4g} GB/s"
            return (f"transport.min_busbw_gbps {min_gbps:g}: the link {link_text(worst)} measured {got} bus "
                    f"bandwidth (the fabric probe over the configuration's nodes: {bw:.4g} GB/s)")
        if bw < min_gbps:
            return f"transport.min_busbw_gbps {min_gbps:g}: the fabric probe measured {bw:.2f} GB/s bus bandwidth"
    if min_fraction is not None:
        per_node = (baseline or {}).get("per_node") or {}
        known = [float(per_node[n]) for n in result.get("node_ids") or [] if n in per_node]
        if not known:
            return (f"transport.min_busbw_fraction {min_fraction:g}: the baseline has no measurement for the nodes "
                    f"{[str(n)[:8] for n in result.get('node_ids') or []]}; run `raysweep preflight --bandwidth` again")
        base = min(known)
        result["baseline_gbps"] = base
        if bw < min_fraction * base:
            return (f"transport.min_busbw_fraction {min_fraction:g}: the fabric probe measured {bw:.2f} GB/s, "
                    f"{bw / base:.0%} of the {base:.2f} GB/s baseline of its nodes")
    return None

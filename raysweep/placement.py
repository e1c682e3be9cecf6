"""Placement: the cluster's topology from Ray, a configuration's GPU shape as bundles, fit checks.

A configuration that fits one node gets one bundle holding all its GPUs (STRICT_PACK); the host actor
in it holds those GPUs, Ray sets CUDA_VISIBLE_DEVICES, and the server does its own parallelism inside
them. On a cluster without GPUs the bundle holds CPU only.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from raysweep.plan import ServeConfig, Shape

__all__ = ["HOST_CPUS", "actor_options", "NodeInfo", "Reservation", "bundles_for", "cluster_nodes", "has_gpus", "never_fits",
           "release", "reserve"]

log = logging.getLogger(__name__)

HOST_CPUS = 0.5


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    ip: str
    gpus: int
    cpus: float
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class Reservation:
    """The placement group of one server configuration."""

    pg: PlacementGroup
    bundles: list[dict[str, float]]
    strategy: str
    gpus_per_bundle: int


def cluster_nodes() -> list[NodeInfo]:
    """The alive nodes of the connected Ray cluster."""
    out = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        res = n.get("Resources", {})
        out.append(NodeInfo(node_id=n["NodeID"], ip=n.get("NodeManagerAddress", ""), gpus=int(res.get("GPU", 0)),
                            cpus=float(res.get("CPU", 0)), labels=dict(n.get("Labels") or {})))
    return out


def has_gpus(nodes: list[NodeInfo]) -> bool:
    return any(n.gpus > 0 for n in nodes)


def bundles_for(shape: Shape, with_gpus: bool) -> tuple[list[dict[str, float]], str, int]:
    """Bundles, strategy and GPUs per bundle for a shape: one bundle on one node, STRICT_PACK."""
    gpus = shape.gpu_count if with_gpus else 0
    bundle: dict[str, float] = {"CPU": HOST_CPUS}
    if gpus:
        bundle["GPU"] = float(gpus)
    return [bundle], "STRICT_PACK", gpus


def never_fits(serve: ServeConfig, nodes: list[NodeInfo]) -> str | None:
    """Why a configuration can never be placed on this cluster, or None if it can."""
    if not nodes:
        return "the cluster has no alive node"
    if not has_gpus(nodes):
        return None
    need = serve.shape.gpu_count
    biggest = max(n.gpus for n in nodes)
    if need > biggest:
        sh = serve.shape
        return (f"needs {need} GPUs on one node (tp={sh.tp} x pp={sh.pp} x dp={sh.dp}), but the largest node has "
                f"{biggest}; placement across nodes is not supported yet")
    return None


def reserve(serve: ServeConfig, with_gpus: bool, timeout_s: float | None = None,
            name: str | None = None) -> Reservation:
    """Create the configuration's placement group and wait until it is placed (it waits for free GPUs)."""
    bundles, strategy, gpus = bundles_for(serve.shape, with_gpus)
    pg = placement_group(bundles, strategy=strategy, name=name or "")
    t0 = time.monotonic()
    while not pg.wait(timeout_seconds=5):
        if timeout_s is not None and time.monotonic() - t0 > timeout_s:
            remove_placement_group(pg)
            raise TimeoutError(f"no room for {bundles} ({strategy}) after {timeout_s:.0f} s")
        log.info("waiting for free resources for server config %s: %s", serve.id, bundles)
    return Reservation(pg=pg, bundles=bundles, strategy=strategy, gpus_per_bundle=gpus)


def release(res: Reservation) -> None:
    try:
        remove_placement_group(res.pg)
    except Exception as exc:  # noqa: BLE001 - the group may already be gone with its cluster
        log.warning("could not remove placement group: %s", exc)


def actor_options(res: Reservation, bundle_index: int = 0) -> dict[str, Any]:
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return {"num_cpus": HOST_CPUS, "num_gpus": res.gpus_per_bundle,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(res.pg, placement_group_bundle_index=bundle_index)}

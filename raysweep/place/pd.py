"""A P/D deployment as one placement: one placement group holding a bundle per server of each role and one for
its router, so that the whole deployment is placed (and freed) together or not at all.

Each server of a role takes one bundle with its GPUs (tensor x data parallel size) on one node: a role's server
never crosses nodes here. The group's strategy is PACK: Ray keeps the bundles on as few nodes as hold them
and spreads them where it must (a 4P1D deployment of TP 8 servers takes five nodes of eight GPUs). The
router's bundle holds CPU only. On a cluster without GPUs every bundle is CPU only.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table, remove_placement_group

from raysweep.campaign import NodeRule
from raysweep.campaign.pd import Deployment
from raysweep.place import placement
from raysweep.place.placement import (
    HOST_CPUS,
    NODE_ID_LABEL,
    Layout,
    NodeInfo,
    NotPlaced,
    eligible_nodes,
    has_gpus,
    rule_text,
)
from raysweep.plan.plan import ServeConfig

__all__ = ["ROUTER", "PDBundles", "PDReservation", "bundle_lines", "deployment_bundles", "deployment_layout",
           "deployment_refusal", "layout_of", "release_deployment", "reserve_deployment"]

log = logging.getLogger(__name__)

ROUTER = "router"


@dataclass(frozen=True)
class PDBundles:
    """The bundles of a deployment, and which server (role, index) or the router each one is for."""

    bundles: list[dict[str, float]]
    owners: list[tuple[str, int]]
    strategy: str = "PACK"

    def index_of(self, role: str, index: int = 0) -> int:
        return self.owners.index((role, index))

    @property
    def gpus(self) -> int:
        return int(sum(b.get("GPU", 0) for b in self.bundles))


def deployment_bundles(dep: Deployment, rule: NodeRule, gpus: bool = True) -> PDBundles:
    """One bundle per server of each role (prefill first) with its GPUs, then the router's (CPU only)."""
    bundles, owners = [], []
    for role in dep.roles:
        for i in range(role.count):
            b: dict[str, float] = {"CPU": HOST_CPUS, **rule.resources}
            if gpus:
                b["GPU"] = float(role.gpus_each)
            bundles.append(b)
            owners.append((role.name, i))
    bundles.append({"CPU": HOST_CPUS})
    owners.append((ROUTER, 0))
    return PDBundles(bundles, owners)


def deployment_refusal(dep: Deployment, rule: NodeRule, nodes: list[NodeInfo]) -> str | None:
    """Why these nodes can never hold the deployment (None: they can): a role's server larger than every
    eligible node, or more GPUs than they have in all."""
    pool = eligible_nodes(rule, nodes)
    if not pool:
        return "no alive node matches the placement rule " + rule_text(rule) if nodes else "no alive node"
    if not has_gpus(nodes):
        return None  # CPU only: every server one CPU bundle
    caps = sorted((n.gpus for n in pool if n.gpus > 0), reverse=True)
    if not caps:
        return "no node with GPUs matches the placement rule " + rule_text(rule)
    for role in dep.roles:
        if role.gpus_each > caps[0]:
            return (f"a {role.name} server needs {role.gpus_each} GPUs (tp={role.tp} x dp={role.dp}), more than any "
                    f"node has ({caps[0]}); a role's server stays on one node")
    # first fit, largest servers first: whether the nodes' free GPUs can hold every server at once
    free = list(caps)
    for need in sorted((r.gpus_each for r in dep.roles for _ in range(r.count)), reverse=True):
        at = next((i for i, f in enumerate(free) if f >= need), None)
        if at is None:
            return (f"needs {dep.gpus} GPUs as {dep.describe()}, which the nodes (GPUs per node: {caps}) cannot "
                    "hold at once")
        free[at] -= need
    return None


def deployment_layout(dep: Deployment, rule: NodeRule, nodes: list[NodeInfo], gpus: bool | None = None) -> Layout | str:
    """The scheduler's view of a deployment: a `Layout` of its bundles' GPUs (mode `pd`, the router's bundle
    last with none), each bundle placed on a node of its own choosing (`placement.fit_bundles`); or why these
    nodes can never hold it. `gpus` as in `placement.layout_for` (the campaign's decision; None: from `nodes`)."""
    use = has_gpus(nodes) if gpus is None else gpus
    if use and nodes and not has_gpus(nodes):
        return (f"no alive node has GPUs and it needs {dep.gpus} ({dep.describe()}); the campaign's cluster has "
                "GPUs, so it never runs on a CPU in their place")
    why = deployment_refusal(dep, rule, nodes)
    if why is not None:
        return why
    b = deployment_bundles(dep, rule, use)
    return Layout(1, 0, "pd", bundle_gpus=tuple(int(x.get("GPU", 0)) for x in b.bundles))


def layout_of(serve: ServeConfig, nodes: list[NodeInfo], gpus: bool | None = None) -> Layout | str:
    """Where a configuration can go on these nodes: a P/D deployment's bundles, or any other's layout."""
    if serve.deployment is not None:
        return deployment_layout(serve.deployment, serve.rule, nodes, gpus)
    return placement.layout_for(serve.shape, serve.rule, nodes, gpus)


def bundle_lines(dep: Deployment, rule: NodeRule, gpus: bool = True) -> list[str]:
    """The dry run's lines of a deployment: its roles, its bundles and its GPU count."""
    b = deployment_bundles(dep, rule, gpus)
    shown = ", ".join(f"{role}-{i}: {_bundle_text(bundle)}" for (role, i), bundle in zip(b.owners, b.bundles,
                                                                                          strict=True))
    return [f"  deployment: {dep.describe()}",
            f"  placement: one placement group ({b.strategy}) of {len(b.bundles)} bundle(s): {shown}",
            f"  GPUs: {dep.gpus} (prefill {dep.prefill.gpus} + decode {dep.decode.gpus})"
            + ("" if gpus else "; this cluster has none: each bundle takes CPU only")]


def _bundle_text(bundle: dict[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in bundle.items()) + "}"


@dataclass
class PDReservation:
    """The placement group of one deployment, and the node each bundle is on."""

    pg: PlacementGroup
    layout: PDBundles
    node_ids: list[str]

    @property
    def bundles(self) -> list[dict[str, float]]:
        return self.layout.bundles

    def actor_options(self, role: str, index: int = 0) -> dict[str, Any]:
        """Ray options of the actor that hosts one server of the deployment (or its router)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        at = self.layout.index_of(role, index)
        return {"num_cpus": HOST_CPUS, "num_gpus": self.layout.bundles[at].get("GPU", 0),
                "scheduling_strategy": PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=at)}


def reserve_deployment(dep: Deployment, rule: NodeRule, name: str, gpus: bool = True,
                       timeout_s: float = 60.0, node_ids: list[str] | None = None) -> PDReservation:
    """Create the deployment's placement group and wait until Ray has placed all of it; with `node_ids` (the
    scheduler's choice, one per bundle), each bundle pinned to its node, so that what the scheduler counts as
    taken is what Ray holds."""
    layout = deployment_bundles(dep, rule, gpus)
    pinned = {} if not node_ids else {"bundle_label_selector": [{NODE_ID_LABEL: n} for n in node_ids]}
    if node_ids and len(node_ids) != len(layout.bundles):
        raise ValueError(f"{len(node_ids)} node(s) given for {len(layout.bundles)} bundle(s)")
    pg = placement_group(layout.bundles, strategy=layout.strategy, name=name, **pinned)
    t0 = time.monotonic()
    while not pg.wait(timeout_seconds=2):
        if time.monotonic() - t0 > timeout_s:
            remove_placement_group(pg)
            raise NotPlaced(f"no room for the deployment {dep.describe()} after {timeout_s:.0f} s")
        log.info("waiting for the deployment %s", dep.describe())
    placed = placement_group_table(pg).get("bundles_to_node_id", {})
    return PDReservation(pg, layout, [str(placed.get(i, "")) for i in range(len(layout.bundles))])


def release_deployment(res: PDReservation) -> None:
    try:
        remove_placement_group(res.pg)
    except Exception as exc:
        log.warning("could not remove the deployment's placement group: %s", exc)

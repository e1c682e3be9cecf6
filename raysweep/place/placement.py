"""Placement: the cluster's topology from Ray, how a configuration's GPU shape maps onto nodes, which
configurations to start next, and their placement groups.

A configuration that fits one node gets one bundle holding all its GPUs (STRICT_PACK). One larger than
any node gets one bundle per node (STRICT_SPREAD), the same number of GPUs on each: tensor parallelism
stays inside a node, and either the pipeline stages of one replica (`--nnodes`, mode `nnodes`) or whole
data-parallel replicas (`--data-parallel-size-local`, mode `dp`) cross nodes. Each bundle is pinned to the
node the packer chose (by Ray's `ray.io/node-id` label), so what raysweep believes is free is what Ray
has free. On a cluster without GPUs every configuration takes one bundle of CPU.

A configuration with `placement_layout: spread` (`placement.layout`) is spread instead: one pipeline stage
or one data-parallel replica per node, even where it would fit one node, so a campaign can sweep pack
against spread and measure what the fabric costs.

`choose_starts` is the packing policy, shared by the driver and the packing benchmark: the configurations
with the most work left first (remaining points), the largest shapes first among equals (so with equal
grids, largest first), each on the nodes it fits most tightly (best fit, which keeps whole nodes free
for the large ones), smaller ones filling the gaps. Work first keeps a long small configuration from
being left alone on an emptying cluster at the end (benchmarks/results/packing.md measures both orders).
Given estimated seconds and the running configurations' time left (`Busy`), it also holds nodes for the
first configuration that does not fit (benchmarks/results/packing-estimates.md: this needs accurate
per-configuration durations to pay off).

`tail_starts` is the campaign's tail (`placement.tail_replicas`): once no configuration is waiting, GPUs
that would idle start more servers of running configurations, which share their unclaimed points, the one
whose points would end last first, while each server's share takes longer than a server start (one more
server then ends them sooner). A configuration started late or longer than it looked no longer sets the
end alone (benchmarks/results/packing-tail.md).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table, remove_placement_group

from raysweep.campaign import NodeRule
from raysweep.plan.plan import ServeConfig, Shape

__all__ = ["HOST_CPUS", "NODE_ID_LABEL", "Busy", "Demand", "Layout", "NodeInfo", "NotPlaced", "Reservation",
           "Share", "actor_options", "bundles_for", "rule_text", "choose_starts", "cluster_nodes", "eligible_nodes",
           "fit_bundles",
           "fit_nodes", "has_gpus", "layout_fits", "layout_for", "local_nodes", "release", "reserve", "tail_starts",
           "take"]

log = logging.getLogger(__name__)

HOST_CPUS = 0.5
NODE_ID_LABEL = "ray.io/node-id"


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    ip: str
    gpus: int
    cpus: float
    labels: dict[str, str] = field(default_factory=dict)
    resources: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Layout:
    """How a configuration sits on nodes: `nnodes` nodes with `gpus_per_node` GPUs each.

    mode `single`: one node. `nnodes`: one replica's pipeline stages across nodes (vLLM `--nnodes`).
    `dp`: `dp_local` whole data-parallel replicas per node (vLLM `--data-parallel-size-local`).
    """

    nnodes: int
    gpus_per_node: int
    mode: str = "single"
    dp_local: int = 1
    bundle_gpus: tuple[int, ...] = ()  # mode `pd`: the GPUs of each bundle, several bundles to a node allowed

    @property
    def gpu_count(self) -> int:
        return sum(self.bundle_gpus) if self.bundle_gpus else self.nnodes * self.gpus_per_node

    def node_gpus(self) -> list[int]:
        """The GPUs it takes on each of its `node_ids` (one entry per bundle: a node may come several times)."""
        return list(self.bundle_gpus) if self.bundle_gpus else [self.gpus_per_node] * self.nnodes

    def describe(self) -> str:
        if self.bundle_gpus:
            return f"{len(self.bundle_gpus)} bundle(s) of {list(self.bundle_gpus)} GPU(s), one per server and router"
        where = "1 node" if self.nnodes == 1 else f"{self.nnodes} nodes"
        extra = {"nnodes": ", pipeline across nodes",
                 "dp": f", {self.dp_local} DP replica(s) per node"}.get(self.mode, "")
        return f"{where} x {self.gpus_per_node} GPU(s){extra}"


@dataclass(frozen=True)
class Demand:
    """A configuration waiting for GPUs, as the packer sees it."""

    key: str
    layout: Layout
    eligible: tuple[str, ...]   # node ids it may use, in cluster order
    work: float = 1.0           # remaining work (points): who goes first


@dataclass(frozen=True)
class Busy:
    """A running configuration as the packer sees it: its nodes, its GPUs on each, and its estimated time
    left (the unit of `Demand.work`)."""

    nodes: tuple[str, ...]
    gpus_per_node: int
    left: float
    per_node: tuple[int, ...] = ()  # GPUs on each of `nodes` where they differ (a P/D deployment's bundles)

    def node_gpus(self) -> list[int]:
        return list(self.per_node) if self.per_node else [self.gpus_per_node] * len(self.nodes)


class NotPlaced(RuntimeError):
    """A placement group that Ray could not place in time (someone else holds the GPUs, or a node went)."""


@dataclass
class Reservation:
    """The placement group of one server configuration and the nodes its bundles are on."""

    pg: PlacementGroup
    bundles: list[dict[str, float]]
    strategy: str
    layout: Layout
    node_ids: list[str]


# ---------------------------------------------------------------------------------------------------
# Topology
# ---------------------------------------------------------------------------------------------------

def cluster_nodes() -> list[NodeInfo]:
    """The alive nodes of the connected Ray cluster."""
    out = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        res = n.get("Resources", {})
        out.append(NodeInfo(node_id=n["NodeID"], ip=n.get("NodeManagerAddress", ""), gpus=int(res.get("GPU", 0)),
                            cpus=float(res.get("CPU", 0)), labels=dict(n.get("Labels") or {}),
                            resources={k: float(v) for k, v in res.items()}))
    return out


def local_nodes() -> list[NodeInfo]:
    """This machine as the one node an embedded Ray would start (for a dry run without a cluster)."""
    gpus = 0
    try:
        from ray._private.accelerators import get_accelerator_manager_for_resource

        gpus = int(get_accelerator_manager_for_resource("GPU").get_current_node_num_accelerators() or 0)
    except Exception as exc:
        log.debug("no local GPU count: %s", exc)
    return [NodeInfo(node_id="local", ip="127.0.0.1", gpus=gpus, cpus=float(os.cpu_count() or 1),
                     resources={"GPU": float(gpus)})]


def has_gpus(nodes: Iterable[NodeInfo]) -> bool:
    return any(n.gpus > 0 for n in nodes)


def layout_fits(layout: Layout, rule: NodeRule, nodes: list[NodeInfo]) -> bool:
    """Whether these nodes could hold `layout` at all (enough eligible nodes with its GPUs per node), busy
    or not: a configuration keeps the layout it first ran with, so that a re-placement never changes how
    its GPUs sit on nodes."""
    pool = eligible_nodes(rule, nodes)
    if layout.bundle_gpus:
        whole = {n.node_id: n.gpus for n in pool}
        return bool(pool) and fit_nodes(layout, list(whole), whole) is not None
    if not layout.gpus_per_node:
        return bool(pool)
    return sum(1 for n in pool if n.gpus >= layout.gpus_per_node) >= layout.nnodes


def _label_ok(have: str | None, want: str | list[str]) -> bool:
    return have is not None and (have in want if isinstance(want, list) else have == want)


def eligible_nodes(rule: NodeRule, nodes: Iterable[NodeInfo]) -> list[NodeInfo]:
    """The nodes whose labels and resources satisfy a configuration's node rule."""
    return [n for n in nodes
            if all(_label_ok(n.labels.get(k), v) for k, v in rule.node_labels.items())
            and all(n.resources.get(k, 0.0) >= amount for k, amount in rule.resources.items())]


def rule_text(rule: NodeRule) -> str:
    parts = [f"{k}={'|'.join(v) if isinstance(v, list) else v}" for k, v in rule.node_labels.items()]
    parts += [f"resource {k}>={v:g}" for k, v in rule.resources.items()]
    return ", ".join(parts)


def layout_for(shape: Shape, rule: NodeRule, nodes: list[NodeInfo], gpus: bool | None = None) -> Layout | str:
    """Where a shape can go on these nodes: a `Layout`, or why it cannot be placed on them.

    `gpus` is the campaign's decision, taken once (`campaign_gpus`): True, the shape's GPUs are asked for
    and only nodes with GPUs count, even when none of them is alive now; False, the cluster has no GPUs at
    all and every configuration takes one CPU bundle (`Layout(1, 0)`). None decides from `nodes` (a plan
    shown before anything runs)."""
    pool = eligible_nodes(rule, nodes)
    if not pool:
        return (("no alive node matches the placement rule " + rule_text(rule)) if nodes
                else "the cluster has no alive node")
    if not (has_gpus(nodes) if gpus is None else gpus):
        return Layout(1, 0)
    if not has_gpus(nodes):
        return (f"no alive node has GPUs and it needs {shape.gpu_count} ({shape.describe()}); the campaign's "
                "cluster has GPUs, so it never runs on a CPU in their place")
    pool = [n for n in pool if n.gpus > 0]
    if not pool:
        return "no node with GPUs matches the placement rule " + rule_text(rule)
    caps = sorted((n.gpus for n in pool), reverse=True)
    need, biggest = shape.gpu_count, caps[0]
    where = f" matching {rule_text(rule)}" if rule.node_labels or rule.resources else ""
    if shape.spread:
        return _spread(shape, caps, where)
    if need <= biggest:
        return Layout(1, need)
    if need > sum(caps):
        return (f"needs {need} GPUs ({shape.describe()}), but the {len(caps)} node(s){where} have {sum(caps)} "
                "in all")
    if not shape.per_replica and shape.tp > biggest:
        return (f"tensor_parallel_size={shape.tp} is larger than any node{where} (the largest has {biggest} GPUs); "
                "tensor parallelism never crosses nodes")
    replica = shape.replica_gpus

    def nodes_with(g: int) -> int:
        return sum(1 for c in caps if c >= g)

    if replica <= biggest:  # whole data-parallel replicas per node, the same number on every node
        for local in sorted((d for d in _divisors(shape.dp) if d * replica <= biggest), reverse=True):
            if nodes_with(local * replica) >= shape.dp // local:
                return Layout(shape.dp // local, local * replica, "dp", local)
        return (f"{shape.dp} data-parallel replicas of {replica} GPUs cannot be spread evenly over the nodes{where} "
                f"(GPUs per node: {caps})")
    if shape.dp > 1:
        return (f"one replica needs {replica} GPUs, more than any node{where} has ({biggest}); data parallelism over "
                "replicas that themselves span nodes is not supported: use data_parallel_size=1")
    # one replica across nodes: its pipeline stages (and prefill-context ranks: vLLM orders the ranks PP, PCP,
    # TP from outer to inner) split evenly, each node holding whole TP groups
    stages = shape.pp * shape.pcp if not shape.per_replica else replica
    for n in _divisors(stages):
        g = replica // n
        if n > 1 and replica % n == 0 and g <= biggest and nodes_with(g) >= n:
            return Layout(n, g, "nnodes")
    pcp = f" x pcp={shape.pcp}" if shape.pcp > 1 else ""
    return (f"tp={shape.tp} x pp={shape.pp}{pcp} = {replica} GPUs cannot be split evenly over the nodes{where} "
            f"(GPUs per node: {caps}): the nodes must each hold tp x pp{pcp and ' x pcp'} / N GPUs with N dividing "
            f"pp{pcp and ' x pcp'}")


def _spread(shape: Shape, caps: list[int], where: str) -> Layout | str:
    """`placement_layout: spread`: one data-parallel replica per node, or one pipeline stage (its TP group)
    per node, so that the same shape measures what crossing the fabric costs."""
    replica = shape.replica_gpus
    if shape.dp > 1:
        if replica <= caps[0] and sum(1 for c in caps if c >= replica) >= shape.dp:
            return Layout(shape.dp, replica, "dp", 1)
        return (f"placement_layout spread: {shape.dp} data-parallel replicas of {replica} GPUs need {shape.dp} "
                f"nodes{where} with {replica} GPUs each (GPUs per node: {caps})")
    if shape.pp * shape.pcp > 1 and not shape.per_replica:
        for n in sorted(_divisors(shape.pp * shape.pcp), reverse=True):
            g = replica // n
            if n > 1 and sum(1 for c in caps if c >= g) >= n:
                return Layout(n, g, "nnodes")
        return (f"placement_layout spread: tp={shape.tp} x pp={shape.pp} cannot be split over the nodes{where} "
                f"(GPUs per node: {caps})")
    return (f"placement_layout spread: {shape.describe()} has nothing to spread (tensor parallelism never crosses "
            "nodes): give it pipeline_parallel_size or data_parallel_size > 1")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# ---------------------------------------------------------------------------------------------------
# Packing
# ---------------------------------------------------------------------------------------------------

def fit_nodes(layout: Layout, eligible: Iterable[str], free: dict[str, int]) -> list[str] | None:
    """The nodes a layout would take now: those with room whose free GPUs it fills most tightly (a layout of
    bundles, `fit_bundles`: the node of each bundle)."""
    if layout.bundle_gpus:
        return fit_bundles(layout.bundle_gpus, eligible, free)
    room = [n for n in eligible if free.get(n, 0) >= layout.gpus_per_node]
    if len(room) < layout.nnodes:
        return None
    room.sort(key=lambda n: free[n] - layout.gpus_per_node)  # stable: ties keep cluster order
    return room[:layout.nnodes]


def fit_bundles(bundle_gpus: tuple[int, ...], eligible: Iterable[str], free: dict[str, int]) -> list[str] | None:
    """The node of each bundle of a P/D deployment (one bundle per server, several to a node allowed), or None
    when they do not all fit now: the largest bundles first, each on the node it fills most tightly. A bundle
    without GPUs (the router's, or every bundle on a cluster without GPUs) goes with the last bundle that has
    GPUs (the router beside a decode server), or on the first eligible node."""
    order = list(eligible)
    if not order:
        return None
    room = {n: free.get(n, 0) for n in order}
    at: dict[int, str] = {}
    for i in sorted((i for i, g in enumerate(bundle_gpus) if g > 0), key=lambda i: -bundle_gpus[i]):
        fits = [n for n in order if room[n] >= bundle_gpus[i]]
        if not fits:
            return None
        node = min(fits, key=lambda n: room[n] - bundle_gpus[i])  # min keeps the first of equals: cluster order
        room[node] -= bundle_gpus[i]
        at[i] = node
    with_gpus = [i for i in range(len(bundle_gpus)) if i in at]
    home = at[with_gpus[-1]] if with_gpus else order[0]
    return [at.get(i, home) for i in range(len(bundle_gpus))]


def take(free: dict[str, int], layout: Layout, nodes: list[str]) -> None:
    """Take a layout's GPUs on `nodes` (as `fit_nodes` chose them) from `free`, in place."""
    for n, g in zip(nodes, layout.node_gpus(), strict=True):
        if n in free:
            free[n] -= g


def choose_starts(demands: list[Demand], free: dict[str, int], slots: int | None = None,
                  busy: list[Busy] | None = None) -> list[tuple[Demand, list[str]]]:
    """Which waiting configurations to start now, and on which nodes: most work first, largest shapes first
    among equals, then gap filling.

    `free` is GPUs free per node (updated in place); `slots` caps how many may start (None: no cap).
    `busy`, the running configurations with their estimated time left (the unit of `Demand.work`, which
    is then estimated time too), turns on a reservation: the first configuration in order that does not
    fit holds the nodes where it will fit soonest, and a later one may use those nodes only if its work
    ends before then. Without `busy` every gap is filled.
    """
    chosen: list[tuple[Demand, list[str]]] = []
    held: set[str] = set()
    until: float | None = None
    for d in sorted(demands, key=lambda d: (-d.work, -d.layout.gpu_count)):
        if slots is not None and len(chosen) >= slots:
            break
        nodes = fit_nodes(d.layout, [n for n in d.eligible if n not in held], free)
        if nodes is None and until is not None and d.work <= until:
            nodes = fit_nodes(d.layout, d.eligible, free)
        if nodes is None:
            if busy is not None and until is None:
                until, held = _soonest_fit(d, free, busy + [Busy(tuple(n), c.layout.gpus_per_node, c.work,
                                                                 tuple(c.layout.bundle_gpus))
                                                            for c, n in chosen])
            continue
        take(free, d.layout, nodes)
        chosen.append((d, nodes))
    return chosen


def _soonest_fit(d: Demand, free: dict[str, int], busy: list[Busy]) -> tuple[float | None, set[str]]:
    """When a configuration that does not fit now will fit as the busy ones end, and on which nodes."""
    room = dict(free)
    for b in sorted(busy, key=lambda b: b.left):
        for n, g in zip(b.nodes, b.node_gpus(), strict=True):
            room[n] = room.get(n, 0) + g
        nodes = fit_nodes(d.layout, d.eligible, room)
        if nodes is not None:
            return b.left, set(nodes)
    return None, set()


@dataclass(frozen=True)
class Share:
    """A running configuration whose unclaimed points more servers of it could share, as `tail_starts` sees
    it: its measured seconds per point and per server start."""

    key: str
    layout: Layout
    eligible: tuple[str, ...]
    servers: int        # servers of it running now
    points_left: int    # points no server has claimed yet
    point_s: float
    start_s: float
    max_servers: int    # 1 + placement.tail_replicas


def tail_starts(shares: list[Share], free: dict[str, int]) -> list[tuple[str, list[str]]]:
    """More servers for running configurations, on GPUs nothing waits for: the configuration whose unclaimed
    points take longest per server first, one more server while each server's share of them takes longer
    than a server start (n servers end them in points_left x point_s / n; n + 1, of which one starts first,
    in (points_left x point_s + start_s) / (n + 1), sooner exactly then). `free` is updated in place."""
    chosen: list[tuple[str, list[str]]] = []
    for s in sorted(shares, key=lambda s: (-s.points_left * s.point_s / s.servers, s.key)):
        n = s.servers
        while n < s.max_servers and s.points_left * s.point_s / n > s.start_s:
            nodes = fit_nodes(s.layout, s.eligible, free)
            if nodes is None:
                break
            take(free, s.layout, nodes)
            chosen.append((s.key, nodes))
            n += 1
    return chosen


# ---------------------------------------------------------------------------------------------------
# Placement groups
# ---------------------------------------------------------------------------------------------------

def bundles_for(layout: Layout, rule: NodeRule) -> tuple[list[dict[str, float]], str]:
    """One bundle per node (CPU for the host actor, the node's GPUs, the rule's resources) and the strategy."""
    bundle: dict[str, float] = {"CPU": HOST_CPUS, **rule.resources}
    if layout.gpus_per_node:
        bundle["GPU"] = float(layout.gpus_per_node)
    return [dict(bundle) for _ in range(layout.nnodes)], "STRICT_PACK" if layout.nnodes == 1 else "STRICT_SPREAD"


def reserve(serve: ServeConfig, layout: Layout, node_ids: list[str], timeout_s: float = 60.0,
            replica: int = 0) -> Reservation:
    """Create the configuration's placement group on the chosen nodes and wait until Ray has placed it
    (`replica` > 0: a further server of it at the campaign's tail, in a group of its own)."""
    bundles, strategy = bundles_for(layout, serve.rule)
    name = f"raysweep-{serve.id}" + (f"-r{replica}" if replica else "")
    pg = placement_group(bundles, strategy=strategy, name=name,
                         bundle_label_selector=[{NODE_ID_LABEL: n} for n in node_ids])
    t0 = time.monotonic()
    while not pg.wait(timeout_seconds=2):
        if time.monotonic() - t0 > timeout_s:
            remove_placement_group(pg)
            raise NotPlaced(f"no room for {bundles} ({strategy}) on {[n[:8] for n in node_ids]} "
                            f"after {timeout_s:.0f} s")
        log.info("waiting for %s on nodes %s", bundles, [n[:8] for n in node_ids])
    placed = placement_group_table(pg).get("bundles_to_node_id", {})
    return Reservation(pg=pg, bundles=bundles, strategy=strategy, layout=layout,
                       node_ids=[placed.get(i, node_ids[i]) for i in range(len(bundles))])


def release(res: Reservation) -> None:
    try:
        remove_placement_group(res.pg)
    except Exception as exc:
        log.warning("could not remove placement group: %s", exc)


def actor_options(res: Reservation, bundle_index: int = 0) -> dict[str, Any]:
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return {"num_cpus": HOST_CPUS, "num_gpus": res.layout.gpus_per_node,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(res.pg, placement_group_bundle_index=bundle_index)}

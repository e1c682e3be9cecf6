"""Makespan of raysweep's packing policy (`placement.choose_starts`), by discrete-event simulation.

No Ray and no servers: each configuration has a modeled duration (server start 60-180 s, plus its points
times a per-point time that grows with its GPU count, with a random spread). The simulation drives the
real policy the way the driver does: at time 0 and whenever a running configuration finishes, it builds a
`Demand` for every waiting configuration (work = its number of points; the policy never sees durations),
calls `choose_starts` with the free GPUs per node, and starts what it returns. Layouts come from the real
`layout_for` on the simulated nodes (16 GPUs on 8-GPU nodes: 2 nodes x 8).

For each scenario it reports the makespan against a lower bound, max(GPU-seconds / GPUs, longest config),
the GPU utilisation, the same for vLLM's sweep order (one configuration at a time, each alone on the
cluster), and the ratio makespan / lower bound over many seeds (median, min, max). "drain" is the time from
the last start to the end: the cluster finishing its last configurations with nothing left waiting.

`--compare` also runs every scenario under "gpu-count-first", the policy's previous order (largest GPU
count first, remaining work only breaking ties; the same best fit), and prints the two side by side.
`--safeguards` runs two more for the starvation question of one-wave campaigns: "reserve-300s" (once the
first configuration in order that does not fit has waited 300 s, the nodes with the most free GPUs are
held for it: nothing else starts there) and "exact-lpt", an oracle that knows every configuration's true
duration and starts the longest first (the same best fit): what any order could gain against this bound.
`--estimates` runs `choose_starts` fed estimated seconds instead of points, with the running configurations'
estimated time left, so that the first configuration that does not fit holds the nodes where it will fit
soonest (`Estimated`): estimates from what this campaign has measured so far ("est-campaign"), from an
earlier campaign's ledger of the same configurations with per-point times off by up to 10, 20 or 40 %
("est-history-N%"), and the true durations ("exact+hold", an oracle).
`--tail-replicas N` runs the driver's order with `placement.tail_replicas: N` ("tail-replicas-N"), simulated
point by point (`simulate_shared`): once nothing waits, GPUs that would idle start further servers of running
configurations (`placement.tail_starts`), which share their unclaimed points. It also prints how many further
servers started and what their starts cost, in GPU-seconds against the campaign's.

    .venv/bin/python benchmarks/bench_packing.py [--seed N] [--seeds 20] [--quick] [--compare] [--safeguards]
                                                 [--estimates] [--tail-replicas N] [--json FILE]
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import random
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from raysweep.campaign import NodeRule
from raysweep.place.placement import (
    Busy,
    Demand,
    Layout,
    NodeInfo,
    Share,
    choose_starts,
    eligible_nodes,
    fit_nodes,
    layout_for,
    tail_starts,
)
from raysweep.plan.plan import Shape

Policy = Callable[[list[Demand], dict[str, int]], list[tuple[Demand, list[str]]]]
RULE = NodeRule()
# the shapes a campaign draws from, by GPU count: TP inside a node, PP or DP across nodes for 16
SHAPES: dict[int, tuple[Shape, ...]] = {
    1: (Shape(1),), 2: (Shape(2), Shape(1, dp=2)), 4: (Shape(4), Shape(2, dp=2)),
    8: (Shape(8), Shape(4, dp=2)), 16: (Shape(8, pp=2), Shape(8, dp=2)),
}


@dataclass(frozen=True)
class Scenario:
    name: str
    nodes: int
    gpus_per_node: int
    configs: int
    seed: int
    points: tuple[int, int] = (2, 24)   # points per configuration, uniform
    long_points: int = 0                # > 0: one configuration gets this many points and dominates


@dataclass(frozen=True)
class Config:
    key: str
    shape: Shape
    points: int
    duration_s: float  # modeled server start + points x point time; unknown to the policy
    start_s: float = 0.0  # its server start, and the time of each of its points (duration_s is their sum)
    point_s: float = 0.0


SCENARIOS = (
    Scenario("mixed-4x8", nodes=4, gpus_per_node=8, configs=40, seed=1),
    Scenario("mixed-32x8", nodes=32, gpus_per_node=8, configs=400, seed=2),
    Scenario("one-long-4x8", nodes=4, gpus_per_node=8, configs=8, seed=3, points=(2, 12), long_points=60),
    Scenario("one-wave-32x8", nodes=32, gpus_per_node=8, configs=100, seed=4),  # about one wave: little to fill with
    # one bench grid for every configuration, as most campaigns have: work-first is then largest-first
    Scenario("equal-grid-4x8", nodes=4, gpus_per_node=8, configs=40, seed=5, points=(12, 12)),
    Scenario("equal-grid-32x8", nodes=32, gpus_per_node=8, configs=400, seed=6, points=(12, 12)),
)


def gpu_count_first(demands: list[Demand], free: dict[str, int]) -> list[tuple[Demand, list[str]]]:
    """The previous order, for comparison only: largest GPU count first, remaining work breaking ties, then
    the same best fit (`fit_nodes`) as `choose_starts`."""
    return _first_fit(sorted(demands, key=lambda d: (-d.layout.gpu_count, -d.work)), free)


def _first_fit(ordered: list[Demand], free: dict[str, int]) -> list[tuple[Demand, list[str]]]:
    """Start, in the given order, every configuration that fits (best fit), taking its GPUs from `free`."""
    chosen = []
    for d in ordered:
        nodes = fit_nodes(d.layout, d.eligible, free)
        if nodes is not None:
            for n in nodes:
                free[n] -= d.layout.gpus_per_node
            chosen.append((d, nodes))
    return chosen


class ReserveAfter:
    """choose_starts' order, with a reservation for the first configuration that does not fit once it has
    waited `after_s` (every configuration waits from the campaign's start here): the nodes with the most free
    GPUs are held for it."""

    def __init__(self, after_s: float) -> None:
        self.after_s, self.now = after_s, 0.0

    def __call__(self, demands: list[Demand], free: dict[str, int]) -> list[tuple[Demand, list[str]]]:
        chosen, held = [], False
        for d in sorted(demands, key=lambda d: (-d.work, -d.layout.gpu_count)):
            nodes = fit_nodes(d.layout, d.eligible, free)
            if nodes is None:
                if not held and self.now >= self.after_s:
                    for n in sorted(d.eligible, key=lambda n: -free.get(n, 0))[:d.layout.nnodes]:
                        free[n] = 0
                    held = True
                continue
            for n in nodes:
                free[n] -= d.layout.gpus_per_node
            chosen.append((d, nodes))
        return chosen


class ExactLpt:
    """An oracle, for comparison only: the true durations known, the longest configuration first."""

    def __init__(self) -> None:
        self.duration: dict[str, float] = {}

    def __call__(self, demands: list[Demand], free: dict[str, int]) -> list[tuple[Demand, list[str]]]:
        return _first_fit(sorted(demands, key=lambda d: -self.duration[d.key]), free)


class Estimated:
    """choose_starts fed estimated seconds instead of points, and the running configurations' estimated time
    left (`busy`), so the first configuration that does not fit holds the nodes where it fits soonest.

    Where the estimates come from (`source`):
    - "campaign": only what this campaign has measured by now, as the driver could read it from its ledger:
      the server starts seen so far, and the point times of every finished point, averaged per GPU count
      (then over all sizes while a size has none). A running configuration with a finished point uses its
      own point time. Before the first point ends the estimates are points (1 s a point, no start).
    - "history": a ledger of an earlier campaign of the same configurations: each one's point time as it was
      then, off by up to `spread` (uniform); server starts averaged (this campaign's once seen, the earlier
      campaign's before). A running configuration with a finished point uses its own point time.
    - "exact": an oracle, the true remaining durations.
    """

    def __init__(self, source: str, spread: float = 0.0) -> None:
        self.source, self.spread = source, spread
        self.now = 0.0
        self.configs: dict[str, Config] = {}
        self.started: dict[str, tuple[float, list[str]]] = {}  # key: start time, node ids (running or ended)
        self.layouts: dict[str, Layout] = {}
        self.earlier: dict[str, tuple[float, float]] = {}  # history: key -> (start, point time) then

    def bind(self, configs: list[Config], layouts: dict[str, Layout], seed: int) -> None:
        rng = random.Random(seed * 7919 + 1)
        self.configs, self.layouts, self.started = {c.key: c for c in configs}, layouts, {}
        self.earlier = {c.key: (rng.uniform(60, 180), c.point_s * rng.uniform(1 - self.spread, 1 + self.spread))
                        for c in configs}

    def __call__(self, demands: list[Demand], free: dict[str, int]) -> list[tuple[Demand, list[str]]]:
        per_size, starts, own = self._measured()
        every = [t for ts in per_size.values() for t in ts]

        def point_s(key: str) -> float:
            if self.source == "history":
                return self.earlier[key][1]
            ts = per_size.get(self.layouts[key].gpu_count) or every
            return statistics.fmean(ts) if ts else 1.0

        if self.source == "history":  # server starts: this campaign's once seen, the earlier campaign's before
            start_s = statistics.fmean(starts or [t for t, _ in self.earlier.values()])
        else:
            start_s = statistics.fmean(starts) if starts and every else 0.0

        def waiting(key: str) -> float:
            c = self.configs[key]
            if self.source == "exact":
                return c.duration_s
            return start_s + c.points * point_s(key)

        def left(key: str, t0: float) -> float:
            c = self.configs[key]
            if self.source == "exact" or key in own:
                return t0 + c.duration_s - self.now
            if self.now >= t0 + c.start_s:
                return t0 + c.start_s + c.points * point_s(key) - self.now
            return t0 + max(waiting(key) - c.points * point_s(key), self.now - t0) + c.points * point_s(key) - self.now

        busy = [Busy(tuple(ids), self.layouts[k].gpus_per_node, max(0.0, left(k, t0)))
                for k, (t0, ids) in self.started.items() if t0 + self.configs[k].duration_s > self.now]
        ds = [Demand(d.key, d.layout, d.eligible, waiting(d.key)) for d in demands]
        return choose_starts(ds, free, busy=busy)

    def _measured(self) -> tuple[dict[int, list[float]], list[float], set[str]]:
        """By now: point times of finished points per GPU count, server starts, configurations with a point."""
        per_size: dict[int, list[float]] = {}
        starts, own = [], set()
        for k, (t0, _) in self.started.items():
            c = self.configs[k]
            if self.now < t0 + c.start_s:
                continue
            starts.append(c.start_s)
            done = min(c.points, int((self.now - t0 - c.start_s) // c.point_s))
            if done > 0:
                per_size.setdefault(self.layouts[k].gpu_count, []).extend([c.point_s] * done)
                own.add(k)
        return per_size, starts, own


class TailReplicas:
    """choose_starts, and at the tail (nothing waiting) `placement.tail_starts` with up to `extra` more servers
    per configuration, as the driver runs `placement.tail_replicas`. Simulated point by point
    (`simulate_shared`): each server takes its configuration's next unclaimed point when it is free."""

    def __init__(self, extra: int) -> None:
        self.extra = extra
        self.extra_servers = 0     # started in the last campaign simulated
        self.extra_gpu_s = 0.0     # the GPU-seconds of their starts (not in the lower bound's area)


def simulate_shared(configs: list[Config], nodes: list[NodeInfo], policy: TailReplicas,
                    seed: int = 0) -> tuple[float, float]:
    """Point by point: every server pulls its configuration's points one at a time until none is left, then
    frees its GPUs. At every such end the real `choose_starts` starts what fits; once nothing waits, the real
    `tail_starts` gets each running configuration's unclaimed points and, once measured (a point done on it,
    so its own point time and server start are known, as `RunState.pace` reads them from the ledger), its
    pace. A further server's start is drawn like any other (60-180 s), unknown to the policy. With
    `extra` = 0 this is the same campaign as `simulate` (same makespan). Returns the makespan and last start."""
    rng = random.Random(seed * 7919 + 3)
    layouts = {c.key: layout_of(c, nodes) for c in configs}
    eligible = tuple(n.node_id for n in eligible_nodes(RULE, nodes))
    by_key = {c.key: c for c in configs}
    waiting = dict(by_key)
    unclaimed: dict[str, int] = {}
    servers: dict[int, tuple[str, list[str]]] = {}  # server number -> configuration, node ids
    measured: set[str] = set()                      # configurations with a point done
    events: list[tuple[float, int, int, bool]] = []  # (time, order, server, a point just ended there)
    order = itertools.count()
    policy.extra_servers, policy.extra_gpu_s = 0, 0.0
    now = last_start = 0.0

    def start(key: str, ids: list[str], start_s: float) -> None:
        n = next(order)
        servers[n] = (key, ids)
        heapq.heappush(events, (now + start_s, n, n, False))

    while True:
        free = {n.node_id: n.gpus for n in nodes}
        for key, ids in servers.values():
            for n in ids:
                free[n] -= layouts[key].gpus_per_node
        demands = [Demand(k, layouts[k], eligible, float(c.points)) for k, c in waiting.items()]
        for d, ids in choose_starts(demands, free):
            c = waiting.pop(d.key)
            unclaimed[d.key], last_start = c.points, now
            start(d.key, ids, c.start_s)
        if not waiting and policy.extra:
            count: dict[str, int] = {}
            for key, _ in servers.values():
                count[key] = count.get(key, 0) + 1
            shares = [Share(k, layouts[k], eligible, n, unclaimed[k], by_key[k].point_s, by_key[k].start_s,
                            1 + policy.extra) for k, n in count.items() if k in measured and unclaimed[k]]
            for key, ids in tail_starts(shares, free):
                start_s = rng.uniform(60, 180)
                start(key, ids, start_s)
                policy.extra_servers += 1
                policy.extra_gpu_s += layouts[key].gpu_count * start_s
                last_start = now
        if not events:
            if waiting:
                raise RuntimeError(f"policy started nothing on an idle cluster; {len(waiting)} configs left")
            return now, last_start
        freed = False
        while events and not freed:  # to the next server that frees its GPUs
            now, _, n, after_point = heapq.heappop(events)
            key = servers[n][0]
            if after_point:
                measured.add(key)
            if unclaimed[key]:
                unclaimed[key] -= 1
                heapq.heappush(events, (now + by_key[key].point_s, next(order), n, True))
            else:
                del servers[n]
                freed = True


POLICIES: dict[str, Policy] = {"choose_starts": choose_starts, "gpu-count-first": gpu_count_first}
SAFEGUARDS: dict[str, Callable[[], Policy]] = {"reserve-300s": lambda: ReserveAfter(300.0), "exact-lpt": ExactLpt}
ESTIMATES: dict[str, Callable[[], Policy]] = {
    "est-campaign+hold": lambda: Estimated("campaign"),
    "est-history-20%+hold": lambda: Estimated("history", 0.2),
    "est-history-10%+hold": lambda: Estimated("history", 0.1),
    "est-history-40%+hold": lambda: Estimated("history", 0.4),
    "exact+hold": lambda: Estimated("exact"),
}


def make_nodes(sc: Scenario) -> list[NodeInfo]:
    """The simulated cluster: identical GPU nodes without labels."""
    return [NodeInfo(node_id=f"node-{i:02d}", ip=f"10.0.0.{i + 1}", gpus=sc.gpus_per_node, cpus=64.0)
            for i in range(sc.nodes)]


def make_campaign(sc: Scenario, seed: int) -> list[Config]:
    """Configurations in plan order: GPU counts cycle 1..16 so each size is equally common, then shuffled."""
    rng = random.Random(seed)
    sizes = [sorted(SHAPES)[i % len(SHAPES)] for i in range(sc.configs)]
    rng.shuffle(sizes)
    long_at = rng.randrange(sc.configs) if sc.long_points else -1
    out = []
    for i, gpus in enumerate(sizes):
        points = sc.long_points if i == long_at else rng.randint(*sc.points)
        point_s = 40.0 * (1 + math.log2(gpus) / 4) * rng.uniform(0.5, 1.5)  # bigger models: slower points
        shape, start_s = rng.choice(SHAPES[gpus]), rng.uniform(60, 180)
        out.append(Config(f"c{i:03d}", shape, points, start_s + points * point_s, start_s, point_s))
    return out


def layout_of(c: Config, nodes: list[NodeInfo]) -> Layout:
    """The configuration's layout on these nodes, from the real `layout_for`."""
    lay = layout_for(c.shape, RULE, nodes)
    if isinstance(lay, Layout):
        return lay
    raise ValueError(f"{c.key} ({c.shape.describe()}) cannot be placed: {lay}")


def simulate(configs: list[Config], nodes: list[NodeInfo], policy: Policy = choose_starts,
             seed: int = 0) -> tuple[float, float]:
    """Run the campaign under `policy`; return its makespan and the time of its last start, in seconds."""
    layouts = {c.key: layout_of(c, nodes) for c in configs}
    if isinstance(policy, ExactLpt):
        policy.duration = {c.key: c.duration_s for c in configs}
    if isinstance(policy, Estimated):
        policy.bind(configs, layouts, seed)
    eligible = tuple(n.node_id for n in eligible_nodes(RULE, nodes))
    waiting = {c.key: c for c in configs}
    running: list[tuple[float, str, list[str]]] = []  # heap of (end time, key, node ids)
    now = last_start = 0.0
    while waiting or running:
        free = {n.node_id: n.gpus for n in nodes}
        for _, key, ids in running:
            for n in ids:
                free[n] -= layouts[key].gpus_per_node
        demands = [Demand(k, layouts[k], eligible, float(c.points)) for k, c in waiting.items()]
        if isinstance(policy, (ReserveAfter, Estimated)):
            policy.now = now
        for d, ids in policy(demands, free):
            last_start = now
            if isinstance(policy, Estimated):
                policy.started[d.key] = (now, ids)
            heapq.heappush(running, (now + waiting.pop(d.key).duration_s, d.key, ids))
        if not running:
            raise RuntimeError(f"policy started nothing on an idle cluster; {len(waiting)} configs left")
        now = running[0][0]
        while running and running[0][0] == now:  # every configuration ending now frees its GPUs
            heapq.heappop(running)
    return now, last_start


def measure(sc: Scenario, seed: int, policy: Policy = choose_starts) -> dict[str, float]:
    """One campaign of the scenario: packed by `policy`, against its lower bound and vLLM's sweep order."""
    nodes, configs = make_nodes(sc), make_campaign(sc, seed)
    gpus = sc.nodes * sc.gpus_per_node
    gpu_s = sum(c.shape.gpu_count * c.duration_s for c in configs)
    bound = max(gpu_s / gpus, max(c.duration_s for c in configs))
    if isinstance(policy, TailReplicas):
        makespan, last_start = simulate_shared(configs, nodes, policy, seed)
    else:
        makespan, last_start = simulate(configs, nodes, policy, seed)
    sequential = sum(c.duration_s for c in configs)
    out = {"seed": seed, "makespan_s": makespan, "lower_bound_s": bound, "ratio": makespan / bound,
           "utilisation": gpu_s / (gpus * makespan), "drain_s": makespan - last_start, "sequential_s": sequential,
           "sequential_ratio": sequential / bound, "sequential_utilisation": gpu_s / (gpus * sequential)}
    if isinstance(policy, TailReplicas):  # what the further servers cost: their starts, outside the area bound
        out.update(extra_servers=policy.extra_servers, extra_start_gpu_fraction=policy.extra_gpu_s / gpu_s)
    return out


def run_scenario(sc: Scenario, seed: int, n_seeds: int, policy: Policy = choose_starts) -> dict[str, Any]:
    """The figures of seed `seed`, and the ratio's spread over seeds seed .. seed + n_seeds - 1."""
    one = measure(sc, seed, policy)
    runs = [measure(sc, s, policy) for s in range(seed, seed + n_seeds)]
    ratios = [r["ratio"] for r in runs]
    out = {"scenario": asdict(sc), "seed": seed, "run": one, "seeds": n_seeds,
           "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
           "seeds_within_1_1": sum(r <= 1.1 for r in ratios), "ratios": ratios}
    if isinstance(policy, TailReplicas):
        out["extra_servers_median"] = statistics.median(r["extra_servers"] for r in runs)
        out["extra_start_gpu_fraction_median"] = statistics.median(r["extra_start_gpu_fraction"] for r in runs)
    return out


def table(results: list[dict[str, Any]]) -> str:
    """A Markdown table, one row per scenario."""
    head = ("| scenario | GPUs | configs | seed | makespan s | lower bound s | ratio | util | drain s | sequential s "
            "| seq. ratio | seq. util | ratio over seeds: median [min, max] | seeds <= 1.1 |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        sc, one = r["scenario"], r["run"]
        lines.append(
            f"| {sc['name']} | {sc['nodes']}x{sc['gpus_per_node']} | {sc['configs']} | {r['seed']} "
            f"| {one['makespan_s']:.0f} | {one['lower_bound_s']:.0f} | {one['ratio']:.3f} "
            f"| {one['utilisation']:.0%} | {one['drain_s']:.0f} "
            f"| {one['sequential_s']:.0f} | {one['sequential_ratio']:.2f} | {one['sequential_utilisation']:.0%} "
            f"| {r['ratio_median']:.3f} [{r['ratio_min']:.3f}, {r['ratio_max']:.3f}] "
            f"| {r['seeds_within_1_1']}/{r['seeds']} |")
    return "\n".join(lines)


def compare_table(by_policy: dict[str, list[dict[str, Any]]]) -> str:
    """Per scenario, for each policy: the ratio over seeds, and the first seed's drain and utilisation."""
    head = "| scenario | " + " | ".join(f"{p}: ratio median [min, max] | seeds <= 1.1 | drain s | util"
                                       for p in by_policy) + " |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for rows in zip(*by_policy.values()):
        cells = [f"{r['ratio_median']:.3f} [{r['ratio_min']:.3f}, {r['ratio_max']:.3f}] | {r['seeds_within_1_1']}/"
                 f"{r['seeds']} | {r['run']['drain_s']:.0f} | {r['run']['utilisation']:.0%}" for r in rows]
        lines.append(f"| {rows[0]['scenario']['name']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, help="first seed of every scenario (default: each scenario's own)")
    ap.add_argument("--seeds", type=int, default=20, help="seeds for the ratio's median, min and max")
    ap.add_argument("--quick", action="store_true", help="5 seeds instead of --seeds")
    ap.add_argument("--compare", action="store_true", help="also run the previous order, gpu-count-first")
    ap.add_argument("--safeguards", action="store_true", help="also run reserve-300s and the exact-lpt oracle")
    ap.add_argument("--estimates", action="store_true",
                    help="also run choose_starts fed estimated seconds and holding nodes (Estimated)")
    ap.add_argument("--tail-replicas", type=int, default=0, metavar="N",
                    help="also run choose_starts with placement.tail_replicas N (point by point)")
    ap.add_argument("--json", type=Path, metavar="FILE", help="also write every figure to FILE as JSON")
    args = ap.parse_args()
    n_seeds = min(args.seeds, 5) if args.quick else args.seeds
    policies = dict(POLICIES) if args.compare else {"choose_starts": choose_starts}
    if args.safeguards:
        policies.update({name: make() for name, make in SAFEGUARDS.items()})
    if args.estimates:
        policies.update({name: make() for name, make in ESTIMATES.items()})
    if args.tail_replicas:
        policies[f"tail-replicas-{args.tail_replicas}"] = TailReplicas(args.tail_replicas)
    by_policy = {name: [run_scenario(sc, sc.seed if args.seed is None else args.seed, n_seeds, policy)
                        for sc in SCENARIOS] for name, policy in policies.items()}
    for name, results in by_policy.items():
        print(f"## {name}\n\n{table(results)}\n")
        if "extra_servers_median" in results[0]:
            print("further servers at the tail, median over seeds (their starts' GPU-seconds / the campaign's): "
                  + ", ".join(f"{r['scenario']['name']} {r['extra_servers_median']:g} "
                              f"({r['extra_start_gpu_fraction_median']:.1%})" for r in results) + "\n")
    if len(by_policy) > 1:
        print(f"## {' vs '.join(by_policy)}\n\n{compare_table(by_policy)}")
    if args.json:
        args.json.write_text(json.dumps(by_policy, indent=2) + "\n")


if __name__ == "__main__":
    main()

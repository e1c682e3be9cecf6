"""The plan: server configurations x benchmark points x runs, each with a stable id, and the dry-run text.

Ids are hashes of canonical parameters, so the order of keys or grid values does not matter, and adding a
value to a grid adds points without touching the ids of the others. The campaign's fingerprint covers
what gives finished points their meaning (the commands and environments), not the grids.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from raysweep import grid
from raysweep.bench.load import CONCURRENCY, Load, load_of
from raysweep.campaign import CampaignSpec, NodeRule, PlacementSpec
from raysweep.campaign.levels import BATCH, LEVEL, SERIAL, dataset_size, workload_of
from raysweep.campaign.levels import dry_run_lines as workload_lines
from raysweep.campaign.pd import Deployment, deployment_of
from raysweep.errors import CampaignError
from raysweep.plan import hooks
from raysweep.procs import CPUS_ENV

__all__ = ["BenchPoint", "Plan", "PointRun", "ServeConfig", "Shape", "build_plan", "dry_run_text", "endpoint_benches",
           "fingerprint", "first_runs", "level_bench", "make_serve", "meaning", "point_id",
           "role_servers", "rule_for", "serve_points", "shape_of"]

_SHAPE_FLAGS = {
    "tp": ("tensor_parallel_size", ("--tensor-parallel-size", "--tensor_parallel_size", "-tp")),
    "pp": ("pipeline_parallel_size", ("--pipeline-parallel-size", "--pipeline_parallel_size", "-pp")),
    "dp": ("data_parallel_size", ("--data-parallel-size", "--data_parallel_size", "-dp")),
    # vLLM counts prefill context parallelism in a replica's world size (TP x PP x PCP, `config/parallel.py`);
    # decode context parallelism reuses the TP ranks and takes no GPU of its own
    "pcp": ("prefill_context_parallel_size", ("--prefill-context-parallel-size", "--prefill_context_parallel_size",
                                               "-pcp")),
}


@dataclass(frozen=True)
class Shape:
    """How many GPUs a server configuration takes: tensor x pipeline x prefill-context x data parallel sizes,
    as vLLM counts its world size (`ParallelConfig.world_size` = TP x PP x PCP, times DP across replicas)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    per_replica: int | None = None  # serve.gpus_per_replica, for commands that are not `vllm serve`
    spread: bool = False            # `placement_layout: spread`: across as many nodes as the shape allows
    pd_gpus: int | None = None      # a P/D deployment (serve.pd): all its roles' GPUs
    pcp: int = 1                    # prefill context parallelism: its ranks are GPUs of the replica

    @property
    def replica_gpus(self) -> int:
        return self.per_replica or self.tp * self.pp * self.pcp

    @property
    def gpu_count(self) -> int:
        return self.pd_gpus if self.pd_gpus is not None else self.replica_gpus * self.dp

    def describe(self) -> str:
        if self.pd_gpus is not None:
            return "P/D deployment (its roles below)"
        text = f"tp={self.tp} pp={self.pp} dp={self.dp}" + (f" pcp={self.pcp}" if self.pcp > 1 else "")
        return text + (f" gpus_per_replica={self.per_replica}" if self.per_replica else "") + (
            " spread" if self.spread else "")


@dataclass(frozen=True)
class ServeConfig:
    """One server configuration: its parameters, the full command and environment, and its GPU shape."""

    id: str
    params: dict[str, Any]
    argv: list[str]
    env: dict[str, str]
    shape: Shape
    label: str
    rule: NodeRule = field(default_factory=NodeRule)
    deployment: Deployment | None = None  # serve.pd: the roles, each a server of its own (raysweep.campaign.pd)

    def display_argv(self) -> list[str]:
        return grid.mask_argv(self.argv)


@dataclass(frozen=True)
class BenchPoint:
    """One benchmark point: its parameters and the benchmark command with them applied. A probe of an
    SLA search also names the bench point it probes (`base_id`) and the value it tries (`sla_value`)."""

    id: str
    params: dict[str, Any]
    argv: list[str]
    label: str
    base_id: str | None = None
    sla_value: float | None = None
    workload_of: str | None = None      # bench.workload: the grid's bench point this one is a load level of
    workload_role: str | None = None    # serial, batch or level (raysweep.levels.search)
    workload_value: int | None = None   # the value of bench.workload.variable it runs at
    load: Load = field(init=False, repr=False, compare=False)  # its load, read once from its command

    def __post_init__(self) -> None:
        object.__setattr__(self, "load", load_of(self.argv))


@dataclass(frozen=True)
class PointRun:
    """One run of one benchmark point against one server configuration: the unit the ledger tracks."""

    id: str
    serve: ServeConfig
    bench: BenchPoint
    run: int


@dataclass
class Plan:
    spec: CampaignSpec
    serves: list[ServeConfig]
    benches: list[BenchPoint]
    points: list[PointRun]
    fingerprint: str
    skipped_pairs: int = 0
    searches: list[tuple[str, str]] = field(default_factory=list)  # (serve id, bench id) pairs an SLA search runs on
    confirm_ids: dict[str, str] = field(default_factory=dict)  # bench ids of the winner's confirmation: labels
    confirm_base: dict[str, str] = field(default_factory=dict)  # confirmation bench id -> the bench id it confirms
    _by_serve: dict[str, list[PointRun]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for p in self.points:
            self._by_serve.setdefault(p.serve.id, []).append(p)

    def points_of(self, serve_id: str) -> list[PointRun]:
        return self._by_serve.get(serve_id, [])

    def point(self, point_id: str) -> PointRun | None:
        return next((p for p in self.points if p.id == point_id), None)

    def add_runs(self, points: list[PointRun]) -> None:
        """Runs `bench.precision` added to points of configurations already in the plan."""
        self.points.extend(points)
        for p in points:
            self._by_serve.setdefault(p.serve.id, []).append(p)

    def add(self, serve: ServeConfig, points: list[PointRun], searches: list[tuple[str, str]]) -> None:
        """A configuration added while the campaign runs (a tuning candidate)."""
        self.serves.append(serve)
        self.points.extend(points)
        self.searches.extend(searches)
        self._by_serve.setdefault(serve.id, []).extend(points)


def first_runs(spec: CampaignSpec) -> int:
    """Runs every bench point starts with: `runs`, or `bench.precision.min_runs` (which adds more as needed)."""
    c = spec.campaign
    precision = getattr(c.bench, "precision", None) if c.bench is not None else None
    return precision.min_runs if precision is not None else c.runs


def point_id(serve_id: str, bench_id: str, run: int) -> str:
    return hashlib.sha256(f"{serve_id}/{bench_id}/{run}".encode()).hexdigest()[:16]


def shape_of(params: dict[str, Any], argv: list[str], gpus_per_replica: int | None = None) -> Shape:
    """The GPU shape from the parameters, else from the flags of the base command, else 1 x 1 x 1;
    `gpus_per_replica` replaces tp x pp as the size of one replica."""
    norm = {grid.normalize_key(k): v for k, v in params.items()}
    sizes = {}
    for short, (key, flags) in _SHAPE_FLAGS.items():
        value = norm[key] if key in norm else grid.find_flag_value(argv, *flags)
        try:
            size = 1 if value is None else int(value)
        except (TypeError, ValueError):
            size = 0
        if size < 1 or isinstance(value, bool):
            where = f"serve.params ({grid.combo_label(params)})" if key in norm else "serve.cmd"
            raise CampaignError(where, f"{key} must be a positive integer, got {value!r}")
        sizes[short] = size
    layout = norm.get(grid.LAYOUT_KEY, "pack")
    if layout not in ("pack", "spread"):
        raise CampaignError(f"serve.params ({grid.combo_label(params)})",
                            f"{grid.LAYOUT_KEY} must be pack or spread, got {layout!r}")
    return Shape(**sizes, per_replica=gpus_per_replica, spread=layout == "spread")


def rule_for(params: dict[str, Any], placement: PlacementSpec) -> NodeRule:
    """The node rule of one configuration: the campaign's, with every matching pin laid over it."""
    labels, resources = dict(placement.node_labels), dict(placement.resources)
    for pin in placement.pins:
        if _pin_matches(pin.when, params):
            labels.update(pin.node_labels)
            resources.update(pin.resources)
    return NodeRule(node_labels=labels, resources=resources)


def _pin_matches(when: dict[str, Any], params: dict[str, Any]) -> bool:
    norm = {grid.normalize_key(k): v for k, v in params.items()}
    return all(grid.normalize_key(k) in norm and _same(norm[grid.normalize_key(k)], v) for k, v in when.items())


def _same(a: object, b: object) -> bool:
    return a == b or str(a) == str(b)


def _check_pins(placement: PlacementSpec, combos: list[dict[str, Any]]) -> None:
    for i, pin in enumerate(placement.pins):
        if not any(_pin_matches(pin.when, c) for c in combos):
            raise CampaignError(f"placement.pins[{i}].when",
                                f"{pin.when} matches no server configuration (serve parameters: "
                                f"{', '.join(grid.combo_label(c) for c in combos[:5]) or 'none'})")


def meaning(spec: CampaignSpec) -> dict[str, Any]:
    """What gives a finished point its meaning: commands, environments, bench backend (secrets masked)."""
    c = spec.campaign
    if spec.offline:
        return {"mode": "offline", "offline_cmd": grid.mask_argv(spec.serve_argv),
                "offline_env": grid.mask_env(spec.serve_env),
                **({"gpus_per_point": spec.gpus_per_replica} if spec.gpus_per_replica else {})}
    assert c.bench is not None
    return {
        "serve_cmd": grid.mask_argv(spec.serve_argv),
        "serve_env": grid.mask_env(spec.serve_env),
        "bench_backend": c.bench.backend,
        "bench_cmd": grid.mask_argv(spec.bench_argv),
        "bench_env": grid.mask_env(spec.bench_env),
        "after_bench_cmd": grid.mask_argv(spec.after_bench_argv) if spec.after_bench_argv else None,
        **({"gpus_per_replica": spec.gpus_per_replica} if spec.gpus_per_replica else {}),
        **({"serve_pd": c.serve.pd.model_dump(mode="json")} if c.serve is not None and c.serve.pd else {}),
    }


def fingerprint(spec: CampaignSpec) -> str:
    """A hash of `meaning(spec)`: it changes only when finished points would mean something else."""
    return hashlib.sha256(json.dumps(meaning(spec), sort_keys=True).encode()).hexdigest()[:16]


def build_plan(spec: CampaignSpec) -> Plan:
    """Expand a campaign into server configs, bench points and runs (linked pairs only). A `tune:` campaign
    starts with no server config: the tuner adds its candidates (`make_serve`, `serve_points`, `Plan.add`).
    A campaign's `design:` is put in place first: its starts as `order.instances`, its runs as `runs`
    (`raysweep.plan.design.applied`)."""
    from raysweep.plan.design import applied

    spec = applied(spec)
    c = spec.campaign
    _check_pins(c.placement, spec.serve_combos)
    serves = [] if c.tune is not None else [make_serve(spec, combo) for combo in spec.serve_combos]
    benches = [BenchPoint(id=grid.params_id(_no_name(c)), params=c, argv=grid.apply_to_cmd(spec.bench_argv, c),
                          label=grid.combo_label(c)) for c in spec.bench_combos]
    points: list[PointRun] = []
    searches: list[tuple[str, str]] = []
    skipped = 0
    for s in serves:
        pts, srch, skip = serve_points(spec, s, benches)
        points, searches, skipped = points + pts, searches + srch, skipped + skip
    return Plan(spec=spec, serves=serves, benches=benches, points=points, fingerprint=fingerprint(spec),
                skipped_pairs=skipped, searches=searches)


def make_serve(spec: CampaignSpec, combo: dict[str, Any]) -> ServeConfig:
    """The server configuration of one combination of serve parameters."""
    argv = grid.apply_to_cmd(spec.serve_argv, combo)
    env = dict(spec.serve_env)
    cpus = spec.campaign.serve.cpu_affinity if spec.campaign.serve is not None else None
    if cpus is not None:  # the server's guard pins itself and the server to them (raysweep.serve.guard)
        from raysweep.procs import cpu_set, cpu_text

        env[CPUS_ENV] = cpu_text(cpu_set(cpus) or ())
    pd = spec.campaign.serve.pd if spec.campaign.serve is not None else None
    dep = deployment_of(pd, combo, base_argv=spec.serve_argv) if pd is not None else None
    shape = shape_of({} if dep else combo, spec.serve_argv, spec.gpus_per_replica)
    # a deployment's shape (ratio, each role's parallelism, connector) is part of its id, swept or not
    ident = {**_no_name(combo), **({"pd": dep.identity()} if dep else {})}
    return ServeConfig(id=grid.params_id(ident), params=combo, argv=argv, env=env,
                       shape=replace(shape, pd_gpus=dep.gpus) if dep else shape, label=grid.combo_label(combo),
                       rule=rule_for(combo, spec.campaign.placement), deployment=dep)


def role_servers(serve: ServeConfig, spec: CampaignSpec) -> list[Any]:
    """The servers of a P/D configuration (`raysweep.campaign.pd.RoleInstance`, prefill first); [] otherwise."""
    if serve.deployment is None:
        return []
    shared = {k: v for k, v in serve.params.items() if not grid.is_own_key(str(k))}
    return serve.deployment.instances(spec.serve_argv, shared, serve.env)


def serve_points(spec: CampaignSpec, s: ServeConfig, benches: list[BenchPoint]
                 ) -> tuple[list[PointRun], list[tuple[str, str]], int]:
    """A configuration's runs, its SLA searches (serve id, bench id) and the pairs its link skips."""
    points: list[PointRun] = []
    searches, skipped = [], 0
    for b in benches:
        if not grid.link_matches(s.params, b.params, spec.campaign.link):
            skipped += 1
            continue
        workload = getattr(spec.campaign.bench, "workload", None) is not None
        if spec.campaign.sla is not None:  # the search runs after the levels, if any, and starts from them
            searches.append((s.id, b.id))
        if spec.campaign.sla is not None and not workload:  # it starts at unbounded load; it adds the other probes
            points.extend(hooks.sla().probe_runs(spec, s, b, math.inf))  # raysweep.sla.plan, lent
        elif workload:  # the levels come after these two
            points.extend(PointRun(id=point_id(s.id, e.id, r), serve=s, bench=e, run=r)
                          for e in endpoint_benches(spec, b) for r in range(first_runs(spec)))
        else:
            points.extend(PointRun(id=point_id(s.id, b.id, r), serve=s, bench=b, run=r)
                          for r in range(first_runs(spec)))
    return points, searches, skipped


def _workload_bench(spec: CampaignSpec, base: BenchPoint, params: dict[str, Any], role: str, value: int
                    ) -> BenchPoint:
    wl = workload_of(spec.campaign)
    assert wl is not None
    # A level equal to an endpoint's value (max_concurrency 1 when the range is narrow) is a run of its own, as
    # vLLM's sweep runs it again: its id must not be the serial point's.
    salt = {"workload_level": value} if role == LEVEL else {}
    return BenchPoint(id=grid.params_id({**_no_name(params), **salt}), params=params,
                      argv=grid.apply_to_cmd(spec.bench_argv, params),
                      label=f"{base.label}-{role}-{wl.variable}={value}" if base.label
                      else f"{role}-{wl.variable}={value}",
                      workload_of=base.id, workload_role=role, workload_value=value)


def endpoint_benches(spec: CampaignSpec, base: BenchPoint) -> list[BenchPoint]:
    """`bench.workload`: the serial and batch points of a bench point, as vLLM's sweep runs them: the base with
    max_concurrency 1 and the variable 1, and with both at the point's prompt count."""
    wl = workload_of(spec.campaign)
    assert wl is not None
    size = dataset_size(base.params, base.argv)
    return [_workload_bench(spec, base, {**base.params, CONCURRENCY: n, wl.variable: n}, role, n)
            for role, n in ((SERIAL, 1), (BATCH, size))]


def level_bench(spec: CampaignSpec, base: BenchPoint, value: int) -> BenchPoint:
    """`bench.workload`: a level between the endpoints, the base with only the variable set."""
    wl = workload_of(spec.campaign)
    assert wl is not None
    return _workload_bench(spec, base, {**base.params, wl.variable: value}, LEVEL, value)


def _no_name(combo: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in combo.items() if k != grid.BENCHMARK_NAME_KEY}


def dry_run_text(plan: Plan, render_bench: Callable[[list[str]], list[str]] | None = None,
                 describe_serve: Callable[[ServeConfig], list[str]] | None = None) -> str:
    """Every server command, every benchmark command and the run counts, secrets masked;
    `describe_serve` gives the lines that say where a server goes and what each node runs."""
    c = plan.spec.campaign
    precision = getattr(c.bench, "precision", None) if c.bench is not None else None
    runs = f"{precision.min_runs} to {precision.max_runs}" if precision is not None else c.runs
    lines = [f"Campaign {c.name}: {len(plan.serves)} server config(s) x {len(plan.benches)} bench point(s) "
             + ("x 2 (serial, batch) " if getattr(c.bench, "workload", None) is not None else "")
             + f"x {runs} run(s) = {len(plan.points)} run(s)"
             + (" to start with" if precision is not None or getattr(c.bench, "workload", None) is not None else "")
             + (f" ({plan.skipped_pairs} pair(s) skipped by link)" if plan.skipped_pairs else "")]
    if c.tune is not None:  # candidates come from the sampler (raysweep.tune.dry_run_lines)
        lines = [f"Campaign {c.name}: tuning; each candidate runs {len(plan.benches)} bench point(s) x {c.runs} run(s)"
                 + (f" ({len(plan.serves)} candidate(s) already in the ledger)" if plan.serves else "")]
    if plan.spec.offline:
        lines.append("Mode: startup (each run is `vllm bench startup` below, to its end: the engine's cold and warm "
                     "starts timed, no server)" if c.mode == "startup" else
                     "Mode: offline (each run is the command below, to its end, with --output-json added)")
    else:
        assert c.bench is not None
        lines.append("Bench backend: " + ("native (raysweep's streaming client in Ray actors, reading the options "
                                          "below)" if c.bench.backend == "native"
                                          else "command (the command below, run as is)"))
    env = grid.mask_env(plan.spec.serve_env)
    if env:
        lines.append(("Environment: " if plan.spec.offline else "Server environment: ")
                     + " ".join(f"{k}={v}" for k, v in env.items()))
    for s in plan.serves:
        pts = plan.points_of(s.id)
        if not pts:
            continue
        sh = s.shape
        lines += ["", f"[{'config' if plan.spec.offline else 'server'} {s.id}] {s.label}",
                  f"  shape: {sh.describe()} gpus={sh.gpu_count}"]
        lines += describe_serve(s) if describe_serve else [
            f"  command: {grid.shell_join(s.display_argv())} "
            + ("--output-json <result file>" if plan.spec.offline else "--host <node ip> --port <free port>")]
        if plan.spec.offline:
            lines.append(f"  x {len(pts)} run(s)")
            continue
        seen: set[str] = set()
        for p in pts:
            if p.bench.id in seen:
                continue
            seen.add(p.bench.id)
            runs = sum(1 for q in pts if q.bench.id == p.bench.id)
            argv = grid.mask_argv(render_bench(p.bench.argv) if render_bench else p.bench.argv)
            lines += [f"  [bench {p.bench.id}] {p.bench.label}  x {runs} run(s)",
                      f"    command: {grid.shell_join(argv)}"]
    if c.serve is not None and c.bench is not None and (c.serve.cpu_affinity is not None
                                                         or c.bench.cpu_affinity is not None):
        from raysweep.procs import cpu_set, cpu_text

        def cpus(v: list[int] | str | None) -> str:
            return "any" if v is None else cpu_text(cpu_set(v) or ())

        lines += ["", f"CPU affinity: server on CPU(s) {cpus(c.serve.cpu_affinity)}, client actors on CPU(s) "
                      f"{cpus(c.bench.cpu_affinity)} (on each node)"]
    if precision is not None:
        from raysweep.maths.precision import describe

        lines += ["", (f"Precision: {describe(precision)}; the runs above are the first {precision.min_runs} of "
                       "each point, the others are added one at a time to one server start (the last, with "
                       "order.instances); for verdicts over several starts, `design:` (docs/design.md)")]
    lines += ["", *workload_lines(plan.spec, len(plan.points))] if workload_lines(plan.spec) else []
    if not plan.spec.offline and c.tune is None and c.sla is None:
        from raysweep.maths.order import order_lines, order_of
        from raysweep.plan.design import dry_run_lines as design_lines

        first = next((s for s in plan.serves if plan.points_of(s.id)), None)
        benches = list(dict.fromkeys(p.bench.id for p in plan.points_of(first.id))) if first is not None else []
        designed = design_lines(plan.spec, [s.label for s in plan.serves], None, len(benches))
        lines += ["", *designed] if designed else []
        said = order_lines(order_of(c), [s.label for s in plan.serves], benches, first_runs(plan.spec),
                           first.id if first is not None else "")
        if designed:  # the design's lines above say the starts and their blocks
            said = [line for line in said if not line.startswith("Instances:")]
        lines += ["", *said] if said else []
    if c.warmup:
        lines += ["", f"Warmup: {c.warmup} prompt(s) after every server start (not recorded)"]
    if c.sla is not None:  # SLA search's own lines (raysweep.sla.plan, lent)
        lines += ["", *hooks.sla().dry_run_lines(c)]
    return "\n".join(lines)

"""The plan: server configurations x benchmark points x runs, each with a stable id, and the dry-run text.

Ids are hashes of canonical parameters, so the order of keys or grid values does not matter, and adding a
value to a grid adds points without touching the ids of the others. The campaign's fingerprint covers
what gives finished points their meaning (the commands and environments), not the grids.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from raysweep import grid
from raysweep.campaign import CampaignSpec
from raysweep.errors import CampaignError

__all__ = ["BenchPoint", "Plan", "PointRun", "ServeConfig", "Shape", "build_plan", "dry_run_text", "fingerprint",
           "meaning", "point_id", "shape_of"]

_SHAPE_FLAGS = {
    "tp": ("tensor_parallel_size", ("--tensor-parallel-size", "--tensor_parallel_size", "-tp")),
    "pp": ("pipeline_parallel_size", ("--pipeline-parallel-size", "--pipeline_parallel_size", "-pp")),
    "dp": ("data_parallel_size", ("--data-parallel-size", "--data_parallel_size", "-dp")),
}


@dataclass(frozen=True)
class Shape:
    """How many GPUs a server configuration takes: tensor x pipeline x data parallel sizes."""

    tp: int = 1
    pp: int = 1
    dp: int = 1

    @property
    def gpu_count(self) -> int:
        return self.tp * self.pp * self.dp


@dataclass(frozen=True)
class ServeConfig:
    """One server configuration: its parameters, the full command and environment, and its GPU shape."""

    id: str
    params: dict[str, Any]
    argv: list[str]
    env: dict[str, str]
    shape: Shape
    label: str

    def display_argv(self) -> list[str]:
        return grid.mask_argv(self.argv)


@dataclass(frozen=True)
class BenchPoint:
    """One benchmark point: its parameters and the benchmark command with them applied."""

    id: str
    params: dict[str, Any]
    argv: list[str]
    label: str


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
    _by_serve: dict[str, list[PointRun]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for p in self.points:
            self._by_serve.setdefault(p.serve.id, []).append(p)

    def points_of(self, serve_id: str) -> list[PointRun]:
        return self._by_serve.get(serve_id, [])

    def point(self, point_id: str) -> PointRun | None:
        return next((p for p in self.points if p.id == point_id), None)


def point_id(serve_id: str, bench_id: str, run: int) -> str:
    return hashlib.sha256(f"{serve_id}/{bench_id}/{run}".encode()).hexdigest()[:16]


def shape_of(params: dict[str, Any], argv: list[str]) -> Shape:
    """The GPU shape from the parameters, else from the flags of the base command, else 1 x 1 x 1."""
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
    return Shape(**sizes)


def meaning(spec: CampaignSpec) -> dict[str, Any]:
    """What gives a finished point its meaning: commands, environments, bench backend (secrets masked)."""
    c = spec.campaign
    return {
        "serve_cmd": grid.mask_argv(spec.serve_argv),
        "serve_env": grid.mask_env(spec.serve_env),
        "bench_backend": c.bench.backend,
        "bench_cmd": grid.mask_argv(spec.bench_argv),
        "bench_env": grid.mask_env(spec.bench_env),
        "after_bench_cmd": grid.mask_argv(spec.after_bench_argv) if spec.after_bench_argv else None,
    }


def fingerprint(spec: CampaignSpec) -> str:
    """A hash of `meaning(spec)`: it changes only when finished points would mean something else."""
    return hashlib.sha256(json.dumps(meaning(spec), sort_keys=True).encode()).hexdigest()[:16]


def build_plan(spec: CampaignSpec) -> Plan:
    """Expand a campaign into server configs, bench points and runs (linked pairs only)."""
    serves = []
    for combo in spec.serve_combos:
        argv = grid.apply_to_cmd(spec.serve_argv, combo)
        serves.append(ServeConfig(id=grid.params_id(_no_name(combo)), params=combo, argv=argv,
                                  env=dict(spec.serve_env), shape=shape_of(combo, spec.serve_argv),
                                  label=grid.combo_label(combo)))
    benches = [BenchPoint(id=grid.params_id(_no_name(c)), params=c, argv=grid.apply_to_cmd(spec.bench_argv, c),
                          label=grid.combo_label(c)) for c in spec.bench_combos]
    points, skipped = [], 0
    for s in serves:
        for b in benches:
            if not grid.link_matches(s.params, b.params, spec.campaign.link):
                skipped += 1
                continue
            points.extend(PointRun(id=point_id(s.id, b.id, r), serve=s, bench=b, run=r)
                          for r in range(spec.campaign.runs))
    return Plan(spec=spec, serves=serves, benches=benches, points=points, fingerprint=fingerprint(spec),
                skipped_pairs=skipped)


def _no_name(combo: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in combo.items() if k != grid.BENCHMARK_NAME_KEY}


def dry_run_text(plan: Plan, render_bench: Callable[[list[str]], list[str]] | None = None) -> str:
    """Every server command, every benchmark command and the run counts, secrets masked."""
    c = plan.spec.campaign
    lines = [f"Campaign {c.name}: {len(plan.serves)} server config(s) x {len(plan.benches)} bench point(s) "
             f"x {c.runs} run(s) = {len(plan.points)} run(s)"
             + (f" ({plan.skipped_pairs} pair(s) skipped by link)" if plan.skipped_pairs else "")]
    env = grid.mask_env(plan.spec.serve_env)
    if env:
        lines.append("Server environment: " + " ".join(f"{k}={v}" for k, v in env.items()))
    for s in plan.serves:
        pts = plan.points_of(s.id)
        if not pts:
            continue
        sh = s.shape
        lines += ["", f"[server {s.id}] {s.label}",
                  f"  shape: tp={sh.tp} pp={sh.pp} dp={sh.dp} gpus={sh.gpu_count}",
                  f"  command: {grid.shell_join(s.display_argv())} --host <node ip> --port <free port>"]
        seen: set[str] = set()
        for p in pts:
            if p.bench.id in seen:
                continue
            seen.add(p.bench.id)
            runs = sum(1 for q in pts if q.bench.id == p.bench.id)
            argv = grid.mask_argv(render_bench(p.bench.argv) if render_bench else p.bench.argv)
            lines += [f"  [bench {p.bench.id}] {p.bench.label}  x {runs} run(s)",
                      f"    command: {grid.shell_join(argv)}"]
    if c.warmup:
        lines += ["", f"Warmup: {c.warmup} prompt(s) after every server start (not recorded)"]
    return "\n".join(lines)

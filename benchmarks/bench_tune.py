"""Does tuning pay? A `tune:` campaign against the full grid, on a simulated 4 x 8 GPU cluster.

No Ray and no servers. The real scheduler (`raysweep.place.scheduler.Scheduler`), the real tuning work
(`raysweep.tune.TuneWork`, `TunedCluster`: Optuna ask-and-tell, successive halving, budget) and a real
ledger run against `SimCluster`, a discrete-event cluster whose stand-in servers answer every bench point
from a known response surface of the serve parameters, with noise:

* space: tensor_parallel_size {1, 2, 4, 8} x max_num_seqs {64, 128, 256, 512} x max_num_batched_tokens
  {2048, 4096, 8192, 16384} x async_scheduling {false, true} = 128 configurations (the grid);
* bench grid: max_concurrency {8, 32, 128, 512}, one run each;
* surface: a replica's KV cache holds 40 x tp^1.4 sequences; a batch is min(concurrency, max_num_seqs);
  beyond the cache it thrashes (preemptions); a decode step costs 6 / tp^0.5 + 0.06 x batch / tp^0.85 ms
  plus 1.5 x sqrt(tp - 1) ms of all-reduce, and chunked prefill is best near 3072 x sqrt(tp) batched tokens
  (quadratic in log2 around it); async
  scheduling gains 5 % when the batch is large. output_throughput = batch / step, with 3 % log-normal noise
  per point. The best per GPU is tp 4 with max_num_seqs 256 (its KV cache), 4096-8192 batched tokens;
* durations: a server starts in 90 + 20 x tp s; a point takes 45 to 75 s. GPU-hours = GPUs x time held.

Single objective: maximize output_throughput per GPU (best over the bench points), budget 26 % of the grid's
GPU-hours (the dry run's estimate of the grid gives it), early stopping eta 3. Success: the configuration
the tuner ranks first has a true objective within 5 % of the true objective of the grid's first. Pareto:
tokens/s/user (output_throughput / max_concurrency) against tokens/s/GPU, budget 26 %, early stopping by
domination (eta 3: rungs of 1 and 2 bench points, both ends of the load first), after 16 start-up candidates
the surrogate's proposals (`tune.pareto_model`; `--no-pareto-model`: the sampler's), the last 15 % of the
budget on neighbours of the front; the hypervolume of the (configuration, bench point) pairs actually run
(`hv_ratio_measured`: a stopped candidate did not run all of its points) against the grid's (true values,
reference point 0, 0). `hv_ratio` is looser: every pair of every configuration the tuner tried.

    .venv/bin/python benchmarks/bench_tune.py [--seeds 20] [--first-seed 0] [--mode single|pareto|both]
                                              [--no-pareto-model] [--json FILE]
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import raysweep.modes  # noqa: F401 - every mode registered (raysweep.drive.hooks), as the faces do
from raysweep.campaign import campaign_from_dict
from raysweep.drive.driver import open_campaign
from raysweep.maths.pareto import hypervolume as tune_hypervolume
from raysweep.place.placement import Layout, NodeInfo
from raysweep.place.scheduler import Scheduler
from raysweep.plan.plan import ServeConfig
from raysweep.record.directory import CampaignDir
from raysweep.tune import TunedCluster, TuneWork

SPACE = {"tensor_parallel_size": [1, 2, 4, 8], "max_num_seqs": [64, 128, 256, 512],
         "max_num_batched_tokens": [2048, 4096, 8192, 16384], "async_scheduling": [False, True]}
CONCURRENCY = [8, 32, 128, 512]
NOISE = 0.03


def true_throughput(p: dict[str, Any], c: int) -> float:
    """output_throughput (tokens/s) of a configuration at concurrency c, without noise."""
    tp, mns, mbt = p["tensor_parallel_size"], p["max_num_seqs"], p["max_num_batched_tokens"]
    kv = 40 * tp ** 1.4
    batch = min(c, mns)
    eff = min(batch, kv)
    thrash = 1 + 0.8 * max(0.0, batch - kv) / kv
    step_ms = 6 / tp ** 0.5 + 0.06 * eff / tp ** 0.85 + 1.5 * (tp - 1) ** 0.5  # compute + all-reduce
    prefill = max(0.3, 1 - 0.07 * math.log2(mbt / (3072 * math.sqrt(tp))) ** 2)
    boost = 1.05 if p["async_scheduling"] and batch >= 64 else 1.0
    return eff / step_ms * 1000 * prefill * boost / thrash


def grid_configs() -> list[dict[str, Any]]:
    return [dict(zip(SPACE, values)) for values in itertools.product(*SPACE.values())]


def server_start_s(p: dict[str, Any]) -> float:
    return 90 + 20 * p["tensor_parallel_size"]


def point_s(rng: random.Random) -> float:
    return rng.uniform(45, 75)


class SimCluster:
    """A discrete-event cluster of `nodes` x `gpus` GPUs; a started configuration's stand-in server answers
    its points (most informative first, as the driver orders them) from the surface, one after another,
    and writes each result to the ledger; an abort takes effect at the next point boundary."""

    def __init__(self, nodes: int, gpus: int, rng: random.Random) -> None:
        self.work: Any = None
        self.rng = rng
        self.now = 0.0
        self.node_list = [NodeInfo(f"node-{i}", f"10.0.0.{i + 1}", gpus, 64.0) for i in range(nodes)]
        self.events: list[tuple[float, int, str]] = []
        self.queue: dict[str, list[Any]] = {}
        self.aborted: set[str] = set()
        self.ended: list[tuple[str, str]] = []
        self.seq = itertools.count()
        self.measured: list[tuple[dict[str, Any], int, float]] = []  # (params, concurrency, measured value)

    def clock(self) -> float:
        return self.now

    def nodes(self) -> list[NodeInfo]:
        return self.node_list

    def start(self, serve: ServeConfig, layout: Layout, node_ids: list[str]) -> None:
        runnable = {r.point_id for r in self.work.ledger.runnable(serve.id, 2)}
        points = self.work.in_order([p for p in self.work.plan.points_of(serve.id) if p.id in runnable])
        self.queue[serve.id] = points
        self._next(serve.id, server_start_s(serve.params))

    def _next(self, sid: str, extra: float = 0.0) -> None:
        heapq.heappush(self.events, (self.now + extra + point_s(self.rng), next(self.seq), sid))

    def finished(self) -> list[tuple[str, str]]:
        out, self.ended = self.ended, []
        return out

    def abort(self, serve_id: str, reason: str) -> None:
        self.aborted.add(serve_id)

    def wait(self, timeout_s: float) -> None:
        if not self.events:
            return
        self.now, _, sid = heapq.heappop(self.events)
        point = self.queue[sid].pop(0)
        self._record(point)
        if sid in self.aborted or not self.queue[sid]:
            self.ended.append((sid, "aborted" if sid in self.aborted else "finished"))
            del self.queue[sid]
        else:
            self._next(sid)

    def _record(self, point: Any) -> None:
        c = int(point.bench.params["max_concurrency"])
        value = true_throughput(point.serve.params, c) * math.exp(self.rng.gauss(0, NOISE))
        self.measured.append((point.serve.params, c, value))
        rel = f"points/{point.id}.json"
        path = self.work.output_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"output_throughput": value, "max_concurrency": c}))
        self.work.ledger.mark_running(point.id, "sim")
        self.work.ledger.mark_done(point.id, rel)

    def join(self) -> None:
        pass


def campaign(mode: str, seed: int, budget_gpu_h: float, pareto_model: bool = True) -> dict[str, Any]:
    tune: dict[str, Any] = {"space": {k: {"choices": v} for k, v in SPACE.items()},
                            "budget": {"gpu_hours": budget_gpu_h}, "seed": seed}
    if not pareto_model:
        tune["pareto_model"] = False
    if mode == "single":
        tune["objective"] = {"metric": "output_throughput", "per": "gpu"}
    else:
        tune["pareto"] = [{"metric": "output_throughput", "per": "user"},
                          {"metric": "output_throughput", "per": "gpu"}]
    return {"name": f"tune-{mode}-{seed}", "runs": 1,
            "serve": {"cmd": "vllm serve m"},
            "bench": {"cmd": "vllm bench serve --model m --dataset-name random --num-prompts 200",
                      "params": {"grid": {"max_concurrency": CONCURRENCY}}},
            "tune": tune}


def grid_gpu_hours(rng: random.Random) -> float:
    """The full grid's GPU-hours: every configuration started once and run through every point."""
    return sum(p["tensor_parallel_size"] * (server_start_s(p) + sum(point_s(rng) for _ in CONCURRENCY))
               for p in grid_configs()) / 3600


def objective_single(p: dict[str, Any]) -> float:
    return max(true_throughput(p, c) for c in CONCURRENCY) / p["tensor_parallel_size"]


def pairs(p: dict[str, Any]) -> list[tuple[float, float]]:
    return [(true_throughput(p, c) / c, true_throughput(p, c) / p["tensor_parallel_size"]) for c in CONCURRENCY]


def hypervolume(points: list[tuple[float, float]]) -> float:
    """Area dominated by the points (both maximized) above the reference point (0, 0)."""
    return tune_hypervolume(points, ["maximize", "maximize"], (0.0, 0.0))


def tune_once(mode: str, seed: int, fraction: float, pareto_model: bool = True) -> dict[str, Any]:
    rng = random.Random(seed)
    grid_h = grid_gpu_hours(random.Random(seed + 10_000))
    root = Path(tempfile.mkdtemp(prefix="bench-tune-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    spec = campaign_from_dict(campaign(mode, seed, fraction * grid_h, pareto_model), base_dir=root)
    plan, ledger = open_campaign(spec, CampaignDir(root / "out"))
    sim = SimCluster(nodes=4, gpus=8, rng=rng)
    run_dir = CampaignDir.around(root / "out", ledger)
    work = sim.work = TuneWork(plan, run_dir, lambda kind, **d: None, with_gpus=True, clock=sim.clock)
    Scheduler(TunedCluster(sim, work), work, lambda kind, **d: None, max_servers=None, clock=sim.clock).run()
    rows = ledger.candidates()
    ledger.close()
    states = {s: sum(1 for r in rows if r["state"] == s) for s in ("complete", "pruned", "failed", "refused")}
    out: dict[str, Any] = {"seed": seed, "grid_gpu_h": grid_h, "used_gpu_h": work.gpu_hours(),
                           "gpu_fraction": work.gpu_hours() / grid_h, "candidates": len(rows), **states,
                           "sim_hours": sim.now / 3600}
    if mode == "single":
        grid_best = max(grid_configs(), key=lambda p: objective_single(p) * math.exp(rng.gauss(0, NOISE)))
        done = [r for r in rows if r["state"] == "complete"]
        pick = max(done, key=lambda r: r["objective"][0])
        out.update(grid_best=objective_single(grid_best), true_best=max(map(objective_single, grid_configs())),
                   tuned=objective_single(pick["params"]), tuned_params=pick["params"])
        out["ratio"] = out["tuned"] / out["grid_best"]
        out["within_5pct"] = out["ratio"] >= 0.95
    else:
        grid_hv = hypervolume([xy for p in grid_configs() for xy in pairs(p)])
        seen = {json.dumps(p, sort_keys=True): p for p, _, _ in sim.measured}
        tuned_hv = hypervolume([xy for p in seen.values() for xy in pairs(p)])
        ran = {(json.dumps(p, sort_keys=True), c): p for p, c, _ in sim.measured}
        ran_hv = hypervolume([pairs(p)[CONCURRENCY.index(c)] for (_, c), p in ran.items()])
        out.update(grid_hv=grid_hv, tuned_hv=tuned_hv, hv_ratio=tuned_hv / grid_hv, hv_ratio_measured=ran_hv / grid_hv)
    return out


def summary(mode: str, runs: list[dict[str, Any]]) -> str:
    fr = [r["gpu_fraction"] for r in runs]
    lines = [f"## {mode}: {len(runs)} seeds",
             f"GPU-hours used / grid: median {statistics.median(fr):.1%}, max {max(fr):.1%}",
             f"candidates: median {statistics.median(r['candidates'] for r in runs)}, "
             f"pruned median {statistics.median(r['pruned'] for r in runs)}"]
    if mode == "single":
        ratios = [r["ratio"] for r in runs]
        lines.append(f"within 5 % of the grid's best: {sum(r['within_5pct'] for r in runs)}/{len(runs)} "
                     f"(tuned / grid ratio median {statistics.median(ratios):.3f}, min {min(ratios):.3f})")
    else:
        hm = [r["hv_ratio_measured"] for r in runs]
        lines.append(f"hypervolume of the bench points run / grid's: median {statistics.median(hm):.3f}, "
                     f"min {min(hm):.3f}, >= 0.95 in {sum(h >= 0.95 for h in hm)}/{len(runs)}")
        hv = [r["hv_ratio"] for r in runs]
        lines.append(f"  counting every bench point of each configuration tried: median {statistics.median(hv):.3f}, "
                     f"min {min(hv):.3f}, >= 0.95 in {sum(h >= 0.95 for h in hv)}/{len(runs)}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--mode", choices=["single", "pareto", "both"], default="both")
    ap.add_argument("--single-budget", type=float, default=0.26, help="GPU-hours budget as a fraction of the grid's")
    ap.add_argument("--pareto-budget", type=float, default=0.26, help="GPU-hours budget as a fraction of the grid's")
    ap.add_argument("--no-pareto-model", action="store_true",
                    help="Pareto: every candidate from the sampler (tune.pareto_model false), for comparison")
    ap.add_argument("--json", type=Path, metavar="FILE")
    args = ap.parse_args()
    modes = ["single", "pareto"] if args.mode == "both" else [args.mode]
    results = {}
    t0 = time.monotonic()
    for mode in modes:
        budget = args.single_budget if mode == "single" else args.pareto_budget
        results[mode] = [tune_once(mode, s, budget, not args.no_pareto_model)
                         for s in range(args.first_seed, args.first_seed + args.seeds)]
        print(summary(mode, results[mode]) + "\n", flush=True)
    print(f"({time.monotonic() - t0:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()

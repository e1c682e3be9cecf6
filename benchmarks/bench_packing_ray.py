"""Packing by the real driver on a real Ray cluster with simulated GPUs, with stand-in servers.

`benchmarks/bench_packing.py` simulates the packing policy with modeled durations. This benchmark runs a
campaign through the real `raysweep.drive.driver.run_campaign` instead, on a local Ray cluster
(`ray.cluster_utils.Cluster`): a head without GPUs and 4 nodes x 8 simulated GPUs. The servers are
`tests/standin/server.py` and the benchmarks `tests/standin/bench.py`, so nothing computes, but every
placement group, host actor, guard, server process, health check, cache reset, bench process and stop is
real.

The campaign has `--configs` server configurations with equal numbers of 1, 2, 4, 8 and 16 GPUs
(tensor_parallel_size 1 to 8; 16 is tp 8 x pp 2, one rank on each of two nodes), in shuffled plan order,
and `--points` bench points each (runs 1). Durations are those of bench_packing.py divided by
`--time-scale`: each configuration's server start (the stand-in's `--startup-delay`) is 60-180 s, and its
point time 40 s x (1 + log2(GPUs) / 4) x uniform(0.5, 1.5), scaled. A point sends `--prompts` requests
one at a time (`--max-concurrency 1`) to a server that sleeps the stand-in's `--request-delay` (point
time / prompts) on each, so a point takes about its point time. The nominal duration of a configuration
is its start plus its points' time. All configurations have the same number of points, so the policy's
work-first order reduces to largest GPU count first here.

Everything is measured from the ledger afterwards:
- occupancy of a configuration: its first server's `started_at` to its last server's `stopped_at` (the
  server start and stop included);
- makespan: first server start to last server stop; lower bound: max(GPU-seconds / GPUs, longest
  occupancy); the ratio, GPU utilisation, and vLLM's sweep order (one configuration at a time: the sum of
  the occupancies);
- the same campaign replayed in bench_packing's simulation with the measured occupancies as durations
  (the policy with no scheduling delay) and with the nominal durations (no delay and no overhead at all);
- where the time above the nominal goes, per configuration: server start (`ready_at - started_at -
  startup delay`), ready to first point, the first point and the later points beyond prompts x delay
  (the first one also creates the configuration's client actor), between points (the cache reset), last
  point end to stopped (a last cache reset and the server's stop); and the time above the nominal by GPU
  count, with how many configurations ran alongside (every server and bench shares the 2 cores);
- the scheduler's refill delay: for each configuration started after others finished, the time from the
  moment the last of the GPUs it ends up on became free (the `stopped_at` of the server that held it
  before) to its own `started_at`. That spans the stop's bookkeeping, freeing the placement group, the
  scheduling loop's wake, the packer, the new placement group and the host actor's creation.

Afterwards the cluster is shut down and its temp dir removed, and every process of the run is checked to
be gone: the stand-ins (pids from their `--pid-file`), the guards (pids from the ledger's ranks), and any
process with this run's pid file in its command line. The exit status is 1 if one is left or a point
did not finish.

    .venv/bin/python benchmarks/bench_packing_ray.py [--seed 1] [--configs 20] [--points 3] [--prompts 4]
        [--time-scale 15] [--keep DIR] [--json FILE]
    .venv/bin/python benchmarks/bench_packing_ray.py --analyse DIR [same options]   # re-measure a kept run
"""

from __future__ import annotations

import os

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ["RAY_AUTH_MODE"] = "disabled"
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

import argparse
import json
import math
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests")]

import itertools

import bench_packing
import psutil
from helpers import standin_campaign

from raysweep import procs
from raysweep.ledger import Ledger, PointRow, ServerRow
from raysweep.plan.plan import Shape
from raysweep.record.directory import CampaignDir

NODES, GPUS_PER_NODE = 4, 8
GPUS = NODES * GPUS_PER_NODE
SHAPES: dict[int, dict[str, int]] = {1: {"tensor_parallel_size": 1}, 2: {"tensor_parallel_size": 2},
                                     4: {"tensor_parallel_size": 4}, 8: {"tensor_parallel_size": 8},
                                     16: {"tensor_parallel_size": 8, "pipeline_parallel_size": 2}}


@dataclass(frozen=True)
class Config:
    index: int
    gpus: int
    startup_s: float        # the stand-in's --startup-delay
    request_s: float        # the stand-in's --request-delay
    nominal_s: float        # startup + points x prompts x request delay

    def params(self) -> dict[str, Any]:
        # max_num_seqs only makes each configuration's parameters unique; the stand-in ignores it
        return {**SHAPES[self.gpus], "startup_delay": self.startup_s, "request_delay": self.request_s,
                "max_num_seqs": 100 + self.index}

    def shape(self) -> Shape:
        p = SHAPES[self.gpus]
        return Shape(p["tensor_parallel_size"], p.get("pipeline_parallel_size", 1))


def make_campaign(n: int, seed: int, scale: float, points: int, prompts: int) -> list[Config]:
    """bench_packing's duration model divided by `scale`, in shuffled plan order."""
    rng = random.Random(seed)
    sizes = [sorted(SHAPES)[i % len(SHAPES)] for i in range(n)]
    rng.shuffle(sizes)
    out = []
    for i, g in enumerate(sizes):
        startup = round(rng.uniform(60, 180) / scale, 2)
        point_s = 40.0 * (1 + math.log2(g) / 4) * rng.uniform(0.5, 1.5) / scale
        request = round(point_s / prompts, 3)
        out.append(Config(i, g, startup, request, round(startup + points * prompts * request, 3)))
    return out


# ---------------------------------------------------------------------------------------------------
# Running the campaign
# ---------------------------------------------------------------------------------------------------

def run(configs: list[Config], work: Path, points: int, prompts: int) -> dict[str, Any]:
    """Start the cluster, run the campaign with the real driver, shut everything down; return timings."""
    import ray
    from ray.cluster_utils import Cluster

    import raysweep.modes  # noqa: F401 - every mode registered (raysweep.drive.hooks), as the faces do
    from raysweep.campaign import load_campaign
    from raysweep.drive.driver import run_campaign

    pid_file = work / "standin-pids"
    f = standin_campaign(work, name="packing-ray", server_args=f"--pid-file {pid_file}",
                         bench_args="--max-concurrency 1",
                         serve_params=[c.params() for c in configs],
                         bench_params={"grid": {"random_input_len": [16 * 2 ** i for i in range(points)],
                                                "num_prompts": [prompts]}},
                         serve={"ready_timeout_s": 120}, bench={"timeout_s": 300})
    spec = load_campaign(f)
    out = Path(spec.campaign.output_dir or "")
    temp_dir = f"/tmp/rs-pk{os.getpid()}"
    os.makedirs("/tmp/ray", exist_ok=True)  # Cluster writes its address file there whatever temp_dir says
    t0 = time.time()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 4, "num_gpus": 0, "include_dashboard": False, "temp_dir": temp_dir})
    timings: dict[str, Any] = {}
    events: list[str] = []
    try:
        for i in range(NODES):
            # 8 host actors (0.5 CPU each) fit a node; client actors (0.1 CPU) go anywhere
            cluster.add_node(num_cpus=5, num_gpus=GPUS_PER_NODE, runtime_env_dir_name=f"runtime_resources_w{i}")
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, namespace="raysweep", log_to_driver=False)
        timings["cluster_start_s"] = time.time() - t0

        def on_event(kind: str, **data: Any) -> None:
            if kind in ("server_failed", "point_failed", "node_lost", "config_failed"):
                events.append(f"{kind}: {data.get('error') or data.get('reason')}")
                print(f"  {kind}: {data.get('error') or data.get('reason')}", file=sys.stderr)
            elif kind == "server_stopped":
                print(f"  {time.time() - t1:6.1f} s: server {data['server_id']} stopped", file=sys.stderr)

        t1 = time.time()
        summary = run_campaign(spec, CampaignDir(out), on_event=on_event)
        timings["campaign_wall_s"] = time.time() - t1
        timings["counts"] = summary.counts
        timings["stopped_early"] = summary.stopped_early
    finally:
        t2 = time.time()
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
        timings["cluster_stop_s"] = time.time() - t2
    timings["events"] = events
    # every stand-in process we started (each rank's server, by its own --pid-file) and every guard is gone
    standins = [int(x) for x in pid_file.read_text().split()] if pid_file.exists() else []
    led = Ledger.open_existing(out)
    try:
        guards = [(r["pid"], r.get("pid_create_time")) for s in led.servers() for r in s.rank_list() if r.get("pid")]
    finally:
        led.close()
    procs.wait_for(lambda: not any(procs.is_alive(p, None) for p in standins)
                   and not any(procs.is_alive(p, c) for p, c in guards), 30)
    timings["standin_pids"] = len(standins)
    timings["guard_pids"] = len(guards)
    timings["left_alive"] = [p for p in standins if procs.is_alive(p, None)] + \
                            [p for p, c in guards if procs.is_alive(p, c)]
    # and no process at all still carries this run's pid file in its command line (one that died before
    # writing its pid would be missed above)
    timings["left_alive"] += [p.pid for p in psutil.process_iter(["cmdline"])
                              if str(pid_file) in " ".join(p.info["cmdline"] or []) and p.pid != os.getpid()]
    timings["out"] = out
    return timings


# ---------------------------------------------------------------------------------------------------
# Measuring from the ledger
# ---------------------------------------------------------------------------------------------------

def _stats(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "max": max(xs), "min": min(xs)} if xs else {}


def refill_delays(servers: list[ServerRow]) -> tuple[list[float], list[float], int]:
    """For each server started on GPUs that another server used before it: its start minus the moment the
    last of its GPUs was freed (that server's stop). Also the start offsets of the servers of the first wave
    (on GPUs nobody had used), from the first start, and how many servers were left out: a server that failed
    before its GPUs were recorded, and any later server of the same configuration (its delay would include
    the failure). Raises if two servers that overlap in time held the same GPU."""
    spans: dict[tuple[str, str], list[tuple[float, float]]] = {}
    gpus_of = {s.server_id: [(r["node_id"], g) for r in s.rank_list() for g in (r.get("gpu_ids") or "").split(",") if g]
               for s in servers}
    for s in servers:
        for key in gpus_of[s.server_id]:
            spans.setdefault(key, []).append((s.started_at, s.stopped_at or math.inf))
    for key, iv in spans.items():
        iv.sort()
        for (a0, a1), (b0, _) in itertools.pairwise(iv):
            if b0 < a1:
                raise RuntimeError(f"GPU {key} held by two servers at once ({a0:.1f}-{a1:.1f} and from {b0:.1f})")
    first = min(s.started_at for s in servers)
    refill, wave, seen, left_out = [], [], set(), 0
    for s in sorted(servers, key=lambda s: s.started_at):
        again, mine = s.serve_id in seen, gpus_of[s.server_id]
        seen.add(s.serve_id)
        if again or not mine:
            left_out += 1
            continue
        freed = [max((b for a, b in spans[key] if b <= s.started_at), default=None) for key in mine]
        if any(f is not None for f in freed):
            refill.append(s.started_at - max(f for f in freed if f is not None))
        else:
            wave.append(s.started_at - first)
    return refill, wave, left_out


def measure(configs: list[Config], out: Path, points: int, prompts: int) -> dict[str, Any]:
    led = Ledger.open_existing(out)
    try:
        servers, pts = led.servers(), led.points()
    finally:
        led.close()
    by_params = {json.dumps(c.params(), sort_keys=True): c for c in configs}
    serve_cfg = {p.serve_id: by_params[json.dumps(p.serve_params, sort_keys=True)] for p in pts}
    per: dict[int, dict[str, Any]] = {}
    for c in configs:
        per[c.index] = {"config": asdict(c), "servers": []}
    for s in servers:
        per[serve_cfg[s.serve_id].index]["servers"].append(s)
    points_of: dict[str, list[PointRow]] = {}
    for p in pts:
        points_of.setdefault(p.serve_id, []).append(p)

    rows: list[dict[str, Any]] = []
    parts: dict[str, list[float]] = {"start": [], "ready_to_first_point": [], "first_point": [], "later_points": [],
                                     "between_points": [],
                                     "last_point_to_stopped": []}
    for sid, c in serve_cfg.items():
        ss = per[c.index]["servers"]
        mine = sorted(points_of[sid], key=lambda p: p.started_at or 0)
        occ = max(s.stopped_at or math.nan for s in ss) - min(s.started_at for s in ss)
        row = {"index": c.index, "gpus": c.gpus, "servers": len(ss), "nominal_s": c.nominal_s,
               "started_at": min(s.started_at for s in ss), "stopped_at": max(s.stopped_at or math.nan for s in ss),
               "occupancy_s": occ, "overhead_s": occ - c.nominal_s,
               "points_done": sum(p.state == "done" for p in mine)}
        rows.append(row)
        if len(ss) == 1 and ss[0].ready_at and all(p.started_at and p.ended_at for p in mine):
            s = ss[0]
            parts["start"].append(s.ready_at - s.started_at - c.startup_s)
            parts["ready_to_first_point"].append(mine[0].started_at - s.ready_at)
            beyond = [p.ended_at - p.started_at - prompts * c.request_s for p in mine]
            parts["first_point"].append(beyond[0])
            parts["later_points"] += beyond[1:]
            parts["between_points"] += [b.started_at - a.ended_at for a, b in itertools.pairwise(mine)]
            parts["last_point_to_stopped"].append(s.stopped_at - max(p.ended_at for p in mine))
    rows.sort(key=lambda r: r["started_at"])
    first, last = min(r["started_at"] for r in rows), max(r["stopped_at"] for r in rows)
    makespan = last - first
    occs = [r["occupancy_s"] for r in rows]
    gpu_s = sum(r["gpus"] * r["occupancy_s"] for r in rows)
    bound = max(gpu_s / GPUS, max(occs))
    sequential = sum(occs)
    nominal_gpu_s = sum(c.gpus * c.nominal_s for c in configs)
    nominal_bound = max(nominal_gpu_s / GPUS, max(c.nominal_s for c in configs))

    # the same campaign in bench_packing's simulation: the policy alone, no scheduling delay
    sc = bench_packing.Scenario("ray", nodes=NODES, gpus_per_node=GPUS_PER_NODE, configs=len(configs), seed=0)
    nodes = bench_packing.make_nodes(sc)
    occ_of = {r["index"]: r["occupancy_s"] for r in rows}
    sim_meas, _ = bench_packing.simulate(
        [bench_packing.Config(f"c{c.index:03d}", c.shape(), points, occ_of[c.index]) for c in configs], nodes)
    sim_nom, _ = bench_packing.simulate(
        [bench_packing.Config(f"c{c.index:03d}", c.shape(), points, c.nominal_s) for c in configs], nodes)

    # concurrency: servers and GPUs in use over time
    edges = sorted([(r["started_at"], 1, r["gpus"]) for r in rows] + [(r["stopped_at"], -1, -r["gpus"]) for r in rows])
    running = busy = peak_servers = peak_gpus = 0
    for _, ds, dg in edges:
        running, busy = running + ds, busy + dg
        peak_servers, peak_gpus = max(peak_servers, running), max(peak_gpus, busy)
    last_start = max(r["started_at"] for r in rows)
    refill, wave, left_out = refill_delays(servers)
    by_size = {g: {"configs": sum(r["gpus"] == g for r in rows),
                   "overhead": _stats([r["overhead_s"] for r in rows if r["gpus"] == g]),
                   "overlapping_configs": statistics.median(
                       [sum(o["started_at"] < r["stopped_at"] and o["stopped_at"] > r["started_at"] for o in rows)
                        for r in rows if r["gpus"] == g])}
               for g in sorted(SHAPES)}
    return {
        "makespan_s": makespan, "lower_bound_s": bound, "ratio": makespan / bound,
        "utilisation": gpu_s / (GPUS * makespan), "drain_s": last - last_start,
        "sequential_s": sequential, "sequential_over_packed": sequential / makespan,
        "sim_measured_s": sim_meas, "real_over_sim_measured": makespan / sim_meas,
        "nominal_bound_s": nominal_bound, "sim_nominal_s": sim_nom,
        "nominal_sequential_s": sum(c.nominal_s for c in configs),
        "occupancy": _stats(occs), "nominal": _stats([c.nominal_s for c in configs]),
        "overhead": _stats([r["overhead_s"] for r in rows]),
        "parts": {k: _stats(v) for k, v in parts.items()},
        "refill_delay": _stats(refill), "refill_count": len(refill), "refill_left_out": left_out,
        "failed_servers": [{"server_id": s.server_id, "error": s.error} for s in servers if s.state == "failed"],
        "by_gpu_count": by_size,
        "first_wave": {"count": len(wave), "last_start_s": max(wave) if wave else 0.0},
        "peak_servers": peak_servers, "peak_gpus": peak_gpus,
        "server_restarts": sum(r["servers"] - 1 for r in rows),
        "points_done": sum(r["points_done"] for r in rows), "points": points * len(configs),
        "configs": rows,
    }


# ---------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------

def _mm(st: dict[str, float]) -> str:
    return f"{st['median']:.2f} / {st['max']:.2f}" if st else "-"


def report(m: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [
        (f"## Packing by the real driver: {NODES} x {GPUS_PER_NODE} simulated GPUs, {args.configs} configs x "
        f"{args.points} points, seed {args.seed}, durations / {args.time_scale:g}"), "",
        ("| makespan s | lower bound s | ratio | util | drain s | sequential s | seq. / packed "
        "| sim. (measured occupancies) s | real / sim. | nominal bound s | sim. (nominal) s "
        "| peak servers | peak GPUs |"),
        "|" + "---|" * 13,
        (f"| {m['makespan_s']:.1f} | {m['lower_bound_s']:.1f} | {m['ratio']:.3f} | {m['utilisation']:.0%} "
        f"| {m['drain_s']:.1f} | {m['sequential_s']:.1f} | {m['sequential_over_packed']:.2f}x "
        f"| {m['sim_measured_s']:.1f} | {m['real_over_sim_measured']:.3f} | {m['nominal_bound_s']:.1f} "
        f"| {m['sim_nominal_s']:.1f} | {m['peak_servers']} | {m['peak_gpus']} |"), "",
        "Per configuration, seconds, median / max (over configs; per point: over points):", "",
        ("| occupancy | nominal | occupancy - nominal | server start beyond its delay | ready to 1st point "
        "| 1st point beyond prompts x delay | later points, same | between points | last point to stopped "
        "| refill delay (n) "
        "| first wave (n, last start) |"),
        "|" + "---|" * 11,
        (f"| {_mm(m['occupancy'])} | {_mm(m['nominal'])} | {_mm(m['overhead'])} | {_mm(m['parts']['start'])} "
        f"| {_mm(m['parts']['ready_to_first_point'])} | {_mm(m['parts']['first_point'])} "
        f"| {_mm(m['parts']['later_points'])} "
        f"| {_mm(m['parts']['between_points'])} | {_mm(m['parts']['last_point_to_stopped'])} "
        f"| {_mm(m['refill_delay'])} ({m['refill_count']}) "
        f"| {m['first_wave']['count']}, {m['first_wave']['last_start_s']:.2f} |"), "",
        "| GPUs | configs | occupancy - nominal s, median / max | configs overlapping it (itself included), median |",
        "|---|---|---|---|",
    ]
    for g, b in m["by_gpu_count"].items():
        lines.append(f"| {g} | {b['configs']} | {_mm(b['overhead'])} | {b['overlapping_configs']:g} |")
    for f in m["failed_servers"]:
        lines.append(f"\nfailed server start {f['server_id']}: {(f['error'] or '').splitlines()[-1][:300]}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--configs", type=int, default=20)
    ap.add_argument("--points", type=int, default=3, help="bench points per configuration (runs 1)")
    ap.add_argument("--prompts", type=int, default=4, help="requests per point, one at a time")
    ap.add_argument("--time-scale", type=float, default=15.0, help="divide bench_packing's durations by this")
    ap.add_argument("--keep", type=Path, metavar="DIR", help="keep the campaign's output (ledger, logs) in DIR")
    ap.add_argument("--json", type=Path, metavar="FILE", help="also write every figure to FILE as JSON")
    ap.add_argument("--analyse", type=Path, metavar="DIR", help="start nothing: measure the output a run with "
                                                                 "--keep DIR and the same options left")
    args = ap.parse_args()
    configs = make_campaign(args.configs, args.seed, args.time_scale, args.points, args.prompts)
    if args.analyse:
        m = measure(configs, args.analyse, args.points, args.prompts)
        print(report(m, args))
        if args.json:
            args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                             "configs": [asdict(c) for c in configs], "measured": m}, indent=2) + "\n")
        return
    work = Path(tempfile.mkdtemp(prefix="rs-pk-"))
    try:
        t = run(configs, work, args.points, args.prompts)
        m = measure(configs, t["out"], args.points, args.prompts)
        if args.keep:
            shutil.copytree(t["out"], args.keep, dirs_exist_ok=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(report(m, args))
    print(f"\ncluster start {t['cluster_start_s']:.1f} s, campaign {t['campaign_wall_s']:.1f} s, cluster stop "
          f"{t['cluster_stop_s']:.1f} s; points done {m['points_done']}/{m['points']}, counts {t['counts']}, "
          f"server restarts {m['server_restarts']}, problems {len(t['events'])}; "
          f"stand-in pids {t['standin_pids']}, guards {t['guard_pids']}, left alive {t['left_alive'] or 'none'}")
    if args.json:
        t = {k: v for k, v in t.items() if k != "out"}
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "run": t,
                                         "configs": [asdict(c) for c in configs], "measured": m}, indent=2) + "\n")
    if t["left_alive"] or m["points_done"] != m["points"]:
        sys.exit(1)


if __name__ == "__main__":
    main()

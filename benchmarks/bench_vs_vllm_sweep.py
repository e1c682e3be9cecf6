"""Wall time of `raysweep run` vs `vllm bench sweep serve` on the same grid, in one run on this machine.

The grid is the CPU demo's (configs/demo-serve-params.json x configs/demo-bench-params.json, 2 runs each,
100 prompts at concurrency 16, the tiny dummy-weight Llama on vLLM's CPU build), with no warmup on either
side. Both tools get the same server and bench commands. Prints a Markdown report and writes it to
benchmarks/results/vs_vllm_sweep.md; the breakdown says where the time went.

    .venv/bin/python benchmarks/bench_vs_vllm_sweep.py [--order raysweep-first|vllm-first]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SERVE = "--load-format dummy --max-model-len 1024 --dtype bfloat16 --gpu-memory-utilization 0.2"
BENCH = "--dataset-name random --num-prompts 100 --max-concurrency 16 --temperature 0"


def run_vllm_sweep(model: Path, work: Path, env: dict[str, str]) -> dict[str, float]:
    port = 18431
    t0 = time.monotonic()
    subprocess.run([str(BIN / "vllm"), "bench", "sweep", "serve",
                    "--serve-cmd", f"{BIN / 'vllm'} serve {model} {SERVE} --host 127.0.0.1 --port {port}",
                    "--bench-cmd", f"{BIN / 'vllm'} bench serve --model {model} {BENCH} --host 127.0.0.1 --port {port}",
                    "--serve-params", str(REPO / "configs/demo-serve-params.json"),
                    "--bench-params", str(REPO / "configs/demo-bench-params.json"),
                    "--num-runs", "2", "-o", str(work), "-e", "vllm"],
                   env=env, check=True, stdout=subprocess.DEVNULL, stderr=(work / "vllm-sweep.log").open("w"))
    wall = time.monotonic() - t0
    runs = [json.loads(p.read_text()) for p in (work / "vllm").rglob("run=*.json")]
    bench = sum(r["duration"] for r in runs)
    return {"wall_s": wall, "runs": len(runs), "benchmarks_s": bench, "other_s": wall - bench,
            "req_per_s": sorted(r["request_throughput"] for r in runs)[len(runs) // 2]}


def run_raysweep(model: Path, work: Path, env: dict[str, str]) -> dict[str, float]:
    campaign = yaml.safe_load((REPO / "configs/demo-cpu.yaml").read_text())
    campaign.update(warmup=0, output_dir=str(work / "raysweep"))
    campaign["serve"]["cmd"] = f"vllm serve {model} {SERVE}"  # exactly the command vLLM's sweep gets
    campaign["serve"]["params"] = str(REPO / "configs/demo-serve-params.json")
    campaign["bench"]["params"] = str(REPO / "configs/demo-bench-params.json")
    f = work / "campaign.yaml"
    f.write_text(yaml.safe_dump(campaign))
    t0 = time.monotonic()
    subprocess.run([str(BIN / "raysweep"), "run", str(f)], env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=(work / "raysweep.log").open("w"))
    wall = time.monotonic() - t0
    out = work / "raysweep"
    import sqlite3

    db = sqlite3.connect(out / "ledger.sqlite")
    servers = db.execute("SELECT started_at, ready_at, stopped_at FROM servers").fetchall()
    drivers = db.execute("SELECT started_at, ended_at FROM drivers").fetchall()
    runs = [json.loads(p.read_text()) for p in (out / "points").rglob("run=*.json")]
    server_start = sum(r - s for s, r, _ in servers)
    bench = sum(r["duration"] for r in runs)
    bench_procs = sum(r["bench_wall_s"] for r in runs) - bench
    driver_span = drivers[0][1] - drivers[0][0]
    return {"wall_s": wall, "runs": len(runs), "benchmarks_s": bench, "server_starts_s": server_start,
            "bench_process_overhead_s": bench_procs, "ray_and_cli_s": wall - driver_span,
            "other_s": wall - bench - server_start - bench_procs,
            "req_per_s": sorted(r["request_throughput"] for r in runs)[len(runs) // 2]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--order", choices=["raysweep-first", "vllm-first"], default="vllm-first")
    args = ap.parse_args()
    from raysweep.demo import make_tiny_model

    work = Path(tempfile.mkdtemp(prefix="rs-bench-"))
    model = make_tiny_model(work / "tiny-llama")
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_HOST_IP": "127.0.0.1",
           "RAYSWEEP_DEMO_MODEL": str(model), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           "RAY_USAGE_STATS_ENABLED": "0", "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
    order = [("vllm bench sweep serve", run_vllm_sweep), ("raysweep run", run_raysweep)]
    if args.order == "raysweep-first":
        order.reverse()
    results = {name: fn(model, work, env) for name, fn in order}
    v, r = results["vllm bench sweep serve"], results["raysweep run"]
    lines = [f"# raysweep run vs vllm bench sweep serve ({time.strftime('%Y-%m-%d')}, order: {args.order})", "",
             "2 serve configs x 2 bench points x 2 runs, 100 prompts at concurrency 16, tiny Llama on vLLM CPU.", "",
             "| | vllm bench sweep serve | raysweep run |", "|---|---|---|"]
    for key in ("wall_s", "runs", "benchmarks_s", "server_starts_s", "bench_process_overhead_s", "ray_and_cli_s",
                "other_s", "req_per_s"):
        fmt = (lambda x: "-" if x is None else (f"{x:.1f}" if isinstance(x, float) else str(x)))
        lines.append(f"| {key} | {fmt(v.get(key))} | {fmt(r.get(key))} |")
    lines += ["", f"Ratio raysweep / vllm wall time: {r['wall_s'] / v['wall_s']:.2f}"]
    text = "\n".join(lines)
    print(text)
    dest = REPO / "benchmarks/results"
    dest.mkdir(exist_ok=True)
    (dest / f"vs_vllm_sweep-{args.order}.md").write_text(text + "\n")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

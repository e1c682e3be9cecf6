"""The anchor comparison: `vllm bench sweep serve` and `raysweep run` on the same grid, in one sitting.

The grid: 2 server configs (configs/demo-serve-params.json) x 2 bench points (random 128 in / 32 out and
256 / 64, configs/demo-bench-params.json) x 2 runs, 100 prompts at concurrency 16, `--ignore-eos`,
temperature 0, no warmup, on vLLM's CPU build with the tiny dummy-weight Llama and `--enforce-eager`.
Every tool gets the same server command, bench command and parameter files. raysweep runs twice, once
with each client, so that it is always clear which client a figure comes from:
- `raysweep run (native)`: `bench.backend: native`, raysweep's own client in Ray actors (the default);
- `raysweep run (command)`: `bench.backend: command`, the same `vllm bench serve` that vLLM's sweep runs,
  started by a Ray actor.
raysweep's Ray workers run at niceness 0 (`RAY_worker_niceness=0`), as the servers vLLM's sweep starts do.

Reported: the wall time of each tool and where it went, the medians per (server config, bench point) of
request and output throughput and median TTFT and TPOT, and the ratios to vLLM's sweep. Also where each
tool's CPU time went: every process the tool starts (found by a variable in its environment) is sampled
every second, and its CPU seconds are counted as the server's (`vllm serve` and its engine), the clients'
(`vllm bench serve`, raysweep's client actors) or the rest (vLLM's sweep driver; raysweep's driver, Ray's
GCS, raylet, agents and idle workers). On 2 shared cores, CPU the rest takes is CPU the server does not
get. Prints Markdown and writes benchmarks/results/vs_vllm_sweep-<order>.md.

    .venv/bin/python benchmarks/bench_vs_vllm_sweep.py [--order vllm-first|raysweep-first] [--tools ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import yaml

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SERVE = "--load-format dummy --max-model-len 1024 --dtype bfloat16 --gpu-memory-utilization 0.2 --enforce-eager"
BENCH = "--dataset-name random --num-prompts 100 --max-concurrency 16 --ignore-eos --temperature 0"
SERVE_PARAMS = REPO / "configs/demo-serve-params.json"
BENCH_PARAMS = REPO / "configs/demo-bench-params.json"
METRICS = ("request_throughput", "output_throughput", "median_ttft_ms", "median_tpot_ms")
VLLM = "vllm bench sweep serve"
TOOLS = {"vllm": VLLM, "native": "raysweep run (native)", "command": "raysweep run (command)"}


def _key(r: dict[str, Any]) -> tuple[int, int, int]:
    """(max_num_seqs, random_input_len, random_output_len): the point a run belongs to."""
    return int(r["max_num_seqs"]), int(r["random_input_len"]), int(r["random_output_len"])


def _medians(runs: list[dict[str, Any]]) -> dict[tuple[int, int, int], dict[str, float]]:
    by: dict[tuple[int, int, int], list[dict[str, Any]]] = {}
    for r in runs:
        by.setdefault(_key(r), []).append(r)
    return {k: {m: statistics.median(float(r[m]) for r in rs) for m in METRICS} | {"runs": len(rs)}
            for k, rs in sorted(by.items())}


def _kind(argv: list[str]) -> str | None:
    """`server` or `client` for the processes that start those trees; None for anything else."""
    if argv and argv[0].startswith(("ray::NativeClient", "ray::Dispenser", "ray::CommandClient")):
        return "client"
    head = " ".join(argv[:3])
    if "vllm" in head and "bench" in argv[:4] and "serve" in argv[:4]:
        return "client"
    if "vllm" in head and "serve" in argv[:3] and "bench" not in argv[:4]:
        return "server"
    return None


MARK = "RS_ANCHOR_TOOL"  # in each tool's environment: every process it starts inherits it, Ray's daemons too


class CpuSampler:
    """CPU seconds of every process whose environment holds `MARK=tag`, by kind (server, client, rest),
    sampled every `every` s: a process's last sample counts, so one that ends between samples loses at most
    `every` s of its time. (Ray's GCS and raylet are not children of the driver, so the process tree would
    miss them and everything they start; the environment reaches them all.)"""

    def __init__(self, tag: str, every: float = 1.0) -> None:
        self.tag, self.every = tag, every
        self.seen: dict[tuple[int, float], tuple[str, float]] = {}
        self.kinds: dict[int, str] = {}
        self.ours: set[int] = set()
        self.others: set[tuple[int, float]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.every)

    def sample(self) -> None:
        for p in psutil.process_iter():
            try:
                key = (p.pid, p.create_time())
                if key in self.others:
                    continue
                if p.pid not in self.ours:
                    if p.environ().get(MARK) != self.tag:
                        self.others.add(key)
                        continue
                    self.ours.add(p.pid)
                t = p.cpu_times()
                self.seen[key] = (self._kind_of(p), t.user + t.system)
            except psutil.Error:
                continue

    def _kind_of(self, p: psutil.Process) -> str:
        """A process's kind, else its parent's (server and client trees), else rest. Ray workers are read
        again every time: an idle worker becomes an actor's."""
        if p.pid in self.kinds:
            return self.kinds[p.pid]
        argv = p.cmdline()
        kind = _kind(argv)
        if kind is None:
            parent = p.parent()
            kind = self._kind_of(parent) if parent is not None and parent.pid in self.ours else "rest"
            kind = kind if kind in ("server", "client") else "rest"
        if not (argv and argv[0].startswith("ray::")):
            self.kinds[p.pid] = kind
        return kind

    def totals(self) -> dict[str, float]:
        out = {"server": 0.0, "client": 0.0, "rest": 0.0}
        for kind, cpu in self.seen.values():
            out[kind] += cpu
        return out


def _cpu_fields(cpu: dict[str, float], wall: float) -> dict[str, Any]:
    return {"cpu_server_s": cpu["server"], "cpu_client_s": cpu["client"], "cpu_rest_s": cpu["rest"],
            "rest_cores": cpu["rest"] / wall}


def run_vllm_sweep(model: Path, work: Path, env: dict[str, str]) -> dict[str, Any]:
    port = 18431
    t0 = time.monotonic()
    with subprocess.Popen([str(BIN / "vllm"), "bench", "sweep", "serve",
                           "--serve-cmd", f"{BIN / 'vllm'} serve {model} {SERVE} --host 127.0.0.1 --port {port}",
                           "--bench-cmd", f"{BIN / 'vllm'} bench serve --model {model} {BENCH} --host 127.0.0.1 "
                                          f"--port {port}",
                           "--serve-params", str(SERVE_PARAMS), "--bench-params", str(BENCH_PARAMS),
                           "--num-runs", "2", "-o", str(work), "-e", "vllm"],
                          env={**env, MARK: "vllm"}, stdout=subprocess.DEVNULL,
                          stderr=(work / "vllm-sweep.log").open("w")) as proc, CpuSampler("vllm") as cpu:
        if proc.wait():
            raise subprocess.CalledProcessError(proc.returncode, "vllm bench sweep serve")
    wall = time.monotonic() - t0
    runs = [json.loads(p.read_text()) for p in (work / "vllm").rglob("run=*.json")]  # with the overrides
    bench = sum(r["duration"] for r in runs)
    return {"wall_s": wall, "runs": len(runs), "benchmarks_s": bench, "other_s": wall - bench,
            "points": _medians(runs), **_cpu_fields(cpu.totals(), wall)}


def run_raysweep(model: Path, work: Path, env: dict[str, str], backend: str) -> dict[str, Any]:
    out = work / f"raysweep-{backend}"
    campaign = {
        "name": f"anchor-{backend}", "output_dir": str(out), "runs": 2, "warmup": 0,
        "serve": {"cmd": f"vllm serve {model} {SERVE}",  # exactly the command vLLM's sweep gets
                  "env": {"VLLM_CPU_KVCACHE_SPACE": 1, "VLLM_HOST_IP": "127.0.0.1"}, "ready_timeout_s": 400,
                  "params": str(SERVE_PARAMS)},
        "bench": {"backend": backend, "cmd": f"vllm bench serve --model {model} {BENCH}", "params": str(BENCH_PARAMS)},
    }
    f = work / f"campaign-{backend}.yaml"
    f.write_text(yaml.safe_dump(campaign))
    t0 = time.monotonic()
    with subprocess.Popen([str(BIN / "raysweep"), "run", str(f)], env={**env, MARK: backend},
                          stdout=subprocess.DEVNULL, stderr=(work / f"raysweep-{backend}.log").open("w")) as proc, \
            CpuSampler(backend) as cpu:
        if proc.wait():
            raise subprocess.CalledProcessError(proc.returncode, "raysweep run")
    wall = time.monotonic() - t0
    db = sqlite3.connect(out / "ledger.sqlite")
    servers = db.execute("SELECT started_at, ready_at FROM servers").fetchall()
    drivers = db.execute("SELECT started_at, ended_at FROM drivers").fetchall()
    runs = [json.loads(p.read_text()) for p in (out / "points").rglob("run=*.json")]
    server_start = sum(r - s for s, r in servers if r)
    bench = sum(r["duration"] for r in runs)
    bench_procs = sum(r["bench_wall_s"] for r in runs) - bench
    driver_span = drivers[0][1] - drivers[0][0]
    return {"wall_s": wall, "runs": len(runs), "benchmarks_s": bench, "server_starts_s": server_start,
            "bench_client_overhead_s": bench_procs, "ray_and_cli_s": wall - driver_span,
            "other_s": wall - bench - server_start - bench_procs, "points": _medians(runs),
            "client_limited_runs": sum(1 for r in runs if r.get("client_limited")),
            **_cpu_fields(cpu.totals(), wall)}


def _fmt(x: Any) -> str:
    return "-" if x is None else f"{x:,.1f}" if isinstance(x, float) else str(x)


def report(results: dict[str, dict[str, Any]], order: str) -> str:
    names = list(results)
    lines = [f"# The anchor comparison: {' / '.join(names)} ({time.strftime('%Y-%m-%d')}, order: {order})", "",
             "2 serve configs x 2 bench points x 2 runs, random 128/32 and 256/64, 100 prompts at concurrency 16, "
             "--ignore-eos, no warmup; tiny Llama on vLLM CPU, --enforce-eager. Ran one after the other in the "
             "order of the columns.", "",
             "| seconds | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for key in ("wall_s", "runs", "benchmarks_s", "server_starts_s", "bench_client_overhead_s", "ray_and_cli_s",
                "other_s", "client_limited_runs", "cpu_server_s", "cpu_client_s", "cpu_rest_s", "rest_cores"):
        cells = [f"{v:.2f}" if key == "rest_cores" and v is not None else _fmt(v)
                 for v in (results[n].get(key) for n in names)]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    base = results.get(VLLM)
    if base:
        lines += [""] + [f"Wall time {n} / vllm sweep: **{results[n]['wall_s'] / base['wall_s']:.2f}**"
                         for n in names if n != VLLM]
    lines += ["", "Medians of the runs per point (max_num_seqs, input/output len); ratio to vLLM's sweep in "
              "brackets.", ""]
    for m in METRICS:
        lines += [f"### {m}", "", "| point | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for k in sorted({k for n in names for k in results[n]["points"]}):
            cells = []
            for n in names:
                v = results[n]["points"].get(k, {}).get(m)
                b = base["points"].get(k, {}).get(m) if base else None
                cells.append(_fmt(v) + (f" ({v / b:.2f})" if n != VLLM and v is not None and b else ""))
            lines.append(f"| seqs {k[0]}, {k[1]}/{k[2]} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--order", choices=["raysweep-first", "vllm-first"], default="vllm-first")
    ap.add_argument("--tools", default="vllm,native,command",
                    help="comma list of vllm (vLLM's sweep), native and command (raysweep with that client)")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from raysweep.lab.tiny_model import make_tiny_model

    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    if bad := [t for t in tools if t not in TOOLS]:
        ap.error(f"--tools: unknown {bad}; accepted: {', '.join(TOOLS)}")
    if args.order == "raysweep-first":
        tools = [t for t in tools if t != "vllm"] + [t for t in tools if t == "vllm"]
    work = Path(tempfile.mkdtemp(prefix="rs-bench-"))
    model = make_tiny_model(work / "tiny-llama")
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_HOST_IP": "127.0.0.1", "VLLM_SERVER_DEV_MODE": "1",
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_worker_niceness": "0", "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
    results = {}
    for t in tools:
        results[TOOLS[t]] = run_vllm_sweep(model, work, env) if t == "vllm" else run_raysweep(model, work, env, t)
    text = report(results, args.order)
    print(text)
    dest = REPO / "benchmarks/results"
    dest.mkdir(exist_ok=True)
    (dest / f"vs_vllm_sweep-{args.order}.md").write_text(text + "\n")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

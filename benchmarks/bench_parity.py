"""Parity of the native client with `vllm bench serve` on one real vLLM CPU server, server and clients apart.

One `vllm serve` (CPU build, the tiny dummy-weight Llama from `raysweep tiny-model`, `--enforce-eager`) runs
pinned to one core; `raysweep crosscheck --url` runs pinned to another, with its embedded Ray, so both clients
(native actors, and `vllm bench serve` started by a Ray actor) share that core alike, at niceness 0
(`RAY_worker_niceness=0`). The clients take turns, 5 runs each on one workload (random 128 in / 32 out,
100 prompts, concurrency 16, `--ignore-eos`, temperature 0), with the caches reset before every run.
Targets: output throughput within 5 %, median TTFT and TPOT within 10 % (crosscheck's defaults).

    .venv/bin/python benchmarks/bench_parity.py [--runs 5] [--server-cpus 0] [--client-cpus 1]

Writes benchmarks/results/parity.md (and the crosscheck JSON beside it); exits with crosscheck's code.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from servers import ENV, start_server, stop_server  # benchmarks/servers.py

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
OUT = REPO / "benchmarks" / "results"
SERVE = "--load-format dummy --max-model-len 1024 --dtype bfloat16 --gpu-memory-utilization 0.2 --enforce-eager"
LOAD = ("--dataset-name random --random-input-len 128 --random-output-len 32 --num-prompts {prompts} "
        "--max-concurrency 16 --ignore-eos --temperature 0")


def campaign(model: Path, prompts: int, work: Path) -> Path:
    """The one-point campaign both clients run (the command crosscheck hands to `vllm bench serve`)."""
    f = work / "parity.yaml"
    f.write_text(yaml.safe_dump({
        "name": "parity", "output_dir": str(work / "out"), "warmup": 16,
        "serve": {"cmd": f"vllm serve {model} {SERVE}"},
        "bench": {"cmd": f"vllm bench serve --model {model} {LOAD.format(prompts=prompts)}", "client_cpus": 0.5}}))
    return f


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=100)
    ap.add_argument("--server-cpus", default="0", help="taskset CPU list of the server")
    ap.add_argument("--client-cpus", default="1", help="taskset CPU list of crosscheck, its Ray and both clients")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from raysweep.demo import make_tiny_model
    from raysweep.procs import free_port

    with tempfile.TemporaryDirectory(prefix="rs-parity-") as tmp:
        work = Path(tmp)
        model = make_tiny_model(work / "model")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        t0 = time.monotonic()
        server = start_server(["taskset", "-c", args.server_cpus, str(BIN / "vllm"), "serve", str(model),
                               *SERVE.split(), "--host", "127.0.0.1", "--port", str(port)], url, 400,
                              work / "vllm.log")
        ready_s = time.monotonic() - t0
        env = {**ENV, "RAY_worker_niceness": "0", "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
        try:
            t0 = time.monotonic()
            proc = subprocess.run(["taskset", "-c", args.client_cpus, str(BIN / "raysweep"), "crosscheck",
                                   str(campaign(model, args.prompts, work)), "--url", url, "-n", str(args.runs),
                                   "--out", str(work / "xc"), "--json"],
                                  env=env, capture_output=True, text=True)
            wall = time.monotonic() - t0
        finally:
            stop_server(server)
        if proc.returncode not in (0, 1) or not proc.stdout:
            sys.stderr.write(proc.stderr[-5000:])
            return proc.returncode or 2
        report = json.loads(proc.stdout)
        md = Path(report["report_dir"]) / "crosscheck.md"
        head = (f"<!-- {time.strftime('%Y-%m-%d %H:%M')} -->\n"
                f"# Parity: native client vs `vllm bench serve` on one real vLLM CPU server\n\n"
                f"Server pinned to CPU(s) {args.server_cpus} (ready in {ready_s:.0f} s); crosscheck, its embedded "
                f"Ray and both clients pinned to CPU(s) {args.client_cpus}, Ray workers at niceness 0. "
                f"Crosscheck took {wall:.0f} s.\n"
                f"Command: `taskset -c {args.client_cpus} raysweep crosscheck parity.yaml --url {url} "
                f"-n {args.runs}`\n\n")
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "parity.md").write_text(head + md.read_text().replace("# raysweep crosscheck", "## raysweep crosscheck", 1))
        (OUT / "parity.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(head + md.read_text(), flush=True)
        return proc.returncode


if __name__ == "__main__":
    sys.exit(main())

"""The native client against `vllm bench serve`: capacity and per-point overhead.

- capacity: requests/s that one native client actor (and two) sustain against the zero-work streaming
  stand-in (tests/standin/stream_server.py, 4 one-token chunks per response), and what `vllm bench serve`
  sustains with the same load. Median of 3 each.
- overhead: a campaign of 20 points against the stand-in through the real driver; the gap from one point's
  last response to the next point's start (cache reset, result file, ledger, request generation, start
  barrier), and, for comparison, the fixed cost of one `vllm bench serve` process (wall minus duration).

Parity with `vllm bench serve` on the real vLLM CPU server is benchmarks/bench_parity.py.

    .venv/bin/python benchmarks/bench_native_client.py [capacity|overhead|all]

Writes benchmarks/results/native_client_<part>.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from servers import ENV, start_server, stop_server  # benchmarks/servers.py

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
STUB = REPO / "tests" / "standin" / "stream_server.py"
OUT = REPO / "benchmarks" / "results"
def native(nb: Any, url: str, model: str, flags: list[str]) -> dict[str, Any]:
    import ray

    job = nb.submit(["vllm", "bench", "serve", "--model", model, *flags], url, model)
    return nb.finish(job, ray.get(job.refs))["result"]


def vllm_bench(url: str, model: str, flags: list[str], work: Path) -> tuple[dict[str, Any], float]:
    """One `vllm bench serve` run: its result JSON and its wall time."""
    t0 = time.monotonic()
    subprocess.run([str(BIN / "vllm"), "bench", "serve", "--backend", "openai", "--base-url", url, "--model", model,
                    *flags, "--save-result", "--result-dir", str(work), "--result-filename", "r.json"],
                   env=ENV, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.loads((work / "r.json").read_text()), time.monotonic() - t0


def ray_up(tmp: str) -> None:
    import ray

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, _temp_dir=tmp)


def table(head: list[str], rows: list[list[Any]]) -> str:
    fmt = [f"{v:,.1f}" if isinstance(v, float) else str(v) for r in rows for v in r]
    cells = [fmt[i:i + len(head)] for i in range(0, len(fmt), len(head))]
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                     + ["| " + " | ".join(c) + " |" for c in cells])


def capacity(model: Path, work: Path) -> str:
    import ray

    from raysweep.bench.native import NativeBench

    url = "http://127.0.0.1:18611"
    stub = start_server([sys.executable, str(STUB), "--model", "m", "--port", "18611"], url, 30, work / "stub.log")
    load = ["--dataset-name", "random", "--random-input-len", "8", "--random-output-len", "4",
            "--max-concurrency", "64", "--temperature", "0"]
    rows = []
    try:
        ray_up(str(work / "ray"))
        nb = NativeBench(cpus=0.5)
        native(nb, url, "m", [*load, "--num-prompts", "2000", "--clients", "2"])  # warm the actors
        for clients in (1, 2):
            got = [native(nb, url, "m", [*load, "--num-prompts", "30000", "--clients", str(clients)])
                   for _ in range(3)]
            rows.append([f"native, {clients} actor(s)", statistics.median(r["request_throughput"] for r in got),
                         statistics.median(r["client_send_lag_p99_ms"] for r in got),
                         "yes" if any(r["client_limited"] for r in got) else "no"])
        nb.close()
        ray.shutdown()
        got = [vllm_bench(url, str(model), [*load, "--tokenizer", str(model), "--num-prompts", "10000"], work)[0]
               for _ in range(3)]
        rows.append(["vllm bench serve", statistics.median(r["request_throughput"] for r in got), "-", "-"])
    finally:
        stop_server(stub)
    ratio = rows[0][1] / rows[2][1]
    return ("### Capacity against the zero-work stand-in (median of 3)\n\n"
            + table(["client", "req/s", "send lag p99 ms", "client-limited"], rows)
            + f"\n\nOne native actor / `vllm bench serve`: **{ratio:.2f}x**. Client, stand-in and Ray share 2 cores.\n")


def overhead(model: Path, work: Path) -> str:
    import yaml

    from raysweep.campaign import load_campaign
    from raysweep.driver import ray_session, run_campaign

    out = work / "camp"
    f = work / "c.yaml"
    f.write_text(yaml.safe_dump({
        "name": "overhead", "output_dir": str(out), "runs": 1,
        "serve": {"cmd": f"{sys.executable} {STUB} --model m --ttft-delay 0.002 --itl-delay 0.001"},
        "bench": {"cmd": "vllm bench serve --model m --num-prompts 20 --random-input-len 16 --random-output-len 4",
                  "client_cpus": 0.5, "params": {"grid": {"max_concurrency": list(range(1, 21))}}}}))
    with ray_session(None):
        run_campaign(load_campaign(f), out)
    recs = sorted((json.loads(p.read_text()) for p in out.rglob("run=*.json")), key=lambda r: r["start_time"])
    gaps = sorted(b["start_time"] - a["end_time"] for a, b in zip(recs, recs[1:]))
    url = "http://127.0.0.1:18612"
    stub = start_server([sys.executable, str(STUB), "--model", "m", "--port", "18612"], url, 30, work / "stub2.log")
    try:
        fixed = []
        for _ in range(3):
            r, wall = vllm_bench(url, str(model), ["--dataset-name", "random", "--tokenizer", str(model),
                                                   "--num-prompts", "20", "--random-input-len", "16",
                                                   "--random-output-len", "4"], work)
            fixed.append(wall - r["duration"])
    finally:
        stop_server(stub)
    rows = [["native, warm actors (19 gaps)", statistics.median(gaps) * 1000, gaps[int(0.9 * (len(gaps) - 1))] * 1000,
             gaps[-1] * 1000],
            ["`vllm bench serve` process (3 runs)", statistics.median(fixed) * 1000, "-", max(fixed) * 1000]]
    return ("### Per-point overhead on a warm server\n\n"
            + table(["between points", "median ms", "p90 ms", "max ms"], rows)
            + f"\n\nNative gap: last response of one point to the start of the next (cache reset, result file, "
              f"ledger, request generation, start barrier). Median {statistics.median(gaps):.3f} s vs "
              f"{statistics.median(fixed):.1f} s per `vllm bench serve` start.\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=["capacity", "overhead", "all"], default="all", nargs="?")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from raysweep.demo import make_tiny_model

    with tempfile.TemporaryDirectory(prefix="rs-bnc") as tmp:
        work = Path(tmp)
        model = make_tiny_model(work / "model")
        for part in (["capacity", "overhead"] if args.part == "all" else [args.part]):
            (work / part).mkdir()
            text = f"<!-- {time.strftime('%Y-%m-%d')} -->\n" + globals()[part](model, work / part)
            OUT.mkdir(parents=True, exist_ok=True)
            (OUT / f"native_client_{part}.md").write_text(text)
            print(text, flush=True)


if __name__ == "__main__":
    main()

"""The native client against `vllm bench serve`: capacity and per-point overhead.

- capacity: requests/s that one native client actor (and two) sustain against the zero-work streaming
  stand-in (tests/standin/stream_server.py, 4 one-token chunks per response), and what `vllm bench serve`
  sustains with the same load. Median of 3 each.
- capacity_multi_turn: synthetic multi-turn sessions (4 turns, 8 words in / 4 tokens out per turn, 64
  sessions at once) against the stand-in with a 0.1 ms inter-token delay, which makes it keep its own record
  of every request (`/timings`). `vllm bench serve` has no multi-turn sessions, so each run's counts (requests,
  input and output tokens) are checked against the stand-in's record and counters, and the client's TTFT and
  end-to-end latency against the stand-in's own clock. 1 and 2 actors, 3 runs each.
- capacity_trace: a timed trace (vLLM's plain format: 8,000 lines, Poisson at 2,000 req/s, 32 input tokens as
  2 blocks of 16, the first shared by groups of 10 lines, 4 output tokens) replayed on its timeline against
  the zero-work stand-in by 1 and 2 native actors and by `vllm bench serve --dataset-name timed_trace`; the
  rate each achieves, how late the native client sent against the trace's schedule, and each run's counts
  against the stand-in's counters. Median of 3 each.
- overhead: a campaign of 20 points against the stand-in through the real driver; the gap from one point's
  last response to the next point's start (cache reset, result file, ledger, request generation, start
  barrier), and, for comparison, the fixed cost of one `vllm bench serve` process (wall minus duration).

Parity with `vllm bench serve` on the real vLLM CPU server is benchmarks/bench_parity.py.

    .venv/bin/python benchmarks/bench_native_client.py [capacity|capacity_multi_turn|capacity_trace|overhead|all]

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
import urllib.request
from pathlib import Path
from typing import Any

from servers import ENV, start_server, stop_server  # benchmarks/servers.py

from raysweep.record.directory import CampaignDir

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
STUB = REPO / "tests" / "standin" / "stream_server.py"
OUT = REPO / "benchmarks" / "results"
PARTS = ("capacity", "capacity_multi_turn", "capacity_trace", "overhead")


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


def served(url: str) -> tuple[dict[str, float], int]:
    """The stand-in's token counters and how many requests its own record (`/timings`) holds."""
    from raysweep.serve.metrics import parse_metrics

    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        counters = parse_metrics(r.read().decode())
    return counters, len(timings(url))


def timings(url: str, start: int = 0) -> list[dict[str, Any]]:
    """The stand-in's own record of every streamed request (its clock), from the `start`th on."""
    with urllib.request.urlopen(url + "/timings", timeout=30) as r:
        return json.loads(r.read())[start:]


def counted(r: dict[str, Any], before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """The client's input and output tokens, and the server's counter deltas over the run."""
    return {"in": r["total_input_tokens"], "server_in": after["vllm:prompt_tokens"] - before["vllm:prompt_tokens"],
            "out": r["total_output_tokens"],
            "server_out": after["vllm:generation_tokens"] - before["vllm:generation_tokens"]}


def pct_ms(values: list[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(values, q)) * 1000 if values else float("nan")


def capacity_multi_turn(model: Path, work: Path) -> str:
    import ray

    from raysweep.bench.native import NativeBench

    url = "http://127.0.0.1:18613"
    stub = start_server([sys.executable, str(STUB), "--model", "m", "--port", "18613", "--itl-delay", "0.0001"],
                        url, 30, work / "stub.log")
    load = ["--backend", "openai-chat", "--dataset-name", "multi_turn", "--multi-turn-turns", "4",
            "--random-input-len", "8", "--random-output-len", "4", "--max-concurrency", "64", "--ignore-eos",
            "--temperature", "0", "--tokenizer", str(model)]
    runs: list[dict[str, Any]] = []
    try:
        ray_up(str(work / "ray"))
        nb = NativeBench(cpus=0.5)
        native(nb, url, "m", [*load, "--num-prompts", "200", "--clients", "2"])  # warm the actors
        for clients in (1, 2):
            for _ in range(3):
                before, seen = served(url)
                r = native(nb, url, "m", [*load, "--num-prompts", "1500", "--clients", str(clients)])
                rec = timings(url, seen)
                runs.append({"clients": clients, "r": r, "server_requests": len(rec),
                             **counted(r, before, served(url)[0]),
                             "server_ttft_p50": pct_ms([t["ttft"] for t in rec], 50),
                             "server_ttft_p99": pct_ms([t["ttft"] for t in rec], 99),
                             "server_e2el_p50": pct_ms([t["e2el"] for t in rec], 50)})
        nb.close()
        ray.shutdown()
    finally:
        stop_server(stub)
    exact = all(x["r"]["completed"] == x["server_requests"] and x["in"] == x["server_in"]
                and x["out"] == x["server_out"] and not x["r"]["failed"] for x in runs)
    rows = [[f"native, {x['clients']} actor(s)", x["r"]["request_throughput"], x["r"]["num_sessions"],
             f"{x['r']['completed']} / {x['server_requests']}", f"{x['in']} / {x['server_in']:.0f}",
             f"{x['out']} / {x['server_out']:.0f}", f"{x['r']['median_ttft_ms']:.2f} / {x['server_ttft_p50']:.2f}",
             f"{x['r']['p99_ttft_ms']:.2f} / {x['server_ttft_p99']:.2f}",
             f"{x['r']['median_e2el_ms']:.2f} / {x['server_e2el_p50']:.2f}",
             "yes" if x["r"]["client_limited"] else "no"] for x in runs]
    med = {c: statistics.median(x["r"]["request_throughput"] for x in runs if x["clients"] == c) for c in (1, 2)}
    why = "; ".join(f"{x['clients']} actor(s): {x['r']['client_limited_reason']}" for x in runs
                    if x["r"]["client_limited"])
    turns = runs[-1]["r"]["per_turn"]
    turns = json.loads(turns) if isinstance(turns, str) else turns
    per_turn = table(["turn", "requests", "mean input tokens", "mean TTFT ms", "p99 TTFT ms"],
                     [[t["turn"], t["requests"], t["mean_input_tokens"], f"{t['mean_ttft_ms']:.2f}",
                       f"{t['p99_ttft_ms']:.2f}"] for t in turns])
    return ("### Capacity with multi-turn sessions, checked against the stand-in's own record\n\n"
            + table(["client", "req/s", "sessions", "requests client / server", "input tokens client / server",
                     "output tokens client / server", "TTFT p50 ms client / server", "TTFT p99 ms client / server",
                     "E2EL p50 ms client / server", "client-limited"], rows)
            + f"\n\nMedian req/s: 1 actor **{med[1]:,.0f}**, 2 actors **{med[2]:,.0f}** (a request is one turn; 4 "
              f"per session). Counts equal to the stand-in's record and counters in every run: "
              f"**{'yes' if exact else 'NO'}**. The server's TTFT and E2EL run from the arrival of a request's bytes "
              f"to its first and last chunk written, the client's from its send to their receipt. The stand-in "
              f"counts a chat prompt's words (every message), which the client reads back from the usage. Client, "
              f"stand-in and Ray share 2 cores. Client-limited runs, the guard's reasons: {why or 'none'}."
              f"\n\nPer turn (last run, 2 actors): each turn carries the "
              f"conversation so far.\n\n{per_turn}\n")


def capacity_trace(model: Path, work: Path) -> str:
    import ray
    from bench_parity import write_trace  # benchmarks/bench_parity.py

    from raysweep.bench.native import NativeBench

    n, rate = 8000, 2000.0
    trace = write_trace(work / "trace.jsonl", n=n, rate=rate, blocks=2, shared=1, output_len=4)
    url = "http://127.0.0.1:18614"
    stub = start_server([sys.executable, str(STUB), "--model", "m", "--port", "18614"], url, 30, work / "stub.log")
    load = ["--dataset-name", "timed_trace", "--dataset-path", str(trace), "--tokenizer", str(model),
            "--num-prompts", str(n), "--temperature", "0"]
    runs: list[dict[str, Any]] = []
    try:
        ray_up(str(work / "ray"))
        nb = NativeBench(cpus=0.5)
        native(nb, url, "m", [*load, "--num-prompts", "1000", "--clients", "2"])  # warm the actors
        for clients in (1, 2):
            for _ in range(3):
                before, _ = served(url)
                r = native(nb, url, "m", [*load, "--clients", str(clients)])
                runs.append({"client": f"native, {clients} actor(s)", "r": r, **counted(r, before, served(url)[0])})
        nb.close()
        ray.shutdown()
        for _ in range(3):
            before, _ = served(url)
            r = vllm_bench(url, str(model), load, work)[0]
            runs.append({"client": "vllm bench serve", "r": r, **counted(r, before, served(url)[0])})
    finally:
        stop_server(stub)
    rows = []
    for name in dict.fromkeys(x["client"] for x in runs):
        mine = [x for x in runs if x["client"] == name]
        nat = name.startswith("native")
        rows.append([name, statistics.median(x["r"]["request_throughput"] for x in mine),
                     statistics.median(x["r"]["duration"] for x in mine),
                     statistics.median(x["r"]["client_send_lag_p99_ms"] for x in mine) if nat else "-",
                     max(x["r"]["client_late_sends"] for x in mine) if nat else "-",
                     ("yes" if any(x["r"]["client_limited"] for x in mine) else "no") if nat else "-",
                     "; ".join(f"{x['r']['completed']}, {x['in']} / {x['server_in']:.0f}, {x['out']} / "
                               f"{x['server_out']:.0f}" for x in mine)])
    exact = all(x["r"]["completed"] == n and x["in"] == x["server_in"] and x["out"] == x["server_out"]
                for x in runs if x["client"].startswith("native"))
    return ("### Capacity replaying a timed trace (median of 3)\n\n"
            + table(["client", "achieved req/s", "duration s", "send lag p99 ms", "late sends (max of 3)",
                     "client-limited", "each run: completed, input tokens client / server, output tokens client / "
                     "server"], rows)
            + f"\n\nTrace: {n:,} lines, Poisson at {rate:,.0f} req/s (a {n / rate:.0f} s timeline), 32 input tokens "
              f"(2 blocks of 16, the first shared by groups of 10 lines), 4 output tokens; the stand-in counts a "
              f"token-id prompt's ids. Native counts equal to the stand-in's counters in every run: "
              f"**{'yes' if exact else 'NO'}**. "
              f"Late sends: begun over 10 ms after their due time in the trace. "
              f"Client, stand-in and Ray share 2 cores.\n")


def overhead(model: Path, work: Path) -> str:
    import yaml

    import raysweep.modes  # noqa: F401 - every mode registered (raysweep.drive.hooks), as the faces do
    from raysweep.campaign import load_campaign
    from raysweep.drive.driver import ray_session, run_campaign

    out = work / "camp"
    f = work / "c.yaml"
    f.write_text(yaml.safe_dump({
        "name": "overhead", "output_dir": str(out), "runs": 1,
        "serve": {"cmd": f"{sys.executable} {STUB} --model m --ttft-delay 0.002 --itl-delay 0.001"},
        "bench": {"cmd": "vllm bench serve --model m --num-prompts 20 --random-input-len 16 --random-output-len 4",
                  "client_cpus": 0.5, "params": {"grid": {"max_concurrency": list(range(1, 21))}}}}))
    with ray_session(None):
        run_campaign(load_campaign(f), CampaignDir(out))
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
    ap.add_argument("part", choices=[*PARTS, "all"], default="all", nargs="?")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from raysweep.lab.tiny_model import make_tiny_model

    with tempfile.TemporaryDirectory(prefix="rs-bnc") as tmp:
        work = Path(tmp)
        model = make_tiny_model(work / "model")
        for part in (PARTS if args.part == "all" else [args.part]):
            (work / part).mkdir()
            text = f"<!-- {time.strftime('%Y-%m-%d')} -->\n" + globals()[part](model, work / part)
            OUT.mkdir(parents=True, exist_ok=True)
            (OUT / f"native_client_{part}.md").write_text(text)
            print(text, flush=True)


if __name__ == "__main__":
    main()

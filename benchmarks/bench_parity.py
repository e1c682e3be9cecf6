"""Parity of the native client with `vllm bench serve` on one real vLLM CPU server, server and clients apart.

One `vllm serve` (CPU build, the tiny dummy-weight Llama from `raysweep tiny-model`, `--enforce-eager`) runs
pinned to one core; `raysweep crosscheck --url` runs pinned to another, with its embedded Ray, so both clients
(native actors, and `vllm bench serve` started by a Ray actor) share that core alike, at niceness 0
(`RAY_worker_niceness=0`). The clients take turns, 5 runs each on one workload (random 128 in / 32 out,
100 prompts, concurrency 16, `--ignore-eos`, temperature 0), with the caches reset before every run.
Targets: output throughput within 5 %, median TTFT and TPOT within 10 % (crosscheck's defaults).

Cases (`--case`):
- `random` (the default): the workload above.
- `trace`: a timed trace replayed by both clients (`--dataset-name timed_trace`, vLLM's plain format: 100
  lines at 4 req/s Poisson, 128 input tokens in 8 blocks of 16 of which the first 4 are shared by groups of
  10 lines, 32 output tokens), on its own timeline at `--trace-speedup 2` (8 req/s), which crosscheck hands
  `vllm bench serve` as `--timed-trace-sec-multiplier 0.5`. 9 runs of each client by default: on this
  lightly loaded server each run's median TPOT moves by a third from run to run, both clients alike.
- `multi_turn`: `vllm bench serve` has no multi-turn sessions, so the native client is checked against the
  server's own counters instead: 16 synthetic sessions of 4 turns (64 in / 32 out per turn, concurrency 8),
  per run the client's input and output tokens and completed requests against the deltas of
  `vllm:prompt_tokens`, `vllm:generation_tokens` and `vllm:request_success` (exact: equal), with the
  per-turn input length, TTFT and the prefix-cache hit rate.

    .venv/bin/python benchmarks/bench_parity.py [--case random|trace|multi_turn] [--runs N] [--server-cpus 0]
        [--client-cpus 1] [--autogroup-nice -10] [--sittings 5] [--prompts N] [--min-run-s 10]

Where the kernel groups processes by session for scheduling (`/proc/sys/kernel/sched_autogroup_enabled`),
a process's niceness counts only against processes of its own session: other work on the machine at nice 19,
in sessions of its own, gets an equal share of the server's and the clients' cores. So the server and
crosscheck (with its Ray and both clients) each run in a session of their own at autogroup niceness
`--autogroup-nice` (-10: other sessions get about a tenth of a contended core; 0 leaves them as they are),
the same for both clients, and the header says what was set.

`--sittings N` (random case) runs crosscheck N times in a row on the one server and records how many
sittings reach "equivalent" (crosscheck's equivalence test: the 90 % interval of each ratio inside its
tolerance) in parity-sittings.md and .json. Its runs are bounded by duration, at least `--min-run-s` (10 s):
`vllm bench serve` has no duration bound, so both clients get the same prompt count, sized before the first
sitting from a calibration run of `vllm bench serve` (200 prompts of the same workload, pinned as the clients
are) at 1.5 times the prompts that the calibrated rate finishes in `--min-run-s`, in hundreds. A sitting
whose shortest run still came out shorter is marked in the table ("short").

Writes benchmarks/results/parity.md (parity-trace.md, parity-multi-turn.md; the JSON beside each); exits with
crosscheck's code (multi_turn: 0 when every count is equal, else 1).
"""

from __future__ import annotations

import argparse
import json
import math
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
TRACE_LOAD = ("--dataset-name timed_trace --dataset-path {trace} --trace-speedup 2 --num-prompts {prompts} "
              "--ignore-eos --temperature 0")
SESSIONS_LOAD = ("--backend openai-chat --dataset-name multi_turn --num-prompts 16 --multi-turn-turns 4 "
                 "--random-input-len 64 --random-output-len 32 --max-concurrency 8 --ignore-eos --temperature 0")
RESULT_FILE = {"random": "parity", "trace": "parity-trace", "multi_turn": "parity-multi-turn"}


def campaign(model: Path, prompts: int, work: Path, load: str = LOAD) -> Path:
    """The one-point campaign both clients run (the command crosscheck hands to `vllm bench serve`)."""
    f = work / "parity.yaml"
    f.write_text(yaml.safe_dump({
        "name": "parity", "output_dir": str(work / "out"), "warmup": 16,
        "serve": {"cmd": f"vllm serve {model} {SERVE}"},
        "bench": {"cmd": f"vllm bench serve --model {model} {load.format(prompts=prompts, trace=work / 'trace.jsonl')}",
                  "client_cpus": 0.5}}))
    return f


def autogroup_nice(pid: int, nice: int) -> str:
    """Set the scheduler autogroup niceness of `pid`'s session (all its processes, and those it starts); what
    was done, for the header."""
    if not nice:
        return "autogroup niceness left as it was"
    try:
        if Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() != "1":
            return "kernel autogroups off: nothing to set"
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))
        return f"autogroup niceness {nice}"
    except OSError as exc:
        return f"autogroup niceness not set ({exc.strerror or exc})"


def write_trace(path: Path, n: int = 100, rate: float = 8.0, seed: int = 0, blocks: int = 8, shared: int = 4,
                output_len: int = 32) -> Path:
    """A timed trace in vLLM's plain format: Poisson arrivals, `blocks` blocks of 16 input tokens (the first
    `shared` shared by groups of 10 lines), `output_len` output tokens (default: 128 in as 8 blocks, 4 shared,
    32 out)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    at = np.cumsum(rng.exponential(1 / rate, n))
    lines = [{"timestamp": round(float(t), 4), "input_length": 16 * blocks, "output_length": output_len,
              "hash_ids": [1000 * (i // 10) + b for b in range(shared)]
              + [10**6 + blocks * i + b for b in range(blocks - shared)]}
             for i, t in enumerate(at)]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def sessions_check(model: Path, url: str, runs: int) -> tuple[int, str, list[dict]]:
    """The multi-turn case: the native client's counts against the server's counters, run by run."""
    import ray

    from raysweep.bench.native import NativeBench
    from raysweep.serve import metrics
    from raysweep.serve.server import reset_caches

    ray.init(include_dashboard=False, log_to_driver=False)
    nb = NativeBench(cpus=0.5)
    rows: list[dict] = []
    try:
        for rnd in range(runs):
            reset_caches(url)
            scraper = metrics.Scraper(url, 0.5).start()
            try:
                job = nb.submit(["vllm", "bench", "serve", "--model", str(model), *SESSIONS_LOAD.split()], url,
                                str(model))
                out = nb.finish(job, ray.get(job.refs))
            finally:
                scraper.stop()
            r = out["result"]
            r.update(scraper.summary((r["start_time"], r["end_time"])))
            rows.append({"run": rnd, **{k: r.get(k) for k in (
                "completed", "server_request_success", "total_input_tokens", "server_prompt_tokens",
                "total_output_tokens", "server_generation_tokens", "server_prefix_cache_hit_rate",
                "output_throughput", "median_ttft_ms", "per_turn")}})
    finally:
        nb.close()
        ray.shutdown()
    exact = all(r["completed"] == r["server_request_success"] and r["total_input_tokens"] == r["server_prompt_tokens"]
                and r["total_output_tokens"] == r["server_generation_tokens"] for r in rows)
    md = ["| run | completed / server | input tokens / server | output tokens / server | prefix-cache hit rate "
          "| output tok/s | median TTFT ms |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['run']} | {r['completed']} / {r['server_request_success']:.0f} | {r['total_input_tokens']} / "
                  f"{r['server_prompt_tokens']:.0f} | {r['total_output_tokens']} / {r['server_generation_tokens']:.0f} "
                  f"| {r['server_prefix_cache_hit_rate']:.3f} | {r['output_throughput']:.1f} | "
                  f"{r['median_ttft_ms']:.1f} |")
    md += ["", "Per turn (last run): turn, mean input tokens (the conversation so far), mean TTFT ms", "",
           "| turn | mean input tokens | mean TTFT ms | p99 TTFT ms |", "|---|---|---|---|"]
    md += [f"| {t['turn']} | {t['mean_input_tokens']:.1f} | {t['mean_ttft_ms']:.1f} | {t['p99_ttft_ms']:.1f} |"
           for t in rows[-1]["per_turn"]]
    md += ["", f"Counts equal to the server's counters in every run: **{'yes' if exact else 'NO'}**."]
    return (0 if exact else 1), "\n".join(md) + "\n", rows


def one_crosscheck(args: argparse.Namespace, model: Path, url: str, work: Path, load: str,
                   env: dict[str, str]) -> tuple[int, dict | None, str, float, str]:
    """One `raysweep crosscheck` pinned and in a session of its own: (exit code, report, stderr, seconds,
    what was done to its autogroup)."""
    t0 = time.monotonic()
    with subprocess.Popen(["taskset", "-c", args.client_cpus, str(BIN / "raysweep"), "crosscheck",
                           str(campaign(model, args.prompts, work, load)), "--url", url, "-n",
                           str(args.runs), "--out", str(work / "xc"), "--json"],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:
        grouped = autogroup_nice(proc.pid, args.autogroup_nice)
        try:
            stdout, stderr = proc.communicate()
        except BaseException:  # its own session gets no Ctrl-C from the terminal: stop it here
            stop_server(proc)
            raise
    report = json.loads(stdout) if proc.returncode in (0, 1) and stdout else None
    return proc.returncode, report, stderr, time.monotonic() - t0, grouped


def calibrate_prompts(args: argparse.Namespace, model: Path, url: str, work: Path, env: dict[str, str]) -> tuple[
        int, str]:
    """Prompts per run for runs of at least `--min-run-s`: one `vllm bench serve` of 200 prompts of the random
    workload, pinned as the clients are, gives the rate; 1.5 times the prompts that rate finishes in
    `--min-run-s`, rounded up to hundreds. (prompts, what was measured, for the header)."""
    out = work / "calibration"
    out.mkdir()
    argv = ["taskset", "-c", args.client_cpus, str(BIN / "vllm"), "bench", "serve", "--model", str(model),
            "--base-url", url, *LOAD.format(prompts=200).split(), "--save-result", "--result-dir", str(out),
            "--result-filename", "calibration.json"]
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    result = json.loads((out / "calibration.json").read_text())
    rate = float(result["completed"]) / float(result["duration"])
    prompts = max(100, 100 * math.ceil(1.5 * rate * args.min_run_s / 100))
    return prompts, (f"calibration: `vllm bench serve` ran 200 prompts at {rate:.1f} req/s, so {prompts} prompts "
                     f"a run (1.5 x {args.min_run_s:g} s at that rate)")


def sitting_row(k: int, report: dict, wall: float, grouped: str, min_run_s: float) -> dict:
    """One sitting's row: verdict, each judged metric's ratio, interval and word, the runs' shortest and
    longest duration, and whether the shortest fell under `min_run_s`."""
    durations = [float(r.get("duration") or 0) for r in report["runs"] if r.get("ok")]
    judged = [c for c in report["comparison"] if c.get("tolerance") is not None]
    return {"sitting": k + 1, "verdict": report["verdict"]["verdict"], "seconds": round(wall),
            "run_s": [round(min(durations), 1), round(max(durations), 1)] if durations else None,
            "short": bool(durations) and min(durations) < min_run_s,
            "metrics": {c["metric"]: {"ratio": c["ratio"], "low": c.get("low"), "high": c.get("high"),
                                      "word": c.get("word")} for c in judged},
            "autogroup": grouped}


def sittings_table(rows: list[dict]) -> tuple[int, list[str]]:
    """How many sittings reached 'equivalent', and the table of rows."""
    reached = sum(r["verdict"] == "equivalent within tolerance" for r in rows)
    names = list(dict.fromkeys(m for r in rows for m in r.get("metrics", {})))
    lines = ["| sitting | run length (s) | " + " | ".join(names) + " | verdict |",
             "|---|---|" + "---|" * len(names) + "---|"]
    for r in rows:
        cells = []
        for m in names:
            c = r.get("metrics", {}).get(m)
            cells.append("-" if not c or c["ratio"] is None else
                         f"{c['ratio']:.3f} [{c['low']:.3f}, {c['high']:.3f}] {c['word']}" if c["low"] is not None
                         else f"{c['ratio']:.3f} {c['word']}")
        span = f"{r['run_s'][0]}-{r['run_s'][1]}" + (" short" if r.get("short") else "") if r.get("run_s") else "-"
        lines.append(f"| {r['sitting']} | {span} | " + " | ".join(cells) + f" | {r['verdict']} |")
    return reached, lines


def sittings(args: argparse.Namespace, model: Path, url: str, work: Path, load: str, env: dict[str, str],
             grouped: str, ready_s: float) -> int:
    """`--sittings N`: N crosschecks in a row on the one server; per sitting each judged metric's ratio, its
    90 % interval and verdict, the runs' durations; how many sittings reach 'equivalent'. Writes
    benchmarks/results/parity-sittings.md and .json."""
    calibration = "prompts given by --prompts"
    if args.prompts is None:
        args.prompts, calibration = calibrate_prompts(args, model, url, work, env)
        print(calibration, flush=True)
    rows, reports = [], []
    for k in range(args.sittings):
        (work / f"s{k}").mkdir()
        code, report, stderr, wall, xc_grouped = one_crosscheck(args, model, url, work / f"s{k}", load, env)
        if report is None:
            sys.stderr.write(stderr[-5000:])
            rows.append({"sitting": k + 1, "verdict": f"crosscheck failed (exit {code})"})
            continue
        reports.append(report)
        rows.append(sitting_row(k, report, wall, xc_grouped, args.min_run_s))
        print(f"sitting {k + 1}: {report['verdict']['verdict']}", flush=True)
    reached, table = sittings_table(rows)
    lines = [f"<!-- {time.strftime('%Y-%m-%d %H:%M')} -->",
             f"# Parity in {args.sittings} sittings: native client vs `vllm bench serve`", "",
             (f"Server pinned to CPU(s) {args.server_cpus} (ready in {ready_s:.0f} s, {grouped}); crosscheck "
              f"pinned to CPU(s) {args.client_cpus}; per sitting {args.runs} runs of each client of "
              f"`{load.format(prompts=args.prompts, trace='')}`, caches reset before each ({calibration}; runs "
              f"under {args.min_run_s:g} s marked short). Verdict per metric: the "
              "ratio of the geometric means native / vllm with its 90 % interval, equivalent only inside the "
              "tolerance (throughput 5 %, median TTFT and TPOT 10 %)."),
             "", f"**{reached} of {len(rows)} sittings reach \"equivalent\".**", "", *table]
    text = "\n".join(lines) + "\n"
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "parity-sittings.md").write_text(text)
    (OUT / "parity-sittings.json").write_text(json.dumps({"rows": rows, "reports": reports}, indent=2,
                                                         default=str) + "\n")
    print(text, flush=True)
    return 0 if reached == len(rows) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=sorted(RESULT_FILE), default="random")
    ap.add_argument("--runs", type=int, default=None, help="runs of each client (default 5; trace: 9)")
    ap.add_argument("--prompts", type=int, default=None,
                    help="prompts per run (default 100; with --sittings, sized by a calibration run for runs of "
                         "at least --min-run-s)")
    ap.add_argument("--min-run-s", type=float, default=10.0,
                    help="with --sittings: the shortest run length aimed at, in seconds (default 10)")
    ap.add_argument("--sittings", type=int, default=1,
                    help="crosschecks in a row on the one server (random case): how many reach 'equivalent'")
    ap.add_argument("--server-cpus", default="0", help="taskset CPU list of the server")
    ap.add_argument("--client-cpus", default="1", help="taskset CPU list of crosscheck, its Ray and both clients")
    ap.add_argument("--autogroup-nice", type=int, default=-10,
                    help="autogroup niceness of the server's and crosscheck's sessions (0: leave it)")
    args = ap.parse_args()
    args.runs = args.runs or (9 if args.case == "trace" else 5)
    if args.sittings <= 1:
        args.prompts = args.prompts or 100
    sys.path.insert(0, str(REPO))
    from raysweep.lab.tiny_model import make_tiny_model
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
        grouped = autogroup_nice(server.pid, args.autogroup_nice)
        env = {**ENV, "RAY_worker_niceness": "0", "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
        name = RESULT_FILE[args.case]
        if args.case == "multi_turn":
            try:
                os.sched_setaffinity(0, {int(c) for c in args.client_cpus.split(",")})
                t0 = time.monotonic()
                code, table, rows = sessions_check(model, url, args.runs)
                wall = time.monotonic() - t0
            finally:
                stop_server(server)
            head = (f"<!-- {time.strftime('%Y-%m-%d %H:%M')} -->\n# Parity: multi-turn sessions against the "
                    f"server's counters\n\nServer pinned to CPU(s) {args.server_cpus} (ready in {ready_s:.0f} s, "
                    f"{grouped}); "
                    f"the native client pinned to CPU(s) {args.client_cpus}, {args.runs} runs of `{SESSIONS_LOAD}` "
                    f"in {wall:.0f} s, caches reset before each.\n\n")
            OUT.mkdir(parents=True, exist_ok=True)
            (OUT / f"{name}.md").write_text(head + table)
            (OUT / f"{name}.json").write_text(json.dumps(rows, indent=2, default=str) + "\n")
            print(head + table, flush=True)
            return code
        load = LOAD
        if args.case == "trace":
            write_trace(work / "trace.jsonl", n=args.prompts, rate=4.0)  # replayed at --trace-speedup 2: 8 req/s
            load = TRACE_LOAD
        if args.sittings > 1:
            try:
                return sittings(args, model, url, work, load, env, grouped, ready_s)
            finally:
                stop_server(server)
        try:
            t0 = time.monotonic()
            with subprocess.Popen(["taskset", "-c", args.client_cpus, str(BIN / "raysweep"), "crosscheck",
                                   str(campaign(model, args.prompts, work, load)), "--url", url, "-n",
                                   str(args.runs), "--out", str(work / "xc"), "--json"],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  start_new_session=True) as proc:
                xc_grouped = autogroup_nice(proc.pid, args.autogroup_nice)
                try:
                    stdout, stderr = proc.communicate()
                except BaseException:  # its own session gets no Ctrl-C from the terminal: stop it here
                    stop_server(proc)
                    raise
            wall = time.monotonic() - t0
        finally:
            stop_server(server)
        if proc.returncode not in (0, 1) or not stdout:
            sys.stderr.write(stderr[-5000:])
            return proc.returncode or 2
        report = json.loads(stdout)
        report["autogroup"] = {"server": grouped, "crosscheck": xc_grouped}
        report["progress"] = [line for line in stderr.splitlines() if " run " in line]
        sessions = grouped if grouped == xc_grouped else f"{grouped} (server), {xc_grouped} (crosscheck)"
        md = Path(report["report_dir"]) / "crosscheck.md"
        head = (f"<!-- {time.strftime('%Y-%m-%d %H:%M')} -->\n"
                f"# Parity{' (timed trace)' if args.case == 'trace' else ''}: native client vs `vllm bench serve` "
                f"on one real vLLM CPU server\n\n"
                f"Server pinned to CPU(s) {args.server_cpus} (ready in {ready_s:.0f} s); crosscheck, its embedded "
                f"Ray and both clients pinned to CPU(s) {args.client_cpus}, Ray workers at niceness 0; server and "
                f"crosscheck each in a session of its own, {sessions}. "
                f"Crosscheck took {wall:.0f} s.\n"
                f"Command: `taskset -c {args.client_cpus} raysweep crosscheck parity.yaml --url {url} "
                f"-n {args.runs}`\n\n")
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / f"{name}.md").write_text(
            head + md.read_text().replace("# raysweep crosscheck", "## raysweep crosscheck", 1))
        (OUT / f"{name}.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(head + md.read_text(), flush=True)
        return proc.returncode


if __name__ == "__main__":
    sys.exit(main())

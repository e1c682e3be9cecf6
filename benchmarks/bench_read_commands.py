"""How long raysweep's read commands take on finished campaigns of many points and of many runs.

Each campaign is a stub: a real campaign file (a `vllm serve` grid over max_num_seqs, a bench grid over
random_input_len x max_concurrency, 2 runs), its ledger synced from the real plan, every point marked done
with a result file as raysweep writes it (vLLM's fields, server metrics, the validity record, 64 per-request
latencies) and, as the native backend keeps them, the raw samples of its requests (32 requests of 16
chunks, `points/.../run=N.samples.parquet`: the summary's pooled percentiles and their two-level bootstrap
read them), made here directly: no server, no Ray. Two shapes: many points (2 configurations x 9, 500 or 5,000
bench points x 2 runs: 36, 2,000 and 20,000 runs, 18, 1,000 and 10,000 points; the cost of the summary grows
with the points) and many runs (`runs2000`: 2 configurations x 5 bench points x 200 runs, 10 points).
Then each read command runs as a user runs it (a fresh `python -m raysweep` process, so imports count) and its
wall time is taken; `run` on the finished campaign checks that it answers without starting Ray; `run (end)` is
the same with results.*, summary.* and answer.json removed, so that it writes them again: the work `run` does
after its last point (a campaign without `report: true`; `report (cold)` is what that adds). The stub ends as
`run` ends, with results.*, summary.* and answer.json written (`results --aggregate` and `compare` read the
kept aggregates, `status` the kept answer); `results --aggregate --confidence 0.9` makes the kept summary's
intervals again at that level. `report (cold)` writes the report into the campaign dir with no figure kept
(every figure drawn and kept in .figures/, as at the end of a `run` with `report: true`); `report` then writes
it elsewhere (`--out`) from the kept figures, as a user's `raysweep report` after `run` (it makes them first,
untimed, when none are kept).

    .venv/bin/python benchmarks/bench_read_commands.py [--sizes 36,2000,20000,runs2000] [--commands ...]
        [--keep DIR] [--repeat N] [--record]

`--repeat N` times each command N times (prepared afresh each time) and shows the medians; `--record` rewrites
the table of the `## read commands` section of benchmarks/RESULTS.md. `compare --json` may be named in
`--commands` beside the defaults.

Sizes: 36 = 2 server configs x 9 bench points x 2 runs (the demo's shape); 2000 = 2 x 500 x 2;
20000 = 2 x 5,000 x 2; runs2000 = 2 x 5 x 200.
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from raysweep.record.directory import CampaignDir

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# name -> (input lengths, concurrencies per server config, runs)
SIZES = {"36": (3, 3, 2), "2000": (20, 25, 2), "20000": (50, 100, 2), "runs2000": (1, 5, 200)}
COMMANDS = ("status", "results --aggregate", "results --aggregate --confidence 0.9", "compare", "report (cold)",
            "report", "plot", "pareto", "run (finished)", "run (end)")
REQUESTS, CHUNKS = 32, 16  # raw samples per run: requests, and token chunks per request
# What a command may write into the campaign dir (anything else is noted in the table)
WRITES = {"report (cold)": ("report.html", ".figures/"), "run (end)": ("results.", "summary.", "answer.json")}
# The names in RESULTS.md's table
LABELS = {"compare": "`compare DIR DIR`", "report (cold)": "`report` (cold: every figure drawn)",
          "report": "`report` (figures kept, after `run`)", "run (finished)": "`run` (finished)",
          "run (end)": "`run` (end: results and summary written)"}


def campaign_data(name: str, out: Path, lengths: int, concurrencies: int, runs: int = 2) -> dict[str, Any]:
    """A campaign of 2 server configs x lengths x concurrencies bench points x runs."""
    return {"name": name, "output_dir": str(out), "runs": runs,
            "serve": {"cmd": "vllm serve tiny --dtype bfloat16", "params": {"grid": {"max_num_seqs": [8, 16]}}},
            "bench": {"backend": "native", "cmd": "vllm bench serve --model tiny --dataset-name random "
                                                  "--num-prompts 32 --random-output-len 16",
                      "params": {"grid": {"random_input_len": [16 * (i + 1) for i in range(lengths)],
                                          "max_concurrency": [i + 1 for i in range(concurrencies)]}}}}


def stub_samples(rng: random.Random, ttft_ms: float, tpot_ms: float) -> dict[str, Any]:
    """Raw samples of one run as the native backend writes them: REQUESTS requests, CHUNKS chunks each."""
    cols: dict[str, list[Any]] = {k: [] for k in ("index", "actor", "due", "ready", "sent", "first", "end", "in_tok",
                                                  "out_tok", "ok", "error", "chunks", "begin", "done", "text",
                                                  "first_out", "reasoning", "session", "turn")}
    for i in range(REQUESTS):
        begin = i * 0.01
        first = ttft_ms / 1000.0 * rng.uniform(0.7, 1.4)
        chunks = [first]
        for _ in range(CHUNKS - 1):
            chunks.append(chunks[-1] + tpot_ms / 1000.0 * rng.uniform(0.6, 1.5))
        for key, value in (("index", i), ("actor", 0), ("due", begin), ("ready", begin), ("sent", begin),
                           ("first", begin + first), ("end", begin + chunks[-1]), ("in_tok", 64), ("out_tok", CHUNKS),
                           ("ok", True), ("error", None), ("chunks", chunks), ("begin", begin),
                           ("done", begin + chunks[-1]), ("text", None), ("first_out", begin + first),
                           ("reasoning", False), ("session", -1), ("turn", -1)):
            cols[key].append(value)
    return cols


def stub_record(point: Any, rng: random.Random) -> dict[str, Any]:
    """A result record shaped like the native backend's: vLLM's metrics, our ids, server metrics, validity."""
    mns = int(point.serve.params["max_num_seqs"])
    conc = int(point.bench.params["max_concurrency"])
    length = int(point.bench.params["random_input_len"])
    busy = min(conc, mns)
    thr = 40.0 * busy * (64 / (64 + length)) * rng.gauss(1.0, 0.03)
    ttft = 5.0 * (1 + max(0, conc - mns)) * (1 + length / 256) * rng.gauss(1.0, 0.05)
    tpot = 2.0 * (1 + busy / 8) * rng.gauss(1.0, 0.03)
    rec: dict[str, Any] = {
        "campaign": "stub", "serve_id": point.serve.id, "bench_id": point.bench.id, "point_id": point.id,
        "run_number": point.run, "serve_label": point.serve.label, "bench_label": point.bench.label,
        **point.serve.params, **point.bench.params, "backend": "native", "request_rate": "inf",
        "completed": 32, "failed": 0, "duration": 32 * 16 / thr, "total_input_tokens": 32 * length,
        "total_output_tokens": 512, "request_throughput": thr / 16, "output_throughput": thr,
        "total_token_throughput": thr * (1 + length / 16), "max_concurrent_requests": conc,
        "tensor_parallel_size": 1, "pipeline_parallel_size": 1, "data_parallel_size": 1, "gpu_count": 1,
        "num_nodes": 1, "server_id": f"{point.serve.id}-0", "node_ip": "127.0.0.1", "gpu_ids": "",
        "client_limited": False, "validity_ok": True, "validity_issues": "",
    }
    for metric, base in (("ttft", ttft), ("tpot", tpot), ("itl", tpot), ("e2el", ttft + 15 * tpot)):
        for stat, k in (("mean", 1.0), ("median", 0.97), ("std", 0.2), ("p90", 1.4), ("p99", 1.9)):
            rec[f"{stat}_{metric}_ms"] = base * k
    for gauge in ("kv_cache_usage_perc", "num_requests_running", "num_requests_waiting"):
        rec[f"server_{gauge}_peak"] = busy * 1.0
        rec[f"server_{gauge}_mean"] = busy * 0.8
    rec.update({"server_num_preemptions": 0, "server_prompt_tokens": 32 * length, "server_generation_tokens": 512,
                "server_mean_ttft_ms": ttft * 0.9, "server_mean_queue_ms": 0.1, "server_mean_e2el_ms": ttft + 15 * tpot,
                "server_mean_requests_in_inference": busy * 0.9, "server_metrics_complete": True,
                "latencies": [round(rng.uniform(0.05, 0.2), 4) for _ in range(64)],
                "ttfts": [round(rng.uniform(0.001, 0.02), 4) for _ in range(64)]})
    return rec


def build_stub(out: Path, size: str | int, name: str = "stub") -> Path:
    """A finished stub campaign of shape `size` (a key of SIZES) in `out`; returns the campaign file."""
    size = str(size)
    import raysweep.modes  # noqa: F401 - every mode registered (raysweep.drive.hooks), as the faces do
    from raysweep.campaign import load_campaign
    from raysweep.drive.driver import open_campaign
    from raysweep.record.files import write_json_atomic
    from raysweep.record.runs import write_samples

    lengths, concurrencies, runs = SIZES[size]
    out.mkdir(parents=True, exist_ok=True)
    cfile = out.parent / f"{out.name}.yaml"
    cfile.write_text(yaml.safe_dump(campaign_data(name, out, lengths, concurrencies, runs)))
    spec = load_campaign(cfile)
    plan, ledger = open_campaign(spec, CampaignDir(out))
    rng = random.Random(size)
    try:
        for p in plan.points:
            rel = f"points/{p.serve.id}/{p.bench.id}/run={p.run}.json"
            record = stub_record(p, rng)
            kept = f"points/{p.serve.id}/{p.bench.id}/run={p.run}.samples.parquet"
            write_samples(out / kept, stub_samples(rng, record["median_ttft_ms"], record["median_tpot_ms"]))
            write_json_atomic(out / rel, {**record, "samples_path": kept})
        with ledger._tx() as c:  # one transaction for all: the per-point calls would take minutes at 20,000
            c.executemany("UPDATE points SET state = 'done', attempts = 1, result_path = ? WHERE point_id = ?",
                          [(f"points/{p.serve.id}/{p.bench.id}/run={p.run}.json", p.id) for p in plan.points])
    finally:
        ledger.close()
    assert len(plan.points) == 2 * lengths * concurrencies * runs, len(plan.points)
    from raysweep.results.table import write_results

    with CampaignDir(out) as directory:
        write_results(directory)  # as `run` does at its end: results.* and summary.* (the aggregates, kept)
    return cfile


def keep_stub_answer(out: Path) -> None:
    """The campaign's answer kept (answer.json), as `run` keeps it at its end without a report."""
    from raysweep.report.page import conclusions_of
    from raysweep.results.answer_file import keep_answer

    with CampaignDir(out) as directory:
        made = conclusions_of(directory)
        if made is not None:
            keep_answer(directory, made.answer)


def argv_of(command: str, out: Path, cfile: Path, scratch: Path) -> list[str]:
    if command in ("run (finished)", "run (end)"):
        return ["run", str(cfile)]
    if command.startswith("compare"):  # `compare` and `compare --json`: the campaign against itself
        return ["compare", str(out), str(out), *command.split()[1:]]
    if command == "report (cold)":
        return ["report", str(out)]
    if command == "report":
        return ["report", str(out), "--out", str(scratch / "report.html")]
    if command in ("plot", "pareto"):
        return [command, str(out), "--out", str(scratch / command)]
    words = command.split()
    return [words[0], str(out), *words[1:]]


def time_command(argv: list[str]) -> tuple[float, float, int, str]:
    """Wall seconds, CPU seconds (user + system of the process and its children), exit code, stderr tail."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           "VLLM_HOST_IP": "127.0.0.1", "RAY_AUTH_MODE": "disabled", "COLUMNS": "200"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "raysweep", *argv], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu, proc.returncode, proc.stderr[-2000:]


def prepare(command: str, out: Path, cfile: Path, scratch: Path) -> None:
    """`report (cold)`: no report and no figure kept; `report`: the figures kept (made untimed if none are)."""
    if command == "report (cold)":
        shutil.rmtree(out / ".figures", ignore_errors=True)
        (out / "report.html").unlink(missing_ok=True)
    elif command == "report" and not (out / ".figures").is_dir():
        time_command(argv_of("report (cold)", out, cfile, scratch))
    elif command == "run (end)":  # as at the end of `run`: the results, their summary and answer not yet written
        for kept in (*out.glob("results.*"), *out.glob("summary.*"), *out.glob("answer.json")):
            kept.unlink()


def snapshot(out: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(out)): (p.stat().st_size, p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="36,2000,20000,runs2000")
    ap.add_argument("--commands", default=",".join(COMMANDS))
    ap.add_argument("--keep", default=None, help="Build the stubs here and keep them (default: a temp dir).")
    ap.add_argument("--repeat", type=int, default=1,
                    help="Time each command this many times (each prepared afresh) and show the medians.")
    ap.add_argument("--record", action="store_true", help="Write the table into benchmarks/RESULTS.md.")
    args = ap.parse_args()
    sizes = [s.strip() for s in args.sizes.split(",")]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        ap.error(f"--sizes {','.join(unknown)}: accepted: {', '.join(SIZES)}")
    commands = [c.strip() for c in args.commands.split(",")]
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="rs-read-"))
    table: dict[str, dict[str, str]] = {c: {} for c in commands}
    try:
        for size in sizes:
            out = base / f"stub{size}"
            if not (out / "ledger.sqlite").exists():
                t0 = time.perf_counter()
                build_stub(out, size)
                keep_stub_answer(out)
                print(f"built {shape(size)} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
            cfile = base / f"stub{size}.yaml"
            for command in commands:
                walls, cpus, note = [], [], ""
                for _ in range(max(1, args.repeat)):
                    wall, cpu, one = time_once(command, out, cfile, base / f"scratch{size}")
                    walls.append(wall)
                    cpus.append(cpu)
                    note = note or one
                    print(f"{size:>8}  {command:<38} {wall:7.2f} s wall {cpu:7.2f} s CPU{one}  "
                          f"(load {os.getloadavg()[0]:.1f})", file=sys.stderr)
                wall, cpu = statistics.median(walls), statistics.median(cpus)
                table[command][size] = f"{wall:.2f} ({cpu:.2f}){note}"
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    text = markdown(table, sizes)
    print(text)
    if args.record:
        record(text)


def time_once(command: str, out: Path, cfile: Path, scratch: Path) -> tuple[float, float, str]:
    """One timing of `command` on the stub in `out`, prepared afresh: wall s, CPU s, a note (exit code, stray
    files written into the campaign dir)."""
    shutil.rmtree(scratch, ignore_errors=True)
    prepare(command, out, cfile, scratch)
    before = snapshot(out)
    wall, cpu, rc, err = time_command(argv_of(command, out, cfile, scratch))
    wrote = sorted(name for name, _ in set(snapshot(out).items()) - set(before.items())
                   if not name.startswith(WRITES.get(command, ())))
    note = "" if rc == 0 else f" (exit {rc})"
    if wrote:
        note += f" (wrote {len(wrote)} file(s) in the campaign dir)"
    if rc:
        print(err, file=sys.stderr)
    return wall, cpu, note


def shape(size: str) -> str:
    """`1,000 points x 2 runs`: the shape of a stub."""
    lengths, concurrencies, runs = SIZES[size]
    return f"{2 * lengths * concurrencies:,} points x {runs} runs"


def markdown(table: dict[str, dict[str, str]], sizes: list[str]) -> str:
    """Wall seconds (CPU seconds) per command and shape; with 2,000 and 20,000 runs both measured, the growth
    of the wall time from one to the other (10x the points: linear growth is 10x)."""
    grow = "2000" in sizes and "20000" in sizes
    head = ("| command | " + " | ".join(shape(s) for s in sizes) + (" | 10,000 / 1,000 points |" if grow else " |"))
    rows = [f"| {LABELS.get(c, f'`{c}`')} | " + " | ".join(table[c].get(s, "-") for s in sizes)
            + (f" | {_growth(table[c].get('20000'), table[c].get('2000'))} |" if grow else " |") for c in table]
    return "\n".join([head, "|---" * (len(sizes) + 1 + grow) + "|", *rows])


def _growth(last: str | None, before: str | None) -> str:
    try:
        return f"{float(str(last).split()[0]) / float(str(before).split()[0]):.1f}x"
    except (ValueError, ZeroDivisionError):
        return "-"


def record(table: str) -> None:
    path = ROOT / "benchmarks" / "RESULTS.md"
    text = path.read_text()
    start = text.find("\n## read commands")
    if start < 0:
        return print("RESULTS.md has no `## read commands` section to update", file=sys.stderr)
    end = text.find("\n## ", start + 1)
    end = len(text) if end < 0 else end
    section = text[start:end]
    t0, t1 = section.find("\n| command |"), section.find("\n\n", section.find("\n| command |"))
    day = datetime.date.today().isoformat()
    stamp = f"\n\nRecorded {day} on this VM (2 cores)."
    new = section[:t0] + "\n" + table + stamp + section[t1:] if t0 >= 0 else section
    path.write_text(text[:start] + new + text[end:])


if __name__ == "__main__":
    main()

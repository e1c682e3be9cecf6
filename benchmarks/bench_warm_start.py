"""The start of a second server configuration of the same model on a node, against the cold start.

The real vLLM CPU build serves the tiny dummy-weight Llama (`raysweep tiny-model`) with compilation on (no
`--enforce-eager`). Campaign 1 starts three configurations one after the other (`max_num_seqs` 8; the same
without prefix caching, which vLLM leaves out of its compilation hash, so it has the same compiled graph;
`max_num_seqs` 16, which vLLM keys apart) on this machine with `serve.share_caches: true` and a campaign name
never used before, so its shared compilation caches (~/.cache/raysweep/<name>) start empty: the first start
is cold. Campaign 2, the same name in another output dir, starts the first configuration again. Each start's
phases come from raysweep's own record of it (the ledger's servers rows, `raysweep.serve.startup`), with its
compilation label (cold, warm, recompiled, none: `raysweep.serve.caches.compile_cache_state`; on the CPU build a start
loads its compiled graph with raysweep's vLLM plugin, `raysweep.vllm_plugin`). For a later configuration also
what the campaign waited for it: from the end of the previous configuration's last point to its server being
ready (the previous server's stop, the placement and the start). Target (issue 28): the second configuration's
start at most 60 % of the cold one.

    .venv/bin/python benchmarks/bench_warm_start.py [--keep]

Writes benchmarks/results/warm-start.md and .json; the shared cache directory and the campaigns' output dirs
are removed at the end unless `--keep`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
OUT = REPO / "benchmarks" / "results"
SERVE = "--load-format dummy --max-model-len 1024 --dtype bfloat16 --gpu-memory-utilization 0.2"
ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0", "VLLM_HOST_IP": "127.0.0.1",
       "RAY_AUTH_MODE": "disabled"}


def campaign(work: Path, name: str, out: str, model: Path, params: list[dict]) -> Path:
    f = work / f"{out}.yaml"
    f.write_text(yaml.safe_dump({
        "name": name, "output_dir": str(work / out), "runs": 1,
        "serve": {"cmd": f"vllm serve {model} {SERVE}", "share_caches": True, "ready_timeout_s": 600,
                  "env": {"VLLM_CPU_KVCACHE_SPACE": 1, "VLLM_HOST_IP": "127.0.0.1"},
                  "params": params},
        "bench": {"cmd": f"vllm bench serve --model {model} --dataset-name random --random-input-len 16 "
                         "--random-output-len 4 --num-prompts 4 --max-concurrency 2"}}))
    return f


# max_num_seqs is in vLLM's compilation hash (0.32: SchedulerConfig.compute_hash), enable_prefix_caching is not
# (CacheConfig.compute_hash ignores it): the second start has the first one's compiled graph, the third another
CONFIGS = [{"max_num_seqs": 8}, {"max_num_seqs": 8, "enable_prefix_caching": False}, {"max_num_seqs": 16}]


def describe(params: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in params.items() if not k.startswith("_"))


def starts(output_dir: Path) -> list[dict]:
    """Each recorded start in order, with its phases and what the campaign waited for it: from the end of the
    previous configuration's last point (its server then stops, its placement group is freed, this one's is
    reserved, its host actor starts and launches the server) to this server being ready; None for the first."""
    con = sqlite3.connect(f"file:{output_dir / 'ledger.sqlite'}?mode=ro", uri=True)
    con.row_factory = sqlite3.Row
    rows = con.execute("SELECT s.server_id, s.serve_id, s.started_at, s.ready_at, s.stopped_at, s.startup, "
                       "(SELECT p.serve_params FROM points p WHERE p.serve_id = s.serve_id LIMIT 1) AS params, "
                       "(SELECT MAX(p.ended_at) FROM points p WHERE p.serve_id = s.serve_id) AS last_end "
                       "FROM servers s ORDER BY s.started_at").fetchall()
    con.close()
    out: list[dict] = []
    for prev, r in zip([None, *rows[:-1]], rows):
        rec = {"server_id": r["server_id"], "serve_id": r["serve_id"], "params": json.loads(r["params"] or "{}"),
               **json.loads(r["startup"] or "{}")}
        if prev is not None and prev["last_end"] and r["ready_at"]:
            rec["wait_s"] = r["ready_at"] - prev["last_end"]  # what the campaign waited between configurations
            rec["stop_s"] = (prev["stopped_at"] or prev["last_end"]) - prev["last_end"]
            rec["placing_s"] = r["started_at"] - (prev["stopped_at"] or prev["last_end"])
        out.append(rec)
    return out


def run(f: Path) -> None:
    proc = subprocess.run([str(BIN / "raysweep"), "run", str(f)], env={**os.environ, **ENV}, capture_output=True,
                          text=True, timeout=1800)
    if proc.returncode != 0:
        sys.exit(f"raysweep run {f} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def table(labels: list[str], rows: list[dict]) -> list[str]:
    """The Markdown table of the starts: phases, compilation label, share of the cold start, campaign wait."""
    cold = rows[0]["startup_s"]
    cols = [("startup_s", "ready"), ("startup_imports_s", "imports"), ("startup_process_s", "process"),
            ("startup_engine_s", "engine"), ("startup_weights_s", "weights"), ("startup_kv_cache_s", "init"),
            ("startup_compile_s", "of which compile"), ("startup_api_s", "API"), ("startup_cache_mb", "cache MB")]
    lines = ["| start | compilation | " + " | ".join(c for _, c in cols) + " | of cold | campaign wait (stop + "
             "placing + ready) | of cold |", "|---|---|" + "---|" * len(cols) + "---|---|---|"]
    for label, r in zip(labels, rows, strict=True):
        wait = (f"{r['wait_s']:.1f} ({r['stop_s']:.1f} + {r['placing_s']:.1f} + {r['startup_s']:.1f}) | "
                f"{100 * r['wait_s'] / cold:.0f} %" if "wait_s" in r else "- | -")
        lines.append(f"| {label} | {r.get('compile_cache', '-')} | "
                     + " | ".join(f"{r[p]:.1f}" if p in r else "" for p, _ in cols)
                     + f" | {100 * r['startup_s'] / cold:.0f} % | {wait} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", action="store_true", help="keep the shared cache directory and the campaigns' output "
                    "dirs (the servers' logs)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rs-warm-"))
    model = work / "tiny-llama"
    subprocess.run([str(BIN / "raysweep"), "tiny-model", str(model)], check=True, capture_output=True)
    name = f"warm-start-{int(time.time())}"
    run(campaign(work, name, "first", model, CONFIGS))
    first = starts(work / "first")
    run(campaign(work, name, "again", model, [first[0]["params"]]))  # the configuration that started cold, again
    rows = first + starts(work / "again")
    labels = [f"{n}. {describe(r['params'])}" for n, r in enumerate(rows[:-1], 1)]
    labels = [labels[0] + ", empty caches", *labels[1:], f"{len(rows)}. {describe(rows[-1]['params'])} again"]
    lines = table(labels, rows)
    cache = rows[0].get("cache_dir")
    header = (f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores; vLLM CPU build, tiny "
              f"dummy-weight Llama, compilation on; phases in seconds (log time stamps +-1 s), cache in MB ({cache})")
    text = "\n".join([f"# Warm starts\n\n{header}\n", *lines, ""])
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "warm-start.md").write_text(text)
    (OUT / "warm-start.json").write_text(json.dumps({"header": header, "starts": rows}, indent=2))
    print(text)
    if args.keep:
        print(f"kept: {cache} and {work}")
        return
    if cache:
        shutil.rmtree(Path(cache), ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

"""How long the catalogue takes at a team's scale: 1,000 campaigns, 1,000,000 runs.

The catalogue is built in two parts. 1,000 stub campaigns of 1,000 runs each (10 server configurations x
10 loads x 10 runs; 3 models, 2 hardware kinds, vLLM versions over time) are written straight in the
catalogue's own format (`runs/<id>.parquet` and the index, as `catalog add` writes them): making 1,000 real
campaign directories of 1,000 run files each would take hours and measure the file system, not the
catalogue. Then what a user runs is timed, each as a fresh `python -m raysweep` process (imports count):

- `catalog add` of one real stub campaign directory of 2,000 runs (tests/catalog_stubs.py: a real campaign
  file, ledger and run files) into that catalogue, and `catalog add` of it again (unchanged: nothing added);
- `history` of one configuration and workload across the catalogue (`--config ... --input-len ...`);
- `catalog query` of one model's points (the mean of two metrics per point, over 1,000,000 runs);
- `site` of the whole catalogue (when `raysweep site` exists).

    .venv/bin/python benchmarks/bench_catalog.py [--campaigns 1000] [--runs 1000] [--keep DIR] [--record]
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_read_commands import time_command

MODELS = ("meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-7B-Instruct", "mistralai/Mistral-7B-Instruct-v0.3")
HARDWARE = ("1 node(s) x 1 GPU(s) / GPU NVIDIA H100 80GB HBM3", "1 node(s) x 1 GPU(s) / GPU NVIDIA A100-SXM4-80GB")
VLLM = ("0.30.0", "0.31.0", "0.32.0", "0.33.0")


def stub_rows(i: int, runs: int, rng: np.random.Generator) -> pd.DataFrame:
    """One stub campaign's catalogue rows: 10 configurations x (runs / 100) loads x 10 runs."""
    from raysweep.catalog import fields

    model, hardware = MODELS[i % len(MODELS)], HARDWARE[(i // 3) % len(HARDWARE)]
    date = 1.7e9 + i * 3600.0
    vllm = VLLM[min(i * len(VLLM) // 1000, len(VLLM) - 1)]
    loads = max(1, runs // 100)
    n = 10 * loads * 10
    cfg = np.repeat(np.arange(10), loads * 10)
    load = np.tile(np.repeat(2 ** np.arange(loads), 10), 10)
    thr = 40.0 * np.minimum(load, 8 * (cfg + 1)) * rng.normal(1.0, 0.03, n)
    wl = fields.bench_fields(["--dataset-name", "random", "--random-input-len", "1024", "--random-output-len", "128"])
    cid = f"stub{i:05d}"
    settings = [f"vllm serve {model} --max-num-seqs {8 * (c + 1)}" for c in range(10)]
    df = pd.DataFrame({
        "campaign_id": cid, "campaign": f"nightly-{i:04d}", "source": "raysweep", "source_path": f"/runs/{cid}",
        "config": [f"max_num_seqs={8 * (c + 1)}" for c in cfg], "point": [f"{c}|{x}" for c, x in zip(cfg, load)],
        "server_settings": [settings[c] for c in cfg], "model": model, "model_revision": None,
        **{k: wl[k] for k in ("workload", "dataset", "dataset_params", "input_len", "output_len")},
        "load_variable": "max_concurrency", "hardware": hardware, "gpu_type": hardware.rsplit("GPU ", 1)[-1],
        "interconnect": None, "vllm_version": vllm, "raysweep_version": "0.9.0", "ray_version": "2.60.0",
        "torch_version": "2.8.0+cu128", "build": "cuda", "validity_issues": None,
        "run_number": np.tile(np.arange(10), 10 * loads), "load_value": load.astype(float), "gpu_count": 1.0,
        "num_nodes": 1.0, "date": date + np.arange(n), "validity_ok": True, "client_limited": False,
        "request_throughput": thr / 128, "output_throughput": thr, "total_token_throughput": thr * 9,
    })
    for m in fields.METRICS:
        if m not in df:
            df[m] = (5.0 + load * 0.5) * rng.normal(1.0, 0.05, n) * (10 if "e2el" in m else 1)
    return df[list(fields.COLUMNS)]


def build_catalog(cat: Path, campaigns: int, runs: int) -> float:
    """The stub catalogue (see the module docstring); returns seconds taken."""
    from raysweep.catalog import store
    from raysweep.catalog.fields import frame

    t0 = time.perf_counter()
    (cat / store.RUNS_DIR).mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    schema = None
    entries = {}
    for i in range(campaigns):
        df = stub_rows(i, runs, rng)
        if schema is None:
            schema = frame(df.head(1).to_dict("records")).dtypes
        df = df.astype(schema)
        buf = io.BytesIO()
        df.to_parquet(buf, index=False)
        cid = str(df["campaign_id"].iloc[0])
        (cat / store.RUNS_DIR / f"{cid}.parquet").write_bytes(buf.getvalue())
        entries[cid] = {"id": cid, "name": str(df["campaign"].iloc[0]), "source": "raysweep",
                        "path": f"/runs/{cid}", "signature": "stub", "complete": True, "runs": len(df),
                        "points": int(df["point"].nunique()), "models": [str(df["model"].iloc[0])],
                        "hardware": [str(df["hardware"].iloc[0])], "vllm": [str(df["vllm_version"].iloc[0])],
                        "first_date": float(df["date"].min()), "last_date": float(df["date"].max()),
                        "added_at": time.time(), "updated_at": time.time()}
    (cat / store.INDEX_FILE).write_text(json.dumps({"format": store.FORMAT, "campaigns": entries}))
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--campaigns", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--keep", type=Path, default=None)
    ap.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    ap.add_argument("--reuse", action="store_true", help="reuse the stub catalogue kept in --keep (the real "
                                                          "campaign taken out of it first)")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="bench-catalog-"))
    cat = work / "catalog"
    if args.reuse and (cat / "catalog.json").is_file():
        index = json.loads((cat / "catalog.json").read_text())
        for cid in [c for c, e in index["campaigns"].items() if not c.startswith("stub")]:
            del index["campaigns"][cid]
            (cat / "runs" / f"{cid}.parquet").unlink(missing_ok=True)
        (cat / "catalog.json").write_text(json.dumps(index))
        built = math.nan
    else:
        built = build_catalog(cat, args.campaigns, args.runs)
    total = args.campaigns * args.runs
    made = "reused" if math.isnan(built) else f"written in {built:.0f} s"
    print(f"stub catalogue: {args.campaigns} campaigns, {total} runs {made}", flush=True)
    from catalog_stubs import make_campaign

    t0 = time.perf_counter()
    shutil.rmtree(work / "real", ignore_errors=True)
    real = make_campaign(work / "real/big", "big", runs=20, input_lens=tuple(16 * (k + 1) for k in range(5)),
                         concurrencies=tuple(range(1, 11)), write_results=True)
    print(f"a real stub campaign of 2,000 runs made in {time.perf_counter() - t0:.1f} s (untimed)", flush=True)
    rows = []
    steps = [("`catalog add` of a 2,000-run campaign", ["catalog", "add", str(cat), str(real)]),
             ("`catalog add` of it again (unchanged)", ["catalog", "add", str(cat), str(real)]),
             ("`history` of one configuration and workload",
              ["history", str(cat), "--config", "max_num_seqs=16", "--input-len", "1024", "--model", MODELS[0]]),
             ("`catalog query` of one model's points",
              ["catalog", "query", str(cat), "--model", MODELS[1], "--csv"])]
    from importlib.util import find_spec

    if find_spec("raysweep.catalog.site") is not None:
        steps.append(("`site` of the whole catalogue", ["site", str(cat), str(work / "site")]))
    for label, argv in steps:
        wall, cpu, rc, tail = time_command(argv)  # bench_read_commands: a fresh `python -m raysweep`
        print(f"{label}: {wall:.2f} s wall, {cpu:.2f} s CPU (exit {rc})", flush=True)
        if rc not in (0,):
            print(tail)
        rows.append((label, wall, cpu, rc))
    table = ["| step | wall s | CPU s | exit |", "|---|---|---|---|"]
    table += [f"| {label} | {wall:.2f} | {cpu:.2f} | {rc} |" for label, wall, cpu, rc in rows]
    stamp = datetime.date.today().isoformat()
    text = (f"\n## catalogue ({stamp})\n\n`benchmarks/bench_catalog.py`: a catalogue of {args.campaigns:,} stub "
            "campaigns "
            f"and {total + 2000:,} runs ({total:,} in the catalogue's format, {made}; one real "
            "2,000-run stub campaign added with `catalog add`); each step a fresh `python -m raysweep` process. "
            "Measured on the 2-core development machine with other work on the machine (other developers' tests "
            "running), so the figures are upper bounds of what the machine does alone.\n\n" + "\n".join(table) + "\n")
    print(text)
    if args.record:
        with open(ROOT / "benchmarks" / "RESULTS.md", "a") as f:
            f.write(text)


if __name__ == "__main__":
    main()

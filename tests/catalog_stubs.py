"""Stub campaigns for the catalogue's tests and benchmark: a real campaign file, its ledger synced from the
real plan, and a result file per finished run as raysweep writes it (benchmarks/bench_read_commands.py's
`stub_record`), with the run's start time and the server's versions set; no server, no Ray, no samples."""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import yaml

from raysweep.record.directory import CampaignDir

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))


def make_campaign(out: Path, name: str = "stub", *, runs: int = 4, scale: float = 1.0, started_at: float = 1.7e9,
                  vllm: str = "0.32.0", input_lens: tuple[int, ...] = (16, 32), concurrencies: tuple[int, ...] = (1, 2),
                  done: int | None = None, seed: int = 0, hardware: str = "1 node(s) x 1 GPU(s) / GPU H100",
                  write_results: bool = False) -> Path:
    """A campaign of 2 server configs (max_num_seqs 8, 16) x input lengths x concurrencies x `runs`, its
    throughputs multiplied by `scale`; the first `done` runs finished (all by default)."""
    from bench_read_commands import stub_record

    from raysweep.campaign import load_campaign
    from raysweep.drive.driver import open_campaign
    from raysweep.record.files import write_json_atomic

    out.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {
        "name": name, "output_dir": str(out), "runs": runs,
        "serve": {"cmd": "vllm serve tiny --dtype bfloat16", "params": {"grid": {"max_num_seqs": [8, 16]}}},
        "bench": {"backend": "native", "cmd": "vllm bench serve --model tiny --dataset-name random "
                                              "--num-prompts 32 --random-output-len 16",
                  "params": {"grid": {"random_input_len": list(input_lens), "max_concurrency": list(concurrencies)}}}}
    cfile = out.parent / f"{out.name}.yaml"
    cfile.write_text(yaml.safe_dump(data))
    plan, ledger = open_campaign(load_campaign(cfile), CampaignDir(out))
    rng = random.Random(seed)
    finished = plan.points if done is None else plan.points[:done]
    try:
        for i, p in enumerate(finished):
            rec = stub_record(p, rng)
            rec["campaign"] = name
            for k in ("request_throughput", "output_throughput", "total_token_throughput"):
                rec[k] *= scale
            rec.update(started_at=started_at + i, hardware=hardware, provenance_vllm=vllm,
                       provenance_raysweep="0.9.0", provenance_ray="2.60.0", provenance_torch="2.8.0+cpu",
                       provenance_gpu="H100", provenance_model_path="tiny")
            write_json_atomic(out / f"points/{p.serve.id}/{p.bench.id}/run={p.run}.json", rec)
        with ledger._tx() as c:
            c.executemany("UPDATE points SET state = 'done', attempts = 1, result_path = ?, ended_at = ? "
                          "WHERE point_id = ?",
                          [(f"points/{p.serve.id}/{p.bench.id}/run={p.run}.json", started_at + i, p.id)
                           for i, p in enumerate(finished)])
    finally:
        ledger.close()
    if write_results:
        from raysweep.record.files import write_bytes_atomic
        from raysweep.results.records import results_table

        with CampaignDir(out) as directory:
            write_bytes_atomic(out / "results.parquet", results_table(directory).to_parquet(index=False))
    return out

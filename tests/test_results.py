"""Unit tests for raysweep.results.table and the `status` / `results` commands, on an output dir built by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from click.testing import CliRunner

from raysweep.cli import main
from raysweep.ledger import LEDGER_FILE, Ledger
from raysweep.record.directory import CampaignDir
from raysweep.record.files import write_json_atomic
from raysweep.results.table import PER_REQUEST_KEYS, load_records, results_table, write_results

SERVE_A = {"max_num_seqs": 4, "compilation_config": {"mode": 3}}
SERVE_B = {"max_num_seqs": 8, "compilation_config": {"mode": 0}}
BENCH = {"random_input_len": 16, "max_concurrency": 4}

# (point_id, serve_id, serve params, run, state, request_rate)
POINTS = [
    ("pa0", "sa", SERVE_A, 0, "done", "inf"),
    ("pa1", "sa", SERVE_A, 1, "done", 10.0),
    ("pb0", "sb", SERVE_B, 0, "done", "inf"),
    ("pb1", "sb", SERVE_B, 1, "failed", None),
    ("pb2", "sb", SERVE_B, 2, "pending", None),
]


def vllm_result(request_rate: Any, ttft: float) -> dict[str, Any]:
    """The shape of a `vllm bench serve --save-result` JSON (reference/vllm.md §1.7), a few requests long."""
    return {
        "date": "20250101-000000", "endpoint_type": "vllm", "backend": "vllm", "label": None,
        "model_id": "m", "tokenizer_id": "m", "num_prompts": 3,
        "request_rate": request_rate, "burstiness": 1.0, "max_concurrency": 4,
        "duration": 1.25, "completed": 3, "failed": 0, "total_input_tokens": 48, "total_output_tokens": 24,
        "request_throughput": 2.4, "output_throughput": 19.2, "total_token_throughput": 57.6,
        "mean_ttft_ms": ttft, "median_ttft_ms": ttft, "p99_ttft_ms": ttft * 2,
        "input_lens": [16, 16, 16], "output_lens": [8, 8, 8], "ttfts": [0.01, 0.02, 0.03],
        "itls": [[0.001, 0.002], [0.001], [0.003]], "latencies": [0.1, 0.2, 0.3], "start_times": [0.0, 0.1, 0.2],
        "generated_texts": ["a", "b", "c"], "errors": ["", "", ""],
    }


def record(pid: str, sid: str, serve: dict[str, Any], run: int, rate: Any) -> dict[str, Any]:
    rec = vllm_result(rate, ttft=10.0 + run)
    rec.update(serve)
    rec.update(BENCH)
    rec["run_number"] = run
    rec.update({"campaign": "camp", "point_id": pid, "serve_id": sid, "bench_id": "b1", "server_id": f"srv-{sid}",
                "serve_label": "x", "bench_label": "y", "tensor_parallel_size": 1, "pipeline_parallel_size": 1,
                "data_parallel_size": 1, "gpu_count": 0, "node_ip": "127.0.0.1", "gpu_ids": None,
                "cache_state_before": "reset"})
    return rec


@pytest.fixture
def outdir(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    led = Ledger(out / LEDGER_FILE)
    try:
        led.sync(name="camp", fingerprint="fp", meaning={}, campaign={"name": "camp"}, campaign_file="c.yaml",
                 points=[(pid, sid, "b1", run, serve, BENCH) for pid, sid, serve, run, _, _ in POINTS])
        for pid, sid, serve, run, st, rate in POINTS:
            if st == "pending":
                continue
            led.mark_running(pid, f"srv-{sid}")
            if st == "done":
                rel = f"points/{sid}/b1/run={run}.json"
                write_json_atomic(out / rel, record(pid, sid, serve, run, rate))
                led.mark_done(pid, rel)
            else:
                led.mark_failed(pid, "server died during the point (exit code -9)", "CUDA out of memory\nlast line")
    finally:
        led.close()
    return out


def test_results_table_one_row_per_done_point(outdir):
    df = results_table(CampaignDir(outdir))
    assert len(df) == 3
    assert sorted(df["point_id"]) == ["pa0", "pa1", "pb0"]
    assert "pb1" not in set(df["point_id"]) and "pb2" not in set(df["point_id"])
    # sorted by serve, bench, run; identifying columns first
    assert list(df["point_id"]) == ["pa0", "pa1", "pb0"]
    assert list(df.columns[:5]) == ["campaign", "serve_id", "bench_id", "point_id", "run_number"]


def test_results_table_drops_per_request_arrays(outdir):
    df = results_table(CampaignDir(outdir))
    assert not set(df.columns) & PER_REQUEST_KEYS
    for key in ("latencies", "ttfts", "itls", "input_lens", "output_lens", "generated_texts", "errors"):
        assert key not in df.columns
    # the scalars stay, with vLLM's names
    assert list(df["median_ttft_ms"]) == [10.0, 11.0, 10.0]
    assert {"request_throughput", "p99_ttft_ms", "completed", "max_num_seqs", "random_input_len"} <= set(df.columns)
    # the result files themselves keep the per-request data
    assert all("latencies" in r for r in load_records(CampaignDir(outdir)))


def test_request_rate_inf_becomes_float(outdir):
    df = results_table(CampaignDir(outdir))
    assert pd.api.types.is_float_dtype(df["request_rate"])
    rates = dict(zip(df["point_id"], df["request_rate"]))
    assert math.isinf(rates["pa0"]) and rates["pa0"] > 0
    assert rates["pa1"] == 10.0


def test_dict_params_become_json_text(outdir):
    df = results_table(CampaignDir(outdir))
    values = dict(zip(df["point_id"], df["compilation_config"]))
    assert values["pa0"] == json.dumps({"mode": 3})
    assert json.loads(values["pb0"]) == {"mode": 0}


def test_write_results_all_formats_read_back(outdir):
    paths = write_results(CampaignDir(outdir), ("parquet", "csv", "json"))
    assert paths == [outdir / "results.parquet", outdir / "results.csv", outdir / "results.json"]
    frames = {"parquet": pd.read_parquet(paths[0]), "csv": pd.read_csv(paths[1]), "json": pd.read_json(paths[2])}
    for fmt, df in frames.items():
        assert len(df) == 3, fmt
        assert sorted(df["point_id"]) == ["pa0", "pa1", "pb0"], fmt
        assert "latencies" not in df.columns, fmt
        assert sorted(df["max_num_seqs"]) == [4, 4, 8], fmt
    for fmt in ("parquet", "csv"):
        rates = dict(zip(frames[fmt]["point_id"], frames[fmt]["request_rate"]))
        assert math.isinf(rates["pa0"]) and rates["pa1"] == 10.0, fmt
        assert json.loads(frames[fmt].set_index("point_id").loc["pa0", "compilation_config"]) == {"mode": 3}
    # no temporary files left beside them
    assert sorted(p.name for p in outdir.iterdir() if p.name.startswith(".")) == []


def test_write_results_default_formats(outdir):
    paths = write_results(CampaignDir(outdir))
    assert [p.name for p in paths] == ["results.parquet", "results.csv"]
    assert all(p.is_file() for p in paths)


def test_write_results_unknown_format(outdir):
    with pytest.raises(ValueError):
        write_results(CampaignDir(outdir), ("xlsx",))


def test_empty_results_still_written(tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    led = Ledger(out / LEDGER_FILE)
    led.sync(name="c", fingerprint="f", meaning={}, campaign={}, campaign_file="", points=[
        ("p", "s", "b", 0, {}, {})])
    led.close()
    paths = write_results(CampaignDir(out), ("parquet", "csv", "json"))
    assert len(pd.read_parquet(paths[0])) == 0
    assert all(p.is_file() for p in paths)


def test_unreadable_result_file_is_skipped(outdir):
    (outdir / "points" / "sa" / "b1" / "run=1.json").write_text("{truncated")
    df = results_table(CampaignDir(outdir))
    assert sorted(df["point_id"]) == ["pa0", "pb0"]


def test_out_of_plan_points_are_not_in_results(outdir):
    led = Ledger.open_existing(outdir)
    try:
        led.sync(name="camp", fingerprint="fp", meaning={}, campaign={"name": "camp"}, campaign_file="c.yaml",
                 points=[(pid, sid, "b1", run, serve, BENCH) for pid, sid, serve, run, _, _ in POINTS
                         if pid != "pa1"])
    finally:
        led.close()
    assert sorted(results_table(CampaignDir(outdir))["point_id"]) == ["pa0", "pb0"]


# ---------------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------------

def test_cli_results_json(outdir):
    result = CliRunner().invoke(main, ["results", str(outdir), "--format", "json"])
    assert result.exit_code == 0, result.output
    assert "3 row(s)" in result.output
    assert str(outdir / "results.json") in result.output
    assert not (outdir / "results.csv").exists() and not (outdir / "results.parquet").exists()
    rows = json.loads((outdir / "results.json").read_text())
    assert sorted(r["point_id"] for r in rows) == ["pa0", "pa1", "pb0"]


def test_cli_results_writes_only_when_asked(outdir, tmp_path):
    before = sorted(p.name for p in outdir.rglob("*"))
    result = CliRunner().invoke(main, ["results", str(outdir)])
    assert result.exit_code == 0, result.output
    assert "3 row(s)" in result.output and "nothing written" in result.output
    assert sorted(p.name for p in outdir.rglob("*")) == before
    result = CliRunner().invoke(main, ["results", str(outdir), "--out", str(tmp_path / "t")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "t" / "results.csv").is_file() and (tmp_path / "t" / "results.parquet").is_file()
    assert (tmp_path / "t" / "summary.csv").is_file() and not (outdir / "results.csv").exists()


def test_cli_status_counts_and_failure(outdir):
    result = CliRunner().invoke(main, ["status", str(outdir)])
    assert result.exit_code == 0, result.output
    text = result.output
    assert "camp" in text
    header = next(ln for ln in text.splitlines() if "done" in ln and "pending" in ln)
    values = next(ln for ln in text.splitlines()[text.splitlines().index(header) + 1:]
                  if any(ch.isdigit() for ch in ln))
    cols = [c.strip() for c in header.strip("│┃| \n").replace("┃", "│").split("│")]
    nums = [c.strip() for c in values.strip("│┃| \n").split("│")]
    assert dict(zip(cols, nums)) == {"done": "3", "running": "0", "failed": "1", "pending": "1", "total": "5"}
    assert "pb1" in text and "server died during the point (exit code -9)" in text
    assert "CUDA out of memory" in text


@pytest.mark.parametrize("command", ["status", "results"])
def test_cli_without_ledger_exits_2(tmp_path, command):
    result = CliRunner().invoke(main, [command, str(tmp_path)])
    assert result.exit_code == 2
    assert "no raysweep ledger" in result.output and LEDGER_FILE in result.output
    assert not (tmp_path / LEDGER_FILE).exists()


def test_json_keeps_infinite_request_rate(outdir):
    (path,) = write_results(CampaignDir(outdir), ("json",))
    rates = {r["point_id"]: r["request_rate"] for r in json.loads(path.read_text())}
    assert rates["pa1"] == 10.0
    assert rates["pa0"] in ("inf", "Infinity", math.inf)


def test_records_written_before_the_validity_record_get_it_when_read(outdir):
    from raysweep.results.table import flagged, load_records

    path = sorted((outdir / "points").rglob("run=*.json"))[0]
    rec = json.loads(path.read_text())
    rec.update(server_nice=15, client_limited=False)
    rec.pop("validity_ok", None)
    write_json_atomic(path, rec)
    records = load_records(CampaignDir(outdir))
    assert all("validity_ok" in r and "validity_issues" in r for r in records)
    mine = next(r for r in records if r["point_id"] == rec["point_id"])
    assert mine["validity_ok"] is False and "niced (server 15)" in mine["validity_issues"]
    assert mine in flagged(records)


def test_status_counts_and_lists_runs_failing_a_validity_check(outdir):
    path = outdir / "points/sb/b1/run=0.json"
    rec = json.loads(path.read_text())
    rec.update(client_limited=True, client_limited_reason="send lag p99 40.0 ms > 10 ms", server_nice=15)
    write_json_atomic(path, rec)
    res = CliRunner().invoke(main, ["status", str(outdir)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "validity: 1 of 3 finished run(s) fail a check" in res.output
    line = next(ln for ln in res.output.splitlines() if "pb0" in ln)
    assert "client-limited (send lag p99 40.0 ms > 10 ms)" in line and "niced (server 15)" in line


def test_status_says_no_run_fails_and_what_was_not_judged(outdir):
    """These records carry no validity fields: no run fails a check, but none is said to pass them all
    (tests/test_validity_story.py: the same count in the report, and runs judged on every check)."""
    res = CliRunner().invoke(main, ["status", str(outdir)], catch_exceptions=False)
    assert "validity: none of 3 finished run(s) fails a check; 0 pass every check, 3 were not judged" in res.output
    assert "all 3 finished run(s) pass every check" not in res.output

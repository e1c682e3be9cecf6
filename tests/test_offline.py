"""Offline sweeps (`mode: offline`): the schema, the JSON of `vllm bench throughput|latency` read into result
rows, and on the simulated cluster: points as GPU tasks in placement groups, side by side when GPUs allow,
retries, node loss, the transport gate, plots and report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from helpers import PY, STANDIN, add_nodes, remove_node_when_running, remove_nodes, run_file

from raysweep.bench.offline import offline_argv, offline_kind, parse_result
from raysweep.campaign import campaign_from_dict
from raysweep.cli import main
from raysweep.errors import CampaignError
from raysweep.record.directory import CampaignDir

OFFLINE = STANDIN / "offline.py"


def offline_data(out: Path, kind: str = "throughput", args: str = "", params: Any = None, **fields: Any) -> dict:
    data: dict[str, Any] = {"name": "off", "output_dir": str(out), "runs": 1, "mode": "offline",
                            "offline": {"cmd": f"{PY} {OFFLINE} {kind} --model m {args}".strip(),
                                        "params": params if params is not None else
                                        {"grid": {"max_num_batched_tokens": [2000, 8000]}}}}
    for key, value in fields.items():
        if key == "offline":
            data["offline"].update(value)
        else:
            data[key] = value
    return data


def offline_file(path: Path, **kw: Any) -> Path:
    f = path / "campaign.yaml"
    f.write_text(yaml.safe_dump(offline_data(path / "out", **kw)))
    return f


# -- the schema and the parsing (no Ray) -------------------------------------------------------------

@pytest.mark.parametrize("change, field, words", [
    (lambda d: d.pop("offline"), "offline", "is required (mode: offline)"),
    (lambda d: d.update(serve={"cmd": "vllm serve m"}), "serve", "has no meaning in mode offline"),
    (lambda d: d.update(sla={"targets": [{"p99_ttft_ms": "<=1"}]}), "sla", "has no meaning in mode offline"),
    (lambda d: d.update(mode="serve"), "serve", "is required (mode: serve)"),
    (lambda d: d["offline"].update(cmd="vllm bench serve --model m"), "offline.cmd",
     "must be `vllm bench throughput ...` or `vllm bench latency ...`"),
    (lambda d: d["offline"].update(params=[{"output_json": "x.json"}]), "offline.params[0].output_json",
     "is set by raysweep"),
    (lambda d: d["offline"].update(timeout_s=0), "offline.timeout_s", "greater than 0"),
    (lambda d: d["offline"].update(bogus=1), "offline.bogus", ""),
])
def test_schema_errors_name_the_field(tmp_path, change, field, words):
    data = offline_data(tmp_path / "out")
    change(data)
    with pytest.raises(CampaignError) as err:
        campaign_from_dict(data, base_dir=tmp_path)
    assert err.value.field == field and words in str(err.value), str(err.value)


def test_a_serve_campaign_with_an_offline_section_is_refused(tmp_path):
    data = {"name": "x", "serve": {"cmd": "vllm serve m"}, "bench": {"cmd": "vllm bench serve --model m"},
            "offline": {"cmd": "vllm bench throughput --model m"}}
    with pytest.raises(CampaignError, match="offline: is only for `mode: offline`"):
        campaign_from_dict(data, base_dir=tmp_path)


def test_bad_offline_campaign_exits_2_and_starts_nothing(tmp_path):
    f = offline_file(tmp_path, params=[{"output_json": "x"}])
    result = CliRunner().invoke(main, ["run", str(f)])
    assert result.exit_code == 2 and "offline.params[0].output_json" in result.output
    assert not (tmp_path / "out").exists()


def test_follower_command_keeps_the_engine_options_only():
    from raysweep.bench.offline import worker_argv

    argv = ("vllm bench throughput --model M --load-format dummy --dataset-name random --num-prompts 16 "
            "--random-input-len=32 -tp 4 --enable-prefix-caching --output-json /x.json --max-num-batched-tokens 512 "
            "--disable-detokenize --n 2").split()
    assert worker_argv(argv) == ["vllm", "serve", "M", "--load-format", "dummy", "-tp", "4",
                                 "--enable-prefix-caching", "--max-num-batched-tokens", "512"]
    assert worker_argv(["python", "-m", "vllm.entrypoints.cli.main", "bench", "latency", "--model=m"]) == \
        ["python", "-m", "vllm.entrypoints.cli.main", "serve", "m"]


def test_kind_and_the_output_json_flag():
    assert offline_kind(["vllm", "bench", "throughput", "--model", "m"]) == "throughput"
    assert offline_kind(["python", "-m", "vllm.entrypoints.cli.main", "bench", "latency"]) == "latency"
    assert offline_argv(["vllm", "bench", "latency", "--output-json", "old.json", "--n", "1"], "/x/p.json") == \
        ["vllm", "bench", "latency", "--output-json", "/x/p.json", "--n", "1"]
    assert offline_argv(["vllm", "bench", "throughput"], "/x/p.json")[-2:] == ["--output-json", "/x/p.json"]


def test_throughput_json_and_printed_token_counts_become_result_fields():
    text = json.dumps({"model_id": "m", "elapsed_time": 4.0, "num_requests": 100, "total_num_tokens": 16000,
                       "requests_per_second": 25.0, "tokens_per_second": 4000.0})
    log = "INFO ...\nThroughput: 25.00 requests/s\nTotal num prompt tokens:  12800\nTotal num output tokens:  3200\n"
    r = parse_result("throughput", text, log)
    assert (r["duration"], r["completed"], r["request_throughput"], r["total_token_throughput"]) == (4.0, 100, 25.0,
                                                                                                   4000.0)
    assert (r["total_input_tokens"], r["total_output_tokens"], r["output_throughput"]) == (12800, 3200, 800.0)
    assert r["requests_per_second"] == 25.0 and r["offline_kind"] == "throughput"  # vLLM's own keys kept
    assert "output_throughput" not in parse_result("throughput", text, "")  # not printed: not made up


def test_latency_json_becomes_milliseconds():
    text = json.dumps({"model_id": "m", "avg_latency": 0.2, "latencies": [0.1, 0.2, 0.3],
                       "percentiles": {"10": 0.1, "50": 0.2, "99": 0.3}})
    r = parse_result("latency", text)
    assert r["mean_latency_ms"] == pytest.approx(200) and r["median_latency_ms"] == pytest.approx(200)
    assert (r["p10_latency_ms"], r["p99_latency_ms"]) == (pytest.approx(100), pytest.approx(300))
    assert r["num_iters"] == 3 and "latencies" not in r


def test_dry_run_shows_each_config_and_its_command(tmp_path):
    f = offline_file(tmp_path, params={"grid": {"max_num_batched_tokens": [2000, 8000], "tensor_parallel_size": [2]}},
                     runs=2)
    result = CliRunner().invoke(main, ["run", str(f), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "Mode: offline" in result.output and result.output.count("[config ") == 2
    assert "--max-num-batched-tokens 8000 --tensor-parallel-size 2 --output-json <result file>" in result.output
    assert "gpus=2" in result.output


# -- on the simulated cluster ------------------------------------------------------------------------


@pytest.mark.ray
def test_offline_grid_runs_each_point_as_a_gpu_task_side_by_side(gpu_cluster, tmp_path):
    env_file = tmp_path / "env.jsonl"
    f = offline_file(tmp_path, args=f"--sleep 1.5 --env-file {env_file}", runs=2,
                     params={"grid": {"max_num_batched_tokens": [2000, 8000], "random_input_len": [100, 200],
                                      "tensor_parallel_size": [2]}})
    summary, out = run_file(f)
    assert summary.counts["done"] == 8, summary.failures
    from raysweep.results.table import results_table

    df = results_table(CampaignDir(out))
    assert len(df) == 8
    # every row holds its own point's JSON: the stand-in's throughput follows its parameters
    expected = df["max_num_batched_tokens"] / (10.0 * df["random_input_len"])
    assert (df["request_throughput"] - expected).abs().max() < 1e-9
    assert (df["total_output_tokens"] == 100 * 32).all() and (df["output_throughput"] > 0).all()
    assert (df["gpu_count"] == 2).all() and set(df["offline_kind"]) == {"throughput"}
    # every offline row carries the provenance of the host that ran it, as a served point's does
    assert df["provenance_raysweep"].notna().all() and df["provenance_hostnames"].str.len().gt(0).all()
    # the command saw its GPUs, with --output-json added
    seen = [json.loads(x) for x in env_file.read_text().splitlines()]
    assert all(len((s["CUDA_VISIBLE_DEVICES"] or "").split(",")) == 2 for s in seen)
    assert all("--output-json" in s["argv"] for s in seen)
    # four configs of 2 GPUs on 12 GPUs: several ran at once
    spans = sorted((r["started_at"], r["ended_at"]) for r in df.to_dict("records"))
    assert any(b[0] < a[1] - 0.5 for a, b in zip(spans, spans[1:])), spans
    # plots and report work on offline results: throughput against the swept parameter
    result = CliRunner().invoke(main, ["plot", str(out)])
    assert result.exit_code == 0, result.output
    figures = list((out / "plots").glob("*.png"))
    assert any("request_throughput" in p.name for p in figures), figures
    result = CliRunner().invoke(main, ["report", str(out)])
    assert result.exit_code == 0, result.output
    html = (out / "report.html").read_text()
    assert "request_throughput against max_num_batched_tokens" in html


@pytest.mark.ray
def test_latency_failures_retries_and_no_leftovers(gpu_cluster, tmp_path):
    from raysweep import procs
    from raysweep.ledger import Ledger
    from raysweep.results.table import results_table

    pids = tmp_path / "pids"
    die = tmp_path / "died"
    f = offline_file(tmp_path, kind="latency", args=f"--pid-file {pids}", max_attempts=2,
                     params=[{"random_input_len": 100, "die_once_file": str(die)},
                             {"random_input_len": 200, "fail": True},
                             {"random_input_len": 300, "no_json": True}])
    summary, out = run_file(f)
    assert (summary.counts.get("done"), summary.counts.get("failed")) == (1, 2), summary.counts
    led = Ledger.open_existing(out)
    points = {p.serve_params["random_input_len"]: p for p in led.points()}
    led.close()
    assert points[100].state == "done" and points[100].attempts == 2  # died once, ran again
    assert points[200].attempts == 2 and "exited with code 1" in points[200].error
    assert "failing on purpose" in points[200].log_tail
    assert points[300].state == "failed" and "without writing its --output-json file" in points[300].error
    row = results_table(CampaignDir(out)).iloc[0]
    assert row["mean_latency_ms"] == pytest.approx(100 * 1.2) and row["p99_latency_ms"] == pytest.approx(140)
    all_pids = [int(x) for x in pids.read_text().split()]
    assert procs.wait_for(lambda: not any(procs.is_alive(p, None) for p in all_pids), 30)


@pytest.mark.ray
def test_node_loss_mid_point_runs_it_again_elsewhere(gpu_cluster, tmp_path):
    from raysweep.ledger import Ledger
    from raysweep.results.table import results_table

    pool = add_nodes(gpu_cluster, "offloss")
    try:
        f = offline_file(tmp_path, args="--sleep 4", params=[{"tensor_parallel_size": 4}],
                         placement={"node_labels": {"pool": "offloss"}})
        out = tmp_path / "out"
        removed: list[str] = []
        watcher = remove_node_when_running(gpu_cluster, out, pool, removed)
        summary, _ = run_file(f)
        watcher.join(5)
        assert removed and summary.counts["done"] == 1, summary.failures
        led = Ledger.open_existing(out)
        assert [p.attempts for p in led.points()] == [2]
        led.close()
        assert results_table(CampaignDir(out)).iloc[0]["node_id"] != removed[0]
    finally:
        remove_nodes(gpu_cluster, pool)


@pytest.mark.ray
def test_multi_node_offline_ranks_and_the_transport_gate(gpu_cluster, tmp_path):
    """tp=4 x pp=2 spans two nodes: rank 0 runs the benchmark with vLLM's multi-node flags, the other node
    `serve MODEL --headless` with the engine options; a config on TCP sockets is stopped by
    `transport.require: ib`."""
    from raysweep.ledger import Ledger
    from raysweep.results.table import results_table

    env_file = tmp_path / "env.jsonl"
    f = offline_file(tmp_path, args=f"--sleep 3 --env-file {env_file}", max_attempts=1,
                     params=[{"tensor_parallel_size": 4, "pipeline_parallel_size": 2, "nccl_net": net}
                             for net in ("gdr", "socket")],
                     transport={"require": "ib", "wait_s": 0.5})
    summary, out = run_file(f)
    led = Ledger.open_existing(out)
    points = {p.serve_params["nccl_net"]: p for p in led.points()}
    led.close()
    assert points["gdr"].state == "done", points["gdr"].error
    assert points["socket"].state == "failed" and "cross-node links include Socket" in points["socket"].error
    row = results_table(CampaignDir(out)).iloc[0]
    assert (row["num_nodes"], row["transport_inter"], row["gpu_count"]) == (2, "IB+GDR", 8)
    argvs = {a["rank"]: a["argv"] for a in map(json.loads, env_file.read_text().splitlines()) if "gdr" in a["argv"]}
    assert sorted(argvs) == [0, 1]
    # rank 0 runs the benchmark; the follower runs `serve MODEL --headless` with the engine options only
    assert argvs[0][0] == "throughput" and "--output-json" in argvs[0] and "--headless" not in argvs[0]
    assert argvs[1][:2] == ["serve", "m"] and "--headless" in argvs[1] and "--output-json" not in argvs[1]
    assert "--node-rank" in argvs[1] and "--tensor-parallel-size" in argvs[1] and "--env-file" in argvs[1]


def test_resume_knows_when_an_offline_campaign_is_finished(tmp_path):
    """`resume` first asks whether the campaign has anything left (`drive.checks.finished`); an offline campaign
    has no bench section: pending points mean not finished, every point done means finished, with its counts."""
    from raysweep.drive.checks import finished
    from raysweep.drive.driver import open_campaign

    out = tmp_path / "out"
    spec = campaign_from_dict(offline_data(out, params=[{"max_num_seqs": 2}, {"max_num_seqs": 4}]), base_dir=tmp_path)
    plan, led = open_campaign(spec, CampaignDir(out))
    try:
        assert len(plan.points) == 2 and finished(spec, CampaignDir(out), False) is None
        for p in plan.points:
            led.claim(p.id, "s", 1)
            led.mark_done(p.id, str(out / f"{p.id}.json"))
        done = finished(spec, CampaignDir(out), False)
        assert done is not None and done[0] == {"done": 2, "failed": 0, "pending": 0, "running": 0}
    finally:
        led.close()

"""Integration with the real vLLM CPU build: `vllm serve` with the tiny dummy-weight model and the real
`vllm bench serve`, through `raysweep run` on an embedded Ray, exactly as `make demo` runs it.

The demo campaign (configs/demo-cpu.yaml, 2 serve x 2 bench points of 9 s, with bench.precision's runs cut
from 3-5 to 2-3 and the warmup from 768 prompts to 16 for the test) is SIGKILLed in the middle (the driver
process), then `raysweep resume` finishes it: every run done exactly once, finished results untouched, no
process left.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from browser import check_page
from helpers import add_nodes, remove_nodes

from raysweep import procs
from raysweep.ledger import Ledger
from raysweep.record.directory import CampaignDir
from raysweep.results.table import results_table

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parent.parent


MARK = "RAYSWEEP_TEST_MARK"


def _ours(mark: str) -> list[psutil.Process]:
    """Processes that inherited this test's mark: the driver's embedded Ray, vLLM servers and bench clients."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(MARK) == mark:
                found.append(p)
        except psutil.Error:
            pass
    return found


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _is_vllm_serve(p: psutil.Process) -> bool:
    try:
        argv = p.cmdline()
    except psutil.Error:
        return False
    return "serve" in argv and any("vllm" in a for a in argv[:2])


def _killed_then_resumed(tmp_path: Path, config: str, out: Path, tiny_model: Path,
                         kill_when: Callable[[], bool], limit_s: float) -> dict[Path, str]:
    """`raysweep run CONFIG` on its own embedded Ray, SIGKILLed once `kill_when()`; checks that the server and
    bench processes went with it, then `raysweep resume` must finish. Returns the hashes of the result files
    that existed at the kill."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_worker_niceness", "RAY_ADDRESS")}  # Ray's defaults
    env.update({"RAYSWEEP_DEMO_MODEL": str(tiny_model), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
                "RAY_AUTH_MODE": "disabled", "VLLM_HOST_IP": "127.0.0.1", MARK: str(tmp_path)})
    cli = [sys.executable, "-m", "raysweep"]
    log = (tmp_path / "run.log").open("w")
    proc = subprocess.Popen([*cli, "run", str(REPO / config), "--output-dir", str(out)],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        assert procs.wait_for(kill_when, limit_s, 0.2), (tmp_path / "run.log").read_text()[-3000:]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    first = {p: _sha(p) for p in (out / "points").rglob("*.json")}
    led = Ledger.open_existing(out)
    ray_helpers = {pid for d in led.lost_drivers() + [led.last_driver()] for pid, _ in json.loads(d["helpers"] or "[]")}
    led.close()
    assert ray_helpers, "the driver recorded its embedded Ray processes"

    # The server and bench processes go with the driver (their guard watches it). The embedded Ray's own
    # agents linger for a minute or more (they wait on the dead GCS); resume stops them by recorded pid.
    def servers_left() -> list[psutil.Process]:
        return [p for p in _ours(str(tmp_path)) if p.pid not in ray_helpers]

    assert procs.wait_for(lambda: not servers_left(), 60), \
        f"left running: {[(p.pid, p.name()) for p in servers_left()]}"
    done = subprocess.run([*cli, "resume", str(out)], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert not _ours(str(tmp_path)), "a process outlived the campaign"
    return first


def _demo_with_fewer_starts(tmp_path: Path) -> Path:
    """configs/demo-cpu.yaml as it is, but for its design's server starts and the warmup: 2 starts per
    configuration instead of 3 (blocks A B | B A, one run of each point per start: every point gets 2 runs, one
    on each of its configuration's starts), and a warmup of 16 prompts instead of 384 (about 4 s a server start):
    what the test checks of a run holds whether its first seconds ran slower or not (a run the steady-state test
    flags is left out of the verdicts and counted), and the demo's own validity is what benchmarks/RESULTS.md
    records. The points keep their 9 s (the steady-state test judges a window of at least 5 s)."""
    import yaml

    data = yaml.safe_load((REPO / "configs/demo-cpu.yaml").read_text())
    data["design"]["starts"] = 2
    data["warmup"] = 16
    path = tmp_path / "demo-cpu.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_demo_campaign_killed_mid_run_then_resumed(tiny_model, tmp_path):
    """The demo on its design, killed once its first server start is done and the second one (the other
    configuration's) is starting, so the resume starts only the server it lost; every finished result survives and
    nothing is run twice. Its `vllm serve` runs at niceness 0 (read while it runs, and as recorded, with Ray's
    default worker niceness) on core 0 and the clients on core 1 (the campaign's cpu_affinity), its provenance is
    the installed vLLM, and every row carries its validity record. The design (2 starts here, see
    `_demo_with_fewer_starts`) gave each point one run on each of its configuration's starts, numbered from 0
    without a gap or a repeat."""
    import importlib.metadata

    out = tmp_path / "demo"
    config = _demo_with_fewer_starts(tmp_path)
    nices: dict[int, int] = {}
    cpus: dict[int, list[int]] = {}

    def second_server_starting() -> bool:
        if not nices:  # the first server's niceness and CPUs, read from the running process
            serving = [p for p in _ours(str(tmp_path)) if _is_vllm_serve(p)]
            nices.update({p.pid: p.nice() for p in serving})
            cpus.update({p.pid: p.cpu_affinity() for p in serving})
        if not (out / "ledger.sqlite").exists():
            return False
        led = Ledger.open_existing(out)
        try:
            states = [s.state for s in led.servers()]
        finally:
            led.close()
        return states.count("stopped") == 1 and states.count("starting") == 1

    first = _killed_then_resumed(tmp_path, str(config), out, tiny_model, second_server_starting, 420)
    assert nices and set(nices.values()) == {0}, nices
    assert cpus and all(c == [0] for c in cpus.values()), cpus

    led = Ledger.open_existing(out)
    points, servers = led.points(), led.servers()
    led.close()
    assert all(p.state == "done" and p.attempts == 1 for p in points)
    runs: dict[tuple[str, str], list[int]] = {}
    for p in points:
        runs.setdefault((p.serve_id, p.bench_id), []).append(p.run)
    assert len(runs) == 4 and all(sorted(r) == list(range(len(r))) and len(r) == 2 for r in runs.values())
    first_config = {str(p.relative_to(out)).split("/")[1] for p in first}
    assert len(first_config) == 1  # the killed driver had finished the first server start only
    assert len(first) == sum(1 for serve, _ in runs if serve in first_config)  # one run of each of its points
    assert all(_sha(p) == h for p, h in first.items()), "a finished result was rewritten"
    assert {s.state for s in servers} <= {"stopped", "lost"} and sum(s.state == "lost" for s in servers) == 1
    # two configurations of one model, both eager (--enforce-eager), 2 starts each: every start is labelled as
    # compiling nothing
    starts = [json.loads(s.startup or "{}") for s in servers if s.state == "stopped"]
    assert len(starts) == 4 and {s.get("compile_cache") for s in starts} == {"none"}, starts

    df = results_table(CampaignDir(out))
    assert len(df) == len(points)
    assert (df.groupby(["serve_id", "bench_id"])["server_id"].nunique() == 2).all()  # each run on its own start
    assert (df["completed"] > 0).all() and set(df["failed"]) == {0} and set(df["duration_limit_s"]) == {9.0}
    assert set(df["max_num_seqs"]) == {8, 16} and set(df["random_input_len"]) == {128}
    assert set(df["max_concurrency"]) == {4, 16}
    assert (df["request_throughput"] > 0).all() and (df["p99_ttft_ms"] > 0).all()
    for col in ("p50_e2el_ms", "p90_tpot_ms", "p95_itl_ms", "median_ttft_ms", "total_token_throughput"):
        assert col in df.columns
    assert set(df["cache_state_before"]) == {"reset"}  # the real server answered {"success": true}
    # the native client: exact prompt lengths (text fitted as vLLM fits it, BOS added by the server), and the
    # server counted what was sent and received
    assert set(df["bench_backend"]) == {"native"} and df["client_limited"].dtype == bool
    assert set(df["prompt_format"]) == {"text"}  # as `vllm bench serve` sends the random set
    assert (df["total_input_tokens"] == df["completed"] * df["random_input_len"]).all()
    assert (df["total_output_tokens"] == df["completed"] * 16).all()
    assert (df["server_prompt_tokens"] == df["total_input_tokens"]).all(), \
        df[["server_prompt_tokens", "total_input_tokens"]]
    assert (df["server_generation_tokens"] == df["total_output_tokens"]).all()
    # the server's own inference times: every point ran requests, never more at once than the client had in flight
    assert (df["server_mean_requests_in_inference"] > 0).all()
    assert (df["server_mean_requests_in_inference"] <= df["max_concurrency"]).all()
    # the gauges, sampled every 0.5 s, are read on every point and within their bounds; a point of about a
    # second whose engine runs in bursts between samples can read 0 in all of them (seen in 1 of 36 points
    # of some runs, with the server's counters proving all 24 requests ran in it), so under load they must
    # show up on each server config's points, not on every point
    running, kv = df["server_num_requests_running_peak"], df["server_kv_cache_usage_perc_peak"]
    assert running.notna().all() and kv.notna().all()
    assert (running <= df[["max_num_seqs", "max_concurrency"]].min(axis=1)).all() and kv.between(0, 1).all()
    by_config = df.groupby("max_num_seqs")
    assert (by_config["server_num_requests_running_peak"].max() >= 1).all()
    assert (by_config["server_kv_cache_usage_perc_peak"].max() > 0).all()
    assert (df["median_ttft_ms"] > 0).all() and (df["median_tpot_ms"] > 0).all()
    assert all((out / p).is_file() for p in df["samples_path"])
    assert set(df["gpu_count"]) == {0} and set(df["tensor_parallel_size"]) == {1}
    assert (out / "results.parquet").is_file() and (out / "results.csv").is_file()
    logs = list((out / "logs").glob("server-*.log"))
    assert logs and any("Application startup complete" in p.read_text() or "Started server process" in p.read_text()
                        for p in logs)
    # the validity record and the provenance, as recorded by the servers that ran
    assert (df["server_nice"] == 0).all() and set(df["server_cpu_affinity"]) == {"0"}
    assert set(df["client_cpu_affinity"]) == {"1"} and not df["shared_cpus"].any()  # pinned apart: no shared CPUs
    # 9-s points leave the steady-state test a window to fit (its verdict may still be "not judged: too few
    # requests" where the fitted drift's interval is too wide to see a 30 % drift)
    assert df["steady_state_drift_pct"].notna().all()
    notes = df["steady_state_note"] if "steady_state_note" in df.columns else df["steady_state"].map(lambda _: None)
    assert (df["steady_state"].notna() | notes.fillna("").astype(str).str.startswith("not judged: too few")).all()
    assert set(df["provenance_vllm"]) == {importlib.metadata.version("vllm")}
    assert set(df["provenance_model_path"]) == {str(tiny_model.resolve())}
    assert df["provenance_model_revision"].str.startswith("local config.json sha256:").all()
    for col in ("validity_ok", "validity_issues", "shared_cpus", "error_rate", "client_limited",
                "client_send_lag_p99_ms", "provenance_torch", "provenance_nccl", "provenance_gpu"):
        assert col in df.columns, col
    assert set(df["error_rate"]) == {0.0} and not df["validity_issues"].fillna("").str.contains("niced").any()
    assert all(s.nice == "0" and s.provenance_record()["vllm"] == importlib.metadata.version("vllm")
               for s in servers if s.state == "stopped")
    _verdicts_on_real_results(out, df)
    check_page(out / "report.html", tmp_path)  # in Chromium: no script error, no note said twice


def _verdicts_on_real_results(out: Path, df) -> None:
    """The verdicts on the demo's real results: the conclusions test every leader on its server starts (flagged
    runs left out and counted; one start each: not compared), and `compare` of the campaign with itself calls
    nothing better or worse."""
    from raysweep.results import aggregate, compare, conclusions

    summary = aggregate.summary_table(CampaignDir(out), results=df)
    assert (summary["runs"] + summary["runs_left_out"] == summary["runs_total"]).all()
    c = conclusions.conclude(df, ["random_input_len", "max_concurrency"], summary=summary)
    assert len(c.verdicts) == 1 and all(v.runner_up is not None for v in c.verdicts)
    for v in c.verdicts:
        text = conclusions.verdict_text(v)
        assert "noise" not in text and ("better than every other config" in text or "tied with the leader" in text
                                        or "not judged" in text or text.startswith("not compared: ")
                                        or "confirm" in text), text
        assert not (v.clear and v.flagged)
    same = compare.compare(compare.load_side(out, "baseline"), compare.load_side(out))
    words = set(same.table["output_throughput_verdict"]) | set(same.table["p99_ttft_ms_verdict"])
    assert words <= {"not shown", "not judged", "not compared"}, words
    assert (same.table["output_throughput_ratio"].dropna() == 1.0).all()


def test_real_vllm_server_spanning_two_simulated_nodes(tiny_model, gpu_cluster, tmp_path):
    """`vllm serve --pipeline-parallel-size 2` across two Ray nodes of one GPU each: rank 0 on one node
    serves HTTP, rank 1 on the other runs headless; the real `vllm bench serve` measures it."""
    from raysweep.campaign import campaign_from_dict
    from raysweep.drive.driver import run_campaign

    added = add_nodes(gpu_cluster, "vllm-mn", num_gpus=1)
    try:
        out = tmp_path / "out"
        data = {
            "name": "vllm-multinode", "output_dir": str(out), "runs": 1, "max_attempts": 1,
            "serve": {"cmd": f"vllm serve {tiny_model} --load-format dummy --max-model-len 512 --dtype bfloat16 "
                             # PP fails in eager mode on the CPU build, and so with VLLM_CPU_CI_ENV=1 (dynamo's
                             # eager backend): the second stage finds no intermediate tensors
                             "--pipeline-parallel-size 2",
                      "env": {"VLLM_CPU_KVCACHE_SPACE": 1, "VLLM_HOST_IP": "127.0.0.1", MARK: str(tmp_path)},
                      "ready_timeout_s": 400},
            "bench": {"backend": "command",
                      "cmd": f"vllm bench serve --model {tiny_model} --dataset-name random --num-prompts 24 "
                             "--max-concurrency 4 --random-input-len 32 --random-output-len 16 --temperature 0",
                      "env": {MARK: str(tmp_path)}},
            "placement": {"node_labels": {"pool": "vllm-mn"}},
            # the fabric probe (gloo on CPU) across exactly the server's two bundles, gated on a minimum
            "transport": {"probe": True, "probe_mib": 4, "probe_iters": 2, "min_busbw_gbps": 0.001},
            "cost": {"gpu_hour": 1.5},
        }
        summary = run_campaign(campaign_from_dict(data, base_dir=tmp_path), CampaignDir(out))
        led = Ledger.open_existing(out)
        servers = led.servers()
        led.close()
        tails = [p.read_text()[-3000:] for p in (out / "logs").glob("*.log")]
        assert summary.counts["done"] == 1, (summary.failures, tails)
        df = results_table(CampaignDir(out))
        row = df.iloc[0]
        assert row["completed"] == 24 and row["failed"] == 0 and row["output_throughput"] > 0
        assert row["num_nodes"] == 2 and row["placement_mode"] == "nnodes" and row["gpu_count"] == 2
        assert row["pipeline_parallel_size"] == 2 and len(set(row["node_ids"].split(","))) == 2
        ranks = servers[0].rank_list()
        logs = [Path(r["log_path"]).read_text() for r in ranks]
        assert "--nnodes 2 --node-rank 0 --master-addr 127.0.0.1" in logs[0]
        assert "--node-rank 1" in logs[1] and "--headless" in logs[1]
        assert servers[0].state == "stopped"
        # compiled (no --enforce-eager): its start compiled or loaded compiled graphs from the campaign's shared
        # cache (warm when an earlier run of this test left them), never "none", and status's table says which
        from raysweep.serve.startup import table_rows

        start = json.loads(servers[0].startup or "{}")
        assert start.get("compile_cache") in ("cold", "warm", "recompiled"), start
        assert start["cache_dir"].endswith("vllm-multinode") and start["startup_cache_mb"] > 0, start
        assert table_rows(servers)[1][0][2] == f"1 {start['compile_cache']}"
        # the transport check read both ranks: the CPU build talks over gloo, so NCCL says nothing
        verdict = servers[0].transport_verdict()
        assert verdict["nnodes"] == 2 and verdict["inter"] == "none" and row["transport_inter"] == "none"
        assert verdict["links"] == [] and verdict["node_links"] == []  # the per-link table: no NCCL link on CPU
        probe = servers[0].fabric_record()
        assert probe["error"] is None and probe["backend"] == "gloo" and probe["world"] == 2 and probe["nnodes"] == 2
        assert sorted(probe["node_ids"]) == sorted(set(row["node_ids"].split(",")))  # the server's own nodes
        assert row["fabric_busbw_gbps"] == probe["busbw_gbps"] > 0.001 and row["fabric_backend"] == "gloo"
        assert row["placement_layout"] == "pack" and str(row["gpu_telemetry"]).startswith("unavailable")
        # no NVML (nor AMD SMI) on this machine, and RAPL is not a GPU server's energy: no energy field at all
        # (never a zero), and why; the price per
        # token still comes from the GPU-hour price (2 GPUs x 1.5 over the whole load's output rate)
        assert row["energy_note"].startswith("no energy reading: NVML unavailable"), row["energy_note"]
        assert "AMD SMI unavailable" in row["energy_note"], row["energy_note"]
        assert "RAPL not read: the server has GPUs" in row["energy_note"]
        assert "energy_j" not in df.columns and "j_per_output_token" not in df.columns
        assert row["cost_per_m_output_tokens"] == pytest.approx(3.0 / 3600 / row["output_throughput"] * 1e6)
        assert procs.wait_for(lambda: not _ours(str(tmp_path)), 60), \
            f"left running: {[(p.pid, p.name()) for p in _ours(str(tmp_path))]}"
    finally:
        remove_nodes(gpu_cluster, added)


def test_a_real_vllm_configuration_shares_its_points_with_a_tail_replica(tiny_model, gpu_cluster, tmp_path):
    """placement.tail_replicas with the real server: nothing else waits, so once the first point and the
    server's start are measured (6 points of a real `vllm bench serve`, each about 13 s with the program's own
    start, against a server start of about 25 s: the 5 left take longer), a second `vllm serve` of the same
    configuration starts on a free simulated GPU and takes some of the points; each point runs once, on one
    server, and neither server outlives the campaign. The points are a light open loop (2 requests/s): on 2
    cores, a first server kept saturated slowed the second one's start to 65-148 s. The benchmark runs behind a gate
    (tests/standin/gate.py): the second-to-last point waits until the second server has been sent its first,
    so the outcome does not hang on how long a start takes (on a loaded CI machine the second server once came
    up after the last point), and the first server keeps running points while the second one starts (a gate
    from the third point on left it idle for the whole start: 22 s alone, up to 150 s under load)."""
    from raysweep.campaign import campaign_from_dict
    from raysweep.drive.driver import run_campaign

    out = tmp_path / "out"
    lengths = list(range(16, 28, 2))   # 6 points: the replica starts once 5 are left (about a minute of them)
    gate = [sys.executable, str(Path(__file__).parent / "standin" / "gate.py"), "--log", str(tmp_path / "gate.log"),
            "--hold-from", str(len(lengths) - 1), "--servers", "2", "--"]
    data = {
        "name": "vllm-tail", "output_dir": str(out), "runs": 1, "max_attempts": 1,
        # the model's worker in the engine process, as configs/demo-cpu.yaml starts it: two Python processes
        # importing torch and vLLM per server instead of three
        "serve": {"cmd": f"vllm serve {tiny_model} --load-format dummy --max-model-len 512 --dtype bfloat16 "
                         "--enforce-eager --distributed-executor-backend uni",
                  "env": {"VLLM_CPU_KVCACHE_SPACE": 1, "VLLM_HOST_IP": "127.0.0.1", MARK: str(tmp_path),
                          "VLLM_ENABLE_V1_MULTIPROCESSING": 0},
                  "ready_timeout_s": 400},
        "bench": {"backend": "command",
                  "cmd": " ".join(gate) + f" vllm bench serve --model {tiny_model} --dataset-name random "
                         "--random-output-len 8 --request-rate 2 --num-prompts 8 --temperature 0",
                  "params": {"grid": {"random_input_len": lengths}},
                  "client_cpus": 0.5},
        "placement": {"tail_replicas": 1},
    }
    summary = run_campaign(campaign_from_dict(data, base_dir=tmp_path), CampaignDir(out))
    led = Ledger.open_existing(out)
    points, servers, events = led.points(), led.servers(), led.events()
    led.close()
    tails = [p.read_text()[-2000:] for p in (out / "logs").glob("*.log")]
    assert summary.counts["done"] == len(lengths), (summary.failures, tails)
    assert all(p.attempts == 1 for p in points)
    assert [e["kind"] for e in events] == ["replica"] and len(servers) == 2
    assert {s.state for s in servers} == {"stopped"} and servers[0].ready_at < servers[1].started_at
    df = results_table(CampaignDir(out))
    per_server = df.groupby("server_id").size().to_dict()
    assert set(per_server) == {s.server_id for s in servers}, per_server   # the replica ran some points
    assert len(set((tmp_path / "gate.log").read_text().split())) == 2       # at two addresses
    assert (df["completed"] > 0).all() and (df["failed"] == 0).all()
    assert procs.wait_for(lambda: not _ours(str(tmp_path)), 60), \
        f"left running: {[(p.pid, p.name()) for p in _ours(str(tmp_path))]}"


def test_sla_search_on_the_real_server(tiny_model, gpu_cluster, tmp_path):
    """A median TTFT target that max_num_seqs=1 (requests served one at a time) meets only at a small concurrency,
    and max_num_seqs=8 meets at a larger concurrency: the search finds both, each probe run once. (The
    median, not the p90: over 16 requests a p90 is one or two requests, too noisy on a shared machine.)"""
    from raysweep.campaign import campaign_from_dict
    from raysweep.drive.driver import run_campaign
    from raysweep.results.table import sla_table

    out = tmp_path / "out"
    data = {
        "name": "vllm-sla", "output_dir": str(out), "runs": 1, "max_attempts": 1, "warmup": 4,
        # the model's worker in the engine process, as configs/demo-cpu.yaml starts it (two Python processes
        # importing torch and vLLM per server instead of three)
        "serve": {"cmd": f"vllm serve {tiny_model} --load-format dummy --max-model-len 512 --dtype bfloat16 "
                         "--enforce-eager --distributed-executor-backend uni",
                  "env": {"VLLM_CPU_KVCACHE_SPACE": 1, "VLLM_HOST_IP": "127.0.0.1", MARK: str(tmp_path),
                          "VLLM_ENABLE_V1_MULTIPROCESSING": 0},
                  "ready_timeout_s": 400, "params": {"grid": {"max_num_seqs": [1, 8]}}},
        "bench": {"cmd": f"vllm bench serve --model {tiny_model} --dataset-name random --num-prompts 16 "
                         "--random-input-len 32 --random-output-len 16 --temperature 0",
                  # the client shares 2 cores with vLLM here: its lateness is the machine's, and more actors
                  # cannot help, so the guard is set to flag only a client that stalls
                  "client_cpus": 0.5, "client_guard": {"max_send_lag_ms": 500}},
        "placement": {"max_servers": 1},
        "sla": {"targets": [{"median_ttft_ms": "<=60"}], "max_value": 32},
    }
    summary = run_campaign(campaign_from_dict(data, base_dir=tmp_path), CampaignDir(out))
    df = sla_table(CampaignDir(out))
    assert len(df) == 2, (summary.failures, df)
    best = {r["serve_label"]: (0 if r["largest_pass"] is None or r["largest_pass"] != r["largest_pass"]
                               else r["largest_pass"]) for r in df.to_dict("records")}
    assert best["max_num_seqs=8"] > best["max_num_seqs=1"], df.to_dict("records")
    states = {r["serve_label"]: r["state"] for r in df.to_dict("records")}
    assert states["max_num_seqs=1"] in {"found", "never met"}, df.to_dict("records")
    # on a quick run the target holds at every concurrency its 16 prompts allow: the search says so
    assert states["max_num_seqs=8"] in {"found", "above max"}, df.to_dict("records")
    led = Ledger.open_existing(out)
    probes = led.points()
    led.close()
    assert all(p.state == "done" and p.attempts == 1 for p in probes)
    per_config = {}
    for p in probes:
        per_config.setdefault(p.serve_id, []).append(p.bench_params.get("max_concurrency"))
    assert all(len(v) == len(set(v)) for v in per_config.values())  # no value ran twice
    assert procs.wait_for(lambda: not _ours(str(tmp_path)), 60)


def test_offline_throughput_sweep_killed_mid_run_then_resumed(tiny_model, tmp_path):
    """configs/offline-cpu.yaml runs the real `vllm bench throughput` per point; the driver is SIGKILLed while
    the second point runs, its engine goes with it, and `raysweep resume` runs only that point again."""
    out = tmp_path / "offline"

    def second_running() -> bool:
        if not (out / "ledger.sqlite").exists() or not list((out / "points").rglob("*.json")):
            return False
        led = Ledger.open_existing(out)
        try:
            return any(p.state == "running" for p in led.points()) and \
                any(s.pid and s.stopped_at is None for s in led.servers())
        finally:
            led.close()

    first = _killed_then_resumed(tmp_path, "configs/offline-cpu.yaml", out, tiny_model, second_running, 600)
    assert len(first) == 1
    led = Ledger.open_existing(out)
    points = led.points()
    led.close()
    assert len(points) == 2 and all(p.state == "done" for p in points)
    assert all(p.attempts == 1 for p in points)  # the attempt lost with the driver is not counted
    led = Ledger.open_existing(out)
    assert sum(s.state == "lost" for s in led.servers()) == 1  # the killed point's engine, reaped on resume
    led.close()
    assert all(_sha(p) == h for p, h in first.items()), "a finished result was rewritten"
    df = results_table(CampaignDir(out))
    assert sorted(df["max_num_batched_tokens"]) == [512, 1024] and set(df["offline_kind"]) == {"throughput"}
    assert set(df["completed"]) == {16} and set(df["total_output_tokens"]) == {16 * 16}
    assert (df["total_input_tokens"] >= 16 * 32).all()
    assert (df["request_throughput"] > 0).all() and (df["output_throughput"] > 0).all()
    assert (df["total_token_throughput"] > df["output_throughput"]).all()
    assert all("--output-json" in c for c in df["bench_command"])

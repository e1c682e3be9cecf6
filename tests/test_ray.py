"""Ray tests on the session's local cluster with simulated GPU nodes (see conftest.py).

Servers and benchmarks are the stand-ins of tests/standin (fast starts); the real vLLM server is covered
by tests/test_vllm_integration.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import PY, STANDIN, run_file, standin_campaign

ray = pytest.importorskip("ray")

from raysweep import procs  # noqa: E402
from raysweep.errors import LedgerError, UserError  # noqa: E402
from raysweep.ledger import Ledger  # noqa: E402
from raysweep.record.directory import CampaignDir  # noqa: E402
from raysweep.results.table import results_table  # noqa: E402

pytestmark = pytest.mark.ray


def _ledger(out: Path) -> Ledger:
    return Ledger.open_existing(out)


def test_campaign_runs_on_simulated_gpus(gpu_cluster, tmp_path):
    f = standin_campaign(tmp_path, serve_params={"grid": {"tensor_parallel_size": [1, 2]}}, runs=2, warmup=2)
    summary, out = run_file(f)
    assert summary.counts == {"pending": 0, "running": 0, "done": 8, "failed": 0}
    df = results_table(CampaignDir(out))
    assert len(df) == 8
    by_tp = {tp: g for tp, g in df.groupby("tensor_parallel_size")}
    assert set(by_tp[1]["gpu_count"]) == {1} and set(by_tp[2]["gpu_count"]) == {2}
    assert all(len(ids.split(",")) == 2 for ids in by_tp[2]["gpu_ids"])
    assert all(len(ids.split(",")) == 1 for ids in by_tp[1]["gpu_ids"])
    assert set(df["cache_state_before"]) == {"reset"}
    assert set(df["node_ip"]) == {"127.0.0.1"}
    assert df["node_id"].notna().all() and df["server_id"].nunique() == 2
    # the server saw the GPUs Ray gave its host actor, and was started with our host and port
    logs = {p.name: p.read_text() for p in (out / "logs").iterdir()}
    assert len(logs) == 2
    for server_id, ids in df.groupby("server_id")["gpu_ids"].first().items():
        [log] = [t for name, t in logs.items() if server_id in name]
        seen = re.search(r"CVD=([0-9,]+)", log).group(1)
        assert sorted(seen.split(",")) == sorted(ids.split(",")), (seen, ids)
    assert all("--host 127.0.0.1 --port" in t for t in logs.values())
    # every run file holds vLLM's fields, the overrides and run_number
    rec = json.loads(next((out / "points").rglob("run=1.json")).read_text())
    assert rec["run_number"] == 1 and "request_throughput" in rec and "p90_e2el_ms" in rec and "random_input_len" in rec
    led = _ledger(out)
    assert {s.state for s in led.servers()} == {"stopped"}
    led.close()


def test_shape_that_never_fits_is_refused_before_anything_starts(gpu_cluster, tmp_path):
    f = standin_campaign(tmp_path, serve_params=[{"tensor_parallel_size": 8}])
    with pytest.raises(UserError, match="tensor_parallel_size=8 is larger than any node .the largest has 4 GPUs"):
        run_file(f)
    led = _ledger(tmp_path / "out")
    assert led.servers() == [] and led.counts()["pending"] == 2
    led.close()


def test_server_that_fails_to_start_fails_its_points_and_the_campaign_goes_on(gpu_cluster, tmp_path):
    f = standin_campaign(tmp_path, serve_params=[{"fail_start": True}, {"fail_start": False}], max_attempts=2)
    summary, out = run_file(f)
    assert summary.counts["done"] == 2 and summary.counts["failed"] == 2
    failed = [p for p in summary.failures]
    assert all(p.attempts == 2 for p in failed)
    assert all("server failed to start" in p.error and "exited with code 1" in p.error for p in failed)
    assert all("failing on purpose" in p.log_tail for p in failed)
    led = _ledger(out)
    assert sorted(s.state for s in led.servers()) == ["failed", "failed", "stopped"]
    led.close()


def test_server_that_dies_mid_point_is_restarted_and_only_spoiled_points_rerun(gpu_cluster, tmp_path):
    calls = tmp_path / "bench-calls.jsonl"
    f = standin_campaign(tmp_path, server_args=f"--die-after 15 --die-once-file {tmp_path / 'died'}",
                         bench_args=f"--log-file {calls}",
                         bench_params={"grid": {"random_input_len": [16, 32, 64]}}, max_attempts=2)
    summary, out = run_file(f)
    assert summary.counts["done"] == 3 and summary.counts["failed"] == 0
    led = _ledger(out)
    points = led.points()
    servers = led.servers()
    led.close()
    # the first server dies in the second point (request 16 of 30); that point alone runs again
    assert [s.state for s in servers] == ["died (exit code 3)", "stopped"]
    assert sorted(p.attempts for p in points) == [1, 1, 2]
    assert len(calls.read_text().splitlines()) == 4
    records = [json.loads(p.read_text()) for p in (out / "points").rglob("run=0.json")]
    assert all(r["completed"] == 10 and r["failed"] == 0 for r in records)  # no spoiled result was kept


def test_bench_failure_is_recorded_and_stops_when_continue_on_error_is_false(gpu_cluster, tmp_path):
    f = standin_campaign(tmp_path, bench_args="--fail", continue_on_error=False, max_attempts=1)
    summary, out = run_file(f)
    assert summary.stopped_early and "continue_on_error is false" in summary.stopped_early
    assert summary.counts["failed"] == 1 and summary.counts["pending"] == 1
    assert "exited with code 1" in summary.failures[0].error
    assert "failing on purpose" in summary.failures[0].log_tail


def test_refused_cache_reset_is_recorded_in_the_results(gpu_cluster, tmp_path):
    f = standin_campaign(tmp_path, server_args="--reset-refuses")
    summary, out = run_file(f)
    assert summary.counts["done"] == 2
    states = set(results_table(CampaignDir(out))["cache_state_before"])
    assert len(states) == 1
    assert states.pop().startswith('reset failed: /reset_prefix_cache: HTTP 200 {"success": false}')
    # judged, not only a column
    assert results_table(CampaignDir(out))["validity_issues"].str.contains("cache not reset").all()


def test_after_bench_cmd_replaces_the_reset(gpu_cluster, tmp_path):
    marker = tmp_path / "after.txt"
    f = standin_campaign(tmp_path, bench={"after_bench_cmd": f"sh -c 'echo x >> {marker}'"})
    summary, out = run_file(f)
    assert summary.counts["done"] == 2
    assert len(marker.read_text().splitlines()) == 3  # after server start, then after each point
    assert set(results_table(CampaignDir(out))["cache_state_before"]) == {"after_bench_cmd"}


def test_changed_command_is_refused_unless_forced_and_new_grid_values_only_add_points(gpu_cluster, tmp_path):
    calls = tmp_path / "calls.jsonl"
    f = standin_campaign(tmp_path, bench_args=f"--log-file {calls}")
    summary, out = run_file(f)
    assert summary.counts["done"] == 2
    first = {p: p.read_bytes() for p in (out / "points").rglob("*.json")}
    # a new grid value: only the new point runs, the finished ones are untouched
    standin_campaign(tmp_path, bench_args=f"--log-file {calls}",
                     bench_params={"grid": {"random_input_len": [16, 32, 64]}})
    summary, out = run_file(f)
    assert summary.counts["done"] == 3
    assert len(calls.read_text().splitlines()) == 3
    # a changed bench command changes what finished points mean: refused, then forced
    standin_campaign(tmp_path, bench_args=f"--log-file {calls} --sleep 0.01",
                     bench_params={"grid": {"random_input_len": [16, 32, 64]}})
    with pytest.raises(LedgerError, match="bench_cmd"):
        run_file(f)
    summary, out = run_file(f, force=True)
    assert summary.counts["done"] == 3 and len(calls.read_text().splitlines()) == 3
    assert all(p.read_bytes() == data for p, data in first.items())


def test_no_orphan_after_ray_kill_of_the_host_actor(gpu_cluster, tmp_path):
    """The host actors here keep their guard state in a temp dir of the test's own (TMPDIR), so that the host
    actors of a test running beside this one, which clean every dead host's state on the node when they start,
    cannot clean this one before the test looks (seen once in CI, 2026-11-29)."""
    from raysweep.serve.server import ServerHost

    own_tmp = tmp_path / "tmp"
    own_tmp.mkdir()
    isolated = {"num_cpus": 0, "runtime_env": {"env_vars": {"TMPDIR": str(own_tmp)}}}
    pids = tmp_path / "pids"
    actor = ServerHost.options(**isolated).remote("orphans", str(tmp_path))
    info = ray.get(actor.start.remote([PY, str(STANDIN / "server.py"), "--spawn-child", "--pid-file", str(pids)], {}))
    assert ray.get(actor.wait_ready.remote(30, "standin"))["ok"]
    tree = [info["pid"], *map(int, pids.read_text().split())]
    assert len(tree) == 3 and all(procs.is_alive(p, None) for p in tree)
    state_dirs = list(own_tmp.glob("raysweep-guard-orphans-*"))
    assert len(state_dirs) == 1
    ray.kill(actor)
    assert procs.wait_for(lambda: not any(procs.is_alive(p, None) for p in tree), 15), "processes outlived the actor"
    # the guard was killed with the actor's process group: the next host actor on the node cleans up
    assert state_dirs[0].exists()
    host_pid = int((state_dirs[0] / "host").read_text().split()[0])
    assert procs.wait_for(lambda: not procs.is_alive(host_pid, None), 15)
    nxt = ServerHost.options(**isolated).remote("next", str(tmp_path))
    ray.get(nxt.node_info.remote())
    ray.kill(nxt)
    assert not state_dirs[0].exists(), "a dead host's guard state directory was left"


def test_clean_stop_leaves_nothing_and_frees_the_port(gpu_cluster, tmp_path):
    from raysweep.serve.server import ServerHost

    pids = tmp_path / "pids"
    actor = ServerHost.options(num_cpus=0).remote("stop", str(tmp_path))
    info = ray.get(actor.start.remote([PY, str(STANDIN / "server.py"), "--spawn-child", "--pid-file", str(pids)], {}))
    assert ray.get(actor.wait_ready.remote(30, "standin"))["ok"]
    assert ray.get(actor.reset_caches.remote())["ok"]
    result = ray.get(actor.stop.remote(10))
    tree = [info["pid"], *map(int, pids.read_text().split())]
    assert result["left"] == [] and result["port_free"] is True
    assert not any(procs.is_alive(p, None) for p in tree)
    ray.kill(actor)


def test_ready_wait_fails_when_the_model_is_not_listed(gpu_cluster, tmp_path):
    from raysweep.serve.server import ServerHost

    actor = ServerHost.options(num_cpus=0).remote("model", str(tmp_path))
    ray.get(actor.start.remote([PY, str(STANDIN / "server.py"), "--model", "other"], {}))
    ready = ray.get(actor.wait_ready.remote(3, "expected"))
    assert not ready["ok"] and "not ready after 3 s" in ready["error"]
    ray.get(actor.stop.remote(5))
    ray.kill(actor)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_killed_driver_leaves_no_process_and_resume_finishes_exactly_once(tmp_path):
    """`raysweep run` on its own embedded Ray is SIGKILLed mid-campaign (its 4th point held until then, so that
    the kill comes after 3 points whatever the machine's load); `raysweep resume` finishes it."""
    pids = tmp_path / "pids"
    calls = tmp_path / "calls.jsonl"
    hold = tmp_path / "hold"
    hold.touch()
    f = standin_campaign(tmp_path, server_args=f"--spawn-child --pid-file {pids}",
                         bench_args=f"--log-file {calls} --sleep 0.5 --hold-while {hold} --hold-from 4",
                         bench_params={"grid": {"random_input_len": [16, 32, 64, 128]}}, runs=2)
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}
    cli = [sys.executable, "-m", "raysweep"]
    out = tmp_path / "out"
    proc = subprocess.Popen([*cli, "run", str(f)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert procs.wait_for(lambda: len(list((out / "points").rglob("*.json"))) >= 3 if out.exists() else False,
                              120, 0.1), "no point finished in time"
        status = subprocess.run([*cli, "status", str(out)], capture_output=True, text=True, timeout=60)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
        hold.unlink()
    assert status.returncode == 0 and "servers running" in status.stdout and "driver: pid" in status.stdout
    first = {p: _sha(p) for p in (out / "points").rglob("*.json")}
    tree = [int(x) for x in pids.read_text().split()]
    assert procs.wait_for(lambda: not any(procs.is_alive(p, None) for p in tree), 20), "server outlived the driver"
    led = Ledger.open_existing(out)
    before = led.counts()
    led.close()
    assert before["done"] == 3
    done = subprocess.run([*cli, "resume", str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    led = Ledger.open_existing(out)
    assert led.counts()["done"] == 8
    assert all(p.attempts == 1 for p in led.points() if p.state == "done" and p.attempts > 0)
    led.close()
    # every point ran exactly once, the one held at the kill twice (it was interrupted mid-run)
    ran = [json.loads(line) for line in calls.read_text().splitlines()]
    assert len(ran) == 9
    assert all(_sha(p) == h for p, h in first.items()), "a finished result was rewritten"
    assert not any(procs.is_alive(p, None) for p in map(int, pids.read_text().split()))
    assert len(results_table(CampaignDir(out))) == 8
    from raysweep.drive.driver import embedded_temp_dir

    assert not Path(embedded_temp_dir(proc.pid)).exists(), "the killed driver's Ray session dir was left"


def test_cli_joins_an_existing_cluster_with_address(gpu_cluster, tmp_path):
    f = standin_campaign(tmp_path, serve_params={"grid": {"tensor_parallel_size": [2]}})
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}
    done = subprocess.run([sys.executable, "-m", "raysweep", "run", str(f), "--address", gpu_cluster.address],
                          env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "done 2" in done.stderr and "results.parquet" in done.stderr
    df = results_table(CampaignDir(tmp_path / "out"))
    assert set(df["gpu_count"]) == {2}  # it ran on the simulated GPU nodes, not on a new local Ray
    status = subprocess.run([sys.executable, "-m", "raysweep", "status", str(tmp_path / "out")],
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0 and "finished" in status.stdout


def test_secrets_never_reach_the_ledger_results_or_logs(gpu_cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("RS_TEST_KEY", "sk-from-the-environment-42")
    f = standin_campaign(tmp_path, server_args="--api-key sk-literal-secret-1234",
                         bench_args="--api-key ${RS_TEST_KEY}",
                         serve={"env": {"HF_TOKEN": "hf_literal_token_5678"}})
    summary, out = run_file(f)
    assert summary.counts["done"] == 2
    log = next((out / "logs").iterdir()).read_text()
    assert "standin: starting" in log and "HF_TOKEN=***" in log and "'***'" in log  # the server did print them
    for path in [p for p in out.rglob("*") if p.is_file()]:
        data = path.read_bytes()
        for secret in (b"sk-literal-secret-1234", b"hf_literal_token_5678", b"sk-from-the-environment-42"):
            assert secret not in data, f"{secret!r} found in {path}"


def test_sigterm_stops_cleanly_keeps_finished_points_and_exits_130(tmp_path):
    pids = tmp_path / "pids"
    f = standin_campaign(tmp_path, server_args=f"--spawn-child --pid-file {pids}", bench_args="--sleep 2",
                         bench_params={"grid": {"random_input_len": [16, 32, 64]}})
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "raysweep", "run", str(f)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert procs.wait_for(lambda: out.exists() and any((out / "points").rglob("*.json")), 120, 0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err and "raysweep resume" in err
    assert not any(procs.is_alive(p, None) for p in map(int, pids.read_text().split()))
    led = Ledger.open_existing(out)
    counts, servers, driver = led.counts(), led.servers(), led.last_driver()
    led.close()
    assert counts["running"] == 0 and counts["done"] >= 1 and counts["pending"] >= 1
    assert servers[-1].state == "stopped" and driver["outcome"] == "interrupted"


def test_failed_points_stay_failed_on_resume_unless_retry_failed(gpu_cluster, tmp_path):
    broken = tmp_path / "broken"
    broken.touch()
    f = standin_campaign(tmp_path, bench_args=f"--fail-while {broken}", max_attempts=1)
    summary, out = run_file(f)
    assert summary.counts["failed"] == 2 and all(p.attempts == 1 for p in summary.failures)
    broken.unlink()  # the cause is fixed, but the points used up their attempts
    summary, out = run_file(f)
    assert summary.counts["failed"] == 2
    summary, out = run_file(f, retry_failed=True)
    assert summary.counts == {"pending": 0, "running": 0, "done": 2, "failed": 0}


@pytest.mark.timing
def test_every_native_result_carries_its_validity_record_and_provenance(gpu_cluster, tmp_path):
    import importlib.metadata
    import socket

    from helpers import native_campaign

    from raysweep import __version__

    f = native_campaign(tmp_path, server_args="--ttft-delay 0.01 --itl-delay 0.005", warmup=0,
                        bench_args="--random-output-len 4 --max-concurrency 2 --num-prompts 12",
                        bench_params={"grid": {"random_input_len": [8, 16]}}, bench={"client_cpus": 0.5})
    summary, out = run_file(f)
    assert summary.counts["done"] == 2, summary.failures
    df = results_table(CampaignDir(out))
    try:
        vllm = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        vllm = "not installed"
    for _, row in df.iterrows():
        # the server process ran at niceness 0 (the guard lowers Ray's 15; these tests run with the right to)
        assert row["server_nice"] == 0 and row["server_cpu_affinity"]
        assert row["server_cpu_affinity_per_node"].startswith("127.0.0.1=")
        assert row["error_rate"] == 0.0 and row["client_limited"] == False  # noqa: E712
        issues = row["validity_issues"] or ""
        assert bool(row["validity_ok"]) == (issues == "")
        assert "niced (server" not in issues and "client-limited" not in issues and "errors" not in issues
        # provenance gathered on the server's node when it started
        assert row["provenance_vllm"] == vllm and row["provenance_ray"] == ray.__version__
        assert row["provenance_raysweep"] == __version__ and row["provenance_hostnames"] == socket.gethostname()
        assert row["provenance_gpu"] in ("none",) or "x" in row["provenance_gpu"]
        assert row["provenance_torch"] and row["provenance_model_path"] == "unknown"  # `--model m` is no path
    led = _ledger(out)
    try:
        servers = led.servers()
    finally:
        led.close()
    assert servers and all(s.nice == "0" and s.cpu_affinity.startswith("127.0.0.1=") for s in servers)
    assert all(s.provenance_record()["vllm"] == vllm for s in servers)


def test_embedded_ray_starts_its_workers_at_niceness_0(tmp_path):
    """Ray's default worker niceness is 15; the embedded Ray of a driver starts them at 0."""
    code = ("import os, ray\nfrom raysweep.drive.driver import ray_session\n"
            "with ray_session(None):\n"
            "    print('NICE', ray.get(ray.remote(lambda: os.getpriority(os.PRIO_PROCESS, 0)).remote()))\n")
    env = {k: v for k, v in os.environ.items() if k != "RAY_worker_niceness"}
    env["RAY_ADDRESS"] = ""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=180,
                          cwd=tmp_path)
    assert "NICE 0" in done.stdout, done.stdout + done.stderr


def test_tail_replicas_share_a_configurations_points_each_run_once(gpu_cluster, tmp_path):
    """Nothing else waits: once its first point and server start are measured, more servers of the one
    configuration start on the free GPUs and take its points, each point run exactly once."""
    from click.testing import CliRunner

    from raysweep.cli import main

    f = standin_campaign(tmp_path, bench_args="--sleep 2", placement={"tail_replicas": 2},
                         bench_params={"grid": {"random_input_len": list(range(16, 28))}})
    summary, out = run_file(f)
    assert summary.counts == {"pending": 0, "running": 0, "done": 12, "failed": 0}
    led = _ledger(out)
    try:
        points, servers, events = led.points(), led.servers(), led.events()
    finally:
        led.close()
    assert all(p.attempts == 1 for p in points)
    replicas = [e for e in events if e["kind"] == "replica"]
    assert 1 <= len(replicas) <= 2 and len(servers) == 1 + len(replicas)
    assert {s.state for s in servers} == {"stopped"} and len({s.serve_id for s in servers}) == 1
    df = results_table(CampaignDir(out))
    assert len(df) == 12 and df["server_id"].nunique() >= 2          # a further server ran some of its points
    assert set(df["server_id"]) <= {s.server_id for s in servers}
    assert all("to share its" in e["detail"] and e["serve_ids"] == [servers[0].serve_id] for e in replicas)
    shown = CliRunner().invoke(main, ["status", str(out)])
    assert shown.exit_code == 0 and "replica" in shown.output

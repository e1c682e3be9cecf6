"""The `command` bench backend: the command it runs, the directories it cleans, the priority it runs at."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

from raysweep.bench import command
from raysweep.bench.command import bench_argv, load_window_cpu


def test_bench_command_points_at_the_server_and_asks_for_every_percentile():
    argv = bench_argv(["vllm", "bench", "serve", "--model", "m", "--host", "h", "--port", "1",
                       "--metric-percentiles", "99.9,50"], "http://10.0.0.1:8000", "/tmp/r", num_prompts=16)
    text = " ".join(argv)
    assert "--host" not in argv and "--port" not in argv
    assert "--base-url http://10.0.0.1:8000" in text and "--save-result" in text and "--result-dir /tmp/r" in text
    assert "--metric-percentiles 50,90,95,99,99.9" in text and "--num-prompts 16" in text
    assert "--percentile-metrics ttft,tpot,itl,e2el" in text


def test_directories_of_killed_clients_are_removed_and_live_ones_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"raysweep-bench-{dead.pid}-abc"
    live = tmp_path / f"raysweep-bench-{os.getpid()}-def"
    other = tmp_path / "raysweep-bench-notapid"
    for d in (stale, live, other):
        d.mkdir()
        (d / "result.json").write_text("{}")
    command._remove_stale_dirs()
    assert not stale.exists() and live.exists() and other.exists()


def test_the_commands_cpu_is_counted_over_its_load_window_only():

    # 10 s of import at 1 core, then a 4 s load at half a core: the window is the last 4 s
    samples = [(float(t), float(t)) for t in range(0, 11)] + [(12.0, 11.0), (14.0, 12.0)]
    assert load_window_cpu(samples, 4.0) == pytest.approx(2.0)
    assert load_window_cpu(samples, 3.0) == pytest.approx(1.5)
    assert load_window_cpu(samples, 100.0) == pytest.approx(12.0)  # longer than the samples: all of it
    assert load_window_cpu([], 4.0) is None and load_window_cpu(samples, 0.0) is None


@pytest.mark.ray
def test_the_benchmark_process_runs_at_niceness_0_though_rays_workers_are_niced(gpu_cluster, tmp_path):
    """The test cluster's workers run at Ray's default niceness (15); the command the client actor starts
    runs at 0, and its niceness, CPUs and node are recorded with the result."""
    import ray

    script = tmp_path / "bench.py"
    script.write_text("import json, os, sys\n"
                      "d = sys.argv[sys.argv.index('--result-dir') + 1]\n"
                      "json.dump({'completed': 1, 'duration': 0.1, 'own_nice': os.nice(0)},"
                      " open(os.path.join(d, 'result.json'), 'w'))\n")
    worker_nice = ray.get(ray.remote(num_cpus=0)(lambda: os.nice(0)).remote())
    assert worker_nice > 0  # otherwise this test would prove nothing
    actor = command.CommandClient.remote()
    try:
        out = ray.get(actor.run.remote([sys.executable, str(script)], "http://127.0.0.1:9", {}, 60.0), timeout=60)
    finally:
        ray.kill(actor)
    assert out["ok"], out
    res = out["result"]
    assert res["own_nice"] == 0 and res["client_nice"] == 0 and res["client_nice_lowering_failed"] is False
    assert res["client_cpu_affinity"] and res["client_node_ips"] == "127.0.0.1"


def test_the_command_backends_client_is_said_to_be_not_judged():
    """vllm bench serve's JSON has no send times: the client-bottleneck check is not judged, and says so,
    and the validity record counts it among the checks with nothing to judge."""
    from raysweep.bench.command import NOT_JUDGED, client_judgement
    from raysweep.drive.validity import unknown_checks, validity_fields

    record = {"completed": 10, "failed": 0, "server_nice": 0, "client_nice": 0, "steady_state": True}
    record.update(client_judgement(record))
    assert record["client_limited"] is None and record["client_limited_reason"] == NOT_JUDGED
    assert "client-limited" in unknown_checks(record) and validity_fields(record)["validity_ok"] is True
    assert client_judgement({"client_limited": False}) == {}

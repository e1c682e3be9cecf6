"""`raysweep submit`, `jobs` and `stop` against a real Ray job server: a local cluster with the dashboard on
loopback and Ray's token authentication on (cluster/local-fake-cluster.py). A campaign is submitted,
refused a second time while it runs, stopped halfway, submitted again after its output dir is lost, and
resumes from its storage mirror: every point done once, results readable from the mirror URI."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import standin_campaign

ray = pytest.importorskip("ray")

from raysweep import procs  # noqa: E402
from raysweep.cli import main  # noqa: E402
from raysweep.ledger import Ledger  # noqa: E402
from raysweep.record.directory import CampaignDir  # noqa: E402

pytestmark = pytest.mark.ray

SCRIPT = Path(__file__).resolve().parent.parent / "cluster" / "local-fake-cluster.py"


@pytest.fixture(scope="module")
def job_server(tmp_path_factory):
    """A head with the dashboard (and its job server) on 127.0.0.1 and one node of 2 simulated GPUs, with
    token authentication on; yields (job server URL, token)."""
    tmp = tmp_path_factory.mktemp("jobs")
    token = secrets.token_hex(16)
    port = procs.free_port()
    addr = tmp / "address"
    home = tmp / "home"
    home.mkdir()
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "token",
           "RAY_AUTH_TOKEN": token, "HOME": str(home), "RAY_USAGE_STATS_ENABLED": "0"}
    temp_dir = f"/tmp/rs-j{os.getpid()}"
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--nodes", "1", "--gpus-per-node", "2", "--dashboard",
                             "--dashboard-port", str(port), "--address-file", str(addr), "--temp-dir", temp_dir],
                            env=env, stdout=subprocess.DEVNULL, stderr=open(tmp / "cluster.log", "w"))
    url = f"http://127.0.0.1:{port}"
    try:
        assert procs.wait_for(lambda: addr.exists() or proc.poll() is not None, 120, 0.2), "cluster did not start"
        assert proc.poll() is None, (tmp / "cluster.log").read_text()[-3000:]
        from ray.job_submission import JobSubmissionClient

        def answers() -> bool:
            try:
                JobSubmissionClient(url, headers={"Authorization": f"Bearer {token}"}).list_jobs()
                return True
            except Exception:
                return False

        assert procs.wait_for(answers, 60, 0.5), "the job server did not answer"
        yield url, token
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            procs.kill_tree(proc.pid)


def _counts(out: Path) -> dict[str, int]:
    led = Ledger.open_existing(out)
    try:
        return led.counts()
    finally:
        led.close()


def test_submit_refuse_stop_resubmit_and_resume_from_the_mirror(job_server, tmp_path, monkeypatch):
    url, token = job_server
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.delenv("RAY_API_SERVER_ADDRESS", raising=False)
    pids, calls, mirror = tmp_path / "pids", tmp_path / "calls.jsonl", tmp_path / "mirror"
    out = tmp_path / "out"
    f = standin_campaign(tmp_path, name="jobc", server_args=f"--spawn-child --pid-file {pids}",
                         bench_args=f"--log-file {calls} --sleep 1.5",
                         bench_params={"grid": {"random_input_len": [16, 32, 64, 128]}},
                         storage=mirror.as_uri())
    runner = CliRunner()
    submit = ["submit", str(f), "--dashboard-url", url, "--python", sys.executable, "--stop-wait", "60"]

    # the token is required: without it the job server refuses, and raysweep says so (exit 2)
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ray/auth_token here
    r = runner.invoke(main, ["jobs", "--dashboard-url", url])
    assert r.exit_code == 2 and "cannot reach the Ray job server" in r.output, r.output
    monkeypatch.setenv("RAY_AUTH_TOKEN", token)

    r = runner.invoke(main, submit)
    assert r.exit_code == 0, r.output
    job1 = r.stdout.strip().splitlines()[0]
    assert job1.startswith("raysweep-jobc-")
    again = runner.invoke(main, submit)  # a second submission while the first one runs is refused
    assert again.exit_code == 2 and job1 in again.output, again.output

    assert procs.wait_for(lambda: (out / "ledger.sqlite").exists() and _counts(out)["done"] >= 1, 180, 0.3), \
        runner.invoke(main, ["jobs", "--dashboard-url", url, "--follow", job1]).output[-3000:]
    r = runner.invoke(main, ["stop", job1, "--dashboard-url", url, "--wait", "90"])
    assert r.exit_code == 0 and "STOPPED" in r.output, r.output
    tree = [int(x) for x in pids.read_text().split()]
    assert procs.wait_for(lambda: not any(procs.is_alive(p, None) for p in tree), 30), "a server outlived the job"
    first = _counts(out)
    assert 1 <= first["done"] < 4 and first["running"] == 0, first
    assert _counts(mirror) == first  # the mirror holds the stopped campaign as it was left

    # the output dir is lost (a new head): the next submission takes the mirrored ledger and goes on
    for p in sorted(out.rglob("*"), reverse=True):
        p.unlink() if p.is_file() else p.rmdir()
    out.rmdir()
    r = runner.invoke(main, [*submit, "--follow"])
    assert r.exit_code == 0, r.output[-4000:]
    assert "SUCCEEDED" in r.output
    assert _counts(out)["done"] == 4
    ran = [json.loads(line) for line in calls.read_text().splitlines()]
    assert 4 <= len(ran) <= 5  # every point once, and at most the one interrupted by the stop twice
    assert not any(procs.is_alive(p, None) for p in map(int, pids.read_text().split()))

    r = runner.invoke(main, ["jobs", "--dashboard-url", url], env={"COLUMNS": "300"})
    assert r.exit_code == 0 and job1 in r.output and "STOPPED" in r.output and "SUCCEEDED" in r.output, r.output
    r = runner.invoke(main, ["results", mirror.as_uri(), "--format", "csv"],
                      env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert r.exit_code == 0, r.output
    csv = next(Path(line.strip()) for line in r.output.splitlines() if line.strip().endswith(".csv"))
    assert len(csv.read_text().strip().splitlines()) == 1 + 4


@pytest.mark.vllm
def test_real_vllm_campaign_as_a_job_with_its_results_read_from_the_mirror(job_server, tiny_model, tmp_path,
                                                                           monkeypatch):
    """The real `vllm serve` and the native client, submitted as a job with --follow; the results are read
    back from the storage URI, as a user without access to the cluster's disks would."""
    import yaml

    url, token = job_server
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN", token)
    mirror = tmp_path / "mirror"
    campaign = {
        "name": "vllm-job", "output_dir": str(tmp_path / "out"), "runs": 1, "max_attempts": 1,
        # the model's worker in the engine process, as configs/demo-cpu.yaml starts it: two Python processes
        # importing torch and vLLM instead of three
        "serve": {"cmd": f"vllm serve {tiny_model} --load-format dummy --max-model-len 512 --dtype bfloat16 "
                         "--enforce-eager --distributed-executor-backend uni",
                  "env": {"VLLM_CPU_KVCACHE_SPACE": 1, "VLLM_HOST_IP": "127.0.0.1",
                          "VLLM_ENABLE_V1_MULTIPROCESSING": 0}, "ready_timeout_s": 400,
                  "params": [{"max_num_seqs": 8}]},
        "bench": {"cmd": f"vllm bench serve --model {tiny_model} --dataset-name random --num-prompts 12 "
                         "--random-input-len 32 --random-output-len 8 --max-concurrency 4",
                  "client_cpus": 0.5},
        "storage": mirror.as_uri(),
    }
    f = tmp_path / "vllm-job.yaml"
    f.write_text(yaml.safe_dump(campaign))
    r = CliRunner().invoke(main, ["submit", str(f), "--dashboard-url", url, "--python", sys.executable, "--follow"])
    assert r.exit_code == 0, r.output[-4000:]
    assert "SUCCEEDED" in r.output
    from raysweep.record.storage import resolve_output
    from raysweep.results.table import results_table

    df = results_table(CampaignDir(resolve_output(mirror.as_uri(), tmp_path / "copy")))
    assert len(df) == 1
    row = df.iloc[0]
    assert row["completed"] == 12 and row["failed"] == 0 and row["max_num_seqs"] == 8
    assert row["server_generation_tokens"] == row["total_output_tokens"]

"""`raysweep submit`: what is staged and sent with a job, the entrypoint, the runtime env, the address and
the token; refusals. The real job server is exercised in tests/test_jobs_cluster.py."""

from __future__ import annotations

import json
import os
import shlex
import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from raysweep.campaign import load_campaign
from raysweep.cli import main
from raysweep.drive import jobs
from raysweep.errors import UserError


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project dir (the current directory) with a campaign under configs/ naming files in several ways."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "configs" / "serve.json").write_text(json.dumps([{"max_num_seqs": 8}, {"max_num_seqs": 16}]))
    (tmp_path / "configs" / "more").mkdir()
    (tmp_path / "configs" / "more" / "bench.json").write_text(json.dumps([{"dataset_path": "data/b.jsonl"}]))
    (tmp_path / "data" / "a.jsonl").write_text('{"prompt": "hi"}\n')
    (tmp_path / "data" / "b.jsonl").write_text('{"prompt": "ho"}\n')
    campaign = {
        "name": "job-c", "output_dir": "/shared/results/job-c",
        "serve": {"cmd": "vllm serve /models/llama --served-model-name ${MODEL_NAME}", "params": "serve.json",
                  "env": {"HF_TOKEN": "${HF_TOKEN}"}},
        "bench": {"cmd": "vllm bench serve --model m --dataset-name jsonl --dataset-path data/a.jsonl",
                  "params": {"file": "more/bench.json"}},
    }
    f = tmp_path / "configs" / "c.yaml"
    f.write_text(yaml.safe_dump(campaign))
    monkeypatch.setenv("MODEL_NAME", "llama")
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    return f


def test_named_files_are_the_params_files_and_data_sets(project):
    spec = load_campaign(project)
    names = {(fld, str(path)) for fld, path, _ in jobs.named_files(spec, project)}
    assert names == {("serve.params", "serve.json"), ("bench.params.file", "more/bench.json"),
                     ("bench.cmd", "data/a.jsonl"), ("bench.params[0].dataset_path", "data/b.jsonl")}


def test_stage_puts_every_file_where_the_job_reads_it(project, tmp_path):
    spec = load_campaign(project)
    dest = tmp_path / "stage"
    staged = jobs.stage(spec, "configs/c.yaml", dest)
    assert staged.campaign == "configs/c.yaml"
    assert sorted(staged.shipped) == ["configs/more/bench.json", "configs/serve.json", "data/a.jsonl", "data/b.jsonl"]
    # the staged copy loads from the job's working dir exactly as the original does here
    os.chdir(dest)
    again = load_campaign(dest / staged.campaign)
    assert again.serve_combos == spec.serve_combos and again.bench_combos == spec.bench_combos
    # referenced variables travel, secrets do not (a job's runtime env is shown by the dashboard)
    assert staged.env_vars == {"MODEL_NAME": "llama"}
    assert staged.secrets_kept == ["HF_TOKEN"]
    assert "hf_secret_value" not in json.dumps(jobs.runtime_env(staged, None, 60))


def test_files_outside_the_sent_directory_or_missing_are_refused(project, tmp_path):
    data = yaml.safe_load(project.read_text())
    outside = tmp_path.parent / f"{tmp_path.name}-outside.json"
    outside.write_text(json.dumps([{"max_num_seqs": 1}]))
    data["serve"]["params"] = f"../../{outside.name}"
    project.write_text(yaml.safe_dump(data))
    spec = load_campaign(project)
    with pytest.raises(UserError, match=r"serve.params: .* outside the directory"):
        jobs.stage(spec, project, tmp_path / "stage")
    outside.unlink()


def test_entrypoint_and_runtime_env(project, tmp_path):
    cmd = jobs.entrypoint("configs/my campaign.yaml", "/shared/out dir", python="/opt/py/bin/python",
                          retry_failed=True)
    assert shlex.split(cmd) == ["/opt/py/bin/python", "-m", "raysweep", "run", "configs/my campaign.yaml",
                                "--address", "auto", "--output-dir", "/shared/out dir", "--retry-failed"]
    assert shlex.split(jobs.entrypoint("c.yaml", "/o"))[:2] == ["raysweep", "run"]
    staged = jobs.Staged(root=tmp_path, campaign="c.yaml", env_vars={"A": "1"})
    env = jobs.runtime_env(staged, {"pip": ["x"], "env_vars": {"A": "2", "B": 3}}, 90)
    assert env == {"pip": ["x"], "working_dir": str(tmp_path),
                   "env_vars": {"A": "2", "B": "3", "RAY_JOB_STOP_WAIT_TIME_S": "90"}}
    with pytest.raises(UserError, match="working_dir"):
        jobs.runtime_env(staged, {"working_dir": "."}, 90)
    (tmp_path / "re.yaml").write_text("pip: [y]\n")
    assert jobs.read_runtime_env(str(tmp_path / "re.yaml")) == {"pip": ["y"]}
    assert jobs.read_runtime_env('{"conda": "env"}') == {"conda": "env"}
    with pytest.raises(UserError, match="--runtime-env"):
        jobs.read_runtime_env("{not json")


def test_address_and_token(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_API_SERVER_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert jobs.api_address("http://10.0.0.1:8265/") == "http://10.0.0.1:8265"
    with pytest.raises(UserError, match="--dashboard-url"):
        jobs.api_address("10.0.0.1:6379")
    with pytest.raises(UserError, match="RAY_API_SERVER_ADDRESS"):
        jobs.api_address(None)
    monkeypatch.setenv("RAY_ADDRESS", "http://h:8265")
    assert jobs.api_address(None) == "http://h:8265"

    token_file = tmp_path / "tok"
    token_file.write_text("abc123\n")
    assert jobs.auth_headers({"RAY_AUTH_TOKEN": "t0"}) == {"Authorization": "Bearer t0"}
    assert jobs.auth_headers({"RAY_AUTH_TOKEN_PATH": str(token_file)}) == {"Authorization": "Bearer abc123"}
    assert jobs.auth_headers({"RAY_AUTH_MODE": "disabled", "RAY_AUTH_TOKEN": "t0"}) == {}
    assert jobs.auth_headers({"RAY_AUTH_TOKEN_PATH": str(tmp_path / "missing")}) == {}


def test_submit_refuses_bad_input_before_contacting_anything(project, monkeypatch):
    monkeypatch.delenv("RAY_API_SERVER_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    r = CliRunner().invoke(main, ["submit", str(project), "--output-dir", "relative/out",
                                  "--address", "http://127.0.0.1:9"])
    assert r.exit_code == 2 and "--output-dir" in r.output and "absolute" in r.output
    r = CliRunner().invoke(main, ["submit", str(project)])
    assert r.exit_code == 2 and "--dashboard-url" in r.output
    r = CliRunner().invoke(main, ["submit", str(project), "--dashboard-url", "http://127.0.0.1:9"])
    assert r.exit_code == 2 and "cannot reach the Ray job server" in r.output
    # the old spelling still works for one release, with a warning on stderr
    r = CliRunner().invoke(main, ["submit", str(project), "--address", "http://127.0.0.1:9"])
    assert r.exit_code == 2 and "cannot reach the Ray job server" in r.output
    assert "--address is deprecated" in r.output and "--dashboard-url" in r.output
    r = CliRunner().invoke(main, ["stop", "nope", "--address", "127.0.0.1:6379"])
    assert r.exit_code == 2 and "http://HEAD:8265" in r.output


def test_submit_resolves_params_in_a_dir_that_is_not_the_cwd(project, tmp_path, monkeypatch):
    """A campaign outside the current directory goes to the root of the job's dir, its files beside it."""
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.chdir(other)
    (other / "data").mkdir()
    for name in ("a.jsonl", "b.jsonl"):
        (other / "data" / name).write_text('{"prompt": "x"}\n')
    spec = load_campaign(project)
    staged = jobs.stage(spec, project, tmp_path / "stage2")
    assert staged.campaign == "c.yaml"
    assert {"serve.json", "more/bench.json", "data/a.jsonl"} <= set(staged.shipped)
    assert Path(tmp_path / "stage2" / "serve.json").is_file()


def test_an_endpoint_campaign_is_submitted_as_a_run_that_places_no_server(tmp_path, monkeypatch):
    """A serve.url campaign through `raysweep submit` (the job server recorded, not contacted): the job is
    `raysweep run` of the staged campaign with its data file, asks the cluster for no CPU or GPU of its own,
    and the staged campaign, loaded where the job runs, is the same two endpoints, whose dry run places
    nothing (no placement group, no server command)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "p.jsonl").write_text('{"prompt": "hi"}\n')
    urls = ["http://gateway.svc:8000", "http://10.0.0.7:8000"]
    campaign = {"name": "ep-job", "output_dir": "/shared/results/ep-job",
                "serve": {"url": [{"url": urls[0], "metrics_url": "http://gateway.svc:9090/metrics"}, urls[1]]},
                "bench": {"backend": "native", "cmd": "vllm bench serve --model m --dataset-name jsonl "
                                                      "--dataset-path data/p.jsonl"}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(campaign))
    sent: dict[str, object] = {}
    job_dir = tmp_path / "job"

    class Recorder:
        def list_jobs(self) -> list[object]:
            return []

        def submit_job(self, **kwargs: object) -> str:
            sent.update(kwargs)
            shutil.copytree(str(kwargs["runtime_env"]["working_dir"]), job_dir)  # type: ignore[index]
            return "raysweep-ep-job-1"

    monkeypatch.setattr(jobs, "client", lambda address: Recorder())
    r = CliRunner().invoke(main, ["submit", "c.yaml", "--dashboard-url", "http://127.0.0.1:9"])
    assert r.exit_code == 0, r.output
    assert "raysweep-ep-job-1" in r.stdout and "sent data/p.jsonl" in r.output
    assert shlex.split(str(sent["entrypoint"])) == ["raysweep", "run", "c.yaml", "--address", "auto",
                                                    "--output-dir", "/shared/results/ep-job"]
    assert sent["entrypoint_num_cpus"] == 0
    assert not {"entrypoint_num_gpus", "entrypoint_resources", "entrypoint_memory"} & set(sent)
    assert sent["metadata"] == {jobs.META_KEY: "ep-job", "output_dir": "/shared/results/ep-job",
                                "campaign_file": "c.yaml", "storage": ""}
    assert sorted(str(p.relative_to(job_dir)) for p in job_dir.rglob("*") if p.is_file()) == ["c.yaml",
                                                                                              "data/p.jsonl"]
    monkeypatch.chdir(job_dir)  # where the job's `raysweep run` reads its campaign
    from raysweep.drive.endpoint import endpoints_of

    spec = load_campaign("c.yaml")
    assert [ep.url for ep in endpoints_of(spec)] == urls and spec.campaign.serve.cmd is None
    dry = CliRunner().invoke(main, ["run", "c.yaml", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert all(f"endpoint: {u} (running already" in dry.output for u in urls)
    assert "metrics: http://gateway.svc:9090/metrics" in dry.output
    assert "placement:" not in dry.output and "vllm serve" not in dry.output  # no group placed, no server cmd

"""Endpoints that already run (`serve.url`, `raysweep profile`): the refusals before anything starts (no Ray),
a campaign against the stand-in server that goes away mid-campaign and is resumed (simulated cluster), and a
campaign against the real vLLM CPU server (the session's shared `vllm_server`)."""

from __future__ import annotations

import json
import re
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from browser import check_page
from click.testing import CliRunner
from helpers import PY, STANDIN

from raysweep.cli import main
from raysweep.cli.profile import default_name, parse_grid
from raysweep.errors import UserError
from raysweep.procs import free_port, wait_for
from raysweep.record.directory import CampaignDir


def endpoint_campaign(path: Path, url: Any, *, bench: dict[str, Any] | None = None, **fields: Any) -> Path:
    data: dict[str, Any] = {
        "name": "ep", "output_dir": str(path / "out"), "runs": 1,
        "serve": {"url": url},
        "bench": {"backend": "command",
                  "cmd": f"{PY} {STANDIN / 'bench.py'} --model m --num-prompts 10",
                  "params": {"grid": {"random_input_len": [16, 32, 48, 64]}}, **(bench or {})},
        **fields,
    }
    f = path / "campaign.yaml"
    f.write_text(yaml.safe_dump(data))
    return f


def _validate(f: Path) -> Any:
    return CliRunner().invoke(main, ["validate", str(f)])


# ---------------------------------------------------------------------------------------------------
# Refusals: exit 2 naming the field, nothing started
# ---------------------------------------------------------------------------------------------------

def test_url_with_cmd_is_refused_naming_serve_url(tmp_path):
    f = endpoint_campaign(tmp_path, "http://127.0.0.1:1")
    data = yaml.safe_load(f.read_text())
    data["serve"] = {"cmd": "vllm serve m", "url": "http://127.0.0.1:1"}
    f.write_text(yaml.safe_dump(data))
    res = _validate(f)
    assert res.exit_code == 2 and "serve.url" in res.output and "cannot be combined with serve.cmd" in res.output


@pytest.mark.parametrize("extra, field", [
    ({"tune": {"space": {"max_num_seqs": {"choices": [8, 16]}}, "objective": {"metric": "output_throughput"},
               "budget": {"candidates": 2}}}, "tune"),
    ({"placement": {"tail_replicas": 1}}, "placement.tail_replicas"),
    ({"transport": {"probe": True}}, "transport.probe"),
])
def test_what_needs_a_server_of_our_own_is_refused_with_endpoints(tmp_path, extra, field):
    f = endpoint_campaign(tmp_path, "http://127.0.0.1:1", **extra)
    res = _validate(f)
    assert res.exit_code == 2, res.output
    assert f"{field}: cannot be used with serve.url" in res.output, res.output


def test_serve_params_and_neither_cmd_nor_url_are_refused(tmp_path):
    f = endpoint_campaign(tmp_path, "http://127.0.0.1:1")
    data = yaml.safe_load(f.read_text())
    data["serve"]["params"] = [{"max_num_seqs": 8}]
    f.write_text(yaml.safe_dump(data))
    res = _validate(f)
    assert res.exit_code == 2 and "serve.params" in res.output and "serve.url" in res.output
    data["serve"] = {"env": {}}
    f.write_text(yaml.safe_dump(data))
    res = _validate(f)
    assert res.exit_code == 2 and "serve.cmd: is required" in res.output and "`serve.url`" in res.output
    data["serve"] = {"url": ["http://a:1", "http://a:1/"]}
    f.write_text(yaml.safe_dump(data))
    res = _validate(f)
    assert res.exit_code == 2 and "serve.url" in res.output and "listed twice" in res.output
    data["serve"] = {"url": "ftp://a"}
    f.write_text(yaml.safe_dump(data))
    res = _validate(f)
    assert res.exit_code == 2 and "serve.url" in res.output and "http://" in res.output


def test_plan_has_one_server_config_per_endpoint(tmp_path):
    from raysweep.campaign import load_campaign
    from raysweep.plan.plan import build_plan

    f = endpoint_campaign(tmp_path, ["http://127.0.0.1:1/v1", {"url": "http://127.0.0.1:2", "reset_url": "http://x/r"}])
    plan = build_plan(load_campaign(f))
    assert [s.params for s in plan.serves] == [{"endpoint": "http://127.0.0.1:1"}, {"endpoint": "http://127.0.0.1:2"}]
    assert len(plan.points) == 2 * 4
    stored = load_campaign(f).stored_form()  # a resume reads it back: the endpoints again, no serve.params
    from raysweep.campaign import campaign_from_dict

    again = build_plan(campaign_from_dict(stored, base_dir=tmp_path))
    assert [s.id for s in again.serves] == [s.id for s in plan.serves]


class _NotOpenAI(BaseHTTPRequestHandler):
    def log_message(self, *a: object) -> None:
        pass

    def do_GET(self) -> None:
        body = b"<html>a web page</html>"
        self.send_response(200 if self.path == "/" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def web_page():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _NotOpenAI)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def test_an_endpoint_that_does_not_answer_or_is_not_openai_is_refused_before_anything_starts(tmp_path, web_page):
    dead = f"http://127.0.0.1:{free_port()}"
    for url, said in ((dead, "does not answer"), (web_page, "answers without an OpenAI API")):
        f = endpoint_campaign(tmp_path, [url])
        res = CliRunner().invoke(main, ["run", str(f)])
        assert res.exit_code == 2, res.output
        assert "serve.url[0]" in res.output and said in res.output, res.output
        assert not (tmp_path / "out").exists()  # nothing written, no Ray started
    res = CliRunner().invoke(main, ["profile", dead, "--grid", "max_concurrency=1,2", "--output-dir",
                                    str(tmp_path / "prof")])
    assert res.exit_code == 2 and "serve.url" in res.output and "does not answer" in res.output
    assert not (tmp_path / "prof").exists()


def test_profile_options_and_dry_run(tmp_path):
    assert parse_grid(("max_concurrency=1,8,64", "random_input_len=128")) == {
        "max_concurrency": [1, 8, 64], "random_input_len": [128]}
    for bad in ("max_concurrency", "=1", "a=1 b=2,"):
        with pytest.raises(UserError, match="--grid"):
            parse_grid((bad,))
    with pytest.raises(UserError, match="given twice"):
        parse_grid(("a=1", "a=2"))
    assert default_name("http://10.0.0.7:8000/v1") == "profile-10.0.0.7-8000"
    res = CliRunner().invoke(main, ["profile", "http://127.0.0.1:9", "--grid", "max_concurrency=1,8,64",
                                    "--bench-cmd", "vllm bench serve --model m --num-prompts 20",
                                    "--output-dir", str(tmp_path / "p"), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "3 bench point(s) x 3 run(s) = 9 run(s)" in res.output
    assert "endpoint: http://127.0.0.1:9 (running already" in res.output and "cache reset: none" in res.output
    assert not (tmp_path / "p").exists()


# ---------------------------------------------------------------------------------------------------
# Against the stand-in that goes away, on the simulated cluster
# ---------------------------------------------------------------------------------------------------

def _standin(port: int, *args: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([PY, str(STANDIN / "server.py"), "--model", "m", "--port", str(port), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert wait_for(lambda: subprocess.run(["curl", "-sf", f"http://127.0.0.1:{port}/v1/models"],
                                           capture_output=True).returncode == 0, 30)
    return proc


@pytest.mark.ray
def test_endpoint_that_goes_away_fails_its_point_and_resume_finishes(gpu_cluster, tmp_path):
    from raysweep.ledger import Ledger
    from raysweep.results.table import results_table

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = _standin(port, "--die-after", "15")  # dies during the second point (10 requests each)
    try:
        uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
        f = endpoint_campaign(tmp_path, {"url": url, "reset_url": f"{url}/reset_prefix_cache"},
                              tracking={"backend": "mlflow", "uri": uri})
        res = CliRunner().invoke(main, ["run", str(f)])
        assert res.exit_code == 1, res.output
        assert server.wait(10) == 3  # it died as told
        led = Ledger.open_existing(tmp_path / "out")
        by_state: dict[str, list[Any]] = {}
        for p in led.points():
            by_state.setdefault(str(p.state.value), []).append(p)
        # the first point done, the second failed as the endpoint went away, the other two left for the resume
        # (not failed against a dead endpoint)
        assert {k: len(v) for k, v in by_state.items()} == {"done": 1, "failed": 1, "pending": 2}, by_state
        points = [by_state["done"][0], by_state["failed"][0]]
        assert "stopped answering" in (points[1].error or ""), points[1].error
        first_done = points[0].ended_at
        led.close()
        server = _standin(port)  # back again
        res = CliRunner().invoke(main, ["resume", str(tmp_path / "out")])
        assert res.exit_code == 0, res.output
        led = Ledger.open_existing(tmp_path / "out")
        done = {p.point_id: p for p in led.points()}
        assert {p.state for p in done.values()} == {"done"}
        assert done[points[0].point_id].ended_at == first_done and done[points[0].point_id].attempts == 1
        assert done[points[1].point_id].attempts == 2
        assert {s.command for s in led.servers()} == {f"endpoint {url} (not started by raysweep)"}
        led.close()
        df = results_table(CampaignDir(tmp_path / "out"))
        assert len(df) == 4 and set(df["server_origin"]) == {"endpoint"} and set(df["endpoint_url"]) == {url}
        assert set(df["cache_state_before"]) == {"reset"}
        assert set(df["server_unknown"]) == {"niceness, CPU affinity, GPUs, versions"}  # the stand-in has no /version
        assert df["server_nice"].isna().all() if "server_nice" in df.columns else True
        # tracking: the resumed campaign logged into the runs the first one made, one per point
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        runs = client.search_runs([client.get_experiment_by_name("ep").experiment_id])
        kinds = sorted(r.data.tags["raysweep.kind"] for r in runs)
        assert kinds == ["campaign"] + ["point"] * 4, kinds
        assert {r.data.tags["raysweep.runs_logged"] for r in runs if r.data.tags["raysweep.kind"] == "point"} == {"0"}
        camp = next(r for r in runs if r.data.tags["raysweep.kind"] == "campaign")
        assert "report.html" in [a.path for a in client.list_artifacts(camp.info.run_id)]
    finally:
        server.kill()
        server.wait(10)


# ---------------------------------------------------------------------------------------------------
# Against the real vLLM CPU server
# ---------------------------------------------------------------------------------------------------

@pytest.mark.ray
@pytest.mark.vllm
def test_profile_sweeps_the_real_vllm_server_it_did_not_start(vllm_server, gpu_cluster, tmp_path):
    url = vllm_server["url"]
    out = tmp_path / "prof"
    res = CliRunner().invoke(main, ["profile", url, "--grid", "max_concurrency=1,4", "--runs", "1",
                                    "--bench-cmd", f"vllm bench serve --model {vllm_server['model']} --dataset-name "
                                                   "random --random-input-len 32 --random-output-len 8 --num-prompts 8 "
                                                   "--ignore-eos",
                                    "--reset-url", f"{url}/reset_prefix_cache", "--output-dir", str(out)])
    assert res.exit_code == 0, res.output
    written = yaml.safe_load((out / "campaign.yaml").read_text())
    assert written["serve"] == {"url": {"url": url, "reset_url": f"{url}/reset_prefix_cache"}}
    # it ends with its report, conclusions about loads (one endpoint is no set of configs), and its points' table
    assert written["report"] is True and (out / "report.html").is_file()
    check_page(out / "report.html", tmp_path)  # in Chromium: no script error, no note said twice
    assert "Capacity for all bench points: output_throughput " in res.output  # no GPU count declared: not per GPU
    assert "By max_concurrency for all bench points: 1: " in res.output
    assert "better than" not in res.output and "Best for" not in res.output
    assert "2 point(s); noisy" in res.output
    from raysweep.results.table import results_table

    df = results_table(CampaignDir(out))
    assert len(df) == 2 and sorted(df["max_concurrency"]) == [1, 4]
    assert set(df["server_origin"]) == {"endpoint"} and set(df["cache_state_before"]) == {"reset"}
    assert (df["completed"] == 8).all() and (df["total_output_tokens"] == 64).all()
    import vllm

    assert set(df["provenance_vllm"]) == {vllm.__version__}  # its /version answered
    assert set(df["server_unknown"]) == {"niceness, CPU affinity, GPUs"}
    assert df["server_num_requests_running_max"].notna().all() if "server_num_requests_running_max" in df else True
    rec = json.loads(next((out / "points").rglob("run=0.json")).read_text())
    assert rec["validity_issues"] == "" or "niced" not in rec["validity_issues"]
    # the server raysweep did not start is still there, and running the same line again has nothing to do
    assert vllm_server["pid"] and subprocess.run(["kill", "-0", str(vllm_server["pid"])]).returncode == 0
    res = CliRunner().invoke(main, ["status", str(out)])
    assert res.exit_code == 0 and "done" in res.output
    # the readers work as for a started server: aggregates, the report, compare
    res = CliRunner().invoke(main, ["results", str(out), "--aggregate"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["report", str(out), "--out", str(tmp_path / "report.html")])
    assert res.exit_code == 0, res.output
    assert url in (tmp_path / "report.html").read_text()
    # the report into the campaign dir keeps its figures; written again on the same runs it draws none, and
    # shows what a report drawing every figure afresh shows
    from raysweep.report.page import build_report

    assert CliRunner().invoke(main, ["report", str(out)]).exit_code == 0
    kept = {p.name: p.stat().st_mtime_ns for p in (out / ".figures").glob("*.json")}
    res = CliRunner().invoke(main, ["report", str(out)])
    assert res.exit_code == 0, res.output
    assert len(kept) >= 3 and {p.name: p.stat().st_mtime_ns for p in (out / ".figures").glob("*.json")} == kept
    made = re.compile(r" · made [0-9-]+ [0-9:]+")
    assert made.sub("", (out / "report.html").read_text()) == made.sub("", build_report(CampaignDir(out)))
    res = CliRunner().invoke(main, ["compare", str(out), str(out), "--out", str(tmp_path / "cmp")])
    assert res.exit_code == 0, res.output


@pytest.mark.timing
@pytest.mark.ray
def test_sla_search_runs_against_an_endpoint(gpu_cluster, tmp_path):
    """A streaming stand-in with 4 generation slots, started here and given by URL: the search finds where its
    TTFT target breaks, as it does against a server raysweep starts (tests/test_native.py)."""
    from raysweep.results.table import sla_table

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([PY, str(STANDIN / "stream_server.py"), "--model", "m", "--port", str(port),
                             "--ttft-delay", "0.01", "--itl-delay", "0.005", "--slots", "4"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: subprocess.run(["curl", "-sf", f"{url}/v1/models"], capture_output=True)
                        .returncode == 0, 30)
        f = endpoint_campaign(tmp_path, url, bench={
            "backend": "native", "client_cpus": 0.5, "params": [{"random_input_len": 8}],
            "cmd": "vllm bench serve --model m --random-output-len 4 --random-input-len 8 --num-prompts 24"},
            sla={"targets": [{"p90_ttft_ms": "<=30"}], "max_value": 64})
        res = CliRunner().invoke(main, ["run", str(f)])
        assert res.exit_code == 0, res.output
        row = sla_table(CampaignDir(tmp_path / "out")).iloc[0]
        assert row["state"] == "found" and 3 <= row["largest_pass"] <= 5, row.to_dict()
        assert row["smallest_fail"] == row["largest_pass"] + 1
        assert proc.poll() is None  # not ours to stop
    finally:
        proc.kill()
        proc.wait(10)

"""The Python API: docs/api.md's code blocks run in order against a finished stub campaign (the benchmark's,
made through the real plan and ledger, no server), `import raysweep` stays light, and what `load` returns
matches the CLI's tables. No Ray."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import matplotlib
import pytest
from test_cli_json import bench_module

import raysweep
from raysweep.errors import UserError
from raysweep.record.directory import CampaignDir

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def stub(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("api") / "stub"
    bench_module().build_stub(out, 36)
    return out


def test_the_api_page_runs_as_a_notebook(stub, capsys):
    matplotlib.use("Agg")
    text = (ROOT / "docs" / "api.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 7
    namespace: dict[str, object] = {}
    before = sorted(p.name for p in stub.rglob("*"))
    for i, block in enumerate(blocks):
        code = block.replace('"results/demo-cpu"', repr(str(stub)))
        exec(compile(code, f"docs/api.md block {i + 1}", "exec"), namespace)
    printed = capsys.readouterr().out
    assert "36 runs," in printed and "tok/s" in printed and "Best for" in printed
    assert "{'done': 36, 'running': 0, 'failed': 0, 'pending': 0, 'total': 36}" in printed
    assert sorted(p.name for p in stub.rglob("*")) == before          # reading wrote nothing there


def test_load_gives_the_tables_of_the_cli(stub):
    from raysweep.results.table import results_table

    c = raysweep.load(stub)
    assert c.name == "stub" and len(c.results) == 36 and len(c.summary) == 18
    assert list(c.results["point_id"]) == list(results_table(CampaignDir(stub))["point_id"])
    assert c.summary["runs"].eq(2).all() and c.results is c.results     # read once, kept
    assert c.sla.empty and c.conclusions is not None and c.conclusions.headlines
    paths = c.plot(out=stub.parent / "figs")
    assert paths and all(p.is_file() for p in paths)
    with pytest.raises(UserError, match="no such directory"):
        raysweep.load(stub.parent / "nowhere")


def test_import_raysweep_is_light():
    code = ("import sys, raysweep\n"
            "heavy = [m for m in ('pandas', 'ray', 'matplotlib', 'scipy', 'raysweep.api') if m in sys.modules]\n"
            "assert not heavy, heavy\n"
            "print(sorted(n for n in ('load', 'run', 'Campaign') if n in dir(raysweep)), callable(raysweep.load))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['Campaign', 'load', 'run'] True"  # listed without loading, there when asked


def test_run_of_a_finished_campaign_answers_without_ray(tmp_path):
    cfile = bench_module().build_stub(tmp_path / "stub", 36)
    code = ("import sys, raysweep\nc = raysweep.run(sys.argv[1])\n"
            "print(c.last_run.counts['done'], len(c.summary))\n"
            "assert 'ray' not in sys.modules, 'ray was imported'")
    done = subprocess.run([sys.executable, "-c", code, str(cfile)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["36", "18"]


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _endpoint_campaign(out: Path, url: str, **extra: object) -> dict[str, object]:
    return {"name": "ep", "output_dir": str(out), "serve": {"url": url},
            "bench": {"backend": "native", "cmd": "vllm bench serve --model tiny --dataset-name random "
                                                  "--num-prompts 4 --random-input-len 8 --random-output-len 4"},
            **extra}


def test_run_refuses_bad_input_as_the_cli_does_before_anything_starts(tmp_path):
    """raysweep.run goes through `raysweep run`'s checks: an endpoint that does not answer, a tracking URI
    MLflow refuses, a data file that is not there; each raises naming the field, and nothing is written."""
    import yaml
    from click.testing import CliRunner

    from raysweep.cli import main
    from raysweep.errors import CampaignError

    out = tmp_path / "out"
    url = f"http://127.0.0.1:{_closed_port()}"
    bad = {"serve.url": _endpoint_campaign(out, url),
           "tracking.uri": {**_endpoint_campaign(out, url), "serve": {"cmd": "vllm serve tiny"},
                            "tracking": {"backend": "mlflow", "uri": (tmp_path / "mlruns").as_uri()}}}
    for field, data in bad.items():
        with pytest.raises(CampaignError) as err:
            raysweep.run(data)
        assert err.value.field == field, err.value
        assert not out.exists()                                   # no ledger, no output dir
        f = tmp_path / "c.yaml"
        f.write_text(yaml.safe_dump(data))
        res = CliRunner().invoke(main, ["run", str(f)])
        assert res.exit_code == 2 and field in res.output and not out.exists()
        assert str(err.value).split(":", 1)[1].split()[0] in res.output  # the same words: the same check
    with pytest.raises(CampaignError, match="dataset-path") as err:
        raysweep.run({**_endpoint_campaign(out, url), "bench": {
            "backend": "native", "cmd": f"vllm bench serve --model tiny --dataset-name sharegpt "
                                        f"--dataset-path {tmp_path / 'missing.json'}"}})
    assert err.value.field and not out.exists()

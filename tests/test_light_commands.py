"""Commands that need neither Ray nor a tokenizer start neither and import neither: validate (of a campaign
whose bench points make random token ids), schema, status, results, compare and report."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from test_cli_json import bench_module

HEAVY = ("ray", "transformers", "torch", "vllm", "tokenizers")

CODE = ("import sys; from raysweep.cli import main\n"
        "try:\n    main(sys.argv[1:])\n"
        "except SystemExit as e:\n    assert e.code in (0, None), e\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "assert not heavy, heavy")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CODE, *args], capture_output=True, text=True, timeout=300)


def test_validate_of_a_random_data_set_loads_no_tokenizer(tmp_path):
    from raysweep.lab.tiny_model import make_tiny_model

    model = make_tiny_model(tmp_path / "tiny")  # a real local tokenizer: validate could load it, and must not
    data = yaml.safe_load(open("configs/demo-cpu.yaml"))
    data["output_dir"] = str(tmp_path / "out")
    f = tmp_path / "demo.yaml"
    f.write_text(yaml.safe_dump(data).replace("${RAYSWEEP_DEMO_MODEL}", str(model)))
    done = _run("validate", str(f))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"OK {f}: campaign demo-cpu")
    assert "took" not in done.stdout  # nothing slow to say
    assert not (tmp_path / "out").exists()


def test_validate_says_when_it_reads_a_data_files_tokens(tmp_path, monkeypatch):
    from raysweep.cli import campaign_file
    from raysweep.cli.campaign_file import _check

    model_dir = tmp_path / "tiny"
    from raysweep.lab.tiny_model import make_tiny_model

    model = make_tiny_model(model_dir)
    rows = [{"prompt": f"hello number {i}", "output_tokens": 4} for i in range(20)]
    (tmp_path / "set.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    data = {"name": "c", "output_dir": str(tmp_path / "out"),
            "serve": {"cmd": "python server.py"},
            "bench": {"backend": "native", "cmd": f"vllm bench serve --model {model} --dataset-name custom "
                                                  f"--dataset-path {tmp_path / 'set.jsonl'} --num-prompts 20"}}
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(data))
    # the note comes when the reading took at least `_SAY_READ_S` (half a second; how long the tokenizer takes to
    # load depends on the machine and on whether this process loaded it already): above and below that line
    monkeypatch.setattr(campaign_file, "_SAY_READ_S", 0.0)
    report = _check(str(f))
    assert report["valid"], report
    assert any(n.startswith("reading the bench points' data (files and tokenizer, to check their tokens) took ")
               for n in report["notes"]), report["notes"]
    monkeypatch.setattr(campaign_file, "_SAY_READ_S", float("inf"))
    report = _check(str(f))
    assert report["valid"] and not any("took" in n for n in report["notes"]), report["notes"]


@pytest.mark.parametrize("command", ["status", "results", "report", "compare", "schema"])
def test_read_commands_start_no_ray_and_load_no_tokenizer(tmp_path, command):
    out = tmp_path / "stub"
    bench_module().build_stub(out, 36)
    args = {"status": ["status", str(out)], "results": ["results", str(out), "--aggregate"],
            "report": ["report", str(out), "--out", str(tmp_path / "r.html")],
            "compare": ["compare", str(out), str(out), "--out", str(tmp_path / "cmp")],
            "schema": ["schema"]}[command]
    done = _run(*args)
    assert done.returncode == 0, done.stderr

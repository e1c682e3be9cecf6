"""`raysweep schema` (the checked-in copy cannot drift), the schema comments of the example configs, and
`raysweep validate`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner
from helpers import standin_campaign

from raysweep.campaign.schema import SCHEMA_FILE, campaign_schema
from raysweep.cli import main

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def test_checked_in_schema_equals_the_generated_one():
    assert json.loads((CONFIGS / SCHEMA_FILE).read_text()) == campaign_schema(), \
        f"configs/{SCHEMA_FILE} is stale: regenerate it with `raysweep schema > configs/{SCHEMA_FILE}`"


def test_schema_command_prints_the_schema():
    result = CliRunner().invoke(main, ["schema"])
    assert result.exit_code == 0
    schema = json.loads(result.output)
    assert schema == campaign_schema()
    assert {"name", "serve", "bench", "sla", "report"} <= set(schema["properties"])
    assert schema["required"] == ["name"] and schema["additionalProperties"] is False


def test_every_example_config_names_the_schema():
    for f in CONFIGS.glob("*.yaml"):
        assert f.read_text().splitlines()[0] == f"# yaml-language-server: $schema={SCHEMA_FILE}", f.name


def test_validate_ok_prints_counts(tmp_path):
    f = standin_campaign(tmp_path, serve_params={"grid": {"max_num_seqs": [8, 16]}},
                         bench_params={"grid": {"random_input_len": [16, 32, 64]}}, runs=2)
    result = CliRunner().invoke(main, ["validate", str(f)])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == (f"OK {f}: campaign t, 2 server config(s) x 3 bench point(s) x 2 run(s) = "
                                     "12 run(s)")
    assert not (tmp_path / "out").exists()  # nothing started, nothing written


def test_validate_refuses_a_bad_field_with_exit_2(tmp_path):
    f = standin_campaign(tmp_path, runs=0)
    result = CliRunner().invoke(main, ["validate", str(f)])
    assert result.exit_code == 2
    assert "runs" in result.output


def test_validate_reads_parameter_files_and_planning_checks(tmp_path):
    (tmp_path / "bench.json").write_text(json.dumps([{"random_input_len": 16}, "not a dict"]))
    f = standin_campaign(tmp_path, bench_params="bench.json")
    result = CliRunner().invoke(main, ["validate", str(f)])
    assert result.exit_code == 2 and "bench.json" in result.output, result.output
    g = standin_campaign(tmp_path, serve_params={"grid": {"tensor_parallel_size": [0]}})
    result = CliRunner().invoke(main, ["validate", str(g)])
    assert result.exit_code == 2 and "tensor_parallel_size" in result.output, result.output  # a planning check


def test_validate_needs_no_ray(tmp_path):
    f = standin_campaign(tmp_path)
    code = ("import sys; from raysweep.cli import main\n"
            "try:\n    main(['validate', sys.argv[1]])\nexcept SystemExit as e:\n    assert e.code in (0, None)\n"
            "assert 'ray' not in sys.modules, 'ray was imported'")
    proc = subprocess.run([sys.executable, "-c", code, str(f)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr

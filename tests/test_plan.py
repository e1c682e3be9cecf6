"""Unit tests for raysweep.plan.plan: expansion, stable ids, GPU shapes, the fingerprint and the dry-run text."""

from __future__ import annotations

import copy
import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from raysweep.campaign import CampaignSpec, campaign_from_dict
from raysweep.cli import main
from raysweep.plan.plan import Shape, build_plan, fingerprint, meaning, shape_of

BASE: dict[str, Any] = {
    "name": "plan",
    "runs": 3,
    "serve": {
        "cmd": "vllm serve facebook/opt-125m --max-num-seqs 8",
        "params": {"grid": {"max_num_seqs": [4, 8], "max_num_batched_tokens": [256, 512]}},
    },
    "bench": {
        "backend": "command",
        "cmd": "vllm bench serve --model facebook/opt-125m --dataset-name random",
        "params": {"grid": {"random_input_len": [16, 32, 64], "max_concurrency": [4]}},
    },
}


def spec_of(data: dict[str, Any], tmp_path: Path | None = None, env: dict[str, str] | None = None) -> CampaignSpec:
    return campaign_from_dict(copy.deepcopy(data), base_dir=tmp_path or Path("."), env=env or {})


def changed(**changes: Any) -> dict[str, Any]:
    """BASE with dotted-path changes, e.g. changed(**{"serve.cmd": "..."})."""
    d = copy.deepcopy(BASE)
    for path, value in changes.items():
        *parents, last = path.split(".")
        t = d
        for p in parents:
            t = t[p]
        t[last] = value
    return d


def ids(plan) -> set[str]:
    return {p.id for p in plan.points}


# ---------------------------------------------------------------------------------------------------
# Expansion
# ---------------------------------------------------------------------------------------------------

def test_build_plan_counts():
    plan = build_plan(spec_of(BASE))
    assert len(plan.serves) == 4
    assert len(plan.benches) == 3
    assert len(plan.points) == 4 * 3 * 3
    assert len(ids(plan)) == len(plan.points)  # every run has its own id
    assert plan.skipped_pairs == 0
    for s in plan.serves:
        assert len(plan.points_of(s.id)) == 3 * 3
    assert {p.run for p in plan.points} == {0, 1, 2}


def test_plan_commands_have_params_applied():
    plan = build_plan(spec_of(BASE))
    s = next(s for s in plan.serves if s.params == {"max_num_seqs": 4, "max_num_batched_tokens": 512})
    assert s.argv == ["vllm", "serve", "facebook/opt-125m", "--max-num-seqs", "4", "--max-num-batched-tokens", "512"]
    b = next(b for b in plan.benches if b.params["random_input_len"] == 32)
    assert b.argv[-4:] == ["--random-input-len", "32", "--max-concurrency", "4"]


def test_link_skips_pairs():
    d = changed(**{"serve.params": {"grid": {"max_num_seqs": [4, 8]}},
                   "bench.params": {"grid": {"max_concurrency": [4, 8], "random_input_len": [16, 32]}},
                   "link": {"max_num_seqs": "max_concurrency"}})
    plan = build_plan(spec_of(d))
    assert plan.skipped_pairs == 2 * 4 - 4
    assert len(plan.points) == 4 * 3
    for p in plan.points:
        assert p.serve.params["max_num_seqs"] == p.bench.params["max_concurrency"]


def test_point_lookup():
    plan = build_plan(spec_of(BASE))
    p = plan.points[5]
    assert plan.point(p.id) is p
    assert plan.point("nope") is None
    assert plan.points_of("nope") == []


# ---------------------------------------------------------------------------------------------------
# Stable ids
# ---------------------------------------------------------------------------------------------------

def test_ids_stable_when_grid_order_and_key_order_change():
    a = build_plan(spec_of(BASE))
    d = changed(**{"serve.params": {"grid": {"max_num_batched_tokens": [512, 256], "max_num_seqs": [8, 4]}},
                   "bench.params": {"grid": {"max_concurrency": [4], "random_input_len": [64, 16, 32]}}})
    b = build_plan(spec_of(d))
    assert ids(a) == ids(b)
    assert {s.id for s in a.serves} == {s.id for s in b.serves}
    assert {x.id for x in a.benches} == {x.id for x in b.benches}


def test_ids_stable_across_list_and_grid_forms_and_spelling():
    a = build_plan(spec_of(BASE))
    d = changed(**{"bench.params": [{"max-concurrency": 4, "random-input-len": n} for n in (64, 32, 16)]})
    assert ids(build_plan(spec_of(d))) == ids(a)


def test_adding_a_grid_value_keeps_old_ids():
    a = build_plan(spec_of(BASE))
    d = changed(**{"serve.params": {"grid": {"max_num_seqs": [4, 8, 16], "max_num_batched_tokens": [256, 512]}},
                   "bench.params": {"grid": {"random_input_len": [16, 32, 64, 128], "max_concurrency": [4]}}})
    b = build_plan(spec_of(d))
    assert ids(a) < ids(b)
    assert len(b.points) == 6 * 4 * 3
    # the same point has the same commands in both plans
    for p in a.points:
        q = b.point(p.id)
        assert (q.serve.argv, q.bench.argv, q.run) == (p.serve.argv, p.bench.argv, p.run)


def test_more_runs_keep_old_ids():
    a = build_plan(spec_of(BASE))
    b = build_plan(spec_of(changed(runs=5)))
    assert ids(a) < ids(b)
    assert len(ids(b) - ids(a)) == 4 * 3 * 2


def test_different_runs_get_different_ids():
    plan = build_plan(spec_of(BASE))
    s, b = plan.serves[0], plan.benches[0]
    run_ids = [p.id for p in plan.points if p.serve is s and p.bench is b]
    assert len(run_ids) == 3 and len(set(run_ids)) == 3


def test_benchmark_name_does_not_change_ids():
    a = build_plan(spec_of(changed(**{"bench.params": [{"random_input_len": 16}]})))
    b = build_plan(spec_of(changed(**{"bench.params": [{"_benchmark_name": "short", "random_input_len": 16}]})))
    assert ids(a) == ids(b)
    assert b.benches[0].label == "short"
    assert "_benchmark_name" not in " ".join(b.benches[0].argv)


def test_changing_a_value_changes_ids():
    a = build_plan(spec_of(changed(**{"serve.params": [{"max_num_seqs": 4}]})))
    b = build_plan(spec_of(changed(**{"serve.params": [{"max_num_seqs": 5}]})))
    assert not ids(a) & ids(b)


# ---------------------------------------------------------------------------------------------------
# GPU shape
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("params", "cmd", "shape"), [
    ({}, "vllm serve m", Shape(1, 1, 1)),
    ({"tensor_parallel_size": 2}, "vllm serve m", Shape(2, 1, 1)),
    ({"tensor-parallel-size": 4, "pipeline_parallel_size": 2}, "vllm serve m", Shape(4, 2, 1)),
    ({}, "vllm serve m -tp 2", Shape(2, 1, 1)),
    ({}, "vllm serve m --tensor-parallel-size=2", Shape(2, 1, 1)),
    ({}, "vllm serve m --tensor-parallel-size 2 -pp 2 --data-parallel-size=3", Shape(2, 2, 3)),
    ({"tensor_parallel_size": 4}, "vllm serve m -tp 2", Shape(4, 1, 1)),
    ({"tensor_parallel_size": 8}, "vllm serve m --tensor-parallel-size=2", Shape(8, 1, 1)),
    ({"data_parallel_size": 2.0}, "vllm serve m", Shape(1, 1, 2)),
])
def test_shape_of(params, cmd, shape):
    assert shape_of(params, shlex.split(cmd)) == shape


def test_gpu_count():
    assert Shape(2, 2, 3).gpu_count == 12
    assert Shape().gpu_count == 1


def test_plan_shapes_come_from_params_over_base_cmd():
    d = changed(**{"serve.cmd": "vllm serve m -tp 2",
                   "serve.params": [{"tensor_parallel_size": 4}, {"max_num_seqs": 1}]})
    plan = build_plan(spec_of(d))
    assert [s.shape.tp for s in plan.serves] == [4, 2]


# ---------------------------------------------------------------------------------------------------
# Fingerprint
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("change", [
    {"serve.cmd": "vllm serve facebook/opt-125m --max-num-seqs 16"},
    {"bench.cmd": "vllm bench serve --model facebook/opt-125m --dataset-name random --random-range-ratio 0.5"},
    {"serve.env": {"VLLM_ATTENTION_BACKEND": "FLASHINFER"}},
    {"bench.after_bench_cmd": "curl -X POST localhost/reset"},
])
def test_fingerprint_changes_with_meaning(change):
    assert fingerprint(spec_of(changed(**change))) != fingerprint(spec_of(BASE))


@pytest.mark.parametrize("change", [
    {"serve.params": {"grid": {"max_num_seqs": [4, 8, 16], "max_num_batched_tokens": [256, 512]}}},
    {"bench.params": {"grid": {"random_input_len": [16, 32, 64, 128], "max_concurrency": [4]}}},
    {"runs": 7},
    {"warmup": 4, "max_attempts": 5},
])
def test_fingerprint_unchanged_by_grid_and_runs(change):
    assert fingerprint(spec_of(changed(**change))) == fingerprint(spec_of(BASE))


def test_fingerprint_ignores_secret_value():
    a = spec_of(changed(**{"serve.env": {"HF_TOKEN": "one"}}))
    b = spec_of(changed(**{"serve.env": {"HF_TOKEN": "two"}}))
    assert fingerprint(a) == fingerprint(b)
    assert "one" not in json.dumps(meaning(a))


def test_meaning_holds_no_secret_from_the_command():
    d = changed(**{"bench.cmd": "vllm bench serve --model m --api-key ${OPENAI_API_KEY}"})
    spec = spec_of(d, env={"OPENAI_API_KEY": "sk-live-123"})
    assert spec.bench_argv[-1] == "sk-live-123"  # the real command has it
    assert "sk-live-123" not in json.dumps(meaning(spec))


# ---------------------------------------------------------------------------------------------------
# Dry run through the CLI
# ---------------------------------------------------------------------------------------------------

def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    data = copy.deepcopy(data)
    data["output_dir"] = str(tmp_path / "out")
    path = tmp_path / "campaign.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_dry_run_lists_every_command_with_run_counts_and_no_secret(tmp_path):
    d = changed(**{"serve.env": {"HF_TOKEN": "supersecret", "VLLM_LOGGING_LEVEL": "INFO"},
                   "serve.cmd": "vllm serve facebook/opt-125m --max-num-seqs 8 --api-key sk-XYZ"})
    path = _write(tmp_path, d)
    result = CliRunner().invoke(main, ["run", str(path), "--dry-run"])
    assert result.exit_code == 0, result.output
    text = result.output
    assert "supersecret" not in text and "sk-XYZ" not in text
    assert "HF_TOKEN=***" in text and "VLLM_LOGGING_LEVEL=INFO" in text
    assert "4 server config(s) x 3 bench point(s) x 3 run(s) = 36 run(s)" in text

    plan = build_plan(spec_of(d))
    for s in plan.serves:
        assert f"[server {s.id}]" in text
        assert f"command: {shlex.join(s.display_argv())} --host" in text
    for b in plan.benches:
        bench_lines = [ln for ln in text.splitlines() if f"[bench {b.id}]" in ln]
        assert len(bench_lines) == len(plan.serves)  # listed under every server
        assert all(ln.rstrip().endswith("x 3 run(s)") for ln in bench_lines)
    commands = [shlex.split(ln.split("command: ", 1)[1]) for ln in text.splitlines()
                if ln.startswith("    command: ")]
    assert len(commands) == 4 * 3
    for argv in commands:
        assert argv[argv.index("--percentile-metrics") + 1] == "ttft,tpot,itl,e2el"
        assert argv[argv.index("--metric-percentiles") + 1] == "50,90,95,99"
    for s in plan.serves:  # the server's --api-key masked in its command line
        assert "--api-key '***'" in text and f"--max-num-seqs {s.params['max_num_seqs']}" in text
    # every bench point's own parameters appear in its command
    lens = sorted(argv[argv.index("--random-input-len") + 1] for argv in commands)
    assert lens == sorted(["16", "32", "64"] * 4)
    # a dry run starts nothing and writes nothing
    assert not (tmp_path / "out").exists()
    assert str(tmp_path / "out") in text


def test_dry_run_keeps_user_percentiles(tmp_path):
    d = changed(**{"bench.cmd": "vllm bench serve --model m --metric-percentiles 75,99.9"})
    result = CliRunner().invoke(main, ["run", str(_write(tmp_path, d)), "--dry-run"])
    assert result.exit_code == 0
    line = next(ln for ln in result.output.splitlines() if ln.startswith("    command: "))
    argv = shlex.split(line.split("command: ", 1)[1])
    assert argv.count("--metric-percentiles") == 1
    assert argv[argv.index("--metric-percentiles") + 1] == "50,75,90,95,99,99.9"


def test_dry_run_reports_linked_skips(tmp_path):
    d = changed(**{"serve.params": {"grid": {"max_num_seqs": [4, 8]}},
                   "bench.params": {"grid": {"max_concurrency": [4, 8]}},
                   "link": {"max_num_seqs": "max_concurrency"}})
    result = CliRunner().invoke(main, ["run", str(_write(tmp_path, d)), "--dry-run"])
    assert result.exit_code == 0
    assert "= 6 run(s) (2 pair(s) skipped by link)" in result.output
    bench_lines = [ln for ln in result.output.splitlines() if ln.startswith("  [bench ")]
    assert len(bench_lines) == 2 and all(ln.endswith("x 3 run(s)") for ln in bench_lines)


def test_dry_run_shows_serve_secret_flag_masked(tmp_path):
    d = changed(**{"serve.cmd": "vllm serve m --hf-token=hf_SECRET --api-key sk-ABC"})
    result = CliRunner().invoke(main, ["run", str(_write(tmp_path, d)), "--dry-run"])
    assert result.exit_code == 0
    assert "hf_SECRET" not in result.output and "sk-ABC" not in result.output
    assert "--hf-token='***'" in result.output or "--hf-token=***" in result.output


@pytest.mark.parametrize("value", ["auto", 0, -2, True])
def test_bad_parallel_size_is_a_campaign_error_naming_the_field(value):
    from raysweep.errors import CampaignError

    with pytest.raises(CampaignError, match="tensor_parallel_size must be a positive integer") as err:
        build_plan(spec_of(changed(**{"serve.params": [{"tensor_parallel_size": value}]})))
    assert err.value.field.startswith("serve.params")


def test_bad_parallel_size_in_the_command_exits_2_from_the_cli(tmp_path):
    data = changed(**{"serve.cmd": "vllm serve m -tp two"})
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(data))
    res = CliRunner().invoke(main, ["run", str(f), "--dry-run"])
    assert res.exit_code == 2 and "serve.cmd" in res.output and "tensor_parallel_size" in res.output

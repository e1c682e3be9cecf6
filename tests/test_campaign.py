"""Unit tests for raysweep.campaign: the YAML schema, field-path errors through the CLI, parameter resolution."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from raysweep.campaign import campaign_from_dict, load_campaign
from raysweep.cli import main
from raysweep.errors import CampaignError
from raysweep.grid import BENCHMARK_NAME_KEY, MASK

BASE: dict[str, Any] = {
    "name": "unit",
    "runs": 2,
    "serve": {
        "cmd": "vllm serve facebook/opt-125m --max-num-seqs 8",
        "params": {"grid": {"max_num_seqs": [4, 8]}},
    },
    "bench": {
        "backend": "command",
        "cmd": "vllm bench serve --model facebook/opt-125m --dataset-name random",
        "params": [{"random_input_len": 16, "max_concurrency": 4}, {"random_input_len": 32, "max_concurrency": 8}],
    },
}


def write_campaign(tmp_path: Path, data: dict[str, Any] | None = None, name: str = "campaign.yaml",
                   **top: Any) -> Path:
    d = copy.deepcopy(BASE if data is None else data)
    d.setdefault("output_dir", str(tmp_path / "out"))
    d.update(top)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return path


def modified(fn) -> dict[str, Any]:
    d = copy.deepcopy(BASE)
    fn(d)
    return d


def dry_run(path: Path):
    return CliRunner().invoke(main, ["run", str(path), "--dry-run"])


# ---------------------------------------------------------------------------------------------------
# Refused campaigns: exit 2, a message naming the field path, nothing started
# ---------------------------------------------------------------------------------------------------

def _set(path: str, value: Any):
    def fn(d: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for p in parents:
            d = d[p]
        d[last] = value
    return fn


def _del(path: str):
    def fn(d: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for p in parents:
            d = d[p]
        del d[last]
    return fn


REFUSED = [
    # (id, change, substrings the message must contain)
    ("unknown-top-key", _set("runz", 2), ["runz", "did you mean 'runs'"]),
    ("unknown-nested-key", _set("serve.cmdd", "x"), ["serve.cmdd", "did you mean 'cmd'"]),
    ("wrong-type", _set("runs", "three"), ["runs", "integer", "three"]),
    ("runs-zero", _set("runs", 0), ["runs", "greater than or equal to 1"]),
    ("missing-serve-cmd", _del("serve.cmd"), ["serve.cmd", "required"]),
    ("missing-bench", _del("bench"), ["bench", "required"]),
    ("empty-grid", _set("serve.params", {"grid": {}}), ["serve.params.grid", "empty"]),
    ("empty-value-list", _set("serve.params", {"grid": {"max_num_seqs": []}}),
     ["serve.params.grid.max_num_seqs", "empty"]),
    ("link-unknown-serve-param", _set("link", {"max_num_seqz": "max_concurrency"}),
     ["link.max_num_seqz", "not a serve parameter", "max_num_seqs"]),
    ("link-unknown-bench-param", _set("link", {"max_num_seqs": "max_concurency"}),
     ["link.max_num_seqs", "max_concurency", "not a bench parameter", "max_concurrency"]),
    ("duplicate-combos", _set("bench.params", [{"random_input_len": 16}, {"random_input_len": 16}]),
     ["bench.params[1]", "duplicate"]),
    ("params-wrong-type", _set("serve.params", 5), ["serve.params", "accepted"]),
    ("params-item-not-mapping", _set("bench.params", [{"a": 1}, "b"]), ["bench.params[1]", "mapping"]),
    ("exclude-unknown-key", _set("serve.params", {"grid": {"max_num_seqs": [4, 8]}, "exclude": [{"nope": 1}]}),
     ["serve.params.exclude[0].nope", "max_num_seqs"]),
    ("grid-unknown-key", _set("serve.params", {"gird": {"max_num_seqs": [4]}}), ["serve.params.gird", "grid"]),
    ("empty-cmd", _set("bench.cmd", "   "), ["bench.cmd", "non-empty"]),
    ("bad-backend", _set("bench.backend", "vllm"), ["bench.backend", "native", "command"]),
    ("tail-replicas-negative", _set("placement", {"tail_replicas": -1}),
     ["placement.tail_replicas", "greater than or equal to 0"]),
    ("tail-replicas-with-sla", lambda d: (d.update(placement={"tail_replicas": 2},
                                                   sla={"targets": [{"p99_e2el_ms": "<=200"}]}),
                                          d["bench"].update(backend="native", cmd="vllm bench serve --model m"),
                                          d["bench"].update(params=[{"random_input_len": 16}])),
     ["placement.tail_replicas", "cannot be used with `sla:`", "follow one another on one server"]),
    ("link-no-pair", lambda d: (d.update(link={"max_num_seqs": "max_concurrency"}),
                                d["bench"].update(params=[{"max_concurrency": 99}])),
     ["link", "nothing would run"]),
]


@pytest.mark.parametrize(("change", "expected"), [(c, e) for _, c, e in REFUSED], ids=[i for i, _, _ in REFUSED])
def test_refused_campaign_exits_2_naming_the_field(tmp_path, change, expected):
    path = write_campaign(tmp_path, modified(change))
    result = dry_run(path)
    assert result.exit_code == 2, result.output
    assert "error" in result.output
    for text in expected:
        assert text in result.output, (text, result.output)
    assert not (tmp_path / "out").exists()


def test_params_file_missing_exits_2(tmp_path):
    path = write_campaign(tmp_path, modified(_set("serve.params", "serve-params.json")))
    result = dry_run(path)
    assert result.exit_code == 2
    assert "serve.params" in result.output and "serve-params.json" in result.output
    assert "does not exist" in result.output


def test_params_file_not_json_exits_2(tmp_path):
    (tmp_path / "bench.json").write_text("random_input_len: 16\n")
    path = write_campaign(tmp_path, modified(_set("bench.params", "bench.json")))
    result = dry_run(path)
    assert result.exit_code == 2
    assert "bench.params" in result.output and "not valid JSON" in result.output


def test_unset_variable_in_serve_cmd_exits_2(tmp_path, monkeypatch):
    monkeypatch.delenv("RAYSWEEP_UNSET_VAR", raising=False)
    path = write_campaign(tmp_path, modified(_set("serve.cmd", "vllm serve ${RAYSWEEP_UNSET_VAR} --max-num-seqs 8")))
    result = dry_run(path)
    assert result.exit_code == 2
    assert "serve.cmd" in result.output and "RAYSWEEP_UNSET_VAR" in result.output


def test_campaign_file_missing_exits_2(tmp_path):
    result = dry_run(tmp_path / "nothere.yaml")
    assert result.exit_code == 2
    assert "nothere.yaml" in result.output and "does not exist" in result.output


def test_invalid_yaml_exits_2(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: [unclosed\nserve: {cmd: x\n")
    result = dry_run(path)
    assert result.exit_code == 2
    assert "not valid YAML" in result.output


def test_yaml_that_is_not_a_mapping_exits_2(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- a\n- b\n")
    result = dry_run(path)
    assert result.exit_code == 2
    assert "mapping" in result.output


def test_several_errors_are_all_listed(tmp_path):
    path = write_campaign(tmp_path, modified(lambda d: d.update(runs=0, warmup=-1)))
    result = dry_run(path)
    assert result.exit_code == 2
    assert "runs" in result.output and "warmup" in result.output


def test_load_campaign_raises_campaign_error_with_field(tmp_path):
    path = write_campaign(tmp_path, modified(_set("serve.ready_timeout_s", -1)))
    with pytest.raises(CampaignError) as exc:
        load_campaign(path)
    assert exc.value.field == "serve.ready_timeout_s"


# ---------------------------------------------------------------------------------------------------
# Accepted campaigns
# ---------------------------------------------------------------------------------------------------

def test_defaults(tmp_path):
    d = {"name": "x", "serve": {"cmd": "vllm serve m"}, "bench": {"cmd": "vllm bench serve --model m"}}
    spec = load_campaign(write_campaign(tmp_path, d))
    c = spec.campaign
    assert (c.runs, c.warmup, c.max_attempts, c.continue_on_error, c.bench.backend) == (3, 0, 2, True, "native")
    assert spec.serve_combos == [{}] and spec.bench_combos == [{}]
    assert spec.serve_argv == ["vllm", "serve", "m"]
    assert spec.after_bench_argv is None


def test_params_from_vllm_json_file_relative_to_yaml(tmp_path, monkeypatch):
    sub = tmp_path / "camp"
    (sub / "params").mkdir(parents=True)
    (sub / "params" / "serve.json").write_text(json.dumps([{"max_num_seqs": 16}, {"max_num_seqs": 32}]))
    (sub / "params" / "bench.json").write_text(json.dumps({"short": {"random_input_len": 8},
                                                          "long": {"random_input_len": 64}}))
    d = modified(lambda d: (d["serve"].update(params="params/serve.json"),
                            d["bench"].update(params="params/bench.json")))
    path = write_campaign(sub, d)
    monkeypatch.chdir(tmp_path)  # not the YAML's directory: the path must be resolved against the YAML file
    spec = load_campaign(path)
    assert spec.serve_combos == [{"max_num_seqs": 16}, {"max_num_seqs": 32}]
    assert spec.bench_combos == [{BENCHMARK_NAME_KEY: "short", "random_input_len": 8},
                                 {BENCHMARK_NAME_KEY: "long", "random_input_len": 64}]
    assert spec.base_dir == sub.resolve()
    assert dry_run(path).exit_code == 0


def test_params_file_under_file_key_with_exclude(tmp_path):
    (tmp_path / "serve.json").write_text(json.dumps([{"max_num_seqs": 16}, {"max_num_seqs": 32}]))
    path = write_campaign(tmp_path, modified(_set("serve.params", {"file": "serve.json",
                                                                    "exclude": [{"max_num_seqs": 16}]})))
    assert load_campaign(path).serve_combos == [{"max_num_seqs": 32}]


def test_inline_list(tmp_path):
    spec = load_campaign(write_campaign(tmp_path))
    assert spec.bench_combos == BASE["bench"]["params"]


def test_grid_with_exclude(tmp_path):
    d = modified(_set("serve.params", {
        "grid": {"max_num_seqs": [4, 8, 16], "max_num_batched_tokens": [256, 512]},
        "exclude": [{"max_num_seqs": 16, "max_num_batched_tokens": 256}, {"max_num_seqs": 4}],
    }))
    spec = load_campaign(write_campaign(tmp_path, d))
    assert sorted((c["max_num_seqs"], c["max_num_batched_tokens"]) for c in spec.serve_combos) == [
        (8, 256), (8, 512), (16, 512)]


def test_exclude_everything_is_refused(tmp_path):
    d = modified(_set("serve.params", {"grid": {"max_num_seqs": [4]}, "exclude": [{"max_num_seqs": 4}]}))
    with pytest.raises(CampaignError) as exc:
        load_campaign(write_campaign(tmp_path, d))
    assert exc.value.field == "serve.params"


def test_variable_expansion(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYSWEEP_MODEL", "org/my model")
    monkeypatch.delenv("RAYSWEEP_UNSET_PORT", raising=False)
    d = modified(lambda d: (d["serve"].update(cmd="vllm serve '${RAYSWEEP_MODEL}' --x ${RAYSWEEP_UNSET_PORT:-7}",
                                              env={"A": "${RAYSWEEP_UNSET_PORT:-fallback}", "B": 3, "C": True}),
                            d["bench"].update(after_bench_cmd="echo ${RAYSWEEP_MODEL:-none}")))
    spec = load_campaign(write_campaign(tmp_path, d))
    assert spec.serve_argv == ["vllm", "serve", "org/my model", "--x", "7"]
    assert spec.serve_env == {"A": "fallback", "B": "3", "C": "true"}
    assert spec.after_bench_argv == ["echo", "org/my", "model"]


def test_explicit_env_mapping_overrides_process_env(tmp_path):
    d = modified(_set("serve.cmd", "vllm serve ${M}"))
    spec = campaign_from_dict(yaml.safe_load(yaml.safe_dump(d)), base_dir=tmp_path, env={"M": "given"})
    assert spec.serve_argv == ["vllm", "serve", "given"]


def test_unset_variable_in_env_value_names_the_env_field(tmp_path, monkeypatch):
    monkeypatch.delenv("RAYSWEEP_UNSET_VAR", raising=False)
    d = modified(_set("bench.env", {"OPENAI_API_KEY": "${RAYSWEEP_UNSET_VAR}"}))
    with pytest.raises(CampaignError) as exc:
        load_campaign(write_campaign(tmp_path, d))
    assert exc.value.field == "bench.env.OPENAI_API_KEY"


# ---------------------------------------------------------------------------------------------------
# The stored form (what the ledger keeps)
# ---------------------------------------------------------------------------------------------------

def test_stored_form_masks_literal_secrets_and_keeps_references(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_from_env")
    d = modified(lambda d: (d["serve"].update(env={"HF_TOKEN": "abc", "VLLM_LOGGING_LEVEL": "DEBUG"}),
                            d["bench"].update(env={"OPENAI_API_KEY": "${HF_TOKEN}"})))
    spec = load_campaign(write_campaign(tmp_path, d))
    assert spec.serve_env["HF_TOKEN"] == "abc"  # the resolved campaign still has the real value
    assert spec.bench_env["OPENAI_API_KEY"] == "hf_from_env"
    stored = spec.stored_form()
    assert stored["serve"]["env"] == {"HF_TOKEN": MASK, "VLLM_LOGGING_LEVEL": "DEBUG"}
    assert stored["bench"]["env"] == {"OPENAI_API_KEY": "${HF_TOKEN}"}
    text = json.dumps(stored)
    assert "abc" not in text and "hf_from_env" not in text
    # parameters are stored resolved
    assert stored["serve"]["params"] == [{"max_num_seqs": 4}, {"max_num_seqs": 8}]


def test_stored_form_round_trips_when_no_secret_was_masked(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_from_env")
    d = modified(_set("serve.env", {"HF_TOKEN": "${HF_TOKEN}"}))
    spec = load_campaign(write_campaign(tmp_path, d))
    again = campaign_from_dict(spec.stored_form(), base_dir=tmp_path)
    assert again.serve_env == {"HF_TOKEN": "hf_from_env"}
    assert again.serve_combos == spec.serve_combos and again.bench_combos == spec.bench_combos
    assert again.serve_argv == spec.serve_argv


def test_resolving_a_masked_secret_names_the_field(tmp_path):
    d = modified(_set("serve.env", {"HF_TOKEN": "abc"}))
    spec = load_campaign(write_campaign(tmp_path, d))
    with pytest.raises(CampaignError) as exc:
        campaign_from_dict(spec.stored_form(), base_dir=tmp_path)
    assert exc.value.field == "serve.env.HF_TOKEN"
    assert "masked" in str(exc.value)


def test_stored_form_round_trip_keeps_boolean_env(tmp_path):
    from raysweep.plan.plan import fingerprint

    d = modified(_set("serve.env", {"VLLM_USE_V1": True, "N": 1}))
    spec = load_campaign(write_campaign(tmp_path, d))
    assert spec.serve_env == {"VLLM_USE_V1": "true", "N": "1"}
    again = campaign_from_dict(spec.stored_form(), base_dir=tmp_path)
    assert again.serve_env == spec.serve_env
    assert fingerprint(again) == fingerprint(spec)


def test_stored_form_masks_literal_secret_flags_in_commands(tmp_path, monkeypatch):
    monkeypatch.setenv("RS_KEY", "sk-env-value")
    d = modified(lambda d: (d["serve"].update(cmd=d["serve"]["cmd"] + " --api-key sk-literal-9"),
                            d["bench"].update(cmd=d["bench"]["cmd"] + " --api-key ${RS_KEY}")))
    spec = load_campaign(write_campaign(tmp_path, d))
    assert "sk-literal-9" in spec.serve_argv and "sk-env-value" in spec.bench_argv
    stored = spec.stored_form()
    assert "sk-literal-9" not in json.dumps(stored) and "--api-key '***'" in stored["serve"]["cmd"]
    assert "${RS_KEY}" in stored["bench"]["cmd"]
    with pytest.raises(CampaignError) as exc:
        campaign_from_dict(stored, base_dir=tmp_path)
    assert exc.value.field == "serve.cmd" and "masked" in str(exc.value)


# -- input validation: parameter files, flag names, percentiles, output_dir -------------------------

def _param_file(tmp_path: Path, records: Any, name: str = "bench.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(records))
    return path


@pytest.mark.parametrize("records, entry", [
    ([{"max_concurrency": 4}, {"max_concurrency": 4}], "entry 1"),            # duplicate of entry 0
    ([{"max_concurrency": 4}, {"": 3}], "entry 1"),                           # empty key
    ([{"max_concurrency": 4}, {"max concurrency": 3}], "entry 1"),            # not a flag
    ([{"max_concurrency": 4}, 7], "entry 1"),                                 # not an object
    ({"a": {"max_concurrency": 4}, "b": {"--max-concurrency": 2}}, "entry 'b'"),
])
def test_every_parameter_file_error_names_the_file_and_the_entry(tmp_path, records, entry):
    path = _param_file(tmp_path, records)
    data = copy.deepcopy(BASE)
    data["bench"]["params"] = str(path)
    with pytest.raises(CampaignError) as e:
        campaign_from_dict(data, base_dir=tmp_path, env={})
    assert str(path) in str(e.value) and entry in str(e.value)


def test_a_native_point_refused_from_a_parameter_file_names_the_file_and_the_entry(tmp_path):
    path = _param_file(tmp_path, [{"max_concurrency": 4}, {"max_concurrency": 2}, {"request_rate": -1}])
    data = copy.deepcopy(BASE)
    data["bench"] = {"cmd": "vllm bench serve --model m", "params": {"file": str(path),
                                                                      "exclude": [{"max_concurrency": 2}]}}
    with pytest.raises(CampaignError) as e:
        campaign_from_dict(data, base_dir=tmp_path, env={})
    assert "--request-rate" in str(e.value) and str(path) in str(e.value) and "entry 2" in str(e.value)


def test_a_bench_command_completed_by_its_parameters_is_judged_per_point(tmp_path):
    """`--duration` needs a closed loop or a rate: a command that leaves it to the grid's `max_concurrency` is
    accepted; where some point still lacks it, that point is named; where no parameter could help, the
    command is."""
    data = copy.deepcopy(BASE)
    data["bench"] = {"cmd": "vllm bench serve --model m --duration 5", "params": {"grid": {"max_concurrency": [1, 4]}}}
    campaign_from_dict(data, base_dir=tmp_path, env={})
    data["bench"]["params"] = [{"max_concurrency": 4}, {"random_input_len": 8}]
    with pytest.raises(CampaignError) as e:
        campaign_from_dict(data, base_dir=tmp_path, env={})
    assert e.value.field == "bench.params[1]" and "--duration needs --max-concurrency" in e.value.message
    data["bench"] = {"cmd": "vllm bench serve --model m --duration 5 --ramp-up-strategy linear",
                     "params": {"grid": {"max_concurrency": [1, 4]}}}
    with pytest.raises(CampaignError) as e:
        campaign_from_dict(data, base_dir=tmp_path, env={})
    assert e.value.field == "bench.cmd" and "--ramp-up-strategy" in e.value.message


@pytest.mark.parametrize("key", ["max num seqs", "", "max_num_seqs=4", "-x", "a'b", "x.", "é"])
def test_a_key_that_cannot_be_a_flag_is_refused(tmp_path, key):
    data = copy.deepcopy(BASE)
    data["serve"]["params"] = [{"max_num_seqs": 4}, {key: 8}]
    with pytest.raises(CampaignError) as e:
        campaign_from_dict(data, base_dir=tmp_path, env={})
    assert e.value.field.startswith("serve.params[1]") and "flag" in str(e.value)


def test_flag_like_keys_are_accepted(tmp_path):
    data = copy.deepcopy(BASE)
    data["serve"]["params"] = [{"max-num-seqs": 4, "compilation_config.mode": 3, "kv_transfer_config": {"a": 1}}]
    assert campaign_from_dict(data, base_dir=tmp_path, env={}).serve_combos[0]["compilation_config.mode"] == 3


@pytest.mark.parametrize("backend", ["command", "native"])
@pytest.mark.parametrize("where", ["cmd", "params"])
def test_percentiles_outside_0_to_100_are_refused(tmp_path, backend, where):
    data = copy.deepcopy(BASE)
    data["bench"]["backend"] = backend
    if where == "cmd":
        data["bench"]["cmd"] += " --metric-percentiles 50,150"
    else:
        data["bench"]["params"][1]["metric_percentiles"] = "-5,99"
    with pytest.raises(CampaignError) as e:
        campaign_from_dict(data, base_dir=tmp_path, env={})
    assert "--metric-percentiles" in str(e.value) and "100" in str(e.value)
    assert e.value.field == ("bench.cmd" if where == "cmd" else "bench.params[1]")


@pytest.mark.parametrize("how", ["field", "option"])
def test_an_output_dir_that_is_a_file_exits_2(tmp_path, how):
    blocker = tmp_path / "results.txt"
    blocker.write_text("not a directory\n")
    if how == "field":
        path = write_campaign(tmp_path, output_dir=str(blocker))
        args = ["run", str(path)]
    else:
        path = write_campaign(tmp_path)
        args = ["run", str(path), "--output-dir", str(blocker)]
    for extra in ([], ["--dry-run"]):
        result = CliRunner().invoke(main, args + extra)
        assert result.exit_code == 2, result.output
        assert ("--output-dir" if how == "option" else "output_dir") in result.output
        assert str(blocker) in result.output and "not a directory" in result.output
        assert blocker.read_text() == "not a directory\n"

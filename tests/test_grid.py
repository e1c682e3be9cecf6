"""Unit tests for raysweep.grid: flags as vLLM's sweep renders them, grids, exclusions, ids, secrets."""

from __future__ import annotations

import hashlib
import json
import shlex

import pytest

from raysweep import grid
from raysweep.errors import CampaignError
from raysweep.grid import (
    BENCHMARK_NAME_KEY,
    MASK,
    apply_to_cmd,
    check_unique,
    exclude_combos,
    expand_grid,
    is_secret_name,
    link_matches,
    load_param_file,
    mask_argv,
    mask_env,
    params_id,
    shell_join,
)

# The base command of the verified examples in reference/vllm.md §1.5.
BASE = ["vllm", "serve", "meta-llama/Llama-3.1-8B", "--max-num-seqs", "64", "--enable-prefix-caching"]


# ---------------------------------------------------------------------------------------------------
# Flag rendering: vLLM's verified examples (reference/vllm.md §1.5)
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("params", "expected_tail"), [
    # replaced in place, new flag appended
    ({"max_num_seqs": 128, "max_num_batched_tokens": 4096},
     ["--max-num-seqs", "128", "--enable-prefix-caching", "--max-num-batched-tokens", "4096"]),
    # boolean False on a bare boolean flag -> --no-x in place
    ({"enable_prefix_caching": False}, ["--max-num-seqs", "64", "--no-enable-prefix-caching"]),
    # dotted key with a boolean -> --a.b=false, only the head is hyphenated
    ({"compilation_config.use_inductor": False},
     ["--max-num-seqs", "64", "--enable-prefix-caching", "--compilation-config.use_inductor=false"]),
    # dict value -> one JSON argument
    ({"compilation_config": {"cudagraph_mode": "FULL"}},
     ["--max-num-seqs", "64", "--enable-prefix-caching", "--compilation-config", '{"cudagraph_mode": "FULL"}']),
], ids=["replace-and-append", "bool-false", "dotted-bool", "dict-json"])
def test_vllm_verified_examples(params, expected_tail):
    assert apply_to_cmd(BASE, params) == BASE[:3] + expected_tail


def test_base_command_is_not_modified():
    base = list(BASE)
    apply_to_cmd(base, {"max_num_seqs": 1, "enable_prefix_caching": False})
    assert base == BASE


def test_bool_true_appends_bare_flag_and_false_appends_no_flag():
    assert apply_to_cmd(["vllm", "serve", "m"], {"enforce_eager": True}) == ["vllm", "serve", "m", "--enforce-eager"]
    assert apply_to_cmd(["vllm", "serve", "m"], {"enforce_eager": False}) == [
        "vllm", "serve", "m", "--no-enforce-eager"]


def test_dotted_key_true_and_rest_kept_as_written():
    out = apply_to_cmd(["x"], {"compilation_config.use_inductor": True, "compilation_config.mode": 3})
    assert out == ["x", "--compilation-config.use_inductor=true", "--compilation-config.mode", "3"]


def test_negated_flag_in_base_is_found_and_replaced():
    out = apply_to_cmd(["x", "--no-enable-prefix-caching", "--y", "1"], {"enable_prefix_caching": True})
    assert out == ["x", "--enable-prefix-caching", "--y", "1"]


def test_benchmark_name_is_never_passed():
    out = apply_to_cmd(BASE, {BENCHMARK_NAME_KEY: "big", "max_num_seqs": 1})
    assert out == ["vllm", "serve", "meta-llama/Llama-3.1-8B", "--max-num-seqs", "1", "--enable-prefix-caching"]
    assert not any("benchmark" in tok or tok == "big" for tok in out)


def test_hyphen_and_underscore_spellings_find_the_same_flag():
    # found under its other spelling and replaced in place (vLLM's parser takes both spellings)
    out = apply_to_cmd(["x", "--max_num_seqs", "64", "--y", "1"], {"max-num-seqs": 8})
    assert out[0] == "x" and out[1] in ("--max_num_seqs", "--max-num-seqs") and out[2:] == ["8", "--y", "1"]
    out = apply_to_cmd(["x", "--max-num-seqs", "64"], {"max_num_seqs": 8})
    assert out == ["x", "--max-num-seqs", "8"]


def test_scalar_values_are_str():
    assert apply_to_cmd(["x"], {"a": 1.5, "b": "s t", "c": 0}) == ["x", "--a", "1.5", "--b", "s t", "--c", "0"]


# ---------------------------------------------------------------------------------------------------
# Flag rendering: our repairs
# ---------------------------------------------------------------------------------------------------

def test_equals_token_is_replaced_not_appended():
    out = apply_to_cmd(["vllm", "serve", "m", "--max-num-seqs=64", "--x", "1"], {"max_num_seqs": 8})
    assert out == ["vllm", "serve", "m", "--max-num-seqs", "8", "--x", "1"]
    assert "--max-num-seqs=64" not in out


def test_equals_token_of_dotted_key_is_replaced():
    out = apply_to_cmd(["x", "--compilation-config.use_inductor=true", "--y", "1"],
                       {"compilation_config.use_inductor": False})
    assert out == ["x", "--compilation-config.use_inductor=false", "--y", "1"]


def test_list_value_becomes_several_arguments():
    out = apply_to_cmd(["vllm", "serve", "m"], {"lora_modules": ["a=/x", "b=/y"]})
    assert out == ["vllm", "serve", "m", "--lora-modules", "a=/x", "b=/y"]
    assert not any("[" in tok for tok in out)


def test_list_value_replaces_every_old_value():
    out = apply_to_cmd(["x", "--lora-modules", "a", "b", "--y", "1"], {"lora_modules": ["c"]})
    assert out == ["x", "--lora-modules", "c", "--y", "1"]


def test_list_of_dicts_are_json_arguments():
    out = apply_to_cmd(["x"], {"k": [{"a": 1}, 2]})
    assert out == ["x", "--k", '{"a": 1}', "2"]


def test_none_removes_flag_and_its_values():
    assert apply_to_cmd(BASE, {"max_num_seqs": None}) == [
        "vllm", "serve", "meta-llama/Llama-3.1-8B", "--enable-prefix-caching"]
    assert apply_to_cmd(BASE, {"enable_prefix_caching": None}) == [
        "vllm", "serve", "meta-llama/Llama-3.1-8B", "--max-num-seqs", "64"]
    assert apply_to_cmd(["x", "--lora-modules", "a", "b", "--y", "1"], {"lora_modules": None}) == ["x", "--y", "1"]
    assert apply_to_cmd(["x", "--max-num-seqs=64", "--y", "1"], {"max-num-seqs": None}) == ["x", "--y", "1"]


def test_none_for_an_absent_flag_changes_nothing():
    assert apply_to_cmd(BASE, {"not_there": None}) == BASE


def test_bare_boolean_followed_by_flag_is_not_eaten():
    base = ["vllm", "serve", "m", "--enable-prefix-caching", "--max-num-seqs", "64"]
    assert apply_to_cmd(base, {"enable_prefix_caching": False}) == [
        "vllm", "serve", "m", "--no-enable-prefix-caching", "--max-num-seqs", "64"]
    # vLLM's own sweep would overwrite the next token here; a key/value override must keep `--max-num-seqs 64`
    out = apply_to_cmd(base, {"enable_prefix_caching": True, "max_num_seqs": 8})
    assert out == ["vllm", "serve", "m", "--enable-prefix-caching", "--max-num-seqs", "8"]


def test_negative_number_counts_as_a_value():
    assert apply_to_cmd(["x", "--temperature", "-1", "--y"], {"temperature": 0.5}) == [
        "x", "--temperature", "0.5", "--y"]


def test_bare_boolean_followed_by_positional_keeps_the_positional():
    base = ["vllm", "serve", "--enable-prefix-caching", "meta-llama/Llama-3.1-8B"]
    assert apply_to_cmd(base, {"enable_prefix_caching": False}) == [
        "vllm", "serve", "--no-enable-prefix-caching", "meta-llama/Llama-3.1-8B"]


# ---------------------------------------------------------------------------------------------------
# Shell quoting
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [
    "has space", "it's", 'say "hi"', "$HOME", "${HF_TOKEN}", "a;b", "`id`", "back\\slash", "", "tab\there",
    '{"cudagraph_mode": "FULL"}', "*", "new\nline",
])
def test_shell_join_round_trips(value):
    argv = ["vllm", "serve", "m", "--x", value]
    line = shell_join(argv)
    assert shlex.split(line) == argv


def test_shell_join_quotes_dollar_so_it_is_not_expanded():
    line = shell_join(["echo", "$HOME"])
    assert "'$HOME'" in line


def test_rendered_flags_round_trip_through_shell():
    argv = apply_to_cmd(["vllm", "serve", "m"], {"compilation_config": {"a b": "c'd"}, "served_model_name": "x $y"})
    assert shlex.split(shell_join(argv)) == argv
    assert json.loads(argv[argv.index("--compilation-config") + 1]) == {"a b": "c'd"}


# ---------------------------------------------------------------------------------------------------
# Grid expansion, exclusion, uniqueness, links
# ---------------------------------------------------------------------------------------------------

def test_expand_grid_is_cartesian():
    combos = expand_grid({"a": [1, 2, 3], "b": ["x", "y"], "c": [True, False]}, "serve.params.grid")
    assert len(combos) == 12
    assert {json.dumps(c, sort_keys=True) for c in combos} == {
        json.dumps({"a": a, "b": b, "c": c}, sort_keys=True) for a in (1, 2, 3) for b in "xy" for c in (True, False)}


def test_expand_grid_scalar_is_one_value():
    combos = expand_grid({"a": [1, 2], "model": "m", "cfg": {"k": 1}}, "f")
    assert combos == [{"a": 1, "model": "m", "cfg": {"k": 1}}, {"a": 2, "model": "m", "cfg": {"k": 1}}]


def test_expand_grid_empty_grid_refused():
    with pytest.raises(CampaignError) as exc:
        expand_grid({}, "serve.params.grid")
    assert exc.value.field == "serve.params.grid"
    assert "empty" in str(exc.value)


def test_expand_grid_empty_value_list_refused():
    with pytest.raises(CampaignError) as exc:
        expand_grid({"a": [1], "max_num_seqs": []}, "serve.params.grid")
    assert exc.value.field == "serve.params.grid.max_num_seqs"
    assert "serve.params.grid.max_num_seqs" in str(exc.value)


def test_exclude_drops_matching_combos():
    combos = expand_grid({"a": [1, 2], "b": [1, 2]}, "g")
    kept = exclude_combos(combos, [{"a": 1, "b": 2}, {"a": 2.0}], "serve.params.exclude")
    assert kept == [{"a": 1, "b": 1}]


def test_exclude_matches_any_key_spelling():
    kept = exclude_combos([{"max_num_seqs": 1}, {"max_num_seqs": 2}], [{"max-num-seqs": 1}], "x")
    assert kept == [{"max_num_seqs": 2}]


def test_exclude_without_rules_keeps_everything():
    combos = [{"a": 1}, {"a": 2}]
    assert exclude_combos(combos, [], "x") == combos


def test_exclude_unknown_key_refused():
    with pytest.raises(CampaignError) as exc:
        exclude_combos([{"a": 1}], [{"a": 1}, {"zz": 1}], "serve.params.exclude")
    assert exc.value.field == "serve.params.exclude[1].zz"
    assert "a" in exc.value.message


def test_check_unique_accepts_distinct():
    check_unique([{"a": 1}, {"a": 2}, {"a": 1, "b": 1}], "f")


@pytest.mark.parametrize("combos", [
    [{"a": 1}, {"a": 1}],
    [{"a": 1, "b": 2}, {"b": 2, "a": 1}],
    [{"max_num_seqs": 1}, {"max-num-seqs": 1.0}],
    [{BENCHMARK_NAME_KEY: "x", "a": 1}, {BENCHMARK_NAME_KEY: "y", "a": 1}],
])
def test_check_unique_refuses_duplicate_combinations(combos):
    with pytest.raises(CampaignError) as exc:
        check_unique(combos, "bench.params")
    assert exc.value.field == "bench.params[1]"
    assert "duplicate" in exc.value.message


def test_check_unique_refuses_duplicate_benchmark_name():
    with pytest.raises(CampaignError) as exc:
        check_unique([{BENCHMARK_NAME_KEY: "x", "a": 1}, {BENCHMARK_NAME_KEY: "x", "a": 2}], "bench.params")
    assert exc.value.field == "bench.params[1]"
    assert BENCHMARK_NAME_KEY in exc.value.message


def test_link_matches():
    links = {"max_num_seqs": "max_concurrency"}
    assert link_matches({"max_num_seqs": 8}, {"max_concurrency": 8}, links)
    assert link_matches({"max-num-seqs": 8}, {"max_concurrency": 8.0}, links)
    assert not link_matches({"max_num_seqs": 8}, {"max_concurrency": 16}, links)
    assert not link_matches({"max_num_seqs": 8}, {"other": 8}, links)
    assert not link_matches({}, {"max_concurrency": 8}, links)
    assert link_matches({"a": 1}, {"b": 2}, {})


# ---------------------------------------------------------------------------------------------------
# vLLM parameter files
# ---------------------------------------------------------------------------------------------------

def test_load_param_file_list_form(tmp_path):
    p = tmp_path / "serve.json"
    p.write_text(json.dumps([{"max_num_seqs": 32}, {"max_num_seqs": 64, "enable_prefix_caching": False}]))
    assert load_param_file(p, "serve.params") == [{"max_num_seqs": 32},
                                                  {"max_num_seqs": 64, "enable_prefix_caching": False}]


def test_load_param_file_dict_form_adds_benchmark_name(tmp_path):
    p = tmp_path / "bench.json"
    p.write_text(json.dumps({"short": {"random_input_len": 128}, "long": {"random_input_len": 4096}}))
    assert load_param_file(p, "bench.params") == [
        {BENCHMARK_NAME_KEY: "short", "random_input_len": 128},
        {BENCHMARK_NAME_KEY: "long", "random_input_len": 4096},
    ]


def test_load_param_file_missing(tmp_path):
    with pytest.raises(CampaignError) as exc:
        load_param_file(tmp_path / "nope.json", "serve.params")
    assert exc.value.field == "serve.params"
    assert "does not exist" in exc.value.message and "nope.json" in exc.value.message


def test_load_param_file_invalid_json(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text("{not json")
    with pytest.raises(CampaignError) as exc:
        load_param_file(p, "serve.params")
    assert exc.value.field == "serve.params"
    assert "not valid JSON" in exc.value.message


@pytest.mark.parametrize(("content", "field"), [
    ("5", "serve.params"),
    ('"text"', "serve.params"),
    ("[{\"a\": 1}, 2]", "serve.params[1]"),
    ("{\"x\": {\"a\": 1}, \"y\": [1]}", "serve.params['y']"),
])
def test_load_param_file_wrong_shapes(tmp_path, content, field):
    p = tmp_path / "p.json"
    p.write_text(content)
    with pytest.raises(CampaignError) as exc:
        load_param_file(p, "serve.params")
    assert exc.value.field == field


# ---------------------------------------------------------------------------------------------------
# Stable ids
# ---------------------------------------------------------------------------------------------------

def test_params_id_ignores_key_order_spelling_and_int_float():
    a = params_id({"max_num_seqs": 1, "max_num_batched_tokens": 512, "cfg": {"x": 1, "y": 2.0}})
    assert a == params_id({"max-num-batched-tokens": 512, "max-num-seqs": 1.0, "cfg": {"y": 2, "x": 1}})
    assert len(a) == 12 and all(ch in "0123456789abcdef" for ch in a)


def test_params_id_is_deterministic_value():
    # a fixed value: the id must not depend on the process (no salted hash())
    assert params_id({"a": 1}) == hashlib.sha256(b'{"a":1}').hexdigest()[:12]


@pytest.mark.parametrize("other", [
    {"max_num_seqs": 2}, {"max_num_seqs": "1"}, {"max_num_seqs": True}, {"max_num_seqs": 1, "x": 1},
    {"max_num_seqs": 1.5}, {"max_num_seq": 1},
])
def test_params_id_differs_for_different_values(other):
    assert params_id({"max_num_seqs": 1}) != params_id(other)


# ---------------------------------------------------------------------------------------------------
# Secrets
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["HF_TOKEN", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "api-key", "hf_token",
                                  "HUGGING_FACE_HUB_TOKEN", "DB_PASSWORD"])
def test_is_secret_name_true(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["max_num_batched_tokens", "max-num-batched-tokens", "VLLM_HOST_IP", "KEY",
                                  "max_tokens", "model", "", "tokenizer"])
def test_is_secret_name_false(name):
    assert not is_secret_name(name)


def test_mask_env_masks_literals_and_keeps_references():
    env = {"HF_TOKEN": "hf_abc", "OPENAI_API_KEY": "${OPENAI_API_KEY}", "VLLM_HOST_IP": "10.0.0.1",
           "max_num_batched_tokens": "512"}
    masked = mask_env(env)
    assert masked == {"HF_TOKEN": MASK, "OPENAI_API_KEY": "${OPENAI_API_KEY}", "VLLM_HOST_IP": "10.0.0.1",
                      "max_num_batched_tokens": "512"}
    assert env["HF_TOKEN"] == "hf_abc"  # the input is not changed


def test_mask_env_does_not_treat_a_partial_reference_as_reference():
    assert mask_env({"HF_TOKEN": "hf_${X}"}) == {"HF_TOKEN": MASK}


def test_mask_env_masks_a_literal_default_of_a_reference():
    masked = mask_env({"HF_TOKEN": "${HF_TOKEN:-hf_literal_secret}"})
    assert "hf_literal_secret" not in json.dumps(masked)


def test_mask_argv():
    argv = ["vllm", "bench", "serve", "--api-key", "sk-XYZ", "--hf-token=hf_abc", "--max-num-batched-tokens", "512",
            "--model", "m"]
    out = mask_argv(argv)
    assert out == ["vllm", "bench", "serve", "--api-key", MASK, f"--hf-token={MASK}", "--max-num-batched-tokens",
                   "512", "--model", "m"]
    assert "sk-XYZ" not in out and not any("hf_abc" in t for t in out)
    assert argv[4] == "sk-XYZ"  # the input is not changed


def test_mask_argv_secret_flag_without_value_masks_nothing_else():
    assert mask_argv(["x", "--api-key", "--model", "m"]) == ["x", "--api-key", "--model", "m"]
    assert mask_argv(["x", "--api-key"]) == ["x", "--api-key"]


def test_module_exports_exist():
    for name in grid.__all__:
        assert hasattr(grid, name), name


def test_key_value_flag_followed_by_positional_keeps_the_positional():
    argv = ["vllm", "serve", "--max-num-seqs", "64", "MODEL"]
    assert apply_to_cmd(argv, {"max_num_seqs": 128}) == ["vllm", "serve", "--max-num-seqs", "128", "MODEL"]


def test_list_value_replaces_all_old_values():
    argv = ["vllm", "serve", "m", "--lora-modules", "a=/x", "b=/y", "--port", "1"]
    assert apply_to_cmd(argv, {"lora_modules": ["c=/z"]}) == [
        "vllm", "serve", "m", "--lora-modules", "c=/z", "--port", "1"]


def test_secret_values_and_mask_text():
    argv = ["vllm", "serve", "m", "--api-key", "sk-abcdef", "--hf-token=hf_xyz123", "--max-num-batched-tokens", "512"]
    env = {"HF_TOKEN": "hf_envtoken", "VLLM_HOST_IP": "127.0.0.1", "OPENAI_API_KEY": "${OPENAI_API_KEY}"}
    secrets = grid.secret_values(argv, env)
    assert secrets == {"sk-abcdef", "hf_xyz123", "hf_envtoken"}
    text = "args: api_key=sk-abcdef token hf_envtoken, max 512 on 127.0.0.1"
    assert grid.mask_text(text, secrets) == "args: api_key=*** token ***, max 512 on 127.0.0.1"


def test_mask_argv_keeps_references_and_labels_hide_secret_params():
    assert grid.mask_argv(["x", "--api-key", "${KEY}"]) == ["x", "--api-key", "${KEY}"]
    assert grid.mask_argv(["x", "--api-key=${KEY:-sk-default}"]) == ["x", "--api-key=${KEY:-***}"]
    assert grid.combo_label({"api_key": "sk-123", "max_concurrency": 4}) == "api_key=***-max_concurrency=4"


# -- parameter files: every error names the file and the entry --------------------------------------

@pytest.mark.parametrize("records, entry", [
    ([{"max_num_seqs": 4}, "x"], "entry 1"),
    ({"small": {"max_num_seqs": 4}, "big": 8}, "entry 'big'"),
    ([{"max_num_seqs": 4}, {"max num seqs": 8}], "entry 1"),
    ([{"max_num_seqs": 4}, {"": 8}], "entry 1"),
])
def test_param_file_errors_name_the_file_and_the_entry(tmp_path, records, entry):
    path = tmp_path / "serve.json"
    path.write_text(json.dumps(records))
    with pytest.raises(CampaignError) as e:
        grid.load_param_file(path, "serve.params")
    assert str(path) in str(e.value) and entry in str(e.value)


@pytest.mark.parametrize("key", ["max_num_seqs", "max-num-seqs", "compilation_config.mode", "a.b-c.d_e", "tp2",
                                 "_benchmark_name"])
def test_flag_keys_accepted(key):
    grid.check_flag_key(key, "x[0]")


@pytest.mark.parametrize("key", ["", " ", "max num seqs", "--max-num-seqs", "a=b", "a..b", "a.", ".a", "a/b", 3])
def test_keys_that_cannot_be_flags_refused(key):
    with pytest.raises(CampaignError, match="flag"):
        grid.check_flag_key(key, "x[0]")

"""Serve and bench options checked against vLLM's own parser before anything starts."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from raysweep.campaign import campaign_from_dict, vllm_options
from raysweep.cli import main
from raysweep.errors import CampaignError

# a slice of vLLM 0.32's `vllm serve` and `vllm bench serve` parsers, as `known_options` keeps them
SERVE = {"options": ["--max-num-seqs", "--max-num-active-seqs", "--max-num-queued-reqs", "--max-model-len",
                     "--enforce-eager", "--no-enforce-eager", "--dtype", "--load-format", "--port", "--host",
                     "--gpu-memory-utilization", "--compilation-config", "-cc", "--optimization-level",
                     "--tensor-parallel-size", "-tp"],
         "takes_value": ["--max-num-seqs", "--max-num-active-seqs", "--max-num-queued-reqs", "--max-model-len",
                         "--dtype", "--load-format", "--port", "--host", "--gpu-memory-utilization",
                         "--compilation-config", "-cc", "--optimization-level", "--tensor-parallel-size", "-tp"]}
BENCH = {"options": ["--model", "--max-concurrency", "--num-prompts", "--random-input-len", "--dataset-name"],
         "takes_value": ["--model", "--max-concurrency", "--num-prompts", "--random-input-len", "--dataset-name"]}
OPTIONS = {"vllm": "0.32.0+cpu", "serve": SERVE, "bench serve": BENCH}


@pytest.fixture
def cached(tmp_path, monkeypatch):
    """vLLM's option lists as the on-disk cache holds them (no vLLM import)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(vllm_options, "vllm_version", lambda: "0.32.0+cpu")
    path = vllm_options._cache_file("0.32.0+cpu")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(OPTIONS))
    return path


def _spec(tmp_path: Path, serve_cmd: str, serve_params, bench_cmd: str = "vllm bench serve --model m",
          backend: str = "command"):
    data = {"name": "t", "output_dir": str(tmp_path / "out"),
            "serve": {"cmd": serve_cmd, "params": serve_params},
            "bench": {"backend": backend, "cmd": bench_cmd}}
    return campaign_from_dict(data, base_dir=tmp_path)


def test_exact_names_pass_and_vllm_spellings_are_read(cached, tmp_path):
    spec = _spec(tmp_path, "vllm serve M --max_model_len 1024 --enforce-eager -O3 -tp 1 --compilation-config.mode 3 "
                 "--dtype=bfloat16", {"grid": {"max_num_seqs": [2, 16], "enforce_eager": [False]}},
                 "vllm bench serve --model m --random_input_len 8")
    check = vllm_options.check_campaign(spec)
    assert check.version == "0.32.0+cpu" and check.note is None
    assert set(check.checked) == {"serve", "bench serve"}
    assert "all known" in check.line()


def test_a_typo_in_the_grid_is_refused_with_three_closest_names(cached, tmp_path):
    spec = _spec(tmp_path, "vllm serve M", {"grid": {"max_num_seqz": [2, 16]}})
    with pytest.raises(CampaignError) as err:
        vllm_options.check_campaign(spec)
    assert err.value.field == "serve.params.grid.max_num_seqz"
    msg = err.value.message
    assert msg.startswith("max_num_seqz (--max-num-seqz): not an option of `vllm serve`; did you mean "
                          "--max-num-seqs, --max-num-active-seqs, --max-num-queued-reqs?")
    assert msg.count("--max-num-") == 4  # the option and three names, never the whole list


def test_an_abbreviation_argparse_would_accept_is_refused(cached, tmp_path):
    spec = _spec(tmp_path, "vllm serve M", [{"max_num_seq": 4}])
    with pytest.raises(CampaignError) as err:
        vllm_options.check_campaign(spec)
    assert err.value.field == "serve.params[0]"
    assert "did you mean --max-num-seqs" in err.value.message
    assert "an abbreviation is refused" in err.value.message


def test_the_command_and_parameter_files_are_checked(cached, tmp_path):
    with pytest.raises(CampaignError) as err:
        vllm_options.check_campaign(_spec(tmp_path, "vllm serve M --enforce-eagre", None))
    assert err.value.field == "serve.cmd" and "did you mean --enforce-eager" in err.value.message
    (tmp_path / "serve.json").write_text(json.dumps([{"max_num_seqs": 2}, {"max_model_length": 512}]))
    with pytest.raises(CampaignError) as err:
        vllm_options.check_campaign(_spec(tmp_path, "vllm serve M", "serve.json"))
    assert err.value.field == "serve.params (serve.json, entry 1)"
    assert "did you mean --max-model-len" in err.value.message


def test_bench_options_of_the_command_backend(cached, tmp_path):
    spec = _spec(tmp_path, "vllm serve M", None, "vllm bench serve --model m --max-concurency 4")
    with pytest.raises(CampaignError) as err:
        vllm_options.check_campaign(spec)
    assert err.value.field == "bench.cmd"
    assert "--max-concurency: not an option of `vllm bench serve`; did you mean --max-concurrency" in err.value.message


def test_other_programs_are_not_checked(cached, tmp_path):
    check = vllm_options.check_campaign(_spec(tmp_path, "python server.py --whatever 1", None, "bench.sh --x 1"))
    assert check.checked == {} and check.note is None


def test_no_vllm_on_the_driver_is_a_note_not_a_refusal(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_options, "vllm_version", lambda: None)
    check = vllm_options.check_campaign(_spec(tmp_path, "vllm serve M --max-num-seqz 4", None))
    assert check.checked == {} and "vLLM is not installed on this machine" in check.note
    assert check.line().startswith("vLLM options: not checked (")


def test_validate_and_dry_run_give_the_same_verdict(cached, tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump({"name": "t", "output_dir": str(tmp_path / "out"),
                                 "serve": {"cmd": "vllm serve M", "params": {"grid": {"max_num_seq": [2]}}},
                                 "bench": {"backend": "command", "cmd": "vllm bench serve --model M"}}))
    for args in (["validate", str(f)], ["run", "--dry-run", str(f)]):
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 2, res.output
        assert "serve.params.grid.max_num_seq: max_num_seq (--max-num-seq): not an option of `vllm serve`" \
               in res.output
    assert not (tmp_path / "out").exists()


def test_the_native_client_names_three_close_options_not_all():
    from raysweep.bench.options import parse_load_options

    with pytest.raises(CampaignError) as err:
        parse_load_options(["vllm", "bench", "serve", "--model", "m", "--max-concurency", "4"])
    msg = err.value.message
    assert "--max-concurency: not an option of the native client" in msg and "did you mean --max-concurrency" in msg
    assert msg.count("--") <= 6


@pytest.mark.vllm
def test_the_installed_vllm_parser_is_built_once_and_cached(tmp_path, monkeypatch):
    if vllm_options.vllm_version() is None:
        if os.environ.get("RAYSWEEP_REQUIRE_VLLM"):
            pytest.fail("the vLLM CPU build is required here (RAYSWEEP_REQUIRE_VLLM is set)")
        pytest.skip("the vLLM CPU build is not installed")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    options, note = vllm_options.known_options()
    assert note is None and options is not None
    path = vllm_options._cache_file(vllm_options.vllm_version() or "")
    assert path.is_file()
    # the real parser's names: the option, its negation, a short alias; bench serve's own
    assert {"--max-num-seqs", "--enforce-eager", "--no-enforce-eager", "-tp"} <= set(options["serve"]["options"])
    assert {"--max-concurrency", "--random-input-len"} <= set(options["bench serve"]["options"])
    t0 = time.monotonic()
    again, _ = vllm_options.known_options()
    assert again == options and time.monotonic() - t0 < 1.0  # read from the file, vLLM not imported again
    spec = _spec(tmp_path, "vllm serve M --enforce-eager", {"grid": {"max_num_seq": [2]}})
    with pytest.raises(CampaignError, match=r"did you mean --max-num-seqs"):
        vllm_options.check_campaign(spec)

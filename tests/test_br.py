"""Benchmark Report v0.2 (llm-d): `raysweep export --format br-v0.2` and its import into the catalogue, checked
against the format's published JSON Schema and example (tests/fixtures/llm-d, llm-d/llm-d-benchmark at f0dd0ba6,
Apache-2.0) and against the units each field accepts, which llm-d's pydantic models check in validators that the
JSON Schema does not carry (`schema_v0_2.py`: `check_units`)."""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pandas as pd
import pytest
import yaml
from click.testing import CliRunner

from raysweep.catalog import br, br_export, others
from raysweep.cli import main
from raysweep.record.directory import CampaignDir

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "llm-d"

# The units each Statistics accepts, as schema_v0_2.py's validators say (UNITS_* of base.py)
UNITS = {
    ("requests", "input_length"): {"count", "pixels"}, ("requests", "output_length"): {"count", "pixels"},
    ("latency", "time_to_first_token"): {"ms", "s"}, ("latency", "request_latency"): {"ms", "s"},
    ("latency", "normalized_time_per_output_token"): {"ms/token", "s/token"},
    ("latency", "time_per_output_token"): {"ms/token", "s/token"},
    ("latency", "inter_token_latency"): {"ms/token", "s/token"},
    ("throughput", "input_token_rate"): {"tokens/s"}, ("throughput", "output_token_rate"): {"tokens/s"},
    ("throughput", "total_token_rate"): {"tokens/s"}, ("throughput", "request_rate"): {"queries/s"},
}


@cache
def schema() -> dict[str, Any]:
    return json.loads((FIXTURES / "br_v0_2_json_schema.json").read_text())


def br_errors(report: dict[str, Any]) -> list[str]:
    """Every way `report` breaks Benchmark Report v0.2: the published JSON Schema, then the units rules."""
    plain = json.loads(json.dumps(report, default=str))     # YAML's timestamps as the strings JSON has
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
              for e in jsonschema.Draft202012Validator(schema()).iter_errors(plain)]
    agg = (((report.get("results") or {}).get("request_performance") or {}).get("aggregate") or {})
    for (group, name), allowed in UNITS.items():
        stats = (agg.get(group) or {}).get(name)
        if stats is not None and stats.get("units") not in allowed:
            errors.append(f"{group}.{name}: units {stats.get('units')!r} not in {sorted(allowed)}")
    return errors


@pytest.fixture(scope="module")
def example() -> dict[str, Any]:
    return yaml.safe_load((FIXTURES / "br_v0_2_example.yaml").read_text())


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    """The report tests' campaign (tests/test_plots.py), each run's record with a mean TTFT and TPOT beside the
    percentiles it has (a Statistics needs a mean)."""
    from test_plots import build_output_dir

    out = build_output_dir(tmp_path_factory.mktemp("br") / "out")
    for f in (out / "points").rglob("run=*.json"):
        rec = json.loads(f.read_text())
        rec["mean_ttft_ms"] = 1.25 * rec["median_ttft_ms"]
        rec["mean_tpot_ms"] = rec["median_tpot_ms"] = 0.5 + rec["run_number"]
        f.write_text(json.dumps(rec))
    return out


def test_the_published_example_is_valid_and_the_checks_refuse_what_the_format_refuses(example):
    assert br_errors(example) == []
    bad = copy.deepcopy(example)
    bad["run"]["uuid"] = bad["run"].pop("uid")                               # extra="forbid", and uid required
    assert any("uuid" in e for e in br_errors(bad)) and any("uid" in e for e in br_errors(bad))
    bad = copy.deepcopy(example)
    bad["results"]["request_performance"]["aggregate"]["latency"]["time_to_first_token"]["units"] = "tokens/s"
    assert br_errors(bad) == ["latency.time_to_first_token: units 'tokens/s' not in ['ms', 's']"]
    bad = copy.deepcopy(example)
    bad["scenario"]["stack"][0]["standardized"]["role"] = "leader"            # not a HostType
    assert any("role" in e or "stack" in e for e in br_errors(bad))


def test_every_point_is_exported_valid_with_its_interval_and_verdict(campaign):
    from raysweep.results import aggregate
    from raysweep.results.importer import read_table

    reports = br_export.export_reports(CampaignDir(campaign))
    summary = aggregate.summary_table(CampaignDir(campaign), results=read_table(campaign).df)
    assert len(reports) == len(summary) == 16
    assert all(br_errors(r) == [] for r in reports), [br_errors(r) for r in reports if br_errors(r)][0]
    assert len({r["run"]["uid"] for r in reports}) == 16 and len({r["run"]["eid"] for r in reports}) == 1
    by_point = {(r["scenario"]["stack"][0]["metadata"]["cfg_id"], r["scenario"]["load"]["metadata"]["cfg_id"]): r
                for r in reports}
    for _, row in summary.iterrows():
        rep = by_point[(row["serve_id"], row["bench_id"])]
        thr = rep["results"]["request_performance"]["aggregate"]["throughput"]
        out = thr["output_token_rate"]
        assert out["units"] == "tokens/s" and out["mean"] == pytest.approx(row["output_throughput_mean"])
        ext = out["raysweep"]                           # the interval: an extra field where the format allows
        assert ext["runs"] == row["runs"]
        if pd.notna(row["output_throughput_ci_low"]):
            assert (ext["ci_low"], ext["ci_high"]) == pytest.approx((row["output_throughput_ci_low"],
                                                                      row["output_throughput_ci_high"]))
            assert ext["level"] == 0.95 and ext["method"] == row["ci_method"]
        else:                                           # one run: no interval, none invented
            assert "ci_low" not in ext and row["runs"] == 1
        lat = rep["results"]["request_performance"]["aggregate"]["latency"]
        assert lat["time_to_first_token"]["units"] == "ms"
        assert lat["time_to_first_token"]["mean"] == pytest.approx(row["mean_ttft_ms_mean"])
        assert lat["time_to_first_token"]["p50"] == pytest.approx(row["median_ttft_ms_mean"])
        assert lat["time_to_first_token"]["p99"] == pytest.approx(row["p99_ttft_ms_mean"])
        assert lat["time_per_output_token"]["units"] == "ms/token" and "p90" not in lat["time_per_output_token"]
        engine = rep["scenario"]["stack"][0]["standardized"]
        assert engine["accelerator"]["parallelism"]["tp"] == row["tensor_parallel_size"]
        assert rep["scenario"]["stack"][0]["native"]["args"]["--max-num-seqs"] == row["max_num_seqs"]
        assert rep["scenario"]["load"]["standardized"]["concurrency"] == row["max_concurrency"]
        # the verdict of the point, on the objective's metric (output throughput per GPU here) and in keywords
        verdict = ext["verdict"]
        assert verdict["objective"] == "output_throughput_per_gpu" and verdict["verdict"] in rep["run"]["keywords"]
    words = {k: by_point[k]["results"]["request_performance"]["aggregate"]["throughput"]["output_token_rate"][
        "raysweep"]["verdict"]["verdict"] for k in by_point}
    # each configuration on one server start: ranked but not compared (the answer's own verdict), its leader's too
    assert words[("s8", "b256-4")] == "not compared" and words[("s16", "b256-8")] == "not compared"
    assert words[("s8", "b128-4")] == "not compared"
    assert sum(w == "not ranked" for w in words.values()) == 12               # not their config's best point
    from raysweep.results.data import answer_of, read_data

    answer = answer_of(read_data(CampaignDir(campaign)))
    leader = [v for v in answer.verdicts if v.shape == "random_input_len=256"][0].leader
    assert by_point[(leader["serve_id"], leader["bench_id"])]["results"]["request_performance"]["aggregate"][
        "throughput"]["output_token_rate"]["raysweep"]["verdict"]["value"] == pytest.approx(
        leader["output_throughput_per_gpu_mean"])


def test_the_published_example_is_imported_into_the_catalogue_in_raysweeps_units(tmp_path, example):
    src = tmp_path / "llm-d"
    src.mkdir()
    (src / "br.yaml").write_bytes((FIXTURES / "br_v0_2_example.yaml").read_bytes())
    (src / "other.yaml").write_text("version: '0.2'\nnot: a report\n")                # not a report: left alone
    (src / "as.json").write_text(json.dumps(example, default=str))                     # the same, as JSON
    res = CliRunner().invoke(main, ["catalog", "add", str(tmp_path / "cat"), str(src)])
    assert res.exit_code == 0, res.output
    from raysweep.catalog.store import Catalog

    runs = Catalog(tmp_path / "cat").query("SELECT * FROM runs ORDER BY source_path")
    assert list(runs["source"]) == [others.BR, others.BR]
    row = runs.iloc[0]
    assert (row.model, row.gpu_type, row.gpu_count, row.input_len, row.output_len) == \
        ("Qwen/Qwen3-0.6B", "NVIDIA-H100-80GB-HBM3", 8, "2148", "1000")
    assert (row.load_variable, row.load_value, row.dataset, row.config) == ("request_rate", 10.0, "sampled",
                                                                            "vllm-svc-0")
    lat = example["results"]["request_performance"]["aggregate"]["latency"]["time_to_first_token"]
    assert (row.mean_ttft_ms, row.median_ttft_ms, row.p90_ttft_ms, row.p99_ttft_ms) == pytest.approx(
        (1000 * lat["mean"], 1000 * lat["p50"], 1000 * lat["p90"], 1000 * lat["p99"]))  # seconds -> ms
    assert row.mean_tpot_ms == pytest.approx(36.8578234128654) and pd.isna(row.p99_tpot_ms)  # only a mean given
    assert row.request_throughput == pytest.approx(2262.448) and row.validity_ok
    assert row.date == pytest.approx(pd.Timestamp("2025-11-05T18:00:42Z").timestamp())


def test_exported_reports_read_back_as_the_same_values(campaign, tmp_path):
    res = CliRunner().invoke(main, ["export", str(campaign), "--format", "br-v0.2", "--out", str(tmp_path / "br")])
    assert res.exit_code == 0, res.output
    files = sorted((tmp_path / "br").glob("br-v0.2-*.yaml"))
    assert len(files) == 16 and "16 Benchmark Report v0.2 file(s)" in res.output
    for f in files:
        rep = yaml.safe_load(f.read_text())
        assert others.kind_of(f) == others.BR and br_errors(rep) == []
        (row,) = br.report_rows(rep)
        agg = rep["results"]["request_performance"]["aggregate"]
        assert row["output_throughput"] == pytest.approx(agg["throughput"]["output_token_rate"]["mean"])
        assert row["p99_ttft_ms"] == pytest.approx(agg["latency"]["time_to_first_token"]["p99"])
        assert row["load_variable"] == "max_concurrency" and row["config"] == \
            rep["scenario"]["stack"][0]["metadata"]["label"]


@pytest.mark.parametrize("args, named", [
    (["--format", "csv"], "--format"),
    (["--format", "br-v0.2", "--mlflow", "sqlite:///x.db"], "--format"),
    (["--out", "somewhere"], "--out"),
])
def test_bad_export_options_exit_2_and_write_nothing(campaign, tmp_path, args, named):
    before = sorted(p.name for p in campaign.iterdir())
    res = CliRunner().invoke(main, ["export", str(campaign), *[a.replace("somewhere", str(tmp_path / "o"))
                                                                for a in args]])
    assert res.exit_code == 2 and named in res.output
    assert sorted(p.name for p in campaign.iterdir()) == before and not (tmp_path / "o").exists()

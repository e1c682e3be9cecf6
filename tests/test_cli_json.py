"""`--json` on the commands that have it: one JSON document on stdout (nothing else there), valid against its
JSON Schema in raysweep/schemas; a `--json` on a command without it is refused (exit 2) naming the flag.
Tables for people: one column per parameter, sorted by parameter values, never cut when piped. Output dirs
are made through the ledger API (tests/test_plots.py) or as a finished stub campaign; no Ray, no server."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from click.testing import CliRunner
from test_plots import build_output_dir

from raysweep.cli import main
from raysweep.cli.jsonout import JSON_COMMANDS, jsonable, schema
from raysweep.record.directory import CampaignDir
from raysweep.report import page as report

ROOT = Path(__file__).parent.parent


def bench_module() -> Any:
    spec = importlib.util.spec_from_file_location("bench_read_commands",
                                                  ROOT / "benchmarks" / "bench_read_commands.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def document(args: list[str], kind: str, exit_code: int = 0) -> dict[str, Any]:
    """Run the command with --json; its stdout is one JSON document of `kind`, valid against its schema."""
    result = CliRunner().invoke(main, args)
    assert result.exit_code == exit_code, result.output
    doc = json.loads(result.stdout)      # the whole of stdout: nothing printed beside the document
    assert doc["kind"] == kind and doc["schema_version"] == 1
    jsonschema.validate(doc, schema(kind))
    return doc


@pytest.fixture
def outdir(tmp_path: Path) -> Path:
    return build_output_dir(tmp_path / "out", sla=True)


def files_of(path: Path) -> dict[str, int]:
    return {str(p.relative_to(path)): p.stat().st_mtime_ns for p in path.rglob("*")}


def test_schemas_are_valid_json_schemas_and_every_command_has_one():
    kinds = {"status", "results", "summary", "compare", "tune", "sla", "validate", "report", "run", "history",
             "catalog"}
    for kind in kinds:
        jsonschema.Draft202012Validator.check_schema(schema(kind))
    assert {c.split()[0] for c in JSON_COMMANDS} <= kinds | {"results"}


def test_status_results_and_aggregates_as_json_write_nothing(outdir):
    before = files_of(outdir)
    status = document(["status", str(outdir), "--json"], "status")
    assert status["counts"] == {"done": 31, "running": 0, "failed": 1, "pending": 0, "total": 32}
    assert status["complete"] is True and len(status["server_configs"]) == 2
    assert [f["error"] for f in status["failures"]] == ["server died during the point"]
    runs = document(["results", str(outdir), "--json"], "results")
    assert runs["rows"] == 31 == len(runs["runs"]) and runs["written"] == []
    assert "max_concurrency" in runs["columns"]
    summary = document(["results", str(outdir), "--aggregate", "--json", "--confidence", "0.9"], "summary")
    assert summary["confidence"] == 0.9 and len(summary["points"]) == 16
    assert summary["params"] == ["max_num_seqs", "tensor_parallel_size", "random_input_len", "max_concurrency"]
    # sorted by the parameter values, numbers as numbers
    keys = [tuple(p["params"][k] for k in ("max_num_seqs", "random_input_len", "max_concurrency"))
            for p in summary["points"]]
    assert keys == sorted(keys)
    point = summary["points"][0]
    assert set(point["metrics"]["output_throughput"]) >= {"mean", "ci_low", "ci_high", "cv"}
    assert files_of(outdir) == before              # read commands wrote nothing


def test_sla_compare_and_report_as_json(outdir, tmp_path, monkeypatch):
    sla = document(["sla", str(outdir), "--json"], "sla")
    assert {(s["state"], s["largest_pass"]) for s in sla["searches"]} == {("found", 4.0), ("above max", "inf"),
                                                                           ("never met", None)}
    other = build_output_dir(tmp_path / "other")
    cmp = document(["compare", str(outdir), str(other), "--json", "--metrics", "output_throughput"], "compare")
    (c,) = cmp["comparisons"]
    assert c["metrics"] == ["output_throughput"] and len(c["points"]) == 16 and cmp["written"] == []
    assert not (other / "compare").exists()      # nothing recorded without --record
    monkeypatch.setattr(report, "_figure_list", lambda data: [])
    monkeypatch.setattr(report, "_card_figure", lambda data, c, v: "")
    rep = document(["report", str(outdir), "--json", "--out", str(tmp_path / "r.html")], "report")
    assert rep["report"] == str(tmp_path / "r.html") and rep["conclusions"]


def test_validate_takes_many_files_and_reports_each(tmp_path):
    from helpers import standin_campaign

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    good = standin_campaign(tmp_path / "a", runs=2)
    bad = standin_campaign(tmp_path / "b", runs=0)
    ok = CliRunner().invoke(main, ["validate", str(good), str(good)])
    assert ok.exit_code == 0 and ok.stdout.count(f"OK {good}:") == 2
    doc = document(["validate", str(good), str(bad), "--json"], "validate", exit_code=2)
    assert doc["valid"] is False and [f["valid"] for f in doc["files"]] == [True, False]
    assert doc["files"][0]["runs"] == 4 and doc["files"][1]["field"] == "runs"
    plain = CliRunner().invoke(main, ["validate", str(good), str(bad)])
    assert plain.exit_code == 2 and f"OK {good}" in plain.stdout and f"{bad}: runs" in plain.output
    assert not (tmp_path / "a" / "out").exists()


def test_a_finished_campaign_run_again_answers_without_ray(tmp_path):
    bench = bench_module()
    cfile = bench.build_stub(tmp_path / "stub", 36)
    code = ("import sys, json; from raysweep.cli import main\n"
            "try:\n    main(['run', sys.argv[1], '--json'])\n"
            "except SystemExit as e:\n    assert e.code in (0, None), e\n"
            "assert 'ray' not in sys.modules, 'ray was imported'")
    done = subprocess.run([sys.executable, "-c", code, str(cfile)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    jsonschema.validate(doc, schema("run"))
    assert doc["ran"] is False and doc["counts"] == {"done": 36, "failed": 0, "pending": 0, "running": 0}
    assert doc["results"] and all(Path(p).is_file() for p in doc["results"])
    assert "nothing left to run" in done.stderr


def test_report_imports_only_what_its_sections_show(tmp_path):
    """A campaign without tune:, bench.workload or events: the report leaves those sections out without
    importing their modules (Optuna, Ray), and says so in no section."""
    out = tmp_path / "stub"
    bench_module().build_stub(out, 36)
    code = ("import sys; from raysweep.cli import main\n"
            "try:\n    main(['report', sys.argv[1], '--out', sys.argv[2], '--json'])\n"
            "except SystemExit as e:\n    assert e.code in (0, None), e\n"
            "heavy = [m for m in ('ray', 'optuna', 'raysweep.drive.recovery', 'raysweep.levels.search')\n"
            "         if m in sys.modules]\n"
            "assert not heavy, heavy")
    page = tmp_path / "report.html"
    done = subprocess.run([sys.executable, "-c", code, str(out), str(page)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    jsonschema.validate(json.loads(done.stdout), schema("report"))
    text = page.read_text()
    assert 'id="conclusions"' in text and 'id="figures"' in text
    assert not any(f'id="{sid}"' in text for sid in ("tuning", "workload", "events"))


def test_tune_as_json(tmp_path):
    from test_tune import campaign, simulate

    _, ledger, _ = simulate(tmp_path, campaign(budget={"candidates": 4}, seed=1), seed=1)
    ledger.close()
    doc = document(["tune", str(tmp_path / "out"), "--json"], "tune")
    assert len(doc["candidates"]) >= 4 and doc["objectives"]
    ranked = [c["rank"] for c in doc["candidates"] if c["rank"] is not None]
    assert ranked == sorted(ranked)


@pytest.mark.parametrize("command", [["plot", "X"], ["pareto", "X"], ["schema"], ["import", "A", "B"]])
def test_json_on_a_command_without_it_is_refused_naming_the_flag(command):
    result = CliRunner().invoke(main, [*command, "--json"])
    assert result.exit_code == 2
    assert "--json: `raysweep" in result.output and "has no JSON output" in result.output
    assert "status, results, compare, tune, sla, validate, report, run" in result.output


def test_json_values_are_plain_json():
    import numpy as np

    doc = jsonable({"a": np.float64("nan"), "b": float("inf"), "c": np.int64(3), "d": Path("/x"), "e": (1, None)})
    assert doc == {"a": None, "b": "inf", "c": 3, "d": "/x", "e": [1, None]}
    json.dumps(doc, allow_nan=False)


def test_piped_tables_cut_no_name_and_sort_by_parameters(outdir):
    result = CliRunner().invoke(main, ["results", str(outdir), "--aggregate", "--metrics",
                                       "output_throughput,median_ttft_ms,p99_ttft_ms"])
    assert result.exit_code == 0, result.output
    text = result.stdout
    lines = text.splitlines()
    head = lines[[i for i, ln in enumerate(lines) if ln.startswith("┏")][0]:][:6]
    head = head[:[i for i, ln in enumerate(head) if ln.startswith("┡")][0]]
    header = next(line for line in head if "max_num_seqs" in line)
    for name in ("max_num_seqs", "random_input_len", "max_concurrency", "output_throughput", "median_ttft_ms",
                 "p99_ttft_ms"):
        assert any(f" {name} " in line for line in head), name  # one column per parameter, whole names
    assert "…" not in text and "..." not in text
    names = [c.strip() for c in header.replace("┃", "│").split("│")[1:-1]]
    at = [names.index(n) + 1 for n in ("max_num_seqs", "random_input_len", "max_concurrency")]
    rows = [[line.split("│")[i] for i in at] for line in text.splitlines() if line.startswith("│")]
    keys = [tuple(int(c.strip()) for c in r) for r in rows if all(c.strip().isdigit() for c in r)]
    assert len(keys) == 16 and keys == sorted(keys)
    bad = CliRunner().invoke(main, ["results", str(outdir), "--aggregate", "--metrics", "median_ttf_ms"])
    assert bad.exit_code == 2 and "did you mean median_ttft_ms" in bad.output


def test_version_names_raysweep_vllm_and_ray():
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert lines[0].startswith("raysweep ") and lines[1].startswith("vLLM ") and lines[2].startswith("Ray ")


def test_deprecated_spellings_still_work_with_a_warning(outdir, tmp_path):
    result = CliRunner().invoke(main, ["pareto", str(outdir), "--format", "svg", "--out", str(tmp_path / "p")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "p" / "PARETO.svg").is_file()
    assert "--format is deprecated" in result.stderr and "--fig-format" in result.stderr
    result = CliRunner().invoke(main, ["pareto", str(outdir), "--fig-format", "pdf", "--out", str(tmp_path / "q")])
    assert result.exit_code == 0 and (tmp_path / "q" / "PARETO.pdf").is_file() and "is deprecated" not in result.output


def test_kept_aggregates_are_used_only_while_fresh(tmp_path):
    import time

    from raysweep.ledger import Ledger
    from raysweep.results.table import kept_summary, write_results

    out = build_output_dir(tmp_path / "out")
    assert kept_summary(CampaignDir(out)) is None                       # none written yet
    write_results(CampaignDir(out))                                     # as the campaign's end does
    kept = kept_summary(CampaignDir(out))
    assert kept is not None and len(kept) == 16
    assert kept_summary(CampaignDir(out), confidence=0.9) is None       # other settings: computed again
    time.sleep(0.05)
    ledger = Ledger.open_existing(out)                     # a point finishes after the summary was written
    try:
        (failed,) = [p for p in ledger.points() if p.state == "failed"]
        ledger.mark_running(failed.point_id, "srv-s8")
        ledger.mark_done(failed.point_id, "points/s16/b128-1/run=0.json")
    finally:
        ledger.close()
    assert kept_summary(CampaignDir(out)) is None


def test_kept_results_table_is_the_table_built_again_and_used_only_while_fresh(tmp_path):
    """results.parquet, as the campaign's end wrote it, stands for the table built from the result files (the
    same frame, every dtype), and only while no point finished after it and it holds a row per done run."""
    import time

    import pandas as pd

    from raysweep.ledger import Ledger
    from raysweep.results.importer import read_table
    from raysweep.results.records import kept_results, results_table
    from raysweep.results.table import write_results

    out = build_output_dir(tmp_path / "out")
    assert kept_results(CampaignDir(out)) is None                       # none written yet
    built = results_table(CampaignDir(out))
    write_results(CampaignDir(out))                                     # as the campaign's end does
    kept = kept_results(CampaignDir(out))
    assert kept is not None
    pd.testing.assert_frame_equal(kept, built, check_exact=True)
    pd.testing.assert_frame_equal(read_table(out).df, built, check_exact=True)
    short = tmp_path / "short.parquet"                     # a row fewer than the done runs: built again
    built.iloc[1:].to_parquet(short, index=False)
    short.replace(out / "results.parquet")
    assert kept_results(CampaignDir(out)) is None
    pd.testing.assert_frame_equal(read_table(out).df, built, check_exact=True)
    write_results(CampaignDir(out))
    time.sleep(0.05)
    ledger = Ledger.open_existing(out)                     # a point finishes after the table was written
    try:
        (failed,) = [p for p in ledger.points() if p.state == "failed"]
        ledger.mark_running(failed.point_id, "srv-s8")
        ledger.mark_done(failed.point_id, "points/s16/b128-1/run=0.json")
        points = ledger.points()                           # what the freshness is judged by, in one query
        assert ledger.finished() == (sum(p.state == "done" for p in points), max(p.ended_at or 0.0 for p in points))
    finally:
        ledger.close()
    assert kept_results(CampaignDir(out)) is None

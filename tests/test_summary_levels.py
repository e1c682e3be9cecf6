"""The kept summary read at other settings (`raysweep.results.table.kept_summary_at`, `aggregate.at_level`):
`results --aggregate --confidence C` (or `--noise-threshold T`) makes its intervals and noise columns again
from the statistics summary.parquet keeps, instead of the whole summary, and gives the numbers the summary
made afresh at those settings gives, bit for bit. No Ray: stub campaigns (benchmarks/bench_read_commands.py)
through the real plan and ledger, one with raw samples, several server starts, flagged and noisy runs, one
with bench.precision."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner
from test_cli_json import bench_module
from test_one_story import precision_campaign

from raysweep.cli import main
from raysweep.record.directory import CampaignDir
from raysweep.record.files import write_json_atomic
from raysweep.results import aggregate, table
from raysweep.results.table import kept_summary, kept_summary_at, write_results


def mixed_campaign(tmp_path: Path) -> Path:
    """The demo's shape (2 configs x 9 bench points x 2 runs, raw samples kept) with its runs made unlike:
    each run on a server start of its own in one config, two runs noisy, two flagged."""
    out = tmp_path / "mixed"
    bench_module().build_stub(out, 36, name="mixed")
    paths = sorted((out / "points").rglob("run=*.json"))
    first = min(p.parent.parent.name for p in paths)
    for i, path in enumerate(paths):
        rec = json.loads(path.read_text())
        if rec["serve_id"] == first:
            rec["server_id"] = f"{rec['serve_id']}-{rec['run_number']}"  # two starts per point
        if i % 7 == 3:   # a run far from its partner: a noisy point
            rec.update(output_throughput=rec["output_throughput"] * 1.4, median_ttft_ms=rec["median_ttft_ms"] * 0.6)
        if i % 11 == 5:
            rec.update(validity_ok=False, validity_issues="shared CPUs (2 of 2 cores)")
        write_json_atomic(path, rec)
    write_results(CampaignDir(out))
    return out


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return mixed_campaign(tmp_path_factory.mktemp("levels"))


def afresh(out: Path, confidence: float, threshold: float = aggregate.DEFAULT_THRESHOLD) -> pd.DataFrame:
    """The summary made from the runs at these settings, less what only the raw samples give at them."""
    full = aggregate.summary_table(CampaignDir(out), confidence, threshold)
    return full.drop(columns=[c for c in full.columns if c.endswith(("_pooled_ci_low", "_pooled_ci_high"))])


@pytest.mark.parametrize("which", ["mixed", "precision"])
def test_the_kept_summary_at_other_settings_is_the_summary_made_afresh(tmp_path, mixed, which):
    out = mixed if which == "mixed" else precision_campaign(tmp_path)
    kept = kept_summary(CampaignDir(out))
    assert kept is not None and kept.attrs["confidence"] == 0.95
    if which == "mixed":   # what this campaign is for: intervals over starts and over runs, noisy points
        assert {1, 2} <= set(kept["server_starts"]) and kept["noisy"].any() and not kept["noisy"].all()
        assert "output_throughput_pooled_ci_low" not in kept and "median_ttft_ms_pooled_ci_low" in kept
    else:
        assert kept["precision_state"].notna().any()
    for confidence, threshold in ((0.9, None), (0.8, 0.02), (0.95, 0.2)):
        fast = kept_summary_at(CampaignDir(out), confidence, threshold)
        assert fast is not None and fast.attrs["confidence"] == confidence
        full = afresh(out, confidence, threshold or aggregate.DEFAULT_THRESHOLD)
        assert list(fast.columns) == list(full.columns)
        pd.testing.assert_frame_equal(fast, full, check_exact=True, check_dtype=False)
        moved = [c for c in full.columns if c.endswith("_ci_low") and not full[c].equals(kept[c])]
        assert moved or confidence == 0.95   # the intervals did change with the level
    own = kept_summary_at(CampaignDir(out), 0.95, 0.05)   # at its own settings: the kept summary as it is
    assert own is not None
    pd.testing.assert_frame_equal(own, kept, check_exact=True)


def test_results_aggregate_prints_the_same_from_the_kept_summary_as_made_afresh(mixed, monkeypatch):
    out = mixed
    runs = [["results", str(out), "--aggregate", "--confidence", "0.9"],
            ["results", str(out), "--aggregate", "--confidence", "0.8", "--noise-threshold", "0.02", "--json"],
            ["results", str(out), "--aggregate", "--confidence", "0.99", "--metrics",
             "p99_ttft_ms,median_itl_ms,mean_tpot_ms", "--json"]]
    kept = [CliRunner().invoke(main, args, catch_exceptions=False) for args in runs]
    monkeypatch.setattr(table, "kept_summary_at", lambda *a, **kw: None)   # every summary made from the runs
    made = [CliRunner().invoke(main, args, catch_exceptions=False) for args in runs]
    for a, b in zip(kept, made, strict=True):
        assert a.exit_code == b.exit_code == 0
        assert a.stdout == b.stdout and a.stderr == b.stderr
    assert "[90% CI]" in kept[0].stdout and json.loads(kept[1].stdout)["confidence"] == 0.8


def test_a_level_out_of_range_is_refused_as_before(mixed):
    res = CliRunner().invoke(main, ["results", str(mixed), "--aggregate", "--confidence", "1.5"])
    assert res.exit_code == 2 and "--confidence 1.5" in res.stderr and "between 0 and 1" in res.stderr


def test_status_says_the_kept_answer_as_it_says_the_answer_made_again(mixed, tmp_path, monkeypatch):
    """`status` of a finished campaign reads the answer `run` kept (answer.json) while it is fresh: the same text
    and JSON as the answer made again from the runs, which it no longer makes."""
    import shutil

    from raysweep.cli import status as status_cli
    from raysweep.report.page import conclusions_of
    from raysweep.results.answer_file import ANSWER_FILE, keep_answer

    out = tmp_path / "copy"
    shutil.copytree(mixed, out)
    (out / ANSWER_FILE).unlink(missing_ok=True)
    made = [CliRunner().invoke(main, ["status", str(out), *json_flag], catch_exceptions=False)
            for json_flag in ([], ["--json"])]
    assert "answer:" in made[0].stdout and json.loads(made[1].stdout)["answer"]["shapes"]
    c = conclusions_of(CampaignDir(out))
    assert c is not None
    keep_answer(CampaignDir(out), c.answer)   # as `run` keeps it at its end

    def not_again(output_dir: str) -> None:
        raise AssertionError("the answer was made again")

    monkeypatch.setattr(status_cli, "_answer_of", not_again)
    kept = [CliRunner().invoke(main, ["status", str(out), *json_flag], catch_exceptions=False)
            for json_flag in ([], ["--json"])]
    assert [r.stdout for r in kept] == [r.stdout for r in made]


def test_run_keeps_the_answer_without_a_report_once(tmp_path):
    """`run` ending without a report keeps the campaign's answer (answer.json) for `status`, `compare` and the
    catalogue, made once: a finished campaign run again leaves a fresh one as it is."""
    from raysweep.report.page import conclusions_of
    from raysweep.results.answer_file import ANSWER_FILE, kept_answer

    out = tmp_path / "stub"
    cfile = bench_module().build_stub(out, 36, name="stub")
    assert not (out / ANSWER_FILE).exists()
    res = CliRunner().invoke(main, ["run", str(cfile)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    kept, c = kept_answer(CampaignDir(out)), conclusions_of(CampaignDir(out))
    assert kept is not None and c is not None
    assert kept["lines"] == c.answer.lines() and kept["answer"] == c.answer.to_dict()
    written = (out / ANSWER_FILE).stat().st_mtime_ns
    assert CliRunner().invoke(main, ["run", str(cfile)], catch_exceptions=False).exit_code == 0
    assert (out / ANSWER_FILE).stat().st_mtime_ns == written


def test_a_summary_without_the_models_statistics_is_made_afresh(mixed):
    """A kept summary whose intervals cannot be made again from it (written before `M_se` and `M_df`) is not
    read at another level: `at_level` says so and the summary is made from the runs."""
    kept = kept_summary(CampaignDir(mixed))
    assert kept is not None and aggregate.at_level(kept, 0.9) is not None
    assert aggregate.at_level(kept.drop(columns=["output_throughput_se"]), 0.9) is None
    assert aggregate.at_level(kept.drop(columns=["median_ttft_ms_df"]), 0.9) is None
    plain = kept.copy()
    plain.attrs = {}
    assert aggregate.at_level(plain, 0.9) is None   # its settings unknown

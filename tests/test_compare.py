"""Unit tests for raysweep.results.compare and `raysweep compare`: campaigns built here (output dirs through the
ledger API, or summary/results files), compared point by point. No Ray, no vLLM."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner
from test_aggregate import build_dir, run_row

from raysweep.cli import main
from raysweep.errors import UserError
from raysweep.record.directory import CampaignDir
from raysweep.report import comparison
from raysweep.results import aggregate, compare

CONCS = (1, 2, 4)


def rows(name: str, thr: float, ttft: float, configs: tuple[str, ...] = ("s8",), jitter: float = 0.01,
         noisy_at: int | None = None) -> list[dict]:
    """Three runs per point, each on a server start of its own (3 starts of 1 run: the replicate is the
    start): throughput thr * conc and TTFT ttft * conc, each within +-jitter; at `noisy_at` the runs spread
    by 50 %."""
    out = []
    for sid in configs:
        for c in CONCS:
            for r in range(3):
                spread = 0.5 if c == noisy_at else jitter
                f = 1.0 + spread * (0, -1, 1)[r]   # not a straight line over the runs: no drift
                out.append(run_row(sid, c, r, thr * c * f, ttft * c * f, campaign=name,
                                   server_id=f"{name}-{sid}-start{r}"))
    return out


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    a = build_dir(tmp_path / "a", rows("base", 100.0, 10.0), name="base")
    b = build_dir(tmp_path / "b", rows("new", 120.0, 12.0, noisy_at=4), name="new")
    return a, b


def test_points_matched_by_parameters_with_ratio_and_verdict(dirs):
    a, b = (compare.load_side(d) for d in dirs)
    assert (a.name, b.name) == ("base", "new")
    cmp = compare.compare(a, b)
    assert cmp.on == ["max_num_seqs", "max_concurrency"]
    t = cmp.table.set_index("max_concurrency")
    assert t.loc[1, "output_throughput_ratio"] == pytest.approx(1.2)
    assert t.loc[1, "output_throughput_a"] == pytest.approx(100.0)
    assert t.loc[1, "output_throughput_verdict"] == "better"     # more throughput, Welch's p << 0.05
    assert t.loc[1, "output_throughput_p"] < 0.01
    assert t.loc[2, "median_ttft_ms_verdict"] == "worse"         # a higher latency
    assert t.loc[4, "output_throughput_verdict"] == "not shown"  # 50 % spread over 3 runs: cannot tell
    tot = compare.totals(cmp).set_index("metric")
    assert tot.loc["output_throughput", "better"] == 2 and tot.loc["output_throughput", "not_shown"] == 1
    assert tot.loc["output_throughput", "ratio_geomean"] == pytest.approx(1.2)


def test_a_single_run_is_not_compared_and_says_why(tmp_path):
    one = [r for r in rows("one", 100.0, 10.0) if r["run_number"] == 0]
    a = compare.load_side(build_dir(tmp_path / "a", one, name="one"))
    b = compare.load_side(build_dir(tmp_path / "b", rows("new", 200.0, 10.0), name="new"))
    t = compare.compare(a, b).table
    assert set(t["output_throughput_verdict"]) == {"not compared"}
    assert set(t["output_throughput_why"]) == {"one server start on a side (1 and 3 starts)"}
    assert t["output_throughput_p"].isna().all()   # a stated reason, never a p-value


def test_several_configs_against_one_baseline_point_and_unmatched_points(tmp_path):
    base = [r for r in rows("base", 100.0, 10.0) if r["max_concurrency"] != 4]
    a = pd.DataFrame.from_records(base)
    a_file = tmp_path / "base_results.parquet"
    a.drop(columns=["max_num_seqs"]).to_parquet(a_file)            # the baseline swept no server parameter
    b = compare.load_side(build_dir(tmp_path / "b", rows("new", 120.0, 12.0, configs=("s8", "s16")), name="new"))
    side_a = compare.load_side(a_file)
    assert side_a.name == "base"
    cmp = compare.compare(side_a, b)
    assert cmp.on == ["max_concurrency"]
    assert len(cmp.table) == 4 and cmp.unmatched_other == 2 and cmp.unmatched_baseline == 0
    assert sorted(cmp.table["serve_label_b"]) == ["max_num_seqs=16"] * 2 + ["max_num_seqs=8"] * 2


def test_an_ambiguous_baseline_or_nothing_in_common_is_refused(tmp_path):
    a = compare.load_side(build_dir(tmp_path / "a", rows("a", 100.0, 10.0, configs=("s8", "s16")), name="a"))
    b = compare.load_side(build_dir(tmp_path / "b", rows("b", 100.0, 10.0), name="b"))
    with pytest.raises(UserError, match="several points with max_concurrency=1.*add max_num_seqs to --match-on"):
        compare.compare(a, b, on=["max_concurrency"])
    b.params = ["other"]
    with pytest.raises(UserError, match="no parameter in common.*--match-on"):
        compare.compare(a, b)
    with pytest.raises(UserError, match="--match-on nope"):
        compare.compare(a, b, on=["nope"])
    with pytest.raises(UserError, match="--metrics nope.*accepted: .*output_throughput"):
        compare.compare(a, b, on=["max_num_seqs", "max_concurrency"], metrics=["nope"])


def test_a_summary_file_is_a_baseline(dirs, tmp_path):
    a, b = dirs
    aggregate.write_summary(a)
    side = compare.load_side(a / "summary.csv")    # csv keeps no parameter list: read from its columns
    assert side.params == ["max_num_seqs", "max_concurrency"] and side.name == "base"
    cmp = compare.compare(side, compare.load_side(b))
    assert len(cmp.table) == 3 and cmp.on == ["max_num_seqs", "max_concurrency"]


def test_figure_has_both_campaigns_baseline_dashed(dirs):
    a, b = (compare.load_side(d) for d in dirs)
    fig = comparison.comparison_figure([compare.compare(a, b)])
    axes = fig.get_axes()
    assert [ax.get_title() for ax in axes] == ["output_throughput", "median_ttft_ms"]
    lines = [ln for ln in axes[0].get_lines() if ln.get_label() in ("base · max_num_seqs=8", "new · max_num_seqs=8")]
    assert sorted(ln.get_linestyle() for ln in lines) == ["-", "--"]
    dashed = next(ln for ln in lines if ln.get_linestyle() == "--")
    assert list(dashed.get_xdata()) == [1, 2, 4] and list(dashed.get_ydata()) == pytest.approx([100, 200, 400])
    assert axes[0].get_xlabel() == "max_concurrency"


def test_cli_writes_the_comparison_and_the_report_shows_it(dirs, tmp_path):
    a, b = dirs
    res = CliRunner().invoke(main, ["compare", str(a), str(b), "--out", str(b / "compare"), "--record"])
    assert res.exit_code == 0, res.output
    assert "new against base: 3 point(s) matched" in res.output
    written = pd.read_csv(b / "compare" / "comparison.csv")
    assert list(written["campaign_a"].unique()) == ["base"] and len(written) == 3
    assert (b / "compare" / "COMPARE.png").read_bytes().startswith(b"\x89PNG")
    assert json.loads((b / "compare" / "baseline.json").read_text())["baseline"] == str(a.resolve())
    html = comparison.report_section(CampaignDir(b))
    assert html is not None and "data:image/png;base64," in html and "base" in html and "better" in html
    assert comparison.report_section(CampaignDir(a)) is None    # the baseline itself has no baseline
    # with --baseline and --no-record, into --out
    out = tmp_path / "cmp"
    res = CliRunner().invoke(main, ["compare", str(b), "--baseline", str(a), "--out", str(out), "--no-record",
                                    "--metrics", "output_throughput"])
    assert res.exit_code == 0, res.output
    assert list(pd.read_csv(out / "comparison_totals.csv")["metric"]) == ["output_throughput"]


def test_cli_refuses_one_side(dirs):
    res = CliRunner().invoke(main, ["compare", str(dirs[0])])
    assert res.exit_code == 2 and "at least two campaigns" in res.output


def test_the_report_of_a_compared_dir_has_the_comparison(dirs):
    from raysweep.report.page import build_report

    a, b = dirs
    compare.record_baseline(CampaignDir(b), a)
    page = build_report(CampaignDir(b))
    assert '<section id="comparison">' in page and "Against the baseline <b>base</b>" in page
    assert page.index('id="comparison"') < page.index('id="figures"')


def test_with_an_slo_only_points_meeting_it_on_both_sides_are_judged(dirs):
    a, b = (compare.load_side(d) for d in dirs)
    # median TTFT: 10 ms x concurrency on the baseline, 12 ms x concurrency on the other side
    slo = compare.parse_slo_option("median_ttft_ms=30")
    t = compare.compare(a, b, slo=slo).table.set_index("max_concurrency")
    assert list(t["slo"]) == ["both meet", "both meet", "neither meets"]
    assert t.loc[1, "output_throughput_verdict"] == "better" and t.loc[4, "output_throughput_verdict"] == "outside slo"
    none = compare.compare(a, b, slo=compare.parse_slo_option("median_ttft_ms=5"))
    assert any("no matched point meets the slo" in n for n in none.notes)
    with pytest.raises(UserError, match="--slo.p99_ttf_ms.*did you mean p99_ttft_ms"):
        compare.parse_slo_option("p99_ttf_ms=5")


def test_flagged_runs_are_left_out_of_the_comparison(tmp_path):
    base = rows("base", 100.0, 10.0)
    new = rows("new", 100.0, 10.0)
    for r in new:
        if r["run_number"] == 2:   # one run per point measured on a niced server, far off
            r.update(output_throughput=r["output_throughput"] * 3, validity_ok=False,
                     validity_issues="niced (server 5)")
    a = compare.load_side(build_dir(tmp_path / "a", base, name="base"))
    b = compare.load_side(build_dir(tmp_path / "b", new, name="new"))
    t = compare.compare(a, b).table
    assert set(t["runs_b"]) == {2} and set(t["output_throughput_verdict"]) == {"not shown"}


def test_cli_compare_with_an_slo(dirs):
    a, b = dirs
    res = CliRunner().invoke(main, ["compare", str(a), str(b), "--slo", "median_ttft_ms=30"])
    assert res.exit_code == 0, res.output
    assert "judged only where both meet the slo median_ttft_ms<=30" in res.output and "outside slo" in res.output
    bad = CliRunner().invoke(main, ["compare", str(a), str(b), "--slo", "p101_ttft_ms=30"])
    assert bad.exit_code == 2 and "--slo.p101_ttft_ms" in bad.output and "outside 0 to 100" in bad.output


def test_campaigns_of_one_server_start_each_are_measured_but_not_compared(tmp_path):
    def one_start(name: str, thr: float) -> list[dict]:
        return [{**r, "server_id": f"{name}-{r['serve_id']}"} for r in rows(name, thr, 10.0)]

    a = compare.load_side(build_dir(tmp_path / "a", one_start("base", 100.0), name="base"))
    b = compare.load_side(build_dir(tmp_path / "b", one_start("new", 120.0), name="new"))
    cmp = compare.compare(a, b)
    # +20 % with a 1 % spread over 3 runs: runs of one start each cannot carry what a start adds
    assert set(cmp.table["output_throughput_verdict"]) == {"not compared"}
    assert set(cmp.table["output_throughput_why"]) == {"one server start each"}
    assert cmp.table["output_throughput_ratio"].tolist() == pytest.approx([1.2] * 3)   # still measured
    assert any("3 of 3 matched point(s) not compared: one server start on a side" in n for n in cmp.notes)
    assert compare.totals(cmp).set_index("metric").loc["output_throughput", "not_compared"] == 3


def test_verdicts_are_over_server_starts_with_the_lead_s_interval(dirs):
    a, b = (compare.load_side(d) for d in dirs)
    cmp = compare.compare(a, b)
    assert set(cmp.table["output_throughput_test"]) == {"t over server starts"}
    assert "t over server starts" in compare.family_text(cmp)
    row = cmp.table.set_index("max_concurrency").loc[1]
    assert row["output_throughput_ratio_low"] < 1.2 < row["output_throughput_ratio_high"]
    assert row["output_throughput_ratio_low"] > 1.0    # better: the interval of the lead excludes no lead


def test_two_sides_without_any_spread_are_not_judged_not_given_a_tiny_p_value(tmp_path):
    flat_a = [{**r, "output_throughput": 1000.0} for r in rows("a", 100.0, 10.0)]
    flat_b = [{**r, "output_throughput": 1000.001} for r in rows("b", 100.0, 10.0)]
    a = compare.load_side(build_dir(tmp_path / "a", flat_a, name="a"))
    b = compare.load_side(build_dir(tmp_path / "b", flat_b, name="b"))
    t = compare.compare(a, b).table
    assert set(t["output_throughput_verdict"]) == {"not judged"} and t["output_throughput_p"].isna().all()
    assert all("no spread at all between server starts" in w for w in t["output_throughput_why"])


def test_the_slo_bound_is_judged_on_the_interval_not_the_mean(tmp_path):
    # a median TTFT of 29 ms on average against a bound of 30, with runs from 20 to 38 ms: not shown to meet it
    wide = [{**r, "median_ttft_ms": 29.0 * (1.0 + 0.3 * (0, -1, 1)[r["run_number"]])} for r in rows("a", 100.0, 10.0)]
    a = compare.load_side(build_dir(tmp_path / "a", wide, name="a"))
    b = compare.load_side(build_dir(tmp_path / "b", rows("b", 100.0, 5.0), name="b"))   # 5 to 20 ms: meets
    t = compare.compare(a, b, slo=compare.parse_slo_option("median_ttft_ms=30")).table
    assert set(t["slo"]) == {"only this one meets"}


def _with_confirmation(name: str, thr: float) -> list[dict]:
    """Two configs at three loads, 3 runs each; then the leader (s16 at concurrency 4) and the runner-up (s8 at
    4) measured again as the confirmation does: points of their own (`confirms_bench_id`), 4 runs on 2 starts."""
    out = rows(name, thr, 10.0, configs=("s8", "s16"))
    for sid in ("s8", "s16"):
        for r in range(4):
            f = 1.0 + 0.01 * (0, -1, 1, 0.5)[r]
            out.append(run_row(sid, 4, r, thr * 4 * f * (1.1 if sid == "s16" else 1.0), 40.0 * f, campaign=name,
                               bench_id="b4-confirm", point_id=f"{sid}-c4-{r}", phase="confirm",
                               confirms_bench_id="b4", server_id=f"{sid}-{r % 2}"))
    return out


def test_campaigns_with_a_confirmation_compare_and_say_what_did_not_match(tmp_path):
    """`confirm:` adds points with the parameters of the points they confirm: compare matches them as the answer
    does (the confirmation's runs are the point's, measured again), instead of refusing the baseline."""
    a = build_dir(tmp_path / "a", _with_confirmation("base", 100.0), name="base")
    b = build_dir(tmp_path / "b", [r for r in _with_confirmation("new", 120.0) if r["max_concurrency"] != 1],
                  name="new")
    result = CliRunner().invoke(main, ["compare", str(a), str(b)])
    assert result.exit_code == 0, result.output
    cmp = compare.compare(compare.load_side(a), compare.load_side(b))
    t = cmp.table.set_index(["max_num_seqs", "max_concurrency"])
    assert len(t) == 4 and t.index.is_unique  # 2 configs x the 2 loads both have
    assert t.loc[(16, 4), "runs_a"] == 7 and t.loc[(8, 2), "runs_a"] == 3  # 3 of the sweep + 4 fresh
    assert t.loc[(8, 2), "output_throughput_ratio"] == pytest.approx(1.2, rel=0.02)
    text = " ".join(cmp.notes)
    assert "confirmation" in text
    assert "max_num_seqs=8, max_concurrency=1" in text and "2 point(s) of base not in new" in text
    doc = json.loads(CliRunner().invoke(main, ["compare", str(a), str(b), "--json"]).output)
    assert any("not in new" in n for n in doc["notes"]) and len(doc["comparisons"][0]["points"]) == 4


def test_compare_says_how_many_runs_each_side_left_out_and_why(tmp_path):
    flagged = [{**r, "validity_ok": False, "validity_issues": "shared CPUs (server and clients on CPU(s) 0-1)"}
               if r["run_number"] == 0 else r for r in rows("a", 100.0, 10.0, configs=("s8",))]
    a = compare.load_side(build_dir(tmp_path / "a", flagged, name="a"))
    b = compare.load_side(build_dir(tmp_path / "b", rows("b", 100.0, 10.0), name="b"))
    notes = compare.compare(a, b).notes
    said = [n for n in notes if n.startswith("left out of")]
    assert said == ["left out of a: 3 of 9 run(s) (shared CPUs 3)"], notes


def test_a_campaign_of_a_catalogue_is_a_side_matched_as_its_dir_is(tmp_path):
    """`compare --catalog CATALOG` takes a campaign's name or id as either side: read from the output dir it was
    added from, its confirmation points matched as the answer matches them, the same comparison as the dirs'."""
    a = build_dir(tmp_path / "a", _with_confirmation("base", 100.0), name="base")
    b = build_dir(tmp_path / "b", [r for r in _with_confirmation("new", 120.0) if r["max_concurrency"] != 1],
                  name="new")
    cat = tmp_path / "cat"
    assert CliRunner().invoke(main, ["catalog", "add", str(cat), str(a), str(b)]).exit_code == 0
    by_dir = json.loads(CliRunner().invoke(main, ["compare", str(a), str(b), "--json"]).output)
    ids = {c["name"]: c["id"] for c in json.loads(
        CliRunner().invoke(main, ["catalog", "list", str(cat), "--json"]).output)["campaigns"]}
    for args in (["base", "new"], [str(a), "new"], [ids["base"], str(b)], ["new", "--baseline", "base"]):
        res = CliRunner().invoke(main, ["compare", "--catalog", str(cat), *args, "--json"])
        assert res.exit_code == 0, (args, res.output)
        doc = json.loads(res.output)
        assert doc["comparisons"][0]["points"] == by_dir["comparisons"][0]["points"], args
        assert doc["answers"] == by_dir["answers"]
        named = [n for n in doc["notes"] if "of the catalogue" in n]
        assert len(named) == sum(1 for x in args if x in ("base", "new", ids["base"])), (args, doc["notes"])
    text = CliRunner().invoke(main, ["compare", "--catalog", str(cat), "base", "new"]).output
    assert "the campaign new of the catalogue" in " ".join(text.split())
    assert "max_concurrency=1 never measured there" in " ".join(text.split())


def test_a_side_neither_a_path_nor_a_catalogue_campaign_is_refused_naming_what_is_accepted(tmp_path):
    a = build_dir(tmp_path / "a", rows("base", 100.0, 10.0), name="base")
    res = CliRunner().invoke(main, ["compare", str(a), "nope"])
    said = " ".join(res.output.split())
    assert res.exit_code == 2 and "DIR nope: no such file or directory" in said and "--catalog CATALOG" in said
    cat = tmp_path / "cat"
    assert CliRunner().invoke(main, ["catalog", "add", str(cat), str(a)]).exit_code == 0
    res = CliRunner().invoke(main, ["compare", "--catalog", str(cat), "base", "nope"])
    said = " ".join(res.output.split())
    assert res.exit_code == 2 and "DIR nope: neither a file or directory here nor a campaign of the catalogue" in said
    assert "its campaigns: base" in said and "accepted: a raysweep output dir" in said
    res = CliRunner().invoke(main, ["compare", "--baseline", "nope", str(a)])
    assert res.exit_code == 2 and "--baseline nope" in res.output
    a.rename(tmp_path / "moved")  # the catalogue's campaign is no longer where it was added from
    res = CliRunner().invoke(main, ["compare", "--catalog", str(cat), "base", str(tmp_path / "moved")])
    said = " ".join(res.output.split())
    assert res.exit_code == 2 and "which is not on this machine" in said and "catalog compare" in said


def test_unmatched_points_say_which_value_the_other_side_never_measured(tmp_path):
    a = compare.load_side(build_dir(tmp_path / "a", rows("base", 100.0, 10.0, configs=("s8", "s16")), name="base"))
    b = compare.load_side(build_dir(tmp_path / "b", [r for r in rows("new", 100.0, 10.0, configs=("s8", "s16"))
                                                     if (r["max_num_seqs"], r["max_concurrency"]) != (16, 2)
                                                     and r["max_concurrency"] != 1], name="new"))
    text = " ".join(compare.compare(a, b).notes)
    assert "max_num_seqs=8, max_concurrency=1 (max_concurrency=1 never measured there)" in text
    assert "max_num_seqs=16, max_concurrency=2 (each of its values measured there, not together)" in text

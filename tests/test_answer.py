"""The campaign's answer (`raysweep.results.answer`): computed once from the conclusions, on the one model of a
measurement, and rendered the same by the terminal, `report --json`, the Python API and the report's card."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner
from test_conclusions_verdicts import SHAPE, runs
from test_plots import build_output_dir

from raysweep.cli import main
from raysweep.results import conclusions


def _answer(df, **kw):
    return conclusions.conclude(df, SHAPE[:1], objective="output_throughput", **kw).answer


def test_a_lead_shown_over_server_starts_says_deploy_with_the_lead_s_interval_and_level():
    a = _answer(runs({"A": [(8, 1200.0, 100.0, 500.0)], "B": [(8, 1000.0, 100.0, 500.0)]}, n=4, per_start=2))
    (s,) = a.shapes
    assert s.leader == "cfg=A" and s.verdict == "better" and s.clear
    assert s.ci_low < s.value < s.ci_high and s.level == 0.95 and (s.starts, s.runs) == (2, 4)
    (rival,) = s.rivals
    assert rival.config == "cfg=B" and rival.verdict == "better"
    assert rival.lead == pytest.approx(0.2, abs=0.02) and 0 < rival.lead_low < rival.lead < rival.lead_high
    assert s.headline.startswith("Best for random_input_len=128: deploy cfg=A: output_throughput ")
    assert "20 % more than cfg=B [+" in s.headline and "p=" not in s.headline
    assert any("Holm" in d for d in s.details)   # the test, one --verbose away
    doc = a.to_dict()
    json.dumps(doc)   # plain JSON
    assert doc["shapes"][0]["leader"] == s.leader and doc["shapes"][0]["value"] == pytest.approx(s.value)


def test_one_server_start_each_is_measured_and_ranked_but_never_green():
    a = _answer(runs({"A": [(8, 1200.0, 100.0, 500.0)], "B": [(8, 1000.0, 100.0, 500.0)]}, n=4, per_start=4))
    (s,) = a.shapes
    assert s.leader == "cfg=A" and not s.clear
    assert (s.verdict, s.why) == ("not compared", "one server start each")
    assert s.rivals[0].lead == pytest.approx(0.2, abs=0.02) and s.rivals[0].lead_low is None
    assert "(best measured)" in s.headline and s.headline.endswith("not compared: one server start each")


def test_a_configuration_whose_runs_are_all_flagged_is_never_the_leader_and_the_answer_says_so():
    df = runs({"A": [(8, 2000.0, 100.0, 500.0)], "B": [(8, 1000.0, 100.0, 500.0)]}, n=4)
    df.loc[df["serve_id"] == "A", ["validity_ok", "validity_issues"]] = [False, "shared CPUs"]
    (s,) = _answer(df).shapes
    assert s.leader == "cfg=B" and "never the leader" in "; ".join(s.left_out)
    df["validity_ok"] = False
    (every,) = _answer(df).shapes
    assert every.leader is None and every.verdict == "no leader" and "no configuration to deploy" in every.headline
    assert math.isfinite(every.value)   # still measured


def test_a_flagged_configuration_behind_the_runner_up_is_still_said_to_be_left_out():
    """The fastest configuration, every run flagged, is ranked last: the answer names it and why it is not the
    leader, as it does when it is the runner-up, never drops it in silence."""
    df = runs({"A": [(8, 2000.0, 100.0, 500.0)], "B": [(8, 1200.0, 100.0, 500.0)], "C": [(8, 1000.0, 100.0, 500.0)]},
              n=4)
    df.loc[df["serve_id"] == "A", ["validity_ok", "validity_issues"]] = [False, "shared CPUs"]
    (s,) = _answer(df).shapes
    assert s.leader == "cfg=B" and s.runner_up == "cfg=C"
    assert any(x.startswith("cfg=A: every one of its 4 run(s) failed a check") and x.endswith("never the leader")
               for x in s.left_out), s.left_out
    assert "cfg=A: every one of its 4 run(s)" in s.headline


def test_a_warm_up_cut_from_the_leader_is_said_with_what_was_left_out():
    df = runs({"A": [(8, 1200.0, 100.0, 500.0)], "B": [(8, 1000.0, 100.0, 500.0)]}, n=8, per_start=2)
    first = (df["serve_id"] == "A") & (df["run_number"] % 2 == 0)
    df.loc[first, "output_throughput"] *= 0.85      # A's first run on each of its 4 starts is slow
    (s,) = _answer(df).shapes
    assert s.leader == "cfg=A" and s.value == pytest.approx(df.loc[(df["serve_id"] == "A") & ~first,
                                                                   "output_throughput"].mean(), rel=1e-9)
    said = [x for x in s.left_out if "warm-up left out" in x]
    assert len(said) == 1 and said[0].startswith("cfg=A: ") and "first run after each of 4 server start(s)" in said[0]


def test_an_outlier_left_out_of_one_metric_is_said_by_the_answer():
    df = runs({"A": [(8, 1200.0, 100.0, 500.0)], "B": [(8, 1000.0, 100.0, 500.0)]}, n=8, per_start=8)  # one start
    df.loc[(df["serve_id"] == "A") & (df["run_number"] == 5), "p99_ttft_ms"] *= 4
    (s,) = _answer(df).shapes
    assert "cfg=A: an outlier run left out of p99_ttft_ms only (Grubbs' test)" in s.left_out


def test_every_face_states_the_same_answer(tmp_path, monkeypatch):
    from raysweep import api
    from raysweep.report import page as report

    monkeypatch.setattr(report, "_figure_list", lambda data: [])
    out = build_output_dir(tmp_path / "out")
    res = CliRunner().invoke(main, ["report", str(out), "--objective", "output_throughput", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    shapes = doc["answer"]["shapes"]
    assert [s["headline"] for s in shapes] == doc["conclusions"][:len(shapes)]   # the terminal's lines are its words
    c = api.Campaign(out).conclude("output_throughput")
    assert c is not None and c.answer.to_dict() == doc["answer"]
    card = (out / "report.html").read_text()
    for s in shapes:
        assert s["leader"] in card and conclusions.fmt(s["value"]) in card and f"{s['verdict']}: {s['why']}" in card


def test_status_of_a_complete_campaign_gives_its_answer(tmp_path):
    out = build_output_dir(tmp_path / "out")
    res = CliRunner().invoke(main, ["status", str(out), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    report = json.loads(CliRunner().invoke(main, ["report", str(out), "--json"]).output)
    assert doc["answer"] is not None and doc["answer"] == report["answer"]
    text = CliRunner().invoke(main, ["status", str(out)]).output
    assert "answer:" in text and report["answer"]["shapes"][0]["headline"][:60] in text.replace("\n", " ")


def test_the_tests_and_p_values_are_one_verbose_away(tmp_path, monkeypatch):
    from raysweep.report import page as report

    monkeypatch.setattr(report, "_figure_list", lambda data: [])
    out = build_output_dir(tmp_path / "out")
    plain = CliRunner().invoke(main, ["report", str(out), "--objective", "output_throughput"]).output
    verbose = CliRunner().invoke(main, ["-v", "report", str(out), "--objective", "output_throughput"]).output
    # the test behind each shape's verdict, on a line of its own under it, only with -v
    detail = "\n  random_input_len=128: not compared: one server start each"
    assert detail not in plain and detail in verbose
    assert [ln for ln in verbose.splitlines() if not ln.startswith("  ")] == plain.splitlines()


def test_failed_points_are_said_whatever_the_answer_names():
    """The campaign's failed points are in no ranking: every kind of answer says how many, in what it leaves out
    (a leader, no leader because every run failed a check, no point shown to meet the slo), and says nothing
    without any."""
    from raysweep.campaign.slo import parse_slo

    df = runs({"A": [(8, 1200.0, 100.0, 500.0)], "B": [(8, 1000.0, 100.0, 500.0)]}, n=4, per_start=2)
    said = "3 failed point(s) of the campaign (not in any ranking; `raysweep status` says why)"
    flagged = df.assign(validity_ok=False, validity_issues="shared CPUs")
    for kw, frame in (({}, df), ({}, flagged), ({"slo": parse_slo({"p99_ttft_ms": 10})}, df)):
        (s,) = _answer(frame, failed_points=3, **kw).shapes
        assert said in s.left_out and "; left out: " in s.headline and said in s.headline, s.headline
        assert s.leader is not None or s.verdict == "no leader"
        assert said not in _answer(frame, **kw).shapes[0].headline
    (s,) = _answer(flagged, failed_points=3).shapes
    assert s.leader is None and s.lead_words == "" and s.lead is None   # no leader: no lead stated either

"""The campaign's answer on the faces that read many campaigns: `run` keeps it beside the results
(`answer.json`), and `compare`, the catalogue (`catalog list`, `--json`) and its site render that answer, word for
word, never another; a kept answer a later point made stale is not shown. No Ray, no vLLM."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_aggregate import build_dir
from test_report_browser import _demo_like_rows

from raysweep.cli import main
from raysweep.record.directory import CampaignDir
from raysweep.report.page import conclusions_of
from raysweep.results.answer_file import ANSWER_FILE, kept_answer


def test_the_kept_answer_is_what_compare_the_catalogue_and_the_site_say(tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from raysweep.cli import logs
    from raysweep.cli.running import _headlines

    monkeypatch.setattr(logs, "verbosity", 0)  # as `run` without -v (an earlier command's -v is not this one's)

    out = build_dir(tmp_path / "demo-cpu", _demo_like_rows(), name="demo-cpu")
    printed = _headlines(CampaignDir(out))  # what `run` prints at its end, and keeps
    c = conclusions_of(CampaignDir(out))
    assert c is not None and printed == c.answer.lines() and printed[0].startswith("Best for all bench points: deploy")
    kept = kept_answer(CampaignDir(out))
    assert kept is not None and kept["lines"] == printed and kept["answer"] == c.answer.to_dict()
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    res = CliRunner().invoke(main, ["compare", str(out), str(copy)])
    assert res.exit_code == 0, res.output
    said = [ln.split("'s answer: ", 1)[1] for ln in res.output.splitlines() if "'s answer: " in ln]
    assert said == printed * 2, res.output
    doc = json.loads(CliRunner().invoke(main, ["compare", str(out), str(copy), "--json"]).output)
    assert list(doc["answers"].values()) == [c.answer.to_dict()] * 2
    cat = tmp_path / "cat"
    assert CliRunner().invoke(main, ["catalog", "add", str(cat), str(out)]).exit_code == 0
    listed = CliRunner().invoke(main, ["catalog", "list", str(cat)])
    assert f"demo-cpu's answer: {printed[0]}" in " ".join(listed.output.split()), listed.output
    entries = json.loads(CliRunner().invoke(main, ["catalog", "list", str(cat), "--json"]).output)["campaigns"]
    assert entries[0]["answer"] == printed
    assert CliRunner().invoke(main, ["site", str(cat), str(tmp_path / "site")]).exit_code == 0
    import html

    assert html.escape(printed[0]) in (tmp_path / "site" / "index.html").read_text()


def test_a_kept_answer_is_not_shown_once_a_point_finished_after_it(tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from raysweep.cli import logs
    from raysweep.cli.running import _headlines

    monkeypatch.setattr(logs, "verbosity", 0)  # as `run` without -v (an earlier command's -v is not this one's)
    from raysweep.ledger import Ledger

    out = build_dir(tmp_path / "demo-cpu", _demo_like_rows(), name="demo-cpu")
    _headlines(CampaignDir(out))
    assert kept_answer(CampaignDir(out)) is not None and (out / ANSWER_FILE).is_file()
    led = Ledger.open_existing(out)
    led.sync(name="demo-cpu", fingerprint="fp", meaning={}, campaign={"name": "demo-cpu"}, campaign_file="c.yaml",
             points=[("late", "s8", "b4", 9, {"max_num_seqs": 8}, {"max_concurrency": 4})])
    led.mark_running("late", "srv")
    led.mark_done("late", "points/s8/b4/run=0.json")
    led.close()
    assert kept_answer(CampaignDir(out)) is None


def test_history_states_each_campaign_s_answer_as_its_run_gave_it(tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`history` (text and --json) gives, for every campaign its series name, that campaign's kept answer: the
    same lines `run` printed, and the same object (leader, value, lead, verdict, counts), never a second wording."""
    import jsonschema

    from raysweep.cli import logs
    from raysweep.cli.jsonout import schema
    from raysweep.cli.running import _headlines

    monkeypatch.setattr(logs, "verbosity", 0)
    out = build_dir(tmp_path / "demo-cpu", _demo_like_rows(), name="demo-cpu")
    printed = _headlines(CampaignDir(out))
    c = conclusions_of(CampaignDir(out))
    assert c is not None
    cat = tmp_path / "cat"
    assert CliRunner().invoke(main, ["catalog", "add", str(cat), str(out)]).exit_code == 0
    res = CliRunner().invoke(main, ["history", str(cat)])
    assert res.exit_code == 0, res.output
    said = [ln.split("'s answer: ", 1)[1] for ln in res.output.splitlines() if ln.startswith("demo-cpu's answer: ")]
    assert said == printed, res.output
    res = CliRunner().invoke(main, ["history", str(cat), "--json"])
    doc = json.loads(res.stdout)
    jsonschema.validate(doc, schema("history"))
    (entry,) = doc["answers"]
    assert entry["campaign"] == "demo-cpu" and entry["lines"] == printed
    assert entry["answer"] == c.answer.to_dict()
    listed = json.loads(CliRunner().invoke(main, ["catalog", "list", str(cat), "--json"]).stdout)
    jsonschema.validate(listed, schema("catalog"))
    assert listed["campaigns"][0]["answer_object"] == c.answer.to_dict()


def test_history_says_where_a_campaign_kept_no_answer(tmp_path: Path) -> None:
    out = build_dir(tmp_path / "unkept", _demo_like_rows(), name="unkept")   # no run ended: nothing kept
    cat = tmp_path / "cat"
    assert CliRunner().invoke(main, ["catalog", "add", str(cat), str(out)]).exit_code == 0
    res = CliRunner().invoke(main, ["history", str(cat)])
    assert res.exit_code == 0, res.output
    assert "unkept: no answer kept (its run did not end, or a point finished after it)" in res.output
    assert "unkept's answer" not in res.output

"""One story across commands: `status` (text and --json), `resume --json` on a finished campaign, the report's
data, the Python API and the conclusions count the same runs done and failed, the same runs not judged on
every validity check (never as passed), and the same points reached or short of a bench.precision target.
No Ray, no vLLM: stub campaigns (benchmarks/bench_read_commands.py) made through the real plan and ledger, one
of them a precision campaign whose extra runs the real stopping rule added."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from test_cli_json import bench_module

import raysweep
from raysweep.cli import main
from raysweep.ledger import Ledger, PointState
from raysweep.record.directory import CampaignDir
from raysweep.record.files import write_json_atomic
from raysweep.report import page as report
from raysweep.results.data import answer_of, read_data
from raysweep.results.table import load_records, write_results
from raysweep.results.validity_story import validity_counts

PRECISION = {"metric": "output_throughput", "rel_half_width": 0.04, "min_runs": 2, "max_runs": 3}


def plain_campaign(tmp_path: Path, monkeypatch) -> Path:
    """The demo's shape (2 configs x 9 bench points x 2 runs) with `report: true`, one run failed for good,
    10 runs whose steady state was not recorded."""
    bench = bench_module()
    made = bench.campaign_data
    monkeypatch.setattr(bench, "campaign_data", lambda *a, **kw: {**made(*a, **kw), "report": True})
    out = tmp_path / "plain"
    bench.build_stub(out, 36, name="plain")
    led = Ledger.open_existing(out)
    try:
        first = led.points()[0]
        with led._tx() as c:
            c.execute("UPDATE points SET state = 'failed', result_path = NULL, error = ? WHERE point_id = ?",
                      ("server died during the point", first.point_id))
    finally:
        led.close()
    for i, path in enumerate(sorted((out / "points").rglob("run=*.json"))):
        rec = json.loads(path.read_text())
        rec.update(steady_state=i >= 10, server_nice=0, client_nice=0)
        write_json_atomic(path, rec)
    write_results(CampaignDir(out))
    return out


def precision_campaign(tmp_path: Path) -> Path:
    """2 configs x 3 bench points, bench.precision from 2 to 3 runs: every point's first runs done, then
    the real stopping rule (raysweep.drive.sequential) adds runs until each point is decided."""
    from raysweep.campaign import load_campaign
    from raysweep.drive import sequential
    from raysweep.drive.driver import open_campaign
    from raysweep.drive.state import RunState

    bench = bench_module()
    out = tmp_path / "prec"
    data = bench.campaign_data("prec", out, 3, 1)
    data.pop("runs")
    data["bench"]["precision"] = PRECISION
    data["report"] = True
    cfile = tmp_path / "prec.yaml"
    cfile.write_text(yaml.safe_dump(data))
    spec = load_campaign(cfile)
    out.mkdir()
    plan, ledger = open_campaign(spec, CampaignDir(out))
    rng = random.Random(7)

    def finish(p) -> None:
        assert ledger.claim(p.id, "s", 3) is not None
        rel = f"points/{p.serve.id}/{p.bench.id}/run={p.run}.json"
        write_json_atomic(out / rel, {**bench.stub_record(p, rng), "steady_state": True, "server_nice": 0,
                                      "client_nice": 0})
        ledger.mark_done(p.id, rel)

    try:
        for p in plan.points:
            finish(p)
        work = RunState(plan, CampaignDir.around(out, ledger), lambda kind, **kw: None, with_gpus=False)
        while True:
            added = [p for p in plan.points if ledger.points(serve_id=p.serve.id) and p.id not in
                     {r.point_id for r in ledger.points() if r.state == PointState.DONE}]
            for p in added:
                finish(p)
            if not sequential.settle_all(work) and not added:
                break
    finally:
        ledger.close()
    write_results(CampaignDir(out))
    return out


@pytest.fixture(autouse=True)
def _no_figures(monkeypatch):
    """The figures are not what this test compares (tests/test_report.py draws them)."""
    from raysweep.cli import analysing

    monkeypatch.setattr(report, "_figure_list", lambda data: [])
    monkeypatch.setattr(report, "_card_figure", lambda data, c, v: "")
    monkeypatch.setattr(analysing, "default_figures", lambda out_dir: ([], []))


def _json(args: list[str]) -> tuple[int, dict]:
    res = CliRunner().invoke(main, args, catch_exceptions=False)
    return res.exit_code, json.loads(res.stdout)


@pytest.mark.parametrize("which", ["plain", "precision"])
def test_every_command_tells_the_same_story(tmp_path, monkeypatch, which):
    out = plain_campaign(tmp_path, monkeypatch) if which == "plain" else precision_campaign(tmp_path)
    # status, text and --json, and the API's status: the same counts of runs
    code, status = _json(["status", str(out), "--json"])
    assert code == 0 and status["complete"]
    counts = status["counts"]
    assert raysweep.load(out).status()["counts"] == counts
    text = CliRunner().invoke(main, ["status", str(out)]).output
    assert re.search(rf"{counts['done']}\s.*\s{counts['failed']}\s.*\s{counts['total']}", text), text
    led = Ledger.open_existing(out)
    try:
        assert counts["done"] == sum(1 for p in led.points() if p.state == PointState.DONE)
    finally:
        led.close()

    # resume on the finished campaign: does nothing (no Ray), says the same counts and the report's conclusions
    code, resumed = _json(["resume", str(out), "--json"])
    assert resumed["ran"] is False and code == (1 if counts["failed"] else 0)
    assert {k: resumed["counts"][k] for k in ("done", "failed")} == {k: counts[k] for k in ("done", "failed")}
    assert len(resumed["failures"]) == counts["failed"] == len(status["failures"])
    campaign = raysweep.load(out)
    assert campaign.conclusions is not None
    assert resumed["conclusions"] == campaign.conclusions.headlines != []
    code, again = _json(["resume", str(out), "--json"])  # the report is up to date now: the same answer
    assert again["conclusions"] == resumed["conclusions"] and again["counts"] == resumed["counts"]

    # the report's data and the API: one row per run done; the same validity counts
    data = read_data(CampaignDir(out))
    assert len(data.df) == len(campaign.results) == counts["done"]
    judged = validity_counts(load_records(CampaignDir(out)))
    v = status["validity"]
    assert (v["runs"], v["flagged"], v["passed"], v["partly_judged"]) == (
        judged.runs, judged.failed, judged.passed, judged.partly_judged)
    assert v["runs"] == counts["done"] and v["passed"] + v["partly_judged"] + v["flagged"] == v["runs"]
    html = report.build_report(CampaignDir(out))
    section = re.sub(r"<[^>]+>", " ", html.split('<section id="validity">', 1)[1].split("</section>", 1)[0])
    validity_line = next(ln for ln in text.splitlines() if ln.startswith("validity:"))
    if v["partly_judged"]:  # not judged is never passed
        assert f"All {v['runs']} run(s) pass every check" not in section
        assert f"{v['passed']} pass every check; {v['partly_judged']} could not be judged" in section
        assert f"{v['passed']} pass every check, {v['partly_judged']} were not judged" in validity_line
    else:
        assert f"All {v['runs']} run(s) pass every check" in section
        assert validity_line == f"validity: all {v['runs']} finished run(s) pass every check"

    # the conclusions (API, report) judge the same points reached or short of the precision target as status
    answer = answer_of(data)
    assert list(answer.points["runs"]) == list(campaign.conclusions.points["runs"])
    assert int(answer.points["runs"].sum()) == counts["done"]
    if which == "plain":
        assert status["precision"] is None and "precision_state" not in answer.points
        return
    states = list(answer.points["precision_state"])
    assert status["precision"] == {s: states.count(s) for s in ("reached", "max_runs", "max_duration", "measuring")}
    assert status["precision"]["reached"] and status["precision"]["max_runs"], states  # both kinds in this stub
    assert (f"{states.count('reached')} point(s) reached it, {states.count('max_runs')} stopped at max_runs"
            in " ".join(text.split()))
    assert counts["total"] > 12  # the runs the rule added are counted by every command, not only the planned 12
    cards = html.split('<section id="conclusions">', 1)[1].split("</section>", 1)[0].split('class="card"')[1:]
    assert cards
    for card, verdict in zip(cards, answer.verdicts, strict=True):
        short = "Precision not reached: this point stopped at max_runs" in card
        assert short == (verdict.leader["precision_state"] == "max_runs"), card
    # a point still measuring (a driver that died before deciding it): not finished, the run goes on
    from raysweep.campaign import campaign_from_dict
    from raysweep.drive.checks import finished

    led = Ledger.open_existing(out)
    try:
        spec = campaign_from_dict(led.stored_campaign(), base_dir=out)
        assert finished(spec, CampaignDir(out), False) is not None
        row = led.precision()[0]
        led.record_precision(row["serve_id"], row["bench_id"], "measuring", row["runs_done"], row["runs_spent"], None)
        assert finished(spec, CampaignDir(out), False) is None
    finally:
        led.close()


def test_resuming_a_finished_campaign_needs_nothing_exported_again(tmp_path, monkeypatch):
    """What `${VAR}` expanded to at `run` is recorded (secrets left out); `resume` uses it when the variable
    is no longer set, and says so."""
    from raysweep.campaign.loading import expanded_variables

    bench = bench_module()
    made = bench.campaign_data

    def with_vars(*a, **kw):
        data = made(*a, **kw)
        data["serve"]["cmd"] = data["serve"]["cmd"].replace("tiny", "${STORY_MODEL}")
        data["serve"]["env"] = {"STORY_LEVEL": "${STORY_LEVEL:-info}", "HF_TOKEN": "${HF_TOKEN}"}
        return data

    monkeypatch.setattr(bench, "campaign_data", with_vars)
    monkeypatch.setenv("STORY_MODEL", "tiny-model-at-run")
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    monkeypatch.delenv("STORY_LEVEL", raising=False)
    out = tmp_path / "vars"
    bench.build_stub(out, 36, name="vars")
    led = Ledger.open_existing(out)
    try:
        assert json.loads(led.meta("variables")) == {"STORY_MODEL": "tiny-model-at-run"}  # no secret, no default
    finally:
        led.close()
    for stored in out.rglob("*"):  # the ledger (and its write-ahead log), results, logs
        assert not stored.is_file() or b"hf_secret_value" not in stored.read_bytes(), stored
    assert expanded_variables({"cmd": "x ${A} ${API_KEY}"}, {"A": "1", "API_KEY": "k"}) == {"A": "1"}

    monkeypatch.delenv("STORY_MODEL")
    res = CliRunner().invoke(main, ["resume", str(out), "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["ran"] is False and doc["counts"]["done"] == 36
    assert ("${STORY_MODEL} is not set: using the value it had when the campaign was run "
            "(STORY_MODEL=tiny-model-at-run)") in " ".join(res.stderr.split())
    monkeypatch.setenv("STORY_MODEL", "tiny-model-at-run")  # set again: nothing to say
    res = CliRunner().invoke(main, ["resume", str(out), "--json"], catch_exceptions=False)
    assert res.exit_code == 0 and "is not set" not in res.stderr


def test_the_readme_sample_is_made_from_a_result_directory(tmp_path):
    """scripts/readme_sample.py rewrites the README's block between its markers from a result directory
    (here a stub campaign): `run`'s closing lines with the report's conclusions; the rest stays; twice is
    once; --check tells a stale block."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("readme_sample", "scripts/readme_sample.py")
    sample = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sample)
    readme = Path("README.md").read_text()
    assert readme.count(sample.BEGIN) == 1 and readme.count(sample.END) == 1
    out = tmp_path / "demo"
    bench_module().build_stub(out, 36, name="demo-cpu")
    (out / "plots").mkdir()
    (out / "plots" / "FIGURE.png").write_bytes(b"")
    copy = tmp_path / "README.md"
    copy.write_text(readme)
    args = [str(out), "--readme", str(copy), "--no-figures"]
    assert sample.main([*args, "--check"]) == 1  # the README's block is another run's
    assert sample.main(args) == 0
    made = copy.read_text()
    head, rest = made.split(sample.BEGIN)
    inner, tail = rest.split(sample.END)
    assert head == readme.split(sample.BEGIN)[0] and tail == readme.split(sample.END)[1]
    headlines = raysweep.load(out).conclusions.headlines
    assert headlines and inner.strip().splitlines()[-len(headlines) - 3:] == [
        f"Report: {out}/report.html", f"Figures: {out}/plots/FIGURE.png", *headlines, "```"]
    assert "From the run of campaign `demo-cpu` that ended " in inner
    assert sample.main([*args, "--check"]) == 0 and sample.main(args) == 0 and copy.read_text() == made

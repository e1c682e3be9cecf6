"""One count of the validity checks for `status` and the report: runs that could not be judged on a check
(its field not recorded, as steady state on a short run) are never counted, or shown, as passing it. No
Ray, no vLLM: output dirs made through the ledger API (tests/test_plots.py)."""

from __future__ import annotations

import json
import re

from click.testing import CliRunner
from test_plots import build_output_dir

from raysweep.cli import main
from raysweep.record.directory import CampaignDir
from raysweep.record.files import write_json_atomic
from raysweep.report import page as report
from raysweep.results.table import load_records
from raysweep.results.validity_story import validity_counts


def judged_but(out, missing: dict[str, int]) -> int:
    """Every run of `out` judged on every check and passing, except that the first `n` runs lack the field
    of each check in `missing` (steady_state: not judged for steady state); returns the runs."""
    paths = sorted((out / "points").rglob("run=*.json"))
    for i, path in enumerate(paths):
        rec = json.loads(path.read_text())
        rec.update(client_limited=False, validity_ok=True, validity_issues="", server_nice=0, client_nice=0,
                   server_cpu_affinity_per_node="10.0.0.1=0-3", client_node_ips="10.0.0.2", steady_state=True)
        for field, n in missing.items():
            if i < n:
                rec.pop(field, None)
        write_json_atomic(path, rec)
    return len(paths)


def validity_text(out) -> tuple[str, str]:
    res = CliRunner().invoke(main, ["status", str(out)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    line = next(ln for ln in res.output.splitlines() if ln.startswith("validity:"))
    html = report.build_report(CampaignDir(out))
    section = html.split('<section id="validity">', 1)[1].split("</section>", 1)[0]
    return line, re.sub(r"<[^>]+>", " ", section)


def test_runs_not_judged_are_not_shown_as_passing(tmp_path, monkeypatch):
    """16 of the runs not judged for steady state: status and the report give the same counts, and neither
    says every run passes every check."""
    monkeypatch.setattr(report, "_figure_list", lambda data: [])
    monkeypatch.setattr(report, "_card_figure", lambda data, c, v: "")
    out = build_output_dir(tmp_path / "out")
    runs = judged_but(out, {"steady_state": 16})
    counts = validity_counts(load_records(CampaignDir(out)))
    assert (counts.runs, counts.failed, counts.partly_judged, counts.passed) == (runs, 0, 16, runs - 16)
    assert counts.not_judged == {"not steady": 16}
    line, section = validity_text(out)
    assert "pass every check" not in line.split(";")[0] and f"none of {runs} finished run(s) fails a check" in line
    assert f"{runs - 16} pass every check, 16 were not judged" in line and "not steady for 16 run(s)" in line
    assert f"All {runs} run(s) pass every check" not in section
    assert f"{runs - 16} pass every check; 16 could not be judged" in section
    assert "not steady for 16 run(s)" in section


def test_runs_too_short_to_judge_are_said_too_short_not_nothing_recorded(tmp_path, monkeypatch):
    """Runs whose steady state was looked at and found too short to judge (`steady_state_note`): status and the
    report say so, as the results do, never "nothing recorded: not steady"."""
    monkeypatch.setattr(report, "_figure_list", lambda data: [])
    monkeypatch.setattr(report, "_card_figure", lambda data, c, v: "")
    out = build_output_dir(tmp_path / "out")
    runs = judged_but(out, {"steady_state": 16})
    for path in sorted((out / "points").rglob("run=*.json"))[:16]:
        rec = json.loads(path.read_text())
        write_json_atomic(path, {**rec, "steady_state": None, "steady_state_note": "not judged: too short"})
    line, section = validity_text(out)
    for text in (line, " ".join(section.split())):
        assert "steady state too short to judge for 16 run(s)" in text, text
        assert "nothing recorded" not in text and "not steady for" not in text
    assert f"{runs - 16} pass every check, 16 were not judged" in line


def test_when_every_check_was_judged_every_run_passes(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "_figure_list", lambda data: [])
    monkeypatch.setattr(report, "_card_figure", lambda data, c, v: "")
    out = build_output_dir(tmp_path / "out")
    runs = judged_but(out, {})
    line, section = validity_text(out)
    assert line == f"validity: all {runs} finished run(s) pass every check"
    assert f"All {runs} run(s) pass every check" in section and "Not judged" not in section


def test_a_card_says_its_point_stopped_short_of_the_precision_target(tmp_path, monkeypatch):
    """bench.precision: the leader of each card stopped at max_runs before its interval was as narrow as
    asked: the card says so, with the target and where it stopped; a point that reached it says nothing."""
    from raysweep.ledger import Ledger

    monkeypatch.setattr(report, "_figure_list", lambda data: [])
    monkeypatch.setattr(report, "_card_figure", lambda data, c, v: "")
    out = build_output_dir(tmp_path / "out")
    judged_but(out, {})
    ledger = Ledger.open_existing(out)
    try:
        points = {(p.serve_id, p.bench_id) for p in ledger.points()}
        for serve_id, bench_id in points:
            ledger.record_precision(serve_id, bench_id, "max_runs", 2, 2, 0.081)
    finally:
        ledger.close()
    html = report.build_report(CampaignDir(out))
    cards = html.split('<section id="conclusions">', 1)[1].split("</section>", 1)[0]
    assert cards.count("Precision not reached: this point stopped at max_runs") == cards.count('class="card"') >= 1
    assert "+-8.1 % of the mean" in cards
    ledger = Ledger.open_existing(out)
    try:
        for serve_id, bench_id in points:
            ledger.record_precision(serve_id, bench_id, "reached", 2, 2, 0.02)
    finally:
        ledger.close()
    assert "Precision not reached" not in report.build_report(CampaignDir(out))

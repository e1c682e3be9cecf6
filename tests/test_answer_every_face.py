"""One answer on every face: for campaigns of every kind the answer covers (plain, precision, confirmation, flagged
runs, an outlier run, an endpoint, failed points, P/D deployments), each built through the ledger API from a
stand-in table, every face states the same leader, value, lead, verdict and counts: what `run` prints at its end
(and keeps), `report` (its terminal lines and --json), `status` (text and --json), the Python API, the report's
card, `compare`, the catalogue (`catalog list`, text and --json), `history` and the site. No Ray, no vLLM."""

from __future__ import annotations

import html
import json
import math
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from test_aggregate import run_row
from test_report_browser import _demo_like_rows

from raysweep.cli import main
from raysweep.ledger import LEDGER_FILE, Ledger
from raysweep.record.directory import CampaignDir
from raysweep.record.files import write_json_atomic
from raysweep.results import answer as answer_module

Rows = list[dict[str, Any]]


def _sweep(name: str, levels: dict[str, float], starts: int = 2, per_start: int = 2, concs: tuple[int, ...] = (4, 16),
           **extra: Any) -> Rows:
    """Each config at each concurrency, `starts` server starts of `per_start` runs, a small spread that does
    not run in a line (no drift)."""
    rows = []
    for sid, level in levels.items():
        for c in concs:
            for r in range(starts * per_start):
                f = 1.0 + 0.01 * (0, -1, 1, 0.5, -0.5, 0.2)[r % 6]
                rows.append(run_row(sid, c, r, level * c / 16 * f, 50.0 * f, campaign=name,
                                    server_id=f"{sid}-{r // per_start}", gpu_count=1, **extra))
    return rows


def _plain(name: str) -> Rows:
    return _sweep(name, {"s8": 1000.0, "s16": 1250.0})


def _precision(name: str) -> Rows:
    rows = _sweep(name, {"s8": 1000.0, "s16": 1030.0})
    for r in rows:  # bench.precision: the leader's point stopped at max_runs before its interval was narrow enough
        stopped = r["serve_id"] == "s16" and r["max_concurrency"] == 16
        r.update(precision_state="max_runs" if stopped else "reached",
                 precision_rel_half_width=0.04 if stopped else 0.01)
    return rows


def _flagged(name: str) -> Rows:
    rows = _sweep(name, {"s8": 1000.0, "s16": 2000.0, "s4": 900.0})
    for r in rows:  # the fastest config's runs all share CPUs with their clients; one run of another too
        if r["serve_id"] == "s16" or (r["serve_id"] == "s8" and r["run_number"] == 3):
            r.update(validity_ok=False, validity_issues="shared CPUs (server and clients on CPU(s) 0-1)")
    return rows


def _outlier(name: str) -> Rows:
    rows = _sweep(name, {"s8": 1000.0, "s16": 1100.0}, starts=1, per_start=6)
    for r in rows:  # one run of the leader at 16 far below the five others of its start: left out by the aggregates
        if r["serve_id"] == "s16" and r["max_concurrency"] == 16 and r["run_number"] == 2:
            r["output_throughput"] *= 0.3
    return rows


def _endpoint(name: str) -> Rows:
    """A server raysweep did not start, swept over loads: one configuration, its capacity."""
    rows = _sweep(name, {"s0": 1000.0}, concs=(1, 4, 16))
    for r in rows:
        r.update(serve_label="base command", max_num_seqs=None)
    return rows


def _pd(name: str) -> Rows:
    rows = _sweep(name, {"s1": 1000.0, "s2": 1200.0}, starts=2, per_start=2, concs=(1, 4, 16))
    for r in rows:
        ratio = "1P1D" if r["serve_id"] == "s1" else "2P1D"
        r.update(serve_label=f"pd_ratio={ratio}", pd_ratio=ratio, pd_connector="NixlConnector")
    return rows


def _all_flagged(name: str) -> Rows:
    rows = _sweep(name, {"s8": 1000.0, "s16": 2000.0})
    for r in rows:  # every run of every config shares CPUs with its clients: no leader is named
        r.update(validity_ok=False, validity_issues="shared CPUs (server and clients on CPU(s) 0-1)")
    return rows


KINDS: dict[str, tuple[Callable[[str], Rows], int]] = {   # the rows, and how many points failed besides
    "plain": (_plain, 0), "precision": (_precision, 0), "confirmation": (lambda n: _demo_like_rows(), 0),
    "flagged": (_flagged, 0), "all_flagged": (_all_flagged, 0), "outlier": (_outlier, 0),
    "endpoint": (_endpoint, 0), "endpoint_failed": (_endpoint, 1), "failed": (_plain, 2), "pd": (_pd, 0)}


def _build(out: Path, name: str, rows: Rows, failed: int) -> Path:
    """A raysweep output dir with these runs done and `failed` more points failed, through the ledger API."""
    out.mkdir(parents=True)
    gone = [{**rows[0], "point_id": f"gone-{i}", "run_number": 90 + i} for i in range(failed)]

    def serve(r: dict[str, Any]) -> dict[str, Any]:
        return {k: r[k] for k in ("max_num_seqs", "pd_ratio") if r.get(k) is not None}

    led = Ledger(out / LEDGER_FILE)
    try:
        led.sync(name=name, fingerprint="fp", meaning={"bench_cmd": ["vllm", "bench", "serve", "--model", "m"]},
                 campaign={"name": name}, campaign_file="c.yaml",
                 points=[(r["point_id"], r["serve_id"], r["bench_id"], r["run_number"], serve(r),
                          {"max_concurrency": r["max_concurrency"]}) for r in [*rows, *gone]])
        for r in rows:
            rel = f"points/{r['serve_id']}/{r['bench_id']}/{r['point_id']}.json"
            write_json_atomic(out / rel, {**r, "campaign": name})
            led.mark_running(r["point_id"], "srv")
            led.mark_done(r["point_id"], rel)
        states = {(r["serve_id"], r["bench_id"]): r for r in rows if "precision_state" in r}
        for (sid, bid), r in states.items():  # bench.precision: where each point stopped, as the driver records it
            n = sum(1 for x in rows if (x["serve_id"], x["bench_id"]) == (sid, bid))
            led.record_precision(sid, bid, r["precision_state"], n, n, r["precision_rel_half_width"])
        for r in gone:
            led.mark_running(r["point_id"], "srv")
            led.mark_failed(r["point_id"], "server died during the point", "CUDA out of memory\nlast log line")
    finally:
        led.close()
    return out


def _flat(text: str) -> str:
    return " ".join(text.split())


def _run(*args: str) -> Any:
    res = CliRunner().invoke(main, list(args))
    assert res.exit_code == 0, (args, res.output)
    return res


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_face_states_the_same_leader_value_lead_verdict_and_counts(kind: str, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from raysweep import api
    from raysweep.cli import logs
    from raysweep.cli.running import _headlines
    from raysweep.report import page as report

    monkeypatch.setattr(logs, "verbosity", 0)  # as `run` without -v
    monkeypatch.setattr(report, "_figure_list", lambda data: [])  # the words are compared, not the figures
    monkeypatch.setattr(report, "_card_figure", lambda data, c, v: "")
    make, failed = KINDS[kind]
    out = _build(tmp_path / kind, kind, make(kind), failed)

    printed = _headlines(CampaignDir(out))  # what `run` prints at its end, and keeps beside the results
    answer = api.Campaign(out).conclude()
    assert answer is not None
    obj = answer.answer.to_dict()   # the API's answer: what every other face must state
    assert printed == answer.answer.lines() and printed and obj["shapes"]
    _the_kind_shows(kind, answer.answer, failed)
    counted = json.loads(_run("status", str(out), "--json").output)["counts"]["failed"]
    assert counted == failed and obj["failed"] == failed
    said_failed = f"{failed} failed point(s) of the campaign (not in any ranking"
    for s in obj["shapes"]:   # the points that failed are said wherever the answer is, with `status`'s count
        assert (said_failed in s["headline"]) == bool(failed) and (said_failed in " ".join(s["left_out"])) == bool(
            failed), s["headline"]

    doc = json.loads(_run("report", str(out), "--json").output)   # writes the card too
    assert doc["answer"] == obj and doc["conclusions"][:len(printed)] == printed
    assert [ln for ln in _run("report", str(out)).output.splitlines() if ln in printed] == printed

    assert json.loads(_run("status", str(out), "--json").output)["answer"] == obj
    status = _flat(_run("status", str(out)).output)
    assert all(_flat(line) in status for line in printed), status

    page = (out / "report.html").read_text()
    card = _flat(html.unescape(re.sub(r"<[^>]+>", " ", page)))
    assert ("Precision not reached" in card) == (kind == "precision")
    for s in obj["shapes"]:
        _the_card_states(card, s, single=answer.answer.shapes[0].verdict == "alone" and not s["rivals"])
    # a lead on the card only where the terminal's line states one: none where no leader is named
    assert page.count('<p class="lead">') == sum(bool(s["lead_words"]) and s["lead_words"] in s["headline"]
                                                 for s in obj["shapes"]), page

    copy = tmp_path / "copy" / kind
    shutil.copytree(out, copy)
    said = [ln.split("'s answer: ", 1)[1] for ln in _run("compare", str(out), str(copy)).output.splitlines()
            if "'s answer: " in ln]
    assert said == printed[:4] * 2
    assert list(json.loads(_run("compare", str(out), str(copy), "--json").output)["answers"].values()) == [obj] * 2

    cat = tmp_path / "cat"
    _run("catalog", "add", str(cat), str(out))
    listed = _flat(_run("catalog", "list", str(cat)).output)
    assert all(f"{kind}'s answer: {_flat(line)}" in listed for line in printed), listed
    (entry,) = json.loads(_run("catalog", "list", str(cat), "--json").output)["campaigns"]
    assert entry["answer"] == printed and entry["answer_object"] == obj

    history = _run("history", str(cat)).output
    if kind == "all_flagged":  # no run passed its checks: in no series of `history`, so no answer of it there
        assert "no run matches" in history and json.loads(_run("history", str(cat), "--json").output)["answers"] == []
    else:
        assert [ln.split("'s answer: ", 1)[1] for ln in history.splitlines()
                if ln.startswith(f"{kind}'s answer: ")] == printed, history
        (kept,) = json.loads(_run("history", str(cat), "--json").output)["answers"]
        assert kept["lines"] == printed and kept["answer"] == obj

    _run("site", str(cat), str(tmp_path / "site"))
    index = (tmp_path / "site" / "index.html").read_text()
    assert all(html.escape(line) in index for line in printed)


def _the_card_states(card: str, s: dict[str, Any], single: bool) -> None:
    """The card of one shape states the answer's leader (or that none is named), value, counts, lead, verdict, in
    the words of the terminal's line (the value as `value_words` gives it, the lead as `lead_words`)."""
    words = s["value_words"]
    assert words.startswith(answer_module._n(s["value"])) and words in s["headline"], (words, s["headline"])
    assert re.search(rf"\b{s['starts']} (fresh )?server start\(s\), {s['runs']} run\(s\)\)$", words), words
    if math.isfinite(s["ci_low"] or math.nan):
        level = f"{100 * s['level']:.4g} %"
        assert f" [{answer_module._n(s['ci_low'])}, {answer_module._n(s['ci_high'])} at {level}] " in words, words
    assert words in card, (words, card)
    for left in s["left_out"]:
        assert left in card
    if single:
        assert "Capacity:" in card
        return
    if s["leader"] is None:
        assert f"No configuration to deploy: {s['why']}" in card
    else:
        assert f"{'Deploy' if s['verdict'] == 'better' else 'Best measured'}: {s['leader']}" in card
    if s["lead_words"]:
        assert s["lead_words"] in s["headline"] or s["leader"] is None
        assert f"{s['lead_words']} (" in card, (s["lead_words"], card)
    assert f"{s['verdict']}: {s['why']}" in card or s["leader"] is None
    assert bool(s["precision"]) == ("Precision not reached: this point stopped at max_runs" in card)


def _the_kind_shows(kind: str, a: Any, failed: int) -> None:
    """Each stand-in is the kind it stands for, as the answer reads it (a guard on the stand-ins themselves)."""
    first = a.shapes[0]
    if kind == "precision":
        assert first.precision.startswith("precision not reached: its point stopped at max_runs"), a.lines()
        assert first.headline.endswith(first.precision)
    elif kind == "confirmation":
        assert first.confirmed or "confirmation" in first.headline
    elif kind == "flagged":
        assert first.leader != "max_num_seqs=16 at max_concurrency=16"
        assert any("never the leader" in x for s in a.shapes for x in s.left_out), a.lines()
    elif kind == "outlier":
        assert any("1 run(s) left out (outlier run 1)" in x for s in a.shapes for x in s.left_out), a.lines()
    elif kind == "all_flagged":
        assert all(s.leader is None and s.verdict == "no leader" for s in a.shapes), a.lines()
    elif kind.startswith("endpoint"):
        assert all(s.verdict == "alone" for s in a.shapes)
    elif kind == "pd":
        assert any(line.startswith("Deployments by") for line in a.extra), a.lines()
    assert failed == 0 or first.leader is not None


def test_one_configuration_words_its_numbers_as_every_other_answer(tmp_path: Path) -> None:
    """An endpoint swept over loads states its capacity as any other answer states its value: `1,001 tok/s
    [990.2, 1,012 at 95 %]`, never `1001 tok/s (95% interval ...)`."""
    from raysweep import api

    out = _build(tmp_path / "ep", "ep", _endpoint("ep"), 0)   # a capacity above a thousand tok/s
    c = api.Campaign(out).conclude()
    assert c is not None
    (s,) = c.answer.shapes
    assert s.headline.startswith(f"Capacity for {s.shape}: {c.answer.objective} {s.value_words} at max_concurrency=16")
    assert re.match(r"1,001 tok/s \[[\d,.]+, 1,0\d\d at 95 %\] \(on 2 server start\(s\), 4 run\(s\)\)$",
                    s.value_words), s.value_words
    assert "95% interval" not in " ".join(c.answer.lines())
    knee = next(x for x in c.answer.extra if x.startswith("Knee for"))
    by_load = next(x for x in c.answer.extra if x.startswith("By max_concurrency for"))
    assert "1,001 tok/s" in knee and "16: 1,001 tok/s" in by_load and "1001" not in knee + by_load, (knee, by_load)

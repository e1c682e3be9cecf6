"""`raysweep status`: per server config progress, the ETA from measured durations, and `--watch` (with
`--json`: a JSON line per refresh)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from raysweep.cli import main
from raysweep.cli.jsonout import schema
from raysweep.ledger import LEDGER_FILE, Ledger


def _campaign(out: Path) -> None:
    """Two server configs of two points; s1's first point done in 20 s, its server up in 40 s."""
    out.mkdir(parents=True)
    led = Ledger(out / LEDGER_FILE)
    try:
        led.sync(name="camp", fingerprint="fp", meaning={}, campaign={"name": "camp"}, campaign_file="c.yaml",
                 points=[(f"{s}-{b}", s, b, 0, {"max_num_seqs": n}, {}) for s, n in (("s1", 8), ("s2", 16))
                         for b in ("b1", "b2")])
        led.add_server("s1-aa", "s1", "vllm serve m")
    finally:
        led.close()
    with sqlite3.connect(out / LEDGER_FILE) as c:
        c.execute("UPDATE points SET state = 'done', started_at = 100, ended_at = 120 WHERE point_id = 's1-b1'")
        c.execute("UPDATE servers SET started_at = 50, ready_at = 90, stopped_at = 200 WHERE server_id = 's1-aa'")


def _finish(out: Path) -> None:
    with sqlite3.connect(out / LEDGER_FILE) as c:
        c.execute("UPDATE points SET state = 'done', started_at = 100, ended_at = 120")


def test_status_shows_progress_per_config_and_an_eta(tmp_path):
    out = tmp_path / "out"
    _campaign(out)
    result = CliRunner().invoke(main, ["status", str(out)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    row = next(line for line in lines if line.startswith("│ s1"))
    assert "1/2" in row and "waiting" in row
    assert "0/2" in next(line for line in lines if line.startswith("│ s2"))
    # 3 runs left at the measured 20 s, and two server starts (40 s measured) one after another
    assert "ETA: about 2 min for 3 run(s) left" in result.output  # 140 s


def test_status_before_any_measure_says_so(tmp_path):
    out = tmp_path / "out"
    _campaign(out)
    with sqlite3.connect(out / LEDGER_FILE) as c:
        c.execute("UPDATE points SET state = 'pending', started_at = NULL, ended_at = NULL")
    result = CliRunner().invoke(main, ["status", str(out)])
    assert "ETA: after the first point is done (4 run(s) left)" in result.output


def test_watch_reads_again_until_the_campaign_is_complete(tmp_path, monkeypatch):
    out = tmp_path / "out"
    _campaign(out)
    sleeps = []

    def sleep(seconds: float) -> None:  # the campaign finishes while the watcher waits
        sleeps.append(seconds)
        if len(sleeps) == 2:
            _finish(out)

    monkeypatch.setattr("raysweep.cli.status.time.sleep", sleep)
    result = CliRunner().invoke(main, ["status", str(out), "--watch", "0.01"])
    assert result.exit_code == 0, result.output
    assert sleeps == [0.01, 0.01]
    assert result.output.count("campaign camp") == 3  # read three times
    assert result.output.rstrip().endswith("campaign complete")
    assert "4/4" not in result.output.split("campaign camp")[2]  # the second read still saw work left


def test_watch_without_seconds_and_ctrl_c(tmp_path, monkeypatch):
    out = tmp_path / "out"
    _campaign(out)
    sleeps = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        raise KeyboardInterrupt

    monkeypatch.setattr("raysweep.cli.status.time.sleep", sleep)
    result = CliRunner().invoke(main, ["status", str(out), "--watch"])
    assert result.exit_code == 0, result.output
    assert sleeps == [5.0]
    assert "interrupted" not in result.output


def test_watch_follows_a_storage_uri(tmp_path, monkeypatch):
    out = tmp_path / "mirror"
    _campaign(out)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def sleep(seconds: float) -> None:
        _finish(out)  # the mirror is updated; the watcher must download it again

    monkeypatch.setattr("raysweep.cli.status.time.sleep", sleep)
    result = CliRunner().invoke(main, ["status", out.as_uri(), "--watch", "1"])
    assert result.exit_code == 0, result.output
    assert result.output.count("campaign camp") == 2
    assert "campaign complete" in result.output


def _lines(stdout: str) -> list[dict]:
    """JSON lines: every line of stdout one status document, valid against the status schema."""
    docs = [json.loads(line) for line in stdout.splitlines()]
    for doc in docs:
        assert doc["kind"] == "status"
        jsonschema.validate(doc, schema("status"))
    return docs


def test_watch_json_of_a_finished_campaign_is_one_line(tmp_path, monkeypatch):
    out = tmp_path / "out"
    _campaign(out)
    _finish(out)
    monkeypatch.setattr("raysweep.cli.status.time.sleep", lambda s: pytest.fail("a finished campaign waited"))
    result = CliRunner().invoke(main, ["status", str(out), "--watch", "--json"])
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 1
    (doc,) = _lines(result.stdout)
    assert doc["complete"] is True and doc["counts"]["done"] == 4


def test_watch_json_prints_a_line_per_refresh_until_complete(tmp_path, monkeypatch):
    out = tmp_path / "out"
    _campaign(out)
    sleeps = []

    def sleep(seconds: float) -> None:  # the campaign finishes during the second wait
        sleeps.append(seconds)
        if len(sleeps) == 2:
            _finish(out)

    monkeypatch.setattr("raysweep.cli.status.time.sleep", sleep)
    result = CliRunner().invoke(main, ["status", str(out), "--watch", "0.01", "--json"])
    assert result.exit_code == 0, result.output
    docs = _lines(result.stdout)
    assert sleeps == [0.01, 0.01]
    assert [d["counts"]["done"] for d in docs] == [1, 1, 4]
    assert [d["complete"] for d in docs] == [False, False, True]

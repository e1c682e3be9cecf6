"""Mirroring an output dir to a filesystem URI (`storage:`), reading it back, restoring a lost output dir.
A local `file://` URI stands in for s3:// or gs:// (pyarrow gives every scheme the same interface)."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from raysweep.campaign import campaign_from_dict
from raysweep.cli import main
from raysweep.errors import CampaignError, UserError
from raysweep.ledger import LEDGER_FILE, Ledger
from raysweep.record import storage
from raysweep.record.directory import CampaignDir


def _ledger_with_points(out: Path, n: int) -> Ledger:
    led = Ledger(out / LEDGER_FILE)
    led.sync(name="m", fingerprint="f", meaning={}, campaign={"name": "m"}, campaign_file="",
             points=[(f"p{i}", "s", "b", 0, {}, {}) for i in range(n)], force=False, searches=[])
    return led


def _done(rows: Path) -> int:
    con = sqlite3.connect(rows)
    try:
        return con.execute("select count(*) from points where state='done'").fetchone()[0]
    finally:
        con.close()


def test_mirror_copies_a_live_ledger_as_a_consistent_snapshot_and_changed_files_only(tmp_path):
    out, mirror_dir = tmp_path / "out", tmp_path / "mirror"
    out.mkdir()
    led = _ledger_with_points(out, 4)
    try:
        led.mark_running("p0", "srv")
        (out / "points").mkdir()
        (out / "points" / "p0.json").write_text('{"x": 1}')
        led.mark_done("p0", "points/p0.json")
        m = storage.Mirror(mirror_dir.as_uri(), CampaignDir(out))
        assert m.sync()
        # the copy is a database of its own (no -wal beside it) with the finished point in it
        assert not (mirror_dir / f"{LEDGER_FILE}-wal").exists()
        assert _done(mirror_dir / LEDGER_FILE) == 1
        assert (mirror_dir / "points" / "p0.json").read_text() == '{"x": 1}'
        first = (mirror_dir / "points" / "p0.json").stat().st_mtime_ns
        led.mark_running("p1", "srv")
        (out / "points" / "p1.json").write_text('{"x": 2}')
        led.mark_done("p1", "points/p1.json")
        time.sleep(0.01)
        assert m.sync()
        assert _done(mirror_dir / LEDGER_FILE) == 2
        assert (mirror_dir / "points" / "p0.json").stat().st_mtime_ns == first  # unchanged: not copied again
        assert not list(mirror_dir.rglob("*.part-*"))
    finally:
        led.close()


def test_requests_are_folded_and_close_makes_the_last_copy(tmp_path):
    """While a slow copy runs, 20 requests return at once and fold into one more copy (not 20)."""
    out, mirror_dir = tmp_path / "out", tmp_path / "mirror"
    out.mkdir()
    led = _ledger_with_points(out, 3)
    led.close()
    m = storage.Mirror(mirror_dir.as_uri(), CampaignDir(out))
    entered, gate, copies = threading.Event(), threading.Event(), []
    real = m._sync

    def slow_store() -> None:  # the first copy hangs until every request has been made
        copies.append(gate.is_set())
        entered.set()
        gate.wait(30)
        real()

    m._sync = slow_store  # type: ignore[method-assign]
    m.request()
    assert entered.wait(30)
    threads = [threading.Thread(target=m.request) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)   # no request waited for the slow copy
    gate.set()
    (out / "results.csv").write_text("a\n1\n")
    assert m.close()
    assert (mirror_dir / "results.csv").read_text() == "a\n1\n"
    # the first copy, at most one for the 20 folded requests, at most one more as the loop ends, the last one
    assert copies[0] is False and 2 <= len(copies) <= 4 and m.syncs == len(copies)


def test_a_failing_mirror_warns_and_never_raises(tmp_path, caplog):
    out = tmp_path / "out"
    out.mkdir()
    (out / "f.txt").write_text("x")
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the mirror's directory should be")
    m = storage.Mirror(blocker.as_uri(), CampaignDir(out))
    assert m.sync() is False
    assert "could not mirror" in caplog.text


def test_fetch_restore_and_results_from_a_uri(tmp_path):
    out, mirror_dir = tmp_path / "out", tmp_path / "mirror"
    out.mkdir()
    led = _ledger_with_points(out, 2)
    led.close()
    storage.Mirror(mirror_dir.as_uri(), CampaignDir(out)).sync()

    local = storage.resolve_output(mirror_dir.as_uri(), tmp_path / "copy")
    assert (local / LEDGER_FILE).is_file()
    # the commands that read an output dir take the URI too
    r = CliRunner().invoke(main, ["status", mirror_dir.as_uri()], env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert r.exit_code == 0, r.output
    assert "pending" in r.output

    fresh = tmp_path / "fresh"
    assert storage.restore(mirror_dir.as_uri(), CampaignDir(fresh)) is True
    assert (fresh / LEDGER_FILE).is_file()
    assert storage.restore(mirror_dir.as_uri(), CampaignDir(fresh)) is False  # a ledger is there: it is the truth
    assert storage.restore((tmp_path / "nothing").as_uri(), CampaignDir(tmp_path / "x")) is False


def test_bad_uris_are_refused_with_what_is_accepted(tmp_path):
    with pytest.raises(UserError, match="no mirrored campaign"):
        storage.fetch((tmp_path / "none").as_uri(), tmp_path / "d")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "x.txt").write_text("x")
    with pytest.raises(UserError, match="no raysweep ledger"):
        storage.fetch(empty.as_uri(), tmp_path / "d2")
    base = {"name": "c", "serve": {"cmd": "srv"}, "bench": {"backend": "command", "cmd": "b"}}
    with pytest.raises(CampaignError) as err:
        campaign_from_dict({**base, "storage": "/just/a/path"}, base_dir=tmp_path)
    assert err.value.field == "storage" and "s3://" in str(err.value)
    with pytest.raises(CampaignError, match="ftp"):
        campaign_from_dict({**base, "storage": "ftp://host/x"}, base_dir=tmp_path)

"""Unit tests for raysweep.ledger: the SQLite (WAL) ledger, point states, sync and resume rules."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raysweep.errors import LedgerError
from raysweep.ledger import LEDGER_FILE, Ledger, PointState

FP = "fp-one"
MEANING = {"serve_cmd": ["vllm", "serve", "m"], "bench_cmd": ["vllm", "bench", "serve"], "serve_env": {}}


def pts(*ids: str, serve: str = "s1") -> list[tuple[str, str, str, int, dict[str, Any], dict[str, Any]]]:
    return [(pid, serve, f"b-{pid}", 0, {"max_num_seqs": 4}, {"random_input_len": 16}) for pid in ids]


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    led = Ledger(tmp_path / LEDGER_FILE)
    yield led
    led.close()


def sync(led: Ledger, points, *, name: str = "camp", fp: str = FP, meaning: dict[str, Any] | None = None,
         force: bool = False):
    return led.sync(name=name, fingerprint=fp, meaning=MEANING if meaning is None else meaning,
                    campaign={"name": name}, campaign_file="/x/camp.yaml", points=points, force=force)


def state(led: Ledger, pid: str) -> tuple[PointState, int]:
    row = next(p for p in led.points(in_plan_only=False) if p.point_id == pid)
    return row.state, row.attempts


def test_wal_mode(ledger, tmp_path):
    conn = sqlite3.connect(tmp_path / LEDGER_FILE)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal"
    finally:
        conn.close()


def test_open_existing_needs_a_ledger(tmp_path):
    with pytest.raises(LedgerError) as exc:
        Ledger.open_existing(tmp_path)
    assert LEDGER_FILE in str(exc.value)
    assert not (tmp_path / LEDGER_FILE).exists()  # nothing created by the failed open


def test_sync_inserts_pending_points(ledger):
    report = sync(ledger, pts("p1", "p2", "p3"))
    assert (report.added, report.in_plan, report.out_of_plan, report.fingerprint_changed) == (3, 3, 0, False)
    rows = ledger.points()
    assert [r.point_id for r in rows] == ["p1", "p2", "p3"]
    assert all(r.state == PointState.PENDING and r.attempts == 0 and r.in_plan for r in rows)
    assert rows[0].serve_params == {"max_num_seqs": 4} and rows[0].bench_params == {"random_input_len": 16}
    assert ledger.counts() == {"pending": 3, "running": 0, "done": 0, "failed": 0}
    assert ledger.meta("name") == "camp" and ledger.meta("fingerprint") == FP
    assert ledger.stored_campaign() == {"name": "camp"}
    assert ledger.meta("campaign_file") == "/x/camp.yaml"


def test_stored_campaign_missing(ledger):
    with pytest.raises(LedgerError):
        ledger.stored_campaign()


def test_second_sync_keeps_done_and_adds_pending(ledger):
    sync(ledger, pts("p1", "p2"))
    ledger.mark_running("p1", "srv")
    ledger.mark_done("p1", "points/p1.json")
    report = sync(ledger, pts("p1", "p2", "p3"))
    assert report.added == 1
    assert state(ledger, "p1") == (PointState.DONE, 1)
    assert state(ledger, "p2") == (PointState.PENDING, 0)
    assert state(ledger, "p3") == (PointState.PENDING, 0)
    assert ledger.counts() == {"pending": 2, "running": 0, "done": 1, "failed": 0}
    done = next(p for p in ledger.points() if p.point_id == "p1")
    assert done.result_path == "points/p1.json"


def test_sync_survives_reopening(tmp_path):
    led = Ledger(tmp_path / LEDGER_FILE)
    sync(led, pts("p1", "p2"))
    led.mark_running("p1", "srv")
    led.mark_done("p1", "r.json")
    led.close()
    again = Ledger.open_existing(tmp_path)
    try:
        assert sync(again, pts("p1", "p2")).added == 0
        assert state(again, "p1") == (PointState.DONE, 1)
    finally:
        again.close()


def test_changed_fingerprint_refused_unless_forced(ledger):
    sync(ledger, pts("p1"))
    ledger.mark_running("p1", "srv")
    ledger.mark_done("p1", "r.json")
    other = dict(MEANING, bench_cmd=["vllm", "bench", "serve", "--dataset-name", "sharegpt"])
    with pytest.raises(LedgerError) as exc:
        sync(ledger, pts("p1", "p2"), fp="fp-two", meaning=other)
    msg = str(exc.value)
    assert "bench_cmd" in msg and "serve_cmd" not in msg and "--force" in msg
    # nothing changed by the refused sync
    assert ledger.meta("fingerprint") == FP
    assert [p.point_id for p in ledger.points()] == ["p1"]
    report = sync(ledger, pts("p1", "p2"), fp="fp-two", meaning=other, force=True)
    assert report.fingerprint_changed and report.added == 1
    assert ledger.meta("fingerprint") == "fp-two"
    assert state(ledger, "p1") == (PointState.DONE, 1)


def test_another_campaign_name_refused(ledger):
    sync(ledger, pts("p1"))
    with pytest.raises(LedgerError) as exc:
        sync(ledger, pts("p1"), name="other")
    assert "camp" in str(exc.value) and "other" in str(exc.value)
    assert ledger.meta("name") == "camp"
    sync(ledger, pts("p1"), name="other", force=True)
    assert ledger.meta("name") == "other"


def test_running_then_done(ledger):
    sync(ledger, pts("p1"))
    assert ledger.mark_running("p1", "srv-1") == 1
    row = ledger.points()[0]
    assert (row.state, row.attempts, row.server_id) == (PointState.RUNNING, 1, "srv-1")
    assert row.started_at is not None and row.ended_at is None
    ledger.mark_done("p1", "points/s1/b/run=0.json")
    row = ledger.points()[0]
    assert (row.state, row.attempts, row.result_path) == (PointState.DONE, 1, "points/s1/b/run=0.json")
    assert row.ended_at >= row.started_at
    assert row.error is None


def test_mark_failed_records_error_and_tail(ledger):
    sync(ledger, pts("p1", "p2"))
    ledger.mark_running("p1", "srv")
    ledger.mark_failed("p1", "boom", "last\nlines")
    row = next(p for p in ledger.points() if p.point_id == "p1")
    assert (row.state, row.attempts, row.error, row.log_tail) == (PointState.FAILED, 1, "boom", "last\nlines")
    # a point whose server never started counts its attempt here
    ledger.mark_failed("p2", "server failed to start", started=False)
    assert state(ledger, "p2") == (PointState.FAILED, 1)


def test_retry_after_failure_then_done_clears_error(ledger):
    sync(ledger, pts("p1"))
    ledger.mark_running("p1", "srv")
    ledger.mark_failed("p1", "boom")
    assert ledger.mark_running("p1", "srv") == 2
    ledger.mark_done("p1", "r.json")
    row = ledger.points()[0]
    assert (row.state, row.attempts, row.error) == (PointState.DONE, 2, None)


def test_runnable(ledger):
    sync(ledger, pts("pending", "failed-once", "failed-twice", "done", "running") + pts("other-serve", serve="s2"))
    for pid in ("failed-once", "failed-twice", "done", "running"):
        ledger.mark_running(pid, "srv")
    ledger.mark_failed("failed-once", "x")
    ledger.mark_running("failed-twice", "srv")
    ledger.mark_failed("failed-twice", "x")
    ledger.mark_done("done", "r.json")
    assert sorted(p.point_id for p in ledger.runnable("s1", max_attempts=2)) == ["failed-once", "pending"]
    assert sorted(p.point_id for p in ledger.runnable("s1", max_attempts=3)) == ["failed-once", "failed-twice",
                                                                                 "pending"]
    assert [p.point_id for p in ledger.runnable("s1", max_attempts=1)] == ["pending"]
    assert [p.point_id for p in ledger.runnable("s2", max_attempts=2)] == ["other-serve"]


def test_recover_requeues_running_without_counting_and_returns_unstopped_servers(ledger):
    sync(ledger, pts("p1", "p2", "p3"))
    ledger.mark_running("p1", "srv-a")
    ledger.mark_done("p1", "r.json")
    ledger.mark_running("p2", "srv-b")  # the driver died during p2
    ledger.mark_running("p3", "srv-b")
    ledger.mark_failed("p3", "x")
    ledger.mark_running("p3", "srv-b")  # second attempt of p3 also cut off
    ledger.add_server("srv-a", "s1", "vllm serve m --api-key ***")
    ledger.update_server("srv-a", stopped_at=123.0, state="stopped", pid=11)
    ledger.add_server("srv-b", "s1", "vllm serve m")
    ledger.update_server("srv-b", pid=4242, pid_create_time=99.5, hostname="h", port=8000)

    n, lost = ledger.recover()
    assert n == 2
    assert state(ledger, "p1") == (PointState.DONE, 1)
    assert state(ledger, "p2") == (PointState.PENDING, 0)
    assert state(ledger, "p3") == (PointState.PENDING, 1)
    assert [(s.server_id, s.pid, s.pid_create_time, s.port) for s in lost] == [("srv-b", 4242, 99.5, 8000)]
    assert ledger.servers(active_only=True) == []
    assert {s.server_id: s.state for s in ledger.servers()} == {"srv-a": "stopped", "srv-b": "lost"}
    # recovering again finds nothing more
    assert ledger.recover() == (0, [])


def test_update_server_refuses_unknown_fields(ledger):
    ledger.add_server("srv", "s1", "cmd")
    with pytest.raises(ValueError):
        ledger.update_server("srv", bogus=1)


def _drivers(path: Path) -> list[tuple[int, int, str | None, float | None]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT id, pid, outcome, ended_at FROM drivers ORDER BY id").fetchall()
    finally:
        conn.close()


def test_acquire_driver_refuses_a_live_driver_and_takes_over_a_dead_one(ledger, tmp_path):
    calls: list[tuple[str, int, float]] = []
    first = ledger.acquire_driver(100, 1.5, lambda *a: calls.append(a) or True)
    assert calls == []  # no earlier driver to ask about

    with pytest.raises(LedgerError) as exc:
        ledger.acquire_driver(200, 2.5, lambda *a: calls.append(a) or True)
    assert "100" in str(exc.value)
    assert calls[-1][1:] == (100, 1.5)
    assert [d[:3] for d in _drivers(tmp_path / LEDGER_FILE)] == [(first, 100, None)]

    second = ledger.acquire_driver(200, 2.5, lambda *a: False)
    rows = _drivers(tmp_path / LEDGER_FILE)
    assert [(d[0], d[1], d[2]) for d in rows] == [(first, 100, "lost"), (second, 200, None)]
    assert rows[0][3] is not None

    third = ledger.acquire_driver(300, 3.5, lambda *a: True, force=True)
    assert _drivers(tmp_path / LEDGER_FILE)[-1][:3] == (third, 300, None)

    ledger.release_driver(third, "finished")
    fourth = ledger.acquire_driver(400, 4.5, lambda *a: pytest.fail("a released driver must not be asked about"))
    assert [d[2] for d in _drivers(tmp_path / LEDGER_FILE)] == ["lost", "lost", "finished", None]
    assert fourth > third
    assert [d["pid"] for d in ledger.lost_drivers()] == [100, 200]
    assert ledger.last_driver()["pid"] == 400 and ledger.last_driver()["ended_at"] is None


def test_counts(ledger):
    sync(ledger, pts("a", "b", "c", "d", "e"))
    ledger.mark_running("a", "s")
    ledger.mark_done("a", "r")
    ledger.mark_running("b", "s")
    ledger.mark_failed("b", "x")
    ledger.mark_running("c", "s")
    assert ledger.counts() == {"pending": 2, "running": 1, "done": 1, "failed": 1}


def test_points_out_of_plan_after_a_sync_that_drops_one(ledger):
    sync(ledger, pts("a", "b", "c"))
    ledger.mark_running("c", "s")
    ledger.mark_done("c", "r")
    report = sync(ledger, pts("a", "b"))
    assert (report.in_plan, report.out_of_plan, report.added) == (2, 1, 0)
    assert [p.point_id for p in ledger.points()] == ["a", "b"]
    everything = {p.point_id: p for p in ledger.points(in_plan_only=False)}
    assert set(everything) == {"a", "b", "c"}
    assert everything["c"].in_plan is False and everything["c"].state == PointState.DONE
    assert ledger.counts() == {"pending": 2, "running": 0, "done": 0, "failed": 0}
    assert ledger.out_of_plan() == 1
    # back in the plan: kept done, not added again
    report = sync(ledger, pts("a", "b", "c"))
    assert report.added == 0 and report.out_of_plan == 0
    assert ledger.counts()["done"] == 1


def test_points_filter_by_serve(ledger):
    sync(ledger, pts("a", "b") + pts("c", serve="s2"))
    assert [p.point_id for p in ledger.points(serve_id="s2")] == ["c"]
    assert [p.point_id for p in ledger.points(serve_id="s1")] == ["a", "b"]


def test_a_second_connection_sees_committed_writes(ledger, tmp_path):
    sync(ledger, pts("a"))
    ledger.mark_running("a", "s")
    ledger.mark_done("a", "r.json")
    reader = Ledger.open_existing(tmp_path)
    try:
        assert reader.counts()["done"] == 1
    finally:
        reader.close()


def test_retry_failed_resets_attempts_of_failed_points_only(ledger):
    sync(ledger, pts("a", "b", "c"))
    for pid in ("a", "b"):
        ledger.mark_running(pid, "s")
    ledger.mark_failed("a", "boom")
    ledger.mark_done("b", "points/b.json")
    assert [p.point_id for p in ledger.runnable("s1", max_attempts=1)] == ["c"]
    assert ledger.retry_failed() == 1
    rows = {p.point_id: p for p in ledger.points()}
    assert rows["a"].state == "pending" and rows["a"].attempts == 0
    assert rows["b"].state == "done" and rows["c"].state == "pending"


def test_lost_driver_helpers_are_stopped_by_pid(ledger):
    """A killed driver's embedded Ray processes are recorded and stopped by whoever finds it dead; a live
    process whose pid matches but whose start time does not is left alone."""
    import subprocess
    import sys

    import psutil

    from raysweep.drive.recovery import reap_lost_drivers

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        driver = ledger.acquire_driver(dead.pid, 1.0, lambda *a: False)
        ledger.record_driver_helpers(driver, [(helper.pid, psutil.Process(helper.pid).create_time()),
                                              (stranger.pid, 12345.0)])
        ledger.acquire_driver(os.getpid(), 2.0, lambda *a: False)
        reap_lost_drivers(ledger.lost_drivers())
        assert helper.wait(timeout=10) is not None
        assert stranger.poll() is None
    finally:
        for p in (helper, stranger):
            p.kill()
            p.wait()


def test_many_points_finishing_at_once_keep_the_ledger_consistent(ledger):
    """Configurations run in threads of one driver: their updates interleave on one connection."""
    import threading

    ids = [f"p{i}" for i in range(240)]
    sync(ledger, pts(*ids))
    errors: list[BaseException] = []

    def worker(chunk: list[str]) -> None:
        try:
            for pid in chunk:
                ledger.mark_running(pid, f"s-{chunk[0]}")
                if int(pid[1:]) % 7 == 0:
                    ledger.mark_failed(pid, "boom")
                else:
                    ledger.mark_done(pid, f"points/{pid}.json")
                ledger.counts()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(ids[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    failed = sum(1 for i in range(240) if i % 7 == 0)
    assert ledger.counts() == {"pending": 0, "running": 0, "done": 240 - failed, "failed": failed}
    assert all(p.attempts == 1 for p in ledger.points())


def test_a_ledger_from_before_provenance_gets_the_new_server_columns(tmp_path):
    """An older ledger (servers without nice, cpu_affinity, provenance) opens, keeps its rows, and takes
    the new facts."""
    path = tmp_path / LEDGER_FILE
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE servers (server_id TEXT PRIMARY KEY, serve_id TEXT NOT NULL, command TEXT NOT NULL,
          hostname TEXT, node_id TEXT, node_ip TEXT, port INTEGER, pid INTEGER, pid_create_time REAL,
          gpu_ids TEXT, started_at REAL NOT NULL, ready_at REAL, stopped_at REAL, state TEXT NOT NULL,
          error TEXT, log_tail TEXT);
        INSERT INTO servers(server_id, serve_id, command, started_at, state)
            VALUES ('old', 's1', 'vllm serve m', 1.0, 'stopped');
    """)
    conn.commit()
    conn.close()
    led = Ledger(path)
    try:
        old = led.servers()[0]
        assert (old.server_id, old.nice, old.cpu_affinity, old.provenance_record()) == ("old", None, None, None)
        led.update_server("old", nice="0", cpu_affinity="127.0.0.1=0-1",
                          provenance='{"vllm": "0.32.0", "hostname": "h"}')
        row = led.servers()[0]
        assert row.nice == "0" and row.cpu_affinity == "127.0.0.1=0-1"
        assert row.provenance_record() == {"vllm": "0.32.0", "hostname": "h"}
    finally:
        led.close()


def test_claim_gives_each_point_to_one_server_of_several(ledger):
    """Servers of one configuration share its points (placement.tail_replicas): a point goes to one."""
    import threading

    ids = [f"p{i}" for i in range(120)]
    sync(ledger, pts(*ids))
    taken: dict[str, list[str]] = {f"srv{k}": [] for k in range(4)}

    def server(name: str) -> None:
        for pid in ids:  # every server walks the whole list, as each starts with the runnable points it read
            if ledger.claim(pid, name, max_attempts=2) is not None:
                taken[name].append(pid)
                ledger.mark_done(pid, f"points/{pid}.json")

    threads = [threading.Thread(target=server, args=(n,)) for n in taken]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(p for ps in taken.values() for p in ps) == sorted(ids)      # each once
    assert all(p.attempts == 1 and p.server_id in taken for p in ledger.points())


def test_claim_takes_a_failed_point_with_attempts_left_but_not_one_running_or_done(ledger):
    sync(ledger, pts("failed", "running", "done", "spent"))
    for pid in ("failed", "running", "done", "spent"):
        ledger.mark_running(pid, "srv")
    ledger.mark_failed("failed", "x")
    ledger.mark_done("done", "r.json")
    ledger.mark_failed("spent", "x")
    assert ledger.claim("failed", "srv2", max_attempts=2) == 2
    assert ledger.claim("running", "srv2", max_attempts=2) is None
    assert ledger.claim("done", "srv2", max_attempts=2) is None
    assert ledger.claim("spent", "srv2", max_attempts=1) is None
    assert state(ledger, "running") == (PointState.RUNNING, 1) and state(ledger, "spent") == (PointState.FAILED, 1)


def test_connections_opening_a_new_ledger_at_once_all_succeed(tmp_path):
    """A driver creates its ledger while another process (`raysweep status`, a test's watcher) opens it: the
    columns added to older ledgers are added once, and no opener fails on another's addition."""
    import threading

    for attempt in range(15):
        path = tmp_path / f"l{attempt}" / LEDGER_FILE
        path.parent.mkdir()
        errors: list[BaseException] = []
        go = threading.Barrier(6)

        def open_it(path: Path, go: threading.Barrier, errors: list[BaseException]) -> None:
            try:
                go.wait()
                Ledger(path).close()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=open_it, args=(path, go, errors)) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors


def test_a_campaign_dir_opens_its_ledger_once_reads_its_records_and_closes_it(ledger, tmp_path):
    from raysweep.record.directory import CampaignDir

    sync(ledger, pts("p1", "p2"))
    ledger.mark_running("p1", "srv-1")
    (tmp_path / "points").mkdir()
    (tmp_path / "points" / "p1.json").write_text('{"point_id": "p1", "output_throughput": 12.5}')
    ledger.mark_done("p1", "points/p1.json")
    with CampaignDir(tmp_path) as directory:
        opened = directory.ledger
        assert directory.ledger is opened                       # opened once
        assert directory.records() == [{"point_id": "p1", "output_throughput": 12.5}]  # done points only
    with pytest.raises(sqlite3.ProgrammingError):
        opened.points()                                         # closed with the directory
    dropped = CampaignDir(tmp_path).ledger                      # one dropped unclosed closes its ledger too
    with pytest.raises(sqlite3.ProgrammingError):
        dropped.points()


def test_a_campaign_dir_without_a_ledger_says_so_and_creates_nothing(tmp_path):
    from raysweep.record.directory import CampaignDir

    with pytest.raises(LedgerError) as exc:
        CampaignDir(tmp_path).check()
    assert LEDGER_FILE in str(exc.value)
    assert list(tmp_path.iterdir()) == []


def test_a_directory_around_an_open_ledger_reads_through_it_and_leaves_it_open(ledger, tmp_path):
    """The run's stages read the campaign's directory through the driver's own ledger: no second one is opened,
    and neither closing nor dropping the directory closes the driver's."""
    from raysweep.record.directory import CampaignDir

    sync(ledger, pts("p1", "p2"))
    with CampaignDir.around(tmp_path, ledger) as directory:
        assert directory.ledger is ledger and directory.path == tmp_path
    assert directory._ledger is None  # let go of
    dropped = CampaignDir.around(tmp_path, ledger)
    del dropped
    assert ledger.counts()["pending"] == 2  # still open: the driver closes it
    own = CampaignDir(tmp_path)
    other = own.ledger
    own.close()
    with pytest.raises(sqlite3.ProgrammingError):  # a directory's own ledger is closed with it
        other.counts()

"""The durable ledger: one SQLite database (WAL) in the output directory.

It holds the campaign (as stored, secrets masked) and its fingerprint, every point with its state
(pending / running / done / failed), attempts, times, error and server-log tail and result file, every
server start, and which driver holds the campaign. Only a driver writes; `status` and `results` read.
"""

from __future__ import annotations

import json
import math
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from raysweep.errors import LedgerError

__all__ = ["CampaignHeld", "Ledger", "PointRow", "PointState", "ServerRow", "SyncReport", "LEDGER_FILE"]

LEDGER_FILE = "ledger.sqlite"
SCHEMA_VERSION = "1"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS points (
  point_id TEXT PRIMARY KEY,
  serve_id TEXT NOT NULL,
  bench_id TEXT NOT NULL,
  run INTEGER NOT NULL,
  serve_params TEXT NOT NULL,
  bench_params TEXT NOT NULL,
  in_plan INTEGER NOT NULL DEFAULT 1,
  state TEXT NOT NULL DEFAULT 'pending',
  attempts INTEGER NOT NULL DEFAULT 0,
  started_at REAL,
  ended_at REAL,
  server_id TEXT,
  error TEXT,
  log_tail TEXT,
  result_path TEXT,
  updated_at REAL NOT NULL,
  probe_of TEXT
);
CREATE INDEX IF NOT EXISTS points_by_serve ON points (serve_id, state);
CREATE TABLE IF NOT EXISTS sla_searches (
  serve_id TEXT NOT NULL,
  bench_id TEXT NOT NULL,
  target TEXT NOT NULL,
  state TEXT NOT NULL,
  largest_pass REAL,
  smallest_fail REAL,
  probes INTEGER NOT NULL,
  notes TEXT,
  metrics TEXT,
  updated_at REAL NOT NULL,
  PRIMARY KEY (serve_id, bench_id, target)
);
CREATE TABLE IF NOT EXISTS servers (
  server_id TEXT PRIMARY KEY,
  serve_id TEXT NOT NULL,
  command TEXT NOT NULL,
  hostname TEXT,
  node_id TEXT,
  node_ip TEXT,
  port INTEGER,
  pid INTEGER,
  pid_create_time REAL,
  gpu_ids TEXT,
  ranks TEXT,
  started_at REAL NOT NULL,
  ready_at REAL,
  stopped_at REAL,
  state TEXT NOT NULL,
  error TEXT,
  log_tail TEXT,
  log_path TEXT,
  transport TEXT,
  nice TEXT,
  cpu_affinity TEXT,
  provenance TEXT
);
CREATE TABLE IF NOT EXISTS events (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  at REAL NOT NULL,
  kind TEXT NOT NULL,
  serve_ids TEXT,
  nodes TEXT,
  detail TEXT
);
CREATE TABLE IF NOT EXISTS attempt_errors (
  point_id TEXT NOT NULL,
  attempt INTEGER NOT NULL,
  at REAL NOT NULL,
  server_id TEXT,
  error TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS drivers (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  hostname TEXT NOT NULL,
  pid INTEGER NOT NULL,
  pid_create_time REAL NOT NULL,
  started_at REAL NOT NULL,
  ended_at REAL,
  outcome TEXT,
  helpers TEXT
);
CREATE TABLE IF NOT EXISTS precision (
  serve_id TEXT NOT NULL,
  bench_id TEXT NOT NULL,
  state TEXT NOT NULL,
  runs_done INTEGER NOT NULL,
  runs_spent INTEGER NOT NULL,
  rel_half_width REAL,
  updated_at REAL NOT NULL,
  PRIMARY KEY (serve_id, bench_id)
);
CREATE TABLE IF NOT EXISTS workload_levels (
  serve_id TEXT NOT NULL,
  bench_id TEXT NOT NULL,
  variable TEXT NOT NULL,
  serial REAL,
  batch REAL,
  levels TEXT NOT NULL,
  state TEXT NOT NULL,
  decided_at REAL NOT NULL,
  PRIMARY KEY (serve_id, bench_id)
);
CREATE TABLE IF NOT EXISTS candidates (
  number INTEGER PRIMARY KEY,
  serve_id TEXT NOT NULL,
  params TEXT NOT NULL,
  state TEXT NOT NULL,
  objective TEXT,
  rungs TEXT,
  reason TEXT,
  gpu_count INTEGER NOT NULL DEFAULT 0,
  gpu_s REAL NOT NULL DEFAULT 0,
  created_at REAL NOT NULL,
  updated_at REAL NOT NULL
);
"""


class PointState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True)
class PointRow:
    point_id: str
    serve_id: str
    bench_id: str
    run: int
    serve_params: dict[str, Any]
    bench_params: dict[str, Any]
    in_plan: bool
    state: PointState
    attempts: int
    started_at: float | None
    ended_at: float | None
    server_id: str | None
    error: str | None
    log_tail: str | None
    result_path: str | None
    probe_of: str | None = None  # the bench point whose SLA search added this probe


@dataclass(frozen=True)
class ServerRow:
    server_id: str
    serve_id: str
    command: str
    hostname: str | None
    node_id: str | None
    node_ip: str | None
    port: int | None
    pid: int | None
    pid_create_time: float | None
    gpu_ids: str | None
    ranks: str | None  # JSON: one entry per node of a multi-node server (rank, node, pid, GPUs, log)
    started_at: float
    ready_at: float | None
    stopped_at: float | None
    state: str
    error: str | None
    log_tail: str | None
    log_path: str | None
    transport: str | None = None  # JSON: the NCCL transport verdict (raysweep.transport.server_verdict)
    nice: str | None = None  # the server process's niceness (the highest of its ranks)
    cpu_affinity: str | None = None  # its CPU affinity per node: "ip=0-3;ip=0-7"
    provenance: str | None = None  # JSON: versions, GPUs, model, hostnames (raysweep.provenance)
    fabric: str | None = None  # JSON: the all-reduce bandwidth probe before it started (raysweep.fabric)
    topology: str | None = None  # JSON: per node, its GPUs' NVLink / PCIe / NUMA topology and the TP warnings
    startup: str | None = None  # JSON: the phases of its start, from its log (raysweep.startup)

    def transport_verdict(self) -> dict[str, Any] | None:
        return dict(json.loads(self.transport)) if self.transport else None

    def fabric_record(self) -> dict[str, Any] | None:
        return dict(json.loads(self.fabric)) if self.fabric else None

    def topology_record(self) -> list[dict[str, Any]] | None:
        return list(json.loads(self.topology)) if self.topology else None

    def provenance_record(self) -> dict[str, Any] | None:
        return dict(json.loads(self.provenance)) if self.provenance else None

    def rank_list(self) -> list[dict[str, Any]]:
        """Every node's part of the server: rank, hostname, node_id, node_ip, pid, pid_create_time, gpu_ids."""
        if self.ranks:
            return list(json.loads(self.ranks))
        return [{"rank": 0, "hostname": self.hostname, "node_id": self.node_id, "node_ip": self.node_ip,
                 "pid": self.pid, "pid_create_time": self.pid_create_time, "gpu_ids": self.gpu_ids}]


class CampaignHeld(LedgerError):
    """Another driver that still runs holds the campaign."""

    def __init__(self, driver: dict[str, Any]) -> None:
        super().__init__(f"this campaign is being run by pid {driver['pid']} on {driver['hostname']}; wait for it, "
                         "stop it, or use --force if it is gone (nothing was changed in its output directory)")
        self.driver = driver


@dataclass(frozen=True)
class SyncReport:
    added: int
    in_plan: int
    out_of_plan: int
    fingerprint_changed: bool


_ADDED_COLUMNS = (("points", "probe_of"), ("servers", "ranks"), ("servers", "log_path"), ("drivers", "helpers"),
                  ("servers", "transport"), ("servers", "nice"), ("servers", "cpu_affinity"),
                  ("servers", "provenance"), ("servers", "fabric"), ("servers", "topology"), ("servers", "startup"))


class Ledger:
    """The SQLite ledger of one output directory. Thread-safe; every write is one transaction."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.RLock()
        self._conn = sqlite3.connect(self.path, check_same_thread=False, timeout=30)
        self._conn.row_factory = sqlite3.Row
        self._wal()
        self._conn.execute("PRAGMA synchronous=FULL")
        with self._tx() as c:
            c.executescript(_SCHEMA)
        if self._missing_columns():  # a ledger written before these columns existed
            with self._lock:
                # one opener at a time looks and adds: another connection may be opening it too (a driver
                # creating it while `raysweep status` reads it), and two additions of one column fail
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    for table, column in self._missing_columns():
                        self._conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} TEXT")
                except BaseException:
                    self._conn.rollback()
                    raise
                self._conn.commit()

    def _wal(self, timeout_s: float = 30.0) -> None:
        """Switch to WAL. On a new ledger another connection may be switching it at the same moment, which
        SQLite answers at once with "database is locked" (no busy wait): try again until one has."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def _missing_columns(self) -> list[tuple[str, str]]:
        return [(table, column) for table, column in _ADDED_COLUMNS
                if column not in {r[1] for r in self._conn.execute(f"PRAGMA table_info({table})")}]

    @classmethod
    def open_existing(cls, output_dir: str | Path) -> Ledger:
        path = Path(output_dir) / LEDGER_FILE
        if not path.is_file():
            raise LedgerError(f"{output_dir}: no raysweep ledger here ({LEDGER_FILE} is missing)")
        return cls(path)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock, self._conn:
            yield self._conn

    # -- campaign ------------------------------------------------------------------------------------

    def meta(self, key: str) -> str | None:
        with self._lock:
            row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row["value"] if row else None

    def set_meta(self, key: str, value: str) -> None:
        """Keep one value of the campaign's record (e.g. `measured_with`, raysweep.drift)."""
        with self._tx() as c:
            c.execute("INSERT INTO meta(key, value) VALUES(?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                      (key, value))

    def stored_campaign(self) -> dict[str, Any]:
        text = self.meta("campaign")
        if text is None:
            raise LedgerError(f"{self.path}: the ledger holds no campaign")
        return json.loads(text)

    def sync(self, *, name: str, fingerprint: str, meaning: dict[str, Any], campaign: dict[str, Any],
             campaign_file: str, points: list[tuple[str, str, str, int, dict[str, Any], dict[str, Any]]],
             force: bool = False, searches: Sequence[tuple[str, str]] = ()) -> SyncReport:
        """Record the campaign and its points: new points become pending, finished ones are kept.
        The probes of SLA searches (serve id, bench id) still in the plan stay in it.

        Refuses (unless `force`) when the stored campaign has another name or another fingerprint.
        """
        old_name, old_fp = self.meta("name"), self.meta("fingerprint")
        changed = old_fp is not None and old_fp != fingerprint
        if not force:
            if old_name is not None and old_name != name:
                raise LedgerError(f"{self.path.parent} holds campaign {old_name!r}, not {name!r}; "
                                  "use another output_dir, or --force to take it over")
            if changed:
                old = json.loads(self.meta("meaning") or "{}")
                diff = sorted(k for k in set(old) | set(meaning) if old.get(k) != meaning.get(k))
                raise LedgerError(f"the campaign changed in a way that changes the meaning of finished points "
                                  f"({', '.join(diff)} differ from the ledger); finished results would no longer "
                                  "match it. Use another output_dir, or --force to keep them anyway")
        now = time.time()
        with self._tx() as c:
            for key, value in (("name", name), ("fingerprint", fingerprint), ("meaning", json.dumps(meaning)),
                               ("campaign", json.dumps(campaign)), ("campaign_file", campaign_file),
                               ("schema_version", SCHEMA_VERSION)):
                c.execute("INSERT INTO meta(key, value) VALUES(?, ?)"
                          " ON CONFLICT(key) DO UPDATE SET value = excluded.value", (key, value))
            c.execute("INSERT OR IGNORE INTO meta(key, value) VALUES('created_at', ?)", (str(now),))
            before = c.execute("SELECT COUNT(*) FROM points").fetchone()[0]
            c.executemany(
                "INSERT OR IGNORE INTO points(point_id, serve_id, bench_id, run, serve_params, bench_params,"
                " updated_at) VALUES(?, ?, ?, ?, ?, ?, ?)",
                [(pid, sid, bid, run, json.dumps(sp), json.dumps(bp), now) for pid, sid, bid, run, sp, bp in points])
            added = c.execute("SELECT COUNT(*) FROM points").fetchone()[0] - before
            c.execute("UPDATE points SET in_plan = 0")
            c.executemany("UPDATE points SET in_plan = 1 WHERE point_id = ?", [(p[0],) for p in points])
            c.executemany("UPDATE points SET in_plan = 1 WHERE serve_id = ? AND probe_of = ?", list(searches))
            out = c.execute("SELECT COUNT(*) FROM points WHERE in_plan = 0").fetchone()[0]
        return SyncReport(added=added, in_plan=len(points), out_of_plan=out, fingerprint_changed=changed)

    # -- the driver that holds the campaign ----------------------------------------------------------

    def live_driver(self, is_alive: Any) -> dict[str, Any] | None:
        """The driver that holds the campaign and still runs (None when none does); reads only."""
        with self._lock:
            rows = self._conn.execute("SELECT * FROM drivers WHERE ended_at IS NULL ORDER BY id DESC").fetchall()
        return next((dict(r) for r in rows if is_alive(r["hostname"], r["pid"], r["pid_create_time"])), None)

    def acquire_driver(self, pid: int, pid_create_time: float, is_alive: Any, force: bool = False) -> int:
        """Register this driver; refuse if another live driver holds the campaign.

        `is_alive(hostname, pid, create_time)` says whether an earlier driver still runs.
        """
        host = socket.gethostname()
        with self._tx() as c:
            for row in c.execute("SELECT * FROM drivers WHERE ended_at IS NULL").fetchall():
                if not force and is_alive(row["hostname"], row["pid"], row["pid_create_time"]):
                    raise CampaignHeld(dict(row))
                c.execute("UPDATE drivers SET ended_at = ?, outcome = 'lost' WHERE id = ?", (time.time(), row["id"]))
            cur = c.execute("INSERT INTO drivers(hostname, pid, pid_create_time, started_at) VALUES(?, ?, ?, ?)",
                            (host, pid, pid_create_time, time.time()))
            return int(cur.lastrowid or 0)

    def record_driver_helpers(self, driver_id: int, helpers: list[tuple[int, float]]) -> None:
        """Remember the processes a driver started on its host (its embedded Ray), as (pid, create time),
        so that whoever finds the driver dead can stop them."""
        with self._tx() as c:
            c.execute("UPDATE drivers SET helpers = ? WHERE id = ?", (json.dumps(sorted(helpers)), driver_id))

    def lost_drivers(self) -> list[dict[str, Any]]:
        """Drivers that died without releasing the campaign (killed, crashed, their machine lost)."""
        with self._lock:
            return [dict(r) for r in self._conn.execute("SELECT * FROM drivers WHERE outcome = 'lost'").fetchall()]

    def drivers(self) -> list[dict[str, Any]]:
        """Every driver that held the campaign, oldest first, with its outcome (None while it runs)."""
        with self._lock:
            return [dict(r) for r in self._conn.execute("SELECT * FROM drivers ORDER BY id").fetchall()]

    def last_driver(self) -> dict[str, Any] | None:
        """The most recent driver of this campaign: hostname, pid, start time, end time and outcome."""
        with self._lock:
            row = self._conn.execute("SELECT * FROM drivers ORDER BY id DESC LIMIT 1").fetchone()
        return dict(row) if row else None

    def release_driver(self, driver_id: int, outcome: str) -> None:
        with self._tx() as c:
            c.execute("UPDATE drivers SET ended_at = ?, outcome = ? WHERE id = ?", (time.time(), outcome, driver_id))

    def recover(self) -> tuple[int, list[ServerRow]]:
        """After a driver died: running points go back to pending (the lost attempt is not counted), and the
        servers it left without a stop are returned (marked `lost`) so the caller can reap their processes."""
        with self._tx() as c:
            n = c.execute("UPDATE points SET state = 'pending', attempts = MAX(attempts - 1, 0), updated_at = ? "
                          "WHERE state = 'running'", (time.time(),)).rowcount
            rows = c.execute("SELECT * FROM servers WHERE stopped_at IS NULL").fetchall()
            c.execute("UPDATE servers SET state = 'lost', stopped_at = ? WHERE stopped_at IS NULL", (time.time(),))
        return n, [_server_row(r) for r in rows]

    # -- points --------------------------------------------------------------------------------------

    def points(self, *, serve_id: str | None = None, in_plan_only: bool = True) -> list[PointRow]:
        sql, args = "SELECT * FROM points WHERE 1 = 1", []
        if in_plan_only:
            sql += " AND in_plan = 1"
        if serve_id is not None:
            sql += " AND serve_id = ?"
            args.append(serve_id)
        with self._lock:
            rows = self._conn.execute(sql + " ORDER BY serve_id, bench_id, run", args).fetchall()
        return [_point_row(r) for r in rows]

    def runnable(self, serve_id: str, max_attempts: int) -> list[PointRow]:
        """Points of a server config still to run: pending, or failed with attempts left."""
        return [p for p in self.points(serve_id=serve_id)
                if p.state == PointState.PENDING or (p.state == PointState.FAILED and p.attempts < max_attempts)]

    def claim(self, point_id: str, server_id: str, max_attempts: int) -> int | None:
        """Mark a point running on a server only if it is still to run (pending, or failed with attempts
        left), in one transaction: of several servers of one configuration, one takes each point. Returns
        its attempt number, or None when another server has it (or it is done)."""
        with self._tx() as c:
            cur = c.execute("UPDATE points SET state = 'running', attempts = attempts + 1, started_at = ?, "
                            "ended_at = NULL, server_id = ?, updated_at = ? WHERE point_id = ? AND "
                            "(state = 'pending' OR (state = 'failed' AND attempts < ?))",
                            (time.time(), server_id, time.time(), point_id, max_attempts))
            if cur.rowcount != 1:
                return None
            return int(c.execute("SELECT attempts FROM points WHERE point_id = ?", (point_id,)).fetchone()[0])

    def mark_running(self, point_id: str, server_id: str) -> int:
        with self._tx() as c:
            c.execute("UPDATE points SET state = 'running', attempts = attempts + 1, started_at = ?, ended_at = NULL,"
                      " server_id = ?, updated_at = ? WHERE point_id = ?",
                      (time.time(), server_id, time.time(), point_id))
            return int(c.execute("SELECT attempts FROM points WHERE point_id = ?", (point_id,)).fetchone()[0])

    def mark_done(self, point_id: str, result_path: str) -> None:
        """A point is done only once its result file is in place (the caller writes it first)."""
        with self._tx() as c:
            c.execute("UPDATE points SET state = 'done', ended_at = ?, result_path = ?, error = NULL, log_tail = NULL,"
                      " updated_at = ? WHERE point_id = ?", (time.time(), result_path, time.time(), point_id))

    def mark_failed(self, point_id: str, error: str, log_tail: str | None = None, started: bool = True) -> None:
        """A failed attempt. `started=False` for a point that never ran (its server did not start): the
        attempt is counted here, since `mark_running` did not count it."""
        with self._tx() as c:
            c.execute("UPDATE points SET state = 'failed', ended_at = ?, error = ?, log_tail = ?, updated_at = ?,"
                      " attempts = attempts + ? WHERE point_id = ?",
                      (time.time(), error, log_tail, time.time(), 0 if started else 1, point_id))
            self._keep_error(c, point_id, error)

    def _keep_error(self, c: sqlite3.Connection, point_id: str, error: str) -> None:
        """An attempt's error, kept after the point later succeeds (`attempt_errors`)."""
        row = c.execute("SELECT attempts, server_id FROM points WHERE point_id = ?", (point_id,)).fetchone()
        if row is not None:
            c.execute("INSERT INTO attempt_errors(point_id, attempt, at, server_id, error) VALUES(?, ?, ?, ?, ?)",
                      (point_id, row["attempts"], time.time(), row["server_id"], error))

    def attempt_errors(self, point_id: str | None = None) -> list[dict[str, Any]]:
        """The errors of failed attempts, oldest first (of one point, or all)."""
        sql = "SELECT * FROM attempt_errors"
        args: tuple[str, ...] = ()
        if point_id is not None:
            sql, args = sql + " WHERE point_id = ?", (point_id,)
        with self._lock:
            return [dict(r) for r in self._conn.execute(sql + " ORDER BY at", args).fetchall()]

    def add_event(self, kind: str, serve_ids: list[str], nodes: list[str], detail: str) -> None:
        """A cluster event (`node_lost`, `replaced`, `replica`): when, which configurations, which nodes, what."""
        with self._tx() as c:
            c.execute("INSERT INTO events(at, kind, serve_ids, nodes, detail) VALUES(?, ?, ?, ?, ?)",
                      (time.time(), kind, ",".join(serve_ids), ",".join(nodes), detail))

    def events(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._conn.execute("SELECT * FROM events ORDER BY id").fetchall()
        return [{**dict(r), "serve_ids": [x for x in (r["serve_ids"] or "").split(",") if x],
                 "nodes": [x for x in (r["nodes"] or "").split(",") if x]} for r in rows]

    def requeue(self, point_id: str, error: str, max_attempts: int) -> None:
        """A running point lost to its node or host (not to itself): the attempt counts, and it goes back to
        pending while attempts are left (else it stays failed), with the reason kept."""
        with self._tx() as c:
            c.execute("UPDATE points SET state = CASE WHEN attempts < ? THEN 'pending' ELSE 'failed' END, ended_at = ?,"
                      " error = ?, updated_at = ? WHERE point_id = ?",
                      (max_attempts, time.time(), error, time.time(), point_id))
            self._keep_error(c, point_id, error)

    def give_up(self, point_id: str, error: str, max_attempts: int) -> None:
        """Fail a point for good (its configuration can no longer run): no attempts left, the reason kept."""
        with self._tx() as c:
            c.execute("UPDATE points SET state = 'failed', attempts = MAX(attempts, ?), ended_at = ?, error = ?,"
                      " updated_at = ? WHERE point_id = ?", (max_attempts, time.time(), error, time.time(), point_id))

    def mark_pending(self, point_id: str, count_attempt: bool = False) -> None:
        with self._tx() as c:
            c.execute("UPDATE points SET state = 'pending', updated_at = ?, attempts = attempts + ? WHERE point_id = ?",
                      (time.time(), 0 if count_attempt else -1, point_id))

    def retry_failed(self) -> int:
        """Give every failed point of the plan a fresh set of attempts; returns how many."""
        with self._tx() as c:
            return c.execute("UPDATE points SET state = 'pending', attempts = 0, updated_at = ? "
                             "WHERE state = 'failed' AND in_plan = 1", (time.time(),)).rowcount

    def counts(self) -> dict[str, int]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT state, COUNT(*) n FROM points WHERE in_plan = 1 GROUP BY state").fetchall()
        out = {s.value: 0 for s in PointState}
        out.update({r["state"]: r["n"] for r in rows})
        return out

    def add_probes(self, probe_of: str, points: list[tuple[str, str, str, int, dict[str, Any], dict[str, Any]]]
                   ) -> None:
        """Points an SLA search of bench point `probe_of` decided to run (kept if already there)."""
        now = time.time()
        with self._tx() as c:
            c.executemany(
                "INSERT OR IGNORE INTO points(point_id, serve_id, bench_id, run, serve_params, bench_params,"
                " updated_at, probe_of) VALUES(?, ?, ?, ?, ?, ?, ?, ?)",
                [(pid, sid, bid, run, json.dumps(sp), json.dumps(bp), now, probe_of)
                 for pid, sid, bid, run, sp, bp in points])

    def point(self, point_id: str) -> PointRow | None:
        with self._lock:
            r = self._conn.execute("SELECT * FROM points WHERE point_id = ?", (point_id,)).fetchone()
        return _point_row(r) if r else None

    def record_search(self, serve_id: str, bench_id: str, target: str, state: str, largest_pass: float | None,
                      smallest_fail: float | None, probes: int, notes: list[str], metrics: dict[str, Any]) -> None:
        with self._tx() as c:
            c.execute("INSERT INTO sla_searches VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(serve_id, bench_id, "
                      "target) DO UPDATE SET state = excluded.state, largest_pass = excluded.largest_pass, "
                      "smallest_fail = excluded.smallest_fail, probes = excluded.probes, notes = excluded.notes, "
                      "metrics = excluded.metrics, updated_at = excluded.updated_at",
                      (serve_id, bench_id, target, state, _finite(largest_pass), _finite(smallest_fail), probes,
                       json.dumps(notes), json.dumps(metrics, default=str), time.time()))

    def searches(self) -> list[dict[str, Any]]:
        """Every finished SLA search: serve and bench ids, target, state, bounds (None = unbounded), probes."""
        with self._lock:
            rows = self._conn.execute("SELECT * FROM sla_searches ORDER BY serve_id, bench_id, target").fetchall()
        return [{**dict(r), "notes": json.loads(r["notes"] or "[]"), "metrics": json.loads(r["metrics"] or "{}")}
                for r in rows]

    def out_of_plan(self) -> int:
        with self._lock:
            return int(self._conn.execute("SELECT COUNT(*) FROM points WHERE in_plan = 0").fetchone()[0])

    # -- servers -------------------------------------------------------------------------------------

    def add_server(self, server_id: str, serve_id: str, command: str) -> None:
        with self._tx() as c:
            c.execute("INSERT INTO servers(server_id, serve_id, command, started_at, state)"
                      " VALUES(?, ?, ?, ?, 'starting')",
                      (server_id, serve_id, command, time.time()))

    def update_server(self, server_id: str, **fields: Any) -> None:
        allowed = set(ServerRow.__dataclass_fields__) - {"server_id", "serve_id", "started_at"}
        bad = set(fields) - allowed
        if bad:
            raise ValueError(f"unknown server fields: {sorted(bad)}")
        cols = ", ".join(f"{k} = ?" for k in fields)
        with self._tx() as c:
            c.execute(f"UPDATE servers SET {cols} WHERE server_id = ?", (*fields.values(), server_id))

    def servers(self, *, active_only: bool = False) -> list[ServerRow]:
        sql = "SELECT * FROM servers" + (" WHERE stopped_at IS NULL" if active_only else "") + " ORDER BY started_at"
        with self._lock:
            return [_server_row(r) for r in self._conn.execute(sql).fetchall()]


    # -- bench.precision (raysweep.sequential) ---------------------------------------------------------

    def record_precision(self, serve_id: str, bench_id: str, state: str, runs_done: int, runs_spent: int,
                         rel_half_width: float | None) -> None:
        """Where a point of a `bench.precision` campaign stands: measuring, reached or max_runs."""
        with self._tx() as c:
            c.execute("INSERT INTO precision VALUES(?, ?, ?, ?, ?, ?, ?) ON CONFLICT(serve_id, bench_id) DO UPDATE "
                      "SET state = excluded.state, runs_done = excluded.runs_done, runs_spent = excluded.runs_spent,"
                      " rel_half_width = excluded.rel_half_width, updated_at = excluded.updated_at",
                      (serve_id, bench_id, state, runs_done, runs_spent, _finite(rel_half_width), time.time()))

    def precision(self) -> list[dict[str, Any]]:
        """Every recorded precision state: serve and bench ids, state, runs done and spent, rel_half_width."""
        with self._lock:
            rows = self._conn.execute("SELECT * FROM precision ORDER BY serve_id, bench_id").fetchall()
        return [dict(r) for r in rows]

    # -- bench.workload (raysweep.workload_levels) -----------------------------------------------------

    def record_workload_levels(self, serve_id: str, bench_id: str, variable: str, serial: float | None,
                               batch: float | None, levels: list[int], state: str, replace: bool = False) -> None:
        """The load levels decided for a bench point of a configuration; the first decision stays (unless
        `replace`: endpoints that failed and ran again later)."""
        with self._tx() as c:
            c.execute(f"INSERT OR {'REPLACE' if replace else 'IGNORE'} INTO workload_levels "
                      "VALUES(?, ?, ?, ?, ?, ?, ?, ?)",
                      (serve_id, bench_id, variable, serial, batch, json.dumps([int(v) for v in levels]), state,
                       time.time()))

    def workload_levels(self, serve_id: str, bench_id: str) -> dict[str, Any] | None:
        """The decision for one (configuration, bench point), or None before it."""
        with self._lock:
            r = self._conn.execute("SELECT * FROM workload_levels WHERE serve_id = ? AND bench_id = ?",
                                   (serve_id, bench_id)).fetchone()
        return _levels_row(r) if r else None

    def all_workload_levels(self) -> list[dict[str, Any]]:
        """Every decision: serve and bench ids, variable, serial, batch, levels (a list), state, decided_at."""
        with self._lock:
            rows = self._conn.execute("SELECT * FROM workload_levels ORDER BY serve_id, bench_id").fetchall()
        return [_levels_row(r) for r in rows]

    # -- tuning candidates (raysweep.tune) ------------------------------------------------------------

    def add_points(self, points: list[tuple[str, str, str, int, dict[str, Any], dict[str, Any]]]) -> None:
        """Points added to the plan while the campaign runs (a tuning candidate's); kept if already there."""
        now = time.time()
        with self._tx() as c:
            c.executemany(
                "INSERT OR IGNORE INTO points(point_id, serve_id, bench_id, run, serve_params, bench_params,"
                " updated_at) VALUES(?, ?, ?, ?, ?, ?, ?)",
                [(pid, sid, bid, run, json.dumps(sp), json.dumps(bp), now) for pid, sid, bid, run, sp, bp in points])
            c.executemany("UPDATE points SET in_plan = 1 WHERE point_id = ?", [(p[0],) for p in points])

    def drop_unfinished(self, serve_id: str) -> int:
        """Take a configuration's points that will not run (a stopped candidate's) out of the plan."""
        with self._tx() as c:
            return c.execute("UPDATE points SET in_plan = 0, updated_at = ? WHERE serve_id = ? AND state IN "
                             "('pending', 'failed')", (time.time(), serve_id)).rowcount

    def save_candidate(self, number: int, *, serve_id: str, params: dict[str, Any], state: str,
                       objective: list[float] | None = None, rungs: dict[str, Any] | None = None,
                       reason: str | None = None, gpu_count: int = 0, gpu_s: float = 0.0) -> None:
        """Insert or update one tuning candidate (its number is the sampler's trial number)."""
        now = time.time()
        with self._tx() as c:
            c.execute("INSERT INTO candidates(number, serve_id, params, state, objective, rungs, reason, gpu_count, "
                      "gpu_s, created_at, updated_at) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(number) DO "
                      "UPDATE SET state = excluded.state, objective = excluded.objective, rungs = excluded.rungs, "
                      "reason = excluded.reason, gpu_s = excluded.gpu_s, updated_at = excluded.updated_at",
                      (number, serve_id, json.dumps(params), state,
                       None if objective is None else json.dumps(objective), json.dumps(rungs or {}), reason,
                       gpu_count, gpu_s, now, now))

    def candidates(self) -> list[dict[str, Any]]:
        """Every tuning candidate, by number: params, state, objective (list or None), rungs, reason, GPU-seconds."""
        with self._lock:
            rows = self._conn.execute("SELECT * FROM candidates ORDER BY number").fetchall()
        out = []
        for r in rows:
            d = dict(r)
            d["params"] = json.loads(d["params"])
            d["objective"] = None if d["objective"] is None else json.loads(d["objective"])
            d["rungs"] = json.loads(d["rungs"] or "{}")
            out.append(d)
        return out


def _finite(v: float | None) -> float | None:
    return v if v is None or math.isfinite(v) else None


def _levels_row(r: sqlite3.Row) -> dict[str, Any]:
    d = dict(r)
    d["levels"] = json.loads(d["levels"])
    return d


def _point_row(r: sqlite3.Row) -> PointRow:
    d = dict(r)
    d["serve_params"] = json.loads(d["serve_params"])
    d["bench_params"] = json.loads(d["bench_params"])
    d["in_plan"] = bool(d["in_plan"])
    d["state"] = PointState(d["state"])
    d.pop("updated_at")
    return PointRow(**d)


def _server_row(r: sqlite3.Row) -> ServerRow:
    return ServerRow(**dict(r))

"""The ledger's database: its tables, the columns added since the first release, the connection (WAL,
one lock, one transaction per write) and the insertion of plan points that every writer shares."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self

from raysweep.errors import LedgerError

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
  probe_of TEXT,
  tried TEXT
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


_ADDED_COLUMNS = (("points", "probe_of"), ("points", "tried"), ("servers", "ranks"), ("servers", "log_path"),
                  ("drivers", "helpers"),
                  ("servers", "transport"), ("servers", "nice"), ("servers", "cpu_affinity"),
                  ("servers", "provenance"), ("servers", "fabric"), ("servers", "topology"), ("servers", "startup"),
                  ("servers", "role_settings"))

PointTuple = tuple[str, str, str, int, dict[str, Any], dict[str, Any]]
"""A plan point as written: point id, serve id, bench id, run, serve params, bench params."""


def insert_points(c: sqlite3.Connection, points: list[PointTuple], probe_of: str | None = None) -> None:
    """Add points to the `points` table as pending; a point already there is kept as it is."""
    now = time.time()
    c.executemany(
        "INSERT OR IGNORE INTO points(point_id, serve_id, bench_id, run, serve_params, bench_params,"
        " updated_at, probe_of) VALUES(?, ?, ?, ?, ?, ?, ?, ?)",
        [(pid, sid, bid, run, json.dumps(sp), json.dumps(bp), now, probe_of)
         for pid, sid, bid, run, sp, bp in points])


class Store:
    """The SQLite database of one output directory. Thread-safe; every write is one transaction."""

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
    def open_existing(cls, output_dir: str | Path) -> Self:
        path = Path(output_dir) / LEDGER_FILE
        if not path.is_file():
            raise LedgerError(f"{output_dir}: no raysweep ledger here ({LEDGER_FILE} is missing)")
        return cls(path)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock, self._conn:
            yield self._conn

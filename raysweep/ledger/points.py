"""The points of the plan and their transitions: pending, claimed and running, done, failed (with the
error of every attempt kept), requeued or given up; the reads of their rows and counts."""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from raysweep.ledger.rows import PointRow, PointState, point_row
from raysweep.ledger.store import PointTuple, Store, insert_points


class PointLedger(Store):
    """Points and the moves between their states."""

    def points(self, *, serve_id: str | None = None, in_plan_only: bool = True) -> list[PointRow]:
        sql, args = "SELECT * FROM points WHERE 1 = 1", []
        if in_plan_only:
            sql += " AND in_plan = 1"
        if serve_id is not None:
            sql += " AND serve_id = ?"
            args.append(serve_id)
        with self._lock:
            rows = self._conn.execute(sql + " ORDER BY serve_id, bench_id, run", args).fetchall()
        return [point_row(r) for r in rows]

    def finished(self) -> tuple[int, float]:
        """The plan's done points, and when the last of its points ended (0.0: none): what tells whether a file
        written from the results is still fresh, in one query instead of every point's row."""
        with self._lock:
            done, last = self._conn.execute("SELECT COALESCE(SUM(state = 'done'), 0), COALESCE(MAX(ended_at), 0.0) "
                                            "FROM points WHERE in_plan = 1").fetchone()
        return int(done), float(last)

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
            c.execute("UPDATE points SET state = 'failed', tried = COALESCE(tried, attempts),"
                      " attempts = MAX(attempts, ?), ended_at = ?, error = ?, updated_at = ? WHERE point_id = ?",
                      (max_attempts, time.time(), error, time.time(), point_id))

    def mark_pending(self, point_id: str, count_attempt: bool = False) -> None:
        with self._tx() as c:
            c.execute("UPDATE points SET state = 'pending', updated_at = ?, attempts = attempts + ? WHERE point_id = ?",
                      (time.time(), 0 if count_attempt else -1, point_id))

    def retry_failed(self) -> int:
        """Give every failed point of the plan a fresh set of attempts; returns how many."""
        with self._tx() as c:
            return c.execute("UPDATE points SET state = 'pending', attempts = 0, tried = NULL, updated_at = ? "
                             "WHERE state = 'failed' AND in_plan = 1", (time.time(),)).rowcount

    def counts(self) -> dict[str, int]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT state, COUNT(*) n FROM points WHERE in_plan = 1 GROUP BY state").fetchall()
        out = {s.value: 0 for s in PointState}
        out.update({r["state"]: r["n"] for r in rows})
        return out

    def add_probes(self, probe_of: str, points: list[PointTuple]) -> None:
        """Points an SLA search of bench point `probe_of` decided to run (kept if already there)."""
        with self._tx() as c:
            insert_points(c, points, probe_of)

    def point(self, point_id: str) -> PointRow | None:
        with self._lock:
            r = self._conn.execute("SELECT * FROM points WHERE point_id = ?", (point_id,)).fetchone()
        return point_row(r) if r else None

    def out_of_plan(self) -> int:
        with self._lock:
            return int(self._conn.execute("SELECT COUNT(*) FROM points WHERE in_plan = 0").fetchone()[0])
    def add_points(self, points: list[PointTuple]) -> None:
        """Points added to the plan while the campaign runs (a tuning candidate's); kept if already there."""
        with self._tx() as c:
            insert_points(c, points)
            c.executemany("UPDATE points SET in_plan = 1 WHERE point_id = ?", [(p[0],) for p in points])

    def drop_unfinished(self, serve_id: str) -> int:
        """Take a configuration's points that will not run (a stopped candidate's) out of the plan."""
        with self._tx() as c:
            return c.execute("UPDATE points SET in_plan = 0, updated_at = ? WHERE serve_id = ? AND state IN "
                             "('pending', 'failed')", (time.time(), serve_id)).rowcount


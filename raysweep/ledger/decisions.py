"""What the campaign decided while it ran, kept so that a resume takes it up: SLA searches
(raysweep.sla.probe), `bench.precision` states (raysweep.drive.sequential), `bench.workload` load levels
(raysweep.levels.search) and tuning candidates (raysweep.tune)."""

from __future__ import annotations

import json
import time
from typing import Any

from raysweep.ledger.rows import finite, levels_row
from raysweep.ledger.store import Store


class DecisionLedger(Store):
    """SLA searches, precision states, load levels and tuning candidates."""

    def record_search(self, serve_id: str, bench_id: str, target: str, state: str, largest_pass: float | None,
                      smallest_fail: float | None, probes: int, notes: list[str], metrics: dict[str, Any]) -> None:
        with self._tx() as c:
            c.execute("INSERT INTO sla_searches VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(serve_id, bench_id, "
                      "target) DO UPDATE SET state = excluded.state, largest_pass = excluded.largest_pass, "
                      "smallest_fail = excluded.smallest_fail, probes = excluded.probes, notes = excluded.notes, "
                      "metrics = excluded.metrics, updated_at = excluded.updated_at",
                      (serve_id, bench_id, target, state, finite(largest_pass), finite(smallest_fail), probes,
                       json.dumps(notes), json.dumps(metrics, default=str), time.time()))

    def searches(self) -> list[dict[str, Any]]:
        """Every finished SLA search: serve and bench ids, target, state, bounds (None = unbounded), probes."""
        with self._lock:
            rows = self._conn.execute("SELECT * FROM sla_searches ORDER BY serve_id, bench_id, target").fetchall()
        return [{**dict(r), "notes": json.loads(r["notes"] or "[]"), "metrics": json.loads(r["metrics"] or "{}")}
                for r in rows]

    # -- bench.precision (raysweep.drive.sequential) ---------------------------------------------------------

    def record_precision(self, serve_id: str, bench_id: str, state: str, runs_done: int, runs_spent: int,
                         rel_half_width: float | None) -> None:
        """Where a point of a `bench.precision` campaign stands: measuring, reached or max_runs."""
        with self._tx() as c:
            c.execute("INSERT INTO precision VALUES(?, ?, ?, ?, ?, ?, ?) ON CONFLICT(serve_id, bench_id) DO UPDATE "
                      "SET state = excluded.state, runs_done = excluded.runs_done, runs_spent = excluded.runs_spent,"
                      " rel_half_width = excluded.rel_half_width, updated_at = excluded.updated_at",
                      (serve_id, bench_id, state, runs_done, runs_spent, finite(rel_half_width), time.time()))

    def precision(self) -> list[dict[str, Any]]:
        """Every recorded precision state: serve and bench ids, state, runs done and spent, rel_half_width."""
        with self._lock:
            rows = self._conn.execute("SELECT * FROM precision ORDER BY serve_id, bench_id").fetchall()
        return [dict(r) for r in rows]

    # -- bench.workload (raysweep.levels.search) -----------------------------------------------------

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
        return levels_row(r) if r else None

    def all_workload_levels(self) -> list[dict[str, Any]]:
        """Every decision: serve and bench ids, variable, serial, batch, levels (a list), state, decided_at."""
        with self._lock:
            rows = self._conn.execute("SELECT * FROM workload_levels ORDER BY serve_id, bench_id").fetchall()
        return [levels_row(r) for r in rows]

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


"""The runs `bench.precision` adds to a point, one at a time, exactly once.

The plan holds a point's first `min_runs` runs (run numbers 0..min_runs-1, ids as for `runs:`). When the
last unfinished run of a point ends (done, or failed with no attempt left), `settle` reads the metric of
its done runs (and their measured durations, for `max_duration_s`) from their result files and applies
the stopping rule (`raysweep.maths.precision.decide`); a
point still measuring gets its next run number, whose id is the same hash of (serve, bench, run) as any
other run: it is inserted into the ledger with INSERT OR IGNORE, so two servers of one configuration
deciding at once add one run, and a run already done is never run again. The decision is recorded in
the ledger's `precision` table (state, runs with values, runs spent, relative half-width), which
`status`, the summary and the report read.

On resume, `restore_plan` puts the runs added before back into the plan (they are in the ledger, not
in the expanded grid), and `settle_all` decides the points whose last run ended just before the driver
died, before anything starts.
"""

from __future__ import annotations

import json
import logging
import math
from typing import TYPE_CHECKING, Any

from raysweep.drive.state import RunState
from raysweep.ledger import Ledger, PointRow, PointState
from raysweep.maths.precision import Decision, PrecisionSpec, decide
from raysweep.plan.plan import Plan, PointRun, ServeConfig, point_id

if TYPE_CHECKING:
    from raysweep.campaign.models import Campaign

__all__ = ["precision_of", "restore_plan", "run_seconds", "run_values", "settle", "settle_all"]

log = logging.getLogger(__name__)


def precision_of(campaign: Campaign) -> PrecisionSpec | None:
    """The campaign's `bench.precision`, or None."""
    bench = getattr(campaign, "bench", None)
    return getattr(bench, "precision", None) if bench is not None else None


def restore_plan(plan: Plan, ledger: Ledger) -> int:
    """Put the runs earlier drivers added (run numbers min_runs..max_runs-1 of points still in the plan)
    back into the plan; returns how many."""
    spec = precision_of(plan.spec.campaign)
    if spec is None:
        return 0
    first = {(p.serve.id, p.bench.id): p for p in plan.points}
    have = {p.id for p in plan.points}
    extra = []
    for row in ledger.points(in_plan_only=False):
        base = first.get((row.serve_id, row.bench_id))
        if base is None or row.point_id in have or not spec.min_runs <= row.run < spec.max_runs:
            continue
        if row.point_id == point_id(row.serve_id, row.bench_id, row.run):
            extra.append(PointRun(id=row.point_id, serve=base.serve, bench=base.bench, run=row.run))
    plan.add_runs(extra)
    return len(extra)


def done_records(work: RunState, rows: list[PointRow]) -> list[dict[str, Any]]:
    """The result records of a point's done runs, in run order (unreadable ones left out, with a warning)."""
    records = []
    for row in sorted(rows, key=lambda r: r.run):
        if row.state != PointState.DONE:
            continue
        try:
            records.append(json.loads((work.output_dir / (row.result_path or "")).read_text()))
        except (OSError, ValueError) as exc:
            log.warning("run %s of point %s/%s: result unreadable (%s)", row.run, row.serve_id, row.bench_id, exc)
    return records


def _number(record: dict[str, Any], key: str) -> float:
    value = record.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def run_values(work: RunState, rows: list[PointRow], metric: str) -> list[float]:
    """The metric of a point's done runs, in run order, from their result files (nan where missing)."""
    return [_number(r, metric) for r in done_records(work, rows)]


def run_seconds(work: RunState, rows: list[PointRow]) -> float:
    """The measured run time of a point's done runs: their `duration` (s) added up (`max_duration_s`)."""
    return float(sum(d for d in (_number(r, "duration") for r in done_records(work, rows)) if math.isfinite(d)))


def _unfinished(row: PointRow, max_attempts: int) -> bool:
    return row.state in (PointState.PENDING, PointState.RUNNING) or (
        row.state == PointState.FAILED and row.attempts < max_attempts)


def settle(work: RunState, serve: ServeConfig, bench_id: str, announce: bool = True) -> PointRun | None:
    """Decide a point whose runs have all ended; returns the run it adds (already in the ledger and the
    plan), or None (reached, at max_runs, runs still to end, or not a precision campaign)."""
    spec = precision_of(work.c)
    if spec is None:
        return None
    rows = [r for r in work.ledger.points(serve_id=serve.id) if r.bench_id == bench_id]
    if not rows or any(_unfinished(r, work.c.max_attempts) for r in rows):
        return None
    spent = max(r.run for r in rows) + 1
    decision = decide(run_values(work, rows, spec.metric), spent, spec, run_seconds(work, rows))
    work.ledger.record_precision(serve.id, bench_id, decision.state, decision.runs_done, spent,
                                 decision.rel_half_width)
    if not decision.wants_more:
        if announce:
            _announce(work, serve, bench_id, decision, spec)
        return None
    base = next(p for p in work.plan.points_of(serve.id) if p.bench.id == bench_id)
    nxt = PointRun(id=point_id(serve.id, bench_id, spent), serve=serve, bench=base.bench, run=spent)
    work.ledger.add_points([(nxt.id, serve.id, bench_id, spent, serve.params, base.bench.params)])
    work.plan.add_runs([nxt])
    log.info("point %s/%s: %s: run %d added", serve.id, bench_id, decision.text(spec), spent)
    return nxt


def _announce(work: RunState, serve: ServeConfig, bench_id: str, decision: Decision, spec: PrecisionSpec) -> None:
    log.info("point %s/%s: %s after %d run(s): %s", serve.id, bench_id, decision.state, decision.runs_done,
             decision.text(spec))
    work.emit("precision", serve=serve, bench_id=bench_id, state=decision.state, runs_done=decision.runs_done,
              rel_half_width=decision.rel_half_width, target=spec.rel_half_width, metric=spec.metric,
              text=decision.text(spec), drift=decision.drift)


def settle_all(work: RunState) -> int:
    """`settle` every point of the plan (at the start of a run: a driver may have died between a point's
    last run and its decision); returns how many runs it added."""
    if precision_of(work.c) is None:
        return 0
    pairs = {(p.serve.id, p.bench.id): p.serve for p in work.plan.points
             if p.bench.id not in work.plan.confirm_ids}  # the confirmation's runs are fixed (raysweep.confirm)
    return sum(settle(work, serve, bench_id, announce=False) is not None for (_, bench_id), serve in pairs.items())

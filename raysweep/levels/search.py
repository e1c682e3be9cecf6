"""`bench.workload`: load levels found from the server itself, as `vllm bench sweep serve_workload` finds them.

A campaign with `bench: {workload: {variable: request_rate, levels: 10}}` runs, per server configuration
and bench point of its grid (the *base* point), first two endpoint points:
- serial: the base with `max_concurrency: 1` and the variable set to 1;
- batch: the base with `max_concurrency` and the variable set to the point's prompt count (every request
  at once);
then `levels - 2` levels of the variable between what those two achieved, computed exactly as vLLM's
`explore_comb_workloads` does (`levels_between`): the achieved value of one run is its request throughput
(`request_rate`) or request throughput x mean E2EL (`max_concurrency`, Little's law); the serial value is
the ceiling of its runs' mean, the batch value the floor; the levels are
`sorted(set(round(v) for v in numpy.linspace(serial, batch, levels)[1:-1]))` (so a narrow range gives
fewer, never repeated, levels). A level point is the base with only the variable set.

The levels are decided when both endpoints' runs have all ended (done, or failed with no attempt left;
with `bench.precision` when both were decided), by `settle`, which the config's run loop calls after
every point, as it calls `raysweep.drive.sequential.settle`: the decision goes to the ledger's `workload_levels`
table (first writer wins, so two servers of one configuration decide once), the level points' runs are
inserted with the same stable ids as any other run (INSERT OR IGNORE) and added to the plan. A resumed
campaign reads the table (`restore_plan`) and runs the same levels; `settle_all` decides, before anything
starts, the endpoints a dead driver left ended but undecided. Endpoints with no done run decide no level
(vLLM's sweep skips them too), recorded as such.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from raysweep.bench.load import CONCURRENCY, RATE
from raysweep.campaign.levels import (
    BATCH,
    DECIDED,
    LEVEL,
    NO_ENDPOINTS,
    SERIAL,
    WorkloadSpec,
    achieved,
    check_workload,
    dataset_size,
    dry_run_lines,
    levels_between,
    status_lines,
    workload_of,
)
from raysweep.drive.sequential import done_records
from raysweep.plan.plan import (
    BenchPoint,
    Plan,
    PointRun,
    ServeConfig,
    endpoint_benches,
    first_runs,
    level_bench,
    point_id,
)

if TYPE_CHECKING:
    from raysweep.drive.state import RunState
    from raysweep.ledger import Ledger, PointRow
    from raysweep.record.directory import CampaignDir

__all__ = ["BATCH", "LEVEL", "SERIAL", "WorkloadSpec", "achieved", "check_workload", "dataset_size",
           "dry_run_lines", "endpoint_benches", "level_bench", "levels_between", "pending", "report_section",
           "restore_plan", "search_probes", "settle", "settle_all", "status_lines", "workload_of"]

log = logging.getLogger(__name__)

_lock = threading.Lock()


# -- deciding them while the campaign runs ----------------------------------------------------------

def _unfinished(row: PointRow, max_attempts: int) -> bool:
    from raysweep.ledger import PointState

    return row.state in (PointState.PENDING, PointState.RUNNING) or (
        row.state == PointState.FAILED and row.attempts < max_attempts)


def _level_runs(plan: Plan, serve: ServeConfig, base: BenchPoint, values: list[int]) -> list[PointRun]:
    runs = []
    for v in values:
        b = level_bench(plan.spec, base, v)
        runs += [PointRun(id=point_id(serve.id, b.id, r), serve=serve, bench=b, run=r)
                 for r in range(first_runs(plan.spec))]
    return runs


def _add_to_plan(plan: Plan, runs: list[PointRun]) -> list[PointRun]:
    with _lock:
        have = {p.id for p in plan.points}
        new = [p for p in runs if p.id not in have]
        plan.add_runs(new)
    return new


def settle(work: RunState, serve: ServeConfig, bench: BenchPoint) -> list[PointRun]:
    """After a point of `serve` ended: when it is an endpoint and both endpoints of its base have ended,
    decide the levels (once, in the ledger) and return their runs (already in the ledger and the plan);
    else []."""
    wl = workload_of(work.c)
    if wl is None or bench.workload_role not in (SERIAL, BATCH):
        return []
    base = next((b for b in work.plan.benches if b.id == bench.workload_of), None)
    if base is None:
        return []
    ends = endpoint_benches(work.plan.spec, base)
    rows = {str(b.workload_role): [r for r in work.ledger.points(serve_id=serve.id, in_plan_only=False)
                              if r.bench_id == b.id] for b in ends}
    if not all(rows.values()) or any(_unfinished(r, work.c.max_attempts) for rs in rows.values() for r in rs):
        return []
    if _precision_open(work, serve.id, ends):
        return []
    recorded = work.ledger.workload_levels(serve.id, base.id)
    again = recorded is not None and recorded["state"] == NO_ENDPOINTS and all(
        any(r.state == "done" for r in rs) for rs in rows.values())  # failed endpoints that ran again since
    if recorded is None or again:
        recorded = _decide(work, serve, base, rows, wl, replace=again)
    runs = _level_runs(work.plan, serve, base, recorded["levels"])
    if not runs:
        return []
    work.ledger.add_points([(p.id, p.serve.id, p.bench.id, p.run, p.serve.params, p.bench.params) for p in runs])
    new = _add_to_plan(work.plan, runs)
    return [p for p in new if (row := work.ledger.point(p.id)) is not None
            and not _done_or_spent(row, work.c.max_attempts)]


def _done_or_spent(row: PointRow, max_attempts: int) -> bool:
    return row.state == "done" or (row.state == "failed" and row.attempts >= max_attempts)


def _precision_open(work: RunState, serve_id: str, ends: list[BenchPoint]) -> bool:
    """With bench.precision, an endpoint not yet decided (its next run is about to be added)."""
    if getattr(work.c.bench, "precision", None) is None:
        return False
    states = {(r["serve_id"], r["bench_id"]): r["state"] for r in work.ledger.precision()}
    return any(states.get((serve_id, b.id)) in (None, "measuring") for b in ends)


def _decide(work: RunState, serve: ServeConfig, base: BenchPoint, rows: dict[str, list[PointRow]], wl: WorkloadSpec,
            replace: bool = False) -> dict[str, Any]:
    serial = [achieved(r, wl.variable) for r in done_records(work, rows[SERIAL])]
    batch = [achieved(r, wl.variable) for r in done_records(work, rows[BATCH])]
    if not serial or not batch:
        work.ledger.record_workload_levels(serve.id, base.id, wl.variable, None, None, [], NO_ENDPOINTS)
        log.warning("server config %s, bench %s: no done run of the %s point; no level between them", serve.id,
                    base.id, "serial" if not serial else "batch")
    else:
        lo, hi, levels = levels_between(serial, batch, wl.levels)
        work.ledger.record_workload_levels(serve.id, base.id, wl.variable, lo, hi, levels, DECIDED, replace=replace)
        log.info("server config %s, bench %s: serial %s=%d, batch %s=%d; levels %s", serve.id, base.id,
                 wl.variable, lo, wl.variable, hi, levels)
    recorded = work.ledger.workload_levels(serve.id, base.id)  # the first writer's, should two have decided
    assert recorded is not None
    work.emit("workload_levels", serve=serve, bench_id=base.id, variable=wl.variable, serial=recorded["serial"],
              batch=recorded["batch"], levels=recorded["levels"], state=recorded["state"])
    return recorded


def restore_plan(plan: Plan, ledger: Ledger) -> int:
    """Put the levels earlier drivers decided back into the plan (their runs are in the ledger, not in the
    expanded grid); returns how many runs."""
    if workload_of(plan.spec.campaign) is None:
        return 0
    serves = {s.id: s for s in plan.serves}
    bases = {b.id: b for b in plan.benches}
    runs = []
    for row in ledger.all_workload_levels():
        serve, base = serves.get(row["serve_id"]), bases.get(row["bench_id"])
        if serve is not None and base is not None and plan.points_of(serve.id):
            runs += _level_runs(plan, serve, base, row["levels"])
    return len(_add_to_plan(plan, runs))


def settle_all(work: RunState) -> int:
    """`settle` every base point of every configuration (at the start of a run: a driver may have died between
    the endpoints' last run and the decision); returns how many runs it added."""
    if workload_of(work.c) is None:
        return 0
    seen: set[tuple[str, str]] = set()
    added = 0
    for p in list(work.plan.points):
        key = (p.serve.id, p.bench.workload_of or "")
        if p.bench.workload_role == BATCH and key not in seen:
            seen.add(key)
            added += len(settle(work, p.serve, p.bench))
    return added


# -- with an SLA search -----------------------------------------------------------------------------------

def pending(work: RunState, serve_id: str) -> list[PointRun]:
    """The serial, batch and level runs of a configuration still to run (with an SLA search, which runs after
    them, `RunState.work_left` counts them too)."""
    if workload_of(work.c) is None:
        return []
    out = []
    for row in work.ledger.runnable(serve_id, work.c.max_attempts):
        p = work.plan.point(row.point_id)
        if p is not None and p.bench.workload_role is not None:
            out.append(p)
    return out


def search_probes(work: RunState, serve_id: str, base_id: str) -> dict[float, list[str]]:
    """The workload points of one base point that run exactly what an SLA probe of the same variable would
    run, as the search's probes: value -> the result files of their runs, for values whose every run is done.
    Every level is one (the base with only the variable set); with max_concurrency the serial point is the
    probe of 1 and the batch point (every prompt at once) the unbounded-load probe; with request_rate the
    endpoints also cap the concurrency, which a probe does not, so only the levels count."""
    import math

    wl, cfg = workload_of(work.c), getattr(work.c, "sla", None)
    if wl is None or cfg is None or cfg.variable != wl.variable:
        return {}
    runs: dict[float, list[PointRow | None]] = {}
    for p in work.plan.points_of(serve_id):
        b = p.bench
        if b.workload_of != base_id or b.workload_value is None:
            continue
        if b.workload_role == LEVEL or (wl.variable == CONCURRENCY and b.workload_role == SERIAL):
            value = float(b.workload_value)
        elif wl.variable == CONCURRENCY and b.workload_role == BATCH:
            value = math.inf
        else:
            continue
        runs.setdefault(value, []).append(work.ledger.point(p.id))
    done = {v: [r for r in rows if r is not None and r.state == "done"] for v, rows in runs.items()}
    return {v: [str(r.result_path) for r in sorted(rows, key=lambda r: r.run)] for v, rows in done.items()
            if len(rows) == len(runs[v]) >= work.c.runs}


def report_section(directory: CampaignDir) -> str | None:
    """The report's Load levels section (bench.workload): per server config and bench point the serial and
    batch values and the levels decided between them; None for any other campaign."""
    import html

    from raysweep.ledger import LEDGER_FILE

    if not (directory.path / LEDGER_FILE).is_file():
        return None
    ledger = directory.ledger
    stored, rows = ledger.stored_campaign(), ledger.all_workload_levels()
    spec = (stored.get("bench") or {}).get("workload")
    if not spec:
        return None
    variable = spec.get("variable", RATE)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in (
            r["serve_id"], r["bench_id"], "" if r["serial"] is None else f"{r['serial']:g}",
            "" if r["batch"] is None else f"{r['batch']:g}", ", ".join(str(v) for v in r["levels"]), r["state"]))
        + "</tr>" for r in rows)
    return (f"<p>{html.escape(status_lines(rows, stored)[0])}. The serial point runs at max_concurrency 1, the batch "
            f"point with every prompt at once; the levels of {html.escape(variable)} between what they achieved are "
            "decided as vLLM's <code>serve_workload</code> decides them.</p><table><thead><tr><th>server config</th>"
            f"<th>bench point</th><th>serial</th><th>batch</th><th>levels</th><th>state</th></tr></thead>"
            f"<tbody>{body}</tbody></table>")

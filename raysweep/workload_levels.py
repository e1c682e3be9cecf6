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
every point, as it calls `raysweep.sequential.settle`: the decision goes to the ledger's `workload_levels`
table (first writer wins, so two servers of one configuration decide once), the level points' runs are
inserted with the same stable ids as any other run (INSERT OR IGNORE) and added to the plan. A resumed
campaign reads the table (`restore_plan`) and runs the same levels; `settle_all` decides, before anything
starts, the endpoints a dead driver left ended but undecided. Endpoints with no done run decide no level
(vLLM's sweep skips them too), recorded as such.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from raysweep import grid
from raysweep.errors import CampaignError

__all__ = ["BATCH", "LEVEL", "SERIAL", "WorkloadSpec", "achieved", "check_workload", "dataset_size",
           "dry_run_lines", "endpoint_benches", "level_bench", "levels_between", "report_section", "restore_plan",
           "settle", "settle_all", "status_lines", "workload_of"]

log = logging.getLogger(__name__)

SERIAL, BATCH, LEVEL = "serial", "batch", "level"
VARIABLES = ("max_concurrency", "request_rate")
DEFAULT_NUM_PROMPTS = 1000  # vLLM's DEFAULT_NUM_PROMPTS: what `vllm bench serve` runs without --num-prompts
DECIDED, NO_ENDPOINTS = "decided", "endpoints failed"
_lock = threading.Lock()


class WorkloadSpec(BaseModel):
    """vLLM's `--workload-var` and `--workload-iters`: which load variable the levels set, and how many
    levels there are in all (the serial and batch endpoints included)."""

    model_config = ConfigDict(extra="forbid")

    variable: Literal["max_concurrency", "request_rate"] = Field(
        "request_rate", description="the load variable the levels set (vLLM's --workload-var)")
    levels: int = Field(10, ge=2, description="levels in all, the serial and batch endpoints included, as vLLM's "
                        "--workload-iters (at least 2; the levels between are decided after the endpoints)")


def workload_of(campaign: Any) -> WorkloadSpec | None:
    """The campaign's `bench.workload`, or None."""
    bench = getattr(campaign, "bench", None)
    return getattr(bench, "workload", None) if bench is not None else None


# -- the campaign's checks ------------------------------------------------------------------------------

_REFUSED = (("sla", "an SLA search chooses its own load values; run the workload campaign first and start the "
                    "SLA search from its range (sla.start, sla.max_value)"),
            ("tune", "tuning candidates are compared on the same fixed bench points, and levels decided per "
                     "candidate would differ between them"),
            ("offline", "offline runs have no load variable"))


def check_workload(campaign: Any, serve_combos: list[dict[str, Any]], bench_combos: list[dict[str, Any]]) -> None:
    """Refuse what cannot work with `bench.workload`: a hand-typed grid of its variable (or of
    max_concurrency, which the endpoints set), an SLA search, tuning or offline mode."""
    spec = workload_of(campaign)
    if spec is None:
        return
    for part, why in _REFUSED:
        if getattr(campaign, part, None) is not None:
            raise CampaignError("bench.workload", f"cannot be used with `{part}:` ({why}); remove one of them")
    for i, combo in enumerate(bench_combos):
        for key in combo:
            norm = grid.normalize_key(key)
            if norm in (spec.variable, "max_concurrency"):
                raise CampaignError(f"bench.params[{i}].{key}", f"is set by bench.workload (variable "
                                    f"{spec.variable}: the serial and batch points set max_concurrency, the "
                                    f"levels set {spec.variable}); remove it from bench.params, or remove "
                                    "bench.workload to type the levels by hand")


# -- the points ---------------------------------------------------------------------------------------

def dataset_size(params: dict[str, Any], argv: Sequence[str]) -> int:
    """The prompts of one run, as vLLM's sweep reads them: the bench point's num_prompts, else the command's
    --num-prompts, else vLLM's default (1000)."""
    norm = {grid.normalize_key(k): v for k, v in params.items()}
    value = norm.get("num_prompts")
    if value is None:
        value = grid.find_flag_value(argv, "--num-prompts", "--num_prompts")
    return int(value) if value is not None else DEFAULT_NUM_PROMPTS


def _bench(spec: Any, base: Any, params: dict[str, Any], role: str, value: int) -> Any:
    from raysweep.plan import BenchPoint

    wl = workload_of(spec.campaign)
    assert wl is not None
    clean = {k: v for k, v in params.items() if k != grid.BENCHMARK_NAME_KEY}
    return BenchPoint(id=grid.params_id(clean), params=params, argv=grid.apply_to_cmd(spec.bench_argv, params),
                      label=f"{base.label}-{role}-{wl.variable}={value}" if base.label else
                      f"{role}-{wl.variable}={value}", workload_of=base.id, workload_role=role,
                      workload_value=value)


def endpoint_benches(spec: Any, base: Any) -> list[Any]:
    """The serial and batch points of a base bench point, as vLLM's sweep runs them: the base with
    max_concurrency 1 and the variable 1, and with both at the point's prompt count."""
    wl = workload_of(spec.campaign)
    assert wl is not None
    size = dataset_size(base.params, base.argv)
    return [_bench(spec, base, {**base.params, "max_concurrency": n, wl.variable: n}, role, n)
            for role, n in ((SERIAL, 1), (BATCH, size))]


def level_bench(spec: Any, base: Any, value: int) -> Any:
    """A level between the endpoints: the base with only the variable set."""
    wl = workload_of(spec.campaign)
    assert wl is not None
    return _bench(spec, base, {**base.params, wl.variable: value}, LEVEL, value)


# -- the levels, as vLLM computes them ---------------------------------------------------------------

def achieved(record: dict[str, Any], variable: str) -> float:
    """What one run achieved of the variable: its request throughput, or (max_concurrency) the requests it
    kept in flight, request throughput x mean E2EL (vLLM's `_estimate_workload_value`)."""
    rps = float(record["request_throughput"])
    if variable == "request_rate":
        return rps
    return rps * float(record["mean_e2el_ms"]) / 1000


def levels_between(serial: Sequence[float], batch: Sequence[float], levels: int) -> tuple[int, int, list[int]]:
    """The serial and batch values and the levels between them from the endpoints' per-run achieved values,
    exactly as vLLM's `explore_comb_workloads`: ceil of the serial mean, floor of the batch mean, the inner
    points of an even spacing of `levels` values, rounded (half to even) and deduplicated."""
    import numpy as np

    lo = math.ceil(sum(serial) / len(serial))
    hi = math.floor(sum(batch) / len(batch))
    inner = np.linspace(lo, hi, levels)[1:-1]
    return lo, hi, sorted(set(map(round, inner)))


# -- deciding them while the campaign runs ----------------------------------------------------------

def _unfinished(row: Any, max_attempts: int) -> bool:
    from raysweep.ledger import PointState

    return row.state in (PointState.PENDING, PointState.RUNNING) or (
        row.state == PointState.FAILED and row.attempts < max_attempts)


def _records(work: Any, rows: list[Any]) -> list[dict[str, Any]]:
    from raysweep.ledger import PointState

    out = []
    for row in sorted(rows, key=lambda r: r.run):
        if row.state != PointState.DONE:
            continue
        try:
            out.append(json.loads((work.output_dir / (row.result_path or "")).read_text()))
        except (OSError, ValueError) as exc:
            log.warning("run %s of point %s/%s: result unreadable (%s)", row.run, row.serve_id, row.bench_id, exc)
    return out


def _level_runs(plan: Any, serve: Any, base: Any, values: list[int]) -> list[Any]:
    from raysweep.plan import PointRun, first_runs, point_id

    runs = []
    for v in values:
        b = level_bench(plan.spec, base, v)
        runs += [PointRun(id=point_id(serve.id, b.id, r), serve=serve, bench=b, run=r)
                 for r in range(first_runs(plan.spec))]
    return runs


def _add_to_plan(plan: Any, runs: list[Any]) -> list[Any]:
    with _lock:
        have = {p.id for p in plan.points}
        new = [p for p in runs if p.id not in have]
        plan.add_runs(new)
    return new


def settle(work: Any, serve: Any, bench: Any) -> list[Any]:
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
    rows = {b.workload_role: [r for r in work.ledger.points(serve_id=serve.id, in_plan_only=False)
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
    return [p for p in new if work.ledger.point(p.id) is not None
            and not _done_or_spent(work.ledger.point(p.id), work.c.max_attempts)]


def _done_or_spent(row: Any, max_attempts: int) -> bool:
    return row.state == "done" or (row.state == "failed" and row.attempts >= max_attempts)


def _precision_open(work: Any, serve_id: str, ends: list[Any]) -> bool:
    """With bench.precision, an endpoint not yet decided (its next run is about to be added)."""
    if getattr(work.c.bench, "precision", None) is None:
        return False
    states = {(r["serve_id"], r["bench_id"]): r["state"] for r in work.ledger.precision()}
    return any(states.get((serve_id, b.id)) in (None, "measuring") for b in ends)


def _decide(work: Any, serve: Any, base: Any, rows: dict[str, list[Any]], wl: WorkloadSpec,
            replace: bool = False) -> dict[str, Any]:
    serial = [achieved(r, wl.variable) for r in _records(work, rows[SERIAL])]
    batch = [achieved(r, wl.variable) for r in _records(work, rows[BATCH])]
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


def restore_plan(plan: Any, ledger: Any) -> int:
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


def settle_all(work: Any) -> int:
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


def dry_run_lines(spec: Any, endpoint_runs: int = 0) -> list[str]:
    """What the dry run says of the levels; `endpoint_runs`: the serial and batch runs the plan holds."""
    wl = workload_of(spec.campaign)
    if wl is None:
        return []
    inner = wl.levels - 2
    more = f"; at most {endpoint_runs // 2 * inner} more run(s)" if endpoint_runs and inner else ""
    what = ("request throughput" if wl.variable == "request_rate"
            else "request throughput x mean E2EL (the requests kept in flight)")
    return [f"Workload levels: per server config and bench point, the serial point (max_concurrency 1) and the "
            f"batch point (max_concurrency = num_prompts) run first; {inner} level(s) of {wl.variable} between "
            f"what they achieve ({what}) are decided after the serial and batch points, as vLLM's serve_workload "
            f"decides them (fewer when the range is narrow){more}"]


def status_lines(rows: list[dict[str, Any]], stored: dict[str, Any]) -> list[str]:
    """Lines for `status` and the report: per (server config, bench point) the levels decided, or that they
    wait for the serial and batch points."""
    spec = (stored.get("bench") or {}).get("workload")
    if not spec:
        return []
    variable, n = spec.get("variable", "request_rate"), spec.get("levels", 10)
    lines = [f"bench.workload ({n} levels of {variable}): {sum(r['state'] == DECIDED for r in rows)} decided, "
             f"{sum(r['state'] == NO_ENDPOINTS for r in rows)} without levels (an endpoint had no done run)"]
    for r in rows:
        if r["state"] == DECIDED:
            lines.append(f"  server {r['serve_id']} bench {r['bench_id']}: serial {variable}={r['serial']:g}, batch "
                         f"{r['batch']:g}; levels {', '.join(str(v) for v in r['levels']) or 'none between'}")
        else:
            lines.append(f"  server {r['serve_id']} bench {r['bench_id']}: {r['state']}, no level")
    return lines


def report_section(output_dir: Any) -> str | None:
    """The report's Load levels section (bench.workload): per server config and bench point the serial and
    batch values and the levels decided between them; None for any other campaign."""
    import html
    from pathlib import Path

    from raysweep.ledger import LEDGER_FILE, Ledger

    if not (Path(output_dir) / LEDGER_FILE).is_file():
        return None
    ledger = Ledger.open_existing(output_dir)
    try:
        stored, rows = ledger.stored_campaign(), ledger.all_workload_levels()
    finally:
        ledger.close()
    spec = (stored.get("bench") or {}).get("workload")
    if not spec:
        return None
    variable = spec.get("variable", "request_rate")
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

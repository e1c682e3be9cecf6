"""How long a campaign will take: server starts, GPU-hours and wall time, before it runs and while it runs.

Durations come from measurements when there are any (an output dir's ledger: a server's start is
`ready_at - started_at`, a point's duration is `ended_at - started_at`, else its result's `bench_wall_s`),
and otherwise from the benchmark command with the constants below. Measurements of other points
calibrate the command-based guess: it is scaled by the median of measured / guessed over the measured
points. Pure: no Ray, no processes.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from raysweep.plan import hooks
from raysweep.plan.guess import DEFAULTS, Defaults, guess_point_s
from raysweep.plan.plan import Plan, PointRun, first_runs

if TYPE_CHECKING:
    from raysweep.record.directory import CampaignDir

__all__ = ["DEFAULTS", "Defaults", "Estimate", "Measured", "add_recorded", "estimate", "eta_s",
           "format_duration", "guess_point_s", "measured_from", "precision_runs"]


@dataclass
class Measured:
    """Durations measured in earlier runs: server start seconds per server config, and point seconds
    per (server config, bench point)."""

    server_start_s: dict[str, list[float]] = field(default_factory=dict)
    point_s: dict[tuple[str, str], list[float]] = field(default_factory=dict)

    def add_start(self, serve_id: str, seconds: float) -> None:
        if seconds >= 0 and math.isfinite(seconds):
            self.server_start_s.setdefault(serve_id, []).append(seconds)

    def add_point(self, serve_id: str, bench_id: str, seconds: float) -> None:
        if seconds >= 0 and math.isfinite(seconds):
            self.point_s.setdefault((serve_id, bench_id), []).append(seconds)

    def __bool__(self) -> bool:
        return bool(self.server_start_s or self.point_s)


@dataclass(frozen=True)
class Estimate:
    """What is left of a campaign: server starts, points, GPU-hours, wall time and where the durations
    came from (`basis`: "measured", "calibrated" or "defaults")."""

    server_starts: int
    points: int
    gpu_hours: float
    wall_s: float
    work_s: float
    basis: str
    per_serve_s: dict[str, float] = field(default_factory=dict)
    most_points: int | None = None  # bench.precision: every undecided point run to max_runs
    most_wall_s: float | None = None
    confirm: tuple[int, int, float] | None = None  # the winner's confirmation after it: starts, runs, seconds
    node_hours: float | None = None  # on a machine without GPUs: what its servers bill, node-hours (not GPU-hours)

    def hours_text(self) -> str:
        """What the servers will hold: GPU-hours, or node-hours where the machine has no GPUs."""
        if self.node_hours is not None:
            return f"{self.node_hours:.2f} node-hour(s) (no GPUs here)"
        return f"{self.gpu_hours:.2f} GPU-hour(s)"

    def text(self) -> str:
        most = "" if self.most_points is None or self.most_wall_s is None else (
            f"; bench.precision: at most {self.most_points} run(s), about {format_duration(self.most_wall_s)}")
        then = "" if self.confirm is None else (
            f"; then the winner's confirmation (every bench shape's leader and runner-up): {self.confirm[0]} "
            "server start(s), "
            f"{self.confirm[1]} run(s), about {format_duration(self.confirm[2])}")
        return (f"Estimate ({self.basis}): {self.server_starts} server start(s), {self.points} run(s)"
                f"{' expected' if most else ''}, {self.hours_text()}, wall time about "
                f"{format_duration(self.wall_s)}{most}{then}")


def format_duration(seconds: float) -> str:
    """`45 s`, `12 min`, `3 h 05 min`."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    h, m = divmod(round(seconds / 60), 60)
    return f"{h} h {m:02d} min"


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def _point_s(p: PointRun, measured: Measured, scale: float, offline: bool, defaults: Defaults) -> float:
    exact = measured.point_s.get((p.serve.id, p.bench.id))
    if exact:
        return _median(exact)
    return scale * guess_point_s(p.bench.argv if not offline else p.serve.argv, offline, defaults,
                                 p.bench.load)


def _calibration(plan: Plan, measured: Measured, offline: bool, defaults: Defaults) -> float:
    """The median of measured / guessed over the measured points of the plan (1 when none)."""
    ratios = []
    benches = {b.id: b for b in plan.benches}
    serves = {s.id: s for s in plan.serves}
    for (serve_id, bench_id), values in measured.point_s.items():
        argv = (serves[serve_id].argv if serve_id in serves else None) if offline else (
            benches[bench_id].argv if bench_id in benches else None)
        if argv is None:
            continue
        guess = guess_point_s(argv, offline, defaults, benches[bench_id].load if bench_id in benches else None)
        if guess > 0:
            ratios.append(_median(values) / guess)
    if not ratios and measured.point_s:  # another campaign's points: compare with their own median
        every = [v for values in measured.point_s.values() for v in values]
        guesses = [guess_point_s(b.argv, offline, defaults, b.load) for b in plan.benches] or [1.0]
        return _median(every) / _median(guesses)
    return _median(ratios) if ratios else 1.0


def _start_s(serve_id: str, measured: Measured, defaults: Defaults) -> float:
    if serve_id in measured.server_start_s:
        return _median(measured.server_start_s[serve_id])
    every = [v for values in measured.server_start_s.values() for v in values]
    return _median(every) if every else defaults.server_start_s


def _measured_point_s(serve_id: str, bench_id: str, measured: Measured) -> float:
    """A measured duration for a run: its own (server config, bench point), else its bench point on other
    configurations, else every measured point's median."""
    exact = measured.point_s.get((serve_id, bench_id))
    if exact:
        return _median(exact)
    same_bench = [v for (_, b), values in measured.point_s.items() if b == bench_id for v in values]
    return _median(same_bench or [v for values in measured.point_s.values() for v in values])


def eta_s(left: list[tuple[str, str]], measured: Measured, running: set[str], lanes: int) -> float | None:
    """Seconds until the runs `left` ((server config id, bench point id) each) are done, from measured
    durations only, with a server start for every configuration not in `running`; None before any point
    was measured."""
    if not measured.point_s:
        return None
    per_serve: dict[str, float] = {}
    for serve_id, bench_id in left:
        per_serve[serve_id] = per_serve.get(serve_id, 0.0) + _measured_point_s(serve_id, bench_id, measured)
    for serve_id in per_serve:
        if serve_id not in running:
            per_serve[serve_id] += _start_s(serve_id, measured, DEFAULTS)
    return _wall(list(per_serve.values()), lanes)


def precision_runs(plan: Plan, values: dict[tuple[str, str], list[float]] | None = None,
                   decided: set[tuple[str, str]] | None = None, most: bool = False,
                   run_s: dict[tuple[str, str], float] | None = None) -> list[PointRun]:
    """The runs `bench.precision` is expected to add to the points of `plan` (beyond the runs the plan
    holds): per point not `decided` yet, up to `expected_runs` of the metric `values` seen so far (min_runs
    without), or with `most` up to max_runs; with `max_duration_s`, no more than its budget allows at
    `run_s` seconds a run (per point)."""
    from raysweep.maths.precision import expected_runs, most_runs

    c = plan.spec.campaign
    spec = getattr(c.bench, "precision", None) if c.bench is not None else None
    if spec is None:
        return []
    runs: dict[tuple[str, str], list[PointRun]] = {}
    for p in plan.points:
        runs.setdefault((p.serve.id, p.bench.id), []).append(p)
    extra = []
    for pair, pts in runs.items():
        if pair in (decided or set()):
            continue
        secs = (run_s or {}).get(pair)
        want = most_runs(spec, secs) if most else expected_runs((values or {}).get(pair, []), spec, secs)
        last = max(p.run for p in pts)
        extra += [PointRun(id=f"{pts[0].id}+{r}", serve=pts[0].serve, bench=pts[0].bench, run=r)
                  for r in range(last + 1, max(want, last + 1))]
    return extra


def estimate(plan: Plan, *, done: set[str] | None = None, measured: Measured | None = None, lanes: int = 1,
             gpus_of: dict[str, int] | None = None, running: set[str] | None = None,
             defaults: Defaults = DEFAULTS, values: dict[tuple[str, str], list[float]] | None = None,
             decided: set[tuple[str, str]] | None = None) -> Estimate:
    """The time left for the points of `plan` not in `done`: one server start per configuration with
    points left (none for those in `running`, whose server is up), their points one after another, and
    `lanes` configurations at a time (the longest first). `gpus_of` gives a configuration's GPUs
    (default: its shape). With `bench.precision`, the runs each point not `decided` is expected to add
    (`precision_runs` from the metric `values` seen) are counted, and `most_points` / `most_wall_s` say
    what running every one of them to max_runs would take. A `design:` that states the cost of a server start
    (`design.start_s`) gives it where none was measured."""
    design = getattr(plan.spec.campaign, "design", None)
    if design is not None and design.start_s is not None and defaults is DEFAULTS:
        defaults = replace(defaults, server_start_s=design.start_s)
    secs = _run_seconds(plan, measured, defaults)
    est = _estimate(plan, precision_runs(plan, values, decided, run_s=secs), done, measured, lanes, gpus_of,
                    running, defaults)
    est = hooks.confirmation()(plan, est, measured)  # the winner's confirmation after it (raysweep.confirm)
    if getattr(plan.spec.campaign.bench, "precision", None) is None:
        return est
    top = _estimate(plan, precision_runs(plan, values, decided, most=True, run_s=secs), done, measured, lanes,
                    gpus_of, running, defaults)
    return Estimate(**{**est.__dict__, "most_points": top.points, "most_wall_s": top.wall_s})


def _run_seconds(plan: Plan, measured: Measured | None, defaults: Defaults) -> dict[tuple[str, str], float]:
    """Seconds a run of each point takes, for bench.precision's `max_duration_s`: measured, else guessed."""
    out: dict[tuple[str, str], float] = {}
    spec = getattr(plan.spec.campaign.bench, "precision", None)
    if spec is None or spec.max_duration_s is None:
        return out
    offline = plan.spec.offline
    for p in plan.points:
        pair = (p.serve.id, p.bench.id)
        exact = measured.point_s.get(pair) if measured is not None else None
        if pair not in out:
            out[pair] = _median(exact) if exact else guess_point_s(p.serve.argv if offline else p.bench.argv,
                                                                    offline, defaults, p.bench.load)
    return out


def _estimate(plan: Plan, extra: list[PointRun], done: set[str] | None, measured: Measured | None, lanes: int,
              gpus_of: dict[str, int] | None, running: set[str] | None, defaults: Defaults) -> Estimate:
    done, measured, running = done or set(), measured or Measured(), running or set()
    offline = plan.spec.offline
    scale = _calibration(plan, measured, offline, defaults)
    per_serve: dict[str, float] = {}
    left = [p for p in plan.points if p.id not in done] + extra
    for p in left:
        per_serve[p.serve.id] = per_serve.get(p.serve.id, 0.0) + _point_s(p, measured, scale, offline, defaults)
    starts = 0
    if not offline:
        for serve_id, n in _starts_left(plan, left, running).items():
            starts += n
            per_serve[serve_id] += n * _start_s(serve_id, measured, defaults)
    gpus = gpus_of or {s.id: s.shape.gpu_count for s in plan.serves}
    gpu_hours = sum(gpus.get(sid, 0) * s for sid, s in per_serve.items()) / 3600
    basis = ("measured" if measured and all((p.serve.id, p.bench.id) in measured.point_s for p in left)
             else "calibrated" if measured else "defaults")
    return Estimate(server_starts=starts if not offline else len(left), points=len(left), gpu_hours=gpu_hours,
                    wall_s=_wall(list(per_serve.values()), lanes), work_s=sum(per_serve.values()), basis=basis,
                    per_serve_s=per_serve)


def _starts_left(plan: Plan, left: list[PointRun], running: set[str]) -> dict[str, int]:
    """Server starts each configuration with runs left still needs: one (none while its server runs), or with
    `order.instances` one per instance its runs left go to (`raysweep.maths.order`)."""
    from raysweep.maths.order import instance_of, order_of

    n = order_of(plan.spec.campaign).instances
    first = first_runs(plan.spec)
    out: dict[str, set[int]] = {}
    for p in left:
        out.setdefault(p.serve.id, set()).add(instance_of(p.run, n, first) if n > 1 else 0)
    return {sid: len(inst) - (1 if sid in running else 0) for sid, inst in out.items()}


def _wall(durations: list[float], lanes: int) -> float:
    """Longest-first list scheduling of the configurations onto `lanes` parallel lanes."""
    ends = [0.0] * max(1, lanes)
    for d in sorted(durations, reverse=True):
        i = ends.index(min(ends))
        ends[i] += d
    return max(ends)


def measured_from(*directories: CampaignDir) -> Measured:
    """The durations the ledgers (and result files) of campaigns' directories recorded."""
    m = Measured()
    for directory in directories:
        _measure(directory, m)
    return m


def add_recorded(m: Measured, servers: list[Any], points: list[Any]) -> set[str]:
    """Add the server starts and done points' durations of ledger rows to `m`; returns the points timed."""
    from raysweep.ledger import PointState

    for s in servers:
        if s.ready_at is not None:
            m.add_start(s.serve_id, s.ready_at - s.started_at)
    timed = set()
    for p in points:
        if p.state == PointState.DONE and p.started_at is not None and p.ended_at is not None:
            m.add_point(p.serve_id, p.bench_id, p.ended_at - p.started_at)
            timed.add(p.point_id)
    return timed


def _measure(directory: CampaignDir, m: Measured) -> None:
    from raysweep.record.runs import read_records

    ledger = directory.ledger
    timed = add_recorded(m, ledger.servers(), ledger.points(in_plan_only=False))
    try:
        records = read_records(directory)
    except (OSError, ValueError):
        records = []
    for r in records:
        wall = r.get("bench_wall_s")
        if r.get("point_id") not in timed and isinstance(wall, (int, float)):
            m.add_point(str(r.get("serve_id")), str(r.get("bench_id")), float(wall))

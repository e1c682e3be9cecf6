"""The winner confirmed: after the sweep, the leader and the runner-up of every bench shape measured again,
fresh and interleaved, and the headline verdict taken from those runs, not from the selection.

Picking the best of many and testing it against the next one overstates its lead (the winner's curse): the
leader is the configuration whose runs happened to read high. `confirm:` (on by default where the campaign
has room for it, `ROOM`) takes the pairs the report's conclusions name (`raysweep.confirm.winners`, for
`confirm.objective`) once the sweep has ended, and measures each of their points again on new server
starts: every configuration of the pairs gets `confirm.starts` starts, in blocks ordered AB BA across them
(`raysweep.maths.order.turns`), each start running `confirm.runs` runs of its points (in rounds). The pairs are
recorded in the ledger (its `confirm` entry) before a run starts, so a resumed campaign confirms the same
pairs and runs only what is left. The confirmation's runs are points of their own (bench id
`confirm_bench_id(base)`, result field `phase: confirm`, `confirms_bench_id` the point confirmed) that the
sweep's conclusions leave out; the headline's verdict and the leader's interval come from them
(`raysweep.confirm.verdict.confirmed_verdict`). The run calls `restore_plan` and `run_after` through
`raysweep.drive.hooks`, where `raysweep.confirm` lends this module.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from raysweep.maths.order import ROOM, ConfirmSpec

if TYPE_CHECKING:
    from raysweep.campaign import Campaign, CampaignSpec
    from raysweep.drive.state import EventSink, RunState
    from raysweep.ledger import Ledger, PointRow
    from raysweep.plan.estimate import Measured
    from raysweep.plan.plan import Plan, PointRun, ServeConfig
    from raysweep.record.directory import CampaignDir

__all__ = ["ConfirmSpec", "ConfirmWork", "PHASE", "ROOM", "applies", "confirm_bench_id", "confirm_of", "cost",
           "dry_run_lines", "restore_plan", "run_after", "wanted"]

log = logging.getLogger(__name__)

PHASE = "confirm"
META_KEY = "confirm"


def confirm_of(campaign: Campaign | None) -> ConfirmSpec:
    """The campaign's `confirm:` section (its defaults when absent)."""
    return getattr(campaign, "confirm", None) or ConfirmSpec()


def confirm_bench_id(bench_id: str) -> str:
    """The bench id of a point's confirmation runs (stable, so a resume finds them)."""
    from raysweep.grid import params_id

    return params_id({"confirms": bench_id})


def cost(plan: Plan, measured: Measured | None = None, pairs: int | None = None) -> tuple[int, int, float]:
    """Server starts, runs and seconds the confirmation of `pairs` pair(s) takes (default: one per bench shape;
    `confirm.estimate.confirm_cost`)."""
    from raysweep.confirm.estimate import confirm_cost

    return confirm_cost(plan, measured, pairs)


def wanted(plan: Plan, sweep_s: float, measured: Measured | None = None) -> bool:
    """Whether the campaign confirms its winner (`confirm.estimate.confirm_wanted`)."""
    from raysweep.confirm.estimate import confirm_wanted

    return confirm_wanted(plan, sweep_s, measured)


def applies(spec: CampaignSpec) -> bool:
    """Whether a campaign is one the confirmation can follow (`confirm.estimate.confirm_applies`)."""
    from raysweep.confirm.estimate import confirm_applies

    return confirm_applies(spec)


def dry_run_lines(plan: Plan, sweep_s: float | None = None) -> list[str]:
    """What the dry run says of the confirmation: on or off, its design and what it costs."""
    spec = confirm_of(plan.spec.campaign)
    if not applies(plan.spec):
        return []
    from raysweep.confirm.estimate import confirm_pairs

    starts, runs, secs = cost(plan)
    pairs = confirm_pairs(plan)
    on = wanted(plan, sweep_s) if sweep_s is not None else spec.enabled is True
    what = (f"the leader and the runner-up of each bench shape re-measured after the sweep on fresh servers, "
            f"{spec.starts} start(s) each in blocks ordered AB BA ({'A B B A' if spec.starts == 2 else 'A B ...'}),"
            f" {spec.runs} run(s) of each point per start: {pairs} pair(s), {starts} start(s) and {runs} run(s) in "
            f"all, about {secs:.0f} s; the headline's verdict and the leader's interval come from these runs")
    if on:
        return [f"Confirmation: {what}"]
    why = ("confirm.enabled is false" if spec.enabled is False else
           f"auto: it would cost more than {ROOM * 100:.0f} % of the sweep" if sweep_s is not None else "auto")
    return [f"Confirmation: off ({why}); `confirm: true` turns it on: {what}"]


# -- the points ---------------------------------------------------------------------------------------------

def _points_for(plan: Plan, chosen: Sequence[Sequence[str]], spec: ConfirmSpec) -> list[PointRun]:
    from raysweep.plan.plan import BenchPoint, PointRun, point_id

    serves = {s.id: s for s in plan.serves}
    benches = {b.id: b for b in plan.benches}
    out = []
    for serve_id, bench_id in dict.fromkeys((str(s), str(b)) for s, b, *_ in chosen):
        serve, bench = serves.get(serve_id), benches.get(bench_id)
        if serve is None or bench is None:
            log.warning("confirmation of %s/%s: no longer in the plan; left out", serve_id, bench_id)
            continue
        cid = confirm_bench_id(bench_id)
        cb = BenchPoint(id=cid, params=bench.params, argv=bench.argv, label=f"{bench.label} (confirmation)")
        out += [PointRun(id=point_id(serve_id, cid, r), serve=serve, bench=cb, run=r) for r in range(spec.per_arm)]
    return out


def _stored(ledger: Ledger) -> dict[str, Any] | None:
    text = ledger.meta(META_KEY)
    return json.loads(text) if text else None


def restore_plan(plan: Plan, ledger: Ledger) -> int:
    """Put the confirmation's runs an earlier driver chose back into the plan (they are in the ledger, not in
    the expanded grid); returns how many."""
    stored = _stored(ledger)
    if stored is None:
        return 0
    spec = ConfirmSpec.model_validate(stored.get("spec") or {})
    pts = _points_for(plan, stored.get("pairs") or [], spec)
    plan.add_runs(pts)
    plan.confirm_ids.update({p.bench.id: p.bench.label for p in pts})
    plan.confirm_base.update({confirm_bench_id(b): b for _, b, *_ in stored.get("pairs") or []})
    return len(pts)


def _serve_order(chosen: Sequence[Sequence[str]]) -> list[str]:
    return list(dict.fromkeys(str(s) for s, *_ in chosen))


# -- running it -----------------------------------------------------------------------------------------

def _work_class() -> type:
    from raysweep.drive.state import RunState
    from raysweep.maths.order import Turn, block_order, turns

    class ConfirmWork(RunState):
        """The confirmation's share of a campaign: its configurations (in the pairs' order), their
        confirmation runs only, `starts` instances each in AB BA blocks; it adds no runs."""

        adds_runs = False

        def __init__(self, plan: Plan, directory: CampaignDir, emit: EventSink, with_gpus: bool,
                     serve_ids: list[str], spec: ConfirmSpec) -> None:
            super().__init__(plan, directory, emit, with_gpus)
            by_id = {s.id: s for s in plan.serves}
            self._serves = [by_id[s] for s in serve_ids if s in by_id]
            self.instances, self.first_runs = spec.starts, spec.per_arm
            self.instances_always = True

        @property
        def serves(self) -> list[ServeConfig]:
            return self._serves

        def mine(self, row: PointRow) -> bool:
            return row.bench_id in self.plan.confirm_ids

        def design(self) -> list[Turn]:
            return turns([s.id for s in self._serves], self.instances)

        def turn_of(self, serve_id: str, instance: int) -> Turn | None:
            block = block_order([s.id for s in self._serves], instance)
            return Turn(serve_id, instance, instance, block.index(serve_id)) if serve_id in block else None

        def order_fields(self, serve_id: str, bench_id: str, run: int, slot: int) -> dict[str, Any]:
            return {**super().order_fields(serve_id, bench_id, run, slot), "phase": PHASE,
                    "confirms_bench_id": self.plan.confirm_base.get(bench_id)}

    return ConfirmWork


def ConfirmWork(*args: Any, **kw: Any) -> RunState:
    """`raysweep.drive.state.RunState` for the confirmation's runs (see `_work_class`)."""
    return _work_class()(*args, **kw)


def run_after(plan: Plan, directory: CampaignDir, emit: EventSink, with_gpus: bool,
              run_work: Callable[[RunState], str | None]) -> str | None:
    """After the sweep: the pairs recorded (chosen now when the campaign confirms and none are), their
    runs in the ledger and the plan, and the confirmation run through `run_work` (the scheduler on the
    cluster). Returns why it stopped early, or None."""
    from raysweep.confirm.winners import winner_pairs
    from raysweep.plan import estimate

    spec = confirm_of(plan.spec.campaign)
    ledger = directory.ledger
    stored = _stored(ledger)
    if stored is None:
        measured = estimate.Measured()
        estimate.add_recorded(measured, ledger.servers(), ledger.points())
        sweep = estimate.estimate(plan, measured=measured)
        if not wanted(plan, sweep.wall_s, measured):
            return None
        chosen = winner_pairs(directory, spec.objective)
        if not chosen:
            log.info("confirmation: no bench shape has a runner-up to confirm its leader against")
            return None
        if spec.enabled == "auto":  # what it costs for the pairs chosen, not for the shapes guessed before
            secs = cost(plan, measured, len(chosen) // 2)[2]
            if secs > ROOM * sweep.wall_s:
                log.info("confirmation: off (auto): %d pair(s) would take about %.0f s, more than %.0f %% of the "
                         "sweep's %.0f s", len(chosen) // 2, secs, ROOM * 100, sweep.wall_s)
                return None
        stored = {"pairs": chosen, "spec": spec.model_dump()}
        ledger.set_meta(META_KEY, json.dumps(stored))  # first: a resume confirms the same pairs
        restore_plan(plan, ledger)
        pts = [p for p in plan.points if p.bench.id in plan.confirm_ids]
        ledger.add_points([(p.id, p.serve.id, p.bench.id, p.run, p.serve.params, p.bench.params) for p in pts])
    spec = ConfirmSpec.model_validate(stored["spec"])
    serve_ids = _serve_order(stored["pairs"])
    work = ConfirmWork(plan, directory, emit, with_gpus, serve_ids, spec)
    if not any(work.runnable(s) for s in serve_ids) and not any(
            r.state == "running" for r in ledger.points() if r.bench_id in plan.confirm_ids):
        return None
    emit("confirm_start", pairs=stored["pairs"], starts=spec.starts, runs=spec.runs)
    log.info("confirmation: %s re-measured on fresh servers, %d start(s) each (AB BA), %d run(s) per start",
             ", ".join(f"{role} {s}/{b}" for s, b, role, *_ in stored["pairs"]), spec.starts, spec.runs)
    return run_work(work)

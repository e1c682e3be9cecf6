"""A tuning campaign as the scheduler's work: candidates asked as GPUs free up, judged at rungs, told when
they end.

`TuneWork` is the scheduler's `Work` for a `tune:` campaign and `TunedCluster` wraps its `Cluster` to see
starts and ends. A candidate's life: asked of the sampler (or proposed by `Proposals`), refused or added to
the plan and the ledger, started, judged at its rungs (`Rungs`), stopped early or finished, its objective
(`Objective`) told to the sampler; every step is saved as its ledger row, so a resumed campaign rebuilds the
candidates and the sampler from those rows.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from optuna.trial import TrialState

from raysweep.campaign import TuneSpec
from raysweep.drive.state import EventSink, RunState
from raysweep.place import placement
from raysweep.plan.plan import Plan, PointRun, ServeConfig, serve_points
from raysweep.tune.budget import Budget
from raysweep.tune.candidates import Candidate
from raysweep.tune.objective import Objective
from raysweep.tune.proposals import Proposals
from raysweep.tune.rungs import Rungs
from raysweep.tune.sampler import MAX_ASKS, Tuner
from raysweep.tune.space import SLA_CAPACITY, candidate_serve, refusal

if TYPE_CHECKING:
    from raysweep.place.scheduler import Cluster
    from raysweep.record.directory import CampaignDir

log = logging.getLogger(__name__)


class TuneWork(RunState):
    """The scheduler's `Work` for a `tune:` campaign: candidates asked as GPUs free up, judged at rungs,
    told when they end. `TunedCluster` calls `started`, `ended`, `review` and `refill`."""

    def __init__(self, plan: Plan, directory: CampaignDir, emit: EventSink, with_gpus: bool,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(plan, directory, emit, with_gpus)
        assert self.c.tune is not None
        self.t: TuneSpec = self.c.tune
        self.clock = clock
        self.tuner = Tuner(self.t)
        self.objectives = self.t.objectives
        self.cands: dict[int, Candidate] = {}
        self.by_serve: dict[str, Candidate] = {}
        self.nodes_now: list[placement.NodeInfo] = []
        self.refused: set[str] = set()  # configurations refused once: a proposal of one again is not recorded
        self.polished: dict[int, int] = {}  # candidate -> the front configuration it is one step from
        self.modelled: set[int] = set()     # candidates the surrogate proposed (Pareto, after the start-up)
        self.objective = Objective(self.objectives, directory, plan.spec.bench_argv)
        self.budget = Budget(self.t.budget, self.cands, clock)
        self.rungs = Rungs(self.t.early_stop, self.objective, self.cands, self.ledger, self.c.max_attempts,
                           self.bench_order, self._save)
        self.proposals = Proposals(self.t, self.tuner, plan, self.objective, self.budget, self.cands, self.by_serve,
                                   self.refused, lambda: self.nodes_now)
        self._restore()

    def _restore(self) -> None:
        serves = {s.id: s for s in self.plan.serves}
        for row in self.ledger.candidates():
            serve = serves.get(row["serve_id"]) or candidate_serve(self.plan.spec, row["params"])
            cand = Candidate(row["number"], serve, row["params"], row["state"], row["objective"], row["rungs"],
                             row["reason"], row["gpu_s"], gpus=row["gpu_count"], created_at=row["created_at"])
            by_points = cand.state in ("complete", "pruned") and self.objective.by_points()
            points = self.objective.points(cand) if by_points else []
            cand.trial = (self.tuner.add_points(cand.params, points) if points else
                          self.tuner.add(cand.params, cand.state, cand.objective, cand.rungs))
            self.cands[cand.number] = cand
            if cand.state != "refused":
                self.by_serve[serve.id] = cand
            else:
                self.refused.add(serve.id)
        if self.cands:
            self.budget.t0 = min(self.budget.t0, min(c.created_at for c in self.cands.values()))
        for cand in self.live():
            if not super().work_left(cand.serve.id):  # its points ended before the driver could tell
                self._finalize(cand)

    def _save(self, cand: Candidate) -> None:
        self.ledger.save_candidate(cand.number, serve_id=cand.serve.id, params=cand.params, state=cand.state,
                                   objective=cand.objective, rungs=cand.rungs, reason=cand.reason,
                                   gpu_count=cand.gpus, gpu_s=cand.gpu_s)

    # -- the scheduler's Work ----------------------------------------------------------------------------

    def work_left(self, serve_id: str) -> int:
        cand = self.by_serve.get(serve_id)
        if cand is None or cand.state != "running":
            return 0
        return super().work_left(serve_id)

    def give_up(self, serve: ServeConfig, reason: str, search_state: str = "server failed") -> None:
        """A candidate that cannot run any more (no node left for it, its transport refused): failed."""
        super().give_up(serve, reason, search_state)
        cand = self.by_serve.get(serve.id)
        if cand is not None and cand.state == "running":
            cand.state, cand.reason = "failed", reason
            self._save(cand)
            self._tell(cand)
            self.emit("candidate_done", number=cand.number, serve=serve, state="failed", objective=None, reason=reason)

    def live(self) -> list[Candidate]:
        return [c for c in self.cands.values() if c.state == "running"]

    def in_order(self, points: list[PointRun]) -> list[PointRun]:
        """A candidate's points, most informative first: the highest load first when maximizing a throughput
        (lowest first for a latency, or per user), so the first rungs already say much. Pareto: both ends of
        the load first (highest, lowest), then the rest from the high end down."""
        if len(self.objectives) == 2:
            loads = sorted({p.bench.load.key() for p in points})
            ends = [loads[-1], loads[0]] + loads[-2:0:-1] if loads else []
            rank = {load: ends.index(load) for load in loads}
            return sorted(points, key=lambda p: (rank[p.bench.load.key()], p.bench.id, p.run))
        high_first = self.objectives[0].direction == "maximize" and self.objectives[0].per != "user"
        return sorted(points, key=lambda p: (tuple(-v if high_first else v for v in p.bench.load.key()),
                                             p.bench.id, p.run))

    def bench_order(self, serve_id: str) -> list[str]:
        out: list[str] = []
        for p in self.in_order(self.plan.points_of(serve_id)):
            if p.bench.id not in out:
                out.append(p.bench.id)
        return out

    # -- what the cluster tells ------------------------------------------------------------------------

    def started(self, serve_id: str, gpus: int) -> None:
        cand = self.by_serve.get(serve_id)
        if cand is not None:
            cand.started_at, cand.gpus = self.clock(), gpus

    def ended(self, serve_id: str, outcome: str) -> None:
        cand = self.by_serve.get(serve_id)
        if cand is None:
            return
        if cand.started_at is not None:
            cand.gpu_s += cand.gpus * max(0.0, self.clock() - cand.started_at)
            cand.started_at = None
        if cand.state == "pruned":
            self.ledger.drop_unfinished(serve_id)
        elif cand.state == "running" and outcome == "finished":
            self._finalize(cand)
            return
        self._save(cand)

    def _finalize(self, cand: Candidate) -> None:
        values = self.objective.values(cand, None)
        if any(v is None for v in values):
            cand.state = "failed"
            errors = [p.error for p in self.ledger.points(serve_id=cand.serve.id) if p.error]
            cand.reason = errors[0] if errors else f"no result has {self.objectives[0].metric}"
            self.ledger.drop_unfinished(cand.serve.id)
        else:
            cand.state, cand.objective = "complete", [float(v) for v in values]  # type: ignore[arg-type]
        self._save(cand)
        self._tell(cand)
        shown = ", ".join(f"{v:.4g}" for v in cand.objective) if cand.objective else cand.reason
        log.info("candidate %d (%s) %s: %s", cand.number, cand.serve.label, cand.state, shown)
        self.emit("candidate_done", number=cand.number, serve=cand.serve, state=cand.state, objective=cand.objective,
                  reason=cand.reason)

    def _tell(self, cand: Candidate) -> None:
        if cand.trial is None:
            return
        if self.tuner.study.trials[cand.trial].state == TrialState.RUNNING:
            self._tell_trial(cand.trial, cand)

    def _tell_trial(self, trial: int, cand: Candidate) -> None:
        """Tell a trial the outcome of this candidate (Pareto: the pairs of each of its bench points)."""
        by_points = cand.state in ("complete", "pruned") and self.objective.by_points()
        points = self.objective.points(cand) if by_points else []
        if points:
            self.tuner.tell_points(trial, points)
        else:
            self.tuner.tell(trial, cand.state if cand.state != "running" else "failed", cand.objective, cand.rungs)

    def values(self, serve_id: str, bench_ids: Sequence[str] | None) -> list[float | None]:
        """Each objective of a configuration over these bench points (None: all of them)."""
        return self.objective.values(self.by_serve[serve_id], bench_ids)

    # -- early stopping ----------------------------------------------------------------------------------

    def review(self) -> list[tuple[str, str]]:
        """Judge running candidates at the rungs they reached; (serve id, reason) of each to stop now."""
        if not self.t.early_stop.enabled or any(o.metric == SLA_CAPACITY for o in self.objectives):
            return []
        stop = []
        for cand in self.live():
            reason = self.rungs.judge(cand)
            if reason:
                cand.state, cand.reason = "pruned", reason
                self._save(cand)
                self._tell(cand)
                log.info("candidate %d (%s) stopped: %s", cand.number, cand.serve.label, reason)
                self.emit("candidate_done", number=cand.number, serve=cand.serve, state="pruned", objective=None,
                          reason=reason)
                stop.append((cand.serve.id, f"stopped early: {reason}"))
        return stop

    # -- budget and new candidates -------------------------------------------------------------------------

    def gpu_hours(self) -> float:
        return self.budget.gpu_hours()

    def budget_left(self) -> str | None:
        """None while the budget allows another candidate, else what ran out."""
        return self.budget.left()

    def _free_gpus(self) -> int:
        used = sum(c.gpus for c in self.live() if c.started_at is not None)
        return sum(n.gpus for n in self.nodes_now) - used

    def _cap(self) -> int | None:
        caps = [x for x in (self.t.parallel, self.c.placement.max_servers) if x]
        if not self.with_gpus:
            caps.append(1)
        return min(caps) if caps else None

    def refill(self) -> None:
        """Ask for candidates while the budget allows and free GPUs (or `parallel`) leave room for them."""
        misses = 0
        while not self.stop_reason:
            live = self.live()
            cap = self._cap()
            if cap is not None and len(live) >= cap:
                return
            waiting = sum(max(1, c.serve.shape.gpu_count) for c in live if c.started_at is None)
            if cap is None and live and self._free_gpus() - waiting <= 0:
                return
            if self.budget_left() is not None:
                return
            if misses >= MAX_ASKS or (self.tuner.grid_size is not None and len(self.cands) >= self.tuner.grid_size):
                self.budget.exhausted = "the sampler proposes nothing new"
                return
            misses = 0 if self._new_candidate() else misses + 1

    def _new_candidate(self) -> bool:
        polish = self.proposals.polish_next() if self.proposals.polishing() else None
        chosen = polish[1] if polish else self.proposals.model_next() if self.objective.by_points() else None
        trial, params = self.tuner.ask(chosen)
        serve = candidate_serve(self.plan.spec, params)
        if serve.id in self.refused:
            self.tuner.tell(trial, "refused")
            return False
        known = self.by_serve.get(serve.id)
        if known is not None:  # the sampler proposed a configuration already tried: it learns its outcome
            self._tell_trial(trial, known)
            return False
        number = max(self.cands, default=-1) + 1
        cand = Candidate(number, serve, params, trial=trial, created_at=time.time())
        why = refusal(self.t, serve, self.nodes_now)
        if why:
            self._refuse(cand, why)
            return False
        points, searches, _ = serve_points(self.plan.spec, serve, self.plan.benches)
        if not points:
            self._refuse(cand, "no bench point matches it (link)")
            return False
        self.plan.add(serve, points, searches)
        self.ledger.add_points([(p.id, serve.id, p.bench.id, p.run, serve.params, p.bench.params) for p in points])
        cand.gpus = serve.shape.gpu_count
        self.cands[number] = cand
        self.by_serve[serve.id] = cand
        self._save(cand)
        log.info("candidate %d: %s (%s)", number, serve.label, serve.shape.describe())
        if polish:
            self.polished[number] = polish[0].number
            log.info("candidate %d: one step from candidate %d, on or near the front", number, polish[0].number)
        elif chosen is not None:
            self.modelled.add(number)
            log.info("candidate %d: its predicted points add the most to the front", number)
        self.emit("candidate_start", number=number, serve=serve, points=len(points))
        return True

    def _refuse(self, cand: Candidate, why: str) -> None:
        self.refused.add(cand.serve.id)
        cand.state, cand.reason = "refused", why
        self.cands[cand.number] = cand
        self._save(cand)
        assert cand.trial is not None
        self.tuner.tell(cand.trial, "refused")
        log.info("candidate %d (%s) refused: %s", cand.number, cand.serve.label, why)


class TunedCluster:
    """The scheduler's `Cluster` seen by a tuning campaign: starts and ends reach `TuneWork`, which stops
    pruned candidates and asks for new ones each time the scheduler looks at what ended."""

    def __init__(self, inner: Cluster, work: TuneWork) -> None:
        self.inner, self.work = inner, work

    def nodes(self) -> list[placement.NodeInfo]:
        self.work.nodes_now = self.inner.nodes()
        return self.work.nodes_now

    def start(self, serve: ServeConfig, layout: placement.Layout, node_ids: list[str]) -> None:
        self.work.started(serve.id, layout.gpu_count)
        self.inner.start(serve, layout, node_ids)

    def finished(self) -> list[tuple[str, str]]:
        ended = self.inner.finished()
        for sid, outcome in ended:
            self.work.ended(sid, outcome)
        for sid, reason in self.work.review():
            self.inner.abort(sid, reason)
        self.work.refill()
        return ended

    def abort(self, serve_id: str, reason: str) -> None:
        self.inner.abort(serve_id, reason)

    def wait(self, timeout_s: float) -> None:
        self.inner.wait(timeout_s)

    def join(self) -> None:
        self.inner.join()

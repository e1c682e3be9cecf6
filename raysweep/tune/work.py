"""Tuning: search a campaign's serve parameters instead of running their whole grid.

A campaign with a `tune:` block has no server configuration in its plan at first. While it runs, the
driver asks an Optuna sampler for candidates (ask-and-tell): each is a server configuration added to the
plan and the ledger, placed, packed and run by the scheduler like any other, with the campaign's bench
points. When a candidate ends, its objective (a result field over its bench points, per GPU or per user,
or the SLA capacity its searches found) is told to the sampler. Candidates run their most informative bench
points first; with early stopping (successive halving, asynchronous) one that ranks outside the best 1/eta
of its peers at a rung is stopped and its GPUs go to the next candidate. With two objectives (Pareto), each
bench point of a candidate is one point of the trade-off: the sampler learns every one, candidates run both
ends of the load first, and one whose every point is dominated by other candidates' points at a rung stops;
after the sampler's start-up candidates, each next one is the untried configuration whose optimistic
predicted points add the most hypervolume (`raysweep.surrogate`, `tune.pareto_model`), and the end of the
budget goes to configurations one step from those on or near the front.

Every candidate is a ledger row (`candidates`: number, parameters, state, objective, rung values, reason,
GPU-seconds); a resumed campaign rebuilds the plan and the sampler from those rows, so no finished
candidate runs again. `TuneWork` is the scheduler's `Work` for such a campaign and `TunedCluster` wraps
its `Cluster` to see starts and ends; the sampler side (`Tuner`) and the objective are plain Python.
"""

from __future__ import annotations

import html
import itertools
import json
import logging
import math
import random
import shlex
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from raysweep import grid, placement, surrogate
from raysweep.campaign import Campaign, CampaignSpec, TuneObjective, TuneParam, TuneSpec, register_check
from raysweep.errors import CampaignError
from raysweep.ledger import Ledger, PointState
from raysweep.plan import Plan, PointRun, ServeConfig, make_serve, serve_points
from raysweep.workload import EventSink, Workload

__all__ = ["STATES", "TuneWork", "TunedCluster", "Tuner", "candidate_serve", "check_tune", "distribution", "refusal",
           "beaten", "dry_run_estimate", "dry_run_lines", "hypervolume", "leaderboard", "pareto_front", "report_section",
           "restore_plan", "rung_sizes"]

log = logging.getLogger(__name__)
optuna.logging.set_verbosity(optuna.logging.WARNING)

STATES = ("running", "complete", "pruned", "failed", "refused")
SHAPE_KEYS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
SLA_CAPACITY = "sla_capacity"
MAX_ASKS = 50      # proposals in a row that bring nothing new before the sampler counts as exhausted
GRID_LIMIT = 100_000
# Pareto: a bench point is beaten only by one that stays better when it is this much better (the noise of one
# measurement is a few %); the last POLISH_SHARE of the budget goes to neighbours of the configurations whose
# points, each LIFT better, would add to the front
FRONT_MARGIN = 0.03
POLISH_SHARE = 0.15
LIFT = 0.03
# candidates drawn by the sampler (TPE: at random) before its model, or in Pareto mode `raysweep.surrogate`,
# proposes; the surrogate scores a finite space whole up to MODEL_CANDIDATES configurations, else as many drawn
STARTUP = 16
MODEL_CANDIDATES = 1024

# ---------------------------------------------------------------------------------------------------
# The space and its checks
# ---------------------------------------------------------------------------------------------------


def _whole(v: float | None) -> bool:
    return v is None or float(v).is_integer()


def distribution(key: str, p: TuneParam, fld: str) -> BaseDistribution:
    """The Optuna distribution of one dimension; refuses (CampaignError at `fld`) what is not a valid one."""
    if p.choices is not None:
        if p.low is not None or p.high is not None or p.log or p.step is not None:
            raise CampaignError(fld, "give either choices: [...] or a range (low, high, log, step), not both")
        if not p.choices:
            raise CampaignError(f"{fld}.choices", "must hold at least one value")
        for v in p.choices:
            if not (v is None or isinstance(v, (bool, int, float, str))):
                raise CampaignError(f"{fld}.choices", f"takes numbers, strings, booleans or null, got {v!r}")
        if len({repr(v) for v in p.choices}) != len(p.choices):
            raise CampaignError(f"{fld}.choices", f"holds a value twice: {p.choices}")
        if grid.normalize_key(key) in SHAPE_KEYS and not all(isinstance(v, int) and v >= 1 for v in p.choices):
            raise CampaignError(f"{fld}.choices", f"{key} takes positive integers, got {p.choices}")
        return CategoricalDistribution(tuple(p.choices))
    if p.low is None or p.high is None:
        raise CampaignError(fld, "give choices: [...] or a range with both low: and high:")
    if p.low > p.high:
        raise CampaignError(fld, f"low {p.low:g} is above high {p.high:g}")
    if p.log and p.low <= 0:
        raise CampaignError(f"{fld}.low", f"must be above 0 on a log scale, got {p.low:g}")
    if p.log and p.step is not None:
        raise CampaignError(f"{fld}.step", "has no meaning on a log scale; remove it or log")
    is_int = p.type == "int" or (p.type is None and _whole(p.low) and _whole(p.high) and _whole(p.step))
    if grid.normalize_key(key) in SHAPE_KEYS and not (is_int and p.low >= 1):
        raise CampaignError(fld, f"{key} takes a range of positive integers")
    if is_int:
        if not (_whole(p.low) and _whole(p.high) and _whole(p.step)):
            raise CampaignError(fld, "type int needs whole low, high and step")
        return IntDistribution(int(p.low), int(p.high), log=p.log, step=int(p.step or 1))
    return FloatDistribution(float(p.low), float(p.high), log=p.log, step=p.step)


def _grid_values(d: BaseDistribution, fld: str) -> list[Any]:
    if isinstance(d, CategoricalDistribution):
        return list(d.choices)
    if isinstance(d, IntDistribution):
        return list(range(d.low, d.high + 1, d.step))
    if isinstance(d, FloatDistribution) and d.step is not None:
        n = int(round((d.high - d.low) / d.step))
        return [round(d.low + i * d.step, 12) for i in range(n + 1)]
    raise CampaignError(fld, "sampler grid needs choices, an integer range or a float range with step")


def _finite(d: BaseDistribution) -> bool:
    return isinstance(d, (CategoricalDistribution, IntDistribution)) or (
        isinstance(d, FloatDistribution) and d.step is not None)


def _draw(d: BaseDistribution, rng: random.Random) -> Any:
    """One value of a distribution, uniform (in log where asked)."""
    if isinstance(d, CategoricalDistribution):
        return rng.choice(list(d.choices))
    if isinstance(d, (IntDistribution, FloatDistribution)):
        if _finite(d):
            return rng.choice(_grid_values(d, ""))
        return math.exp(rng.uniform(math.log(d.low), math.log(d.high))) if d.log else rng.uniform(d.low, d.high)
    raise TypeError(f"no values to draw from {d!r}")


def distributions(t: TuneSpec) -> dict[str, BaseDistribution]:
    return {k: distribution(k, p, f"tune.space.{k}") for k, p in t.space.items()}


def check_tune(campaign: Campaign, serve_combos: list[dict[str, Any]], bench_combos: list[dict[str, Any]]) -> None:
    """Refuse (CampaignError naming the field) a `tune:` block that cannot run."""
    t = campaign.tune
    assert t is not None and campaign.serve is not None and campaign.bench is not None
    if len(serve_combos) > 1:
        raise CampaignError("serve.params", f"holds {len(serve_combos)} combinations; with tune: it may hold one "
                                            "(its values go into every candidate). Move the grid's lists into "
                                            "tune.space as {choices: [...]}")
    if not t.space:
        raise CampaignError("tune.space", "give at least one serve parameter, e.g. max_num_seqs: {choices: [64, 128]}")
    base = {grid.normalize_key(k) for k in serve_combos[0]}
    dists = {}
    for key, p in t.space.items():
        fld = f"tune.space.{key}"
        grid.check_flag_key(key, fld)
        if grid.normalize_key(key) in base:
            raise CampaignError(fld, "is also set in serve.params; keep it in one place")
        dists[key] = distribution(key, p, fld)
    known = {grid.normalize_key(k) for k in t.space} | base
    for i, rule in enumerate(t.exclude):
        for key in rule:
            if grid.normalize_key(key) not in known:
                raise CampaignError(f"tune.exclude[{i}].{key}", f"names no parameter of the space or serve.params; "
                                                                f"known: {', '.join(sorted(known))}")
    if t.sampler == "grid":
        size = 1
        for key, d in dists.items():
            size *= len(_grid_values(d, f"tune.space.{key}"))
        if size > GRID_LIMIT:
            raise CampaignError("tune.sampler", f"grid over {size} combinations; at most {GRID_LIMIT}")
    bench_cmd = shlex.split(campaign.bench.cmd or "")
    for i, o in enumerate(t.objectives):
        fld = "tune.objective" if t.objective is not None else f"tune.pareto[{i}]"
        if o.metric == SLA_CAPACITY:
            if campaign.sla is None:
                raise CampaignError(f"{fld}.metric", "sla_capacity needs an sla: section (its targets)")
            if o.per == "user":
                raise CampaignError(f"{fld}.per", "sla_capacity per user has no meaning; use none or gpu")
        elif campaign.sla is not None:
            raise CampaignError(f"{fld}.metric", f"with sla:, candidates run SLA searches, not plain points; use "
                                                 f"metric: sla_capacity (got {o.metric!r})")
        elif not o.metric.isidentifier():
            raise CampaignError(f"{fld}.metric", f"must be a result field name (e.g. output_throughput), got {o.metric!r}")
        if o.per == "user" and not all(_concurrency(b, bench_cmd) for b in bench_combos):
            raise CampaignError(f"{fld}.per", "per user divides by max_concurrency; give it in every bench point "
                                              "(bench.params or --max-concurrency in bench.cmd)")


register_check("tune", check_tune)


def _concurrency(bench: dict[str, Any], cmd: list[str]) -> float | None:
    norm = {grid.normalize_key(k): v for k, v in bench.items()}
    value = norm.get("max_concurrency", grid.find_flag_value(cmd, "--max-concurrency", "--max_concurrency"))
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


# ---------------------------------------------------------------------------------------------------
# The sampler side
# ---------------------------------------------------------------------------------------------------


def _sampler(t: TuneSpec, dists: dict[str, BaseDistribution]) -> optuna.samplers.BaseSampler:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if t.sampler == "random":
            return optuna.samplers.RandomSampler(seed=t.seed)
        if t.sampler == "grid":
            space = {k: _grid_values(d, k) for k, d in dists.items()}
            return optuna.samplers.GridSampler(space, seed=t.seed)
        if t.sampler == "nsga2":
            return optuna.samplers.NSGAIISampler(seed=t.seed, population_size=8)
        return optuna.samplers.TPESampler(seed=t.seed, multivariate=True, constant_liar=True,
                                           n_startup_trials=STARTUP)


_TO_OPTUNA = {"running": TrialState.RUNNING, "complete": TrialState.COMPLETE, "pruned": TrialState.PRUNED,
              "failed": TrialState.FAIL, "refused": TrialState.FAIL}


class Tuner:
    """An Optuna study asked and told by number; `add` puts a known candidate into it (a rebuild)."""

    def __init__(self, t: TuneSpec) -> None:
        self.t = t
        self.dists = distributions(t)
        self.single = len(t.objectives) == 1
        # numeric choices are searched as an ordered scale (their rank), so that the sampler learns from
        # neighbouring values; the grid sampler takes them as they are
        self.scales = {k: sorted(d.choices) for k, d in self.dists.items() if t.sampler != "grid"
                       and isinstance(d, CategoricalDistribution) and len(d.choices) > 2
                       and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in d.choices)}
        self.search = {k: IntDistribution(0, len(self.scales[k]) - 1) if k in self.scales else d
                       for k, d in self.dists.items()}
        self.study = optuna.create_study(sampler=_sampler(t, self.dists),
                                         directions=[o.direction for o in t.objectives])
        self.grid_size = math.prod(len(_grid_values(d, k)) for k, d in self.dists.items()) \
            if t.sampler == "grid" else None

    def ask(self, params: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        """A new trial: its study number and its parameters (`params` when given, else the sampler's)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if params is not None:
                self.study.enqueue_trial(self._ranked(params))
            trial = self.study.ask(self.search)
        return trial.number, {k: self.scales[k][v] if k in self.scales else v for k, v in trial.params.items()}

    def _ranked(self, params: dict[str, Any]) -> dict[str, Any]:
        return {k: self.scales[k].index(v) if k in self.scales and v in self.scales[k] else v
                for k, v in params.items() if k in self.search}

    def neighbours(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        """The configurations one step away from `params` in one dimension: the next value up and down of an
        ordered scale (a quarter of a range), every other value of unordered choices. Unordered choices come
        first: the sampler cannot learn them from neighbouring values, as it does an ordered scale."""
        out = []
        for key, d in self.dists.items():
            if key not in params:
                continue
            ordered = key in self.scales or not isinstance(d, CategoricalDistribution)
            for v in _steps_from(self.scales.get(key), d, params[key]):
                out.append((ordered, len(out), {**params, key: v}))
        return [p for _, _, p in sorted(out, key=lambda x: x[:2])]

    def tell(self, trial: int, state: str, values: list[float] | None = None,
             rungs: dict[str, float | None] | None = None) -> None:
        """The outcome of a running trial: complete with its values, pruned (its rung values), or failed."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if state == "complete" and values is not None:
                self.study.tell(trial, values)
            elif state == "pruned" and self.single:
                live = optuna.trial.Trial(self.study, self.study.trials[trial]._trial_id)
                for step, v in _steps(rungs):
                    live.report(v, step)
                self.study.tell(trial, state=TrialState.PRUNED)
            else:
                self.study.tell(trial, state=TrialState.FAIL)

    def tell_points(self, trial: int, points: list[list[float]]) -> None:
        """Pareto: a candidate's bench points, each a pair of objective values. The trial is told the first;
        each other pair goes in as one more finished trial of the same parameters, so that the sampler
        learns the whole trade-off a configuration spans, not only its best value of each objective."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.study.tell(trial, points[0])
        self._copies(trial, points[1:])

    def add_points(self, params: dict[str, Any], points: list[list[float]]) -> int:
        """A Pareto candidate known from the ledger, with its bench points' pairs; returns its study number."""
        number = self.add(params, "complete", points[0])
        self._copies(number, points[1:])
        return number

    def _copies(self, trial: int, points: list[list[float]]) -> None:
        done = self.study.trials[trial]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for values in points:
                self.study.add_trial(create_trial(params=done.params, distributions=done.distributions,
                                                  values=values))

    def add(self, params: dict[str, Any], state: str, values: list[float] | None = None,
            rungs: dict[str, float | None] | None = None) -> int:
        """A candidate known from the ledger; returns its study number (a running one is told later)."""
        if state == "complete" and values is None:
            state = "failed"
        st = _TO_OPTUNA[state]
        if st == TrialState.PRUNED and not self.single:
            st = TrialState.FAIL
        kwargs: dict[str, Any] = {"params": self._ranked(params), "distributions": self.search, "state": st}
        if st == TrialState.COMPLETE:
            kwargs["values"] = values
        if st == TrialState.PRUNED:
            kwargs["intermediate_values"] = dict(_steps(rungs))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.study.add_trial(create_trial(**kwargs))
        return self.study.trials[-1].number


def _steps_from(scale: list[Any] | None, d: BaseDistribution, v: Any) -> list[Any]:
    """The values one step from v in one dimension (see `Tuner.neighbours`)."""
    if scale is not None:
        i = scale.index(v) if v in scale else None
        return [] if i is None else [scale[j] for j in (i - 1, i + 1) if 0 <= j < len(scale)]
    if isinstance(d, CategoricalDistribution):
        return [c for c in d.choices if repr(c) != repr(v)]
    if not isinstance(d, (IntDistribution, FloatDistribution)) or not isinstance(v, (int, float)):
        return []
    if d.log:
        f = (d.high / d.low) ** 0.25
        near = [v / f, v * f]
    else:
        near = [v - (d.high - d.low) / 4, v + (d.high - d.low) / 4]
    out = []
    for w in near:
        w = min(d.high, max(d.low, w))
        if d.step is not None:
            w = d.low + round((w - d.low) / d.step) * d.step
        w = int(round(w)) if isinstance(d, IntDistribution) else float(w)
        if w != v and w not in out:
            out.append(w)
    return out


def _steps(rungs: dict[str, float | None] | None) -> list[tuple[int, float]]:
    return sorted((int(k), float(v)) for k, v in (rungs or {}).items() if v is not None and math.isfinite(v))


# ---------------------------------------------------------------------------------------------------
# Candidates in the plan
# ---------------------------------------------------------------------------------------------------


def candidate_serve(spec: CampaignSpec, params: dict[str, Any]) -> ServeConfig:
    """A candidate's server configuration: serve.params' one combination with the sampled values."""
    return make_serve(spec, {**spec.serve_combos[0], **params})


def restore_plan(plan: Plan, ledger: Ledger) -> None:
    """Put the ledger's candidates back into the plan (before `Ledger.sync`, which keeps only plan points):
    a running one with all its points; an ended one with the points it finished or failed."""
    for row in ledger.candidates():
        if row["state"] == "refused":
            continue
        serve = candidate_serve(plan.spec, row["params"])
        points, searches, _ = serve_points(plan.spec, serve, plan.benches)
        if row["state"] != "running":
            kept = {p.point_id for p in ledger.points(serve_id=serve.id, in_plan_only=False)
                    if p.state in (PointState.DONE, PointState.FAILED)}
            points = [p for p in points if p.id in kept]
        plan.add(serve, points, searches)


def rung_sizes(n_bench: int, eta: int) -> list[int]:
    """The bench-point counts at which candidates are compared: n/eta, n/eta^2, ... (at least 1, below n)."""
    sizes, j = set(), 1
    while True:
        r = max(1, math.ceil(n_bench / eta ** j))
        if r < n_bench:
            sizes.add(r)
        if r == 1:
            return sorted(sizes)
        j += 1


def _load_key(bench_params: dict[str, Any]) -> tuple[float, float]:
    norm = {grid.normalize_key(k): v for k, v in bench_params.items()}

    def num(key: str) -> float:
        try:
            v = norm.get(key)
            return math.inf if v is None else float(v)
        except (TypeError, ValueError):
            return math.inf
    return num("max_concurrency"), num("request_rate")


@dataclass
class Candidate:
    number: int
    serve: ServeConfig
    params: dict[str, Any]
    state: str = "running"
    objective: list[float] | None = None
    rungs: dict[str, float | None] = field(default_factory=dict)
    reason: str | None = None
    gpu_s: float = 0.0
    trial: int | None = None
    started_at: float | None = None
    gpus: int = 0
    created_at: float = 0.0


class TuneWork(Workload):
    """The scheduler's `Work` for a `tune:` campaign: candidates asked as GPUs free up, judged at rungs,
    told when they end. `TunedCluster` calls `started`, `ended`, `review` and `refill`."""

    def __init__(self, plan: Plan, ledger: Ledger, output_dir: Path, emit: EventSink, with_gpus: bool,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(plan, ledger, output_dir, emit, with_gpus)
        assert self.c.tune is not None
        self.t: TuneSpec = self.c.tune
        self.clock = clock
        self.tuner = Tuner(self.t)
        self.objectives = self.t.objectives
        self.cands: dict[int, Candidate] = {}
        self.by_serve: dict[str, Candidate] = {}
        self.nodes_now: list[placement.NodeInfo] = []
        self.exhausted: str | None = None
        self._records: dict[str, dict[str, Any]] = {}
        self.refused: set[str] = set()  # configurations refused once: a proposal of one again is not recorded
        self.polished: dict[int, int] = {}  # candidate -> the front configuration it is one step from
        self.modelled: set[int] = set()     # candidates the surrogate proposed (Pareto, after the start-up)
        self.t0 = clock()
        self._restore()

    # -- ledger ----------------------------------------------------------------------------------------

    def _restore(self) -> None:
        serves = {s.id: s for s in self.plan.serves}
        for row in self.ledger.candidates():
            serve = serves.get(row["serve_id"]) or candidate_serve(self.plan.spec, row["params"])
            cand = Candidate(row["number"], serve, row["params"], row["state"], row["objective"], row["rungs"],
                             row["reason"], row["gpu_s"], gpus=row["gpu_count"], created_at=row["created_at"])
            points = self._points(cand) if cand.state in ("complete", "pruned") and self._by_points() else []
            cand.trial = (self.tuner.add_points(cand.params, points) if points else
                          self.tuner.add(cand.params, cand.state, cand.objective, cand.rungs))
            self.cands[cand.number] = cand
            if cand.state != "refused":
                self.by_serve[serve.id] = cand
            else:
                self.refused.add(serve.id)
        if self.cands:
            self.t0 = min(self.t0, min(c.created_at for c in self.cands.values()))
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
            loads = sorted({_load_key(p.bench.params) for p in points})
            ends = [loads[-1], loads[0]] + loads[-2:0:-1] if loads else []
            rank = {load: ends.index(load) for load in loads}
            return sorted(points, key=lambda p: (rank[_load_key(p.bench.params)], p.bench.id, p.run))
        high_first = self.objectives[0].direction == "maximize" and self.objectives[0].per != "user"
        return sorted(points, key=lambda p: (tuple(-v if high_first else v for v in _load_key(p.bench.params)),
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
        values = self.values(cand.serve.id, None)
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
        points = self._points(cand) if cand.state in ("complete", "pruned") and self._by_points() else []
        if points:
            self.tuner.tell_points(trial, points)
        else:
            self.tuner.tell(trial, cand.state if cand.state != "running" else "failed", cand.objective, cand.rungs)

    # -- objective ---------------------------------------------------------------------------------------

    def _record(self, row: Any) -> dict[str, Any] | None:
        if row.point_id not in self._records:
            path = self.output_dir / (row.result_path or "")
            try:
                self._records[row.point_id] = json.loads(path.read_text())
            except (OSError, ValueError):
                return None
        return self._records[row.point_id]

    def values(self, serve_id: str, bench_ids: Sequence[str] | None) -> list[float | None]:
        """Each objective of a configuration over these bench points (None: all of them)."""
        return [self._value(serve_id, o, bench_ids) for o in self.objectives]

    def _value(self, serve_id: str, o: TuneObjective, bench_ids: Sequence[str] | None) -> float | None:
        cand = self.by_serve[serve_id]
        gpus = max(1, cand.serve.shape.gpu_count)
        per_bench: dict[str, list[float]] = {}
        if o.metric == SLA_CAPACITY:
            for r in self.ledger.searches():
                if r["serve_id"] == serve_id and (bench_ids is None or r["bench_id"] in bench_ids):
                    cap = r["largest_pass"] if r["largest_pass"] is not None else 0.0
                    per_bench.setdefault(r["bench_id"], []).append(cap)
            caps = [min(v) for v in per_bench.values()]  # every target must hold
            return _aggregate([c / (gpus if o.per == "gpu" else 1) for c in caps], o) if caps else None
        per = self._per_bench(cand, o, bench_ids)
        return _aggregate(list(per.values()), o) if per else None

    def _by_points(self) -> bool:
        """Pareto over result fields: each bench point of a candidate is one point of the trade-off."""
        return len(self.objectives) == 2 and all(o.metric != SLA_CAPACITY for o in self.objectives)

    def _points(self, cand: Candidate, bench_ids: Sequence[str] | None = None) -> list[list[float]]:
        """Pareto: the pair of objective values of each bench point the candidate finished."""
        a, b = (self._per_bench(cand, o, bench_ids) for o in self.objectives)
        return [[a[k], b[k]] for k in a if k in b]

    def _per_bench(self, cand: Candidate, o: TuneObjective, bench_ids: Sequence[str] | None) -> dict[str, float]:
        """One objective at each bench point the candidate finished (mean over its runs)."""
        gpus = max(1, cand.serve.shape.gpu_count)
        per_bench: dict[str, list[float]] = {}
        for row in self.ledger.points(serve_id=cand.serve.id):
            if row.state != PointState.DONE or (bench_ids is not None and row.bench_id not in bench_ids):
                continue
            rec = self._record(row)
            v = None if rec is None else rec.get(o.metric)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                continue
            if o.per == "gpu":
                v = v / gpus
            elif o.per == "user":
                users = _concurrency(row.bench_params, self.plan.spec.bench_argv)
                if not users:
                    continue
                v = v / users
            per_bench.setdefault(row.bench_id, []).append(float(v))
        return {b: sum(v) / len(v) for b, v in per_bench.items()}

    # -- early stopping ----------------------------------------------------------------------------------

    def review(self) -> list[tuple[str, str]]:
        """Judge running candidates at the rungs they reached; (serve id, reason) of each to stop now."""
        es = self.t.early_stop
        if not es.enabled or any(o.metric == SLA_CAPACITY for o in self.objectives):
            return []
        judge = self._judge if len(self.objectives) == 1 else self._judge_front
        stop = []
        for cand in self.live():
            reason = judge(cand, es.eta, es.min_peers)
            if reason:
                cand.state, cand.reason = "pruned", reason
                self._save(cand)
                self._tell(cand)
                log.info("candidate %d (%s) stopped: %s", cand.number, cand.serve.label, reason)
                self.emit("candidate_done", number=cand.number, serve=cand.serve, state="pruned", objective=None,
                          reason=reason)
                stop.append((cand.serve.id, f"stopped early: {reason}"))
        return stop

    def _judge(self, cand: Candidate, eta: int, min_peers: int) -> str | None:
        order, reached = self._reached(cand)
        o = self.objectives[0]
        for r in rung_sizes(len(order), eta):
            if r > reached or str(r) in cand.rungs:
                continue
            v = self._value(cand.serve.id, o, order[:r])
            cand.rungs[str(r)] = v
            self._save(cand)
            if v is None:
                continue
            peers = [c.rungs[str(r)] for c in self.cands.values() if c.rungs.get(str(r)) is not None]
            if len(peers) < min_peers:
                continue
            better = sum(1 for p in peers if (p > v if o.direction == "maximize" else p < v))
            keep = math.ceil(len(peers) / eta)
            if better >= keep:
                what = o.metric + {"none": "", "gpu": " per GPU", "user": " per user"}[o.per]
                return (f"rung {r} of {len(order)} bench point(s): {what} {v:.4g} ranks {better + 1} of "
                        f"{len(peers)}; only the best {keep} go on (eta {eta})")
        return None

    def _reached(self, cand: Candidate) -> tuple[list[str], int]:
        """The candidate's bench ids in run order, and how many of them in a row it finished."""
        order = self.bench_order(cand.serve.id)
        done = self._done_benches(cand.serve.id)
        reached = 0
        for b in order:
            if b not in done:
                break
            reached += 1
        return order, reached

    def _judge_front(self, cand: Candidate, eta: int, min_peers: int) -> str | None:
        """Pareto: at a rung, a candidate none of whose points is off the others' dominated area stops.
        Its rung value is how many of its points no other candidate's point dominates."""
        order, reached = self._reached(cand)
        dirs = [o.direction for o in self.objectives]
        for r in rung_sizes(len(order), eta):
            if r > reached or str(r) in cand.rungs:
                continue
            mine = self._points(cand, order[:r])
            others = [q for c in self.cands.values() if c is not cand and c.state != "refused"
                      for q in self._points(c)]
            alive = [p for p in mine if not beaten(p, others, dirs, FRONT_MARGIN)]
            cand.rungs[str(r)] = float(len(alive))
            self._save(cand)
            peers = sum(1 for c in self.cands.values() if c is not cand and str(r) in c.rungs)
            if mine and not alive and peers >= min_peers:
                return (f"rung {r} of {len(order)} bench point(s): each of its {len(mine)} point(s) is dominated "
                        f"by another candidate's")
        return None

    def _done_benches(self, serve_id: str) -> set[str]:
        by_bench: dict[str, list[bool]] = {}
        for p in self.ledger.points(serve_id=serve_id):
            ended = p.state == PointState.DONE or (p.state == PointState.FAILED and p.attempts >= self.c.max_attempts)
            by_bench.setdefault(p.bench_id, []).append(ended)
        return {b for b, ends in by_bench.items() if all(ends)}

    # -- budget and new candidates -------------------------------------------------------------------------

    def gpu_hours(self) -> float:
        now = self.clock()
        return sum(c.gpu_s + (c.gpus * (now - c.started_at) if c.started_at is not None else 0.0)
                   for c in self.cands.values()) / 3600

    def _committed_hours(self) -> float:
        """What the live candidates are expected to hold still: each the mean time a complete candidate held
        its GPUs (none yet: nothing expected), less the time it has held them."""
        held = [c.gpu_s / c.gpus for c in self.cands.values() if c.state == "complete" and c.gpus]
        if not held:
            return 0.0
        mean, now = sum(held) / len(held), self.clock()
        return sum(max(1, c.gpus) * max(0.0, mean - c.gpu_s / max(1, c.gpus)
                                         - (now - c.started_at if c.started_at is not None else 0.0))
                   for c in self.live()) / 3600

    def budget_left(self) -> str | None:
        """None while the budget allows another candidate, else what ran out."""
        b = self.t.budget
        tried = sum(1 for c in self.cands.values() if c.state != "refused")
        if b.candidates is not None and tried >= b.candidates:
            return f"{tried} candidate(s) tried (budget {b.candidates})"
        if b.gpu_hours is not None and self.gpu_hours() + self._committed_hours() >= b.gpu_hours:
            return (f"{self.gpu_hours():.2f} GPU-hours used, {self._committed_hours():.2f} more expected of the "
                    f"candidates running (budget {b.gpu_hours:g})")
        hours = (self.clock() - self.t0) / 3600
        if b.wall_hours is not None and hours >= b.wall_hours:
            return f"{hours:.2f} hours since the first candidate (budget {b.wall_hours:g})"
        return self.exhausted

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
                self.exhausted = "the sampler proposes nothing new"
                return
            misses = 0 if self._new_candidate() else misses + 1

    def _polishing(self) -> bool:
        """Pareto: the last POLISH_SHARE of the budget (of whichever limit is nearest) goes to neighbours of
        the configurations on or near the front, instead of the sampler's proposals."""
        if not self._by_points() or POLISH_SHARE <= 0 or self.t.sampler == "grid":
            return False
        b, spent = self.t.budget, []
        if b.candidates is not None:
            spent.append(sum(1 for c in self.cands.values() if c.state != "refused") / b.candidates)
        if b.gpu_hours is not None:
            spent.append((self.gpu_hours() + self._committed_hours()) / b.gpu_hours)
        if b.wall_hours is not None:
            spent.append((self.clock() - self.t0) / 3600 / b.wall_hours)
        return max(spent, default=0.0) >= 1 - POLISH_SHARE

    def front_owners(self) -> list[tuple[Candidate, float]]:
        """The candidates whose bench points, each LIFT better, would add to the hypervolume of every point
        run (those on or near the front), with what they would add, the most first."""
        dirs = [o.direction for o in self.objectives]
        pts = [(c, p) for c in self.cands.values() if c.state != "refused" for p in self._points(c)]
        if not pts:
            return []
        every = [p for _, p in pts]
        worst = [min(v) if d == "maximize" else max(v) for v, d in zip(zip(*every), dirs)]
        whole = hypervolume(every, dirs, worst)
        gain: dict[int, float] = {}
        for c in {id(c): c for c, _ in pts}.values():
            mine = [_lifted(p, dirs, LIFT) for p in self._points(c)]
            g = hypervolume(every + mine, dirs, worst) - whole
            if g > 0:
                gain[c.number] = g
        return sorted(((self.cands[n], g) for n, g in gain.items()), key=lambda x: (-x[1], x[0].number))

    def polish_next(self) -> tuple[Candidate, dict[str, Any]] | None:
        """The next neighbour not tried yet of a configuration on or near the front, and that configuration:
        the one whose lifted points add the most, divided by one more than its neighbours tried so far."""
        best: tuple[float, Candidate, dict[str, Any]] | None = None
        for owner, gain in self.front_owners():
            near = self.tuner.neighbours(owner.params)
            ids = [candidate_serve(self.plan.spec, p).id for p in near]
            left = [p for p, sid in zip(near, ids) if sid not in self.by_serve and sid not in self.refused]
            score = gain / (1 + len(near) - len(left))
            if left and (best is None or score > best[0]):
                best = (score, owner, left[0])
        return None if best is None else best[1:]

    def model_next(self) -> dict[str, Any] | None:
        """Pareto over result fields, after the sampler's start-up candidates: the untried configuration
        whose optimistic predicted bench points add the most hypervolume to the points run
        (`raysweep.surrogate`); None before there is enough to go on, or when every configuration is tried."""
        tried = [c for c in self.cands.values() if c.state != "refused"]
        if not self.t.pareto_model or self.t.sampler == "grid" or len(tried) < STARTUP:
            return None
        loads = {b.id: _load_key(b.params) for b in self.plan.benches}
        xs, ys, run = [], [], []
        for c in tried:
            a, b = (self._per_bench(c, o, None) for o in self.objectives)
            for bid in a:
                if bid in b:
                    run.append([a[bid], b[bid]])
                    if a[bid] > 0 and b[bid] > 0:
                        xs.append(self._features(c.params, loads[bid], loads))
                        ys.append([a[bid], b[bid]])
        untried = self._untried()
        found = surrogate.best_addition(xs, ys, [[self._features(p, loads[bid], loads) for bid in loads]
                                                 for p in untried], run,
                                        [o.direction for o in self.objectives], hypervolume)
        return None if found is None else untried[found[0]]

    def _features(self, params: dict[str, Any], load: tuple[float, float],
                  loads: dict[str, tuple[float, float]]) -> list[float]:
        """A configuration at a bench load, each parameter and each varying part of the load in [0, 1]:
        ordered scales by rank, ranges by value (log where asked), unordered choices one-hot."""
        out: list[float] = []
        for key, d in self.tuner.dists.items():
            v = params[key]
            scale = self.tuner.scales.get(key)
            if scale is not None:
                out.append(scale.index(v) / max(1, len(scale) - 1))
            elif isinstance(d, CategoricalDistribution):
                i = [repr(c) for c in d.choices].index(repr(v))
                out.extend([float(i)] if len(d.choices) == 2 else [float(i == j) for j in range(len(d.choices))])
            elif isinstance(d, (IntDistribution, FloatDistribution)):
                lo, hi, x = (math.log(d.low), math.log(d.high), math.log(v)) if d.log else (d.low, d.high, v)
                out.append((x - lo) / (hi - lo) if hi > lo else 0.0)
        for part in range(2):  # max_concurrency, request_rate where they vary: log scale, unbounded at 1
            values = {v[part] for v in loads.values()}
            if len(values) < 2:
                continue
            finite = sorted(v for v in values if math.isfinite(v) and v > 0)
            x = load[part]
            if not math.isfinite(x):
                out.append(1.0)
            elif len(finite) < 2 or x <= 0:
                out.append(0.0)
            else:
                top = 0.8 if len(finite) < len(values) else 1.0  # room above for the unbounded load
                out.append(top * (math.log(x) - math.log(finite[0])) / (math.log(finite[-1]) - math.log(finite[0])))
        return out

    def _untried(self) -> list[dict[str, Any]]:
        """Configurations not tried, refused or excluded: all of a finite space up to MODEL_CANDIDATES, else
        that many drawn at random."""
        dists = self.tuner.dists
        values = {k: _grid_values(d, k) if _finite(d) else None for k, d in dists.items()}
        size = math.prod(len(v) for v in values.values()) if all(v is not None for v in values.values()) else None
        if size is not None and size <= MODEL_CANDIDATES:
            combos = [dict(zip(values, c)) for c in itertools.product(*values.values())]  # type: ignore[arg-type]
        else:
            rng = random.Random(f"{self.t.seed}-{len(self.cands)}")
            combos = [{k: _draw(d, rng) for k, d in dists.items()} for _ in range(MODEL_CANDIDATES)]
        out, seen = [], set()
        for params in combos:
            serve = candidate_serve(self.plan.spec, params)
            if serve.id in seen or serve.id in self.by_serve or serve.id in self.refused:
                continue
            seen.add(serve.id)
            if refusal(self.t, serve, self.nodes_now) is None:
                out.append(params)
        return out

    def _new_candidate(self) -> bool:
        polish = self.polish_next() if self._polishing() else None
        chosen = polish[1] if polish else self.model_next() if self._by_points() else None
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
        refusal = self._refusal(serve)
        if refusal:
            self.refused.add(serve.id)
            cand.state, cand.reason = "refused", refusal
            self.cands[number] = cand
            self._save(cand)
            self.tuner.tell(trial, "refused")
            log.info("candidate %d (%s) refused: %s", number, serve.label, refusal)
            return False
        points, searches, _ = serve_points(self.plan.spec, serve, self.plan.benches)
        if not points:
            self.refused.add(serve.id)
            cand.state, cand.reason = "refused", "no bench point matches it (link)"
            self.cands[number] = cand
            self._save(cand)
            self.tuner.tell(trial, "refused")
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

    def _refusal(self, serve: ServeConfig) -> str | None:
        return refusal(self.t, serve, self.nodes_now)


def refusal(t: TuneSpec, serve: ServeConfig, nodes: list[placement.NodeInfo] | None) -> str | None:
    """Why a candidate is refused (it matches `tune.exclude`, or no node of the cluster can hold it), or None."""
    norm = {grid.normalize_key(k): v for k, v in serve.params.items()}
    for rule in t.exclude:
        if all(grid.normalize_key(k) in norm and str(norm[grid.normalize_key(k)]) == str(v) for k, v in rule.items()):
            return f"matches tune.exclude {rule}"
    if nodes:
        lay = placement.layout_for(serve.shape, serve.rule, nodes)
        if isinstance(lay, str):
            return f"can never be placed on this cluster: {lay}"
    return None


def _aggregate(values: list[float], o: TuneObjective) -> float:
    if o.aggregate == "mean":
        return sum(values) / len(values)
    best = (o.aggregate == "best") == (o.direction == "maximize")
    return max(values) if best else min(values)


class TunedCluster:
    """The scheduler's `Cluster` seen by a tuning campaign: starts and ends reach `TuneWork`, which stops
    pruned candidates and asks for new ones each time the scheduler looks at what ended."""

    def __init__(self, inner: Any, work: TuneWork) -> None:
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


# ---------------------------------------------------------------------------------------------------
# Reading a tuning campaign: leaderboard, Pareto front, dry run, report
# ---------------------------------------------------------------------------------------------------


def _dominates(q: Sequence[float], p: Sequence[float], directions: Sequence[str]) -> bool:
    """q is at least as good as p in both objectives, and not the same point."""
    sign = [1 if d == "maximize" else -1 for d in directions]
    return all(a * s >= b * s for a, b, s in zip(q, p, sign)) and list(q) != list(p)


def _lifted(p: Sequence[float], directions: Sequence[str], margin: float) -> list[float]:
    """p made `margin` (a fraction of each value) better in each objective: larger when maximized, else smaller."""
    return [v + abs(v) * margin if d == "maximize" else v - abs(v) * margin for v, d in zip(p, directions)]


def beaten(p: Sequence[float], others: Sequence[Sequence[float]], directions: Sequence[str], margin: float) -> bool:
    """Some point of `others` dominates p even when p is `margin` better in each objective."""
    lifted = _lifted(p, directions, margin)
    return any(_dominates(q, lifted, directions) for q in others)


def hypervolume(points: Sequence[Sequence[float]], directions: Sequence[str], ref: Sequence[float]) -> float:
    """The area two-objective points dominate, bounded by the reference point `ref`."""
    sx, sy = (1 if d == "maximize" else -1 for d in directions)
    flat = [(sx * (p[0] - ref[0]), sy * (p[1] - ref[1])) for p in points]  # both maximized from (0, 0)
    flat = [q for q in flat if q[0] > 0 and q[1] > 0]
    area, top = 0.0, 0.0
    for x, y in sorted(flat, reverse=True):
        if y > top:
            area += x * (y - top)
            top = y
    return area


def pareto_front(points: list[tuple[float, float]], directions: Sequence[str]) -> list[int]:
    """Indices of the points no other point dominates."""
    return [i for i, p in enumerate(points) if not any(_dominates(q, p, directions) for q in points)]


def leaderboard(campaign: dict[str, Any], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Candidates best first: complete ones by objective (Pareto: the front first), then pruned by their
    last rung, then failed and refused. Each row gains `rank` and `on_front` (Pareto)."""
    t = TuneSpec.model_validate(campaign["tune"])
    objs = t.objectives
    done = [r for r in rows if r["state"] == "complete" and r["objective"]]
    if len(objs) == 2:
        front = set(pareto_front([tuple(r["objective"]) for r in done], [o.direction for o in objs]))  # type: ignore[misc]
        for i, r in enumerate(done):
            r["on_front"] = i in front
        sign = 1 if objs[0].direction == "maximize" else -1
        done.sort(key=lambda r: (not r["on_front"], -sign * r["objective"][0]))
    else:
        sign = 1 if objs[0].direction == "maximize" else -1
        done.sort(key=lambda r: -sign * r["objective"][0])

    def last_rung(r: dict[str, Any]) -> float:
        steps = _steps(r["rungs"])
        return -sign * steps[-1][1] if steps else math.inf
    pruned = sorted((r for r in rows if r["state"] == "pruned"), key=lambda r: (-len(_steps(r["rungs"])), last_rung(r)))
    rest = [r for r in rows if r["state"] in ("running",)] + [r for r in rows if r["state"] in ("failed", "refused")]
    out = done + pruned + rest
    for i, r in enumerate(out):
        r["rank"] = i + 1
    return out


def objective_names(t: TuneSpec) -> list[str]:
    return [o.metric + {"none": "", "gpu": " per GPU", "user": " per user"}[o.per] + f" ({o.direction})"
            for o in t.objectives]


def dry_run_lines(plan: Plan, nodes: list[placement.NodeInfo] | None = None,
                  describe: Callable[[ServeConfig, placement.Layout], list[str]] | None = None,
                  first: int = 4) -> list[str]:
    """The space, objective, budget and sampler, what each candidate runs, and the first candidates the
    sampler would ask for (with a seed, the ones the run starts with)."""
    t = plan.spec.campaign.tune
    assert t is not None
    lines = ["", f"Tuning with sampler {t.sampler}" + (f" (seed {t.seed})" if t.seed is not None else "")
             + ", space:"]
    for key, p in t.space.items():
        if p.choices is not None:
            lines.append(f"  {key}: choices {p.choices}")
        else:
            lines.append(f"  {key}: {p.low:g} .. {p.high:g}" + (" log" if p.log else "")
                         + (f" step {p.step:g}" if p.step else ""))
    lines += [f"  exclude: {rule}" for rule in t.exclude]
    if plan.spec.serve_combos[0]:
        lines.append(f"  every candidate also sets: {grid.combo_label(plan.spec.serve_combos[0])}")
    names = objective_names(t)
    lines.append(("Objective: " if len(names) == 1 else "Pareto front of: ") + " and ".join(names)
                 + f", {t.objectives[0].aggregate} over each candidate's bench points")
    b = t.budget
    parts = [f"{b.candidates} candidates" if b.candidates else "", f"{b.gpu_hours:g} GPU-hours" if b.gpu_hours else "",
             f"{b.wall_hours:g} hours" if b.wall_hours else ""]
    given = [x for x in parts if x]
    lines.append("Budget: " + " or ".join(given) + (", whichever comes first" if len(given) > 1 else "") + "; "
                 + (f"{t.parallel} candidate(s) at once" if t.parallel else "as many at once as free GPUs allow"))
    es = t.early_stop
    single = len(t.objectives) == 1 and t.objectives[0].metric != SLA_CAPACITY
    lines.append(f"Early stopping: successive halving, eta {es.eta}, from {es.min_peers} candidates at a rung"
                 if es.enabled and single else "Early stopping: off")
    lines.append(f"Each candidate runs {len(plan.benches)} bench point(s) x {plan.spec.campaign.runs} run(s):")
    for bp in plan.benches:
        lines.append(f"  [bench {bp.id}] {bp.label}: {grid.shell_join(grid.mask_argv(bp.argv))}")
    tuner = Tuner(t)
    lines += ["", f"First candidates the sampler asks for ({first}):"]
    for i in range(first):
        _, params = tuner.ask()
        serve = candidate_serve(plan.spec, params)
        lines.append(f"[candidate {i}] {serve.label}  shape: {serve.shape.describe()} gpus={serve.shape.gpu_count}")
        why = refusal(t, serve, nodes)
        lay = placement.layout_for(serve.shape, serve.rule, nodes) if nodes and why is None else None
        if why is not None:
            lines.append(f"  refused: {why}")
        elif describe is not None and isinstance(lay, placement.Layout):
            lines += describe(serve, lay)
        else:
            lines.append(f"  command: {grid.shell_join(serve.display_argv())} --host <node ip> --port <free port>")
    return lines


def dry_run_estimate(plan: Plan, measured: Any = None, first: int = 4) -> str:
    """What one candidate costs (the mean of the first candidates the sampler asks for, from the commands or
    what `measured` holds), and what the budget's candidate count would then hold at most."""
    from raysweep.estimate import estimate, format_duration

    t = plan.spec.campaign.tune
    assert t is not None
    tuner, costs = Tuner(t), []
    for _ in range(first):
        _, params = tuner.ask()
        serve = candidate_serve(plan.spec, params)
        if refusal(t, serve, None):
            continue
        points, _, _ = serve_points(plan.spec, serve, plan.benches)
        one = Plan(spec=plan.spec, serves=[serve], benches=plan.benches, points=points, fingerprint=plan.fingerprint)
        costs.append(estimate(one, measured=measured))
    if not costs:
        return "Estimate: none (the first candidates are all refused)"
    wall = sum(e.wall_s for e in costs) / len(costs)
    gpu_h = sum(e.gpu_hours for e in costs) / len(costs)
    text = (f"Estimate ({costs[0].basis}): one candidate about {format_duration(wall)} and {gpu_h:.2f} GPU-hour(s) "
            f"run to its end (the mean of the first {len(costs)})")
    if t.budget.candidates:
        text += f"; {t.budget.candidates} candidates at most about {t.budget.candidates * gpu_h:.1f} GPU-hour(s)"
    return text + "; early stopping and the budget cut it short"


def _figure_html(fig: Any, caption: str) -> str:
    """The figure as the report embeds it (a base64 PNG with its caption), then closed."""
    import matplotlib.pyplot as plt

    from raysweep.report import _img

    try:
        return _img(fig, caption)
    finally:
        plt.close(fig)


def _importance(t: TuneSpec, rows: list[dict[str, Any]]) -> dict[str, float]:
    tuner = Tuner(t.model_copy(update={"sampler": "random"}))
    for r in rows:
        if r["state"] == "complete" and r["objective"]:
            tuner.add(r["params"], "complete", r["objective"])
    if sum(1 for tr in tuner.study.trials if tr.state == TrialState.COMPLETE) < 3 or len(t.space) < 2:
        return {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return dict(optuna.importance.get_param_importances(
                tuner.study, target=(lambda tr: tr.values[0]) if len(t.objectives) > 1 else None))
    except (RuntimeError, ValueError) as exc:
        log.info("parameter importance: %s", exc)
        return {}


def report_section(output_dir: Path) -> str | None:
    """The report's tuning section (its HTML without the heading): the leaderboard, the objective over
    candidates, parameter importance and (two objectives) the Pareto front of candidates. None for a
    campaign without `tune:`."""
    try:
        ledger = Ledger.open_existing(output_dir)
    except Exception:  # noqa: BLE001 - no ledger: no section
        return None
    try:
        campaign, rows = ledger.stored_campaign(), ledger.candidates()
    finally:
        ledger.close()
    if not campaign.get("tune") or not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = TuneSpec.model_validate(campaign["tune"])
    board = leaderboard(campaign, [dict(r) for r in rows])
    names = objective_names(t)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in ["rank", "candidate", "state", *names, "parameters",
                                                          "GPU-hours", "reason"])
    body = []
    for r in board:
        objs = r["objective"] or [None] * len(names)
        cells = [r["rank"], r["number"], r["state"] + (" (front)" if r.get("on_front") else ""),
                 *[("-" if v is None else f"{v:.4g}") for v in objs], grid.combo_label(r["params"]),
                 f"{r['gpu_s'] / 3600:.3f}", r["reason"] or ""]
        body.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    parts = [f"<p>{len(rows)} candidate(s); objective: {html.escape(' and '.join(names))}.</p>",
             f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"]
    done = [r for r in rows if r["state"] == "complete" and r["objective"]]
    if done:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.scatter([r["number"] for r in done], [r["objective"][0] for r in done], label="complete")
        pruned = [(r["number"], _steps(r["rungs"])[-1][1]) for r in rows if r["state"] == "pruned" and _steps(r["rungs"])]
        if pruned:
            ax.scatter(*zip(*pruned), marker="x", color="grey", label="stopped (last rung)")
        best, run = [], None
        for r in sorted(done, key=lambda r: r["number"]):
            v = r["objective"][0]
            run = v if run is None else (max(run, v) if t.objectives[0].direction == "maximize" else min(run, v))
            best.append((r["number"], run))
        ax.step(*zip(*best), where="post", color="black", label="best so far")
        ax.set_xlabel("candidate")
        ax.set_ylabel(names[0])
        ax.legend(fontsize=8)
        parts.append(_figure_html(fig, f"{names[0]} over candidates"))
    imp = _importance(t, rows)
    if imp:
        fig, ax = plt.subplots(figsize=(6, 0.5 + 0.4 * len(imp)))
        keys = list(imp)[::-1]
        ax.barh(keys, [imp[k] for k in keys])
        ax.set_xlabel("importance (fANOVA)")
        parts.append(_figure_html(fig, f"parameter importance for {names[0]}"))
    if len(names) == 2 and done:
        pts = [tuple(r["objective"]) for r in done]
        front = pareto_front(pts, [o.direction for o in t.objectives])  # type: ignore[arg-type]
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], color="grey", label="candidates")
        fp = sorted(pts[i] for i in front)
        ax.plot([p[0] for p in fp], [p[1] for p in fp], "o-", color="C3", label="Pareto front")
        ax.set_xlabel(names[0])
        ax.set_ylabel(names[1])
        ax.legend(fontsize=8)
        parts.append(_figure_html(fig, "Pareto front of candidates"))
    return "".join(parts)

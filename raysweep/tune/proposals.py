"""Where the next Pareto candidate comes from, when not from the sampler: after the sampler's start-up, the
untried configuration whose optimistic predicted points add the most hypervolume (`raysweep.tune.surrogate`);
in the last POLISH_SHARE of the budget, a neighbour of a configuration on or near the front."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable
from typing import Any

from optuna.distributions import (
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from raysweep.campaign import TuneSpec
from raysweep.maths.pareto import LIFT, _lifted, hypervolume
from raysweep.place import placement
from raysweep.plan.plan import Plan
from raysweep.tune import surrogate
from raysweep.tune.budget import Budget
from raysweep.tune.candidates import Candidate
from raysweep.tune.objective import Objective
from raysweep.tune.sampler import STARTUP, Tuner
from raysweep.tune.space import _draw, _finite, _grid_values, candidate_serve, refusal

# the last POLISH_SHARE of the budget goes to neighbours of the configurations whose points, each LIFT better,
# would add to the front; the surrogate scores a finite space whole up to MODEL_CANDIDATES configurations,
# else as many drawn
POLISH_SHARE = 0.15
MODEL_CANDIDATES = 1024


class Proposals:
    """The Pareto tuner's own proposals, from the candidates known so far (shared with `TuneWork`)."""

    def __init__(self, t: TuneSpec, tuner: Tuner, plan: Plan,
                 objective: Objective, budget: Budget, cands: dict[int, Candidate], by_serve: dict[str, Candidate],
                 refused: set[str], nodes: Callable[[], list[placement.NodeInfo]]) -> None:
        self.t, self.tuner, self.plan = t, tuner, plan
        self.objective, self.budget = objective, budget
        self.cands, self.by_serve, self.refused = cands, by_serve, refused
        self.nodes = nodes

    def polishing(self) -> bool:
        """Pareto: the last POLISH_SHARE of the budget (of whichever limit is nearest) goes to neighbours of
        the configurations on or near the front, instead of the sampler's proposals."""
        if not self.objective.by_points() or POLISH_SHARE <= 0 or self.t.sampler == "grid":
            return False
        return self.budget.spent() >= 1 - POLISH_SHARE

    def front_owners(self) -> list[tuple[Candidate, float]]:
        """The candidates whose bench points, each LIFT better, would add to the hypervolume of every point
        run (those on or near the front), with what they would add, the most first."""
        dirs = [o.direction for o in self.objective.objectives]
        pts = [(c, p) for c in self.cands.values() if c.state != "refused" for p in self.objective.points(c)]
        if not pts:
            return []
        every = [p for _, p in pts]
        worst = [min(v) if d == "maximize" else max(v) for v, d in zip(zip(*every), dirs)]
        whole = hypervolume(every, dirs, worst)
        gain: dict[int, float] = {}
        for c in {id(c): c for c, _ in pts}.values():
            mine = [_lifted(p, dirs, LIFT) for p in self.objective.points(c)]
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
        return None if best is None else (best[1], best[2])

    def model_next(self) -> dict[str, Any] | None:
        """Pareto over result fields, after the sampler's start-up candidates: the untried configuration
        whose optimistic predicted bench points add the most hypervolume to the points run
        (`raysweep.tune.surrogate`); None before there is enough to go on, or when every configuration is tried."""
        tried = [c for c in self.cands.values() if c.state != "refused"]
        if not self.t.pareto_model or self.t.sampler == "grid" or len(tried) < STARTUP:
            return None
        loads = {b.id: b.load.key() for b in self.plan.benches}
        xs, ys, run = [], [], []
        for c in tried:
            a, b = (self.objective.per_bench(c, o, None) for o in self.objective.objectives)
            for bid in a:
                if bid in b:
                    run.append([a[bid], b[bid]])
                    if a[bid] > 0 and b[bid] > 0:
                        xs.append(self._features(c.params, loads[bid], loads))
                        ys.append([a[bid], b[bid]])
        untried = self._untried()
        found = surrogate.best_addition(xs, ys, [[self._features(p, loads[bid], loads) for bid in loads]
                                                 for p in untried], run,
                                        [o.direction for o in self.objective.objectives], hypervolume)
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
        values = {k: _grid_values(d, k) for k, d in dists.items() if _finite(d)}
        size = math.prod(len(v) for v in values.values()) if len(values) == len(dists) else None
        if size is not None and size <= MODEL_CANDIDATES:
            combos = [dict(zip(values, c)) for c in itertools.product(*values.values())]
        else:
            rng = random.Random(f"{self.t.seed}-{len(self.cands)}")
            combos = [{k: _draw(d, rng) for k, d in dists.items()} for _ in range(MODEL_CANDIDATES)]
        out, seen = [], set()
        nodes = self.nodes()
        for params in combos:
            serve = candidate_serve(self.plan.spec, params)
            if serve.id in seen or serve.id in self.by_serve or serve.id in self.refused:
                continue
            seen.add(serve.id)
            if refusal(self.t, serve, nodes) is None:
                out.append(params)
        return out

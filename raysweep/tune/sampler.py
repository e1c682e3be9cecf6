"""The sampler side: an Optuna study asked and told by number (`Tuner`), numeric choices searched as an
ordered scale, the neighbours of a configuration one step away in one dimension.

STARTUP candidates are drawn by the sampler (TPE: at random) before its model, or in Pareto mode
`raysweep.tune.proposals`, proposes; MAX_ASKS proposals in a row that bring nothing new exhaust it.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import TrialState, create_trial

from raysweep.campaign import TuneSpec
from raysweep.tune.space import _grid_values, distributions

optuna.logging.set_verbosity(optuna.logging.WARNING)


MAX_ASKS = 50      # proposals in a row that bring nothing new before the sampler counts as exhausted


# candidates drawn by the sampler (TPE: at random) before its model, or in Pareto mode the surrogate, proposes
STARTUP = 16


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



def _number(v: Any) -> float:
    return float(v)

class Tuner:
    """An Optuna study asked and told by number; `add` puts a known candidate into it (a rebuild)."""

    def __init__(self, t: TuneSpec) -> None:
        self.t = t
        self.dists = distributions(t)
        self.single = len(t.objectives) == 1
        # numeric choices are searched as an ordered scale (their rank), so that the sampler learns from
        # neighbouring values; the grid sampler takes them as they are
        self.scales = {k: sorted(d.choices, key=_number) for k, d in self.dists.items() if t.sampler != "grid"
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
        out: list[tuple[bool, int, dict[str, Any]]] = []
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

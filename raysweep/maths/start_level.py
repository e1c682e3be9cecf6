"""The level of each point at its server's start: the drift of the server's life fitted out of its interval.

A server's runs happen one after another while the machine warms up, throttles or gains neighbours. The run
order spreads such a drift over every point of the server (`raysweep.maths.order`: rounds), so that no point
takes it alone, but each point's mean is still the level averaged over the drifting life, and its t-interval
over its own runs is centred there: under a -1 %/run drift a point's 95 % interval over 5 runs holds the level
before the drift 76.3 % of the time (benchmarks/RESULTS.md, "Verdicts over time"). A drift too weak for the
trend test of one point's 5 runs is found in the server's whole timeline, where every point's runs measure it.

`start_levels` fits the logarithm of a metric's values of one server's life as one level per point plus one
slope over the runs' places in that life (points as fixed effects, the slope shared: a relative drift, alike
for every point), and gives each point the interval of its level at the server's start (place 0). A point
drifts alone when its own slope is shown to differ both from zero and from the pooled slope of the others
(two t-tests on the residual variance of a line per point, two-sided at `ALONE_ALPHA`, 1 %): it is fitted with
its own slope and left out of the shared one. The level is 1 % and not 5 % because calling a point alone picks
its most extreme lines: with 4 points of 5 runs and no drift, the intervals held the level 93.1 % of the time
at 5 % and 94.4 % at 1 % (3,000 simulated servers each, seed 11).
The residual variance is pooled over the life, so its degrees of freedom are those of all the server's runs
(runs less points less slopes), not a point's own runs less one: with 4 points of 5 runs in rounds the
interval is about as wide as the plain one when nothing drifts, and it holds the level at the start with or
without a common drift (`benchmarks/verdicts_time.py`, benchmarks/RESULTS.md "Verdicts over time"). A server
with one point fits that point's own line: an honest interval, wider than the plain one when nothing drifts.

The assumptions to state: the drift is linear over a server's life (a step is not a line: the paired verdicts
handle steps), and the run-to-run spread of the metric's logarithm is alike for the points of a life.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

__all__ = ["ALONE_ALPHA", "StartLevels", "start_levels"]

ALONE_ALPHA = 0.01   # a point drifts alone when both its tests reject at this level (see the module docstring)


@dataclass(frozen=True)
class StartLevels:
    """Per point of one server's life (its code): the log of its level at the server's start, that log's
    standard error and degrees of freedom (NaN where the point has fewer than 2 runs, or the life cannot be
    fitted), whether it was fitted alone; and the shared slope in % per place of the life."""

    log_level: np.ndarray
    log_se: np.ndarray
    df: float
    alone: np.ndarray
    slope_pct: float


def _sums(logs: np.ndarray, places: np.ndarray, points: np.ndarray, k: int) -> tuple[np.ndarray, ...]:
    """Per point: runs, mean log, mean place, and the centred sums Sxx, Sxy, Syy."""
    n = np.bincount(points, minlength=k).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        ybar = np.bincount(points, weights=logs, minlength=k) / n
        xbar = np.bincount(points, weights=places, minlength=k) / n
    xc, yc = places - xbar[points], logs - ybar[points]
    sxx = np.bincount(points, weights=xc * xc, minlength=k)
    sxy = np.bincount(points, weights=xc * yc, minlength=k)
    syy = np.bincount(points, weights=yc * yc, minlength=k)
    return n, ybar, xbar, sxx, sxy, syy


def _drifting_alone(n: np.ndarray, sxx: np.ndarray, sxy: np.ndarray, syy: np.ndarray, alpha: float) -> np.ndarray:
    """The points that drift alone: their own slope shown to differ from zero and from the pooled slope of the
    others, on the residual variance of a line per point (see the module docstring)."""
    k = n.size
    fitted = (n >= 3) & (sxx > 0)   # a slope and a residual: 3 runs at least
    dof = float(np.sum(n[fitted] - 2))
    alone = np.zeros(k, dtype=bool)
    if k < 2 or dof < 1 or fitted.sum() < 2:
        return alone
    s2 = float(np.sum(syy[fitted] - sxy[fitted] ** 2 / sxx[fitted])) / dof
    if not s2 > 0:
        return alone
    total_xx, total_xy = float(sxx[fitted].sum()), float(sxy[fitted].sum())
    for p in np.flatnonzero(fitted):
        others_xx = total_xx - sxx[p]
        if others_xx <= 0:
            continue
        own = sxy[p] / sxx[p]
        drifts = float(2.0 * special.stdtr(dof, -abs(own) / math.sqrt(s2 / sxx[p]))) < alpha
        diff = own - (total_xy - sxy[p]) / others_xx
        t = diff / math.sqrt(s2 * (1.0 / sxx[p] + 1.0 / others_xx))
        alone[p] = drifts and float(2.0 * special.stdtr(dof, -abs(t))) < alpha
    return alone


def start_levels(values: np.ndarray, points: np.ndarray, places: np.ndarray, k: int,
                 alpha: float = ALONE_ALPHA) -> StartLevels | None:
    """The levels at the server's start of the `k` points (coded 0 .. k - 1) of one server's life, from its
    runs' `values` (one metric), their `points` and their `places` in the life (0: the first run the server
    measured; gaps allowed). None when the life cannot be fitted: a value that is not positive and finite (a
    logarithm is taken), fewer residual degrees of freedom than 1, or no spread of places."""
    values, points = np.asarray(values, dtype=float), np.asarray(points, dtype=int)
    places = np.asarray(places, dtype=float)
    if not values.size or not (np.isfinite(values).all() and (values > 0).all() and np.isfinite(places).all()):
        return None
    logs = np.log(values)
    n, ybar, xbar, sxx, sxy, syy = _sums(logs, places, points, k)
    alone = _drifting_alone(n, sxx, sxy, syy, alpha)
    shared = ~alone & (n > 0)
    shared_xx = float(sxx[shared].sum())
    slope = float(sxy[shared].sum()) / shared_xx if shared_xx > 0 else math.nan
    own = np.divide(sxy, sxx, out=np.zeros(k), where=sxx > 0)
    slopes = np.where(alone, own, slope)
    used = n > 0
    dof = float(n.sum() - used.sum() - (shared_xx > 0) - alone.sum())
    if dof < 1:
        return None
    fit = slope if math.isfinite(slope) else 0.0   # no shared slope: the shared points have one run each
    sse = float(np.sum(syy[shared] - 2.0 * fit * sxy[shared] + fit * fit * sxx[shared]))
    sse += float(np.sum(syy[alone] - own[alone] * sxy[alone]))
    s2 = max(sse, 0.0) / dof
    slope_xx = np.where(alone, sxx, shared_xx)
    with np.errstate(invalid="ignore", divide="ignore"):
        log_level = ybar - slopes * xbar
        var = s2 * (1.0 / n + xbar * xbar / slope_xx)
    ok = n >= 2
    return StartLevels(np.where(ok, log_level, math.nan), np.where(ok, np.sqrt(var), math.nan), dof, alone,
                       100.0 * math.expm1(slope) if math.isfinite(slope) else math.nan)

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
A life with fewer than `MIN_DF` (3) residual degrees of freedom is not fitted, and its points keep the
t-interval of their mean: a line through so few runs costs more than it can remove (Student's t at 2 degrees
of freedom is 4.30, at 1 12.71, against 3.18 at 3), e.g. one point of 3 or 4 runs alone on its server, or 2
points of 2 runs.

The assumptions to state: the drift is linear over a server's life (a step is not a line: the paired verdicts
handle steps), and the run-to-run spread of the metric's logarithm is alike for the points of a life.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

__all__ = ["ALONE_ALPHA", "MIN_DF", "StartLevels", "start_levels"]

ALONE_ALPHA = 0.01   # a point drifts alone when both its tests reject at this level (see the module docstring)
MIN_DF = 3           # fewer residual degrees of freedom in a server's life: it is not fitted (see the docstring)


@dataclass(frozen=True)
class StartLevels:
    """Per point (its code): the log of its level at its server's start, that log's standard error and the
    degrees of freedom of its server's fit (NaN where the point has fewer than 2 runs or its server's life
    cannot be fitted), whether it was fitted alone, and its server's shared slope in % per place."""

    log_level: np.ndarray
    log_se: np.ndarray
    df: np.ndarray
    alone: np.ndarray
    slope_pct: np.ndarray


def _by(codes: np.ndarray, weights: np.ndarray, size: int) -> np.ndarray:
    return np.bincount(codes, weights=np.asarray(weights, dtype=float), minlength=size)


def _sums(logs: np.ndarray, places: np.ndarray, points: np.ndarray, k: int) -> tuple[np.ndarray, ...]:
    """Per point: runs, mean log, mean place, and the centred sums Sxx, Sxy, Syy."""
    n = np.bincount(points, minlength=k).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        ybar = _by(points, logs, k) / n
        xbar = _by(points, places, k) / n
    xc, yc = places - xbar[points], logs - ybar[points]
    return n, ybar, xbar, _by(points, xc * xc, k), _by(points, xc * yc, k), _by(points, yc * yc, k)


def _two_sided(t: np.ndarray, dof: np.ndarray) -> np.ndarray:
    return 2.0 * special.stdtr(np.maximum(dof, 1.0), -np.abs(t))


def _drifting_alone(n: np.ndarray, sxx: np.ndarray, sxy: np.ndarray, syy: np.ndarray, life: np.ndarray,
                    lives: int, alpha: float) -> np.ndarray:
    """The points that drift alone: their own slope shown to differ from zero and from the pooled slope of the
    other points of their life, on the residual variance of a line per point (see the module docstring)."""
    fitted = (n >= 3) & (sxx > 0)   # a slope and a residual: 3 runs at least
    safe_xx = np.where(fitted, sxx, 1.0)
    own = np.where(fitted, sxy / safe_xx, 0.0)
    dof = _by(life, np.where(fitted, n - 2.0, 0.0), lives)[life]
    count = _by(life, fitted, lives)[life]
    with np.errstate(invalid="ignore", divide="ignore"):
        s2 = _by(life, np.where(fitted, syy - sxy * own, 0.0), lives)[life] / dof
        others_xx = _by(life, np.where(fitted, sxx, 0.0), lives)[life] - sxx
        others_xy = _by(life, np.where(fitted, sxy, 0.0), lives)[life] - sxy
        valid = fitted & (count >= 2) & (dof >= 1) & (s2 > 0) & (others_xx > 0)
        s2, others_xx = np.where(valid, s2, 1.0), np.where(valid, others_xx, 1.0)
        zero = _two_sided(own / np.sqrt(s2 / safe_xx), dof)
        others = _two_sided((own - others_xy / others_xx) / np.sqrt(s2 * (1.0 / safe_xx + 1.0 / others_xx)), dof)
    return valid & (zero < alpha) & (others < alpha)


def start_levels(values: np.ndarray, points: np.ndarray, places: np.ndarray, k: int,
                 lives: np.ndarray | None = None, alpha: float = ALONE_ALPHA) -> StartLevels:
    """The levels at their server's start of the `k` points (coded 0 .. k - 1), from the runs' `values` (one
    metric), their `points`, their `places` in their server's life (0: the first run the server measured; gaps
    allowed) and their `lives` (a code per server start; default: one). Every run of a point must come from
    one life. A life is not fitted (its points get NaN) when one of its values is not positive and finite (a
    logarithm is taken) or it leaves fewer residual degrees of freedom than `MIN_DF`."""
    values, points = np.asarray(values, dtype=float), np.asarray(points, dtype=int)
    places = np.asarray(places, dtype=float)
    life_of_run = np.zeros(points.size, dtype=int) if lives is None else np.asarray(lives, dtype=int)
    m = int(life_of_run.max()) + 1 if life_of_run.size else 1
    life = np.zeros(k, dtype=int)
    life[points] = life_of_run
    bad = ~(np.isfinite(values) & (values > 0) & np.isfinite(places))
    logs = np.log(np.where(bad, 1.0, values))
    n, ybar, xbar, sxx, sxy, syy = _sums(logs, np.where(bad, 0.0, places), points, k)
    alone = _drifting_alone(n, sxx, sxy, syy, life, m, alpha)
    shared = ~alone & (n > 0)
    shared_xx = _by(life, np.where(shared, sxx, 0.0), m)
    with np.errstate(invalid="ignore", divide="ignore"):
        slope = np.where(shared_xx > 0, _by(life, np.where(shared, sxy, 0.0), m) / shared_xx, math.nan)
        own = np.where(sxx > 0, sxy / np.where(sxx > 0, sxx, 1.0), 0.0)
        slopes = np.where(alone, own, slope[life])
        dof = _by(life, n, m) - _by(life, n > 0, m) - (shared_xx > 0) - _by(life, alone, m)
        fit = np.where(np.isfinite(slope), slope, 0.0)[life]   # no shared slope: its points have one run each
        sse = _by(life, np.where(shared, syy - 2.0 * fit * sxy + fit * fit * sxx,
                                 np.where(alone, syy - own * sxy, 0.0)), m)
        s2 = np.maximum(sse, 0.0) / dof
        slope_xx = np.where(alone, sxx, shared_xx[life])
        log_level = ybar - slopes * xbar
        se = np.sqrt(s2[life] * (1.0 / n + xbar * xbar / slope_xx))
    ok = (n >= 2) & (dof[life] >= MIN_DF) & (_by(life_of_run, bad, m)[life] == 0) & np.isfinite(se)
    nan = math.nan
    return StartLevels(np.where(ok, log_level, nan), np.where(ok, se, nan), np.where(ok, dof[life], nan),
                       alone & ok, np.where(ok, 100.0 * np.expm1(slope[life]), nan))

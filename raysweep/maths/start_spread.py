"""The spread between server starts, and the intervals that include it.

Runs of one server start share what that start got: its memory layout, its CPU placement, the neighbours of
its hour. A point measured on one start has a t-interval over its runs that knows nothing of that, and the
next campaign (another start) lands outside it far more often than the interval's level says (on this
project's CPU demo, 48 of 80 times it held the other sittings' estimates).

Where a campaign measures some points on two or more server starts (`order.instances`, the winner's
confirmation), the spread between starts can be estimated: a one-way analysis of variance of log values (so
that the spread is relative, a percentage of the level, and one figure serves every point), pooled over every
point with two or more starts, gives the variance of one start's mean (its between-starts mean square over
the runs per start: the start's own effect and its runs' noise together) with its degrees of freedom. A
point's interval is then Student's t on the larger of two variances of its mean: that of a start's mean over
the starts it was measured on, and that of its own runs (std^2 / runs); with the first, the degrees of freedom
are the spread's. A point on one start gets an interval of its configuration's level over starts, not only of
that start's runs. Simulated in the demo's design (`benchmarks/verdicts_time.py`), it covers the level in 94.0
to 99.2 % of campaigns from no start effect to 20 % between starts (benchmarks/RESULTS.md, "Verdicts over
time").

The assumption to state: the relative spread between starts is alike for every configuration and load of the
campaign (it pools them), as the relative run-to-run spread is in `runs_needed`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

from raysweep.maths.verdicts import ALPHA, MIN_RUNS, Verdict

__all__ = ["OVER_STARTS", "StartSpread", "compare_over_starts", "level_intervals", "start_spread",
           "starts_per_point", "widened_intervals"]


@dataclass(frozen=True)
class StartSpread:
    """The variance of one server start's mean (of log values: relative, its root about a percentage of the
    level), its degrees of freedom and the points it was measured on."""

    var: float
    df: int
    points: int

    @property
    def pct(self) -> float:
        """The standard deviation of a start's mean, in per cent of the level."""
        return 100.0 * math.sqrt(self.var)

    def text(self) -> str:
        return (f"a start's mean varies {self.pct:.1f} % between server starts, measured on {self.points} "
                f"point(s) with 2+ starts, {self.df} degree(s) of freedom")


def starts_per_point(points: np.ndarray, starts: np.ndarray, n_points: int) -> np.ndarray:
    """How many server starts each point (coded 0 .. n_points - 1) has runs on."""
    pairs = np.unique(np.stack([np.asarray(points), np.asarray(starts)]), axis=1)
    return np.bincount(pairs[0], minlength=n_points)


def start_spread(values: np.ndarray, points: np.ndarray, starts: np.ndarray) -> StartSpread | None:
    """The spread between starts of runs' `values` (one per run; `points` and `starts` are integer codes of
    each run's point and server start), pooled over the points with runs on 2 or more starts; None when no
    point has them. Values that are not positive and finite are left out."""
    keep = np.isfinite(values) & (values > 0)
    logs, pts, sts = np.log(values[keep]), np.asarray(points)[keep], np.asarray(starts)[keep]
    if not pts.size:
        return None
    many = starts_per_point(pts, sts, int(pts.max()) + 1)[pts] >= 2
    logs, pts, sts = logs[many], pts[many], sts[many]
    ss_between, df_between, runs_per_start, measured = 0.0, 0, 0.0, 0
    for p in np.unique(pts):  # the points measured on 2+ starts: few (the confirmation, `order.instances`)
        mine = pts == p
        y = logs[mine]
        codes, counts = np.unique(sts[mine], return_inverse=True, return_counts=True)[1:]
        means = np.bincount(codes, weights=y) / counts
        ss_between += float((counts * (means - y.mean()) ** 2).sum())
        df_between += counts.size - 1
        runs_per_start += y.size - (counts ** 2).sum() / y.size  # (starts - 1) x runs per start, averaged
        measured += 1
    if not measured:
        return None
    # the between-starts mean square over the runs per start: the variance of one start's mean
    return StartSpread(ss_between / runs_per_start, df_between, measured)


def widened_intervals(mean: np.ndarray, std: np.ndarray, runs: np.ndarray, starts: np.ndarray,
                      spread: StartSpread, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Each point's interval of its level over server starts (see the module docstring): t on the larger of
    a start's mean's variance over its starts and its runs' variance of the mean. NaN where the point has
    fewer than 2 runs."""
    mean, std, runs = np.asarray(mean, dtype=float), np.asarray(std, dtype=float), np.asarray(runs, dtype=float)
    ok = runs >= 2
    n = np.where(ok, runs, 2.0)
    return level_intervals(np.where(ok, mean, math.nan), std ** 2 / n, n - 1, starts, spread, confidence)


def level_intervals(level: np.ndarray, within: np.ndarray, within_df: np.ndarray, starts: np.ndarray,
                    spread: StartSpread | None, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Each point's interval of its `level` (the mean of its runs, or its level at its server's start:
    `raysweep.maths.start_level`) from the variance of that estimate over its runs (`within`, with
    `within_df` degrees of freedom) and, with a `spread`, over server starts: t on the larger of the two
    variances, with the degrees of freedom of the one taken (see the module docstring). NaN where a value
    is missing or `within_df` is under 1."""
    level, within = np.asarray(level, dtype=float), np.asarray(within, dtype=float)
    within_df = np.asarray(within_df, dtype=float)
    ok = np.isfinite(level) & np.isfinite(within) & (within_df >= 1)
    within = np.where(ok, within, 0.0)
    if spread is None:
        between, dof = np.zeros_like(within), np.where(ok, within_df, 1.0)
    else:
        between = spread.var * np.where(ok, level, 0.0) ** 2 / np.maximum(np.asarray(starts, dtype=float), 1.0)
        dof = np.where(between >= within, float(spread.df), np.where(ok, within_df, 1.0))
    half = special.stdtrit(dof, 0.5 + confidence / 2.0) * np.sqrt(np.maximum(between, within))
    return np.where(ok, level - half, math.nan), np.where(ok, level + half, math.nan)


OVER_STARTS = "t over server starts"


def _mean_variance(mean: float, std: float, runs: int, starts: int, spread: StartSpread,
                   ) -> tuple[float, float, bool]:
    """A point's variance of its mean over server starts, as `widened_intervals` takes it, its degrees of
    freedom, and whether it is the spread's."""
    within = std * std / runs
    between = spread.var * mean * mean / max(starts, 1)
    return (between, float(spread.df), True) if between >= within else (within, float(runs - 1), False)


def compare_over_starts(a: tuple[float, float, int, int], b: tuple[float, float, int, int], spread: StartSpread,
                        higher_is_better: bool = True, alpha: float = ALPHA) -> Verdict:
    """B's mean against A's, each (mean, sample std, runs, server starts), as two levels over server starts:
    Student's t on the difference with each side's variance of `widened_intervals`; the degrees of freedom
    are the spread's where a side takes its variance from it (both do from one estimate), else Welch-
    Satterthwaite's. Fewer than `MIN_RUNS` runs on a side: not shown, as in `compare_means`."""
    (ma, sa, na, ka), (mb, sb, nb, kb) = a, b
    na, nb = int(na or 0), int(nb or 0)
    ratio = mb / ma if ma and math.isfinite(ma) and math.isfinite(mb) else math.nan
    if na < 2 or nb < 2 or not all(math.isfinite(v) for v in (ma, sa, mb, sb)):
        return Verdict("not judged", na, nb, ratio, test=OVER_STARTS)
    (va, da, fa), (vb, db, fb) = _mean_variance(ma, sa, na, ka, spread), _mean_variance(mb, sb, nb, kb, spread)
    total = va + vb
    if total <= 0:
        p = 0.0 if ma != mb else 1.0
    else:
        # where a side's variance is the spread's, its degrees of freedom (one estimate serves both sides)
        dof = float(spread.df) if fa or fb else total * total / (va * va / da + vb * vb / db)
        p = float(2.0 * special.stdtr(dof, -abs(mb - ma) / math.sqrt(total)))
    if min(na, nb) < MIN_RUNS:
        return Verdict("not shown", na, nb, ratio, p, OVER_STARTS, f"fewer than {MIN_RUNS} runs on a side")
    if not p < alpha:
        return Verdict("not shown", na, nb, ratio, p, OVER_STARTS)
    return Verdict("better" if (mb > ma) == higher_is_better else "worse", na, nb, ratio, p, OVER_STARTS)

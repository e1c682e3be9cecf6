"""One model of a measurement, from runs to the answer: a sitting > a server start > a run > a request.

Runs of one server start share that start's effect (its memory layout, its CPU placement, the neighbours of
its hour) and its stretch of the machine's time, so they are not independent replicates of a configuration:
treating them so is pseudoreplication (Hurlbert 1984), and between identical configurations whose starts
differ by 5 to 10 % it gave a green "better" half the time. Here the replicate is the server start:

- a run's value is the mean of its steady window (the client's per-run metrics);
- a start's value is the mean of its runs;
- a configuration's value at a bench point is the mean over its server starts of their start means, and its
  interval Student's t over those start means on starts - 1 degrees of freedom (exact for any start effect and
  any runs per start when the start means are alike in spread, where a random-intercept model's few-starts
  degrees of freedom are not; `benchmarks/bench_verdicts.py --model` measures its coverage and error rates:
  see benchmarks/results/verdicts-model.md);
- a point measured on one start keeps the t-interval over its runs, labelled so: it says nothing of the next
  start, and no verdict rests on it ("not compared: one server start each");
- a warm-up of a server's life is found and cut before any of it (`warmup`): where the first run of each of a
  configuration's server starts differs from the later runs of its bench point on that start (Student's
  one-sample t-test of the relative differences at `WARMUP_ALPHA`, one per start, at least `WARMUP_MIN_STARTS` of
  them, each start its own control so that start effects and the machine's drift between starts cancel), those
  first runs are left out of that metric's value, and the cut is said. With one run per start and point it cannot
  be judged.

`estimates` gives every point's (mean, standard error, degrees of freedom, starts, runs) at once: the
sufficient statistics of the model, which the summary carries (`M_mean`, `M_se`, `M_df`, `server_starts`)
so that the interval shown, the verdicts, the ranking, `compare` and the catalogue read one estimate.
`compare` tests two configurations on their start means: the ratio of their values, its interval and the
verdict from one statistic (the log ratio over its standard error, Welch-Satterthwaite's degrees of freedom,
Hsu's min(starts) - 1 under `FEW_STARTS`), so the verdict is `better` exactly when the interval of the lead
excludes zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np
from scipy import special

from raysweep.maths.verdicts import ALPHA, Verdict, row_number

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy.typing as npt

__all__ = ["FEW_STARTS", "MODEL", "ONE_START", "RUNS_OF_ONE_START", "WARMUP_ALPHA", "WARMUP_MIN_STARTS", "Estimate",
           "Warmup", "compare", "drift_apart", "drift_could_decide", "drift_total", "estimates", "interval",
           "method_text", "warmup"]

MODEL = "t over server starts"
ONE_START = "one server start each"
RESOLUTION = 1e-9   # a relative standard error under this is rounding, not a measured spread
FEW_STARTS = 5   # with fewer starts on a side, the test reads Hsu's min(starts) - 1 degrees of freedom
WARMUP_MIN_STARTS = 3   # a configuration's warm-up is judged on this many starts of 2 or more runs, at least
# A warm-up is cut where its test's p-value is under this: a cut chosen by the data moves the value away from the
# first runs, and at 5 % that raised the false green between identical configurations from 4.0 to 5.7 % (i.i.d.
# runs, 8 starts x 2 runs, 2,000 campaigns); at 0.1 % it is 4.1 %, and a 10 % warm-up over 8 starts is still found
WARMUP_ALPHA = 0.001


@dataclass(frozen=True)
class Estimate:
    """A configuration's value at a bench point under the model: the mean over its server starts of their
    start means, its standard error and degrees of freedom (over starts with 2 or more, else over the runs
    of its one start), and the starts and runs it rests on."""

    mean: float
    se: float
    df: float
    starts: int
    runs: int

    @classmethod
    def of_row(cls, row: Mapping[str, Any], metric: str, scale: float = 1.0) -> Estimate:
        """From a summary row (`M_mean`, `M_se`, `M_df`, `server_starts`, `runs`); `scale` divides the value
        (per GPU)."""
        def num(key: str) -> float:
            return row_number(row, key)

        starts, runs = num("server_starts"), num(f"{metric}_runs")
        runs = runs if math.isfinite(runs) else num("runs")
        return cls(num(f"{metric}_mean") / scale, num(f"{metric}_se") / scale, num(f"{metric}_df"),
                   int(starts) if math.isfinite(starts) and starts > 0 else 1, int(runs) if math.isfinite(runs) else 0)

    @classmethod
    def of_runs(cls, values: npt.ArrayLike, starts: Sequence[object] | np.ndarray) -> Estimate:
        """From one point's run values and the server start each ran on (NaN and inf left out)."""
        v, s = np.asarray(values, dtype=float), np.asarray(starts)
        keep = np.isfinite(v)
        if not keep.any():
            return cls(math.nan, math.nan, math.nan, 0, 0)
        codes = np.unique(s[keep], return_inverse=True)[1]
        got = estimates(v[keep], np.zeros(int(keep.sum()), dtype=int), codes, 1)
        return cls(float(got[0][0]), float(got[1][0]), float(got[2][0]), int(got[3][0]), int(got[4][0]))

    def interval(self, confidence: float) -> tuple[float, float]:
        low, high = interval(np.array([self.mean]), np.array([self.se]), np.array([self.df]), confidence)
        return float(low[0]), float(high[0])


def estimates(values: np.ndarray, points: np.ndarray, starts: np.ndarray, k: int,
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per point (coded 0 .. k - 1) from the runs' finite `values` of one metric and their server `starts`
    (integer codes, any numbering): the mean over its starts of the start means, its standard error, its
    degrees of freedom, its starts and its runs. With 2 or more starts the error is the spread of the start
    means over the square root of their number (starts - 1 degrees of freedom); with one start it is that of
    its runs (runs - 1); NaN where there are fewer than 2 of either."""
    values, points, starts = np.asarray(values, dtype=float), np.asarray(points, dtype=int), np.asarray(starts)
    runs = np.bincount(points, minlength=k).astype(float)
    nan = np.full(k, math.nan)
    if not values.size:
        return nan, nan.copy(), nan.copy(), np.zeros(k, dtype=int), runs.astype(int)
    cell = np.unique(np.stack([points, np.unique(starts, return_inverse=True)[1]]), axis=1, return_inverse=True)
    pairs, cell_of = cell[0], np.asarray(cell[1]).ravel()
    cell_n = np.bincount(cell_of)
    cell_mean = np.bincount(cell_of, weights=values) / cell_n
    owner = pairs[0]
    n_starts = np.bincount(owner, minlength=k).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.bincount(owner, weights=cell_mean, minlength=k) / n_starts
        between = np.bincount(owner, weights=(cell_mean - mean[owner]) ** 2, minlength=k) / (n_starts - 1)
        run_mean = np.bincount(points, weights=values, minlength=k) / runs
        within = np.bincount(points, weights=(values - run_mean[points]) ** 2, minlength=k) / (runs - 1)
        many = n_starts >= 2
        se = np.where(many, np.sqrt(between / n_starts), np.sqrt(within / runs))
        df = np.where(many, n_starts - 1, runs - 1)
    ok = np.where(many, n_starts >= 2, runs >= 2)
    return (np.where(runs > 0, mean, math.nan), np.where(ok, se, math.nan), np.where(ok, df, math.nan),
            n_starts.astype(int), runs.astype(int))


@dataclass(frozen=True)
class Warmup:
    """The warm-up test of each configuration (coded 0 .. k - 1, by `warmup`) on one metric: the mean relative
    difference of its starts' first runs from the later runs of their points, in % (`pct`), its p-value (`p`, NaN
    where not judged), the starts it rests on (`starts`), per run whether it is left out (`cut`: the first run of a
    start's life, in a configuration whose warm-up is shown), and per configuration whether it is (`shown`)."""

    pct: np.ndarray
    p: np.ndarray
    starts: np.ndarray
    cut: np.ndarray
    shown: np.ndarray   # per configuration: whether its warm-up is shown (p under the test's alpha)


def warmup(values: np.ndarray, configs: np.ndarray, starts: np.ndarray, points: np.ndarray, ranks: np.ndarray, k: int,
           alpha: float = WARMUP_ALPHA) -> Warmup:
    """Per configuration (`configs`, coded 0 .. k - 1), from its runs' finite `values` of one metric, the server
    start and the bench point each ran on (`starts`, `points`: codes, any numbering) and each run's place in the
    order of measurement (`ranks`): whether the first run of each server start's life differs from the later runs
    of its bench point on that start (see the module docstring). A relative difference is taken where those later
    runs' mean is positive; a configuration with all its differences 0 shows none, one with all alike and not 0
    shows one."""
    values, configs, ranks = (np.asarray(x, dtype=float) for x in (values, configs, ranks))
    configs = configs.astype(int)
    nan = np.full(k, math.nan)
    cut = np.zeros(values.size, dtype=bool)
    if not values.size:
        return Warmup(nan, nan.copy(), np.zeros(k, dtype=int), cut, np.zeros(k, dtype=bool))
    start = np.unique(np.asarray(starts), return_inverse=True)[1].ravel()
    cell = np.unique(np.stack([np.unique(np.asarray(points), return_inverse=True)[1].ravel(), start]), axis=1,
                     return_inverse=True)[1].ravel()
    order = np.lexsort((ranks, start))
    head = np.ones(order.size, dtype=bool)
    head[1:] = start[order][1:] != start[order][:-1]
    first = order[head]                       # the first run of each start's life
    n = np.bincount(cell).astype(float)[cell[first]]
    total = np.bincount(cell, weights=values)[cell[first]]
    with np.errstate(invalid="ignore", divide="ignore"):
        rest = (total - values[first]) / (n - 1.0)   # the later runs of its point on its start
        d = values[first] / rest - 1.0
    judged = (n >= 2) & np.isfinite(d) & (rest > 0)
    owner = configs[first][judged]
    d = d[judged]
    m = np.bincount(owner, minlength=k).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.bincount(owner, weights=d, minlength=k) / m
        var = np.bincount(owner, weights=(d - mean[owner]) ** 2, minlength=k) / (m - 1.0)
        t = np.where(var > 0, mean / np.sqrt(var / m), np.where(mean != 0, np.inf, 0.0))
    p = np.where(m >= WARMUP_MIN_STARTS, 2.0 * special.stdtr(np.maximum(m - 1.0, 1.0), -np.abs(t)), math.nan)
    shown = np.nan_to_num(p, nan=1.0) < alpha
    cut[first[judged][shown[owner]]] = True
    return Warmup(np.where(m > 0, 100.0 * mean, math.nan), p, m.astype(int), cut, shown)


def interval(mean: np.ndarray, se: np.ndarray, df: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Student's t-interval of each estimate at `confidence` (two-sided); NaN where any part is unknown. The
    mean always lies inside it."""
    mean, se, df = (np.asarray(x, dtype=float) for x in (mean, se, df))
    ok = np.isfinite(mean) & np.isfinite(se) & np.isfinite(df) & (df >= 1)
    half = special.stdtrit(np.where(ok, df, 1.0), 0.5 + confidence / 2.0) * np.where(ok, se, 0.0)
    return np.where(ok, mean - half, math.nan), np.where(ok, mean + half, math.nan)


RUNS_OF_ONE_START = "t over the runs of one server start (what a start adds is not in it)"


def method_text(starts: int) -> str:
    """What a point's interval is over, in words (its starts are in `server_starts`, its degrees of freedom
    in `M_df`)."""
    return MODEL if starts >= 2 else RUNS_OF_ONE_START


def compare(a: Estimate, b: Estimate, higher_is_better: bool = True, alpha: float = ALPHA) -> Verdict:
    """B against A on their start means: the ratio B / A with its interval at 1 - `alpha` (`Verdict.low`,
    `Verdict.high`) and the verdict from the same statistic (see the module docstring). Stated reasons, never a
    p-value, where the model cannot decide: a side on one server start (`not compared`), a value not positive
    and finite, no spread at all between starts on either side (`not judged`)."""
    ratio = b.mean / a.mean if a.mean and math.isfinite(a.mean) and math.isfinite(b.mean) else math.nan
    base = dict(runs_a=a.runs, runs_b=b.runs, ratio=ratio, test=MODEL, starts_a=a.starts, starts_b=b.starts,
                level=1.0 - alpha)
    if a.runs == 0 or b.runs == 0:
        return Verdict("not judged", reason="no run with a finite value on a side", **base)  # type: ignore[arg-type]
    if not (math.isfinite(a.mean) and math.isfinite(b.mean) and a.mean > 0 and b.mean > 0):
        return Verdict("not judged", reason="a value that is not positive and finite", **base)  # type: ignore[arg-type]
    if a.starts < 2 or b.starts < 2:
        why = ONE_START if a.starts < 2 and b.starts < 2 else \
            f"one server start on a side ({a.starts} and {b.starts} starts)"
        return Verdict("not compared", reason=why, **base)  # type: ignore[arg-type]
    ra, rb = a.se / a.mean, b.se / b.mean
    if not (math.isfinite(ra) and math.isfinite(rb)):
        return Verdict("not judged", reason="the spread between server starts is unknown", **base)  # type: ignore[arg-type]
    total = ra * ra + rb * rb
    if total <= RESOLUTION ** 2:   # a spread below the resolution of the numbers themselves is no spread
        return Verdict("not judged", reason="no spread at all between server starts on either side: a difference "
                                            "cannot be tested", **base)  # type: ignore[arg-type]
    if min(a.starts, b.starts) < FEW_STARTS:
        dof = float(min(a.df, b.df))
    else:
        parts = [x for x in (ra ** 4 / a.df if ra > 0 else 0.0, rb ** 4 / b.df if rb > 0 else 0.0)]
        dof = total * total / sum(parts)
    d, se = math.log(b.mean / a.mean), math.sqrt(total)
    p = float(2.0 * special.stdtr(dof, -abs(d) / se))
    half = float(special.stdtrit(dof, 1.0 - alpha / 2.0)) * se
    base.update(p_value=p, low=math.exp(d - half), high=math.exp(d + half))
    if not p < alpha:
        return Verdict("not shown", **base)  # type: ignore[arg-type]
    return Verdict("better" if (d > 0) == higher_is_better else "worse", **base)  # type: ignore[arg-type]


def drift_total(pct_per_run: Any, runs: Any, drifts: bool) -> float:
    """How far a point's runs drift over their window, a fraction of its value (0 where no drift is shown,
    inf where one is shown without its size)."""
    if not drifts:
        return 0.0
    try:
        pct, n = float(pct_per_run), float(runs)
    except (TypeError, ValueError):
        return math.inf
    return abs(pct) / 100.0 * max(n - 1.0, 1.0) if math.isfinite(pct) and math.isfinite(n) else math.inf


def drift_apart(pct_a: float, se_a: float, df_a: float, pct_b: float, se_b: float, df_b: float, runs: float,
                alpha: float = ALPHA) -> float:
    """How far two configurations' drifts (slopes in % per run, with their standard errors and degrees of
    freedom) take them apart over `runs` runs, a fraction of their value: 0 unless Student's t-test of the
    difference of the slopes (min(df) degrees of freedom) shows one at `alpha`."""
    diff, se = pct_a - pct_b, math.hypot(se_a, se_b)
    dof = min(df_a, df_b)
    if not (math.isfinite(diff) and math.isfinite(se) and dof >= 1):
        return 0.0
    p = float(2.0 * special.stdtr(dof, -abs(diff) / se)) if se > 0 else (0.0 if diff else 1.0)
    return abs(diff) / 100.0 * max(runs - 1.0, 1.0) if p < alpha else 0.0


def drift_could_decide(v: Verdict, drift: float, higher_is_better: bool = True) -> bool:
    """Whether a drift of `drift` (a fraction, the larger of the two sides') is as large as the part of the
    lead that the verdict's interval shows (its edge nearest to no lead): there, and only there, it could
    have made a `better`/`worse` verdict, which is then not shown."""
    if drift <= 0 or v.word not in ("better", "worse"):
        return False
    if not (math.isfinite(v.low) and math.isfinite(v.high)):
        return True
    shown = (v.low - 1.0) if v.high > 1.0 and v.low > 1.0 else (1.0 - v.high)
    return drift >= shown

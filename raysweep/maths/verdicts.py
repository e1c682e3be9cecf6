"""Intervals and verdicts over runs, on `scipy.stats`.

Every comparison raysweep prints rests on a test of the difference itself, with the run as the unit (the
requests of one run share its server state, its queue and its noisy neighbours, so they are not independent
samples of the configuration):

- `mean_interval`: the Student t-interval of a mean over per-run values (the per-point aggregates, and
  `bench.precision`'s stopping rule);
- `compare_means` (`compare_values` from raw per-run values): Welch's t-test of two means (with fewer
  than `FEW_RUNS` runs on a side, on Hsu's min(na, nb) - 1 degrees of freedom), worded `better`,
  `worse`, `not shown with N runs` (the data cannot tell them apart, which is not a claim of equality) or
  `not judged` (fewer than 2 runs on a side). Percentiles are compared the same way, over per-run
  percentiles (benchmarks/bench_verdicts.py measures its calibration with correlated requests);
- `tied_with_leader`: which candidates cannot be told apart from the one with the best mean, a Welch test
  of the leader against each one with Holm's step-down correction over all of them: the leader is picked as
  the best of many, so its lead over the runner-up alone is tested at a level that accounts for the others;
- `equivalence`: the ratio of two means with its confidence interval (Welch on the logarithms),
  `equivalent` only when the whole interval lies within the tolerance, `different` when it lies outside,
  `not shown` otherwise, with the runs per side that would settle it at the spread seen;
- `slope_test`: whether a series drifts by more than an allowed fraction of its mean, judged on the
  confidence interval of the least-squares slope (flagged only when the whole interval lies beyond).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import special  # the t and normal quantiles; scipy.stats (slow to import) only where needed

__all__ = ["ALPHA", "MIN_RUNS", "WELCH", "Equivalence", "Slope", "Verdict", "compare_means", "compare_values",
           "equivalence", "mean_interval", "relative_half_width", "row_stats", "runs_for_half_width", "slope_test",
           "t_quantile", "tied_with_leader"]

ALPHA = 0.05   # two-sided level of every test (95 % intervals)


def _finite(values: Sequence[float] | Any) -> np.ndarray:
    x = np.asarray([v for v in values if v is not None], dtype=float)
    return x[np.isfinite(x)]


@functools.lru_cache(maxsize=4096)
def t_quantile(p: float, dof: float) -> float:
    """The p-quantile of Student's t distribution with `dof` degrees of freedom (0 < p < 1); kept once
    computed (a summary asks for the same few thousands of times)."""
    if not 0.0 < p < 1.0 or dof <= 0:
        raise ValueError(f"t_quantile: p must be in (0, 1) and dof > 0, got p={p}, dof={dof}")
    return float(special.stdtrit(dof, p))


@functools.lru_cache(maxsize=256)
def _norm_quantile(p: float) -> float:
    return float(special.ndtri(p))


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the Student t-interval of the mean of `values` (NaNs dropped).

    With fewer than 2 finite values the interval is (nan, nan) around the mean (nan for none)."""
    x = _finite(values)
    if x.size == 0:
        return math.nan, math.nan, math.nan
    mean = float(x.mean())
    if x.size < 2:
        return mean, math.nan, math.nan
    half = float(special.stdtrit(x.size - 1, 0.5 + confidence / 2.0) * x.std(ddof=1) / math.sqrt(x.size))
    return mean, mean - half, mean + half


def relative_half_width(values: Sequence[float], confidence: float = 0.95) -> float:
    """The t-interval's half-width over |mean|; nan with fewer than 2 values or a zero mean."""
    mean, low, high = mean_interval(values, confidence)
    if not (math.isfinite(low) and mean):
        return math.nan
    return (high - low) / 2.0 / abs(mean)


def runs_for_half_width(cv: float, rel_half_width: float, confidence: float = 0.95,
                        limit: int = 100_000) -> int | None:
    """The fewest runs whose t-interval half-width is at most `rel_half_width` of the mean, for a spread
    (coefficient of variation) `cv`; None for an unknown spread."""
    if not math.isfinite(cv) or rel_half_width <= 0:
        return None
    q = 0.5 + confidence / 2.0
    n = max(2, math.ceil((_norm_quantile(q) * cv / rel_half_width) ** 2))  # the normal bound; t only adds
    while n < limit and t_quantile(q, n - 1) * cv / math.sqrt(n) > rel_half_width:
        n += 1
    return n


# ---------------------------------------------------------------------------------------------------
# Two means: Welch's t
# ---------------------------------------------------------------------------------------------------

MIN_RUNS = 3   # fewer runs on a side: a verdict is "not shown" (Welch with 2 runs errs about twice as often)
WELCH = "Welch's t over runs"


@dataclass(frozen=True)
class Verdict:
    """B against A: `word` is `better`, `worse`, `not shown` or `not judged`; `ratio` is mean B / mean A;
    `test` names the test that decided (Welch's t over runs, or a paired t over blocks: `over_time`) and
    `reason` why a verdict is not shown or not judged, where that is not the test's p-value."""

    word: str
    runs_a: int
    runs_b: int
    ratio: float = math.nan
    p_value: float = math.nan
    test: str = WELCH
    reason: str = ""
    low: float = math.nan      # the interval of the ratio B / A, where the test gives one
    high: float = math.nan
    level: float = math.nan    # the level of that interval
    starts_a: int = 0          # the server starts behind each side (`raysweep.maths.hierarchy`), where counted
    starts_b: int = 0

    @property
    def text(self) -> str:
        """`better`, `worse`, `not shown with 3 and 3 runs`, `not shown with 2 and 5 runs (fewer than 3 runs
        on a side)`, `not judged: fewer than 2 runs on a side`."""
        if self.word == "not shown":
            runs = (f"{self.runs_a} runs" if self.runs_a == self.runs_b
                    else f"{self.runs_a} and {self.runs_b} runs")
            return f"not shown with {runs}" + (f" ({self.reason})" if self.reason else "")
        if self.word == "not judged":
            return f"not judged: {self.reason or 'fewer than 2 runs on a side'}"
        if self.word == "not compared":
            return f"not compared: {self.reason}"
        return self.word

    @property
    def lead_text(self) -> str:
        """`+22.1 % [+12.0, +33.1 %] at 95 %`: the ratio as a change with its interval and its real level."""
        if not math.isfinite(self.ratio):
            return ""
        out = f"{100.0 * (self.ratio - 1.0):+.1f} %"
        if math.isfinite(self.low) and math.isfinite(self.high):
            out += (f" [{100.0 * (self.low - 1.0):+.1f}, {100.0 * (self.high - 1.0):+.1f} %] at "
                    f"{100.0 * self.level:.4g} %")
        return out

    @property
    def decided(self) -> bool:
        return self.word in ("better", "worse")


def compare_means(a: tuple[float, float, int], b: tuple[float, float, int], higher_is_better: bool = True,
                  alpha: float = ALPHA) -> Verdict:
    """Welch's two-sided t-test of B's mean against A's, from (mean, sample std, runs) of each side."""
    (ma, sa, na), (mb, sb, nb) = a, b
    na, nb = int(na or 0), int(nb or 0)
    ratio = mb / ma if ma and math.isfinite(ma) and math.isfinite(mb) else math.nan
    if na < 2 or nb < 2 or not all(math.isfinite(v) for v in (ma, sa, mb, sb)):
        return Verdict("not judged", na, nb, ratio)
    p = _welch_p(ma, sa, na, mb, sb, nb)
    if min(na, nb) < MIN_RUNS:
        return Verdict("not shown", na, nb, ratio, p, reason=f"fewer than {MIN_RUNS} runs on a side")
    if not p < alpha:
        return Verdict("not shown", na, nb, ratio, p)
    up = mb > ma
    return Verdict("better" if up == higher_is_better else "worse", na, nb, ratio, p)


def compare_values(a: Sequence[float], b: Sequence[float], higher_is_better: bool = True,
                   alpha: float = ALPHA) -> Verdict:
    """`compare_means` from the per-run values of each side."""
    return compare_means(_summary(_finite(a)), _summary(_finite(b)), higher_is_better, alpha)


def _summary(x: np.ndarray) -> tuple[float, float, int]:
    if x.size == 0:
        return math.nan, math.nan, 0
    return float(x.mean()), float(x.std(ddof=1)) if x.size > 1 else math.nan, int(x.size)


FEW_RUNS = 5   # with fewer runs on a side, Welch's t takes the fewest degrees of freedom it can have (Hsu's)


def _welch_p(ma: float, sa: float, na: int, mb: float, sb: float, nb: int) -> float:
    """Welch's two-sided p-value; where a side has fewer than `FEW_RUNS` runs, read against Student's t with
    min(na, nb) - 1 degrees of freedom (Hsu's conservative bound on Welch's): with 3 runs on a side five times
    noisier than the other, Welch's own degrees of freedom err 6.6 % of the time at 5 %
    (benchmarks/bench_verdicts.py --time)."""
    if sa == 0 and sb == 0:   # no spread at all: any difference is certain, none is not shown
        return 0.0 if ma != mb else 1.0
    if min(na, nb) >= FEW_RUNS:
        from scipy import stats

        return float(stats.ttest_ind_from_stats(ma, sa, na, mb, sb, nb, equal_var=False).pvalue)
    t = (mb - ma) / math.sqrt(sa * sa / na + sb * sb / nb)
    return float(2.0 * special.stdtr(min(na, nb) - 1, -abs(t)))


def row_number(row: Mapping[str, Any], key: str) -> float:
    """A summary row's number at `key`, NaN where it is missing or not a number."""
    try:
        v = row.get(key)
        return float(v) if v is not None else math.nan
    except (TypeError, ValueError):
        return math.nan


def row_stats(row: Mapping[str, Any], metric: str) -> tuple[float, float, int]:
    """(mean, std, runs) of `metric` in a summary row (`M_mean`, `M_std`, `runs`, or `M_runs` when the
    metric has its own count)."""
    def num(key: str) -> float:
        return row_number(row, key)

    runs = num(f"{metric}_runs")
    runs = runs if math.isfinite(runs) else num("runs")
    return num(f"{metric}_mean"), num(f"{metric}_std"), int(runs) if math.isfinite(runs) else 0


# ---------------------------------------------------------------------------------------------------
# The leader of many: which cannot be told apart from it (Holm)
# ---------------------------------------------------------------------------------------------------

@dataclass
class Leadership:
    """The candidates (by position) that cannot be told apart from the leader, and each one's verdict
    against it (Holm-adjusted p-value)."""

    leader: int
    tied: list[int] = field(default_factory=list)
    behind: list[int] = field(default_factory=list)
    not_judged: list[int] = field(default_factory=list)
    adjusted_p: dict[int, float] = field(default_factory=dict)
    tests: dict[int, str] = field(default_factory=dict)
    verdicts: dict[int, Verdict] = field(default_factory=dict)   # each candidate's own test against the leader

    @property
    def clear(self) -> bool | None:
        """True: better than every other candidate; False: tied with some; None: none could be judged."""
        if self.not_judged and not (self.tied or self.behind):
            return None
        return not self.tied and not self.not_judged


def tied_with_leader(candidates: Sequence[tuple[float, float, int]], higher_is_better: bool = True,
                     alpha: float = ALPHA, paired: Callable[[int, int], Verdict | None] | None = None) -> Leadership:
    """The candidate with the best mean, and which of the others it is not shown to beat: Welch's test of the
    leader against each (two-sided p-values), Holm's step-down correction over the family (a candidate is
    behind only when its adjusted p-value is under `alpha` and it is worse). A candidate with fewer than 2
    runs, or a leader with fewer than 2, is `not_judged`; one with fewer than `MIN_RUNS` (or a leader with
    fewer) is tied: it cannot be shown behind. `paired(leader, i)`, where it gives a verdict, replaces
    Welch's for that candidate (a paired test on runs measured side by side: `over_time.paired_verdict`);
    `tests` names the test each candidate got."""
    means = [c[0] if math.isfinite(c[0]) else (-math.inf if higher_is_better else math.inf) for c in candidates]
    lead = int(np.argmax(means) if higher_is_better else np.argmin(means))
    out = Leadership(lead)
    pvals: dict[int, float] = {}
    short: list[int] = []
    for i, c in enumerate(candidates):
        if i == lead:
            continue
        v = (paired(lead, i) if paired is not None else None) or \
            compare_means(candidates[lead], c, higher_is_better, alpha=1.0)   # p only
        out.tests[i] = v.test
        out.verdicts[i] = v
        if v.word in ("not judged", "not compared"):
            out.not_judged.append(i)
        elif v.reason:   # too few runs to be shown behind: tied, outside the family
            short.append(i)
        else:
            pvals[i] = v.p_value
    order = sorted(pvals, key=lambda i: pvals[i])
    m, running, stopped = len(order), 0.0, False
    for k, i in enumerate(order):
        running = max(running, min(1.0, (m - k) * pvals[i]))
        out.adjusted_p[i] = running
        stopped = stopped or running >= alpha
        (out.tied if stopped else out.behind).append(i)
    out.tied.extend(short)
    out.tied.sort(key=lambda i: means[i], reverse=higher_is_better)
    return out


# ---------------------------------------------------------------------------------------------------
# Equivalence of two means: the ratio's interval against a tolerance
# ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Equivalence:
    """B / A with its confidence interval, and what it shows against a tolerance of +-`tolerance`."""

    word: str          # "equivalent", "different", "not shown", "not judged"
    ratio: float
    low: float
    high: float
    tolerance: float
    runs_a: int
    runs_b: int
    runs_needed: int | None = None   # per side, at the spread seen, to settle a "not shown"

    @property
    def text(self) -> str:
        tol = f"{self.tolerance:.0%}"
        if self.word == "equivalent":
            return f"equivalent within {tol}"
        if self.word == "different":
            return f"different by more than {tol}"
        if self.word == "not judged":
            return "not judged: fewer than 2 runs on a side"
        inside = 1.0 - self.tolerance <= self.ratio <= 1.0 + self.tolerance
        longer = (self.runs_needed or 0) / max(self.runs_a, 1)
        more = (f"; about {self.runs_needed} runs per side (or runs about {longer:.0f}x "
                f"as long, if their spread falls as one over the square root of their length) would show it "
                f"{'equivalent' if inside else 'different'} at this ratio and spread"
                if self.runs_needed else "; the ratio sits on the tolerance: no number of runs settles it")
        return f"not shown within {tol} with {self.runs_a} and {self.runs_b} runs{more}"


def log_ratio_intervals(a_logs: Sequence[np.ndarray], b_logs: Sequence[np.ndarray],
                        confidence: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each pair of samples of logarithms (at least 2 values each), the ratio exp(mean B - mean A) and its
    interval from Welch's t at `confidence` (two-sided), as arrays (ratio, low, high): one vectorised pass,
    for the thousands of pairs of a catalogue's history."""
    na = np.array([x.size for x in a_logs], dtype=float)
    nb = np.array([x.size for x in b_logs], dtype=float)
    diff = np.array([y.mean() - x.mean() for x, y in zip(a_logs, b_logs, strict=True)], dtype=float)
    va = np.array([x.var(ddof=1) for x in a_logs], dtype=float) / na
    vb = np.array([y.var(ddof=1) for y in b_logs], dtype=float) / nb
    se = np.sqrt(va + vb)
    with np.errstate(divide="ignore", invalid="ignore"):
        dof = np.where(se > 0, (va + vb) ** 2 / (va ** 2 / (na - 1) + vb ** 2 / (nb - 1)), na + nb - 2)
    q = special.stdtrit(dof, 0.5 + confidence / 2.0)
    return np.exp(diff), np.exp(diff - q * se), np.exp(diff + q * se)


def equivalence(a: Sequence[float], b: Sequence[float], tolerance: float = 0.05,
                confidence: float = 1 - 2 * ALPHA, limit: int = 1000) -> Equivalence:
    """The ratio of the means of B to A, its interval from Welch's t on the logarithms of the per-run values
    (`confidence` two-sided: 90 % is the two one-sided tests at 5 %), judged against [1 - tol, 1 + tol]."""
    xa, xb = _finite(a), _finite(b)
    xa, xb = xa[xa > 0], xb[xb > 0]
    na, nb = int(xa.size), int(xb.size)
    ratio = float(xb.mean() / xa.mean()) if na and nb else math.nan
    if na < 2 or nb < 2:
        return Equivalence("not judged", ratio, math.nan, math.nan, tolerance, na, nb)
    la, lb = np.log(xa), np.log(xb)
    ratios, lows, highs = log_ratio_intervals([la], [lb], confidence)
    diff, low, high = math.log(float(ratios[0])), float(lows[0]), float(highs[0])
    lo_tol, hi_tol = 1.0 - tolerance, 1.0 + tolerance
    if lo_tol <= low and high <= hi_tol:
        word = "equivalent"
    elif high < lo_tol or low > hi_tol:
        word = "different"
    else:
        word = "not shown"
    needed = None
    if word == "not shown":   # the runs per side whose interval, at this ratio and spread, would settle it
        inside = min(math.log(hi_tol) - diff, diff - math.log(lo_tol))
        room = inside if inside > 0 else max(diff - math.log(hi_tol), math.log(lo_tol) - diff)
        spread = la.var(ddof=1) + lb.var(ddof=1)
        if room > 0:
            needed = next((n for n in range(max(na, nb), limit)
                           if special.stdtrit(2 * n - 2, 0.5 + confidence / 2.0) * math.sqrt(spread / n) < room), None)
    return Equivalence(word, float(math.exp(diff)), low, high, tolerance, na, nb, needed)


# ---------------------------------------------------------------------------------------------------
# A drift in a series: the slope's interval against an allowed change
# ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Slope:
    """The least-squares slope of a series in % of its mean per step, with its interval; `drifts` is True
    only when the whole interval of the change over the series lies beyond the allowed drift."""

    pct_per_step: float
    low: float
    high: float
    drifts: bool


def _ar1_inflation(residuals: np.ndarray) -> float:
    """How much wider a slope's interval must be when neighbouring residuals are correlated (a request's
    tokens fall into several seconds, a queue carries over): sqrt((1 + r) / (1 - r)) for the lag-1
    autocorrelation r of the residuals, corrected for its bias in a short series (r + (1 + 3r) / n,
    Marriott and Pope), when positive; 1 otherwise."""
    if residuals.size < 4 or not residuals.var() > 0:
        return 1.0
    r = float(np.corrcoef(residuals[:-1], residuals[1:])[0, 1])
    if not math.isfinite(r):
        return 1.0
    r += (1.0 + 3.0 * r) / residuals.size
    if r <= 0:
        return 1.0
    r = min(r, 0.9)
    return math.sqrt((1.0 + r) / (1.0 - r))


def slope_test(series: Sequence[float], max_drift_pct: float, confidence: float = 1 - ALPHA) -> Slope | None:
    """Whether `series` (equally spaced) changes by more than `max_drift_pct` % of its mean over its length:
    the t-interval of the fitted slope (times the length, in % of the mean; widened for a positive lag-1
    autocorrelation of the residuals) must lie entirely beyond +-`max_drift_pct`. None with fewer than 3
    values or a mean that is not positive."""
    y = _finite(series)
    if y.size < 3 or not y.mean() > 0:
        return None
    from scipy import stats

    x = np.arange(y.size, dtype=float)
    fit = stats.linregress(x, y)
    scale = 100.0 / float(y.mean())
    q = float(special.stdtrit(y.size - 2, 0.5 + confidence / 2.0))
    widen = _ar1_inflation(y - fit.intercept - fit.slope * x)
    pct, half = float(fit.slope) * scale, float(fit.stderr) * scale * q * widen
    span = y.size - 1
    low, high = pct - half, pct + half
    drifts = low * span > max_drift_pct or high * span < -max_drift_pct
    return Slope(pct, low, high, bool(drifts))

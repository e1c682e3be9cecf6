"""Statistics over the order runs were measured in: drift, outlier runs, paired verdicts, families of
verdicts, and latency bounds judged on intervals (pure maths on `scipy.stats`).

Runs of a point happen one after another on a machine that warms up, throttles and gains neighbours, so
a point's runs are not independent draws of one level. What this module judges:

- `trend`: whether a point's runs drift over their order. The least-squares slope of the per-run values
  (in % of their mean per run) with Student's t-test of a zero slope, two-sided at `ALPHA`: `drifts`
  when it is rejected, `no drift shown` otherwise, `not judged` with fewer than `MIN_TREND_RUNS` finite
  values. benchmarks/bench_verdicts.py measures it: at most 5 % false alarms on stationary runs, and a
  -3 %/run drift over 5 runs at a 2 % run-to-run spread found at least 85 % of the time.
- `timeline`: the same test over a server's (or the campaign's) runs in time order, each run relative to its
  point's mean, one level per point.
- `outliers`: the run farthest from the others is an outlier when Grubbs' test rejects it at `OUTLIER_ALPHA`
  (two-sided, 1 %); at most one per point, only among at least `MIN_OUTLIER_RUNS` runs, and never in a
  drifting point (the drift explains the far run). An outlier run is shown and left out of the point's
  statistics like a run failing a validity check.
- `paired_verdict`: B against A where their runs pair (`pairs`, below): the runs of each key averaged
  per side, the log-ratios of the pairs tested by the one-sample t-test (a paired t-test on
  the logarithms); a slow drift common to both arms falls out of every pair, and a decided verdict whose
  pairs' ratio itself drifts over the pairs' order (one arm drifting alone) is `not shown`. Fewer than
  `MIN_RUNS` pairs: `not shown`.
- `adjust`: p-values of a family of verdicts adjusted by Holm's step-down (`holm`, family-wise error) or
  Benjamini-Hochberg (`bh`, false discovery rate, which on identical campaigns is also the chance of any
  false verdict).
- `bound_verdict`: whether an interval of a metric lies inside a service-level bound (`met`), outside it
  (`missed`) or across it (`not shown`).

Pairing (the run order's fields on each run's record, `raysweep.maths.order`): `block` is the block of server
starts a run belongs to (`order.instances`: block k starts instance k of every configuration, ordered AB BA
across them), `round` its pass over its server's points, `slot` its place in its server's life. Two sides'
runs are paired (`pairs`) only where they were measured in the same time span (their start-to-end spans
overlap): by `block` and `round` where the runs of a pair overlap in time (configurations measured at once,
concurrent arms), else by `block` where they hold at least two blocks in common (the unit is then a server
start: the runs of a side within a block are averaged, so that the variation between starts is in the
test). Without either, there are no pairs and Welch's t over runs decides.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy import special  # the t distribution's functions without scipy.stats's import (0.5 s)

from raysweep.maths.verdicts import ALPHA, Equivalence, Verdict

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["ALPHA", "MIN_RUNS", "MIN_TREND_RUNS", "OUTLIER_ALPHA", "PAIR_KEYS", "Outliers", "Trend", "adjust",
           "bound_verdict", "outlier_runs", "outliers", "paired_equivalence", "paired_verdict", "pairs", "run_order",
           "timeline", "trend"]

MIN_RUNS = 3            # fewer runs (or pairs) on a side: a verdict is "not shown"
MIN_TREND_RUNS = 3      # fewer finite values: no trend is judged
MIN_OUTLIER_RUNS = 4    # fewer runs: no outlier is judged (with 3, any two equal runs make the third one)
OUTLIER_ALPHA = 0.01
PAIR_KEYS = ("block",)      # a run table without it has no pairs
ORDER_KEYS = ("started_at", "round", "run_number")


def _values(values: Iterable[Any]) -> np.ndarray:
    out = []
    for v in values:
        try:
            out.append(float(v) if v is not None else math.nan)
        except (TypeError, ValueError):
            out.append(math.nan)
    return np.asarray(out, dtype=float)


# ---------------------------------------------------------------------------------------------------
# Drift over the runs' order
# ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Trend:
    """The slope of a point's runs over their order: `pct_per_run` (% of the mean per run) with its 95 %
    interval and the p-value of a zero slope; `word` drifts / no drift shown / not judged."""

    word: str
    pct_per_run: float = math.nan
    low: float = math.nan
    high: float = math.nan
    p_value: float = math.nan
    runs: int = 0
    reason: str = ""

    @property
    def drifts(self) -> bool:
        return self.word == "drifts"

    @property
    def text(self) -> str:
        if self.word == "not judged":
            return f"not judged: {self.reason}"
        what = (f"{self.pct_per_run:+.1f} %/run (95 % CI {self.low:+.1f} to {self.high:+.1f}), "
                f"p={self.p_value:.2g} over {self.runs} runs")
        return f"drifts {what}" if self.drifts else f"no drift shown ({what})"


def trend(values: Sequence[Any], alpha: float = ALPHA) -> Trend:
    """The trend test of values in their run order (see the module docstring); NaN and missing values are
    left out, the others keep their places in the order."""
    y = _values(values)
    x = np.arange(y.size, dtype=float)
    keep = np.isfinite(y)
    x, y = x[keep], y[keep]
    n = int(y.size)
    if n < MIN_TREND_RUNS:
        return Trend("not judged", runs=n, reason=f"fewer than {MIN_TREND_RUNS} runs with a value")
    mean = float(np.mean(y))
    if not (math.isfinite(mean) and mean != 0):
        return Trend("not judged", runs=n, reason="the runs' mean is zero")
    rel = 100.0 * y / abs(mean)
    xc = x - x.mean()
    sxx = float(np.sum(xc * xc))
    slope = float(np.sum(xc * (rel - rel.mean())) / sxx)
    resid = rel - rel.mean() - slope * xc
    dof = n - 2
    s2 = float(np.sum(resid * resid)) / dof
    if not math.isfinite(s2):
        return Trend("not judged", runs=n, reason="the runs' values are not finite")
    se = math.sqrt(s2 / sxx)
    if se == 0.0:   # a perfect line: any slope is certain, none is none
        p = 0.0 if slope != 0.0 else 1.0
        return Trend("drifts" if p < alpha else "no drift shown", slope, slope, slope, p, n)
    tstat = slope / se
    p = float(2.0 * special.stdtr(dof, -abs(tstat)))
    q = float(special.stdtrit(dof, 1.0 - alpha / 2.0))
    return Trend("drifts" if p < alpha else "no drift shown", slope, slope - q * se, slope + q * se, p, n)


def timeline(points: Sequence[Any], values: Sequence[Any], alpha: float = ALPHA) -> Trend:
    """The trend of a server's (or a campaign's) runs over their time order, whatever point each measured:
    each run's value relative to its point's mean (in %), regressed on the run's place in the order with one
    level per point (a point's level is not a drift), the slope's t-test on the residual degrees of freedom
    (runs less points less one). `points` names each run's point, in the order the runs were measured."""
    y = _values(values)
    keys = [str(p) for p in points]
    keep = np.isfinite(y)
    slots = np.arange(y.size, dtype=float)[keep]
    y = y[keep]
    keys = [k for k, g in zip(keys, keep) if g]
    groups = sorted(set(keys))
    n, k = int(y.size), len(groups)
    if n - k - 1 < 1:
        return Trend("not judged", runs=n, reason="too few runs beside one per point")
    rel = np.empty(n)
    for g in groups:
        idx = np.asarray([i for i, key in enumerate(keys) if key == g])
        m = float(np.mean(y[idx]))
        if not (math.isfinite(m) and m != 0):
            return Trend("not judged", runs=n, reason="a point's mean is zero")
        rel[idx] = 100.0 * (y[idx] / abs(m) - np.sign(m))
    design = np.column_stack([slots, *[np.asarray([key == g for key in keys], dtype=float) for g in groups]])
    coef, *_ = np.linalg.lstsq(design, rel, rcond=None)
    resid = rel - design @ coef
    dof = n - k - 1
    s2 = float(resid @ resid) / dof
    cov = np.linalg.pinv(design.T @ design)
    se = math.sqrt(max(s2 * float(cov[0, 0]), 0.0))
    slope = float(coef[0])
    if se == 0.0:
        p = 0.0 if slope != 0.0 else 1.0
        return Trend("drifts" if p < alpha else "no drift shown", slope, slope, slope, p, n)
    p = float(2.0 * special.stdtr(dof, -abs(slope / se)))
    q = float(special.stdtrit(dof, 1.0 - alpha / 2.0))
    return Trend("drifts" if p < alpha else "no drift shown", slope, slope - q * se, slope + q * se, p, n)


def run_order(runs: pd.DataFrame) -> list[Any]:
    """The index labels of a point's runs (a DataFrame) in the order they were measured: by `started_at`
    where every run has one, else by `round` and run number, else by run number, else as given."""
    for keys in (("started_at",), ("round", "run_number"), ("run_number",)):
        if not all(k in runs.columns for k in keys):
            continue
        cols = [np.asarray([_num(v) for v in runs[k].tolist()], dtype=float) for k in keys]
        if all(np.isfinite(c).all() for c in cols):
            order = np.lexsort(tuple(reversed(cols)))   # the first key sorts first; ties keep their place
            return [runs.index[i] for i in order]
    return list(runs.index)


# ---------------------------------------------------------------------------------------------------
# Outlier runs
# ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Outliers:
    """Which runs (positions in the values given) are outliers, and the rule's answer in words."""

    mask: list[bool]
    text: str
    deviation_pct: float = math.nan   # the outlier's distance from the median of the others, in % of it

    @property
    def count(self) -> int:
        return int(sum(self.mask))


def _grubbs_critical(n: int, alpha: float) -> float:
    t = float(special.stdtrit(n - 2, 1.0 - alpha / (2.0 * n)))
    return (n - 1) / math.sqrt(n) * math.sqrt(t * t / (n - 2 + t * t))


def outliers(values: Sequence[Any], alpha: float = OUTLIER_ALPHA) -> Outliers:
    """Grubbs' two-sided test of the run farthest from the mean (see the module docstring)."""
    y = _values(values)
    mask = [False] * int(y.size)
    keep = np.flatnonzero(np.isfinite(y))
    n = int(keep.size)
    if n < MIN_OUTLIER_RUNS:
        return Outliers(mask, f"not judged: fewer than {MIN_OUTLIER_RUNS} runs")
    v = y[keep]
    sd = float(np.std(v, ddof=1))
    if not (math.isfinite(sd) and sd > 0):
        return Outliers(mask, "none: the runs do not differ")
    g = np.abs(v - v.mean()) / sd
    far = int(np.argmax(g))
    if not g[far] > _grubbs_critical(n, alpha):
        return Outliers(mask, f"none (Grubbs' test at {alpha:.0%})")
    mask[int(keep[far])] = True
    others = np.delete(v, far)
    med = float(np.median(others))
    dev = 100.0 * (float(v[far]) - med) / abs(med) if med else math.nan
    return Outliers(mask, f"run {int(keep[far])} of {n} is an outlier ({dev:+.1f} % from the median of the others; "
                          f"Grubbs' test at {alpha:.0%})", dev)


def outlier_runs(values: np.ndarray, groups: np.ndarray, k: int, alpha: float = OUTLIER_ALPHA) -> np.ndarray:
    """`outliers` of many points at once: per run, whether it is its group's outlier (groups coded 0 .. k - 1; the
    values finite), by the same rule, at most one per group."""
    values, groups = np.asarray(values, dtype=float), np.asarray(groups, dtype=int)
    out = np.zeros(values.size, dtype=bool)
    if not values.size:
        return out
    n = np.bincount(groups, minlength=k).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.bincount(groups, weights=values, minlength=k) / n
        sd = np.sqrt(np.bincount(groups, weights=(values - mean[groups]) ** 2, minlength=k) / (n - 1.0))
        g = np.abs(values - mean[groups]) / sd[groups]
    g = np.where(np.isfinite(g), g, -1.0)
    top = np.full(k, -1.0)
    np.maximum.at(top, groups, g)
    critical = np.full(k, np.inf)
    for size in np.unique(n[n >= MIN_OUTLIER_RUNS]):
        critical[n == size] = _grubbs_critical(int(size), alpha)
    judged = (n >= MIN_OUTLIER_RUNS) & (sd > 0) & (top > critical)
    first = np.zeros(k, dtype=bool)
    for i in np.flatnonzero(judged[groups] & (g == top[groups])):   # the first run at the group's largest distance
        if not first[groups[i]]:
            first[groups[i]] = out[i] = True
    return out


# ---------------------------------------------------------------------------------------------------
# Paired verdicts
# ---------------------------------------------------------------------------------------------------

def _span(runs: pd.DataFrame) -> tuple[float, float] | None:
    if "started_at" not in runs.columns:
        return None
    start = np.asarray([_num(v) for v in runs["started_at"]], dtype=float)
    end = np.asarray([_num(v) for v in runs["ended_at"]], dtype=float) if "ended_at" in runs.columns else start
    good = np.isfinite(start)
    if not good.any():
        return None
    end = np.where(np.isfinite(end), end, start)
    return float(start[good].min()), float(end[good].max())


def _num(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _overlap(a: tuple[float, float] | None, b: tuple[float, float] | None) -> bool:
    return a is not None and b is not None and a[0] <= b[1] and b[0] <= a[1]


def pairs(a: pd.DataFrame, b: pd.DataFrame) -> tuple[str, list[Any], list[Any]] | None:
    """How two sides' runs (DataFrames of one point each) pair (see the module docstring): (what a pair is,
    the key of each run of A, of B), or None: not measured side by side."""
    cols_a, cols_b = getattr(a, "columns", ()), getattr(b, "columns", ())
    if "block" not in cols_a or "block" not in cols_b or a.empty or b.empty:
        return None
    if not _overlap(_span(a), _span(b)):   # different campaigns, or different times
        return None
    if "round" in cols_a and "round" in cols_b:
        ka = [f"{x}/{y}" for x, y in zip(a["block"], a["round"])]
        kb = [f"{x}/{y}" for x, y in zip(b["block"], b["round"])]
        common = set(ka) & set(kb)
        if common and all(_overlap(_span(a[[k == c for k in ka]]), _span(b[[k == c for k in kb]]))
                          for c in common):
            return "runs measured at once", ka, kb
    ka, kb = [str(x) for x in a["block"]], [str(x) for x in b["block"]]
    if len({k for k in ka if _known(k)} & {k for k in kb if _known(k)}) >= 2:
        return "blocks", ka, kb
    return None


def _known(v: object) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v)) and str(v) != ""


def _by_key(keys: Sequence[Any], values: Sequence[Any]) -> dict[str, float]:
    """The mean of the positive finite values of each key (a block may hold several runs of one side)."""
    groups: dict[str, list[float]] = {}
    for k, v in zip(keys, _values(values)):
        if _known(k) and math.isfinite(v) and v > 0:
            groups.setdefault(str(k), []).append(float(v))
    return {k: float(np.mean(v)) for k, v in groups.items()}


def paired_verdict(keys_a: Sequence[Any], values_a: Sequence[Any], keys_b: Sequence[Any],
                   values_b: Sequence[Any], higher_is_better: bool = True, alpha: float = ALPHA,
                   key: str = "blocks") -> Verdict:
    """B against A over the pairs their keys make (see the module docstring); `ratio` is the geometric mean
    of the pairs' ratios B / A."""
    a, b = _by_key(keys_a, values_a), _by_key(keys_b, values_b)
    common = sorted(set(a) & set(b))
    test = f"paired t over {len(common)} {key}"
    if not common:
        return Verdict("not judged", 0, 0, test=test, reason=f"no pair ({key}) holds runs of both sides")
    d = np.log([b[k] for k in common]) - np.log([a[k] for k in common])
    ratio = float(math.exp(float(np.mean(d))))
    n = len(common)
    if n < MIN_RUNS:
        return Verdict("not shown", n, n, ratio, test=test, reason=f"fewer than {MIN_RUNS} pairs")
    sd = float(np.std(d, ddof=1))
    if sd == 0.0:
        p = 0.0 if float(np.mean(d)) != 0.0 else 1.0
    else:
        p = float(2.0 * special.stdtr(n - 1, -abs(float(np.mean(d)) / (sd / math.sqrt(n)))))
    if not p < alpha:
        return Verdict("not shown", n, n, ratio, p, test=test)
    drift = trend(list(np.exp(d)))   # the pairs in their order: one arm drifting alone does not cancel
    if drift.drifts:
        return Verdict("not shown", n, n, ratio, p, test=test,
                       reason=f"the pairs' ratio drifts {drift.pct_per_run:+.1f} % a pair")
    return Verdict("better" if (ratio > 1.0) == higher_is_better else "worse", n, n, ratio, p, test=test)


def paired_equivalence(keys_a: Sequence[Any], values_a: Sequence[Any], keys_b: Sequence[Any],
                       values_b: Sequence[Any], tolerance: float = 0.05, confidence: float = 1 - 2 * ALPHA,
                       limit: int = 1000) -> Equivalence:
    """B / A over the pairs their keys make (the geometric mean of the pairs' ratios) with its interval from
    the one-sample t on the pairs' log-ratios (90 %: the two one-sided tests at 5 %), judged against
    [1 - tol, 1 + tol] as `verdicts.equivalence` judges it; `not judged` with fewer than 2 pairs."""
    a, b = _by_key(keys_a, values_a), _by_key(keys_b, values_b)
    common = sorted(set(a) & set(b))
    n = len(common)
    d = np.log([b[k] for k in common]) - np.log([a[k] for k in common]) if n else np.zeros(0)
    ratio = float(math.exp(float(np.mean(d)))) if n else math.nan
    if n < 2:
        return Equivalence("not judged", ratio, math.nan, math.nan, tolerance, n, n)
    sd = float(np.std(d, ddof=1))
    q = float(special.stdtrit(n - 1, 0.5 + confidence / 2.0))
    mean = float(np.mean(d))
    low, high = math.exp(mean - q * sd / math.sqrt(n)), math.exp(mean + q * sd / math.sqrt(n))
    lo_tol, hi_tol = 1.0 - tolerance, 1.0 + tolerance
    word = ("equivalent" if lo_tol <= low and high <= hi_tol else
            "different" if high < lo_tol or low > hi_tol else "not shown")
    needed = None
    if word == "not shown":
        inside = min(math.log(hi_tol) - mean, mean - math.log(lo_tol))
        room = inside if inside > 0 else max(mean - math.log(hi_tol), math.log(lo_tol) - mean)
        if room > 0 and sd > 0:
            needed = next((m for m in range(n, limit)
                           if special.stdtrit(m - 1, 0.5 + confidence / 2.0) * sd / math.sqrt(m) < room), None)
    return Equivalence(word, ratio, low, high, tolerance, n, n, needed)


# ---------------------------------------------------------------------------------------------------
# Families
# ---------------------------------------------------------------------------------------------------

FAMILY_METHODS = {"holm": "family-wise error (Holm)", "bh": "false discovery rate (Benjamini-Hochberg)"}


@dataclass
class Family:
    """Adjusted p-values of a family of tests and what controls them."""

    method: str
    adjusted: list[float] = field(default_factory=list)

    @property
    def tested(self) -> int:
        return sum(math.isfinite(p) for p in self.adjusted)

    @property
    def text(self) -> str:
        return f"{self.tested} tests, {FAMILY_METHODS[self.method]} at {ALPHA:.0%}"


def adjust(p_values: Sequence[float], method: str = "bh") -> Family:
    """The p-values adjusted over the family (NaN ones are not tests and stay NaN)."""
    if method not in FAMILY_METHODS:
        raise ValueError(f"family method {method!r}; accepted: {', '.join(FAMILY_METHODS)}")
    p = np.asarray([float(x) if x is not None else math.nan for x in p_values], dtype=float)
    out = np.full(p.size, math.nan)
    live = np.flatnonzero(np.isfinite(p))
    m = live.size
    if m:
        order = live[np.argsort(p[live], kind="stable")]
        ps = p[order]
        if method == "holm":
            adj = np.maximum.accumulate(np.minimum(1.0, (m - np.arange(m)) * ps))
        else:
            adj = np.minimum.accumulate((m / np.arange(1, m + 1) * ps)[::-1])[::-1]
            adj = np.minimum(adj, 1.0)
        out[order] = adj
    return Family(method, out.tolist())


# ---------------------------------------------------------------------------------------------------
# A bound judged on an interval
# ---------------------------------------------------------------------------------------------------

def bound_verdict(low: float, high: float, op: str, bound: float) -> str:
    """`met` when the whole interval satisfies `op bound` (`<=`, `<`, `>=`, `>`), `missed` when none of it
    does, `not shown` when it lies across the bound or is unknown."""
    try:
        lo, hi = float(low), float(high)
    except (TypeError, ValueError):
        return "not shown"
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "not shown"
    if op in ("<=", "<"):
        inside = hi <= bound if op == "<=" else hi < bound
        outside = lo > bound if op == "<=" else lo >= bound
    else:
        inside = lo >= bound if op == ">=" else lo > bound
        outside = hi < bound if op == ">=" else hi <= bound
    return "met" if inside else "missed" if outside else "not shown"

"""SLA targets and the search for the largest concurrency or request rate that meets them (pure logic).

- Targets use vLLM's expression syntax: `{p99_e2el_ms: "<=200", p50_ttft_ms: "<100"}`; every threshold of
  a target must hold.
- A probe (one value of the load variable, all its runs) is judged per target, either on its metrics
  (`percentile`), or on the fraction of requests that meet every latency threshold (`attainment`), with a
  Wilson interval: a fraction whose interval straddles the level is `UNRESOLVED`, not a boundary.
- `pool_runs` gives a probe's metrics: latencies pooled over the requests of all its runs; throughputs
  (and goodput) as everything the runs completed over the sum of their durations, i.e. each run's
  throughput weighted by its duration (each run is timed from its own start, so pooled samples cannot be
  timed as one run); peaks are the largest run's; `duration` is the sum.
- Failed requests count against latency thresholds, as infinitely slow requests: in the percentile judge a
  mean fails on any failure, and pNN (median: p50) of TTFT or E2EL is taken over all requests sent,
  failures ranked last; for TPOT and ITL (measured per token or chunk) pNN fails when the failed fraction
  exceeds the 100 - NN % tail. In the attainment judge a failed request meets no threshold.
- Targets on server metrics (`server_*`, the fields `raysweep.serve.metrics` records) are judged on the probe's
  runs combined (`metrics.combine`); a probe whose server metrics were not complete cannot judge a counter
  (the target is `UNRESOLVED`).
- `search` finds the boundary for one target. It first looks at an unbounded-load probe. If that passes,
  no load the point can make breaks the targets. Otherwise its capacity estimate (Little's law for
  concurrency, the throughput for a rate) lets doubling start near the boundary instead of at 1. Doubling
  brackets the boundary, bisection narrows it to `precision`, and an inversion (a larger value passing where
  a smaller one failed) is re-checked once, then reported as `unresolved`.
- Probes go through a caller's `evaluate(value)`, which runs a probe or looks up one already run, so
  targets share probes and a search replays from the ledger after a restart.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np

from raysweep.campaign.slo import (
    LATENCY,
    OPS,
    Target,
    Threshold,
    check_metric,
    meets,
    parse_slo,
    parse_targets,
    search_key,
)

__all__ = ["INFINITE", "Outcome", "Target", "Threshold", "Verdict", "check_metric", "judge_attainment",
           "judge_percentile", "meets", "parse_slo", "parse_targets", "pool_runs", "search", "search_key", "wilson"]

INFINITE = math.inf
_RATES = ("request_throughput", "output_throughput", "total_token_throughput", "request_goodput")
_PEAKS = ("max_output_tokens_per_s", "max_concurrent_requests", "peak_in_flight_requests")


class Verdict(str, Enum):
    PASS = "pass"
    FAIL = "fail"
    UNRESOLVED = "unresolved"


def pool_runs(pooled: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A probe's metrics: `pooled` (computed on the requests of all its runs together: right for latencies
    and counts) with throughputs, peaks and duration taken from each run's own metrics (`runs`)."""
    out = dict(pooled)
    durations = [float(r.get("duration") or 0.0) for r in runs]
    total = sum(d for d in durations if d > 0 and math.isfinite(d))
    out["duration"] = total
    for key in _RATES:
        if all(r.get(key) is None for r in runs):
            continue
        done = sum(float(r.get(key) or 0.0) * d for r, d in zip(runs, durations) if d > 0 and math.isfinite(d))
        out[key] = done / total if total > 0 else 0.0
    for key in _PEAKS:
        values = [r[key] for r in runs if r.get(key) is not None]
        if values:
            out[key] = max(values)
    steady = [r.get("steady_state") for r in runs if "steady_state" in r]
    if steady:
        out["steady_state"] = None if None in steady else all(steady)
        slopes = [r["steady_state_slope_pct_per_s"] for r in runs if r.get("steady_state_slope_pct_per_s") is not None]
        out["steady_state_slope_pct_per_s"] = max(slopes, key=abs) if slopes else None
    return out


def _with_failures(ok_values: np.ndarray, failed: int, pct: float) -> float:
    """numpy's linear percentile of all requests, the `failed` ones ranked last as infinitely slow."""
    k = int(ok_values.size)
    pos = (k + failed - 1) * pct / 100.0
    if k == 0 or pos > k - 1:
        return math.inf
    return float(np.percentile(ok_values, 100.0 * pos / (k - 1))) if k > 1 else float(ok_values[0])


def _judged(metric: str, metrics: dict[str, Any], per_request: dict[str, Any] | None) -> Any:
    """The value a threshold is judged on: the metric, or for a latency with failed requests, the
    latency counting the failures as infinitely slow requests."""
    value = metrics.get(metric)
    failed = int(metrics.get("failed") or 0)
    m = LATENCY.match(metric)
    if not m or failed <= 0 or value is None:
        return value
    stat, kind = m.groups()
    if stat == "mean":
        return math.inf
    pct = 50.0 if stat == "median" else float(stat[1:])
    if per_request is not None and kind in ("ttft", "e2el"):
        ok = np.asarray(per_request["ok"], dtype=bool)
        return _with_failures(np.asarray(per_request[kind], dtype=float)[ok], int((~ok).sum()), pct)
    share = failed / (failed + int(metrics.get("completed") or 0))
    return math.inf if share > 1.0 - pct / 100.0 else value


def judge_percentile(metrics: dict[str, Any], target: Target,
                     per_request: dict[str, np.ndarray] | None = None) -> Verdict:
    """Every threshold on the probe's metrics, failed requests counting against latency thresholds:
    a mean fails with any failure; pNN of TTFT or E2EL is taken over all requests (failures ranked last,
    from `per_request`); pNN of TPOT or ITL (or without `per_request`) fails when the failed fraction of
    the requests exceeds the 100 - NN % tail."""
    for t in target.thresholds:
        value = _judged(t.metric, metrics, per_request)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return Verdict.UNRESOLVED
        if not t.holds(float(value)):
            return Verdict.FAIL
    return Verdict.PASS


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a binomial fraction."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def judge_attainment(per_request: dict[str, np.ndarray], metrics: dict[str, Any], target: Target,
                     level: float = 0.99, z: float = 1.96) -> tuple[Verdict, float, tuple[float, float]]:
    """The fraction of requests meeting every latency threshold (a request that failed meets none), judged
    against `level` with a Wilson interval; point-level thresholds (throughputs) must hold as well.
    `per_request` holds, per request, `ok` and the latencies `ttft`, `tpot`, `itl` (its mean gap), `e2el` in ms."""
    ok = np.asarray(per_request["ok"], dtype=bool)
    good = ok.copy()
    unresolved = False
    for t in target.thresholds:
        m = LATENCY.match(t.metric)
        if m:
            values = np.asarray(per_request[m.group(2)], dtype=float)
            good &= np.where(np.isnan(values), False, OPS[t.op](values, t.bound))
        else:  # a point-level threshold: one that fails fails the target, one that cannot be judged (a server
            # counter from incomplete server metrics) leaves it unresolved, as the percentile judge does
            point = judge_percentile(metrics, Target((t,)))
            if point is Verdict.FAIL:
                return Verdict.FAIL, 0.0, (0.0, 0.0)
            if point is Verdict.UNRESOLVED:
                unresolved = True
    n, k = int(ok.size), int(good.sum())
    lo, hi = wilson(k, n, z)
    frac = k / n if n else 0.0
    if hi < level:
        return Verdict.FAIL, frac, (lo, hi)
    if unresolved:
        return Verdict.UNRESOLVED, frac, (lo, hi)
    if lo >= level:
        return Verdict.PASS, frac, (lo, hi)
    if hi < level:
        return Verdict.FAIL, frac, (lo, hi)
    return Verdict.UNRESOLVED, frac, (lo, hi)


@dataclass
class Outcome:
    """The answer of one search: `found`, `unresolved`, `never met` (the smallest value fails) or
    `above max` (the targets hold at unbounded load or at `max_value`)."""

    state: str
    largest_pass: float | None
    smallest_fail: float | None
    probes: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def search(evaluate: Callable[[float], Verdict], *, start: float = 1.0, max_value: float = 65536.0,
           precision: float = 0.05, integer: bool = True, estimate: Callable[[], float | None] | None = None,
           recheck: Callable[[float], Verdict] | None = None, known: Callable[[], dict[float, Verdict]] | None = None
           ) -> Outcome:
    """The largest value of the load variable at which `evaluate` passes.

    `evaluate(INFINITE)` is the unbounded-load probe; `estimate()` (called after it) gives the capacity it
    showed, or None. `known()` gives this target's verdicts on values already probed (for other targets):
    bisection uses one that falls in the middle half of the bracket instead of a new value, and all of them
    take part in the monotonicity check. `recheck(v)` runs a value again (new runs) when the verdicts are
    not monotone."""
    probes: list[float] = []
    seen: dict[float, Verdict] = {}

    def ev(v: float) -> Verdict:
        if v not in seen:
            probes.append(v)
            seen[v] = evaluate(v)
        return seen[v]

    def verdicts() -> dict[float, Verdict]:  # everything known for this target, its own probes last
        return {**(known() if known else {}), **seen}

    top = ev(INFINITE)
    if top is Verdict.PASS:
        failed = sorted(v for v, r in verdicts().items() if r is Verdict.FAIL and math.isfinite(v))
        out = Outcome("above max", INFINITE, None, probes, ["the targets hold at unbounded load"])
        return _recheck(out, failed, seen, recheck) if failed else out
    lo, hi = _bracket(ev, start, max_value, estimate() if estimate else None, integer)
    if lo is None and hi is None:
        return Outcome("unresolved", None, None, probes, ["a probe's verdict was unresolved while bracketing"])
    if lo is None:
        return Outcome("never met", None, hi, probes, [f"the targets fail at the smallest value {hi:g}"])
    rechecked = False
    notes: list[str] = []
    while True:
        if hi is None:
            return Outcome("above max", lo, None, probes, [*notes, f"the targets hold up to max_value {lo:g}"])
        while not _narrow_enough(lo, hi, precision, integer):
            mid = math.floor((lo + hi) / 2) if integer else (lo + hi) / 2
            q = (hi - lo) / 4
            shared = [v for v, r in verdicts().items() if r is not Verdict.UNRESOLVED and lo + q <= v <= hi - q]
            if shared:
                mid = min(shared, key=lambda v: abs(v - mid))
            verdict = ev(mid)
            if verdict is Verdict.UNRESOLVED:
                return Outcome("unresolved", lo, hi, probes,
                               [*notes, f"{mid:g} is unresolved: the noise is larger than the step"])
            lo, hi = (mid, hi) if verdict is Verdict.PASS else (lo, mid)
        out = Outcome("found", lo, hi, probes, notes)
        passes = [v for v, r in verdicts().items() if r is Verdict.PASS and math.isfinite(v)]
        inverted = sorted(v for v, r in verdicts().items() if r is Verdict.FAIL and passes and v < max(passes))
        if not inverted:
            return out
        if rechecked:
            out.state = "unresolved"
            out.notes.append("not monotone after a re-check: " + ", ".join(f"{v:g}" for v in inverted))
            return out
        out = _recheck(out, inverted, seen, recheck)
        if out.state == "unresolved":
            return out
        rechecked = True  # they pass now: the boundary lies above the largest passing value
        lo = max(v for v, r in verdicts().items() if r is Verdict.PASS and math.isfinite(v))
        above = [v for v, r in verdicts().items() if r is Verdict.FAIL and lo < v < INFINITE]
        hi = min(above) if above else _double_from(ev, lo, max_value)


def _recheck(out: Outcome, values: list[float], seen: dict[float, Verdict],
             recheck: Callable[[float], Verdict] | None) -> Outcome:
    """Values that failed where a larger one passed, run once more: their new verdicts replace the old ones;
    any that still fails (or no way to re-check) leaves the answer `unresolved`."""
    out.notes.append("not monotone: " + ", ".join(f"{v:g} failed below a passing value" for v in values))
    if recheck is None:
        out.state = "unresolved"
        return out
    again = {v: recheck(v) for v in values}
    out.probes.extend(values)
    seen.update(again)
    if all(r is Verdict.PASS for r in again.values()):
        out.notes.append("re-checked: they pass now")
        return out
    out.state = "unresolved"
    return out


def _double_from(ev: Callable[[float], Verdict], lo: float, max_value: float) -> float | None:
    """The first failing value doubling up from a passing `lo` (None: up to max_value passes)."""
    while lo < max_value:
        v = min(lo * 2, max_value)
        if ev(v) is not Verdict.PASS:
            return v
        lo = v
    return None


def _bracket(ev: Callable[[float], Verdict], start: float, max_value: float, capacity: float | None,
             integer: bool) -> tuple[float | None, float | None]:
    """(largest pass, smallest fail) by doubling, from a quarter of the estimated capacity (never below
    `start`), halving back down when that first probe already fails. (None, None) when unresolved."""
    first = start
    if capacity and capacity > 0:
        while first * 2 <= min(capacity / 2, max_value):
            first *= 2
    v = first
    verdict = ev(v)
    if verdict is Verdict.UNRESOLVED:
        return None, None
    if verdict is Verdict.FAIL:
        hi = v
        while v > start:
            v = max(start, math.floor(v / 2) if integer else v / 2)
            verdict = ev(v)
            if verdict is Verdict.UNRESOLVED:
                return None, None
            if verdict is Verdict.PASS:
                return v, hi
            hi = v
        return None, hi
    lo = v
    while lo < max_value:
        v = min(lo * 2, max_value)
        verdict = ev(v)
        if verdict is Verdict.UNRESOLVED:
            return None, None
        if verdict is Verdict.FAIL:
            return lo, v
        lo = v
    return lo, None


def _narrow_enough(lo: float, hi: float, precision: float, integer: bool) -> bool:
    return (integer and hi - lo <= 1) or (hi - lo) <= precision * hi

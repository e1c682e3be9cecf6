"""SLA targets and the search for the largest concurrency or request rate that meets them (pure logic).

- Targets use vLLM's expression syntax: `{p99_e2el_ms: "<=200", p50_ttft_ms: "<100"}`; every threshold of
  a target must hold.
- A probe (one value of the load variable, all its runs pooled) is judged per target, either on the pooled
  metrics (`percentile`), or on the fraction of requests that meet every latency threshold (`attainment`),
  with a Wilson interval: a fraction whose interval straddles the level is `UNRESOLVED`, not a boundary.
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
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np

from raysweep.errors import CampaignError

__all__ = ["INFINITE", "Outcome", "Target", "Threshold", "Verdict", "judge_attainment", "judge_percentile",
           "parse_targets", "search", "wilson"]

INFINITE = math.inf
_OPS: dict[str, Callable[[float, float], bool]] = {"<=": operator.le, "<": operator.lt, ">=": operator.ge,
                                                   ">": operator.gt}
_EXPR = re.compile(r"^\s*(<=|<|>=|>)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$")
_LATENCY = re.compile(r"^(mean|median|p\d+(?:\.\d+)?)_(ttft|tpot|itl|e2el)_ms$")
_POINT_METRICS = ("request_throughput", "output_throughput", "total_token_throughput", "request_goodput",
                  "completed", "failed", "max_concurrent_requests", "duration")


class Verdict(str, Enum):
    PASS = "pass"
    FAIL = "fail"
    UNRESOLVED = "unresolved"


@dataclass(frozen=True)
class Threshold:
    metric: str
    op: str
    bound: float

    def holds(self, value: float) -> bool:
        return bool(_OPS[self.op](value, self.bound))

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.bound:g}"


@dataclass(frozen=True)
class Target:
    thresholds: tuple[Threshold, ...]

    @property
    def label(self) -> str:
        return " & ".join(str(t) for t in self.thresholds)


def parse_targets(raw: Any, fld: str = "sla.targets") -> list[Target]:
    """Targets from the campaign: a list of {metric: "<op><number>"}; anything else names the target at fault."""
    if not isinstance(raw, list) or not raw:
        raise CampaignError(fld, "must be a non-empty list of {metric: \"<=number\"} mappings")
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or not item:
            raise CampaignError(f"{fld}[{i}]", "must be a mapping of metric -> expression, e.g. {p99_e2el_ms: \"<=200\"}")
        ths = []
        for metric, expr in item.items():
            where = f"{fld}[{i}].{metric}"
            if not (_LATENCY.match(str(metric)) or metric in _POINT_METRICS or str(metric).startswith("server_")):
                raise CampaignError(where, "is not a metric the results carry; accepted: {mean,median,pNN}_"
                                           "{ttft,tpot,itl,e2el}_ms, " + ", ".join(_POINT_METRICS) + ", server_*")
            m = _EXPR.match(str(expr))
            if not m:
                raise CampaignError(where, f"expression {expr!r} is not one of <=, <, >=, > followed by a number "
                                           "(quote it in YAML: \"<=200\")")
            ths.append(Threshold(str(metric), m.group(1), float(m.group(2))))
        out.append(Target(tuple(ths)))
    return out


def judge_percentile(metrics: dict[str, Any], target: Target) -> Verdict:
    """Every threshold on the pooled metrics of the probe's runs."""
    for t in target.thresholds:
        value = metrics.get(t.metric)
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
    for t in target.thresholds:
        m = _LATENCY.match(t.metric)
        if m:
            values = np.asarray(per_request[m.group(2)], dtype=float)
            good &= np.where(np.isnan(values), False, _OPS[t.op](values, t.bound))
        elif judge_percentile(metrics, Target((t,))) is not Verdict.PASS:
            return Verdict.FAIL, 0.0, (0.0, 0.0)
    n, k = int(ok.size), int(good.sum())
    lo, hi = wilson(k, n, z)
    frac = k / n if n else 0.0
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
    rechecked, notes = False, []
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

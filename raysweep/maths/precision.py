"""`bench.precision`: points measured until the interval of one metric is narrow enough.

A campaign with `bench: {precision: {metric: output_throughput, rel_half_width: 0.03, min_runs: 3, max_runs:
10}}` runs every point `min_runs` times, then one more run at a time while the Student t-interval of the
metric's mean over the point's runs (`raysweep.maths.verdicts.relative_half_width`, at `confidence`, widened
for the looks as below) is wider than `rel_half_width` of the mean (at two successive runs: `decide`), and
stops at `max_runs` (the point then says so: state `max_runs`), or, with `max_duration_s`, once the measured
durations of its runs add up to that many seconds (state `max_duration`). This module holds the section's
schema and the stopping rule (pure); the runs themselves are added by `raysweep.drive.sequential`.

Stopping when an interval is narrow selects runs whose spread happened to be low, so a plain 95 % interval of
the stopped point covers the true mean less often than 95 % (91.8 % at the worst noise level simulated). The rule
therefore judges, and every place that quotes the point (the terminal, the summary, the report, `--json`)
reports, one interval for the precision metric: the campaign's 95 % interval widened for the sequential looks,
its t quantile taken at `reported_confidence` (the miss rate halved: 97.5 % for 95 %).
`benchmarks/bench_verdicts.py --precision` measures how often it covers the true mean at every noise level.
"""

from __future__ import annotations

import difflib
import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["METRICS", "Decision", "PrecisionSpec", "decide", "describe", "expected_runs", "interval_name",
           "most_runs", "reported_confidence", "runs_to_reach"]

REACHED, AT_MAX, AT_DURATION, MEASURING = "reached", "max_runs", "max_duration", "measuring"
log = logging.getLogger(__name__)
CONFIRM_LOOKS = 2  # successive narrow intervals a point needs to stop (see `decide`)

# Per-run metrics a point's result records hold (the results table names them the same).
_RATES = ("request_throughput", "output_throughput", "total_token_throughput", "request_goodput")
_LATENCY = tuple(f"{stat}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el")
                 for stat in ("mean", "median", "p90", "p95", "p99"))
METRICS = _RATES + _LATENCY
_PERCENTILE = re.compile(r"^p(\d+(?:\.\d+)?)_(ttft|tpot|itl|e2el)_ms$")


class PrecisionSpec(BaseModel):
    """When a point has enough runs: the t-interval of `metric`'s mean over its runs within
    `rel_half_width` of the mean, or `max_runs` runs."""

    model_config = ConfigDict(extra="forbid")

    metric: str = Field(description="the per-run metric whose interval decides, e.g. output_throughput, "
                        "median_ttft_ms, p99_tpot_ms")
    rel_half_width: float = Field(gt=0, lt=1, description="the interval's half-width over the mean at which a "
                                  "point stops (0.03: within +-3 %)")
    min_runs: int = Field(3, ge=2, description="runs every point gets before the interval is looked at (at "
                          "least 2: one run has no interval)")
    max_runs: int = Field(10, ge=2, description="the most runs a point gets; one that stops here says so")
    max_duration_s: float | None = Field(None, gt=0, description="the most measured run time a point gets, in s: "
                                         "no run is added once its runs' durations add up to this (the point "
                                         "then says so: state max_duration); min_runs still run")
    confidence: float = Field(0.95, gt=0, lt=1, description="the interval's two-sided confidence")

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, v: str) -> str:
        m = _PERCENTILE.match(v)
        if v in METRICS or (m and 0 < float(m.group(1)) < 100):
            return v
        close = difflib.get_close_matches(v, METRICS, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise ValueError(f"unknown metric {v!r}; {hint}accepted: {', '.join(_RATES)}, and "
                         "mean|median|pNN_(ttft|tpot|itl|e2el)_ms with 0 < NN < 100")

    @model_validator(mode="after")
    def _runs_in_order(self) -> PrecisionSpec:
        if self.max_runs < self.min_runs:
            raise ValueError(f"max_runs ({self.max_runs}) must be at least min_runs ({self.min_runs})")
        return self


@dataclass(frozen=True)
class Decision:
    """Where a point stands: `state` reached / max_runs / max_duration / measuring, over `runs_done` runs
    with values, and the interval's relative half-width (nan with fewer than 2 values); `looks` the
    half-widths the rule read at its last successive looks, by run count; `drift` the trend test's answer
    where the runs drift (a drifting point is never reached)."""

    state: str
    runs_done: int
    rel_half_width: float
    looks: tuple[tuple[int, float], ...] = ()
    drift: str = ""

    @property
    def wants_more(self) -> bool:
        return self.state == MEASURING

    def text(self, spec: PrecisionSpec) -> str:
        """The rule's state in words, with the intervals it read: `95 % interval (widened ...) of
        output_throughput's mean: +-4.6 % at run 5, +-5.9 % at run 4: the rule needs 2 successive runs within
        +-5.0 %; stopped at max_runs`."""
        target = f"+-{100 * spec.rel_half_width:.1f} %"
        seen = ", ".join(f"+-{100 * w:.1f} % at run {n}" for n, w in reversed(self.looks) if math.isfinite(w)) \
            or "no interval yet"
        level = f"{interval_name(spec)} of {spec.metric}'s mean"
        if self.drift:
            rule = f"the runs drift ({self.drift}): never reached while they do"
        elif self.state == REACHED:
            rule = f"within {target} at {CONFIRM_LOOKS} successive runs: reached"
        else:
            rule = f"the rule needs {CONFIRM_LOOKS} successive runs within {target}"
        end = {AT_MAX: "; stopped at max_runs", AT_DURATION: "; stopped at max_duration_s",
               MEASURING: "; measuring"}.get(self.state, "")
        return f"{level}: {seen}: {rule}{end}"


def decide(values: Sequence[float], runs_spent: int, spec: PrecisionSpec, seconds: float = 0.0) -> Decision:
    """The stopping rule after a point's runs: `values` are the metric of its finished runs (in run
    order), `runs_spent` the run numbers it used (failed runs count against `max_runs` too), `seconds` the
    measured durations of its done runs added up (against `max_duration_s`).

    A point whose values drift over their order (`over_time.trend`) is never reached: it runs on to
    `max_runs` (or `max_duration_s`) and says so. Otherwise a point stops when its interval is narrow
    enough over its values and was already over all but the last one (`CONFIRM_LOOKS` successive looks
    from `min_runs` values on): stopping at the first narrow
    interval stops on a lucky low spread more often, and the interval then covers the true mean less
    often than it says (`benchmarks/bench_verdicts.py --precision` measures both rules)."""
    # scipy is imported only where a point is judged, not by the schema
    from raysweep.maths.over_time import trend
    from raysweep.maths.verdicts import relative_half_width

    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    level = reported_confidence(spec)
    width = relative_half_width(finite, level)
    looked = [(n, relative_half_width(finite[:n], level))
              for n in range(max(2, len(finite) - CONFIRM_LOOKS + 1), len(finite) + 1)]
    looks = [w for n, w in looked if n >= spec.min_runs]
    drift = trend(finite)
    drifting = drift.text if drift.drifts else ""
    kept = tuple(looked)
    if not drifting and len(looks) == CONFIRM_LOOKS and all(math.isfinite(w) and w <= spec.rel_half_width
                                                            for w in looks):
        return Decision(REACHED, len(finite), width, kept)
    if runs_spent >= spec.max_runs:
        return Decision(AT_MAX, len(finite), width, kept, drifting)
    if spec.max_duration_s is not None and seconds >= spec.max_duration_s:
        return Decision(AT_DURATION, len(finite), width, kept, drifting)
    return Decision(MEASURING, len(finite), width, kept, drifting)


def most_runs(spec: PrecisionSpec, run_s: float | None = None) -> int:
    """The most runs a point can get: `max_runs`, or fewer where `max_duration_s` stops it first at runs of
    `run_s` seconds each (the run that reaches the budget still runs; `min_runs` always do)."""
    if spec.max_duration_s is None or not run_s or run_s <= 0:
        return spec.max_runs
    return max(spec.min_runs, min(spec.max_runs, math.ceil(spec.max_duration_s / run_s - 1e-9)))


def expected_runs(values: Sequence[float], spec: PrecisionSpec, run_s: float | None = None) -> int:
    """Runs a point is expected to take, from the spread of the values seen so far: the smallest n >= min_runs
    whose t-interval at that spread is narrow enough, and the runs that confirm it (`decide`), at most
    `most_runs` (`max_runs`, or what `max_duration_s` allows at `run_s` seconds a run); before two values
    are known, the fewest runs the rule allows."""
    return min(_expected_runs(values, spec), most_runs(spec, run_s))


def _expected_runs(values: Sequence[float], spec: PrecisionSpec) -> int:
    from scipy import stats

    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if len(finite) < 2:  # nothing known: the fewest the rule allows
        return min(spec.min_runs + CONFIRM_LOOKS - 1, spec.max_runs)
    mean = sum(finite) / len(finite)
    sd = math.sqrt(sum((v - mean) ** 2 for v in finite) / (len(finite) - 1))
    if not mean:
        return spec.max_runs
    cv = sd / abs(mean)
    for n in range(spec.min_runs, spec.max_runs + 1):
        if stats.t.ppf(0.5 + reported_confidence(spec) / 2.0, n - 1) * cv / math.sqrt(n) <= spec.rel_half_width:
            return min(n + CONFIRM_LOOKS - 1, spec.max_runs)  # and the looks that confirm it
    return spec.max_runs


def runs_to_reach(cv: float, spec: PrecisionSpec) -> int | None:
    """The runs a point of run-to-run spread `cv` needs to be reached by the rule: the fewest (at least
    `min_runs`) whose interval is within `rel_half_width`, and the look that confirms it; not capped at
    `max_runs` (None for an unknown spread)."""
    from raysweep.maths.verdicts import runs_for_half_width

    n = runs_for_half_width(cv, spec.rel_half_width, reported_confidence(spec))
    return None if n is None else max(n, spec.min_runs) + CONFIRM_LOOKS - 1


def reported_confidence(spec: PrecisionSpec) -> float:
    """The level of the t quantile of the one interval a point of a `bench.precision` campaign is judged by and
    reports for its metric: the spec's miss rate halved (0.975 for 0.95), for the looks of sequential stopping
    (see the module)."""
    return 1.0 - (1.0 - spec.confidence) / 2.0


def interval_name(spec: PrecisionSpec) -> str:
    """What that interval is, in words: `95 % interval (widened for the rule's looks: t at 97.5 %)`."""
    return (f"{100 * spec.confidence:g} % interval (widened for the rule's looks: t at "
            f"{100 * reported_confidence(spec):g} %)")


def describe(spec: PrecisionSpec) -> str:
    """One line for the dry run and the docs."""
    budget = (f", or {spec.max_duration_s:g} s of measured runs" if spec.max_duration_s is not None else "")
    return (f"{spec.min_runs} to {spec.max_runs} run(s) per point{budget}, until the {interval_name(spec)} "
            f"of {spec.metric}'s mean is within +-{spec.rel_half_width:.1%} of it at {CONFIRM_LOOKS} successive runs")

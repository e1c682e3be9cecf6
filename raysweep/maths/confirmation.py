"""The verdict of the winner's confirmation (`raysweep.drive.confirm` runs it): the leader's and the runner-up's
fresh runs compared by Welch's t, the leader's interval from its own fresh runs; "not shown" with fewer than
`MIN_RUNS` runs on a side. Where the campaign measured the spread between server starts
(`raysweep.maths.start_spread`: the confirmation's own starts measure it), the two arms are compared as levels
over their starts (`compare_over_starts`) and the leader's interval includes that spread."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from raysweep.maths.start_spread import OVER_STARTS, StartSpread, compare_over_starts, widened_intervals

__all__ = ["MIN_RUNS", "Confirmation", "confirmed_verdict"]

@dataclass(frozen=True)
class Confirmation:
    """The confirmation of one shape's leader against its runner-up, over their fresh runs: the leader's mean
    and interval, the runner-up's mean, the lead, Welch's p and the verdict (True: shown better; False: not
    shown; None: too few runs to judge)."""

    leader_mean: float
    ci_low: float
    ci_high: float
    runner_mean: float
    runner_ci: tuple[float, float]
    lead: float | None
    p_value: float | None
    significant: bool | None
    runs: tuple[int, int]
    starts: tuple[int, int]
    test: str = "Welch's t"

    def text(self, confidence: float = 0.95) -> str:
        n = f"{self.runs[0]} and {self.runs[1]} fresh run(s) on {self.starts[0]} and {self.starts[1]} server start(s)"
        if self.significant is None:
            return f"confirmation not shown: {n}, fewer than 3 on a side"
        lead = f"{self.lead:+.1%}" if self.lead is not None else "no lead"
        said = "confirmed better" if self.significant else "not confirmed better"
        return f"{said} on {n} (AB BA): {lead}, {self.test} p={self.p_value:.2g}"


MIN_RUNS = 3  # a verdict with fewer runs on a side is "not shown"


def confirmed_verdict(leader: Sequence[float], runner: Sequence[float], higher_is_better: bool,
                      starts: tuple[int, int] = (0, 0), confidence: float = 0.95,
                      spread: StartSpread | None = None) -> Confirmation | None:
    """The confirmation's verdict from the objective of the leader's and the runner-up's fresh runs (over
    server starts where `spread` is given)."""
    from raysweep.maths.verdicts import compare_values, mean_interval

    a = [float(v) for v in leader if v is not None and math.isfinite(float(v))]
    b = [float(v) for v in runner if v is not None and math.isfinite(float(v))]
    if not a or not b:
        return None
    ma, lo, hi = mean_interval(a, confidence)
    mb, blo, bhi = mean_interval(b, confidence)
    if spread is not None:
        (lo, hi), (blo, bhi) = _over_starts(a, starts[0], spread, confidence), _over_starts(b, starts[1], spread,
                                                                                         confidence)
    lead = None if not mb else ((ma - mb) / abs(mb) if higher_is_better else (mb - ma) / abs(mb))
    if len(a) < MIN_RUNS or len(b) < MIN_RUNS:
        return Confirmation(ma, lo, hi, mb, (blo, bhi), lead, None, None, (len(a), len(b)), starts)
    if spread is None:
        v = compare_values(b, a, higher_is_better, 1 - confidence)  # the leader (B) against the runner-up (A)
        test = "Welch's t"
    else:
        v = compare_over_starts(_described(b, starts[1]), _described(a, starts[0]), spread, higher_is_better,
                                1 - confidence)
        test = OVER_STARTS
    p = v.p_value if math.isfinite(v.p_value) else None
    return Confirmation(ma, lo, hi, mb, (blo, bhi), lead, p, v.word == "better", (len(a), len(b)), starts, test)


def _described(values: list[float], starts: int) -> tuple[float, float, int, int]:
    x = np.asarray(values, dtype=float)
    return float(x.mean()), float(x.std(ddof=1)) if x.size > 1 else math.nan, int(x.size), starts


def _over_starts(values: list[float], starts: int, spread: StartSpread, confidence: float) -> tuple[float, float]:
    mean, std, runs, k = _described(values, starts)
    low, high = widened_intervals(np.array([mean]), np.array([std]), np.array([runs]), np.array([k]), spread,
                                  confidence)
    return float(low[0]), float(high[0])

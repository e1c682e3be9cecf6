"""The verdict of the winner's confirmation (`raysweep.drive.confirm` runs it): the leader's and the runner-up's
fresh runs compared by Welch's t, the leader's interval from its own fresh runs; "not shown" with fewer than
`MIN_RUNS` runs on a side."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

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

    def text(self, confidence: float = 0.95) -> str:
        n = f"{self.runs[0]} and {self.runs[1]} fresh run(s) on {self.starts[0]} and {self.starts[1]} server start(s)"
        if self.significant is None:
            return f"confirmation not shown: {n}, fewer than 3 on a side"
        lead = f"{self.lead:+.1%}" if self.lead is not None else "no lead"
        said = "confirmed better" if self.significant else "not confirmed better"
        return f"{said} on {n} (AB BA): {lead}, Welch's t p={self.p_value:.2g}"


MIN_RUNS = 3  # a verdict with fewer runs on a side is "not shown"


def confirmed_verdict(leader: Sequence[float], runner: Sequence[float], higher_is_better: bool,
                      starts: tuple[int, int] = (0, 0), confidence: float = 0.95) -> Confirmation | None:
    """The confirmation's verdict from the objective of the leader's and the runner-up's fresh runs."""
    from raysweep.maths.verdicts import compare_values, mean_interval

    a = [float(v) for v in leader if v is not None and math.isfinite(float(v))]
    b = [float(v) for v in runner if v is not None and math.isfinite(float(v))]
    if not a or not b:
        return None
    ma, lo, hi = mean_interval(a, confidence)
    mb, blo, bhi = mean_interval(b, confidence)
    lead = None if not mb else ((ma - mb) / abs(mb) if higher_is_better else (mb - ma) / abs(mb))
    if len(a) < MIN_RUNS or len(b) < MIN_RUNS:
        return Confirmation(ma, lo, hi, mb, (blo, bhi), lead, None, None, (len(a), len(b)), starts)
    v = compare_values(b, a, higher_is_better, 1 - confidence)  # the leader (B) against the runner-up (A)
    p = v.p_value if math.isfinite(v.p_value) else None
    return Confirmation(ma, lo, hi, mb, (blo, bhi), lead, p, v.word == "better", (len(a), len(b)), starts)

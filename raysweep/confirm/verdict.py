"""The verdict of the winner's confirmation (`raysweep.confirm.runs` runs it): the same model of a measurement
(`raysweep.maths.hierarchy`) applied to the leader's and the runner-up's fresh server starts alone, so that the
selection (the leader read high by chance: the winner's curse) does not enter the value, the interval or the
verdict. Each fresh start is a replicate; a side on one fresh start is "not compared"."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from raysweep.maths import hierarchy
from raysweep.maths.verdicts import Verdict

__all__ = ["Confirmation", "confirmed_verdict"]


@dataclass(frozen=True)
class Confirmation:
    """The confirmation of one shape's leader against its runner-up, over their fresh starts: the leader's value
    and interval (at `level`), the runner-up's value and interval, the lead, the p-value and the verdict (True:
    shown better; False: not shown; None: the model cannot compare them, `verdict.reason` says why)."""

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
    test: str = hierarchy.MODEL
    verdict: Verdict | None = None
    level: float = 0.95

    def text(self, confidence: float = 0.95) -> str:
        n = f"{self.runs[0]} and {self.runs[1]} fresh run(s) on {self.starts[0]} and {self.starts[1]} server start(s)"
        if self.significant is None:
            why = self.verdict.text if self.verdict is not None else "not judged"
            return f"confirmation {why}: {n}"
        lead = self.verdict.lead_text if self.verdict is not None else ""
        said = "confirmed better" if self.significant else "not confirmed better"
        return f"{said} on {n}: {lead}, {self.test} p={self.p_value:.2g}"


def confirmed_verdict(leader: Sequence[float], runner: Sequence[float], higher_is_better: bool,
                      starts: tuple[Sequence[object], Sequence[object]], confidence: float = 0.95,
                      ) -> Confirmation | None:
    """The confirmation's verdict from the objective of the leader's and the runner-up's fresh runs, with the
    server start of each run (`starts`: one sequence per side, aligned with the values)."""
    ea = hierarchy.Estimate.of_runs(leader, starts[0])
    eb = hierarchy.Estimate.of_runs(runner, starts[1])
    if not ea.runs or not eb.runs:
        return None
    lo, hi = ea.interval(confidence)
    v = hierarchy.compare(eb, ea, higher_is_better, 1.0 - confidence)   # the leader (B) against the runner-up
    ma, mb = ea.mean, eb.mean
    lead = None
    if mb and math.isfinite(mb):
        lead = (ma - mb) / abs(mb) if higher_is_better else (mb - ma) / abs(mb)
    decided = v.word in ("better", "worse", "not shown")
    p = v.p_value if math.isfinite(v.p_value) else None
    return Confirmation(ma, lo, hi, mb, eb.interval(confidence), lead, p, (v.word == "better") if decided else None,
                        (ea.runs, eb.runs), (ea.starts, eb.starts), hierarchy.MODEL, v, confidence)

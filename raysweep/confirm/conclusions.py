"""The confirmation's part of the conclusions: a bench shape's verdict from the fresh runs of its leader and
runner-up (`confirmed`, lent to `raysweep.results.conclusions` through `raysweep.drive.hooks`), the value, the
interval and the test taken from them (`raysweep.confirm.verdict`), the sweep's own test kept in words."""

from __future__ import annotations

import pandas as pd

from raysweep.confirm.verdict import confirmed_verdict
from raysweep.results.aggregate import left_out_mask
from raysweep.results.conclusions import _PER_GPU, Objective, ShapeVerdict, verdict_text

__all__ = ["confirmed"]


def confirmed(v: ShapeVerdict, runs: pd.DataFrame, obj: Objective, confidence: float) -> None:
    """A shape's verdict from the confirmation's fresh runs of its leader and runner-up, where there are
    some: the lead, the test and `clear` are the confirmation's; the sweep's own test is kept in words."""
    if v.runner_up is None or not len(runs) or "confirms_bench_id" not in runs.columns:
        return
    kept = ~left_out_mask(runs)

    def arm(row: pd.Series) -> tuple[list[float], list[str]]:
        of_it = (runs["serve_id"] == row["serve_id"]) & (runs["confirms_bench_id"] == row["bench_id"])
        # its runs that passed their checks; when none did, all of them, as the sweep's aggregates do
        mine = runs[of_it & kept] if (of_it & kept).any() else runs[of_it]
        metric, per_gpu = obj.metric, obj.per_gpu
        if metric not in mine.columns and metric.endswith(_PER_GPU):  # aggregated per GPU, recorded per server
            metric, per_gpu = metric[: -len(_PER_GPU)], True
        values = pd.to_numeric(mine.get(metric, pd.Series(dtype=float)), errors="coerce")
        if per_gpu:
            values = values / float(row.get("gpus") or 1.0)
        starts = (mine["server_id"].astype(str) if "server_id" in mine.columns
                  else pd.Series("", index=mine.index))
        return list(values.astype(float)), list(starts)

    (a, sa), (b, sb) = arm(v.leader), arm(v.runner_up)
    c = confirmed_verdict(a, b, obj.maximize, (sa, sb), confidence)
    if c is None:
        return
    v.selection = verdict_text(v, drift_note=False)
    v.confirmation, v.significant, v.lead, v.p_value = c, c.significant, c.lead, c.p_value
    v.against = c.verdict
    v.test = f"{c.test} of the confirmation's fresh starts"

"""Reading a tuning campaign: its candidates ranked (the leaderboard) and the names of its objectives."""

from __future__ import annotations

import math
from typing import Any

from raysweep.campaign import TuneSpec
from raysweep.maths.pareto import pareto_front
from raysweep.tune.sampler import _steps


def leaderboard(campaign: dict[str, Any], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Candidates best first: complete ones by objective (Pareto: the front first), then pruned by their
    last rung, then failed and refused. Each row gains `rank` and `on_front` (Pareto)."""
    t = TuneSpec.model_validate(campaign["tune"])
    objs = t.objectives
    done = [r for r in rows if r["state"] == "complete" and r["objective"]]
    if len(objs) == 2:
        front = set(pareto_front([tuple(r["objective"]) for r in done], [o.direction for o in objs]))
        for i, r in enumerate(done):
            r["on_front"] = i in front
        sign = 1 if objs[0].direction == "maximize" else -1
        done.sort(key=lambda r: (not r["on_front"], -sign * r["objective"][0]))
    else:
        sign = 1 if objs[0].direction == "maximize" else -1
        done.sort(key=lambda r: -sign * r["objective"][0])

    def last_rung(r: dict[str, Any]) -> float:
        steps = _steps(r["rungs"])
        return -sign * steps[-1][1] if steps else math.inf
    pruned = sorted((r for r in rows if r["state"] == "pruned"), key=lambda r: (-len(_steps(r["rungs"])), last_rung(r)))
    rest = [r for r in rows if r["state"] in ("running",)] + [r for r in rows if r["state"] in ("failed", "refused")]
    out = done + pruned + rest
    for i, r in enumerate(out):
        r["rank"] = i + 1
    return out


def objective_names(t: TuneSpec) -> list[str]:
    return [o.metric + {"none": "", "gpu": " per GPU", "user": " per user"}[o.per] + f" ({o.direction})"
            for o in t.objectives]

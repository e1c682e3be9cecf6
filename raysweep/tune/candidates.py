"""A tuning candidate: one server configuration asked of the sampler, its state, objective, rung values and
GPU-seconds (its ledger row), and the plan rebuilt from those rows on resume.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from raysweep.ledger import Ledger, PointState
from raysweep.plan.plan import Plan, ServeConfig, serve_points
from raysweep.tune.space import candidate_serve

STATES = ("running", "complete", "pruned", "failed", "refused")


def restore_plan(plan: Plan, ledger: Ledger) -> None:
    """Put the ledger's candidates back into the plan (before `Ledger.sync`, which keeps only plan points):
    a running one with all its points; an ended one with the points it finished or failed."""
    for row in ledger.candidates():
        if row["state"] == "refused":
            continue
        serve = candidate_serve(plan.spec, row["params"])
        points, searches, _ = serve_points(plan.spec, serve, plan.benches)
        if row["state"] != "running":
            kept = {p.point_id for p in ledger.points(serve_id=serve.id, in_plan_only=False)
                    if p.state in (PointState.DONE, PointState.FAILED)}
            points = [p for p in points if p.id in kept]
        plan.add(serve, points, searches)


@dataclass
class Candidate:
    number: int
    serve: ServeConfig
    params: dict[str, Any]
    state: str = "running"
    objective: list[float] | None = None
    rungs: dict[str, float | None] = field(default_factory=dict)
    reason: str | None = None
    gpu_s: float = 0.0
    trial: int | None = None
    started_at: float | None = None
    gpus: int = 0
    created_at: float = 0.0

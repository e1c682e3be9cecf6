"""The confirmation's share of the estimate: the pairs it re-measures, what they cost (server starts, runs,
seconds, from the sweep's measured or guessed durations: `raysweep.plan.estimate`), whether a campaign confirms
its winner (`confirm.enabled`, auto: at most `order.ROOM` of the sweep), and the estimate with it after the sweep
(`with_confirmation`, lent to the estimate through `raysweep.plan.hooks`). Pure: no Ray, no processes."""

from __future__ import annotations

import math
from typing import Any

from raysweep.maths.order import ROOM
from raysweep.plan.estimate import DEFAULTS, Estimate, Measured, _calibration, _point_s, _start_s
from raysweep.plan.plan import Plan

__all__ = ["confirm_applies", "confirm_cost", "confirm_pairs", "confirm_wanted", "order_of_confirm",
           "with_confirmation"]


def order_of_confirm(plan: Plan) -> Any:
    """The campaign's `confirm:` section (its defaults when absent)."""
    from raysweep.maths.order import ConfirmSpec

    return getattr(plan.spec.campaign, "confirm", None) or ConfirmSpec()


def confirm_applies(spec: Any) -> bool:
    """Whether a campaign is one the confirmation can follow: servers raysweep starts, a plain sweep."""
    c = spec.campaign
    return not (spec.offline or c.tune is not None or c.sla is not None or c.serve is None
                or getattr(c.serve, "url", None) is not None
                or getattr(c.bench, "workload", None) is not None)


def confirm_pairs(plan: Plan) -> int:
    """The pairs the confirmation re-measures: one per bench shape (its bench parameters less the load), where
    there are two configurations or more to rank."""
    if len(plan.serves) < 2:
        return 0
    from raysweep.bench.load import VARIABLES

    load_keys = set(VARIABLES)
    return len({tuple(sorted((str(k), repr(v)) for k, v in b.params.items()
                             if str(k).replace("-", "_") not in load_keys)) for b in plan.benches})


def confirm_cost(plan: Plan, measured: Measured | None = None, pairs: int | None = None) -> tuple[int, int, float]:
    """Server starts, runs and seconds the confirmation of `pairs` pair(s) takes (two configurations each;
    default: one per bench shape, `confirm_pairs`). A configuration in several pairs is started once per
    `confirm.starts` for all of its points."""
    spec = order_of_confirm(plan)
    measured = measured or Measured()
    pairs = confirm_pairs(plan) if pairs is None else pairs
    configs = min(2 * pairs, len(plan.serves)) if plan.serves else 2 * pairs
    starts, runs = configs * spec.starts, 2 * pairs * spec.per_arm
    if not plan.points:
        return starts, runs, math.nan
    scale = _calibration(plan, measured, plan.spec.offline, DEFAULTS)
    run_s = sorted(_point_s(p, measured, scale, False, DEFAULTS) for p in plan.points)[len(plan.points) // 2]
    start_s = sorted(_start_s(s.id, measured, DEFAULTS) for s in plan.serves)[len(plan.serves) // 2]
    return starts, runs, starts * start_s + runs * run_s


def confirm_wanted(plan: Plan, sweep_s: float, measured: Measured | None = None) -> bool:
    """Whether the campaign confirms its winner: `enabled` true or false as said; auto where it applies and
    costs at most `order.ROOM` of the sweep's `sweep_s` seconds."""
    spec = order_of_confirm(plan)
    if spec.enabled is not True and spec.enabled is not False:
        if not confirm_applies(plan.spec) or len(plan.serves) < 2:
            return False
        return confirm_pairs(plan) > 0 and confirm_cost(plan, measured)[2] <= ROOM * sweep_s
    return bool(spec.enabled) and confirm_applies(plan.spec)


def with_confirmation(plan: Plan, est: Estimate, measured: Measured | None) -> Estimate:
    """The estimate with the winner's confirmation after the sweep, where the campaign confirms
    (`raysweep.confirm.runs`: auto decides from the sweep's estimated time)."""
    if plan.spec.campaign.tune is not None or not confirm_wanted(plan, est.wall_s, measured):
        return est
    return Estimate(**{**est.__dict__, "confirm": confirm_cost(plan, measured)})

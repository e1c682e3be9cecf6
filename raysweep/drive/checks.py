"""What a run settles before anything starts, shared by `raysweep run` / `resume` and `raysweep.run`:
whether the campaign in its output dir has nothing left to run (then it is answered from its files, without
importing Ray), and the checks that refuse bad input naming the field: every `serve.url` endpoint answers
with an OpenAI API, the `tracking:` backend is installed and its URI usable, the ledger takes this campaign
(unchanged or forced, no live driver, the same measuring settings or accepted). The campaign file itself,
its data files included, is checked when it is loaded (`raysweep.campaign`)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from raysweep.campaign.loading import CampaignSpec
    from raysweep.ledger.rows import PointRow
    from raysweep.record.directory import CampaignDir

__all__ = ["check_before_run", "finished"]

log = logging.getLogger(__name__)


def finished(spec: CampaignSpec, directory: CampaignDir,
             retry_failed: bool) -> tuple[dict[str, int], list[PointRow]] | None:
    """(counts, failed points) when the campaign in `directory` is this one, unchanged (same name and
    fingerprint), and has nothing left to run: every point of its plan done or failed for good (and not
    retried), no SLA search or tuning that could add points. None otherwise (the run goes on as usual)."""
    from raysweep.ledger import LEDGER_FILE, PointState
    from raysweep.maths.precision import MEASURING
    from raysweep.plan.plan import build_plan

    c = spec.campaign
    if c.tune is not None or c.sla is not None or not (directory.path / LEDGER_FILE).is_file():
        return None  # searches add points as they go
    plan = build_plan(spec)
    ledger = directory.ledger
    if ledger.meta("name") != c.name or ledger.meta("fingerprint") != plan.fingerprint:
        return None
    rows = {p.point_id: p for p in ledger.points(in_plan_only=False)}
    in_plan = ledger.points()  # the plan's points and the runs bench.precision added to them
    undecided = c.bench is not None and c.bench.precision is not None and (  # no bench in mode offline
        {(p.serve.id, p.bench.id) for p in plan.points if p.bench.id not in plan.confirm_ids}
        - {(r["serve_id"], r["bench_id"]) for r in ledger.precision() if r["state"] != MEASURING})
    mine = [rows.get(p.id) for p in plan.points]
    ends = (PointState.DONE,) if retry_failed else (PointState.DONE, PointState.FAILED)
    if not mine or undecided or any(r is None or r.state not in ends for r in [*mine, *in_plan]):
        return None  # a point still measuring for bench.precision may add a run
    ours = {r.point_id: r for r in [*in_plan, *(r for r in mine if r is not None)]}.values()
    failed = [r for r in ours if r.state == PointState.FAILED]
    return {"done": len(ours) - len(failed), "failed": len(failed), "pending": 0, "running": 0}, failed


def check_before_run(spec: CampaignSpec, directory: CampaignDir, *, force: bool = False,
                     accept_changes: bool = False) -> None:
    """Refuse what cannot run before Ray starts, then clear what a dead driver left (its embedded Ray goes at
    once, before ours starts beside it). Nothing is written for a refused campaign.

    :raises CampaignError: `serve.url[i]` does not answer as an OpenAI server, `tracking.backend` is not
        installed or `tracking.uri` is refused.
    :raises UserError: the ledger refuses the campaign (changed commands without `force`, another driver alive,
        changed measuring settings without `accept_changes`).
    """
    from raysweep.drive import hooks, recovery
    from raysweep.drive.driver import open_campaign
    from raysweep.drive.endpoint import check_endpoints, is_endpoint_campaign

    if is_endpoint_campaign(spec):  # serve.url: every endpoint answers with an OpenAI API
        check_endpoints(spec)
    if spec.campaign.tracking is not None:  # its library is here and its URI usable (report.tracking, lent)
        hooks.tracking().check(spec.campaign)
    _, ledger = open_campaign(spec, directory, force=force, accept_changes=accept_changes)
    try:
        recovery.reap_lost_drivers(recovery.dead_drivers(ledger))
    finally:
        ledger.close()

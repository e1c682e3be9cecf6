"""Where a campaign stands, as one document (raysweep/schemas/status.json): what `raysweep status --json` prints,
what `raysweep status` shows, and what `raysweep.load(...).status()` returns. Reading never writes into the
directory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from raysweep import grid
from raysweep.ledger import PointState
from raysweep.record.directory import CampaignDir

__all__ = ["Status", "read_status", "status_document"]


@dataclass
class Status:
    """Where a campaign stands: the document, and the finished runs' records it counted (`load_records`), for a
    view that shows more of them than the document names."""

    document: dict[str, Any]
    records: list[dict[str, Any]]


def status_document(directory: CampaignDir) -> dict[str, Any]:
    """Where the campaign in `directory` stands (raysweep/schemas/status.json)."""
    return read_status(directory).document


def read_status(directory: CampaignDir) -> Status:
    """The status document of the campaign in `directory`, with the records it counted."""
    from raysweep.plan.cost import campaign_spend
    from raysweep.plan.estimate import eta_s, measured_from
    from raysweep.results.records import flagged, load_records
    from raysweep.results.validity_story import validity_counts
    from raysweep.serve import hardware

    ledger = directory.ledger
    counts, points, servers = ledger.counts(), ledger.points(), ledger.servers()
    name, driver = ledger.meta("name"), ledger.last_driver()
    stored = ledger.stored_campaign()
    block = stored.get("cost")
    live = False
    if driver is not None and driver["ended_at"] is None:  # modules imported only where they are needed
        from raysweep.drive.recovery import driver_alive

        live = driver_alive(driver["hostname"], driver["pid"], driver["pid_create_time"])
    precision = None
    if (stored.get("bench") or {}).get("precision"):
        from raysweep.results.precision import precision_counts

        precision = precision_counts(ledger)
    spec = None
    if block:
        from raysweep.campaign import CostSpec

        spec = CostSpec.model_validate(block)
    running = {s.serve_id for s in servers if s.stopped_at is None} if live else set()
    configs = []
    for serve_id in dict.fromkeys(p.serve_id for p in points):
        pts = [p for p in points if p.serve_id == serve_id]
        n = {st: sum(1 for p in pts if p.state == st) for st in PointState}
        left = n[PointState.PENDING] + n[PointState.RUNNING]
        configs.append({"serve_id": serve_id, "params": pts[0].serve_params,
                        "label": grid.combo_label(pts[0].serve_params) or "base command",
                        "done": n[PointState.DONE], "failed": n[PointState.FAILED], "left": left,
                        "total": len(pts),
                        "state": "running" if serve_id in running else "finished" if not left else "waiting"})
    left_runs = [(p.serve_id, p.bench_id) for p in points if p.state in (PointState.PENDING, PointState.RUNNING)]
    eta = eta_s(left_runs, measured_from(directory), running, max(1, len(running))) if left_runs else 0.0
    records = load_records(directory) if counts.get("done") else []
    bad = flagged(records)
    judged = validity_counts(records)
    total = {k: counts.get(k, 0) for k in ("done", "running", "failed", "pending")}
    return Status({
        "campaign": name, "output_dir": directory.given, "counts": {**total, "total": sum(counts.values())},
        "complete": not total["pending"] and not total["running"] and not live,
        "driver": None if not driver else {"pid": driver["pid"], "hostname": driver["hostname"], "alive": live,
                                           "outcome": driver["outcome"]},
        "server_configs": configs, "eta_s": eta,
        "servers_running": [{"server_id": s.server_id, "serve_id": s.serve_id, "port": s.port,
                             "state": s.state} for s in servers if s.stopped_at is None and live],
        "validity": {"runs": len(records), "flagged": len(bad), "passed": judged.passed,
                     "partly_judged": judged.partly_judged, "not_judged": judged.not_judged,
                     "flagged_runs": [{"point_id": r.get("point_id"), "issues": r.get("validity_issues")}
                                      for r in bad],
                     "hardware_mixed": hardware.mixed(records)},
        "failures": [{"point_id": p.point_id, "serve_id": p.serve_id, "bench_id": p.bench_id, "run": p.run,
                      "attempts": p.attempts_made, "error": p.error}
                     for p in points if p.state == PointState.FAILED],
        "spend": campaign_spend(spec, servers),
        "precision": precision,
    }, records)

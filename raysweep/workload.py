"""A running campaign as its parts share it, and what each server configuration still has to do.

`Workload` holds the plan, the ledger, the output and log directories, the event sink and why the campaign
stops (None while it goes on). It answers the scheduler's `Work` questions: how much a configuration has
left (its runnable points, or with SLA searches one probe's runs per open search), its measured pace
(for more servers of it at the campaign's tail), and giving one up.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raysweep import estimate, sla, workload_levels
from raysweep.ledger import Ledger
from raysweep.plan import Plan, ServeConfig

__all__ = ["EventSink", "Workload"]

log = logging.getLogger(__name__)

EventSink = Callable[..., None]


class Workload:
    """The shared state of one campaign run (see the module docstring)."""

    def __init__(self, plan: Plan, ledger: Ledger, output_dir: Path, emit: EventSink, with_gpus: bool) -> None:
        self.plan, self.ledger, self.output_dir, self.emit = plan, ledger, output_dir, emit
        self.c = plan.spec.campaign
        self.with_gpus = with_gpus
        self.log_dir = (output_dir / "logs").resolve()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.stop_reason: str | None = None
        self.targets = sla.parse_targets(self.c.sla.targets) if self.c.sla is not None else []

    @property
    def serves(self) -> list[ServeConfig]:
        return self.plan.serves

    def stopping(self) -> bool:
        """Whether the campaign stops: no configuration starts anything new."""
        return bool(self.stop_reason)

    def work_left(self, serve_id: str) -> int:
        """Points a config still has to run; with SLA searches, a run of one probe per open search (the
        searches run their probes themselves, and a probe no search needs any more is left alone), and the
        `bench.workload` points they start from."""
        if self.c.sla is not None:  # with bench.workload, its points first (the searches start from them)
            return self.c.runs * len(self.open_searches(serve_id)) + len(workload_levels.pending(self, serve_id))
        return len(self.ledger.runnable(serve_id, self.c.max_attempts))

    def pace(self, serve_id: str) -> tuple[float, float] | None:
        """Its median seconds per done point and per server start, as the ledger recorded them; None before
        both are known, and with SLA searches (a search's probes run one after another on one server)."""
        if self.c.sla is not None or self.plan.spec.offline:
            return None
        m = estimate.Measured()
        estimate.add_recorded(m, [s for s in self.ledger.servers() if s.serve_id == serve_id],
                              self.ledger.points(serve_id=serve_id))
        points = [t for (sid, _), ts in m.point_s.items() if sid == serve_id for t in ts]
        starts = m.server_start_s.get(serve_id)
        if not points or not starts:
            return None
        return statistics.median(points), statistics.median(starts)

    def open_searches(self, serve_id: str) -> list[tuple[str, Any]]:
        """The (bench id, target) SLA searches of a config without a recorded outcome."""
        if self.c.sla is None:
            return []
        done = {(r["bench_id"], r["target"]) for r in self.ledger.searches() if r["serve_id"] == serve_id}
        return [(bid, t) for sid, bid in self.plan.searches if sid == serve_id
                for t in self.targets if (bid, sla.search_key(self.c.sla, t)) not in done]

    def close_searches(self, serve_id: str, state: str, note: str) -> None:
        """Record every open SLA search of a config as ended without an answer (`state`, and why)."""
        for bench_id, target in self.open_searches(serve_id):
            self.ledger.record_search(serve_id, bench_id, sla.search_key(self.c.sla, target), state, None, None,
                                      0, [note], {})

    def give_up(self, serve: ServeConfig, reason: str, search_state: str = "server failed") -> None:
        """Fail a configuration's points (and SLA searches) for good."""
        for p in self.ledger.runnable(serve.id, self.c.max_attempts):
            self.ledger.give_up(p.point_id, reason, self.c.max_attempts)
        self.close_searches(serve.id, search_state, reason)
        log.error("server config %s: %s", serve.id, reason)
        self.emit("config_failed", serve=serve, error=reason)

"""A running campaign as its parts share it, and what each server configuration still has to do.

`RunState` holds the plan, the campaign's directory (`raysweep.record.directory.CampaignDir`: its path and the
run's ledger), the log directory, the event sink and why the campaign
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

from raysweep.drive import hooks
from raysweep.ledger import Ledger, PointRow, PointState
from raysweep.maths.order import Turn, block_order, instance_of, open_turns, order_of, turns
from raysweep.plan import estimate
from raysweep.plan.plan import Plan, ServeConfig, first_runs
from raysweep.record.directory import CampaignDir

__all__ = ["EventSink", "RunState"]

log = logging.getLogger(__name__)

EventSink = Callable[..., None]


class RunState:
    """The shared state of one campaign run (see the module docstring)."""

    def __init__(self, plan: Plan, directory: CampaignDir, emit: EventSink, with_gpus: bool) -> None:
        self.plan, self.directory, self.emit = plan, directory, emit
        self.ledger: Ledger = directory.ledger  # the run's own, open while it runs
        self.c = plan.spec.campaign
        self.with_gpus = with_gpus
        self.log_dir = (directory.path / "logs").resolve()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.stop_reason: str | None = None
        self.order = order_of(self.c)
        self.instances = self.order.instances  # server starts per configuration (`order.instances`)
        self.first_runs = first_runs(plan.spec)
        # several servers at once (a cluster with GPUs, no cap of one): a block's configurations run together
        self.together = with_gpus and self.c.placement.max_servers != 1

    @property
    def output_dir(self) -> Path:
        """Where the run writes its result files (the directory's path)."""
        return self.directory.path

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
        if self.c.sla is not None:  # raysweep.sla.book
            return hooks.sla_book().work_left(self, serve_id)
        return len(self.runnable(serve_id))

    # -- the order of server starts (raysweep.maths.order) ------------------------------------------------------

    def instance_of(self, run: int) -> int:
        """The server start (instance) of a configuration a run number goes to (`order.instances`)."""
        return instance_of(run, self.instances, self.first_runs)

    def mine(self, row: PointRow) -> bool:
        """Whether a ledger row is one of this work's runs: the sweep's (the winner's confirmation runs after
        it, `raysweep.confirm`)."""
        return row.bench_id not in self.plan.confirm_ids

    def design(self) -> list[Turn]:
        """Every server start of the design (one per configuration without `order.instances`)."""
        return turns([s.id for s in self.serves], self.instances)

    def turn_of(self, serve_id: str, instance: int) -> Turn | None:
        """Where a configuration's instance sits in the design (its block and place in it)."""
        if self.instances <= 1:
            return None
        block = block_order([s.id for s in self.serves], instance)
        return Turn(serve_id, instance, instance, block.index(serve_id)) if serve_id in block else None

    def order_fields(self, serve_id: str, bench_id: str, run: int, slot: int) -> dict[str, Any]:
        """Where a run sat in the design, for its record: `round` (its run number: every point once per
        round), `instance` and `block` (the server start of its configuration, AB BA across configurations),
        `turn` (its configuration's place in the block) and `slot` (its place in its server's life)."""
        instance = self.instance_of(run)
        turn = self.turn_of(serve_id, instance)
        return {"round": run, "instance": instance, "block": turn.block if turn else 0,
                "turn": turn.turn if turn else None, "slot": slot, "order_seed": self.order.seed,
                "order_rounds": self.order.rounds}

    def instance_now(self, serve_id: str) -> int | None:
        """The instance a configuration is to measure now; None when it is not its turn (`order.instances`:
        blocks ordered AB BA, one start after another unless the cluster runs several at once)."""
        if self.instances <= 1:
            return 0
        rows: dict[str, list[PointRow]] = {}
        for r in self.ledger.points():
            if self.mine(r):
                rows.setdefault(r.serve_id, []).append(r)

        def unfinished(sid: str, instance: int) -> bool:
            return any(self.instance_of(r.run) == instance and _unfinished(r, self.c.max_attempts)
                       for r in rows.get(sid, []))
        now = [t.instance for t in open_turns(self.design(), unfinished, self.together) if t.serve_id == serve_id]
        return now[0] if now else None

    def runnable(self, serve_id: str) -> list[PointRow]:
        """A configuration's runs still to run now: with `order.instances`, those of the instance whose turn it
        is (none when it is not its turn)."""
        rows = [r for r in self.ledger.runnable(serve_id, self.c.max_attempts) if self.mine(r)]
        if self.instances <= 1 or self.c.sla is not None:
            return rows
        now = self.instance_now(serve_id)
        return [] if now is None else [r for r in rows if self.instance_of(r.run) == now]

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
        """The (bench id, target) SLA searches of a config without a recorded outcome (`raysweep.sla.book`)."""
        return hooks.sla_book().open_searches(self, serve_id) if self.c.sla is not None else []

    def close_searches(self, serve_id: str, state: str, note: str) -> None:
        """Record every open SLA search of a config as ended without an answer (`state`, and why)."""
        if self.c.sla is not None:
            hooks.sla_book().close_searches(self, serve_id, state, note)

    def give_up(self, serve: ServeConfig, reason: str, search_state: str = "server failed") -> None:
        """Fail a configuration's points (and SLA searches) for good."""
        for p in self.ledger.runnable(serve.id, self.c.max_attempts):
            self.ledger.give_up(p.point_id, reason, self.c.max_attempts)
        self.close_searches(serve.id, search_state, reason)
        log.error("server config %s: %s", serve.id, reason)
        self.emit("config_failed", serve=serve, error=reason)


def _unfinished(row: PointRow, max_attempts: int) -> bool:
    """A run still to end: pending, running, or failed with attempts left."""
    return row.state in (PointState.PENDING, PointState.RUNNING) or (
        row.state == PointState.FAILED and row.attempts < max_attempts)

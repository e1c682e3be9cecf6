"""SLA search's bookkeeping in a running campaign: the searches of a configuration still open (each of its
(bench id, target) pairs, `plan.searches` x `sla.targets`, without an outcome in the ledger), the work they leave
the scheduler, and every open one recorded as ended without an answer when the configuration is given up. The
run's state (`raysweep.drive.state.RunState.open_searches`, `.close_searches`, `.work_left`) asks for it through
`raysweep.drive.hooks` (`sla_book`), where `raysweep.sla` lends it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from raysweep.campaign import slo
from raysweep.drive import hooks

if TYPE_CHECKING:
    from raysweep.drive.state import RunState

__all__ = ["close_searches", "open_searches", "work_left"]


def open_searches(work: RunState, serve_id: str) -> list[tuple[str, slo.Target]]:
    """The (bench id, target) SLA searches of a config without a recorded outcome."""
    cfg = work.c.sla
    if cfg is None:
        return []
    targets = slo.parse_targets(cfg.targets)
    done = {(r["bench_id"], r["target"]) for r in work.ledger.searches() if r["serve_id"] == serve_id}
    return [(bid, t) for sid, bid in work.plan.searches if sid == serve_id
            for t in targets if (bid, slo.search_key(cfg, t)) not in done]


def close_searches(work: RunState, serve_id: str, state: str, note: str) -> None:
    """Record every open SLA search of a config as ended without an answer (`state`, and why)."""
    for bench_id, target in work.open_searches(serve_id):
        work.ledger.record_search(serve_id, bench_id, slo.search_key(work.c.sla, target), state, None, None,
                                  0, [note], {})


def work_left(work: RunState, serve_id: str) -> int:
    """Points a config with SLA searches still has to run: a run of one probe per open search (the searches run
    their probes themselves, and a probe no search needs any more is left alone), and the `bench.workload`
    points they start from (those run first)."""
    return work.c.runs * len(work.open_searches(serve_id)) + len(hooks.levels().pending(work, serve_id))

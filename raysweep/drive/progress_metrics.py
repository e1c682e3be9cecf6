"""Campaign progress in Ray's own metrics system (`ray.util.metrics`), so that the Prometheus and Grafana of
a Ray cluster show it beside Ray's metrics.

Gauges, each with the tag `campaign` (its name): `raysweep_points_total`, `raysweep_points_done`,
`raysweep_points_failed`, `raysweep_points_pending`, `raysweep_servers_running` and `raysweep_eta_seconds`
(the wall time left at this run's pace: seconds per point finished since the driver started, times the
points left; NaN until a point has finished). Ray exports them as `ray_raysweep_...` on every node's
metrics port, as it does for any application metric. They are recorded by a small actor (no CPU reserved)
that the driver tells after each event; a failure to record never touches the campaign.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from raysweep.drive.state import EventSink

if TYPE_CHECKING:
    from ray.actor import ActorHandle

__all__ = ["GAUGES", "Progress", "eta_s"]

log = logging.getLogger(__name__)

GAUGES = {
    "raysweep_points_total": "runs of bench points in the campaign's plan",
    "raysweep_points_done": "runs done (in the ledger)",
    "raysweep_points_failed": "runs failed for now or for good",
    "raysweep_points_pending": "runs not run yet",
    "raysweep_servers_running": "servers (or endpoints) the campaign is running points on now",
    "raysweep_eta_seconds": "wall time left at this run's pace (NaN until a point finished)",
}


def eta_s(elapsed_s: float, finished_here: int, left: int) -> float:
    """Seconds left: the seconds per point finished since the driver started, times the points left."""
    if left <= 0:
        return 0.0
    if finished_here <= 0 or elapsed_s <= 0:
        return math.nan
    return elapsed_s / finished_here * left


def _recorder() -> Any:
    import ray
    from ray.util.metrics import Gauge

    @ray.remote(num_cpus=0, max_restarts=0)
    class ProgressRecorder:
        def __init__(self) -> None:
            self.gauges = {name: Gauge(name, description=text, tag_keys=("campaign",)) for name, text in GAUGES.items()}
            self.last: dict[str, float] = {}

        def set(self, campaign: str, values: dict[str, float]) -> None:
            for name, value in values.items():
                self.gauges[name].set(value, tags={"campaign": campaign})
            self.last.update(values)

        def values(self) -> dict[str, float]:
            return dict(self.last)

    return ProgressRecorder


class Progress:
    """Follows a campaign's events and keeps its gauges up to date (see the module docstring)."""

    def __init__(self, campaign: str, counts: Callable[[], dict[str, int]] | None = None) -> None:
        self.campaign = campaign
        self.read_counts = counts  # the ledger's counts by state (`Ledger.counts`), read after every point
        self.counts: dict[str, int] = {}
        self.total = 0
        self.servers: set[str] = set()
        self.t0 = time.monotonic()
        self.finished_here = 0
        self.actor: ActorHandle | None = None
        try:
            import ray

            if ray.is_initialized():  # never a Ray of its own
                self.actor = _recorder().remote()
        except Exception as exc:
            log.info("progress metrics not recorded: %s", exc)

    def values(self) -> dict[str, float]:
        done, failed, pending = (self.counts.get(k, 0) for k in ("done", "failed", "pending"))
        left = max(0, self.total - done - failed) if self.total else pending
        return {"raysweep_points_total": float(self.total), "raysweep_points_done": float(done),
                "raysweep_points_failed": float(failed), "raysweep_points_pending": float(pending),
                "raysweep_servers_running": float(len(self.servers)),
                "raysweep_eta_seconds": eta_s(time.monotonic() - self.t0, self.finished_here, left)}

    def on_event(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "campaign_start":
            self.total, self.counts = int(data.get("total") or 0), dict(data.get("counts") or {})
        elif kind == "campaign_end":
            self.counts = dict(data.get("counts") or self.counts)
        elif kind == "point_done":
            self._move("done")
        elif kind == "point_failed":
            self._move("failed")
        elif kind == "server_ready":
            self.servers.add(str(data.get("server_id")))
        elif kind in ("server_stopped", "server_failed"):
            self.servers.discard(str(data.get("server_id")))
        else:
            return
        self.publish()

    def _move(self, to: str) -> None:
        self.finished_here += 1
        if self.read_counts is not None:
            try:
                self.counts = dict(self.read_counts())
                return
            except Exception as exc:
                log.info("progress metrics: ledger counts not read (%s)", exc)
        self.counts[to] = self.counts.get(to, 0) + 1
        if self.counts.get("pending", 0) > 0:
            self.counts["pending"] -= 1

    def publish(self) -> None:
        if self.actor is None:
            return
        try:
            self.actor.set.remote(self.campaign, self.values())
        except Exception as exc:
            log.info("progress metrics not recorded: %s", exc)

    def sink(self, emit: EventSink) -> EventSink:
        """The event sink that also updates the gauges."""
        def sink(kind: str, **data: Any) -> None:
            emit(kind, **data)
            self.on_event(kind, data)
        return sink

    def close(self) -> None:
        """Publish the last values and let the recorder go (Prometheus keeps what it scraped)."""
        self.publish()
        if self.actor is not None:
            import ray

            try:
                ray.get(self.actor.values.remote(), timeout=10)  # the last values were recorded
            except Exception as exc:
                log.info("progress metrics: %s", exc)
            finally:
                ray.kill(self.actor)

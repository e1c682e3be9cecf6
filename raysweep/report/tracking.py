"""Live export (`tracking:`): every point logged to MLflow or Weights & Biases as it lands, the report at the end.

`check(spec)` runs before anything starts: the tracker's library is there and (MLflow) its URI can be used,
else a user error naming `tracking.uri` or `tracking.backend` (exit 2). While the campaign runs, `LiveTracker`
takes each finished point from the event stream and logs it, in a thread of its own, through
`raysweep.report.export` (the same runs a later `raysweep export` updates: the export is idempotent, so a resumed
campaign goes on logging into the runs it started). When the campaign ends, every point is logged once more
with the campaign run and its artifacts (the report, made when the output dir has none, `summary.csv`,
`results.csv`). A tracker that fails is logged as a warning and never stops the campaign.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import TYPE_CHECKING, Any

from raysweep.drive.state import EventSink
from raysweep.errors import CampaignError, UserError

if TYPE_CHECKING:
    from raysweep.campaign.models import Campaign, TrackingSpec
    from raysweep.record.directory import CampaignDir

__all__ = ["LiveTracker", "check"]

log = logging.getLogger(__name__)

_LOGGED_AFTER = ("point_done", "sla_done")


def _experiment(spec: TrackingSpec, name: str) -> str:
    return spec.experiment or name


def check(campaign: Campaign) -> None:
    """The campaign's tracker can be used (see the module docstring).

    :raises CampaignError: naming `tracking.backend` (library missing) or `tracking.uri` (MLflow refuses it).
    """
    t = campaign.tracking
    if t is None:
        return
    from raysweep.report import (
        export,  # here: it loads scipy and pandas, which a campaign without a tracker never needs
    )

    try:
        export.tracker_library(t.backend)
    except UserError as exc:
        raise CampaignError("tracking.backend", str(exc).split(": ", 1)[-1]) from None
    if t.backend == "mlflow":
        assert t.uri is not None  # the campaign's model refuses mlflow without a uri
        try:
            export.mlflow_client(t.uri, _experiment(t, campaign.name), option="tracking.uri")
        except UserError as exc:
            raise CampaignError("tracking.uri", str(exc).removeprefix(f"tracking.uri {t.uri}: ")) from None


class LiveTracker:
    """Logs a running campaign's points as they land, and everything at the end (see the module docstring)."""

    def __init__(self, campaign: Campaign, directory: CampaignDir) -> None:
        assert campaign.tracking is not None  # made only for a campaign with `tracking:`
        self.spec: TrackingSpec = campaign.tracking
        self.name = campaign.name
        self.directory = directory
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="tracking", daemon=True)
        self._thread.start()
        self.logged = 0
        self.errors: list[str] = []

    def sink(self, emit: EventSink) -> EventSink:
        """The event sink that also queues every finished point for logging."""
        def sink(kind: str, **data: Any) -> None:
            emit(kind, **data)
            if kind in _LOGGED_AFTER:
                point = data.get("point")
                serve_id = point.serve.id if point is not None else getattr(data.get("serve"), "id", None)
                bench_id = point.bench.id if point is not None else data.get("bench_id")
                if serve_id and bench_id:
                    self._queue.put(f"{serve_id}/{bench_id}")
        return sink

    def _work(self) -> None:
        while True:
            key = self._queue.get()
            if key is None:
                return
            keys = {key}
            while True:  # what else landed meanwhile goes in the same export
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._queue.put(None)
                    break
                keys.add(more)
            self._log(keys, final=False)

    def _log(self, keys: set[str] | None, final: bool) -> None:
        from raysweep.report import export

        try:
            campaign = export.export_points(self.directory, report=final, only=keys, artifacts=final)
            if self.spec.backend == "mlflow":
                assert self.spec.uri is not None  # the campaign's model refuses mlflow without a uri
                export.export_mlflow(campaign, self.spec.uri, _experiment(self.spec, self.name), with_artifacts=final)
            else:
                export.export_wandb(campaign, self.spec.project or self.name, self.spec.entity, mode=self.spec.mode,
                                    directory=self.directory.path, with_artifacts=final)
            self.logged += len(campaign.points)
        except Exception as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")
            log.warning("tracking (%s): %s could not be logged: %s", self.spec.backend,
                        "the campaign" if final else f"{len(keys or ())} point(s)", exc)

    def close(self) -> None:
        """Log what is queued, then every point, the campaign run and its artifacts."""
        self._queue.put(None)
        self._thread.join()
        self._log(None, final=True)

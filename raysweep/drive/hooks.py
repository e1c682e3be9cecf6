"""What the rooms above the run lend it: the optional modes' parts, live tracking, the winner to confirm.

The run stage (`drive`) sits below the modes (`tune`, `sla`, `levels`, `offline`), the results and the report,
and imports none of them. The parts of them a run calls are registered here by name, each as a loader that
imports the part when a run first asks for it (registering costs nothing: the CLI starts without Ray or Optuna):

- `levels` (`raysweep.levels` lends `levels.search`): `bench.workload`'s `restore_plan`, `settle_all`, `settle`
  after each point, `pending` and `search_probes`;
- `sla` (`raysweep.sla` lends `sla.probe.SlaSearches`): a configuration's SLA searches, `.run(run, server)`;
- `offline` (`raysweep.offline` lends `offline.points.OfflinePoints`): a configuration's offline points, `.run(run)`;
- `tune` (`raysweep.tune`): `tune:`'s `restore_plan`, `TuneWork` and `TunedCluster`;
- `tracking` (`raysweep.modes` lends `report.tracking`): `tracking:`'s `check(campaign)` before the run and its
  `LiveTracker(campaign, directory)` during it;
- `winners` (`raysweep.modes` lends `results.data.winner_pairs`): `confirm:`'s leaders and runners-up, as the
  conclusions name them.

A mode's package registers its parts when it is imported; `raysweep.modes`, which both faces (`cli`, `api`)
import, imports every mode and registers the rest. A run that asks for a part nobody registered stops with a
`LookupError` naming it: nothing is skipped quietly.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from raysweep.registry import Registry

if TYPE_CHECKING:
    from raysweep.campaign import Campaign
    from raysweep.ledger import Ledger, PointRow
    from raysweep.place.scheduler import Cluster
    from raysweep.plan.plan import BenchPoint, Plan, PointRun, ServeConfig
    from raysweep.record.directory import CampaignDir
    from raysweep.serve.live_server import ConfigRun, Server, Servers

__all__ = ["LOADERS", "Levels", "Points", "Tracker", "Tracking", "Tune", "Work", "levels", "offline_points", "register",
           "sla_searches", "tracking", "tune", "winners"]

LOADERS: Registry[Callable[[], Any]] = Registry(
    "part of the run", "the run asks raysweep.drive.hooks for it; import raysweep.modes first, as the CLI and the "
    "Python API do")
_LOADED: dict[str, Any] = {}


def register(name: str, load: Callable[[], Any]) -> None:
    """Lend the run the part `name` (see the module docstring): `load()` returns it, importing what it needs."""
    LOADERS.register(name, load)
    _LOADED.pop(name, None)


def _part(name: str) -> Any:
    if name not in _LOADED:
        _LOADED[name] = LOADERS.get(name)()
    return _LOADED[name]


class Work(Protocol):
    """What the parts read of a run's shared state (`raysweep.drive.state.RunState` is one; named here, not
    imported, so that the state, which asks this module for the parts, is not imported back)."""

    @property
    def plan(self) -> Plan: ...
    @property
    def ledger(self) -> Ledger: ...
    @property
    def c(self) -> Campaign: ...
    @property
    def emit(self) -> Callable[..., None]: ...


W = TypeVar("W", bound=Work)


class Points(Protocol):
    """What the parts call of the run's points (`raysweep.drive.point.PointRunner` is it; named here, as `Work`)."""

    def reset(self, run: ConfigRun, server: Server) -> str: ...
    def run(self, run: ConfigRun, server: Server, point: PointRun, reset: str, attempt: int | None = None) -> bool: ...
    def abandon(self, point: PointRun, why: str, attempt: int) -> None: ...
    def finish(self, run: ConfigRun, server: Server, point: PointRun, result: dict[str, Any], attempt: int,
               started: float, reset: str, out: dict[str, Any]) -> None: ...


class Levels(Protocol):
    """`bench.workload`'s load levels, decided while the campaign runs (`raysweep.levels.search`)."""

    def restore_plan(self, plan: Plan, ledger: Ledger) -> int: ...
    def settle_all(self, work: Work) -> int: ...
    def settle(self, work: Work, serve: ServeConfig, bench: BenchPoint) -> list[PointRun]: ...
    def pending(self, work: Work, serve_id: str) -> list[PointRow]: ...
    def search_probes(self, work: Work, serve_id: str, base_id: str) -> dict[float, list[str]]: ...


class ServerPart(Protocol):
    """A configuration's SLA searches against its live server."""

    def run(self, run: ConfigRun, server: Server) -> None: ...


class OfflinePart(Protocol):
    """A configuration's offline points, run inside its placement group without a server."""

    def run(self, run: ConfigRun) -> str: ...


class Tune(Protocol[W]):
    """Tuning: the candidates as the scheduler's work, and its cluster seen through them (`raysweep.tune`); the
    driver names the work it makes (`Tune[RunState]`)."""

    def restore_plan(self, plan: Plan, ledger: Ledger) -> None: ...
    def TuneWork(self, plan: Plan, ledger: Ledger, output_dir: Path, emit: Callable[..., None],
                 with_gpus: bool) -> W: ...
    def TunedCluster(self, inner: Cluster, work: W) -> Cluster: ...


class Tracker(Protocol):
    """A live tracker: it wraps the run's event sink, and is closed at the end."""

    def sink(self, emit: Callable[..., None]) -> Callable[..., None]: ...
    def close(self) -> None: ...


class Tracking(Protocol):
    """Live export of the points as they land (`tracking:`)."""

    def check(self, campaign: Campaign) -> None: ...
    def LiveTracker(self, campaign: Campaign, directory: CampaignDir) -> Tracker: ...


def levels() -> Levels:
    return _part("levels")


def sla_searches() -> Callable[[Work, Points], ServerPart]:
    return _part("sla")


def offline_points() -> Callable[[Work, Servers, Points], OfflinePart]:
    return _part("offline")


def tune() -> Tune[Any]:
    return _part("tune")


def tracking() -> Tracking:
    return _part("tracking")


def winners() -> Callable[[Path, str | None], list[list[str]]]:
    return _part("winners")

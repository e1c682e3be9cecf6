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
from typing import TYPE_CHECKING, Any, Protocol

from raysweep.registry import Registry

if TYPE_CHECKING:
    from raysweep.drive.point import PointRunner
    from raysweep.drive.state import EventSink, RunState
    from raysweep.ledger import Ledger, PointRow
    from raysweep.plan.plan import BenchPoint, Plan, PointRun, ServeConfig
    from raysweep.record.directory import CampaignDir
    from raysweep.serve.live_server import ConfigRun, Server, Servers

__all__ = ["LOADERS", "Levels", "Tracking", "Tune", "levels", "offline_points", "register", "sla_searches", "tracking",
           "tune", "winners"]

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


class Levels(Protocol):
    """`bench.workload`'s load levels, decided while the campaign runs (`raysweep.levels.search`)."""

    def restore_plan(self, plan: Plan, ledger: Ledger) -> int: ...
    def settle_all(self, work: RunState) -> int: ...
    def settle(self, work: RunState, serve: ServeConfig, bench: BenchPoint) -> list[PointRun]: ...
    def pending(self, work: RunState, serve_id: str) -> list[PointRow]: ...
    def search_probes(self, work: RunState, serve_id: str, base_id: str) -> dict[float, list[str]]: ...


class ServerPart(Protocol):
    """A configuration's SLA searches against its live server."""

    def run(self, run: ConfigRun, server: Server) -> None: ...


class OfflinePart(Protocol):
    """A configuration's offline points, run inside its placement group without a server."""

    def run(self, run: ConfigRun) -> str: ...


class Tune(Protocol):
    """Tuning: the candidates as the scheduler's work, and its cluster seen through them (`raysweep.tune`)."""

    def restore_plan(self, plan: Plan, ledger: Ledger) -> None: ...
    def TuneWork(self, plan: Plan, ledger: Ledger, output_dir: Path, emit: EventSink,
                 with_gpus: bool) -> RunState: ...
    def TunedCluster(self, inner: Any, work: Any) -> Any: ...


class Tracking(Protocol):
    """Live export of the points as they land (`tracking:`)."""

    def check(self, campaign: Any) -> None: ...
    def LiveTracker(self, campaign: Any, directory: CampaignDir) -> Any: ...


def levels() -> Levels:
    return _part("levels")


def sla_searches() -> Callable[[RunState, PointRunner], ServerPart]:
    return _part("sla")


def offline_points() -> Callable[[RunState, Servers, PointRunner], OfflinePart]:
    return _part("offline")


def tune() -> Tune:
    return _part("tune")


def tracking() -> Tracking:
    return _part("tracking")


def winners() -> Callable[[Path, str | None], list[list[str]]]:
    return _part("winners")

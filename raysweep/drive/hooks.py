"""What the rooms above the run lend it: the optional modes' parts, live tracking, the winner to confirm.

The run stage (`drive`) sits below the modes (`tune`, `sla`, `levels`, `offline`, `confirm`), the results and
the report, and imports none of them. The parts of them a run calls are registered here by name, each as a loader
that imports the part when a run first asks for it (registering costs nothing: the CLI starts without Ray or
Optuna):

- `levels` (`raysweep.levels` lends `levels.search`): `bench.workload`'s `restore_plan`, `settle_all`, `settle`
  after each point, `pending` and `search_probes`;
- `sla` (`raysweep.sla` lends `sla.probe.SlaSearches`): a configuration's SLA searches, `.run(run, server)`;
- `sla_book` (`raysweep.sla` lends `sla.book`): the searches of a configuration still open, and closing them
  when it is given up (`RunState.open_searches`, `.close_searches`);
- `sla_capacities` (`raysweep.sla` lends `sla.capacities.capacities`): the configs ranked by their SLA capacity,
  for the conclusions (`results`, above the run and below the modes, asks for it here), and
  `sla_capacities_html` (`sla.report.capacities_html`) for the report's cards;
- `offline` (`raysweep.offline` lends `offline.points.OfflinePoints`): a configuration's offline points, `.run(run)`;
- `tune` (`raysweep.tune`): `tune:`'s `restore_plan`, `TuneWork` and `TunedCluster`;
- `tracking` (`raysweep.modes` lends `report.tracking`): `tracking:`'s `check(campaign)` before the run and its
  `LiveTracker(campaign, output_dir)` during it;
- `confirmation` (`raysweep.confirm` lends `confirm.runs`): `confirm:`'s `restore_plan` (the runs an earlier
  driver chose) and `run_after` (the leaders and runners-up measured again after the sweep);
- `confirmed` (`raysweep.confirm` lends `confirm.conclusions.confirmed`): a shape's verdict from the confirmation's
  fresh runs, for the conclusions (`results`, above the run and below the modes, asks for it here too).

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
    import pandas as pd

    from raysweep.drive.point import PointRunner
    from raysweep.drive.state import EventSink, RunState
    from raysweep.ledger import Ledger, PointRow
    from raysweep.plan.plan import BenchPoint, Plan, PointRun, ServeConfig
    from raysweep.results.conclusions import Conclusions, Objective, ShapeVerdict
    from raysweep.serve.live_server import ConfigRun, Server, Servers

__all__ = ["LOADERS", "Confirmation", "Levels", "Tracking", "Tune", "confirmation", "confirmed", "levels",
           "offline_points", "register", "sla_book", "sla_capacities", "sla_capacities_html", "sla_searches",
           "tracking", "tune"]

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


class SlaBook(Protocol):
    """SLA search's bookkeeping in a running campaign (`raysweep.sla.book`)."""

    def open_searches(self, work: RunState, serve_id: str) -> list[tuple[str, Any]]: ...
    def close_searches(self, work: RunState, serve_id: str, state: str, note: str) -> None: ...


class OfflinePart(Protocol):
    """A configuration's offline points, run inside its placement group without a server."""

    def run(self, run: ConfigRun) -> str: ...


class Tune(Protocol):
    """Tuning: the candidates as the scheduler's work, and its cluster seen through them (`raysweep.tune`)."""

    def restore_plan(self, plan: Plan, ledger: Ledger) -> None: ...
    def TuneWork(self, plan: Plan, ledger: Ledger, output_dir: Path, emit: EventSink,
                 with_gpus: bool) -> RunState: ...
    def TunedCluster(self, inner: Any, work: Any) -> Any: ...


class Confirmation(Protocol):
    """The winner's confirmation after the sweep (`raysweep.confirm.runs`)."""

    def restore_plan(self, plan: Plan, ledger: Ledger) -> int: ...
    def run_after(self, plan: Plan, ledger: Ledger, output_dir: Path, emit: EventSink, with_gpus: bool,
                  run_work: Callable[[RunState], str | None]) -> str | None: ...


class Tracking(Protocol):
    """Live export of the points as they land (`tracking:`)."""

    def check(self, campaign: Any) -> None: ...
    def LiveTracker(self, campaign: Any, output_dir: Path) -> Any: ...


def levels() -> Levels:
    return _part("levels")


def sla_searches() -> Callable[[RunState, PointRunner], ServerPart]:
    return _part("sla")


def sla_book() -> SlaBook:
    return _part("sla_book")


def sla_capacities() -> Callable[[pd.DataFrame, pd.DataFrame | None], pd.DataFrame]:
    return _part("sla_capacities")


def sla_capacities_html() -> Callable[[Conclusions], str]:
    return _part("sla_capacities_html")


def offline_points() -> Callable[[RunState, Servers, PointRunner], OfflinePart]:
    return _part("offline")


def tune() -> Tune:
    return _part("tune")


def tracking() -> Tracking:
    return _part("tracking")


def confirmation() -> Confirmation:
    return _part("confirmation")


def confirmed() -> Callable[[ShapeVerdict, pd.DataFrame, Objective, float], None]:
    return _part("confirmed")

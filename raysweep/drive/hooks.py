"""What the rooms above the run lend it: the optional modes' parts, live tracking, the winner to confirm.

The run stage (`drive`) sits below the modes (`tune`, `sla`, `levels`, `offline`, `confirm`), the results and
the report, and imports none of them. The parts of them a run calls are registered here by name, each as a loader
that imports the part when a run first asks for it (registering costs nothing: the CLI starts without Ray or
Optuna):

- `levels` (`raysweep.levels` lends `levels.search`): `bench.workload`'s `restore_plan`, `settle_all`, `settle`
  after each point, `pending` and `search_probes`;
- `sla` (`raysweep.sla` lends `sla.probe.SlaSearches`): a configuration's SLA searches, `.run(run, server)`;
- `sla_book` (`raysweep.sla` lends `sla.book`): the searches of a configuration still open, the work they leave
  and closing them when it is given up (`RunState.open_searches`, `.work_left`, `.close_searches`);
- `sla_capacities` (`raysweep.sla` lends `sla.capacities.capacities`): the configs ranked by their SLA capacity,
  for the conclusions (`results`, above the run and below the modes, asks for it here), and
  `sla_capacities_html` (`sla.report.capacities_html`) for the report's cards;
- `offline` (`raysweep.offline` lends `offline.points.OfflinePoints`): a configuration's offline points, `.run(run)`;
- `tune` (`raysweep.tune`): `tune:`'s `restore_plan`, `TuneWork` and `TunedCluster`;
- `tracking` (`raysweep.modes` lends `report.tracking`): `tracking:`'s `check(campaign)` before the run and its
  `LiveTracker(campaign, directory)` during it;
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
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from raysweep.registry import Lenders

if TYPE_CHECKING:
    import pandas as pd

    from raysweep.campaign import Campaign
    from raysweep.campaign.slo import Target
    from raysweep.ledger import Ledger, PointRow
    from raysweep.place.scheduler import Cluster
    from raysweep.plan.plan import BenchPoint, Plan, PointRun, ServeConfig
    from raysweep.record.directory import CampaignDir
    from raysweep.results.conclusions import Conclusions, Objective, ShapeVerdict
    from raysweep.serve.live_server import ConfigRun, Server, Servers

__all__ = ["LOADERS", "Confirmation", "Levels", "Points", "SlaBook", "Tracker", "Tracking", "Tune", "Work",
           "confirmation", "confirmed", "levels", "offline_points", "register", "sla_book", "sla_capacities",
           "sla_capacities_html", "sla_searches", "tracking", "tune"]

LOADERS = Lenders(
    "part of the run", "the run asks raysweep.drive.hooks for it; import raysweep.modes first, as the CLI and the "
    "Python API do")


def register(name: str, load: Callable[[], Any]) -> None:
    """Lend the run the part `name` (see the module docstring): `load()` returns it, importing what it needs."""
    LOADERS.register(name, load)


def _part(name: str) -> Any:  # each accessor below names the type of its part
    return LOADERS.part(name)


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
W_co = TypeVar("W_co", bound=Work, covariant=True)


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


class SlaBook(Protocol):
    """SLA search's bookkeeping in a running campaign (`raysweep.sla.book`)."""

    def open_searches(self, work: Work, serve_id: str) -> list[tuple[str, Target]]: ...
    def close_searches(self, work: Work, serve_id: str, state: str, note: str) -> None: ...
    def work_left(self, work: Work, serve_id: str) -> int: ...


class OfflinePart(Protocol):
    """A configuration's offline points, run inside its placement group without a server."""

    def run(self, run: ConfigRun) -> str: ...


class Tune(Protocol[W]):
    """Tuning: the candidates as the scheduler's work, and its cluster seen through them (`raysweep.tune`); the
    driver names the work it makes (`Tune[RunState]`)."""

    def restore_plan(self, plan: Plan, ledger: Ledger) -> None: ...
    def TuneWork(self, plan: Plan, directory: CampaignDir, emit: Callable[..., None], with_gpus: bool) -> W: ...
    def TunedCluster(self, inner: Cluster, work: W) -> Cluster: ...


class Tracker(Protocol):
    """A live tracker: it wraps the run's event sink, and is closed at the end."""

    def sink(self, emit: Callable[..., None]) -> Callable[..., None]: ...
    def close(self) -> None: ...


class Confirmation(Protocol[W_co]):
    """The winner's confirmation after the sweep (`raysweep.confirm.runs`); `run_work` runs the work it makes
    (a `raysweep.drive.state.RunState`) on the cluster."""

    def restore_plan(self, plan: Plan, ledger: Ledger) -> int: ...
    def run_after(self, plan: Plan, directory: CampaignDir, emit: Callable[..., None], with_gpus: bool,
                  run_work: Callable[[W_co], str | None]) -> str | None: ...


class Tracking(Protocol):
    """Live export of the points as they land (`tracking:`)."""

    def check(self, campaign: Campaign) -> None: ...
    def LiveTracker(self, campaign: Campaign, directory: CampaignDir) -> Tracker: ...


def levels() -> Levels:
    return _part("levels")


def sla_searches() -> Callable[[Work, Points], ServerPart]:
    return _part("sla")


def sla_book() -> SlaBook:
    return _part("sla_book")


def sla_capacities() -> Callable[[pd.DataFrame, pd.DataFrame | None], pd.DataFrame]:
    return _part("sla_capacities")


def sla_capacities_html() -> Callable[[Conclusions], str]:
    return _part("sla_capacities_html")


def offline_points() -> Callable[[Work, Servers, Points], OfflinePart]:
    return _part("offline")


def tune() -> Tune[Any]:
    return _part("tune")


def tracking() -> Tracking:
    return _part("tracking")


def confirmation() -> Confirmation[Any]:
    return _part("confirmation")


def confirmed() -> Callable[[ShapeVerdict, pd.DataFrame, Objective, float], None]:
    return _part("confirmed")

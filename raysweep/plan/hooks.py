"""What the modes lend the plan stage: SLA search's probes, and the parts of a campaign that run after its sweep.

The plan stage sits below the modes and imports none of them. What the plan and the estimate call of them they ask
for here by name, each part registered as a loader that imports it when it is first asked for (registering costs
nothing):

- `sla` (`raysweep.sla` lends `sla.plan`): the runs of an SLA search's unbounded-load probe (`probe_runs`), which
  the plan holds from the start, and what the dry run says of the search (`dry_run_lines`);

- `confirmation` (`raysweep.confirm` lends `confirm.estimate.with_confirmation`): the estimate with the
  confirmation's server starts, runs and seconds where the campaign confirms its winner.

`raysweep.modes`, which both faces (`cli`, `api`) import, imports every mode. A plan or an estimate that asks for a
part nobody registered stops with a `LookupError` naming it: nothing is left out quietly. The run's own hooks are
`raysweep.drive.hooks`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from raysweep.registry import Lenders

if TYPE_CHECKING:
    from raysweep.campaign import Campaign, CampaignSpec
    from raysweep.plan.estimate import Estimate, Measured
    from raysweep.plan.plan import BenchPoint, Plan, PointRun, ServeConfig

__all__ = ["LOADERS", "SlaPlan", "confirmation", "register", "sla"]

LOADERS = Lenders(
    "part of the estimate", "the estimate asks raysweep.plan.hooks for it; import raysweep.modes first, as the CLI "
    "and the Python API do")


def register(name: str, load: Callable[[], Any]) -> None:
    """Lend the estimate the part `name` (see the module docstring): `load()` returns it."""
    LOADERS.register(name, load)


def _part(name: str) -> Any:  # each accessor below names the type of its part
    return LOADERS.part(name)


class SlaPlan(Protocol):
    """SLA search's part of the plan (`raysweep.sla.plan`)."""

    def probe_runs(self, spec: CampaignSpec, serve: ServeConfig, base: BenchPoint, value: float,
                   first_run: int = 0) -> list[PointRun]: ...
    def dry_run_lines(self, c: Campaign) -> list[str]: ...


def sla() -> SlaPlan:
    return _part("sla")


def confirmation() -> Callable[[Plan, Estimate, Measured | None], Estimate]:
    return _part("confirmation")

"""What the modes lend the estimate: the parts of a campaign that run after its sweep.

The plan stage sits below the modes and imports none of them. The estimate (`raysweep.plan.estimate`) counts the
winner's confirmation (`confirm:`) that runs after the sweep; it asks for it here by name, each part registered as
a loader that imports it when an estimate first asks for it (registering costs nothing):

- `confirmation` (`raysweep.confirm` lends `confirm.estimate.with_confirmation`): the estimate with the
  confirmation's server starts, runs and seconds where the campaign confirms its winner.

`raysweep.modes`, which both faces (`cli`, `api`) import, imports every mode. An estimate that asks for a part
nobody registered stops with a `LookupError` naming it: nothing is left out quietly. The run's own hooks are
`raysweep.drive.hooks`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from raysweep.registry import Registry

if TYPE_CHECKING:
    from raysweep.plan.estimate import Estimate, Measured
    from raysweep.plan.plan import Plan

__all__ = ["LOADERS", "confirmation", "register"]

LOADERS: Registry[Callable[[], Any]] = Registry(
    "part of the estimate", "the estimate asks raysweep.plan.hooks for it; import raysweep.modes first, as the CLI "
    "and the Python API do")
_LOADED: dict[str, Any] = {}


def register(name: str, load: Callable[[], Any]) -> None:
    """Lend the estimate the part `name` (see the module docstring): `load()` returns it."""
    LOADERS.register(name, load)
    _LOADED.pop(name, None)


def _part(name: str) -> Any:
    if name not in _LOADED:
        _LOADED[name] = LOADERS.get(name)()
    return _LOADED[name]


def confirmation() -> Callable[[Plan, Estimate, Measured | None], Estimate]:
    return _part("confirmation")

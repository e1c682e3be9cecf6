"""raysweep: vLLM serving benchmark sweeps across a Ray cluster.

A campaign (one YAML file) is expanded into a plan of server configurations x benchmark points x runs;
the driver runs them on Ray, every finished point lands in a durable SQLite ledger, and the results are
merged into one table.

The Python API (`raysweep.api`, imported on first use so that `import raysweep` stays fast):
`raysweep.load(dir_or_uri)` reads a campaign's results (`.results`, `.summary`, `.conclusions`, `.sla`,
`.plot(...)`), `raysweep.run(campaign)` runs one. See docs/api.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raysweep.api import Campaign, Conclusions, load, run

from raysweep.version import __version__

__all__ = ["Campaign", "Conclusions", "__version__", "load", "run"]

_API = ("Campaign", "Conclusions", "load", "run")


def __getattr__(name: str) -> Any:
    if name in _API:
        from raysweep import api

        return getattr(api, name)
    raise AttributeError(f"module 'raysweep' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])

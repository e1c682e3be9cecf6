"""The SLA mode: targets, their judgment over runs, the search for the largest concurrency or request rate
that meets them (`sla.search`), its probes against a live server (`sla.probe`), and its bookkeeping in a running
campaign (`sla.book`: the searches still open, closed when their configuration is given up).

The run calls its searches and its bookkeeping through `raysweep.drive.hooks`, where this package lends them when
it is imported.

A mode. May import: every stage and the stage-free rooms; never another mode.
"""

from __future__ import annotations

from typing import Any

from raysweep.drive import hooks


def _searches() -> Any:
    from raysweep.sla.probe import SlaSearches  # imports the run's parts: only when a campaign runs

    return SlaSearches


def _book() -> Any:
    from raysweep.sla import book

    return book


hooks.register("sla", _searches)
hooks.register("sla_book", _book)

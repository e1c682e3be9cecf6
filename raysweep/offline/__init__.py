"""The offline mode: `vllm bench throughput` / `latency` run to their end inside a configuration's placement
group, without a server. The client's offline backend is the bench's (`bench.offline`).

The run calls its points through `raysweep.drive.hooks`, where this package lends them when it is imported.

A mode. May import: every stage and the stage-free rooms; never another mode.
"""

from __future__ import annotations

from typing import Any

from raysweep.drive import hooks


def _points() -> Any:
    from raysweep.offline.points import OfflinePoints  # imports Ray: only when a campaign runs

    return OfflinePoints


hooks.register("offline", _points)

"""Benchmark clients.

- `native` (the default): raysweep's own streaming client in warm Ray actors (`native`, with `options`,
  `datasets`, `arrivals` and `stats`; the workloads `sessions`, `trace` and `timeseries`).
- `command`: runs a benchmark command such as `vllm bench serve` in a Ray actor and reads its JSON (`command`).

- `offline`: the offline sweeps' `vllm bench throughput|latency` commands and their JSON (no client: the
  driver runs them in the configuration's host actors).

The two serving backends give the driver one typed interface (`backend.BenchBackend`: `warm`, `submit`,
`finish`, `close`), registered by name in `backend.BACKENDS`; `backend_for` picks one.
Submodules are imported on use, so the pure parts load without Ray.

May import: the stage-free rooms, `ledger` and `record`. Knows nothing of the campaign file, placement or
servers (the campaign uses its option parser, not the other way round).
"""

from __future__ import annotations

from raysweep.bench.backend import BenchBackend, backend_for

__all__ = ["BenchBackend", "backend_for"]

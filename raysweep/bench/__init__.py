"""Benchmark clients.

- `native` (the default): raysweep's own streaming client in warm Ray actors (`native`, with `options`,
  `datasets`, `arrivals` and `stats`; the workloads `sessions`, `trace` and `timeseries`).
- `command`: runs a benchmark command such as `vllm bench serve` in a Ray actor and reads its JSON (`command`).

- `offline`: the offline sweeps' `vllm bench throughput|latency` commands and their JSON (no client: the
  driver runs them in the configuration's host actors).

The two serving backends give the driver the same interface (`warm`, `submit`, `finish`, `close`); `backend_for`
picks one.
Submodules are imported on use, so the pure parts load without Ray.

May import: the stage-free rooms, `ledger` and `record`. Knows nothing of the campaign file, placement or
servers (the campaign uses its option parser, not the other way round).
"""

from __future__ import annotations

from typing import Any


def backend_for(bench: Any, env: dict[str, str]) -> Any:
    """The driver-side client of a campaign's `bench` section."""
    from raysweep.procs import cpu_set

    wanted = getattr(bench, "cpu_affinity", None)
    cpu_ids = sorted(cpu_set(wanted) or ()) if wanted is not None else None
    if bench.backend == "native":
        from raysweep.bench.native import NativeBench
        return NativeBench(clients=bench.clients, max_clients=bench.max_clients, cpus=bench.client_cpus,
                           timeout_s=bench.timeout_s, max_send_lag_ms=bench.client_guard.max_send_lag_ms,
                           min_rate_fraction=bench.client_guard.min_rate_fraction,
                           max_loop_lag_ms=bench.client_guard.max_loop_lag_ms, cpu_ids=cpu_ids)
    from raysweep.bench.command import CommandBench
    return CommandBench(env, bench.timeout_s, cpu_ids)

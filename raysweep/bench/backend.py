"""The interface the driver drives a bench client through, and the registry of the backends that have one.

A backend (`bench.backend` in a campaign) is a driver-side object with four verbs: `warm` (start its actors
while the server starts), `submit` (send one point's load; returns the job in flight), `finish` (the point's
result record from the job's answers) and `close`. `native` (raysweep's own client) and `command` (a
benchmark command such as `vllm bench serve` in an actor) register themselves here; offline points have no
client (their command runs in the configuration's host actors, `raysweep.bench.offline`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from raysweep.registry import Registry

__all__ = ["BACKENDS", "BenchBackend", "BenchJob", "backend_for", "register_backend"]


class BenchJob(Protocol):
    """A point in flight: the Ray calls its answers come from, and how many clients send its load."""

    refs: list[Any]
    clients: int


class BenchBackend(Protocol):
    """What the driver asks of a bench client (see the module docstring)."""

    def warm(self) -> None: ...

    def submit(self, argv: list[str], base_url: str, model: str, num_prompts: int | None = None,
               clients: int | None = None) -> BenchJob: ...

    def finish(self, job: Any, answers: list[dict[str, Any]]) -> dict[str, Any]: ...

    def close(self) -> None: ...


# name -> a factory of the backend from the campaign's `bench` section, its environment and its CPU ids
Factory = Callable[[Any, dict[str, str], list[int] | None], BenchBackend]
BACKENDS: Registry[Factory] = Registry("bench backend", "a backend registers itself in raysweep.bench.backend")


def register_backend(name: str) -> Callable[[Factory], Factory]:
    """Register `factory(bench, env, cpu_ids)` as the backend `name` (the campaign schema reads the names)."""
    return BACKENDS.add(name)


@register_backend("native")
def _native(bench: Any, env: dict[str, str], cpu_ids: list[int] | None) -> BenchBackend:
    from raysweep.bench.native import NativeBench

    return NativeBench(clients=bench.clients, max_clients=bench.max_clients, cpus=bench.client_cpus,
                       timeout_s=bench.timeout_s, max_send_lag_ms=bench.client_guard.max_send_lag_ms,
                       min_rate_fraction=bench.client_guard.min_rate_fraction,
                       max_loop_lag_ms=bench.client_guard.max_loop_lag_ms, cpu_ids=cpu_ids)


@register_backend("command")
def _command(bench: Any, env: dict[str, str], cpu_ids: list[int] | None) -> BenchBackend:
    from raysweep.bench.command import CommandBench

    return CommandBench(env, bench.timeout_s, cpu_ids)


def backend_for(bench: Any, env: dict[str, str]) -> BenchBackend:
    """The driver-side client of a campaign's `bench` section."""
    from raysweep.procs import cpu_set

    wanted = getattr(bench, "cpu_affinity", None)
    cpu_ids = sorted(cpu_set(wanted) or ()) if wanted is not None else None
    if bench.backend not in BACKENDS:
        raise ValueError(f"bench.backend: {bench.backend!r} is none of {', '.join(sorted(BACKENDS))}")
    return BACKENDS.get(bench.backend)(bench, env, cpu_ids)

"""The load of a bench point: how many requests it keeps in flight (`max_concurrency`) and how fast they
arrive (`request_rate`), as `vllm bench serve` names them. The two load variables are named here once; the
campaign file's `sla.variable` and `bench.workload.variable`, the plan, the estimate, the tuner, the results'
columns and the figures take their names from here. The names are also the result files' column names, so
the files read as before.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

from raysweep import grid

__all__ = ["CONCURRENCY", "RATE", "VARIABLES", "Load", "LoadVariable", "flags", "load_of"]

LoadVariable = Literal["max_concurrency", "request_rate"]
CONCURRENCY: Final = "max_concurrency"  # requests kept in flight (a closed loop); unset: no limit
RATE: Final = "request_rate"            # requests sent per second (an open loop); inf: all at once
VARIABLES: Final[tuple[LoadVariable, LoadVariable]] = (CONCURRENCY, RATE)


def flags(variable: LoadVariable) -> tuple[str, str]:
    """The command-line spellings of a load variable: `--max-concurrency`, `--max_concurrency`."""
    return f"--{variable.replace('_', '-')}", f"--{variable}"


@dataclass(frozen=True)
class Load:
    """A bench point's load: at most `max_concurrency` requests in flight (None: no limit), sent at
    `request_rate` per second (inf: all at once), as `vllm bench serve` reads its two options."""

    max_concurrency: int | None = None
    request_rate: float = math.inf

    def value(self, variable: LoadVariable) -> float | None:
        """The value of one load variable (None for a concurrency left unset)."""
        return self.max_concurrency if variable == CONCURRENCY else self.request_rate

    @property
    def variable(self) -> LoadVariable | None:
        """The variable that sets the pace: the rate when it is finite, else the concurrency when set."""
        if math.isfinite(self.request_rate):
            return RATE
        return CONCURRENCY if self.max_concurrency is not None else None

    def key(self) -> tuple[float, float]:
        """(max_concurrency, request_rate), an unset concurrency as inf: the load's place in an order."""
        return (math.inf if self.max_concurrency is None else float(self.max_concurrency), self.request_rate)


def _number(value: str | None) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def _load(concurrency: str | None, rate: str | None) -> Load:
    c, r = _number(concurrency), _number(rate)
    return Load(max_concurrency=int(c) if c is not None and math.isfinite(c) else None,
                request_rate=math.inf if r is None else r)


def load_of(argv: Sequence[str]) -> Load:
    """The load a benchmark command asks for (the last of each option, as argparse reads it); an option
    missing or not a number reads as unset. It never refuses: the option parser (`bench.options`) judges."""
    return _load(*(grid.find_flag_value(argv, *flags(v)) for v in VARIABLES))


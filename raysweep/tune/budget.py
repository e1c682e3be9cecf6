"""The tuning budget: candidates tried, GPU-hours held (and expected of the candidates running), hours since
the first candidate; whichever limit comes first stops the asking."""

from __future__ import annotations

from collections.abc import Callable

from raysweep.campaign import TuneBudget
from raysweep.tune.candidates import Candidate


class Budget:
    """What a tuning campaign has spent of its budget; `exhausted` is set when the sampler has nothing new."""

    def __init__(self, budget: TuneBudget, cands: dict[int, Candidate], clock: Callable[[], float]) -> None:
        self.b = budget
        self.cands = cands
        self.clock = clock
        self.t0 = clock()
        self.exhausted: str | None = None

    def _live(self) -> list[Candidate]:
        return [c for c in self.cands.values() if c.state == "running"]

    def _tried(self) -> int:
        return sum(1 for c in self.cands.values() if c.state != "refused")

    def gpu_hours(self) -> float:
        now = self.clock()
        return sum(c.gpu_s + (c.gpus * (now - c.started_at) if c.started_at is not None else 0.0)
                   for c in self.cands.values()) / 3600

    def committed_hours(self) -> float:
        """What the live candidates are expected to hold still: each the mean time a complete candidate held
        its GPUs (none yet: nothing expected), less the time it has held them."""
        held = [c.gpu_s / c.gpus for c in self.cands.values() if c.state == "complete" and c.gpus]
        if not held:
            return 0.0
        mean, now = sum(held) / len(held), self.clock()
        return sum(max(1, c.gpus) * max(0.0, mean - c.gpu_s / max(1, c.gpus)
                                         - (now - c.started_at if c.started_at is not None else 0.0))
                   for c in self._live()) / 3600

    def left(self) -> str | None:
        """None while the budget allows another candidate, else what ran out."""
        b = self.b
        tried = self._tried()
        if b.candidates is not None and tried >= b.candidates:
            return f"{tried} candidate(s) tried (budget {b.candidates})"
        if b.gpu_hours is not None and self.gpu_hours() + self.committed_hours() >= b.gpu_hours:
            return (f"{self.gpu_hours():.2f} GPU-hours used, {self.committed_hours():.2f} more expected of the "
                    f"candidates running (budget {b.gpu_hours:g})")
        hours = (self.clock() - self.t0) / 3600
        if b.wall_hours is not None and hours >= b.wall_hours:
            return f"{hours:.2f} hours since the first candidate (budget {b.wall_hours:g})"
        return self.exhausted

    def spent(self) -> float:
        """The share spent of whichever limit is nearest (0 when none is given)."""
        b, spent = self.b, []
        if b.candidates is not None:
            spent.append(self._tried() / b.candidates)
        if b.gpu_hours is not None:
            spent.append((self.gpu_hours() + self.committed_hours()) / b.gpu_hours)
        if b.wall_hours is not None:
            spent.append((self.clock() - self.t0) / 3600 / b.wall_hours)
        return max(spent, default=0.0)

"""Early stopping: successive halving over each candidate's bench points, judged at rungs.

One objective: at a rung (n/eta, n/eta^2, ... bench points finished in a row), a candidate that ranks
outside the best 1/eta of the candidates that reached it stops. Pareto: a candidate none of whose points is
off the others' dominated area (each FRONT_MARGIN better) stops. Each rung value is saved with the candidate.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from raysweep.campaign import TuneEarlyStop, TuneObjective
from raysweep.ledger import Ledger, PointState
from raysweep.maths.pareto import FRONT_MARGIN, beaten
from raysweep.tune.candidates import Candidate
from raysweep.tune.objective import Objective


def rung_sizes(n_bench: int, eta: int) -> list[int]:
    """The bench-point counts at which candidates are compared: n/eta, n/eta^2, ... (at least 1, below n)."""
    sizes, j = set(), 1
    while True:
        r = max(1, math.ceil(n_bench / eta ** j))
        if r < n_bench:
            sizes.add(r)
        if r == 1:
            return sorted(sizes)
        j += 1


class Rungs:
    """Judges running candidates at the rungs they reached (`judge`: why one stops now, or None)."""

    def __init__(self, early_stop: TuneEarlyStop, objective: Objective, cands: dict[int, Candidate], ledger: Ledger,
                 max_attempts: int, bench_order: Callable[[str], list[str]],
                 save: Callable[[Candidate], None]) -> None:
        self.es = early_stop
        self.objective = objective
        self.objectives: list[TuneObjective] = objective.objectives
        self.cands = cands
        self.ledger = ledger
        self.max_attempts = max_attempts
        self.bench_order = bench_order
        self.save = save

    def judge(self, cand: Candidate) -> str | None:
        if len(self.objectives) == 1:
            return self._judge(cand, self.es.eta, self.es.min_peers)
        return self._judge_front(cand, self.es.eta, self.es.min_peers)

    def _judge(self, cand: Candidate, eta: int, min_peers: int) -> str | None:
        order, reached = self._reached(cand)
        o = self.objectives[0]
        for r in rung_sizes(len(order), eta):
            if r > reached or str(r) in cand.rungs:
                continue
            v = self.objective.value(cand, o, order[:r])
            cand.rungs[str(r)] = v
            self.save(cand)
            if v is None:
                continue
            peers = [p for c in self.cands.values() if (p := c.rungs.get(str(r))) is not None]
            if len(peers) < min_peers:
                continue
            better = sum(1 for p in peers if (p > v if o.direction == "maximize" else p < v))
            keep = math.ceil(len(peers) / eta)
            if better >= keep:
                what = o.metric + {"none": "", "gpu": " per GPU", "user": " per user"}[o.per]
                return (f"rung {r} of {len(order)} bench point(s): {what} {v:.4g} ranks {better + 1} of "
                        f"{len(peers)}; only the best {keep} go on (eta {eta})")
        return None

    def _reached(self, cand: Candidate) -> tuple[list[str], int]:
        """The candidate's bench ids in run order, and how many of them in a row it finished."""
        order = self.bench_order(cand.serve.id)
        done = self._done_benches(cand.serve.id)
        reached = 0
        for b in order:
            if b not in done:
                break
            reached += 1
        return order, reached

    def _judge_front(self, cand: Candidate, eta: int, min_peers: int) -> str | None:
        """Pareto: at a rung, a candidate none of whose points is off the others' dominated area stops.
        Its rung value is how many of its points no other candidate's point dominates."""
        order, reached = self._reached(cand)
        dirs = [o.direction for o in self.objectives]
        for r in rung_sizes(len(order), eta):
            if r > reached or str(r) in cand.rungs:
                continue
            mine = self.objective.points(cand, order[:r])
            others = [q for c in self.cands.values() if c is not cand and c.state != "refused"
                      for q in self.objective.points(c)]
            alive = [p for p in mine if not beaten(p, others, dirs, FRONT_MARGIN)]
            cand.rungs[str(r)] = float(len(alive))
            self.save(cand)
            peers = sum(1 for c in self.cands.values() if c is not cand and str(r) in c.rungs)
            if mine and not alive and peers >= min_peers:
                return (f"rung {r} of {len(order)} bench point(s): each of its {len(mine)} point(s) is dominated "
                        f"by another candidate's")
        return None

    def _done_benches(self, serve_id: str) -> set[str]:
        by_bench: dict[str, list[bool]] = {}
        for p in self.ledger.points(serve_id=serve_id):
            ended = p.state == PointState.DONE or (p.state == PointState.FAILED and p.attempts >= self.max_attempts)
            by_bench.setdefault(p.bench_id, []).append(ended)
        return {b for b, ends in by_bench.items() if all(ends)}

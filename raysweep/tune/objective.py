"""A candidate's objective: a result field (per GPU or per user) or the SLA capacity its searches found,
over its bench points; with two result fields (Pareto), the pair of values at each of its bench points."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from raysweep.campaign import TuneObjective
from raysweep.ledger import Ledger, PointState
from raysweep.tune.candidates import Candidate
from raysweep.tune.space import SLA_CAPACITY, _concurrency

if TYPE_CHECKING:
    from raysweep.ledger import PointRow
    from raysweep.record.directory import CampaignDir


def _aggregate(values: list[float], o: TuneObjective) -> float:
    if o.aggregate == "mean":
        return sum(values) / len(values)
    best = (o.aggregate == "best") == (o.direction == "maximize")
    return max(values) if best else min(values)


class Objective:
    """The objectives of a tuning campaign, read from the ledger and the result files of the output dir."""

    def __init__(self, objectives: list[TuneObjective], directory: CampaignDir, bench_argv: list[str]) -> None:
        self.objectives = objectives
        self.ledger: Ledger = directory.ledger
        self.output_dir = directory.path
        self.bench_argv = bench_argv
        self._records: dict[str, dict[str, Any]] = {}

    def _record(self, row: PointRow) -> dict[str, Any] | None:
        if row.point_id not in self._records:
            path = self.output_dir / (row.result_path or "")
            try:
                self._records[row.point_id] = json.loads(path.read_text())
            except (OSError, ValueError):
                return None
        return self._records[row.point_id]

    def values(self, cand: Candidate, bench_ids: Sequence[str] | None) -> list[float | None]:
        """Each objective of a candidate over these bench points (None: all of them)."""
        return [self.value(cand, o, bench_ids) for o in self.objectives]

    def value(self, cand: Candidate, o: TuneObjective, bench_ids: Sequence[str] | None) -> float | None:
        serve_id = cand.serve.id
        gpus = max(1, cand.serve.shape.gpu_count)
        per_bench: dict[str, list[float]] = {}
        if o.metric == SLA_CAPACITY:
            for r in self.ledger.searches():
                if r["serve_id"] == serve_id and (bench_ids is None or r["bench_id"] in bench_ids):
                    cap = r["largest_pass"] if r["largest_pass"] is not None else 0.0
                    per_bench.setdefault(r["bench_id"], []).append(cap)
            caps = [min(v) for v in per_bench.values()]  # every target must hold
            return _aggregate([c / (gpus if o.per == "gpu" else 1) for c in caps], o) if caps else None
        per = self.per_bench(cand, o, bench_ids)
        return _aggregate(list(per.values()), o) if per else None

    def by_points(self) -> bool:
        """Pareto over result fields: each bench point of a candidate is one point of the trade-off."""
        return len(self.objectives) == 2 and all(o.metric != SLA_CAPACITY for o in self.objectives)

    def points(self, cand: Candidate, bench_ids: Sequence[str] | None = None) -> list[list[float]]:
        """Pareto: the pair of objective values of each bench point the candidate finished."""
        a, b = (self.per_bench(cand, o, bench_ids) for o in self.objectives)
        return [[a[k], b[k]] for k in a if k in b]

    def per_bench(self, cand: Candidate, o: TuneObjective, bench_ids: Sequence[str] | None) -> dict[str, float]:
        """One objective at each bench point the candidate finished (mean over its runs)."""
        gpus = max(1, cand.serve.shape.gpu_count)
        per_bench: dict[str, list[float]] = {}
        for row in self.ledger.points(serve_id=cand.serve.id):
            if row.state != PointState.DONE or (bench_ids is not None and row.bench_id not in bench_ids):
                continue
            rec = self._record(row)
            v = None if rec is None else rec.get(o.metric)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                continue
            if o.per == "gpu":
                v = v / gpus
            elif o.per == "user":
                users = _concurrency(row.bench_params, self.bench_argv)
                if not users:
                    continue
                v = v / users
            per_bench.setdefault(row.bench_id, []).append(float(v))
        return {b: sum(v) / len(v) for b, v in per_bench.items()}

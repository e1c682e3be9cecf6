"""SLA probing against a live server: runs the probes an SLA search asks for and judges them.

A probe is one value of the load variable (`max_concurrency` or `request_rate`) of a bench point, with all
its runs; each run is an ordinary point (`PointRunner.run`) recorded in the ledger, so probes are shared
between targets and a search replays from the ledger after a restart. A probe's metrics pool the raw
samples of its runs (`pool_probe`); `judge` gives its verdict for a target and `capacity` what the
unbounded-load probe says the server sustains. The search itself is `raysweep.sla.search.search` (pure).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raysweep.bench import stats
from raysweep.bench.load import CONCURRENCY, RATE, LoadVariable
from raysweep.bench.options import parse_load_options
from raysweep.drive import hooks
from raysweep.drive.point import PointRunner
from raysweep.drive.state import RunState
from raysweep.plan.plan import BenchPoint
from raysweep.record.runs import read_samples
from raysweep.serve import metrics
from raysweep.serve.live_server import ConfigRun, Server
from raysweep.sla import search as sla
from raysweep.sla.plan import probe_runs

if TYPE_CHECKING:
    from raysweep.campaign.models import SlaSpec
    from raysweep.record.directory import CampaignDir

__all__ = ["ProbeData", "SlaSearches", "capacity", "judge", "pool_probe"]


class SearchStopped(Exception):
    """A probe could not run (the server went down, the run was aborted or the campaign stops)."""


@dataclass
class ProbeData:
    metrics: dict[str, Any]
    per_request: dict[str, Any]
    client_limited: bool


@dataclass
class _SearchState:
    reset: str
    probes: dict[str, dict[tuple[float, int], ProbeData | None]] = field(default_factory=dict)


def _probe_value(setting: int | float | str | None) -> float:
    return math.inf if setting is None or setting == "inf" else float(setting)


def pool_probe(directory: CampaignDir, result_paths: list[str | None], argv: list[str]) -> ProbeData:
    """Metrics of a probe from the raw samples of all its runs (their result files in `directory`): latencies
    over the pooled requests, throughputs and peaks per run and then combined (each run is timed from its own
    start), and the server metrics of the runs combined."""
    records = [json.loads((directory.path / (p or "")).read_text()) for p in result_paths]
    runs = [read_samples(directory.path / r["samples_path"]) for r in records]
    samples = stats.pool(runs)
    opts = parse_load_options(argv)
    pooled = sla.pool_runs(stats.point_metrics(samples, opts), [stats.point_metrics(s, opts) for s in runs])
    pooled.update(metrics.combine(records))
    return ProbeData(pooled, stats.per_request(samples), any(r.get("client_limited") for r in records))


def judge(data: ProbeData | None, target: sla.Target, cfg: SlaSpec) -> sla.Verdict:
    """A probe's verdict for one target, by the campaign's `sla.judge`."""
    if data is None or data.client_limited:  # a probe that did not run, or a client that limited it, decides nothing
        return sla.Verdict.UNRESOLVED
    if cfg.judge == "attainment":
        return sla.judge_attainment(data.per_request, data.metrics, target, cfg.attainment)[0]
    return sla.judge_percentile(data.metrics, target, data.per_request)


def capacity(data: ProbeData | None, variable: LoadVariable) -> float | None:
    """What the unbounded-load probe says the server sustains: its throughput (a rate), or by Little's
    law the requests it keeps in flight (a concurrency)."""
    if data is None:
        return None
    rps = float(data.metrics.get("request_throughput") or 0.0)
    if variable == RATE:
        return rps or None
    return rps * float(data.metrics.get("mean_e2el_ms") or 0.0) / 1000.0 or None


class SlaSearches:
    """Runs the open SLA searches of a configuration against its live server (see the module docstring)."""

    def __init__(self, work: RunState, points: PointRunner) -> None:
        self.work, self.points = work, points
        self.c = work.c

    def run(self, run: ConfigRun, server: Server) -> None:
        """Every open SLA search of this config, probes shared between targets and taken from the ledger
        when they are already done. Returns early (the caller restarts or stops) when a probe could not run."""
        w, cfg = self.work, self.c.sla
        assert cfg is not None
        state = _SearchState(reset=self.points.reset(run, server))
        for bench_id, target in w.open_searches(run.serve.id):
            base = next(b for b in w.plan.benches if b.id == bench_id)
            probes = state.probes.setdefault(bench_id, {})
            try:
                if not probes:
                    self._workload_probes(run.serve.id, base, probes)  # bench.workload: its levels are probes
                    for value, first in self._ledger_probe_values(run.serve.id, bench_id):
                        self._probe(run, server, base, value, probes, state, first, run_missing=False)
                outcome = self._search(run, server, base, target, probes, state)
            except SearchStopped:
                return
            at = probes.get((outcome.largest_pass, 0)) if outcome.largest_pass is not None else None
            w.ledger.record_search(run.serve.id, bench_id, sla.search_key(cfg, target), outcome.state,
                                   outcome.largest_pass, outcome.smallest_fail, len(outcome.probes), outcome.notes,
                                   at.metrics if at else {})
            w.emit("sla_done", serve=run.serve, bench_id=bench_id, target=target.label, outcome=outcome)

    def _search(self, run: ConfigRun, server: Server, base: BenchPoint, target: sla.Target,
                probes: dict[tuple[float, int], ProbeData | None], state: _SearchState) -> sla.Outcome:
        cfg = self.c.sla
        assert cfg is not None

        def judged(value: float, first: int = 0) -> sla.Verdict:
            return judge(self._probe(run, server, base, value, probes, state, first), target, cfg)

        return sla.search(
            judged, start=cfg.start, max_value=cfg.max_value, precision=cfg.precision,
            integer=cfg.variable == CONCURRENCY,
            estimate=lambda: capacity(probes.get((sla.INFINITE, 0)), cfg.variable),
            recheck=lambda v: judged(v, self.c.runs),
            known=lambda: {v: judge(d, target, cfg) for (v, first), d in probes.items() if first == 0})

    def _workload_probes(self, serve_id: str, base: BenchPoint, probes: dict[tuple[float, int], ProbeData | None]
                         ) -> None:
        """With `bench.workload`, the serial, batch and level points that ran exactly what a probe runs are
        that probe (the load-levels mode's `search_probes`, lent through `raysweep.drive.hooks`): the search
        starts from them and runs none of them again."""
        for value, paths in hooks.levels().search_probes(self.work, serve_id, base.id).items():
            probes[(value, 0)] = pool_probe(self.work.directory, list(paths), base.argv)

    def _ledger_probe_values(self, serve_id: str, bench_id: str) -> list[tuple[float, int]]:
        """The (value, first run) of every probe of a search already in the ledger, done or not."""
        cfg = self.c.sla
        assert cfg is not None
        unbounded = {p.bench.id for p in self.work.plan.points_of(serve_id) if p.bench.base_id == bench_id}
        return sorted({(_probe_value(row.bench_params.get(cfg.variable)), (row.run // self.c.runs) * self.c.runs)
                       for row in self.work.ledger.points(serve_id=serve_id)
                       if row.probe_of == bench_id or row.bench_id in unbounded})

    def _probe(self, run: ConfigRun, server: Server, base: BenchPoint, value: float,
               probes: dict[tuple[float, int], ProbeData | None], state: _SearchState, first: int = 0,
               run_missing: bool = True) -> ProbeData | None:
        """The pooled data of one probe's runs, running those not done yet (within max_attempts). A
        concurrency of at least the point's prompt count is the unbounded probe itself."""
        w = self.work
        if self.c.sla is not None and self.c.sla.variable == CONCURRENCY and math.isfinite(value) \
                and value >= parse_load_options(base.argv).num_prompts:
            value = math.inf
        key = (value, first)
        if key in probes:
            return probes[key]
        pts = probe_runs(w.plan.spec, run.serve, base, value, first)
        w.ledger.add_probes(base.id, [(p.id, p.serve.id, p.bench.id, p.run, p.serve.params, p.bench.params)
                                      for p in pts])
        for p in pts:
            while run_missing:
                row = w.ledger.point(p.id)
                if row is None or row.state == "done" or row.attempts >= self.c.max_attempts:
                    break
                self.points.run(run, server, p, state.reset)
                if run.abort or w.stopping() or server.down() is not None:
                    raise SearchStopped()
                state.reset = self.points.reset(run, server)
        rows = [w.ledger.point(p.id) for p in pts]
        if not all(r is not None and r.state == "done" for r in rows):
            if run_missing:
                probes[key] = None  # failed for good: it cannot decide anything
            return None
        probes[key] = pool_probe(w.directory, [r.result_path for r in rows if r is not None], pts[0].bench.argv)
        return probes[key]

"""SLA search's part of the plan: the bench point that probes a value of its variable on a grid point
(`probe_bench`: unbounded load at inf), a probe's runs (`probe_runs`: the campaign's first ones, its unbounded-load
probes, and those a search adds as it goes), and what the dry run says of the search (`dry_run_lines`). The plan
(`raysweep.plan.plan`) asks for them through `raysweep.plan.hooks` (`sla`), where `raysweep.sla` lends them."""

from __future__ import annotations

import math
from typing import Any

from raysweep import grid
from raysweep.bench.load import CONCURRENCY
from raysweep.campaign import Campaign, CampaignSpec
from raysweep.campaign.levels import workload_of
from raysweep.plan.plan import BenchPoint, PointRun, ServeConfig, _no_name, point_id

__all__ = ["dry_run_lines", "probe_bench", "probe_runs"]


def probe_bench(spec: CampaignSpec, base: BenchPoint, value: float) -> BenchPoint:
    """The bench point an SLA search runs to try `value` of its variable on `base` (inf: unbounded load)."""
    sla = spec.campaign.sla
    assert sla is not None
    if math.isinf(value):
        setting: Any = None if sla.variable == CONCURRENCY else "inf"
    else:
        setting = int(value) if sla.variable == CONCURRENCY else float(value)
    params = {**base.params, sla.variable: setting}
    return BenchPoint(id=grid.params_id(_no_name(params)), params=params,
                      argv=grid.apply_to_cmd(spec.bench_argv, params),
                      label=f"{base.label}-{sla.variable}={'inf' if math.isinf(value) else f'{value:g}'}",
                      base_id=base.id, sla_value=value)


def probe_runs(spec: CampaignSpec, serve: ServeConfig, base: BenchPoint, value: float, first_run: int = 0
               ) -> list[PointRun]:
    """The runs of one probe (`first_run` > 0 for a re-check: new runs of the same value)."""
    b = probe_bench(spec, base, value)
    return [PointRun(id=point_id(serve.id, b.id, r), serve=serve, bench=b, run=r)
            for r in range(first_run, first_run + spec.campaign.runs)]



def dry_run_lines(c: Campaign) -> list[str]:
    """What the dry run says of a campaign's SLA search: its variable, judge and range, its targets, and the
    probes it adds as it goes."""
    assert c.sla is not None
    lines = [f"SLA search on {c.sla.variable} ({c.sla.judge}, precision {c.sla.precision:g}, "
             f"from {c.sla.start:g} to {c.sla.max_value:g}), per server config and bench point, for:"]
    lines += [f"  {t}" for t in c.sla.targets]
    lines += ["The runs above are the unbounded-load probes; the search adds its other probes as it goes."
              if workload_of(c) is None else "The search runs after the workload levels and starts from them: "
              "every level, and with max_concurrency the serial and batch points, is a probe it does not run "
              "again; it adds the other probes as it goes."]
    return lines

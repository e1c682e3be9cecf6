"""The search space of a `tune:` campaign and its checks: each `tune.space` dimension as an Optuna
distribution, the refusals of a block that cannot run (registered with the campaign loader, which runs them
when a campaign sets `tune:`), and the refusal of a candidate (`tune.exclude`, or no node can hold it).
"""

from __future__ import annotations

import math
import random
import shlex
from typing import Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from raysweep import grid
from raysweep.bench.load import load_of
from raysweep.campaign import Campaign, CampaignSpec, TuneParam, TuneSpec, register_check
from raysweep.errors import CampaignError
from raysweep.place import placement
from raysweep.plan.plan import ServeConfig, make_serve

SHAPE_KEYS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
SLA_CAPACITY = "sla_capacity"


GRID_LIMIT = 100_000


def _whole(v: float | None) -> bool:
    return v is None or float(v).is_integer()


def distribution(key: str, p: TuneParam, fld: str) -> BaseDistribution:
    """The Optuna distribution of one dimension; refuses (CampaignError at `fld`) what is not a valid one."""
    if p.choices is not None:
        if p.low is not None or p.high is not None or p.log or p.step is not None:
            raise CampaignError(fld, "give either choices: [...] or a range (low, high, log, step), not both")
        if not p.choices:
            raise CampaignError(f"{fld}.choices", "must hold at least one value")
        for v in p.choices:
            if not (v is None or isinstance(v, (bool, int, float, str))):
                raise CampaignError(f"{fld}.choices", f"takes numbers, strings, booleans or null, got {v!r}")
        if len({repr(v) for v in p.choices}) != len(p.choices):
            raise CampaignError(f"{fld}.choices", f"holds a value twice: {p.choices}")
        if grid.normalize_key(key) in SHAPE_KEYS and not all(isinstance(v, int) and v >= 1 for v in p.choices):
            raise CampaignError(f"{fld}.choices", f"{key} takes positive integers, got {p.choices}")
        return CategoricalDistribution(tuple(p.choices))
    if p.low is None or p.high is None:
        raise CampaignError(fld, "give choices: [...] or a range with both low: and high:")
    if p.low > p.high:
        raise CampaignError(fld, f"low {p.low:g} is above high {p.high:g}")
    if p.log and p.low <= 0:
        raise CampaignError(f"{fld}.low", f"must be above 0 on a log scale, got {p.low:g}")
    if p.log and p.step is not None:
        raise CampaignError(f"{fld}.step", "has no meaning on a log scale; remove it or log")
    is_int = p.type == "int" or (p.type is None and _whole(p.low) and _whole(p.high) and _whole(p.step))
    if grid.normalize_key(key) in SHAPE_KEYS and not (is_int and p.low >= 1):
        raise CampaignError(fld, f"{key} takes a range of positive integers")
    if is_int:
        if not (_whole(p.low) and _whole(p.high) and _whole(p.step)):
            raise CampaignError(fld, "type int needs whole low, high and step")
        return IntDistribution(int(p.low), int(p.high), log=p.log, step=int(p.step or 1))
    return FloatDistribution(float(p.low), float(p.high), log=p.log, step=p.step)


def _grid_values(d: BaseDistribution, fld: str) -> list[Any]:
    if isinstance(d, CategoricalDistribution):
        return list(d.choices)
    if isinstance(d, IntDistribution):
        return list(range(d.low, d.high + 1, d.step))
    if isinstance(d, FloatDistribution) and d.step is not None:
        n = int(round((d.high - d.low) / d.step))
        return [round(d.low + i * d.step, 12) for i in range(n + 1)]
    raise CampaignError(fld, "sampler grid needs choices, an integer range or a float range with step")


def _finite(d: BaseDistribution) -> bool:
    return isinstance(d, (CategoricalDistribution, IntDistribution)) or (
        isinstance(d, FloatDistribution) and d.step is not None)


def _draw(d: BaseDistribution, rng: random.Random) -> Any:
    """One value of a distribution, uniform (in log where asked)."""
    if isinstance(d, CategoricalDistribution):
        return rng.choice(list(d.choices))
    if isinstance(d, (IntDistribution, FloatDistribution)):
        if _finite(d):
            return rng.choice(_grid_values(d, ""))
        return math.exp(rng.uniform(math.log(d.low), math.log(d.high))) if d.log else rng.uniform(d.low, d.high)
    raise TypeError(f"no values to draw from {d!r}")


def distributions(t: TuneSpec) -> dict[str, BaseDistribution]:
    return {k: distribution(k, p, f"tune.space.{k}") for k, p in t.space.items()}


def check_tune(campaign: Campaign, serve_combos: list[dict[str, Any]], bench_combos: list[dict[str, Any]]) -> None:
    """Refuse (CampaignError naming the field) a `tune:` block that cannot run."""
    t = campaign.tune
    assert t is not None and campaign.serve is not None and campaign.bench is not None
    if len(serve_combos) > 1:
        raise CampaignError("serve.params", f"holds {len(serve_combos)} combinations; with tune: it may hold one "
                                            "(its values go into every candidate). Move the grid's lists into "
                                            "tune.space as {choices: [...]}")
    if not t.space:
        raise CampaignError("tune.space", "give at least one serve parameter, e.g. max_num_seqs: {choices: [64, 128]}")
    base = {grid.normalize_key(k) for k in serve_combos[0]}
    dists = {}
    for key, p in t.space.items():
        fld = f"tune.space.{key}"
        grid.check_flag_key(key, fld)
        if grid.normalize_key(key) in base:
            raise CampaignError(fld, "is also set in serve.params; keep it in one place")
        dists[key] = distribution(key, p, fld)
    known = {grid.normalize_key(k) for k in t.space} | base
    for i, rule in enumerate(t.exclude):
        for key in rule:
            if grid.normalize_key(key) not in known:
                raise CampaignError(f"tune.exclude[{i}].{key}", f"names no parameter of the space or serve.params; "
                                                                f"known: {', '.join(sorted(known))}")
    if t.sampler == "grid":
        size = 1
        for key, d in dists.items():
            size *= len(_grid_values(d, f"tune.space.{key}"))
        if size > GRID_LIMIT:
            raise CampaignError("tune.sampler", f"grid over {size} combinations; at most {GRID_LIMIT}")
    bench_cmd = shlex.split(campaign.bench.cmd or "")
    for i, o in enumerate(t.objectives):
        fld = "tune.objective" if t.objective is not None else f"tune.pareto[{i}]"
        if o.metric == SLA_CAPACITY:
            if campaign.sla is None:
                raise CampaignError(f"{fld}.metric", "sla_capacity needs an sla: section (its targets)")
            if o.per == "user":
                raise CampaignError(f"{fld}.per", "sla_capacity per user has no meaning; use none or gpu")
        elif campaign.sla is not None:
            raise CampaignError(f"{fld}.metric", f"with sla:, candidates run SLA searches, not plain points; use "
                                                 f"metric: sla_capacity (got {o.metric!r})")
        elif not o.metric.isidentifier():
            raise CampaignError(f"{fld}.metric",
                                f"must be a result field name (e.g. output_throughput), got {o.metric!r}")
        elif o.metric.startswith("cost_per_m_") and campaign.cost is None:
            raise CampaignError(f"{fld}.metric", f"{o.metric} needs a cost: section (the price per GPU-hour; "
                                                 "docs/energy.md)")
        if o.per == "user" and not all(_concurrency(b, bench_cmd) for b in bench_combos):
            raise CampaignError(f"{fld}.per", "per user divides by max_concurrency; give it in every bench point "
                                              "(bench.params or --max-concurrency in bench.cmd)")


register_check("tune", check_tune)


def _concurrency(bench: dict[str, Any], cmd: list[str]) -> int | None:
    """The concurrency a bench point of the grid runs at: its command with its parameters applied."""
    return load_of(grid.apply_to_cmd(cmd, bench)).max_concurrency


def candidate_serve(spec: CampaignSpec, params: dict[str, Any]) -> ServeConfig:
    """A candidate's server configuration: serve.params' one combination with the sampled values."""
    return make_serve(spec, {**spec.serve_combos[0], **params})


def refusal(t: TuneSpec, serve: ServeConfig, nodes: list[placement.NodeInfo] | None) -> str | None:
    """Why a candidate is refused (it matches `tune.exclude`, or no node of the cluster can hold it), or None."""
    norm = {grid.normalize_key(k): v for k, v in serve.params.items()}
    for rule in t.exclude:
        if all(grid.normalize_key(k) in norm and str(norm[grid.normalize_key(k)]) == str(v) for k, v in rule.items()):
            return f"matches tune.exclude {rule}"
    if nodes:
        lay = placement.layout_for(serve.shape, serve.rule, nodes)
        if isinstance(lay, str):
            return f"can never be placed on this cluster: {lay}"
    return None

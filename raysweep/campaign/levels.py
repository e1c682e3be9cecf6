"""`bench.workload`'s schema and vLLM's rule for the levels (pure: no plan, no ledger).

See `raysweep.levels.search` for how a campaign runs them; this module holds what the campaign schema, the
plan and the readers need: the section's model and checks, the prompt count of a point, what a run achieved
and the levels between two endpoints exactly as vLLM's `serve_workload` computes them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from raysweep import grid
from raysweep.bench.load import CONCURRENCY, RATE, VARIABLES, LoadVariable
from raysweep.errors import CampaignError

if TYPE_CHECKING:
    from raysweep.campaign.loading import CampaignSpec
    from raysweep.campaign.models import Campaign

__all__ = ["BATCH", "DECIDED", "LEVEL", "NO_ENDPOINTS", "SERIAL", "VARIABLES", "WorkloadSpec", "achieved",
           "check_workload", "dataset_size", "dry_run_lines", "levels_between", "status_lines", "workload_of"]

SERIAL, BATCH, LEVEL = "serial", "batch", "level"
DEFAULT_NUM_PROMPTS = 1000  # vLLM's DEFAULT_NUM_PROMPTS: what `vllm bench serve` runs without --num-prompts
DECIDED, NO_ENDPOINTS = "decided", "endpoints failed"


class WorkloadSpec(BaseModel):
    """vLLM's `--workload-var` and `--workload-iters`: which load variable the levels set, and how many
    levels there are in all (the serial and batch endpoints included)."""

    model_config = ConfigDict(extra="forbid")

    variable: LoadVariable = Field(
        RATE, description="the load variable the levels set (vLLM's --workload-var)")
    levels: int = Field(10, ge=2, description="levels in all, the serial and batch endpoints included, as vLLM's "
                        "--workload-iters (at least 2; the levels between are decided after the endpoints)")


def workload_of(campaign: Campaign) -> WorkloadSpec | None:
    """The campaign's `bench.workload`, or None."""
    bench = getattr(campaign, "bench", None)
    return getattr(bench, "workload", None) if bench is not None else None


# -- the campaign's checks ------------------------------------------------------------------------------

_REFUSED = (("tune", "a tuning candidate's objective compares every candidate on the same bench points, and the "
                     "levels decided from each candidate's own serial and batch points differ between candidates; "
                     "tune on load values typed in bench.params, then run bench.workload on the candidates kept"),
            ("offline", "offline runs have no load variable"))


def check_workload(campaign: Campaign, serve_combos: list[dict[str, Any]], bench_combos: list[dict[str, Any]]) -> None:
    """Refuse what cannot work with `bench.workload`: a hand-typed grid of its variable (or of
    max_concurrency, which the endpoints set), tuning, offline mode, or an SLA search of another variable
    (the levels are the search's first probes)."""
    spec = workload_of(campaign)
    if spec is None:
        return
    for part, why in _REFUSED:
        if getattr(campaign, part, None) is not None:
            raise CampaignError("bench.workload", f"cannot be used with `{part}:` ({why}); remove one of them")
    sla = getattr(campaign, "sla", None)
    if sla is not None and sla.variable != spec.variable:
        raise CampaignError("sla.variable", f"is {sla.variable}, but bench.workload.variable is {spec.variable}: the "
                            "SLA search runs after the levels and starts from them, so both must set the same "
                            f"variable; set sla.variable: {spec.variable} (or change bench.workload.variable)")
    for i, combo in enumerate(bench_combos):
        for key in combo:
            norm = grid.normalize_key(key)
            if norm in (spec.variable, CONCURRENCY):
                raise CampaignError(f"bench.params[{i}].{key}", f"is set by bench.workload (variable "
                                    f"{spec.variable}: the serial and batch points set max_concurrency, the "
                                    f"levels set {spec.variable}); remove it from bench.params, or remove "
                                    "bench.workload to type the levels by hand")


# -- the points -----------------------------------------------------------------------------------------

def dataset_size(params: dict[str, Any], argv: Sequence[str]) -> int:
    """The prompts of one run, as vLLM's sweep reads them: the bench point's num_prompts, else the command's
    --num-prompts, else vLLM's default (1000)."""
    norm = {grid.normalize_key(k): v for k, v in params.items()}
    value = norm.get("num_prompts")
    if value is None:
        value = grid.find_flag_value(argv, "--num-prompts", "--num_prompts")
    return int(value) if value is not None else DEFAULT_NUM_PROMPTS


# -- the levels, as vLLM computes them ---------------------------------------------------------------

def achieved(record: dict[str, Any], variable: LoadVariable) -> float:
    """What one run achieved of the variable: its request throughput, or (max_concurrency) the requests it
    kept in flight, request throughput x mean E2EL (vLLM's `_estimate_workload_value`)."""
    rps = float(record["request_throughput"])
    if variable == RATE:
        return rps
    return rps * float(record["mean_e2el_ms"]) / 1000


def levels_between(serial: Sequence[float], batch: Sequence[float], levels: int) -> tuple[int, int, list[int]]:
    """The serial and batch values and the levels between them from the endpoints' per-run achieved values,
    exactly as vLLM's `explore_comb_workloads`: ceil of the serial mean, floor of the batch mean, the inner
    points of an even spacing of `levels` values, rounded (half to even) and deduplicated."""
    import numpy as np

    lo = math.ceil(sum(serial) / len(serial))
    hi = math.floor(sum(batch) / len(batch))
    inner = np.linspace(lo, hi, levels)[1:-1]
    return lo, hi, sorted(set(map(round, inner)))


def dry_run_lines(spec: CampaignSpec, endpoint_runs: int = 0) -> list[str]:
    """What the dry run says of the levels; `endpoint_runs`: the serial and batch runs the plan holds."""
    wl = workload_of(spec.campaign)
    if wl is None:
        return []
    inner = wl.levels - 2
    more = f"; at most {endpoint_runs // 2 * inner} more run(s)" if endpoint_runs and inner else ""
    what = ("request throughput" if wl.variable == RATE
            else "request throughput x mean E2EL (the requests kept in flight)")
    return [f"Workload levels: per server config and bench point, the serial point (max_concurrency 1) and the "
            f"batch point (max_concurrency = num_prompts) run first; {inner} level(s) of {wl.variable} between "
            f"what they achieve ({what}) are decided after the serial and batch points, as vLLM's serve_workload "
            f"decides them (fewer when the range is narrow){more}"]


def status_lines(rows: list[dict[str, Any]], stored: dict[str, Any]) -> list[str]:
    """Lines for `status` and the report: per (server config, bench point) the levels decided, or that they
    wait for the serial and batch points."""
    spec = (stored.get("bench") or {}).get("workload")
    if not spec:
        return []
    variable, n = spec.get("variable", RATE), spec.get("levels", 10)
    lines = [f"bench.workload ({n} levels of {variable}): {sum(r['state'] == DECIDED for r in rows)} decided, "
             f"{sum(r['state'] == NO_ENDPOINTS for r in rows)} without levels (an endpoint had no done run)"]
    for r in rows:
        if r["state"] == DECIDED:
            lines.append(f"  server {r['serve_id']} bench {r['bench_id']}: serial {variable}={r['serial']:g}, batch "
                         f"{r['batch']:g}; levels {', '.join(str(v) for v in r['levels']) or 'none between'}")
        else:
            lines.append(f"  server {r['serve_id']} bench {r['bench_id']}: {r['state']}, no level")
    return lines

"""The Pareto front of tokens/s per user against tokens/s per GPU (or energy or cost per token).

It follows `plot_pareto` (x = output tokens/s per user, y = output tokens/s per GPU) without its dominated
ties (vLLM issue #55561), and takes the GPU count as recorded (see `pareto`). With `y` one of `ENERGY_AXES`
(J per output token, $ per million output tokens, ...: docs/energy.md) the front is of the points that no other
beats on tokens/s per user (higher) and that column (lower).

One definition everywhere (the `pareto` command, the report's figure and conclusions, the Python API): the
front is of the points' means over their runs (client-limited runs left out), each with its 95 % t-interval
across runs; a front of single runs (`per="run"`, `raysweep pareto --per run`, what vLLM's plot draws) would
crown the luckiest repeat. The figure of it is `raysweep.report.plots.pareto`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from raysweep.bench.load import CONCURRENCY
from raysweep.errors import UserError
from raysweep.maths import pareto as geometry
from raysweep.maths.verdicts import mean_interval
from raysweep.results.rows import (
    _POINT,
    _flagged_note,
    _limited_note,
    apply_filters,
    check_columns,
    client_limited_mask,
)

_PARALLEL = {"tensor_parallel_size": "tp", "pipeline_parallel_size": "pp", "data_parallel_size": "dp"}
PER_GPU = "tokens_per_gpu"
# the y axes beside tokens/s per GPU: per-run columns, lower is better (raysweep.maths.energy, raysweep.plan.cost)
ENERGY_AXES = {"j_per_output_token": "J per output token", "net_j_per_output_token": "J per output token, net of idle",
               "j_per_total_token": "J per total token", "cost_per_m_output_tokens": "cost per million output tokens",
               "cost_per_m_total_tokens": "cost per million total tokens"}


PER = ("point", "run")


@dataclass
class ParetoResult:
    """Every usable run with `user_count`, `gpus`, `tokens_per_user`, `tokens_per_gpu` (and where the counts
    came from), the front (a subset of `means`, by tokens per user), notes on what was left out or derived, and
    `drawn_notes` on how the figure shows the runs (hollow, flagged, bars), which only a figure needs.
    `means`: per point, the mean of its runs that are not client-limited, `n_runs`, and each axis's 95 %
    interval across them (`<axis>_low`, `<axis>_high`; none for a single run); with `per="run"` the runs
    themselves (every run a point of its own)."""

    points: pd.DataFrame
    front: pd.DataFrame
    notes: list[str]
    y: str = PER_GPU  # the y axis: tokens_per_gpu, or one of ENERGY_AXES (lower is better)
    means: pd.DataFrame | None = None
    per: str = "point"
    drawn_notes: list[str] = field(default_factory=list)

    @property
    def y_label(self) -> str:
        return ENERGY_AXES.get(self.y, "output tokens/s per GPU")


def pareto(df: pd.DataFrame, user_count_var: str = CONCURRENCY, gpu_count_var: str = "gpu_count",
           filter_by: Sequence[str] = (), gpu_count: float | None = None, y: str = PER_GPU,
           per: str = "point") -> ParetoResult:
    """Tokens/s per user against tokens/s per GPU for every run, and the front of the non-dominated points
    (their means over runs; `per="run"`: of single runs).

    - users: `user_count_var`; where it is empty, 0 or infinite (a rate-limited run), the observed
      `max_concurrent_requests`, as vLLM does. Runs with neither are left out and counted.
    - GPUs: `gpu_count_var` as recorded. Where it is 0 or missing (a CPU-only cluster reserves no GPU; a
      vLLM sweep records none), tensor x pipeline x data parallel size from the record (sizes not recorded
      count as 1, as vLLM's plot_pareto does), said in the notes and in `gpus_from`. A table with neither (a
      single-GPU `vllm bench sweep` directory) counts 1 GPU per run as vLLM's plot_pareto does, said in the
      notes; `gpu_count` (the CLI's --gpu-count N) gives the count of the runs without a recorded one instead.
    - client-limited runs are kept in `points` but never on the front; ties that another run dominates
      (same tokens/s per GPU at fewer tokens/s per user) are not on the front.
    """
    if df.empty:
        raise UserError("OUTPUT_DIR: the results table has no finished run")
    if per not in PER:
        raise UserError(f"--per {per}: accepted: {', '.join(PER)}")
    check_columns(df, [user_count_var], "--user-count-var")
    check_columns(df, ["output_throughput"], "(needed by the Pareto plot)")
    if y != PER_GPU:
        if y not in ENERGY_AXES:
            raise UserError(f"--y {y}: accepted: {', '.join([PER_GPU, *ENERGY_AXES])}")
        check_columns(df, [y], "--y (measured where the GPUs' energy is read, or priced with cost:; docs/energy.md)")
    df = apply_filters(df, filter_by).copy()  # one block per dtype: a results table of many columns is fragmented
    users, user_from = _user_counts(df, user_count_var)
    gpus, gpus_from, notes = gpu_counts(df, gpu_count_var, gpu_count)
    pts = df.assign(user_count=users, user_count_from=user_from, gpus=gpus, gpus_from=gpus_from)
    usable = np.isfinite(pts["user_count"]) & (pts["user_count"] > 0)
    if (~usable).any():
        notes.append(f"{int((~usable).sum())} run(s) without a user count ({user_count_var} or "
                     "max_concurrent_requests) left out")
    pts = pts[usable]
    thr = pd.to_numeric(pts["output_throughput"], errors="coerce")
    pts = pts.assign(tokens_per_user=thr / pts["user_count"], tokens_per_gpu=thr / pts["gpus"],
                     client_limited=client_limited_mask(pts))
    drawn = _limited_note(pts, "on the front") + _flagged_note(pts)
    if y != PER_GPU:
        pts = pts.assign(**{y: pd.to_numeric(pts[y], errors="coerce")})
        if pts[y].isna().any():
            notes.append(f"{int(pts[y].isna().sum())} run(s) without {y} left off the front")
    candidates = pts[~pts["client_limited"] & (pts[y].notna() if y != PER_GPU else True)]
    if per == "run" or not set(_POINT) <= set(candidates.columns):
        means = candidates.assign(n_runs=1)
    else:
        means = point_means(candidates, y)
        if (means["n_runs"] > 1).any():
            drawn.append("the front is of point means over their runs (bars: 95 % intervals across runs)")
    return ParetoResult(pts.reset_index(drop=True), pareto_front(means, y), notes, y, means, per, drawn)


def point_means(runs: pd.DataFrame, y: str = PER_GPU) -> pd.DataFrame:
    """Per point (`serve_id`, `bench_id`), its first run's other columns with the mean over `runs` of the
    throughput, the counts and both axes, `n_runs`, and each axis's 95 % t-interval across runs."""
    axes = list(dict.fromkeys(["tokens_per_user", y]))
    averaged = [c for c in dict.fromkeys(("output_throughput", "user_count", "gpus", "tokens_per_gpu", *axes))
                if c in runs.columns]
    groups = runs.groupby(_POINT, sort=False, dropna=False)
    values = runs[averaged].apply(pd.to_numeric, errors="coerce")
    added = {**values.groupby([runs[c] for c in _POINT], sort=False, dropna=False).mean(), "n_runs": groups.size()}
    codes = groups.ngroup().to_numpy()  # a point's runs laid together, points in the group-by's order
    order = np.argsort(codes, kind="stable")
    cuts = np.searchsorted(codes[order], np.arange(groups.ngroups + 1))
    for axis in axes:  # each point's interval from its runs' values, as a pandas aggregate would pass them
        column = pd.to_numeric(runs[axis], errors="coerce").to_numpy(float)[order]
        ends = [mean_interval(column[a:b])[1:] for a, b in zip(cuts[:-1], cuts[1:])]
        added[f"{axis}_low"] = pd.Series([e[0] for e in ends], index=added["n_runs"].index, dtype=float)
        added[f"{axis}_high"] = pd.Series([e[1] for e in ends], index=added["n_runs"].index, dtype=float)
    firsts = groups.first().drop(columns=averaged, errors="ignore")
    return pd.concat([firsts, pd.DataFrame(added, index=firsts.index)], axis=1).reset_index()


def _user_counts(df: pd.DataFrame, var: str) -> tuple[pd.Series, pd.Series]:
    given = pd.to_numeric(df[var], errors="coerce")
    ok = np.isfinite(given) & (given > 0)
    seen = pd.to_numeric(df.get("max_concurrent_requests", pd.Series(np.nan, index=df.index)), errors="coerce")
    return given.where(ok, seen), pd.Series(np.where(ok, var, "max_concurrent_requests (observed)"), index=df.index)


PD_GPUS = "pd_gpus"  # a P/D deployment's GPUs, all roles together (raysweep.campaign.pd.Deployment.identity)


def gpu_counts(df: pd.DataFrame, var: str, fixed: float | None = None) -> tuple[pd.Series, pd.Series, list[str]]:
    """GPUs per run as recorded in `var`, else `fixed` (--gpu-count), else TP x PP x DP from the record, else 1
    as vLLM's plot_pareto takes it (see `pareto`). A run of a P/D deployment counts all its roles' GPUs
    (`pd_gpus`), so that a 4P1D deployment and a colocated server compare per GPU honestly."""
    if var != "gpu_count":
        check_columns(df, [var], "--gpu-count-var")
    elif PD_GPUS in df.columns:
        pd_gpus = pd.to_numeric(df[PD_GPUS], errors="coerce")
        is_pd = np.isfinite(pd_gpus) & (pd_gpus > 0)
        if is_pd.any():
            rest, rest_from, notes = gpu_counts(df.drop(columns=[PD_GPUS]), var, fixed)
            return (pd_gpus.where(is_pd, rest), rest_from.where(~is_pd, f"{PD_GPUS} (all roles of the deployment)"),
                    notes)
    recorded = pd.to_numeric(df[var], errors="coerce") if var in df.columns else pd.Series(np.nan, index=df.index)
    ok = np.isfinite(recorded) & (recorded > 0)
    if ok.all():
        return recorded, pd.Series(var, index=df.index), []
    missing = int((~ok).sum())
    if fixed is not None:
        if not fixed > 0:
            raise UserError(f"--gpu-count: must be a positive number of GPUs per run, got {fixed:g}")
        return (recorded.where(ok, float(fixed)), pd.Series(np.where(ok, var, "--gpu-count"), index=df.index),
                [f"{missing} run(s) have no {var}; their GPUs are --gpu-count {fixed:g}"])
    sizes = [c for c in _PARALLEL if c in df.columns]
    if not sizes:
        note = (f"{missing} run(s) have no {var} (0 or missing) and the table has none of {', '.join(_PARALLEL)}: "
                "each counts 1 GPU, as vLLM's plot_pareto takes it; --gpu-count N says otherwise")
        return recorded.where(ok, 1.0), pd.Series(np.where(ok, var, "1 (no record)"), index=df.index), [note]
    product = np.prod([pd.to_numeric(df[c], errors="coerce").fillna(1) for c in sizes], axis=0)
    source = " x ".join(_PARALLEL[c] for c in sizes) + " (record)"
    note = (f"{missing} run(s) have no {var} (0 or missing: no GPU reserved or recorded); their "
            f"GPUs are {' x '.join(sizes)} from the record" + ("" if len(sizes) == 3 else ", other sizes taken as 1"))
    return recorded.where(ok, product), pd.Series(np.where(ok, var, source), index=df.index), [note]


def pareto_front(points: pd.DataFrame, y: str = PER_GPU) -> pd.DataFrame:
    """The points no other point dominates (at least as good on both axes, better on one), by tokens per user.

    A tie on tokens per GPU at fewer tokens per user is dominated, and of two identical points one is kept
    (`raysweep.maths.pareto.pareto_front`, both axes maximized; `y` other than tokens per GPU is minimized).
    """
    xy = list(zip(points["tokens_per_user"].astype(float), points[y].astype(float), strict=True))
    keep = geometry.pareto_front(xy, ("maximize", "maximize" if y == PER_GPU else "minimize"), distinct=True)
    return points.iloc[keep].sort_values("tokens_per_user", ignore_index=True)

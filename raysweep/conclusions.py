"""What a campaign's results answer: per bench shape, the best configuration for an objective, how far it
leads the best other configuration and whether that lead exceeds the noise; the SLA capacities; the
Pareto front of each shape.

Built from the results table (`raysweep.results`, one row per run) and its per-point aggregates
(`raysweep.aggregate.summarize`, one row per point with mean and confidence interval per metric). A
*bench shape* is a combination of the bench parameters that vary, but the load variable (`max_concurrency`
or `request_rate`), the SLA search variable and parameters that only follow the load (a `num_prompts`
scaled with the concurrency). A *point* is a server config x bench point; its runs are its repeats.

The objective is a metric of the aggregates, optionally per GPU (`output_throughput_per_gpu`, the default:
output tokens/s divided by the GPUs of the config, as the Pareto plot counts them), maximised unless it is a
latency (`_ms`), a duration or a failure count; `min:`/`max:` in front of it says otherwise. The lead of the
best point over the best point of another configuration is beyond the noise when their confidence intervals
do not overlap (`aggregate.lead_is_significant`); with fewer than two runs on either side it is not judged.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from raysweep import aggregate, plots
from raysweep.errors import UserError

__all__ = ["CONFIDENCE", "Conclusions", "DEFAULT_OBJECTIVE", "Objective", "ShapeVerdict", "conclude",
           "finite", "fmt", "headlines", "parse_objective", "rounded", "shape_keys"]

log = logging.getLogger(__name__)

DEFAULT_OBJECTIVE = "output_throughput_per_gpu"
CONFIDENCE = 0.95
_PER_GPU = "_per_gpu"
_STATS = ("mean", "median", "std", "ci_low", "ci_high")
_POINT = ["serve_id", "bench_id"]
_LOWER_IS_BETTER = ("_ms", "_s", "duration", "failed", "error_rate", "num_preemptions")


@dataclass(frozen=True)
class Objective:
    """`metric` of the aggregates (divided by the config's GPUs when `per_gpu`), maximised or minimised."""

    metric: str
    per_gpu: bool = True
    maximize: bool = True

    @property
    def name(self) -> str:
        return self.metric + (_PER_GPU if self.per_gpu else "")

    @property
    def unit(self) -> str:
        """`tok/s`, `ms`, ... (empty when the metric has none)."""
        return plots.axis_label(self.metric)[len(self.metric):].strip(" ()")

    @property
    def text(self) -> str:
        """How the report names it: `output_throughput per GPU (tok/s, higher is better)`."""
        unit = self.unit
        return (f"{self.metric}{' per GPU' if self.per_gpu else ''} "
                f"({unit + ', ' if unit else ''}{'higher' if self.maximize else 'lower'} is better)")


def parse_objective(text: str | None, aggregated: Iterable[str]) -> Objective:
    """`[max:|min:]METRIC[_per_gpu]`, METRIC one of the `aggregated` metrics.

    :raises UserError: an unknown metric or direction (naming --objective and what is accepted).
    """
    raw = (text or DEFAULT_OBJECTIVE).strip()
    direction, _, name = raw.rpartition(":")
    if direction not in ("", "max", "min"):
        raise UserError(f"--objective {raw}: unknown direction {direction!r}; accepted: max:METRIC or min:METRIC")
    metrics = list(aggregated)
    per_gpu = name.endswith(_PER_GPU) and name not in metrics
    metric = name[: -len(_PER_GPU)] if per_gpu else name
    if metric not in metrics:
        accepted = ", ".join([DEFAULT_OBJECTIVE, *metrics]) if metrics else "(no metric was aggregated)"
        raise UserError(f"--objective {raw}: not an aggregated metric; accepted: {accepted} (any of them may end "
                        f"in {_PER_GPU}, and start with max: or min:)")
    maximize = direction == "max" or (not direction and not metric.endswith(_LOWER_IS_BETTER))
    return Objective(metric, per_gpu, maximize)


def shape_keys(df: pd.DataFrame, bench_vars: Sequence[str], load: str | None, sla_variable: str = "") -> list[str]:
    """The bench parameters that make a bench shape (see the module doc)."""
    keys = [v for v in bench_vars if v not in (load, sla_variable)]
    linked = set(plots.load_linked(df, load, keys))
    return [k for k in keys if k not in linked]


@dataclass
class ShapeVerdict:
    """One bench shape: the best point per server config (best first), the leader, its runner-up (the best
    point of another config, or the next point when there is one config) and what the noise allows."""

    shape: str
    ranking: pd.DataFrame
    leader: pd.Series
    runner_up: pd.Series | None
    significant: bool | None  # None: not judged (fewer than 2 runs on a side)
    lead: float | None        # relative lead of the leader over the runner-up, in the objective's direction


@dataclass
class Conclusions:
    """Everything the report's first section says."""

    objective: Objective
    load: str | None
    shape_keys: list[str]
    points: pd.DataFrame          # one row per point: labels, load, shape, gpus, objective stats, runs, noisy
    verdicts: list[ShapeVerdict]
    fronts: dict[str, pd.DataFrame]  # per shape, the Pareto front of the point means
    front_notes: list[str]
    sla: pd.DataFrame             # per bench point and target: the configs ranked by their capacity
    notes: list[str] = field(default_factory=list)

    @property
    def noisy(self) -> pd.DataFrame:
        return self.points[self.points["noisy"].fillna(False).astype(bool)] if len(self.points) else self.points


def conclude(df: pd.DataFrame, bench_vars: Sequence[str], objective: str | None = None,
             sla: pd.DataFrame | None = None, sla_variable: str = "", confidence: float = CONFIDENCE,
             summary: pd.DataFrame | None = None) -> Conclusions:
    """The conclusions of a results table (one row per run); see the module doc. `summary` is its
    `aggregate.summarize` (made here when not given).

    :raises UserError: the objective is not an aggregated metric.
    """
    if summary is None:
        summary = aggregate.summarize(df, confidence=confidence)
    aggregated = [c[: -len("_mean")] for c in summary.columns if c.endswith("_mean")]
    obj = parse_objective(objective, aggregated)
    load = plots.load_variable(df, "")
    keys = shape_keys(df, bench_vars, load or None, sla_variable)
    points, notes = _points(df, summary, obj, load or None, keys)
    verdicts = [_verdict(shape, rows, obj) for shape, rows in points.groupby("shape", sort=False)]
    fronts, front_notes = _fronts(df, points)
    return Conclusions(obj, load or None, keys, points, verdicts, fronts, front_notes,
                       _sla_capacities(sla if sla is not None else pd.DataFrame()), notes)


def _shape_label(keys: Sequence[str], values: Sequence[Any]) -> str:
    return ", ".join(f"{k}={plots.fmt_value(v)}" for k, v in zip(keys, values, strict=True)) or "all bench points"


def _points(df: pd.DataFrame, summary: pd.DataFrame, obj: Objective, load: str | None,
            keys: list[str]) -> tuple[pd.DataFrame, list[str]]:
    """One row per point with its labels, load, shape, GPUs and the objective's statistics (per GPU when
    asked), from the aggregates."""
    first = df.drop_duplicates(_POINT).reset_index(drop=True)
    gpus, _, notes = plots.gpu_counts(first, "gpu_count") if obj.per_gpu else (pd.Series(1.0, index=first.index),
                                                                                None, [])
    info = first[[c for c in (*_POINT, "serve_label", "bench_label", load, *keys) if c and c in first.columns]]
    info = info.loc[:, ~info.columns.duplicated()].assign(gpus=gpus.to_numpy())
    info["shape"] = [_shape_label(keys, row) for row in first[keys].itertuples(index=False, name=None)] \
        if keys else _shape_label([], [])
    stats = [f"{obj.metric}_{s}" for s in _STATS if f"{obj.metric}_{s}" in summary.columns]
    extra = [c for c in ("runs", "noisy", "noisy_metrics", "runs_needed", f"{obj.metric}_cv") if c in summary.columns]
    pts = info.merge(summary[[*_POINT, *stats, *extra]], on=_POINT, how="inner")
    for col in stats:
        pts[col.replace(obj.metric, "objective", 1)] = pd.to_numeric(pts[col], errors="coerce") / pts["gpus"]
    pts = pts.rename(columns={f"{obj.metric}_cv": "objective_cv"})
    pts = pts[np.isfinite(pd.to_numeric(pts["objective_mean"], errors="coerce"))]
    if keys:  # shapes in the order of their values
        order = sorted(range(len(pts)), key=lambda i: tuple(plots.sort_key(v) for v in pts[keys].iloc[i]))
        pts = pts.iloc[order]
    if obj.per_gpu:
        notes = [n.replace("run(s)", "point(s)", 1) for n in notes]
    return pts.reset_index(drop=True), notes


def _verdict(shape: str, rows: pd.DataFrame, obj: Objective) -> ShapeVerdict:
    ordered = rows.sort_values("objective_mean", ascending=not obj.maximize, kind="stable")
    ranking = ordered.drop_duplicates("serve_id").reset_index(drop=True)
    leader = ranking.iloc[0]
    others = ranking.iloc[1:] if len(ranking) > 1 else ordered.iloc[1:]
    runner = others.iloc[0] if len(others) else None
    if runner is None:
        return ShapeVerdict(shape, ranking, leader, None, None, None)
    a, b = float(leader["objective_mean"]), float(runner["objective_mean"])
    lead = (a - b) / abs(b) if b else None
    if lead is not None and not obj.maximize:
        lead = (b - a) / abs(b)
    judged = all(finite(r.get(c)) for r in (leader, runner) for c in ("objective_ci_low", "objective_ci_high"))
    significant = aggregate.lead_is_significant(leader, runner, "objective") if judged else None
    return ShapeVerdict(shape, ranking, leader, runner, significant, lead)


def finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _fronts(df: pd.DataFrame, points: pd.DataFrame) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """Per shape, the Pareto front (output tokens/s per user against per GPU) of the point means; runs
    marked client-limited stay out of the means."""
    if "output_throughput" not in df.columns or "max_concurrency" not in df.columns:
        return {}, ["no Pareto front: the results have no output_throughput or max_concurrency"]
    usable = df[~plots.client_limited_mask(df)]
    means = usable.groupby(_POINT, dropna=False)["output_throughput"].mean().rename("output_throughput")
    # one row per point; its runs' validity is the Warnings section's business, not the front's
    firsts = usable.drop(columns=["output_throughput", "validity_ok"], errors="ignore").drop_duplicates(_POINT)
    merged = firsts.merge(means.reset_index(), on=_POINT).merge(points[[*_POINT, "shape"]], on=_POINT)
    if merged.empty:
        return {}, []
    try:
        notes = [n.replace("run(s)", "point(s)", 1) for n in plots.pareto(merged.drop(columns=["shape"])).notes]
    except UserError as exc:
        return {}, [f"no Pareto front: {exc}"]
    fronts = {str(shape): plots.pareto(rows.drop(columns=["shape"])).front
              for shape, rows in merged.groupby("shape", sort=False)}
    return fronts, notes


def _sla_capacities(sla: pd.DataFrame) -> pd.DataFrame:
    """Per bench point and target, each config's largest passing value, best first (unbounded first, none
    last)."""
    if sla.empty or not set(plots.SLA_COLUMNS) <= set(sla.columns):
        return pd.DataFrame()
    value = pd.to_numeric(sla["largest_pass"], errors="coerce")
    ranked = sla.assign(_v=value.fillna(-math.inf)).sort_values(["bench_label", "target", "_v"],
                                                               ascending=[True, True, False], kind="stable")
    return ranked.drop(columns="_v").reset_index(drop=True)


# -- text ------------------------------------------------------------------------------------------------

def fmt(value: Any) -> str:
    """A measured value with 4 significant digits."""
    return f"{float(value):.4g}" if finite(value) else "n/a"


def rounded(value: Any) -> Any:
    """A measured value rounded to 4 significant digits (a number still), other values as they are."""
    return float(f"{float(value):.4g}") if finite(value) and not isinstance(value, (bool, np.bool_)) else value


def at_load(row: pd.Series, load: str | None) -> str:
    """`serve label at max_concurrency=32` (the load of the point, when the campaign sweeps one)."""
    where = f" at {load}={plots.fmt_value(row[load])}" if load and load in row.index else ""
    return f"{row.get('serve_label', row.get('serve_id'))}{where}"


def noise_text(verdict: ShapeVerdict) -> str:
    """Whether the lead exceeds the noise, in words."""
    if verdict.runner_up is None:
        return "nothing to compare it with"
    if verdict.significant is None:
        return "not judged: a point with fewer than 2 runs has no confidence interval"
    return ("beyond the noise: the confidence intervals do not overlap" if verdict.significant
            else "within the noise: the confidence intervals overlap")


def headlines(c: Conclusions) -> list[str]:
    """One line per bench shape: the winner, its value, its lead and whether the lead exceeds the noise."""
    lines = []
    for v in c.verdicts:
        lead = ""
        if v.runner_up is not None:
            amount = f"{v.lead:+.1%}" if v.lead is not None else "a lead"
            lead = f"; {amount} over {at_load(v.runner_up, c.load)} ({fmt(v.runner_up['objective_mean'])}), " \
                   f"{noise_text(v)}"
        lines.append(f"Best for {v.shape}: {at_load(v.leader, c.load)}, {c.objective.name} "
                     f"{fmt(v.leader['objective_mean'])} {c.objective.unit}".rstrip() + lead)
    return lines

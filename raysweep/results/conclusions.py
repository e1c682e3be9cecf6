"""What a campaign's results answer: per bench shape, the best configuration for an objective, which other
configurations cannot be told apart from it, the knee of its curve; the SLA capacities; the Pareto front of
each shape.

Built from the results table (`raysweep.results.table`, one row per run) and its per-point aggregates
(`raysweep.results.aggregate.summarize`, one row per point with mean and confidence interval per metric; client-limited
and flagged runs are left out of them and counted). A *bench shape* is a combination of the bench parameters
that vary, but the load variable (`max_concurrency` or `request_rate`), the SLA search variable and
parameters that only follow the load (a `num_prompts` scaled with the concurrency). A *point* is a server
config x bench point; its runs are its repeats.

The objective is a metric of the aggregates, optionally per GPU (`output_throughput_per_gpu`, the default:
output tokens/s divided by the GPUs of the config, as the Pareto plot counts them), maximised unless it is a
latency (`_ms`), a duration or a failure count; `min:`/`max:` in front of it says otherwise. A latency
objective ranks a point whose failed requests would reach its percentile (any failure for a mean) after
every point whose requests did not, as the SLA judge counts a failed request as infinitely slow.

With a service-level objective (the campaign's `slo:`), only points shown to meet it are ranked
(goodput-style): the 95 % interval of each threshold's metric inside its bound (`slo_judgement`: met,
missed or not shown; a latency percentile judged on its pooled requests where the raw samples are
kept); a shape where none is shown to meet it names no winner, only the nearest point. Per shape the
best point of each server config is ranked (a point whose runs all failed a check after every other: never
the leader); the leader is tested against every other one on their server starts' means (the one model of a
measurement, `raysweep.maths.hierarchy`: one server start each is "not compared"), Holm's correction over the
family (the leader is the best of many, `verdicts.tied_with_leader`): those not shown to be behind are *tied
with the leader*. A drift in the objective's runs withholds the verdict only where it is as large as the lead
its interval shows (`hierarchy.drift_could_decide`). The answer of the conclusions, computed once, is
`Conclusions.answer` (`raysweep.results.answer`). Without an slo, the
*knee* is the point of highest objective among those whose
median E2EL (else median TPOT, else median TTFT) is at most `KNEE_FACTOR` times the lowest of the shape.
Beside the best, each shape names its *cheapest* point (under the slo where there is one): the least
`cost_per_m_output_tokens` where the campaign has a `cost:` block, else the least `j_per_output_token` where
energy was measured (`CHEAPEST_METRICS`; docs/energy.md). Where a shape's points hold several P/D
deployments over several loads, a line says which deployment leads in which load region
(`raysweep.results.pd_regions`); beside it, once, any pair of deployments whose role servers' settings differ
beyond the campaign's declared sweep axes, or that their settings were not recorded, and a note for a
deployment whose decode servers prefilled requests again (`raysweep.results.pd_arms`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from raysweep.bench.load import CONCURRENCY
from raysweep.campaign.slo import Target
from raysweep.drive import hooks
from raysweep.errors import UserError, unknown_names
from raysweep.maths import hierarchy, verdicts
from raysweep.results import aggregate, pd_arms, pd_regions
from raysweep.results.front import gpu_counts, pareto, pareto_front
from raysweep.results.labels import axis_label, fmt_value, sort_key
from raysweep.results.rows import load_linked, load_variable

if TYPE_CHECKING:
    from raysweep.results.answer import Answer

__all__ = [
    "CHEAPEST_METRICS",
    "CONFIDENCE",
    "DEFAULT_OBJECTIVE",
    "KNEE_FACTOR",
    "Conclusions",
    "Objective",
    "ShapeVerdict",
    "conclude",
    "cheapest_text",
    "finite",
    "fmt",
    "by_load",
    "gpus_declared",
    "headlines",
    "load_lines",
    "parse_objective",
    "rounded",
    "shape_keys",
    "verdict_text",
]

log = logging.getLogger(__name__)

DEFAULT_OBJECTIVE = "output_throughput_per_gpu"
CONFIDENCE = 0.95
_PER_GPU = "_per_gpu"
_STATS = ("mean", "median", "std", "ci_low", "ci_high", "se", "df", "ci_level", "drift_pct_per_run", "drift_se",
          "drift_df", "drift_p")
_UNSCALED = ("_df", "_ci_level", "_drift_pct_per_run", "_drift_se", "_drift_p")   # not divided per GPU
_POINT = ["serve_id", "bench_id"]
_LOWER_IS_BETTER = ("_ms", "_s", "duration", "failed", "error_rate", "num_preemptions", "j_per_output_token",
                    "j_per_total_token", "_per_m_output_tokens", "_per_m_total_tokens", "energy_j", "energy_net_j")
# what a point costs, first found first: the cheapest configuration under the bound is named beside the best
CHEAPEST_METRICS = ("cost_per_m_output_tokens", "j_per_output_token")
KNEE_FACTOR = 2.0
CARD_LATENCIES = ("median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms")
_KNEE_LATENCIES = ("median_e2el_ms", "median_tpot_ms", "median_ttft_ms")
_RUN_COUNTS = ("runs", "runs_total", "runs_left_out", "left_out_reasons", "on_flagged_runs", "noisy",
               "noisy_metrics", "runs_needed", *aggregate.TIME_COLUMNS, "precision_state", "precision_rel_half_width",
               "ci_method", "server_starts", "warmup_text", "outlier_metrics")
_SLO_STATS = ("mean", "ci_low", "ci_high", "pooled", "pooled_ci_low", "pooled_ci_high")


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
        return axis_label(self.metric)[len(self.metric):].strip(" ()")

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
        if not metrics:
            raise UserError(f"--objective {raw}: not an aggregated metric; accepted: none (no metric was aggregated)")
        names = list(dict.fromkeys([DEFAULT_OBJECTIVE, *metrics]))
        raise UserError(unknown_names("--objective", [raw], [*names, *(m + _PER_GPU for m in metrics)],
                                      "aggregated metric")
                        + f" (any of them may end in {_PER_GPU}, and start with max: or min:)")
    maximize = direction == "max" or (not direction and not metric.endswith(_LOWER_IS_BETTER))
    return Objective(metric, per_gpu, maximize)


def shape_keys(df: pd.DataFrame, bench_vars: Sequence[str], load: str | None, sla_variable: str = "") -> list[str]:
    """The bench parameters that make a bench shape (see the module doc)."""
    keys = [v for v in bench_vars if v not in (load, sla_variable)]
    linked = set(load_linked(df, load, keys))
    return [k for k in keys if k not in linked]


@dataclass
class ShapeVerdict:
    """One bench shape: the best point per server config (best first; under an slo only points meeting it),
    the leader, its runner-up (the best point of another config, or the next point when there is one
    config), the candidates tied with the leader, and the knee."""

    shape: str
    ranking: pd.DataFrame
    leader: pd.Series
    runner_up: pd.Series | None
    significant: bool | None  # the leader is shown better than the runner-up (Holm); None: not judged
    lead: float | None        # relative lead of the leader over the runner-up, in the objective's direction
    tied: list[str] = field(default_factory=list)        # the configs (at their best load) tied with the leader
    p_value: float | None = None                           # Holm-adjusted, leader against runner-up
    flagged: bool = False     # a run of the leader or the runner-up was left out or all their runs are flagged
    slo_met: bool | None = None  # None: no slo; False: no point of the shape meets it (ranked without it)
    knee: pd.Series | None = None
    knee_bound: str = ""
    cheapest: pd.Series | None = None  # the point of least cost (else energy) per output token, under the slo
    cheapest_metric: str = ""
    test: str = verdicts.WELCH   # the test that decided the leader against the runner-up
    drifting: bool = False       # the leader's or the runner-up's runs drift over their order (shown, not a veto)
    against: verdicts.Verdict | None = None  # the leader against the runner-up (the model), the lead with its interval
    all_flagged: bool = False    # every configuration's runs failed a check: no leader is named
    nearest: str = ""            # with an slo no point is shown to meet: the nearest point and its interval
    confirmation: Any = None  # raysweep.confirm.verdict.Confirmation: the leader and runner-up measured again, fresh
    selection: str = ""       # with a confirmation, what the sweep's own test said (the verdict is the confirmation's)
    cheapest_tied: list[str] = field(default_factory=list)  # configs not shown to cost more (Welch's t, Holm)

    @property
    def clear(self) -> bool:
        """A verdict shown in green: the leader beats every other config (with a confirmation: the confirmation
        shows it better than the runner-up), none of their runs is flagged, and neither drifts."""
        if self.all_flagged:
            return False
        if self.confirmation is not None:
            return bool(self.confirmation.significant) and not self.flagged and self.slo_met is not False
        return bool(self.significant) and not self.tied and not self.flagged and self.slo_met is not False


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
    slo: Target | None = None
    single_config: bool = False   # one server config (an endpoint) swept over loads: judged by load, not config
    deployments: dict[str, str] = field(default_factory=dict)  # P/D deployments by serve_id (`pd_regions`)
    # whether the deployments differ only where declared, and any that prefilled requests again (`pd_arms`)
    arms: list[str] = field(default_factory=list)
    failed_points: int = 0        # points of the campaign that failed (no record: in no ranking), as `status` counts
    _answer: Answer | None = None

    @property
    def answer(self) -> Any:
        """The campaign's answer (`raysweep.results.answer.Answer`), computed once from these conclusions."""
        if self._answer is None:
            import sys

            from raysweep.results.answer import build

            self._answer = build(self, sys.modules[__name__])
        return self._answer

    @property
    def noisy(self) -> pd.DataFrame:
        return self.points[self.points["noisy"].fillna(False).astype(bool)] if len(self.points) else self.points


def conclude(df: pd.DataFrame, bench_vars: Sequence[str], objective: str | None = None,
             sla: pd.DataFrame | None = None, sla_variable: str = "", confidence: float = CONFIDENCE,
             summary: pd.DataFrame | None = None, slo: Target | None = None,
             serve_params: Iterable[Mapping[str, Any]] = (), failed_points: int = 0) -> Conclusions:
    """The conclusions of a results table (one row per run); see the module doc. `summary` is its
    `aggregate.summarize` (made here when not given); `slo` the campaign's service-level objective;
    `serve_params` its serve parameter combinations, whose names are the declared sweep axes that P/D
    deployments may differ in (`pd_arms`; none given: any difference is flagged).

    :raises UserError: the objective is not an aggregated metric.
    """
    if summary is None:
        summary = aggregate.summarize(df, confidence=confidence)
    df, confirming = _without_confirmation(df)
    if len(confirming):
        summary = summary[~summary["bench_id"].isin(set(confirming["bench_id"]))].reset_index(drop=True)
    aggregated = [c[: -len("_mean")] for c in summary.columns if c.endswith("_mean")]
    gpu_note = []
    if objective is None and not gpus_declared(df):
        objective = DEFAULT_OBJECTIVE[: -len(_PER_GPU)]
        gpu_note = [f"No GPU count is declared or discovered for these runs (an endpoint declares it with "
                    f"serve.gpus): ranked by {objective}, not per GPU"]
    obj = parse_objective(objective, aggregated)
    load = load_variable(df, "")
    keys = shape_keys(df, bench_vars, load or None, sla_variable)
    points, notes = _points(df, summary, obj, load or None, keys, slo)
    verdicts_ = [_verdict(shape, rows, obj, slo, df, load or None)
                 for shape, rows in points.groupby("shape", sort=False)]
    if len(confirming):  # the confirmation's fresh runs give the verdicts (raysweep.confirm lends it)
        confirmed = hooks.confirmed()
        for v in verdicts_:
            confirmed(v, confirming, obj, confidence)
    fronts, front_notes = _fronts(df, points)
    single = bool(load) and "serve_id" in df.columns and df["serve_id"].nunique() == 1
    deployments = pd_regions.deployment_names(df)
    return Conclusions(obj, load or None, keys, points, verdicts_, fronts, front_notes,
                       _sla_capacities(sla, df),
                       [*gpu_note, *notes], slo, single, deployments,
                       [*pd_arms.arm_lines(df, deployments, serve_params),
                        *pd_arms.prefilled_again_lines(df, deployments, load or None)], failed_points)


def _sla_capacities(sla: pd.DataFrame | None, df: pd.DataFrame) -> pd.DataFrame:
    """Per bench point and target, the configs ranked by their SLA capacity (`raysweep.sla.capacities`, lent
    through `raysweep.drive.hooks`); empty without SLA searches."""
    return hooks.sla_capacities()(sla, df) if sla is not None and not sla.empty else pd.DataFrame()


def gpus_declared(df: pd.DataFrame) -> bool:
    """Every run records its GPUs (`gpu_count` > 0: GPUs raysweep reserved, or an endpoint's `serve.gpus`)."""
    if "gpu_count" not in df.columns or df.empty:
        return False
    counts = pd.to_numeric(df["gpu_count"], errors="coerce")
    return bool((np.isfinite(counts) & (counts > 0)).all())


def _without_confirmation(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The sweep's runs, and the runs of the winner's confirmation (`raysweep.confirm`: `phase` confirm)."""
    if "phase" not in df.columns:
        return df, df.iloc[0:0]
    mask = (df["phase"] == "confirm").fillna(False).astype(bool)
    return df[~mask].reset_index(drop=True), df[mask].reset_index(drop=True)


def _shape_label(keys: Sequence[str], values: Sequence[Any]) -> str:
    return ", ".join(f"{k}={fmt_value(v)}" for k, v in zip(keys, values, strict=True)) or "all bench points"


def _points(df: pd.DataFrame, summary: pd.DataFrame, obj: Objective, load: str | None,
            keys: list[str], slo: Target | None = None) -> tuple[pd.DataFrame, list[str]]:
    """One row per point with its labels, load, shape, GPUs and the objective's statistics (per GPU when
    asked), from the aggregates; its run counts, the card's latencies, whether it meets the slo and whether
    its failed requests rank it last."""
    first = df.drop_duplicates(_POINT).reset_index(drop=True)
    gpus, _, notes = gpu_counts(first, "gpu_count") if obj.per_gpu else (pd.Series(1.0, index=first.index),
                                                                                None, [])
    info = first[[c for c in (*_POINT, "serve_label", "bench_label", load, *keys) if c and c in first.columns]]
    info = info.loc[:, ~info.columns.duplicated()].assign(gpus=gpus.to_numpy())
    info["shape"] = [_shape_label(keys, row) for row in first[keys].itertuples(index=False, name=None)] \
        if keys else _shape_label([], [])
    stats = [f"{obj.metric}_{s}" for s in _STATS if f"{obj.metric}_{s}" in summary.columns]
    wanted = {*CARD_LATENCIES, *_KNEE_LATENCIES, *(t.metric for t in (slo.thresholds if slo else ()))}
    means = [f"{m}_mean" for m in sorted(wanted) if f"{m}_mean" in summary.columns and f"{m}_mean" not in stats]
    means += [f"{m}_{st}" for m in CHEAPEST_METRICS for st in ("mean", "std", "ci_low", "ci_high", "se", "df")
              if f"{m}_{st}" in summary.columns and f"{m}_{st}" not in (*stats, *means)]
    means += [f"{t.metric}_{k}" for t in (slo.thresholds if slo else ()) for k in _SLO_STATS[1:]
              if f"{t.metric}_{k}" in summary.columns and f"{t.metric}_{k}" not in stats + means]
    extra = [c for c in (*_RUN_COUNTS, "ci_level", "value_issues", f"{obj.metric}_cv") if c in summary.columns]
    pts = info.merge(summary[[*_POINT, *stats, *extra, *means]], on=_POINT, how="inner")
    for col in stats:   # per GPU where asked (degrees of freedom are not divided)
        scale = 1.0 if col.endswith(_UNSCALED) else pts["gpus"]
        pts[col.replace(obj.metric, "objective", 1)] = pd.to_numeric(pts[col], errors="coerce") / scale
    pts = pts.rename(columns={f"{obj.metric}_cv": "objective_cv"})
    pts = pts[np.isfinite(pd.to_numeric(pts["objective_mean"], errors="coerce"))]
    pts = pts.assign(failed_last=_failed_last(df, pts, obj))
    if slo is not None:
        judged = [slo_judgement(r, slo) for _, r in pts.iterrows()]
        pts = pts.assign(slo_verdict=[j[0] for j in judged], slo_text=[j[1] for j in judged],
                         slo_excess=[j[2] for j in judged])
        pts = pts.assign(meets_slo=pts["slo_verdict"] == "met")
    if keys:  # shapes in the order of their values
        shapes = pts[keys]  # once: a column selection per row cost seconds at 1,000 points
        order = sorted(range(len(pts)), key=lambda i: tuple(sort_key(v) for v in shapes.iloc[i]))
        pts = pts.iloc[order]
    if obj.per_gpu:
        notes = [n.replace("run(s)", "point(s)", 1) for n in notes]
    return pts.reset_index(drop=True), notes


def _failed_last(df: pd.DataFrame, pts: pd.DataFrame, obj: Objective) -> list[bool]:
    """Per point, whether a latency objective ranks it last: its failed requests (over the runs used, as a
    fraction of all requests) would reach the objective's percentile (any failure for a mean)."""
    stat = obj.metric.split("_", 1)[0]
    if obj.maximize or not obj.metric.endswith("_ms") or "failed" not in df.columns:
        return [False] * len(pts)
    q = 50.0 if stat == "median" else float(stat[1:]) if stat.startswith("p") else 100.0
    used = df[~aggregate.left_out_mask(df)] if (~aggregate.left_out_mask(df)).any() else df
    failed = pd.to_numeric(used["failed"], errors="coerce").fillna(0)
    done = pd.to_numeric(used.get("completed", pd.Series(0, index=used.index)), errors="coerce").fillna(0)
    frac = (failed.groupby([used[k] for k in _POINT]).sum()
            / (failed + done).groupby([used[k] for k in _POINT]).sum().replace(0, np.nan)).fillna(0)
    limit = (100.0 - q) / 100.0
    return [float(frac.get((r["serve_id"], r["bench_id"]), 0.0)) > limit if q < 100 else
            float(frac.get((r["serve_id"], r["bench_id"]), 0.0)) > 0 for _, r in pts.iterrows()]


def slo_judgement(row: pd.Series, slo: Target) -> tuple[str, str, float]:
    """Whether a point meets the slo: `met` when the interval of every threshold's metric lies inside its
    bound, `missed` when one lies outside, `not shown` otherwise (`over_time.bound_verdict`); a latency
    percentile is judged on the interval of the pooled requests' percentile (a bootstrap over runs, then
    requests) where the point kept its raw samples, else on the t-interval of its per-run percentiles.
    Returns the word, the thresholds in words and how far the worst estimate lies past its bound (a
    fraction of the bound, negative when inside: the nearest point is the one with the least)."""
    from raysweep.maths import over_time

    words, texts, excess = [], [], -math.inf
    for t in slo.thresholds:
        pooled = finite(row.get(f"{t.metric}_pooled_ci_low")) and finite(row.get(f"{t.metric}_pooled_ci_high"))
        pre = f"{t.metric}_pooled" if pooled else f"{t.metric}_mean"
        low, high = (row.get(f"{t.metric}_pooled_ci_low"), row.get(f"{t.metric}_pooled_ci_high")) if pooled \
            else (row.get(f"{t.metric}_ci_low"), row.get(f"{t.metric}_ci_high"))
        value = row.get(pre)
        word = over_time.bound_verdict(low, high, t.op, t.bound)
        words.append(word)
        how = "pooled requests" if pooled else "mean of runs"
        texts.append(f"{t.metric} {fmt(value)} ({CONFIDENCE:.0%} CI {fmt(low)} to {fmt(high)}, {how}) against "
                     f"{t.op}{t.bound:g}: {word}")
        if finite(value):
            past = (float(value) - t.bound) / t.bound
            excess = max(excess, past if t.op in ("<=", "<") else -past)
        else:
            excess = math.inf
    word = "missed" if "missed" in words else "met" if words and all(w == "met" for w in words) else "not shown"
    return word, "; ".join(texts), excess


def _nearest(rows: pd.DataFrame, load: str | None = None) -> str:
    """The point nearest to meeting the slo, with its thresholds' intervals."""
    if "slo_excess" not in rows.columns or rows.empty:
        return ""
    best = rows.assign(_e=pd.to_numeric(rows["slo_excess"], errors="coerce").fillna(math.inf)) \
        .sort_values("_e", kind="stable").iloc[0]
    return f"{at_load(best, load)}: {best.get('slo_text')}"


def _verdict(shape: str, rows: pd.DataFrame, obj: Objective, slo: Target | None = None,
             df: pd.DataFrame | None = None, load: str | None = None) -> ShapeVerdict:
    slo_met = None
    nearest = ""
    if slo is not None:
        meeting = rows[rows["meets_slo"]]
        slo_met = bool(len(meeting))
        if not len(meeting):   # none shown to meet it: no winner; the nearest is named
            nearest = _nearest(rows, load)
            near = rows.assign(_e=pd.to_numeric(rows["slo_excess"], errors="coerce").fillna(math.inf)) \
                .sort_values("_e", kind="stable").drop(columns="_e")
            leader = near.iloc[0]
            return ShapeVerdict(shape, near.drop_duplicates("serve_id").reset_index(drop=True), leader, None, None,
                                None, slo_met=False, flagged=_flagged(leader), nearest=nearest,
                                drifting=_drifts(leader))
        rows = meeting
    cheapest, cheap_metric, cheap_tied = _cheapest(rows, load)
    sign = -1.0 if obj.maximize else 1.0
    # a point whose runs all failed a check ranks after every point with runs that passed: never the leader
    ordered = rows.assign(_key=sign * pd.to_numeric(rows["objective_mean"], errors="coerce"),
                          _flag=_all_flagged(rows)) \
        .sort_values(["_flag", "failed_last", "_key"], kind="stable").drop(columns=["_key", "_flag"])
    ranking = ordered.drop_duplicates("serve_id").reset_index(drop=True)
    leader = ranking.iloc[0]
    everything_flagged = bool(leader.get("on_flagged_runs") == True)  # noqa: E712 (numpy's bool too)
    knee, bound = _knee(rows, obj) if slo is None else (None, "")
    others = ranking.iloc[1:] if len(ranking) > 1 else ordered.iloc[1:]
    runner = others.iloc[0] if len(others) else None
    if runner is None:
        return ShapeVerdict(shape, ranking, leader, None, None, None, slo_met=slo_met, knee=knee, knee_bound=bound,
                            flagged=_flagged(leader), cheapest=cheapest, cheapest_metric=cheap_metric,
                            cheapest_tied=cheap_tied, all_flagged=everything_flagged)
    a, b = float(leader["objective_mean"]), float(runner["objective_mean"])
    lead = (a - b) / abs(b) if b else None
    if lead is not None and not obj.maximize:
        lead = (b - a) / abs(b)
    family = ranking if len(ranking) > 1 else ordered.reset_index(drop=True).iloc[:2]
    if not bool(leader.get("failed_last")):   # failed-last points are behind by rule, not by test
        family = family[~family["failed_last"].astype(bool)]
    family = family[~_all_flagged(family)] if not everything_flagged else family
    drifting = _drifts(leader) or _drifts(runner)
    against = hierarchy.compare(_estimate(runner), _estimate(leader), obj.maximize)
    if len(family) < 2:
        return ShapeVerdict(shape, ranking, leader, runner, True, lead, [], None, _flagged(leader) or
                            _flagged(runner), slo_met, knee, bound, cheapest, cheap_metric, drifting=drifting,
                            cheapest_tied=cheap_tied, against=against, all_flagged=everything_flagged)
    family = family.reset_index(drop=True)
    estimates = [_estimate(r) for _, r in family.iterrows()]
    led = verdicts.tied_with_leader([(e.mean, math.nan, e.runs) for e in estimates], obj.maximize,
                                    paired=_model_test(estimates, obj.maximize))
    significant = None if 1 in led.not_judged else (1 in led.behind)
    if significant:   # a drift or a step decides only where it is as large as the lead's shown part
        significant = not _drift_could_decide(against, leader, runner, obj.maximize)
    tied = [at_load(family.iloc[i], None) for i in led.tied]
    return ShapeVerdict(shape, ranking, leader, runner, significant, lead, tied, led.adjusted_p.get(1),
                        _flagged(leader) or _flagged(runner), slo_met, knee, bound, cheapest, cheap_metric,
                        hierarchy.MODEL, drifting, cheapest_tied=cheap_tied, against=against,
                        all_flagged=everything_flagged)


def _estimate(row: pd.Series) -> hierarchy.Estimate:
    """A point's objective under the model (`raysweep.maths.hierarchy`), as the summary holds it."""
    def num(key: str) -> float:
        v = row.get(key)
        return float(v) if finite(v) else math.nan

    starts, runs = row.get("server_starts"), row.get("runs")
    return hierarchy.Estimate(num("objective_mean"), num("objective_se"), num("objective_df"),
                              int(starts) if finite(starts) else 1, int(runs) if finite(runs) else 0)


def _all_flagged(rows: pd.DataFrame) -> pd.Series:
    if "on_flagged_runs" not in rows.columns:
        return pd.Series(False, index=rows.index)
    return rows["on_flagged_runs"].fillna(False).astype(bool)


def _drift_could_decide(against: verdicts.Verdict, leader: pd.Series, runner: pd.Series, maximize: bool) -> bool:
    """Whether a drift could have made the verdict (`hierarchy.drift_could_decide`). The configurations of one
    campaign are measured in interleaved blocks, so a drift of the machine that both share cancels between them:
    what can make the verdict is the difference of their drifts, where Student's t-test of the two slopes shows
    one (`hierarchy.drift_apart`). Where a side's slope has no standard error (a summary written before it had
    one), either side's own drift counts, as it did."""
    def pct(r: pd.Series) -> Any:
        own = r.get("objective_drift_pct_per_run")
        return own if finite(own) else r.get("drift_pct_per_run")

    sides = [(r.get("objective_drift_pct_per_run"), r.get("objective_drift_se"), r.get("objective_drift_df"))
             for r in (leader, runner)]
    if all(finite(v) for side in sides for v in side):
        (pa, sa, da), (pb, sb, db) = ((float(v) for v in side) for side in sides)
        runs = max(float(r.get("runs")) if finite(r.get("runs")) else 1.0 for r in (leader, runner))
        drift = hierarchy.drift_apart(pa, sa, da, pb, sb, db, runs)
    else:
        drift = max(hierarchy.drift_total(pct(r), r.get("runs"), _drifts(r)) for r in (leader, runner))
    return hierarchy.drift_could_decide(against, drift, maximize)


def _drifts(row: pd.Series | None) -> bool:
    """Whether the objective's own runs drift over their order (its trend test at 5 %; the first rate metric's
    where the summary has no per-metric trend)."""
    if row is None:
        return False
    p = row.get("objective_drift_p")
    if finite(p):
        return float(p) < verdicts.ALPHA
    return row.get("drift") == "drifts"


def _cheapest(rows: pd.DataFrame, load: str | None = None) -> tuple[pd.Series | None, str, list[str]]:
    """The point of least cost per million output tokens (else least energy per output token) among
    `rows` (those meeting the slo where one is set; never a point its failures rank last), the metric, and the
    other configurations (each at its cheapest point) not shown to cost more: the model's test on their server
    starts' means (`hierarchy.compare`; one start each: not compared, so tied), Holm over them
    (`verdicts.tied_with_leader`, lower is better)."""
    for metric in CHEAPEST_METRICS:
        col = f"{metric}_mean"
        if col not in rows.columns:
            continue
        values = pd.to_numeric(rows[col], errors="coerce")
        ok = rows[values.notna() & ~rows["failed_last"].astype(bool)]
        if not len(ok):
            continue
        best = ok.assign(_c=pd.to_numeric(ok[col], errors="coerce")).sort_values("_c", kind="stable") \
            .drop(columns="_c").drop_duplicates("serve_id").reset_index(drop=True)
        if len(best) < 2:
            return best.iloc[0], metric, []
        costs = [hierarchy.Estimate.of_row(r, metric) for _, r in best.iterrows()]
        led = verdicts.tied_with_leader([(e.mean, math.nan, e.runs) for e in costs], higher_is_better=False,
                                        paired=_model_test(costs, False))
        return best.iloc[led.leader], metric, [at_load(best.iloc[i], load) for i in led.tied + led.not_judged]
    return None, "", []


def _model_test(estimates: list[hierarchy.Estimate], maximize: bool) -> Any:
    """A function (leader, other) -> the model's verdict of the leader against the other (p-value only)."""
    def test(lead: int, other: int) -> verdicts.Verdict:
        return hierarchy.compare(estimates[other], estimates[lead], maximize, alpha=1.0)

    return test


def _flagged(row: pd.Series) -> bool:
    left = row.get("runs_left_out")
    return bool(row.get("on_flagged_runs") is True or (finite(left) and float(left) > 0))


def _knee(rows: pd.DataFrame, obj: Objective) -> tuple[pd.Series | None, str]:
    """The point of best objective among those whose median E2EL (else TPOT) is within `KNEE_FACTOR` of the
    shape's lowest, and the bound in words; None when the shape has no such latency."""
    for metric in _KNEE_LATENCIES:
        col = f"{metric}_mean"
        if col not in rows.columns:
            continue
        lat = pd.to_numeric(rows[col], errors="coerce")
        if not lat.notna().any():
            continue
        limit = KNEE_FACTOR * float(lat.min())
        within = rows[(lat <= limit) & ~rows["failed_last"].astype(bool)]
        if within.empty:
            return None, ""
        best = within.sort_values("objective_mean", ascending=not obj.maximize, kind="stable").iloc[0]
        return best, f"{metric} <= {fmt(limit)} ms ({KNEE_FACTOR:g}x the lowest of the shape)"
    return None, ""


def finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _fronts(df: pd.DataFrame, points: pd.DataFrame) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """Per shape, the Pareto front (output tokens/s per user against per GPU) of the point means, as
    `raysweep pareto` and the report's figure draw it (`pareto`); runs marked client-limited stay out
    of the means."""
    if "output_throughput" not in df.columns or CONCURRENCY not in df.columns:
        return {}, ["no Pareto front: the results have no output_throughput or max_concurrency"]
    # the runs' validity is the Warnings section's business, not the front's
    runs = df.drop(columns=["validity_ok"], errors="ignore").merge(points[[*_POINT, "shape"]], on=_POINT)
    if runs.empty:
        return {}, []
    try:
        whole = pareto(runs)   # the point means once: each shape's front is that of its own points' means
    except UserError as exc:
        return {}, [f"no Pareto front: {exc}"]
    means = whole.means if whole.means is not None else runs.iloc[0:0]
    fronts = {str(shape): pareto_front(means[means["shape"] == shape].drop(columns=["shape"]).reset_index(drop=True))
              for shape in runs["shape"].unique()}
    return fronts, whole.notes


# -- text ------------------------------------------------------------------------------------------------

def level_of(row: pd.Series, prefix: str = "objective") -> float:
    """The real level of a point's interval of `prefix` (the objective by default): its own where the summary
    gives one (`M_ci_level`: `bench.precision` reports its metric at a raised level), else the summary's."""
    for key in (f"{prefix}_ci_level", "ci_level"):
        v = row.get(key)
        if finite(v):
            return float(v)
    return CONFIDENCE


def level_text(level: float) -> str:
    """`95 %`, `97.5 %`."""
    return f"{100.0 * level:.4g} %"


def fmt(value: Any) -> str:
    """A measured value with 4 significant digits."""
    return f"{float(value):.4g}" if finite(value) else "n/a"


def rounded(value: Any) -> Any:
    """A measured value rounded to 4 significant digits (a number still), other values as they are."""
    return float(f"{float(value):.4g}") if finite(value) and not isinstance(value, (bool, np.bool_)) else value


def at_load(row: pd.Series, load: str | None) -> str:
    """`serve label at max_concurrency=32` (the load of the point, when the campaign sweeps one)."""
    where = f" at {load}={fmt_value(row[load])}" if load and load in row.index else ""
    return f"{row.get('serve_label', row.get('serve_id'))}{where}"


def verdict_text(verdict: ShapeVerdict, drift_note: bool = True) -> str:
    """What the model shows of the leader against the others, in words: the lead over the runner-up with its
    interval and real level, then the verdict (`drift_note`: with a drift shown in their runs)."""
    if verdict.all_flagged:
        return "no leader: every configuration's runs failed a check (see Warnings)"
    if verdict.runner_up is None:
        return "nothing to compare it with"
    drift = ("; the runs of the leader or the runner-up drift over their order (see Warnings)"
             if verdict.drifting and drift_note else "")
    if verdict.confirmation is not None:
        return (verdict.confirmation.text() + (f" (in the sweep: {verdict.selection})" if verdict.selection else "")
                + drift)
    v = verdict.against
    lead = f"lead {v.lead_text}; " if v is not None and v.lead_text and v.word in ("better", "worse", "not shown") \
        else ""
    if verdict.significant is None:
        why = v.text if v is not None else "not judged"
        return f"{why} (still measured and ranked)" + drift
    if verdict.tied:
        return (f"{lead}not shown better: tied with the leader: {', '.join(verdict.tied)} "
                f"({verdict.test}, Holm over the configs)" + drift)
    if not verdict.significant:
        return f"{lead}not shown: a drift in their runs is as large as the lead it would show" + drift
    p = f", adjusted p={verdict.p_value:.2g}" if verdict.p_value is not None else ""
    return f"{lead}better than every other config ({verdict.test}, Holm over the configs{p})" + drift


def noise_text(verdict: ShapeVerdict) -> str:
    """The former name of `verdict_text`."""
    return verdict_text(verdict)


def cheapest_text(v: ShapeVerdict) -> str:
    """`cost_per_m_output_tokens 0.412 (95 % CI 0.40 to 0.43)` of a shape's cheapest point."""
    row, m = v.cheapest, v.cheapest_metric
    if row is None:
        return ""
    lo, hi = row.get(f"{m}_ci_low"), row.get(f"{m}_ci_high")
    ci = f" ({CONFIDENCE:.0%} CI {fmt(lo)} to {fmt(hi)})" if finite(lo) and finite(hi) else ""
    tied = f"; not shown to cost less than {', '.join(v.cheapest_tied)}" if v.cheapest_tied else ""
    return f"{m} {fmt(row[f'{m}_mean'])}{ci}{tied}"


def by_load(c: Conclusions, v: ShapeVerdict) -> pd.DataFrame:
    """The points of a shape in the order of their load (one server config: its curve)."""
    rows = c.points[c.points["shape"] == v.shape]
    if c.load and c.load in rows.columns:
        order = sorted(range(len(rows)), key=lambda i: sort_key(rows[c.load].iloc[i]))
        rows = rows.iloc[order]
    return rows


def load_lines(c: Conclusions) -> list[str]:
    """One server config swept over loads (an endpoint): per shape its capacity (the load of highest mean
    objective, with its interval), its knee and the latencies at each load; never one load "better" than
    another as if they were configs."""
    from raysweep.results.answer import number, point_words  # the answer's one wording of a value

    lines = []
    for v in c.verdicts:
        top, unit = v.leader, f" {c.objective.unit}".rstrip()
        said = point_words(top, level_of(top), c.objective.unit)
        word = "highest" if c.objective.maximize else "lowest"
        lines.append(f"Capacity for {v.shape}: {c.objective.name} {said} at "
                     f"{c.load}={fmt_value(top[c.load])}, the {word} mean of "
                     f"{len(by_load(c, v))} load(s)" + ("; some of its runs were flagged" if v.flagged else "")
                     + ("; its runs drift over their order" if v.drifting else ""))
        if v.knee is not None:
            lines.append(f"Knee for {v.shape}: {c.load}={fmt_value(v.knee[c.load])}, {c.objective.name} "
                         f"{number(v.knee['objective_mean'])}{unit} (the best among loads with {v.knee_bound})")
        steps = []
        for _, r in by_load(c, v).iterrows():
            lat = ", ".join(f"{m[:-3].replace('_', ' ')} {fmt(r.get(f'{m}_mean'))} ms"
                            for m in CARD_LATENCIES[::2] if finite(r.get(f"{m}_mean")))
            steps.append(f"{fmt_value(r[c.load])}: {number(r['objective_mean'])}{unit}"
                         + (f", {lat}" if lat else ""))
        lines.append(f"By {c.load} for {v.shape}: " + "; ".join(steps))
    return lines


def headlines(c: Conclusions, verbose: bool = False) -> list[str]:
    """The campaign's answer in words (`raysweep.results.answer`, made once per conclusions): one plain line per
    bench shape (with its tests and p-values under `verbose`), then the cheapest points, the P/D regions and
    notes."""
    return c.answer.lines(verbose)


def extra_lines(c: Conclusions) -> list[str]:
    """The lines beside the shapes' answers: each shape's cheapest point and P/D load regions, then the notes on
    the deployments' arms."""
    lines, said_arms = [], False
    for v in c.verdicts:
        if v.cheapest is not None and (c.slo is None or v.slo_met):
            lines.append(f"Cheapest for {v.shape}{' under the slo' if v.slo_met else ''}: "
                         f"{at_load(v.cheapest, c.load)}, {cheapest_text(v)}")
        regions = pd_regions.region_line(c.points[c.points["shape"] == v.shape], c.deployments, c.load, v.shape,
                                         c.objective.maximize, c.slo is not None)
        if regions:
            lines.append(regions)
            if c.arms and not said_arms:  # once, next to the first region line
                lines += c.arms
                said_arms = True
    return lines if said_arms else [*lines, *c.arms]

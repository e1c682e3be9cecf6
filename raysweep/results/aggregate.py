"""Aggregates per point over its runs: mean, median, spread and confidence interval of the headline metrics.

A point is one server configuration x one bench point (`serve_id`, `bench_id`); its runs are the rows of the results
table that share them. Runs that are client-limited or fail a validity check are left out of the statistics
(`left_out_mask`; `runs` counts the runs used, `runs_total` all of them, `runs_left_out` and `left_out_reasons` the
others by check); a point whose runs are all flagged keeps them, and says so in `on_flagged_runs`. For each headline
metric M (`HEADLINE_RATES` and the mean, median and percentile columns of TTFT, TPOT, ITL and E2EL, as the results
name them) `summarize` gives `M_mean`, `M_median`, `M_std` (sample standard deviation over the runs), `M_cv` (std /
|mean|), and the point's value under the one model of a measurement (`raysweep.maths.hierarchy`): `M_mean` the mean
over its server starts (`server_id`) of each start's mean, `M_se` and `M_df` its standard error and degrees of
freedom (over starts; over the runs of its one start where it has one), `M_ci_low`, `M_ci_high` Student's t on them
(`confidence`, two-sided, in `ci_level`; one run has no interval; a rate's or a latency's never reaches below 0),
and `server_starts`. For a percentile column the runs' values are their per-run percentiles, the same quantity the
verdicts test. Run values that are not finite, or negative for a rate or a latency, are left out and said
(`value_issues`). Each metric's trend over the point's runs is measured and shown (`M_drift_pct_per_run`,
`M_drift_p`), never fitted out. The energy and cost columns of a run (`ENERGY_COST_METRICS`: J per token, power, $
per million tokens; docs/energy.md) are aggregated the same way where the runs have them.

For the percentile columns (`median_*`, `p<P>_*`) of points whose runs all kept their raw samples (the
native backend), `M_pooled` is the percentile of the requests of all runs pooled, and `M_pooled_ci_low`,
`M_pooled_ci_high` its two-level bootstrap interval (runs resampled, then requests within each drawn run;
for ITL, whole requests with their gaps); none for a single run. The column `ci_method` says which a row got.

Over the order its runs were measured in (`runs_over_time`, `raysweep.maths.over_time`), a point gets the trend
test of its first rate metric (`drift`, `drift_pct_per_run`, `drift_p`, `drift_text`: a point whose runs
drift is flagged, never green in the conclusions nor "reached" by `bench.precision`) and, where it does
not drift and its runs share one server start, Grubbs' outlier rule on that metric (over several starts their
spread is the replicates' own, never trimmed): an outlier run is left out of the point's statistics
(`runs_left_out`, `left_out_reasons` "outlier run 1", `outlier_text` says which and how far). Then a warm-up of
the configuration's server starts, where shown, is cut from each metric (`_cut_warmup`: `M_warmup_pct`,
`M_warmup_p`, `warmup_text`), and on every other headline metric whose runs do not drift an outlier run's value is
left out of that metric only (`outlier_metrics` names them).

A point is `noisy` when the coefficient of variation of one of its `NOISE_METRICS` exceeds `threshold`
(default 5 %; `noisy_metrics` names them), and `runs_needed` is the number of runs that would bring the
t-interval's half-width of every one of them under `threshold` of its mean (estimated from the spread
seen; empty with one run).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from scipy import special

from raysweep.errors import UserError, unknown_names
from raysweep.maths import bootstrap, hierarchy, verdicts
from raysweep.maths.verdicts import t_quantile
from raysweep.record.files import write_bytes_atomic, write_text_atomic

__all__ = ["HEADLINE_RATES", "NOISE_METRICS", "SUMMARY_FORMATS", "TIME_COLUMNS", "at_level", "check_names",
           "headline_metrics", "lead_is_significant", "left_out_mask", "left_out_reasons", "point_keys", "runs_needed",
           "runs_over_time", "summarize",
           "summary_params", "summary_table", "t_quantile", "write_summary"]

log = logging.getLogger(__name__)

HEADLINE_RATES = ("request_throughput", "output_throughput", "total_token_throughput", "request_goodput",
                  "output_throughput_per_gpu")
NOISE_METRICS = ("request_throughput", "output_throughput", "total_token_throughput", "mean_ttft_ms",
                 "median_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "mean_itl_ms", "median_itl_ms",
                 "mean_e2el_ms", "median_e2el_ms")
STATS = ("mean", "median", "std", "cv", "ci_low", "ci_high")
MODEL_STATS = ("se", "df",   # the standard error of `mean` and its degrees of freedom (`raysweep.maths.hierarchy`)
               "drift_pct_per_run", "drift_se", "drift_df", "drift_p",  # the trend of its runs (`_drift_per_metric`)
               "warmup_pct", "warmup_p")  # its configuration's warm-up test (`_cut_warmup`)
# `vllm bench startup` (mode startup): the mean start of each run, cold and warm, and its compilation
STARTUP_METRICS = ("cold_startup_s", "warm_startup_s", "cold_compilation_s", "warm_compilation_s",
                   "cold_encoder_compilation_s", "warm_encoder_compilation_s")
# energy and cost per run (raysweep.maths.energy, raysweep.plan.cost): each with its interval across runs
ENERGY_COST_METRICS = ("energy_j", "energy_net_j", "power_mean_w", "power_net_mean_w", "j_per_output_token",
                       "j_per_total_token", "output_tokens_per_j", "net_j_per_output_token", "net_j_per_total_token",
                       "net_output_tokens_per_j", "cost_per_m_output_tokens", "cost_per_m_total_tokens")
SUMMARY_FORMATS = ("parquet", "csv")
DEFAULT_THRESHOLD = 0.05
DEFAULT_RESAMPLES = 1000
_LATENCY = re.compile(r"^(mean|median|p(\d+(?:\.\d+)?))_(ttft|tpot|itl|e2el)_ms$")
_LATENCY_ORDER = ("ttft", "tpot", "itl", "e2el")
_MAX_BOOTSTRAP_VALUES = 5_000_000    # resamples x pooled ITL gaps at most per point (200 resamples of 25k gaps)
_MIN_RESAMPLES = 100
# Columns that differ from run to run of one point, or say where it ran: never point parameters.
_RUN_COLUMNS = {"point_id", "run_number", "server_id", "attempt", "started_at", "ended_at", "bench_wall_s",
                "cache_state_before", "bench_command", "date", "node_id", "node_ip", "hostname", "gpu_ids",
                "node_ids", "node_ips", "gpu_ids_per_node", "samples_path", "result_path", "combo_dir",
                "node_types", "hardware", "hardware_mixed"}
_KEYS = ("serve_id", "bench_id")
_LABELS = ("campaign", "serve_label", "bench_label")
_SHAPE = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "gpu_count", "num_nodes")


def runs_needed(cv: float, threshold: float, confidence: float = 0.95, limit: int = 100_000) -> int | None:
    """The fewest runs whose t-interval half-width is at most `threshold` of the mean, for a spread `cv`."""
    return verdicts.runs_for_half_width(cv, threshold, confidence, limit)


# ---------------------------------------------------------------------------------------------------
# Which columns
# ---------------------------------------------------------------------------------------------------

def headline_metrics(df: pd.DataFrame) -> list[str]:
    """The headline metric columns the table has (with a value): throughputs, then per latency metric its
    mean, median and percentiles."""
    def has(col: str) -> bool:
        return col in df.columns and pd.to_numeric(df[col], errors="coerce").notna().any()

    latency = [c for c in df.columns if _LATENCY.match(str(c)) and has(c)]

    def order(col: str) -> tuple[int, float]:
        m = _LATENCY.match(col)
        assert m is not None
        stat = {"mean": -2.0, "median": -1.0}.get(m.group(1), float(m.group(2) or 0))
        return _LATENCY_ORDER.index(m.group(3)), stat

    return ([c for c in HEADLINE_RATES if has(c)] + sorted(latency, key=order)
            + [c for c in STARTUP_METRICS + ENERGY_COST_METRICS if has(c)])


def point_keys(df: pd.DataFrame, params: Sequence[str] | None = None) -> list[str]:
    """The columns that identify a point: `serve_id` and `bench_id`, else the parameters, else every
    column that is neither a metric nor a fact of one run."""
    if all(k in df.columns for k in _KEYS):
        return list(_KEYS)
    if params:
        return [p for p in params if p in df.columns]
    metrics = set(headline_metrics(df))
    return [c for c in df.columns if c not in metrics and c not in _RUN_COLUMNS and not _is_measurement(c)
            and not pd.api.types.is_bool_dtype(df[c])]


def _param_columns(df: pd.DataFrame, keys: list[str], params: Sequence[str] | None) -> tuple[list[str], list[str]]:
    """The parameter columns of the points: those given (that the table has), else the columns that are
    constant within every point and differ between points; and the GPU shape columns besides them."""
    if params is not None:
        names = [p for p in params if p in df.columns]
    elif list(keys) != list(_KEYS):  # points told apart by their parameters
        names = [k for k in keys if k not in _LABELS and k not in _SHAPE]
    else:
        metrics = set(headline_metrics(df))
        skip = metrics | _RUN_COLUMNS | set(keys) | set(_LABELS)
        grouped = df.groupby(keys, dropna=False, sort=False)
        names = [c for c in df.columns if c not in skip and not _is_measurement(c)
                 and df[c].astype(str).nunique() > 1 and (grouped[c].nunique(dropna=False) <= 1).all()]
    return names, [c for c in _SHAPE if c in df.columns and c not in names and c not in keys]


_MEASURED = re.compile(r"^((mean|median|std|p\d+(\.\d+)?)_\w+_ms|duration|completed|failed|total_\w+_tokens|"
                       r"\w+_throughput(_per_gpu)?|request_goodput|max_output_tokens_per_s|max_concurrent_requests|"
                       r"peak_\w+|rtfx|error_rate|shared_cpus|client_limited\w*|errors_sample|"
                       r"(server|provenance|transport|validity|steady_state|spec_decode|probe|client|energy|power|idle|"
                       r"cost|(net_)?j_per|(net_)?output_tokens_per_j|load_window)_?\w*|"
                       r"pd_(role_settings|server_\w+|kv_received_tokens|\w+_prefilled_tokens|\w+_computed_tokens|"
                       r"(prefill|decode)_(requests|failures)))$")


def _is_measurement(col: str) -> bool:
    """A field a run measures or records about itself (vLLM's result fields and raysweep's own), never a
    parameter of its point."""
    return bool(_MEASURED.match(str(col)))


# ---------------------------------------------------------------------------------------------------
# The summary
# ---------------------------------------------------------------------------------------------------

def summarize(results: pd.DataFrame, confidence: float = 0.95, *, threshold: float = DEFAULT_THRESHOLD,
              params: Sequence[str] | None = None, noise_metrics: Sequence[str] | None = None,
              samples: Mapping[str, Mapping[str, Any]] | None = None,
              resamples: int = DEFAULT_RESAMPLES) -> pd.DataFrame:
    """One row per point (see the module docstring): its keys, labels and parameter columns, `runs`,
    `runs_flagged` (runs failing a validity check), `client_limited_runs`, `noisy`, `noisy_metrics`,
    `runs_needed`, `ci_method`, then `M_mean, M_median, M_std, M_cv, M_ci_low, M_ci_high` per headline
    metric (and `M_pooled` for percentiles bootstrapped from raw samples).

    :param params: the parameter columns (default: inferred, see `_param_columns`).
    :param samples: raw per-request samples by `point_id` (one run), as `raysweep.record.runs.read_samples` returns.
    :raises UserError: a confidence or threshold out of range, or a noise metric the table lacks.
    """
    _check(confidence, threshold)
    df = _with_per_gpu(results)
    metrics = headline_metrics(df)
    if df.empty:
        return pd.DataFrame(columns=["runs", "noisy", "runs_needed"])
    judged = _noise_metrics(noise_metrics, metrics)
    keys = point_keys(df, params)
    names, shape = _param_columns(df, keys, params)
    df = df.assign(**{m: pd.to_numeric(df[m], errors="coerce") for m in metrics})  # once, not once per point
    cut: dict[str, list[str]] = {}
    rows = _point_rows(df, keys, names + shape, metrics, judged, confidence, threshold, samples, resamples, cut)
    out = pd.DataFrame.from_records(rows)
    out["runs_needed"] = out["runs_needed"].astype("Int64")
    out["noisy"] = out["noisy"].astype(bool)
    out.attrs.update(keys=keys, params=names, confidence=confidence, threshold=threshold, values_cut=cut)
    return out


def summary_params(summary: pd.DataFrame) -> list[str]:
    """The parameter columns of a summary: as `summarize` recorded them (kept in parquet), else the columns
    before `runs` that are neither keys, labels nor the GPU shape."""
    if summary.attrs.get("params") is not None:
        return [p for p in summary.attrs["params"] if p in summary.columns]
    lead = list(summary.columns[: list(summary.columns).index("runs")]) if "runs" in summary.columns else []
    return [c for c in lead if c not in (*_KEYS, *_LABELS, *_SHAPE)]


def at_level(summary: pd.DataFrame, confidence: float, threshold: float | None = None) -> pd.DataFrame | None:
    """A summary `summarize` made at one confidence and noise threshold (its `attrs`), at `confidence` and
    `threshold` (default: its own), from what it keeps: each metric's interval from its `M_mean`, `M_se` and
    `M_df` (`hierarchy.interval`, as `_model` makes it: a rate's or a latency's never below 0), `noisy`,
    `noisy_metrics` and `runs_needed` from the `M_cv` of the default noise metrics, and `ci_level`: the numbers
    `summarize` gives at those settings. The pooled percentiles' bootstrap intervals (`M_pooled_ci_low`,
    `M_pooled_ci_high`) need the raw samples again: they are left out. None when the summary does not say its
    settings or keeps an interval without its statistics. The precision record
    (`raysweep.results.precision.precision_columns`) is the caller's to apply again.

    :raises UserError: a confidence or threshold out of range.
    """
    made = summary.attrs.get("confidence"), summary.attrs.get("threshold")
    threshold = made[1] if threshold is None else threshold
    if made[0] is None or threshold is None or "runs_needed" not in summary.columns:
        return None
    _check(confidence, threshold)
    cols = set(summary.columns)
    metrics = [c[: -len("_ci_low")] for c in summary.columns if c.endswith("_ci_low") and "_pooled_" not in c]
    if any(not {f"{m}_{k}" for k in ("mean", "se", "df", "cv", "ci_high")} <= cols for m in metrics):
        return None   # an interval not made from what the summary keeps (one written before M_se and M_df)
    out = summary.drop(columns=[c for c in summary.columns if c.endswith(("_pooled_ci_low", "_pooled_ci_high"))])
    for m in metrics:
        mean, se, dof = (out[f"{m}_{k}"].to_numpy(dtype=float) for k in ("mean", "se", "df"))
        low, high = hierarchy.interval(mean, se, dof, confidence)
        out[f"{m}_ci_low"] = np.where(low < 0.0, 0.0, low) if _never_negative(m) else low   # as `_model` floors it
        out[f"{m}_ci_high"] = high
    judged = [m for m in NOISE_METRICS if m in metrics]
    cvs = [[float(v) for v in out[f"{m}_cv"].to_numpy(dtype=float)] for m in judged]
    noisy, needed = [], []
    for i in range(len(out)):   # as `_point_rows` makes them, from the same numbers
        mine = [c[i] for c in cvs]
        noisy.append(",".join(m for m, cv in zip(judged, mine) if cv > threshold))
        known = [n for n in (runs_needed(cv, threshold, confidence) for cv in mine) if n is not None]
        needed.append(max(known) if known else None)
    out["noisy"] = pd.Series([bool(n) for n in noisy], index=out.index, dtype=bool)
    out["noisy_metrics"] = noisy
    out["runs_needed"] = pd.array(needed, dtype="Int64")
    if "ci_level" in cols:
        out["ci_level"] = confidence
    out.attrs.update(summary.attrs)
    out.attrs.update(confidence=confidence, threshold=threshold)
    return out


def _check(confidence: float, threshold: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise UserError(f"--confidence {confidence}: accepted: a number between 0 and 1 (exclusive), e.g. 0.95")
    if not threshold > 0.0:
        raise UserError(f"--noise-threshold {threshold}: accepted: a positive fraction of the mean, e.g. 0.05")


def _noise_metrics(given: Sequence[str] | None, metrics: list[str]) -> list[str]:
    if given is None:
        return [m for m in NOISE_METRICS if m in metrics]
    missing = [m for m in given if m not in metrics]
    if missing:
        raise UserError(unknown_names("--noise-metrics", missing, metrics, "headline metric"))
    return list(given)


def _with_per_gpu(df: pd.DataFrame) -> pd.DataFrame:
    """The table with `output_throughput_per_gpu`: GPUs counted as the Pareto plot counts them (gpu_count,
    else tensor x pipeline x data parallel size from the record)."""
    if df.empty or "output_throughput" not in df.columns or "output_throughput_per_gpu" in df.columns:
        return df
    from raysweep.results.front import gpu_counts

    try:
        gpus = gpu_counts(df, "gpu_count")[0]
    except UserError:
        return df
    thr = pd.to_numeric(df["output_throughput"], errors="coerce")
    return df.copy().assign(output_throughput_per_gpu=thr / gpus)  # copy: one block, not many inserts


def _point_rows(df: pd.DataFrame, keys: list[str], names: list[str], metrics: list[str], judged: list[str],
                confidence: float, threshold: float, samples: Mapping[str, Mapping[str, Any]] | None,
                resamples: int, cut: dict[str, list[str]] | None = None) -> list[dict[str, Any]]:
    """One row per point, in the order of its keys: the counts and statistics of every point at once (one
    group-by over the table, not a table per point), then each point's row, its values and intervals under
    the model of a measurement (`_model`)."""
    grouped = df.groupby(keys, dropna=False, sort=True)
    codes = grouped.ngroup().to_numpy()
    points = grouped.ngroups
    left = left_out_mask(df).to_numpy(dtype=bool)
    total = np.bincount(codes, minlength=points)
    n_left = np.bincount(codes, weights=left, minlength=points).astype(int)
    all_left = n_left == total
    used = ~left | all_left[codes]  # a point whose runs are all left out keeps them
    firsts = np.unique(codes, return_index=True)[1]
    labels = [c for c in dict.fromkeys((*keys, *_LABELS, *names)) if c in df.columns]
    heads = df.iloc[firsts][labels].to_dict("records")
    flagged = (np.bincount(codes, weights=(df["validity_ok"] == False).to_numpy(dtype=bool),  # noqa: E712
                           minlength=points).astype(int) if "validity_ok" in df.columns else None)
    limited = (np.bincount(codes, weights=(df["client_limited"] == True).to_numpy(dtype=bool),  # noqa: E712
                           minlength=points).astype(int) if "client_limited" in df.columns else None)
    order = np.argsort(codes, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(total)])
    ids = df["point_id"].to_numpy(dtype=object) if "point_id" in df.columns else None
    over_time = _RunsOverTime(df, metrics)
    hardware = df["hardware"].to_numpy(dtype=object) if "hardware" in df.columns else None
    mixed = (df["hardware_mixed"].fillna(False).astype(bool).to_numpy()
             if hardware is not None and "hardware_mixed" in df.columns else None)
    rows = []
    for i in range(points):
        members = order[bounds[i]:bounds[i + 1]]  # the point's runs, in the table's order
        row: dict[str, Any] = dict(heads[i])
        row["runs"] = int(used[members].sum())  # the first column after the parameters (`summary_params`)
        if flagged is not None:
            row["runs_flagged"] = int(flagged[i])
        if limited is not None:
            row["client_limited_runs"] = int(limited[i])
        gone = members[left[members]]
        row.update(runs_total=int(total[i]), runs_left_out=0 if all_left[i] else int(n_left[i]),
                   left_out_reasons=left_out_reasons(df.iloc[gone]) if gone.size else "",
                   on_flagged_runs=bool(all_left[i]) and total[i] > 0)
        timed, outlier = over_time.of(members[used[members]])
        row.update(timed)
        if outlier is not None:   # shown and judged: left out of the point's statistics like a flagged run
            used[outlier] = False
            reasons = ", ".join(r for r in (row["left_out_reasons"], "outlier run 1") if r)
            row.update(runs=row["runs"] - 1, runs_left_out=row["runs_left_out"] + 1, left_out_reasons=reasons)
        if hardware is not None:  # what the runs used were measured on (one, unless all were flagged)
            row["hardware"] = " | ".join(sorted({str(h) for h in hardware[members[used[members]]] if not pd.isna(h)}))
            row["hardware_mixed"] = bool(mixed[members].any()) if mixed is not None else False
        rows.append(row)
    values, issues = _sane_values(df[metrics].to_numpy(dtype=float)[used], codes[used], points, metrics)
    start_codes, ranks = _start_codes(df, used), _run_ranks(df, codes)[used]
    measured = _run_ranks(df, np.zeros(len(df), dtype=int))[used]   # the order of measurement over the campaign
    sane = np.isfinite(values)
    values, warm, warm_texts = _cut_warmup(df, values, codes, used, start_codes, measured, points, metrics)
    values, outlying = _cut_outliers(values, codes[used], start_codes, ranks, points, metrics, over_time.metric)
    if cut is not None and ids is not None:   # by run: the metrics the warm-up or an outlier took its value from
        used_ids = ids[used]
        for r, j in zip(*np.nonzero(sane & ~np.isfinite(values))):
            cut.setdefault(str(used_ids[r]), []).append(metrics[j])
    stats = _group_stats(values, codes[used], points, confidence)
    stats.update(warm)
    starts = _model(values, codes[used], start_codes, points, stats, confidence, [_never_negative(m) for m in metrics])
    _drift_per_metric(stats, values, codes[used], ranks, points, start_codes)
    trend_at = metrics.index(over_time.metric) if over_time.metric in metrics else None
    for i, row in enumerate(rows):
        row.update(warmup_text=warm_texts[i], outlier_metrics=outlying[i])
        if trend_at is not None and starts[i] >= 2:   # the drift of several starts: their means' test
            row.update(_starts_drift(float(stats["drift_pct_per_run"][i, trend_at]),
                                     float(stats["drift_p"][i, trend_at]), int(starts[i])))
        mine = {m: {k: float(stats[k][i, j]) for k in (*STATS, *MODEL_STATS)} for j, m in enumerate(metrics)}
        noisy = [m for m in judged if mine[m]["cv"] > threshold]
        needed = [runs_needed(mine[m]["cv"], threshold, confidence) for m in judged]
        known = [n for n in needed if n is not None]
        row.update(noisy=bool(noisy), noisy_metrics=",".join(noisy), runs_needed=max(known) if known else None,
                   server_starts=int(starts[i]), ci_method=hierarchy.method_text(int(starts[i])),
                   ci_level=confidence, value_issues=issues[i])
        for m in metrics:
            row.update({f"{m}_{k}": v for k, v in mine[m].items()})
    if ids is not None and samples and resamples >= 1:
        _add_pooled(rows, [[str(p) for p in ids[m[used[m]]]] for m in
                           (order[bounds[i]:bounds[i + 1]] for i in range(points))], metrics, confidence, samples,
                    resamples)
    return rows


def _add_pooled(rows: list[dict[str, Any]], runs_of: list[list[str]], metrics: list[str], confidence: float,
                samples: Mapping[str, Mapping[str, Any]], resamples: int) -> None:
    """Into each point's row, after each percentile metric's statistics: its pooled value and two-level
    bootstrap interval (`_pooled`), every point's resamples drawn at once (`bootstrap.intervals`)."""
    wanted = _wanted(metrics)
    found = [_pooled(ids, wanted, samples, resamples) for ids in runs_of]
    ends = iter(bootstrap.intervals([p for f in found if f for _, _, p in f[0]], confidence))
    values_at = iter(_percentiles([(values, [q for _, q in asked]) for f in found if f for asked, values, _ in f[0]]))
    for i, f in enumerate(found):
        if not f:
            continue
        parts, requests = f
        extra: dict[str, tuple[float, float, float]] = {}
        for (asked, _, _), lows_highs, pooled in zip(parts, ends, values_at):
            for (name, _), value, (lo, hi) in zip(asked, pooled, lows_highs):
                extra[name] = (value, lo, hi)
        if not extra:
            continue
        row = rows[i]
        said = row["ci_method"]
        row["ci_method"] = (f"{said}; pooled percentiles with a two-level bootstrap (runs, then requests; "
                            f"{requests} requests)")
        rows[i] = {}
        for k, v in row.items():  # the pooled columns after the metric's interval, as before
            rows[i][k] = v
            m = k[: -len("_ci_high")] if k.endswith("_ci_high") else ""
            if m in extra:
                rows[i][f"{m}_pooled"], rows[i][f"{m}_pooled_ci_low"], rows[i][f"{m}_pooled_ci_high"] = extra[m]


def _start_codes(df: pd.DataFrame, used: np.ndarray) -> np.ndarray:
    """The server start (`server_id`) of each run used, as integer codes (runs whose start is not recorded share
    one)."""
    if "server_id" in df.columns:
        return pd.factorize(df["server_id"].astype(str).where(df["server_id"].notna(), ""))[0][used]
    return np.zeros(int(used.sum()), dtype=int)


def _cut_warmup(df: pd.DataFrame, values: np.ndarray, codes: np.ndarray, used: np.ndarray, start_codes: np.ndarray,
                ranks: np.ndarray, points: int, metrics: list[str],
                ) -> tuple[np.ndarray, dict[str, np.ndarray], list[str]]:
    """The warm-up of each configuration's server starts found per metric (`hierarchy.warmup`; a configuration
    is its `serve_id`; `ranks`, the order of measurement over the campaign) and, where shown, the first run of
    each start's life left out of that metric: the values with those runs NaN, per point and metric the
    configuration's `warmup_pct` and `warmup_p`, and per point what was cut, in words (`warmup_text`, empty where
    nothing was)."""
    run_points = codes[used]
    configs = (pd.factorize(df["serve_id"].astype(str))[0][used] if "serve_id" in df.columns
               else np.zeros(run_points.size, dtype=int))
    n_configs = int(configs.max()) + 1 if configs.size else 0
    config_of = np.zeros(points, dtype=int)
    config_of[run_points] = configs
    values = values.copy()
    pct, pval = np.full((points, len(metrics)), math.nan), np.full((points, len(metrics)), math.nan)
    cut_in: list[list[tuple[str, int, hierarchy.Warmup, int]]] = [[] for _ in range(points)]
    for j, m in enumerate(metrics):
        known = np.flatnonzero(np.isfinite(values[:, j]))
        if known.size < 2:
            continue
        w = hierarchy.warmup(values[known, j], configs[known], start_codes[known], run_points[known], ranks[known],
                             n_configs)
        pct[:, j], pval[:, j] = w.pct[config_of], w.p[config_of]
        gone = known[w.cut]
        values[gone, j] = math.nan
        for i, n in zip(*np.unique(run_points[gone], return_counts=True)):
            cut_in[int(i)].append((m, int(n), w, int(config_of[i])))
    texts = []
    for cut in cut_in:
        if not cut:
            texts.append("")
            continue
        m, n, w, c = cut[0]
        texts.append(f"warm-up left out: the first run after each of {n} server start(s), in "
                     f"{', '.join(x[0] for x in cut)} (in {m}: {w.pct[c]:+.1f} % against the later runs on the "
                     f"same start, over {w.starts[c]} starts, p = {w.p[c]:.2g})")
    return values, {"warmup_pct": pct, "warmup_p": pval}, texts


def _cut_outliers(values: np.ndarray, run_points: np.ndarray, start_codes: np.ndarray, ranks: np.ndarray, points: int,
                  metrics: list[str], judged_whole: str | None) -> tuple[np.ndarray, list[str]]:
    """Grubbs' rule (`over_time.outlier_runs`) on every headline metric but `judged_whole` (the rate metric whose
    outlier run leaves the point's statistics whole, `runs_over_time`), per point measured on one server start
    where that metric's runs do not drift (as `_time_fields`): an outlier run's value is left out of that metric
    only. Returns the values and per point the metrics that lost one (`outlier_metrics`, comma-separated, empty
    where none did)."""
    from raysweep.maths.over_time import outlier_runs

    drift: dict[str, np.ndarray] = {}
    _drift_per_metric(drift, values, run_points, ranks, points, start_codes)
    pairs = np.unique(np.stack([run_points, start_codes]), axis=1) if run_points.size else np.zeros((2, 0), int)
    one_start = np.bincount(pairs[0], minlength=points) <= 1
    values = values.copy()
    named: list[list[str]] = [[] for _ in range(points)]
    for j, m in enumerate(metrics):
        if m == judged_whole:
            continue
        steady = ~(np.nan_to_num(drift["drift_p"][:, j], nan=1.0) < verdicts.ALPHA) & one_start
        known = np.flatnonzero(np.isfinite(values[:, j]) & steady[run_points])
        out = known[outlier_runs(values[known, j], run_points[known], points)]
        values[out, j] = math.nan
        for i in run_points[out]:
            named[int(i)].append(m)
    return values, [",".join(n) for n in named]


def _never_negative(metric: str) -> bool:
    """A rate or a latency: a value below 0 is not a measurement (`_sane_values`), nor an interval's end."""
    return metric in HEADLINE_RATES or bool(_LATENCY.match(metric))


def _model(values: np.ndarray, run_points: np.ndarray, start_codes: np.ndarray, points: int,
           stats: dict[str, np.ndarray], confidence: float, floored: list[bool]) -> np.ndarray:
    """Every point's value and interval under the model of a measurement (`raysweep.maths.hierarchy`), in
    `stats` in place: `mean` the mean over its server starts of their start means, `se` and `df` its standard
    error and degrees of freedom, `ci_low`/`ci_high` Student's t on them (for a metric `floored`, its low end
    never under 0: the value cannot be, and the interval holds what it held). Returns the server starts of each
    point."""
    k = values.shape[1]
    stats["se"], stats["df"] = np.full((points, k), math.nan), np.full((points, k), math.nan)
    for j in range(k):
        known = np.isfinite(values[:, j])
        mean, se, dof, _, _ = hierarchy.estimates(values[known, j], run_points[known], start_codes[known], points)
        low, high = hierarchy.interval(mean, se, dof, confidence)
        if floored[j]:
            low = np.where(low < 0.0, 0.0, low)
        stats["mean"][:, j], stats["se"][:, j], stats["df"][:, j] = mean, se, dof
        stats["ci_low"][:, j], stats["ci_high"][:, j] = low, high
    pairs = np.unique(np.stack([run_points, start_codes]), axis=1) if run_points.size else np.zeros((2, 0), int)
    return np.maximum(np.bincount(pairs[0], minlength=points), 1)


def _run_ranks(df: pd.DataFrame, codes: np.ndarray) -> np.ndarray:
    """Each run's place among its point's runs in the order they were measured (`started_at`, else round and run
    number, else run number, else the table's order), as `over_time.run_order` orders them."""
    from raysweep.maths import over_time

    keys = [np.arange(len(df), dtype=float)]
    for cols in (("started_at",), ("round", "run_number"), ("run_number",)):
        if all(c in df.columns for c in cols):
            got = [np.asarray([over_time._num(v) for v in df[c].tolist()], dtype=float) for c in cols]
            if all(np.isfinite(g).all() for g in got):
                keys = [*got, keys[0]]
                break
    order = np.lexsort((*reversed(keys), codes))
    ranks = np.empty(len(df), dtype=float)
    starts = np.concatenate([[0], np.cumsum(np.bincount(codes, minlength=int(codes.max()) + 1 if codes.size else 0))])
    ranks[order] = np.arange(len(df)) - starts[codes[order]]
    return ranks


def _drift_per_metric(stats: dict[str, np.ndarray], values: np.ndarray, codes: np.ndarray, ranks: np.ndarray,
                      points: int, starts: np.ndarray | None = None) -> None:
    """Per point and metric, in `stats` in place: the least-squares slope of the runs' values in their order, in %
    of their mean per run (`drift_pct_per_run`), its standard error (`drift_se`, in the same unit), its degrees of
    freedom (`drift_df`) and Student's t-test of a zero slope (`drift_p`), as `over_time.trend` tests one series;
    NaN under `over_time.MIN_TREND_RUNS` runs with a value. A drift is measured and shown for every metric,
    throughput and latency alike, never fitted out of the value. Where a point's runs come from several server
    `starts`, all four are those of its start means against their place in the order (each start at the mean
    place of its runs; the replicates' own test, starts - 2 degrees of freedom, not judged under
    `MIN_TREND_RUNS` starts): its runs' test would read the start effects as a drift (38 % of campaigns of 10
    starts x 2 runs under 10 % start effects flagged one)."""
    from raysweep.maths.over_time import MIN_TREND_RUNS

    k = values.shape[1]
    out = {name: np.full((points, k), math.nan) for name in ("drift_pct_per_run", "drift_se", "drift_df", "drift_p")}
    for j in range(k):
        ok = np.isfinite(values[:, j])
        y, x, c = values[ok, j], ranks[ok], codes[ok]
        if starts is not None and ok.any():   # several starts: one value per start, at its runs' mean place
            pairs, of = np.unique(np.stack([c, starts[ok]]), axis=1, return_inverse=True)
            of = np.asarray(of).ravel()
            owner, size = pairs[0], np.bincount(of).astype(float)
            many = np.bincount(owner, minlength=points) >= 2
            mine = many[owner]
            y = np.concatenate([y[~many[c]], (np.bincount(of, weights=y) / size)[mine]])
            x = np.concatenate([x[~many[c]], (np.bincount(of, weights=x) / size)[mine]])
            c = np.concatenate([c[~many[c]], owner[mine]])
        slope, se, dof, p, ybar, judged = _trend(y, x, c, points, MIN_TREND_RUNS)
        with np.errstate(invalid="ignore", divide="ignore"):
            out["drift_pct_per_run"][:, j] = np.where(judged, 100.0 * slope / np.abs(ybar), math.nan)
            out["drift_se"][:, j] = np.where(judged, 100.0 * se / np.abs(ybar), math.nan)
        out["drift_df"][:, j] = np.where(judged, dof, math.nan)
        out["drift_p"][:, j] = np.where(judged, p, math.nan)
    stats.update(out)


def _starts_drift(pct: float, p: float, starts: int) -> dict[str, Any]:
    """`drift`, `drift_pct_per_run`, `drift_p` and `drift_text` of a point measured on several server starts, from
    its first rate metric's test of the start means (`_drift_per_metric`)."""
    from raysweep.maths.over_time import MIN_TREND_RUNS

    if not math.isfinite(p):
        return dict(drift="not judged", drift_pct_per_run=math.nan, drift_p=math.nan,
                    drift_text=f"not judged: fewer than {MIN_TREND_RUNS} server starts")
    word = "drifts" if p < verdicts.ALPHA else "no drift shown"
    what = f"{pct:+.1f} %/run, p={p:.2g} over the means of {starts} server starts"
    return dict(drift=word, drift_pct_per_run=pct, drift_p=p,
                drift_text=f"drifts {what}" if word == "drifts" else f"no drift shown ({what})")


def _trend(y: np.ndarray, x: np.ndarray, c: np.ndarray, points: int, least: int,
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per group of `c` (0 .. points - 1): the least-squares slope of `y` on `x`, its standard error and degrees of
    freedom, the p-value of Student's t-test of a zero slope, the mean of `y`, and whether it is judged (`least`
    values at least, `x` not all alike, a mean not 0)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        n = np.bincount(c, minlength=points).astype(float)
        ybar = np.bincount(c, weights=y, minlength=points) / n
        xbar = np.bincount(c, weights=x, minlength=points) / n
        xc, yc = x - xbar[c], y - ybar[c]
        sxx = np.bincount(c, weights=xc * xc, minlength=points)
        sxy = np.bincount(c, weights=xc * yc, minlength=points)
        syy = np.bincount(c, weights=yc * yc, minlength=points)
        slope = sxy / sxx
        s2 = np.maximum(syy - slope * sxy, 0.0) / (n - 2)
        se = np.sqrt(s2 / sxx)
        t = np.where(se > 0, slope / np.where(se > 0, se, 1.0), np.where(slope != 0, np.inf, 0.0))
        p = 2.0 * special.stdtr(np.maximum(n - 2, 1), -np.abs(t))
    judged = (n >= least) & (sxx > 0) & np.isfinite(ybar) & (ybar != 0)
    return slope, se, n - 2, p, ybar, judged


def _sane_values(values: np.ndarray, codes: np.ndarray, points: int, metrics: list[str],
                 ) -> tuple[np.ndarray, list[str]]:
    """The runs' values with those no statistic may read left out (NaN): not finite (inf), or negative for a
    rate or a latency; and per point what was left out, in words (`value_issues`), never in silence."""
    values = values.copy()
    issues: list[list[str]] = [[] for _ in range(points)]
    for j, m in enumerate(metrics):
        col = values[:, j]
        bad_inf = np.isinf(col)
        bad_neg = np.isfinite(col) & (col < 0) & _never_negative(m)
        for what, bad in (("not finite", bad_inf), ("negative", bad_neg)):
            if bad.any():
                for i, n in enumerate(np.bincount(codes[bad], minlength=points)):
                    if n:
                        issues[i].append(f"{m}: {n} run(s) {what}, left out")
        col[bad_inf | bad_neg] = math.nan
    return values, ["; ".join(x) for x in issues]


def _percentiles(sets: list[tuple[np.ndarray, list[float]]]) -> list[list[float]]:
    """`np.percentile(values, qs)` of each set, the sets of one length and percentiles in one call (the same
    numbers as one by one)."""
    out: list[list[float]] = [[] for _ in sets]
    alike: dict[tuple[int, tuple[float, ...]], list[int]] = {}
    for i, (values, asked) in enumerate(sets):
        alike.setdefault((values.size, tuple(asked)), []).append(i)
    for (_, qs), members in alike.items():
        for start in range(0, len(members), 1024):
            part = members[start:start + 1024]
            got = np.percentile(np.stack([sets[i][0] for i in part]), list(qs), axis=1).T.tolist()
            for i, value in zip(part, got):
                out[i] = value
    return out


def _group_stats(values: np.ndarray, codes: np.ndarray, points: int, confidence: float) -> dict[str, np.ndarray]:
    """Per point (rows) and metric (columns): mean, median, std, cv and the t-interval of the mean over its
    runs' values (NaN skipped): numpy's mean and two-pass std, Student's t-interval (one run has none)."""
    index = pd.RangeIndex(points)
    median = pd.DataFrame(values).groupby(codes).median().reindex(index).to_numpy(dtype=float)
    known = ~np.isnan(values)
    n = np.zeros((points, values.shape[1]))  # values counted per point and metric
    for j in range(values.shape[1]):
        n[:, j] = np.bincount(codes[known[:, j]], minlength=points)
    mean, std = np.full(n.shape, math.nan), np.full(n.shape, math.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        for j in range(values.shape[1]):  # two passes, as numpy's std: the spread about the mean
            v, c = values[known[:, j], j], codes[known[:, j]]
            mean[:, j] = np.bincount(c, weights=v, minlength=points) / n[:, j]
            std[:, j] = np.sqrt(np.bincount(c, weights=(v - mean[c, j]) ** 2, minlength=points) / (n[:, j] - 1))
    nan = math.nan
    many = n > 1
    std = np.where(many, std, nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        cv = np.where(many & np.isfinite(mean) & (mean != 0) & np.isfinite(std), std / np.abs(mean), nan)
        q = np.full(n.shape, nan)
        for dof in np.unique(n[many]):
            q[n == dof] = t_quantile(0.5 + confidence / 2.0, dof - 1)
        half = np.where(many, q * std / np.sqrt(np.maximum(n, 1)), nan)
    ok = np.isfinite(half)
    return {"mean": mean, "median": median, "std": std, "cv": cv, "ci_low": np.where(ok, mean - half, nan),
            "ci_high": np.where(ok, mean + half, nan), "n": n}


TREND_METRICS = ("output_throughput", "request_throughput", "total_token_throughput")
TIME_COLUMNS = ("drift", "drift_pct_per_run", "drift_p", "drift_text", "drift_metric", "outlier_text")


def runs_over_time(runs: pd.DataFrame, metrics: Sequence[str]) -> tuple[dict[str, Any], Any]:
    """A point's runs over the order they were measured in (`over_time.run_order`): the trend test of its
    first rate metric (`drift`: drifts / no drift shown / not judged, with the slope in % per run, its p-value
    and the answer in words) and Grubbs' outlier rule on the same metric where it does not drift and its runs
    share one server start; returns those fields and the index label of the outlier run (None: none)."""
    from raysweep.maths import over_time

    metric = next((m for m in TREND_METRICS if m in metrics), None)
    if metric is None or runs.empty:
        return dict.fromkeys(TIME_COLUMNS), None
    order = over_time.run_order(runs)
    starts = (runs["server_id"].astype(str).where(runs["server_id"].notna(), "").nunique()
              if "server_id" in runs.columns else 1)
    fields, at = _time_fields(metric, pd.to_numeric(runs.loc[order, metric], errors="coerce").tolist(), starts)
    return fields, None if at is None else order[at]


class _RunsOverTime:
    """`runs_over_time` of the points of one table, its columns read once: `of(positions)` gives a point's
    fields and the position of its outlier run (None: none), as `runs_over_time` of those rows would."""

    def __init__(self, df: pd.DataFrame, metrics: Sequence[str]) -> None:
        from raysweep.maths import over_time

        self.metric = next((m for m in TREND_METRICS if m in metrics), None)
        self.keys = [[np.asarray([over_time._num(v) for v in df[k].tolist()], dtype=float) for k in keys]
                     for keys in (("started_at",), ("round", "run_number"), ("run_number",))
                     if all(k in df.columns for k in keys)]
        self.values = (pd.to_numeric(df[self.metric], errors="coerce").tolist() if self.metric is not None
                       else [])
        self.starts = _start_codes(df, np.ones(len(df), dtype=bool))

    def of(self, positions: np.ndarray) -> tuple[dict[str, Any], Any]:
        if self.metric is None or not positions.size:
            return dict.fromkeys(TIME_COLUMNS), None
        starts = len(np.unique(self.starts[positions]))
        order = positions  # as given, unless a key orders them (`over_time.run_order`)
        for cols in self.keys:
            mine = [c[positions] for c in cols]
            if all(np.isfinite(c).all() for c in mine):
                order = positions[np.lexsort(tuple(reversed(mine)))]
                break
        fields, at = _time_fields(self.metric, [self.values[i] for i in order], starts)
        return fields, None if at is None else int(order[at])


def _time_fields(metric: str, values: list[Any], starts: int = 1) -> tuple[dict[str, Any], int | None]:
    """The trend test of a point's values in their run order and, where they do not drift and were measured on
    one server start (`starts`), Grubbs' rule: `runs_over_time`'s fields, and the place in `values` of the outlier
    run to leave out (None: none). Over several starts no run is trimmed: their spread is the replicates' own,
    which the interval over the starts carries (trimming it gave a flagged point, never green, in most campaigns
    of 10 starts under 10 % start effects)."""
    from raysweep.maths import over_time

    fields: dict[str, Any] = dict.fromkeys(TIME_COLUMNS)
    t = over_time.trend(values)
    fields.update(drift=t.word, drift_pct_per_run=t.pct_per_run, drift_p=t.p_value, drift_text=t.text,
                  drift_metric=metric)
    if starts > 1:
        fields["outlier_text"] = f"not judged: runs of {starts} server starts (their spread is the model's)"
        return fields, None
    if t.drifts:
        fields["outlier_text"] = "not judged: the runs drift"
        return fields, None
    marks = over_time.outliers(values)
    fields["outlier_text"] = marks.text
    if marks.count and len(values) - marks.count >= 2:
        return fields, marks.mask.index(True)
    return fields, None


def left_out_mask(runs: pd.DataFrame) -> pd.Series:
    """The runs left out of every statistic that ranks or compares: client-limited ones (the load was not
    what was asked) and those failing a validity check (`validity_ok` False)."""
    mask = pd.Series(False, index=runs.index)
    for col in ("client_limited", "validity_ok"):
        if col in runs.columns:
            mask |= runs[col] == (col == "client_limited")
    return mask


def left_out_reasons(runs: pd.DataFrame) -> str:
    """`client-limited 2, shared CPUs 3`: how many of these runs each check flagged (a run may count under
    several)."""
    counts: dict[str, int] = {}
    if runs.empty:  # the usual case; iterrows would still build the values of every column
        return ""
    for _, r in runs.iterrows():
        names = check_names(r.get("validity_issues"))
        if r.get("client_limited") is True and "client-limited" not in names:
            names.insert(0, "client-limited")
        for n in names or ["flagged"]:
            counts[n] = counts.get(n, 0) + 1
    return ", ".join(f"{k} {v}" for k, v in counts.items())


def check_names(issues: object) -> list[str]:
    """The names of the checks in a run's `validity_issues` (`shared CPUs; not steady (slope +3 %/s)` gives
    `shared CPUs`, `not steady`)."""
    if not isinstance(issues, str) or not issues.strip():
        return []
    return list(dict.fromkeys(i.split(" (")[0].strip() for i in issues.split("; ") if i.strip()))


# ---------------------------------------------------------------------------------------------------
# Bootstrap of the percentiles of the pooled requests
# ---------------------------------------------------------------------------------------------------

def _wanted(metrics: list[str]) -> dict[str, list[tuple[str, float]]]:
    """The percentile metrics by latency: {"ttft": [("median_ttft_ms", 50.0), ("p99_ttft_ms", 99.0)], ...}."""
    wanted: dict[str, list[tuple[str, float]]] = {}
    for m in metrics:
        match = _LATENCY.match(m)
        if match is not None and match.group(1) != "mean":
            q = 50.0 if match.group(1) == "median" else float(match.group(2))
            wanted.setdefault(match.group(3), []).append((m, q))
    return wanted


_Parts = list[tuple[list[tuple[str, float]], np.ndarray, bootstrap.Pooled]]


def _pooled(point_ids: list[str], wanted: dict[str, list[tuple[str, float]]],
            samples: Mapping[str, Mapping[str, Any]], resamples: int) -> tuple[_Parts, int] | None:
    """A point's percentile metrics to bootstrap, when every run of it has its raw samples (None otherwise):
    per latency with values, the metrics and percentiles asked, the pooled values, and what the bootstrap
    resamples (`raysweep.maths.bootstrap.Pooled`); and the point's requests. The interval is a two-level
    bootstrap: the runs resampled, then the requests within each drawn run (a run's requests share its
    server state, so they are not independent draws of the configuration); a single run has no interval.
    The latencies measured on the same requests share their resamples."""
    runs = [samples.get(pid) for pid in point_ids]
    if not runs or any(r is None for r in runs):
        return None
    per_run = [_request_values(r) for r in runs if r is not None]
    parts: _Parts = []
    for name, asked in wanted.items():
        owned = [_owned(r, name) for r in per_run]
        values = np.concatenate([v for v, _, _ in owned]) if owned else np.zeros(0)
        if values.size == 0:
            continue
        n = resamples
        if name == "itl":  # fewer resamples (never under _MIN_RESAMPLES) when the gaps are many
            n = min(resamples, max(_MIN_RESAMPLES, _MAX_BOOTSTRAP_VALUES // max(1, values.size)))
        parts.append((asked, values, bootstrap.Pooled([v for v, _, _ in owned], [o for _, o, _ in owned],
                                                      [k for _, _, k in owned], [q for _, q in asked], n)))
    return parts, sum(int(r["n"]) for r in per_run)


def _owned(values: Mapping[str, Any], name: str) -> tuple[np.ndarray, np.ndarray, int]:
    """One run's values of a latency, the request (0..n-1) each belongs to, and n: for ITL every gap, owned
    by its request, n all successful requests (those of one chunk draw no gap); else one value a request."""
    if name == "itl":
        return values["itl_gaps"], values["itl_owner"], int(values["n"])
    v = np.asarray(values[name], dtype=float)
    return v, np.arange(v.size), v.size


def _request_values(s: Mapping[str, Any]) -> dict[str, Any]:
    """Per successful request, in ms: TTFT, TPOT (outputs longer than one token, as vLLM), E2EL, and its ITL
    gaps (`itl_gaps`, with `itl_owner` the request of each), as `bench.stats.point_metrics` defines them."""
    ok = np.asarray(s["ok"], dtype=bool)
    begin_col = s.get("begin")
    begin = np.asarray(begin_col if begin_col is not None and len(begin_col) == ok.size else s["sent"], dtype=float)
    first, end = np.asarray(s["first"], dtype=float), np.asarray(s["end"], dtype=float)
    outs = np.asarray(s["out_tok"], dtype=float)
    e2el, ttft = ((end - begin) * 1000.0)[ok], ((first - begin) * 1000.0)[ok]
    multi = outs[ok] > 1
    tpot = (e2el[multi] - ttft[multi]) / (outs[ok][multi] - 1)
    offsets, flat = _chunk_offsets(s["chunks"])
    every = np.diff(offsets)
    lengths, flat = every[ok], flat[np.repeat(ok, every)]  # the chunks of the successful requests, in order
    inner = np.ones(flat.size, dtype=bool)  # a gap from each chunk to the next of its own request
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    inner[starts[lengths > 0]] = False
    gaps = (np.diff(flat, prepend=0.0) * 1000.0)[inner]
    owner = np.repeat(np.arange(lengths.size), np.maximum(lengths - 1, 0))
    return {"n": int(ok.sum()), "ttft": ttft, "tpot": tpot, "e2el": e2el, "itl_gaps": gaps, "itl_owner": owner}


def _chunk_offsets(chunks: pa.ChunkedArray | pa.ListArray | Sequence[Sequence[float]]) -> tuple[np.ndarray, np.ndarray]:
    """The chunk offsets of every request laid end to end, and where each request's start (n + 1 offsets):
    from an Arrow list column as read (`_read_samples`) or from lists of numbers."""
    if isinstance(chunks, pa.ChunkedArray):
        chunks = chunks.combine_chunks()
    if isinstance(chunks, pa.ListArray):
        lengths = pc.fill_null(pc.list_value_length(chunks), 0).to_numpy(zero_copy_only=False).astype(np.int64)
        flat = chunks.flatten().to_numpy(zero_copy_only=False).astype(float)
    else:
        lengths = np.fromiter((len(c) if c is not None else 0 for c in chunks), dtype=np.int64, count=len(chunks))
        flat = np.fromiter((x for c in chunks if c is not None for x in c), dtype=float, count=int(lengths.sum()))
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), flat


# ---------------------------------------------------------------------------------------------------
# Significance
# ---------------------------------------------------------------------------------------------------

def lead_is_significant(a_row: Mapping[str, Any], b_row: Mapping[str, Any], metric: str,
                        alpha: float = verdicts.ALPHA) -> bool:
    """Whether `metric` differs between two summary rows under the one model of a measurement
    (`hierarchy.compare` of their server starts' means, from `M_mean`, `M_se`, `M_df`, `server_starts`) at level
    `alpha`; False where the model cannot compare them (one server start on a side, no spread, no value)."""
    return hierarchy.compare(hierarchy.Estimate.of_row(a_row, metric), hierarchy.Estimate.of_row(b_row, metric),
                             alpha=alpha).decided


# ---------------------------------------------------------------------------------------------------
# An output dir's summary
# ---------------------------------------------------------------------------------------------------

def summary_table(output_dir: str | Path, confidence: float = 0.95, threshold: float = DEFAULT_THRESHOLD,
                  results: pd.DataFrame | None = None, **kw: Any) -> pd.DataFrame:
    """`summarize` of a raysweep output dir (parameters from its ledger, raw samples from its result
    files), a vLLM sweep dir or an imported dir."""
    from raysweep.results.importer import read_table

    path = Path(output_dir)
    df = results if results is not None else read_table(path).df
    params, samples = _dir_params(path), _dir_samples(path, df)
    # bench.precision: each point's state, from the ledger
    from raysweep.results.precision import precision_columns

    return precision_columns(path, summarize(df, confidence, threshold=threshold, params=params, samples=samples,
                                             **kw))


def _dir_params(output_dir: Path) -> list[str] | None:
    """The serve and bench parameter names of a raysweep output dir's plan (None elsewhere)."""
    from raysweep.ledger import plan_points

    points = plan_points(output_dir)
    if points is None:
        return None
    return list(dict.fromkeys(k for p in points for k in (*p.serve_params, *p.bench_params)))


def _dir_samples(output_dir: Path, df: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """The raw samples of the runs that kept them, by point id (runs whose file cannot be read are left
    out: their point gets t-intervals only)."""
    if "samples_path" not in df.columns or "point_id" not in df.columns:
        return {}
    out = {}
    for pid, rel in zip(df["point_id"], df["samples_path"]):
        if not isinstance(rel, str) or not rel:
            continue
        try:
            out[str(pid)] = _read_samples(output_dir / rel)
        except (OSError, ValueError, pa.ArrowException) as exc:
            log.warning("run %s: its raw samples %s cannot be read (%s); its point gets t-intervals only", pid,
                        rel, exc)
    return out


_SAMPLE_COLUMNS = ("ok", "begin", "sent", "first", "end", "out_tok", "chunks")


def _read_samples(path: Path) -> dict[str, Any]:
    """The columns of a run's raw samples (`raysweep.record.runs.write_samples`) that the pooled percentiles need, as
    arrays (the chunks as Arrow's list column): no Python value per request. One thread: a run's file is a few
    kB, and Arrow's thread pool cost more than the reading (0.82 against 1.41 s of CPU for 2,000 files)."""
    f = pq.ParquetFile(path)
    have = set(f.schema_arrow.names)
    table = f.read(columns=[c for c in _SAMPLE_COLUMNS if c in have], use_threads=False)
    names = table.column_names
    return {c: table.column(c) if c == "chunks" else table.column(c).to_numpy(zero_copy_only=False) for c in names}


def write_summary(output_dir: str | Path, formats: Sequence[str] = SUMMARY_FORMATS,
                  results: pd.DataFrame | None = None, summary: pd.DataFrame | None = None) -> list[Path]:
    """Write `summary.<format>` (parquet, csv) beside `results.*`, each whole or not at all: `summary` as
    given, else `summary_table` of the output dir (of `results` when given) with the default settings."""
    output_dir = Path(output_dir)
    df = summary if summary is not None else summary_table(output_dir, results=results)
    written = []
    for fmt in formats:
        path = output_dir / f"summary.{fmt}"
        if fmt == "csv":
            written.append(write_text_atomic(path, df.to_csv(index=False)))
        elif fmt == "parquet":
            written.append(write_bytes_atomic(path, df.to_parquet(index=False)))
        else:
            raise ValueError(f"unknown summary format {fmt!r}; accepted: {', '.join(SUMMARY_FORMATS)}")
    return written

"""Comparing campaigns: the points of one or more campaigns against a baseline, matched by their parameters.

A side is a raysweep output dir, a `vllm bench sweep` dir, a dir written by `raysweep import`, or a file: a
`summary.parquet/csv` (aggregates per point) or a `results.parquet/csv` (one row per run), read through
`raysweep.results.aggregate` (client-limited and flagged runs left out). Points are matched on the parameter columns
both sides have (or `--match-on`); the baseline must hold one point per matched value, the other side may hold
several (several server configs against one baseline point). Per metric a comparison gives the baseline and
the other mean over runs (for a percentile, the mean of the per-run percentiles), their ratio (other /
baseline) with its interval (`M_ratio_low`, `M_ratio_high`), the p-value and a verdict from one model
(`raysweep.maths.hierarchy`: each side's value is the mean over its server starts of their start means, and
the two are compared on those start means; `M_test`), higher is better for throughputs, lower for latencies:
`better` or `worse` when the interval of the ratio excludes 1, `not shown` when it does not (not a claim
that they are equal) or a drift shown on a side is as large as the lead shown, `not compared` when a side
was measured on one server start (`M_why` says so), `not judged` when a value or a spread is missing.
Every verdict of a comparison
(all matched points x metrics) is one family: its p-values are adjusted for the false discovery rate
(Benjamini-Hochberg, `FAMILY`; `M_p_adjusted`), and `family_text` says how many were tested
(benchmarks/bench_verdicts.py measures the false verdicts per comparison).

With a service-level objective (`slo`, e.g. the campaign's `slo:` or `--slo`), a point compared is judged
only when both sides meet it; the others get `outside slo` and the `slo` column says which side meets it.
`raysweep compare` writes `comparison.csv`, `comparison_totals.csv` and `COMPARE.png`
(`raysweep.report.comparison`, which draws the curves of all sides in one figure), and records the baseline in
every compared raysweep output dir (`compare/baseline.json`), where the report's section finds it
(`raysweep.report.comparison.report_section`): the report of that dir then shows the comparison.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from raysweep.campaign.slo import Target
from raysweep.errors import UserError, unknown_names
from raysweep.maths import hierarchy, over_time, verdicts
from raysweep.maths.over_time import Family
from raysweep.record.files import write_json_atomic
from raysweep.results import aggregate
from raysweep.results.labels import fmt_value

if TYPE_CHECKING:
    pass

__all__ = [
    "BASELINE_FILE",
    "COMPARE_DIR",
    "DEFAULT_METRICS",
    "Comparison",
    "Side",
    "campaign_slo",
    "common_params",
    "compare",
    "deployment_differences",
    "deployments_of",
    "distinct_names",
    "family_text",
    "higher_is_better",
    "load_side",
    "parse_slo_option",
    "record_baseline",
    "totals",
]

log = logging.getLogger(__name__)

FAMILY = "bh"   # the rate controlled over all a comparison's verdicts: the false discovery rate
COMPARE_DIR = "compare"
BASELINE_FILE = "baseline.json"
DEFAULT_METRICS = ("output_throughput", "output_throughput_per_gpu", "request_throughput", "median_ttft_ms",
                   "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_e2el_ms", "p99_e2el_ms",
                   "j_per_output_token", "cost_per_m_output_tokens")  # the last two where both sides have them
# energy and cost per token (raysweep.maths.energy, raysweep.plan.cost) are better lower, like latencies
_LOWER_IS_BETTER = ("_ms", "j_per_output_token", "j_per_total_token", "_per_m_output_tokens", "_per_m_total_tokens",
                    "energy_j", "energy_net_j", "power_mean_w", "power_net_mean_w")
_LABELS = ("serve_label", "bench_label")


@dataclass
class Side:
    """One campaign's aggregates per point: its name, where it came from and its parameter columns; `runs`
    its results table (one row per run) where it was read from one, for the paired verdicts."""

    name: str
    source: Path
    summary: pd.DataFrame
    params: list[str]
    runs: pd.DataFrame | None = None
    folded: str = ""  # what counting its confirmation points as the points they confirm did, in words


@dataclass
class Comparison:
    """The points of `other` matched against `baseline` on the columns `on`, one row per point of `other`
    that has a baseline point: the matched values, labels, and per metric `M_a` (baseline mean; for a
    percentile, the mean of the per-run percentiles), `M_b`, `M_ratio` (b / a), `M_p` (Welch's p-value),
    `M_verdict`; with an slo, `slo` (which side meets it)."""

    baseline: Side
    other: Side
    on: list[str]
    metrics: list[str]
    table: pd.DataFrame
    unmatched_baseline: int = 0
    unmatched_other: int = 0
    notes: list[str] = field(default_factory=list)
    slo: Target | None = None
    family: Family | None = None   # the control over every verdict of the comparison
    deployments: list[dict[str, Any]] = field(default_factory=list)  # `deployment_differences`


def higher_is_better(metric: str) -> bool:
    """Throughputs (and output tokens per joule) are better higher; latencies (`*_ms`), energy, power and cost
    per token lower."""
    return not metric.endswith(_LOWER_IS_BETTER)


# ---------------------------------------------------------------------------------------------------
# Reading a side
# ---------------------------------------------------------------------------------------------------

def load_side(path: str | Path, option: str = "DIR", confidence: float = 0.95) -> Side:
    """The aggregates of a directory or file (see the module docstring).

    :raises UserError: the path is none of them (naming `option`).
    """
    p = Path(path)
    runs: pd.DataFrame | None = None
    if p.is_file():
        df = _read_file(p, option)
        summary = df if _is_summary(df) else aggregate.summarize(df, confidence)
        runs = None if _is_summary(df) else df
        name = _campaign_name(summary) or p.stem
    elif p.is_dir():
        from raysweep.results.table import kept_summary

        kept = kept_summary(p, confidence)  # as the campaign's end wrote it, when nothing finished since
        summary = kept if kept is not None else aggregate.summary_table(p, confidence)
        runs = _runs_of(p)
        name = _campaign_name(summary) or p.name
    else:
        raise UserError(f"{option} {path}: no such file or directory; accepted: a raysweep output dir, a `vllm bench "
                        "sweep` dir, a dir written by `raysweep import`, or a summary/results .parquet or .csv file")
    if summary.empty:
        raise UserError(f"{option} {path}: no finished run to compare")
    side = Side(name, p, summary, aggregate.summary_params(summary), runs)
    return _confirmation_folded(side, confidence)


def _confirmation_folded(side: Side, confidence: float) -> Side:
    """The side with each confirmation point (`confirm:`, a point of its own with `confirms_bench_id`) counted
    as the point it confirms, as the campaign's answer counts it: the same configuration at the same load,
    measured again on fresh servers, so its runs join that point's. A side without one is returned as it is."""
    runs = side.runs
    if runs is None or "confirms_bench_id" not in runs.columns or "bench_id" not in runs.columns:
        return side
    base = runs["confirms_bench_id"]
    again = base.notna() & (base.astype(str) != "")
    if not again.any():
        return side
    folded = runs.copy()
    folded.loc[again, "bench_id"] = base[again].astype(str)
    if "bench_label" in folded.columns:  # the label of the point confirmed, not "(confirmation)"
        labels = dict(zip(folded.loc[~again, "bench_id"], folded.loc[~again, "bench_label"]))
        folded.loc[again, "bench_label"] = folded.loc[again, "bench_id"].map(labels).fillna(
            folded.loc[again, "bench_label"])
    folded = folded.drop(columns=[c for c in ("phase", "confirms_bench_id") if c in folded.columns])
    summary = aggregate.summarize(folded, confidence)
    points = runs.loc[again, ["serve_id", "bench_id"]].drop_duplicates()
    side.folded = (f"{len(points)} confirmation point(s) of {side.name} compared as the points they confirm (their "
                   f"{int(again.sum())} fresh run(s) with the sweep's, as its answer counts them)")
    return Side(side.name, side.source, summary, aggregate.summary_params(summary), folded, side.folded)


def _runs_of(path: Path) -> pd.DataFrame | None:
    """The results table of a directory (None when it cannot be read: the verdicts are then Welch's)."""
    from raysweep.results.importer import read_table

    try:
        return read_table(path).df
    except (UserError, OSError, ValueError) as exc:
        log.info("%s: its runs are not read (%s); no paired verdicts", path, exc)
        return None


def distinct_names(sides: list[Side]) -> list[Side]:
    """The sides, those that share a name told apart by their path."""
    names = [s.name for s in sides]
    short = [s.source.name for s in sides]
    for s in sides:
        if names.count(s.name) > 1:
            s.name = f"{s.name} ({s.source.name if short.count(s.source.name) == 1 else s.source})"
    return sides


def common_params(sides: Sequence[Side]) -> list[str]:
    """The parameter columns every side has, in the order of the first."""
    return [p for p in sides[0].params if all(p in s.params for s in sides[1:])]


def _read_file(path: Path, option: str) -> pd.DataFrame:
    try:
        if path.suffix == ".parquet":
            return pd.read_parquet(path)
        if path.suffix == ".csv":
            return pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise UserError(f"{option} {path}: cannot be read ({exc})") from exc
    raise UserError(f"{option} {path}: a file must be .parquet or .csv (a summary.* or results.* table)")


def _is_summary(df: pd.DataFrame) -> bool:
    return "runs" in df.columns and any(str(c).endswith("_mean") for c in df.columns)


def _campaign_name(summary: pd.DataFrame) -> str | None:
    if "campaign" not in summary.columns:
        return None
    names = summary["campaign"].dropna().astype(str).unique()
    return names[0] if len(names) == 1 else None


# ---------------------------------------------------------------------------------------------------
# Matching and comparing
# ---------------------------------------------------------------------------------------------------

def _norm(value: Any) -> Any:
    """A value as matching sees it: numbers (and "inf") as floats, missing as None, the rest as text."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


def compare(baseline: Side, other: Side, on: Sequence[str] | None = None,
            metrics: Sequence[str] | None = None, slo: Target | None = None,
            family: str = FAMILY) -> Comparison:
    """Match the points of `other` against `baseline` and compare them metric by metric (only the points
    meeting `slo` on both sides, when given).

    :raises UserError: no parameter to match on, a `--match-on` or `--metrics` name a side lacks, or a
        baseline with several points for one matched value.
    """
    keys = _match_columns(baseline, other, on)
    names = _metrics(baseline, other, metrics)
    base_keys = [tuple(_norm(v) for v in row) for row in baseline.summary[keys].itertuples(index=False)]
    _check_unique(baseline, keys, base_keys)
    index = {k: i for i, k in enumerate(base_keys)}
    rows, matched, served = [], set(), []
    base_rows = baseline.summary.to_dict("records")  # plain dicts: a Series' lookups cost 20 times more
    for b in other.summary.to_dict("records"):
        key = tuple(_norm(b[k]) for k in keys)
        if key not in index:
            continue
        matched.add(key)
        a = base_rows[index[key]]
        served.append((a.get("serve_id"), b.get("serve_id")))
        rows.append(_row(a, b, keys, names, slo))
    table = pd.DataFrame.from_records(rows)
    fam = _control(table, names, family)
    notes = [_starts_note(table, names)] if rows else []
    notes += [s.folded for s in (baseline, other) if s.folded]
    notes += [n for n in (left_out_note(s) for s in (baseline, other)) if n]
    notes += _unmatched_notes(baseline, other, keys, set(base_keys) - matched,
                              [tuple(_norm(b[k]) for k in keys) for b in other.summary.to_dict("records")
                               if tuple(_norm(b[k]) for k in keys) not in index])
    if not rows:
        notes.append(f"no point of {other.name} has the parameters of a point of {baseline.name} "
                     f"(matched on {', '.join(keys)})")
    elif slo is not None and not (table["slo"] == "both meet").any():
        notes.append(f"no matched point meets the slo {slo.label} on both sides: nothing is ranked")
    return Comparison(baseline, other, keys, names, table, len(set(base_keys) - matched),
                      len(other.summary) - len(rows), notes, slo, fam,
                      deployment_differences(baseline, other, served))


# ---------------------------------------------------------------------------------------------------
# P/D deployments: what differs between the two sides' deployments, role server by role server
# ---------------------------------------------------------------------------------------------------

_PD_SHAPE = re.compile(r"^pd_(ratio|connector|gpus|(prefill|decode)_(count|tp|dp))$")
ROLE_SETTINGS = "pd_role_settings"  # a P/D point's JSON: each role server's effective settings


def deployments_of(side: Side) -> dict[str, dict[str, Any]]:
    """A side's P/D deployments by serve_id, from its runs: `shape` (pd_ratio, pd_connector, per-role count
    and parallelism) and `settings` (each role server's effective settings as recorded at its start, None
    where the runs have none). {} for a side without P/D runs."""
    runs = side.runs
    if runs is None or "serve_id" not in runs.columns or "pd_ratio" not in runs.columns:
        return {}
    shape = [c for c in runs.columns if _PD_SHAPE.match(str(c))]
    out: dict[str, dict[str, Any]] = {}
    for r in runs[runs["pd_ratio"].notna()].to_dict("records"):
        sid = str(r["serve_id"])
        dep = out.setdefault(sid, {"shape": {c: _norm(r.get(c)) for c in shape}, "settings": None})
        text = r.get(ROLE_SETTINGS)
        if dep["settings"] is None and isinstance(text, str) and text:
            try:
                dep["settings"] = dict(json.loads(text))
            except (ValueError, TypeError):
                log.info("%s: serve %s has unreadable %s", side.name, sid, ROLE_SETTINGS)
    return out


def deployment_differences(baseline: Side, other: Side,
                           pairs: Sequence[tuple[Any, Any]]) -> list[dict[str, Any]]:
    """Per pair of matched configurations (serve_id of the baseline, of the other) where either is a P/D
    deployment: every difference of shape (`pd_ratio 1P1D != 2P1D`, the connector, a role's parallelism)
    and of the effective settings of each role server (`decode-0: max_num_seqs 64 != 128`, a server one
    side lacks: `raysweep.serve.pd_settings.settings_differences`), host and port aside; `settings_recorded` false
    where a side's runs carry no settings (runs from before they were recorded)."""
    from raysweep.serve.pd_settings import settings_differences

    deps_a, deps_b = deployments_of(baseline), deployments_of(other)
    out: list[dict[str, Any]] = []
    for sa, sb in dict.fromkeys((str(a), str(b)) for a, b in pairs):
        da, db = deps_a.get(sa), deps_b.get(sb)
        if da is None and db is None:
            continue
        if da is None or db is None:
            single = "other" if da is None else "baseline"
            out.append({"baseline_serve_id": sa, "other_serve_id": sb, "settings_recorded": False,
                        "differences": [f"a P/D deployment against a single server (the {single})"]})
            continue
        diffs = [f"{k} {_shown(da['shape'].get(k))} != {_shown(db['shape'].get(k))}"
                 for k in sorted(set(da["shape"]) | set(db["shape"])) if da["shape"].get(k) != db["shape"].get(k)]
        recorded = da["settings"] is not None and db["settings"] is not None
        if recorded:
            diffs += settings_differences(da["settings"], db["settings"])
        out.append({"baseline_serve_id": sa, "other_serve_id": sb, "settings_recorded": recorded,
                    "differences": diffs})
    return out


def _shown(value: object) -> str:
    return "(none)" if value is None else fmt_value(value)


def _control(table: pd.DataFrame, metrics: list[str], method: str) -> Family:
    """The verdicts of the whole comparison (every matched point and metric) as one family: the p-values
    adjusted (`over_time.adjust`) and a verdict better or worse only where the adjusted p-value is under 5 %
    (`M_p_adjusted`); the others not shown."""
    cells: list[tuple[str, np.ndarray]] = []  # per metric, the rows tested (column by column: no cell access)
    p_values: list[float] = []
    for m in metrics if len(table) else []:
        p = pd.to_numeric(table[f"{m}_p"], errors="coerce").to_numpy(dtype=float)
        rows = np.flatnonzero(table[f"{m}_verdict"].isin(("better", "worse", "not shown")).to_numpy()
                              & np.isfinite(p))
        cells.append((m, rows))
        p_values.extend(p[rows].tolist())
    fam = over_time.adjust(p_values, method)
    adjusted, at = np.asarray(fam.adjusted, dtype=float), 0
    for m, rows in cells:
        q = adjusted[at:at + rows.size]
        at += rows.size
        column = np.full(len(table), math.nan)
        column[rows] = q
        table[f"{m}_p_adjusted"] = column
        verdict = table[f"{m}_verdict"].to_numpy(dtype=object).copy()
        shown = np.isin(verdict[rows], ("better", "worse")) & ~(q < verdicts.ALPHA)
        verdict[rows[shown]] = "not shown"
        table[f"{m}_verdict"] = verdict
    return fam


def _meets(row: dict[str, Any], slo: Target) -> bool:
    """A point meets the slo when the interval of every threshold's metric lies inside its bound (a latency
    percentile: the interval of its pooled requests where kept, else of the model), never on a mean."""
    for t in slo.thresholds:
        pooled = f"{t.metric}_pooled_ci_low" in row and _finite(row.get(f"{t.metric}_pooled_ci_low"))
        pre = f"{t.metric}_pooled_ci" if pooled else f"{t.metric}_ci"
        low, high = row.get(f"{pre}_low", math.nan), row.get(f"{pre}_high", math.nan)
        if over_time.bound_verdict(low, high, t.op, t.bound) != "met":
            return False
    return True


def _metric_drift(row: dict[str, Any], m: str) -> float:
    """How far a side's runs drift in metric `m` over their window (`hierarchy.drift_total` of its own trend,
    `M_drift_pct_per_run` and `M_drift_p`; the first rate metric's `drift` where the summary has none)."""
    p = row.get(f"{m}_drift_p")
    if p is not None and _finite(p):
        return hierarchy.drift_total(row.get(f"{m}_drift_pct_per_run"), row.get("runs"), float(p) < verdicts.ALPHA)
    return hierarchy.drift_total(row.get("drift_pct_per_run"), row.get("runs"), row.get("drift") == "drifts")


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _starts_note(table: pd.DataFrame, metrics: list[str]) -> str:
    """What the verdicts rest on: the server starts of each side (`raysweep.maths.hierarchy`)."""
    one = 0
    if {"starts_a", "starts_b"} <= set(table.columns):
        a = pd.to_numeric(table["starts_a"], errors="coerce").fillna(1)
        b = pd.to_numeric(table["starts_b"], errors="coerce").fillna(1)
        one = int(((a < 2) | (b < 2)).sum())
    said = f"verdicts {hierarchy.MODEL}: the server start is the replicate"
    if one:
        said += (f"; {one} of {len(table)} matched point(s) not compared: one server start on a side "
                 "(a campaign with several starts per configuration compares them)")
    return said


def _match_columns(baseline: Side, other: Side, on: Sequence[str] | None) -> list[str]:
    if on:
        for side in (baseline, other):
            missing = [c for c in on if c not in side.summary.columns]
            if missing:
                raise UserError(unknown_names("--match-on", missing, side.params,
                                              f"parameter of {side.name} ({side.source})"))
        return list(on)
    keys = [p for p in baseline.params if p in other.params]
    if not keys:
        raise UserError(f"{baseline.name} and {other.name} have no parameter in common to match points on "
                        f"({', '.join(baseline.params) or 'none'} vs {', '.join(other.params) or 'none'}); "
                        "name the columns with --match-on")
    return keys


def _metrics(baseline: Side, other: Side, metrics: Sequence[str] | None) -> list[str]:
    def has(side: Side, m: str) -> bool:
        return f"{m}_mean" in side.summary.columns

    if metrics:
        missing = [m for m in metrics if not (has(baseline, m) and has(other, m))]
        if missing:
            both = [c[:-5] for c in baseline.summary.columns if c.endswith("_mean") and has(other, c[:-5])]
            raise UserError(unknown_names("--metrics", missing, both, "metric aggregated on both sides"))
        return list(metrics)
    return [m for m in DEFAULT_METRICS if has(baseline, m) and has(other, m)]


def left_out_note(side: Side) -> str:
    """How many of a side's runs its statistics leave out, by why (`left out of base: 8 of 24 run(s): shared
    CPUs 8`), as every face that drops runs says it; empty when none is."""
    s = side.summary
    if "runs_left_out" not in s.columns:
        return ""
    left = pd.to_numeric(s["runs_left_out"], errors="coerce").fillna(0)
    if not left.sum():
        return ""
    total = pd.to_numeric(s.get("runs_total", s["runs"] + left), errors="coerce").fillna(0)
    why: dict[str, int] = {}
    for text in s.get("left_out_reasons", pd.Series(dtype=str)).dropna().astype(str):
        for part in filter(None, (p.strip() for p in text.split(","))):
            name, _, count = part.rpartition(" ")
            if count.isdigit() and name:
                why[name] = why.get(name, 0) + int(count)
    reasons = ", ".join(f"{k} {v}" for k, v in why.items())
    return (f"left out of {side.name}: {int(left.sum())} of {int(total.sum())} run(s)"
            + (f" ({reasons})" if reasons else ""))


_LISTED = 5  # unmatched points named one by one, the rest counted


def _unmatched_notes(baseline: Side, other: Side, keys: list[str], only_a: set[tuple[Any, ...]],
                     only_b: list[tuple[Any, ...]]) -> list[str]:
    """Which points were not compared and why: the point (its matched values) is not in the other side, and
    which of its values the other side never measured (or that it measured each, not together)."""
    def said(values: tuple[Any, ...], measured: list[set[Any]]) -> str:
        point = ", ".join(f"{k}={fmt_value(v)}" for k, v in zip(keys, values))
        never = [f"{k}={fmt_value(v)}" for k, v, seen in zip(keys, values, measured) if v not in seen]
        why = (f"{' or '.join(never)} never measured there" if never else
               "each of its values measured there, not together")
        return f"{point} ({why})"

    out = []
    for points, mine, theirs in ((sorted(only_a, key=str), baseline, other), (sorted(set(only_b), key=str), other,
                                                                               baseline)):
        if not points:
            continue
        measured = [{_norm(v) for v in theirs.summary[k]} for k in keys]
        named = "; ".join(said(p, measured) for p in points[:_LISTED])
        more = f" and {len(points) - _LISTED} more" if len(points) > _LISTED else ""
        out.append(f"not compared: {len(points)} point(s) of {mine.name} not in {theirs.name} (no point there with "
                   f"the same {', '.join(keys)}): {named}{more}")
    return out


def _check_unique(baseline: Side, keys: list[str], base_keys: list[tuple[Any, ...]]) -> None:
    seen: dict[tuple[Any, ...], int] = {}
    for i, k in enumerate(base_keys):
        if k in seen:
            a, b = baseline.summary.iloc[seen[k]], baseline.summary.iloc[i]
            differ = [c for c in baseline.params if c not in keys and _norm(a.get(c)) != _norm(b.get(c))]
            hint = (f"; add {', '.join(differ)} to --match-on" if differ else "")
            raise UserError(f"the baseline {baseline.name} has several points with "
                            f"{', '.join(f'{c}={fmt_value(v)}' for c, v in zip(keys, k))}: a point to compare "
                            f"with must be one{hint}")
        seen[k] = i


def _row(a: dict[str, Any], b: dict[str, Any], keys: list[str], metrics: list[str], slo: Target | None = None,
         ) -> dict[str, Any]:
    row: dict[str, Any] = {k: b[k] for k in keys}
    for lab in _LABELS:
        row[f"{lab}_a"], row[f"{lab}_b"] = a.get(lab), b.get(lab)
    row["runs_a"], row["runs_b"] = a.get("runs"), b.get("runs")
    row["starts_a"], row["starts_b"] = a.get("server_starts"), b.get("server_starts")
    judged = True
    if slo is not None:
        ma, mb = _meets(a, slo), _meets(b, slo)
        row["slo"] = {(True, True): "both meet", (True, False): "only the baseline meets",
                      (False, True): "only this one meets", (False, False): "neither meets"}[(ma, mb)]
        judged = ma and mb
    drifts = [s for s, r in (("baseline", a), ("this campaign", b)) if r.get("drift") == "drifts"]
    row["drift"] = " and ".join(drifts)
    for m in metrics:
        v = hierarchy.compare(hierarchy.Estimate.of_row(a, m), hierarchy.Estimate.of_row(b, m), higher_is_better(m))
        sides = [(name, _metric_drift(r, m)) for name, r in (("the baseline", a), ("this campaign", b))]
        drift = max(d for _, d in sides)
        if hierarchy.drift_could_decide(v, drift, higher_is_better(m)):
            who = " and ".join(name for name, d in sides if d > 0)
            v = replace(v, word="not shown", reason=f"the runs of {who} drift in {m} as much as the lead shown")
        row[f"{m}_a"], row[f"{m}_b"] = verdicts.row_stats(a, m)[0], verdicts.row_stats(b, m)[0]
        row[f"{m}_ratio"] = v.ratio
        row[f"{m}_ratio_low"], row[f"{m}_ratio_high"] = v.low, v.high
        row[f"{m}_p"] = v.p_value
        row[f"{m}_test"] = v.test
        row[f"{m}_verdict"] = v.word if judged else "outside slo"
        row[f"{m}_why"] = v.reason
    return row


def totals(cmp: Comparison) -> pd.DataFrame:
    """Per metric over the matched points: their number, the geometric mean, lowest and highest ratio, and
    how many are better, worse, not shown, not judged (and outside the slo, with one)."""
    rows = []
    for m in cmp.metrics:
        if cmp.table.empty:
            break
        ratios = pd.to_numeric(cmp.table[f"{m}_ratio"], errors="coerce")
        good = ratios[np.isfinite(ratios) & (ratios > 0)]
        verdicts = cmp.table[f"{m}_verdict"].value_counts()
        rows.append({"metric": m, "points": len(cmp.table),
                     "ratio_geomean": float(np.exp(np.log(good).mean())) if len(good) else math.nan,
                     "ratio_min": float(good.min()) if len(good) else math.nan,
                     "ratio_max": float(good.max()) if len(good) else math.nan,
                     **{v.replace(" ", "_"): int(verdicts.get(v, 0))
                        for v in ("better", "worse", "not shown", "not judged", "not compared",
                                                  "outside slo")}})
    return pd.DataFrame.from_records(rows)


# ---------------------------------------------------------------------------------------------------
# The figure
# ---------------------------------------------------------------------------------------------------

def campaign_slo(output_dir: str | Path) -> Target | None:
    """The service-level objective (`slo:`) of a raysweep output dir's campaign; None elsewhere."""
    from raysweep.campaign.slo import parse_slo
    from raysweep.ledger import LEDGER_FILE
    from raysweep.results.directory import CampaignDir

    path = Path(output_dir)
    if not (path / LEDGER_FILE).is_file():
        return None
    with CampaignDir(path) as campaign_dir:
        ledger = campaign_dir.ledger
        raw = (ledger.stored_campaign() or {}).get("slo")
    return parse_slo(raw) if raw else None


def parse_slo_option(text: str | None) -> Target | None:
    """`--slo 'p99_ttft_ms=500,median_tpot_ms=50'` (or YAML: `{p99_ttft_ms: 500}`) as an slo."""
    import yaml

    from raysweep.campaign.slo import parse_slo

    if not text:
        return None
    if "=" in text and not text.strip().startswith("{"):
        raw: Any = dict(part.split("=", 1) for part in text.split(",") if part.strip())
        raw = {k.strip(): _number(v.strip()) for k, v in raw.items()}
    else:
        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise UserError(f"--slo {text}: not METRIC=BOUND,... nor a YAML mapping ({exc})") from exc
    return parse_slo(raw, "--slo")


def _number(text: str) -> Any:
    try:
        return float(text)
    except ValueError:
        return text


def record_baseline(output_dir: str | Path, baseline: str | Path, on: Sequence[str] | None = None,
                    metrics: Sequence[str] | None = None) -> Path:
    """Remember the baseline of a raysweep output dir, for its report (`raysweep.report.comparison`)."""
    return write_json_atomic(Path(output_dir) / COMPARE_DIR / BASELINE_FILE,
                             {"baseline": str(Path(baseline).resolve()), "match_on": list(on or []),
                              "metrics": list(metrics or [])})


def family_text(cmp: Comparison) -> str:
    """Which tests decided and what controls them: `Welch's t over runs (or a paired t over runs measured
    side by side), 24 tests, false discovery rate (Benjamini-Hochberg) at 5%`."""
    tests = sorted({str(t) for m in cmp.metrics if f"{m}_test" in cmp.table.columns for t in cmp.table[f"{m}_test"]})
    fam = cmp.family.text if cmp.family is not None else "no test"
    return f"{' / '.join(tests) or verdicts.WELCH}, {fam}"

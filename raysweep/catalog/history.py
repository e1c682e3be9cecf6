"""A configuration's measurements over campaigns, and whether a newer campaign made it worse.

A series is one configuration (its model and server settings) on one workload (fingerprint and load) on one
hardware: only like-for-like points ever share a series. Within a series the campaigns are ordered by
date; each campaign after the first is judged against the one before it on one metric, over their runs
(flagged and client-limited runs left out, as the aggregates do), with `maths.verdicts.equivalence`: the
ratio of their means with its confidence interval (Welch's t on the logarithms). The newer campaign is
`worse` when the whole interval lies beyond the margin on the bad side (for a throughput, below 1 - margin;
for a latency, above 1 + margin), `better` when it lies beyond it on the good side, `within margin` when it
lies inside, and `not shown` otherwise, or with fewer than `verdicts.MIN_RUNS` runs on a side. Each
judgement is a one-sided test at `ALPHA` (a two-sided interval at 1 - 2 ALPHA); when several series are
judged at once, the level is divided among them (Bonferroni), so that `--fail-on-regression` over a whole
catalogue flags a regression that is not there at most ALPHA of the time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from raysweep.catalog.store import Catalog
from raysweep.maths import verdicts

__all__ = ["KEY", "Judgement", "Series", "higher_is_better", "history"]

KEY = ("model", "server_settings", "workload", "load_variable", "load_value", "hardware")
_FILTERS = {"model": "model", "config": "config", "hardware": "hardware", "dataset": "dataset",
            "input_len": "input_len", "output_len": "output_len", "campaign": "campaign"}


def higher_is_better(metric: str) -> bool:
    return "throughput" in metric


@dataclass
class Judgement:
    campaign: str
    date: float
    vllm: str | None
    raysweep: str | None
    runs: int
    mean: float
    word: str = ""          # against the campaign before it: worse, better, within margin, not shown, ""
    ratio: float = math.nan
    low: float = math.nan
    high: float = math.nan

    @property
    def text(self) -> str:
        if not self.word:
            return "first"
        if math.isnan(self.low):
            return self.word
        return f"{self.word}: {self.ratio:.3f}x [{self.low:.3f}, {self.high:.3f}]"


@dataclass
class Series:
    key: dict[str, Any]
    config: str
    dataset: str | None
    input_len: str | None
    output_len: str | None
    points: list[Judgement] = field(default_factory=list)

    @property
    def newest(self) -> Judgement | None:
        return self.points[-1] if self.points else None

    @property
    def regressed(self) -> bool:
        return self.newest is not None and self.newest.word == "worse"


def history(catalog: Catalog, metric: str = "output_throughput", margin: float = 0.0,
            filters: Mapping[str, str | None] | None = None, alpha: float = verdicts.ALPHA) -> list[Series]:
    """Every series that `filters` select (exact values of `_FILTERS`' columns), with its judgements."""
    from raysweep.catalog.fields import METRICS
    from raysweep.errors import UserError

    if metric not in METRICS:
        raise UserError(f"--metric {metric}: not a catalogue metric; accepted: {', '.join(METRICS)}")
    where, params = ["coalesce(validity_ok, true)", "NOT coalesce(client_limited, false)", f"{metric} IS NOT NULL"], []
    for name, value in (filters or {}).items():
        if value is None:
            continue
        where.append(f"CAST({_FILTERS[name]} AS VARCHAR) = ?")
        params.append(value)
    cols = ", ".join((*KEY, "config", "dataset", "input_len", "output_len", "campaign_id", "campaign", "date",
                      "vllm_version", "raysweep_version", metric))
    df = catalog.query(f"SELECT {cols} FROM runs WHERE {' AND '.join(where)}", params)
    if df.empty:
        return []
    key = list(KEY)
    df[key] = df[key].astype(object).where(df[key].notna(), None)
    groups = list(df.groupby(key, dropna=False, sort=True))
    judged = sum(1 for _, g in groups if g["campaign_id"].nunique() > 1)
    level = alpha / max(judged, 1)
    out = []
    for values, g in groups:
        first = g.iloc[0]
        series = Series(dict(zip(key, values)), str(first["config"]), first["dataset"], first["input_len"],
                        first["output_len"])
        prev: pd.Series | None = None
        for _, runs in sorted(g.groupby("campaign_id"), key=lambda kv: float(kv[1]["date"].min())):
            x = runs[metric].astype(float)
            j = Judgement(str(runs["campaign"].iloc[0]), float(runs["date"].min()), _first(runs["vllm_version"]),
                          _first(runs["raysweep_version"]), int(len(x)), float(x.mean()))
            if prev is not None:
                _judge(j, prev, x, higher_is_better(metric), margin, level)
            series.points.append(j)
            prev = x
        out.append(series)
    return out


def _first(col: pd.Series) -> str | None:
    vals = col.dropna()
    return str(vals.iloc[0]) if len(vals) else None


def _judge(j: Judgement, before: pd.Series, now: pd.Series, higher: bool, margin: float, level: float) -> None:
    """The verdict of `now` against `before` (see the module docstring)."""
    eq = verdicts.equivalence(before.to_numpy(), now.to_numpy(), tolerance=margin, confidence=1 - 2 * level,
                              limit=0)  # the runs that would settle a "not shown" are not asked for here
    j.ratio, j.low, j.high = eq.ratio, eq.low, eq.high
    if eq.word == "not judged":
        j.word = "not judged"
        return
    if min(eq.runs_a, eq.runs_b) < verdicts.MIN_RUNS:
        j.word = f"not shown (fewer than {verdicts.MIN_RUNS} runs on a side)"
        return
    below, above = eq.high < 1 - margin, eq.low > 1 + margin
    if below or above:
        j.word = "better" if above == higher else "worse"
    elif margin > 0 and 1 - margin <= eq.low and eq.high <= 1 + margin:
        j.word = "within margin"
    else:
        j.word = "not shown"

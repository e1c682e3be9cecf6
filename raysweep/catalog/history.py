"""A configuration's measurements over campaigns, and whether a newer campaign made it worse.

A series is one configuration (its model and server settings) on one workload (fingerprint and load) on one
hardware: only like-for-like points ever share a series. Within a series the campaigns are ordered by
date; each campaign after the first is judged against the one before it on one metric, over their runs
(flagged and client-limited runs left out, as the aggregates do), as `maths.verdicts.equivalence` judges: the
ratio of their means with its confidence interval (Welch's t on the logarithms), computed for every pair of
the catalogue in one vectorised pass (`verdicts.log_ratio_intervals`). The newer campaign is
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

import numpy as np
import pandas as pd

from raysweep.catalog.store import Catalog
from raysweep.maths import verdicts

__all__ = ["KEY", "Judgement", "Series", "answers", "higher_is_better", "history"]

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
    campaign_id: str = ""

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

    def as_dict(self) -> dict[str, Any]:
        """The series as `history --json` writes it (raysweep/schemas/history.json)."""
        return {"key": dict(self.key), "config": self.config, "dataset": self.dataset, "input_len": self.input_len,
                "output_len": self.output_len, "regressed": self.regressed,
                "points": [{"campaign": j.campaign, "date": j.date, "vllm": j.vllm, "raysweep": j.raysweep,
                            "runs": j.runs, "mean": j.mean, "verdict": j.word or "first", "ratio": j.ratio,
                            "low": j.low, "high": j.high, "text": j.text} for j in self.points]}


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
    keys = ", ".join(KEY)
    # one row per series and campaign, its runs' values as a list: the grouping done by DuckDB
    df = catalog.query(
        f"SELECT {keys}, campaign_id, any_value(campaign) AS campaign, min(date) AS date, "
        "any_value(config) AS config, any_value(dataset) AS dataset, any_value(input_len) AS input_len, "
        "any_value(output_len) AS output_len, any_value(vllm_version) AS vllm, "
        f"any_value(raysweep_version) AS raysweep, list({metric}) AS vals FROM runs WHERE {' AND '.join(where)} "
        f"GROUP BY {keys}, campaign_id ORDER BY {keys}, date, campaign_id", params,
        catalog.select(**{k: (filters or {}).get(k) for k in ("model", "hardware", "campaign")}))
    if df.empty:
        return []
    rows = df.to_dict("records")
    series_of: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        series_of.setdefault(tuple(_none(r[k]) for k in KEY), []).append(r)
    judged = sum(1 for runs in series_of.values() if len(runs) > 1)
    level = alpha / max(judged, 1)
    higher = higher_is_better(metric)
    out = []
    pairs: list[tuple[Judgement, np.ndarray, np.ndarray]] = []  # each judgement, with the runs before and now
    for key, runs in series_of.items():
        first = runs[0]
        series = Series(dict(zip(KEY, key)), str(first["config"]), _none(first["dataset"]),
                        _none(first["input_len"]), _none(first["output_len"]))
        prev: np.ndarray | None = None
        for r in runs:
            x = np.asarray(r["vals"], dtype=float)
            j = Judgement(str(r["campaign"]), float(r["date"]), _none(r["vllm"]), _none(r["raysweep"]), int(x.size),
                          float(x.mean()), campaign_id=str(r["campaign_id"]))
            if prev is not None:
                pairs.append((j, prev, x))
            series.points.append(j)
            prev = x
        out.append(series)
    _judge(pairs, higher, margin, level)
    return out


def answers(catalog: Catalog, series: list[Series]) -> list[dict[str, Any]]:
    """The answer of each campaign the series name, oldest first, as its run kept it (the catalogue's index holds
    it: `Answer.lines()` and `Answer.to_dict()`), never another: {campaign, campaign_id, source, lines (empty
    where none is kept), answer (the object, None where none is kept)}."""
    known = catalog.campaigns
    seen: dict[str, float] = {}
    for s in series:
        for j in s.points:
            seen[j.campaign_id] = min(seen.get(j.campaign_id, j.date), j.date)
    out = []
    for cid in sorted(seen, key=lambda c: (seen[c], c)):
        entry = known.get(cid) or {}
        out.append({"campaign": entry.get("name", cid), "campaign_id": cid, "source": entry.get("source"),
                    "lines": list(entry.get("answer") or []), "answer": entry.get("answer_object")})
    return out


def _none(value: object) -> Any:
    """None for a missing value (DuckDB's NULL as pandas gives it)."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    return value


def _judge(pairs: list[tuple[Judgement, np.ndarray, np.ndarray]], higher: bool, margin: float,
           level: float) -> None:
    """The verdict of each campaign against the one before it (see the module docstring): the interval of the
    ratio as `maths.verdicts.equivalence` computes it, for all pairs in one pass (`log_ratio_intervals`)."""
    judged = []
    for j, before, now in pairs:
        a, b = before[np.isfinite(before) & (before > 0)], now[np.isfinite(now) & (now > 0)]
        if a.size < 2 or b.size < 2:
            j.word = "not judged"
            j.ratio = float(b.mean() / a.mean()) if a.size and b.size else math.nan
        else:
            judged.append((j, np.log(a), np.log(b)))
    if not judged:
        return
    ratios, lows, highs = verdicts.log_ratio_intervals([a for _, a, _ in judged], [b for _, _, b in judged],
                                                       1 - 2 * level)
    for (j, a, b), ratio, low, high in zip(judged, ratios, lows, highs, strict=True):
        j.ratio, j.low, j.high = float(ratio), float(low), float(high)
        if min(a.size, b.size) < verdicts.MIN_RUNS:
            j.word = f"not shown (fewer than {verdicts.MIN_RUNS} runs on a side)"
            continue
        below, above = j.high < 1 - margin, j.low > 1 + margin
        if below or above:
            j.word = "better" if above == higher else "worse"
        elif margin > 0 and 1 - margin <= j.low and j.high <= 1 + margin:
            j.word = "within margin"
        else:
            j.word = "not shown"

"""Queries over a catalogue: points (runs averaged) and like-for-like comparison of two campaigns.

`points` averages the valid runs of each point (flagged and client-limited runs left out, as the aggregates
do). `compare` matches a campaign's points to a baseline's on `LIKE` and the server settings: a matched
pair is judged over its runs with `maths.verdicts.compare_values` (Welch's t over runs, as `raysweep
compare` does), and the matched pairs are one family, as in `raysweep compare`: their p-values adjusted
(Benjamini-Hochberg, `maths.over_time.adjust`) and a pair `better` or `worse` only where its adjusted
p-value is under 5 %, so that comparing two campaigns of a hundred points does not find a few differences
by chance. A point without a like is never set beside another: it is listed with the fields that differ
from its nearest point in the baseline ("not comparable: input length 1024 vs 2048").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from raysweep.catalog.fields import LIKE, METRICS, mismatches
from raysweep.catalog.history import higher_is_better
from raysweep.catalog.store import Catalog
from raysweep.errors import UserError
from raysweep.maths import over_time, verdicts

__all__ = ["Comparison", "compare", "points"]

POINT = ("campaign", "config", "model", "dataset", "input_len", "output_len", "load_variable", "load_value", "hardware")
VALID = "coalesce(validity_ok, true) AND NOT coalesce(client_limited, false)"
FAMILY = "bh"  # the control over a comparison's matched points, as `raysweep compare` (results.compare.FAMILY)


def _check_metrics(metrics: list[str]) -> None:
    bad = [m for m in metrics if m not in METRICS]
    if bad:
        raise UserError(f"--metric {', '.join(bad)}: not a catalogue metric; accepted: {', '.join(METRICS)}")


def points(cat: Catalog, metrics: list[str], filters: dict[str, str | None]) -> pd.DataFrame:
    """One row per point that `filters` select (exact values), the mean of each metric over its valid runs."""
    _check_metrics(metrics)
    where, params = [VALID], []
    for name, value in filters.items():
        if value is not None:
            where.append(f"CAST({name} AS VARCHAR) = ?")
            params.append(value)
    keys = ", ".join(POINT)
    avgs = ", ".join(f"avg({m}) AS {m}" for m in metrics)
    return cat.query(f"SELECT {keys}, count(*) AS runs, {avgs} FROM runs WHERE {' AND '.join(where)} "
                     f"GROUP BY ALL ORDER BY {keys}", params,
                     cat.select(**{k: filters.get(k) for k in ("model", "hardware", "campaign")}))


def nothing_selected(cat: Catalog, filters: dict[str, str | None]) -> str:
    """Why a query selected no point: each filter that matches nothing on its own, with the values there are."""
    asked = {k: v for k, v in filters.items() if v is not None}
    if not asked:
        return f"catalogue {cat.path}: no valid run recorded yet (`raysweep catalog add {cat.path} DIR`)"
    parts = []
    for name, value in asked.items():
        column = name
        try:
            known = [str(v) for v in cat.query(f"SELECT DISTINCT CAST({column} AS VARCHAR) AS v FROM runs "
                                               f"WHERE {VALID} ORDER BY v")["v"].dropna()]
        except Exception:  # a column an older catalogue lacks: say the value only
            known = []
        if value not in known:
            shown = ", ".join(known[:10]) + (f" and {len(known) - 10} more" if len(known) > 10 else "")
            parts.append(f"--{name.replace('_', '-')} {value}: no valid run has it"
                         + (f"; there are: {shown}" if known else ""))
    if not parts:
        parts.append("each filter matches runs, but no valid run matches them all: "
                     + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in asked.items()))
    return "no point selected: " + "; ".join(parts)


@dataclass
class Comparison:
    matched: list[dict[str, Any]] = field(default_factory=list)
    unmatched: list[tuple[str, list[str]]] = field(default_factory=list)
    family: str = ""  # the tests and the control over all of them ("8 tests, false discovery rate ...")


def _campaign_runs(cat: Catalog, name: str, metric: str) -> pd.DataFrame:
    ids = [c["id"] for c in cat.campaigns.values() if name in (c["id"], c["name"])]
    if len(ids) != 1:
        known = ", ".join(sorted(c["name"] for c in cat.campaigns.values()))
        raise UserError(f"campaign {name}: " + ("matches several campaigns; give its id (`catalog list`)"
                                                if ids else f"not in the catalogue; known: {known}"))
    cols = ", ".join(dict.fromkeys((*LIKE, "server_settings", "point", metric)))
    return cat.query(f"SELECT {cols} FROM runs WHERE campaign_id = ? AND {VALID} AND {metric} IS NOT NULL", [ids[0]],
                     ids)


def compare(cat: Catalog, baseline: str, other: str, metric: str) -> Comparison:
    """`other`'s points against `baseline`'s, like for like (see the module docstring)."""
    _check_metrics([metric])
    a, b = _campaign_runs(cat, baseline, metric), _campaign_runs(cat, other, metric)
    keys = [*LIKE, "server_settings"]

    def key_of(row: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(None if pd.isna(row[k]) else row[k] for k in keys)

    base: dict[tuple[Any, ...], pd.DataFrame] = {}
    first: dict[tuple[Any, ...], dict[str, Any]] = {}
    for _, g in a.groupby("point", sort=True):
        row = g.iloc[0].to_dict()
        base[key_of(row)] = g
        first[key_of(row)] = row
    out = Comparison()
    judged: list[verdicts.Verdict] = []
    for point, g in b.groupby("point", sort=True):
        row = g.iloc[0].to_dict()
        k = key_of(row)
        if k in base:
            v = verdicts.compare_values(base[k][metric].to_numpy(float), g[metric].to_numpy(float),
                                        higher_is_better(metric))
            judged.append(v)
            out.matched.append({"point": str(point), "baseline": float(base[k][metric].mean()),
                                "other": float(g[metric].mean()), "ratio": v.ratio, "p": v.p_value})
            continue
        if not first:
            out.unmatched.append((str(point), ["not comparable: the baseline has no valid run"]))
            continue
        why = min((mismatches(f, row, keys) for f in first.values()), key=len)
        out.unmatched.append((str(point), why))
    fam = over_time.adjust([v.p_value if v.word in ("better", "worse", "not shown") else math.nan
                            for v in judged], FAMILY)
    for m, v, q in zip(out.matched, judged, fam.adjusted, strict=True):
        m["p_adjusted"] = q
        m["verdict"] = v.text if not v.decided or q < verdicts.ALPHA else \
            f"not shown ({v.word} alone, p={v.p_value:.3g}; over the {fam.tested} tests, p={q:.3g})"
    out.family = fam.text
    return out

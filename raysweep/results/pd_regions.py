"""Which P/D deployment leads in which load region, where a campaign sweeps several deployments over loads.

The best ratio of prefill to decode servers moves with the load, so a single winner per bench shape (the
headline) hides the answer a team needs. Per bench shape and per load, the deployments' points are ranked
by the objective (under an slo, only those shown to meet it); the leader is tested against each other
deployment at that load with the project's test of two means (`raysweep.maths.verdicts.compare_means`:
Welch's t over runs; a point behind by rule, its failed requests reaching the objective's percentile, is
left out of the tests, as in the headline), and every test of the shape, all loads together, is one
family: Holm's correction over it (`raysweep.maths.over_time.adjust`), so that naming a leader at some
load when no deployment differs at any load errs at most 5 % of the time
(benchmarks/bench_pd_regions.py). A load where the leader is not shown better than every other
deployment says `not shown` (or `not judged` with fewer than 2 runs); consecutive loads with the same
answer form a region.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from raysweep.maths import verdicts
from raysweep.maths.over_time import adjust
from raysweep.results.labels import fmt_value, sort_key

__all__ = ["LoadLead", "deployment_names", "load_leads", "region_line", "region_text"]

LEADS, NOT_SHOWN, NOT_JUDGED, ALONE, NONE_MEETS = "leads", "not shown", "not judged", "alone", "none meets"


def deployment_names(df: pd.DataFrame) -> dict[str, str]:
    """The P/D deployments of a results table by serve_id: `label (1P2D via NixlConnector)`; {} without any."""
    if "pd_ratio" not in df.columns or "serve_id" not in df.columns:
        return {}
    out: dict[str, str] = {}
    for r in df[df["pd_ratio"].notna()].drop_duplicates("serve_id").to_dict("records"):
        label = str(r.get("serve_label") or r["serve_id"])
        shape = f"{r['pd_ratio']} via {r.get('pd_connector')}" if r.get("pd_connector") else str(r["pd_ratio"])
        out[str(r["serve_id"])] = label if shape in label else f"{label} ({shape})"
    return out


@dataclass
class LoadLead:
    """One load of a shape: the deployment ranked first (None where none competes), the word (`leads`, `not
    shown`, `not judged`, `alone`: the only one shown to meet the slo, `none meets`), the others, and the
    tests against them (their positions in the shape's family)."""

    load: object
    leader: str | None
    word: str
    others: list[str] = field(default_factory=list)
    tests: list[int] = field(default_factory=list)
    reason: str = ""


def _cand(row: dict[str, Any]) -> tuple[float, float, int]:
    runs = row.get("runs")
    return (float(row["objective_mean"]), float(row.get("objective_std", math.nan)),
            int(runs) if runs is not None and math.isfinite(float(runs)) else 0)


def load_leads(points: pd.DataFrame, names: dict[str, str], load: str, maximize: bool,
               slo: bool = False) -> tuple[list[LoadLead], list[float]]:
    """Per load of one shape's points (`raysweep.results.conclusions.Conclusions.points` of the shape): the
    deployments' leader and its word, and the shape's family of p-values Holm-adjusted."""
    rows = points[points["serve_id"].astype(str).isin(names)]
    out: list[LoadLead] = []
    p_values: list[float] = []
    sign = -1.0 if maximize else 1.0
    for value in sorted(rows[load].dropna().unique(), key=sort_key):
        at = rows[rows[load] == value]
        if slo and "meets_slo" in at.columns:
            at = at[at["meets_slo"].astype(bool)]
        recs = sorted(at.to_dict("records"), key=lambda r: (bool(r.get("failed_last")),
                                                            sign * float(r["objective_mean"])))
        if not recs:
            out.append(LoadLead(value, None, NONE_MEETS))
            continue
        leader = recs[0]
        name = names[str(leader["serve_id"])]
        others = [r for r in recs[1:] if bool(leader.get("failed_last")) or not bool(r.get("failed_last"))]
        if len(recs) == 1:
            out.append(LoadLead(value, name, ALONE) if slo else
                       LoadLead(value, name, NOT_JUDGED, reason="one deployment at this load"))
            continue
        lead = LoadLead(value, name, LEADS, [names[str(r["serve_id"])] for r in recs[1:]])
        for r in others:
            v = verdicts.compare_means(_cand(leader), _cand(r), maximize, alpha=1.0)  # its p-value only
            if v.word == "not judged":
                lead.word, lead.reason = NOT_JUDGED, "fewer than 2 runs"
            elif v.reason and lead.word == LEADS:
                lead.word, lead.reason = NOT_SHOWN, v.reason
            else:
                lead.tests.append(len(p_values))
                p_values.append(v.p_value)
        out.append(lead)
    family = adjust(p_values, "holm").adjusted
    for lead in out:
        if lead.word == LEADS and not all(family[i] < verdicts.ALPHA for i in lead.tests):
            lead.word = NOT_SHOWN
    return out, family


def _span(values: Sequence[Any]) -> str:
    if len(values) == 1:
        return fmt_value(values[0])
    return f"{fmt_value(values[0])} to {fmt_value(values[-1])}"


def region_text(leads: list[LoadLead]) -> str:
    """The regions of consecutive loads with the same answer: `1 to 8: A leads; 16: not shown; ...`."""
    parts: list[str] = []
    i = 0
    while i < len(leads):
        j = i
        key = (leads[i].word, leads[i].leader if leads[i].word in (LEADS, ALONE) else None)
        while j + 1 < len(leads) and (leads[j + 1].word,
                                      leads[j + 1].leader if leads[j + 1].word in (LEADS, ALONE) else None) == key:
            j += 1
        span, first = _span([x.load for x in leads[i:j + 1]]), leads[i]
        if first.word == LEADS:
            parts.append(f"{span}: {first.leader} leads")
        elif first.word == ALONE:
            parts.append(f"{span}: {first.leader} alone shown to meet the slo")
        elif first.word == NONE_MEETS:
            parts.append(f"{span}: no deployment shown to meet the slo")
        else:
            why = {x.reason for x in leads[i:j + 1] if x.reason}
            parts.append(f"{span}: {first.word}" + (f" ({'; '.join(sorted(why))})" if why else ""))
        i = j + 1
    return "; ".join(parts)


def region_line(points: pd.DataFrame, names: dict[str, str], load: str | None, shape: str, maximize: bool,
                slo: bool = False) -> str | None:
    """`Deployments by max_concurrency for <shape>: ...` where the shape's points hold at least two of the
    deployments `names` and two loads; None otherwise."""
    if not load or load not in points.columns or len(names) < 2:
        return None
    rows = points[points["serve_id"].astype(str).isin(names)]
    if rows["serve_id"].nunique() < 2 or rows[load].nunique() < 2:
        return None
    leads, family = load_leads(rows, names, load, maximize, slo)
    tested = sum(math.isfinite(p) for p in family)
    return (f"Deployments by {load} for {shape}: {region_text(leads)} ({verdicts.WELCH}, Holm over the "
            f"{tested} test(s) of the shape at {verdicts.ALPHA:.0%})")

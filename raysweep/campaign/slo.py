"""The service-level vocabulary of a campaign file: thresholds such as `p99_e2el_ms: "<=200"` (vLLM's
expression syntax), the targets of an SLA search (`sla.targets`, every threshold of a target must hold) and a
campaign's objective (`slo:`, a bare number meaning `<=` for latencies and `>=` for rates), the metrics they
may name, whether a point's values meet them, and how a search is recorded. Read by the campaign's checks,
the run, the results and the report; the SLA search itself (`raysweep.sla.search`) judges probes with it.
"""

from __future__ import annotations

import difflib
import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from raysweep.errors import CampaignError
from raysweep.record.fields import SERVER_FIELDS

__all__ = ["LATENCY", "OPS", "POINT_METRICS", "Target", "Threshold", "check_metric", "meets", "parse_slo",
           "parse_targets", "search_key"]

# on floats, and elementwise on arrays
OPS: dict[str, Callable[[Any, Any], Any]] = {"<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt}
_EXPR = re.compile(r"^\s*(<=|<|>=|>)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$")
LATENCY = re.compile(r"^(mean|median|p\d+(?:\.\d+)?)_(ttft|tpot|itl|e2el)_ms$")
POINT_METRICS = ("request_throughput", "output_throughput", "total_token_throughput", "request_goodput",
                 "completed", "failed", "max_concurrent_requests", "duration")


@dataclass(frozen=True)
class Threshold:
    metric: str
    op: str
    bound: float

    def holds(self, value: float) -> bool:
        return bool(OPS[self.op](value, self.bound))

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.bound:g}"


@dataclass(frozen=True)
class Target:
    thresholds: tuple[Threshold, ...]

    @property
    def label(self) -> str:
        return " & ".join(str(t) for t in self.thresholds)


def parse_targets(raw: object, fld: str = "sla.targets") -> list[Target]:
    """Targets from the campaign: a list of {metric: "<op><number>"}; anything else names the target at fault."""
    if not isinstance(raw, list) or not raw:
        raise CampaignError(fld, "must be a non-empty list of {metric: \"<=number\"} mappings")
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or not item:
            raise CampaignError(f"{fld}[{i}]",
                                "must be a mapping of metric -> expression, e.g. {p99_e2el_ms: \"<=200\"}")
        ths = []
        for metric, expr in item.items():
            where = f"{fld}[{i}].{metric}"
            check_metric(str(metric), where)
            m = _EXPR.match(str(expr))
            if not m:
                raise CampaignError(where, f"expression {expr!r} is not one of <=, <, >=, > followed by a number "
                                           "(quote it in YAML: \"<=200\")")
            ths.append(Threshold(str(metric), m.group(1), float(m.group(2))))
        out.append(Target(tuple(ths)))
    return out


def check_metric(metric: str, where: str) -> None:
    """A metric a target or objective may name: a latency statistic with its percentile within 0 to 100,
    or a point or server metric; anything else raises naming `where`, with the closest accepted names."""
    m = LATENCY.match(metric)
    if m:
        stat = m.group(1)
        if stat.startswith("p") and not 0.0 < float(stat[1:]) < 100.0:
            raise CampaignError(where, f"percentile {stat[1:]} is outside 0 to 100; accepted: p1 to p99.9 "
                                       "(e.g. p99_ttft_ms), or median/mean")
        return
    if metric in POINT_METRICS or metric in SERVER_FIELDS:
        return
    known = ["mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
             "median_itl_ms", "p99_itl_ms", "median_e2el_ms", "p99_e2el_ms", *POINT_METRICS, *SERVER_FIELDS]
    close = difflib.get_close_matches(metric, known, n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise CampaignError(where, f"is not a metric the results carry; {hint}accepted: {{mean,median,pNN}}_"
                               "{ttft,tpot,itl,e2el}_ms, " + ", ".join(POINT_METRICS) + ", "
                               + ", ".join(SERVER_FIELDS))


def parse_slo(raw: object, fld: str = "slo") -> Target:
    """A campaign's service-level objective: a mapping of metric to a bound, a bare number meaning `<=`
    for latencies and `>=` for rates (`{p99_ttft_ms: 500, median_tpot_ms: 50}`), or an expression as in
    SLA targets (`"<=500"`). Every bound must be a positive number."""
    if not isinstance(raw, dict) or not raw:
        raise CampaignError(fld, "must be a mapping of metric -> bound, e.g. {p99_ttft_ms: 500, median_tpot_ms: 50}")
    ths = []
    for metric, expr in raw.items():
        where = f"{fld}.{metric}"
        check_metric(str(metric), where)
        if isinstance(expr, (int, float)) and not isinstance(expr, bool):
            op, bound = ("<=" if LATENCY.match(str(metric)) else ">="), float(expr)
        else:
            m = _EXPR.match(str(expr))
            if not m:
                raise CampaignError(where, f"{expr!r} is neither a number nor one of <=, <, >=, > followed by a "
                                           "number; accepted: e.g. 500 or \"<=500\"")
            op, bound = m.group(1), float(m.group(2))
        if not (math.isfinite(bound) and bound > 0):
            raise CampaignError(where, f"bound {bound:g} must be a positive number (e.g. 500 for 500 ms)")
        ths.append(Threshold(str(metric), op, bound))
    return Target(tuple(ths))


def meets(values: dict[str, Any], slo: Target) -> bool | None:
    """Whether a point's values (per metric) meet every threshold of `slo`; None when one is missing."""
    out = True
    for t in slo.thresholds:
        v = values.get(t.metric)
        try:
            v = float(v) if v is not None else math.nan
        except (TypeError, ValueError):
            v = math.nan
        if math.isnan(v):
            return None
        out = out and t.holds(v)
    return out



def search_key(cfg: Any, target: Target) -> str:
    """How a search is recorded: its target and the settings (the campaign's `sla:`) that decide its answer."""
    return (f"{target.label} [{cfg.variable}, {cfg.judge}"
            + (f" {cfg.attainment:g}" if cfg.judge == "attainment" else "")
            + f", precision {cfg.precision:g}, {cfg.start:g}..{cfg.max_value:g}]")

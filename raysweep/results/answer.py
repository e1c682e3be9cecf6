"""The answer of a campaign, computed once from its conclusions and rendered by every face (the terminal, `status`,
`--json`, the Python API, the report's card): per bench shape, the configuration to deploy (or why none is
named), its value with its interval and the interval's real level, its lead over each rival with the lead's
interval and the verdict and why, the server starts and runs it rests on, and what was left out. All of it
comes from the one model of a measurement (`raysweep.maths.hierarchy`); the faces never recompute it.

The plain words come first (`ShapeAnswer.headline`, e.g. "Deploy max_num_seqs=16: 2,410 tok/s at
max_concurrency=16 [2,329, 2,491 at 95 %], 22 % more than max_num_seqs=8 [+12 %, +33 %], confirmed on fresh
servers"); the tests, p-values and corrections are in `ShapeAnswer.details` (`--verbose`). The value and the lead
have one wording each (`ShapeAnswer.value_words`, `ShapeAnswer.lead_words`) that the card renders as the terminal
prints it; what was left out (`ShapeAnswer.left_out`) names the campaign's failed points with their number.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from raysweep.maths import hierarchy

if TYPE_CHECKING:
    from types import ModuleType

    import pandas as pd

    from raysweep.maths.verdicts import Verdict
    from raysweep.results.conclusions import Conclusions, ShapeVerdict

__all__ = ["Answer", "Rival", "ShapeAnswer", "build", "failed_words", "number", "point_words", "value_words"]

# the verdict of a shape, in one word: `better` is the only green one
BETTER, NOT_SHOWN, NOT_COMPARED, NOT_JUDGED, NO_LEADER, ALONE = (
    "better", "not shown", "not compared", "not judged", "no leader", "alone")


@dataclass(frozen=True)
class Rival:
    """Another configuration of the shape (at its best point), against the leader."""

    config: str
    value: float
    ci_low: float
    ci_high: float
    lead: float | None         # the leader's relative lead over it, in the objective's direction
    lead_low: float | None     # the lead's interval (same direction), at `level`
    lead_high: float | None
    verdict: str               # better (the leader is shown better), not shown, not compared, not judged
    why: str
    starts: int
    runs: int


@dataclass(frozen=True)
class ShapeAnswer:
    """One bench shape's answer."""

    shape: str
    leader: str | None         # None: no leader is named (`why` says why)
    value: float
    ci_low: float
    ci_high: float
    level: float               # the real level of the interval shown
    starts: int
    runs: int
    verdict: str               # better / not shown / not compared / not judged / no leader / alone
    why: str
    confirmed: bool            # the verdict is the confirmation's, on fresh server starts
    rivals: list[Rival] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)   # what was left out, with its number and why
    headline: str = ""
    details: list[str] = field(default_factory=list)    # tests, p-values and corrections (verbose)
    runner_up: str | None = None   # the rival the headline names (the confirmation's, where there is one)
    lead: float | None = None      # the leader's lead over it, with its interval, as the headline gives it
    lead_low: float | None = None
    lead_high: float | None = None
    lead_words: str = ""           # that lead in the headline's words: `22 % more than X [+12.0 %, +33.0 %]`
    precision: str = ""            # `bench.precision` not reached at the leader's point, in words ("" otherwise)
    value_words: str = ""          # the value in the headline's words, the card's too: `2,410 tok/s [2,329, 2,491
    #                                at 95 %] (on 2 server start(s), 4 run(s))`

    @property
    def clear(self) -> bool:
        return self.verdict == BETTER


@dataclass(frozen=True)
class Answer:
    """A campaign's answer: the objective and one `ShapeAnswer` per bench shape, with the lines beside them
    (cheapest point, P/D regions, notes)."""

    objective: str
    metric: str
    unit: str
    maximize: bool
    load: str | None
    shapes: list[ShapeAnswer]
    extra: list[str] = field(default_factory=list)
    failed: int = 0                # points of the campaign that failed: in no ranking (each shape's left out says so)

    def lines(self, verbose: bool = False) -> list[str]:
        """The answer in words, plain first: one headline per shape (and its details with `verbose`), then
        the lines beside them."""
        out = []
        for s in self.shapes:
            out.append(s.headline)
            if verbose:
                out += [f"  {d}" for d in s.details]
        return out + self.extra

    def to_dict(self) -> dict[str, Any]:
        """As JSON: numbers that are not finite become null."""
        return _clean(asdict(self))


def _clean(value: object) -> Any:
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):   # numpy scalars
        return _clean(value.item())
    return value


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _count(value: object) -> int:
    v = _num(value)
    return int(v) if math.isfinite(v) else 0


def _n(value: float) -> str:
    """`2,410`, `12.5`, `0.0312`: 4 significant digits with thousands separated."""
    if not math.isfinite(value):
        return "n/a"
    digits = max(0, 3 - int(math.floor(math.log10(abs(value))))) if value else 0
    return f"{value:,.{digits}f}"


def number(value: object) -> str:
    """A measured value as every answer words it: `2,410`, `12.50` (4 significant digits, thousands separated)."""
    return _n(_num(value))


def value_words(value: float, low: float, high: float, level: float, unit: str, starts: int, runs: int,
                confirmation: bool = False) -> str:
    """A value in the answer's one wording (the terminal's line and the card's): `2,410 tok/s [2,329, 2,491 at
    95 %] (on 2 server start(s), 4 run(s))`, or `(the confirmation: 2 fresh server start(s), 4 run(s))`."""
    unit = f" {unit}" if unit else ""
    interval = (f" [{_n(low)}, {_n(high)} at {100 * level:.4g} %]" if math.isfinite(low) and math.isfinite(high)
                else " (no interval: one run)")
    on = (f" (the confirmation: {starts} fresh server start(s), {runs} run(s))" if confirmation
          else f" (on {starts} server start(s), {runs} run(s))")
    return f"{_n(value)}{unit}{interval}{on}"


def point_words(row: pd.Series, level: float, unit: str) -> str:
    """`value_words` of a point's row (its mean, interval, server starts and runs)."""
    return value_words(_num(row.get("objective_mean")), _num(row.get("objective_ci_low")),
                       _num(row.get("objective_ci_high")), level, unit, _count(row.get("server_starts")) or 1,
                       _count(row.get("runs")))


def failed_words(n: int) -> str:
    """The campaign's failed points, as each shape's left out says them ("" for none)."""
    return (f"{n} failed point(s) of the campaign (not in any ranking; `raysweep status` says why)" if n > 0
            else "")


def _pct(x: float) -> str:
    return f"{100.0 * x:+.1f} %"


def _below(lead: float) -> float:
    """Lower is better: how much lower the leader is than the rival, from the lead (the rival over the leader,
    less one): 10 ms against 12.5 ms is a lead of +25 % and 20 % lower."""
    return lead / (1.0 + lead) if lead > -1.0 else -math.inf


def lead_text(lead: float, maximize: bool) -> str:
    """`22 % more` where higher is better; `20 % lower` (never the lead's +25 %) where lower is."""
    if maximize:
        return f"{abs(lead) * 100:.0f} % {'more' if lead >= 0 else 'less'}"
    below = _below(lead)
    return f"{abs(below) * 100:.0f} % {'lower' if below >= 0 else 'higher'}"


def lead_span(low: float | None, high: float | None, maximize: bool) -> str:
    """The lead's interval in the words of `lead_text`: ` [+12 %, +33 %]`, or ` [+17.1 %, +22.8 % lower]`."""
    if low is None or high is None:
        return ""
    if maximize:
        return f" [{_pct(low)}, {_pct(high)}]"
    return f" [{_pct(_below(low))}, {_pct(_below(high))} lower]"


def _lead(v: Verdict, maximize: bool) -> tuple[float | None, float | None, float | None]:
    """The leader's lead over a rival and its interval, in the objective's direction, from the model's verdict
    of the leader (B) against the rival (A)."""
    ratio = _num(getattr(v, "ratio", math.nan))
    if not math.isfinite(ratio) or ratio <= 0:
        return None, None, None
    low, high = _num(v.low), _num(v.high)
    if maximize:
        return ratio - 1.0, (low - 1.0) if math.isfinite(low) else None, (high - 1.0) if math.isfinite(high) else None
    # lower is better: the rival's value over the leader's, less one
    return (1.0 / ratio - 1.0, (1.0 / high - 1.0) if math.isfinite(high) else None,
            (1.0 / low - 1.0) if math.isfinite(low) else None)


def _estimate(row: pd.Series) -> hierarchy.Estimate:
    return hierarchy.Estimate(_num(row.get("objective_mean")), _num(row.get("objective_se")),
                              _num(row.get("objective_df")), _count(row.get("server_starts")) or 1,
                              _count(row.get("runs")))


def _left_out(rows: list[Any]) -> list[str]:
    out = []
    for r in rows:
        if r is None:
            continue
        name = str(r.get("serve_label", r.get("serve_id")))
        n, why = _count(r.get("runs_left_out")), r.get("left_out_reasons") or ""
        if r.get("on_flagged_runs") == True:  # noqa: E712 (numpy's bool too)
            out.append(f"{name}: every one of its {_count(r.get('runs_total'))} run(s) failed a check ({why}): "
                       "never the leader")
        elif n:
            out.append(f"{name}: {n} run(s) left out ({why})")
        for said in (r.get("value_issues"), r.get("warmup_text")):
            if isinstance(said, str) and said:
                out.append(f"{name}: {said}")
        if isinstance(r.get("outlier_metrics"), str) and r.get("outlier_metrics"):
            out.append(f"{name}: an outlier run left out of {r['outlier_metrics'].replace(',', ', ')} only "
                       "(Grubbs' test)")
    return list(dict.fromkeys(out))


def _rivals(c: Conclusions, v: ShapeVerdict, cl: ModuleType) -> list[Rival]:
    at_load = cl.at_load
    if v.runner_up is None:
        return []
    lead_est = _estimate(v.leader)
    out = []
    for _, r in v.ranking.iterrows():
        if r["serve_id"] == v.leader["serve_id"] and r["bench_id"] == v.leader["bench_id"]:
            continue
        m = hierarchy.compare(_estimate(r), lead_est, c.objective.maximize)
        lead, low, high = _lead(m, c.objective.maximize)
        if v.all_flagged:
            word, why = NO_LEADER, "every configuration's runs failed a check"
        elif m.word in ("not compared", "not judged"):
            word, why = m.word, m.reason
        elif at_load(r, None) in v.tied:
            word, why = NOT_SHOWN, "tied with the leader (its lead is not shown, Holm over the configs)"
        elif r["serve_id"] == v.runner_up["serve_id"] and v.significant is False:
            word, why = NOT_SHOWN, "a drift in their runs is as large as the lead shown"
        else:
            word, why = BETTER, f"{hierarchy.MODEL}, Holm over the configs"
        out.append(Rival(at_load(r, c.load), _num(r.get("objective_mean")), _num(r.get("objective_ci_low")),
                         _num(r.get("objective_ci_high")), lead, low, high, word, why,
                         _count(r.get("server_starts")) or 1, _count(r.get("runs"))))
    return out


def _shape(c: Conclusions, v: ShapeVerdict, cl: ModuleType) -> ShapeAnswer:
    at_load, level_of, verdict_text = cl.at_load, cl.level_of, cl.verdict_text
    leader = v.leader
    rivals = _rivals(c, v, cl)
    # what was left out of the leader's and the runner-up's values, and every configuration never the leader
    # because all its runs failed a check (ranked last, whatever it measured: said, never dropped in silence)
    never = [r for _, r in v.ranking.iterrows() if r.get("on_flagged_runs") == True]  # noqa: E712
    left = [*_left_out([leader, v.runner_up, *never]), *filter(None, [failed_words(c.failed_points)])]
    value, low, high = (_num(leader.get("objective_mean")), _num(leader.get("objective_ci_low")),
                        _num(leader.get("objective_ci_high")))
    level, starts, runs = level_of(leader), _count(leader.get("server_starts")) or 1, _count(leader.get("runs"))
    confirmed = False
    k = v.confirmation
    if k is not None:   # the value, the interval and the verdict are the confirmation's fresh starts'
        value, low, high, level, (starts, _), (runs, _) = k.leader_mean, k.ci_low, k.ci_high, k.level, k.starts, k.runs
        confirmed = bool(k.significant)
    name = at_load(leader, c.load)
    against = k.verdict if k is not None and k.verdict is not None else v.against
    lead, lead_low, lead_high = _lead(against, c.objective.maximize) if against is not None else (None, None, None)
    runner = at_load(v.runner_up, c.load) if v.runner_up is not None else ""
    said = value_words(value, low, high, level, c.objective.unit, starts, runs, confirmation=k is not None)
    lead_words = ""
    if lead is not None and runner:
        span = lead_span(lead_low, lead_high, c.objective.maximize)
        lead_words = f"{lead_text(lead, c.objective.maximize)} than {runner}{span}"
    slo = f" (shown to meet the slo {c.slo.label})" if c.slo is not None and v.slo_met else ""
    if v.slo_met is False and c.slo is not None:
        verdict, why = NO_LEADER, f"no point is shown to meet the slo {c.slo.label}; nearest: {v.nearest}"
        headline = f"No point of {v.shape} is shown to meet the slo {c.slo.label} (its interval inside the bound): " \
            f"no configuration to deploy; nearest: {v.nearest}" + (f"; left out: {'; '.join(left)}" if left else "")
        return ShapeAnswer(v.shape, None, value, low, high, level, starts, runs, verdict, why, False, rivals, left,
                           headline, [verdict_text(v)] if v.runner_up is not None else [], runner or None,
                           value_words=said)
    if v.all_flagged:
        verdict, why = NO_LEADER, "every configuration's runs failed a check (see Warnings); none is named"
        headline = f"Best for {v.shape}: no configuration to deploy: {why}. Best measured: {name}, {said}"
    elif v.runner_up is None:
        verdict, why = ALONE, "nothing to compare it with"
        headline = f"Best for {v.shape}: {name}{slo}, {c.objective.name} {said}: nothing to compare it with"
    elif v.clear:
        verdict, why = BETTER, ("confirmed on fresh servers" if confirmed else
                                f"shown better than every other configuration ({hierarchy.MODEL})")
        headline = f"Best for {v.shape}: deploy {name}{slo}: {c.objective.name} {said}, {lead_words}, {why}"
    else:
        if against is not None and against.word in ("not compared", "not judged"):
            verdict, why = against.word, against.reason
        elif v.flagged and v.significant:
            verdict, why = NOT_SHOWN, "shown better, but some of their runs were left out (see Warnings)"
        elif v.tied:
            verdict, why = NOT_SHOWN, f"tied with {', '.join(v.tied)}: the interval of the lead reaches no lead"
        elif v.significant is False and not v.tied:
            verdict, why = NOT_SHOWN, ("a drift in their runs is as large as the lead shown" if k is None
                                       else "the confirmation's fresh starts do not show it better")
        else:
            verdict, why = NOT_SHOWN, verdict_text(v, drift_note=False)
        headline = (f"Best for {v.shape}: {name}{slo} (best measured): {c.objective.name} {said}, {lead_words}; "
                    f"{verdict}: {why}")
    if left:
        headline += f"; left out: {'; '.join(left)}"
    short = _short_of_precision(leader) if k is None else ""
    if short:
        headline += f"; {short}"
    details = [f"{v.shape}: {verdict_text(v)}"] if v.runner_up is not None else []
    if verdict == NO_LEADER:   # no leader, no lead: the line states none, and neither does any other face
        return ShapeAnswer(v.shape, None, value, low, high, level, starts, runs, verdict, why, confirmed, rivals,
                           left, headline, details, runner or None, precision=short, value_words=said)
    return ShapeAnswer(v.shape, name, value, low, high, level, starts, runs, verdict, why, confirmed, rivals, left,
                       headline, details, runner or None, lead, lead_low, lead_high, lead_words, short, said)


def _short_of_precision(row: pd.Series) -> str:
    """A `bench.precision` point that stopped before its interval was as narrow as asked, in words (as the card
    flags it); empty for one that reached it, or without precision."""
    state = row.get("precision_state")
    if not isinstance(state, str) or state in ("reached", ""):
        return ""
    why = {"max_runs": "stopped at max_runs", "max_duration": "stopped at max_duration",
           "measuring": "is still being measured"}.get(state, state)
    return f"precision not reached: its point {why} before its interval was as narrow as bench.precision asks"


def build(c: Conclusions, cl: ModuleType) -> Answer:
    """The answer of a campaign's conclusions (`raysweep.results.conclusions.conclude`), once; `cl` is the
    conclusions' module, whose words (`at_load`, `level_of`, `verdict_text`, `load_lines`, `extra_lines`) it
    uses (passed in: the answer comes after the conclusions, which hand themselves over)."""
    if c.single_config:
        return Answer(c.objective.name, c.objective.metric, c.objective.unit, c.objective.maximize, c.load,
                      [_capacity(c, v, line, cl) for v, line in zip(c.verdicts, [
                          x for x in cl.load_lines(c) if x.startswith(_CAPACITY)])],
                      [*(x for x in cl.load_lines(c) if not x.startswith(_CAPACITY)), *c.arms], c.failed_points)
    shapes = [_shape(c, v, cl) for v in c.verdicts]
    return Answer(c.objective.name, c.objective.metric, c.objective.unit, c.objective.maximize, c.load, shapes,
                  cl.extra_lines(c), c.failed_points)


def _capacity(c: Conclusions, v: ShapeVerdict, line: str, cl: ModuleType) -> ShapeAnswer:
    """One server configuration swept over loads: its capacity (`load_lines`' line, its value in `value_words`),
    with what was left out."""
    row = v.leader
    value, low, high = (_num(row.get("objective_mean")), _num(row.get("objective_ci_low")),
                        _num(row.get("objective_ci_high")))
    level, starts, runs = cl.level_of(row), _count(row.get("server_starts")) or 1, _count(row.get("runs"))
    left = [*_left_out([row]), *filter(None, [failed_words(c.failed_points)])]
    headline = line + (f"; left out: {'; '.join(left)}" if left else "")
    return ShapeAnswer(v.shape, cl.at_load(row, c.load), value, low, high, level, starts, runs, ALONE,
                       "one server configuration swept over loads", False, [], left, headline,
                       value_words=point_words(row, level, c.objective.unit))


_CAPACITY = "Capacity for "   # the first line of each shape of a single configuration (`load_lines`)

"""The Conclusions section: per bench shape a card with the best configuration, its lead over the next and
whether the noise allows it, the knee, the ranking and the Pareto front; then the SLA capacities and the
noisy points."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from raysweep.bench.load import CONCURRENCY
from raysweep.drive import hooks
from raysweep.errors import UserError
from raysweep.ledger import PointState
from raysweep.report.markup import esc, html_table
from raysweep.results import conclusions
from raysweep.results.data import ReportData, answer_of

if TYPE_CHECKING:
    import pandas as pd

CardFigure = Callable[[ReportData, conclusions.Conclusions, conclusions.ShapeVerdict], str]
"""The figure of a card as HTML (`raysweep.report.figures.card_figure`)."""


def conclusions_section(data: ReportData, card_figure: CardFigure) -> str:
    """The answer first: the best configuration per bench shape, its lead and the noise, the Pareto fronts,
    the SLA capacities and the noisy points."""
    if data.df.empty:
        return f"<p>{esc(no_result_line(data))}</p>"
    try:
        c = answer_of(data)
    except UserError as exc:  # the default objective does not fit these results (a latency-only sweep)
        return f'<p class="muted">No conclusions: {esc(exc)}</p>'
    pct = f"{conclusions.CONFIDENCE:.0%}"
    slo = (f" Only points shown to meet the campaign's service-level objective <b>{esc(c.slo.label)}</b> (the "
           f"{pct} interval of each bounded metric inside its bound) are ranked." if c.slo is not None else
           " No service-level objective (<code>slo:</code>): the leader is "
           "the raw best, whatever its latency; each card names the knee beside it.")
    head = (f'<p class="muted">Objective: <b>{esc(c.objective.text)}</b> (<code>raysweep report --objective</code> '
            f"chooses another).{slo} A point is a server config at one bench point; its value is the mean over its "
            "server starts of each start's mean over its runs that passed their checks, with its interval over those "
            "starts (a point on one start: over its runs, which says nothing of the next start). The replicate is "
            "the server start: the leader is tested against every other config on their start means (t over server "
            "starts, Holm's correction over the configs); configs on one server start each are ranked, not "
            f"compared. Load: {esc(c.load or 'not swept')}; bench shape: "
            f"{esc(', '.join(c.shape_keys) or 'one')}.</p>")
    if c.single_config:
        head = (f'<p class="muted">One server config swept over {esc(c.load or "its loads")}: each card gives its '
                f"capacity (the load of highest mean {esc(c.objective.text)}, with its {pct} confidence interval), "
                "its knee and the latencies at each load. Loads are points of one curve, not configurations: none is "
                "ranked against another.</p>")
    cards = "".join(_shape_card(data, c, v, card_figure) for v in c.verdicts)
    if not cards:
        cards = f'<p class="note">No point has a value of {esc(c.objective.name)}.</p>'
    notes = "".join(f'<p class="note">{esc(n)}</p>' for n in dict.fromkeys([*c.notes, *c.arms, *c.front_notes]))
    return head + f'<div class="cards">{cards}</div>' + _sla_capacities(c) + _noise(c) + notes


def _shape_card(data: ReportData, c: conclusions.Conclusions, v: conclusions.ShapeVerdict,
                card_figure: CardFigure) -> str:
    lead = v.leader
    said = c.answer.shapes[c.verdicts.index(v)]   # the campaign's answer: rendered here, never recomputed
    # the value in the answer's own words, as the terminal prints it: `2,410 tok/s [2,329, 2,491 at 95 %] (on ...)`
    value = f"{esc(c.objective.name)} {esc(said.value_words)}"
    parts = [f"<h3>{esc(v.shape)}</h3>"]
    if v.slo_met is False and c.slo is not None:
        parts.append(f'<p class="flag">No point of this shape is shown to meet the service-level objective '
                     f"{esc(c.slo.label)}: no winner. Nearest: {esc(v.nearest)}. The ranking below is by "
                     "nearness to the bound.</p>")
    elif c.single_config:
        parts.append(f'<p class="win">Capacity: <b>{esc(c.load or "")}={esc(str(lead.get(c.load)))}</b>: {value}</p>')
    elif said.leader is None:
        parts.append(f'<p class="flag">No configuration to deploy: {esc(said.why)}. Best measured: '
                     f"<b>{esc(conclusions.at_load(lead, c.load))}</b>: {value}</p>")
    else:
        word = "Deploy" if said.clear else "Best measured"
        parts.append(f'<p class="win">{word}: <b>{esc(said.leader)}</b>: {value}</p>')
    parts.append(_precision(data, lead))
    parts.append(_latencies(lead))
    if c.single_config:
        left = [f'<p class="flag">Left out: {esc("; ".join(said.left_out))}.</p>'] if said.left_out else []
        return f'<div class="card">{"".join([*parts, *left, *_load_parts(data, c, v, card_figure)])}</div>'
    if v.runner_up is not None and said.rivals and said.leader is not None:   # no leader: no lead, as in the line
        cls = "sig" if said.clear else "insig"
        first = said.rivals[0]
        # the lead in the answer's own words, as the terminal prints it: `22 % more than X [+12.0 %, +33.0 %]`
        amount = said.lead_words or f"against {first.config}"
        k = v.confirmation
        rival = (f"{conclusions.fmt(first.value)}, {_interval(v.runner_up)}" if k is None or k.verdict is None else
                 f"{conclusions.fmt(k.runner_mean)}, {conclusions.level_text(k.level)} interval "
                 f"{conclusions.fmt(k.runner_ci[0])} to {conclusions.fmt(k.runner_ci[1])}, the confirmation")
        parts.append(f'<p class="lead">{esc(amount)} ({rival}): '
                     f'<span class="{cls}">{esc(said.verdict)}: {esc(said.why)}</span>.</p>')
    if said.left_out:   # what the line leaves out, the failed points of the campaign included
        parts.append(f'<p class="flag">Left out: {esc("; ".join(said.left_out))}.</p>')
    if said.details:
        parts.append(f"<details><summary>The test</summary><p>{esc(' '.join(said.details))}</p></details>")
    if v.knee is not None:
        same = v.knee["serve_id"] == lead["serve_id"] and v.knee["bench_id"] == lead["bench_id"]
        parts.append(f"<p>Knee (best among points with {esc(v.knee_bound)}): "
                     f"<b>{esc(conclusions.at_load(v.knee, c.load))}</b>, {conclusions.fmt(v.knee['objective_mean'])} "
                     f"{esc(c.objective.unit)}{' (the leader itself)' if same else ''}.</p>" + _latencies(v.knee))
    if v.cheapest is not None:
        same = v.cheapest["serve_id"] == lead["serve_id"] and v.cheapest["bench_id"] == lead["bench_id"]
        parts.append(f"<p>Cheapest{' meeting the slo' if v.slo_met else ''}: "
                     f"<b>{esc(conclusions.at_load(v.cheapest, c.load))}</b>, {esc(conclusions.cheapest_text(v))}"
                     f"{' (the best itself)' if same else ''} (see Energy and cost).</p>")
    parts.append(card_figure(data, c, v))
    levels = {conclusions.level_of(r) for _, r in v.ranking.iterrows()}
    same = len(levels) == 1   # the header says the level where every row's interval has it, else each cell does
    rows = [[i + 1, r.get("serve_label"), *([r.get(c.load)] if c.load else []),
             conclusions.rounded(r["objective_mean"]), _interval(r, bare=same), r.get("server_starts"), r.get("runs"),
             _left_out(r)] for i, (_, r) in enumerate(v.ranking.iterrows())]
    unit = f" ({c.objective.unit})" if c.objective.unit else ""
    level = f"{conclusions.level_text(levels.pop())} interval" if same else "interval"
    cols = ["#", "server config", *([f"at {c.load}"] if c.load else []), f"mean{unit}", level,
            "server starts", "runs used", "left out"]
    parts.append(html_table(cols, rows))
    front = c.fronts.get(v.shape)
    if front is not None and len(front):
        frows = [[r.get("serve_label"), r.get(CONCURRENCY), conclusions.rounded(r["tokens_per_user"]),
                  conclusions.rounded(r["tokens_per_gpu"])] for _, r in front.iterrows()]
        parts.append(f"<p>Pareto front ({len(front)} point(s), none better on both):</p>"
                     + html_table(["server config", CONCURRENCY, "output tok/s per user", "output tok/s per GPU"],
                              frows))
    return f'<div class="card">{"".join(parts)}</div>'


def _precision(data: ReportData, row: pd.Series) -> str:
    """For a `bench.precision` campaign, a point that stopped before its interval was as narrow as asked:
    says so, with the target and where it stopped (empty for one that reached it, or without precision)."""
    state = row.get("precision_state")
    if not isinstance(state, str) or state == "reached":
        return ""
    asked = ((data.campaign.get("bench") or {}).get("precision") or {}) if isinstance(data.campaign, dict) else {}
    target = asked.get("rel_half_width")
    why = {"max_runs": f"stopped at max_runs ({asked.get('max_runs', '?')} runs)",
           "max_duration": "stopped at max_duration", "measuring": "is still being measured"}.get(state, state)
    reached = row.get("precision_rel_half_width")
    at = (f"; its interval (the one the rule judged, widened for its looks) is +-{100 * float(reached):.1f} % of "
          "the mean" if conclusions.finite(reached) else "")
    method = str(row.get("ci_method") or "")
    more = [what for key, what in (("server's start", "of its level at its server's start (the drift fitted out)"),
                                   ("server starts", "widened by the spread between server starts")) if key in method]
    if at and more:
        at += f" over its runs; the interval shown is {' and '.join(more)}"
    goal = f" (+-{100 * float(target or 0):.1f} % of the mean)" if conclusions.finite(target) else ""
    return (f'<p class="flag">Precision not reached: this point {esc(why)} before its interval was as narrow as '
            f"bench.precision asks{esc(goal)}{esc(at)}. Its value is less certain than the campaign asked.</p>")


def _load_parts(data: ReportData, c: conclusions.Conclusions, v: conclusions.ShapeVerdict,
                card_figure: CardFigure) -> list[str]:
    """One server config's card below its capacity: the knee, the figure and one row per load."""
    parts = []
    if v.knee is not None:
        parts.append(f"<p>Knee (best among loads with {esc(v.knee_bound)}): <b>{esc(c.load or '')}="
                     f"{esc(str(v.knee.get(c.load)))}</b>, {conclusions.fmt(v.knee['objective_mean'])} "
                     f"{esc(c.objective.unit)}.</p>" + _latencies(v.knee))
    parts.append(card_figure(data, c, v))
    lats = list(conclusions.CARD_LATENCIES)
    rows = [[r.get(c.load), conclusions.rounded(r["objective_mean"]), _interval(r, bare=True),
             *[conclusions.rounded(r.get(f"{m}_mean")) for m in lats], r.get("runs"), _left_out(r)]
            for _, r in conclusions.by_load(c, v).iterrows()]
    unit = f" ({c.objective.unit})" if c.objective.unit else ""
    parts.append(html_table([c.load or "load", f"mean{unit}", f"{conclusions.CONFIDENCE:.0%} CI",
                             *[f"{m[:-3]} (ms)" for m in lats], "runs used", "left out"], rows))
    return parts


def _left_out(row: pd.Series) -> str:
    if row.get("on_flagged_runs") is True:
        return "all flagged"
    left = row.get("runs_left_out")
    return f"{int(left)} ({row.get('left_out_reasons')})" if conclusions.finite(left) and int(left) > 0 else "0"


def _latencies(row: pd.Series) -> str:
    """The latencies of a card's point: median and p99 TTFT and TPOT (means over its runs)."""
    have = [(m, row.get(f"{m}_mean")) for m in conclusions.CARD_LATENCIES if conclusions.finite(row.get(f"{m}_mean"))]
    if not have:
        return ""
    return ('<p class="muted">At this point: ' + ", ".join(f"{esc(m[:-3])} {conclusions.fmt(x)} ms" for m, x in have)
            + ".</p>")


def _interval(row: pd.Series, bare: bool = False) -> str:
    low, high = row.get("objective_ci_low"), row.get("objective_ci_high")
    if not (conclusions.finite(low) and conclusions.finite(high)):
        return "no interval: one run" if not bare else "n/a"
    text = f"{conclusions.fmt(low)} to {conclusions.fmt(high)}"
    return text if bare else f"{conclusions.level_text(conclusions.level_of(row))} interval {text}"


def _runs(row: pd.Series) -> str:
    n = row.get("runs")
    return f"{int(n)} run(s)" if conclusions.finite(n) else "runs unknown"


def _sla_capacities(c: conclusions.Conclusions) -> str:
    """The SLA capacities under the cards (`raysweep.sla.report_section`, lent through `raysweep.drive.hooks`)."""
    return "" if c.sla.empty else hooks.sla_capacities_html()(c)


def _noise(c: conclusions.Conclusions) -> str:
    noisy = c.noisy
    if not len(c.points):
        return ""
    if not len(noisy):
        return (f'<p class="muted">Noise: no point has a spread above the threshold over its runs '
                f"({len(c.points)} point(s)).</p>")
    rows = [[r.get("serve_label"), r.get("bench_label"), r.get("runs"), r.get("noisy_metrics", ""),
             r.get("runs_needed")] for _, r in noisy.iterrows()]
    return (f'<details><summary class="note">Noise: {len(noisy)} of {len(c.points)} point(s) are noisy (a '
            "coefficient of variation over their runs above the threshold); more runs would tighten them."
            "</summary>" + html_table(["server config", "bench point", "runs", "noisy metrics", "runs needed"], rows)
            + "</details>")


def no_result_line(data: ReportData) -> str:
    """What a report without a finished run says first: how many points failed and where to read why, or that
    none has finished yet."""
    failed = sum(p.state == PointState.FAILED for p in data.points)
    if failed:
        return (f"No finished run: {failed} of {len(data.points)} point(s) failed, so there is nothing to conclude; "
                "the Failures section says why each failed.")
    return "No finished run yet."

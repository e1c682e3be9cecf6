"""The design of a campaign that asks for verdicts (`design:`): server starts per configuration and runs of each
point per start, chosen from the spread at each level and the cost of each level.

A configuration's value is the mean of its starts' means. With `s` the spread of a start's mean between starts and
`r` the spread of a run between the runs of one start (both as fractions of the mean), `k` starts of `n` runs each
give the value a variance of `(s^2 + r^2 / n) / k`. Kalibera and Jones ("Rigorous Benchmarking in Reasonable
Time", ISMM 2013) choose the runs per start that buy a given variance at the least cost: with a start costing
`C` (per point: a start serves every point of its configuration) and a run `c`, `n = sqrt((C / c) * (r^2 / s^2))`
(`runs_per_start`). The starts are then the fewest whose t-interval over starts (k - 1 degrees of freedom) is
within the precision asked (`starts_for`), at least 3 and at most `design.max_starts`. Where the spreads are
not known, the pilot design (3 starts x 2 runs) measures both; `components` reads them from its runs.

`applied` turns a campaign's design into what the driver already runs: `order.instances` (the starts, in blocks
ordered AB BA across configurations: A B, B A, A B ...; at the same time where the cluster has room) and `runs`
(starts x runs per start: run r of a point on start r mod starts). Pure: no Ray, no processes.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from scipy import stats
from scipy.optimize import brentq

from raysweep.campaign.design import MIN_STARTS, PILOT, DesignSpec
from raysweep.maths.hierarchy import FEW_STARTS
from raysweep.plan.guess import DEFAULTS, guess_point_s

if TYPE_CHECKING:
    from raysweep.campaign import CampaignSpec

__all__ = ["AUTO_LEAST", "FEW_STARTS", "POWER", "Design", "applied", "block_text", "choose", "components", "design_of",
           "components_of", "detectable_lead", "dry_run_lines", "half_width", "measured_lines", "runs_per_start",
           "starts_for", "test_df"]

AUTO_LEAST = 3  # auto gives at least this many starts: 2 a side leave a t over starts 2 degrees of freedom
POWER = 0.8  # the power at which the dry run quotes the smallest lead a design shows


@dataclass(frozen=True)
class Design:
    """The chosen design: `starts` x `runs_per_start` per configuration and point, how it was chosen (`basis`:
    given, chosen or pilot), the spreads and costs it was chosen from, and what it is expected to give (the
    relative half-width of a configuration's value and the smallest lead shown at `POWER`; None where the
    spreads are not known)."""

    starts: int
    runs_per_start: int
    basis: str
    metric: str
    target: float
    confidence: float
    start_cv: float | None
    run_cv: float | None
    start_s: float
    run_s: float
    points: int
    expected: float | None = None
    detectable: float | None = None
    capped: bool = False  # auto reached max_starts before the target

    @property
    def runs(self) -> int:
        """Runs of each point per configuration."""
        return self.starts * self.runs_per_start

    def cost_s(self, configs: int) -> float:
        """Seconds of starts and runs the design takes for `configs` configurations, one after another."""
        return configs * self.starts * (self.start_s + self.points * self.runs_per_start * self.run_s)

    def text(self) -> str:
        """One line: the design and why."""
        how = {"given": "as given", "pilot": "the pilot design: the spreads between starts and between runs are "
               "not known yet (design.start_cv, design.run_cv); its runs measure both",
               "chosen": f"chosen from a spread between starts of {self.start_cv:.1%} and between runs of "
               f"{self.run_cv:.1%} (of the mean) and a start of {self.start_s:.0f} s against a run of "
               f"{self.run_s:.0f} s" if self.start_cv is not None and self.run_cv is not None else ""}[self.basis]
        out = (f"{self.starts} server start(s) x {self.runs_per_start} run(s) per start of each point, per "
               f"configuration ({how})")
        if self.expected is not None:
            out += (f"; expected: {self.metric} of a configuration within +-{self.expected:.1%} "
                    f"({self.confidence:.0%} t over {self.starts} starts)")
            if self.capped:
                out += f", short of the +-{self.target:.1%} asked: design.max_starts reached"
        if self.detectable is not None and math.isfinite(self.detectable):
            out += f"; a lead of {self.detectable:.0%} is shown {POWER:.0%} of the time"
        return out


def half_width(start_cv: float, run_cv: float, starts: int, runs: int, confidence: float) -> float:
    """The expected relative half-width of a configuration's value over `starts` starts of `runs` runs."""
    if starts < 2:
        return math.inf
    var = start_cv ** 2 + run_cv ** 2 / max(runs, 1)
    return float(stats.t.ppf(0.5 + confidence / 2, starts - 1) * math.sqrt(var / starts))


def runs_per_start(start_cv: float, run_cv: float, start_cost: float, run_cost: float, most: int) -> int:
    """Kalibera and Jones's runs per start: `sqrt((C / c) * (r^2 / s^2))`, rounded, 1 to `most`."""
    if run_cv <= 0:
        return 1
    if start_cv <= 0 or run_cost <= 0:
        return most
    n = math.sqrt((start_cost / run_cost) * (run_cv ** 2 / start_cv ** 2))
    return max(1, min(most, round(n)))


def starts_for(start_cv: float, run_cv: float, runs: int, target: float, confidence: float, least: int,
               most: int) -> tuple[int, float, bool]:
    """The fewest starts from `least` to `most` whose expected half-width is within `target`: (starts, its
    half-width, whether `most` was reached without it)."""
    least = max(MIN_STARTS, min(least, most))
    for k in range(least, most + 1):
        hw = half_width(start_cv, run_cv, k, runs, confidence)
        if hw <= target:
            return k, hw, False
    return most, half_width(start_cv, run_cv, most, runs, confidence), True


def test_df(starts: int) -> int:
    """The degrees of freedom the verdict between two configurations of `starts` starts each reads: with few
    starts a side (under `FEW_STARTS`) Hsu's starts - 1, which holds its error rate whatever the two sides'
    spreads; else Welch's, 2 x starts - 2 for sides alike."""
    return starts - 1 if starts < FEW_STARTS else 2 * starts - 2


def detectable_lead(start_cv: float, run_cv: float, starts: int, runs: int, alpha: float = 0.05,
                    power: float = POWER) -> float:
    """The relative lead two configurations of this design are shown apart by, `power` of the time: Student's t
    over the starts' means as the verdicts read it (`test_df`), two-sided at `alpha`, from the noncentral t."""
    if starts < 2:
        return math.inf
    sd = math.sqrt(start_cv ** 2 + run_cv ** 2 / max(runs, 1))
    if sd <= 0:
        return 0.0
    df = test_df(starts)
    crit = float(stats.t.ppf(1 - alpha / 2, df))
    scale = sd * math.sqrt(2 / starts)

    def short(lead: float) -> float:
        nc = lead / scale
        other = float(stats.nct.cdf(-crit, df, nc))  # the wrong side: nil for a lead this large (nan at times)
        return float(stats.nct.sf(crit, df, nc)) + (other if math.isfinite(other) else 0.0) - power
    return float(brentq(short, 1e-12, (crit + 6) * scale))  # power at the top: 1 less a few in a thousand


def choose(spec: DesignSpec, start_s: float, run_s: float, points: int) -> Design:
    """The design of `spec` for configurations of `points` bench points whose start costs `start_s` and run
    `run_s` (seconds; `spec.start_s` / `spec.run_s` where given)."""
    start_s = spec.start_s if spec.start_s is not None else start_s
    run_s = spec.run_s if spec.run_s is not None else run_s
    points = max(points, 1)
    given = spec.starts != "auto" and spec.runs_per_start != "auto"

    def design(starts: int, runs: int, basis: str, **more: Any) -> Design:
        return Design(starts=starts, runs_per_start=runs, basis=basis, metric=spec.metric, target=spec.rel_half_width,
                      confidence=spec.confidence, start_cv=spec.start_cv, run_cv=spec.run_cv, start_s=start_s,
                      run_s=run_s, points=points, **more)
    if spec.start_cv is None or spec.run_cv is None:
        starts = spec.starts if isinstance(spec.starts, int) else PILOT[0]
        runs = spec.runs_per_start if isinstance(spec.runs_per_start, int) else PILOT[1]
        return design(starts, runs, "given" if given else "pilot")
    runs = spec.runs_per_start if isinstance(spec.runs_per_start, int) else runs_per_start(
        spec.start_cv, spec.run_cv, start_s / points, run_s, spec.max_runs_per_start)
    if isinstance(spec.starts, int):
        starts, capped = spec.starts, False
        hw = half_width(spec.start_cv, spec.run_cv, starts, runs, spec.confidence)
    else:
        starts, hw, capped = starts_for(spec.start_cv, spec.run_cv, runs, spec.rel_half_width, spec.confidence,
                                        AUTO_LEAST, spec.max_starts)
    lead = detectable_lead(spec.start_cv, spec.run_cv, starts, runs, 1 - spec.confidence)
    return design(starts, runs, "given" if given else "chosen", expected=hw, detectable=lead, capped=capped)


def design_of(spec: CampaignSpec, points: int | None = None) -> Design | None:
    """The design of a resolved campaign (`CampaignSpec`), its costs guessed from its commands (so that a
    resumed campaign gets the same design); None without `design:`."""
    c = spec.campaign
    d = getattr(c, "design", None)
    if d is None:
        return None
    run_s = statistics.median([guess_point_s(list(spec.bench_argv), False, DEFAULTS)] + [
        guess_point_s(_applied_argv(spec.bench_argv, combo), False, DEFAULTS) for combo in spec.bench_combos])
    start_s = DEFAULTS.server_start_s
    return choose(d, start_s, run_s, points if points is not None else max(len(spec.bench_combos), 1))


def _applied_argv(argv: Sequence[str], combo: Mapping[str, Any]) -> list[str]:
    from raysweep import grid

    return grid.apply_to_cmd(list(argv), dict(combo))


def applied(spec: CampaignSpec) -> CampaignSpec:
    """The campaign with its design in place: `order.instances` = starts, `runs` = starts x runs per start
    (unchanged without `design:`)."""
    design = design_of(spec)
    if design is None:
        return spec
    c = spec.campaign
    order = c.order.model_copy(update={"instances": design.starts})
    return replace(spec, campaign=c.model_copy(update={"runs": design.runs, "order": order}))


def block_text(labels: Sequence[str], starts: int) -> str:
    """The blocks of starts: `A B | B A | A B` (configurations in order on even blocks, reversed on odd)."""
    return " | ".join(" ".join(labels if b % 2 == 0 else list(reversed(labels))) for b in range(starts))


def dry_run_lines(spec: CampaignSpec, labels: Sequence[str], together: bool | None, points: int,
                  start_s: float | None = None, run_s: float | None = None) -> list[str]:
    """What the dry run says of the design: the starts and runs, the blocks, and what they cost (at the
    measured `start_s` / `run_s` where given, else the design's guesses)."""
    design = design_of(spec, points)
    if design is None:
        return []
    if start_s is not None or run_s is not None:
        design = replace(design, start_s=start_s or design.start_s, run_s=run_s or design.run_s)
    letters = [chr(ord("A") + i) if i < 26 else f"#{i}" for i in range(len(labels))]
    how = ("a block's configurations at the same time where the cluster has room, else one after another"
           if together is None else "a block's configurations at the same time" if together else "one after another")
    configs = len(labels)
    return [f"Design: {design.text()}",
            f"  {configs} configuration(s) x {design.starts} start(s) = {configs * design.starts} server start(s), "
            f"{configs * design.runs * points} run(s); blocks ordered AB BA, {how}: "
            f"{block_text(letters, design.starts)}"
            + (" (" + ", ".join(f"{a} = {lab}" for a, lab in zip(letters, labels, strict=False)) + ")"
               if configs <= 6 else ""),
            f"  cost: about {design.cost_s(configs):.0f} s of starts and runs (a start {design.start_s:.0f} s, a run "
            f"{design.run_s:.0f} s); run r of a point goes to start r mod {design.starts}"]


def components(values: Iterable[tuple[Any, Any, float]]) -> tuple[float, float | None, int] | None:
    """The spread between starts and between runs, as fractions of the mean, from runs given as (group, start,
    value): a group is a configuration at a bench point, a start one of its server starts. The run spread is
    pooled within starts; the start spread is that of the start means less what the runs put in it (the
    one-way random-effects estimate, at 0 when negative). Returns (start_cv, run_cv, groups used), run_cv None
    where no start has two runs (the start spread then holds the runs' too), or None where no group has two
    starts."""
    groups: dict[Any, dict[Any, list[float]]] = {}
    for group, start, value in values:
        if value is not None and math.isfinite(value):
            groups.setdefault(group, {}).setdefault(start, []).append(float(value))
    within_ss, within_df, start_parts = 0.0, 0, []
    for by_start in groups.values():
        mean = statistics.fmean(v for vs in by_start.values() for v in vs)
        if mean == 0:
            continue
        for vs in by_start.values():
            if len(vs) > 1:
                m = statistics.fmean(vs)
                within_ss += sum(((v - m) / mean) ** 2 for v in vs)
                within_df += len(vs) - 1
        if len(by_start) >= 2:
            means = [statistics.fmean(vs) / mean for vs in by_start.values()]
            n_avg = statistics.fmean(len(vs) for vs in by_start.values())
            start_parts.append((statistics.variance(means), n_avg))
    if not start_parts:
        return None
    run_var = within_ss / within_df if within_df else 0.0
    start_var = statistics.fmean(max(0.0, v - run_var / n) for v, n in start_parts)
    return math.sqrt(start_var), math.sqrt(run_var) if within_df else None, len(start_parts)


def components_of(records: Iterable[Mapping[str, Any]], metric: str) -> tuple[float, float | None, int] | None:
    """`components` of the run records of a campaign (its result files): a configuration at a bench point is a
    group (a confirmation's runs with the point they confirm), its `server_id` a start."""
    def value(r: Mapping[str, Any]) -> float:
        v = r.get(metric)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan
    return components(((r.get("serve_id"), r.get("confirms_bench_id") or r.get("bench_id")), r.get("server_id"),
                       value(r)) for r in records if r.get("server_id") is not None)


def measured_lines(spec: CampaignSpec, measured: tuple[float, float | None, int] | None, start_s: float | None,
                   run_s: float | None, points: int, source: str) -> list[str]:
    """What the spreads measured in earlier runs (`components_of`) say: the design they choose for this campaign
    (its `design:`, else the defaults of one), at the measured costs where given; [] where nothing was measured
    on two starts or more."""
    if measured is None:
        return []
    start_cv, run_cv, groups = measured
    d = getattr(spec.campaign, "design", None) or DesignSpec()
    guess = design_of(replace(spec, campaign=spec.campaign.model_copy(update={"design": d})), points)
    assert guess is not None
    runs = 0.0 if run_cv is None else run_cv
    chosen = choose(d.model_copy(update={"start_cv": round(start_cv, 3), "run_cv": round(runs, 3),
                                         "starts": "auto", "runs_per_start": "auto"}),
                    start_s or guess.start_s, run_s or guess.run_s, points)
    within = (f"a run by {runs:.1%} within a start" if run_cv is not None else
              "a run within a start not measured (one run per start: the start spread holds it)")
    said = (f"Measured in {source}: a start's mean varies by {start_cv:.1%} from start to start, {within} "
            f"({groups} point(s) on 2 server starts or more)")
    return [said, f"  `design: {{start_cv: {start_cv:.3f}, run_cv: {runs:.3f}}}` would choose "
                  f"{chosen.starts} start(s) x {chosen.runs_per_start} run(s) per start"
                  + (f" (expected +-{chosen.expected:.1%}" if chosen.expected is not None else " (")
                  + (f"; a lead of {chosen.detectable:.0%} shown {POWER:.0%} of the time)"
                     if chosen.detectable is not None and math.isfinite(chosen.detectable) else ")")]

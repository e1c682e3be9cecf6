"""The dry run of a tuning campaign: its space, objective, budget and sampler, what each candidate runs, the
first candidates the sampler would ask for, and what one candidate costs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from raysweep import grid
from raysweep.place import placement
from raysweep.plan.plan import Plan, ServeConfig, serve_points
from raysweep.tune.ranking import objective_names
from raysweep.tune.sampler import Tuner
from raysweep.tune.space import SLA_CAPACITY, candidate_serve, refusal

if TYPE_CHECKING:
    from raysweep.plan.estimate import Measured


def dry_run_lines(plan: Plan, nodes: list[placement.NodeInfo] | None = None,
                  describe: Callable[[ServeConfig, placement.Layout], list[str]] | None = None,
                  first: int = 4) -> list[str]:
    """The space, objective, budget and sampler, what each candidate runs, and the first candidates the
    sampler would ask for (with a seed, the ones the run starts with)."""
    t = plan.spec.campaign.tune
    assert t is not None
    lines = ["", f"Tuning with sampler {t.sampler}" + (f" (seed {t.seed})" if t.seed is not None else "")
             + ", space:"]
    for key, p in t.space.items():
        if p.choices is not None:
            lines.append(f"  {key}: choices {p.choices}")
        else:
            lines.append(f"  {key}: {p.low:g} .. {p.high:g}" + (" log" if p.log else "")
                         + (f" step {p.step:g}" if p.step else ""))
    lines += [f"  exclude: {rule}" for rule in t.exclude]
    if plan.spec.serve_combos[0]:
        lines.append(f"  every candidate also sets: {grid.combo_label(plan.spec.serve_combos[0])}")
    names = objective_names(t)
    lines.append(("Objective: " if len(names) == 1 else "Pareto front of: ") + " and ".join(names)
                 + f", {t.objectives[0].aggregate} over each candidate's bench points")
    b = t.budget
    parts = [f"{b.candidates} candidates" if b.candidates else "", f"{b.gpu_hours:g} GPU-hours" if b.gpu_hours else "",
             f"{b.wall_hours:g} hours" if b.wall_hours else ""]
    given = [x for x in parts if x]
    lines.append("Budget: " + " or ".join(given) + (", whichever comes first" if len(given) > 1 else "") + "; "
                 + (f"{t.parallel} candidate(s) at once" if t.parallel else "as many at once as free GPUs allow"))
    es = t.early_stop
    single = len(t.objectives) == 1 and t.objectives[0].metric != SLA_CAPACITY
    lines.append(f"Early stopping: successive halving, eta {es.eta}, from {es.min_peers} candidates at a rung"
                 if es.enabled and single else "Early stopping: off")
    lines.append(f"Each candidate runs {len(plan.benches)} bench point(s) x {plan.spec.campaign.runs} run(s):")
    for bp in plan.benches:
        lines.append(f"  [bench {bp.id}] {bp.label}: {grid.shell_join(grid.mask_argv(bp.argv))}")
    tuner = Tuner(t)
    lines += ["", f"First candidates the sampler asks for ({first}):"]
    for i in range(first):
        _, params = tuner.ask()
        serve = candidate_serve(plan.spec, params)
        lines.append(f"[candidate {i}] {serve.label}  shape: {serve.shape.describe()} gpus={serve.shape.gpu_count}")
        why = refusal(t, serve, nodes)
        lay = placement.layout_for(serve.shape, serve.rule, nodes) if nodes and why is None else None
        if why is not None:
            lines.append(f"  refused: {why}")
        elif describe is not None and isinstance(lay, placement.Layout):
            lines += describe(serve, lay)
        else:
            lines.append(f"  command: {grid.shell_join(serve.display_argv())} --host <node ip> --port <free port>")
    return lines


def dry_run_estimate(plan: Plan, measured: Measured | None = None, first: int = 4) -> str:
    """What one candidate costs (the mean of the first candidates the sampler asks for, from the commands or
    what `measured` holds), and what the budget's candidate count would then hold at most."""
    from raysweep.plan.estimate import estimate, format_duration

    t = plan.spec.campaign.tune
    assert t is not None
    tuner, costs = Tuner(t), []
    for _ in range(first):
        _, params = tuner.ask()
        serve = candidate_serve(plan.spec, params)
        if refusal(t, serve, None):
            continue
        points, _, _ = serve_points(plan.spec, serve, plan.benches)
        one = Plan(spec=plan.spec, serves=[serve], benches=plan.benches, points=points, fingerprint=plan.fingerprint)
        costs.append(estimate(one, measured=measured))
    if not costs:
        return "Estimate: none (the first candidates are all refused)"
    wall = sum(e.wall_s for e in costs) / len(costs)
    gpu_h = sum(e.gpu_hours for e in costs) / len(costs)
    text = (f"Estimate ({costs[0].basis}): one candidate about {format_duration(wall)} and {gpu_h:.2f} GPU-hour(s) "
            f"run to its end (the mean of the first {len(costs)})")
    if t.budget.candidates:
        text += f"; {t.budget.candidates} candidates at most about {t.budget.candidates * gpu_h:.1f} GPU-hour(s)"
    return text + "; early stopping and the budget cut it short"

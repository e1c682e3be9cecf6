"""Tuning: search a campaign's serve parameters instead of running their whole grid.

A campaign with a `tune:` block has no server configuration in its plan at first. While it runs, the
driver asks an Optuna sampler for candidates (ask-and-tell): each is a server configuration added to the
plan and the ledger, placed, packed and run by the scheduler like any other, with the campaign's bench
points. When a candidate ends, its objective (a result field over its bench points, per GPU or per user,
or the SLA capacity its searches found) is told to the sampler. Candidates run their most informative bench
points first; with early stopping (successive halving, asynchronous) one that ranks outside the best 1/eta
of its peers at a rung is stopped and its GPUs go to the next candidate. With two objectives (Pareto), each
bench point of a candidate is one point of the trade-off: the sampler learns every one, candidates run both
ends of the load first, and one whose every point is dominated by other candidates' points at a rung stops;
after the sampler's start-up candidates, each next one is the untried configuration whose optimistic
predicted points add the most hypervolume (`surrogate`, `tune.pareto_model`), and the end of the budget goes
to configurations one step from those on or near the front.

Every candidate is a ledger row (`candidates`: number, parameters, state, objective, rung values, reason,
GPU-seconds); a resumed campaign rebuilds the plan and the sampler from those rows, so no finished
candidate runs again.

Rooms: `space` (the search space and its checks), `sampler` and `surrogate` (who proposes), `candidates`,
`work` (a candidate's life as the scheduler's work), `objective`, `rungs` (early stopping), `budget`,
`proposals` (the surrogate's and the front's neighbours), `ranking` (the leaderboard), `dry_run`; the Pareto
geometry (dominance, hypervolume, the front) is `raysweep.maths.pareto`. The report's Tuning section is
`report_section`, registered with the report when this package is imported; the run reaches `restore_plan`,
`TuneWork` and `TunedCluster` through `raysweep.drive.hooks`, where this package lends itself.

A mode. May import: every stage and the stage-free rooms; never another mode.

The names below are loaded on first use, so that importing one room does not import Optuna.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from raysweep.drive import hooks
from raysweep.report.registry import Section, register

if TYPE_CHECKING:
    from raysweep.results.data import ReportData
    from raysweep.tune.budget import Budget
    from raysweep.tune.candidates import STATES, Candidate, restore_plan
    from raysweep.tune.dry_run import dry_run_estimate, dry_run_lines
    from raysweep.tune.objective import Objective
    from raysweep.tune.proposals import MODEL_CANDIDATES, POLISH_SHARE, Proposals
    from raysweep.tune.ranking import leaderboard, objective_names
    from raysweep.tune.rungs import Rungs, rung_sizes
    from raysweep.tune.sampler import MAX_ASKS, STARTUP, Tuner
    from raysweep.tune.space import (
        GRID_LIMIT,
        SHAPE_KEYS,
        SLA_CAPACITY,
        candidate_serve,
        check_tune,
        distribution,
        distributions,
        refusal,
    )
    from raysweep.tune.work import TunedCluster, TuneWork

_WHERE = {
    "Budget": "budget", "STATES": "candidates", "Candidate": "candidates", "restore_plan": "candidates",
    "dry_run_estimate": "dry_run", "dry_run_lines": "dry_run", "leaderboard": "ranking",
    "objective_names": "ranking", "Objective": "objective",
    "MODEL_CANDIDATES": "proposals",
    "POLISH_SHARE": "proposals", "Proposals": "proposals", "Rungs": "rungs", "rung_sizes": "rungs",
    "MAX_ASKS": "sampler", "STARTUP": "sampler", "Tuner": "sampler", "GRID_LIMIT": "space", "SHAPE_KEYS": "space",
    "SLA_CAPACITY": "space", "candidate_serve": "space", "check_tune": "space", "distribution": "space",
    "distributions": "space", "refusal": "space", "TunedCluster": "work", "TuneWork": "work",
}

__all__ = ["Budget", "Candidate", "GRID_LIMIT", "MAX_ASKS", "MODEL_CANDIDATES", "Objective", "POLISH_SHARE",
           "Proposals", "Rungs", "SHAPE_KEYS", "SLA_CAPACITY", "STARTUP", "STATES", "TuneWork", "TunedCluster", "Tuner",
           "candidate_serve", "check_tune", "distribution", "distributions", "dry_run_estimate", "dry_run_lines",
           "leaderboard", "objective_names", "refusal", "restore_plan", "rung_sizes"]


def _tuning_section(data: ReportData) -> str | None:
    from raysweep.tune.report_section import report_section  # imports Optuna: only for a campaign with `tune:`

    return report_section(data.directory)


register(Section("tuning", "Tuning", _tuning_section, lambda d: bool(d.campaign.get("tune")), order=90))
hooks.register("tune", lambda: importlib.import_module(__name__))  # its names load on first use (below)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"raysweep.tune.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'raysweep.tune' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__

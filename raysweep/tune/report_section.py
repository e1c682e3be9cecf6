"""The report's Tuning section: the leaderboard, the objective over candidates, parameter importance and
(two objectives) the Pareto front of candidates, read from the ledger."""

from __future__ import annotations

import html
import logging
import warnings
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import TrialState

from raysweep import grid
from raysweep.campaign import TuneSpec
from raysweep.maths.pareto import pareto_front
from raysweep.record.directory import CampaignDir
from raysweep.tune.ranking import leaderboard, objective_names
from raysweep.tune.sampler import Tuner, _steps

if TYPE_CHECKING:
    from matplotlib.figure import Figure

log = logging.getLogger(__name__)


def _figure_html(fig: Figure, caption: str) -> str:
    """The figure as the report embeds it (a base64 PNG with its caption), then closed."""
    import matplotlib.pyplot as plt

    from raysweep.report.figures import img_html

    try:
        return img_html(fig, caption)
    finally:
        plt.close(fig)


def _importance(t: TuneSpec, rows: list[dict[str, Any]]) -> dict[str, float]:
    tuner = Tuner(t.model_copy(update={"sampler": "random"}))
    for r in rows:
        if r["state"] == "complete" and r["objective"]:
            tuner.add(r["params"], "complete", r["objective"])
    if sum(1 for tr in tuner.study.trials if tr.state == TrialState.COMPLETE) < 3 or len(t.space) < 2:
        return {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return dict(optuna.importance.get_param_importances(
                tuner.study, target=(lambda tr: tr.values[0]) if len(t.objectives) > 1 else None))
    except (RuntimeError, ValueError) as exc:
        log.info("parameter importance: %s", exc)
        return {}


def report_section(directory: CampaignDir) -> str | None:
    """The report's tuning section (its HTML without the heading): the leaderboard, the objective over
    candidates, parameter importance and (two objectives) the Pareto front of candidates. None for a
    campaign without `tune:`."""
    try:
        ledger = directory.ledger
    except Exception:
        return None
    campaign, rows = ledger.stored_campaign(), ledger.candidates()
    if not campaign.get("tune") or not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = TuneSpec.model_validate(campaign["tune"])
    board = leaderboard(campaign, [dict(r) for r in rows])
    names = objective_names(t)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in ["rank", "candidate", "state", *names, "parameters",
                                                          "GPU-hours", "reason"])
    body = []
    for r in board:
        objs = r["objective"] or [None] * len(names)
        cells = [r["rank"], r["number"], r["state"] + (" (front)" if r.get("on_front") else ""),
                 *[("-" if v is None else f"{v:.4g}") for v in objs], grid.combo_label(r["params"]),
                 f"{r['gpu_s'] / 3600:.3f}", r["reason"] or ""]
        body.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    parts = [f"<p>{len(rows)} candidate(s); objective: {html.escape(' and '.join(names))}.</p>",
             f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"]
    done = [r for r in rows if r["state"] == "complete" and r["objective"]]
    if done:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.scatter([r["number"] for r in done], [r["objective"][0] for r in done], label="complete")
        pruned = [(r["number"], _steps(r["rungs"])[-1][1]) for r in rows
                  if r["state"] == "pruned" and _steps(r["rungs"])]
        if pruned:
            ax.scatter(*zip(*pruned), marker="x", color="grey", label="stopped (last rung)")
        best, run = [], None
        for r in sorted(done, key=lambda r: r["number"]):
            v = r["objective"][0]
            run = v if run is None else (max(run, v) if t.objectives[0].direction == "maximize" else min(run, v))
            best.append((r["number"], run))
        ax.step(*zip(*best), where="post", color="black", label="best so far")
        ax.set_xlabel("candidate")
        ax.set_ylabel(names[0])
        ax.legend(fontsize=8)
        parts.append(_figure_html(fig, f"{names[0]} over candidates"))
    imp = _importance(t, rows)
    if imp:
        fig, ax = plt.subplots(figsize=(6, 0.5 + 0.4 * len(imp)))
        keys = list(imp)[::-1]
        ax.barh(keys, [imp[k] for k in keys])
        ax.set_xlabel("importance (fANOVA)")
        parts.append(_figure_html(fig, f"parameter importance for {names[0]}"))
    if len(names) == 2 and done:
        pts = [tuple(r["objective"]) for r in done]
        front = pareto_front(pts, [o.direction for o in t.objectives])
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], color="grey", label="candidates")
        fp = sorted(pts[i] for i in front)
        ax.plot([p[0] for p in fp], [p[1] for p in fp], "o-", color="C3", label="Pareto front")
        ax.set_xlabel(names[0])
        ax.set_ylabel(names[1])
        ax.legend(fontsize=8)
        parts.append(_figure_html(fig, "Pareto front of candidates"))
    return "".join(parts)

"""Checking a campaign file before running it: `schema` (its JSON Schema, for editors) and `validate`."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from typing import TYPE_CHECKING, Any

import click

from raysweep.cli._common import _say, console, main
from raysweep.cli.jsonout import json_option, print_json
from raysweep.errors import UserError

if TYPE_CHECKING:
    from raysweep.plan.plan import Plan

_SAY_READ_S = 0.5  # `validate` says what reading the bench data cost when it took this long or longer
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:-)?")  # ${VAR} or ${VAR:-default}
DEMO_MODEL = "RAYSWEEP_DEMO_MODEL"


def unset_variables(campaign_file: str) -> list[str]:
    """The `${VAR}` references (without a default) of a campaign file whose variable is not set here."""
    try:
        with open(campaign_file, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError):
        return []  # loading the file says what is wrong with it
    text = "\n".join(line.split(" #")[0] for line in text.splitlines() if not line.lstrip().startswith("#"))
    return sorted({m.group(1) for m in _REFERENCE.finditer(text) if m.group(2) is None} - set(os.environ))


def unset_note(name: str) -> str:
    """What `validate` says of a variable that is not set: checked with a stand-in; `run` needs it."""
    how = (f" (`make demo` makes the tiny model in .cache/tiny-llama: export {name}=$PWD/.cache/tiny-llama)"
           if name == DEMO_MODEL else "")
    return f"${{{name}}} is not set: checked with a stand-in for its value; `run` needs it set{how}"


@main.command()
def schema() -> None:
    """Print the JSON Schema of a campaign file (configs/raysweep-campaign.schema.json is a copy)."""
    from raysweep.campaign.schema import campaign_schema

    _say(json.dumps(campaign_schema(), indent=2))


@main.command()
@click.argument("campaign_files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@json_option
def validate(campaign_files: tuple[str, ...], as_json: bool) -> None:
    """Check campaign files and their parameter files as `run` would (fields, parameter grids, commands, links,
    SLA, GPU shapes, pins, every data file the bench points read, line by line) without starting Ray or
    placing anything; exit 0 when every file is valid, 2 when
    one is not (each file is checked and reported)."""
    reports = [_check(f) for f in campaign_files]
    if as_json:
        print_json("validate", {"valid": all(r["valid"] for r in reports), "files": reports})
    else:
        for r in reports:
            if r["valid"]:
                _say(f"OK {r['file']}: campaign {r['campaign']}, {r['server_configs']} {r['what']} x "
                     f"{r['bench_points']} bench point(s) x {r['runs_per_point']} run(s) = {r['runs']} run(s)"
                     + (f", {r['sla_searches']} SLA search(es)" if r["sla_searches"] else "") + r["more"])
                for note in r["notes"]:
                    _say(f"note: {note}")
            else:
                console.print("error:", style="bold red", end=" ")
                _say(f"{r['file']}: {r['error']}" if len(reports) > 1 else r["error"], err=True)
    if not all(r["valid"] for r in reports):
        sys.exit(2)


def _check(campaign_file: str) -> dict[str, Any]:
    from raysweep.bench.checks import check_data_files
    from raysweep.campaign import load_campaign
    from raysweep.campaign.vllm_options import check_campaign
    from raysweep.plan.plan import build_plan

    unset = unset_variables(campaign_file)
    try:
        env = {**os.environ, **{name: f"<{name}>" for name in unset}}
        plan = build_plan(load_campaign(campaign_file, env=env))
        options = check_campaign(plan.spec)  # serve and bench options against vLLM's own parser
        t0 = time.monotonic()
        notes = check_data_files(plan.spec)  # every data file its bench points read, line by line
        took = time.monotonic() - t0
        if took >= _SAY_READ_S:
            notes = [f"reading the bench points' data (files and tokenizer, to check their tokens) took {took:.1f} s",
                     *notes]
        if options.note:
            notes = [f"vLLM options not checked: {options.note}", *notes]
        notes = [*map(unset_note, unset), *notes]
    except UserError as exc:
        return {"file": campaign_file, "valid": False, "error": str(exc), "field": getattr(exc, "field", None)}
    c = plan.spec.campaign
    counts = _all_runs(plan)
    return {"file": campaign_file, "valid": True, "error": None, "field": None, "campaign": c.name,
            "what": "offline config(s)" if plan.spec.offline else "server config(s)",
            "server_configs": sum(1 for s in plan.serves if plan.points_of(s.id)), "bench_points": len(plan.benches),
            "runs_per_point": counts["per_point"], "runs": len(plan.points), "sla_searches": len(plan.searches),
            "notes": notes + ([counts["note"]] if counts.get("note") else []),
            **{k: v for k, v in counts.items() if k not in ("per_point", "note")}}


def _all_runs(plan: Plan) -> dict[str, Any]:
    """What the campaign will run beyond the plan's first runs: the runs bench.precision may add, the winner's
    confirmation where it is on, the server starts of a design; `more` says it in words ("" when nothing)."""
    from raysweep.plan.design import design_of
    from raysweep.plan.estimate import estimate

    c = plan.spec.campaign
    out: dict[str, Any] = {"per_point": c.runs, "more": "", "runs_most": len(plan.points), "confirm_runs": 0,
                           "server_starts": None}
    if plan.spec.offline or c.tune is not None or c.sla is not None or c.bench is None:
        return out
    est = estimate(plan)
    out["server_starts"] = est.server_starts
    precision = getattr(c.bench, "precision", None)
    words = []
    if precision is not None:
        out["note"] = ("bench.precision adds its runs inside one server start (the last, with order.instances): they "
                       "narrow what that start measured, not what the next start adds; on one start per "
                       "configuration its points are ranked, not compared. `design:` replaces it for verdicts "
                       "(docs/design.md)")
        out["per_point"] = f"{precision.min_runs} to {precision.max_runs}"
        out["runs_most"] = est.most_points if est.most_points is not None else len(plan.points)
        words.append(f"up to {out['runs_most']} with bench.precision")
    design = design_of(plan.spec, len(plan.benches))
    if design is not None:
        words.append(f"design: {design.starts} server start(s) x {design.runs_per_start} run(s) per start per "
                     f"configuration")
    if est.confirm is not None:
        out["confirm_runs"] = est.confirm[1]
        words.append(f"then the winner's confirmation: {est.confirm[1]} run(s) on {est.confirm[0]} fresh server "
                     "start(s)")
    if words:
        total = out["runs_most"] + out["confirm_runs"]
        out["more"] = f" ({'; '.join(words)}): {total} run(s) on {est.server_starts + (est.confirm or (0,))[0]} " \
                      "server start(s) in all"
    return out

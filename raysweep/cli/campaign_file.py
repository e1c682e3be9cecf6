"""Checking a campaign file before running it: `schema` (its JSON Schema, for editors) and `validate`."""

from __future__ import annotations

import json

import click

from raysweep.cli._common import _say, main


@main.command()
def schema() -> None:
    """Print the JSON Schema of a campaign file (configs/raysweep-campaign.schema.json is a copy)."""
    from raysweep.schema import campaign_schema

    _say(json.dumps(campaign_schema(), indent=2))


@main.command()
@click.argument("campaign_file", type=click.Path(dir_okay=False))
def validate(campaign_file: str) -> None:
    """Check a campaign file and its parameter files as `run` would (fields, parameter grids, commands, links,
    SLA, GPU shapes, pins) without starting Ray or placing anything; exit 0 when it is valid, 2 when not."""
    from raysweep.campaign import load_campaign
    from raysweep.plan import build_plan

    plan = build_plan(load_campaign(campaign_file))
    c = plan.spec.campaign
    serves = sum(1 for s in plan.serves if plan.points_of(s.id))
    what = "offline config(s)" if plan.spec.offline else "server config(s)"
    _say(f"OK {campaign_file}: campaign {c.name}, {serves} {what} x {len(plan.benches)} bench point(s) x "
         f"{c.runs} run(s) = {len(plan.points)} run(s)"
         + (f", {len(plan.searches)} SLA search(es)" if plan.searches else ""))

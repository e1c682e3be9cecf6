"""The first day on a GPU cluster: `acceptance` (run the acceptance campaign, then its checklist) and
`checklist` (the checklist of a finished campaign)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from raysweep.cli import logs
from raysweep.cli._common import EXISTING_OUTPUT_DIR, _output_dir, _say, address_option, main


def _print_checklist(output_dir: Path, not_run: dict[str, str] | None = None) -> int:
    """Print the checklist of an output dir; the number of items that failed or were not seen."""
    from raysweep.record.directory import CampaignDir
    from raysweep.results import acceptance
    from raysweep.results.table import results_table

    with CampaignDir(output_dir) as campaign_dir:
        ledger = campaign_dir.ledger
        servers = ledger.servers()
        labels = {p.serve_id: ", ".join(f"{k}={v}" for k, v in p.serve_params.items()) or p.serve_id
                  for p in ledger.points()}
        table = results_table(campaign_dir)
    items = acceptance.checklist(servers, table, labels, not_run)
    _say("\n".join(["Checklist:", *acceptance.text_lines(items)]))
    return len(acceptance.failed(items))


@main.command()
@click.argument("output_dir", type=EXISTING_OUTPUT_DIR)
def checklist(output_dir: str) -> None:
    """What a campaign's servers saw, item by item (GPUs per bundle, NCCL links, probe bandwidth, telemetry,
    server starts), with what to fix; exit 1 when an item failed or was not seen."""
    if _print_checklist(Path(output_dir)):
        sys.exit(1)


@main.command()
@click.argument("campaign_file", type=click.Path(dir_okay=False))
@address_option
@click.option("--output-dir", default=None, help="Override the campaign's output_dir.")
@click.option("--dry-run", is_flag=True, help="Print what would run where and what the checklist checks; exit.")
def acceptance(campaign_file: str, address: str | None, output_dir: str | None, dry_run: bool) -> None:
    """Run a GPU acceptance campaign (configs/gpu-acceptance.yaml) on the cluster, leaving out configurations it
    cannot hold (a pipeline across two nodes on one node), then print its checklist."""
    from raysweep.campaign import load_campaign
    from raysweep.cli.running import _dry_run, _run
    from raysweep.drive.driver import ray_session
    from raysweep.place import placement
    from raysweep.results import acceptance as acc

    spec = load_campaign(campaign_file)
    out = _output_dir(spec, output_dir)
    if address:
        with logs.routed(), ray_session(address):
            nodes = placement.cluster_nodes()
    else:
        nodes = placement.local_nodes()
    spec, not_run = acc.placeable(spec, nodes)
    if dry_run:
        _dry_run(spec, address, out, ())
        for label, why in not_run.items():
            _say(f"Not run: {label}: {why}")
        _say("\n".join(acc.dry_run_lines(placement.has_gpus(nodes))))
        return
    code: str | int | None = 0
    try:
        _run(spec, out, address, force=False)
    except SystemExit as exc:  # failed points: the checklist says why
        code = exc.code
    bad = _print_checklist(out, not_run)
    sys.exit(1 if bad or code else 0)

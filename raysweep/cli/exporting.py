"""Export to experiment trackers (MLflow, Weights & Biases) and to llm-d's Benchmark Report v0.2: `export`."""

from __future__ import annotations

import click

from raysweep.cli._common import EXISTING_OUTPUT_DIR, _print_paths, main, out
from raysweep.errors import UserError


@main.command("export")
@click.argument("output_dir", type=EXISTING_OUTPUT_DIR)
@click.option("--mlflow", "mlflow_uri", default=None, metavar="URI",
              help="Log to this MLflow tracking URI: a server URL or sqlite:///path/mlflow.db (file:///path only "
                   "with MLFLOW_ALLOW_FILE_STORE=true). Exporting again updates the same runs. Needs the extra "
                   "raysweep[mlflow].")
@click.option("--wandb", "wandb_project", default=None, metavar="PROJECT",
              help="Log to this Weights & Biases project. Needs the extra raysweep[wandb].")
@click.option("--experiment", default=None, help="MLflow experiment name (default: the campaign name).")
@click.option("--entity", default=None, help="W&B entity (team or user; default: yours).")
@click.option("--no-report", is_flag=True, help="Do not make or log report.html.")
@click.option("--format", "fmt", default=None, metavar="FORMAT",
              help="Write files in this format instead of logging to a tracker: br-v0.2 (llm-d's Benchmark Report "
                   "v0.2, one YAML file per point, with its interval and verdict; Prism reads them).")
@click.option("--out", "dest", default=None, type=click.Path(file_okay=False),
              help="With --format: the directory to write to (default: OUTPUT_DIR/br-v0.2).")
def export_cmd(output_dir: str, mlflow_uri: str | None, wandb_project: str | None, experiment: str | None,
               entity: str | None, no_report: bool, fmt: str | None, dest: str | None) -> None:
    """Log every point (parameters, aggregates, per-run values, validity record) and the report to an
    experiment tracker: one run per point and one for the campaign. With --format br-v0.2: write every point
    as a Benchmark Report v0.2 file instead."""
    from pathlib import Path

    from raysweep.record.directory import CampaignDir
    from raysweep.report import export

    if fmt is not None:
        if fmt != "br-v0.2":
            raise UserError(f"--format: {fmt!r} is not accepted: br-v0.2")
        if mlflow_uri is not None or wandb_project is not None:
            raise UserError("--format: files or a tracker, not both: drop --mlflow/--wandb or --format")
        from raysweep.catalog import br_export

        with CampaignDir(output_dir) as directory:
            paths = br_export.write_reports(directory, Path(dest) if dest else Path(output_dir) / "br-v0.2")
        out.print(f"{len(paths)} Benchmark Report v0.2 file(s) in {paths[0].parent if paths else dest}",
                  highlight=False)
        return
    if dest is not None:
        raise UserError("--out: only with --format (a tracker is named by --mlflow or --wandb)")
    if (mlflow_uri is None) == (wandb_project is None):
        raise UserError("export: name one tracker (--mlflow URI or --wandb PROJECT) or a file format (--format "
                        "br-v0.2)")
    export.tracker_library("mlflow" if mlflow_uri is not None else "wandb")  # before any work: a missing extra
    with CampaignDir(output_dir) as directory:
        campaign = export.export_points(directory, report=not no_report)
    if mlflow_uri is not None:
        done = export.export_mlflow(campaign, mlflow_uri, experiment)
        out.print(f"MLflow {mlflow_uri}: experiment {done['experiment_id']}, campaign run {done['campaign_run']}, "
                  f"{len(done['point_runs'])} point run(s)", highlight=False)
    else:
        done = export.export_wandb(campaign, wandb_project or "", entity)
        out.print(f"W&B project {wandb_project}: campaign run {done['campaign_run']}, {len(done['point_runs'])} "
                  "point run(s)", highlight=False)
    _print_paths(campaign.artifacts, campaign.notes)

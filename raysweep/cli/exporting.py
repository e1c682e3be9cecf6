"""Export to experiment trackers: `export` (MLflow, Weights & Biases)."""

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
def export_cmd(output_dir: str, mlflow_uri: str | None, wandb_project: str | None, experiment: str | None,
               entity: str | None, no_report: bool) -> None:
    """Log every point (parameters, aggregates, per-run values, validity record) and the report to an
    experiment tracker: one run per point and one for the campaign."""
    from raysweep.report import export

    if (mlflow_uri is None) == (wandb_project is None):
        raise UserError("export: name one tracker: --mlflow URI or --wandb PROJECT")
    export.tracker_library("mlflow" if mlflow_uri is not None else "wandb")  # before any work: a missing extra
    campaign = export.export_points(output_dir, report=not no_report)
    if mlflow_uri is not None:
        done = export.export_mlflow(campaign, mlflow_uri, experiment)
        out.print(f"MLflow {mlflow_uri}: experiment {done['experiment_id']}, campaign run {done['campaign_run']}, "
                  f"{len(done['point_runs'])} point run(s)", highlight=False)
    else:
        done = export.export_wandb(campaign, wandb_project or "", entity)
        out.print(f"W&B project {wandb_project}: campaign run {done['campaign_run']}, {len(done['point_runs'])} "
                  "point run(s)", highlight=False)
    _print_paths(campaign.artifacts, campaign.notes)

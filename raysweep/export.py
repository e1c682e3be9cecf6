"""Export of a campaign to an experiment tracker: MLflow or Weights & Biases, each through its own library
(the optional extras `raysweep[mlflow]`, `raysweep[wandb]`).

What is logged is the same for both (`export_points`):
- one run per point (server config x bench point): its parameters (the point's serve and bench parameters,
  ids, labels, GPU shape), its aggregates (`raysweep.aggregate`: `M_mean`, `M_median`, `M_std`, `M_cv`,
  `M_ci_low`, `M_ci_high` per headline metric, `runs`, `runs_needed`), the value of every headline metric
  in each run (MLflow: as the metric's history, one step per run number; W&B: one `log` per run), and its
  validity record (`validity_ok`: every run passes, `validity_issues`, `runs_flagged`,
  `client_limited_runs`, `noisy`, `noisy_metrics`, `ci_method`) as tags (W&B: in the run's summary);
- one campaign run: the campaign's name and output dir, the report (`report.html`, made first when the dir
  has none), `summary.csv` and `results.csv` as artifacts (W&B: the summary also as a table).
MLflow: the point runs are children of the campaign run (tag `mlflow.parentRunId`) in the experiment
`experiment` (default: the campaign name). W&B: every run is in `group` = the campaign name, the campaign
run with `job_type="campaign"`, the points with `job_type="point"`. Every export makes new runs.
Values that are not finite are left out (trackers refuse them).
"""

from __future__ import annotations

import importlib
import logging
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pandas as pd

from raysweep import aggregate
from raysweep.errors import UserError
from raysweep.files import write_text_atomic

__all__ = ["ExportPoint", "export_mlflow", "export_points", "export_wandb", "tracker_library"]

log = logging.getLogger(__name__)

_EXTRAS = {"mlflow": ("mlflow", "--mlflow"), "wandb": ("wandb", "--wandb")}
_TAGS = ("validity_ok", "validity_issues", "runs_flagged", "client_limited_runs", "noisy", "noisy_metrics",
         "ci_method", "campaign")
_MLFLOW_PARAM_MAX = 6000


@dataclass
class ExportPoint:
    """One point as a tracker run: its name, parameters, aggregate metrics, per-run values and validity."""

    name: str
    params: dict[str, Any]
    metrics: dict[str, float]
    runs: list[tuple[int, dict[str, float]]]
    validity: dict[str, Any]


@dataclass
class ExportCampaign:
    """A campaign ready to export: its name, points, and the files logged as artifacts."""

    name: str
    output_dir: Path
    points: list[ExportPoint]
    artifacts: list[Path]
    summary: pd.DataFrame
    notes: list[str] = field(default_factory=list)


def tracker_library(name: str) -> ModuleType:
    """Import a tracker's library (`mlflow` or `wandb`).

    :raises UserError: it is not installed (naming the extra that installs it).
    """
    module, option = _EXTRAS[name]
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise UserError(f"{option}: the {module} library is not installed here ({exc}); install the optional extra: "
                        f"pip install 'raysweep[{name}]'") from exc


def _finite(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _plain(value: Any) -> Any:
    """A value as a tracker stores it: numbers and booleans as they are, missing as None, the rest as text."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return None
    if hasattr(value, "item"):  # numpy scalars
        value = value.item()
    return value if isinstance(value, (bool, int, float, str)) else str(value)


def export_points(output_dir: str | Path, report: bool = True) -> ExportCampaign:
    """The points of a raysweep output dir as tracker runs, and its artifacts (see the module docstring).

    :raises UserError: the dir has no finished run.
    """
    from raysweep.importer import read_table

    out = Path(output_dir)
    results = read_table(out).df
    if results.empty:
        raise UserError(f"OUTPUT_DIR {output_dir}: no finished run to export")
    summary = aggregate.summary_table(out, results=results)
    names = aggregate.summary_params(summary)
    shape = [c for c in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "gpu_count",
                         "num_nodes") if c in summary.columns and c not in names]
    metrics = [str(c)[: -len("_mean")] for c in summary.columns if str(c).endswith("_mean")]
    keys = aggregate.point_keys(results, names)
    points = [_point(row, names + shape, metrics, _runs_of(results, row, keys)) for _, row in summary.iterrows()]
    campaign = _campaign_name(summary, out)
    artifacts, notes = _artifacts(out, summary, results, report)
    return ExportCampaign(campaign, out, points, artifacts, summary, notes)


def _campaign_name(summary: pd.DataFrame, out: Path) -> str:
    names = summary["campaign"].dropna().astype(str).unique() if "campaign" in summary.columns else []
    return str(names[0]) if len(names) else out.resolve().name


def _runs_of(results: pd.DataFrame, row: pd.Series, keys: list[str]) -> pd.DataFrame:
    mask = pd.Series(True, index=results.index)
    for k in keys:
        mask &= results[k].astype(str) == str(row[k])
    return results[mask]


def _point(row: pd.Series, params: list[str], metrics: list[str], runs: pd.DataFrame) -> ExportPoint:
    ids = {c: row[c] for c in ("serve_id", "bench_id", "serve_label", "bench_label") if c in row.index}
    name = " / ".join(str(row[c]) for c in ("serve_label", "bench_label") if c in row.index) or \
        ", ".join(f"{p}={row[p]}" for p in params)
    values: dict[str, float] = {}
    for m in metrics:
        for stat in (*aggregate.STATS, "pooled"):
            v = _finite(row.get(f"{m}_{stat}"))
            if v is not None:
                values[f"{m}_{stat}"] = v
    for c in ("runs", "runs_needed"):
        v = _finite(row.get(c))
        if v is not None:
            values[c] = v
    per_run = []
    for i, (_, r) in enumerate(runs.sort_values("run_number").iterrows() if "run_number" in runs.columns
                               else runs.iterrows()):
        step = int(r["run_number"]) if "run_number" in runs.columns and _finite(r["run_number"]) is not None else i
        per_run.append((step, {m: v for m in metrics if m in runs.columns and (v := _finite(r[m])) is not None}))
    validity = {k: _plain(row[k]) for k in _TAGS if k in row.index}
    if "validity_ok" in runs.columns:
        validity["validity_ok"] = bool((runs["validity_ok"] != False).all())  # noqa: E712 (None: not judged)
        issues = [str(i) for i in runs.get("validity_issues", pd.Series(dtype=str)).dropna() if str(i)]
        validity["validity_issues"] = "; ".join(dict.fromkeys(s for i in issues for s in i.split("; ")))
    return ExportPoint(name, {k: _plain(v) for k, v in {**ids, **{p: row[p] for p in params}}.items()},
                       values, per_run, validity)


def _artifacts(out: Path, summary: pd.DataFrame, results: pd.DataFrame, report: bool) -> tuple[list[Path], list[str]]:
    """report.html (made when missing and asked for), summary.csv and results.csv (written when missing)."""
    from raysweep.ledger import LEDGER_FILE

    notes, paths = [], []
    page = out / "report.html"
    if report and not page.is_file() and (out / LEDGER_FILE).is_file():
        from raysweep.report import write_report

        try:
            write_report(out)
        except Exception as exc:  # the export goes on without it, and says so
            notes.append(f"the report could not be made ({type(exc).__name__}: {exc}); exported without it")
    if report and page.is_file():
        paths.append(page)
    for name, df in (("summary.csv", summary), ("results.csv", results)):
        path = out / name
        if not path.is_file():
            write_text_atomic(path, df.to_csv(index=False))
        paths.append(path)
    return paths, notes


# ---------------------------------------------------------------------------------------------------
# MLflow
# ---------------------------------------------------------------------------------------------------

def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


_MLFLOW_KEY = re.compile(r"[^\w\-. /]")


def _key(name: str) -> str:
    return _MLFLOW_KEY.sub("_", str(name))[:250]


def export_mlflow(campaign: ExportCampaign, tracking_uri: str, experiment: str | None = None) -> dict[str, Any]:
    """Log the campaign to MLflow at `tracking_uri`; the experiment id, the campaign run id and the point
    run ids.

    :raises UserError: the MLflow library is missing.
    """
    tracker_library("mlflow")
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    from mlflow.exceptions import MlflowException

    name = experiment or campaign.name
    try:
        client = MlflowClient(tracking_uri=tracking_uri)
        found = client.get_experiment_by_name(name)
        exp_id = found.experiment_id if found is not None else client.create_experiment(name)
    except MlflowException as exc:  # an unusable URI (MLflow 3 also refuses file stores unless told)
        raise UserError(f"--mlflow {tracking_uri}: MLflow cannot use it: {exc.message}") from exc
    parent = client.create_run(exp_id, run_name=campaign.name, tags={
        "raysweep.kind": "campaign", "raysweep.campaign": campaign.name,
        "raysweep.output_dir": str(campaign.output_dir.resolve())})
    pid = parent.info.run_id
    for path in campaign.artifacts:
        client.log_artifact(pid, str(path))
    client.log_batch(pid, params=[Param("points", str(len(campaign.points)))])
    children = []
    for point in campaign.points:
        run = client.create_run(exp_id, run_name=point.name[:250], tags={
            "mlflow.parentRunId": pid, "raysweep.kind": "point", "raysweep.campaign": campaign.name})
        rid, now = run.info.run_id, _now_ms()
        params = [Param(_key(k), str(v)[:_MLFLOW_PARAM_MAX]) for k, v in point.params.items() if v is not None]
        tags = [RunTag(_key(f"raysweep.{k}"), str(v)) for k, v in point.validity.items() if v is not None]
        metrics = [Metric(_key(k), v, now, 0) for k, v in point.metrics.items()]
        metrics += [Metric(_key(k), v, now, step) for step, values in point.runs for k, v in values.items()]
        for part in _chunks(params, 100):
            client.log_batch(rid, params=part)
        for part in _chunks(tags, 100):
            client.log_batch(rid, tags=part)
        for part in _chunks(metrics, 1000):
            client.log_batch(rid, metrics=part)
        client.set_terminated(rid)
        children.append(rid)
    client.set_terminated(pid)
    return {"experiment_id": exp_id, "campaign_run": pid, "point_runs": children}


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)


# ---------------------------------------------------------------------------------------------------
# Weights & Biases
# ---------------------------------------------------------------------------------------------------

_WANDB_NAME = re.compile(r"[^\w\-.]")


def export_wandb(campaign: ExportCampaign, project: str, entity: str | None = None) -> dict[str, Any]:
    """Log the campaign to the W&B project `project`; the names of the runs made.

    :raises UserError: the wandb library is missing.
    """
    wandb = tracker_library("wandb")
    common = {"project": project, "group": campaign.name, **({"entity": entity} if entity else {})}
    names = []
    for point in campaign.points:
        run = wandb.init(name=point.name, job_type="point", config={k: v for k, v in point.params.items()
                                                                     if v is not None}, **common)
        for step, values in point.runs:
            run.log({f"run/{k}": v for k, v in values.items()} | {"run_number": step})
        run.summary.update({**point.metrics, **{k: v for k, v in point.validity.items() if v is not None}})
        run.finish()
        names.append(point.name)
    run = wandb.init(name=campaign.name, job_type="campaign",
                     config={"output_dir": str(campaign.output_dir.resolve()), "points": len(campaign.points)},
                     **common)
    table = campaign.summary.astype(object).where(campaign.summary.notna(), None)
    run.log({"summary": wandb.Table(dataframe=table)})
    artifact = wandb.Artifact(_WANDB_NAME.sub("_", f"{campaign.name}-report")[:120], type="report")
    for path in campaign.artifacts:
        artifact.add_file(str(path))
    run.log_artifact(artifact)
    run.finish()
    return {"campaign_run": campaign.name, "point_runs": names}

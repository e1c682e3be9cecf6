"""Export of a campaign to an experiment tracker: MLflow or Weights & Biases, each through its own library
(the optional extras `raysweep[mlflow]`, `raysweep[wandb]`).

What is logged is the same for both (`export_points`):
- one run per point (server config x bench point): its parameters (the point's serve and bench parameters,
  ids, labels, GPU shape), its aggregates (`raysweep.results.aggregate`: `M_mean`, `M_median`, `M_std`, `M_cv`,
  `M_ci_low`, `M_ci_high` per headline metric, `runs`, `runs_needed`), the value of every headline metric
  in each run (MLflow: as the metric's history, one step per run number; W&B: one `log` per run), and its
  validity record (`validity_ok`: every run passes, `validity_issues`, `runs_flagged`,
  `client_limited_runs`, `noisy`, `noisy_metrics`, `ci_method`) as tags (W&B: in the run's summary);
- one campaign run: the campaign's name and output dir, the report (`report.html`, made first when the dir
  has none), `summary.csv` and `results.csv` as artifacts (W&B: the summary also as a table).
MLflow: the point runs are children of the campaign run (tag `mlflow.parentRunId`) in the experiment
`experiment` (default: the campaign name). W&B: every run is in `group` = the campaign name, the campaign
run with `job_type="campaign"`, the points with `job_type="point"`.
Values that are not finite are left out (trackers refuse them).

Exports are idempotent: every run has a stable key (`raysweep.key`: the campaign's key, from its name and
output dir, and the point's server config and bench point ids), so exporting again, or logging a resumed
campaign live (`raysweep.report.tracking`), updates the same runs instead of making new ones. The aggregates are
logged at step = the number of runs they cover, and a run's per-run values only once: MLflow keeps the runs
logged in the tag `raysweep.runs_logged`; W&B (whose offline runs cannot be asked) in the output dir's
`tracking.json`. A W&B run's id is derived from its key, so `wandb sync` merges its offline parts into one run.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import math
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pandas as pd

from raysweep.errors import UserError
from raysweep.record.files import write_json_atomic, write_text_atomic
from raysweep.results import aggregate

if TYPE_CHECKING:
    from mlflow.entities import Run
    from mlflow.tracking import MlflowClient

__all__ = ["ExportPoint", "campaign_key", "export_mlflow", "export_points", "export_wandb", "mlflow_client",
           "tracker_library"]

log = logging.getLogger(__name__)

_EXTRAS = {"mlflow": ("mlflow", "--mlflow"), "wandb": ("wandb", "--wandb")}
_TAGS = ("validity_ok", "validity_issues", "runs_flagged", "client_limited_runs", "noisy", "noisy_metrics",
         "ci_method", "campaign")
_MLFLOW_PARAM_MAX = 6000
STATE_FILE = "tracking.json"  # per tracker and run key: the run numbers whose values were logged (W&B)


@dataclass
class ExportPoint:
    """One point as a tracker run: its name, parameters, aggregate metrics, per-run values and validity."""

    name: str
    params: dict[str, Any]
    metrics: dict[str, float]
    runs: list[tuple[int, dict[str, float]]]
    validity: dict[str, Any]
    key: str = ""       # stable within its campaign: "serve_id/bench_id" (or its parameters)
    ended_ms: int = 0   # when its latest run ended: the timestamp its values are logged with


@dataclass
class ExportCampaign:
    """A campaign ready to export: its name, points, and the files logged as artifacts."""

    name: str
    output_dir: Path
    points: list[ExportPoint]
    artifacts: list[Path]
    summary: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    key: str = ""       # stable for a campaign and its output dir (`campaign_key`)


def campaign_key(name: str, output_dir: str | Path) -> str:
    """A campaign's key in a tracker: its name and a hash of its output dir's absolute path."""
    where = hashlib.sha256(str(Path(output_dir).resolve()).encode()).hexdigest()[:10]
    return f"{name}@{where}"


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


def _plain(value: object) -> Any:
    """A value as a tracker stores it: numbers and booleans as they are, missing as None, the rest as text."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return None
    if hasattr(value, "item"):  # numpy scalars
        value = value.item()
    return value if isinstance(value, (bool, int, float, str)) else str(value)


def export_points(output_dir: str | Path, report: bool = True, only: set[str] | None = None,
                  artifacts: bool = True) -> ExportCampaign:
    """The points of a raysweep output dir as tracker runs, and its artifacts (see the module docstring);
    `only`: the keys ("serve_id/bench_id") of the points wanted; `artifacts=False`: no files made or listed.

    :raises UserError: the dir has no finished run.
    """
    from raysweep.results.importer import read_table

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
    points = [_point(row, names + shape, metrics, _runs_of(results, row, keys)) for _, row in summary.iterrows()
              if only is None or _point_key(row) in only]
    campaign = _campaign_name(summary, out)
    files, notes = _artifacts(out, summary, results, report) if artifacts else ([], [])
    return ExportCampaign(campaign, out, points, files, summary, notes, key=campaign_key(campaign, out))


def _point_key(row: pd.Series) -> str:
    if "serve_id" in row.index and "bench_id" in row.index:
        return f"{row['serve_id']}/{row['bench_id']}"
    return ""


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
        validity["validity_ok"] = bool((runs["validity_ok"] != False).all())  # noqa: E712 - None: not judged
        issues = [str(i) for i in runs.get("validity_issues", pd.Series(dtype=str)).dropna() if str(i)]
        validity["validity_issues"] = "; ".join(dict.fromkeys(s for i in issues for s in i.split("; ")))
    ended = [_finite(v) for v in runs["ended_at"]] if "ended_at" in runs.columns else []
    key = _point_key(row) or ", ".join(f"{p}={row[p]}" for p in params)
    return ExportPoint(name, {k: _plain(v) for k, v in {**ids, **{p: row[p] for p in params}}.items()},
                       values, per_run, validity, key=key,
                       ended_ms=int(1000 * max((e for e in ended if e is not None), default=0.0)))


def _artifacts(out: Path, summary: pd.DataFrame, results: pd.DataFrame, report: bool) -> tuple[list[Path], list[str]]:
    """report.html (made when missing and asked for), summary.csv and results.csv (written when missing)."""
    from raysweep.ledger import LEDGER_FILE

    notes, paths = [], []
    page = out / "report.html"
    if report and not page.is_file() and (out / LEDGER_FILE).is_file():
        from raysweep.report.page import write_report

        try:
            write_report(out)
        except Exception as exc:
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


def _artifact_root(tracking_uri: str) -> str | None:
    """Where a new experiment keeps its artifacts: beside a local SQLite store (`<its folder>/mlruns`), not in
    `./mlruns` of whatever directory the command runs in, which is MLflow's default; None (a server's own root)
    for any other store."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    return (Path(tracking_uri[len("sqlite:///"):]).resolve().parent / "mlruns").as_uri()


def mlflow_client(tracking_uri: str, experiment: str, option: str = "--mlflow") -> tuple[MlflowClient, str]:
    """An MLflow client at `tracking_uri` and the id of `experiment` (made when missing).

    :raises UserError: the library is missing, or MLflow cannot use the URI (a `file:` store gets a one-line
        hint to use `sqlite:///...`).
    """
    tracker_library("mlflow")
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        client = MlflowClient(tracking_uri=tracking_uri)
        found = client.get_experiment_by_name(experiment)
        exp_id = (found.experiment_id if found is not None
                  else client.create_experiment(experiment, artifact_location=_artifact_root(tracking_uri)))
    except MlflowException as exc:  # an unusable URI (MLflow 3 also refuses file stores unless told)
        if _is_file_store(tracking_uri):
            raise UserError(f"{option} {tracking_uri}: MLflow no longer writes plain file stores; use a SQLite one "
                            f"instead, e.g. sqlite:///{_file_path(tracking_uri)}/mlflow.db") from None
        raise UserError(f"{option} {tracking_uri}: MLflow cannot use it: {exc.message}") from exc
    return client, exp_id


def _is_file_store(uri: str) -> bool:
    return uri.startswith("file:") or "://" not in uri


def _file_path(uri: str) -> str:
    path = uri.split("://", 1)[1] if "://" in uri else uri.removeprefix("file:")
    return str(Path(path).resolve())


def _existing_runs(client: MlflowClient, exp_id: str, key: str) -> dict[str, Run]:
    """The runs of a campaign already in the experiment, by `raysweep.key`."""
    found: dict[str, Run] = {}
    token = None
    while True:
        page = client.search_runs([exp_id], filter_string=f"tags.`raysweep.campaign_key` = '{key}'",
                                  max_results=1000, page_token=token)
        for run in page:
            found.setdefault(run.data.tags.get("raysweep.key", ""), run)
        token = getattr(page, "token", None)
        if not token:
            return found


def export_mlflow(campaign: ExportCampaign, tracking_uri: str, experiment: str | None = None,
                  with_artifacts: bool = True) -> dict[str, Any]:
    """Log the campaign to MLflow at `tracking_uri`, updating its runs when they exist (see the module
    docstring); the experiment id, the campaign run id and the point run ids.

    :raises UserError: the MLflow library is missing, or the URI cannot be used.
    """
    from mlflow.entities import Param, RunTag

    client, exp_id = mlflow_client(tracking_uri, experiment or campaign.name)
    existing = _existing_runs(client, exp_id, campaign.key)
    common = {"raysweep.campaign": campaign.name, "raysweep.campaign_key": campaign.key}
    parent = existing.get(campaign.key)
    if parent is None:
        parent = client.create_run(exp_id, run_name=campaign.name, tags={
            **common, "raysweep.kind": "campaign", "raysweep.key": campaign.key,
            "raysweep.output_dir": str(campaign.output_dir.resolve())})
    pid = parent.info.run_id
    if with_artifacts:
        for path in campaign.artifacts:
            client.log_artifact(pid, str(path))
        client.log_batch(pid, tags=[RunTag("raysweep.points", str(len(campaign.points)))])
    children = []
    for point in campaign.points:
        key = f"{campaign.key}/{point.key}"
        found = existing.get(key)
        new = found is None
        run = found if found is not None else client.create_run(exp_id, run_name=point.name[:250], tags={
            **common, "mlflow.parentRunId": pid, "raysweep.kind": "point", "raysweep.key": key})
        rid = run.info.run_id
        logged = set() if new else _numbers(run.data.tags.get("raysweep.runs_logged", ""))
        if new:
            params = [Param(_key(k), str(v)[:_MLFLOW_PARAM_MAX]) for k, v in point.params.items() if v is not None]
            for part in _chunks(params, 100):
                client.log_batch(rid, params=part)
        _log_point_values(client, rid, point, logged)
        client.set_terminated(rid)
        children.append(rid)
    client.set_terminated(pid)
    return {"experiment_id": exp_id, "campaign_run": pid, "point_runs": children}


def _numbers(text: str) -> set[int]:
    return {int(t) for t in text.split(",") if t.strip().lstrip("-").isdigit()}


def _log_point_values(client: MlflowClient, rid: str, point: ExportPoint, logged: set[int]) -> None:
    """Tags always (they are replaced); the aggregates and the per-run values only for runs not logged yet."""
    from mlflow.entities import Metric, RunTag

    steps = {step for step, _ in point.runs}
    tags = [RunTag(_key(f"raysweep.{k}"), str(v)) for k, v in point.validity.items() if v is not None]
    tags.append(RunTag("raysweep.runs_logged", ",".join(str(n) for n in sorted(steps | logged))))
    metrics: list[Metric] = []
    if steps - logged:
        ts = point.ended_ms or _now_ms()
        metrics = [Metric(_key(k), v, ts, len(steps)) for k, v in point.metrics.items()]
        metrics += [Metric(_key(k), v, ts, step) for step, values in point.runs if step not in logged
                    for k, v in values.items()]
    for part in _chunks(metrics, 1000):
        client.log_batch(rid, metrics=part)
    for part in _chunks(tags, 100):
        client.log_batch(rid, tags=part)


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)


# ---------------------------------------------------------------------------------------------------
# Weights & Biases
# ---------------------------------------------------------------------------------------------------

_WANDB_NAME = re.compile(r"[^\w\-.]")


def _wandb_id(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:24]


def _read_state(out: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((out / STATE_FILE).read_text()))
    except (OSError, ValueError):
        return {}


def _own_second(mode: str | None, directory: str | Path | None, run_id: str) -> None:
    """W&B names the folder of an offline run's part by the second it starts in (`offline-run-<second>-<id>`): a
    second part of the same run started within that second would write over the first part's file. Offline,
    wait for the next second when a part of `run_id` already holds this one."""
    if mode != "offline":
        return
    folder = Path(directory or ".") / "wandb"
    while True:
        now = time.time()
        if not any(folder.glob(f"offline-run-{datetime.fromtimestamp(now):%Y%m%d_%H%M%S}-{run_id}*")):
            return
        time.sleep(1.0 - now % 1.0 + 0.01)


def export_wandb(campaign: ExportCampaign, project: str, entity: str | None = None, *, mode: str | None = None,
                 directory: str | Path | None = None, with_artifacts: bool = True) -> dict[str, Any]:
    """Log the campaign to the W&B project `project`, resuming its runs when they exist (stable ids, see the
    module docstring); the names of the runs made. `mode`: W&B's (`online`, `offline`), `directory`: where
    W&B keeps its files.

    :raises UserError: the wandb library is missing.
    """
    wandb = tracker_library("wandb")
    try:
        return _export_wandb(wandb, campaign, project, entity, mode, directory, with_artifacts)
    finally:
        if mode == "offline":  # W&B's service writes a part's file after `finish` returns: wait until it has
            wandb.teardown()


def _export_wandb(wandb: ModuleType, campaign: ExportCampaign, project: str, entity: str | None, mode: str | None,
                  directory: str | Path | None, with_artifacts: bool) -> dict[str, Any]:
    common: dict[str, Any] = {"project": project, "group": campaign.name, "resume": "allow",
                              **({"entity": entity} if entity else {}), **({"mode": mode} if mode else {}),
                              **({"dir": str(directory)} if directory else {})}
    state = _read_state(campaign.output_dir)
    logged_of = state.setdefault(f"wandb:{project}", {})
    names = []
    for point in campaign.points:
        key = f"{campaign.key}/{point.key}"
        logged = set(logged_of.get(key, []))
        _own_second(mode, directory, _wandb_id(key))
        run = wandb.init(name=point.name, job_type="point", id=_wandb_id(key),
                         config={k: v for k, v in point.params.items() if v is not None}, **common)
        for step, values in point.runs:
            if step not in logged:
                run.log({f"run/{k}": v for k, v in values.items()} | {"run_number": step})
        run.summary.update({**point.metrics, **{k: v for k, v in point.validity.items() if v is not None},
                            "raysweep.key": key})
        run.finish()
        logged_of[key] = sorted(logged | {step for step, _ in point.runs})
        names.append(point.name)
    write_json_atomic(campaign.output_dir / STATE_FILE, state)
    if not with_artifacts:
        return {"campaign_run": None, "point_runs": names}
    _own_second(mode, directory, _wandb_id(campaign.key))
    run = wandb.init(name=campaign.name, job_type="campaign", id=_wandb_id(campaign.key),
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

"""Unit tests for raysweep.report.export and `raysweep export`: MLflow against a local file store, Weights & Biases
through a small stand-in module put in sys.modules (its library is an optional extra). No Ray, no vLLM."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from test_aggregate import build_dir, run_row

from raysweep.cli import main
from raysweep.errors import UserError
from raysweep.record.directory import CampaignDir
from raysweep.report import export


@pytest.fixture
def outdir(tmp_path: Path) -> Path:
    rows = [run_row("s8", c, r, 100.0 * c * (1 + 0.01 * r), 10.0 * c, validity_ok=(c, r) != (2, 1),
                    validity_issues="client-limited" if (c, r) == (2, 1) else "") for c in (1, 2) for r in range(3)]
    out = build_dir(tmp_path / "out", rows, name="camp")
    (out / "report.html").write_text("<html>the report</html>")
    return out


def test_mlflow_export_to_a_local_file_store(outdir, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")   # MLflow 3 wants to be told a file store is meant
    uri = (tmp_path / "mlruns").as_uri()
    res = CliRunner().invoke(main, ["export", str(outdir), "--mlflow", uri])
    assert res.exit_code == 0, res.output
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("camp")
    runs = client.search_runs([exp.experiment_id])
    parent = [r for r in runs if r.data.tags.get("raysweep.kind") == "campaign"]
    points = [r for r in runs if r.data.tags.get("raysweep.kind") == "point"]
    assert len(parent) == 1 and len(points) == 2
    assert {r.data.tags["mlflow.parentRunId"] for r in points} == {parent[0].info.run_id}
    assert sorted(a.path for a in client.list_artifacts(parent[0].info.run_id)) == ["report.html", "results.csv",
                                                                                      "summary.csv"]
    by_conc = {r.data.params["max_concurrency"]: r for r in points}
    p2 = by_conc["2"]
    assert p2.data.params["max_num_seqs"] == "8" and p2.data.params["serve_id"] == "s8"
    assert p2.data.metrics["output_throughput_mean"] == pytest.approx(202.0)
    # the flagged (client-limited) run is left out of the aggregates (raysweep.results.aggregate)
    assert p2.data.metrics["runs"] == 2 and "output_throughput_ci_high" in p2.data.metrics
    assert p2.data.tags["raysweep.validity_ok"] == "False"
    assert p2.data.tags["raysweep.validity_issues"] == "client-limited"
    assert by_conc["1"].data.tags["raysweep.validity_ok"] == "True"
    history = client.get_metric_history(p2.info.run_id, "output_throughput")   # one value per run
    assert sorted((m.step, m.value) for m in history) == [(0, 200.0), (1, 202.0), (2, 204.0)]


def test_mlflow_refusing_a_file_store_is_a_user_error(outdir, tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    campaign = export.export_points(CampaignDir(outdir))
    with pytest.raises(UserError) as err:
        export.export_mlflow(campaign, (tmp_path / "mlruns").as_uri())
    # one line naming the option and the SQLite store to use instead, not MLflow's long message
    assert str(err.value) == (f"--mlflow {(tmp_path / 'mlruns').as_uri()}: MLflow no longer writes plain file stores; "
                              f"use a SQLite one instead, e.g. sqlite:///{tmp_path / 'mlruns'}/mlflow.db")


class _Run:
    def __init__(self, kw: dict[str, Any]) -> None:
        self.kw, self.logged, self.summary, self.artifacts, self.finished = kw, [], {}, [], False

    def log(self, data: dict[str, Any]) -> None:
        self.logged.append(data)

    def log_artifact(self, artifact: Any) -> None:
        self.artifacts.append(artifact)

    def finish(self) -> None:
        self.finished = True


class _Artifact:
    def __init__(self, name: str, type: str) -> None:
        self.name, self.type, self.files = name, type, []

    def add_file(self, path: str) -> None:
        self.files.append(Path(path).name)


def fake_wandb() -> tuple[types.ModuleType, list[_Run]]:
    runs: list[_Run] = []
    mod = types.ModuleType("wandb")

    def init(**kw: Any) -> _Run:
        assert all(r.finished for r in runs), "a run was not finished before the next one"
        runs.append(_Run(kw))
        return runs[-1]

    mod.init, mod.Artifact = init, _Artifact
    mod.Table = lambda dataframe: ("table", dataframe)
    return mod, runs


def test_wandb_export_logs_points_and_the_report(outdir, monkeypatch):
    mod, runs = fake_wandb()
    monkeypatch.setitem(sys.modules, "wandb", mod)
    res = CliRunner().invoke(main, ["export", str(outdir), "--wandb", "proj", "--entity", "team"])
    assert res.exit_code == 0, res.output
    assert len(runs) == 3 and all(r.finished for r in runs)
    assert {r.kw["project"] for r in runs} == {"proj"} and {r.kw["group"] for r in runs} == {"camp"}
    assert {r.kw["entity"] for r in runs} == {"team"}
    points = [r for r in runs if r.kw["job_type"] == "point"]
    p2 = next(r for r in points if r.kw["config"]["max_concurrency"] == 2)
    assert p2.kw["config"]["max_num_seqs"] == 8
    assert [d["run_number"] for d in p2.logged] == [0, 1, 2]
    assert [d["run/output_throughput"] for d in p2.logged] == pytest.approx([200.0, 202.0, 204.0])
    assert p2.summary["output_throughput_mean"] == pytest.approx(202.0) and p2.summary["validity_ok"] is False
    (camp,) = [r for r in runs if r.kw["job_type"] == "campaign"]
    (art,) = camp.artifacts
    assert art.type == "report" and sorted(art.files) == ["report.html", "results.csv", "summary.csv"]
    assert camp.logged[0]["summary"][0] == "table" and len(camp.logged[0]["summary"][1]) == 2


def test_a_missing_tracker_library_names_the_extra(outdir, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)   # import fails as when it is not installed
    res = CliRunner().invoke(main, ["export", str(outdir), "--wandb", "proj"])
    assert res.exit_code == 2 and "pip install 'raysweep[wandb]'" in res.output
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(UserError, match=r"raysweep\[mlflow\]"):
        export.tracker_library("mlflow")


def test_one_tracker_must_be_named(outdir):
    for args in ([], ["--mlflow", "x", "--wandb", "y"]):
        res = CliRunner().invoke(main, ["export", str(outdir), *args])
        assert res.exit_code == 2 and "--mlflow URI or --wandb PROJECT" in res.output


def test_no_report_leaves_it_out(outdir):
    campaign = export.export_points(CampaignDir(outdir), report=False)
    assert sorted(p.name for p in campaign.artifacts) == ["results.csv", "summary.csv"]

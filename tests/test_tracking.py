"""Live and repeatable export (`tracking:`, `raysweep export`), and the progress gauges in Ray's metrics.

MLflow runs against a SQLite store; Weights & Biases is the real `wandb` package in offline mode, its run
files read back record by record. The progress gauges are read from the session cluster's metrics port."""

from __future__ import annotations

import struct
import sys
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from raysweep.cli import main
from raysweep.drive.progress_metrics import Progress, eta_s
from raysweep.errors import CampaignError
from raysweep.ledger import LEDGER_FILE, Ledger
from raysweep.record.directory import CampaignDir
from raysweep.record.files import write_json_atomic
from raysweep.report import export, tracking

sys.path.insert(0, str(Path(__file__).parent))
from test_aggregate import run_row


def _rows(runs: range) -> list[dict[str, Any]]:
    return [run_row("s8", c, r, 100.0 * c * (1 + 0.01 * r), 10.0 * c, ended_at=1_700_000_000.0 + 10 * r + c)
            for c in (1, 2) for r in runs]


def _done(out: Path, rows: list[dict[str, Any]], all_rows: list[dict[str, Any]]) -> None:
    """Mark `rows` done in the output dir whose plan holds `all_rows`."""
    out.mkdir(parents=True, exist_ok=True)
    led = Ledger(out / LEDGER_FILE)
    try:
        led.sync(name="camp", fingerprint="fp", meaning={}, campaign={"name": "camp"}, campaign_file="c.yaml",
                 points=[(r["point_id"], r["serve_id"], r["bench_id"], r["run_number"],
                          {"max_num_seqs": r["max_num_seqs"]}, {"max_concurrency": r["max_concurrency"]})
                         for r in all_rows])
        for r in rows:
            rel = f"points/{r['serve_id']}/{r['bench_id']}/run={r['run_number']}.json"
            write_json_atomic(out / rel, {**r, "campaign": "camp"})
            led.mark_running(r["point_id"], "srv")
            led.mark_done(r["point_id"], rel)
    finally:
        led.close()


@pytest.fixture
def grown(tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    """An output dir with runs 0 and 1 of two points done, run 2 of each still to come."""
    out = tmp_path / "out"
    _done(out, _rows(range(2)), _rows(range(3)))
    (out / "report.html").write_text("<html>the report</html>")
    return out, _rows(range(2, 3))


def _mlflow_runs(uri: str, name: str = "camp") -> list[Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    return client.search_runs([client.get_experiment_by_name(name).experiment_id])


def test_mlflow_export_again_and_after_more_runs_updates_the_same_runs(grown, tmp_path):
    from mlflow.tracking import MlflowClient

    out, later = grown
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = export.export_mlflow(export.export_points(CampaignDir(out)), uri)
    again = export.export_mlflow(export.export_points(CampaignDir(out)), uri)   # nothing new: nothing changes
    assert again == first
    _done(out, later, _rows(range(3)))                              # a resumed campaign finished run 2
    third = export.export_mlflow(export.export_points(CampaignDir(out)), uri)
    assert third == first
    runs = _mlflow_runs(uri)
    assert len(runs) == 3 and sum(r.data.tags["raysweep.kind"] == "point" for r in runs) == 2
    client = MlflowClient(tracking_uri=uri)
    p2 = next(r for r in runs if r.data.params.get("max_concurrency") == "2")
    history = client.get_metric_history(p2.info.run_id, "output_throughput")  # each run's value once
    assert sorted((m.step, m.value) for m in history) == [(0, 200.0), (1, 202.0), (2, 204.0)]
    means = client.get_metric_history(p2.info.run_id, "output_throughput_mean")  # at step = runs covered
    assert sorted((m.step, round(m.value, 6)) for m in means) == [(2, 201.0), (3, 202.0)]
    assert p2.data.tags["raysweep.runs_logged"] == "0,1,2"


def test_live_tracker_logs_each_point_as_it_lands_and_everything_at_the_end(grown, tmp_path):
    out, _ = grown
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    campaign = SimpleNamespace(name="camp", tracking=SimpleNamespace(backend="mlflow", uri=uri, experiment=None))
    tracker = tracking.LiveTracker(campaign, CampaignDir(out))
    seen: list[str] = []
    sink = tracker.sink(lambda kind, **data: seen.append(kind))
    point = SimpleNamespace(serve=SimpleNamespace(id="s8"), bench=SimpleNamespace(id="b2"))
    sink("point_done", point=point, result={})
    sink("server_ready", server_id="x")
    tracker._queue.put(None)   # let the worker drain, without the final export
    tracker._thread.join()
    assert seen == ["point_done", "server_ready"] and not tracker.errors
    runs = _mlflow_runs(uri)
    assert [r.data.params["bench_id"] for r in runs if r.data.tags["raysweep.kind"] == "point"] == ["b2"]
    assert not any(r.data.tags["raysweep.kind"] == "campaign" and
                   "report.html" in str(r.info.artifact_uri) for r in runs)
    tracker._log(None, final=True)  # what close() does once the queue is empty
    runs = _mlflow_runs(uri)
    assert sorted(r.data.tags["raysweep.kind"] for r in runs) == ["campaign", "point", "point"]
    assert not tracker.errors


def test_tracking_block_refusals_exit_2_naming_the_field(tmp_path):
    base = {"name": "t", "output_dir": str(tmp_path / "out"), "serve": {"cmd": "vllm serve m"},
            "bench": {"backend": "command", "cmd": "vllm bench serve --model m"}}
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump({**base, "tracking": {"backend": "neptune"}}))
    res = CliRunner().invoke(main, ["validate", str(f)])
    assert res.exit_code == 2 and "tracking.backend" in res.output and "mlflow" in res.output and "wandb" in res.output
    f.write_text(yaml.safe_dump({**base, "tracking": {"backend": "mlflow"}}))
    res = CliRunner().invoke(main, ["validate", str(f)])
    assert res.exit_code == 2 and "tracking" in res.output and "needs `uri`" in res.output
    store = tmp_path / "mlruns"
    campaign = SimpleNamespace(name="t", tracking=SimpleNamespace(backend="mlflow", uri=store.as_uri(),
                                                                  experiment=None))
    with pytest.raises(CampaignError) as err:
        tracking.check(campaign)
    assert err.value.field == "tracking.uri" and f"sqlite:///{store}/mlflow.db" in str(err.value)
    assert "\n" not in str(err.value)
    f.write_text(yaml.safe_dump({**base, "tracking": {"backend": "mlflow", "uri": store.as_uri()}}))
    res = CliRunner().invoke(main, ["run", str(f)])  # refused before Ray starts: nothing written
    assert res.exit_code == 2 and "tracking.uri" in res.output and not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------------
# Weights & Biases, offline, read back
# ---------------------------------------------------------------------------------------------------

def read_wandb_file(path: Path) -> list[Any]:
    """The records of a W&B run file: a 7-byte header (":W&B", magic, version), then LevelDB log blocks of
    32 KiB whose records (checksum, length, type: full, first, middle, last) hold wandb's protobuf Records."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, pending, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # the block's tail is padding
            pos += block - pos % block
            continue
        length, kind = struct.unpack("<HB", data[pos + 4:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(pending)
            records.append(rec)
            pending = b""
    return records


def _item_key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def _wandb_runs(root: Path) -> dict[str, dict[str, Any]]:
    """Per run id, merged over its offline parts: name, config, history rows, last summary."""
    import json

    runs: dict[str, dict[str, Any]] = {}
    for f in sorted(root.rglob("run-*.wandb")):
        for rec in read_wandb_file(f):
            kind = rec.WhichOneof("record_type")
            if kind == "run":
                r = runs.setdefault(rec.run.run_id, {"history": [], "summary": {}, "config": {}, "parts": 0})
                r["name"], r["group"], r["parts"] = rec.run.display_name, rec.run.run_group, r["parts"] + 1
                r["config"].update({i.key: json.loads(i.value_json) for i in rec.run.config.update})
                current = r
            elif kind == "history":
                current["history"].append({_item_key(i): json.loads(i.value_json) for i in rec.history.item})
            elif kind == "summary":
                current["summary"].update({_item_key(i): json.loads(i.value_json) for i in rec.summary.update})
    return runs


def test_a_second_offline_wandb_part_never_starts_in_the_first_parts_second(tmp_path):
    """W&B names an offline part's folder by its start second: a part of the same run started within it would
    write over the first part's file (the export-twice test below lost a part that way once in a full run)."""
    import time
    from datetime import datetime

    stamp = f"{datetime.fromtimestamp(time.time()):%Y%m%d_%H%M%S}"
    (tmp_path / "wandb" / f"offline-run-{stamp}-abc").mkdir(parents=True)
    export._own_second("offline", tmp_path, "abc")
    assert f"{datetime.fromtimestamp(time.time()):%Y%m%d_%H%M%S}" != stamp
    start = time.monotonic()
    export._own_second("offline", tmp_path, "other")  # no part of that run: no wait
    export._own_second("online", tmp_path, "abc")
    assert time.monotonic() - start < 0.5


def test_wandb_offline_export_twice_writes_each_value_once_to_the_same_runs(grown, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out, later = grown
    wdir = tmp_path / "wb"
    wdir.mkdir()
    export.export_wandb(export.export_points(CampaignDir(out)), "proj", mode="offline", directory=wdir)
    _done(out, later, _rows(range(3)))
    export.export_wandb(export.export_points(CampaignDir(out)), "proj", mode="offline", directory=wdir)
    runs = _wandb_runs(wdir)
    assert len(runs) == 3 and all(r["parts"] == 2 for r in runs.values())  # the same three ids, resumed
    points = {r["config"]["max_concurrency"]: r for r in runs.values() if "max_concurrency" in r["config"]}
    p2 = points[2]
    assert p2["group"] == "camp" and p2["config"]["max_num_seqs"] == 8
    per_run = sorted((h["run_number"], h["run/output_throughput"]) for h in p2["history"] if "run_number" in h)
    assert per_run == [(0, 200.0), (1, 202.0), (2, 204.0)]   # run 0 and 1 not logged again
    assert p2["summary"]["output_throughput_mean"] == pytest.approx(202.0) and p2["summary"]["runs"] == 3
    camp = next(r for r in runs.values() if r["name"] == "camp")
    assert camp["config"]["points"] == 2


# ---------------------------------------------------------------------------------------------------
# Progress in Ray's metrics
# ---------------------------------------------------------------------------------------------------

def test_eta_is_the_pace_so_far_times_what_is_left():
    assert eta_s(100.0, 4, 6) == pytest.approx(150.0)
    assert eta_s(100.0, 0, 6) != eta_s(100.0, 0, 6)  # NaN: not known before a point finished
    assert eta_s(100.0, 4, 0) == 0.0


@pytest.mark.ray
def test_progress_gauges_reach_the_clusters_metrics_port(gpu_cluster):
    import ray

    from raysweep.procs import wait_for

    counts = {"pending": 4, "done": 0, "failed": 0}
    progress = Progress("gauge-test", lambda: dict(counts))
    sink = progress.sink(lambda kind, **data: None)
    sink("campaign_start", total=4, counts=dict(counts))
    sink("server_ready", server_id="a")
    counts.update(pending=2, done=1, failed=1)
    sink("point_done", point=None, result={})
    values = ray.get(progress.actor.values.remote())
    assert values["raysweep_points_done"] == 1 and values["raysweep_points_failed"] == 1
    assert values["raysweep_points_pending"] == 2 and values["raysweep_servers_running"] == 1
    assert values["raysweep_eta_seconds"] > 0
    ports = {n["MetricsExportPort"] for n in ray.nodes() if n["Alive"]}

    def exported() -> bool:
        for port in ports:
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            except OSError:
                continue
            if any(line.startswith("ray_raysweep_points_done{") and 'campaign="gauge-test"' in line
                   and line.rstrip().endswith(" 1.0") for line in text.splitlines()):
                return True
        return False

    try:
        assert wait_for(exported, 90, 2.0), "ray_raysweep_points_done not on any node's metrics port"
    finally:
        progress.close()


@pytest.mark.ray
def test_a_running_campaigns_gauges_scraped_in_prometheus_format(gpu_cluster, tmp_path):
    """During a stand-in campaign (its second point held until the scrape), every node's metrics export port
    (`MetricsExportPort` of `ray.nodes()`, as docs/tracking.md says) is read as Prometheus reads it, parsed
    by prometheus_client's text parser: every gauge of cluster/grafana-raysweep.json is there under the
    campaign's label, 1 of its 2 runs done."""
    import threading
    import uuid

    import ray
    from helpers import run_file, standin_campaign
    from prometheus_client.parser import text_string_to_metric_families

    from raysweep.drive.progress_metrics import GAUGES
    from raysweep.procs import wait_for

    name = f"scrape-{uuid.uuid4().hex[:8]}"
    hold, calls = tmp_path / "hold", tmp_path / "calls"
    hold.touch()
    f = standin_campaign(tmp_path, name=name, bench_args=f"--log-file {calls} --hold-while {hold} --hold-from 2")
    ended: dict[str, Any] = {}

    def drive() -> None:
        try:
            ended["summary"] = run_file(f)[0]
        except BaseException as exc:  # noqa: BLE001 (told below, in the test's thread)
            ended["error"] = exc

    thread = threading.Thread(target=drive, daemon=True)
    thread.start()
    seen: dict[str, float] = {}

    def scraped() -> bool:
        ports = {(n["NodeManagerAddress"], n["MetricsExportPort"]) for n in ray.nodes() if n["Alive"]}
        for ip, port in ports:
            try:
                text = urllib.request.urlopen(f"http://{ip}:{port}/metrics", timeout=5).read().decode()
            except OSError:
                continue
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if sample.labels.get("campaign") == name and sample.name.startswith("ray_raysweep_"):
                        seen[sample.name] = sample.value
        return seen.get("ray_raysweep_points_done") == 1.0 and len(seen) == len(GAUGES)

    try:
        assert wait_for(lambda: scraped() or "error" in ended, 120, 1.0), seen
        assert "error" not in ended, ended
    finally:
        hold.unlink()
        thread.join(300)
    assert not thread.is_alive() and "error" not in ended, ended
    assert set(seen) == {f"ray_{g}" for g in GAUGES}
    assert seen["ray_raysweep_points_total"] == 2.0 and seen["ray_raysweep_points_done"] == 1.0
    assert seen["ray_raysweep_points_failed"] == 0.0 and seen["ray_raysweep_points_pending"] == 1.0
    assert seen["ray_raysweep_servers_running"] == 1.0
    assert ended["summary"].counts["done"] == 2

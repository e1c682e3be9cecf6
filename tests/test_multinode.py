"""Multi-node placement on the session's simulated cluster (conftest.py: 3 nodes x 4 GPUs): shapes as
placement groups, servers spanning nodes, several configurations at once, a rank dying, node loss.
Servers and benchmarks are the stand-ins of tests/standin; tests/test_vllm_integration.py runs the real
vLLM across two simulated nodes."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from browser import check_page
from click.testing import CliRunner
from helpers import add_nodes, remove_node_when_running, remove_nodes, run_file, standin_campaign

ray = pytest.importorskip("ray")

from raysweep import procs  # noqa: E402
from raysweep.cli import main  # noqa: E402
from raysweep.ledger import Ledger  # noqa: E402
from raysweep.record.directory import CampaignDir  # noqa: E402
from raysweep.report.page import write_report  # noqa: E402
from raysweep.results.table import results_table  # noqa: E402

pytestmark = pytest.mark.ray


def _servers(out: Path):
    led = Ledger.open_existing(out)
    try:
        return led.servers()
    finally:
        led.close()


def _all_rank_pids(out: Path) -> list[int]:
    return [r["pid"] for s in _servers(out) for r in s.rank_list() if r.get("pid")]


def _assert_no_orphans(out: Path) -> None:
    pids = _all_rank_pids(out)
    assert pids and procs.wait_for(lambda: not any(procs.is_alive(p, None) for p in pids), 30), \
        f"left running: {[p for p in pids if procs.is_alive(p, None)]}"


def test_shapes_land_as_specified_one_bundle_per_node_and_ranks_started_together(gpu_cluster, tmp_path):
    env_file = tmp_path / "bench-env.jsonl"
    f = standin_campaign(tmp_path, bench_args=f"--env-file {env_file}",
                         serve_params=[{"tensor_parallel_size": 1}, {"tensor_parallel_size": 2},
                                       {"tensor_parallel_size": 4},
                                       {"tensor_parallel_size": 4, "pipeline_parallel_size": 2},
                                       {"tensor_parallel_size": 2, "data_parallel_size": 4}],
                         bench_params=[{"random_input_len": 16}])
    summary, out = run_file(f)
    assert summary.counts["done"] == 5
    all_rows = results_table(CampaignDir(out))
    dp = all_rows[all_rows["data_parallel_size"] == 4].iloc[0]
    df = all_rows[all_rows["data_parallel_size"] == 1].set_index("gpu_count")
    assert sorted(df.index) == [1, 2, 4, 8]
    assert df.loc[[1, 2, 4], "num_nodes"].tolist() == [1, 1, 1] and df.loc[8, "num_nodes"] == 2
    for g in (1, 2, 4):
        assert len(df.loc[g, "gpu_ids"].split(",")) == g and df.loc[g, "placement_mode"] == "single"
    two = df.loc[8]
    assert two["placement_mode"] == "nnodes" and two["gpus_per_node"] == 4
    assert len(set(two["node_ids"].split(","))) == 2
    per_node = two["gpu_ids_per_node"].split(";")
    assert len(per_node) == 2 and all(len(p.split("=")[1].split(",")) == 4 for p in per_node)
    # rank 0 serves HTTP with the rendezvous flags; rank 1 runs the same command headless
    server = next(s for s in _servers(out) if s.serve_id == two["serve_id"])
    ranks = server.rank_list()
    assert [r["rank"] for r in ranks] == [0, 1] and ranks[0]["node_id"] != ranks[1]["node_id"]
    logs = {r["rank"]: Path(r["log_path"]).read_text() for r in ranks}
    assert "--nnodes 2 --node-rank 0 --master-addr 127.0.0.1 --master-port" in logs[0] and "--port" in logs[0]
    assert "--node-rank 1" in logs[1] and "--headless" in logs[1] and "headless rank 1" in logs[1]
    assert "--host" not in logs[1].split("raysweep:", 1)[1].splitlines()[0]
    # data parallelism across nodes: 2 replicas of tp=2 on each of 2 nodes, ranks started the DP way
    assert (dp["gpu_count"], dp["num_nodes"], dp["gpus_per_node"], dp["placement_mode"]) == (8, 2, 4, "dp")
    ranks = next(s for s in _servers(out) if s.serve_id == dp["serve_id"]).rank_list()
    logs = {r["rank"]: Path(r["log_path"]).read_text() for r in ranks}
    assert "--data-parallel-size-local 2 --data-parallel-address 127.0.0.1 --data-parallel-rpc-port" in logs[0]
    assert "--data-parallel-start-rank 2 --headless" in logs[1] and "headless rank 0" in logs[1]
    # benchmark clients never hold a GPU
    assert [json.loads(x)["CUDA_VISIBLE_DEVICES"] for x in env_file.read_text().splitlines()] == [None] * 5
    _assert_no_orphans(out)
    check_page(write_report(CampaignDir(out)), tmp_path)  # its report in Chromium: no script error, no note said twice


@pytest.mark.parametrize("max_servers", [None, 1])
def test_two_configs_run_at_once_on_disjoint_gpus_unless_capped(gpu_cluster, tmp_path, max_servers):
    f = standin_campaign(tmp_path, bench_args="--sleep 1.0",
                         serve_params={"grid": {"tensor_parallel_size": [2], "max_num_seqs": [8, 16]}},
                         bench_params={"grid": {"random_input_len": [16, 32, 64]}},
                         placement={"max_servers": max_servers} if max_servers else {})
    out = tmp_path / "out"
    seen: list[str] = []
    one_at_a_time = threading.Lock()  # events come from both configs' threads; CliRunner swaps sys.stdout

    def on_event(kind: str, **data) -> None:
        if kind != "point_start":
            return
        with one_at_a_time:
            if seen:
                return
            led = Ledger.open_existing(out)
            active = led.servers(active_only=True)
            led.close()
            if len([s for s in active if s.state == "ready"]) >= 2:
                seen.append(CliRunner().invoke(main, ["status", str(out)]).output)

    summary, _ = run_file(f, on_event=on_event)
    assert summary.counts["done"] == 6
    df = results_table(CampaignDir(out))
    spans = {sid: (g["started_at"].min(), g["ended_at"].max(), g["node_id"].iloc[0],
                   set(g["gpu_ids"].iloc[0].split(",")))
             for sid, g in df.groupby("server_id")}
    assert len(spans) == 2
    (s1, e1, n1, g1), (s2, e2, n2, g2) = spans.values()
    overlap = min(e1, e2) - max(s1, s2)
    if max_servers == 1:
        assert overlap < 0 and not seen
    else:
        assert overlap > 1.0, "the two servers did not run side by side"
        assert n1 != n2 or not (g1 & g2), "two running servers shared a GPU"
        assert seen and all(sid in seen[0] for sid in spans), "status did not show both running servers"
    _assert_no_orphans(out)


def test_a_dead_rank_takes_the_server_down_and_only_the_spoiled_point_runs_again(gpu_cluster, tmp_path):
    failures: list[str] = []
    f = standin_campaign(tmp_path, server_args=f"--headless-die-after 4 --die-once-file {tmp_path / 'died'}",
                         bench_args="--sleep 3",
                         serve_params=[{"tensor_parallel_size": 4, "pipeline_parallel_size": 2}],
                         bench_params={"grid": {"random_input_len": [16, 32]}})
    summary, out = run_file(f, on_event=lambda kind, **d: failures.append(d["error"]) if kind == "point_failed"
                            else None)
    assert summary.counts["done"] == 2 and summary.counts["failed"] == 0
    assert failures and "rank 1 exited with code 4" in failures[0]
    servers = _servers(out)
    assert [s.state for s in servers] == ["died (rank 1 exited with code 4)", "stopped"]
    led = Ledger.open_existing(out)
    assert sorted(p.attempts for p in led.points()) == [1, 2]
    led.close()
    _assert_no_orphans(out)


def test_node_loss_tears_the_server_down_and_places_it_again_on_the_nodes_left(gpu_cluster, tmp_path):
    pool = add_nodes(gpu_cluster, "loss")
    try:
        lost: list[str] = []
        f = standin_campaign(tmp_path, bench_args="--sleep 1.5", serve_params=[{"tensor_parallel_size": 4}],
                             bench_params={"grid": {"random_input_len": [16, 32, 64]}},
                             placement={"node_labels": {"pool": "loss"}})
        out = tmp_path / "out"
        removed: list[str] = []
        watcher = remove_node_when_running(gpu_cluster, out, pool, removed)
        summary, _ = run_file(f, on_event=lambda kind, **d: lost.append(d["reason"]) if kind == "node_lost" else None)
        watcher.join(5)
        assert removed and lost and "was lost" in lost[0]
        assert summary.counts["done"] == 3 and summary.counts["failed"] == 0
        led = Ledger.open_existing(out)
        attempts = sorted(p.attempts for p in led.points())
        led.close()
        assert attempts == [1, 1, 2]  # the interrupted point counted an attempt and ran again
        servers = _servers(out)
        assert len(servers) == 2 and servers[0].node_id == removed[0] and servers[1].node_id != removed[0]
        assert servers[0].state.startswith("died") and servers[1].state == "stopped"
        assert set(results_table(CampaignDir(out))["node_id"]) == {servers[1].node_id}
        # node loss as data: the loss and the re-placement are ledger rows; the spoiled attempt keeps its error
        led = Ledger.open_existing(out)
        events, earlier, points = led.events(), led.attempt_errors(), led.points()
        led.close()
        assert [e["kind"] for e in events] == ["node_lost", "replaced"]
        assert events[0]["nodes"] == [removed[0]] and events[0]["serve_ids"] == [servers[0].serve_id]
        assert servers[1].node_id in events[1]["nodes"] and events[0]["at"] <= events[1]["at"]
        retried = next(p for p in points if p.attempts == 2)
        assert retried.state == "done" and retried.error is None
        assert [(e["point_id"], e["attempt"]) for e in earlier] == [(retried.point_id, 1)]
        assert "was lost" in earlier[0]["error"]
        status = CliRunner().invoke(main, ["status", str(out)]).output
        assert "cluster events" in status and "node lost" in status and "replaced" in status
        assert "1 point(s) done after failed attempts" in status
        _assert_no_orphans(out)
    finally:
        remove_nodes(gpu_cluster, pool)


def test_config_that_no_longer_fits_after_a_node_loss_fails_with_the_reason(gpu_cluster, tmp_path):
    pool = add_nodes(gpu_cluster, "gone")
    try:
        f = standin_campaign(tmp_path, bench_args="--sleep 1.5",
                             serve_params=[{"tensor_parallel_size": 4, "pipeline_parallel_size": 2}],
                             bench_params={"grid": {"random_input_len": [16, 32]}},
                             placement={"node_labels": {"pool": "gone"}, "replace_wait_s": 2})
        out = tmp_path / "out"
        removed: list[str] = []
        watcher = remove_node_when_running(gpu_cluster, out, pool, removed)
        summary, _ = run_file(f)
        watcher.join(5)
        assert removed
        assert summary.counts == {"pending": 0, "running": 0, "done": 0, "failed": 2}
        assert all("can no longer be placed on the nodes left" in p.error and "have 4 in all" in p.error
                   and "waited 2 s for nodes it fits" in p.error for p in summary.failures)
        led = Ledger.open_existing(out)
        kinds = [e["kind"] for e in led.events()]
        led.close()
        assert kinds == ["node_lost", "waiting_for_nodes", "cannot_place"], kinds
        _assert_no_orphans(out)
        page = check_page(write_report(CampaignDir(out)), tmp_path)  # a campaign with no result: its report in Chromium
        assert "No finished run: 2 of 2 point(s) failed" in page["first_text"]
        assert page["sections"][:2] == ["conclusions", "failures"]  # where the conclusions send the reader
    finally:
        remove_nodes(gpu_cluster, pool)


def test_dry_run_on_the_cluster_shows_each_rank_and_refuses_what_never_fits(gpu_cluster, tmp_path):
    address = gpu_cluster.address
    ok = standin_campaign(tmp_path, serve_params=[{"tensor_parallel_size": 4, "pipeline_parallel_size": 2}],
                          placement={"node_labels": {"gpu-type": "H100"}})
    res = CliRunner().invoke(main, ["run", str(ok), "--dry-run", "--address", address])
    assert res.exit_code == 0, res.output
    assert "placement: 2 nodes x 4 GPU(s), pipeline across nodes on nodes with gpu-type=H100" in res.output
    assert "command (rank 0):" in res.output and "--node-rank 0 --master-addr '<rank 0 ip>'" in res.output
    assert "command (rank 1):" in res.output and "--headless" in res.output
    bad = standin_campaign(tmp_path, serve_params=[{"tensor_parallel_size": 8}, {"tensor_parallel_size": 4,
                                                                                  "pipeline_parallel_size": 4},
                                                    {"tensor_parallel_size": 2}])
    res = CliRunner().invoke(main, ["run", str(bad), "--dry-run", "--address", address])
    assert res.exit_code == 2
    assert "tensor_parallel_size=8 is larger than any node" in res.output
    assert "needs 16 GPUs (tp=4 pp=4 dp=1), but the 3 node(s) have 12 in all" in res.output
    assert "tensor_parallel_size=2)" not in res.output
    # pinned to A100 nodes, of which there is one: an 8-GPU config cannot be placed
    pinned = standin_campaign(tmp_path, serve_params=[{"tensor_parallel_size": 4, "pipeline_parallel_size": 2}],
                              placement={"node_labels": {"gpu-type": "A100"}})
    res = CliRunner().invoke(main, ["run", str(pinned), "--dry-run", "--address", address])
    assert res.exit_code == 2 and "matching gpu-type=A100 have 4 in all" in res.output

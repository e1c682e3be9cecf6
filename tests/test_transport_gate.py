"""The transport check wired into campaigns, on the simulated cluster: stand-in servers print the NCCL lines
of a 2-node pipeline (InfiniBand with GPUDirect, InfiniBand, or TCP sockets) when NCCL_DEBUG=INFO, and
`transport.require` lets through only the configs whose cross-node links are fast enough."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import run_file, standin_campaign

pytest.importorskip("ray")

from raysweep import procs
from raysweep.cli import main
from raysweep.ledger import Ledger
from raysweep.record.directory import CampaignDir
from raysweep.results.table import results_table

pytestmark = pytest.mark.ray

TWO_NODES = {"tensor_parallel_size": 4, "pipeline_parallel_size": 2}


def _ledger(out: Path) -> tuple[list, list]:
    led = Ledger.open_existing(out)
    try:
        return led.points(), led.servers()
    finally:
        led.close()


def _no_orphans(servers: list) -> None:
    pids = [r["pid"] for s in servers for r in s.rank_list() if r.get("pid")]
    assert pids and procs.wait_for(lambda: not any(procs.is_alive(p, None) for p in pids), 30)


def test_a_config_on_tcp_sockets_is_refused_before_benchmarking_and_the_fast_ones_run(gpu_cluster, tmp_path):
    env_file = tmp_path / "bench-env.jsonl"
    f = standin_campaign(tmp_path, bench_args=f"--env-file {env_file}", max_attempts=2,
                         serve_params=[{**TWO_NODES, "nccl_net": "gdr"}, {**TWO_NODES, "nccl_net": "socket"},
                                       {"tensor_parallel_size": 2}],
                         bench_params=[{"random_input_len": 16}, {"random_input_len": 32}],
                         transport={"require": "ib", "wait_s": 3})
    summary, out = run_file(f)
    assert (summary.counts.get("done"), summary.counts.get("failed")) == (4, 2), summary.counts
    points, servers = _ledger(out)
    socket_id = next(s.serve_id for s in servers if "--nccl-net socket" in s.command)
    refused = [p for p in points if p.serve_id == socket_id]
    assert len(refused) == 2 and all(p.state == "failed" and p.attempts == 2 for p in refused)
    err = refused[0].error
    assert "transport.require ib" in err and "cross-node links include Socket" in err and "TCP sockets" in err
    assert "via NET/Socket/0" in err  # the evidence
    assert len(env_file.read_text().splitlines()) == 4  # the refused config never benchmarked
    assert len([s for s in servers if s.serve_id == socket_id]) == 1  # and was not started again
    df = results_table(CampaignDir(out))
    by_nodes = {n: g.iloc[0] for n, g in df.groupby("num_nodes")}
    gdr, single = by_nodes[2], by_nodes[1]
    assert (gdr["transport_inter"], gdr["transport_intra"], gdr["transport_plugins"]) == ("IB+GDR", "P2P", "IB")
    assert gdr["transport_ib_devices"] == "mlx5_0/IB,mlx5_1/IB" and gdr["transport_nccl"] == "2.21.5+cuda12.4"
    assert single["transport_inter"] == "n/a" and single["transport_intra"] == "none"  # no NCCL line: one GPU rank
    # every rank's log was read: the verdict counts the lines of both nodes
    verdict = next(s for s in servers if "--nccl-net gdr" in s.command).transport_verdict()
    assert verdict["nnodes"] == 2 and verdict["ranks_with_nccl"] == 2
    status = CliRunner().invoke(main, ["status", str(out)])
    assert "transport (require: ib)" in status.output and "refused" in status.output
    assert "inter-node IB+GDR" in status.output
    assert "node 0 (127.0.0.1) -> node 1 (127.0.0.1): IB+GDR" in status.output  # the node-pair table
    dry = CliRunner().invoke(main, ["run", str(f), "--dry-run", "--address", gpu_cluster.address])
    assert "Links recorded so far" in dry.output and "node 1 (127.0.0.1) -> node 0 (127.0.0.1): IB+GDR" in dry.output
    _no_orphans(servers)


def test_lines_from_nccl_debug_file_and_late_lines_are_read_and_silence_is_not_a_pass(gpu_cluster, tmp_path):
    """NCCL_DEBUG_FILE (with %h and %p) sends NCCL's lines to per-process files: they are read there. Lines
    that come after ready are waited for. A server whose NCCL says nothing (the user set NCCL_DEBUG=WARN)
    cannot prove InfiniBand, so it is refused too."""
    nccl_dir = tmp_path / "nccl"
    nccl_dir.mkdir()
    f = standin_campaign(tmp_path, max_attempts=1,
                         serve_params=[{**TWO_NODES, "nccl_net": "ib", "nccl_delay": 1.5},
                                       {**TWO_NODES, "nccl_net": "gdr", "max_num_seqs": 4}],
                         bench_params=[{"random_input_len": 16}],
                         serve={"env": {"NCCL_DEBUG_FILE": str(nccl_dir / "nccl.%h.%p.log")}},
                         transport={"require": "gdr", "wait_s": 8})
    summary, out = run_file(f)
    points, servers = _ledger(out)
    ib = next(p for p in points if p.serve_params.get("nccl_net") == "ib")
    assert ib.state == "failed" and "cross-node links include IB, not the GPUDirect RDMA" in ib.error
    assert "node 0 -> node 1: IB (1 rank pair)" in ib.error  # the per-link table
    gdr = next(p for p in points if p.serve_params.get("nccl_net") == "gdr")
    assert gdr.state == "done", gdr.error
    assert len(list(nccl_dir.glob("nccl.node*.log"))) == 4  # 2 ranks x 2 servers wrote there, not to stdout
    assert all("NCCL INFO" not in Path(r["log_path"]).read_text() for s in servers for r in s.rank_list())

    (tmp_path / "quiet").mkdir()
    f2 = standin_campaign(tmp_path / "quiet", max_attempts=1, serve_params=[{**TWO_NODES, "nccl_net": "gdr"}],
                          bench_params=[{"random_input_len": 16}], serve={"env": {"NCCL_DEBUG": "WARN"}},
                          transport={"require": "ib", "wait_s": 1})
    summary, out2 = run_file(f2)
    points, servers = _ledger(out2)
    assert points[0].state == "failed"
    assert "no cross-node NCCL link was seen in the logs of its 2 ranks" in points[0].error
    assert json.loads(servers[0].transport)["ranks_with_nccl"] == 0
    _no_orphans(servers)


def test_data_parallel_replicas_across_nodes_are_not_refused_for_links_they_do_not_need(gpu_cluster, tmp_path):
    """Two data-parallel replicas of TP=2 on each of two nodes: vLLM runs a dense model's replicas independently,
    so NCCL links stay inside each node. `transport.require: ib` lets it run (the old gate refused it: no
    cross-node link seen), and its verdict says why."""
    f = standin_campaign(tmp_path, serve_params=[{"tensor_parallel_size": 2, "data_parallel_size": 4,
                                                  "nccl_net": "intra"}],
                         bench_params=[{"random_input_len": 16}], transport={"require": "ib", "wait_s": 3})
    summary, out = run_file(f)
    assert summary.counts.get("done") == 1 and not summary.counts.get("failed"), summary.counts
    _, servers = _ledger(out)
    verdict = servers[0].transport_verdict()
    assert verdict["nnodes"] == 2 and verdict["cross_node"] is False and verdict["intra"] == "P2P"
    assert verdict["ranks_with_nccl"] == 2 and verdict["inter"] == "none"
    _no_orphans(servers)

"""The GPU acceptance checklist on made server records (NCCL lines as NCCL 2.21 prints them, probe and
telemetry records), the `checklist` command on a made output dir, and the acceptance dry run here (no GPUs)
and on the simulated cluster."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from click.testing import CliRunner

from raysweep.campaign import load_campaign
from raysweep.cli import main
from raysweep.ledger import LEDGER_FILE, Ledger, ServerRow
from raysweep.place import transport
from raysweep.place.placement import NodeInfo
from raysweep.results import acceptance

CONFIG = Path(__file__).parent.parent / "configs" / "gpu-acceptance.yaml"


def nccl_lines(net: str, rank: int) -> list[str]:
    """One rank's NCCL_DEBUG=INFO lines of a two-node pipeline whose cross-node links use `net`."""
    head = f"node{rank}:{100 + rank}:{107 + rank} [0] NCCL INFO"
    via = {"gdr": "NET/IB/0/GDRDMA", "socket": "NET/Socket/0"}[net]
    lines = [f"{head} NCCL version 2.21.5+cuda12.4"]
    lines += ([f"{head} NET/IB : No device found.", f"{head} Using network Socket"] if net == "socket" else
              [f"{head} NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.{rank + 1}<0>", f"{head} Using network IB"])
    lines += [f"{head} Channel 00/0 : {2 * rank + 1}[1] -> {2 * (1 - rank)}[0] [send] via {via}",
              f"{head} Channel 01/0 : {2 * (1 - rank) + 1}[1] -> {2 * rank}[0] [receive] via {via}",
              f"{head} Connected all rings, use ring PXN 0 GDR {1 if net == 'gdr' else 0}"]
    return lines


def server(serve_id: str, ranks: list[tuple[str, str | None]], *, net: str | None = None,
           fabric: dict[str, Any] | None = None, ready: bool = True, started: float = 1000.0) -> ServerRow:
    """A server row: per rank (Ray's GPU ids, the process's CUDA_VISIBLE_DEVICES)."""
    rows = [{"rank": r, "hostname": f"node{r}", "node_id": f"n{r}", "node_ip": f"10.0.0.{r + 1}", "gpu_ids": g,
             "cuda_visible_devices": cvd} for r, (g, cvd) in enumerate(ranks)]
    verdict = transport.server_verdict([nccl_lines(net, r) for r in range(len(ranks))]) if net else None
    return ServerRow(server_id=f"{serve_id}-x", serve_id=serve_id, command="vllm serve m", hostname="node0",
                     node_id="n0", node_ip="10.0.0.1", port=8000, pid=1, pid_create_time=1.0, gpu_ids=ranks[0][0],
                     ranks=json.dumps(rows), started_at=started, ready_at=started + 42.0 if ready else None,
                     stopped_at=started + 100, state="stopped" if ready else "failed",
                     error=None if ready else "server not ready after 900 s", log_tail=None, log_path=None,
                     transport=json.dumps(verdict) if verdict else None,
                     fabric=json.dumps(fabric) if fabric else None)


def points(serve_id: str, util: float | None, source: str = "nvml") -> pd.DataFrame:
    return pd.DataFrame([{"serve_id": serve_id, "gpu_telemetry": source, "gpu_util_mean_pct": util,
                          "gpu_power_mean_w": 300.0 if util else None} for _ in range(2)])


def by_check(items: list[acceptance.Item], subject: str) -> dict[str, acceptance.Item]:
    return {i.check: i for i in items if i.subject == subject}


def test_a_healthy_cluster_passes_every_item():
    rows = [server("one", [("3", "3")]),
            server("pp", [("0", "0"), ("1", "1")], net="gdr",
                   fabric={"busbw_gbps": 21.5, "backend": "nccl", "world": 2, "error": None})]
    results = pd.concat([points("one", 40.0), points("pp", 60.0)])
    items = acceptance.checklist(rows, results, {"one": "tp=1", "pp": "pp=2"})
    one, pp = by_check(items, "tp=1"), by_check(items, "pp=2")
    assert [i.status for i in one.values()] == ["ok", "n/a", "n/a", "ok", "ok"]
    assert [i.status for i in pp.values()] == ["ok"] * 5
    assert "IB+GDR" in pp["NCCL transport"].seen and "node 0 -> node 1" in pp["NCCL transport"].seen
    assert "21.50 GB/s" in pp["fabric probe"].seen and "ready in 42 s" in pp["server start"].seen
    assert "60 %" in pp["GPU telemetry"].seen
    assert not acceptance.failed(items)
    assert acceptance.text_lines(items)[-1] == "every item passed"


def test_each_failure_is_named_with_its_fix():
    rows = [server("pp", [("2,3", "0,1"), ("2,3", "2,3")], net="socket",
                   fabric={"busbw_gbps": None, "error": "gloo: connection refused"}),
            server("tp", [("0,1", None)], ready=False)]
    results = pd.concat([points("pp", None, source="off")])
    items = acceptance.checklist(rows, results, {"pp": "pp=2", "tp": "tp=2"}, not_run={"pp=4": "one node"})
    pp, tp = by_check(items, "pp=2"), by_check(items, "tp=2")
    assert {k: i.status for k, i in pp.items()} == {
        "GPUs per bundle": "FAIL", "NCCL transport": "FAIL", "fabric probe": "FAIL", "GPU telemetry": "FAIL",
        "server start": "ok"}
    assert "rank 0: Ray 2,3, process 0,1" in pp["GPUs per bundle"].seen and "rank 1" not in pp["GPUs per bundle"].seen
    assert "Socket" in pp["NCCL transport"].seen and "NCCL_IB_HCA" in pp["NCCL transport"].fix
    assert "connection refused" in pp["fabric probe"].seen
    assert "gpu_telemetry: off" in pp["GPU telemetry"].seen and "transport.telemetry" in pp["GPU telemetry"].fix
    assert tp["GPUs per bundle"].status == "not seen" and tp["NCCL transport"].status == "not seen"
    assert tp["server start"].status == "FAIL" and "not ready after 900 s" in tp["server start"].seen
    assert tp["GPU telemetry"].status == "not seen"
    text = "\n".join(acceptance.text_lines(items))
    assert text.count("fix:") == len([i for i in items if i.status in ("FAIL", "warn", "not seen")])
    assert "pp=4:" in text and "one node" in text
    assert text.splitlines()[-1] == f"{len(acceptance.failed(items))} item(s) failed or not seen"


def test_nccl_over_host_memory_inside_a_node_is_a_warning():
    shm = ["h:1:2 [0] NCCL INFO NCCL version 2.21.5+cuda12.4",
           "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct"]
    row = replace(server("tp", [("0,1", "0,1")]), transport=json.dumps(transport.server_verdict([shm])))
    [item] = [i for i in acceptance.checklist([row], points("tp", 50.0)) if i.check == "NCCL transport"]
    assert item.status == "warn" and "host memory" in item.seen


def test_configurations_the_cluster_cannot_hold_are_left_out():
    spec = load_campaign(CONFIG)
    one = [NodeInfo("a", "10.0.0.1", 8, 32.0)]
    kept, skipped = acceptance.placeable(spec, one)
    assert len(kept.serve_combos) == 2 and list(skipped) == ["pipeline_parallel_size=2-placement_layout=spread"]
    assert "cannot be split over the nodes" in next(iter(skipped.values()))
    two = one + [NodeInfo("b", "10.0.0.2", 8, 32.0)]
    kept, skipped = acceptance.placeable(spec, two)
    assert len(kept.serve_combos) == 3 and not skipped


def test_checklist_command_reads_a_finished_campaign(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    led = Ledger(out / LEDGER_FILE)
    try:
        led.sync(name="acc", fingerprint="fp", meaning={}, campaign={"name": "acc"}, campaign_file="c.yaml",
                 points=[("p1", "s1", "b1", 0, {"tensor_parallel_size": 2}, {"max_concurrency": 1})])
        led.add_server("s1-a", "s1", "vllm serve m")
        led.update_server("s1-a", state="stopped", ready_at=led.servers()[0].started_at + 5,
                          ranks=json.dumps([{"rank": 0, "gpu_ids": "0,1", "cuda_visible_devices": "0,1"}]))
    finally:
        led.close()
    res = CliRunner().invoke(main, ["checklist", str(out)])
    assert res.exit_code == 1, res.output  # no NCCL line, no point: not seen
    assert "tensor_parallel_size=2:" in res.output and "[      ok] GPUs per bundle" in res.output
    assert "[not seen] NCCL transport" in res.output and "fix:" in res.output


def test_acceptance_dry_run_here_explains_what_it_would_do(tmp_path):
    res = CliRunner().invoke(main, ["acceptance", str(CONFIG), "--dry-run", "--output-dir", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert "3 server config(s) x 2 bench point(s)" in res.output
    assert "After the run, raysweep prints this checklist" in res.output
    assert "This machine has no GPUs" in res.output and not (tmp_path / "o").exists()


@pytest.mark.ray
def test_acceptance_dry_run_on_the_simulated_cluster_places_each_configuration(gpu_cluster, tmp_path):
    res = CliRunner().invoke(main, ["acceptance", str(CONFIG), "--dry-run", "--address", gpu_cluster.address,
                                    "--output-dir", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert "placement: 1 node x 1 GPU(s)" in res.output and "placement: 1 node x 2 GPU(s)" in res.output
    assert "--pipeline-parallel-size 2 --nnodes 2 --node-rank 0" in res.output  # the pipeline across two nodes
    assert "This machine has no GPUs" not in res.output and "Not run" not in res.output


@pytest.mark.ray
def test_acceptance_run_on_the_simulated_cluster_passes_its_checklist(gpu_cluster, tmp_path):
    """The whole path with stand-ins: one GPU, and a pipeline of two stages one per node that prints NCCL's
    InfiniBand lines; the gloo probe across its two bundles; a fake NVML. Every item is seen and passes."""
    from helpers import PY, STANDIN

    from raysweep.serve import telemetry

    nvml = tmp_path / "nvml.json"
    nvml.write_text(json.dumps({"gpus": [{"util": 60, "mem_used_mib": 1000, "power_w": 300, "sm_mhz": 1900,
                                          "reasons": 0}] * 4}))
    f = tmp_path / "acc.yaml"
    f.write_text(yaml.safe_dump({
        "name": "acc", "output_dir": str(tmp_path / "out"), "runs": 1, "max_attempts": 1,
        "serve": {"cmd": f"{PY} {STANDIN / 'server.py'} --model m", "ready_timeout_s": 30,
                  "env": {telemetry.FAKE_ENV: str(nvml)},
                  "params": [{"tensor_parallel_size": 1},
                             {"pipeline_parallel_size": 2, "placement_layout": "spread", "nccl_net": "gdr"}]},
        "bench": {"backend": "command", "cmd": f"{PY} {STANDIN / 'bench.py'} --model m --num-prompts 10 --sleep 1",
                  "params": [{"random_input_len": 16}]},
        "transport": {"probe": True, "probe_mib": 1, "probe_iters": 1, "wait_s": 3, "telemetry_interval_s": 0.1},
    }))
    res = CliRunner().invoke(main, ["acceptance", str(f), "--address", gpu_cluster.address])
    assert res.exit_code == 0, res.output
    assert "every item passed" in res.output
    text = res.output[res.output.index("Checklist:"):]
    assert text.count("[      ok] GPUs per bundle") == 2 and "rank 1: Ray" in text
    assert "IB+GDR" in text and "GB/s bus bandwidth (gloo" in text and "fake NVML" in text
    assert text.count("[      ok] server start: ready in") == 2

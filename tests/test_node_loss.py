"""Node loss on simulated Ray nodes (ray.cluster_utils) in a cluster of its own: the lab's finding that a
one-GPU configuration was placed again on the head without GPUs, and node loss as data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")

SCRIPT = Path(__file__).parent / "standin" / "gpu_node_loss.py"
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.ray
def test_gpu_node_lost_mid_point_its_configs_wait_for_a_gpu_node_never_the_head_and_nothing_is_lost(tmp_path):
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "4"], capture_output=True, text=True,
                          timeout=400, env=env, cwd=ROOT)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert done.returncode == 0 and line, done.stdout[-3000:] + done.stderr[-5000:]
    r = json.loads(line[len("RESULT "):])
    assert r["removed"] and r["added"], r
    lost, new = r["removed"][0], r["added"][0]
    # nothing lost, nothing run twice: 6 points, each done once, one result file each
    assert r["counts"] == {"pending": 0, "running": 0, "done": 6, "failed": 0}, r["counts"]
    assert len(r["result_files"]) == 6 and sorted(p["attempts"] for p in r["points"])[-1] == 2
    assert sum(p["attempts"] for p in r["points"]) == 7, r["points"]  # the one interrupted point ran again
    # never on the head, never with 0 GPUs: every server on a 1-GPU worker, every result with its GPU
    assert {s["node_id"] for s in r["servers"]} <= {lost, new} and r["head"] not in {s["node_id"] for s in r["servers"]}
    assert all(s["gpu_ids"] == "0" for s in r["servers"]), r["servers"]
    assert {row["gpu_count"] for row in r["rows"]} == {1} and {row["gpus_per_node"] for row in r["rows"]} == {1}
    # the old node and the new one are of one type: the same hardware, nothing mixed
    assert {row["hardware"] for row in r["rows"]} == {"1 node(s) x 1 GPU(s) / nodes 1 GPU, 2 CPU"}
    assert {row["hardware_mixed"] for row in r["rows"]} == {False}
    # node loss as data: which node, which points were in flight, the wait, where it went again
    events = r["events"]
    kinds = [e["kind"] for e in events]
    assert kinds.count("node_lost") == 1 and "waiting_for_nodes" in kinds and "cannot_place" not in kinds, kinds
    node_lost = next(e for e in events if e["kind"] == "node_lost")
    assert node_lost["nodes"] == [lost]
    retried = next(p["point_id"] for p in r["points"] if p["attempts"] == 2)
    assert f"points in flight: {retried}" in node_lost["detail"]
    waits = [e for e in events if e["kind"] == "waiting_for_nodes"]
    assert all("no alive node has GPUs" in e["detail"] for e in waits), waits
    replaced = [e for e in events if e["kind"] == "replaced"]
    assert replaced and all(e["nodes"] == [new] and "1 node x 1 GPU(s)" in e["detail"] for e in replaced), replaced
    assert node_lost["at"] <= min(e["at"] for e in waits) <= min(e["at"] for e in replaced)

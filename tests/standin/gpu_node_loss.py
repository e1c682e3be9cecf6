"""The lab's node-loss finding on simulated nodes, in a Ray cluster of its own: a head without GPUs and one
worker declaring 1 GPU; a stand-in campaign of two one-GPU configurations; the worker removed while a point
runs on it, and a new 1-GPU worker added a few seconds later. Prints one JSON line: what the ledger and the
results hold. Run by tests/test_node_loss.py in a process of its own (a cluster of its own needs its own
driver: the session's cluster has GPU nodes that never go)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

from raysweep.record.directory import CampaignDir

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

FAST_HEALTH_CHECKS = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 1000,
                      "health_check_failure_threshold": 5, "health_check_timeout_ms": 2000}


def running_on(out: Path) -> str | None:
    """The node under the server of the first running point, from the ledger."""
    from raysweep.ledger import Ledger

    if not (out / "ledger.sqlite").exists():
        return None
    led = Ledger.open_existing(out)
    try:
        busy = {p.server_id for p in led.points() if p.state == "running"}
        return next((s.node_id for s in led.servers(active_only=True) if s.server_id in busy), None)
    finally:
        led.close()


def main(work: Path, rejoin_after_s: float) -> dict:
    import ray
    from helpers import run_file, standin_campaign
    from ray.cluster_utils import Cluster

    from raysweep import procs
    from raysweep.ledger import Ledger
    from raysweep.results.table import results_table

    temp_dir = f"/tmp/rs-nl{os.getpid()}"
    cluster = Cluster(initialize_head=True, head_node_args=dict(
        num_cpus=2, num_gpus=0, include_dashboard=False, temp_dir=temp_dir, _system_config=FAST_HEALTH_CHECKS))
    try:
        first = cluster.add_node(num_cpus=2, num_gpus=1, runtime_env_dir_name="rr_w0")
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, namespace="raysweep", log_to_driver=False)
        f = standin_campaign(work, bench_args="--sleep 1.5",
                             serve_params={"grid": {"max_num_seqs": [8, 16]}},
                             bench_params={"grid": {"random_input_len": [16, 32, 64]}},
                             placement={"replace_wait_s": 120})
        out = work / "out"
        result: dict = {}
        kinds: list[str] = []

        def campaign() -> None:
            try:
                result["summary"] = run_file(f, on_event=lambda kind, **d: kinds.append(kind))[0]
            except BaseException as exc:
                result["error"] = repr(exc)

        runner = threading.Thread(target=campaign, daemon=True)
        runner.start()
        # the worker removed under the first running point, then (Ray's add_node wants the main thread) a new
        # 1-GPU worker added once Ray has seen the first one go and the configurations have waited a while
        removed: list[str] = []
        added: list[str] = []
        if procs.wait_for(lambda: running_on(out) == first.node_id, 120, 0.2):
            removed.append(first.node_id)
            cluster.remove_node(first, allow_graceful=False)
            procs.wait_for(lambda: not any(n["Alive"] for n in ray.nodes() if n["NodeID"] == first.node_id), 60)
            time.sleep(rejoin_after_s)
            added.append(cluster.add_node(num_cpus=2, num_gpus=1, runtime_env_dir_name="rr_w1").node_id)
        runner.join(300)
        if "summary" not in result:
            raise RuntimeError(f"the campaign did not end: {result.get('error')}")
        summary = result["summary"]
        led = Ledger.open_existing(out)
        try:
            points = [{"point_id": p.point_id, "state": str(p.state), "attempts": p.attempts} for p in led.points()]
            servers = [{"server_id": s.server_id, "serve_id": s.serve_id, "node_id": s.node_id, "state": s.state,
                        "gpu_ids": s.gpu_ids} for s in led.servers()]
            events = led.events()
        finally:
            led.close()
        table = results_table(CampaignDir(out))
        cols = [c for c in ("point_id", "serve_id", "node_id", "gpu_count", "gpus_per_node", "hardware",
                            "hardware_mixed") if c in table.columns]
        rows = table[cols].to_dict("records")
        head = next(n["NodeID"] for n in ray.nodes() if "node:__internal_head__" in (n.get("Resources") or {}))
        files = sorted(str(p.relative_to(out)) for p in (out / "points").rglob("run=*.json"))
        return {"counts": summary.counts, "removed": removed, "added": added, "head": head, "points": points,
                "servers": servers, "events": events, "rows": rows, "kinds": kinds, "result_files": files}
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(Path(sys.argv[1]), float(sys.argv[2])), default=str))

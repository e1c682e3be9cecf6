"""Helpers shared by the tests: campaign files around the stand-in server and bench commands."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import yaml

from raysweep.record.directory import CampaignDir

STANDIN = Path(__file__).parent / "standin"
PY = sys.executable


def standin_campaign(path: Path, *, name: str = "t", server_args: str = "", bench_args: str = "",
                     serve_params: Any = None, bench_params: Any = None, **fields: Any) -> Path:
    """Write a campaign file that runs the stand-in server and bench; returns its path."""
    data: dict[str, Any] = {
        "name": name,
        "output_dir": str(path / "out"),
        "runs": 1,
        "serve": {"cmd": f"{PY} {STANDIN / 'server.py'} --model m {server_args}".strip(), "ready_timeout_s": 30,
                  "params": serve_params if serve_params is not None else {"grid": {"max_num_seqs": [8]}}},
        "bench": {"backend": "command",
                  "cmd": f"{PY} {STANDIN / 'bench.py'} --model m --num-prompts 10 {bench_args}".strip(),
                  "params": bench_params if bench_params is not None else {"grid": {"random_input_len": [16, 32]}}},
    }
    for key, value in fields.items():
        if key in ("serve", "bench"):
            data[key].update(value)
        else:
            data[key] = value
    f = path / "campaign.yaml"
    f.write_text(yaml.safe_dump(data))
    return f


def run_file(campaign_file: Path, **kw: Any) -> tuple[Any, Path]:
    """Run a campaign file on the connected Ray cluster; returns the run summary and the output dir."""
    # every mode registered (raysweep.drive.hooks), as the faces do: a script run in a process of its own
    # (tests/standin/gpu_node_loss.py) has no conftest to do it
    import raysweep.modes  # noqa: F401
    from raysweep.campaign import load_campaign
    from raysweep.drive.driver import run_campaign

    spec = load_campaign(campaign_file)
    out = Path(spec.campaign.output_dir or "")
    return run_campaign(spec, CampaignDir(out), **kw), out


def native_campaign(path: Path, *, name: str = "n", server_args: str = "", bench_args: str = "",
                    bench_params: Any = None, **fields: Any) -> Path:
    """A campaign file with the native client against the streaming stand-in server; returns its path."""
    f = standin_campaign(path, name=name, bench_params=bench_params, **fields)
    data = yaml.safe_load(f.read_text())
    data["serve"]["cmd"] = f"{PY} {STANDIN / 'stream_server.py'} --model m {server_args}".strip()
    data["bench"].update(backend="native", cmd=f"vllm bench serve --model m --num-prompts 10 {bench_args}".strip())
    for key, value in fields.get("bench", {}).items():
        data["bench"][key] = value
    f.write_text(yaml.safe_dump(data))
    return f


def add_nodes(cluster, pool: str, n: int = 2, num_gpus: int = 4) -> list:
    """Add n simulated GPU nodes labelled pool=POOL to the session cluster and wait until Ray sees them."""
    import ray

    from raysweep import procs

    added = [cluster.add_node(num_cpus=2, num_gpus=num_gpus, labels={"pool": pool},
                              runtime_env_dir_name=f"rr_{pool}{i}") for i in range(n)]
    cluster.wait_for_nodes()
    assert procs.wait_for(lambda: sum(1 for x in ray.nodes() if x["Alive"] and x["Labels"].get("pool") == pool) == n,
                          30)
    return added


def remove_nodes(cluster, nodes: list) -> None:
    """Remove what is left of the added nodes and wait until Ray has seen them go, so that the next test
    cannot be placed on a node that is already dead but not yet known to be."""
    import ray

    from raysweep import procs

    for node in nodes:
        if node in cluster.worker_nodes:
            cluster.remove_node(node, allow_graceful=False)
    ids = {n.node_id for n in nodes}
    assert procs.wait_for(lambda: not any(x["Alive"] for x in ray.nodes() if x["NodeID"] in ids), 60)


def remove_node_when_running(cluster, out: Path, candidates: list, removed: list) -> threading.Thread:
    """Remove the node under the first running point's server, from another thread."""
    from raysweep import procs
    from raysweep.ledger import Ledger

    by_id = {n.node_id: n for n in candidates}

    def watch() -> None:
        def running_node() -> str | None:
            if not (out / "ledger.sqlite").exists():
                return None
            led = Ledger.open_existing(out)
            try:
                busy = {p.server_id for p in led.points() if p.state == "running"}
                for s in led.servers(active_only=True):
                    if s.server_id in busy:
                        return next((r["node_id"] for r in s.rank_list() if r["node_id"] in by_id), None)
            finally:
                led.close()
            return None

        holder: list[str] = []
        procs.wait_for(lambda: bool(holder.append(running_node()) or holder[-1]), 60, 0.2)
        if holder and holder[-1]:
            removed.append(holder[-1])
            cluster.remove_node(by_id[holder[-1]], allow_graceful=False)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def plan_workload(plan: Any, tmp_path: Path, with_gpus: bool = False) -> Any:
    """A run's bookkeeping (`raysweep.drive.state.RunState`) over a fresh ledger of `plan` in TMP/out, with no
    driver: for tests of the order the runs are handed out in."""
    from raysweep.drive.state import RunState
    from raysweep.ledger import LEDGER_FILE, Ledger

    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    ledger = Ledger(out / LEDGER_FILE)
    ledger.sync(name="t", fingerprint=plan.fingerprint, meaning={}, campaign={}, campaign_file="",
                points=[(p.id, p.serve.id, p.bench.id, p.run, p.serve.params, p.bench.params) for p in plan.points])
    return RunState(plan, CampaignDir.around(out, ledger), lambda kind, **data: None, with_gpus=with_gpus)


def finish_runnable(work: Any, serve_id: str) -> list[int]:
    """Claim and mark done every run of `serve_id` the workload hands out now; their run numbers, sorted."""
    runs = []
    for row in work.runnable(serve_id):
        assert work.ledger.claim(row.point_id, "s", work.c.max_attempts) is not None
        work.ledger.mark_done(row.point_id, "x.json")
        runs.append(row.run)
    return sorted(runs)

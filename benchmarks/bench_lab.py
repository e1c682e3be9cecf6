"""The lab (raysweep.lab.hosts, root only): its up and down time, partitions at random moments, leftovers, and what a
client on another host costs.

    python benchmarks/bench_lab.py --partitions 10 --seed 1 --json lab.json   # the recorded run (many minutes)
    python benchmarks/bench_lab.py --partitions 2 --no-client                  # a short check

1. `up` and `down` of a 3-host lab, timed; after `down`, the processes, namespaces and links left (target 0).
2. Partitions: one campaign of the stand-in streaming server, one configuration pipeline-parallel across
   hosts 2 and 3 (one simulated GPU each), its native clients on host 1, many short points; `--partitions`
   times, at a random moment 1 to 6 s into a running point, host 2 or 3 (drawn) has its link cut; once Ray
   declares its node dead the link heals and the lab starts that host's Ray again. Measured from the ledger:
   the time from the cut to the `node_lost` event, and to the `replaced` event (the configuration placed
   again, which needs the host back); points lost (not done at the end), points run twice (more than one
   result row), rows measured on another shape (gpu_count or num_nodes not the configuration's).
3. A client on another host against one on the server's host, on the same point of the real `vllm serve`
   (CPU build, tiny model, one host): two labs, one where only host 1 has a CPU for the client, one where only
   the server's host has: median TTFT, ITL and output throughput of each.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml

from raysweep.lab import hosts as lab
from raysweep.ledger import Ledger
from raysweep.record.directory import CampaignDir
from raysweep.results.table import results_table

PY = sys.executable
STANDIN = ROOT / "tests" / "standin"


def _free_subnet() -> str:
    for i in range(150, 250):
        net = f"10.77.{i}.0/24"
        try:
            lab.check_subnet(net)
            return net
        except lab.LabError:
            continue
    raise SystemExit("no free 10.77.x.0/24 subnet")


def in_host(state: dict[str, Any], host: int, argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**lab.host_env(state, host), "RAY_ADDRESS": state["address"], "PYTHONPATH": str(ROOT)}
    return subprocess.run(lab.exec_argv(state, host, argv), env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=str(ROOT))


def leftovers(name: str) -> dict[str, Any]:
    st = lab.status(name)
    left = st.get("leftovers") or {}
    procs = subprocess.run(["pgrep", "-f", f"/tmp/{lab.prefix(name)}/"], capture_output=True, text=True).stdout.split()
    return {"netns": len(left.get("netns", [])), "links": len(left.get("links", [])), "processes": len(procs),
            "state_file": Path(lab.state_path(name)).exists()}


def bench_up_down(rounds: int) -> dict[str, Any]:
    ups, downs, left = [], [], []
    for i in range(rounds):
        t0 = time.monotonic()
        state = lab.up(lab.LabSpec(name=f"bu{i}", subnet=_free_subnet()))
        ups.append(time.monotonic() - t0)
        t0 = time.monotonic()
        lab.down(state["name"])
        downs.append(time.monotonic() - t0)
        left.append(leftovers(state["name"]))
    return {"up_s": ups, "down_s": downs, "left": left}


def _running(out: Path) -> bool:
    if not (out / "ledger.sqlite").exists():
        return False
    try:
        led = Ledger.open_existing(out)
    except Exception:  # noqa: BLE001 - being written
        return False
    try:
        return any(p.state == "running" for p in led.points())
    finally:
        led.close()


def _wait(pred: Any, timeout_s: float, every: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(every)
    return False


def bench_partitions(n: int, seed: int, points: int) -> dict[str, Any]:
    rng = random.Random(seed)
    state = lab.up(lab.LabSpec(name="bp", subnet=_free_subnet()))
    tmp = Path(tempfile.mkdtemp(prefix="rs-bench-lab-"))
    out = tmp / "out"
    data = {"name": "bench-lab", "output_dir": str(out), "runs": 1, "max_attempts": 2 * n + 3,
            "placement": {"replace_wait_s": 600},
            "serve": {"cmd": f"{PY} {STANDIN / 'stream_server.py'} --model m --pipeline-parallel-size 2",
                      "ready_timeout_s": 120},
            "bench": {"backend": "native", "client_cpus": 1, "clients": 1,
                      "cmd": "vllm bench serve --model m --num-prompts 8 --request-rate 2",
                      "params": {"grid": {"random_input_len": list(range(16, 16 + points))}}}}
    f = tmp / "campaign.yaml"
    f.write_text(yaml.safe_dump(data))
    cuts: list[dict[str, Any]] = []

    def partitions() -> None:
        for _ in range(n):
            if not _wait(lambda: _running(out), 900):
                return
            time.sleep(rng.uniform(1.0, 6.0))
            host = rng.choice([2, 3])
            ip = state["hosts"][host - 1]["ip"]
            lab.cut(state, host, "link")
            c = {"host": host, "cut_at": time.time()}
            _wait(lambda ip=ip: (lab.nodes_alive(state) or {}).get(ip) == "DEAD", 300, 0.2)
            c["dead_at"] = time.time()
            lab.heal(state, host)
            lab.restart_ray(state, host)
            c["rejoined_at"] = time.time()
            cuts.append(c)
            _wait(lambda: not _running(out), 60)   # the point cut short is no longer running

    t = threading.Thread(target=partitions, daemon=True)
    t.start()
    t0 = time.monotonic()
    try:
        run = in_host(state, 1, [PY, "-m", "raysweep", "run", str(f), "--address", state["address"]], 7200)
        t.join(600)
        led = Ledger.open_existing(out)
        try:
            pts, events = led.points(), led.events()
        finally:
            led.close()
        df = results_table(CampaignDir(out))
    finally:
        lab.down(state["name"])
    left = leftovers(state["name"])
    lost_events = [e for e in events if e["kind"] == "node_lost"]
    replaced = [e for e in events if e["kind"] == "replaced"]
    for c in cuts:
        lost = next((e for e in lost_events if e["at"] >= c["cut_at"]), None)
        rep = next((e for e in replaced if e["at"] >= c["cut_at"]), None)
        c["to_loss_recorded_s"] = lost["at"] - c["cut_at"] if lost else None
        c["to_dead_s"] = c["dead_at"] - c["cut_at"]
        c["to_replaced_s"] = rep["at"] - c["cut_at"] if rep else None
        c["rejoin_s"] = c["rejoined_at"] - c["dead_at"]
    per_point = df.groupby("point_id").size() if len(df) else {}
    return {"partitions": len(cuts), "cuts": cuts, "exit_code": run.returncode, "wall_s": time.monotonic() - t0,
            "points": len(pts), "done": sum(p.state == "done" for p in pts),
            "lost": sum(p.state != "done" for p in pts),
            "run_twice": int(sum(1 for v in (per_point.values if len(df) else []) if v > 1)),
            "other_shape_rows": int(((df["gpu_count"] != 2) | (df["num_nodes"] != 2)).sum()) if len(df) else 0,
            "attempts": sorted(p.attempts for p in pts), "node_lost_events": len(lost_events),
            "replaced_events": len(replaced), "left": left}


def _client_point(model: str, cpus: list[int], name: str) -> dict[str, Any]:
    state = lab.up(lab.LabSpec(name=name, hosts=2, subnet=_free_subnet(), gpus=[0, 1], cpus=cpus))
    tmp = Path(tempfile.mkdtemp(prefix="rs-bench-lab-"))
    data = {"name": name, "output_dir": str(tmp / "out"), "runs": 3, "warmup": 16,
            "serve": {"cmd": f"vllm serve {model} --load-format dummy --max-model-len 512 --dtype bfloat16 "
                             "--enforce-eager", "env": {"VLLM_CPU_KVCACHE_SPACE": 1}, "ready_timeout_s": 900},
            "bench": {"backend": "native", "client_cpus": 1, "clients": 1,
                      "cmd": f"vllm bench serve --model {model} --dataset-name random --num-prompts 32 "
                             "--random-input-len 64 --random-output-len 16 --temperature 0 --max-concurrency 4"}}
    f = tmp / "c.yaml"
    f.write_text(yaml.safe_dump(data))
    try:
        run = in_host(state, 1, [PY, "-m", "raysweep", "run", str(f), "--address", state["address"]], 3600)
        df = results_table(CampaignDir(tmp / "out"))
    finally:
        lab.down(state["name"])
    cols = ["median_ttft_ms", "median_itl_ms", "output_throughput"]
    return {"exit_code": run.returncode, "client_node_ips": sorted(set(df["client_node_ips"])),
            "server_node_ip": sorted(set(df["node_ip"])), "runs": len(df),
            **{c: [float(x) for x in df[c]] for c in cols if c in df}}


def bench_client(model: str) -> dict[str, Any]:
    other = _client_point(model, [2, 1], "bco")   # host 1: 2 CPUs; the server's host: 1 (its bundle takes 0.5)
    same = _client_point(model, [0, 2], "bcs")    # host 1: none; the server's host: 2
    return {"client_on_other_host": other, "client_on_server_host": same}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", type=int, default=10)
    ap.add_argument("--points", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--up-down-rounds", type=int, default=2)
    ap.add_argument("--no-client", action="store_true", help="skip the client comparison (real vLLM)")
    ap.add_argument("--no-partitions", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    lab.check_root()
    lab.down_stale()
    os.environ.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
    os.environ.pop("VLLM_HOST_IP", None)
    result: dict[str, Any] = {"load_average_at_start": os.getloadavg(), "cores": os.cpu_count()}
    result["up_down"] = bench_up_down(args.up_down_rounds)
    print(json.dumps(result["up_down"], indent=1), flush=True)
    if not args.no_partitions:
        result["partitions"] = bench_partitions(args.partitions, args.seed, args.points)
        print(json.dumps(result["partitions"], indent=1), flush=True)
    if not args.no_client:
        from raysweep.lab.tiny_model import make_tiny_model

        model = make_tiny_model(Path(tempfile.mkdtemp(prefix="rs-bench-model-")) / "tiny-llama")
        result["client"] = bench_client(str(model))
        print(json.dumps(result["client"], indent=1), flush=True)
    result["load_average_at_end"] = os.getloadavg()
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

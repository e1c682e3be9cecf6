"""A campaign's sbatch stopped at random moments on the lab's real Slurm, then submitted again.

A lab of 3 real hosts (raysweep.lab.hosts: GPUs 0,1,1) with a real Slurm on it (raysweep.lab.slurm), the
sbatch `raysweep slurm` writes for a campaign of the stand-in server (tests/standin) pipeline-parallel across
hosts 2 and 3, its clients on host 1 (a heterogeneous job). Each trial is a fresh campaign:

* `scancel`: at a moment drawn uniformly in [0.5, 1.5] points' time after its first point is done (a point
  is then running, or a server between points), `scancel JOB` (every step and the batch shell get SIGTERM at
  once, SIGKILL KillWait = 30 s later);
* `timelimit`: the job's time limit hit mid-campaign (`--time 2`, `--grace 45`: SIGTERM to the batch shell
  45 s before the limit, the campaign and Ray stopped in that order);

then, once the job has left the queue: the points finished before the stop (each in the ledger), any point left
running, what runs on each host beyond the Slurm daemons (must be nothing), and the nodes' Ray temp dirs (must
be gone); then the same sbatch again (as many times as a time-limited job needs, up to 5), to the campaign's end: every
point done, the points finished before the
stop not run again (their attempts unchanged), the runs in all.

    .venv/bin/python benchmarks/bench_slurm.py [--trials 5] [--seed 54] [--work /tmp/bench-slurm]

Root only; writes benchmarks/results/slurm.json and slurm.md (the table); exit 0 when every trial held,
1 when one did not, 2 on bad input. Run it under `flock /tmp/raysweep-lab.lock`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from raysweep.lab import hosts as lab  # noqa: E402
from raysweep.lab import slurm as lab_slurm  # noqa: E402
from raysweep.ledger import Ledger  # noqa: E402

STANDIN = ROOT / "tests" / "standin"
POINTS = 10


def points(out: Path) -> list:
    if not (out / "ledger.sqlite").exists():
        return []
    try:
        led = Ledger.open_existing(out)
    except Exception:  # noqa: BLE001 - not written yet
        return []
    try:
        return led.points()
    finally:
        led.close()


def left_on_hosts(state: dict) -> list[str]:
    import psutil

    daemons = {d["pid"] for d in state["slurm"]["daemons"]}
    left = []
    for h in state["hosts"]:
        for pid in map(int, subprocess.run(["ip", "netns", "pids", h["netns"]], capture_output=True,
                                           text=True).stdout.split()):
            if pid == h["anchor_pid"] or pid in daemons:
                continue
            try:
                p = psutil.Process(pid)
                if p.ppid() in daemons and "slurmctld" in " ".join(p.cmdline()):
                    continue
                if p.status() == psutil.STATUS_ZOMBIE:
                    continue
                left.append(f"{h['hostname']}: {' '.join(p.cmdline())[:100]}")
            except psutil.Error:
                continue
    return left


def campaign(work: Path, name: str) -> Path:
    data = {"name": name, "output_dir": str(work / name / "out"), "runs": 1, "max_attempts": 2,
            "serve": {"cmd": f"{sys.executable} {STANDIN / 'stream_server.py'} --model m --pipeline-parallel-size 2",
                      "ready_timeout_s": 120},
            "bench": {"backend": "native", "client_cpus": 1, "clients": 1,
                      "cmd": "vllm bench serve --model m --num-prompts 8 --request-rate 2",
                      "params": {"grid": {"random_input_len": [16 + 8 * i for i in range(POINTS)]}}}}
    (work / name).mkdir(parents=True, exist_ok=True)
    f = work / name / "campaign.yaml"
    f.write_text(yaml.safe_dump(data))
    return f


def trial(state: dict, work: Path, i: int, mode: str, rng: random.Random) -> dict:
    env = lab_slurm.client_env(state, {**os.environ, "RAY_AUTH_MODE": "disabled"})
    name = f"t{i}-{mode}"
    f = campaign(work, name)
    d = work / name
    out = d / "out"
    limit = ["--time", "2", "--grace", "45"] if mode == "timelimit" else ["--time", "15", "--grace", "60"]
    subprocess.run([sys.executable, "-m", "raysweep", "slurm", str(f), "--gpus-per-node", "1", "--client-nodes", "1",
                    *limit, "-o", str(d / "c.sbatch")], cwd=d, env=env, check=True, capture_output=True)

    def submit() -> str:
        r = subprocess.run(["sbatch", "--parsable", str(d / "c.sbatch")], cwd=d, env=env, capture_output=True,
                           text=True, check=True)
        return r.stdout.strip().split(";")[0]

    rec: dict = {"trial": i, "mode": mode, "load_before": os.getloadavg()[0]}
    t0 = time.monotonic()
    job = submit()
    first_done = None
    while time.monotonic() - t0 < 400:
        pts = points(out)
        if first_done is None and any(p.state == "done" for p in pts):
            first_done = time.monotonic()
            per_point = max(2.0, (first_done - t0) / 4)
            delay = rng.uniform(0.5, 1.5) * per_point
            rec["stop_after_first_done_s"] = round(delay, 1)
        if mode == "scancel" and first_done is not None and time.monotonic() >= first_done + delay:
            break
        if mode == "timelimit" and subprocess.run(["squeue", "-h", "-j", job], env=env, capture_output=True,
                                                  text=True).stdout.strip() == "":
            break
        time.sleep(0.2)
    at_stop = {p.point_id: p.state for p in points(out)}
    rec["running_at_stop"] = sum(s == "running" for s in at_stop.values())
    t_stop = time.monotonic()
    if mode == "scancel":
        subprocess.run(["scancel", job], env=env, check=True)
    rec["end_state"] = lab_slurm.wait_job(state, job, 180)
    rec["stop_to_gone_s"] = round(time.monotonic() - t_stop, 1)
    time.sleep(1)
    first = {p.point_id: (p.state, p.attempts) for p in points(out)}
    done_first = {k: v for k, v in first.items() if v[0] == "done"}
    rec.update(done_at_stop=sum(s == "done" for s in at_stop.values()), done_kept=len(done_first),
               left_running=sum(v[0] == "running" for v in first.values()), left_on_hosts=left_on_hosts(state),
               ray_tmp_left=[str(p) for p in Path("/tmp").glob(f"rs-{job}-{lab.prefix(state['name'])}-*")])
    log = (d / f"slurm-raysweep-{job}.out").read_text(errors="replace") if (d / f"slurm-raysweep-{job}.out").exists() \
        else ""
    rec["stopped_in_order"] = "signal: stopping the campaign" in log and "stopping Ray on" in log
    # the same sbatch again; a time-limited job may need several to end the campaign (each stops cleanly)
    rec["resume_jobs"] = 0
    while rec["resume_jobs"] < 5:
        job2 = submit()
        rec["resume_jobs"] += 1
        rec["resume_state"] = lab_slurm.wait_job(state, job2, 600)
        if rec["resume_state"] == "COMPLETED" or mode == "scancel":
            break
    after = {p.point_id: (p.state, p.attempts) for p in points(out)}
    rec.update(done_after=sum(v[0] == "done" for v in after.values()), points=len(after),
               finished_rerun=sum(after.get(k) != v for k, v in done_first.items()),
               runs_total=sum(a for _, a in after.values()), left_after=left_on_hosts(state),
               load_after=os.getloadavg()[0], wall_s=round(time.monotonic() - t0, 1))
    rec["held"] = (rec["done_kept"] >= rec["done_at_stop"] and not rec["left_on_hosts"] and not rec["ray_tmp_left"]
                   and rec["done_after"] == POINTS and rec["finished_rerun"] == 0
                   and rec["runs_total"] <= POINTS + rec["left_running"] + 1 and not rec["left_after"]
                   and rec["resume_state"] == "COMPLETED")
    print(json.dumps(rec), flush=True)
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--seed", type=int, default=54)
    ap.add_argument("--modes", default="scancel,timelimit", help="comma-separated, taken in turn")
    ap.add_argument("--work", default="/tmp/bench-slurm")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "slurm.json"))
    a = ap.parse_args()
    modes = [m for m in a.modes.split(",") if m]
    if a.trials < 1 or not set(modes) <= {"scancel", "timelimit"} or not modes:
        print("--trials: 1 or more; --modes: scancel and/or timelimit", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("the lab needs root", file=sys.stderr)
        return 2
    work = Path(a.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rng = random.Random(a.seed)
    lab.down_stale()
    state = lab.up(lab.LabSpec(name="bsl", hosts=3, subnet="10.77.254.0/24", gpus=[0, 1, 1], cpus=[2, 1, 1],
                               ray=False))
    recs = []
    try:
        lab_slurm.up(state)
        for i in range(1, a.trials + 1):
            recs.append(trial(state, work, i, modes[(i - 1) % len(modes)], rng))
    finally:
        lab_slurm.down(state)
        lab.down(state["name"])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    doc = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit, "seed": a.seed,
           "points": POINTS, "trials": recs, "held": sum(r["held"] for r in recs)}
    Path(a.out).write_text(json.dumps(doc, indent=2))
    print(f"{doc['held']} of {len(recs)} trials held")
    return 0 if doc["held"] == len(recs) else 1


if __name__ == "__main__":
    sys.exit(main())

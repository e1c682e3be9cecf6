"""Campaigns under Slurm: the sbatch `raysweep slurm` writes from a plan, and a real Slurm on lab hosts
(`slurm_cluster`, tests/conftest.py: slurmctld on host 1, a slurmd per host, munge; root only) that runs it,
cancelled mid-point and submitted again. The campaigns use the stand-in server (tests/standin): the real
vLLM across lab hosts is the lab tier's, and the real demo under sbatch is `make demo-slurm`."""

from __future__ import annotations

import grp
import os
import pwd
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from raysweep.lab import hosts as lab
from raysweep.lab import slurm as lab_slurm
from raysweep.ledger import Ledger
from raysweep.place.slurm import parse_time

RAYSWEEP = [sys.executable, "-m", "raysweep"]
ROOT = Path(__file__).resolve().parent.parent
STANDIN = ROOT / "tests" / "standin"
DEMO = ROOT / "configs" / "demo-cluster.yaml"


def slurm_cmd(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*RAYSWEEP, "slurm", *args], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "RAYSWEEP_DEMO_MODEL": "/models/tiny",
                               **(env or {})})


def sbatch_lines(text: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in text.splitlines() if line.startswith("#SBATCH ")]


# ---------------------------------------------------------------------------------------------------
# The script, from the plan
# ---------------------------------------------------------------------------------------------------

def test_the_sbatch_is_sized_from_the_largest_placement_and_timed_from_the_estimate(tmp_path):
    """The demo campaign (pipeline-parallel 2 and a single-GPU configuration): on one-GPU nodes its largest
    placement takes two nodes, with a CPU-only component for the head and the clients; on 8-GPU nodes, one
    node with 2 GPUs. The time limit is the estimate's, the TERM comes GRACE s before it, and bash reads it."""
    r = slurm_cmd(tmp_path, str(DEMO), "--gpus-per-node", "1", "--client-nodes", "1", "-o", "demo.sbatch")
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "demo.sbatch").read_text()
    lines = sbatch_lines(text)
    het = lines.index("hetjob")
    assert "--nodes=1" in lines[:het] and not any("gpus" in x for x in lines[:het])
    assert {"--nodes=2", "--gpus-per-node=1", "--ntasks-per-node=1"} <= set(lines[het:])
    assert "--signal=B:TERM@120" in lines and "--requeue" in lines and f"--chdir={tmp_path}" in lines
    assert "pipeline_parallel_size=2 (2 nodes x 1 GPU(s), pipeline across nodes)" in text
    limit = parse_time(next(x for x in lines if x.startswith("--time=")).split("=", 1)[1])
    assert "the estimate (" in text and limit % 60 == 0 and limit > 120 + 300
    assert f"OUTPUT_DIR={tmp_path / 'results' / 'demo-cluster'}" in text and f"CAMPAIGN={DEMO}" in text
    assert "ray start --block" in text and "raysweep.place.slurm_node" in text and "ray stop" not in text
    assert subprocess.run(["bash", "-n", str(tmp_path / "demo.sbatch")]).returncode == 0
    assert os.access(tmp_path / "demo.sbatch", os.X_OK)

    r = slurm_cmd(tmp_path, str(DEMO), "--time", "1:30:00", "--grace", "300", "--partition", "gpu", "-o", "-")
    assert r.returncode == 0, r.stderr
    lines = sbatch_lines(r.stdout)
    assert "hetjob" not in lines and {"--nodes=1", "--gpus-per-node=2", "--exclusive", "--partition=gpu",
                                       "--time=01:30:00", "--signal=B:TERM@300"} <= set(lines)
    assert not (tmp_path / "demo-cluster.sbatch").exists()


@pytest.mark.parametrize("args, says", [
    (["--gpus-per-node", "0"], "--gpus-per-node: 0 is not accepted"),
    (["--time", "soon"], "--time: 'soon' is not accepted"),
    (["--time", "3", "--grace", "170"], "--grace: 170 s leaves the campaign"),
    (["--python", "/nonexistent/python"], "--python: '/nonexistent/python' is not an executable file"),
    (["--client-nodes", "-1"], "--client-nodes: -1 is not accepted"),
])
def test_bad_input_exits_2_naming_the_field_and_writes_nothing(tmp_path, args, says):
    r = slurm_cmd(tmp_path, str(DEMO), *args, "-o", "x.sbatch")
    assert r.returncode == 2 and says in r.stderr, (r.returncode, r.stderr)
    assert list(tmp_path.iterdir()) == []


def test_a_configuration_that_fits_no_node_of_that_size_is_refused_naming_it(tmp_path):
    camp = tmp_path / "tp.yaml"
    camp.write_text(yaml.safe_dump({"name": "tp", "serve": {"cmd": "vllm serve m --tensor-parallel-size 8"},
                                    "bench": {"cmd": "vllm bench serve --model m"}}))
    r = slurm_cmd(tmp_path, str(camp), "--gpus-per-node", "4", "-o", "tp.sbatch")
    assert r.returncode == 2 and "--gpus-per-node 4" in r.stderr and "tensor_parallel_size" not in r.stdout
    assert not (tmp_path / "tp.sbatch").exists()
    r = slurm_cmd(tmp_path, str(tmp_path / "missing.yaml"), "-o", "m.sbatch")
    assert r.returncode == 2 and "does not exist" in r.stderr and not (tmp_path / "m.sbatch").exists()


def test_the_node_supervisor_leaves_no_process_behind_even_orphans(tmp_path):
    """`slurm_node` (what each srun task runs) is the subreaper of what it starts: a grandchild whose parent
    died first (as a Ray worker whose raylet went) is still stopped by pid on SIGTERM, and the temp dir goes."""
    import psutil

    mark = tmp_path / "orphan.pid"
    temp = tmp_path / "ray-tmp"
    temp.mkdir()
    script = f"sh -c 'sleep 600 & echo $! > {mark}; exit 0'; sleep 600"
    p = subprocess.Popen([sys.executable, "-m", "raysweep.place.slurm_node", "--grace", "2", "--clean", str(temp),
                          "--", "sh", "-c", script], env={**os.environ, "PYTHONPATH": str(ROOT)},
                         stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (mark.exists() and mark.read_text().strip()):
        time.sleep(0.1)
    orphan = int(mark.read_text())
    time.sleep(0.5)
    assert psutil.Process(orphan).ppid() == p.pid      # reparented to the supervisor, not to init
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 0 and "stopped (signal 15)" in out, out
    assert not psutil.pid_exists(orphan) or psutil.Process(orphan).status() == psutil.STATUS_ZOMBIE
    assert not temp.exists()


def test_slurm_node_gives_ray_the_gpus_and_cpus_slurm_gave_the_node():
    from raysweep.place.slurm_node import expand

    env = {"SLURM_GPUS_ON_NODE": "4", "SLURM_CPUS_ON_NODE": "32", "SLURMD_NODENAME": "gpu7"}
    assert expand(["--num-gpus=@GPUS@", "--num-cpus=@CPUS@", "/tmp/rs-1-@NODE@"], env) == [
        "--num-gpus=4", "--num-cpus=32", "/tmp/rs-1-gpu7"]
    assert expand(["@GPUS@"], {"CUDA_VISIBLE_DEVICES": "0,1"}) == ["2"]
    assert expand(["@GPUS@"], {}) == ["0"]


# ---------------------------------------------------------------------------------------------------
# A real Slurm on the lab's hosts
# ---------------------------------------------------------------------------------------------------

def test_the_lab_slurm_has_a_node_per_host_with_its_gpus_and_no_cgroup(slurm_cluster):
    state = slurm_cluster
    info = state["slurm"]
    env = lab_slurm.client_env(state)
    nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T %c %G"], capture_output=True, text=True, env=env,
                           timeout=30).stdout.split("\n")
    seen = {line.split()[0]: line.split()[1:] for line in nodes if line.strip()}
    assert seen == {h["hostname"]: ["idle", str(h["cpus"]), f"gpu:{h['gpus']}" if h["gpus"] else "(null)"]
                    for h in state["hosts"]}
    conf = Path(info["conf"]).read_text()
    for want in ("ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
                 "SlurmdPidFile=", "%n", "AuthType=auth/munge"):
        assert want in conf
    key = Path(info["dir"]) / "munge" / "munge.key"
    st = key.stat()
    assert stat.S_IMODE(st.st_mode) == 0o400 and pwd.getpwuid(st.st_uid).pw_name == "munge"
    assert grp.getgrgid(st.st_gid).gr_name == "munge"
    # each slurmd runs in its own host's namespaces (its network namespace is that host's anchor's)
    by_host = {d["host"]: d["pid"] for d in info["daemons"] if d["name"] == "slurmd"}
    for h in state["hosts"]:
        assert os.readlink(f"/proc/{by_host[h['index']]}/ns/net") == os.readlink(f"/proc/{h['anchor_pid']}/ns/net")
        pid_file = Path(info["dir"], "run", f"slurmd-{h['hostname']}.pid")
        assert pid_file.read_text().split()[0] == str(by_host[h["index"]])
        assert Path(info["dir"], "log", f"slurmd-{h['hostname']}.log").exists()


def _points(out: Path) -> list:
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


def _left_on_hosts(state: dict) -> dict[str, list[str]]:
    """What runs on each host beyond its anchor and the Slurm daemons: a job's leftovers."""
    import psutil

    daemons = {d["pid"] for d in state["slurm"]["daemons"]}
    out = {}
    for h in state["hosts"]:
        pids = subprocess.run(["ip", "netns", "pids", h["netns"]], capture_output=True, text=True).stdout.split()
        cmds = []
        for pid in map(int, pids):
            if pid == h["anchor_pid"] or pid in daemons:
                continue
            try:
                p = psutil.Process(pid)
                if p.ppid() in daemons and "slurmctld" in " ".join(p.cmdline()):
                    continue          # slurmctld's own script helper
                cmds.append(" ".join(p.cmdline())[:120])
            except psutil.Error:
                continue
        out[h["hostname"]] = cmds
    return out


def _standin_campaign(tmp_path: Path, points: int) -> Path:
    data = {"name": "slurm-cancel", "output_dir": str(tmp_path / "out"), "runs": 1, "max_attempts": 2,
            "serve": {"cmd": f"{sys.executable} {STANDIN / 'stream_server.py'} --model m --pipeline-parallel-size 2",
                      "ready_timeout_s": 120},
            "bench": {"backend": "native", "client_cpus": 1, "clients": 1,
                      "cmd": "vllm bench serve --model m --num-prompts 6 --request-rate 2",
                      "params": {"grid": {"random_input_len": [16 + 8 * i for i in range(points)]}}}}
    f = tmp_path / "campaign.yaml"
    f.write_text(yaml.safe_dump(data))
    return f


def test_an_sbatch_cancelled_mid_point_keeps_every_finished_point_and_resumes_running_nothing_twice(
        slurm_cluster, tmp_path):
    """`raysweep slurm` of a campaign (two one-GPU hosts pipeline-parallel, the head and the clients on the
    GPU-less one), `sbatch`, `scancel` while a point runs: the job ends, every finished point is in the ledger,
    no point is left running, nothing of the job runs on any host; the same sbatch again ends the campaign,
    the points finished before the cancel untouched."""
    state = slurm_cluster
    env = lab_slurm.client_env(state, {**os.environ, "RAY_AUTH_MODE": "disabled"})
    f = _standin_campaign(tmp_path, 4)
    out = tmp_path / "out"
    r = slurm_cmd(tmp_path, str(f), "--gpus-per-node", "1", "--client-nodes", "1", "--time", "15", "--grace", "60",
                  "-o", "c.sbatch", env=env)
    assert r.returncode == 0, r.stderr

    def submit() -> str:
        s = subprocess.run(["sbatch", "--parsable", str(tmp_path / "c.sbatch")], capture_output=True, text=True,
                           env=env, cwd=tmp_path, timeout=60)
        assert s.returncode == 0, s.stderr
        return s.stdout.strip().split(";")[0]

    job = submit()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        pts = _points(out)
        if sum(p.state == "done" for p in pts) >= 1 and any(p.state == "running" for p in pts):
            break
        time.sleep(0.3)
    log = tmp_path / f"slurm-raysweep-{job}.out"
    assert any(p.state == "running" for p in _points(out)), log.read_text()[-4000:] if log.exists() else "no log"
    subprocess.run(["scancel", job], env=env, check=True, timeout=30)
    end = lab_slurm.wait_job(state, job, 120)
    assert end in ("CANCELLED", "FAILED", "COMPLETED"), end
    first = {p.point_id: (p.state, p.attempts) for p in _points(out)}
    done_first = {k: v for k, v in first.items() if v[0] == "done"}
    # scancel signals every step at once: Ray goes with the driver, and the point in flight may be left as a
    # dead driver leaves it (`running`), which the next run takes up again
    assert done_first and sum(s == "running" for s, _ in first.values()) <= 1, first
    time.sleep(1)
    assert not any(_left_on_hosts(state).values()), _left_on_hosts(state)
    assert not list(Path("/tmp").glob(f"rs-{job}-{lab.prefix(state['name'])}-*")), "a node's Ray temp dir was left"

    job2 = submit()
    end = lab_slurm.wait_job(state, job2, 400)
    text = (tmp_path / f"slurm-raysweep-{job2}.out").read_text()
    assert end == "COMPLETED", text[-4000:]
    after = {p.point_id: (p.state, p.attempts) for p in _points(out)}
    assert [s for s, _ in after.values()] == ["done"] * 4, after
    assert all(after[k] == v for k, v in done_first.items())          # nothing finished was run again
    assert sum(a for _, a in after.values()) <= 5                       # only the point cut short ran twice
    time.sleep(1)
    assert not any(_left_on_hosts(state).values()), _left_on_hosts(state)
    assert not list(Path("/tmp").glob(f"rs-{job2}-{lab.prefix(state['name'])}-*")), "a node's Ray temp dir was left"
    assert "Killed" not in text, text[-3000:]          # every node's Ray stopped by its supervisor, not by srun
    assert lab.status(state["name"])["hosts"] and all(
        n.rstrip("*") == "idle" for n in lab_slurm.sinfo(state).values())


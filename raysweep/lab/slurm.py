"""A real Slurm cluster on a lab's hosts (raysweep.lab.hosts): `slurmctld` on the head, `slurmd` on every host
(its own hostname and address), `munged` for authentication with a key made for this lab, the hosts' simulated
GPUs declared as generic resources, and no cgroup anywhere (`proctrack/linuxproc`, `task/none`,
`jobacct_gather/none`), so it runs where the machine gives a process no cgroup of its own.

Everything lives under the lab's own directory (`<lab root>/slurm`): `slurm.conf` and `gres.conf`, the munge key
(0400, owned by munge), the controller's state, each host's spool, pid and log files (`%n` in `slurm.conf`).
Each daemon runs in the foreground inside its host's namespaces; `down` stops each by the pid in its pid file
(the pid it was started with where there is none), SIGTERM then SIGKILL, then removes the directory. The lab's
own `down` then stops whatever a job left on a host (found by its network namespace) and deletes the hosts.

Client commands (`sbatch`, `squeue`, `scancel`, `scontrol`) reach the controller from this machine over the
lab's bridge, or from inside a host, with `SLURM_CONF` set to the lab's `slurm.conf` (`client_env`).

The packages come from Debian (`slurmctld`, `slurmd`, `slurm-client`, `munge`; scripts/install-slurm.sh).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import stat
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysweep.lab import hosts as lab
from raysweep.lab.hosts import LabError

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["CTLD_PORT", "SLURMD_PORT", "client_env", "down", "gres_line", "missing_tools", "sinfo", "slurm_conf",
           "up", "wait_job"]

CTLD_PORT = 6817
SLURMD_PORT = 6818
KILL_WAIT_S = 30            # Slurm's default: SIGTERM to a cancelled job's processes, SIGKILL 30 s later
PARTITION = "lab"
TOOLS = ("slurmctld", "slurmd", "slurmstepd", "munged", "sbatch", "squeue", "scancel", "scontrol", "sinfo")


def _which(tool: str) -> str | None:
    return shutil.which(tool) or next((str(p) for p in (Path("/usr/sbin") / tool, Path("/usr/bin") / tool)
                                       if p.exists()), None)


def missing_tools() -> list[str]:
    """The Slurm and munge programs this machine lacks (scripts/install-slurm.sh installs them)."""
    return [t for t in TOOLS if _which(t) is None]


def slurm_dir(state: dict[str, Any]) -> Path:
    return Path(state["root"]) / "slurm"


def client_env(state: dict[str, Any], base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment in which Slurm's client commands talk to this lab's controller."""
    env = dict(base if base is not None else os.environ)
    env["SLURM_CONF"] = str(slurm_dir(state) / "slurm.conf")
    return env


def gres_line(gpus: int) -> str:
    return f" Gres=gpu:{gpus}" if gpus else ""


def slurm_conf(state: dict[str, Any], kill_wait_s: int = KILL_WAIT_S) -> str:
    """slurm.conf for the lab: one node per host (its hostname, its address, its CPUs and simulated GPUs)."""
    d = slurm_dir(state)
    head = state["hosts"][0]
    lines = [
        f"ClusterName={lab.prefix(state['name'])}",
        f"SlurmctldHost={head['hostname']}({head['ip']})",
        f"SlurmctldPort={CTLD_PORT}", f"SlurmdPort={SLURMD_PORT}",
        "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={d / 'munge' / 'munge.socket'}",
        "SlurmUser=root", "SlurmdUser=root",
        f"StateSaveLocation={d / 'ctld'}",
        f"SlurmctldPidFile={d / 'run' / 'slurmctld.pid'}", f"SlurmctldLogFile={d / 'log' / 'slurmctld.log'}",
        f"SlurmdSpoolDir={d / 'spool' / '%n'}", f"SlurmdPidFile={d / 'run' / 'slurmd-%n.pid'}",
        f"SlurmdLogFile={d / 'log' / 'slurmd-%n.log'}",
        # no cgroup: processes tracked by their parentage, tasks not confined, nothing accounted
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none", "MpiDefault=none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU", "GresTypes=gpu",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=bf_interval=2,bf_hetjob_immediate",   # a heterogeneous job starts within seconds
        "SlurmdParameters=config_overrides", "ReturnToService=2",
        f"KillWait={kill_wait_s}", "MinJobAge=300", "InactiveLimit=0", "SlurmdTimeout=120", "MessageTimeout=20",
        "SlurmctldDebug=info", "SlurmdDebug=info",
    ]
    for h in state["hosts"]:
        # GPU nodes weigh more: Slurm gives the lightest first, so a CPU-only component of a heterogeneous job
        # (the clients) goes to a host without GPUs rather than taking a GPU host its GPU component needs
        lines.append(f"NodeName={h['hostname']} NodeAddr={h['ip']} CPUs={h['cpus']} RealMemory=1024"
                     f"{gres_line(h['gpus'])} Weight={10 if h['gpus'] else 1} State=UNKNOWN")
    lines.append(f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO")
    return "\n".join(lines) + "\n"


def gres_conf(state: dict[str, Any]) -> str:
    """One device file per simulated GPU (`<slurm dir>/dev/<host>/gpuN`, made by `up`). Slurm 22.05 counts no
    GPU of a `gres.conf` line with a count and no device file (measured: the node registers `gres/gpu count
    reported lower than configured (0 < 1)` and is drained), and refuses a regular file ("not a valid character
    or block device"); a character device with /dev/null's numbers is accepted and reads and writes nothing."""
    d = slurm_dir(state) / "dev"
    return "".join(f"NodeName={h['hostname']} Name=gpu File={d / h['hostname']}/gpu"
                   + (f"[0-{h['gpus'] - 1}]" if h["gpus"] > 1 else "0") + "\n"
                   for h in state["hosts"] if h["gpus"])


def _gpu_files(state: dict[str, Any]) -> None:
    null = os.stat("/dev/null").st_rdev
    for h in state["hosts"]:
        where = slurm_dir(state) / "dev" / h["hostname"]
        where.mkdir(parents=True, exist_ok=True)
        for i in range(h["gpus"]):
            os.mknod(where / f"gpu{i}", 0o600 | stat.S_IFCHR, null)


# slurmd 22.05 loads a cgroup plugin whatever the other plugins are, and its `autodetect` fails where
# /sys/fs/cgroup holds no cgroup file system (as in a lab host: `ip netns exec` mounts a sysfs of its own).
# Naming the v1 plugin loads it without touching a cgroup; nothing above uses one.
CGROUP_CONF = "CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n"


def _tool(name: str) -> str:
    path = _which(name)
    if path is None:
        raise LabError(f"{name} is not installed: run scripts/install-slurm.sh as root "
                       "(Debian: apt-get install slurmctld slurmd slurm-client munge)", 2)
    return path


def _munge_key(path: Path, uid: int, gid: int) -> None:
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o400)
    with os.fdopen(fd, "wb") as f:
        f.write(os.urandom(1024))
    os.chown(tmp, uid, gid)
    os.chmod(tmp, 0o400)
    os.replace(tmp, path)


def _daemon(state: dict[str, Any], host: int, argv: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    """A daemon in the foreground inside lab host `host`; `nsenter` execs it, so its pid is the Popen's."""
    with open(log_path, "ab") as out:
        env = {**lab.host_env(state, host), "SLURM_CONF": str(slurm_dir(state) / "slurm.conf")}
        return subprocess.Popen(lab.exec_argv(state, host, argv, cwd="/"), env=env,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _wait(pred: Callable[[], object], timeout_s: float, what: str, logs: list[Path], every: float = 0.2) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(every)
    tails = "\n".join(f"--- {p}:\n{p.read_text(errors='replace')[-1500:]}" for p in logs if p.exists())
    raise LabError(f"the lab's Slurm: {what} within {timeout_s:.0f} s\n{tails}")


def sinfo(state: dict[str, Any]) -> dict[str, str]:
    """Node name -> Slurm's state of it (idle, alloc, down, ...), as `sinfo` reports it now."""
    out = subprocess.run([_tool("sinfo"), "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=30,
                         env=client_env(state))
    return dict(line.split()[:2] for line in out.stdout.splitlines() if len(line.split()) >= 2)


def up(state: dict[str, Any], kill_wait_s: int = KILL_WAIT_S, timeout_s: float = 90.0) -> dict[str, Any]:
    """Start munged, slurmctld on the head and slurmd on every host of a lab that is up; wait until every node
    is idle. Returns what was started (also kept in the lab's state file under `slurm`)."""
    lab.check_root()
    if missing := missing_tools():
        raise LabError(f"Slurm is not installed ({', '.join(missing)} missing): run scripts/install-slurm.sh as "
                       "root (Debian: apt-get install slurmctld slurmd slurm-client munge)", 2)
    t0 = time.monotonic()
    d = slurm_dir(state)
    shutil.rmtree(d, ignore_errors=True)
    for sub in ("ctld", "spool", "log", "run", "munge"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    munge = pwd.getpwnam("munge")
    os.chmod(d / "munge", 0o755)   # munged: the socket's directory open to all (x)
    os.chown(d / "munge", munge.pw_uid, munge.pw_gid)
    key = d / "munge" / "munge.key"
    _munge_key(key, munge.pw_uid, munge.pw_gid)
    (d / "slurm.conf").write_text(slurm_conf(state, kill_wait_s))
    (d / "gres.conf").write_text(gres_conf(state))
    _gpu_files(state)
    (d / "cgroup.conf").write_text(CGROUP_CONF)
    info: dict[str, Any] = {"dir": str(d), "conf": str(d / "slurm.conf"), "kill_wait_s": kill_wait_s,
                            "daemons": []}
    state["slurm"] = info
    lab._save_state(state)                 # from here on, `down` finds what was started
    try:
        sock = d / "munge" / "munge.socket"
        munged = _daemon(state, 1, ["setpriv", f"--reuid={munge.pw_uid}", f"--regid={munge.pw_gid}",
                                    "--init-groups", _tool("munged"), "--foreground", f"--key-file={key}",
                                    f"--socket={sock}", f"--pid-file={d / 'munge' / 'munged.pid'}",
                                    f"--log-file={d / 'munge' / 'munged.log'}",
                                    f"--seed-file={d / 'munge' / 'munged.seed'}"], d / "log" / "munged.out")
        info["daemons"].append({"name": "munged", "host": 1, "pid": munged.pid,
                                "pid_file": str(d / "munge" / "munged.pid")})
        lab._save_state(state)
        _wait(lambda: sock.exists() or munged.poll() is not None, 20, "munged did not start",
              [d / "log" / "munged.out", d / "munge" / "munged.log"])
        if munged.poll() is not None:
            raise LabError(f"munged exited ({munged.returncode}): "
                           f"{(d / 'log' / 'munged.out').read_text(errors='replace')[-1500:]}")
        env = {**os.environ, "SLURM_CONF": info["conf"]}
        ctld = _daemon(state, 1, [_tool("slurmctld"), "-D", "-c", "-f", info["conf"]], d / "log" / "slurmctld.out")
        info["daemons"].append({"name": "slurmctld", "host": 1, "pid": ctld.pid,
                                "pid_file": str(d / "run" / "slurmctld.pid")})
        lab._save_state(state)
        _wait(lambda: ctld.poll() is not None or subprocess.run(
            [_tool("scontrol"), "ping"], capture_output=True, text=True, env=env, timeout=30).stdout.count("UP") > 0,
            30, "slurmctld did not answer", [d / "log" / "slurmctld.out", d / "log" / "slurmctld.log"], 0.5)
        if ctld.poll() is not None:
            raise LabError(f"slurmctld exited ({ctld.returncode}): "
                           f"{(d / 'log' / 'slurmctld.log').read_text(errors='replace')[-2000:]}")
        for h in state["hosts"]:
            (d / "spool" / h["hostname"]).mkdir(exist_ok=True)
            p = _daemon(state, h["index"], [_tool("slurmd"), "-D", "-N", h["hostname"], "-f", info["conf"]],
                        d / "log" / f"slurmd-{h['hostname']}.out")
            info["daemons"].append({"name": "slurmd", "host": h["index"], "pid": p.pid,
                                    "pid_file": str(d / "run" / f"slurmd-{h['hostname']}.pid")})
        lab._save_state(state)
        names = [h["hostname"] for h in state["hosts"]]
        _wait(lambda: all(sinfo(state).get(n, "").rstrip("*") == "idle" for n in names), timeout_s,
              f"not every node became idle (sinfo: {sinfo(state)})",
              [d / "log" / "slurmctld.log", *(d / "log" / f"slurmd-{n}.log" for n in names)], 0.5)
        info["up_s"] = round(time.monotonic() - t0, 2)
        lab._save_state(state)
        return info
    except BaseException:
        down(state)
        raise


def _pid_of(daemon: dict[str, Any]) -> int | None:
    """The daemon's pid from its pid file, else the one it was started with; None when neither runs it."""
    import psutil

    candidates = []
    with contextlib.suppress(OSError, ValueError):
        candidates.append(int(Path(daemon["pid_file"]).read_text().split()[0]))
    candidates.append(int(daemon["pid"]))
    for pid in candidates:
        with contextlib.suppress(psutil.Error):
            if Path(psutil.Process(pid).exe()).name.startswith(daemon["name"]):
                return pid
    return None


def down(state: dict[str, Any], grace_s: float = 10.0) -> dict[str, Any]:
    """Stop the lab's Slurm daemons by their pids (slurmd first, munged last) and remove its directory; the lab
    itself stays up (`lab.down` stops whatever a job left on a host). Returns the pids stopped and left."""
    info = state.get("slurm") or {}
    order = {"slurmd": 0, "slurmctld": 1, "munged": 2}
    stopped: list[int] = []
    left: list[int] = []
    for name in sorted(order, key=order.__getitem__):
        pids = [p for p in (_pid_of(dm) for dm in info.get("daemons", []) if dm["name"] == name) if p]
        if pids:
            alive = lab._stop_pids(pids, grace_s)
            stopped += [p for p in pids if p not in alive]
            left += alive
    if info.get("dir"):
        shutil.rmtree(info["dir"], ignore_errors=True)
    if "slurm" in state:
        state.pop("slurm")
        with contextlib.suppress(OSError):
            if lab.state_path(state["name"]).exists():
                lab._save_state(state)
    return {"stopped": stopped, "left": left}


def wait_job(state: dict[str, Any], job_id: str, timeout_s: float) -> str:
    """Wait until a job has left the queue, its processes gone (`squeue` lists a cancelled job as COMPLETING
    until then), or the timeout passed; its last state as `scontrol` has it."""
    deadline = time.monotonic() + timeout_s
    env = client_env(state)
    while time.monotonic() < deadline:
        queued = subprocess.run([_tool("squeue"), "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True,
                                env=env, timeout=30)
        if queued.returncode == 0 and not queued.stdout.strip():
            break
        time.sleep(0.5)
    out = subprocess.run([_tool("scontrol"), "-o", "show", "job", job_id], capture_output=True, text=True,
                         env=env, timeout=30).stdout
    states = [kv.split("=", 1)[1] for kv in out.split() if kv.startswith("JobState=")]
    return states[0] if states else "UNKNOWN"

"""One node's Ray inside a Slurm job step, and nothing left of it when the step ends, however it ends.

`python -m raysweep.place.slurm_node [--grace S] -- ray start --block ...` (the sbatch that `raysweep slurm`
writes runs it with `srun`, one task per node). It fills in `@GPUS@` (the GPUs Slurm gave this node:
`SLURM_GPUS_ON_NODE`, else the count of `CUDA_VISIBLE_DEVICES`, else 0), `@CPUS@` (`SLURM_CPUS_ON_NODE`) and
`@NODE@` (`SLURMD_NODENAME`), runs the command, and is the child subreaper of everything it starts: a process
whose parent dies (a Ray worker, a vLLM rank, when the raylet goes first) becomes its child rather than init's,
so it is neither lost to Slurm's process tracking (`proctrack/linuxproc` follows parentage) nor left running.

On SIGTERM, SIGINT or SIGHUP (srun forwards `scancel`'s and the batch script's), and when the command exits,
it stops the command (SIGTERM; `ray start --block` then stops its node's processes), waits up to `--grace`
seconds, then stops every descendant left by pid (SIGTERM, then SIGKILL 3 s later), reaps them, removes the
directory `--clean` names (Ray's temp dir on the node), and exits.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def node_gpus(env: dict[str, str]) -> int:
    """The GPUs Slurm gave this node to the step."""
    for key in ("SLURM_GPUS_ON_NODE",):
        with contextlib.suppress(ValueError):
            return int(env.get(key, ""))
    visible = env.get("CUDA_VISIBLE_DEVICES", "")
    return len([d for d in visible.split(",") if d.strip()]) if visible and visible != "NoDevFiles" else 0


def expand(argv: list[str], env: dict[str, str]) -> list[str]:
    cpus = env.get("SLURM_CPUS_ON_NODE") or env.get("SLURM_CPUS_PER_TASK") or str(os.cpu_count() or 1)
    subs = {"@GPUS@": str(node_gpus(env)), "@CPUS@": cpus, "@NODE@": env.get("SLURMD_NODENAME", "node")}
    out = []
    for a in argv:
        for k, v in subs.items():
            a = a.replace(k, v)
        out.append(a)
    return out


def _descendants() -> list[int]:
    import psutil

    try:
        return [p.pid for p in psutil.Process().children(recursive=True)]
    except psutil.Error:
        return []


def _reap() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def sweep(grace_s: float = 3.0) -> int:
    """Stop every descendant by pid (SIGTERM, SIGKILL after `grace_s`), reap them; how many there were."""
    seen: set[int] = set()
    for _ in range(5):
        pids = _descendants()
        if not pids:
            break
        seen.update(pids)
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and _descendants():
            _reap()
            time.sleep(0.1)
        for pid in _descendants():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
        _reap()
    return len(seen)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m raysweep.place.slurm_node", description=__doc__.splitlines()[0])
    ap.add_argument("--grace", type=float, default=20.0, help="seconds the command has to stop on a signal")
    ap.add_argument("--clean", default=None, help="a directory to remove once everything has stopped (Ray's temp dir)")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("no command: python -m raysweep.place.slurm_node -- ray start --block ...")
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    stop = {"sig": 0}

    def on_signal(sig: int, _frame: object) -> None:
        stop["sig"] = sig

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)
    cmd = expand(cmd, dict(os.environ))
    print(f"slurm_node {os.environ.get('SLURMD_NODENAME', '')}: {' '.join(cmd)}", flush=True)
    child = subprocess.Popen(cmd)
    while child.poll() is None and not stop["sig"]:
        time.sleep(0.2)
    if child.poll() is None:
        child.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(args.grace)
    n = sweep()
    rc = child.poll()
    if args.clean:
        shutil.rmtree(expand([args.clean], dict(os.environ))[0], ignore_errors=True)
    why = f"signal {stop['sig']}" if stop["sig"] else f"exit {rc}"
    print(f"slurm_node {os.environ.get('SLURMD_NODENAME', '')}: stopped ({why}); {n} process(es) left by it "
          "stopped by pid", flush=True)
    return 0 if stop["sig"] else (rc if rc is not None else 1)


if __name__ == "__main__":
    sys.exit(main())

"""The server guard: `python -m raysweep.serve.guard WATCH_PID WATCH_START STATE_DIR -- COMMAND...`.

A host actor starts its server through this small supervisor, which makes sure no server process outlives
the actor, however the actor ends:
- The guard forks once and the launcher exits at once, so the guard is not a direct child of the Ray
  worker: a worker that exits SIGKILLs its direct children, which would leave the server orphaned.
- The guard stays in the worker's process group, so Ray's group kill (ray.kill, a crashed worker)
  still reaches the guard, the server and everything the server forked.
- The guard is a child subreaper: whatever the server forks stays its descendant even when orphaned.
- It ends the whole tree on SIGTERM/SIGINT, when the watched worker (pid + start time) is gone (the
  raylet or the driver was killed), or when the server's main process exits.
- It copies the server's output to the log with secret values (secret env vars and flags) masked. The server's
  stdout is a terminal (a pty, in raw mode: no `\r` added), its stderr a pipe: C libraries buffer a stdout that is
  a pipe in 4 KiB blocks and flush it only when the process exits, and NCCL writes its `NCCL_DEBUG=INFO` lines
  to stdout with `vfprintf` and no flush (`src/debug.cc`), so behind a pipe a live server's NCCL lines stay in its
  own memory and the transport check sees none. A terminal makes libc (and Python without PYTHONUNBUFFERED)
  flush every line, in every process the server forks, with no preload and no change to the command. Colour
  codes that a program adds for a terminal are taken out (and `NO_COLOR=1` is set unless the environment sets
  it), so the log reads as before.
- It runs on the CPUs `RAYSWEEP_CPU_AFFINITY` names (`serve.cpu_affinity`), and so does the server.
- It raises its own priority to niceness 0 where the OS allows (Ray starts workers at nice 15, and the
  server would inherit it), and records in `nice` the niceness before, after and why it could not.
- It gives the server a private directory for vLLM's IPC sockets (`VLLM_RPC_BASE_PATH`, unless the server's
  environment sets it): vLLM creates them in /tmp by default and leaves them there when its processes are
  stopped. The guard removes the directory once the server's tree has ended. Its path is short (under /tmp),
  as a socket's path may not exceed 107 bytes.
It writes `guard.pid`, `nice` and `server.pid` on start and `exit_code` at the end into STATE_DIR.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import pty
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import termios
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from raysweep.grid import mask_text, secret_values
from raysweep.procs import CPUS_ENV, is_alive, kill_tree, pin_cpus
from raysweep.record.files import write_text_atomic

PR_SET_CHILD_SUBREAPER = 36
GRACE_S = float(os.environ.get("RAYSWEEP_STOP_GRACE_S", "20"))
PID_FILE = "guard.pid"
SERVER_PID_FILE = "server.pid"
EXIT_FILE = "exit_code"
NICE_FILE = "nice"
SERVER_NICENESS = 0  # the priority a server runs at, whatever the Ray worker that starts it has
IPC_ENV = "VLLM_RPC_BASE_PATH"  # where vLLM puts its processes' IPC sockets

_stop = False


def _on_signal(signum: int, frame: object) -> None:
    global _stop
    _stop = True


def main(argv: list[str]) -> int:
    if len(argv) < 5 or argv[3] != "--":
        print("usage: python -m raysweep.serve.guard WATCH_PID WATCH_START STATE_DIR -- COMMAND...", file=sys.stderr)
        return 2
    watch, watch_start, state = int(argv[0]), float(argv[1]), Path(argv[2])
    cmd = argv[4:]
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    if os.fork() > 0:
        os._exit(0)
    write_text_atomic(state / NICE_FILE, json.dumps(renice(SERVER_NICENESS)))
    _pin(os.environ.pop(CPUS_ENV, None))
    write_text_atomic(state / PID_FILE, str(os.getpid()))
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    sockets = None if IPC_ENV in os.environ else tempfile.mkdtemp(prefix="rs-ipc-")
    if sockets is not None:
        os.environ[IPC_ENV] = sockets
    try:
        code = _supervise(cmd, lambda: not _stop and is_alive(watch, watch_start))
    finally:
        if sockets is not None:
            shutil.rmtree(sockets, ignore_errors=True)
    if is_alive(watch, watch_start):
        write_text_atomic(state / EXIT_FILE, str(code))  # the host reads it, then removes the directory
    else:  # the host is gone (killed, its node lost): nobody will read the state, so leave none behind
        shutil.rmtree(state, ignore_errors=True)
    return code


def _pin(cpus: str | None) -> None:
    """`serve.cpu_affinity`: the guard runs on these CPUs, and so does the server it starts, with all it forks."""
    from raysweep.procs import cpu_set

    wanted = cpu_set(cpus) if cpus else None
    failure = pin_cpus(wanted) if wanted else None
    if failure:
        print(f"# raysweep: the server's {failure}; it runs on CPUs {sorted(os.sched_getaffinity(0))}", flush=True)


def renice(target: int) -> dict[str, object]:
    """Lower this process's niceness to `target` (never raise it); {before, after, error}."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    error = ""
    if before > target:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, target)
        except OSError as exc:
            error = f"{exc.strerror or exc} (lowering niceness needs CAP_SYS_NICE or a RLIMIT_NICE of {20 - target})"
    return {"before": before, "after": os.getpriority(os.PRIO_PROCESS, 0), "error": error}


def stdout_terminal() -> tuple[int, int]:
    """A pty for a child's stdout (master, slave), in raw mode: what the child writes comes through unchanged
    (no `\n` turned into `\r\n`), and libc sees a terminal, so it flushes stdout at every line."""
    master, slave = pty.openpty()
    attrs = termios.tcgetattr(slave)
    attrs[1] &= ~termios.OPOST  # output as written
    attrs[3] &= ~(termios.ECHO | termios.ICANON)
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    return master, slave


def _supervise(cmd: list[str], keep_going: object) -> int:
    try:
        master, slave = stdout_terminal()
    except OSError as exc:  # no pty here (/dev/pts not mounted): a pipe, as before, and say what it costs
        master = slave = -1
        print(f"# raysweep: no terminal for the server's stdout ({exc}): NCCL's lines may reach this log only when "
              "the server exits; set NCCL_DEBUG_FILE in serve.env to read them from files", flush=True)
    env = dict(os.environ)
    env.setdefault("NO_COLOR", "1")  # vLLM colours its log on a terminal (VLLM_LOGGING_COLOR=auto)
    try:
        child = subprocess.Popen(cmd, stdout=slave if slave >= 0 else subprocess.PIPE, stderr=subprocess.PIPE,
                                 stdin=subprocess.DEVNULL, env=env)
    except OSError as exc:
        for fd in (master, slave):
            if fd >= 0:
                os.close(fd)
        print(f"raysweep guard: cannot start {cmd[0]!r}: {exc}", flush=True)
        return 127
    if slave >= 0:
        os.close(slave)  # the server and what it forks hold it; the master reads EOF (EIO) once they all end
    write_text_atomic(Path(sys.argv[3]) / SERVER_PID_FILE, str(child.pid))
    secrets = secret_values(cmd, os.environ)
    lock = threading.Lock()
    stdout = _pty_lines(master) if master >= 0 else iter(child.stdout.readline, b"")  # type: ignore[union-attr]
    stderr = iter(child.stderr.readline, b"")  # type: ignore[union-attr]
    copiers = [threading.Thread(target=_copy_masked, args=(stdout, secrets, lock, master >= 0), daemon=True),
               threading.Thread(target=_copy_masked, args=(stderr, secrets, lock), daemon=True)]
    for copier in copiers:
        copier.start()
    code: int | None = None
    while code is None and keep_going():  # type: ignore[operator]
        code = _reap(child.pid)
        time.sleep(0.2)
    if code is None:  # stop the server first, alone, so it can shut its own workers down and free memory
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGTERM)
            os.kill(child.pid, signal.SIGCONT)  # a stopped (hung) server gets the SIGTERM too
        deadline = time.monotonic() + GRACE_S
        while code is None and time.monotonic() < deadline:
            code = _reap(child.pid)
            time.sleep(0.1)
    kill_tree(os.getpid(), grace_s=5, include_root=False)  # whatever it left behind
    for copier in copiers:
        copier.join(timeout=5)
    last = _reap(child.pid)
    if code is None:
        code = last if last is not None else 143
    return code


_SGR = re.compile(rb"\x1b\[[0-9;]*m")  # colour codes a program writes to a terminal


def _pty_lines(master: int) -> Iterator[bytes]:
    """The lines read from a pty's master end until every holder of its slave end has closed it (Linux then
    answers EIO), the last one even without its newline; the master is closed at the end."""
    rest = b""
    try:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: no process holds the terminal any more
                break
            if not chunk:
                break
            rest += chunk
            *lines, rest = rest.split(b"\n")
            for line in lines:
                yield line + b"\n"
    finally:
        os.close(master)
    if rest:
        yield rest + b"\n"


def _copy_masked(lines: Iterable[bytes], secrets: set[str], lock: threading.Lock | None = None,
                 terminal: bool = False) -> None:
    """Copy the server's output to ours (the log file) line by line, with secret values masked (and from a
    terminal, without colour codes); `lock` keeps the lines of stdout and stderr whole."""
    out = sys.stdout.buffer
    for line in lines:
        if terminal:
            line = _SGR.sub(b"", line)
        if secrets:
            line = mask_text(line.decode(errors="replace"), secrets).encode()
        with lock or contextlib.nullcontext():
            out.write(line)
            out.flush()


def _reap(child_pid: int) -> int | None:
    """Reap finished descendants without blocking; the exit code if `child_pid` was among them."""
    code = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return code
        if pid == 0:
            return code
        if pid == child_pid:
            code = os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

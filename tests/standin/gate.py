"""A gate in front of a real benchmark command: `gate.py --log FILE --hold-from N --servers K -- CMD ...`.

Each call appends the `--base-url` it was given (the server it measures) to FILE; from the N-th call on, it
waits until K different servers have been seen (or --timeout-s passes) before running CMD with the same
arguments. A test of servers sharing points uses it so that the first server cannot finish every point
before a slower second one is up, whatever the machine's speed: the outcome then depends on the scheduler
alone, not on how long a server start took.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import sys
from pathlib import Path

from raysweep import grid, procs


def _seen(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


def main() -> None:
    argv = sys.argv[1:]
    split = argv.index("--")
    ap = argparse.ArgumentParser()
    ap.add_argument("--log", required=True, type=Path)
    ap.add_argument("--hold-from", type=int, default=1)
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--timeout-s", type=float, default=900.0)
    args = ap.parse_args(argv[:split])
    cmd = argv[split + 1:]
    url = grid.find_flag_value(cmd, "--base-url", "--base_url") or ""
    with open(args.log, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(url + "\n")
        fcntl.flock(f, fcntl.LOCK_UN)
    number = len(_seen(args.log))
    if number >= args.hold_from:
        procs.wait_for(lambda: len(set(_seen(args.log))) >= args.servers, args.timeout_s, 0.2)
    full = procs.resolve_executable(cmd)
    os.execv(full[0], full)


if __name__ == "__main__":
    main()

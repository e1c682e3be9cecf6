"""Whole-or-nothing file writes: a temporary file beside the target, fsync, then `os.replace`.

The temporary file is made, renamed and synced through one handle on the target's directory (`dir_fd`), never
by two path names: a process whose working directory was set from another mount namespace (`nsenter --wd`,
as `raysweep lab exec` once did) reaches a relative path through that namespace's mount and an absolute one
through its own, and a rename between the two is refused as crossing devices (EXDEV) although both name the
same directory of the same filesystem.

The file gets the mode any program of the user would give it (0666 less the umask: 0644 under the usual
022), not the 0600 of the temporary file, so teammates reading a shared results directory can open it."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import shutil
import sqlite3
import threading
from pathlib import Path

__all__ = ["DISK_FULL_ENV", "file_mode", "free_space", "no_space", "write_bytes_atomic", "write_json_atomic",
           "write_text_atomic"]

# A fault injection for tests and benchmarks/bench_chaos.py: while the file this variable names exists, every
# write through this module fails as on a full disk (ENOSPC), and works again once it is removed.
DISK_FULL_ENV = "RAYSWEEP_FAULT_DISK_FULL"

_UMASK_LOCK = threading.Lock()


def _umask() -> int:
    """The process's umask, read without changing it where Linux says it (/proc), else set and restored."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode a new regular file gets from the user's umask."""
    return 0o666 & ~_umask()


def no_space(exc: BaseException) -> bool:
    """Whether a write failed for want of space: a full disk or an exhausted quota (or SQLite saying so)."""
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    return isinstance(exc, sqlite3.OperationalError) and "disk is full" in str(exc)


def free_space(path: str | Path) -> str:
    """The free space of the filesystem holding `path` (or its nearest existing parent), for a message."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return f"{shutil.disk_usage(p).free / 2**20:.1f} MiB free on the filesystem of {p}"
    except OSError as exc:
        return f"free space of {p} unknown ({exc.strerror})"


def _injected_fault(path: Path) -> None:
    flag = os.environ.get(DISK_FULL_ENV)
    if flag and os.path.exists(flag):
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (injected: {DISK_FULL_ENV})", str(path))


def write_bytes_atomic(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` whole or not at all. An error names `path` (and keeps the errno: a full disk is
    still told by `no_space`); no temporary file is left behind."""
    path = Path(path)
    _injected_fault(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        tmp, fd = _temp_beside(dfd, path)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fchmod(f.fileno(), file_mode())
                os.fsync(f.fileno())
            os.replace(tmp, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            if isinstance(exc, OSError):
                raise OSError(exc.errno, exc.strerror, str(path)) from exc
            raise
        with contextlib.suppress(OSError):  # the rename itself on disk (some filesystems cannot sync a directory)
            os.fsync(dfd)
    finally:
        os.close(dfd)
    return path


def _temp_beside(dfd: int, path: Path) -> tuple[str, int]:
    """A new, empty temporary file in the directory `dfd` (its name relative to it, and an open descriptor)."""
    for _ in range(100):
        name = f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            return name, os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(path))


def write_text_atomic(path: str | Path, text: str) -> Path:
    return write_bytes_atomic(path, text.encode())


def write_json_atomic(path: str | Path, obj: object) -> Path:
    return write_text_atomic(path, json.dumps(obj, indent=2, default=str) + "\n")

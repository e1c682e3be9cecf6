"""Whole-or-nothing file writes (raysweep.record.files) from any working directory: relative paths, and a working
directory set from another mount namespace (`nsenter --wd`), where a relative and an absolute name of one
directory reach it through two different mounts and a rename between them crosses devices (EXDEV)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raysweep.record.files import write_bytes_atomic, write_json_atomic

ROOT = Path(__file__).resolve().parent.parent


def test_a_relative_path_is_written_whole_with_no_temporary_file_left(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    got = write_json_atomic(Path("points/a/b/run=1.json"), {"ok": 1})
    assert got == Path("points/a/b/run=1.json")
    assert (tmp_path / "points/a/b/run=1.json").read_text() == '{\n  "ok": 1\n}\n'
    write_bytes_atomic("points/a/b/run=1.json", b"again")                # replaced whole
    assert sorted(p.name for p in (tmp_path / "points/a/b").iterdir()) == ["run=1.json"]
    assert (tmp_path / "points/a/b/run=1.json").read_bytes() == b"again"


def test_a_failed_write_names_the_target_keeps_its_errno_and_leaves_nothing(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x").mkdir()           # a directory where the file should go: the rename is refused
    (tmp_path / "d" / "x" / "in").write_text("")
    with pytest.raises(OSError) as info:
        write_bytes_atomic(tmp_path / "d" / "x", b"data")
    assert info.value.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST)
    assert info.value.filename == str(tmp_path / "d" / "x")
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["x"]


@pytest.mark.skipif(os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("nsenter")),
                    reason="NOT RUN: a mount namespace of its own needs root, unshare and nsenter")
def test_a_relative_write_from_a_working_directory_set_from_another_mount_namespace(tmp_path):
    """The fault `make demo-cluster` met (the driver started by `nsenter --wd=DIR` inside a lab host): the same
    program with a temporary file named by an absolute path fails with EXDEV there; raysweep's writes succeed."""
    anchor = subprocess.Popen(["unshare", "--mount", "sleep", "120"])
    try:
        mine = os.readlink("/proc/self/ns/mnt")
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{anchor.pid}/ns/mnt") == mine:   # until unshare has made its namespace
            assert time.monotonic() < deadline, "unshare made no mount namespace in 10 s"
            time.sleep(0.02)
        script = (
            "import os, tempfile\n"
            "from raysweep.record.files import write_json_atomic\n"
            "os.makedirs('points/s', exist_ok=True)\n"
            "fd, tmp = tempfile.mkstemp(dir='points/s')\n"          # an absolute name, as mkstemp gives
            "os.close(fd)\n"
            "try:\n"
            "    os.replace(tmp, 'points/s/plain.json')\n"
            "    print('plain: ok')\n"
            "except OSError as exc:\n"
            "    print('plain:', exc.errno)\n"
            "    os.unlink(tmp)\n"
            "write_json_atomic('points/s/run=1.json', {'ok': 1})\n"
            "print('raysweep: ok')\n")
        res = subprocess.run(["nsenter", "-t", str(anchor.pid), "-m", f"--wd={tmp_path}", "--", sys.executable,
                              "-c", script], capture_output=True, text=True, timeout=60,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        anchor.kill()
        anchor.wait()
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [f"plain: {errno.EXDEV}", "raysweep: ok"]
    assert (tmp_path / "points/s/run=1.json").read_text() == '{\n  "ok": 1\n}\n'
    assert sorted(p.name for p in (tmp_path / "points/s").iterdir()) == ["run=1.json"]

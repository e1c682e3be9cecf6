"""The server guard (`raysweep.serve.guard`): what it leaves behind once its server has ended."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil

from raysweep.serve.guard import IPC_ENV

# the child stands for a vLLM server: it puts a socket-like file where vLLM puts its IPC sockets
CHILD = ("import os, pathlib; d = pathlib.Path(os.environ['VLLM_RPC_BASE_PATH']); "
         "(d / 'a6f1c0de-0000-4000-8000-000000000000').write_text(''); print('ipc', d, flush=True)")


def _guard(state: Path, env: dict[str, str]) -> str:
    """The child's output, run through the guard; returns once the guard has ended (it holds the pipe)."""
    me = psutil.Process()
    state.mkdir()
    out = subprocess.run([sys.executable, "-m", "raysweep.serve.guard", str(me.pid), repr(me.create_time()),
                          str(state), "--", sys.executable, "-c", CHILD],
                         env=env, capture_output=True, text=True, timeout=60)
    return out.stdout


def test_the_servers_ipc_sockets_go_to_a_private_directory_removed_when_it_ends(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != IPC_ENV}
    line = next(s for s in _guard(tmp_path / "state", env).splitlines() if s.startswith("ipc "))
    sockets = Path(line.split(" ", 1)[1])
    assert sockets.parent == Path("/tmp") and sockets.name.startswith("rs-ipc-")
    assert len(str(sockets / "a6f1c0de-0000-4000-8000-000000000000")) < 107  # a socket path's limit
    assert not sockets.exists()  # removed with what the server put in it


def test_a_base_path_the_servers_environment_sets_is_kept(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    out = _guard(tmp_path / "state", {**os.environ, IPC_ENV: str(mine)})
    assert f"ipc {mine}" in out and (mine / "a6f1c0de-0000-4000-8000-000000000000").exists()

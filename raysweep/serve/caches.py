"""Server starts that reuse what they can: one compilation cache per campaign and node, and warm weights.

vLLM keeps what `torch.compile` made under `VLLM_CACHE_ROOT` (keyed by a hash of the configuration, so a
configuration that differs only in what the compiled graph does not depend on loads it instead of compiling),
and Inductor and Triton keep their kernels in their own cache directories. With `serve.share_caches: true`
(the default) every server of a campaign on a node gets the same three directories,
`~/.cache/raysweep/<campaign>/{vllm,inductor,triton}` on that node: the first start of a model there
compiles, the later ones load what they can, and a resumed campaign finds them again (on vLLM's CPU build with
the help of `raysweep.vllm_plugin`, which those servers get: `RAYSWEEP_AOT_LOAD=1`). With
`serve.share_caches: false` every server gets fresh empty directories of its own, removed when it stops: every
start is cold, for a clean cold-start study (vLLM's default, `~/.cache/vllm` shared by everything the user
runs, is neither). A campaign whose `serve.env` sets `VLLM_CACHE_ROOT` itself keeps it.

`serve.warm_weights: true` reads the model's files once per node before the first server there (the page
cache then holds them, and the start reads them from memory), when the model is a local directory.

The driver passes the choice in the server's environment (`CACHE_ENV`); the host actor on the node turns it
into directories (`node_dirs`), says where they are and how big (`dir_bytes`), and removes fresh ones.
Whether a start found compiled graphs in the cache is read from its log (`compile_cache_state`).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysweep import vllm_plugin

if TYPE_CHECKING:
    from raysweep.campaign.models import Campaign

__all__ = ["CACHE_ENV", "cache_request", "compile_cache_state", "dir_bytes", "node_dirs", "warm_files"]

log = logging.getLogger(__name__)

CACHE_ENV = "RAYSWEEP_COMPILE_CACHE"  # "shared:<campaign>" or "fresh", read by the host actor
USER_KEYS = ("VLLM_CACHE_ROOT",)
_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def cache_request(campaign: Campaign, serve_env: dict[str, str]) -> dict[str, str]:
    """What the driver adds to a server's environment: shared per campaign, or fresh per server; nothing
    when `serve.env` chose the cache itself."""
    if any(k in serve_env for k in USER_KEYS):
        return {}
    share = getattr(campaign.serve, "share_caches", True) if campaign.serve is not None else True
    return {CACHE_ENV: f"shared:{_SAFE.sub('_', campaign.name)}" if share else "fresh"}


def node_dirs(request: str | None, server_id: str) -> tuple[dict[str, str], Path | None, Path | None]:
    """On the node: the environment that points vLLM, Inductor and Triton at their directories, the root of
    those directories, and the root to remove when the server stops (fresh ones); ({}, None, None) without
    a request."""
    if not request:
        return {}, None, None
    if request.startswith("shared:"):
        root = Path.home() / ".cache" / "raysweep" / request.removeprefix("shared:")
        remove = None
    else:
        root = Path(tempfile.mkdtemp(prefix=f"raysweep-cold-{server_id}-"))
        remove = root
    env = {"VLLM_CACHE_ROOT": str(root / "vllm"), "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
           "TRITON_CACHE_DIR": str(root / "triton")}
    for path in env.values():
        Path(path).mkdir(parents=True, exist_ok=True)
    if remove is None:  # shared: the CPU build can then load the compiled graph it finds (raysweep.vllm_plugin)
        env[vllm_plugin.ENV] = "1"
    return env, root, remove


def dir_bytes(root: Path | str | None) -> int | None:
    """The bytes of the files under `root` (None when it is not a directory)."""
    if root is None or not Path(root).is_dir():
        return None
    total = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total


def remove(root: Path | None) -> None:
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)


# vLLM 0.32's lines (vllm/compilation/backends.py, decorators.py, monitor.py): loaded from the cache, or compiled
_HIT = re.compile(r"Directly load the compiled graph|Directly load AOT compilation")
_COMPILED = re.compile(r"Compiling a graph for|torch\.compile took [0-9.]+ s in total|compilation: [0-9.]+ s"
                       r"|saved AOT compiled function|Dynamo bytecode transform time")


# vLLM found a compiled graph in the cache but could not load it (the CPU build of 0.32 without raysweep's plugin,
# raysweep.vllm_plugin: "'function' object has no attribute 'finalize_loading'"); it compiles again, with the
# kernels Inductor kept in the same cache
_LOAD_FAILED = re.compile(r"Compiling model again due to a load failure")


def compile_cache_state(log_text: str) -> str:
    """What a start did with compilation, from its log: `warm` (it loaded compiled graphs from the cache),
    `recompiled` (it found them but vLLM could not load them, and compiled again with the kernels the cache
    kept), `cold` (it compiled), or `none` (nothing compiled: eager, or not vLLM)."""
    if _HIT.search(log_text):
        return "warm"
    if _LOAD_FAILED.search(log_text):
        return "recompiled"
    if _COMPILED.search(log_text):
        return "cold"
    return "none"


def warm_files(path: str, chunk: int = 1 << 20) -> dict[str, Any]:
    """Read every file under a local model directory once, so that the page cache holds it; returns what it
    read and how long it took (nothing for a path that is not a local directory, a hub name)."""
    root = Path(path)
    if not root.is_dir():
        return {"path": path, "bytes": 0, "seconds": 0.0, "note": "not a local directory: left to the server"}
    t0, total = time.monotonic(), 0
    for dirpath, _, names in os.walk(root):
        for name in sorted(names):
            try:
                with open(os.path.join(dirpath, name), "rb", buffering=0) as f:
                    while block := f.read(chunk):
                        total += len(block)
            except OSError as exc:
                log.warning("warming %s: %s", os.path.join(dirpath, name), exc)
    return {"path": path, "bytes": total, "seconds": time.monotonic() - t0}

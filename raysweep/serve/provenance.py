"""Provenance of a server: what ran where, gathered on the server's node when the server starts.

`gather(argv)` runs in the host actor: software versions (vLLM, torch and its NCCL, Ray, Python, raysweep,
through `preflight.node_versions`), the GPUs and their driver (nvidia-smi, "none" without it), the model's
path and revision (a local directory, or a Hugging Face id resolved in the local cache) and the hostname.
`result_fields(prov)` flattens it into the `provenance_*` columns every result row carries.
"""

from __future__ import annotations

import hashlib
import os
import socket
from collections import Counter
from pathlib import Path
from typing import Any

from raysweep import grid
from raysweep.place import preflight
from raysweep.version import __version__

__all__ = ["gather", "hf_cache_dir", "model_source", "model_facts", "result_fields"]

NONE = "none"
UNKNOWN = "unknown"


def model_source(argv: list[str]) -> tuple[str | None, str | None]:
    """The model a `vllm serve` command loads (`--model` or `serve MODEL`) and its `--revision`."""
    model = grid.find_flag_value(argv, "--model")
    if not model and "serve" in argv:
        i = argv.index("serve")
        if i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            model = argv[i + 1]
    return model, grid.find_flag_value(argv, "--revision")


def hf_cache_dir(environ: dict[str, str] | None = None) -> Path:
    """The Hugging Face hub cache, as huggingface_hub finds it (HF_HUB_CACHE, HF_HOME/hub, ~/.cache)."""
    env = os.environ if environ is None else environ
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"])
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                               "huggingface")
    return Path(home) / "hub"


def model_facts(model: str | None, revision: str | None, cache: Path | None = None) -> dict[str, Any]:
    """{model, model_path, model_revision}: a local directory (its snapshot hash inside the HF cache, else
    the sha256 of its config.json), or a hub id resolved through the cache's refs."""
    out: dict[str, Any] = {"model": model, "model_path": UNKNOWN, "model_revision": revision or UNKNOWN}
    if not model:
        return out
    local = Path(model).expanduser()
    if local.is_dir():
        path = local.resolve()
        out["model_path"] = str(path)
        if path.parent.name == "snapshots":
            out["model_revision"] = path.name
        elif (path / "config.json").is_file():
            digest = hashlib.sha256((path / "config.json").read_bytes()).hexdigest()[:16]
            out["model_revision"] = revision or f"local config.json sha256:{digest}"
        return out
    repo = (cache or hf_cache_dir()) / ("models--" + model.replace("/", "--"))
    ref = repo / "refs" / (revision or "main")
    sha = revision if revision and (repo / "snapshots" / revision).is_dir() else None
    if sha is None and ref.is_file():
        sha = ref.read_text().strip()
    if sha and (repo / "snapshots" / sha).is_dir():
        out.update(model_path=str(repo / "snapshots" / sha), model_revision=sha)
    return out


def _gpus(timeout_s: float) -> dict[str, Any]:
    facts = preflight.gpu_facts(preflight.run_command(preflight.GPU_QUERY, timeout_s))
    devices = facts["devices"]
    if not devices:
        return {"gpu": NONE if facts["status"] == preflight.NO_NVIDIA_SMI
                else f"{facts['status']}: {facts['error']}"[:200],
                "gpu_driver": NONE}
    models = Counter(d["name"] for d in devices)
    return {"gpu": ", ".join(f"{n} x {m}" for m, n in models.items()),
            "gpu_driver": ",".join(sorted({str(d["driver"]) for d in devices}))}


def gather(argv: list[str], timeout_s: float = 60.0) -> dict[str, Any]:
    """Everything above, for the node this runs on (the host actor of a server's rank)."""
    versions = preflight.node_versions(timeout_s)
    model, revision = model_source(argv)
    out: dict[str, Any] = {
        "hostname": socket.gethostname(), "vllm": versions.get("vllm"), "torch": versions.get("torch"),
        "torch_cuda": versions.get("torch_cuda"), "nccl": versions.get("torch_nccl") or NONE,
        "ray": versions.get("ray"), "python": versions.get("python"), "raysweep": __version__,
    }
    out.update(_gpus(timeout_s))
    try:
        out.update(model_facts(model, revision))
    except OSError as exc:
        out.update(model=model, model_path=UNKNOWN, model_revision=f"unreadable: {exc}")
    return out


_RESULT_KEYS = ("vllm", "torch", "nccl", "ray", "python", "raysweep", "gpu", "gpu_driver", "model_path",
                "model_revision")


def result_fields(prov: dict[str, Any] | None, hostnames: list[str] | None = None) -> dict[str, Any]:
    """The `provenance_*` columns of a result from its server's provenance."""
    if not prov:
        return {}
    out = {f"provenance_{k}": prov.get(k) for k in _RESULT_KEYS}
    out["provenance_hostnames"] = ",".join(hostnames or prov.get("hostnames") or [prov.get("hostname") or ""])
    return out

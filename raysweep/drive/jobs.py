"""Campaigns as Ray jobs: `raysweep submit`, `raysweep jobs` and `raysweep stop`.

`submit` stages the campaign file and the files it names into a working directory, and sends it to the
cluster's job server with the entrypoint `raysweep run CAMPAIGN --address auto --output-dir DIR`. The job's
driver then runs on the cluster like any `raysweep run`, with its ledger in DIR, so submitting the same
campaign again resumes it.

What travels with the job:
- the campaign file, and every file it names by a relative path (parameter files, relative to the campaign
  file; `--dataset-path` files and custom data set hooks, relative to the current directory), each at the
  same relative place, so the job reads them as the local run would;
- the environment variables the campaign refers to as `${VAR}` and that are set here, except secrets (a
  job's runtime environment is shown by the dashboard): those must be set on the cluster.
Absolute paths (models, data on shared storage) are left as they are: they must exist on the cluster.

The output directory must be an absolute path (a submitted job runs in a temporary directory); put it on
shared storage, or add `storage:` to the campaign so that results are mirrored where you can read them
(`raysweep results s3://...`). A job stopped with `raysweep stop` gets SIGTERM and stops its servers
cleanly before its points are lost: Ray waits `stop_wait_s` (120 s by default) before killing it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from raysweep import grid
from raysweep.campaign import CampaignSpec
from raysweep.errors import UserError

if TYPE_CHECKING:
    from ray.job_submission import JobDetails, JobSubmissionClient

__all__ = ["META_KEY", "Staged", "auth_headers", "client", "entrypoint", "find_jobs", "follow", "named_files",
           "referenced_env", "stage", "stop", "submit"]

META_KEY = "raysweep_campaign"
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
STOP_WAIT_S = 120
_DATASET_PATH = "dataset_path"


# ---------------------------------------------------------------------------------------------------
# What the campaign names
# ---------------------------------------------------------------------------------------------------

def named_files(spec: CampaignSpec, campaign_file: Path) -> list[tuple[str, Path, Path]]:
    """The files the campaign names: (field, path as written, the directory it is relative to)."""
    c = spec.campaign
    out: list[tuple[str, Path, Path]] = []
    base = campaign_file.resolve().parent
    for part in ("serve", "bench", "offline"):
        section = getattr(c, part, None)
        params = getattr(section, "params", None)
        if isinstance(params, str):
            out.append((f"{part}.params", Path(params), base))
        elif isinstance(params, dict) and isinstance(params.get("file"), str):
            out.append((f"{part}.params.file", Path(params["file"]), base))
    cwd = Path.cwd()
    argvs = [("bench.cmd", spec.bench_argv)] if not spec.offline else [("offline.cmd", spec.serve_argv)]
    combos = spec.bench_combos if not spec.offline else spec.serve_combos
    section = "offline" if spec.offline else "bench"
    for fld, argv in argvs:
        value = _flag_value(argv, "--dataset-path")
        if value:
            out.append((fld, Path(_hook_file(value)), cwd))
    for i, combo in enumerate(combos):
        for key, value in combo.items():
            if grid.normalize_key(key) == _DATASET_PATH and isinstance(value, str) and value:
                out.append((f"{section}.params[{i}].{key}", Path(_hook_file(value)), cwd))
    seen, unique = set(), []
    for fld, path, rel_to in out:
        if (path, rel_to) not in seen:
            seen.add((path, rel_to))
            unique.append((fld, path, rel_to))
    return unique


def _flag_value(argv: list[str], flag: str) -> str | None:
    for i, tok in enumerate(argv):
        if tok == flag and i + 1 < len(argv):
            return argv[i + 1]
        if tok.startswith(flag + "="):
            return tok.split("=", 1)[1]
    return None


def _hook_file(value: str) -> str:
    """`hooks.py:make` (a custom data set hook) names the file `hooks.py`."""
    file, sep, func = value.rpartition(":")
    return file if sep and file.endswith(".py") and func.isidentifier() else value


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-[^}]*)?\}")


def referenced_env(campaign_text: str, env: dict[str, str] | None = None) -> tuple[dict[str, str], list[str]]:
    """The `${VAR}` variables of the campaign text that are set here: (those to send, secret names kept back)."""
    env = dict(os.environ if env is None else env)
    send, secrets = {}, []
    for name in sorted(set(_VAR.findall(campaign_text))):
        if name not in env:
            continue
        if grid.is_secret_name(name):
            secrets.append(name)
        else:
            send[name] = env[name]
    return send, secrets


# ---------------------------------------------------------------------------------------------------
# Staging
# ---------------------------------------------------------------------------------------------------

@dataclass
class Staged:
    """A job's working directory: the campaign at `campaign`, and the files it names beside it."""

    root: Path
    campaign: str
    shipped: list[str] = field(default_factory=list)
    env_vars: dict[str, str] = field(default_factory=dict)
    secrets_kept: list[str] = field(default_factory=list)


def stage(spec: CampaignSpec, campaign_file: str | Path, dest: Path) -> Staged:
    """Copy the campaign file and the files it names by relative paths into `dest`."""
    campaign_file = Path(campaign_file)
    cwd = Path.cwd().resolve()
    src = campaign_file.resolve()
    rel = _relative(src, cwd) or Path(src.name)
    staged = Staged(root=dest, campaign=rel.as_posix())
    _copy(src, dest / rel)
    for fld, path, rel_to in named_files(spec, campaign_file):
        if path.is_absolute():
            continue  # on shared storage: it must exist on the cluster as it is
        local = (rel_to / path).resolve()
        # the job reads it at the same relative place: beside the staged campaign, or under the job's cwd
        staged_base = (dest / rel).parent if rel_to == src.parent else dest
        target = (staged_base / path).resolve()
        if _relative(target, dest.resolve()) is None:
            raise UserError(f"{fld}: {str(path)!r} lies outside the directory that is sent with the job; move it "
                            "under the current directory, or give an absolute path that exists on the cluster")
        if not local.is_file():
            raise UserError(f"{fld}: {str(path)!r} is not a file here ({local}); submit sends the files a campaign "
                            "names by relative paths")
        _copy(local, target)
        staged.shipped.append(_relative(target, dest.resolve()).as_posix())  # type: ignore[union-attr]
    staged.env_vars, staged.secrets_kept = referenced_env(src.read_text())
    return staged


def _relative(path: Path, root: Path) -> Path | None:
    try:
        return path.relative_to(root)
    except ValueError:
        return None


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dst)


def entrypoint(campaign: str, output_dir: str, python: str | None = None, retry_failed: bool = False) -> str:
    """The job's command: `raysweep run` on the cluster (or `PYTHON -m raysweep run`)."""
    cmd = [python, "-m", "raysweep"] if python else ["raysweep"]
    cmd += ["run", campaign, "--address", "auto", "--output-dir", output_dir]
    if retry_failed:
        cmd.append("--retry-failed")
    return shlex.join(cmd)


def runtime_env(staged: Staged, user: dict[str, Any] | None, stop_wait_s: int) -> dict[str, Any]:
    """The job's runtime environment: the staged working dir and variables, merged with the user's."""
    env = dict(user or {})
    if "working_dir" in env:
        raise UserError("--runtime-env: working_dir is set by raysweep submit (the staged campaign and its files); "
                        "use py_modules or pip for code, or put data on shared storage")
    env["working_dir"] = str(staged.root)
    env_vars = {**staged.env_vars, **{str(k): str(v) for k, v in (env.get("env_vars") or {}).items()}}
    env_vars.setdefault("RAY_JOB_STOP_WAIT_TIME_S", str(stop_wait_s))
    env["env_vars"] = env_vars
    return env


def read_runtime_env(text: str | None) -> dict[str, Any] | None:
    """`--runtime-env`: a YAML or JSON file, or inline JSON."""
    if not text:
        return None
    path = Path(text)
    try:
        data = yaml.safe_load(path.read_text()) if path.is_file() else json.loads(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise UserError(f"--runtime-env: {text!r} is neither a YAML/JSON file nor inline JSON ({exc})") from None
    if not isinstance(data, dict):
        raise UserError("--runtime-env: must be a mapping (e.g. {\"pip\": [...], \"env_vars\": {...}})")
    return data


# ---------------------------------------------------------------------------------------------------
# The job server
# ---------------------------------------------------------------------------------------------------

def api_address(address: str | None) -> str:
    """The job server's address: `--dashboard-url`, or RAY_API_SERVER_ADDRESS / RAY_ADDRESS when it is http(s)."""
    candidates = [address] if address else [os.environ.get("RAY_API_SERVER_ADDRESS"), os.environ.get("RAY_ADDRESS")]
    for value in candidates:
        if value and value.startswith(("http://", "https://")):
            return value.rstrip("/")
    raise UserError("--dashboard-url: give the dashboard's job server, e.g. --dashboard-url http://HEAD:8265 (or set "
                    "RAY_API_SERVER_ADDRESS)" + (f"; got {address!r}" if address else ""))


def auth_headers(env: dict[str, str] | None = None) -> dict[str, str]:
    """The bearer token for a cluster with Ray's token authentication (on by default in Ray 2.60): from
    RAY_AUTH_TOKEN, the file RAY_AUTH_TOKEN_PATH names, or ~/.ray/auth_token. None when auth is disabled."""
    env = dict(os.environ if env is None else env)
    if env.get("RAY_AUTH_MODE", "").lower() == "disabled":
        return {}
    token = env.get("RAY_AUTH_TOKEN", "").strip()
    if not token:
        path = Path(env.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
        if path.is_file():
            token = path.read_text().strip()
    return {"Authorization": f"Bearer {token}"} if token else {}


def client(address: str | None) -> JobSubmissionClient:
    """A JobSubmissionClient for the cluster, with the token when there is one."""
    from ray.job_submission import JobSubmissionClient

    url = api_address(address)
    try:
        return JobSubmissionClient(url, headers=auth_headers())
    except Exception as exc:
        raise UserError(f"--dashboard-url {url}: cannot reach the Ray job server: {exc}") from None


def submit(job_client: JobSubmissionClient, spec: CampaignSpec, staged: Staged, output_dir: str, *,
           python: str | None = None,
           user_env: dict[str, Any] | None = None, retry_failed: bool = False,
           stop_wait_s: int = STOP_WAIT_S) -> str:
    """Submit the staged campaign; refuses while a job of the same campaign and output dir is not finished."""
    name = spec.campaign.name
    for job in find_jobs(job_client, name):
        meta = job.metadata or {}
        if meta.get("output_dir") == output_dir and str(job.status) not in TERMINAL:
            raise UserError(f"campaign {name!r} ({output_dir}) is already {str(job.status).lower()} as job "
                            f"{job.submission_id}; follow it with `raysweep jobs`, or `raysweep stop "
                            f"{job.submission_id}` first")
    sid = f"raysweep-{name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}-{os.urandom(2).hex()}"
    return job_client.submit_job(
        entrypoint=entrypoint(staged.campaign, output_dir, python, retry_failed),
        submission_id=sid,
        runtime_env=runtime_env(staged, user_env, stop_wait_s),
        metadata={META_KEY: name, "output_dir": output_dir, "campaign_file": staged.campaign,
                  "storage": spec.campaign.storage or ""},
        entrypoint_num_cpus=0,
    )


def find_jobs(job_client: JobSubmissionClient, name: str | None = None) -> list[JobDetails]:
    """raysweep's jobs on the cluster (of one campaign when `name`), oldest first."""
    jobs = [j for j in job_client.list_jobs() if META_KEY in (j.metadata or {})]
    if name is not None:
        jobs = [j for j in jobs if j.metadata[META_KEY] == name]
    return sorted(jobs, key=lambda j: j.start_time or 0)


def stop(job_client: JobSubmissionClient, job_id: str, wait_s: float = 0.0) -> str:
    """Ask the job to stop; with `wait_s`, wait that long for it to end. Returns its status."""
    try:
        job_client.get_job_info(job_id)
    except RuntimeError:
        raise UserError(f"JOB {job_id!r}: no such job on this cluster; `raysweep jobs` lists them") from None
    job_client.stop_job(job_id)
    deadline = time.monotonic() + wait_s
    status = str(job_client.get_job_status(job_id))
    while status not in TERMINAL and time.monotonic() < deadline:
        time.sleep(0.5)
        status = str(job_client.get_job_status(job_id))
    return status


def follow(job_client: JobSubmissionClient, job_id: str, write: Callable[[str], None]) -> JobDetails:
    """Stream the job's logs until it ends; returns its final JobInfo."""
    async def tail() -> None:
        async for chunk in job_client.tail_job_logs(job_id):
            write(chunk)

    asyncio.run(tail())
    info = job_client.get_job_info(job_id)
    deadline = time.monotonic() + 30.0  # the log stream ends a moment before the status is final
    while str(info.status) not in TERMINAL and time.monotonic() < deadline:
        time.sleep(0.2)
        info = job_client.get_job_info(job_id)
    return info

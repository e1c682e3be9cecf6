"""Campaigns as Ray jobs on a cluster: `submit`, `jobs` and `stop`."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from rich.markup import escape
from rich.table import Table

from raysweep.cli._common import console, deprecated_alias, main, out, print_table
from raysweep.errors import UserError

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

_Command = TypeVar("_Command", bound=Callable[..., Any])


def _JOB_ADDRESS(f: _Command) -> _Command:
    """`--dashboard-url`, the job server; `--address` (which names the GCS in `run` and `resume`) is kept for one
    release as a deprecated alias."""
    f = deprecated_alias("--address", "--dashboard-url", "address")(f)
    return click.option("--dashboard-url", "address", default=None,
                        help="The cluster's job server (Ray dashboard), e.g. http://HEAD:8265 (default: "
                             "RAY_API_SERVER_ADDRESS).")(f)


@main.command()
@click.argument("campaign_file", type=click.Path(dir_okay=False))
@_JOB_ADDRESS
@click.option("--output-dir", default=None, help="The output dir on the cluster: an absolute path (shared storage). "
                                                 "Default: the campaign's output_dir, if absolute.")
@click.option("--follow", is_flag=True, help="Stream the job's logs until it ends; exit with its outcome.")
@click.option("--runtime-env", "runtime_env_arg", default=None,
              help="A Ray runtime env (YAML/JSON file or inline JSON) merged with the staged campaign: pip, "
                   "py_modules, env_vars, ...")
@click.option("--python", default=None, help="Run `PYTHON -m raysweep` on the cluster instead of `raysweep`.")
@click.option("--retry-failed", is_flag=True, help="Give points that used up max_attempts a fresh set of attempts.")
@click.option("--stop-wait", default=120, show_default=True, type=click.IntRange(min=1),
              help="Seconds a stopped job gets to stop its servers before Ray kills it.")
def submit(campaign_file: str, address: str | None, output_dir: str | None, follow: bool,
           runtime_env_arg: str | None, python: str | None, retry_failed: bool, stop_wait: int) -> None:
    """Send a campaign to a Ray cluster as a job (`raysweep run` there). Submitting it again resumes it."""
    import tempfile

    from raysweep.campaign import load_campaign
    from raysweep.drive import jobs
    from raysweep.record.directory import default_path

    spec = load_campaign(campaign_file)
    target = str(default_path(spec.campaign.name, output_dir, spec.campaign.output_dir))
    if not Path(target).is_absolute():
        raise UserError(f"--output-dir: {target!r} is relative, but a submitted campaign runs in a temporary "
                        "directory on the cluster; give an absolute path on storage the cluster keeps (shared, or "
                        "the head's disk), with --output-dir or output_dir:, and add storage: to mirror results")
    user_env = jobs.read_runtime_env(runtime_env_arg)
    job_client = jobs.client(address)
    with tempfile.TemporaryDirectory(prefix="raysweep-submit-") as tmp:
        staged = jobs.stage(spec, campaign_file, Path(tmp))
        job_id = jobs.submit(job_client, spec, staged, target, python=python, user_env=user_env,
                             retry_failed=retry_failed, stop_wait_s=stop_wait)
    out.print(job_id, highlight=False)
    console.print(f"submitted {spec.campaign.name!r}: output dir {target} on the cluster"
                  + (f", mirrored to {spec.campaign.storage}" if spec.campaign.storage else "")
                  + (f"; sent {', '.join(staged.shipped)}" if staged.shipped else ""), highlight=False, markup=False)
    if staged.secrets_kept:
        console.print(f"[yellow]not sent[/] (secrets; set them on the cluster): {', '.join(staged.secrets_kept)}")
    if follow:
        _follow(job_client, job_id)


def _follow(job_client: JobSubmissionClient, job_id: str) -> None:
    from raysweep.drive import jobs

    def write(chunk: str) -> None:
        sys.stdout.write(chunk)
        sys.stdout.flush()

    info = jobs.follow(job_client, job_id, write)
    status = str(info.status)
    console.print(f"job {job_id}: {status}" + (f" ({escape(info.message)})" if info.message and status != "SUCCEEDED"
                                               else ""), highlight=False)
    if status == "STOPPED":
        sys.exit(130)
    if status != "SUCCEEDED":
        sys.exit(info.driver_exit_code or 1)


@main.command()
@_JOB_ADDRESS
@click.option("--all", "show_all", is_flag=True, help="Also jobs that are not raysweep campaigns.")
@click.option("--follow", "follow_id", default=None, metavar="JOB", help="Stream this job's logs until it ends.")
def jobs(address: str | None, show_all: bool, follow_id: str | None) -> None:
    """The cluster's raysweep jobs: id, campaign, status, output dir, start and end."""
    from datetime import datetime

    from raysweep.drive import jobs as jobs_mod

    job_client = jobs_mod.client(address)
    if follow_id:
        _follow(job_client, follow_id)
        return
    rows = job_client.list_jobs() if show_all else jobs_mod.find_jobs(job_client)
    table = Table()
    for name in ("job", "campaign", "status", "output dir", "started", "ended", "message"):
        table.add_column(name)

    def when(ms: int | None) -> str:
        return datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S") if ms else ""

    for j in rows:
        meta = j.metadata or {}
        table.add_row(j.submission_id or j.job_id or "", meta.get(jobs_mod.META_KEY, ""), str(j.status),
                      meta.get("output_dir", ""), when(j.start_time), when(j.end_time),
                      escape((j.message or "").splitlines()[0] if j.message else ""))
    print_table(table)  # ids and paths are copied from here: folded on a terminal, whole when piped


@main.command("stop")
@click.argument("job_id")
@_JOB_ADDRESS
@click.option("--wait", "wait_s", default=150.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds to wait for the job to end (0: do not wait).")
def stop_job(job_id: str, address: str | None, wait_s: float) -> None:
    """Stop a submitted campaign: its servers are stopped, finished points kept; submit it again to resume."""
    from raysweep.drive import jobs

    status = jobs.stop(jobs.client(address), job_id, wait_s)
    out.print(f"{job_id}: {status}", highlight=False)
    if status not in jobs.TERMINAL and wait_s:
        sys.exit(1)

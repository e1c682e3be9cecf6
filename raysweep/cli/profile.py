"""`raysweep profile URL`: sweep an endpoint that runs already, in one line (writes a campaign file, runs it)."""

from __future__ import annotations

import re
import sys
import urllib.parse
from pathlib import Path
from typing import Any

import click
import yaml

from raysweep.cli._common import _say, main
from raysweep.errors import UserError


def parse_grid(items: tuple[str, ...]) -> dict[str, list[Any]]:
    """`--grid KEY=V1,V2,...` options as a campaign grid (each value read as YAML: 8 is a number).

    :raises UserError: naming `--grid` and the item.
    """
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, eq, values = item.partition("=")
        key = key.strip()
        if not eq or not key or any(not v.strip() for v in values.split(",")):
            raise UserError(f"--grid {item!r}: expected KEY=VALUE[,VALUE...], e.g. max_concurrency=1,8,64")
        if key in grid:
            raise UserError(f"--grid {item!r}: {key} is given twice; list all its values in one --grid")
        try:
            grid[key] = [yaml.safe_load(v.strip()) for v in values.split(",")]
        except yaml.YAMLError as exc:
            raise UserError(f"--grid {item!r}: a value cannot be read ({exc})") from None
    return grid


def default_name(url: str) -> str:
    """`profile-HOST-PORT`, in the campaign name's alphabet."""
    parts = urllib.parse.urlsplit(url)
    text = f"profile-{parts.hostname or 'endpoint'}-{parts.port or ('443' if parts.scheme == 'https' else '80')}"
    return re.sub(r"[^A-Za-z0-9._-]", "-", text)


def profile_campaign(url: str, bench_cmd: str, grid: dict[str, list[Any]], *, name: str, output_dir: str,
                     runs: int, backend: str, metrics_url: str | None, reset_url: str | None,
                     gpus: int | None = None) -> dict[str, Any]:
    """The campaign file `raysweep profile` writes (its report written at the end)."""
    endpoint: str | dict[str, str] = url
    if metrics_url or reset_url:
        endpoint = {"url": url, **({"metrics_url": metrics_url} if metrics_url else {}),
                    **({"reset_url": reset_url} if reset_url else {})}
    bench: dict[str, Any] = {"backend": backend, "cmd": bench_cmd}
    if grid:
        bench["params"] = {"grid": grid}
    serve: dict[str, Any] = {"url": endpoint, **({"gpus": gpus} if gpus else {})}
    return {"name": name, "output_dir": output_dir, "runs": runs, "report": True, "serve": serve, "bench": bench}


@main.command()
@click.argument("url")
@click.option("--bench-cmd", default="vllm bench serve", show_default=True,
              help="The benchmark: `vllm bench serve` options (read by raysweep's native client, or run as is with "
                   "--backend command).")
@click.option("--grid", "grid_items", multiple=True, metavar="KEY=V1,V2,...",
              help="A bench parameter and its values, e.g. max_concurrency=1,8,64 (repeatable: their product).")
@click.option("--runs", type=click.IntRange(min=1), default=3, show_default=True, help="Repeats of every point.")
@click.option("--name", default=None, help="Campaign name (default: profile-HOST-PORT).")
@click.option("--output-dir", default=None,
              help="Where the campaign file, ledger and results go (default: results/NAME).")
@click.option("--backend", type=click.Choice(["native", "command"]), default="native", show_default=True,
              help="native: raysweep's streaming client in Ray actors; command: the bench command itself.")
@click.option("--metrics-url", default=None, help="The endpoint's Prometheus metrics (default: URL/metrics).")
@click.option("--reset-url", default=None, help="A URL POSTed before every point to reset the endpoint's caches "
                                                "(default: none).")
@click.option("--address", default=None, help="Ray cluster whose nodes run the client actors (`auto`, or HOST:PORT). "
                                              "Default: an embedded local Ray on this machine.")
@click.option("--gpus", type=click.IntRange(min=1), default=None,
              help="The GPUs behind the endpoint (serve.gpus): per-GPU figures only when given.")
@click.option("--dry-run", is_flag=True, help="Write the campaign file and print the plan; run nothing.")
def profile(url: str, bench_cmd: str, grid_items: tuple[str, ...], runs: int, name: str | None,
            output_dir: str | None, backend: str, metrics_url: str | None, reset_url: str | None,
            address: str | None, gpus: int | None, dry_run: bool) -> None:
    """Sweep an endpoint that runs already (a vLLM server, a gateway, a Kubernetes service): writes
    OUTPUT_DIR/campaign.yaml with `serve.url: URL` and runs it like `raysweep run` (resumed when run again),
    then prints the table of its points (one row per load) after the report and its conclusions."""
    from raysweep.campaign import campaign_from_dict
    from raysweep.cli.running import _dry_run, _run
    from raysweep.record.files import write_text_atomic
    from raysweep.results.directory import default_path

    name = name or default_name(url)
    out = default_path(name, output_dir)
    data = profile_campaign(url, bench_cmd, parse_grid(grid_items), name=name, output_dir=str(out), runs=runs,
                            backend=backend, metrics_url=metrics_url, reset_url=reset_url, gpus=gpus)
    spec = campaign_from_dict(data, base_dir=Path.cwd())  # refused here (exit 2) before any file is written
    if dry_run:
        _dry_run(spec, address, out, ())
        return
    from raysweep.drive.endpoint import check_endpoints

    check_endpoints(spec)  # the endpoint answers with an OpenAI API before the file is written
    path = write_text_atomic(out / "campaign.yaml", yaml.safe_dump(data, sort_keys=False))
    _say(f"Campaign file: {path}", err=True)
    spec = campaign_from_dict(data, base_dir=out.resolve(), source_path=str(path.resolve()))
    code: str | int | None = 0
    try:
        _run(spec, out, address, force=False)
    except SystemExit as exc:  # some points failed: the table of those that finished still comes
        code = exc.code
    points_table(out)
    if code:
        sys.exit(code)


def points_table(out: Path) -> None:
    """The table `profile` ends with: one row per point (its load), the mean of each headline metric over its
    runs with the confidence interval, as `raysweep results --aggregate` prints it."""
    from raysweep.cli.comparing import print_aggregates
    from raysweep.ledger import LEDGER_FILE
    from raysweep.results.table import results_table

    if not (out / LEDGER_FILE).is_file():
        return
    df = results_table(out)
    if df.empty:
        return
    # the run wrote summary.* into `out` already: no "summary not written" after it
    print_aggregates(str(out), df, ("parquet", "csv"), 0.95, 0.05, None, written=[], tell_unwritten=False)

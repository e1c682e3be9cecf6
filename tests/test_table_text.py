"""Tables printed to a pipe or a file are laid out by `cli._common.plain_table`, not by rich: the text must be
the very text rich prints there, for every table the CLI makes; anything else goes to rich."""

from __future__ import annotations

import io
import random

import pytest
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from raysweep.cli._common import plain_table, print_table

PIECES = ["  ", "a", "b", "1", "0.5", " ", "é", "中", "🙂", "[", "]", "[green]", "[/]", ":", ":smile:", "\\", "-",
          "x y", "_", "%", "1,024", "(s)"]


def rich_text(table: Table) -> str:
    buf = io.StringIO()
    Console(file=buf, width=100_000, soft_wrap=True).print(table)
    return buf.getvalue()


def word(rng: random.Random, most: int = 6) -> str:
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, most)))


def random_table(rng: random.Random) -> Table:
    """Headers of 1 to 3 lines, a title (or none) shorter or longer than the table, cells as markup (escaped
    text, styled), as Text, with wide characters, emoji codes and brackets that are no markup."""
    columns = rng.randint(1, 6)
    heads = ["\n".join([*(word(rng, 4).replace("[", "(") for _ in range(rng.randint(0, 2))),
                        word(rng, 4).replace("[", "(") or "m"]) for _ in range(columns)]
    title = rng.choice([None, escape(word(rng, 3)), escape(word(rng, 40)), "per point"])
    table = Table(*heads, title=title)
    for _ in range(rng.randint(1, 8)):
        cells: list[str | Text] = []
        for _ in range(columns):
            kind = rng.randrange(4)
            text = word(rng)
            cells.append(Text(text, style="green") if kind == 0 else
                         f"[{rng.choice(['green', 'red', 'dim'])}]{escape(text)}[/]" if kind == 1 else
                         escape(text) if kind == 2 else text.replace("[", "("))
        table.add_row(*cells)
    for col in table.columns:
        col.overflow = "fold"
    return table


@pytest.mark.parametrize("seed", range(4))
def test_the_text_of_a_table_is_what_rich_prints(seed):
    rng = random.Random(seed)
    for _ in range(150):
        table = random_table(rng)
        text = plain_table(table)
        assert text is not None
        assert text == rich_text(table)


def test_the_commands_tables_are_laid_out_here_and_printed_as_rich_would():
    """A compare-like table (a title longer than the table, two-line headers, styled verdicts, bracketed
    intervals) printed to a file through `print_table`."""
    table = Table("max_num_seqs", "output_throughput\n[95% CI]", "verdict",
                  title="ratio = compared / baseline; better or worse: Welch's t-test over the runs at 5 %; not "
                        "shown: the runs cannot tell them apart")
    for i in range(30):
        table.add_row(str(8 * i), f"{i * 1.5:.4g} [{i:.4g}, {i * 2:.4g}]",
                      f"[green]{escape(str(i / 7))} better[/]" if i % 2 else "[yellow]not shown[/]")
    want = rich_text(table)
    buf = io.StringIO()
    print_table(table, Console(file=buf, soft_wrap=True))
    assert buf.getvalue() == want and plain_table(table) == want


@pytest.mark.parametrize("change", ["zero width", "combining", "trailing newline", "box", "justify", "lines",
                                    "no rows", "newline in a cell"])
def test_tables_beyond_its_layout_are_left_to_rich(change):
    table = Table("a", "b" + ("\n" if change == "trailing newline" else ""), title="t",
                  box=box.SIMPLE if change == "box" else box.HEAVY_HEAD, show_lines=change == "lines")
    if change == "justify":
        table.columns[0].justify = "right"
    if change != "no rows":
        cell = {"zero width": "x\u200by", "combining": "e\u0301", "newline in a cell": "x\ny"}.get(change, "x")
        table.add_row(cell, "1")
    assert plain_table(table) is None
    buf = io.StringIO()
    print_table(table, Console(file=buf, soft_wrap=True))
    assert buf.getvalue() == rich_text(table)

"""MkDocs hook: pages made at build time, so that they cannot drift from what they describe.

* `reference.md`: the campaign file reference, from the pydantic models (`docs/gen_reference.py`);
* `benchmarks/RESULTS.md`, `benchmarks/results/*.md` and `benchmarks/history/*.md`: the recorded benchmark results
  (the latest of each benchmark, their tables, every earlier recording), as they are in the
  repository (their relative links keep working).

The pages are written as the README is, for GitHub: nested lists indented to their parent's text (2 or 3 spaces)
and fenced code inside list items. Python-Markdown wants 4 spaces a level and no fences inside lists, so
`on_page_markdown` re-indents lists and turns a fence inside a list item into an indented code block.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parent.parent


def _gen_reference() -> Any:
    path = Path(__file__).with_name("gen_reference.py")
    spec = importlib.util.spec_from_file_location("raysweep_docs_gen_reference", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, "reference.md", content=_gen_reference().campaign_reference()))
    bench = REPO / "benchmarks"
    for path in [bench / "RESULTS.md", *sorted((bench / "results").glob("*.md")),
                 *sorted((bench / "history").glob("*.md"))]:
        files.append(File.generated(config, f"benchmarks/{path.relative_to(bench).as_posix()}",
                                    content=path.read_text(encoding="utf-8")))
    return files


_MARKER = re.compile(r"( *)([*+-]|\d+\.) ")
_FENCE = re.compile(r"( *)(```|~~~)")


def _fence_end(lines: list[str], start: int, fence: str) -> int:
    return next((j for j in range(start + 1, len(lines)) if lines[j].strip().startswith(fence)), len(lines) - 1)


def github_lists_to_python_markdown(text: str) -> str:
    """Re-indent nested lists to 4 spaces a level; a fenced block inside a list item becomes an indented block."""
    out: list[str] = []
    stack: list[tuple[int, int]] = []  # per open list item: (its text column as written, its text column now)
    block_is_list: bool | None = None  # whether the lines since the last blank one began with a list item
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        indent = len(line) - len(line.lstrip(" "))
        if not line.strip():
            out.append(line)
            block_is_list = None
            i += 1
            continue
        while stack and indent < stack[-1][0]:
            stack.pop()
        fence = _FENCE.match(line)
        if fence and not stack:  # a fence outside lists: copied as it is, to its end
            end = _fence_end(lines, i, fence.group(2))
            out += lines[i:end + 1]
            block_is_list = False
            i = end + 1
            continue
        if fence:
            end = _fence_end(lines, i, fence.group(2))
            pad = " " * (stack[-1][1] + 4)
            out += ["", *(pad + body[min(indent, len(body) - len(body.lstrip(" "))):] for body in lines[i + 1:end]), ""]
            block_is_list = None
            i = end + 1
            continue
        new_indent = stack[-1][1] if stack else indent
        marker = _MARKER.match(line)
        if marker and block_is_list is False:
            out.append("")  # a list item right under a paragraph needs a blank line before it
            block_is_list = None
        if block_is_list is None:
            block_is_list = marker is not None
        if marker:
            stack.append((indent + len(marker.group(2)) + 1, new_indent + 4))
        out.append(" " * new_indent + line.lstrip(" "))
        i += 1
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    return github_lists_to_python_markdown(markdown)

"""The README, docs/overview.md and docs/benchmarks.md quote only what the latest benchmark recordings back:
every figure they quote (a decimal, a thousands-separated count, a percentage, a multiplier, an "N of M") appears in
benchmarks/RESULTS.md. In the README only the paragraphs that cite the benchmarks are read (its other
numbers are settings and examples)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIGURE = re.compile(r"\d+ of \d+|\d+/\d+|\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?\s?%|\d+(?:\.\d+)?x\b|\d+\.\d+")


def _norm(text: str) -> str:
    return re.sub(r"\s+%", "%", re.sub(r"[*`]", "", text))


def figures(text: str) -> set[str]:
    return {_norm(m.group(0)) for m in FIGURE.finditer(text)}


def backed(figure: str, results: str) -> bool:
    if figure in results:
        return True
    n_of_m = re.fullmatch(r"(\d+) of (\d+)", figure) or re.fullmatch(r"(\d+)/(\d+)", figure)
    return bool(n_of_m) and (f"{n_of_m[1]}/{n_of_m[2]}" in results or f"{n_of_m[1]} of {n_of_m[2]}" in results)


def benchmark_paragraphs(text: str) -> str:
    return "\n\n".join(p for p in re.split(r"\n\s*\n", text) if "RESULTS.md" in p or "benchmarks/" in p)


def unbacked(text: str) -> list[str]:
    results = _norm((ROOT / "benchmarks" / "RESULTS.md").read_text())
    return sorted(f for f in figures(text) if not backed(f, results))


def test_the_figure_finder_sees_the_kinds_of_figures():
    assert figures("0.59x, 3,194 req/s, 28.1 %, 19 of 20, 4/20, 1.099 and 70 ms") == {
        "0.59x", "3,194", "28.1%", "19 of 20", "4/20", "1.099"}
    assert unbacked("a claim of 0.123456x that nothing recorded") == ["0.123456x"]


def test_every_figure_docs_benchmarks_quotes_is_in_the_results():
    assert not unbacked((ROOT / "docs" / "benchmarks.md").read_text())


def test_every_figure_the_readme_quotes_from_the_benchmarks_is_in_the_results():
    assert not unbacked(benchmark_paragraphs((ROOT / "README.md").read_text()))


def test_every_figure_the_overview_quotes_from_the_benchmarks_is_in_the_results():
    """docs/overview.md holds the tour the README carried before it was cut to its first screens."""
    assert not unbacked(benchmark_paragraphs((ROOT / "docs" / "overview.md").read_text()))

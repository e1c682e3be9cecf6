"""benchmarks/bench_verdicts.py runs (with --quick: a few repetitions) and reports every measurement; the
targets themselves are recorded in benchmarks/RESULTS.md from a full run."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_verdicts_benchmark_runs_and_reports(tmp_path, capsys):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_verdicts
    finally:
        sys.path.pop(0)
    assert bench_verdicts.main(["--quick", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "verdicts.md").read_text()
    for heading in ('false "better"', "false clear leader", "power, true 5 % lead", "coverage of the 95 % interval",
                    "steady state"):
        assert heading in text, heading
    assert (tmp_path / "verdicts.json").is_file() and text in capsys.readouterr().out

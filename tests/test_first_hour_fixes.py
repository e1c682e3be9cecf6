"""What a newcomer's first hour met on 2026-12-07 and was fixed: each test fails on the code before the fix.

No Ray, no vLLM: the commands run through click's runner, the driver's parts are stubbed where a real run is
not the point."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator

import pytest
from click.testing import CliRunner

from raysweep.cli import main
from raysweep.record.directory import CampaignDir

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def test_interrupt_names_the_output_dir_to_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An interrupted run says `raysweep resume <its directory>`, not a placeholder to fill in."""
    from raysweep.drive import checks, driver
    from raysweep.results import table

    @contextlib.contextmanager
    def interrupted(*_: Any, **__: Any) -> Iterator[None]:
        raise KeyboardInterrupt
        yield

    monkeypatch.setattr(checks, "finished", lambda *a, **k: None)
    monkeypatch.setattr(checks, "check_before_run", lambda *a, **k: None)
    monkeypatch.setattr(driver, "ray_session", interrupted)
    monkeypatch.setattr(table, "write_results", lambda *a, **k: [])
    monkeypatch.setenv("RAYSWEEP_DEMO_MODEL", str(tmp_path / "model"))
    out = tmp_path / "my out"
    result = CliRunner().invoke(main, ["run", str(CONFIGS / "demo-cpu.yaml"), "--output-dir", str(out)])
    assert result.exit_code == 130, result.output
    text = " ".join(result.output.split())
    assert "OUTPUT_DIR" not in text
    assert f"raysweep resume '{out}'" in text


def test_every_shipped_config_validates_without_the_demo_model_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """`validate` checks the file with a stand-in for an unset variable and says that `run` needs it and how."""
    monkeypatch.delenv("RAYSWEEP_DEMO_MODEL", raising=False)
    files = sorted(str(f) for f in CONFIGS.glob("*.yaml"))
    assert len(files) >= 8
    result = CliRunner().invoke(main, ["validate", *files])
    assert result.exit_code == 0, result.output
    assert result.output.count("OK ") == len(files)
    assert "${RAYSWEEP_DEMO_MODEL} is not set" in result.output
    assert "RAYSWEEP_DEMO_MODEL=$PWD/.cache/tiny-llama" in result.output


def test_run_without_the_demo_model_says_how_to_set_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAYSWEEP_DEMO_MODEL", raising=False)
    result = CliRunner().invoke(main, ["run", str(CONFIGS / "demo-cpu.yaml"), "--output-dir", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "export RAYSWEEP_DEMO_MODEL=$PWD/.cache/tiny-llama" in " ".join(result.output.split())
    assert not (tmp_path / "o").exists()


def test_a_startup_dry_run_says_startup(tmp_path: Path) -> None:
    import yaml

    f = tmp_path / "startup.yaml"
    f.write_text(yaml.safe_dump({
        "name": "st", "output_dir": str(tmp_path / "out"), "mode": "startup", "runs": 1,
        "offline": {"cmd": "vllm bench startup --model m --num-iters-cold 1 --num-iters-warm 1",
                    "params": {"grid": {"max_num_seqs": [8, 16]}}}}))
    result = CliRunner().invoke(main, ["run", str(f), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "Mode: startup" in result.output and "Mode: offline" not in result.output


def test_a_lower_latency_lead_is_worded_lower_not_over() -> None:
    """With a lower-is-better objective the headline says `x% lower than`, never `+x% over`."""
    from test_report import _runs_table

    from raysweep.results import conclusions

    df = _runs_table()
    df.loc[df["serve_id"] == "B", "median_ttft_ms"] *= 1.25  # B 25 % slower: A leads by 20 %
    fast = conclusions.conclude(df, ["random_input_len", "max_concurrency"], objective="median_ttft_ms")
    lines = [ln for ln in conclusions.headlines(fast) if ln.startswith("Best for")]
    assert lines and all("% over" not in ln and "% more" not in ln for ln in lines), lines
    # 10 ms against 12.5 ms: 20 % lower (the rival 25 % higher), never "+25 %" or "25 % lower"
    assert all("20 % lower than cfg=B" in ln for ln in lines), lines
    from raysweep.results.answer import lead_text

    assert lead_text(0.221, True) == "22 % more"
    assert lead_text(0.25, False) == "20 % lower"


def test_the_interval_methods_are_said_once_not_once_per_point() -> None:
    from raysweep.cli.comparing import method_notes

    long = ("t over runs; pooled percentiles with a two-level bootstrap (runs, then requests; {} requests)")
    notes = method_notes([long.format(n) for n in (96, 96, 128, 64, 32, 32)])
    assert len(notes) == 1 and "(6 point(s))" in notes[0] and "96" not in notes[0], notes
    assert method_notes(["t over runs"] * 4) == ["intervals: t over runs"]
    two = method_notes(["t over runs", "t over runs", "t over server starts"])
    assert two == ["intervals (2 point(s)): t over runs", "intervals (1 point(s)): t over server starts"]


def test_profile_ends_without_saying_its_summary_was_not_written(tmp_path: Path) -> None:
    """`profile` runs a campaign whose end writes summary.*: its table is not followed by "summary not written"."""
    from test_aggregate import build_dir, run_row

    from raysweep.cli.profile import points_table
    from raysweep.results.table import write_results

    out = build_dir(tmp_path / "out", [run_row("s8", c, r, 100.0 * c * (1 + 0.01 * r), 10.0) for c in (1, 2)
                                       for r in range(3)])
    write_results(CampaignDir(out))
    runner = CliRunner()
    import click

    @click.command()
    def table() -> None:
        points_table(out)

    result = runner.invoke(table, [])
    assert result.exit_code == 0, result.output
    assert "max_concurrency" in result.output and "summary not written" not in result.output

"""Every kind of file raysweep writes gets the user's umask (0644 under 022, 0640 under 027), never the 0600
of a temporary file: result records, the ledger, results.*, summary.*, sla.csv, the report, figures, the
Pareto front, the comparison, raw samples, a tune leaderboard, and the storage mirror and its download."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_plots import build_output_dir

from raysweep.cli import main
from raysweep.record import storage
from raysweep.record.directory import CampaignDir
from raysweep.record.files import file_mode, write_json_atomic
from raysweep.record.runs import write_samples


@pytest.fixture(params=[0o022, 0o027])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in root.rglob("*") if p.is_file()}


def run_ok(*args: str) -> None:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output


def test_every_file_raysweep_writes_follows_the_umask(tmp_path, umask, monkeypatch):
    want = 0o666 & ~umask
    assert file_mode() == want
    out = build_output_dir(tmp_path / "out", sla=True)       # points/*.json and the ledger
    write_samples(out / "points" / "samples.parquet", {"latencies": [0.1, 0.2], "chunks": [[0.0], [0.1]]})
    run_ok("results", str(out), "--out", str(out), "--format", "csv", "--format", "parquet", "--format", "json")
    run_ok("results", str(out), "--aggregate", "--out", str(out))
    run_ok("sla", str(out), "--out", str(out / "sla.csv"))
    run_ok("pareto", str(out))
    run_ok("plot", str(out), "--no-server-metrics")
    from raysweep.report import page as report

    monkeypatch.setattr(report, "_card_figure", lambda data, c, v: "")
    run_ok("report", str(out))
    other = build_output_dir(tmp_path / "other")
    run_ok("compare", str(out), str(other), "--out", str(other / "compare"), "--record")
    files = modes(out) | {f"other/{k}": v for k, v in modes(other).items()}
    kinds = {"ledger.sqlite", "results.csv", "results.parquet", "results.json", "summary.csv", "summary.parquet",
             "sla.csv", "report.html", "pareto/PARETO.png", "pareto/pareto_front.csv", "plots/FIGURE.png",
             "points/samples.parquet", "other/compare/comparison.csv", "other/compare/COMPARE.png",
             "other/compare/baseline.json"}
    assert kinds <= set(files), kinds - set(files)
    assert any(k.startswith("points/s8/") and k.endswith(".json") for k in files)
    wrong = {k: oct(v) for k, v in files.items() if v != want and not k.startswith("ledger.sqlite-")}
    assert not wrong, f"not {oct(want)}: {wrong}"
    # the storage mirror, and a mirrored campaign read back
    mirror = tmp_path / "mirror"
    assert storage.Mirror(mirror.as_uri(), CampaignDir(out)).close()
    assert modes(mirror) and set(modes(mirror).values()) == {want}
    back = storage.fetch(mirror.as_uri(), tmp_path / "back")
    assert set(modes(back).values()) == {want}
    # a file written whole keeps that mode when it replaces an older one
    target = tmp_path / "one.json"
    target.write_text("{}")
    target.chmod(0o600)
    write_json_atomic(target, {"a": 1})
    assert stat.S_IMODE(target.stat().st_mode) == want

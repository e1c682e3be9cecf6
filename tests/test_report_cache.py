"""The report's kept figures (raysweep.report.cache), on output dirs made through the ledger API: a report
written again on unchanged data draws nothing, does not import matplotlib and is the same page; a changed
campaign draws again exactly the figures whose data changed; an unreadable or altered entry is drawn again;
a report written elsewhere keeps nothing in the output dir. No Ray."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from test_plots import FAILED, _pid, build_output_dir, run_record

from raysweep.bench import timeseries
from raysweep.ledger import Ledger
from raysweep.record.directory import CampaignDir
from raysweep.record.files import write_json_atomic
from raysweep.report import cache as report_cache
from raysweep.report import figures as report_figures
from raysweep.report import page as report

ROOT = Path(__file__).resolve().parent.parent
SLA_CAPTION = "SLA: largest passing value per server config and target"
SERIES_POINT = ("s16", 128, 4, 0)  # the run given a time series


def page(html: str, out: Path) -> str:
    """The page without what differs between two makings of it: the time it was made, the dir's path."""
    return re.sub(r" · made [0-9-]+ [0-9:]+", "", html).replace(str(out), "OUT")


def kept(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / report_cache.FOLDER).glob("*"))}


class Drawn:
    """What a report drew: the captions of the figures encoded (every drawn figure of the Figures and
    Conclusions sections goes through `img_html`) and the time series drawn."""

    def __init__(self, mp: pytest.MonkeyPatch) -> None:
        self.figures: list[str] = []
        self.series = 0
        img, series = report_figures.img_html, timeseries.figure

        def counting_img(fig, caption, notes=(), dpi=110):
            self.figures.append(caption)
            return img(fig, caption, notes, dpi)

        def counting_series(ts, record):
            self.series += 1
            return series(ts, record)

        mp.setattr(report_figures, "img_html", counting_img)
        mp.setattr(timeseries, "figure", counting_series)

    def reset(self) -> None:
        self.figures.clear()
        self.series = 0


def _with_series(out: Path, scale: float = 1.0) -> None:
    """Give one run a time series, as a native point records it."""
    rel = f"points/{SERIES_POINT[0]}/b{SERIES_POINT[1]}-{SERIES_POINT[2]}/run={SERIES_POINT[3]}"
    t = np.arange(0.0, 5.0, 0.5)
    timeseries.write_timeseries(out / f"{rel}.timeseries.parquet",
                                {"t_s": t, "output_throughput": scale * (100 + t), "in_flight": np.full(t.size, 4.0),
                                 "ttft_p50_ms": 10 + t, "itl_p50_ms": 2 + t})
    record = run_record(*SERIES_POINT)
    record.update(timeseries_path=f"{rel}.timeseries.parquet", steady_window_start_s=1.0, steady_window_end_s=4.0)
    write_json_atomic(out / f"{rel}.json", record)


@pytest.fixture(scope="module")
def cold(tmp_path_factory) -> Iterator[tuple[Path, str, list[str]]]:
    """An output dir with SLA searches and a time series, its report written once: (dir, page, the captions
    of the figures it drew)."""
    out = build_output_dir(tmp_path_factory.mktemp("cache") / "out", sla=True)
    _with_series(out)
    with pytest.MonkeyPatch.context() as mp:
        drawn = Drawn(mp)
        html = report.write_report(CampaignDir(out)).read_text()
        assert drawn.series == 1
        yield out, html, list(drawn.figures)


@pytest.fixture
def copy(cold, tmp_path) -> Path:
    """The cold report's output dir, figures kept, copied for one test to change."""
    return Path(shutil.copytree(cold[0], tmp_path / "out"))


@pytest.fixture
def drawn(monkeypatch) -> Drawn:
    return Drawn(monkeypatch)


def test_the_first_report_keeps_every_figure_it_draws(cold):
    out, html, figures = cold
    cards = html.count('<div class="card">')
    assert cards == 2  # one per bench shape (random_input_len 128 and 256)
    # 7 figures of the Figures section, a figure per card, the time series
    assert len(figures) == 7 + cards and SLA_CAPTION in figures
    assert len(kept(out)) == len(figures) + 1
    assert "not drawn" not in html and html.count("data:image/png;base64,") == len(figures) + 1


def test_a_report_written_again_on_unchanged_data_draws_nothing_and_is_the_same_page(cold, copy, drawn):
    out, first, _ = cold
    before = kept(copy)
    again = report.write_report(CampaignDir(copy)).read_text()
    assert drawn.figures == [] and drawn.series == 0
    assert page(again, copy) == page(first, out)  # the first drew every figure: kept ones are the same
    assert kept(copy) == before


# The report written in a fresh Python: a test worker may hold the session's Ray cluster, and a process where
# Ray runs never forks (`_Beside`). It prints how many figures that process drew itself.
BESIDE_CODE = """import sys
import raysweep.modes  # every mode registered (SLA search's and the confirmation's parts), as the faces do
from raysweep.report import figures
from raysweep.record.directory import CampaignDir
from raysweep.report.page import write_report
drawn = []
img = figures.img_html
def counting_img(fig, caption, notes=(), dpi=110):
    drawn.append(caption)
    return img(fig, caption, notes, dpi)
figures.img_html = counting_img
figures.BESIDE_FROM_RUNS = 0  # half of the figures drawn by a forked process
write_report(CampaignDir(sys.argv[1]))
print(len(drawn))
"""


def test_figures_drawn_by_a_second_process_make_the_same_page_and_are_kept_alike(cold, tmp_path):
    out, first, figures = cold
    fresh = Path(shutil.copytree(out, tmp_path / "out"))
    shutil.rmtree(fresh / report_cache.FOLDER)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    proc = subprocess.run([sys.executable, "-c", BESIDE_CODE, str(fresh)], capture_output=True, text=True,
                          env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    again = (fresh / report.REPORT_FILE).read_text()
    assert 0 < int(proc.stdout.split()[-1]) < len(figures)  # that process drew only its half of the Figures section
    assert page(again, fresh) == page(first, out)  # the same figures, in the same places
    assert kept(fresh) == kept(out)


def test_a_report_of_kept_figures_does_not_import_matplotlib(copy):
    code = ("import sys\nfrom raysweep.record.directory import CampaignDir\n"
            "from raysweep.report.page import write_report\n"
            "write_report(CampaignDir(sys.argv[1]))\nprint('matplotlib' in sys.modules)")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    proc = subprocess.run([sys.executable, "-c", code, str(copy)], capture_output=True, text=True, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_one_more_run_draws_again_the_figures_of_its_data_only(cold, copy, drawn):
    out, first, figures = cold
    # the failed run done at last (a resumed campaign): one more row in the results, in the 256 shape
    rel = f"points/{FAILED[0]}/b{FAILED[1]}-{FAILED[2]}/run={FAILED[3]}.json"
    write_json_atomic(copy / rel, run_record(*FAILED))
    led = Ledger.open_existing(copy)
    try:
        led.mark_running(_pid(*FAILED), f"srv-{FAILED[0]}")
        led.mark_done(_pid(*FAILED), rel)
    finally:
        led.close()
    html = report.write_report(CampaignDir(copy)).read_text()
    assert "32 finished run(s)" in html and "31 finished run(s)" in first
    # every figure drawn from the results table again, and the card of the 256 shape; not the SLA bars (the
    # searches did not change), the card of the 128 shape or the time series
    assert SLA_CAPTION not in drawn.figures and drawn.series == 0
    card = next(f for f in figures if figures.count(f) == 2)  # the two cards' figures share a caption
    expected = [f for f in figures if f != SLA_CAPTION]
    expected.remove(card)
    assert sorted(drawn.figures) == sorted(expected) and len(expected) == 6 + 1
    # what the report shows is what a report drawn afresh shows; only this report's figures are kept
    assert page(html, copy) == page(report.build_report(CampaignDir(copy)), copy)
    assert page(html, copy) != page(first, out)
    assert len(kept(copy)) == len(figures) + 1


def test_a_changed_time_series_is_drawn_again(copy, drawn):
    _with_series(copy, scale=2.0)
    report.write_report(CampaignDir(copy))
    assert drawn.series == 1 and drawn.figures == []


def test_an_unreadable_or_altered_entry_is_drawn_again_and_replaced(cold, copy, drawn):
    out, first, _ = cold
    files = sorted((copy / report_cache.FOLDER).glob("*.json"))
    files[0].write_bytes(files[0].read_bytes()[:100])                  # cut short
    files[1].write_bytes(b"\x00\xff not json")                           # garbage
    entry = json.loads(files[2].read_text())
    entry["html"] = entry["html"].replace("data:image/png", "data:image/gif")  # altered, its checksum not
    files[2].write_text(json.dumps(entry))
    html = report.write_report(CampaignDir(copy)).read_text()
    assert len(drawn.figures) + drawn.series == 3
    assert page(html, copy) == page(first, out)
    for f in files[:3]:
        entry = json.loads(f.read_text())
        assert entry["key"] == f.stem and "data:image/png" in entry["html"]


def test_a_report_written_elsewhere_uses_the_kept_figures_and_writes_nothing_into_the_output_dir(copy, tmp_path,
                                                                                                drawn, monkeypatch):
    before = {p: p.stat().st_mtime_ns for p in copy.rglob("*")}
    elsewhere = tmp_path / "shared" / "report.html"
    report.write_report(CampaignDir(copy), elsewhere)
    assert drawn.figures == [] and drawn.series == 0 and elsewhere.is_file()
    assert {p: p.stat().st_mtime_ns for p in copy.rglob("*")} == before
    # without kept figures: drawn, and kept nowhere (one figure is enough to see it)
    monkeypatch.setattr(report, "_figure_list", lambda data: report_figures.figure_list(data)[:1])
    monkeypatch.setattr(report, "_card_figure", lambda data, c, v: "")
    out = build_output_dir(tmp_path / "fresh")
    report.write_report(CampaignDir(out), elsewhere)
    assert len(drawn.figures) == 1 and not (out / report_cache.FOLDER).exists()
    assert not (elsewhere.parent / report_cache.FOLDER).exists() and not (out / report.REPORT_FILE).exists()


def test_the_written_out_colours_are_matplotlibs_tab10():
    import matplotlib

    from raysweep.report.plots.style import _COLORS

    assert tuple(_COLORS) == tuple(matplotlib.colormaps["tab10"].colors)

"""The HTML report in a real headless browser (Chromium's headless shell, by subprocess).

The report of an output dir made through the ledger API is opened from a file: it renders (a screenshot of
its first screen that is not blank), its sections come in order with the conclusions first, every in-page
link lands on an element, every figure is an embedded PNG the browser decodes, the results table sorts when
a header is clicked, and no script error is raised. A copy of the report gets a small probe script that
writes what it finds into the DOM, which `--dump-dom` returns.

Without a browser the test is skipped, unless RAYSWEEP_REQUIRE_VLLM is set (as in CI): then it fails and
says how to install one (`scripts/install-browser.sh`, run by `make test`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from browser import browser, check_page, run_browser
from test_plots import PNG, build_output_dir

from raysweep.report import page as report


@pytest.fixture(scope="module")
def report_file(tmp_path_factory) -> Path:
    out = build_output_dir(tmp_path_factory.mktemp("browser") / "out", sla=True)
    return report.write_report(out)


def test_report_renders_with_working_links_and_figures_in_chromium(report_file, tmp_path):
    probe = check_page(report_file, tmp_path)
    assert probe["title"] == "raysweep report: camp"
    # the answer first, the warnings next, then the figures; the record at the end
    order = probe["sections"]
    assert order[:2] == ["conclusions", "validity"] and order.index("figures") < order.index("results")
    assert order[-3:] == ["campaign", "plan", "environment"]
    first = probe["first_text"]
    assert ("Deploy:" in first or "Best measured:" in first) and "random_input_len=128" in first
    # every in-page link lands on an element; the navigation names every section
    assert probe["links"] and all(link["ok"] for link in probe["links"]), probe["links"]
    assert {link["href"][1:] for link in probe["links"]} >= set(probe["sections"])
    # every figure is an embedded PNG that the browser decoded and shows
    imgs = probe["imgs"]
    assert len(imgs) >= 6, imgs
    assert all(i["png"] and i["width"] > 100 and i["shown"] > 100 for i in imgs), imgs
    # the results table sorts on a click
    values = probe["sorted"]["values"]
    assert len(values) == 31 and values == sorted(values) and values != sorted(values, reverse=True)


def test_first_screen_is_not_blank(report_file, tmp_path):
    exe = browser()
    shot = tmp_path / "first-screen.png"
    done = run_browser(exe, f"--screenshot={shot}", "--window-size=1366,900", report_file.as_uri())
    assert done.returncode == 0 and shot.is_file(), done.stderr[-3000:]
    assert shot.read_bytes().startswith(PNG)
    from matplotlib.image import imread

    pixels = imread(shot)
    assert pixels.shape[:2] == (900, 1366)
    rows_with_ink = (pixels[..., :3].min(axis=2) < 0.5).any(axis=1)
    assert rows_with_ink.sum() > 200, "the first screen is (nearly) blank"
    assert len(np.unique(pixels[..., :3].reshape(-1, 3), axis=0)) > 20  # text, table borders, coloured cards

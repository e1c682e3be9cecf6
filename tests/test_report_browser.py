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

from raysweep.record.directory import CampaignDir
from raysweep.report import page as report


@pytest.fixture(scope="module")
def report_file(tmp_path_factory) -> Path:
    out = build_output_dir(tmp_path_factory.mktemp("browser") / "out", sla=True)
    return report.write_report(CampaignDir(out))


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


def _demo_like_rows() -> list[dict]:
    """The demo's shape: max_num_seqs 8 and 16 at max_concurrency 4 and 16, 3 runs each, where the sweep cannot
    tell them apart; then its confirmation of the leader and the runner-up at 16, 4 fresh runs each on 2 server
    starts, which reads the leader 15 % ahead."""
    from test_aggregate import run_row

    rows = []
    for sid, level in (("s8", 1650.0), ("s16", 1700.0)):
        for c in (4, 16):
            for r in range(3):
                rows.append(run_row(sid, c, r, level * c / 16 * (1 + 0.06 * (0, -1, 1)[r]), 50.0,
                                    campaign="demo-cpu", server_id=f"{sid}-0", gpu_count=0))
    for sid, level in (("s8", 1649.0), ("s16", 1905.0)):
        for r in range(4):
            rows.append(run_row(sid, 16, r, level * (1 + 0.01 * (0, -1, 1, 0.5)[r]), 50.0, campaign="demo-cpu",
                                bench_id="b16-confirm", point_id=f"{sid}-c16-{r}", phase="confirm",
                                confirms_bench_id="b16", server_id=f"{sid}-{1 + r % 2}", gpu_count=0,
                                bench_label="max_concurrency=16"))
    return rows


def test_the_demos_card_states_the_figures_the_terminal_prints(tmp_path, monkeypatch):
    """What the card shows first in Chromium is what `raysweep run` printed at its end for the same campaign: the
    leader's value and interval (the confirmation's), its lead and the runner-up's value, never the sweep's
    numbers beside the confirmation's lead."""
    import re

    from test_aggregate import build_dir

    from raysweep.results import conclusions

    monkeypatch.setattr(report, "_figure_list", lambda data: [])  # the words are compared, not the figures
    monkeypatch.setattr(report, "_card_figure", lambda data, c, v: "")
    out = build_dir(tmp_path / "demo-cpu", _demo_like_rows(), name="demo-cpu")
    c = report.conclusions_of(CampaignDir(out))
    (line,) = conclusions.headlines(c)
    said = re.search(r"deploy (max_num_seqs=\d+) at max_concurrency=16: output_throughput ([\d,.]+) tok/s "
                     r"\[([\d,.]+), ([\d,.]+) at 95 %\] \(the confirmation: .*\), ((\d+) % more than "
                     r"(max_num_seqs=\d+) at max_concurrency=16 \[[^]]*\])", line)
    assert said is not None, line
    leader, value, low, high, words, lead, rival = said.groups()
    probe = check_page(report.write_report(CampaignDir(out)), tmp_path)
    card = " ".join(probe["first_text"].split())
    shown = re.search(r"Deploy: (max_num_seqs=\d+) at max_concurrency=16 ?: output_throughput ([\d,.]+) tok/s "
                      r"\[([\d,.]+), ([\d,.]+) at 95 %\] .*?((\d+) % more than (max_num_seqs=\d+) at "
                      r"max_concurrency=16 \[[^]]*\]) \(([\d,.]+),", card)
    assert shown is not None, card
    def num(text: str) -> float:
        return float(text.replace(",", ""))

    assert (shown[1], shown[7]) == (leader, rival), (line, card)
    assert [num(x) for x in shown.groups()[1:4]] == [num(value), num(low), num(high)], (line, card)
    assert shown[5] == words and shown[6] == lead, (line, card)  # the lead and its interval in the same words
    (v,) = c.verdicts
    assert v.confirmation is not None and num(shown[8]) == num(conclusions.fmt(v.confirmation.runner_mean))

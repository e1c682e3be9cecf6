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

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from test_plots import PNG, build_output_dir

from raysweep.report import page as report

BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")

# Runs after the page has loaded: what the test checks, as JSON in <body data-probe="...">.
PROBE = """
<script>
window.__errors = [];
window.addEventListener('error', function (e) { window.__errors.push(String(e.message)); });
window.addEventListener('load', function () {
  var links = Array.from(document.querySelectorAll('a[href^="#"]')).map(function (a) {
    return {href: a.getAttribute('href'), ok: !!document.getElementById(a.getAttribute('href').slice(1))};
  });
  var imgs = Array.from(document.querySelectorAll('img')).map(function (i) {
    return {alt: i.alt, png: i.src.indexOf('data:image/png;base64,') === 0, width: i.naturalWidth,
            shown: i.getBoundingClientRect().width};
  });
  var sorted = null, t = document.querySelector('#results table.sortable');
  if (t) {
    var ths = Array.from(t.tHead.rows[0].cells);
    var col = ths.findIndex(function (h) { return h.textContent === 'run_number'; });
    ths[col].click();
    var values = Array.from(t.tBodies[0].rows).map(function (r) { return Number(r.cells[col].dataset.v); });
    sorted = {column: col, values: values};
  }
  var sections = Array.from(document.querySelectorAll('section')).map(function (s) { return s.id; });
  var first = document.querySelector('section');
  document.body.setAttribute('data-probe', JSON.stringify({
    links: links, imgs: imgs, sorted: sorted, sections: sections, errors: window.__errors,
    title: document.title, first_text: first ? first.innerText.slice(0, 2000) : ''}));
});
</script>
"""


def browser() -> str:
    """The path of a headless Chromium; skip, or fail when RAYSWEEP_REQUIRE_VLLM is set, without one."""
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    message = (f"no headless Chromium ({', '.join(BROWSERS)}) on PATH; install it with scripts/install-browser.sh "
               "(as root: apt-get install chromium-headless-shell)")
    if os.environ.get("RAYSWEEP_REQUIRE_VLLM"):
        pytest.fail(message)
    pytest.skip(message)


def run_browser(exe: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def report_file(tmp_path_factory) -> Path:
    out = build_output_dir(tmp_path_factory.mktemp("browser") / "out", sla=True)
    return report.write_report(out)


def test_report_renders_with_working_links_and_figures_in_chromium(report_file, tmp_path):
    exe = browser()
    probed = tmp_path / "probed.html"
    probed.write_text(report_file.read_text().replace("</body>", PROBE + "</body>", 1))
    done = run_browser(exe, "--virtual-time-budget=10000", "--dump-dom", probed.as_uri())
    assert done.returncode == 0, done.stderr[-3000:]
    found = re.search(r'data-probe="([^"]*)"', done.stdout)
    assert found, f"the probe did not run: {done.stdout[:500]} {done.stderr[-2000:]}"
    probe = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<")
                       .replace("&gt;", ">").replace("&#39;", "'"))
    assert probe["errors"] == []
    assert probe["title"] == "raysweep report: camp"
    # the answer first, the warnings next, then the figures; the record at the end
    order = probe["sections"]
    assert order[:2] == ["conclusions", "validity"] and order.index("figures") < order.index("results")
    assert order[-3:] == ["campaign", "plan", "environment"]
    assert "Best:" in probe["first_text"] and "random_input_len=128" in probe["first_text"]
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

"""Headless Chromium for the tests (by subprocess): find it, run it, and probe a page that raysweep wrote.

`probe_page` opens a copy of an HTML file with a small probe script that writes what it finds into the DOM
(script and console errors, in-page links, images, the sections, the notes), which `--dump-dom` returns;
`check_page` asserts what every report must hold: no script or console error, every image decoded, every
in-page link landing, and no note said twice.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")

# Runs after the page has loaded: what the test checks, as JSON in <body data-probe="...">.
PROBE = """
<script>
window.__errors = [];
window.addEventListener('error', function (e) { window.__errors.push(String(e.message)); });
(function () {
  var error = console.error;
  console.error = function () {
    window.__errors.push(Array.from(arguments).join(' '));
    error.apply(console, arguments);
  };
})();
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
    notes: Array.from(document.querySelectorAll('.note')).map(function (n) { return n.textContent.trim(); }),
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



def probe_page(page: Path, tmp_path: Path) -> dict[str, Any]:
    """What the probe found on `page` (opened from a copy beside it in `tmp_path`)."""
    exe = browser()
    probed = tmp_path / f"probed-{page.stem}.html"
    probed.write_text(page.read_text().replace("</body>", PROBE + "</body>", 1))
    done = run_browser(exe, "--virtual-time-budget=10000", "--dump-dom", probed.as_uri())
    assert done.returncode == 0, done.stderr[-3000:]
    found = re.search(r'data-probe="([^"]*)"', done.stdout)
    assert found, f"the probe did not run: {done.stdout[:500]} {done.stderr[-2000:]}"
    return json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<")
                      .replace("&gt;", ">").replace("&#39;", "'"))


def check_page(page: Path, tmp_path: Path) -> dict[str, Any]:
    """`page` in Chromium: no script or console error, every image decoded and shown, every in-page link
    landing on an element, and each note (warning) said once; the probe's findings."""
    probe = probe_page(page, tmp_path)
    assert probe["errors"] == [], probe["errors"]
    assert all(i["png"] and i["width"] > 0 for i in probe["imgs"]), probe["imgs"]
    assert all(link["ok"] for link in probe["links"]), [link for link in probe["links"] if not link["ok"]]
    twice = {n: k for n, k in Counter(probe["notes"]).items() if k > 1}
    assert not twice, twice
    return probe

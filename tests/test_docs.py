"""The documentation: the MkDocs site builds in strict mode (every page and link valid), its campaign reference is
generated from the pydantic models, and the README's links point at files that exist."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import typing
from pathlib import Path

from pydantic import BaseModel

from raysweep import campaign

ROOT = Path(__file__).resolve().parent.parent


def _gen_reference():
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "docs" / "gen_reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _models(model: type[BaseModel], path: str, seen: dict[str, type[BaseModel]]) -> dict[str, type[BaseModel]]:
    """Every model reachable from `model`, by the campaign-file path it sits at (`[]` after a list)."""
    seen[path] = model
    for name, info in model.model_fields.items():
        sub_path = f"{path}.{name}" if path else name
        todo = [(info.annotation, False)]
        while todo:
            ann, in_list = todo.pop()
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                _models(ann, sub_path + ("[]" if in_list else ""), seen)
            else:
                todo += [(a, in_list or typing.get_origin(ann) is list) for a in typing.get_args(ann)]
    return seen


def test_reference_covers_every_field_of_every_model():
    text = _gen_reference().campaign_reference()
    models = _models(campaign.Campaign, "", {})
    assert {"serve", "bench", "bench.client_guard", "offline", "placement", "placement.pins[]", "sla",
            "transport"} <= set(models)
    for path, model in models.items():
        if path:
            assert f"`{path}`" in text, f"no section for {path}"
        for name, info in model.model_fields.items():
            row = next((line for line in text.splitlines() if line.startswith(f"| `{name}` |")), None)
            assert row is not None, f"{path or 'campaign'}.{name} missing"
            assert info.description, f"{path or 'campaign'}.{name} has no description in campaign.py"
    # defaults, requiredness and constraints are read from the models, not written by hand
    runs = next(line for line in text.splitlines() if line.startswith("| `runs` |"))
    assert "3" in runs and "≥ 1" in runs
    assert "required" in next(line for line in text.splitlines() if line.startswith("| `name` |"))
    assert '"native" or "command"' in text


def test_mkdocs_build_strict(tmp_path):
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    reference = (site / "reference" / "index.html").read_text()
    assert "max_send_lag_ms" in reference and "ready_timeout_s" in reference
    assert (site / "benchmarks" / "RESULTS" / "index.html").is_file()
    # pages written for GitHub render here too: a fence inside a list item, a list nested 2 spaces deep
    assert "<pre><code>pip install -e ." in (site / "cluster" / "index.html").read_text()
    load_generator = (site / "load-generator" / "index.html").read_text()
    assert re.search(r"--seed</code>:<ul>\s*<li><code>random</code>", load_generator)
    # the site reads offline: no page pulls scripts or styles from the network
    for page in site.rglob("*.html"):
        assert not re.search(r'<(script|link)[^>]+(src|href)="https?://', page.read_text()), page


def test_readme_links_resolve():
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    assert any(link.startswith("docs/") for link in links)
    for link in links:
        if not re.match(r"[a-z]+://", link):
            assert (ROOT / link).exists(), f"README links to {link}, which does not exist"


def test_the_index_links_every_page():
    """docs/index.md is the map: every page of docs/ (and the generated reference) is linked from it, so a new
    page nobody linked fails here, and every page it links exists."""
    index = (ROOT / "docs" / "index.md").read_text()
    linked = set(re.findall(r"\]\(([\w./-]+\.md)(?:#[\w-]*)?\)", index))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    assert not pages - linked, f"docs/index.md does not link: {sorted(pages - linked)}"
    generated = {"reference.md", "benchmarks/RESULTS.md"}  # written by docs/hooks.py when the site is built
    assert not {p for p in linked - pages - generated if not (ROOT / "docs" / p).is_file()}


def test_the_grafana_dashboard_queries_the_documented_gauges():
    """cluster/grafana-raysweep.json is valid JSON whose panels query every progress gauge raysweep
    publishes (as Ray exports them, `ray_` first) and nothing else of ours; docs/tracking.md names the port,
    the discovery file and the dashboard."""
    import json

    from raysweep.drive.progress_metrics import GAUGES

    dashboard = json.loads((ROOT / "cluster" / "grafana-raysweep.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    queried = {m for e in exprs for m in re.findall(r"\bray_raysweep_\w+", e)}
    assert queried == {f"ray_{g}" for g in GAUGES}
    assert all(p["datasource"]["uid"] == "${datasource}" for p in dashboard["panels"])
    doc = (ROOT / "docs" / "tracking.md").read_text()
    for name in GAUGES:
        assert f"`ray_{name}`" in doc
    assert "--metrics-export-port" in doc and "MetricsExportPort" in doc
    assert "prom_metrics_service_discovery.json" in doc and "cluster/grafana-raysweep.json" in doc


def test_the_report_screens_are_in_their_pages_with_a_caption_the_script_rewrites(tmp_path, monkeypatch):
    """Each screen scripts/report_screens.py takes sits between its markers in the page it names, as a PNG
    that exists and is under 300 KB, with the caption the script writes; the script rewrites that block alone."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("report_screens", ROOT / "scripts" / "report_screens.py")
    assert spec and spec.loader
    screens = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "report_screens", screens)  # its dataclass looks its module up there
    spec.loader.exec_module(screens)
    shots = screens.shots(standin=False)
    assert {s.name for s in shots} == set(screens.CAMPAIGNS) == {"endpoint", "multinode", "failed"}
    for shot in shots:
        text = (ROOT / "docs" / shot.page).read_text()
        begin, end = f"<!-- report-screen:{shot.name}:begin -->", f"<!-- report-screen:{shot.name}:end -->"
        inner = text.split(begin, 1)[1].split(end, 1)[0]
        assert f"![{shot.alt}](img/{shot.png})" in inner and f"*{shot.what}: campaign `" in inner
        png = ROOT / "docs" / "img" / shot.png
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size < 300_000
        copy = tmp_path / shot.page
        copy.write_text(text)
        screens.replace_caption(copy, shot, "NEW")
        assert copy.read_text() == text.replace(f"{begin}{inner}{end}", f"{begin}\nNEW\n{end}")

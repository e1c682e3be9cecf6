"""Unit tests for raysweep.report and the `report` command, on output dirs made through the ledger API."""

from __future__ import annotations

import base64
import json
import re

import pytest
from click.testing import CliRunner

from raysweep import report
from raysweep.cli import main
from raysweep.files import write_json_atomic
from raysweep.ledger import Ledger
from test_plots import PNG, build_output_dir


def sections(html: str) -> list[str]:
    return re.findall(r'<section id="(\w+)">', html)


def section(html: str, sid: str) -> str:
    return html.split(f'<section id="{sid}">', 1)[1].split("</section>", 1)[0]


def test_cli_report_is_one_self_contained_file(tmp_path):
    out = build_output_dir(tmp_path / "out", sla=True)
    result = CliRunner().invoke(main, ["report", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    html = (out / "report.html").read_text()
    assert str(out / "report.html") in result.output
    assert sections(html) == ["validity", "campaign", "plan", "figures", "results", "sla", "transport", "failures",
                              "environment"]
    assert "http://" not in html and "https://" not in html and "<link" not in html  # nothing to fetch
    # figures: 3 metric curves, the server metrics, the Pareto front, the SLA bars, all embedded PNGs
    images = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,([^"]+)"', section(html, "figures"))
    assert [alt for alt, _ in images] == [
        "output_throughput against max_concurrency", "median_ttft_ms against max_concurrency",
        "p99_ttft_ms against max_concurrency", "server-side metrics against max_concurrency",
        "Pareto front (every run; front without dominated ties)",
        "SLA: largest passing value per server config and target"]
    assert all(base64.b64decode(data).startswith(PNG) for _, data in images)
    assert "not drawn" not in html
    # the campaign as stored, the plan's counts
    assert "variable: max_concurrency" in section(html, "campaign")
    plan = section(html, "plan")
    assert "2 server config(s), 8 bench point(s), 2 run(s) each." in plan
    assert '<td data-v="0">0</td><td data-v="0">0</td><td data-v="31">31</td><td data-v="1">1</td>' \
           '<td data-v="32">32</td>' in plan
    assert "1 x 1 x 1" in plan and "2 x 1 x 1" in plan
    # the sortable results table: one row per finished run
    results = section(html, "results")
    assert '<table class="sortable">' in results and "<script>" in html and "localeCompare" in html
    assert results.count("<tr>") == 1 + 31
    assert '<th class="t">max_num_seqs</th>' in results and '<th class="t">p99_ttft_ms</th>' in results
    # the SLA table: one row per search
    assert section(html, "sla").count("<tr>") == 1 + 3 and "above max" in section(html, "sla")
    assert "Not checked" in section(html, "transport")
    failures = section(html, "failures")
    assert "1 failed point(s)." in failures and "CUDA out of memory\nlast log line" in failures
    assert "server died during the point" in failures
    env = section(html, "environment")
    # what the runs recorded, never what is installed where the report is made
    assert "No provenance was recorded" in env and "<td class=\"t\">ray</td>" not in env
    assert "1 node(s), 3 GPU(s) used." in env and "10.0.0.1" in env and "0,1,2" in env


@pytest.fixture
def no_figures(monkeypatch):
    """The report without its figures (they are checked above), to keep these tests fast."""
    monkeypatch.setattr(report, "_figure_list", lambda data: [])


def test_transport_verdict_per_server_config_with_evidence_and_recorded_versions(tmp_path, no_figures):
    from raysweep.transport import server_verdict

    out = build_output_dir(tmp_path / "out")
    gdr = "n1:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 4[0] [send] via NET/IB/0/GDRDMA"
    sock = "n1:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 4[0] [send] via NET/Socket/0"
    led = Ledger.open_existing(out)
    for sid, line in (("s8", sock), ("s16", gdr)):
        led.update_server(f"srv-{sid}", transport=json.dumps(server_verdict([[line], []])))
    stored = led.stored_campaign()
    stored["transport"] = {"require": "ib"}
    with led._tx() as c:
        c.execute("UPDATE meta SET value = ? WHERE key = 'campaign'", (json.dumps(stored),))
    led.close()
    for path in (out / "points").rglob("run=*.json"):
        rec = json.loads(path.read_text())
        rec.update(vllm_version="0.33.0")
        write_json_atomic(path, rec)
    html = report.build_report(out)
    transport = section(html, "transport")
    assert transport.count("<tr>") == 1 + 2  # one row per server config
    assert "gate (ib)" in transport and "Not checked" not in transport
    rows = {"s16" if "max_num_seqs=16" in r else "s8": r for r in transport.split("<tr>")[2:]}
    assert "IB+GDR" in rows["s16"] and ">ok<" in rows["s16"], rows
    assert ">Socket<" in rows["s8"] and ">refused<" in rows["s8"], rows
    assert "via NET/Socket/0" in transport and "<details>" in transport  # the evidence lines
    assert "No SLA search in this campaign." in section(html, "sla")
    env = section(html, "environment")
    assert "recorded with the runs" in env and "0.33.0" in env and "installed where" not in env


def test_a_figure_that_fails_costs_only_itself(tmp_path, monkeypatch):
    out = build_output_dir(tmp_path / "out")

    def broken() -> None:
        raise ValueError("no such thing")

    monkeypatch.setattr(report, "_figure_list", lambda data: [("broken one", broken)])
    html = report.build_report(out)
    assert "broken one: not drawn (no such thing)" in section(html, "figures")
    assert sections(html)[-1] == "environment"


def test_report_out_option_and_refusal_without_ledger(tmp_path, no_figures):
    out = build_output_dir(tmp_path / "out")
    target = tmp_path / "elsewhere" / "r.html"
    result = CliRunner().invoke(main, ["report", str(out), "--out", str(target)], catch_exceptions=False)
    assert result.exit_code == 0 and target.is_file() and not (out / "report.html").exists()
    bare = tmp_path / "bare"
    bare.mkdir()
    result = CliRunner().invoke(main, ["report", str(bare)])
    assert result.exit_code == 2 and "no raysweep ledger here" in result.output


def test_report_of_a_campaign_with_nothing_done(tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    led = Ledger(out / "ledger.sqlite")
    led.sync(name="e", fingerprint="f", meaning={}, campaign={"name": "e"}, campaign_file="",
             points=[("p", "s", "b", 0, {"max_num_seqs": 8}, {})])
    led.close()
    html = report.build_report(out)
    assert "No finished run yet." in section(html, "figures") and "No finished run yet." in section(html, "results")
    assert "No server was started." in section(html, "environment")


def _flag_one_run(out) -> str:
    """Mark one finished run as measured on a niced server; returns its point id."""
    path = sorted((out / "points").rglob("run=*.json"))[0]
    rec = json.loads(path.read_text())
    rec.update(server_nice=15, client_limited=False, validity_ok=False, validity_issues="niced (server 15)")
    write_json_atomic(path, rec)
    return rec["point_id"]


def test_runs_failing_a_validity_check_are_listed_marked_and_crossed(tmp_path, no_figures):
    out = build_output_dir(tmp_path / "out")
    _flag_one_run(out)
    html = report.build_report(out)
    assert sections(html)[0] == "validity"
    warn = section(html, "validity")
    assert "fail a check" in warn and "niced (server 15)" in warn
    flagged_count = int(re.search(r"(\d+) of (\d+) run\(s\) fail a check", warn).group(1))
    assert flagged_count >= 1
    results = section(html, "results")
    assert results.count("\u26a0 niced (server 15)") == 1  # the mark in the table


def test_validity_section_when_every_run_passes(tmp_path, no_figures):
    out = build_output_dir(tmp_path / "out")
    for path in (out / "points").rglob("run=*.json"):
        rec = json.loads(path.read_text())
        rec.update(client_limited=False, validity_ok=True, validity_issues="")
        write_json_atomic(path, rec)
    html = report.build_report(out)
    assert "pass every check" in section(html, "validity")
    assert "\u26a0" not in section(html, "results")


def test_environment_shows_the_recorded_provenance(tmp_path, no_figures):
    out = build_output_dir(tmp_path / "out")
    led = Ledger.open_existing(out)
    led.update_server("srv-s8", provenance=json.dumps(
        {"vllm": "9.9.9-recorded", "torch": "2.0", "nccl": "2.21.5", "ray": "2.60.0", "raysweep": "0.1.0",
         "python": "3.11", "gpu": "8 x NVIDIA H100", "gpu_driver": "550.1", "model_path": "/models/x",
         "model_revision": "abc123", "hostnames": ["node-a", "node-b"]}))
    led.close()
    env = section(report.build_report(out), "environment")
    assert "9.9.9-recorded" in env and "8 x NVIDIA H100" in env and "abc123" in env and "node-a,node-b" in env
    assert "No provenance was recorded" not in env


def test_plots_cross_flagged_runs_but_not_client_limited_ones(tmp_path):
    from raysweep import plots
    from raysweep.results import results_table

    out = build_output_dir(tmp_path / "out")
    _flag_one_run(out)
    df = results_table(out)
    spec = plots.PlotSpec(var_x="max_concurrency", var_y="median_ttft_ms")
    plans = plots.plan_curves(df, spec)
    crossed = [c for p in plans for row in p.panels for panel in row for c in panel.curves if len(c.flagged)]
    assert sum(len(c.flagged) for c in crossed) == 1
    assert any("fail a validity check" in n for p in plans for n in p.notes)
    fig = plots.render(next(p for p in plans if any(len(c.flagged) for row in p.panels for pa in row
                                                    for c in pa.curves)), spec)
    assert "fails a validity check" in [t.get_text() for t in fig.legends[0].get_texts()]

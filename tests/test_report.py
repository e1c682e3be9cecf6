"""Unit tests for raysweep.report.page and the `report` command, on output dirs made through the ledger API."""

from __future__ import annotations

import base64
import json
import re

import pandas as pd
import pytest
from click.testing import CliRunner
from test_plots import PNG, build_output_dir

from raysweep.cli import main
from raysweep.ledger import Ledger
from raysweep.record.directory import CampaignDir
from raysweep.record.files import write_json_atomic
from raysweep.report import page as report
from raysweep.report import registry

BUILT_IN = ("conclusions", "validity", "figures", "results", "sla", "transport", "failures", "campaign", "plan",
            "environment")


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
    # the answer first, the warnings next, then the figures; the record (campaign, plan, environment) last
    # (sections that other modules register may come between)
    # (transport: no server of this stub has a verdict, so it is named under the conclusions instead)
    assert [sid for sid in sections(html) if sid in BUILT_IN] == [s for s in BUILT_IN if s != "transport"]
    assert "Transport (not checked: no server of this campaign has a transport verdict)" in section(html, "conclusions")
    assert sections(html)[:2] == ["conclusions", "validity"] and sections(html)[-3:] == list(BUILT_IN[-3:])
    assert "http://" not in html and "https://" not in html and "<link" not in html  # nothing to fetch
    # figures: latency against throughput, 3 metric curves, the server metrics, the Pareto front, the SLA bars,
    # all embedded PNGs
    images = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,([^"]+)"', section(html, "figures"))
    assert [alt for alt, _ in images] == [
        "latency against throughput: median_ttft_ms against output_throughput, one point per max_concurrency "
        "(mean of its runs)",
        "output_throughput against max_concurrency", "median_ttft_ms against max_concurrency",
        "p99_ttft_ms against max_concurrency", "server-side metrics against max_concurrency",
        "Pareto front (point means over their runs, 95 % intervals; every run in grey; no dominated ties)",
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
    failures = section(html, "failures")
    assert "1 failed point(s), 1 way(s) of failing" in failures and "CUDA out of memory\nlast log line" in failures
    assert "server died during the point" in failures
    env = section(html, "environment")
    # what the runs recorded, never what is installed where the report is made
    assert "No provenance was recorded" in env and "<td class=\"t\">ray</td>" not in env
    assert "1 node(s), 3 GPU(s) used." in env and "10.0.0.1" in env and "0,1,2" in env


@pytest.fixture
def no_figures(monkeypatch):
    """The report without its figures (they are checked above and below), to keep these tests fast."""
    monkeypatch.setattr(report, "_figure_list", lambda data: [])
    monkeypatch.setattr(report, "_card_figure", lambda data, c, v: "")


def test_transport_verdict_per_server_config_with_evidence_and_recorded_versions(tmp_path, no_figures):
    from raysweep.place.transport import server_verdict

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
    html = report.build_report(CampaignDir(out))
    transport = section(html, "transport")
    assert transport.count("<tr>") == 1 + 2  # one row per server config
    assert "gate (ib)" in transport and "Not checked" not in transport
    rows = {"s16" if "max_num_seqs=16" in r else "s8": r for r in transport.split("<tr>")[2:]}
    assert "IB+GDR" in rows["s16"] and ">ok<" in rows["s16"], rows
    assert ">Socket<" in rows["s8"] and ">refused<" in rows["s8"], rows
    assert "via NET/Socket/0" in transport and "<details>" in transport  # the evidence lines
    # a section with nothing to show is left out, and named with its reason under the conclusions
    assert "sla" not in sections(html) and 'href="#sla"' not in html
    assert "SLA (no SLA search in this campaign)" in section(html, "conclusions")
    env = section(html, "environment")
    assert "recorded with the runs" in env and "0.33.0" in env and "installed where" not in env


def test_a_figure_that_fails_costs_only_itself(tmp_path, monkeypatch):
    out = build_output_dir(tmp_path / "out")

    def broken() -> None:
        raise ValueError("no such thing")

    monkeypatch.setattr(report, "_figure_list", lambda data: [("broken one", broken)])
    html = report.build_report(CampaignDir(out))
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
    html = report.build_report(CampaignDir(out))
    said = section(html, "conclusions")
    assert "No finished run yet." in said
    for title in ("Warnings", "Runs over time", "Figures", "Results", "SLA", "Transport", "Failures"):
        assert f"{title} (" in said, title  # left out, each named with its reason
    assert not {"validity", "drift", "figures", "results", "sla", "transport", "failures"} & set(sections(html))
    assert sections(html)[0] == "conclusions"
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
    html = report.build_report(CampaignDir(out))
    assert sections(html)[:2] == ["conclusions", "validity"]  # the warnings right after the answer
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
    html = report.build_report(CampaignDir(out))
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
    env = section(report.build_report(CampaignDir(out)), "environment")
    assert "9.9.9-recorded" in env and "8 x NVIDIA H100" in env and "abc123" in env and "node-a,node-b" in env
    assert "No provenance was recorded" not in env


def test_plots_cross_flagged_runs_but_not_client_limited_ones(tmp_path):
    from raysweep.report import plots
    from raysweep.results.table import results_table

    out = build_output_dir(tmp_path / "out")
    _flag_one_run(out)
    df = results_table(CampaignDir(out))
    spec = plots.PlotSpec(var_x="max_concurrency", var_y="median_ttft_ms")
    plans = plots.plan_curves(df, spec)
    crossed = [c for p in plans for row in p.panels for panel in row for c in panel.curves if len(c.flagged)]
    assert sum(len(c.flagged) for c in crossed) == 1
    assert any("fail a validity check" in n for p in plans for n in p.notes)
    fig = plots.render(next(p for p in plans if any(len(c.flagged) for row in p.panels for pa in row
                                                    for c in pa.curves)), spec)
    assert "fails a validity check" in [t.get_text() for t in fig.legends[0].get_texts()]


# ---------------------------------------------------------------------------------------------------------
# conclusions: the best config per bench shape, its lead against the noise, fronts, SLA capacities
# ---------------------------------------------------------------------------------------------------------

def _runs_table() -> pd.DataFrame:
    """Three runs per point: config A (2 GPUs) and B (1 GPU), two input lengths, loads 1, 4 and 16, and a
    num_prompts that follows the load; throughput grows as the square root of the load. In shape 128 A makes
    3x B's throughput (1.5x B's per GPU) with a spread of 1 %; in shape 256 both make the same per GPU with a
    spread of 10 %. Run r of every point of a config ran on its server start r (3 starts per config)."""
    rows = []
    for sid, gpus in (("A", 2), ("B", 1)):
        for length in (128, 256):
            for conc in (1, 4, 16):
                base = 100.0 * conc ** 0.5 * (3 if sid == "A" and length == 128 else 1) * (gpus if length == 256 else 1)
                spread = 0.01 if length == 128 else 0.10
                for run, wobble in enumerate((0, -1, 1)):  # not a straight line over the runs: no drift
                    rows.append({
                        "serve_id": sid, "bench_id": f"{length}-{conc}", "point_id": f"{sid}-{length}-{conc}-{run}",
                        "run_number": run, "serve_label": f"cfg={sid}", "bench_label": f"len={length}-c={conc}",
                        "server_id": f"{sid}-start{run}", "random_input_len": length, "max_concurrency": conc,
                        "num_prompts": 8 * conc,
                        "gpu_count": gpus, "tensor_parallel_size": gpus,
                        "output_throughput": base * (1 + spread * wobble),
                        "median_ttft_ms": 10.0 * conc * (1 + spread * wobble), "client_limited": False})
    return pd.DataFrame(rows)


def test_conclusions_name_the_best_config_per_shape_and_judge_its_lead():
    from raysweep.results import conclusions

    df = _runs_table()
    c = conclusions.conclude(df, ["random_input_len", "max_concurrency", "num_prompts"])
    assert c.load == "max_concurrency"
    assert c.shape_keys == ["random_input_len"]  # num_prompts follows the load: not a shape
    verdicts = {v.shape: v for v in c.verdicts}
    assert set(verdicts) == {"random_input_len=128", "random_input_len=256"}
    clear = verdicts["random_input_len=128"]
    assert clear.leader["serve_id"] == "A" and clear.leader["max_concurrency"] == 16
    assert clear.runner_up["serve_id"] == "B" and clear.runner_up["max_concurrency"] == 16
    assert clear.leader["objective_mean"] == pytest.approx(1200 / 2)  # per GPU: A has 2
    assert clear.lead == pytest.approx(0.5) and clear.significant is True
    tied = verdicts["random_input_len=256"]
    assert tied.lead == pytest.approx(0.0, abs=1e-9) and tied.significant is False
    assert "better than every other config" in conclusions.verdict_text(clear) and clear.clear
    assert tied.tied == ["cfg=B"] and "not shown better: tied with the leader: cfg=B" in \
        conclusions.verdict_text(tied) and not tied.clear
    assert all("noise" not in conclusions.verdict_text(v) for v in (clear, tied))
    lines = conclusions.headlines(c)
    assert lines[0].startswith("Best for random_input_len=128: deploy cfg=A at max_concurrency=16: "
                               "output_throughput_per_gpu 600.0 tok/s [")
    assert "50 % more than cfg=B at max_concurrency=16 [+" in lines[0]
    assert lines[0].endswith("shown better than every other configuration (t over server starts)")
    # the Pareto front of each shape, from the point means: per user falls as per GPU rises with the load
    front = c.fronts["random_input_len=128"]
    assert list(front["serve_label"]) == ["cfg=A"] * 3 and list(front["max_concurrency"]) == [16, 4, 1]


def test_conclusions_for_another_objective_and_with_one_run():
    from raysweep.results import conclusions

    df = _runs_table()
    raw = conclusions.conclude(df, ["random_input_len", "max_concurrency"], objective="output_throughput")
    clear = {v.shape: v for v in raw.verdicts}["random_input_len=128"]
    assert clear.lead == pytest.approx(2.0)  # 3x B's throughput when GPUs are not counted
    fast = conclusions.conclude(df, ["random_input_len", "max_concurrency"], objective="median_ttft_ms")
    assert not fast.objective.maximize  # a latency: lower is better
    assert all(v.leader["max_concurrency"] == 1 for v in fast.verdicts)
    one = conclusions.conclude(df[df["run_number"] == 0], ["random_input_len", "max_concurrency"])
    assert all(v.significant is None for v in one.verdicts)
    # one run of each config: one server start each, ranked with its reason and never a p-value
    assert conclusions.verdict_text(one.verdicts[0]).startswith("not compared: one server start each")
    assert all(v.p_value is None for v in one.verdicts)


@pytest.mark.parametrize("objective, words", [
    ("throughput", ["--objective throughput", "no such aggregated metric", "did you mean", "output_throughput"]),
    ("min:medain_ttft_ms", ["--objective min:medain_ttft_ms", "did you mean median_ttft_ms"]),
    ("sideways:output_throughput", ["--objective sideways:output_throughput", "max:METRIC or min:METRIC"]),
])
def test_a_wrong_objective_is_a_user_error(tmp_path, no_figures, objective, words):
    out = build_output_dir(tmp_path / "out")
    result = CliRunner().invoke(main, ["report", str(out), "--objective", objective])
    assert result.exit_code == 2, result.output
    assert all(w in result.output for w in words), result.output
    assert not (out / "report.html").exists()


def test_report_leads_with_the_conclusions_and_prints_them(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "_figure_list", lambda data: [])
    out = build_output_dir(tmp_path / "out", sla=True)
    result = CliRunner().invoke(main, ["report", str(out), "--objective", "output_throughput"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].endswith("report.html")
    assert [ln.split(":")[0] for ln in lines[1:]] == ["Best for random_input_len=128", "Best for random_input_len=256"]
    html = (out / "report.html").read_text()
    top = section(html, "conclusions")
    assert top.count('class="card"') == 2 and "Best measured: <b>max_num_seqs=16 at max_concurrency=8</b>" in top
    assert top.count('<img alt="median_ttft_ms against output_throughput') == 2  # a curve figure per card
    assert "Pareto front" in top and "SLA capacities" in top
    # SLA capacities: per bench point and target, the unbounded config first, the one that never met it last
    sla_rows = top.split("SLA capacities", 1)[1]
    assert sla_rows.index("above max") < sla_rows.index("found")


def fragment_section(data):
    return f"<p>made from {data.output_dir.name}</p>"


def no_such_section(data):
    return report._no_such_function(data)


def test_sections_registered_by_other_modules(tmp_path, no_figures, monkeypatch):
    out = build_output_dir(tmp_path / "out")
    mine = {sid: registry.SECTIONS.get(sid) for sid in registry.SECTIONS if sid in BUILT_IN}
    monkeypatch.setattr(registry.SECTIONS, "_items", mine)   # only the built-in ones, then three registered after
    registry.register(registry.Section("extra", "Extra", fragment_section, order=45))     # after Figures (40)
    registry.register(registry.Section("absent", "Absent", no_such_section, order=46))
    registry.register(registry.Section("nothing", "Nothing", lambda data: None, order=47))
    html = report.build_report(CampaignDir(out))
    assert sections(html)[:5] == ["conclusions", "validity", "figures", "extra", "absent"]
    assert "nothing" not in sections(html) and '<a href="#nothing">' not in html  # None: left out
    assert "<p>made from out</p>" in section(html, "extra") and '<a href="#extra">Extra</a>' in html
    assert "This section could not be made: AttributeError" in section(html, "absent")  # costs only itself
    assert sections(html)[-1] == "environment"

"""The conclusions' verdicts (raysweep.results.conclusions and the report's cards): the leader tested against every
config with Holm, runs left out and counted, failed requests ranking a latency objective last, the slo
ranking only the points that meet it, the knee beside the raw maximum. Synthetic run tables; no Ray."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest
from test_plots import build_output_dir
from test_report import no_figures, section  # noqa: F401 (fixture)

from raysweep.record.directory import CampaignDir
from raysweep.record.files import write_json_atomic
from raysweep.report import page as report
from raysweep.results import conclusions
from raysweep.sla.search import parse_slo

SHAPE = ["random_input_len", "max_concurrency"]


def runs(configs: dict[str, list[tuple[int, float, float, float]]], n: int = 4, spread: float = 0.01,
         seed: int = 0, per_start: int = 1, **extra_by_cfg: dict) -> pd.DataFrame:
    """Runs of each config at (concurrency, throughput, p99 TTFT ms, median E2EL ms) points, n runs each with
    a relative spread, `per_start` runs on each server start (the default: every run on a start of its own)."""
    rng = np.random.default_rng(seed)
    rows = []
    for cfg, pts in configs.items():
        for conc, thr, ttft, e2el in pts:
            for r in range(n):
                w = 1 + spread * rng.standard_normal()
                rows.append({"serve_id": cfg, "bench_id": f"c{conc}", "point_id": f"{cfg}-{conc}-{r}",
                             "server_id": f"{cfg}-start{r // per_start}",
                             "run_number": r, "serve_label": f"cfg={cfg}", "bench_label": f"c={conc}",
                             "random_input_len": 128, "max_concurrency": conc, "gpu_count": 1,
                             "output_throughput": thr * w, "p99_ttft_ms": ttft * w, "median_ttft_ms": ttft / 2 * w,
                             "median_tpot_ms": 10.0 * w, "p99_tpot_ms": 20.0 * w, "median_e2el_ms": e2el * w,
                             "completed": 100, "failed": 0, "client_limited": False, "validity_ok": True,
                             "validity_issues": "", **extra_by_cfg.get(cfg, {})})
    return pd.DataFrame(rows)


def test_every_config_not_shown_behind_the_leader_is_named_tied():
    df = runs({"A": [(8, 1000.0, 100.0, 500.0)], "B": [(8, 999.0, 100.0, 500.0)], "C": [(8, 998.0, 100.0, 500.0)],
               "D": [(8, 700.0, 100.0, 500.0)]})
    v = conclusions.conclude(df, SHAPE, objective="output_throughput").verdicts[0]
    assert set(v.tied) <= {"cfg=A", "cfg=B", "cfg=C"} and len(v.tied) == 2 and not v.clear
    assert "tied with the leader" in conclusions.verdict_text(v) and "cfg=D" not in v.tied


def test_a_config_failing_30_percent_of_requests_cannot_win_on_p99_ttft():
    df = runs({"A": [(8, 1000.0, 200.0, 500.0)], "B": [(8, 1000.0, 50.0, 500.0)]})
    df.loc[df["serve_id"] == "B", ["completed", "failed"]] = [70, 30]
    c = conclusions.conclude(df, SHAPE, objective="p99_ttft_ms")
    v = c.verdicts[0]
    assert v.leader["serve_id"] == "A" and list(v.ranking["serve_id"]) == ["A", "B"]
    assert bool(v.ranking.iloc[1]["failed_last"])
    # without failures B would lead
    ok = conclusions.conclude(runs({"A": [(8, 1000.0, 200.0, 500.0)], "B": [(8, 1000.0, 50.0, 500.0)]}), SHAPE,
                              objective="p99_ttft_ms")
    assert ok.verdicts[0].leader["serve_id"] == "B"


def test_client_limited_and_flagged_runs_are_left_out_and_the_verdict_is_not_green():
    df = runs({"A": [(8, 1000.0, 100.0, 500.0)], "B": [(8, 500.0, 100.0, 500.0)]}, n=5)
    # one run of A flagged with a huge throughput: left out, so the mean is A's clean runs
    i = df.index[df["serve_id"] == "A"][0]
    df.loc[i, ["output_throughput", "validity_ok", "validity_issues"]] = [10_000.0, False, "shared CPUs"]
    v = conclusions.conclude(df, SHAPE, objective="output_throughput").verdicts[0]
    assert v.leader["objective_mean"] == pytest.approx(1000.0, rel=0.03)
    assert v.leader["runs"] == 4 and v.leader["runs_left_out"] == 1 and v.leader["left_out_reasons"] == "shared CPUs 1"
    assert v.significant is True and v.flagged and not v.clear


def test_with_an_slo_only_points_that_meet_it_are_ranked():
    df = runs({"A": [(8, 800.0, 100.0, 500.0), (32, 2000.0, 900.0, 2000.0)],
               "B": [(8, 900.0, 120.0, 500.0), (32, 1900.0, 800.0, 2000.0)]})
    raw = conclusions.conclude(df, SHAPE[:1], objective="output_throughput").verdicts[0]
    assert raw.leader["serve_id"] == "A" and raw.leader["max_concurrency"] == 32
    slo = parse_slo({"p99_ttft_ms": 500})
    c = conclusions.conclude(df, SHAPE[:1], objective="output_throughput", slo=slo)
    v = c.verdicts[0]
    assert v.slo_met is True and v.leader["serve_id"] == "B" and v.leader["max_concurrency"] == 8
    assert "shown to meet the slo p99_ttft_ms<=500" in conclusions.headlines(c)[0]
    none = conclusions.conclude(df, SHAPE[:1], objective="output_throughput", slo=parse_slo({"p99_ttft_ms": 10}))
    line = conclusions.headlines(none)[0]
    assert none.verdicts[0].slo_met is False and "is shown to meet the slo p99_ttft_ms<=10" in line
    assert line.startswith("No point of") and "nearest: cfg=A at max_concurrency=8: p99_ttft_ms" in line
    assert "Best for" not in line   # no winner is named when none is shown to meet the slo


def test_a_point_whose_interval_lies_across_the_bound_is_not_shown_to_meet_it():
    # both configs' p99 TTFT averages 495 ms against a bound of 500: their means meet it, their intervals
    # do not lie inside it
    df = runs({"A": [(8, 1000.0, 495.0, 500.0)], "B": [(8, 1100.0, 495.0, 500.0)]}, n=4, spread=0.03)
    c = conclusions.conclude(df, SHAPE[:1], objective="output_throughput", slo=parse_slo({"p99_ttft_ms": 500}))
    v = c.verdicts[0]
    assert v.slo_met is False and v.runner_up is None and not v.clear
    assert set(c.points["slo_verdict"]) == {"not shown"}
    assert "95% CI" in v.nearest and "against <=500: not shown" in v.nearest
    met = conclusions.conclude(df, SHAPE[:1], objective="output_throughput", slo=parse_slo({"p99_ttft_ms": 600}))
    assert set(met.points["slo_verdict"]) == {"met"} and met.verdicts[0].leader["serve_id"] == "B"


def test_a_drift_decides_only_where_it_is_as_large_as_the_lead_shown():
    df = runs({"A": [(8, 1100.0, 100.0, 500.0)], "B": [(8, 900.0, 100.0, 500.0)]}, n=5, spread=0.002)
    a = df["serve_id"] == "A"
    df.loc[a, "output_throughput"] = df.loc[a, "output_throughput"] * (1 - 0.02 * df.loc[a, "run_number"])
    v = conclusions.conclude(df, SHAPE[:1], objective="output_throughput").verdicts[0]
    # A drifts 2 %/run (8 % over its window), far less than the part of its +17 % lead the interval shows
    assert v.leader["serve_id"] == "A" and v.drifting and v.significant and v.clear
    assert "drift over their order" in conclusions.verdict_text(v)
    # a drift of 1 %/run (4 % over the window) against a lead of about 3 %: shown better by the test, but the
    # drift could have made that verdict, which is not shown
    close = runs({"A": [(8, 1000.0, 100.0, 500.0)], "B": [(8, 950.0, 100.0, 500.0)]}, n=5, spread=0.002)
    a = close["serve_id"] == "A"
    close.loc[a, "output_throughput"] = close.loc[a, "output_throughput"] * (1 - 0.01 * close.loc[a, "run_number"])
    w = conclusions.conclude(close, SHAPE[:1], objective="output_throughput").verdicts[0]
    assert w.leader["serve_id"] == "A" and w.drifting and not w.significant and not w.clear
    assert "a drift in their runs is as large as the lead" in conclusions.verdict_text(w)


def test_one_server_start_each_is_ranked_but_not_compared():
    # +20 % with a 1 % spread, but all 4 runs of each config on one server start: no replicate of a start
    df = runs({"A": [(8, 1200.0, 100.0, 500.0)], "B": [(8, 1000.0, 100.0, 500.0)]}, n=4, per_start=4)
    c = conclusions.conclude(df, SHAPE[:1], objective="output_throughput")
    v = c.verdicts[0]
    assert v.leader["serve_id"] == "A" and v.lead == pytest.approx(0.2, rel=0.05)   # measured and ranked
    assert v.significant is None and not v.clear and v.p_value is None
    assert conclusions.verdict_text(v).startswith("not compared: one server start each")
    # two starts of 2 runs each: a verdict over the starts, the lead with its interval at its level
    two = conclusions.conclude(runs({"A": [(8, 1200.0, 100.0, 500.0)], "B": [(8, 1000.0, 100.0, 500.0)]}, n=4,
                                    per_start=2), SHAPE[:1], objective="output_throughput").verdicts[0]
    assert two.test == "t over server starts" and two.against is not None and two.against.level == 0.95
    assert two.against.low > 1.0 and two.significant and two.clear
    assert re.match(r"lead \+(19|20)\.\d % \[\+\d+\.\d, \+\d+\.\d %\] at 95 %; better", conclusions.verdict_text(two))


def test_a_config_whose_runs_are_all_flagged_is_never_the_leader():
    df = runs({"A": [(8, 2000.0, 100.0, 500.0)], "B": [(8, 1000.0, 100.0, 500.0)]}, n=4)
    df.loc[df["serve_id"] == "A", ["validity_ok", "validity_issues"]] = [False, "shared CPUs"]
    v = conclusions.conclude(df, SHAPE[:1], objective="output_throughput").verdicts[0]
    assert v.leader["serve_id"] == "B" and list(v.ranking["serve_id"]) == ["B", "A"] and not v.all_flagged
    df["validity_ok"], df["validity_issues"] = False, "shared CPUs"
    every = conclusions.conclude(df, SHAPE[:1], objective="output_throughput").verdicts[0]
    assert every.all_flagged and not every.clear
    assert conclusions.verdict_text(every).startswith("no leader: every configuration's runs failed a check")


def test_the_knee_is_named_beside_the_raw_maximum():
    df = runs({"A": [(1, 100.0, 10.0, 100.0), (8, 700.0, 20.0, 180.0), (64, 900.0, 900.0, 2500.0)]})
    v = conclusions.conclude(df, SHAPE[:1], objective="output_throughput").verdicts[0]
    assert v.leader["max_concurrency"] == 64
    assert v.knee is not None and v.knee["max_concurrency"] == 8 and "median_e2el_ms <= 200" in v.knee_bound


def test_the_card_says_how_many_runs_back_the_leader_its_latencies_and_groups_warnings(tmp_path, no_figures):
    out = build_output_dir(tmp_path / "out")
    paths = sorted((out / "points").rglob("run=*.json"))
    for path, issues in zip(paths[:3], ("shared CPUs", "shared CPUs; not steady (slope +3.0 %/s)", "niced (server 5)")):
        rec = json.loads(path.read_text())
        rec.update(validity_ok=False, validity_issues=issues)
        write_json_atomic(path, rec)
    html = report.build_report(CampaignDir(out), objective="output_throughput")
    card = section(html, "conclusions")
    assert re.search(r"on 1 server start\(s\), \d run\(s\)", card) and "At this point: median_ttft" in card
    assert "Knee (best among points with" in card and "not compared: one server start each" in card
    warn = section(html, "validity")
    assert "<summary class=\"flag\">shared CPUs: 2 run(s)</summary>" in warn
    assert "not steady: 1 run(s)" in warn and "niced: 1 run(s)" in warn


def test_a_flagged_run_is_marked_in_the_figures_with_its_checks_name(tmp_path):
    from raysweep.report import plots
    from raysweep.results.table import results_table

    out = build_output_dir(tmp_path / "out")
    path = sorted((out / "points").rglob("run=*.json"))[0]
    rec = json.loads(path.read_text())
    rec.update(client_limited=False, validity_ok=False, validity_issues="shared CPUs; not steady (slope +3.0 %/s)")
    write_json_atomic(path, rec)
    spec = plots.PlotSpec(var_x="max_concurrency", var_y="median_ttft_ms")
    plan = next(p for p in plots.plan_curves(results_table(CampaignDir(out)), spec)
                if any(len(c.flagged) for row in p.panels for pa in row for c in pa.curves))
    fig = plots.render(plan, spec)
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert "shared CPUs, not steady" in texts


def test_the_report_ranks_under_the_campaigns_slo(tmp_path, no_figures):
    from raysweep.ledger import Ledger

    out = build_output_dir(tmp_path / "out")
    led = Ledger.open_existing(out)
    try:
        campaign = led.stored_campaign()
        led.set_meta("campaign", json.dumps({**campaign, "slo": {"median_ttft_ms": 0.001}}))
    finally:
        led.close()
    path, lines = report.write_report_with_headlines(CampaignDir(out), objective="output_throughput")
    card = section(path.read_text(), "conclusions")
    assert "Only points shown to meet the campaign's service-level objective" in card
    assert "No point of this shape is shown to meet the service-level objective median_ttft_ms&lt;=0.001" in card
    assert lines and all("is shown to meet the slo median_ttft_ms<=0.001" in line for line in lines)


def test_a_latency_bound_is_judged_on_the_pooled_requests_percentile_where_it_is_known():
    slo = parse_slo({"p99_ttft_ms": 500})
    # the mean of per-run p99s (and its interval) under the bound, the pooled requests' p99 above it
    row = pd.Series({"p99_ttft_ms_mean": 450.0, "p99_ttft_ms_ci_low": 430.0, "p99_ttft_ms_ci_high": 470.0,
                     "p99_ttft_ms_pooled": 540.0, "p99_ttft_ms_pooled_ci_low": 510.0,
                     "p99_ttft_ms_pooled_ci_high": 580.0})
    word, text, excess = conclusions.slo_judgement(row, slo)
    assert word == "missed" and "pooled requests" in text and excess == pytest.approx(0.08)
    unpooled = row.drop(["p99_ttft_ms_pooled", "p99_ttft_ms_pooled_ci_low", "p99_ttft_ms_pooled_ci_high"])
    word, text, _ = conclusions.slo_judgement(unpooled, slo)
    assert word == "met" and "mean of runs" in text


def _blocks(drift_a: float, drift_b: float, lead: float = 0.2, starts: int = 6) -> pd.DataFrame:
    """Two configurations on `starts` starts each in interleaved blocks (A B | B A ...), 2 runs a start, the
    machine or each server drifting by `drift_*` per slot."""
    rng = np.random.default_rng(21)
    rows, t = [], 0
    for b in range(starts):
        for cfg in (("A", "B") if b % 2 == 0 else ("B", "A")):
            effect = 1 + 0.03 * rng.standard_normal()
            for j in range(2):
                level = 1000.0 * (1 + lead if cfg == "B" else 1.0) * effect * (1 + 0.01 * rng.standard_normal())
                level *= 1 + (drift_a if cfg == "A" else drift_b) * t
                rows.append({"serve_id": cfg, "bench_id": "c8", "point_id": f"{cfg}-{b}-{j}", "run_number": 2 * b + j,
                             "server_id": f"{cfg}-{b}", "started_at": float(t), "serve_label": f"cfg={cfg}",
                             "bench_label": "c=8", "random_input_len": 128, "max_concurrency": 8, "gpu_count": 1,
                             "output_throughput": level, "validity_ok": True, "client_limited": False})
                t += 1
    return pd.DataFrame(rows)


def test_a_drift_both_configurations_share_does_not_withhold_the_verdict_one_of_their_own_does():
    shared = conclusions.conclude(_blocks(-0.012, -0.012), SHAPE[:1], objective="output_throughput").verdicts[0]
    assert shared.leader["serve_id"] == "B" and shared.significant and shared.clear
    assert shared.leader["objective_drift_p"] < 0.05             # each drifts, and shows it
    own = conclusions.conclude(_blocks(-0.012, 0.0), SHAPE[:1], objective="output_throughput").verdicts[0]
    assert own.against.word == "better" and not own.significant and not own.clear

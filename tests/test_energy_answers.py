"""Energy and cost on the answers: aggregated with their intervals across runs, the cheapest configuration
under the slo named beside the fastest, the SLA table's cheapest configuration meeting the bound, the
report's Energy and cost section (and why it is empty), the Pareto front of J/token against tokens/s per
user, a cost objective in tune needing `cost:`. Synthetic run tables; no Ray."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from test_conclusions_verdicts import SHAPE, runs
from test_report import no_figures  # noqa: F401 (fixture)

from raysweep.record.directory import CampaignDir
from raysweep.report import energy as energy_report
from raysweep.results import aggregate, conclusions
from raysweep.sla.search import parse_slo


def _priced(df: pd.DataFrame, usd_per_hour: dict[str, float], joules: dict[str, float]) -> pd.DataFrame:
    """Each run's cost and energy per output token from its throughput: hour price over tokens per hour."""
    price = df["serve_id"].map(usd_per_hour)
    return df.assign(cost_per_m_output_tokens=price / 3600 / df["output_throughput"] * 1e6,
                     j_per_output_token=df["serve_id"].map(joules), energy_j=1.0)


def test_energy_and_cost_are_aggregated_with_their_interval_across_runs():
    df = _priced(runs({"A": [(8, 1000.0, 100.0, 500.0)]}, n=4), {"A": 3.6}, {"A": 0.5})
    s = aggregate.summarize(df)
    row = s.iloc[0]
    assert row["cost_per_m_output_tokens_mean"] == pytest.approx(1.0, rel=0.05)
    assert row["cost_per_m_output_tokens_ci_low"] < row["cost_per_m_output_tokens_mean"] < \
        row["cost_per_m_output_tokens_ci_high"]
    assert row["j_per_output_token_mean"] == 0.5


def test_the_cheapest_config_under_the_slo_is_named_beside_the_fastest():
    # A is fastest (1000 tok/s at 8 GPU-$/h), B slower but cheaper per token (600 tok/s at 2 $/h),
    # C cheapest of all but breaks the slo (p99 TTFT 900 ms)
    df = runs({"A": [(8, 1000.0, 100.0, 500.0)], "B": [(8, 600.0, 200.0, 500.0)], "C": [(8, 500.0, 900.0, 500.0)]})
    df = _priced(df, {"A": 8.0, "B": 2.0, "C": 1.0}, {"A": 1.0, "B": 0.8, "C": 0.5})
    c = conclusions.conclude(df, SHAPE, objective="output_throughput", slo=parse_slo({"p99_ttft_ms": 500}))
    v = c.verdicts[0]
    assert v.leader["serve_id"] == "A" and v.cheapest["serve_id"] == "B"
    assert v.cheapest_metric == "cost_per_m_output_tokens"
    assert v.cheapest["cost_per_m_output_tokens_mean"] == pytest.approx(2.0 / 3600 / 600 * 1e6, rel=0.05)
    assert v.cheapest_tied == []  # A costs 2.4 times as much: shown (Welch's t over 4 runs each)
    lines = conclusions.headlines(c)
    assert any(line.startswith("Cheapest for") and "cfg=B" in line and "under the slo" in line for line in lines)
    # without a price, the least energy per output token
    no_cost = df.drop(columns="cost_per_m_output_tokens")
    v = conclusions.conclude(no_cost, SHAPE, objective="output_throughput").verdicts[0]
    assert v.cheapest_metric == "j_per_output_token" and v.cheapest["serve_id"] == "C"
    assert conclusions.conclude(runs({"A": [(8, 1.0, 1.0, 1.0)]}), SHAPE).verdicts[0].cheapest is None
    # two configs whose costs differ by 0.1 % with a 1 % spread over 4 runs: not shown to differ, and said so
    close = _priced(runs({"A": [(8, 1000.0, 100.0, 500.0)], "B": [(8, 1000.0, 100.0, 500.0)]}, seed=3),
                    {"A": 2.0, "B": 2.002}, {"A": 1.0, "B": 1.0})
    v = conclusions.conclude(close, SHAPE, objective="output_throughput").verdicts[0]
    assert len(v.cheapest_tied) == 1 and "not shown to cost less than" in conclusions.cheapest_text(v)


def test_cost_and_energy_objectives_are_minimised():
    names = ["cost_per_m_output_tokens", "j_per_output_token", "output_tokens_per_j"]
    assert not conclusions.parse_objective("cost_per_m_output_tokens", names).maximize
    assert not conclusions.parse_objective("j_per_output_token", names).maximize
    assert conclusions.parse_objective("output_tokens_per_j", names).maximize


def test_the_sla_table_marks_the_cheapest_config_meeting_the_bound():
    sla = pd.DataFrame([{"serve_id": s, "serve_label": f"cfg={s}", "bench_id": "b", "bench_label": "in=128",
                         "target": "p99_ttft_ms<=500", "state": "done", "largest_pass": cap}
                        for s, cap in (("A", 32.0), ("B", 16.0), ("C", None))])
    df = pd.DataFrame([{"serve_id": s, "sla_base_id": "b", "sla_value": v, "cost_per_m_output_tokens": cost}
                       for s, v, cost in (("A", 32.0, 2.0), ("A", 32.0, 2.2), ("A", 16.0, 3.0), ("B", 16.0, 1.5),
                                          ("B", 8.0, 9.0))])
    table = conclusions._sla_capacities(sla, df)
    assert list(table["serve_id"]) == ["A", "B", "C"]  # still ranked by capacity
    assert table["cost_per_m_output_tokens_at_pass"].iloc[0] == pytest.approx(2.1)
    assert table["cost_per_m_output_tokens_at_pass"].iloc[1] == 1.5 and math.isnan(
        table["cost_per_m_output_tokens_at_pass"].iloc[2])
    assert list(table["cheapest"]) == [False, True, False]


def test_the_pareto_front_of_energy_per_token_against_tokens_per_user():
    pts = pd.DataFrame({"tokens_per_user": [10.0, 20.0, 30.0, 25.0], "j_per_output_token": [0.5, 0.7, 1.2, 1.5]})
    f = energy_report.front(pts, "j_per_output_token")
    assert list(f["tokens_per_user"]) == [10.0, 20.0, 30.0]  # 25 tok/s at 1.5 J is beaten by 30 at 1.2


def test_a_cost_objective_in_tune_needs_a_cost_block(tmp_path):
    from test_campaign import dry_run, write_campaign

    data = {"name": "t", "runs": 1, "serve": {"cmd": "vllm serve m"},
            "bench": {"backend": "native", "cmd": "vllm bench serve --model m --max-concurrency 4",
                      "params": [{"random_input_len": 16}]},
            "tune": {"space": {"max_num_seqs": {"choices": [4, 8]}}, "budget": {"candidates": 2},
                     "objective": {"metric": "cost_per_m_output_tokens", "direction": "minimize"}}}
    res = dry_run(write_campaign(tmp_path, data))
    assert res.exit_code == 2 and "tune.objective.metric" in res.output and "needs a cost: section" in res.output


def test_the_reports_energy_section_says_why_it_is_empty_then_shows_the_points(tmp_path, no_figures):
    import json

    from click.testing import CliRunner
    from test_plots import build_output_dir
    from test_report import section

    from raysweep.cli import main
    from raysweep.ledger import Ledger
    from raysweep.record.files import write_json_atomic
    from raysweep.report import page as report

    out = build_output_dir(tmp_path / "out")
    html = section(report.write_report(CampaignDir(out)).read_text(), "energy")
    assert "No energy was measured" in html and "absent, not zero" in html
    assert "no <code>cost:</code> block" in html
    for path in sorted(out.glob("points/*/*/run=*.json")):
        rec = json.loads(path.read_text())
        rec.update(energy_j=800.0, j_per_output_token=0.25 + 0.01 * rec.get("run_number", 0),
                   energy_method="counter", energy_window="steady", cost_per_m_output_tokens=1.5)
        write_json_atomic(path, rec)
    led = Ledger.open_existing(out)
    campaign = {**led.stored_campaign(), "cost": {"gpu_hour": 2.0}}
    led.set_meta("campaign", json.dumps(campaign))
    led.close()
    html = section(report.write_report(CampaignDir(out)).read_text(), "energy")
    assert "J / output token" in html and "cost / M output tokens" in html and "steady" in html
    assert "No energy was measured" not in html and "campaign held" in html and " USD" in html
    status = CliRunner().invoke(main, ["status", str(out)])
    assert status.exit_code == 0, status.output
    assert "spent:" in status.output and "GPU-hour(s)" in status.output and "USD" in status.output
    doc = json.loads(CliRunner().invoke(main, ["status", str(out), "--json"]).output)
    assert doc["spend"]["servers"] == 2 and doc["spend"]["currency"] == "USD"
    assert doc["spend"]["cost"] == pytest.approx(doc["spend"]["gpu_hours"] * 2.0)


def test_compare_judges_energy_and_cost_per_token_lower_is_better():
    from raysweep.results.compare import DEFAULT_METRICS, higher_is_better

    assert not higher_is_better("j_per_output_token") and not higher_is_better("cost_per_m_output_tokens")
    assert not higher_is_better("net_j_per_total_token") and higher_is_better("output_tokens_per_j")
    assert {"j_per_output_token", "cost_per_m_output_tokens"} <= set(DEFAULT_METRICS)


def test_raysweep_pareto_draws_the_front_of_energy_per_token_against_tokens_per_user(tmp_path):
    from click.testing import CliRunner
    from test_plots import build_output_dir

    from raysweep.cli import main
    from raysweep.results.front import pareto
    from raysweep.results.table import results_table

    out = build_output_dir(tmp_path / "out")
    df = results_table(CampaignDir(out))
    # per run, J per output token rising with the concurrency: the front trades it against speed per user
    df = df.assign(j_per_output_token=0.1 * pd.to_numeric(df["max_concurrency"]) + 0.001 * df.index)
    r = pareto(df, y="j_per_output_token")
    assert r.y == "j_per_output_token" and r.y_label == "J per output token" and len(r.front)
    pts = r.points[~r.points["client_limited"]]
    for _, f in r.front.iterrows():  # nothing beats a front run on both axes
        assert not ((pts["tokens_per_user"] >= f["tokens_per_user"]) & (pts["j_per_output_token"] <
                                                                          f["j_per_output_token"])).any()
    with pytest.raises(Exception, match="--y"):
        pareto(df, y="watts")
    res = CliRunner().invoke(main, ["pareto", str(out), "--y", "j_per_output_token", "--dry-run"])
    assert res.exit_code == 2 and "--y" in res.output  # the recorded runs measured no energy: named, refused


def test_raysweep_sla_shows_the_cost_at_each_largest_pass_and_the_cheapest(tmp_path):
    import json

    from click.testing import CliRunner
    from test_plots import build_output_dir

    from raysweep.cli import main
    from raysweep.record.files import write_json_atomic

    out = build_output_dir(tmp_path / "out", sla=True)  # s8 passes p99_ttft_ms<=10 up to 4, s16 at any load
    for path in out.glob("points/s8/b128-4/run=*.json"):  # s8's probe at 4 (as an SLA search records it)
        rec = json.loads(path.read_text())
        rec.update(sla_base_id="b128-1", sla_value=4.0, cost_per_m_output_tokens=1.5 + rec["run_number"])
        write_json_atomic(path, rec)
    res = CliRunner().invoke(main, ["sla", str(out), "--json"])
    assert res.exit_code == 0, res.output
    rows = {(r["serve_id"], r["target"]): r for r in json.loads(res.output)["searches"]}
    found = rows[("s8", "p99_ttft_ms<=10")]
    assert found["cost_per_m_output_tokens_at_pass"] == 2.0 and found["cheapest"] is True
    assert rows[("s16", "p99_ttft_ms<=10")]["cost_per_m_output_tokens_at_pass"] is None
    text = CliRunner().invoke(main, ["sla", str(out)]).output
    assert "cost_per_m_output_tokens" in text and "cheapest" in text

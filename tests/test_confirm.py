"""The winner confirmed (raysweep.confirm): its settings and bad input, the verdict from fresh runs, and on the
stand-in servers a campaign that re-measures its leader and runner-up in AB BA order after the sweep, records
the pairs in the ledger, takes its headline from them and resumes without running anything twice."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from click.testing import CliRunner
from helpers import standin_campaign

from raysweep.campaign import load_campaign
from raysweep.cli import main
from raysweep.confirm.runs import ConfirmSpec, confirm_bench_id, dry_run_lines, wanted
from raysweep.confirm.verdict import confirmed_verdict
from raysweep.errors import CampaignError
from raysweep.ledger import Ledger
from raysweep.plan.estimate import estimate
from raysweep.plan.plan import build_plan
from raysweep.record.directory import CampaignDir


def _campaign(tmp_path: Path, confirm=None, **fields) -> Path:
    f = standin_campaign(tmp_path, serve_params={"grid": {"max_num_seqs": [4, 8]}},
                         bench_params={"grid": {"max_concurrency": [2, 4]}}, **fields)
    if confirm is not None:
        data = yaml.safe_load(f.read_text())
        data["confirm"] = confirm
        f.write_text(yaml.safe_dump(data))
    return f


def test_the_shorthand_and_the_defaults():
    assert ConfirmSpec.model_validate(True).enabled is True and ConfirmSpec.model_validate(False).enabled is False
    spec = ConfirmSpec()
    assert (spec.enabled, spec.starts, spec.runs, spec.per_arm) == ("auto", 2, 2, 4)


@pytest.mark.parametrize("confirm, field, says", [
    ({"starts": 0}, "confirm.starts", "greater than or equal to 1"),
    ({"runs": "many"}, "confirm.runs", "integer"),
    ({"enabled": "maybe"}, "confirm.enabled", "auto"),
    ({"start": 2}, "confirm", "start"),
])
def test_bad_confirm_is_refused_naming_the_field_and_nothing_is_written(tmp_path, confirm, field, says):
    f = _campaign(tmp_path, confirm)
    with pytest.raises(CampaignError) as err:
        load_campaign(f)
    assert err.value.field.startswith(field) and says in str(err.value)
    res = CliRunner().invoke(main, ["run", str(f)])
    assert res.exit_code == 2 and field in res.output
    assert not (tmp_path / "out").exists()


def test_confirm_true_is_refused_where_there_is_no_sweep_of_servers_to_confirm(tmp_path):
    f = _campaign(tmp_path, True, serve={"url": "http://127.0.0.1:1", "cmd": None, "params": None})
    with pytest.raises(CampaignError, match="^confirm: cannot be used with `serve.url`"):
        load_campaign(f)


def test_auto_confirms_only_where_it_costs_a_quarter_of_the_sweep_and_the_dry_run_says_so(tmp_path):
    small = build_plan(load_campaign(_campaign(tmp_path, runs=1)))  # 4 runs: 4 more starts would cost more
    assert not wanted(small, estimate(small).wall_s)
    assert "Confirmation: off (auto: it would cost more than 25 % of the sweep)" in dry_run_lines(
        small, estimate(small).wall_s)[0]
    assert estimate(small).confirm is None
    (tmp_path / "b").mkdir()
    big = build_plan(load_campaign(_campaign(tmp_path / "b", runs=40)))
    assert wanted(big, estimate(big).wall_s)
    assert "Confirmation: the leader and the runner-up of each bench shape re-measured" in dry_run_lines(
        big, estimate(big).wall_s)[0]
    est = estimate(big)
    assert est.confirm is not None and est.confirm[:2] == (4, 8) and "then the winner's confirmation" in est.text()
    res = CliRunner().invoke(main, ["run", str(tmp_path / "b" / "campaign.yaml"), "--dry-run"])
    assert res.exit_code == 0 and "Confirmation: the leader and the runner-up" in res.output
    (tmp_path / "c").mkdir()
    forced = build_plan(load_campaign(_campaign(tmp_path / "c", True, runs=1)))
    assert wanted(forced, estimate(forced).wall_s) and estimate(forced).confirm is not None


def test_the_verdict_comes_from_the_fresh_starts_and_needs_two_a_side():
    two = (["a", "a", "b", "b"], ["c", "c", "d", "d"])   # 2 fresh starts of 2 runs a side
    c = confirmed_verdict([110, 111, 109, 110], [100, 101, 99, 100], higher_is_better=True, starts=two)
    assert c is not None and c.significant is True and c.lead == pytest.approx(0.10)
    assert c.ci_low < 110 < c.ci_high and "confirmed better on 4 and 4 fresh run(s) on 2 and 2" in c.text()
    assert c.verdict is not None and c.verdict.low > 1.0 and "at 95 %" in c.text()
    same = confirmed_verdict([100, 103, 98, 101], [101, 99, 102, 100], higher_is_better=True, starts=two)
    assert same is not None and same.significant is False and "not confirmed better" in same.text()
    # one fresh start a side, however many runs: not compared, with the reason, never a p-value
    one = confirmed_verdict([110, 111, 110], [100, 101, 100], higher_is_better=True, starts=(["a"] * 3, ["b"] * 3))
    assert one is not None and one.significant is None and one.p_value is None
    assert "not compared: one server start each" in one.text()
    flipped = confirmed_verdict([90, 91, 89], [100, 101, 99], higher_is_better=True,
                                starts=(["a", "b", "c"], ["d", "e", "f"]))
    assert flipped is not None and flipped.significant is False and flipped.lead is not None and flipped.lead < 0


def test_the_conclusions_leave_the_confirmation_out_of_the_ranking_and_take_the_verdict_from_it():
    from raysweep.results.conclusions import conclude, headlines

    rows = []
    for serve, label, base in (("A", "max_num_seqs=8", 110.0), ("B", "max_num_seqs=4", 100.0)):
        for r, noise in enumerate((0.0, 30.0, -30.0)):  # the sweep: too noisy to tell them apart
            rows.append({"serve_id": serve, "bench_id": "b", "serve_label": label, "bench_label": "c=4",
                         "run_number": r, "output_throughput": base + noise, "gpu_count": 1, "server_id": f"{serve}-s"})
        for r, noise in enumerate((0.0, 0.5, -0.5, 0.2)):  # the confirmation: clear
            rows.append({"serve_id": serve, "bench_id": "cb", "serve_label": label, "bench_label": "c=4 (confirmation)",
                         "run_number": r, "output_throughput": base + noise, "gpu_count": 1, "phase": "confirm",
                         "confirms_bench_id": "b", "server_id": f"{serve}-{r % 2}"})
    c = conclude(pd.DataFrame(rows), [])
    (v,) = c.verdicts
    assert len(c.points) == 2 and set(c.points["bench_id"]) == {"b"}  # the confirmation is not a point of its own
    assert v.leader["serve_id"] == "A" and v.confirmation is not None and v.clear
    assert v.confirmation.runs == (4, 4) and v.confirmation.starts == (2, 2)
    # the sweep alone could not tell: one server start each
    assert v.lead == pytest.approx(0.1, abs=0.01) and v.selection.startswith("not compared: one server start each")
    line = headlines(c)[0]
    assert line.startswith("Best for all bench points: deploy max_num_seqs=8: output_throughput_per_gpu 110.0 tok/s [")
    assert "(the confirmation: 2 fresh server start(s), 4 run(s)), 10 % more than max_num_seqs=4 [+" in line
    assert line.endswith("confirmed on fresh servers")
    assert "confirmed better on 4 and 4 fresh run(s)" in headlines(c, verbose=True)[1]   # the test, one step away


def _records(out: Path) -> list[dict]:
    recs = [json.loads(p.read_text()) for p in (out / "points").rglob("run=*.json")]
    return sorted(recs, key=lambda r: r["started_at"])


@pytest.mark.ray
def test_a_campaign_confirms_its_winner_in_ab_ba_order_and_resumes_without_running_twice(gpu_cluster, tmp_path):
    from helpers import run_file

    from raysweep import api
    from raysweep.results.data import answer_of, read_data

    f = _campaign(tmp_path, {"enabled": True, "starts": 2, "runs": 2}, runs=3, placement={"max_servers": 1})
    data = yaml.safe_load(f.read_text())  # the server and the clients on CPUs of their own, as the demo's: runs on
    data["serve"]["cpu_affinity"], data["bench"]["cpu_affinity"] = [0], [1]  # shared CPUs would fail a check
    f.write_text(yaml.safe_dump(data))
    summary, out = run_file(f)
    assert summary.counts["failed"] == 0 and summary.counts["done"] == 12 + 8  # the sweep, then 2 x 2 x 2
    led = Ledger.open_existing(out)
    stored = json.loads(led.meta("confirm") or "{}")
    led.close()
    (lead_s, lead_b, role_a, _), (run_s, run_b, role_b, _) = stored["pairs"]
    assert (role_a, role_b) == ("leader", "runner-up") and lead_s != run_s
    recs = _records(out)
    sweep = [r for r in recs if r.get("phase") != "confirm"]
    fresh = [r for r in recs if r.get("phase") == "confirm"]
    assert len(sweep) == 12 and len(fresh) == 8
    assert max(r["started_at"] for r in sweep) < min(r["started_at"] for r in fresh)  # after the sweep
    starts = list(dict.fromkeys((r["server_id"], r["serve_id"]) for r in fresh))
    assert [s for _, s in starts] == [lead_s, run_s, run_s, lead_s]  # A B B A, each a fresh server
    assert not {sid for sid, _ in starts} & {r["server_id"] for r in sweep}
    assert {(r["serve_id"], r["confirms_bench_id"], r["bench_id"]) for r in fresh} == {
        (lead_s, lead_b, confirm_bench_id(lead_b)), (run_s, run_b, confirm_bench_id(run_b))}
    answer = answer_of(read_data(CampaignDir(out)))
    (v,) = answer.verdicts
    assert v.confirmation is not None and v.confirmation.runs == (4, 4) and v.confirmation.starts == (2, 2)
    assert (v.leader["serve_id"], v.leader["bench_id"]) == (lead_s, lead_b)
    assert set(answer.points["bench_id"]) <= {p for p in {r["bench_id"] for r in sweep}}
    # the headline's verdict is the confirmation's, on its fresh starts (the stand-in's two configurations serve
    # these loads alike, so it is not shown better: the sweep's one start each could not say so)
    said = " ".join(api.load(out).conclusions.headlines)
    assert "confirm" in said, said
    assert "on 4 and 4 fresh run(s) on 2 and 2 server start(s)" in " ".join(answer.answer.lines(verbose=True))
    # a resume: nothing left; a confirmation run lost (pending again) is the only one that runs
    summary, _ = run_file(f)
    assert summary.counts["done"] == 20
    led = Ledger.open_existing(out)
    lost = next(p for p in led.points() if p.bench_id == confirm_bench_id(run_b))
    led.mark_pending(lost.point_id)
    led.close()
    (out / lost.result_path).unlink()
    summary, _ = run_file(f)
    assert summary.counts["done"] == 20 and summary.counts["pending"] == 0
    led = Ledger.open_existing(out)
    assert all(p.attempts == 1 for p in led.points() if p.point_id != lost.point_id)
    assert json.loads(led.meta("confirm") or "{}")["pairs"] == stored["pairs"]  # the same pairs, not chosen again
    led.close()

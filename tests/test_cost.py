"""The campaign's `cost:` block: $ per million tokens per point against a hand calculation, the price by GPU
type, node type or default, power priced by measured energy or provisioned power, the campaign's own spend
from the ledger, and a bad block refused with exit 2 naming the field."""

from __future__ import annotations

import json

import pytest
from test_campaign import dry_run, modified, write_campaign

from raysweep.campaign import CostSpec
from raysweep.ledger import Ledger
from raysweep.plan import cost

RUN = {"gpu_count": 2, "num_nodes": 1, "provenance_gpu": "8 x NVIDIA H100 80GB HBM3",
       "output_throughput": 1000.0, "total_token_throughput": 4000.0}


def test_cost_per_million_tokens_matches_a_hand_calculation():
    c = CostSpec(gpu_hour={"H100": 3.0, "default": 1.0})
    f = cost.point_cost_fields(c, RUN)
    # 2 GPUs x 3.00/h = 6.00/h; 1000 output tokens/s = 3.6 M per hour: 6 / 3.6 = 1.6667 per M
    assert f["cost_per_hour"] == 6.0 and f["cost_basis"] == "2 GPU x gpu_hour[H100] 3"
    assert f["cost_per_m_output_tokens"] == pytest.approx(6.0 / 3.6)
    assert f["cost_per_m_total_tokens"] == pytest.approx(6.0 / 14.4)
    assert cost.point_cost_fields(c, {**RUN, "provenance_gpu": "1 x NVIDIA A10G"})["cost_per_hour"] == 2.0
    # a node type: a label value of one of the server's Ray nodes
    by_node = CostSpec(gpu_hour={"p5.48xlarge": 4.0})
    assert cost.point_cost_fields(by_node, RUN, labels=["p5.48xlarge"])["cost_per_hour"] == 8.0
    assert "no price" in cost.point_cost_fields(by_node, RUN)["cost_note"]


def test_power_is_priced_by_the_measured_energy_else_the_provisioned_power():
    c = CostSpec(gpu_hour=2.0, power_price_kwh=0.36, provisioned_w_per_gpu=1000)
    measured = {**RUN, "energy_j": 9000.0, "energy_window_s": 10.0, "energy_output_tokens": 10_000.0,
                "energy_total_tokens": 40_000.0, "j_per_output_token": 0.9, "j_per_total_token": 0.225}
    f = cost.point_cost_fields(c, measured)
    # hardware 4.00/h over 3.6 M tokens/h = 1.1111 per M; energy 0.9 J x 1e6 = 0.25 kWh x 0.36 = 0.09 per M
    assert f["cost_per_m_output_tokens"] == pytest.approx(4.0 / 3.6 + 0.09)
    assert f["cost_per_m_total_tokens"] == pytest.approx(4.0 / 14.4 + 0.0225)
    assert "measured energy" in f["cost_basis"]
    f = cost.point_cost_fields(c, RUN)
    # provisioned: 2 x 1000 W at 1000 tokens/s = 2 J per output token = 0.5556 kWh per M x 0.36 = 0.2 per M
    assert f["cost_per_m_output_tokens"] == pytest.approx(4.0 / 3.6 + 0.2)
    assert "provisioned 1000 W/GPU" in f["cost_basis"]


def test_a_cpu_server_is_priced_per_node_hour_or_not_at_all():
    cpu = {**RUN, "gpu_count": 0, "provenance_gpu": "none"}
    assert cost.point_cost_fields(CostSpec(gpu_hour=2.0), cpu) == {
        "cost_note": "cost: no price for this server (no GPU and no node_hour)"}
    f = cost.point_cost_fields(CostSpec(node_hour=0.72), cpu)
    assert f["cost_per_m_output_tokens"] == pytest.approx(0.72 / 3.6)
    assert cost.point_cost_fields(None, cpu) == {}


def test_the_campaigns_spend_counts_every_server_from_its_start_failed_ones_too(tmp_path):
    led = Ledger(tmp_path / "ledger.sqlite")
    for sid, gpus in (("a", "0,1"), ("b", "2,3"), ("c", "")):
        led.add_server(sid, "s1", "vllm serve m")
        led.update_server(sid, gpu_ids=gpus, provenance=json.dumps({"gpu": "2 x NVIDIA H100"}))
    rows = {s.server_id: s for s in led.servers()}
    led.close()
    t = rows["a"].started_at
    fixed = [rows["a"].__class__(**{**rows["a"].__dict__, "stopped_at": t + 1800}),       # 2 GPUs x 0.5 h
             rows["b"].__class__(**{**rows["b"].__dict__, "state": "failed", "started_at": t,
                                                  "stopped_at": t + 360}),  # failed start
             rows["c"].__class__(**{**rows["c"].__dict__, "started_at": t, "stopped_at": None})]  # still running
    spend = cost.campaign_spend(CostSpec(gpu_hour=2.5), fixed, gpus_of={"s1": 4}, now=t + 3600)
    # a: 2 x 0.5 = 1.0; b: 2 x 0.1 = 0.2; c: no GPU ids yet, its configuration's 4 x 1.0 = 4.0 GPU-hours
    assert spend["gpu_hours"] == pytest.approx(5.2) and spend["cost"] == pytest.approx(5.2 * 2.5)
    assert spend["servers"] == 3 and spend["currency"] == "USD"


@pytest.mark.parametrize(("block", "expected"), [
    ({"gpu_hour": -1}, ["cost.gpu_hour", "positive"]),
    ({"gpu_hour": {}}, ["cost", "at least one"]),
    ({}, ["cost", "give gpu_hour"]),
    ({"gpu_hour": 2, "provisioned_w_per_gpu": 700}, ["cost", "needs power_price_kwh"]),
    ({"gpu_hour": 2, "price": 3}, ["cost.price", "unknown key", "gpu_hour, node_hour"]),
])
def test_a_bad_cost_block_exits_2_naming_the_field(tmp_path, block, expected):
    result = dry_run(write_campaign(tmp_path, modified(lambda d: d.update(cost=block))))
    assert result.exit_code == 2, result.output
    for text in expected:
        assert text in result.output, (text, result.output)
    assert not (tmp_path / "out").exists()


def _with_gpus(monkeypatch, gpus: int) -> None:
    """The dry run placed on this machine as if it had `gpus` GPUs."""
    from raysweep.place import placement

    node = placement.NodeInfo(node_id="local", ip="127.0.0.1", gpus=gpus, cpus=16.0, resources={"GPU": float(gpus)})
    monkeypatch.setattr(placement, "local_nodes", lambda: [node])


def test_the_dry_run_prices_its_gpu_hour_estimate(tmp_path, monkeypatch):
    _with_gpus(monkeypatch, 8)
    one = dry_run(write_campaign(tmp_path, modified(lambda d: d.update(cost={"gpu_hour": {"H100": 3.0,
                                                                                          "default": 2.0}}))))
    assert one.exit_code == 0, one.output
    line = next(x for x in one.output.splitlines() if x.startswith("Cost:"))
    hours = float(line.split("(")[1].split(" GPU-hour")[0])
    price = float(line.split("about ")[1].split(" USD")[0])
    assert line.endswith("GPU-hour(s) x 2)") and price == pytest.approx(hours * 2.0, abs=0.011)  # both rounded
    (tmp_path / "typed").mkdir()
    typed = dry_run(write_campaign(tmp_path / "typed", modified(lambda d: d.update(cost={"gpu_hour": {"H100": 3.0}}))))
    assert "known once the servers run" in typed.output


def test_without_gpus_the_dry_run_estimates_and_prices_node_hours(tmp_path, monkeypatch):
    """A machine without GPUs bills its servers' node-hours (as `status` and the report count them): the dry run
    says node-hours and prices them at cost.node_hour, never GPU-hours."""
    _with_gpus(monkeypatch, 0)
    one = dry_run(write_campaign(tmp_path, modified(lambda d: d.update(cost={"gpu_hour": 2.0, "node_hour": 0.5}))))
    assert one.exit_code == 0, one.output
    assert "GPU-hour" not in one.output
    estimate = next(x for x in one.output.splitlines() if x.startswith("Estimate"))
    line = next(x for x in one.output.splitlines() if x.startswith("Cost:"))
    hours = float(line.split("(")[1].split(" node-hour")[0])
    assert f"{hours:.2f} node-hour(s)" in estimate and line.endswith("node-hour(s) x 0.5)")
    assert float(line.split("about ")[1].split(" USD")[0]) == pytest.approx(hours * 0.5, abs=0.011)
    (tmp_path / "gpu").mkdir()
    unpriced = dry_run(write_campaign(tmp_path / "gpu", modified(lambda d: d.update(cost={"gpu_hour": 2.0}))))
    assert "cost.node_hour gives no price" in unpriced.output

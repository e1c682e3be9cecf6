"""Energy of offline points (`vllm bench throughput` / `latency`) on the fake NVML of tests/test_energy.py:
measured over the run's elapsed time back from the command's exit (not its weights' loading), with no net of
idle (the idle reading falls while the command loads); a startup point says why it has no energy fields."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from test_energy import ClockNvml, _run

from raysweep.bench.offline import parse_result
from raysweep.campaign.models import CostSpec
from raysweep.drive import point_energy
from raysweep.offline.points import load_window_fields
from raysweep.plan.cost import point_cost_fields

THROUGHPUT = json.dumps({"model_id": "m", "elapsed_time": 10.0, "num_requests": 100, "total_num_tokens": 6000,
                         "requests_per_second": 10.0, "tokens_per_second": 600.0})
LOG = "Total num prompt tokens:  4000\nTotal num output tokens:  2000\n"


class FakeHost:
    """A host actor's `telemetry_energy` answered from a sampler in this process (no Ray)."""

    def __init__(self, sampler) -> None:
        self.telemetry_energy = SimpleNamespace(remote=sampler.energy_window)


@pytest.fixture
def hosts(monkeypatch):
    monkeypatch.setattr(point_energy.ray, "get", lambda refs, timeout=None: refs)
    return [FakeHost(_run(ClockNvml(wrap_at=1100.0), ["0"], until=1030.0))]


def test_an_offline_throughput_points_energy_is_its_elapsed_time_back_from_its_exit(hosts):
    result = parse_result("throughput", THROUGHPUT, LOG)
    result.update(load_window_fields(result, exited=1015.0))  # 400 W from 1003: the load is 1005..1015
    assert (result["load_window_start"], result["load_window_end"]) == (1005.0, 1015.0)
    f = point_energy.point_energy_fields(hosts, result, None, started=990.0, ended=1020.0, enabled=True)
    assert f["energy_j"] == pytest.approx(4000.0, abs=40.0)           # not the 100 W loading before 1003
    assert f["j_per_output_token"] == pytest.approx(2.0, abs=0.02)    # 2000 output tokens
    assert f["j_per_total_token"] == pytest.approx(4000.0 / 6000.0, abs=0.01)
    assert f["energy_window"] == "load (offline: its elapsed time back from the command's exit)"
    assert f.get("energy_net_j") is None and f.get("net_j_per_output_token") is None
    assert "net of idle not given" in f["energy_note"]
    cost = point_cost_fields(CostSpec.model_validate({"gpu_hour": 3.6}),
                             {**result, **f, "gpu_count": 1, "num_nodes": 1})
    assert cost["cost_per_m_output_tokens"] == pytest.approx(3.6 / 3600 / 200.0 * 1e6)  # 200 output tokens/s


def test_an_offline_latency_point_is_windowed_by_its_measured_iterations(hosts):
    result = parse_result("latency", json.dumps({"avg_latency": 2.0, "latencies": [2.0] * 5}))
    result.update(load_window_fields(result, exited=1020.0))
    f = point_energy.point_energy_fields(hosts, result, None, started=990.0, ended=1025.0, enabled=True)
    assert f["energy_j"] == pytest.approx(4000.0, abs=40.0) and "j_per_output_token" not in f  # no token count


def test_startup_and_unwindowed_offline_points_say_why_they_have_no_energy(hosts):
    startup = parse_result("startup", json.dumps({"avg_cold_startup_time": 30.0, "cold_startup_times": [30.0]}))
    assert load_window_fields(startup, 1020.0) == {}
    f = point_energy.point_energy_fields(hosts, startup, None, 990.0, 1020.0, True)
    assert list(f) == ["energy_note"] and "makes no tokens" in f["energy_note"]
    empty = parse_result("latency", json.dumps({"avg_latency": 2.0, "latencies": []}))
    assert load_window_fields(empty, 1020.0) == {}
    f = point_energy.point_energy_fields(hosts, empty, None, 990.0, 1020.0, True)
    assert list(f) == ["energy_note"] and "no elapsed time" in f["energy_note"]


def test_the_report_of_a_startup_campaign_says_why_it_has_no_energy(hosts):
    import pandas as pd

    from raysweep.report.energy import report_section

    startup = parse_result("startup", json.dumps({"avg_cold_startup_time": 30.0, "cold_startup_times": [30.0]}))
    note = point_energy.point_energy_fields(hosts, startup, None, 990.0, 1020.0, True)["energy_note"]
    df = pd.DataFrame([{"serve_id": "s0", "bench_id": "b0", **startup, "energy_note": note}])
    html = report_section(SimpleNamespace(df=df, campaign={}, servers=[]))  # type: ignore[arg-type]
    assert html is not None and "No energy was measured: not applicable: a startup point makes no tokens" in html

"""Energy per point: the counter's arithmetic on a fake NVML whose energy counter wraps and ticks every 100 ms,
with idle power and a load step; the fallbacks (a counter that did not tick, a window too short, power
samples only); RAPL on a fake sysfs tree (and on this machine's, where it has one); the per-token fields."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from raysweep.maths import energy
from raysweep.record.directory import CampaignDir
from raysweep.serve import rapl, telemetry

TICK = 0.1          # the fake counter updates every 100 ms
STEP = 1003.0       # the load step: 100 W idle before, 400 W after
IDLE_W, LOAD_W = 100.0, 400.0


def _joules(t: float) -> float:
    """Energy since t=990 of one GPU of the fake (exact)."""
    return IDLE_W * (min(t, STEP) - 990.0) + LOAD_W * max(0.0, t - STEP)


class ClockNvml:
    """An NVML stand-in on a clock the test moves: power steps from 100 W to 400 W at STEP; the energy counter
    (mJ, an unsigned 64-bit count) starts so that it wraps at `wrap_at`, and only ticks every 100 ms."""

    def __init__(self, wrap_at: float, counter: bool = True, stuck: bool = False) -> None:
        self.now = 990.0
        self.start = 2 ** 64 - round(_joules(wrap_at) * 1000)
        self.counter, self.stuck = counter, stuck

    def clock(self) -> float:
        return self.now

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return int((LOAD_W if self.now >= STEP else IDLE_W) * 1000)

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        if not self.counter:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        tick = 990.0 if self.stuck else 990.0 + math.floor(round((self.now - 990.0) / TICK, 6)) * TICK
        return (self.start + round(_joules(tick) * 1000)) % 2 ** 64

    def __getattr__(self, name: str):  # utilisation, memory, clocks: not what this test reads
        raise AttributeError(name)


def _run(nvml: ClockNvml, gpus: list[str], until: float, every: float = 0.25) -> telemetry.Sampler:
    """A sampler read every `every` s from 990 to `until`; idle power from its readings before 1000."""
    s = telemetry.Sampler(gpus, nvml=nvml, clock=nvml.clock)
    while nvml.now <= until + 1e-9:
        s.samples.extend(s.sample())
        if abs(nvml.now - 1000.0) < 1e-9:
            s.idle_since(990.0)
        nvml.now = round(nvml.now + every, 6)
    return s


def _window(s: telemetry.Sampler, t0: float, t1: float) -> dict:
    w = s.energy_window(t0, t1)
    return energy.window_energy(w["devices"], w["idle_w"], t0, t1, w["wraps"])


def test_the_counter_gives_the_windows_energy_to_the_joule_across_a_wrap_net_of_idle():
    nvml = ClockNvml(wrap_at=1010.0)
    s = _run(nvml, ["0", "1"], until=1020.0)
    raw = [mj for dev, t, mj, _ in s.energy if dev == "0"]
    assert any(b < a for a, b in zip(raw, raw[1:]))  # the counter did wrap inside the window
    assert s.idle_w == {"0": pytest.approx(IDLE_W, abs=1e-6), "1": pytest.approx(IDLE_W, abs=1e-6)}
    e = _window(s, 1005.0, 1015.0)
    assert e["energy_method"] == "counter" and e["energy_devices"] == 2
    assert e["energy_j"] == pytest.approx(2 * LOAD_W * 10, abs=1.0)            # 8000 J, to the joule
    assert e["energy_net_j"] == pytest.approx(2 * (LOAD_W - IDLE_W) * 10, abs=1.0)  # 6000 J
    assert e["power_mean_w"] == pytest.approx(800, abs=0.1) and e["idle_power_w"] == pytest.approx(200)
    # a window across the load step: 2 s of idle and 10 s of load per GPU
    e = _window(s, 1001.0, 1013.0)
    assert e["energy_j"] == pytest.approx(2 * (IDLE_W * 2 + LOAD_W * 10), abs=1.0)
    # edges between readings: the counter is read at its last tick, so each edge is off by at most one tick
    e = _window(s, 1005.1, 1014.9)
    assert abs(e["energy_j"] - 2 * LOAD_W * 9.8) <= 2 * 2 * LOAD_W * TICK


def test_a_window_too_short_for_the_counter_is_power_times_time_and_says_so():
    s = _run(ClockNvml(wrap_at=1e6), ["0"], until=1008.0)
    e = _window(s, 1005.0, 1005.5)
    assert e["energy_method"] == "power x time" and e["energy_j"] == pytest.approx(LOAD_W * 0.5)
    assert "too short for the counter" in e["energy_fallback"]


def test_a_counter_that_does_not_tick_falls_back_to_power_times_time():
    s = _run(ClockNvml(wrap_at=1e6, stuck=True), ["0"], until=1012.0)
    e = _window(s, 1005.0, 1010.0)
    assert e["energy_method"] == "power x time" and e["energy_j"] == pytest.approx(LOAD_W * 5)
    assert "did not tick" in e["energy_fallback"]


def test_without_a_counter_the_power_samples_are_integrated_and_their_coverage_given():
    s = _run(ClockNvml(wrap_at=1e6, counter=False), ["0"], until=1010.0, every=0.5)
    assert all(mj is None for _, _, mj, _ in s.energy)
    e = _window(s, 1002.0, 1006.0)
    # trapezoids through the samples (0.5 s apart): the step at 1003.0 is seen as a ramp from 1002.5
    by_hand = 0.5 * (IDLE_W + IDLE_W) / 2 + 0.5 * (IDLE_W + LOAD_W) / 2 + 3.0 * LOAD_W
    assert e["energy_method"] == "power samples" and e["energy_j"] == pytest.approx(by_hand)
    assert e["energy_sample_coverage"] == 1.0
    assert e["energy_net_j"] == pytest.approx(by_hand - IDLE_W * 4)


def test_unwrap_is_exact_on_64_bit_integers():
    near = 2 ** 64 - 1500
    assert energy.unwrap([near, near + 1000, 500, 2500], energy.NVML_WRAP_MJ) == [0.0, 1000.0, 2000.0, 4000.0]


def test_per_token_fields_gross_and_net():
    f = energy.energy_fields({"energy_j": 600.0, "energy_net_j": 300.0}, output_tokens=1200, total_tokens=3000)
    assert f["j_per_output_token"] == 0.5 and f["j_per_total_token"] == 0.2 and f["output_tokens_per_j"] == 2.0
    assert f["net_j_per_output_token"] == 0.25 and f["net_output_tokens_per_j"] == 4.0
    assert "j_per_output_token" not in energy.energy_fields({"energy_j": 600.0}, None, None)


def _zone(root: Path, name: str, zone: str, uj: int, max_uj: int) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "name").write_text(zone + "\n")
    (d / "energy_uj").write_text(f"{uj}\n")
    (d / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return d


def test_rapl_packages_on_a_fake_sysfs_tree_wrap_at_their_max_range(tmp_path):
    root = tmp_path / "powercap"
    pkg = _zone(root, "intel-rapl:0", "package-0", uj=262_143_000_000, max_uj=262_143_328_850)
    _zone(root, "intel-rapl:0:0", "core", uj=5, max_uj=10)  # a sub-zone: part of the package, not counted
    r = rapl.Rapl(root)
    assert list(r.zones) == ["package-0"] and r.read_mj() == {"package-0": 262_143_000.0}
    clock = iter([t for t in (100.0, 101.0, 102.0) for _ in range(3)])  # a sample's start, and around the read
    s = telemetry.Sampler([], nvml=None, rapl_root=str(root), clock=lambda: next(clock))
    assert s.nvml is None and s.energy_source == rapl.SCOPE
    for uj in (261_843_328_850, 262_143_328_850, 199_999_999):
        (pkg / "energy_uj").write_text(f"{uj}\n")
        s.sample()
    w = s.energy_window(100.0, 102.0)
    e = energy.window_energy(w["devices"], {"package-0": None}, 100.0, 102.0, w["wraps"])
    # 300 J to the top of the range, 1 uJ to wrap to 0, then 199.999999 J
    assert e["energy_method"] == "counter" and e["energy_j"] == pytest.approx(500.0, abs=1e-6)
    assert e["energy_net_j"] is None  # idle not measured: no net figure, never a guess


def test_unreadable_rapl_says_why(tmp_path):
    assert rapl.Rapl(tmp_path / "absent").why.startswith("RAPL unavailable")
    root = tmp_path / "powercap"
    pkg = _zone(root, "intel-rapl:0", "package-0", uj=1, max_uj=10)
    (pkg / "energy_uj").unlink()
    (pkg / "energy_uj").mkdir()  # unreadable as a file, as energy_uj is to a non-root user
    r = rapl.Rapl(root)
    assert not r.zones and "not readable" in r.why
    s = telemetry.Sampler([], nvml=None, rapl_root=str(root))
    assert s.energy_source == "" and "RAPL unavailable" in s.energy_why


def test_this_machines_rapl_where_it_has_one():
    r = rapl.Rapl()
    if not r.zones:
        pytest.skip(f"this machine has no readable RAPL counter: {r.why}")
    first = r.read_mj()
    assert all(v is None or v >= 0 for v in first.values())
    assert os.path.isdir(rapl.POWERCAP)


STEP_HOOK = """
import fcntl, json, os, time

def requests(num_prompts, seed):
    # the point's data set is built before its load: from here on, every GPU draws its load power
    with open({fake!r} + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with open({fake!r}) as f:
            data = json.load(f)
        if data.get("step_at") is None:
            data["step_at"] = time.time()
            with open({fake!r} + ".tmp", "w") as f:
                json.dump(data, f)
            os.replace({fake!r} + ".tmp", {fake!r})
    time.sleep(0.5)
    return [{{"prompt": [5] * 8, "output_len": 4}} for _ in range(num_prompts)]
"""


@pytest.mark.ray
def test_each_server_gets_its_own_gpus_energy_over_its_points_steady_window(gpu_cluster, tmp_path):
    """Two servers share node w2 (one GPU each). Until the first point's data set is built every GPU draws
    100 W x (index + 1), the server starts and the warmup included; from then on 1000 W + 100 W x (index + 1).
    Each point's mean power is its own GPU's load power, exactly: the window is inside the load, and no other
    GPU is counted. GPU 0's counter wraps during the start-up."""
    import time

    from helpers import native_campaign, run_file

    from raysweep.results.table import results_table

    now = time.time()
    gpus = [{"util": 50, "mem_used_mib": 1, "sm_mhz": 1, "reasons": 0, "power_w": 100.0 * (i + 1),
             "load_power_w": 1000.0 + 100.0 * (i + 1), "energy_mj": 2 ** 64 - 1000 if i == 0 else 10 ** 9 * i,
             "energy_at": now} for i in range(4)]
    fake = tmp_path / "nvml.json"
    fake.write_text(json.dumps({"gpus": gpus, "step_at": None}))
    hook = tmp_path / "hook.py"
    hook.write_text(STEP_HOOK.format(fake=str(fake)))
    f = native_campaign(tmp_path, server_args="--ttft-delay 0.05 --itl-delay 0.03",
                        bench_args=f"--dataset-name custom --dataset-path {hook}:requests --max-concurrency 4",
                        serve_params=[{"max_num_seqs": 4, "tensor_parallel_size": 1},
                                      {"max_num_seqs": 8, "tensor_parallel_size": 1}],
                        bench_params=[{"num_prompts": 240}],
                        bench={"client_cpus": 0.5}, warmup=4, placement={"node_labels": {"node-name": "w2"}},
                        serve={"env": {telemetry.FAKE_ENV: str(fake)}},
                        transport={"telemetry_interval_s": 0.1}, cost={"gpu_hour": {"A100": 2.0, "default": 9.0}})
    summary, out = run_file(f)
    assert summary.counts["done"] == 2, summary.failures
    rows = results_table(CampaignDir(out))
    assert sorted(rows["gpu_ids"]) == sorted({str(g) for g in rows["gpu_ids"]}) and rows["node_ids"].nunique() == 1
    for _, row in rows.iterrows():
        gpu = int(row["gpu_ids"])
        assert row["energy_window"] == "steady" and row["energy_method"] == "counter", row["energy_window"]
        assert row["energy_source"] == "NVML energy counter" and row["energy_devices"] == 1
        assert row["power_mean_w"] == pytest.approx(1000.0 + 100.0 * (gpu + 1), rel=1e-3)
        assert row["energy_window_s"] >= 5.0 and row["energy_window_s"] < row["duration"]
        assert row["energy_j"] == pytest.approx(row["power_mean_w"] * row["energy_window_s"])
        assert row["j_per_output_token"] == pytest.approx(row["energy_j"] / row["energy_output_tokens"])
        assert 0 < row["energy_output_tokens"] < row["total_output_tokens"]
        assert row["cost_per_hour"] == 2.0  # the node's label gpu-type=A100


DCGM_PAGE = """# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{{gpu="0",UUID="GPU-a",device="nvidia0",Hostname="h"}} {p0}
DCGM_FI_DEV_POWER_USAGE{{gpu="1",UUID="GPU-b",device="nvidia1",Hostname="h"}} 999
# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{gpu="0",UUID="GPU-a",device="nvidia0",Hostname="h"}} {e0}
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{gpu="1",UUID="GPU-b",device="nvidia1",Hostname="h"}} 5
"""


@pytest.fixture
def no_nvml(monkeypatch):
    """NVML absent, as on a node where only another source can read the GPUs (whatever this machine has)."""
    monkeypatch.setattr(telemetry, "load_nvml", lambda: (None, "unavailable: NVMLError_LibraryNotFound"))


def test_a_dcgm_exporters_page_gives_the_energy_of_the_servers_own_gpus(no_nvml):
    """An exporter on 127.0.0.1 whose GPU 0 draws 250 W: its counter read through the page gives the window's
    energy; GPU 1 (another server's) is not read."""
    import http.server
    import threading

    from raysweep.serve import power_sources

    state = {"t": 0.0}

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = DCGM_PAGE.format(p0=250.0, e0=int(1_000_000 + 250.0 * state["t"] * 1000)).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/metrics"
        assert power_sources.parse_dcgm(DCGM_PAGE.format(p0=1, e0=2))["1"] == (5.0, 999.0)
        s = telemetry.Sampler(["0"], nvml=None, clock=lambda: state["t"], dcgm_url=url)
        assert s.energy_source == "DCGM exporter" and s.gpu_power is not None
        for t in (0.0, 2.0, 4.0, 6.0):
            state["t"] = t
            s.sample()
        w = s.energy_window(1.0, 5.0)
        assert set(w["devices"]) == {"0"}
        e = energy.window_energy(w["devices"], {"0": 100.0}, 1.0, 5.0, w["wraps"])
        assert e["energy_method"] == "counter" and e["energy_j"] == pytest.approx(1000.0)  # 250 W x 4 s
        assert e["energy_net_j"] == pytest.approx(600.0)
    finally:
        httpd.shutdown()
        httpd.server_close()
    gone = telemetry.Sampler(["0"], nvml=None, dcgm_url=url, rapl_root="/nonexistent")
    assert gone.energy_source == "" and "DCGM exporter" in gone.energy_why and "unreadable" in gone.energy_why
    assert "RAPL not read: the server has GPUs" in gone.energy_why


class FakeAmdSmi:
    """The calls of `amdsmi` raysweep makes, on a clock: two GPUs, GPU 1 drawing 300 W."""

    def __init__(self) -> None:
        self.t = 0.0

    def amdsmi_init(self):
        pass

    def amdsmi_get_processor_handles(self):
        return ["h0", "h1"]

    def amdsmi_get_energy_count(self, h):
        # accumulator x resolution (uJ): 300 W is 300e6 uJ per s, at a resolution of 15.3 uJ
        return {"energy_accumulator": round(300e6 * self.t / 15.3), "counter_resolution": 15.3}

    def amdsmi_get_power_info(self, h):
        return {"average_socket_power": 300}


def test_amd_smi_gives_the_servers_gpus_energy_counter_and_power(no_nvml):
    lib = FakeAmdSmi()
    s = telemetry.Sampler(["1"], nvml=None, clock=lambda: lib.t, amd=lib)
    assert s.energy_source == "AMD SMI"
    for t in (0.0, 1.0, 2.0, 3.0):
        lib.t = t
        s.sample()
    w = s.energy_window(0.5, 2.5)
    e = energy.window_energy(w["devices"], {"1": None}, 0.5, 2.5, w["wraps"])
    assert e["energy_method"] == "counter" and e["energy_j"] == pytest.approx(600.0, abs=1e-3)
    missing = telemetry.Sampler(["0"], nvml=None, amd=True)
    assert "AMD SMI unavailable" in missing.energy_why


def test_a_command_points_energy_is_measured_over_its_load_not_from_the_points_start():
    from raysweep.drive import point_energy

    steady = {"start_time": 100.0, "steady_state_window_start_s": 2.0, "steady_state_window_end_s": 9.0}
    assert point_energy.load_window(steady, 90.0, 120.0) == (102.0, 109.0, "steady")
    short = {"start_time": 100.0, "end_time": 103.0, "steady_state_note": "not judged: too short"}
    assert point_energy.load_window(short, 90.0, 120.0) == (100.0, 103.0, "load (not judged: too short)")
    # `vllm bench serve`'s JSON: no start; its load is its duration back from the process's return
    command = {"load_window_start": 110.0, "load_window_end": 118.0}
    assert point_energy.load_window(command, 90.0, 120.0) == (110.0, 118.0, "load (no steady-state window)")

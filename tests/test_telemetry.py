"""GPU telemetry through NVML: the sampler on a fake NVML (a JSON file), the per-point summary, the
`throttled` validity mark, absent NVML recorded rather than failing, and the whole path on the simulated
cluster (host actors sampling the GPUs Ray gave the server)."""

from __future__ import annotations

import json

import pytest
from helpers import native_campaign, run_file, standin_campaign

from raysweep.drive.validity import validity_fields
from raysweep.record.directory import CampaignDir
from raysweep.report.run_sections import multinode_section
from raysweep.serve import telemetry


def _gpus(path, *gpus):
    path.write_text(json.dumps({"gpus": list(gpus)}))
    return str(path)


GPU = {"util": 90, "mem_used_mib": 30000, "power_w": 650, "sm_mhz": 1980, "reasons": 0}


def test_a_sample_reads_every_assigned_gpu_by_its_physical_index(tmp_path):
    path = _gpus(tmp_path / "nvml.json", GPU, {**GPU, "util": 10}, {**GPU, "util": 50, "reasons": 0x4 | 0x1})
    s = telemetry.Sampler(["2", "0"], nvml=telemetry.FileNvml(path))
    rows = s.sample()
    assert [(r["gpu"], r["util"]) for r in rows] == [("2", 50), ("0", 90)]
    assert rows[0]["power_w"] == 650 and rows[0]["mem_mib"] == 30000 and rows[0]["sm_mhz"] == 1980
    assert telemetry.throttled(rows[0]["reasons"]) == ["sw_power_cap"]  # idle (0x1) is not throttling


def test_summary_pools_the_nodes_and_a_throttled_point_is_marked(tmp_path):
    hot = [{"t": i, "gpu": "0", "util": 80, "mem_mib": 100.0 + i, "power_w": 700.0, "sm_mhz": 1500,
            "reasons": 0x40} for i in range(3)]
    cool = [{"t": i, "gpu": "0", "util": 100, "mem_mib": 50.0, "power_w": 500.0, "sm_mhz": 1980, "reasons": 0}
            for i in range(3)]
    cols = telemetry.summarise([{"source": "nvml", "samples": hot}, {"source": "nvml", "samples": cool}])
    assert cols["gpu_telemetry"] == "nvml" and cols["gpu_telemetry_samples"] == 6
    assert cols["gpu_util_mean_pct"] == 90 and cols["gpu_mem_used_max_mib"] == 102
    assert cols["gpu_power_mean_w"] == 600 and cols["gpu_sm_clock_min_mhz"] == 1500
    assert cols["gpu_throttled_fraction"] == 0.5 and cols["gpu_throttle_reasons"] == "hw_thermal"
    v = validity_fields(cols)
    assert not v["validity_ok"] and "throttled (hw_thermal in 50 % of samples)" in v["validity_issues"]
    assert validity_fields({**cols, "gpu_throttled_fraction": 0.0})["validity_ok"]


def test_no_nvml_is_recorded_not_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv(telemetry.FAKE_ENV, str(tmp_path / "missing.json"))
    s = telemetry.Sampler(["0"]).start()
    assert s.nvml is None and s.source.startswith("unavailable: FileNotFoundError")
    assert s.window(0, 1e12) == {"source": s.source, "samples": []}
    assert telemetry.summarise([s.window(0, 1e12)]) == {"gpu_telemetry": s.source, "gpu_telemetry_samples": 0}
    monkeypatch.delenv(telemetry.FAKE_ENV)
    none = telemetry.Sampler([], nvml=telemetry.FileNvml(_gpus(tmp_path / "n.json", GPU)))
    assert none.source == "unavailable: no GPU assigned to this server"
    # NVML's usual refusals are said in words, not as the exception's class name
    missing = type("NVMLError_LibraryNotFound", (Exception,), {})("NVML Shared Library Not Found")
    assert telemetry.nvml_why(missing) == "unavailable: no NVIDIA driver library (libnvidia-ml) on this node"
    assert telemetry.nvml_why(OSError("odd")) == "unavailable: OSError: odd"


@pytest.mark.ray
def test_host_actors_sample_the_servers_gpus_during_each_point(gpu_cluster, tmp_path):
    fake = _gpus(tmp_path / "nvml.json", *[{**GPU, "util": 70 + i, "reasons": 0x4} for i in range(4)])
    f = standin_campaign(tmp_path, bench_args="--sleep 1.0", serve_params=[{"tensor_parallel_size": 2}],
                         bench_params=[{"random_input_len": 16}],
                         serve={"env": {telemetry.FAKE_ENV: fake}}, transport={"telemetry_interval_s": 0.1})
    summary, out = run_file(f)
    assert summary.counts["done"] == 1
    from raysweep.results.table import results_table

    row = results_table(CampaignDir(out)).iloc[0]
    gpus = [int(g) for g in row["gpu_ids"].split(",")]
    assert row["gpu_telemetry"] == "fake NVML" and row["gpu_telemetry_samples"] >= 4
    assert row["gpu_util_mean_pct"] == pytest.approx(70 + sum(gpus) / 2)  # only the server's own GPUs
    assert row["gpu_throttle_reasons"] == "sw_power_cap" and row["gpu_throttled_fraction"] == 1.0
    assert "throttled (sw_power_cap" in row["validity_issues"]
    # these fake GPUs have no energy counter: the power samples are integrated over the command's load, and
    # the fields say so (2 GPUs at 650 W each)
    assert row["energy_method"] == "power samples" and row["energy_window"].startswith("load")
    assert row["power_mean_w"] == pytest.approx(1300.0) and row["energy_devices"] == 2
    assert row["idle_power_w"] == pytest.approx(1300.0) and row["energy_net_j"] == pytest.approx(0.0, abs=1e-6)


HOOK = """
import json, os, time

def _gpus(util):
    tmp = {fake!r} + ".tmp"
    with open(tmp, "w") as f:
        json.dump({{"gpus": [{{**{gpu!r}, "util": util}}] * 4}}, f)
    os.replace(tmp, {fake!r})

def requests(num_prompts, seed):
    _gpus(0)          # the data set's building: the GPUs read 0 %
    time.sleep(1.0)
    _gpus(90)         # from here on, the load: 90 %
    return [{{"prompt": [5] * 8, "output_len": 4}} for _ in range(num_prompts)]
"""


@pytest.mark.ray
def test_gpu_telemetry_is_averaged_over_the_load_not_the_data_sets_building(gpu_cluster, tmp_path):
    """The data set's building (a hook that takes 1 s, while the GPUs read 0 %) falls inside the point, before
    its load (the GPUs read 90 %): only the load's samples enter the averages, so the mean is 90 exactly, while
    a window from the point's start would hold about ten samples of 0 %."""
    fake = _gpus(tmp_path / "nvml.json", *[{**GPU, "util": 0}] * 4)
    hook = tmp_path / "hook.py"
    hook.write_text(HOOK.format(fake=fake, gpu=GPU))
    f = native_campaign(tmp_path, server_args="--ttft-delay 0.5 --itl-delay 0.05",
                        bench_args=f"--dataset-name custom --dataset-path {hook}:requests --max-concurrency 4",
                        bench_params=[{"num_prompts": 4}], bench={"client_cpus": 0.5},
                        serve={"env": {telemetry.FAKE_ENV: fake}}, transport={"telemetry_interval_s": 0.1})
    summary, out = run_file(f)
    assert summary.counts["done"] == 1, summary.failures
    from raysweep.results.table import results_table

    row = results_table(CampaignDir(out)).iloc[0]
    assert row["completed"] == 4 and row["start_time"] - row["started_at"] >= 1.0  # the building was in the point
    assert row["gpu_telemetry"] == "fake NVML" and row["gpu_telemetry_samples"] >= 1
    assert row["gpu_util_mean_pct"] == 90

def test_the_report_section_shows_node_pair_links_the_probe_topology_and_events(tmp_path):
    from raysweep.ledger import Ledger
    from raysweep.place import transport

    def efa(r: int) -> list[str]:
        return [f"node{r}:1:1 [0] NCCL INFO Channel 00/0 : {2 * r + 1}[1] -> {2 * (1 - r)}[0] [send] via "
                "NET/AWS Libfabric/0/GDRDMA", f"node{r}:1:1 [0] NCCL INFO Channel 00/0 : {2 * r}[0] -> {2 * r + 1}[1] "
                "via P2P/CUMEM/read"]

    led = Ledger(tmp_path / "ledger.sqlite")
    led.add_server("s1-x", "s1", "vllm serve m")
    led.update_server("s1-x", transport=json.dumps(transport.server_verdict([efa(0), efa(1)])),
                      fabric=json.dumps({"busbw_gbps": 12.5, "backend": "nccl", "world": 16}),
                      topology=json.dumps([{"warnings": ["tensor-parallel group of GPUs 0,1 spans NUMA nodes 0,1"]}]),
                      ranks=json.dumps([{"rank": 0, "node_ip": "10.0.0.1"}, {"rank": 1, "node_ip": "10.0.0.2"}]))
    led.add_event("node_lost", ["s1"], ["abcdef1234567890"], "node abcdef123456 (10.0.0.2) was lost")
    led.close()
    html = multinode_section(CampaignDir(tmp_path))
    assert "node 0 (10.0.0.1) -&gt; node 1 (10.0.0.2): OFI+GDR (1 rank pair)" in html
    assert "12.50 GB/s (nccl, 16 ranks)" in html and "spans NUMA nodes 0,1" in html
    assert "Cluster events" in html and "node_lost" in html and "abcdef123456" in html
    empty = tmp_path / "empty"
    empty.mkdir()
    Ledger(empty / "ledger.sqlite").close()
    assert multinode_section(CampaignDir(empty)) is None

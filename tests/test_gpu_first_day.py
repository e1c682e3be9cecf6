"""The first day on a GPU cluster, made safe on this machine: what would fail there for a reason this machine
can catch. NCCL's unflushed stdout through the server guard, the transport gate per layout, vLLM's own
engine timeout, GPU isolation lost to Ray's NOSET switch, the fabric probe's interfaces, and NVML by UUID on
nodes whose NVML order differs from CUDA's."""

from __future__ import annotations

import ctypes
import json
import logging
from dataclasses import replace
from types import SimpleNamespace

import pytest

from raysweep.ledger import ServerRow
from raysweep.place import preflight
from raysweep.results import acceptance
from raysweep.serve import server as server_mod

# ---------------------------------------------------------------------------------------------------
# vLLM's own engine timeout (VLLM_ENGINE_READY_TIMEOUT_S, 600 s by default)
# ---------------------------------------------------------------------------------------------------


def test_the_server_waits_for_its_engines_at_least_as_long_as_the_campaign(caplog):
    env = server_mod.engine_timeout_env({"HF_TOKEN": "x"}, 1800.0)
    assert env == {"HF_TOKEN": "x", "VLLM_ENGINE_READY_TIMEOUT_S": "1800"}
    assert server_mod.engine_timeout_env({}, 899.2)["VLLM_ENGINE_READY_TIMEOUT_S"] == "900"
    # a longer wait in serve.env is kept; a shorter one is raised, with a warning
    assert server_mod.engine_timeout_env({"VLLM_ENGINE_READY_TIMEOUT_S": "3600"}, 900.0) == {
        "VLLM_ENGINE_READY_TIMEOUT_S": "3600"}
    with caplog.at_level(logging.WARNING):
        assert server_mod.engine_timeout_env({"VLLM_ENGINE_READY_TIMEOUT_S": "60"}, 900.0) == {
            "VLLM_ENGINE_READY_TIMEOUT_S": "900"}
    assert "shorter than serve.ready_timeout_s" in caplog.text


def _fake_host(node: int, started: list) -> SimpleNamespace:
    """A host actor's calls as the driver makes them (`.remote(...)` answers at once)."""
    def call(fn):
        return SimpleNamespace(remote=fn)
    info = {"node_id": f"n{node}", "node_ip": f"10.0.0.{node + 1}", "hostname": f"gpu{node}", "gpu_ids": "0,1"}
    return SimpleNamespace(
        node_info=call(lambda: info), pick_port=call(lambda: 29500),
        start=call(lambda argv, env, http, nccl, retries: started.append((argv, env)) or {
            "pid": 1, "pid_create_time": 1.0, "host": info["node_ip"], "port": 8000 if http else None,
            "log_path": "/tmp/x.log", "command": " ".join(argv), "network": {}}),
        process_facts=call(lambda: {"nice": 0, "cpu_affinity": "0-1"}))


def test_the_launch_gives_every_rank_the_engine_timeout(tmp_path):
    """The driver's launch of a two-node server: every rank's environment carries vLLM's engine timeout."""
    from raysweep.place.placement import Layout
    from raysweep.serve.live_server import Server, Servers

    started: list = []
    c = SimpleNamespace(name="c", serve=SimpleNamespace(ready_timeout_s=1800.0, warm_weights=False, share_caches=True),
                        transport=SimpleNamespace(nccl_debug=True, telemetry=False))
    work = SimpleNamespace(c=c, ledger=SimpleNamespace(update_server=lambda *a, **k: None), with_gpus=False,
                           log_dir=tmp_path, emit=lambda *a, **k: None)
    serve = SimpleNamespace(id="pp", argv=["vllm", "serve", "m", "-pp", "2"], env={"HF_TOKEN": "x"}, deployment=None)
    run = SimpleNamespace(serve=serve, layout=Layout(2, 1, "nnodes"),
                          wait=lambda ref, timeout: ("ok", ref))
    server = Server("pp-x", [_fake_host(0, started), _fake_host(1, started)])
    Servers(work).launch(run, server, serve.argv, serve_http=True)
    assert [env.get("VLLM_ENGINE_READY_TIMEOUT_S") for _, env in started] == ["1800", "1800"]
    assert all(env["HF_TOKEN"] == "x" for _, env in started)
    assert "--headless" in started[1][0] and "--headless" not in started[0][0]


# ---------------------------------------------------------------------------------------------------
# Lost GPU isolation: RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES
# ---------------------------------------------------------------------------------------------------


def _row(ranks: list[dict]) -> ServerRow:
    return ServerRow(server_id="s-x", serve_id="s", command="vllm serve m", hostname="node0", node_id="n0",
                     node_ip="10.0.0.1", port=8000, pid=1, pid_create_time=1.0, gpu_ids="0,1",
                     ranks=json.dumps(ranks), started_at=1000.0, ready_at=1042.0, stopped_at=1100.0, state="stopped",
                     error=None, log_tail=None, log_path=None, transport=None, fabric=None)


def test_a_server_without_gpu_isolation_fails_the_checklist():
    import pandas as pd

    noset = {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}
    lost = _row([{"rank": 0, "gpu_ids": "0,1", "cuda_visible_devices": None, "cuda_visible_set": False,
                  "noset_visible_devices": noset}])
    items = {i.check: i for i in acceptance.checklist([lost], pd.DataFrame())}
    gpus = items["GPUs per bundle"]
    assert gpus.status == "FAIL", gpus
    assert "isolation lost" in gpus.seen and "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1" in gpus.seen
    assert "all GPUs of the node" in gpus.seen and "ray start" in gpus.fix
    # the process had no CUDA_VISIBLE_DEVICES at all, the switch unseen (set on the node some other way)
    unset = _row([{"rank": 0, "gpu_ids": "0,1", "cuda_visible_devices": None, "cuda_visible_set": False,
                   "noset_visible_devices": {}}])
    assert {i.check: i for i in acceptance.checklist([unset], pd.DataFrame())}["GPUs per bundle"].status == "FAIL"
    # a rank without GPUs (a CPU-only cluster) has none to isolate
    cpu = _row([{"rank": 0, "gpu_ids": "", "cuda_visible_devices": None, "cuda_visible_set": False,
                 "noset_visible_devices": {}}])
    assert "isolation" not in {i.check: i for i in acceptance.checklist([cpu], pd.DataFrame())}["GPUs per bundle"].seen
    # an old record without these facts is still "not seen", and a healthy one ok
    old = _row([{"rank": 0, "gpu_ids": "0,1", "cuda_visible_devices": None}])
    assert {i.check: i for i in acceptance.checklist([old], pd.DataFrame())}["GPUs per bundle"].status == "not seen"
    ok = _row([{"rank": 0, "gpu_ids": "0,1", "cuda_visible_devices": "0,1", "cuda_visible_set": True,
                "noset_visible_devices": {}}])
    assert {i.check: i for i in acceptance.checklist([ok], pd.DataFrame())}["GPUs per bundle"].status == "ok"


def test_the_isolation_switch_is_read_as_ray_reads_it():
    assert server_mod.isolation_env({"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "true", "PATH": "/bin",
                                     "RAY_EXPERIMENTAL_NOSET_ROCR_VISIBLE_DEVICES": "0"}) == {
        "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "true"}


def test_preflight_flags_a_node_that_lost_gpu_isolation():
    from tests.test_preflight import made_node

    env = {"NCCL_IB_HCA": "mlx5", "NCCL_SOCKET_IFNAME": "bond0"}
    gathered = preflight.nccl_env({**env, "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"})
    assert gathered["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] == "1"
    nodes = [made_node("aaaa", env=env), made_node("bbbb", env=gathered), made_node("cccc", env=env)]
    findings, warnings = preflight.compare(nodes)
    assert [(f.node_id[:4], f.field) for f in findings] == [
        ("bbbb", "env:RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES")]
    said = [(w.node_id[:4], w.message) for w in warnings]
    assert len(said) == 1 and said[0][0] == "bbbb" and "every server on this node would see all its GPUs" in said[0][1]
    # on every node alike: no difference between nodes, but each node is still warned
    _, everywhere = preflight.compare([made_node(n, env=gathered) for n in ("aaaa", "bbbb")])
    assert len(everywhere) == 2


# ---------------------------------------------------------------------------------------------------
# The transport gate per layout: data parallel across nodes has no NCCL link between them
# ---------------------------------------------------------------------------------------------------


def _intra_lines(node: int) -> list[str]:
    """One node of a two-node server of data-parallel replicas (TP=2 each): NCCL's lines inside the node only."""
    head = f"gpu{node}:{200 + node}:{210 + node} [0] NCCL INFO"
    return [f"{head} NCCL version 2.27.3+cuda12.8", f"{head} Using network IB",
            f"{head} NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.{node + 1}<0>",
            f"{head} Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
            f"{head} Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM/read",
            f"{head} Connected all rings, use ring PXN 0 GDR 1"]


def _pp_lines(node: int) -> list[str]:
    """One node of a pipeline across two nodes whose cross-node link fell back to TCP sockets."""
    head = f"gpu{node}:{300 + node}:{310 + node} [0] NCCL INFO"
    return [f"{head} Using network Socket",
            f"{head} Channel 00/0 : {node}[0] -> {1 - node}[0] [send] via NET/Socket/0",
            f"{head} Channel 00/0 : {1 - node}[0] -> {node}[0] [receive] via NET/Socket/0"]


def test_data_parallel_across_nodes_is_not_refused_for_links_it_does_not_have():
    from raysweep.place import transport

    argv = ["vllm", "serve", "m", "-tp", "2", "--data-parallel-size", "2"]
    assert transport.needs_cross_node("dp", 2, argv) is False
    assert transport.needs_cross_node("nnodes", 2, argv) is True
    assert transport.needs_cross_node("dp", 1, argv) is False
    assert transport.needs_cross_node("dp", 2, [*argv, "--enable-expert-parallel"]) is True
    assert transport.needs_cross_node("dp", 2, [*argv, "--enable-expert-parallel", "--no-enable-expert-parallel"]) \
        is False
    verdict = transport.server_verdict([_intra_lines(0), _intra_lines(1)], transport.needs_cross_node("dp", 2, argv))
    for require in ("ib", "gdr", "rdma"):
        assert transport.refusal(verdict, require) is None, require
    assert "no NCCL link between nodes" in transport.describe(verdict)
    # the same lines from a layout that must cross nodes (a pipeline) are refused: no cross-node link seen
    pipeline = transport.server_verdict([_intra_lines(0), _intra_lines(1)], True)
    assert "no cross-node NCCL link" in (transport.refusal(pipeline, "ib") or "")
    # data parallel whose lines do cross nodes (a mixture of experts) is judged on them
    moe = transport.server_verdict([_pp_lines(0), _pp_lines(1)], False)
    assert "Socket" in (transport.refusal(moe, "ib") or "")


def test_the_driver_gate_and_the_checklist_pass_a_two_node_data_parallel_server():
    import pandas as pd

    from raysweep.place import transport
    from raysweep.serve.live_server import Server, Servers

    seen: dict = {}
    work = SimpleNamespace(c=SimpleNamespace(transport=SimpleNamespace(require="ib", wait_s=0.0)),
                           ledger=SimpleNamespace(update_server=lambda sid, **kw: seen.update(kw)),
                           emit=lambda kind, **kw: seen.setdefault("emitted", []).append((kind, kw)))
    hosts = [SimpleNamespace(nccl_lines=SimpleNamespace(remote=lambda n=n: _intra_lines(n))) for n in (0, 1)]
    server = Server("dp-x", hosts, cross_node=transport.needs_cross_node("dp", 2, ["vllm", "serve", "m"]))
    run = SimpleNamespace(serve=SimpleNamespace(id="dp"), wait=lambda refs, timeout: ("ok", list(refs)))
    assert Servers(work).check_transport(run, server) is None
    assert seen["emitted"][0][1]["refused"] is None
    stored = json.loads(seen["transport"])
    row = replace(_row([{"rank": r, "gpu_ids": "0,1", "cuda_visible_devices": "0,1"} for r in (0, 1)]),
                  transport=json.dumps(stored))
    items = {i.check: i for i in acceptance.checklist([row], pd.DataFrame())}
    assert items["NCCL transport"].status == "ok", items["NCCL transport"]
    # a pipeline with the same lines is refused by the same gate
    server = Server("pp-x", hosts, cross_node=True)
    assert "transport.require ib" in (Servers(work).check_transport(run, server) or "")


# ---------------------------------------------------------------------------------------------------
# NCCL's lines through the guard: libc's stdout, not flushed, from a server that stays up
# ---------------------------------------------------------------------------------------------------

# Writes NCCL_DEBUG=INFO-style lines as NCCL does (libc's stdout, vfprintf, no fflush), then stays alive.
NCCL_CHILD = r"""
import ctypes, sys, time
libc = ctypes.CDLL(None)
for i in range(30):
    libc.printf(b"gpu0:4242:4250 [0] NCCL INFO Channel %02d/0 : 0[0] -> 1[1] [send] via NET/IB/0/GDRDMA\n", i)
sys.stderr.write("an error line\n")
sys.stderr.flush()
print("\x1b[32mINFO\x1b[0m a coloured line")
time.sleep(int(sys.argv[1]))
libc.printf(b"the last line, with no newline")
"""


def _start_guard(tmp_path, seconds: int):
    import os
    import subprocess
    import sys

    import psutil

    state = tmp_path / "state"
    state.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # this machine exports it; clusters do not
    me = psutil.Process()
    log = tmp_path / "server.log"
    with open(log, "ab") as f:
        launcher = subprocess.Popen([sys.executable, "-m", "raysweep.serve.guard", str(me.pid), repr(me.create_time()),
                                     str(state), "--", sys.executable, "-c", NCCL_CHILD, str(seconds)],
                                    stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    launcher.wait(timeout=30)
    return state, log


def _wait_for(check, timeout_s: float) -> bool:
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return check()


def test_nccl_lines_of_a_live_server_reach_the_log_through_the_guard(tmp_path):
    import os
    import signal

    from raysweep.place import transport
    from raysweep.serve import guard

    state, log = _start_guard(tmp_path, 60)

    def channels() -> int:
        return sum("NCCL INFO Channel" in ln for ln in log.read_text(errors="replace").splitlines())

    try:
        assert _wait_for(lambda: channels() == 30, 20), log.read_text()
        server = int((state / guard.SERVER_PID_FILE).read_text())
        assert os.path.exists(f"/proc/{server}")  # still running: the lines came live, not at its exit
        text = log.read_text()
        assert "\r" not in text and "\x1b[" not in text and "INFO a coloured line" in text
        assert "an error line" in text
        assert len(transport.parse_nccl(text.splitlines()).links) == 30  # what the transport check reads
    finally:
        guard_pid = int((state / guard.PID_FILE).read_text())
        os.kill(guard_pid, signal.SIGTERM)
        _wait_for(lambda: (state / guard.EXIT_FILE).exists(), 30)


def test_a_server_that_ends_leaves_every_line_in_the_log(tmp_path):
    from raysweep.serve import guard

    state, log = _start_guard(tmp_path, 0)
    assert _wait_for(lambda: (state / guard.EXIT_FILE).exists(), 30)
    assert (state / guard.EXIT_FILE).read_text() == "0"
    text = log.read_text()
    assert _wait_for(lambda: "the last line, with no newline" in log.read_text(), 5), text
    assert sum("NCCL INFO Channel" in ln for ln in log.read_text().splitlines()) == 30


# ---------------------------------------------------------------------------------------------------
# NVML on a node of mixed GPUs: the server's own GPUs by PCI bus id, not by NVML's index
# ---------------------------------------------------------------------------------------------------


class FakePynvml:
    """`pynvml` as nvidia-ml-py behaves on a node of four GPUs of two models, with a driver before 535: handles
    are ctypes pointers, structures are pynvml's own, errors are its NVMLError_* classes. NVML numbers the GPUs
    in PCI bus order; CUDA (fastest first) numbers them C, D, A, B."""

    GPUS = [  # NVML's order: PCI bus 1B, 3B, 5B, 7B
        {"bus": b"00000000:1B:00.0", "uuid": "GPU-aaaa", "name": "NVIDIA A100-SXM4-40GB", "util": 11, "power": 61000},
        {"bus": b"00000000:3B:00.0", "uuid": "GPU-bbbb", "name": "NVIDIA A100-SXM4-40GB", "util": 22, "power": 62000},
        {"bus": b"00000000:5B:00.0", "uuid": "GPU-cccc", "name": "NVIDIA H100 80GB HBM3", "util": 77, "power": 377000},
        {"bus": b"00000000:7B:00.0", "uuid": "GPU-dddd", "name": "NVIDIA H100 80GB HBM3", "util": 88, "power": 388000},
    ]
    CUDA_BUS_IDS = ["0000:5B:00.0", "0000:7B:00.0", "0000:1B:00.0", "0000:3B:00.0"]  # CUDA's order

    def __init__(self):
        import pynvml

        self.p = pynvml
        self._handles = [ctypes.cast(ctypes.c_void_p(0x1000 + 16 * i), pynvml.c_nvmlDevice_t)
                         for i in range(len(self.GPUS))]
        for name in dir(pynvml):
            if name.startswith("NVMLError"):
                setattr(self, name, getattr(pynvml, name))

    def _gpu(self, h) -> dict:
        addr = ctypes.cast(h, ctypes.c_void_p).value
        return self.GPUS[(addr - 0x1000) // 16]

    def nvmlInit(self):
        return None

    def nvmlDeviceGetCount(self):
        return len(self.GPUS)

    def nvmlDeviceGetHandleByIndex(self, i):
        if not 0 <= int(i) < len(self.GPUS):
            raise self.p.NVMLError(self.p.NVML_ERROR_INVALID_ARGUMENT)
        return self._handles[int(i)]

    def nvmlDeviceGetHandleByUUID(self, uuid):
        for h, g in zip(self._handles, self.GPUS):
            if g["uuid"] == uuid:
                return h
        raise self.p.NVMLError(self.p.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetHandleByPciBusId(self, bus):
        from raysweep.serve.telemetry import same_bus

        for h, g in zip(self._handles, self.GPUS):
            if same_bus(g["bus"], bus):
                return h
        raise self.p.NVMLError(self.p.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetName(self, h):
        return self._gpu(h)["name"]

    def nvmlDeviceGetPciInfo(self, h):
        info = self.p.nvmlPciInfo_t()
        info.busId = self._gpu(h)["bus"]
        return info

    def nvmlDeviceGetUtilizationRates(self, h):
        return self.p.c_nvmlUtilization_t(gpu=self._gpu(h)["util"], memory=5)

    def nvmlDeviceGetMemoryInfo(self, h):
        return self.p.c_nvmlMemory_t(total=80 * 2**30, free=70 * 2**30, used=10 * 2**30)

    def nvmlDeviceGetPowerUsage(self, h):
        return ctypes.c_uint(self._gpu(h)["power"]).value

    def nvmlDeviceGetClockInfo(self, h, clock):
        return ctypes.c_uint(1980).value

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):  # the binding has it; a driver before 535 does not
        raise self.p.NVMLError(self.p.NVML_ERROR_FUNCTION_NOT_FOUND)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return ctypes.c_ulonglong(0x4 if self._gpu(h)["util"] > 50 else 0).value

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        raise self.p.NVMLError(self.p.NVML_ERROR_NOT_SUPPORTED)


def test_telemetry_reads_the_servers_own_gpus_where_nvml_and_cuda_number_them_differently():
    pytest.importorskip("pynvml")
    from raysweep.serve import telemetry

    fake = FakePynvml()
    # Ray gave the server CUDA devices 0 and 1 (CUDA_VISIBLE_DEVICES=0,1): the two H100s at PCI 5B and 7B
    sampler = telemetry.Sampler(["0", "1"], nvml=fake, source="nvml", cuda_bus_ids=lambda: fake.CUDA_BUS_IDS[:2])
    assert sampler.source == "nvml"
    rows = sampler.sample()
    assert [(r["gpu"], r["util"], r["power_w"]) for r in rows] == [("0", 77, 377.0), ("1", 88, 388.0)]
    # a driver before 535: the throttle reasons come from the older call, with the same bits
    assert [r["reasons"] for r in rows] == [0x4, 0x4]
    assert telemetry.summarise([{"source": "nvml", "samples": rows}])["gpu_throttle_reasons"] == "sw_power_cap"
    assert rows[0]["mem_mib"] == 10 * 1024 and rows[0]["sm_mhz"] == 1980
    # without CUDA's driver, a node of mixed models is not read by index (it would be the A100s)
    blind = telemetry.Sampler(["0", "1"], nvml=fake, source="nvml", cuda_bus_ids=lambda: None)
    assert blind.nvml is None and "mixes GPU models" in blind.source and "CUDA_DEVICE_ORDER" in blind.source
    # UUIDs are read by UUID
    by_uuid = telemetry.Sampler(["GPU-dddd"], nvml=fake, source="nvml")
    assert [r["util"] for r in by_uuid.sample()] == [88]
    # a bus id NVML does not know is NVML's own NotFound, recorded, not raised
    lost = telemetry.Sampler(["0"], nvml=fake, source="nvml", cuda_bus_ids=lambda: ["0000:9B:00.0"])
    assert lost.nvml is None and lost.source.startswith("unavailable: NVMLError_NotFound")


def test_pci_bus_ids_as_nvml_and_cuda_write_them():
    from raysweep.serve import telemetry

    assert telemetry.same_bus(b"00000000:3B:00.0", "0000:3b:00.0")
    assert telemetry.same_bus("3B:00.0", "0000:3B:00.0")
    assert not telemetry.same_bus("0000:3B:00.0", "0000:5B:00.0") and not telemetry.same_bus("x", "x")
    assert telemetry.cuda_pci_bus_ids() is None or isinstance(telemetry.cuda_pci_bus_ids(), list)


# ---------------------------------------------------------------------------------------------------
# The fabric probe bootstraps NCCL as the server's ranks do: the same interface variables
# ---------------------------------------------------------------------------------------------------


def test_only_the_variables_that_steer_the_fabric_go_to_the_probe():
    from raysweep.place.fabric import fabric_env

    env = {"NCCL_IB_HCA": "mlx5_0,mlx5_1", "NCCL_SOCKET_IFNAME": "bond0", "GLOO_SOCKET_IFNAME": "bond0",
           "UCX_NET_DEVICES": "mlx5_0:1", "FI_PROVIDER": "efa", "NCCL_NET": "IB", "NCCL_DEBUG": "INFO",
           "NCCL_DEBUG_FILE": "/tmp/n.%h.%p", "HF_TOKEN": "secret", "VLLM_ENGINE_READY_TIMEOUT_S": "900"}
    assert fabric_env(env) == {k: env[k] for k in ("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME",
                                                     "UCX_NET_DEVICES", "FI_PROVIDER", "NCCL_NET")}


@pytest.mark.ray
def test_the_probe_and_the_server_get_the_same_interface_variables(gpu_cluster):
    """A probe rank and a server host in the same bundle, given the campaign's serve.env: the same address,
    interfaces and fabric variables (the probe used to set only GLOO_SOCKET_IFNAME, and only for gloo)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from raysweep.place.fabric import ProbeRank
    from raysweep.serve.server import ServerHost

    pg = placement_group([{"CPU": 1.0, "GPU": 2}], strategy="STRICT_PACK")
    assert pg.wait(60)
    strategy = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0)
    host = ServerHost.options(num_cpus=0.5, num_gpus=1, scheduling_strategy=strategy).remote("net-x")
    rank = ProbeRank.options(num_gpus=1, scheduling_strategy=strategy).remote()
    try:
        for env in ({}, {"NCCL_IB_HCA": "mlx5_0", "NCCL_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo",
                         "UCX_NET_DEVICES": "mlx5_0:1", "NCCL_DEBUG": "INFO", "HF_TOKEN": "x"}):
            server = ray.get(host.network_for.remote(env), timeout=60)
            probe = ray.get(rank.network.remote(env), timeout=60)
            assert probe == server, (env, probe, server)
            assert server["VLLM_HOST_IP"] and server["GLOO_SOCKET_IFNAME"] and server["NCCL_SOCKET_IFNAME"]
            assert all(server[k] == v for k, v in env.items() if k not in ("NCCL_DEBUG", "HF_TOKEN"))
            assert "HF_TOKEN" not in probe and "NCCL_DEBUG" not in probe
    finally:
        ray.kill(host)
        ray.kill(rank)
        remove_placement_group(pg)

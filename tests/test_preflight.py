"""Preflight: the parsers of nvidia-smi, the InfiniBand sysfs files and ibv_devinfo; the comparison of
nodes; the gathering function shipped by value; and the real preflight on the session's simulated cluster,
through `run_preflight` and through `raysweep preflight`."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from raysweep.place import netcheck, preflight
from raysweep.place.preflight import (
    NO_NVIDIA_SMI,
    compare,
    gather_node,
    node_report,
    parse_ib_sysfs,
    parse_ibv_devinfo,
    parse_nvidia_smi,
    read_ib_sysfs,
)

H100 = "".join(f"{i}, NVIDIA H100 80GB HBM3, 81559 MiB, 550.54.15\n" for i in range(8))
NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
             "latest NVIDIA driver is installed and running.\n\n")
IBV_DEVINFO = """hca_id:\tmlx5_0
\ttransport:\t\t\tInfiniBand (0)
\tfw_ver:\t\t\t\t28.39.1002
\tnode_guid:\t\t\t946d:ae03:00f1:2a3c
\tvendor_id:\t\t\t0x02c9
\tboard_id:\t\t\tMT_0000000838
\tphys_port_cnt:\t\t\t1
\t\tport:\t1
\t\t\tstate:\t\t\tPORT_ACTIVE (4)
\t\t\tmax_mtu:\t\t4096 (5)
\t\t\tactive_mtu:\t\t4096 (5)
\t\t\tsm_lid:\t\t\t1
\t\t\tlink_layer:\t\tInfiniBand

hca_id:\tmlx5_1
\ttransport:\t\t\tInfiniBand (0)
\tfw_ver:\t\t\t\t28.39.1002
\tboard_id:\t\t\tMT_0000000838
\tphys_port_cnt:\t\t\t1
\t\tport:\t1
\t\t\tstate:\t\t\tPORT_DOWN (1)
\t\t\tactive_mtu:\t\t4096 (5)
\t\t\tlink_layer:\t\tInfiniBand
"""


def _port(root: Path, dev: str, port: int, **files: str) -> None:
    d = root / dev / "ports" / str(port)
    d.mkdir(parents=True)
    for name, text in files.items():
        (d / name).write_text(text + "\n")


def fake_ib_tree(root: Path) -> Path:
    """Two HCAs as sysfs shows them: mlx5_0 port 1 ACTIVE at 400 Gb/s, mlx5_1 port 1 DOWN."""
    _port(root, "mlx5_0", 1, state="4: ACTIVE", phys_state="5: LinkUp", rate="400 Gb/sec (4X NDR)",
          link_layer="InfiniBand")
    _port(root, "mlx5_1", 1, state="1: DOWN", phys_state="3: Disabled", rate="10 Gb/sec (4X SDR)",
          link_layer="InfiniBand")
    return root


# ---------------------------------------------------------------------------------------------------
# Parsers
# ---------------------------------------------------------------------------------------------------

def test_nvidia_smi_eight_h100s():
    gpu = parse_nvidia_smi(H100)
    assert gpu["status"] == "ok" and gpu["error"] == "" and gpu["unparsed"] == []
    assert [d["index"] for d in gpu["devices"]] == list(range(8))
    assert gpu["devices"][3] == {"index": 3, "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559,
                                 "driver": "550.54.15"}


def test_nvidia_smi_odd_fields_and_failures():
    odd = parse_nvidia_smi("0, Some GPU, rev 2, [N/A], 535.104.05\nWARNING: infoROM is corrupted at gpu 0000:4E:00.0\n")
    assert odd["status"] == "ok" and odd["devices"] == [
        {"index": 0, "name": "Some GPU, rev 2", "memory_mib": None, "driver": "535.104.05"}]
    assert odd["unparsed"] == ["WARNING: infoROM is corrupted at gpu 0000:4E:00.0"]
    failed = parse_nvidia_smi(NO_DRIVER, returncode=9)
    assert failed["status"] == "error" and failed["devices"] == []
    assert failed["error"].startswith("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver")
    none = parse_nvidia_smi("No devices were found\n", returncode=6)
    assert none["status"] == "error" and none["error"] == "No devices were found"
    assert parse_nvidia_smi("garbage\n")["status"] == "error"
    assert parse_nvidia_smi("", returncode=2, stderr="")["error"] == "nvidia-smi exited with code 2"
    # the gathered forms: not on PATH, could not run, ran
    assert preflight.gpu_facts(None)["status"] == NO_NVIDIA_SMI
    timed_out = preflight.gpu_facts({"rc": None, "stdout": "", "stderr": "",
                                     "error": "nvidia-smi timed out after 20 s"})
    assert timed_out["status"] == "error" and "timed out" in timed_out["error"]
    assert len(preflight.gpu_facts({"rc": 0, "stdout": H100, "stderr": "", "error": ""})["devices"]) == 8


def test_infiniband_sysfs_tree_with_an_active_and_a_down_port(tmp_path):
    root = fake_ib_tree(tmp_path / "infiniband")
    raw = read_ib_sysfs(root)
    assert raw == {"mlx5_0": {"1": {"state": "4: ACTIVE", "phys_state": "5: LinkUp", "rate": "400 Gb/sec (4X NDR)",
                                    "link_layer": "InfiniBand"}},
                   "mlx5_1": {"1": {"state": "1: DOWN", "phys_state": "3: Disabled", "rate": "10 Gb/sec (4X SDR)",
                                    "link_layer": "InfiniBand"}}}
    ib = parse_ib_sysfs(raw)
    assert (ib["devices"], ib["device_count"], ib["port_count"], ib["active_ports"]) == (["mlx5_0", "mlx5_1"], 2, 2, 1)
    assert ib["active_rates"] == ["400 Gb/sec (4X NDR)"]
    up, down = ib["ports"]
    assert up == {"device": "mlx5_0", "port": "1", "state": "ACTIVE", "state_code": 4, "phys_state": "LinkUp",
                  "rate": "400 Gb/sec (4X NDR)", "rate_gbps": 400.0, "link_layer": "InfiniBand", "active": True}
    assert (down["state"], down["state_code"], down["phys_state"], down["active"]) == ("DOWN", 1, "Disabled", False)
    assert read_ib_sysfs(tmp_path / "absent") == {}
    assert parse_ib_sysfs({}) == {"devices": [], "device_count": 0, "ports": [], "port_count": 0, "active_ports": 0,
                                  "active_rates": []}
    # a port whose files cannot all be read keeps what it has
    _port(root, "mlx5_2", 1, state="4: ACTIVE")
    partial = parse_ib_sysfs(read_ib_sysfs(root))["ports"][-1]
    assert partial["active"] and partial["rate"] is None and partial["link_layer"] is None


def test_ibv_devinfo_summary():
    hcas = parse_ibv_devinfo(IBV_DEVINFO)
    assert [h["hca_id"] for h in hcas] == ["mlx5_0", "mlx5_1"]
    assert hcas[0]["fw_ver"] == "28.39.1002" and hcas[0]["board_id"] == "MT_0000000838"
    assert hcas[0]["ports"] == [{"port": 1, "state": "PORT_ACTIVE (4)", "active_mtu": "4096 (5)",
                                 "link_layer": "InfiniBand"}]
    assert hcas[1]["ports"][0]["state"] == "PORT_DOWN (1)"
    assert parse_ibv_devinfo("No IB devices found\n") == []
    assert preflight.ibv_facts({"rc": 255, "stdout": "", "stderr": "Failed to get IB devices list", "error": ""}) == \
        {"status": "error", "hcas": [], "error": "Failed to get IB devices list"}


def test_nccl_env_keeps_only_the_transport_variables():
    env = {"NCCL_IB_HCA": "mlx5", "NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0", "UCX_NET_DEVICES": "all",
           "FI_PROVIDER": "efa", "UCX_TLS": "rc", "FI_EFA_USE_DEVICE_RDMA": "1", "CUDA_VISIBLE_DEVICES": "0",
           "PATH": "/bin", "MY_NCCL_X": "1"}
    assert list(preflight.nccl_env(env)) == ["FI_PROVIDER", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_SOCKET_IFNAME",
                                             "UCX_NET_DEVICES"]


# ---------------------------------------------------------------------------------------------------
# Comparison
# ---------------------------------------------------------------------------------------------------

def _ib_ports(active: int, total: int = 8) -> dict:
    return {f"mlx5_{i}": {"1": {"state": "4: ACTIVE" if i < active else "1: DOWN",
                                "phys_state": "5: LinkUp" if i < active else "3: Disabled",
                                "rate": "400 Gb/sec (4X NDR)", "link_layer": "InfiniBand"}} for i in range(total)}


def made_node(name: str, *, driver: str = "550.54.15", active: int = 8, gpus: int = 8, ray_gpus: int = 8,
              env: dict | None = None, vllm: str = "0.11.0", smi: bool = True) -> dict:
    smi_out = "".join(f"{i}, NVIDIA H100 80GB HBM3, 81559 MiB, {driver}\n" for i in range(gpus))
    facts = {"hostname": name, "node_id": name * 4,
             "nvidia_smi": {"rc": 0, "stdout": smi_out, "stderr": "", "error": ""} if smi else None,
             "ib_sysfs": _ib_ports(active, 8 if gpus else 0), "ibv_devinfo": None,
             "env": env if env is not None else {"NCCL_IB_HCA": "mlx5", "NCCL_SOCKET_IFNAME": "bond0"},
             "versions": {"python": "3.11.9", "ray": "2.60.0", "vllm": vllm, "torch": "2.8.0+cu128",
                          "torch_cuda": "12.8", "torch_nccl": "2.27.3"}}
    ray_node = {"NodeID": name * 4, "NodeManagerAddress": f"10.0.0.{len(name)}", "NodeManagerHostname": name,
                "Resources": {"CPU": 96.0, "GPU": float(ray_gpus)}, "Labels": {"ray.io/node-id": name * 4}}
    return node_report(ray_node, facts)


def _found(findings) -> set[tuple]:
    return {(f.node_id[:4], f.field, f.value, f.majority, f.tie) for f in findings}


def test_four_nodes_one_with_another_driver_one_without_active_infiniband():
    nodes = [made_node("aaaa"), made_node("bbbb", driver="535.104.05"), made_node("cccc", active=0),
             made_node("dddd")]
    findings, warnings = compare(nodes)
    assert _found(findings) == {("bbbb", "driver_version", "535.104.05", "550.54.15", False),
                                ("cccc", "ib_active_ports", 0, 8, False)}
    assert [f.node for f in findings if f.node_id.startswith("bbbb")] == ["bbbb bbbbbbbb"]
    assert [(w.node_id[:4], w.message) for w in warnings] == [
        ("cccc", "GPU node without any active InfiniBand port (8 device(s), 8 port(s)): NCCL between nodes would "
                 "use TCP sockets")]
    # a head without GPUs is compared on software only: no finding, no warning of its own
    head = made_node("head", gpus=0, ray_gpus=0, env={}, smi=False)
    findings_with_head, warnings_with_head = compare([head, *nodes])
    assert _found(findings_with_head) == _found(findings) and len(warnings_with_head) == len(warnings)
    # the whole report is JSON
    report = preflight.Preflight(nodes=nodes, findings=findings, warnings=warnings).to_dict()
    assert json.loads(json.dumps(report))["summary"] == {"nodes": 4, "gpu_nodes": 4, "findings": 2, "warnings": 1}


def test_versions_env_gpu_counts_and_ties():
    nodes = [made_node("aaaa"), made_node("bbbb", env={"NCCL_IB_HCA": "mlx5"}),
             made_node("cccc", vllm="0.10.2", gpus=7, ray_gpus=8), made_node("dddd")]
    findings, warnings = compare(nodes)
    assert _found(findings) == {("bbbb", "env:NCCL_SOCKET_IFNAME", None, "bond0", False),
                                ("cccc", "vllm", "0.10.2", "0.11.0", False), ("cccc", "gpu_count", 7, 8, False)}
    assert [(w.node_id[:4], w.message) for w in warnings] == [("cccc", "Ray says 8 GPUs but nvidia-smi lists 7")]
    # two against two: no majority, all four named
    tied, _ = compare([made_node("aaaa"), made_node("bbbb"), made_node("cccc", driver="535.104.05"),
                       made_node("dddd", driver="535.104.05")])
    assert {(f.node_id[:4], f.field, f.majority, f.tie) for f in tied} == {
        (n, "driver_version", None, True) for n in ("aaaa", "bbbb", "cccc", "dddd")}
    # nvidia-smi missing on one GPU node, failing on another; a node that did not answer
    gone = node_report({"NodeID": "eeee" * 4, "Resources": {"GPU": 8.0}}, None, "no answer within 120 s")
    broken = made_node("ffff")
    broken["gpu"] = parse_nvidia_smi(NO_DRIVER, returncode=9)
    findings, warnings = compare([made_node("aaaa"), made_node("bbbb"), made_node("cccc", smi=False), broken, gone])
    assert _found(findings) == {("cccc", "gpu_count", NO_NVIDIA_SMI, 8, False),
                                ("ffff", "gpu_count", "nvidia-smi failed", 8, False)}
    messages = {(w.node_id[:4], w.message) for w in warnings}
    assert ("eeee", "no report from this node: no answer within 120 s") in messages
    assert ("ffff", "nvidia-smi failed: " + NO_DRIVER.strip()) in messages
    assert not any(n == "cccc" for n, _ in messages)  # Ray vs nvidia-smi only when nvidia-smi ran


def test_node_rows_for_the_table():
    rows = dict(preflight.describe_node(made_node("aaaa", active=7)))
    assert rows["GPUs (nvidia-smi)"] == "8 x NVIDIA H100 80GB HBM3 (81559 MiB)" and rows["driver"] == "550.54.15"
    assert rows["InfiniBand"].startswith("8 device(s), 7/8 port(s) active: mlx5_0/1 ACTIVE LinkUp 400 Gb/sec")
    assert rows["NCCL env"] == "NCCL_IB_HCA=mlx5, NCCL_SOCKET_IFNAME=bond0"
    assert rows["versions"] == "python 3.11.9, ray 2.60.0, vllm 0.11.0, torch 2.8.0+cu128 (CUDA 12.8, NCCL 2.27.3)"
    assert rows["resources"] == "CPU 96, GPU 8"


def test_the_gathering_function_runs_where_raysweep_is_not_installed(tmp_path):
    """It is shipped to the nodes by value: unpickled in a Python that cannot import raysweep, it still runs."""
    import ray.cloudpickle

    root = fake_ib_tree(tmp_path / "infiniband")
    ray.cloudpickle.register_pickle_by_value(preflight)  # what run_preflight does
    ray.cloudpickle.register_pickle_by_value(netcheck)
    blob = tmp_path / "gather.pkl"
    blob.write_bytes(ray.cloudpickle.dumps(gather_node))
    code = ("import json, pickle, sys; sys.modules['raysweep'] = None; "
            f"f = pickle.loads(open({str(blob)!r}, 'rb').read()); print(json.dumps(f({str(root)!r}, 10)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["ib_sysfs"] == read_ib_sysfs(root)
    assert facts["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert facts["versions"]["vllm"] == importlib.metadata.version("vllm")
    assert facts["net"]["interfaces"]["lo"][0] == "127.0.0.1" and facts["net"]["versions"]["vllm"] == \
        importlib.metadata.version("vllm")


# ---------------------------------------------------------------------------------------------------
# On the simulated cluster
# ---------------------------------------------------------------------------------------------------

def _alive() -> dict[str, dict]:
    import ray

    return {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}


@pytest.mark.ray
def test_preflight_on_the_simulated_cluster(gpu_cluster, tmp_path):
    root = fake_ib_tree(tmp_path / "infiniband")
    pre = preflight.run_preflight(sysfs_root=str(root))
    alive = _alive()
    assert sorted(n["node_id"] for n in pre.nodes) == sorted(alive) and len(alive) == 4
    assert pre.nodes[0]["is_head"] and not any(n["is_head"] for n in pre.nodes[1:])
    smi = shutil.which("nvidia-smi")
    for n in pre.nodes:
        assert n["error"] == "" and n["ran_on"] == n["node_id"]  # each task ran on the node it was pinned to
        assert n["ray"]["gpus"] == (0 if n["is_head"] else 4)
        assert n["ray"]["labels"]["ray.io/node-id"] == n["node_id"]
        assert n["infiniband"]["device_count"] == 2 and n["infiniband"]["active_ports"] == 1
        assert n["infiniband"]["active_rates"] == ["400 Gb/sec (4X NDR)"]
        if smi is None:
            assert n["gpu"] == {"status": NO_NVIDIA_SMI, "devices": [], "error": "", "unparsed": []}
        assert n["versions"]["vllm"] == importlib.metadata.version("vllm")
        assert n["versions"]["ray"] == "2.60.0"
        assert n["env"] == preflight.nccl_env(os.environ)
    labels = {n["ray"]["labels"].get("node-name"): n["ray"]["labels"].get("gpu-type") for n in pre.nodes[1:]}
    assert labels == {"w0": "H100", "w1": "H100", "w2": "A100"}
    assert pre.findings == []  # one machine under it all: nothing differs
    if smi is None:
        assert pre.warnings == []  # an active port everywhere, and no nvidia-smi to disagree with Ray


@pytest.mark.ray
def test_preflight_command_json_out_and_strict(gpu_cluster, tmp_path, monkeypatch):
    from raysweep.cli import main

    monkeypatch.setattr(preflight, "IB_SYSFS", str(tmp_path / "no-infiniband"))
    out_file = tmp_path / "pre" / "preflight.json"
    res = CliRunner().invoke(main, ["preflight", "--address", gpu_cluster.address, "--json", "--strict",
                                    "--out", str(out_file)])
    assert res.exit_code == 1, res.output  # --strict: the GPU nodes have no InfiniBand
    data = json.loads(res.stdout)
    assert data == json.loads(out_file.read_text())
    assert data["summary"]["nodes"] == 4 and data["summary"]["gpu_nodes"] == 3 and data["findings"] == []
    gpu_ids = {n["node_id"] for n in data["nodes"] if n["ray"]["gpus"] == 4}
    no_ib = [w for w in data["warnings"]
             if w["message"].startswith("GPU node without any active InfiniBand port (0 device(s), 0 port(s))")]
    assert {w["node_id"] for w in no_ib} == gpu_ids and len(no_ib) == len(gpu_ids) == 3
    assert all(n["infiniband"]["device_count"] == 0 for n in data["nodes"])
    # every host dialled every other host's TCP port (one machine here: all reached), the driver's versions kept
    assert len(data["reachability"]) == 4 * 3 and all(r["ok"] for r in data["reachability"])
    assert data["driver"]["vllm"] == importlib.metadata.version("vllm")
    assert all(n["net"]["interfaces"]["lo"][0] == "127.0.0.1" for n in data["nodes"])
    # tables, and exit 0 without --strict
    res = CliRunner().invoke(main, ["preflight", "--address", gpu_cluster.address])
    assert res.exit_code == 0, res.output
    assert res.stdout.count("Ray GPUs") == 4 and "(head)" in res.stdout and "gpu-type=A100" in res.stdout
    assert "4 node(s), 0 finding(s), 3 warning(s)" in res.stdout
    assert "TCP reachability between hosts: 12 of 12 connection(s) made" in res.stdout
    assert res.stdout.count("GPU node without any active InfiniBand port") == 3


def _broken(sysfs_root: str, timeout_s: float) -> dict:
    raise RuntimeError("cannot read this node")


@pytest.mark.ray
def test_nodes_that_fail_or_do_not_answer_are_reported_not_fatal(gpu_cluster, monkeypatch):
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this file
    monkeypatch.setattr(preflight, "gather_node", _broken)
    pre = preflight.run_preflight()
    assert len(pre.nodes) == 4 and pre.findings == []
    assert {w.message for w in pre.warnings} == {
        "no report from this node: RuntimeError: cannot read this node"}
    assert len(pre.warnings) == 4
    monkeypatch.undo()
    pre = preflight.run_preflight(timeout_s=0.001)
    assert [n["error"] for n in pre.nodes] == ["no answer within 0.001 s"] * 4 and pre.findings == []


# -- GPU topology (`nvidia-smi topo -m`, fixtures of an NVLink node across 2 NUMA nodes and a PCIe node) ------

def _topo(name: str) -> str:
    return (Path(__file__).parent / "fixtures" / name).read_text()


def test_topo_matrix_is_parsed_with_links_cpu_and_numa_affinity():
    from raysweep.place.preflight import parse_topo

    t = parse_topo(_topo("topo_nvlink_2numa.txt"))
    assert sorted(t["gpus"]) == ["0", "1", "2", "3"]
    assert t["gpus"]["0"]["links"] == {"1": "NV18", "2": "NV18", "3": "NV18"}  # the NIC column is not a GPU
    assert t["gpus"]["2"]["numa"] == "1" and t["gpus"]["0"]["cpu_affinity"] == "0-55,112-167"
    assert parse_topo("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.") == {}


@pytest.mark.parametrize("fixture, gpus, tp, words", [
    ("topo_nvlink_2numa.txt", ["0", "1", "2", "3"], 4, ["GPUs 0,1,2,3 spans NUMA nodes 0,1"]),
    ("topo_nvlink_2numa.txt", ["0", "1", "2", "3"], 2, []),           # each pair on NVLink and one NUMA node
    ("topo_pcie.txt", ["0", "1"], 2, ["GPUs 0,1 has no NVLink between GPU0-GPU1 PIX"]),
    ("topo_pcie.txt", ["1", "2"], 2, ["GPU1-GPU2 SYS", "spans NUMA nodes 0,1"]),
    ("topo_pcie.txt", ["0", "1"], 1, []),                              # no tensor parallelism: nothing to say
])
def test_tensor_parallel_groups_without_nvlink_or_across_numa_are_warned(fixture, gpus, tp, words):
    from raysweep.place.preflight import parse_topo, tp_group_warnings

    got = " | ".join(tp_group_warnings(parse_topo(_topo(fixture)), gpus, tp))
    assert all(w in got for w in words) and (bool(got) == bool(words))


def test_topology_facts_without_nvidia_smi_or_with_an_error():
    from raysweep.place.preflight import NO_NVIDIA_SMI, topo_facts

    assert topo_facts(None) == {"topology": {}, "topology_status": NO_NVIDIA_SMI}
    bad = topo_facts({"rc": 9, "stdout": "", "stderr": "driver not loaded", "error": ""})
    assert bad["topology"] == {} and bad["topology_status"] == "error: driver not loaded"
    ok = topo_facts({"rc": 0, "stdout": _topo("topo_pcie.txt"), "stderr": "", "error": ""})
    assert ok["topology_status"] == "ok" and ok["topology"]["gpus"]["3"]["links"]["2"] == "PIX"

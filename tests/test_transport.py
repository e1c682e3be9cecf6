"""NCCL log parsing and transport verdicts, on real NCCL lines of several versions and made variants."""

from __future__ import annotations

import pytest

from raysweep.place.transport import classify, meets, parse_nccl, refusal, server_verdict

REAL = {
    "ib_gdr_old_busid": "10-90-43-152:120890:121560 [0] NCCL INFO Channel 01 : 2[c7000] -> 0[87000] [receive] "
                        "via NET/IB/5/GDRDMA",
    "ibext_gdr": "VM-17-82-centos:11980:12549 [2] NCCL INFO Channel 03/0 : 2[2] -> 10[2] [send] via NET/IBext/2/GDRDMA",
    "ibext_no_gdr": "hostname-test:987:1260 [7] NCCL INFO Channel 03/0 : 47[7] -> 39[7] [receive] via NET/IBext_v8/2",
    "socket_ray": "(EngineCore_DP0 pid=742) (RayWorkerWrapper pid=927) corona:927:927 [0] NCCL INFO Channel 00/0 : "
                  "0[0] -> 1[0] [send] via NET/Socket/0 comm 0x2083dd50 nRanks 02",
    "socket_shared": "VM-16-64-ubuntu:28471:28471 [0] NCCL INFO Channel 01/1 : 0[0] -> 1[1] [send] "
                     "via NET/Socket/0/Shared",
    "p2p_cumem": "ip-172-31-3-153:35113:35488 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
    "p2p_ipc_ray": "(RayWorkerWrapper pid=581, ip=10.225.128.18) k8s17:581:581 [0] NCCL INFO Channel 00/0 : "
                   "16[17000] -> 18[21000] via P2P/IPC comm 0x5609976f9470 nRanks 32",
    "shm_ansi": "\x1b[36m(RayWorkerVllm pid=4095)\x1b[0m mwh-0:4095:4484 [1] NCCL INFO Channel 00 : 1[1] -> 2[2] "
                "via SHM/direct/direct",
    "socket_using": "3837134f4773:4529:4529 [3] NCCL INFO NET/Socket : Using [0]eth0:172.17.0.3<0>",
    "network_socket": "3837134f4773:4529:4529 [3] NCCL INFO Using network Socket",
    "no_ib": "[pod-name]:5310:5433 [7] NCCL INFO NET/IB : No device found. [repeated 12x across cluster]",
    "rings_gdr0": "llama-3-8b-node-0-0:152:510 [0] NCCL INFO Connected all rings, use ring PXN 0 GDR 0",
}
MADE = {
    "ib_devices": "n1:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE [RO]; OOB ib0:10.0.0.1<0>",
    "network_ib": "n1:1:1 [0] NCCL INFO Using network IB",
    "pxn_pci": "n1:1:1 [3] NCCL INFO Channel 02/1 : 3[3] -> 11[3] [send] via NET/IB/1(1)/GDRDMA(PCI)/Shared",
    "plugin_spaces": "n1:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/AWS Libfabric/0/GDRDMA",
    "shm_230": "n1:1:1 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct",
    "timestamped": "[2026-01-02 03:04:05] n1:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/direct pointer/read",
    "version": "n1:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4",
    "old_ring": "n1:1:1 [0] NCCL INFO Ring 00 : 1 -> 0 [receive] via NET/Socket/0",
}


@pytest.mark.parametrize("key, transport, plugin, gdr", [
    ("ib_gdr_old_busid", "NET", "IB", True), ("ibext_gdr", "NET", "IBext", True),
    ("ibext_no_gdr", "NET", "IBext_v8", False), ("socket_ray", "NET", "Socket", False),
    ("socket_shared", "NET", "Socket", False), ("p2p_cumem", "P2P", "", False), ("p2p_ipc_ray", "P2P", "", False),
    ("shm_ansi", "SHM", "", False), ("pxn_pci", "NET", "IB", True), ("plugin_spaces", "NET", "AWS Libfabric", True),
    ("shm_230", "SHM", "", False), ("timestamped", "P2P", "", False), ("old_ring", "NET", "Socket", False),
])
def test_every_channel_line_form_is_read(key, transport, plugin, gdr):
    rep = parse_nccl([{**REAL, **MADE}[key]])
    assert len(rep.links) == 1
    link = rep.links[0]
    assert (link.transport, link.plugin, link.gdr) == (transport, plugin, gdr)


def test_ray_prefixes_and_ansi_are_stripped_from_the_evidence():
    rep = parse_nccl([REAL["shm_ansi"], REAL["socket_ray"], REAL["no_ib"], "unrelated vLLM line"])
    assert rep.evidence[0].startswith("mwh-0:4095:4484 [1] NCCL INFO Channel 00")
    assert rep.evidence[1].startswith("corona:927:927") and rep.no_ib_device
    assert not any("repeated" in e or "\x1b" in e for e in rep.evidence) and len(rep.evidence) == 3
    assert (rep.links[1].src, rep.links[1].dst, rep.links[0].channel) == (0, 1, 0)


def test_devices_networks_and_versions():
    rep = parse_nccl([MADE["ib_devices"], MADE["network_ib"], REAL["socket_using"], MADE["version"]])
    assert rep.ib_devices == ["mlx5_0/IB", "mlx5_1/RoCE"] and rep.socket_devices == ["eth0:172.17.0.3"]
    assert rep.networks == {"IB"} and rep.versions == {"2.21.5+cuda12.4"}


def test_a_server_lists_each_ib_device_once_whatever_its_ranks_print():
    rank = [MADE["ib_devices"], REAL["ibext_gdr"]]
    v = server_verdict([rank, rank, rank[:1]])
    assert v["ib_devices"] == ["mlx5_0/IB", "mlx5_1/RoCE"] and v["nnodes"] == 3 and v["ranks_with_nccl"] == 3


@pytest.mark.parametrize("keys, intra, inter", [
    (["p2p_cumem", "ibext_gdr", "network_ib"], "P2P", "IB+GDR"),
    (["shm_ansi", "ibext_no_gdr"], "SHM", "IB"),
    (["p2p_cumem", "ibext_gdr", "rings_gdr0"], "P2P", "IB"),            # GDR 0 on the rings: no GPUDirect
    (["p2p_cumem", "ibext_gdr", "socket_shared"], "P2P", "Socket"),     # the slowest link decides
    (["socket_ray", "network_socket", "no_ib"], "none", "Socket"),
    (["p2p_ipc_ray", "shm_230"], "P2P", "none"),                        # one node: nothing crosses
    ([], "none", "none"),
])
def test_verdicts(keys, intra, inter):
    v = classify(parse_nccl([{**REAL, **MADE}[k] for k in keys]))
    assert (v["intra"], v["inter"]) == (intra, inter)


@pytest.mark.parametrize("inter, ib, gdr", [("IB+GDR", True, True), ("IB", True, False), ("Socket", False, False),
                                            ("none", False, False)])
def test_gate(inter, ib, gdr):
    v = {"inter": inter}
    assert meets(v, "any") and meets(v, "ib") is ib and meets(v, "gdr") is gdr


def _two_node_lines(via: str, rank: int) -> list[str]:
    """A 2-node pipeline of 2 GPUs per node as each node's NCCL prints it: ranks 2r and 2r+1 live on node r."""
    head = f"node{rank}:1:1 [0] NCCL INFO"
    return [f"{head} Channel 00/0 : {2 * rank}[0] -> {2 * rank + 1}[1] via P2P/CUMEM/read",
            f"{head} Channel 00/0 : {2 * rank + 1}[1] -> {2 * (1 - rank)}[0] [send] via {via}",
            f"{head} Channel 01/0 : {2 * (1 - rank) + 1}[1] -> {2 * rank}[0] [receive] via {via}"]


def test_the_per_link_table_has_each_rank_pair_on_its_nodes_and_each_node_pair():
    v = server_verdict([_two_node_lines("NET/IB/0/GDRDMA", 0), _two_node_lines("NET/IB/0/GDRDMA", 1)])
    pairs = {(r["src"], r["dst"]): (r["src_node"], r["dst_node"], r["kind"]) for r in v["links"]}
    assert pairs == {(0, 1): (0, 0, "P2P"), (1, 2): (0, 1, "IB+GDR"), (3, 0): (1, 0, "IB+GDR"),
                     (2, 3): (1, 1, "P2P")}
    nodes = {(r["src_node"], r["dst_node"]): r["kinds"] for r in v["node_links"]}
    assert nodes == {(0, 0): ["P2P"], (0, 1): ["IB+GDR"], (1, 0): ["IB+GDR"], (1, 1): ["P2P"]}
    assert v["inter"] == "IB+GDR" and meets(v, "gdr")


def test_one_slow_node_pair_fails_the_gate_even_when_another_is_fast():
    v = server_verdict([_two_node_lines("NET/IB/0/GDRDMA", 0), _two_node_lines("NET/Socket/0", 1)])
    nodes = {(r["src_node"], r["dst_node"]): r["kinds"] for r in v["node_links"]}
    assert nodes[(1, 0)] == ["Socket"] and nodes[(0, 1)] == ["Socket"]  # a pair takes its slowest channel
    assert v["inter"] == "Socket" and not meets(v, "ib") and meets(v, "any")
    why = refusal(v, "ib")
    assert "include Socket" in why and "node 1 -> node 0: Socket (1 rank pair)" in why


@pytest.mark.parametrize("via, kind, gates", [
    ("NET/AWS Libfabric/0/GDRDMA", "OFI+GDR", {"rdma", "gdr"}), ("NET/AWS Libfabric/0", "OFI", {"rdma"}),
    ("NET/OFI/1", "OFI", {"rdma"}), ("NET/IB/0", "IB", {"rdma", "ib"}),
    ("NET/IB/0/GDRDMA", "IB+GDR", {"rdma", "ib", "gdr"}), ("NET/Socket/0", "Socket", set()),
    ("NET/GPUDirectTCPX/0", "NET", set()),
])
def test_efa_is_its_own_class_not_infiniband(via, kind, gates):
    v = server_verdict([_two_node_lines(via, 0), _two_node_lines(via, 1)])
    assert v["inter"] == kind and {g for g in ("rdma", "ib", "gdr") if meets(v, g)} == gates


def test_a_verdict_stored_before_the_table_still_gates_on_its_slowest_link():
    assert meets({"inter": "IB"}, "ib") and not meets({"inter": "IB"}, "gdr") and not meets({"inter": "none"}, "ib")


def test_each_line_counts_for_the_host_it_names_even_when_read_by_another_node():
    """With NCCL_DEBUG_FILE on a shared filesystem every node reads every rank's file: node 0's log then
    holds node 1's lines too, which still count for node 1."""
    both = _two_node_lines("NET/IB/0", 0) + _two_node_lines("NET/IB/0", 1)
    v = server_verdict([both, both])
    nodes = {(r["src_node"], r["dst_node"]): r["kinds"] for r in v["node_links"]}
    assert nodes == {(0, 0): ["P2P"], (0, 1): ["IB"], (1, 0): ["IB"], (1, 1): ["P2P"]}
    assert "node 0 -> node 1: IB (1 rank pair)" in refusal(v, "gdr")

"""Host network checks (raysweep.place.netcheck): interface and address variables a host lacks, versions that differ
from the driver's, hosts that cannot reach each other; judged from injected facts, then on simulated Ray nodes
(which share one machine: what differs between them is injected through each node's environment)."""

from __future__ import annotations

import os

import pytest

from raysweep.place import netcheck, preflight
from raysweep.place.netcheck import env_problems, reach_problems, version_problems

# a lab host: its own address on a veth, as on a cluster of real hosts
HOST = {"hostname": "rs2", "interfaces": {"lo": ["127.0.0.1", "::1"], "rsp2": ["10.77.0.12", "fe80::1"]},
        "env": {}, "versions": {"raysweep": "0.1.0", "vllm": "0.32.0"}}


@pytest.mark.parametrize("env, words", [
    ({"GLOO_SOCKET_IFNAME": "eth0"}, ["GLOO_SOCKET_IFNAME=eth0", "names eth0, which this host lacks",
                                      "rsp2 10.77.0.12", "gloo cannot start"]),
    ({"GLOO_SOCKET_IFNAME": "rsp2,ib0"}, ["names ib0, which this host lacks"]),
    ({"NCCL_SOCKET_IFNAME": "eth,ib"}, ["NCCL_SOCKET_IFNAME=eth,ib", "matches no interface", "or prefix"]),
    ({"NCCL_SOCKET_IFNAME": "=rsp"}, ["NCCL_SOCKET_IFNAME==rsp (the node's environment) matches no interface"]),
    ({"VLLM_HOST_IP": "10.77.0.11"}, ["VLLM_HOST_IP=10.77.0.11", "is not an address of this host",
                                      "lo 127.0.0.1/::1, rsp2 10.77.0.12", "per host"]),
])
def test_interface_and_address_variables_a_host_lacks_are_named_with_the_fix(env, words):
    [problem] = env_problems(HOST, env)
    for w in words:
        assert w in problem, problem
    assert "fe80::1" not in problem  # link-local addresses are left out of the text


@pytest.mark.parametrize("env", [{}, {"GLOO_SOCKET_IFNAME": "rsp2"}, {"NCCL_SOCKET_IFNAME": "rsp"},
                                 {"NCCL_SOCKET_IFNAME": "=rsp2"}, {"NCCL_SOCKET_IFNAME": "^lo,docker"},
                                 {"VLLM_HOST_IP": "10.77.0.12"}, {"VLLM_HOST_IP": "::1"}])
def test_variables_that_fit_the_host_are_no_problem(env):
    assert env_problems(HOST, env) == []


def test_where_a_variable_comes_from_is_said():
    [p] = env_problems(HOST, {"VLLM_HOST_IP": "10.0.0.9"}, "serve.env")
    assert "VLLM_HOST_IP=10.0.0.9 (serve.env)" in p
    assert env_problems({"interfaces": {}}, {"GLOO_SOCKET_IFNAME": "x"}) == []  # nothing known: nothing judged


def test_versions_that_differ_from_the_drivers_are_named_with_the_fix():
    driver = {"raysweep": "0.2.0", "vllm": "0.32.0"}
    [p] = version_problems(HOST, driver)
    assert p == ("raysweep 0.1.0 on this host, 0.2.0 on the driver: install the driver's version on every host "
                 "(pip install 'raysweep==0.2.0' in the Python that Ray runs there)")
    assert version_problems(HOST, {"raysweep": "0.1.0", "vllm": "0.31.0"})[0].startswith("vllm 0.32.0 on this host")
    # a driver without vLLM (a laptop submitting to a cluster) compares no vLLM
    assert version_problems(HOST, {"raysweep": "0.1.0", "vllm": netcheck.NOT_INSTALLED}) == []
    missing = {**HOST, "versions": {"raysweep": netcheck.NOT_INSTALLED, "vllm": "0.32.0"}}
    [p] = version_problems(missing, {"raysweep": "0.1.0"})
    assert "raysweep not installed on this host, 0.1.0 on the driver" in p


def test_failed_connections_are_told_on_the_dialing_host_naming_the_other():
    results = [{"from": "a", "to": "b", "ip": "10.77.0.12", "port": 4242, "ok": False, "ms": None,
                "error": "[Errno 13] Permission denied"},
               {"from": "b", "to": "a", "ip": "10.77.0.11", "port": 4343, "ok": True, "ms": 0.2, "error": ""}]
    said = reach_problems(results, {"b": "rs2 (10.77.0.12)"})
    assert list(said) == ["a"]
    assert said["a"][0].startswith("cannot reach rs2 (10.77.0.12) at 10.77.0.12:4242 over TCP ([Errno 13] "
                                   "Permission denied)")


def test_preflight_warns_on_the_node_whose_facts_do_not_fit_and_compares_with_the_driver():
    def report(node_id: str, net: dict) -> dict:
        return {"node_id": node_id, "hostname": net["hostname"], "ip": "", "error": "", "net": net,
                "ray": {"gpus": 0, "resources": {}, "labels": {}}}

    bad = {**HOST, "hostname": "rs3", "env": {"GLOO_SOCKET_IFNAME": "eth0", "VLLM_HOST_IP": "10.77.0.12"},
           "interfaces": {"lo": ["127.0.0.1"], "rsp3": ["10.77.0.13"]}}
    _, warnings = preflight.compare([report("n2", HOST), report("n3", bad)], {"raysweep": "0.1.0", "vllm": "0.32.0"})
    assert [w.node_id for w in warnings] == ["n3", "n3"]
    assert "GLOO_SOCKET_IFNAME=eth0" in warnings[0].message and "VLLM_HOST_IP=10.77.0.12" in warnings[1].message
    rows = dict(preflight.describe_node({**report("n3", bad), "ray": {"gpus": 0, "resources": {}, "labels": {}}}))
    assert rows["interfaces"] == "lo 127.0.0.1, rsp3 10.77.0.13"
    assert rows["address env"] == "GLOO_SOCKET_IFNAME=eth0, VLLM_HOST_IP=10.77.0.12"


# ---------------------------------------------------------------------------------------------------
# On simulated nodes
# ---------------------------------------------------------------------------------------------------

@pytest.mark.ray
def test_every_host_reaches_every_other_and_a_closed_port_is_found(gpu_cluster):
    import ray

    nodes = [(n["NodeID"], n["NodeManagerAddress"]) for n in ray.nodes() if n["Alive"]]
    results = netcheck.probe_reachability(nodes)
    assert len(results) == len(nodes) * (len(nodes) - 1) and all(r["ok"] for r in results), results
    assert {(r["from"], r["to"]) for r in results} == {(a, b) for a, _ in nodes for b, _ in nodes if a != b}
    # one host's listener closed after the others learnt its port: every other host fails to reach it
    shut = nodes[1][0]
    results = netcheck.probe_reachability(nodes, 2.0, between=lambda probes: ray.get(probes[shut].close.remote()))
    failed = [r for r in results if not r["ok"]]
    assert {r["to"] for r in failed} == {shut} and {r["from"] for r in failed} == {n for n, _ in nodes} - {shut}
    said = reach_problems(results, {shut: "the closed one"})
    assert sorted(said) == sorted(n for n, _ in nodes if n != shut)
    assert all("cannot reach the closed one" in m and "refused" in m.lower() for ms in said.values() for m in ms)


@pytest.mark.ray
def test_preflight_and_the_start_check_catch_a_host_whose_environment_names_a_missing_interface(
        gpu_cluster, tmp_path, monkeypatch):
    """A node started with GLOO_SOCKET_IFNAME and VLLM_HOST_IP that fit no host (Ray's workers inherit the
    environment of their raylet): preflight warns about that node only, and a configuration placed there is
    refused before its server starts, with the fix."""
    from helpers import add_nodes, remove_nodes, run_file, standin_campaign

    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "rsnosuch0")
    monkeypatch.setenv("VLLM_HOST_IP", "10.77.0.99")
    pool = add_nodes(gpu_cluster, "badenv", n=1)
    monkeypatch.undo()
    try:
        bad = pool[0].node_id
        pre = preflight.run_preflight(driver={"raysweep": "0.1.0", "vllm": "0.0.1-other"})
        net = [w for w in pre.warnings if "GLOO_SOCKET_IFNAME" in w.message or "VLLM_HOST_IP" in w.message]
        assert {w.node_id for w in net} == {bad} and len(net) == 2, [w.message for w in pre.warnings]
        assert "GLOO_SOCKET_IFNAME=rsnosuch0 (the node's environment) names rsnosuch0" in net[0].message
        assert "VLLM_HOST_IP=10.77.0.99 (the node's environment) is not an address of this host" in net[1].message
        # the driver given another vLLM: every node is told to install the driver's
        vers = [w for w in pre.warnings if w.message.startswith("vllm ")]
        assert len(vers) == len(pre.nodes) and all("install the driver's version" in w.message for w in vers)
        assert len(pre.reachability) == len(pre.nodes) * (len(pre.nodes) - 1)
        assert all(r["ok"] for r in pre.reachability)
        # the check before a server starts: that node refused, the others pass; serve.env is judged too
        refused = netcheck.start_refusal([bad], {})
        assert refused is not None and refused.count("\n") == 1 and "rsnosuch0" in refused
        others = [n["node_id"] for n in pre.nodes if n["node_id"] != bad and n["ray"]["gpus"]]
        assert netcheck.start_refusal(others, {}) is None
        said = netcheck.start_refusal(others[:1], {"NCCL_SOCKET_IFNAME": "ib"})
        assert said is not None and "NCCL_SOCKET_IFNAME=ib (serve.env) matches no interface" in said
        # a campaign placed on that node: refused before its server starts, its points failed with the fix
        f = standin_campaign(tmp_path, placement={"node_labels": {"pool": "badenv"}},
                             bench_params={"grid": {"random_input_len": [16]}})
        summary, out = run_file(f)
        assert summary.counts["failed"] == 1 and summary.counts["done"] == 0
        err = summary.failures[0].error
        assert "refused before its server started" in err and "GLOO_SOCKET_IFNAME=rsnosuch0" in err, err
        assert not (out / "logs").exists() or not list((out / "logs").rglob("*.log")), "a server was started"
    finally:
        remove_nodes(gpu_cluster, pool)
        assert os.environ.get("GLOO_SOCKET_IFNAME") is None

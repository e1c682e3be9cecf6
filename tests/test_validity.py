"""The validity record of a point (pure checks). The real demo campaign's records are checked in
tests/test_vllm_integration.py (test_demo_campaign_killed_mid_run_then_resumed)."""

from __future__ import annotations

import pytest

from raysweep.drive.validity import shared_cpus, unknown_checks, validity_fields
from raysweep.procs import cpu_set, cpu_text


def fair(**over):
    r = {"client_limited": False, "client_limited_reason": None, "server_nice": 0, "client_nice": "0,0",
         "node_ip": "10.0.0.1", "server_cpu_affinity": "0-3", "client_node_ips": "10.0.0.1,10.0.0.1",
         "client_cpu_affinity": "4-5;6-7", "completed": 100, "failed": 0, "steady_state": True,
         "transport_inter": "n/a"}
    r.update(over)
    return r


def test_cpu_sets_read_and_write():
    assert cpu_set("0-2,5") == {0, 1, 2, 5}
    assert cpu_set([0, "3-4"]) == {0, 3, 4}
    assert cpu_set(None) is None and cpu_set("") is None and cpu_set("x") is None
    assert cpu_text({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"


def test_a_fair_point_passes_every_check():
    v = validity_fields(fair())
    assert v == {"shared_cpus": False, "error_rate": 0.0, "steady_state": True, "validity_ok": True,
                 "validity_issues": ""}
    assert unknown_checks(fair()) == []


@pytest.mark.parametrize("over, issue", [
    ({"client_limited": True, "client_limited_reason": "send lag p99 30 ms > 10 ms; sent 5 of 10"}, "client-limited"),
    ({"server_nice": 15}, "niced (server 15)"),
    ({"client_nice": "0,15"}, "niced (client 15)"),
    ({"client_cpu_affinity": "4-5;3"}, "shared CPUs"),
    ({"failed": 5, "completed": 95}, "errors (5 failed, 5.0 %)"),
    ({"steady_state": False, "steady_state_slope_pct_per_s": -3.25}, "not steady (slope -3.2 %/s)"),
    ({"transport_inter": "Socket"}, "socket transport"),
    ({"cache_state_before": "reset failed: HTTP 404 on /reset_prefix_cache"}, "cache not reset (reset failed"),
    ({"cache_state_before": "after_bench_cmd failed: exit 1"}, "cache not reset (after_bench_cmd failed"),
    ({"client_start_late_ms": 42.0}, "client started late (42.0 ms"),
])
def test_each_failed_check_is_named(over, issue):
    v = validity_fields(fair(**over))
    assert v["validity_ok"] is False
    assert any(i.startswith(issue) for i in v["validity_issues"].split("; ")), v["validity_issues"]
    assert len(v["validity_issues"].split("; ")) == 1  # a reason with its own ';' stays one issue


def test_a_reset_cache_and_a_punctual_start_pass():
    assert validity_fields(fair(cache_state_before="reset", client_start_late_ms=3.0))["validity_ok"] is True
    assert validity_fields(fair(cache_state_before="after_bench_cmd"))["validity_ok"] is True


def test_several_issues_are_listed_in_order():
    v = validity_fields(fair(server_nice=15, client_limited=True, client_limited_reason="x"))
    assert v["validity_issues"] == "client-limited (x); niced (server 15)"


def test_shared_cpus_only_on_the_servers_node():
    assert shared_cpus(fair(client_node_ips="10.0.0.2,10.0.0.2", client_cpu_affinity="0-3;0-3")) is False
    assert shared_cpus(fair(client_node_ips="10.0.0.2,10.0.0.1", client_cpu_affinity="0-3;4")) is False
    assert shared_cpus(fair(client_node_ips="10.0.0.2,10.0.0.1", client_cpu_affinity="4;0")) is True
    # a multi-node server: its CPUs on each node
    per_node = "10.0.0.1=0-3;10.0.0.2=0-7"
    assert shared_cpus(fair(server_cpu_affinity_per_node=per_node, client_node_ips="10.0.0.2",
                            client_cpu_affinity="7")) is True
    # affinities not in line with the actors: every actor's CPUs count
    assert shared_cpus(fair(client_node_ips="10.0.0.1", client_cpu_affinity=[[4, 5], [1]])) is True


def test_absent_facts_are_unknown_not_failures():
    r = fair(client_nice=None, client_cpu_affinity=None, steady_state=None)
    del r["steady_state"]
    v = validity_fields(r)
    assert v["validity_ok"] is True and v["shared_cpus"] is None and v["steady_state"] is None
    assert unknown_checks(r) == ["niced", "shared CPUs", "not steady"]
    assert validity_fields({})["error_rate"] is None


def test_client_room_counts_only_cpus_of_their_own():
    from raysweep.drive.point import client_room

    # the 2-core demo: the server's bundle (0.5) and one client (1 CPU) leave no core for another
    assert client_room(2.5, [(2, 0.5, 1)], 0, 1.0) == 0
    # a 16-core server node with 2 clients: 13 more, unless Ray has fewer CPUs free
    assert client_room(100, [(16, 0.5, 2)], 0, 1.0) == 13
    assert client_room(4, [(16, 0.5, 2)], 0, 1.0) == 4
    # other nodes count with their CPUs; per node, whole client actors only
    assert client_room(100, [(2, 0.5, 1), (2, 0.5, 1)], 8, 1.0) == 8
    assert client_room(100, [(8, 0.5, 0)], 0, 2.0) == 3


def test_the_guard_lowers_its_niceness_or_says_why(monkeypatch):
    import os

    from raysweep.serve import guard

    state = {"nice": 15}
    monkeypatch.setattr(os, "getpriority", lambda which, who: state["nice"])

    def allowed(which, who, value):
        state["nice"] = value
    monkeypatch.setattr(os, "setpriority", allowed)
    assert guard.renice(0) == {"before": 15, "after": 0, "error": ""}

    def refused(which, who, value):
        raise PermissionError(13, "Permission denied")
    state["nice"] = 15
    monkeypatch.setattr(os, "setpriority", refused)
    got = guard.renice(0)
    assert got["before"] == got["after"] == 15
    assert "Permission denied" in got["error"] and "CAP_SYS_NICE" in got["error"]
    state["nice"] = -5  # never raised
    assert guard.renice(0) == {"before": -5, "after": -5, "error": ""}


def test_a_niced_server_is_warned_about_once_per_node(caplog):
    from raysweep.serve import live_server

    server = live_server.Server("srv", hosts=[], nodes=[{"hostname": "node-x", "node_ip": "10.0.0.9"}],
                                 facts=[{"nice": 15, "cpu_affinity": "0-3", "renice": {"error": "Permission denied"}}])
    live_server._NICE_WARNED.discard("node-x")
    with caplog.at_level("WARNING", logger="raysweep.serve.live_server"):
        live_server.warn_niced(server)
        live_server.warn_niced(server)
    lines = [r.getMessage() for r in caplog.records if "niceness" in r.getMessage()]
    assert len(lines) == 1 and "node-x" in lines[0] and "15" in lines[0] and "RAY_worker_niceness=0" in lines[0]
    assert live_server.server_process_fields(server.nodes, server.facts) == {
        "server_nice": 15, "server_cpu_affinity": "0-3", "server_cpu_affinity_per_node": "10.0.0.9=0-3",
        "server_renice_error": "Permission denied"}


@pytest.mark.vllm
def test_numpy_booleans_count_like_pythons():
    import numpy as np

    v = validity_fields(fair(client_limited=np.bool_(True), steady_state=np.bool_(False)))
    assert v["validity_issues"].startswith("client-limited") and "not steady" in v["validity_issues"]
    assert v["steady_state"] is False

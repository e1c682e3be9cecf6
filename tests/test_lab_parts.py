"""The lab's parts that need no root: names, the subnet's arithmetic, the hosts files, the bandwidth gate's
message per link, and the relay (on loopback)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from raysweep.lab import hosts as lab
from raysweep.place import fabric
from raysweep.procs import free_port, wait_for

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", ["", "Lab", "lab-1", "toolong7", "a b"])
def test_a_bad_lab_name_is_refused_with_exit_code_2(name):
    with pytest.raises(lab.LabError) as e:
        lab.check_name(name)
    assert e.value.code == 2 and "--name" in str(e.value)


@pytest.mark.parametrize("subnet,why", [("10.77.0.0/33", "not an IPv4 network"), ("10.77.0.1/24", "not an IPv4"),
                                        ("8.8.8.0/24", "not a private network"), ("10.77.0.0/30", "no room")])
def test_a_bad_subnet_is_refused_before_anything_is_made(subnet, why):
    with pytest.raises(lab.LabError) as e:
        lab.up(lab.LabSpec(name="x", subnet=subnet))
    assert e.value.code == 2 and why in str(e.value) and "--subnet" in str(e.value)


def test_each_host_resolves_the_others_and_itself_as_debian_does():
    state = {"hosts": [{**lab.host_names("lab", i), "ip": f"10.77.0.{i + 1}"} for i in (1, 2, 3)]}
    text = lab._hosts_file(state, state["hosts"][1])
    assert "127.0.1.1\trslab-2" in text and "10.77.0.2\trslab-1" in text and "10.77.0.4\trslab-3" in text
    assert "10.77.0.3" not in text
    names = [lab.host_names("lab", i) for i in (1, 2)]
    assert names[0]["dev"] != names[1]["dev"] and all(len(v) <= 15 for n in names for v in n.values())


def test_the_lab_env_drops_the_loopback_only_settings():
    state = {"hosts": [{"tmp": "/tmp/rsx/1"}], "env": {}}
    env = lab.host_env(state, 1, {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "VLLM_HOST_IP": "127.0.0.1", "A": "b"})
    assert env["A"] == "b" and env["TMPDIR"] == "/tmp/rsx/1"
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in env and "VLLM_HOST_IP" not in env


def _end(i: int) -> dict:
    return {"node_id": f"n{i}", "hostname": f"rslab-{i}", "ip": f"10.77.0.{i + 1}", "iface": f"rslab-e{i}", "mtu": 1500}


def test_the_bandwidth_gate_names_the_slowest_link():
    probe = {"busbw_gbps": 0.3, "backend": "gloo",
             "links": [{"a": _end(1), "b": _end(2), "busbw_gbps": 0.5},
                       {"a": _end(2), "b": _end(3), "busbw_gbps": 0.002},
                       {"a": _end(3), "b": _end(1), "busbw_gbps": 0.4}]}
    why = fabric.gate(probe, 0.01, None, None)
    link = "rslab-2 10.77.0.3 (rslab-e2, MTU 1500) <-> rslab-3 10.77.0.4 (rslab-e3, MTU 1500)"
    assert why is not None and link in why
    assert "0.002 GB/s" in why
    assert fabric.gate(probe, 0.001, None, None) is None
    assert fabric.describe_links(probe)[1].endswith("0.002 GB/s bus bandwidth (gloo)")


def _echo_server() -> socket.socket:
    """A listening socket on loopback whose thread answers each connection's first 100 bytes with themselves;
    closing the socket ends the thread."""
    target = socket.socket()
    target.bind(("127.0.0.1", 0))
    target.listen(50)

    def echo() -> None:
        while True:
            try:
                c, _ = target.accept()
            except OSError:
                return
            with c:
                c.sendall(c.recv(100))
    threading.Thread(target=echo, daemon=True).start()
    return target


def test_the_relay_delays_and_drops_connections():
    """On loopback: an echo server behind the relay; the first connection is spared, then about half dropped."""
    target = _echo_server()
    port = free_port()
    relay = subprocess.Popen([sys.executable, "-m", "raysweep.lab.relay", "--listen", f"127.0.0.1:{port}", "--to",
                              f"127.0.0.1:{target.getsockname()[1]}", "--delay-ms", "50", "--drop", "0.5",
                              "--spare", "1", "--seed", "3"], stdout=subprocess.PIPE, text=True, cwd=str(ROOT))
    try:
        assert wait_for(lambda: _connects(port), 30, 0.1)
        outcomes, took = [], []
        for _ in range(20):
            t0 = time.monotonic()
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                    s.sendall(b"ping")
                    got = s.recv(100)
                outcomes.append(got == b"ping")
                if got == b"ping":
                    took.append(time.monotonic() - t0)
            except OSError:
                outcomes.append(False)
        assert 3 <= sum(outcomes) <= 17 and min(took) >= 0.1    # 50 ms each way
    finally:
        relay.terminate()
        out, _ = relay.communicate(timeout=20)
        target.close()
    assert "forwarded" in out and "dropped" in out


def test_the_relay_cuts_every_nth_answer_chunk():
    """On loopback: an echo server behind the relay cutting every 3rd answer chunk; each connection's answer is
    one chunk, so of 9 connections the 3rd, 6th and 9th are reset mid-answer and the others answered."""
    target = _echo_server()
    port = free_port()
    relay = subprocess.Popen([sys.executable, "-m", "raysweep.lab.relay", "--listen", f"127.0.0.1:{port}", "--to",
                              f"127.0.0.1:{target.getsockname()[1]}", "--cut-every", "3"],
                             stdout=subprocess.PIPE, text=True, cwd=str(ROOT))
    try:
        assert wait_for(lambda: _connects(port), 30, 0.1)   # a connection that sends nothing gets no answer chunk
        outcomes = []
        for _ in range(9):
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                    s.sendall(b"ping")
                    outcomes.append(s.recv(100) == b"ping")
            except OSError:
                outcomes.append(False)
        assert outcomes == [True, True, False] * 3
    finally:
        relay.terminate()
        out, _ = relay.communicate(timeout=20)
        target.close()
    assert "3 cut" in out


def _connects(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False

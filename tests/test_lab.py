"""The multi-node path over a real network: a lab of real hosts on this machine (raysweep.lab.hosts; root only).

Host 1 is the Ray head (no GPU, 2 CPUs: the campaign's driver and its clients), hosts 2 and 3 declare one GPU
and one CPU each (a server bundle takes half a CPU, so no client fits beside it). Each host has its own address,
interface name, hostname (its own name on 127.0.1.1, as Debian writes /etc/hosts), /dev/shm and temp dir:
nothing passes between hosts but TCP over the bridge. The lab is shared by the tests of one session
(`lab_cluster`, tests/conftest.py).
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from raysweep.lab import hosts as lab
from raysweep.ledger import Ledger
from raysweep.record.directory import CampaignDir
from raysweep.results.table import results_table

RAYSWEEP = [sys.executable, "-m", "raysweep"]
ROOT = Path(__file__).resolve().parent.parent
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="NOT RUN: the lab's refusals are checked as root "
                                                         "(a root process drops its rights for the non-root case)")


def in_host(state: dict, host: int, argv: list[str], timeout: float = 900, **env: str) -> subprocess.CompletedProcess:
    """Run a command inside a lab host, as a user would with `raysweep lab exec`."""
    full_env = {**lab.host_env(state, host), "RAY_ADDRESS": state["address"], "PYTHONPATH": str(ROOT), **env}
    return subprocess.run(lab.exec_argv(state, host, argv), env=full_env, capture_output=True, text=True,
                          timeout=timeout, cwd=str(ROOT))


def host_commands(h: dict) -> list[str]:
    """The command lines of the processes of one lab host (found by its network namespace)."""
    import psutil

    pids = subprocess.run(["ip", "netns", "pids", h["netns"]], capture_output=True, text=True).stdout.split()
    out = []
    for pid in pids:
        try:
            out.append(" ".join(psutil.Process(int(pid)).cmdline()))
        except psutil.Error:
            continue
    return out


def client_ips(df) -> set[str]:
    """Every address a client actor of these results ran at (a point may have had several)."""
    return {ip.strip() for ips in df["client_node_ips"] for ip in str(ips).split(",") if ip.strip()}


def lab_ips(state: dict) -> set[str]:
    return {h["ip"] for h in state["hosts"]}


def not_loopback(addr: str) -> bool:
    return not ipaddress.ip_address(addr).is_loopback and addr not in ("0.0.0.0", "")


# ---------------------------------------------------------------------------------------------------
# The lab itself
# ---------------------------------------------------------------------------------------------------

@root_only
def test_the_lab_refuses_without_root_and_a_subnet_routed_elsewhere_creating_nothing(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAYSWEEP_LAB_STATE_DIR": str(tmp_path / "state")}
    before = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
    drop = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
    nobody = subprocess.run([*drop, *RAYSWEEP, "lab", "up", "--name", "rfz"], env=env, capture_output=True,
                            text=True, cwd="/")
    assert nobody.returncode == 2 and "needs root" in nobody.stderr and "nothing was created" in nobody.stderr
    # the machine's own network (eth0's subnet here) is routed elsewhere: refused, naming the route
    routes = json.loads(subprocess.run(["ip", "-j", "-4", "route", "show", "scope", "link"], capture_output=True,
                                       text=True).stdout or "[]")
    used = next((r["dst"] for r in routes if "/" in r.get("dst", "")
                 and ipaddress.ip_network(r["dst"]).is_private), None)
    if used is not None:
        taken = subprocess.run([*RAYSWEEP, "lab", "up", "--name", "rfz", "--subnet", used], env=env,
                               capture_output=True, text=True)
        assert taken.returncode == 2 and "routed elsewhere" in taken.stderr and used in taken.stderr, taken.stderr
    public = subprocess.run([*RAYSWEEP, "lab", "up", "--name", "rfz", "--subnet", "8.8.8.0/24"], env=env,
                            capture_output=True, text=True)
    assert public.returncode == 2 and "not a private network" in public.stderr
    assert subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout == before
    assert "rsrfz" not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not (tmp_path / "state" / "rfz.json").exists()


@root_only
def test_a_subnet_with_a_route_of_its_own_is_refused_by_ip_route_get():
    """Inside a throwaway namespace (the machine's routes untouched): a route to part of the subnet."""
    ns = f"rschk{os.getpid() % 10000}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        subprocess.run(["ip", "-n", ns, "route", "add", "10.78.5.128/25", "dev", "lo"], check=True)
        code = ("import sys; from raysweep.lab import hosts as lab\n"
                "try:\n    lab.check_subnet(sys.argv[1])\nexcept lab.LabError as e:\n    print(e.code, e)\n")
        out = [subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code, net], capture_output=True,
                              text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
               for net in ("10.78.5.0/24", "10.78.6.0/24")]
        assert out[0].startswith("2 ") and "routed elsewhere" in out[0] and "10.78.5.128/25" in out[0], out
        assert out[1] == "", out
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)


def test_lab_hosts_are_hosts_of_their_own(lab_cluster):
    state = lab_cluster
    assert lab.nodes_alive(state) == {h["ip"]: "ALIVE" for h in state["hosts"]}
    names = [in_host(state, h["index"], ["hostname"], 30).stdout.strip() for h in state["hosts"]]
    assert names == [h["hostname"] for h in state["hosts"]] and len(set(names)) == 3
    # each resolves the others by name to their lab address, and itself as Debian does (127.0.1.1)
    seen = in_host(state, 3, ["getent", "hosts", state["hosts"][0]["hostname"], names[2]], 30).stdout.split()
    assert seen == [state["hosts"][0]["ip"], names[0], "127.0.1.1", names[2]]
    # its own /dev/shm: a file written on host 2 is not on host 3
    mark = f"rs-lab-test-{os.getpid()}"
    assert in_host(state, 2, ["sh", "-c", f"touch /dev/shm/{mark} && ls /dev/shm"], 30).stdout.split() == [mark]
    assert mark not in in_host(state, 3, ["ls", "-a", "/dev/shm"], 30).stdout
    assert not Path(f"/dev/shm/{mark}").exists()
    # its own interface and no default route: nothing leaves the machine
    for h in state["hosts"]:
        out = in_host(state, h["index"], ["ip", "-4", "-br", "addr"], 30).stdout
        assert f"{h['dev']}@" in out and h["ip"] in out
        assert "default" not in in_host(state, h["index"], ["ip", "route"], 30).stdout
    st = lab.status(state["name"])
    assert st["up"] and all(h["netns"] and h["processes"] > 0 and h["ray"] == "ALIVE" for h in st["hosts"])


# ---------------------------------------------------------------------------------------------------
# A real vLLM server pipeline-parallel across two hosts
# ---------------------------------------------------------------------------------------------------

def pp_campaign(tmp_path: Path, model: str, **fields) -> Path:
    data = {
        "name": "lab-pp", "output_dir": str(tmp_path / "out"), "runs": 1, "max_attempts": 1,
        "serve": {"cmd": f"vllm serve {model} --load-format dummy --max-model-len 512 --dtype bfloat16 "
                         "--pipeline-parallel-size 2",   # PP fails in eager mode on the CPU build
                  "env": {"VLLM_CPU_KVCACHE_SPACE": 1}, "ready_timeout_s": 900},
        "bench": {"backend": "native", "client_cpus": 1, "clients": 1,
                  "cmd": f"vllm bench serve --model {model} --dataset-name random --num-prompts 12 "
                         "--random-input-len 32 --random-output-len 8 --temperature 0",
                  "params": {"grid": {"max_concurrency": [1, 4]}}},
        "transport": {"probe": True, "probe_mib": 4, "probe_iters": 2},
    }
    data.update(fields)
    f = tmp_path / "campaign.yaml"
    f.write_text(yaml.safe_dump(data))
    return f


def test_a_real_vllm_server_pipeline_parallel_across_two_lab_hosts_with_clients_on_the_third(
        lab_cluster, tiny_model, tmp_path):
    """Every rank gets its own host's address and interface from raysweep; the clients reach the server over
    the bridge; every recorded address is a lab address, never loopback."""
    state = lab_cluster
    h1, h2, h3 = state["hosts"]
    f = pp_campaign(tmp_path, str(tiny_model))
    run = in_host(state, 1, [*RAYSWEEP, "run", str(f), "--address", state["address"]], timeout=1500)
    out = tmp_path / "out"
    logs = {p.name: p.read_text()[-4000:] for p in (out / "logs").glob("*.log")} if (out / "logs").exists() else {}
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-5000:], logs)
    df = results_table(CampaignDir(out))
    assert len(df) == 2 and (df["completed"] == 12).all() and (df["failed"] == 0).all()
    assert (df["num_nodes"] == 2).all() and (df["placement_mode"] == "nnodes").all()
    # the server's ranks on hosts 2 and 3, its clients on host 1; all at lab addresses
    assert set(df["node_ips"]) == {f"{h2['ip']},{h3['ip']}"} or set(df["node_ips"]) == {f"{h3['ip']},{h2['ip']}"}
    assert client_ips(df) == {h1["ip"]}
    assert set(df["hostname"]) <= {h2["hostname"], h3["hostname"]}
    led = Ledger.open_existing(out)
    try:
        servers = led.servers()
    finally:
        led.close()
    assert len(servers) == 1 and servers[0].state == "stopped"
    s = servers[0]
    assert s.node_ip in lab_ips(state) and not_loopback(s.node_ip)
    ranks = s.rank_list()
    by_ip = {h["ip"]: h for h in state["hosts"]}
    master = ranks[0]["node_ip"]
    for r in ranks:
        h = by_ip[r["node_ip"]]                       # a lab host ...
        assert r["hostname"] == h["hostname"]
        # ... whose own address and interface raysweep gave this rank (vLLM's and gloo's)
        assert r["network"]["VLLM_HOST_IP"] == h["ip"] and r["network"]["GLOO_SOCKET_IFNAME"] == h["dev"], r
        text = Path(r["log_path"]).read_text() if Path(r["log_path"]).exists() else ""
        assert f"--master-addr {master}" in text and f"distributed_init_method=tcp://{master}:" in text
        assert "backend=gloo" in text and "ranks do not share the same SHM group" in text   # no /dev/shm between
        assert "using 0.0.0.0" not in text and "127.0.0.1:" not in text.split("raysweep:", 1)[-1].split("\n", 1)[0]
    assert ranks[0]["node_ip"] != ranks[1]["node_ip"]
    assert f"--host {master}" in Path(ranks[0]["log_path"]).read_text()
    # the fabric probe ran over the bridge between the two hosts (gloo)
    probe = s.fabric_record()
    assert probe["error"] is None and probe["backend"] == "gloo" and probe["nnodes"] == 2
    # nothing of the campaign left on any host
    left = {h["hostname"]: [c for c in host_commands(h) if "vllm" in c or "raysweep" in c] for h in state["hosts"]}
    assert not any(left.values()), left


# ---------------------------------------------------------------------------------------------------
# Transport per real link, and a link capped with tbf
# ---------------------------------------------------------------------------------------------------

STANDIN = ROOT / "tests" / "standin"


def standin_pp_campaign(tmp_path: Path, name: str, **fields) -> Path:
    """A two-stage configuration (one GPU per host, so across hosts 2 and 3) of the stand-in server, its clients
    (the command backend would sit anywhere; the native one needs a whole CPU: host 1)."""
    data = {
        "name": name, "output_dir": str(tmp_path / name), "runs": 1, "max_attempts": 1,
        "serve": {"cmd": f"{sys.executable} {STANDIN / 'stream_server.py'} --model m --pipeline-parallel-size 2",
                  "ready_timeout_s": 120},
        "bench": {"backend": "native", "client_cpus": 1, "clients": 1,
                  "cmd": "vllm bench serve --model m --num-prompts 10",
                  "params": {"grid": {"random_input_len": [16]}}},
    }
    data.update(fields)
    f = tmp_path / f"{name}.yaml"
    f.write_text(yaml.safe_dump(data))
    return f


def test_each_real_link_is_recorded_and_a_tbf_capped_link_is_refused_naming_it(lab_cluster, tmp_path):
    state = lab_cluster
    h1, h2, h3 = state["hosts"]
    gate = {"probe": True, "probe_mib": 4, "probe_iters": 2, "min_busbw_gbps": 0.01}
    f = standin_pp_campaign(tmp_path, "link-ok", transport=gate)
    run = in_host(state, 1, [*RAYSWEEP, "run", str(f), "--address", state["address"]], timeout=600)
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])
    led = Ledger.open_existing(tmp_path / "link-ok")
    try:
        probe = led.servers()[0].fabric_record()
    finally:
        led.close()
    assert probe["error"] is None and probe["backend"] == "gloo" and probe["nnodes"] == 2
    (link,) = probe["links"]
    ends = {link["a"]["ip"]: link["a"], link["b"]["ip"]: link["b"]}
    assert set(ends) == {h2["ip"], h3["ip"]}
    for h in (h2, h3):   # each end: its host, its own interface and the interface's MTU
        assert ends[h["ip"]]["iface"] == h["dev"] and ends[h["ip"]]["hostname"] == h["hostname"]
        assert ends[h["ip"]]["mtu"] == 1500
    assert link["busbw_gbps"] == probe["busbw_gbps"] > 0.01
    df = results_table(CampaignDir(tmp_path / "link-ok"))
    assert (df["fabric_busbw_gbps"] > 0.01).all()

    lab.cap(state, 3, "20mbit")            # host 3 sends at 20 Mbit/s (2.5 MB/s) at most
    try:
        f = standin_pp_campaign(tmp_path, "link-capped", transport=gate)
        run = in_host(state, 1, [*RAYSWEEP, "run", str(f), "--address", state["address"]], timeout=600)
    finally:
        lab.cap(state, 3, None)
    assert run.returncode == 1, (run.stdout[-3000:], run.stderr[-3000:])
    led = Ledger.open_existing(tmp_path / "link-capped")
    try:
        points = led.points()
        servers = led.servers()
    finally:
        led.close()
    assert [p.state for p in points] == ["failed"] and not servers   # refused before any server started
    why = points[0].error
    assert "transport.min_busbw_gbps 0.01" in why and f"{h3['hostname']} {h3['ip']} ({h3['dev']}, MTU 1500)" in why
    assert f"{h2['ip']} ({h2['dev']}" in why, why


def test_a_campaign_given_by_relative_paths_runs_from_inside_a_lab_host_as_make_demo_cluster_does(
        lab_cluster, tmp_path):
    """`make demo-cluster`'s way from a fresh clone: `raysweep lab exec 1 -- raysweep run FILE --output-dir DIR
    --address auto` in the clone, FILE and DIR relative. Every record is written (none fails crossing mounts)
    under the directory the command was given in, and nothing temporary is left."""
    state = lab_cluster
    standin_pp_campaign(tmp_path, "rel", runs=2, output_dir="results/rel")
    run = subprocess.run([*RAYSWEEP, "lab", "exec", "--name", state["name"], "1", "--", *RAYSWEEP, "run", "rel.yaml",
                          "--output-dir", "results/rel", "--address", "auto"],
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=600,
                         cwd=str(tmp_path))
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])
    out = tmp_path / "results" / "rel"
    led = Ledger.open_existing(out)
    try:
        points = led.points()
    finally:
        led.close()
    assert [p.state for p in points] == ["done", "done"] and all(p.attempts == 1 for p in points), points
    records = sorted((out / "points").rglob("run=*"))
    assert sorted(p.name for p in records) == [f"run={r}.{kind}" for r in (0, 1)
                                               for kind in ("json", "samples.parquet", "timeseries.parquet")]
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]
    df = results_table(CampaignDir(out))
    assert len(df) == 2 and not df["samples_path"].str.startswith("/").any()
    assert set(df["node_ips"].str.split(",").sum()) == {state["hosts"][1]["ip"], state["hosts"][2]["ip"]}


# ---------------------------------------------------------------------------------------------------
# A partition mid-campaign
# ---------------------------------------------------------------------------------------------------

def _wait(pred, timeout_s: float, every: float = 0.5):
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(every)
    return None


def _running_point(out: Path) -> bool:
    return _ledger_says(out, lambda led: any(p.state == "running" for p in led.points()))


def _ledger_says(out: Path, what: Callable[[Ledger], bool]) -> bool:
    """`what` of the campaign's ledger as it is now (False while there is none)."""
    if not (out / "ledger.sqlite").exists():
        return False
    try:
        led = Ledger.open_existing(out)
    except Exception:  # noqa: BLE001 - not written yet
        return False
    try:
        return what(led)
    finally:
        led.close()


def test_a_partition_mid_point_is_recorded_the_configuration_waits_and_runs_again_when_the_host_rejoins(
        lab_cluster, tmp_path):
    """Host 3 cut off (its link down) while a point of a configuration spanning hosts 2 and 3 runs: Ray declares
    its node dead, raysweep records the loss (node, time, points in flight), the configuration fits no node
    left (it needs two one-GPU hosts) and waits, never falling back to the GPU-less head; the link heals, the lab
    starts host 3's Ray again, the configuration is placed again there and the campaign ends with every point
    done once, all measured on the same shape of hardware."""
    import threading

    state = lab_cluster
    h1, h2, h3 = state["hosts"]
    f = standin_pp_campaign(tmp_path, "part", bench={"backend": "native", "client_cpus": 1, "clients": 1,
                                                     "cmd": "vllm bench serve --model m --num-prompts 6 "
                                                            "--request-rate 2",
                                                     "params": {"grid": {"random_input_len": [16, 24, 32, 40]}}},
                            max_attempts=3, placement={"replace_wait_s": 300})
    out = tmp_path / "part"
    timeline: dict[str, float] = {}

    def partition() -> None:
        import time

        if not _wait(lambda: _running_point(out), 600, 0.2):
            return
        lab.cut(state, 3, "link")
        timeline["cut"] = time.time()
        _wait(lambda: (lab.nodes_alive(state) or {}).get(h3["ip"]) == "DEAD", 120)
        timeline["dead"] = time.time()
        # the configuration now waits for nodes: heal once the driver has recorded it (on a loaded machine
        # that took more than the 5 s this once slept)
        _wait(lambda: _ledger_says(out, lambda led: any(e["kind"] == "waiting_for_nodes" for e in led.events())),
              300)
        lab.heal(state, 3)
        timeline["healed"] = time.time()
        lab.restart_ray(state, 3)
        timeline["rejoined"] = time.time()

    t = threading.Thread(target=partition, daemon=True)
    t.start()
    run = in_host(state, 1, [*RAYSWEEP, "run", str(f), "--address", state["address"]], timeout=1200)
    t.join(300)
    assert {"cut", "dead", "rejoined"} <= set(timeline), timeline
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-4000:])
    led = Ledger.open_existing(out)
    try:
        points, events, servers = led.points(), led.events(), led.servers()
    finally:
        led.close()
    assert [p.state for p in points] == ["done"] * 4
    assert sorted(p.attempts for p in points) == [1, 1, 1, 2]          # only the point cut short ran again
    kinds = [e["kind"] for e in events]
    assert "node_lost" in kinds and "replaced" in kinds, events
    lost = next(e for e in events if e["kind"] == "node_lost")
    assert timeline["cut"] <= lost["at"] and any(h3["hostname"] in n or h3["ip"] in n for n in lost["nodes"]) \
        or h3["hostname"] in lost["detail"] or h3["ip"] in lost["detail"], lost
    df = results_table(CampaignDir(out))
    assert len(df) == 4 and (df["gpu_count"] == 2).all() and (df["num_nodes"] == 2).all()   # never the CPU fallback
    assert all(set(ips.split(",")) == {h2["ip"], h3["ip"]} for ips in df["node_ips"])
    assert len(servers) == 2 and servers[-1].state == "stopped" and "lost" in servers[0].state, servers
    assert set(df["server_id"]) <= {s.server_id for s in servers}
    # the order of things: lost, waiting (no node left fits two one-GPU stages), placed again once host 3 is back
    waiting = next(e for e in events if e["kind"] == "waiting_for_nodes")
    replaced = next(e for e in events if e["kind"] == "replaced")
    assert lost["at"] <= waiting["at"] < timeline["healed"] <= replaced["at"], (timeline, events)
    assert h3["ip"] in replaced["detail"] and "points in flight: none" not in lost["detail"], events
    assert lab.nodes_alive(state).get(h3["ip"]) == "ALIVE"


# ---------------------------------------------------------------------------------------------------
# raysweep submit from outside the lab
# ---------------------------------------------------------------------------------------------------

def _counts(out: Path) -> dict[str, int]:
    if not (out / "ledger.sqlite").exists():
        return {}
    led = Ledger.open_existing(out)
    try:
        return led.counts()
    finally:
        led.close()


def test_submit_from_the_machine_to_the_heads_job_server_over_the_bridge_stop_and_resume(lab_cluster, tmp_path):
    """`raysweep submit` in this machine's own namespace, to the job server on the head's lab address: the job
    (the campaign's driver) runs on the head; it is stopped halfway, then submitted again and followed to its
    end, every point done once (at most the one the stop cut short twice)."""
    import time

    state = lab_cluster
    url = state["dashboard"]
    f = standin_pp_campaign(tmp_path, "job", bench={"backend": "native", "client_cpus": 1, "clients": 1,
                                                    "cmd": "vllm bench serve --model m --num-prompts 6 "
                                                           "--request-rate 2",
                                                    "params": {"grid": {"random_input_len": [16, 24, 32, 40]}}})
    out = tmp_path / "job"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    submit = [*RAYSWEEP, "submit", str(f), "--dashboard-url", url, "--python", sys.executable, "--stop-wait", "60"]
    r = subprocess.run(submit, env=env, capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert r.returncode == 0, (r.stdout, r.stderr)
    job1 = r.stdout.strip().splitlines()[0]
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and _counts(out).get("done", 0) < 1:
        time.sleep(0.5)
    assert _counts(out).get("done", 0) >= 1
    r = subprocess.run([*RAYSWEEP, "stop", job1, "--dashboard-url", url, "--wait", "90"], env=env,
                       capture_output=True, text=True, timeout=200)
    assert r.returncode == 0 and "STOPPED" in r.stdout, (r.stdout, r.stderr)
    first = _counts(out)
    assert 1 <= first["done"] < 4 and first.get("running", 0) == 0, first
    r = subprocess.run([*submit, "--follow"], env=env, capture_output=True, text=True, timeout=600,
                       cwd=str(tmp_path))
    assert r.returncode == 0 and "SUCCEEDED" in r.stdout + r.stderr, (r.stdout[-3000:], r.stderr[-3000:])
    led = Ledger.open_existing(out)
    try:
        points = led.points()
    finally:
        led.close()
    assert [p.state for p in points] == ["done"] * 4 and sum(p.attempts for p in points) <= 5
    df = results_table(CampaignDir(out))
    assert client_ips(df) == {state["hosts"][0]["ip"]}
    assert all(set(ips.split(",")) == {state["hosts"][1]["ip"], state["hosts"][2]["ip"]} for ips in df["node_ips"])


# ---------------------------------------------------------------------------------------------------
# A slow and lossy link (a user-space relay: this kernel has no netem)
# ---------------------------------------------------------------------------------------------------

def test_a_campaign_across_a_slow_lossy_relay_finishes_and_its_validity_record_says_so(lab_cluster, tmp_path):
    """The stand-in streaming server on host 2; a relay on host 3 that delays every chunk 20 ms each way, resets
    15 % of the connections and cuts every 10th chunk of the answers mid-stream (the client keeps its connections
    open, so drops at accept alone may miss a point); the clients sweeping the server through the relay
    (`serve.url`): the campaign ends, every point measured, the cut requests counted as failed and the
    points marked `errors` in their validity record; the delay shows in the time to first token."""
    import signal
    import time

    from raysweep.procs import wait_for

    state = lab_cluster
    h1, h2, h3 = state["hosts"]
    started = []
    try:
        server = subprocess.Popen(lab.exec_argv(state, 2, [sys.executable, str(STANDIN / "stream_server.py"),
                                                           "--model", "m", "--host", h2["ip"], "--port", "18000"]),
                                  env=lab.host_env(state, 2), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        started.append(server)
        relay = subprocess.Popen(lab.exec_argv(state, 3, [sys.executable, "-m", "raysweep.lab.relay", "--listen",
                                                          f"{h3['ip']}:19000", "--to", f"{h2['ip']}:18000",
                                                          "--delay-ms", "20", "--drop", "0.15", "--cut-every", "10",
                                                          "--spare", "3"]),
                                 env={**lab.host_env(state, 3), "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                                 text=True)
        started.append(relay)
        assert wait_for(lambda: in_host(state, 1, ["bash", "-c", f"exec 3<>/dev/tcp/{h2['ip']}/18000"], 10)
                        .returncode == 0, 60, 0.5), "the stand-in server did not come up"
        data = {"name": "relay", "output_dir": str(tmp_path / "relay"), "runs": 1, "max_attempts": 1,
                "serve": {"url": f"http://{h3['ip']}:19000"},
                "bench": {"backend": "native", "client_cpus": 1, "clients": 1, "rerun_client_limited": False,
                          "cmd": "vllm bench serve --model m --num-prompts 40 --max-concurrency 4",
                          "params": {"grid": {"random_input_len": [16, 32]}}}}
        f = tmp_path / "relay.yaml"
        f.write_text(yaml.safe_dump(data))
        run = in_host(state, 1, [*RAYSWEEP, "run", str(f), "--address", state["address"]], timeout=600)
        df = results_table(CampaignDir(tmp_path / "relay"))
        assert len(df) == 2, (run.stdout[-3000:], run.stderr[-3000:])
        assert (df["completed"] > 0).all() and (df["failed"] > 0).all()
        assert (df["completed"] + df["failed"] == 40).all()
        assert (~df["validity_ok"]).all() and df["validity_issues"].str.contains("errors").all()
        assert (df["median_ttft_ms"] >= 40).all()       # 20 ms each way at least
        # an endpoint reserves no CPUs, so the client actor may sit on any host; it reaches the server through
        # the relay from a lab address wherever it is
        assert client_ips(df) <= lab_ips(state) and all(not_loopback(ip) for ip in client_ips(df))
    finally:
        for p in started:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        time.sleep(0.1)
    out = relay.stdout.read() if relay.stdout else ""
    assert "dropped" in out and " 0 dropped" not in out, out

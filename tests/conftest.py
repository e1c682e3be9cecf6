"""Test session set-up: Ray and vLLM stay on loopback, Ray's token auth is off, usage stats off.

These variables must be set before anything starts Ray or vLLM, so they are set at import time.
"""

from __future__ import annotations

import os

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_AUTH_MODE"] = "disabled"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ["VLLM_HOST_IP"] = "127.0.0.1"
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


import shutil
import sys
import time
from pathlib import Path

import pytest

import raysweep.modes  # noqa: F401 - every mode and what the run calls above it registered, as the faces do

# Node rules of the session cluster: w0 and w1 are "H100", w2 is "A100"
GPU_NODES = {"w0": "H100", "w1": "H100", "w2": "A100"}
# Fast enough that a removed node is noticed within seconds, slack enough that a raylet starved of CPU by a
# real vLLM server on this 2-core machine is not taken for dead.
FAST_HEALTH_CHECKS = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 1000,
                      "health_check_failure_threshold": 5, "health_check_timeout_ms": 2000}


# The fixtures that start Ray or vLLM, and the marker each gives its tests (`make test-fast` runs
# `-m "not ray and not vllm"`); a test that starts them another way carries the marker itself.
HEAVY_FIXTURES = {"gpu_cluster": "ray", "tiny_model": "vllm", "vllm_server": "vllm", "lab_cluster": "lab",
                  "slurm_cluster": "lab"}


# The tests that take over 40 s on 2 cores, longest first (docs/tests.md): `make test` runs them first, so that
# its two workers take the long ones early and end together.
LONGEST = ("test_lab_hosts_are_hosts_of_their_own",   # the lab's group (one worker) starts first: the longest
           "test_a_real_vllm_server_pipeline_parallel_across_two_lab_hosts_with_clients_on_the_third",
           "test_an_sbatch_cancelled_mid_point_keeps_every_finished_point_and_resumes_running_nothing_twice",
           "test_each_real_link_is_recorded_and_a_tbf_capped_link_is_refused_naming_it",
           "test_a_partition_mid_point_is_recorded_the_configuration_waits_and_runs_again_when_the_host_rejoins",
           "test_demo_campaign_killed_mid_run_then_resumed",
           "test_a_real_vllm_configuration_shares_its_points_with_a_tail_replica",
           "test_one_fault_of_each_kind_loses_nothing_runs_nothing_twice_and_leaves_nothing",
           "test_a_real_vllm_tuning_campaign_killed_mid_way_then_resumed",
           "test_real_vllm_server_spanning_two_simulated_nodes",
           "test_levels_match_vllms_serve_workload_on_the_real_server",
           "test_offline_throughput_sweep_killed_mid_run_then_resumed",
           "test_sla_search_on_the_real_server",
           "test_a_startup_sweep_of_the_real_vllm_and_the_phases_of_real_server_starts")


# The tests of the session's shared real server (`vllm_server`) form one group that `make test`'s two workers
# (`--dist loadgroup`) send to one worker, so that one `vllm serve` is started for the whole run, not one per worker.
SHARED_SERVER_GROUP = "vllm-server"
# The tests of the session's lab (`lab_cluster`: real hosts in network namespaces) form one group too: one lab
# per run, on one worker.
LAB_GROUP = "lab"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Every test that uses a fixture starting Ray or vLLM carries that fixture's marker, and every test of the
    shared real server its group; the longest tests come first, then the other vLLM tests, then the other Ray
    tests, then the rest, each in file order."""
    for item in items:
        for fixture, marker in HEAVY_FIXTURES.items():
            if fixture in getattr(item, "fixturenames", ()) and item.get_closest_marker(marker) is None:
                item.add_marker(getattr(pytest.mark, marker))
        if "vllm_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group(SHARED_SERVER_GROUP))
        if {"lab_cluster", "slurm_cluster"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.xdist_group(LAB_GROUP))

    def rank(item) -> tuple[int, int]:
        name = getattr(item, "originalname", item.name)
        if name in LONGEST:
            return 0, LONGEST.index(name)
        return (1 if item.get_closest_marker("vllm") or item.get_closest_marker("lab")
                else 2 if item.get_closest_marker("ray") else 3), 0

    items.sort(key=rank)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session):
    """Under `--dist loadgroup`, a worker tells the controller a test's group by the `@group` that pytest-xdist
    appends to the test's id before sending the ids. pytest-xdist 3.8 writes that id to `item._nodeid`, which
    pytest 9 no longer reads (the id lives in `item._id`), so the groups were silently lost; this writes the same
    id where pytest 9 reads it, before pytest-xdist sends the ids. Elsewhere it does nothing."""
    if not hasattr(session.config, "workerinput") or not session.config.getoption("loadgroup", False):
        return
    try:
        from _pytest.nodeid import NodeId
    except ImportError:   # a pytest before 9 reads `_nodeid`, where pytest-xdist writes the group
        return
    for item in session.items:
        groups = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                         for m in item.iter_markers("xdist_group")})
        if groups and "@" not in item.nodeid:
            item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(groups)}")


@pytest.fixture(scope="session")
def gpu_cluster():
    """Started once per test session: a head without GPUs and 3 nodes x 4 simulated GPUs, with fast
    health checks so that a removed node is noticed within seconds. Tests that add nodes remove them."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    temp_dir = f"/tmp/rs-t{os.getpid()}"
    os.makedirs("/tmp/ray", exist_ok=True)  # Cluster writes its address file there whatever temp_dir says
    cluster = Cluster(initialize_head=True, head_node_args=dict(
        num_cpus=2, num_gpus=0, include_dashboard=False, temp_dir=temp_dir, _system_config=FAST_HEALTH_CHECKS))
    for name, gpu in GPU_NODES.items():
        cluster.add_node(num_cpus=2, num_gpus=4, labels={"node-name": name, "gpu-type": gpu},
                         runtime_env_dir_name=f"runtime_resources_{name}")
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace="raysweep", log_to_driver=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()
    shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(autouse=True)
def _gpus_back(request):
    """After each test on the cluster, every placement group is gone and every GPU is free again."""
    yield
    if "gpu_cluster" not in request.fixturenames:
        return
    import ray

    if not ray.is_initialized():
        return
    deadline = time.time() + 20
    while time.time() < deadline and ray.available_resources().get("GPU", 0) < ray.cluster_resources().get("GPU", 0):
        time.sleep(0.1)
    assert ray.available_resources().get("GPU", 0) == ray.cluster_resources().get("GPU", 0), "GPUs leaked"


def _vllm_cli() -> str | None:
    return shutil.which("vllm") or (str(Path(sys.executable).parent / "vllm")
                                    if (Path(sys.executable).parent / "vllm").exists() else None)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """The demo's tiny dummy-weight Llama, for the tests with the real vLLM CPU build (skipped without it,
    unless RAYSWEEP_REQUIRE_VLLM is set, as in CI)."""
    if _vllm_cli() is None:
        if os.environ.get("RAYSWEEP_REQUIRE_VLLM"):
            pytest.fail("the vLLM CPU build is required here (RAYSWEEP_REQUIRE_VLLM is set); run scripts/setup-venv.sh")
        pytest.skip("the vLLM CPU build is not installed")
    from raysweep.lab.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("model") / "tiny-llama")


@pytest.fixture(scope="session")
def vllm_server(tiny_model, tmp_path_factory):
    """One real `vllm serve` (CPU build, tiny model, eager) shared by every test that only needs a running
    server: its URL, model path, pid and log. Started once per session on a free loopback port, in its own
    process group, stopped through that group at the end. The model's worker runs inside the engine process
    (the uni backend, as in configs/demo-cpu.yaml): two processes import vLLM instead of three."""
    import signal
    import subprocess
    import urllib.request

    from raysweep.procs import free_port, wait_for

    port = free_port()
    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_SERVER_DEV_MODE": "1", "VLLM_HOST_IP": "127.0.0.1",
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    argv = [_vllm_cli(), "serve", str(tiny_model), "--load-format", "dummy", "--max-model-len", "1024",
            "--dtype", "bfloat16", "--gpu-memory-utilization", "0.2", "--enforce-eager",
            "--distributed-executor-backend", "uni", "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(argv, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if proc.poll() is not None:
            return True
        try:
            return urllib.request.urlopen(url + "/v1/models", timeout=1).status == 200
        except OSError:
            return False

    try:
        assert wait_for(up, 300, 0.5) and proc.poll() is None, f"vLLM did not start:\n{log.read_text()[-3000:]}"
        yield {"url": url, "model": str(tiny_model), "pid": proc.pid, "log": log}
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(30)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue


@pytest.fixture(scope="session")
def lab_cluster():
    """Started once per test session (root only): a lab of 3 real hosts (raysweep.lab.hosts: each its own network,
    UTS, IPC and mount namespaces on a private bridge), the Ray head on host 1 (no GPU, 2 CPUs), hosts 2 and
    3 with 1 simulated GPU and 1 CPU each; its state (addresses, interfaces). Cleared at the end, and a lab a
    killed session left is cleared first."""
    import warnings

    if os.geteuid() != 0:
        why = ("NOT RUN: the lab tier (tests/test_lab.py: real hosts in network namespaces, the multi-node path "
               "over a real network) needs root; run `make test` as root to prove it")
        warnings.warn(why, stacklevel=1)
        pytest.skip(why)
    from raysweep.lab import hosts as lab

    lab.down_stale()
    subnet = next(s for s in (f"10.77.{i}.0/24" for i in range(100, 200)) if _subnet_free(s))
    state = lab.up(lab.LabSpec(name=f"t{os.getpid() % 100000}", hosts=3, subnet=subnet, gpus=[0, 1, 1],
                               cpus=[2, 1, 1]))
    try:
        yield state
    finally:
        lab.down(state["name"])


def _subnet_free(subnet: str) -> bool:
    from raysweep.lab import hosts as lab

    try:
        lab.check_subnet(subnet)
        return True
    except lab.LabError:
        return False


@pytest.fixture(scope="session")
def slurm_cluster():
    """Started once per test session (root, Slurm and munge installed: scripts/install-slurm.sh): a lab of 3 real
    hosts without Ray (GPUs 0,1,1 and CPUs 2,1,1, as `lab_cluster`), with a real Slurm on it
    (raysweep.lab.slurm: slurmctld on host 1, a slurmd per host, munge). Its lab state, with `slurm`.
    Jobs start Ray themselves. Cleared at the end: the daemons by pid, then the lab."""
    import warnings

    if os.geteuid() != 0:
        why = ("NOT RUN: the Slurm tier (tests/test_slurm.py: a real Slurm on lab hosts) needs root; run `make test` "
               "as root to prove it")
        warnings.warn(why, stacklevel=1)
        pytest.skip(why)
    from raysweep.lab import hosts as lab
    from raysweep.lab import slurm as lab_slurm

    if missing := lab_slurm.missing_tools():
        why = f"NOT RUN: the Slurm tier needs Slurm and munge ({', '.join(missing)} missing): scripts/install-slurm.sh"
        if os.environ.get("RAYSWEEP_REQUIRE_VLLM"):
            pytest.fail(why)
        warnings.warn(why, stacklevel=1)
        pytest.skip(why)
    lab.down_stale()
    subnet = next(s for s in (f"10.77.{i}.0/24" for i in range(200, 250)) if _subnet_free(s))
    state = lab.up(lab.LabSpec(name=f"s{os.getpid() % 100000}", hosts=3, subnet=subnet, gpus=[0, 1, 1],
                               cpus=[2, 1, 1], ray=False))
    try:
        lab_slurm.up(state)
        yield state
    finally:
        lab_slurm.down(state)
        lab.down(state["name"])

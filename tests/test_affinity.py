"""CPU affinity of the server (`serve.cpu_affinity`) and of the client actors (`bench.cpu_affinity`): the
campaign checks, the plan, the guard that pins the server's whole process tree, and the validity record that
the pinned processes satisfy (the real server: tests/test_vllm_integration.py, the demo)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import yaml
from click.testing import CliRunner
from helpers import standin_campaign

from raysweep import procs
from raysweep.campaign import load_campaign
from raysweep.cli import main
from raysweep.drive import validity
from raysweep.errors import CampaignError
from raysweep.plan.plan import build_plan, dry_run_text


def _campaign(tmp_path: Path, serve: object, bench: object) -> Path:
    f = standin_campaign(tmp_path)
    data = yaml.safe_load(f.read_text())
    data["serve"]["cpu_affinity"] = serve
    data["bench"]["cpu_affinity"] = bench
    f.write_text(yaml.safe_dump(data))
    return f


def test_the_plan_pins_the_server_and_the_dry_run_says_where(tmp_path):
    plan = build_plan(load_campaign(_campaign(tmp_path, [0], "1")))
    assert {s.env[procs.CPUS_ENV] for s in plan.serves} == {"0"}
    assert "CPU affinity: server on CPU(s) 0, client actors on CPU(s) 1 (on each node)" in dry_run_text(plan)
    (tmp_path / "plain").mkdir()
    plain = build_plan(load_campaign(standin_campaign(tmp_path / "plain")))
    assert all(procs.CPUS_ENV not in s.env for s in plain.serves)
    assert "CPU affinity" not in dry_run_text(plain)


@pytest.mark.parametrize("serve, bench, field, says", [
    ([0, 1], "1-3", "bench.cpu_affinity", "shares CPU(s) 1 with serve.cpu_affinity"),
    ("zero", None, "serve.cpu_affinity", "is not a set of CPU ids"),
    ([-1], None, "serve.cpu_affinity", "is not a set of CPU ids"),
    (None, "", "bench.cpu_affinity", "is not a set of CPU ids"),
])
def test_bad_affinity_is_refused_naming_the_field(tmp_path, serve, bench, field, says):
    f = _campaign(tmp_path, serve, bench)
    with pytest.raises(CampaignError) as err:
        load_campaign(f)
    assert err.value.field.startswith(field) and says in str(err.value)
    res = CliRunner().invoke(main, ["run", str(f)])
    assert res.exit_code == 2 and field in res.output and not (tmp_path / "out").exists()


def _guarded(cpus: str | None, state: Path) -> str:
    """The output of a command started by the server guard, with RAYSWEEP_CPU_AFFINITY set to `cpus`; `state`:
    the guard's directory (its pid files)."""
    me = psutil.Process()
    env = {k: v for k, v in os.environ.items() if k != procs.CPUS_ENV}
    if cpus is not None:
        env[procs.CPUS_ENV] = cpus
    state.mkdir()
    child = ("import os, time; time.sleep(0.2); print('cpus', sorted(os.sched_getaffinity(0)), "
             "os.environ.get('RAYSWEEP_CPU_AFFINITY'), flush=True)")
    out = subprocess.run([sys.executable, "-m", "raysweep.serve.guard", str(me.pid), repr(me.create_time()), str(state),
                          "--", sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=60)
    return out.stdout


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to tell a pinned process apart")
def test_the_guard_pins_the_server_it_starts(tmp_path):
    last = max(os.sched_getaffinity(0))
    # pinned, and the variable not passed on to the server
    assert f"cpus [{last}] None" in _guarded(str(last), tmp_path / "pinned")
    unpinned = _guarded(None, tmp_path / "unpinned")
    assert f"cpus {sorted(os.sched_getaffinity(0))} None" in unpinned


def test_pinning_to_a_cpu_the_node_lacks_says_why():
    code = ("from raysweep import procs; import os; before = os.sched_getaffinity(0); "
            "print(procs.pin_cpus({4095})); print(os.sched_getaffinity(0) == before)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert "CPU affinity [4095]: OSError" in out and out.strip().endswith("True")


def test_disjoint_pinned_processes_pass_the_shared_cpus_check():
    record = {"node_ip": "10.0.0.1", "server_cpu_affinity": "0", "server_cpu_affinity_per_node": "10.0.0.1=0",
              "client_cpu_affinity": "1", "client_node_ips": "10.0.0.1"}
    assert validity.shared_cpus(record) is False
    assert validity.shared_cpus({**record, "client_cpu_affinity": "0-1"}) is True


def test_the_driver_runs_beside_the_clients_only_when_the_server_has_cpus_of_its_own(tmp_path):
    from raysweep.drive.driver import driver_cpus

    for i, (serve, bench, driver) in enumerate([([0], "1", {1}), ("0-1", [2, 3], {2, 3}), (None, [1], None),
                                                ([0], None, None)]):
        (tmp_path / str(i)).mkdir()
        assert driver_cpus(load_campaign(_campaign(tmp_path / str(i), serve, bench))) == driver, (serve, bench)


def _child_cpus() -> str:
    return subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                          capture_output=True, text=True, timeout=60).stdout.strip()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to tell a pinned process apart")
def test_the_pinned_driver_starts_its_processes_there_and_gets_its_cpus_back():
    from raysweep.drive.driver import _pinned

    before, last = os.sched_getaffinity(0), max(os.sched_getaffinity(0))
    with _pinned({last}):
        assert os.sched_getaffinity(0) == {last} and _child_cpus() == f"[{last}]"
    assert os.sched_getaffinity(0) == before and _child_cpus() == str(sorted(before))
    with _pinned({4095}):  # a CPU this machine lacks: left where it was
        assert os.sched_getaffinity(0) == before


@pytest.mark.ray
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to tell a pinned process apart")
def test_an_embedded_ray_runs_on_the_driver_cpus():
    """`raysweep run` with disjoint server and client CPUs and no --address: the embedded Ray's own processes
    (GCS, raylet, workers) run on the clients' CPUs, not on the server's, and the driver gets its CPUs back."""
    last = max(os.sched_getaffinity(0))
    code = ("import os, psutil, ray\nfrom raysweep.drive.driver import ray_session\n"
            f"with ray_session(None, {{{last}}}):\n"
            "    ray.get(ray.remote(lambda: 1).remote())\n"
            "    for p in psutil.Process().children(recursive=True):\n"
            "        print('child', p.name(), sorted(p.cpu_affinity()))\n"
            "print('after', sorted(os.sched_getaffinity(0)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300).stdout
    children = [line.split() for line in out.splitlines() if line.startswith("child ")]
    names = {c[1] for c in children}
    assert {"raylet", "gcs_server"} <= names, out
    assert all(" ".join(c[2:]) == f"[{last}]" for c in children), out
    assert f"after {sorted(os.sched_getaffinity(0))}" in out, out

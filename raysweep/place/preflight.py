"""Preflight: what every node of the cluster brings to a sweep, and the nodes that differ from the rest.

`run_preflight()` runs one Ray task on every alive node, pinned to it (NodeAffinitySchedulingStrategy,
soft=False) and holding no CPU, so that it runs on a node busy with servers too. The task only gathers, as
raw text: `nvidia-smi --query-gpu=...`, the InfiniBand port files under /sys/class/infiniband, `ibv_devinfo`,
`nvidia-smi topo -m` (the NVLink / PCIe links
between the GPUs and their CPU and NUMA affinity), the NCCL-related environment of Ray's workers there (what a
server inherits before `serve.env`), and the Python, Ray, vLLM and torch versions. `gather_node` and its helpers
use the standard library only and are shipped to the nodes by
value, so a node whose Python lacks raysweep answers as well (a likely mistake that preflight should show).

The driver parses that with pure functions (`raysweep.place.preflight_facts`: `parse_nvidia_smi`, `parse_topo`,
`parse_ib_sysfs`, `parse_ibv_devinfo`), adds Ray's view of the node (GPU count, resources, labels: `node_report`)
and compares the nodes
(`compare`): on every field a node whose value differs from the most common value is a `Finding`, and
`NodeWarning`s say what is wrong on one node by itself (a GPU node without an active InfiniBand port, Ray
and nvidia-smi disagreeing on its GPUs, nvidia-smi failing, vLLM missing, the task failing there).

Hardware fields (GPUs, driver, InfiniBand, Ray's GPU count, NCCL variables) are compared between GPU nodes
only (Ray counts GPUs there or nvidia-smi lists some), so a CPU head node is no finding; software versions
are compared between all nodes. When the most common value is tied with another, there is no majority: every
node is a finding of that field, marked `tie`.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from raysweep.place import netcheck
from raysweep.place.preflight_facts import (
    NO_NVIDIA_SMI,
    gpu_facts,
    ibv_facts,
    node_report,
    parse_ib_port,
    parse_ib_sysfs,
    parse_ibv_devinfo,
    parse_nvidia_smi,
    parse_topo,
    topo_facts,
    tp_group_warnings,
)

__all__ = ["IB_SYSFS", "NO_NVIDIA_SMI", "Finding", "NodeWarning", "Preflight", "compare", "describe_node",
           "gather_node", "gpu_facts", "gpu_node", "ibv_facts", "nccl_env", "node_label", "node_report",
           "parse_ib_port", "parse_ib_sysfs", "parse_ibv_devinfo", "parse_nvidia_smi", "parse_topo", "read_ib_sysfs",
           "run_preflight", "topo_facts", "tp_group_warnings"]

log = logging.getLogger(__name__)

IB_SYSFS = "/sys/class/infiniband"
NOT_INSTALLED = "not installed"
GPU_QUERY = ("nvidia-smi", "--query-gpu=index,name,memory.total,driver_version", "--format=csv,noheader")
TOPO_QUERY = ("nvidia-smi", "topo", "-m")
IB_PORT_FILES = ("state", "phys_state", "rate", "link_layer")
ENV_NAMES = ("GLOO_SOCKET_IFNAME", "UCX_NET_DEVICES", "FI_PROVIDER")  # besides every NCCL_* variable
NOSET_PREFIX = "RAY_EXPERIMENTAL_NOSET_"  # Ray's switches that stop it from isolating its workers' GPUs
OUTPUT_LIMIT = 20_000  # characters kept of a command's stdout and stderr

_TORCH_PROBE = r"""
import json
out = {}
try:
    import torch
    out["torch"] = torch.__version__
    out["torch_cuda"] = torch.version.cuda
    try:
        v = torch.cuda.nccl.version()
        out["torch_nccl"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    except Exception:
        out["torch_nccl"] = None
except Exception as exc:
    out["torch"] = "import failed: " + (str(exc).splitlines() or [""])[0][:200]
print(json.dumps(out))
"""


# ---------------------------------------------------------------------------------------------------
# Gathering (runs on each node; standard library only, shipped by value)
# ---------------------------------------------------------------------------------------------------

def nccl_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that steer NCCL and its fallbacks: every NCCL_*, GLOO_SOCKET_IFNAME, UCX_NET_DEVICES,
    FI_PROVIDER, and Ray's RAY_EXPERIMENTAL_NOSET_*_VISIBLE_DEVICES (GPU isolation of its workers off)."""
    return {k: v for k, v in sorted(environ.items()) if k.startswith("NCCL_") or k in ENV_NAMES
            or (k.startswith(NOSET_PREFIX) and k.endswith("VISIBLE_DEVICES"))}


def read_ib_sysfs(root: str | os.PathLike[str] = IB_SYSFS) -> dict[str, dict[str, dict[str, str]]]:
    """The port files of every InfiniBand device under `root`: {device: {port: {file: content}}}.
    {} when `root` does not exist (no RDMA device, or no driver)."""
    base = pathlib.Path(root)
    devices: dict[str, dict[str, dict[str, str]]] = {}
    if not base.is_dir():
        return devices
    for dev in sorted(base.iterdir(), key=lambda p: p.name):
        ports: dict[str, dict[str, str]] = {}
        ports_dir = dev / "ports"
        if ports_dir.is_dir():
            for port in sorted(ports_dir.iterdir(), key=lambda p: (len(p.name), p.name)):
                files = {}
                for name in IB_PORT_FILES:
                    try:
                        files[name] = (port / name).read_text(errors="replace").strip()
                    except OSError:
                        continue
                ports[port.name] = files
        devices[dev.name] = ports
    return devices


def run_command(argv: list[str] | tuple[str, ...], timeout_s: float) -> dict[str, Any] | None:
    """Run a command: None when it is not on PATH; else its return code, stdout and stderr (rc None and
    `error` when it could not run or ran past `timeout_s`)."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, errors="replace", timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"rc": None, "stdout": "", "stderr": "", "error": f"{argv[0]} timed out after {timeout_s:g} s"}
    except OSError as exc:
        return {"rc": None, "stdout": "", "stderr": "", "error": f"{argv[0]} could not run: {exc}"}
    return {"rc": done.returncode, "stdout": done.stdout[-OUTPUT_LIMIT:], "stderr": done.stderr[-OUTPUT_LIMIT:],
            "error": ""}


def torch_build(locations: list[str] | None) -> dict[str, Any] | None:
    """torch's version and its CUDA and HIP versions from its `version.py`, read without importing torch
    (`locations`: its package directories); None when that file cannot be read."""
    import ast

    for loc in locations or []:
        try:
            tree = ast.parse(pathlib.Path(loc, "version.py").read_text())
        except (OSError, SyntaxError, ValueError):
            continue
        values: dict[str, Any] = {}
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                name, value = node.targets[0].id, node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                name, value = node.target.id, node.value
            else:
                continue
            try:
                values[name] = ast.literal_eval(value)
            except (ValueError, TypeError, SyntaxError):
                continue
        if isinstance(values.get("__version__"), str) and "cuda" in values:
            return {"torch": values["__version__"], "torch_cuda": values["cuda"], "torch_nccl": None,
                    "hip": values.get("hip")}
    return None


def node_versions(timeout_s: float) -> dict[str, Any]:
    """Python, Ray, vLLM and torch (with its CUDA and NCCL) as this node's Python sees them. A CPU build of torch
    is read from its version.py; a CUDA or ROCm build is asked in a subprocess (for its NCCL): importing torch is
    slow and heavy, and it stays out of the Ray worker."""
    import importlib.metadata
    import importlib.util
    import platform

    out: dict[str, Any] = {"python": platform.python_version(), "python_executable": sys.executable}
    try:
        import ray

        out["ray"] = ray.__version__
    except ImportError:
        out["ray"] = NOT_INSTALLED
    try:
        out["vllm"] = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        out["vllm"] = NOT_INSTALLED
    out["vllm_path"] = shutil.which("vllm")
    out.update(torch=NOT_INSTALLED, torch_cuda=None, torch_nccl=None)
    spec = importlib.util.find_spec("torch")
    build = torch_build(spec.submodule_search_locations if spec is not None else None)
    if build is not None and build["torch_cuda"] is None and not build.pop("hip"):
        out.update(build)  # a CPU build has no NCCL to ask for: no torch import beside a server that is starting
    elif spec is not None:
        res = run_command([sys.executable, "-c", _TORCH_PROBE], timeout_s)
        try:
            out.update(json.loads(res["stdout"].strip().splitlines()[-1]))  # type: ignore[index]
        except (TypeError, IndexError, ValueError):
            out["torch"] = "probe failed: " + ((res or {}).get("error") or (res or {}).get("stderr", "")
                                               or "no output").strip()[-300:]
    return out


def gather_node(sysfs_root: str = IB_SYSFS, timeout_s: float = 20.0) -> dict[str, Any]:
    """Everything preflight wants to know about the node it runs on, unparsed (the Ray task's body)."""
    facts: dict[str, Any] = {"hostname": socket.gethostname(), "pid": os.getpid(), "node_id": None}
    try:
        import ray

        if ray.is_initialized():  # never connect from here: outside a Ray worker there is no node id
            facts["node_id"] = ray.get_runtime_context().get_node_id()
    except ImportError:
        pass
    t0 = time.monotonic()
    facts["nvidia_smi"] = run_command(GPU_QUERY, timeout_s)
    facts["topo"] = run_command(TOPO_QUERY, timeout_s)
    facts["ib_sysfs"] = read_ib_sysfs(sysfs_root)
    facts["ibv_devinfo"] = run_command(("ibv_devinfo",), timeout_s)
    facts["env"] = nccl_env(os.environ)
    facts["versions"] = node_versions(timeout_s)
    facts["net"] = netcheck.host_facts()  # interfaces, addresses, GLOO/NCCL_SOCKET_IFNAME, VLLM_HOST_IP
    facts["gather_s"] = round(time.monotonic() - t0, 3)
    return facts


# ---------------------------------------------------------------------------------------------------
# Comparison (pure)
# ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Finding:
    """A node whose value of `field` differs from the most common one (`majority`; with `tie`, there is
    none: two or more values are equally common)."""

    node_id: str
    node: str
    field: str
    value: Any
    majority: Any
    tie: bool = False


@dataclass(frozen=True)
class NodeWarning:
    node_id: str
    node: str
    message: str


@dataclass
class Preflight:
    nodes: list[dict[str, Any]]
    findings: list[Finding] = field(default_factory=list)
    warnings: list[NodeWarning] = field(default_factory=list)
    reachability: list[dict[str, Any]] = field(default_factory=list)  # netcheck.probe_reachability
    driver: dict[str, str] = field(default_factory=dict)  # the driver's raysweep and vLLM versions

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "findings": [asdict(f) for f in self.findings],
                "warnings": [asdict(w) for w in self.warnings], "reachability": self.reachability,
                "driver": self.driver,
                "summary": {"nodes": len(self.nodes), "gpu_nodes": sum(1 for n in self.nodes if gpu_node(n)),
                            "findings": len(self.findings), "warnings": len(self.warnings)}}


def node_label(rep: Mapping[str, Any]) -> str:
    """`hostname 1a2b3c4d` (the start of the node id: hosts may share a name, simulated nodes do)."""
    return f"{rep.get('hostname') or rep.get('ip') or '?'} {str(rep['node_id'])[:8]}"


def gpu_node(rep: Mapping[str, Any]) -> bool:
    """Whether Ray counts GPUs on the node or nvidia-smi lists some there."""
    return rep["ray"]["gpus"] > 0 or bool(rep.get("gpu", {}).get("devices"))


def _joined(values: list[Any]) -> str | None:
    return ", ".join(sorted({str(v) for v in values})) or None


def _gpu_count(rep: Mapping[str, Any]) -> int | str:
    gpu = rep["gpu"]
    return len(gpu["devices"]) if gpu["status"] == "ok" else (NO_NVIDIA_SMI if gpu["status"] == NO_NVIDIA_SMI
                                                              else "nvidia-smi failed")


def _ok_gpus(rep: Mapping[str, Any], key: str) -> str | None:
    return _joined([d[key] for d in rep["gpu"]["devices"]]) if rep["gpu"]["status"] == "ok" else None


@dataclass(frozen=True)
class _Check:
    field: str
    value: Callable[[Mapping[str, Any]], Any]
    gpu_only: bool
    skip_none: bool = True  # a node without a value (None) is left out of this field


CHECKS = (
    _Check("gpu_count", _gpu_count, True),
    _Check("gpu_model", lambda r: _ok_gpus(r, "name"), True),
    _Check("driver_version", lambda r: _ok_gpus(r, "driver"), True),
    _Check("ray_gpus", lambda r: r["ray"]["gpus"], True),
    _Check("ib_devices", lambda r: r["infiniband"]["device_count"], True),
    _Check("ib_active_ports", lambda r: r["infiniband"]["active_ports"], True),
    _Check("ib_link_rate", lambda r: _joined(r["infiniband"]["active_rates"]), True),
    _Check("vllm", lambda r: r["versions"].get("vllm"), False),
    _Check("ray", lambda r: r["versions"].get("ray"), False),
    _Check("python", lambda r: r["versions"].get("python"), False),
    _Check("torch", lambda r: r["versions"].get("torch"), False),
    _Check("torch_nccl", lambda r: r["versions"].get("torch_nccl"), True),
)


def _env_value(name: str) -> Callable[[Mapping[str, Any]], Any]:
    return lambda r: r["env"].get(name)


def _env_checks(reports: list[Mapping[str, Any]]) -> list[_Check]:
    names = sorted({k for r in reports for k in r["env"]})
    return [_Check(f"env:{name}", _env_value(name), True, skip_none=False) for name in names]


def _most_common(values: list[Any]) -> tuple[Any, bool]:
    """The most common value and whether it is tied with another."""
    ranked = Counter(values).most_common()
    return ranked[0][0], len(ranked) > 1 and ranked[0][1] == ranked[1][1]


def compare(reports: Sequence[Mapping[str, Any]], driver: Mapping[str, str] | None = None
            ) -> tuple[list[Finding], list[NodeWarning]]:
    """The nodes that differ from the others, field by field, and what is wrong on each node by itself
    (`driver`: the driver's raysweep and vLLM versions, which every node should have)."""
    answered = [r for r in reports if not r.get("error") and "gpu" in r]
    gpu_reports = [r for r in answered if gpu_node(r)]
    findings: list[Finding] = []
    for check in (*CHECKS, *_env_checks(gpu_reports)):
        pool = [(r, check.value(r)) for r in (gpu_reports if check.gpu_only else answered)]
        pool = [(r, v) for r, v in pool if v is not None or not check.skip_none]
        if len({v for _, v in pool}) < 2:
            continue
        majority, tie = _most_common([v for _, v in pool])
        findings += [Finding(r["node_id"], node_label(r), check.field, v, None if tie else majority, tie)
                     for r, v in pool if tie or v != majority]
    warnings = [w for r in reports for w in node_warnings(r, driver)]
    return findings, warnings


def node_warnings(rep: Mapping[str, Any], driver: Mapping[str, str] | None = None) -> list[NodeWarning]:
    """What is wrong on one node, whatever the others have (and, with `driver`, where its raysweep or vLLM
    differs from the driver's)."""
    say = [] if not rep.get("error") else [f"no report from this node: {rep['error']}"]
    net = rep.get("net")
    if net:  # interface and address variables that do not fit this host (netcheck)
        say += netcheck.env_problems(net, net.get("env") or {})
        say += netcheck.version_problems(net, driver or {})
    noset = {k: v for k, v in (rep.get("env") or {}).items()
             if k.startswith(NOSET_PREFIX) and k.endswith("VISIBLE_DEVICES") and str(v).lower() in ("1", "true")}
    if noset:
        say.append(f"{', '.join(f'{k}={v}' for k, v in noset.items())} in Ray's environment: Ray does not set "
                   "CUDA_VISIBLE_DEVICES for its workers, so every server on this node would see all its GPUs and a "
                   "second configuration there would fail vLLM's free-memory check; remove it and start Ray again")
    if "gpu" in rep:
        gpu, ib, ray_gpus = rep["gpu"], rep["infiniband"], rep["ray"]["gpus"]
        if gpu_node(rep) and not ib["active_ports"]:
            say.append(f"GPU node without any active InfiniBand port ({ib['device_count']} device(s), "
                       f"{ib['port_count']} port(s)): NCCL between nodes would use TCP sockets")
        if gpu["status"] == "ok" and len(gpu["devices"]) != ray_gpus:
            say.append(f"Ray says {ray_gpus} GPUs but nvidia-smi lists {len(gpu['devices'])}")
        if gpu["status"] == "error":
            say.append("nvidia-smi failed: " + ((gpu["error"] or "").strip().splitlines() or ["no output"])[0])
        if gpu_node(rep) and rep["versions"].get("vllm") == NOT_INSTALLED:
            say.append(f"vLLM is not installed in this node's Python ({rep['versions'].get('python_executable')})")
    return [NodeWarning(rep["node_id"], node_label(rep), s) for s in say]


# ---------------------------------------------------------------------------------------------------
# Display rows (pure text; the CLI prints them)
# ---------------------------------------------------------------------------------------------------

def _num(v: float) -> str:
    return f"{v / 2**30:.1f} GiB" if v >= 2**30 else f"{v:g}"


def describe_node(rep: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(what, value) rows of one node for a table."""
    ray_view = rep["ray"]
    rows = [("node id", str(rep["node_id"])), ("ip / host", f"{rep.get('ip')} / {rep.get('hostname')}"),
            ("Ray GPUs", str(ray_view["gpus"]))]
    if rep.get("error"):
        rows.append(("error", str(rep["error"])))
    if "gpu" in rep:
        gpu, ib, v = rep["gpu"], rep["infiniband"], rep["versions"]
        if gpu["status"] == "ok":
            models = Counter(f"{d['name']}" + (f" ({d['memory_mib']} MiB)" if d["memory_mib"] else "")
                             for d in gpu["devices"])
            rows.append(("GPUs (nvidia-smi)", ", ".join(f"{n} x {m}" for m, n in models.items()) or "none"))
            rows.append(("driver", _joined([d["driver"] for d in gpu["devices"]]) or "-"))
        else:
            rows.append(("GPUs (nvidia-smi)", gpu["status"] + (f": {gpu['error']}" if gpu["error"] else "")))
        if ib["device_count"]:
            ports = "; ".join(f"{p['device']}/{p['port']} {p['state'] or '?'} {p['phys_state'] or '?'} "
                              f"{p['rate'] or '?'} {p['link_layer'] or '?'}" for p in ib["ports"])
            rows.append(("InfiniBand", f"{ib['device_count']} device(s), {ib['active_ports']}/{ib['port_count']} "
                                       f"port(s) active: {ports}"))
        else:
            rows.append(("InfiniBand", "no device"))
        rows.append(("ibv_devinfo", _ibv_text(ib["ibv_devinfo"])))
        if rep.get("topology_status", NO_NVIDIA_SMI) != NO_NVIDIA_SMI:
            rows.append(("GPU topology", topo_text(rep.get("topology") or {}) or str(rep.get("topology_status"))))
        rows.append(("NCCL env", ", ".join(f"{k}={val}" for k, val in rep["env"].items()) or "none set"))
        torch = v.get("torch")
        if v.get("torch_cuda") or v.get("torch_nccl"):
            torch = f"{torch} (CUDA {v.get('torch_cuda') or '-'}, NCCL {v.get('torch_nccl') or '-'})"
        rows.append(("versions", f"python {v.get('python')}, ray {v.get('ray')}, vllm {v.get('vllm')}, "
                                 f"torch {torch}"))
    if rep.get("net"):
        net = rep["net"]
        rows.append(("interfaces", netcheck.interfaces_text(net) or "-"))
        rows.append(("address env", ", ".join(f"{k}={val}" for k, val in (net.get("env") or {}).items()) or "none set"))
        rows.append(("raysweep", str((net.get("versions") or {}).get("raysweep"))))
    rows.append(("labels", ", ".join(f"{k}={val}" for k, val in sorted(ray_view["labels"].items())) or "none"))
    rows.append(("resources", ", ".join(f"{k} {_num(val)}" for k, val in sorted(ray_view["resources"].items())
                                        if not k.startswith("node:"))))
    return rows


def topo_text(topo: Mapping[str, Any]) -> str:
    """`GPU0: GPU1 NV18, GPU2 SYS (NUMA 0); ...`"""
    return "; ".join(f"GPU{g}: " + ", ".join(f"GPU{o} {link}" for o, link in info["links"].items())
                     + (f" (NUMA {info['numa']})" if info.get("numa") not in (None, "N/A") else "")
                     for g, info in (topo.get("gpus") or {}).items())


def _ibv_text(ibv: Mapping[str, Any]) -> str:
    if ibv["status"] == "error":
        return f"error: {ibv['error']}"
    if ibv["status"] != "ok":
        return str(ibv["status"])
    return "; ".join(f"{h['hca_id']} fw {h.get('fw_ver', '?')}: "
                     + ", ".join(f"port {p['port']} {p.get('state', '?')}" for p in h["ports"])
                     for h in ibv["hcas"]) or "no HCA"


def finding_text(value: object, field_name: str) -> str:
    if value is None and field_name.startswith("env:"):
        return "unset"
    return "-" if value is None else str(value)


# ---------------------------------------------------------------------------------------------------
# On the cluster
# ---------------------------------------------------------------------------------------------------

def _alive_nodes() -> list[dict[str, Any]]:
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    return sorted(nodes, key=lambda n: ("node:__internal_head__" not in (n.get("Resources") or {}),
                                        n.get("NodeManagerAddress", ""), n["NodeID"]))


def driver_versions() -> dict[str, str]:
    """The driver's raysweep and vLLM versions, which every host should have."""
    return dict(netcheck.host_facts()["versions"])


def run_preflight(sysfs_root: str | None = None, timeout_s: float = 120.0,
                  command_timeout_s: float = 20.0, reach: bool = True,
                  driver: Mapping[str, str] | None = None) -> Preflight:
    """Gather every alive node of the connected Ray cluster and compare them. `sysfs_root` (default
    `IB_SYSFS`) is where each node's InfiniBand devices are read; a node that has not answered within
    `timeout_s` is reported with the reason. With `reach`, every node dials a TCP listener on every other
    node's address (`netcheck.probe_reachability`); `driver` (default: this process's) is the raysweep and
    vLLM versions every node is compared with."""
    import ray
    import ray.cloudpickle
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # nodes need no raysweep to answer
    ray.cloudpickle.register_pickle_by_value(netcheck)
    task = ray.remote(num_cpus=0, max_retries=0)(gather_node)
    root = sysfs_root or IB_SYSFS
    nodes = _alive_nodes()
    if not nodes:
        return Preflight(nodes=[])
    refs = {n["NodeID"]: task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False),
                                      name="raysweep-preflight").remote(root, command_timeout_s) for n in nodes}
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    done = set(ready)
    reports = []
    for n in nodes:
        ref = refs[n["NodeID"]]
        if ref not in done:
            try:
                ray.cancel(ref, force=True)
            except Exception as exc:
                log.debug("could not cancel the preflight task on %s: %s", n["NodeID"][:8], exc)
            reports.append(node_report(n, None, f"no answer within {timeout_s:g} s"))
            continue
        try:
            facts = ray.get(ref)
        except Exception as exc:
            last = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]  # a traceback ends with its error
            reports.append(node_report(n, None, last[:300]))
            continue
        reports.append(node_report(n, facts))
    driver = dict(driver) if driver is not None else driver_versions()
    findings, warnings = compare(reports, driver)
    reached: list[dict[str, Any]] = []
    if reach:
        reached = netcheck.probe_reachability([(n["NodeID"], n.get("NodeManagerAddress", "")) for n in nodes])
        labels = {r["node_id"]: f"{node_label(r)} ({r.get('ip')})" for r in reports}
        for node_id, says in netcheck.reach_problems(reached, labels).items():
            warnings += [NodeWarning(node_id, labels.get(node_id, node_id[:8]), s) for s in says]
    log.info("preflight: %d node(s), %d finding(s), %d warning(s)", len(reports), len(findings), len(warnings))
    return Preflight(nodes=reports, findings=findings, warnings=warnings, reachability=reached, driver=driver)


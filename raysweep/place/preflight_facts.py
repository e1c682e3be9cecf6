"""Preflight's parsing (pure): the raw text a node's task gathered (`raysweep.place.preflight.gather_node`) into
facts: its GPUs from nvidia-smi, their NVLink / PCIe / NUMA topology and the TP groups that cross it, its
InfiniBand ports from sysfs and ibv_devinfo, and one node's report beside Ray's view of it."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

NO_NVIDIA_SMI = "no nvidia-smi"

_MIB = re.compile(r"^(\d+)\s*MiB$")
_STATE = re.compile(r"^\s*(?:(?P<code>\d+)\s*:\s*)?(?P<name>\S.*?)\s*$")
_GBPS = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")


def parse_nvidia_smi(stdout: str, returncode: int | None = 0, stderr: str = "") -> dict[str, Any]:
    """`nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader` output:
    {"status": "ok", "devices": [{index, name, memory_mib, driver}], "error": "", "unparsed": [...]}, or
    status "error" with the text of the failure (a non-zero exit, or nothing that reads as a GPU)."""
    devices, unparsed = [], []
    for line in stdout.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4 or not parts[0].isdigit():
            unparsed.append(line.strip())
            continue
        mem = _MIB.match(parts[-2])
        devices.append({"index": int(parts[0]), "name": ", ".join(parts[1:-2]),
                        "memory_mib": int(mem.group(1)) if mem else None, "driver": parts[-1]})
    text = "\n".join(t for t in (stderr.strip(), stdout.strip()) if t)
    if returncode != 0:
        return {"status": "error", "devices": [], "error": text or f"nvidia-smi exited with code {returncode}",
                "unparsed": []}
    if unparsed and not devices:
        return {"status": "error", "devices": [], "error": text, "unparsed": unparsed}
    return {"status": "ok", "devices": devices, "error": "", "unparsed": unparsed}


def gpu_facts(result: dict[str, Any] | None) -> dict[str, Any]:
    """The GPU part of a node report from the gathered nvidia-smi run (None: not on PATH)."""
    if result is None:
        return {"status": NO_NVIDIA_SMI, "devices": [], "error": "", "unparsed": []}
    if result.get("error"):
        return {"status": "error", "devices": [], "error": result["error"], "unparsed": []}
    return parse_nvidia_smi(result.get("stdout", ""), result.get("rc"), result.get("stderr", ""))


_TOPO_SPLIT = re.compile(r"\t+|\s{2,}")
_ANSI_TOPO = re.compile(r"\x1b\[[0-9;]*m")


def parse_topo(text: str) -> dict[str, Any]:
    """`nvidia-smi topo -m`: per GPU index, its link to every other GPU (`NV#` NVLink with # links, `PIX`,
    `PXB`, `PHB`, `NODE`, `SYS`), its CPU affinity and NUMA node; `{}` when there is no GPU matrix."""
    lines = [_ANSI_TOPO.sub("", ln).rstrip() for ln in text.splitlines()]
    head = next((i for i, ln in enumerate(lines) if re.search(r"\bGPU0\b", ln) and not ln.lstrip().startswith("GPU0 ")
                 and not re.match(r"^\s*GPU0\s+X\b", ln)), None)
    if head is None:
        return {}
    cols = [c for c in _TOPO_SPLIT.split(lines[head].strip()) if c]
    gpus: dict[str, dict[str, Any]] = {}
    for ln in lines[head + 1:]:
        if not ln.strip() or ln.lstrip().startswith("Legend"):
            break
        cells = [c for c in _TOPO_SPLIT.split(ln.strip()) if c]
        name, values = cells[0], cells[1:]
        if not re.fullmatch(r"GPU\d+", name):
            continue
        row = dict(zip(cols, values))
        gpus[name[3:]] = {"links": {c[3:]: row[c] for c in cols
                                    if re.fullmatch(r"GPU\d+", c) and c != name and c in row},
                          "cpu_affinity": row.get("CPU Affinity"), "numa": row.get("NUMA Affinity")}
    return {"gpus": gpus} if gpus else {}


def topo_facts(result: dict[str, Any] | None) -> dict[str, Any]:
    """The topology part of a node report from the gathered `nvidia-smi topo -m` (None: not on PATH)."""
    if result is None:
        return {"topology": {}, "topology_status": NO_NVIDIA_SMI}
    if result.get("error") or result.get("rc"):
        return {"topology": {}, "topology_status": "error: " + (result.get("error") or result.get("stderr") or
                                                                 f"exit code {result.get('rc')}").strip()[:200]}
    topo = parse_topo(result.get("stdout", ""))
    return {"topology": topo, "topology_status": "ok" if topo else "no GPU matrix in the output"}


def tp_group_warnings(topo: Mapping[str, Any], gpu_ids: list[str], tp: int) -> list[str]:
    """Warnings for the tensor-parallel groups of a server's GPUs on one node (consecutive groups of `tp` of
    `gpu_ids`, as vLLM forms them): a pair of GPUs without NVLink between them, a group across NUMA nodes."""
    gpus = (topo or {}).get("gpus") or {}
    if tp < 2 or not gpus:
        return []
    out = []
    for start in range(0, len(gpu_ids) - tp + 1, tp):
        group = [str(g) for g in gpu_ids[start:start + tp]]
        slow = [(a, b, gpus.get(a, {}).get("links", {}).get(b)) for i, a in enumerate(group) for b in group[i + 1:]]
        slow = [(a, b, link) for a, b, link in slow if link is not None and not str(link).startswith("NV")]
        if slow:
            pairs = ", ".join(f"GPU{a}-GPU{b} {link}" for a, b, link in slow[:4])
            out.append(f"tensor-parallel group of GPUs {','.join(group)} has no NVLink between {pairs}")
        numa = sorted({str(gpus[g].get("numa")) for g in group
                       if g in gpus and gpus[g].get("numa") not in (None, "N/A")})
        if len(numa) > 1:
            out.append(f"tensor-parallel group of GPUs {','.join(group)} spans NUMA nodes {','.join(numa)}")
    return out


def parse_ib_port(files: Mapping[str, str]) -> dict[str, Any]:
    """One port from its sysfs files: state `4: ACTIVE`, phys_state `5: LinkUp`, rate `400 Gb/sec (4X NDR)`,
    link_layer `InfiniBand` or `Ethernet` (RoCE)."""
    def named(key: str) -> tuple[int | None, str | None]:
        m = _STATE.match(files.get(key, "") or "")
        if not m:
            return None, None
        return (int(m.group("code")) if m.group("code") else None), m.group("name")

    code, state = named("state")
    _, phys = named("phys_state")
    rate = (files.get("rate") or "").strip() or None
    gbps = _GBPS.match(rate or "")
    return {"state": state, "state_code": code, "phys_state": phys, "rate": rate,
            "rate_gbps": float(gbps.group(1)) if gbps else None, "link_layer": (files.get("link_layer") or None),
            "active": (state or "").upper() == "ACTIVE" or code == 4}


def parse_ib_sysfs(raw: Mapping[str, Mapping[str, Mapping[str, str]]]) -> dict[str, Any]:
    """The InfiniBand summary of a node from `read_ib_sysfs`: devices, every port, the active ones and
    their rates."""
    ports = [{"device": dev, "port": port, **parse_ib_port(files)}
             for dev, dev_ports in sorted(raw.items()) for port, files in dev_ports.items()]
    active = [p for p in ports if p["active"]]
    return {"devices": sorted(raw), "device_count": len(raw), "ports": ports, "port_count": len(ports),
            "active_ports": len(active), "active_rates": sorted({p["rate"] for p in active if p["rate"]})}


def parse_ibv_devinfo(text: str) -> list[dict[str, Any]]:
    """`ibv_devinfo` summarised: per HCA its transport, firmware, board id, and per port its state, active
    MTU and link layer."""
    hcas: list[dict[str, Any]] = []
    port: dict[str, Any] | None = None
    for line in text.splitlines():
        key, sep, value = line.strip().partition(":")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key == "hca_id":
            hcas.append({"hca_id": value, "ports": []})
            port = None
        elif not hcas:
            continue
        elif key == "port":
            port = {"port": int(value) if value.isdigit() else value}
            hcas[-1]["ports"].append(port)
        elif port is not None and key in ("state", "active_mtu", "link_layer", "active_width", "active_speed"):
            port[key] = value
        elif port is None and key in ("transport", "fw_ver", "board_id", "phys_port_cnt"):
            hcas[-1][key] = value
    return hcas


def ibv_facts(result: dict[str, Any] | None) -> dict[str, Any]:
    if result is None:
        return {"status": "no ibv_devinfo", "hcas": [], "error": ""}
    if result.get("error") or result.get("rc") != 0:
        text = result.get("error") or "\n".join(t for t in (result.get("stderr", "").strip(),
                                                            result.get("stdout", "").strip()) if t)
        return {"status": "error", "hcas": [], "error": text or f"ibv_devinfo exited with code {result.get('rc')}"}
    return {"status": "ok", "hcas": parse_ibv_devinfo(result.get("stdout", "")), "error": ""}


def node_report(node: Mapping[str, Any], facts: Mapping[str, Any] | None, error: str = "") -> dict[str, Any]:
    """One node's report: Ray's view of it (an entry of `ray.nodes()`) with the parsed facts of its task
    (None, with `error`, when the task did not answer)."""
    res = {k: float(v) for k, v in (node.get("Resources") or {}).items()}
    rep: dict[str, Any] = {
        "node_id": node["NodeID"], "ip": node.get("NodeManagerAddress", ""),
        "hostname": node.get("NodeManagerHostname", ""), "is_head": "node:__internal_head__" in res,
        "error": error,
        "ray": {"gpus": int(res.get("GPU", 0)), "resources": res, "labels": dict(node.get("Labels") or {})},
    }
    if facts is None:
        return rep
    rep["hostname"] = facts.get("hostname") or rep["hostname"]
    rep["ran_on"] = facts.get("node_id")  # the node the task ran on, as it saw it: the pin held if equal
    ib = parse_ib_sysfs(facts.get("ib_sysfs") or {})
    ib["ibv_devinfo"] = ibv_facts(facts.get("ibv_devinfo"))
    rep.update(topo_facts(facts.get("topo")))
    rep.update(gpu=gpu_facts(facts.get("nvidia_smi")), infiniband=ib, env=dict(facts.get("env") or {}),
               versions=dict(facts.get("versions") or {}), gather_s=facts.get("gather_s"))
    if facts.get("net"):
        rep["net"] = dict(facts["net"])  # interfaces and their addresses, the interface variables (netcheck)
    return rep


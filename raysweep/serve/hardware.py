"""The hardware a run was measured on, and configurations whose runs span different hardware.

Every result records where it ran: the nodes (`node_ids`, `node_ips`, `provenance_hostnames`), the GPUs Ray
gave its server on each (`gpu_ids_per_node`), its layout (`num_nodes`, `gpus_per_node`, `gpu_count`), the GPU
model nvidia-smi lists on its first node (`provenance_gpu`) and, from Ray, the type of each of its nodes
(`node_types`: accelerator type and node group labels, GPUs and CPUs). `signature` sums that up in one
column, `hardware`: `1 node(s) x 1 GPU(s) / GPU NVIDIA H100 80GB HBM3 x 8 / nodes H100, 8 GPU, 96 CPU`. The
node identities are not part of it: two nodes of one type are the same hardware.

`mark(records)` looks at the runs of each configuration together: when they span more than one hardware
(after a node loss, a resumed campaign on another cluster, a driver that placed it elsewhere), every run of
that configuration gets `hardware_mixed` True, and the runs not on its main hardware (the one it ran on
first, which its layout was chosen for; not the most common one, which after a bad re-placement may be the
wrong one) fail the `other hardware` check of their validity record, which names both. The aggregates
leave flagged runs out (`aggregate.left_out_mask`), so runs of one point measured on different hardware
are never pooled silently; status and the report list the configurations and count
their runs per hardware (`mixed`).
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Iterable
from typing import Any

__all__ = ["CHECK", "fields", "mark", "mixed", "node_types", "signature"]

log = logging.getLogger(__name__)

CHECK = "other hardware"
_NO_MODEL = ("", "none", "unknown", None)
_LABELS = ("ray.io/accelerator-type", "ray.io/node-group")
_TYPES: dict[tuple[str, ...], str] = {}  # node ids -> their types (a node's type does not change while it lives)


def _node_type(node: dict[str, Any], local: str | None = None) -> str:
    """`H100, 8 GPU, 96 CPU`: its labels, GPUs and CPUs. The CPUs are the machine's own where the node is this
    one (`local`, its Ray node id): an embedded Ray declares at least 4 CPUs to schedule its actors, which is
    not what the machine has."""
    labels = node.get("Labels") or {}
    res = node.get("Resources") or {}
    named = [str(labels[k]) for k in _LABELS if labels.get(k)]
    cpus = float(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0) \
        if local is not None and node.get("NodeID") == local else res.get("CPU", 0)
    return ", ".join([*named, f"{res.get('GPU', 0):g} GPU", f"{cpus:g} CPU"])


def node_types(node_ids: Iterable[str]) -> str:
    """The distinct types of these nodes, from Ray (`H100, 8 GPU, 96 CPU`; several joined by ` | `); empty
    when Ray does not know them (not connected, or the nodes are gone)."""
    key = tuple(node_ids)
    if key in _TYPES:
        return _TYPES[key]
    try:
        import ray

        known = {n["NodeID"]: n for n in ray.nodes()} if ray.is_initialized() else {}
        local = ray.get_runtime_context().get_node_id() if known else None
    except Exception as exc:
        log.debug("node types not read: %s", exc)
        return ""
    if not all(n in known for n in key):
        return ""
    _TYPES[key] = " | ".join(sorted({_node_type(known[n], local) for n in key}))
    return _TYPES[key]


def signature(record: dict[str, Any]) -> str:
    """The `hardware` of one result record, from its columns (older records without `node_types` too)."""
    gpn = record.get("gpus_per_node")
    nodes = record.get("num_nodes") or 1
    parts = [f"{nodes:g} node(s) x {gpn:g} GPU(s)" if isinstance(gpn, (int, float)) and gpn > 0
             else f"{nodes:g} node(s), no GPU"]
    model = record.get("provenance_gpu")
    if model not in _NO_MODEL:
        parts.append(f"GPU {model}")
    if record.get("node_types"):
        parts.append(f"nodes {record['node_types']}")
    return " / ".join(parts)  # never "; ", which separates the checks of a validity record


def fields(record: dict[str, Any]) -> dict[str, Any]:
    """The `hardware` column of a result record as it is written."""
    return {"hardware": signature(record)}


def _main(runs: list[dict[str, Any]]) -> str:
    """The hardware of the run that started first."""
    return str(min(runs, key=lambda r: float(r.get("started_at") or 0.0))["hardware"])


def mark(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`hardware`, `hardware_mixed` and, for runs off their configuration's main hardware, the `other
    hardware` validity check, on every record (in place; returned for chaining)."""
    by_serve: dict[Any, list[dict[str, Any]]] = {}
    for r in records:
        if not r.get("hardware"):
            r["hardware"] = signature(r)
        by_serve.setdefault(r.get("serve_id"), []).append(r)
    for runs in by_serve.values():
        kinds = {r["hardware"] for r in runs}
        main = _main(runs) if len(kinds) > 1 else None
        for r in runs:
            r["hardware_mixed"] = main is not None
            if main is None or r["hardware"] == main:
                continue
            issue = f"{CHECK} ({r['hardware']}, where its configuration first ran on {main})"
            issues = str(r.get("validity_issues") or "")
            if CHECK not in issues:
                r["validity_issues"] = "; ".join(i for i in (issues, issue) if i)
            r["validity_ok"] = False
    return records


def mixed(records: Iterable[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """{serve id: {hardware: runs}} of the configurations whose runs span more than one hardware (records
    as `mark` left them)."""
    out: dict[str, Counter[str]] = {}
    for r in records:
        if r.get("hardware_mixed"):
            out.setdefault(str(r.get("serve_id")), Counter())[str(r.get("hardware"))] += 1
    return {sid: dict(c.most_common()) for sid, c in out.items()}

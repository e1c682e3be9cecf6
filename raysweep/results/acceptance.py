"""The first day on a GPU cluster: what a short acceptance campaign (`configs/gpu-acceptance.yaml`) saw, as a
checklist with what to fix when an item fails (pure logic on the ledger's server rows and the results table).

Per server configuration (its latest server), five checks:
- `GPUs per bundle`: the `CUDA_VISIBLE_DEVICES` each rank's `vllm serve` process had is the set of GPUs Ray
  gave its bundle;
- `NCCL transport`: the links NCCL chose, per pair of nodes (a server across nodes must not fall back to TCP
  sockets; one inside a node should use P2P/NVLink, not host memory);
- `fabric probe`: the all-reduce bus bandwidth measured across a multi-node server's bundles before it started;
- `GPU telemetry`: NVML samples in the points' `gpu_*` columns;
- `server start`: it became ready, and how long that took.
A check has `ok`, `FAIL`, `warn`, `n/a` (it does not apply: one GPU, one node) or `not seen` (nothing was
recorded to judge it). `placeable` leaves out the configurations this cluster cannot hold (one node: no
pipeline across two), which the checklist lists as not run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import pandas as pd

from raysweep.ledger import ServerRow
from raysweep.place import placement, transport

if TYPE_CHECKING:
    from raysweep.campaign.loading import CampaignSpec

__all__ = ["CHECKS", "Item", "checklist", "dry_run_lines", "failed", "placeable", "text_lines"]

CHECKS = ("GPUs per bundle", "NCCL transport", "fabric probe", "GPU telemetry", "server start")

FIX = {
    "GPUs per bundle": "the server did not run on the GPUs Ray reserved for it: remove CUDA_VISIBLE_DEVICES from "
                       "serve.env and from the environment of `ray start` on the node, and start Ray with "
                       "--num-gpus equal to the node's GPUs",
    "NCCL transport": "NCCL fell back to a slow path: check that the InfiniBand devices are visible where the "
                      "server runs (/dev/infiniband in the container), NCCL_IB_HCA and NCCL_SOCKET_IFNAME on the "
                      "nodes, and `raysweep preflight` (inside a node: NCCL_P2P_DISABLE unset, `nvidia-smi topo -m`)",
    "fabric probe": "the bandwidth probe failed or was not run: set transport.probe: true, and compare with "
                    "`raysweep preflight --bandwidth` between the same nodes",
    "GPU telemetry": "no NVML samples: set transport.telemetry: true, and check that the NVIDIA driver's NVML "
                     "(libnvidia-ml) is visible to Ray's workers (`python -c 'import pynvml; pynvml.nvmlInit()'` "
                     "on the node)",
    "server start": "the server did not become ready: read its log (OUTPUT_DIR/logs/), raise serve.ready_timeout_s "
                    "for a model that loads slowly, and check that the model fits the GPUs of the configuration",
}


@dataclass(frozen=True)
class Item:
    """One check of one server configuration."""

    check: str
    subject: str      # the configuration's label
    status: str       # ok, FAIL, warn, n/a, not seen
    seen: str         # what was recorded
    fix: str = ""     # what to do, when it did not pass


def _gpu_set(value: object) -> set[str]:
    return {g.strip() for g in str(value or "").split(",") if g.strip()}


ISOLATION_FIX = ("Ray was told not to set CUDA_VISIBLE_DEVICES for its workers, so every server sees all the GPUs "
                 "of its node: remove RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES from the environment of `ray start` "
                 "and of serve.env, then start Ray again on the node")


def _gpus(row: ServerRow) -> Item:
    ranks = row.rank_list()
    seen, bad, unknown, lost = [], [], 0, []
    for r in ranks:
        ray_gpus, cvd = _gpu_set(r.get("gpu_ids")), r.get("cuda_visible_devices")
        noset = r.get("noset_visible_devices") or {}
        if ray_gpus and (noset or (cvd is None and r.get("cuda_visible_set") is False)):
            # Ray reserved GPUs, but the process had no CUDA_VISIBLE_DEVICES of Ray's: it sees every GPU of the node
            why = ", ".join(f"{k}={v}" for k, v in noset.items()) or "CUDA_VISIBLE_DEVICES unset"
            lost.append(f"rank {r.get('rank', 0)}: Ray {','.join(sorted(ray_gpus)) or 'none'}, process "
                        f"{cvd if cvd is not None else 'all GPUs of the node'} ({why})")
            continue
        if cvd is None:
            unknown += 1
            continue
        seen.append(f"rank {r.get('rank', 0)}: Ray {','.join(sorted(ray_gpus)) or 'none'}, process {cvd or 'none'}")
        if _gpu_set(cvd) != ray_gpus or not ray_gpus:
            bad.append(seen[-1])
    if lost:
        return Item(CHECKS[0], "", "FAIL", "GPU isolation lost: " + "; ".join(lost + bad), ISOLATION_FIX)
    if bad:
        return Item(CHECKS[0], "", "FAIL", "; ".join(bad), FIX[CHECKS[0]])
    if unknown == len(ranks):
        return Item(CHECKS[0], "", "not seen", "the server processes' CUDA_VISIBLE_DEVICES were not recorded",
                    FIX[CHECKS[0]])
    return Item(CHECKS[0], "", "ok", "; ".join(seen))


def _transport(row: ServerRow, ngpus: int) -> Item:
    verdict = row.transport_verdict()
    nnodes = len(row.rank_list())
    if verdict is None or not verdict.get("channels"):
        if nnodes < 2 and ngpus < 2:
            return Item(CHECKS[1], "", "n/a", "one GPU: no NCCL link")
        if verdict is not None and verdict.get("cross_node") is False and ngpus <= nnodes:
            return Item(CHECKS[1], "", "n/a", "one GPU per node, data-parallel replicas: no NCCL link")
        return Item(CHECKS[1], "", "not seen", "no NCCL channel line in the server's log (transport.nccl_debug "
                    "must be on)", FIX[CHECKS[1]])
    text = transport.describe(verdict)
    if nnodes > 1 and transport.independent_nodes(verdict):  # data-parallel replicas, each inside its node
        if verdict.get("intra") == "SHM":
            return Item(CHECKS[1], "", "warn", text + " (through host memory, not P2P/NVLink)", FIX[CHECKS[1]])
        return Item(CHECKS[1], "", "ok", text)
    if nnodes > 1:
        links = "; ".join(transport.describe_links(verdict)) or text
        slow = verdict.get("inter") in ("Socket", "none", "NET")
        return Item(CHECKS[1], "", "FAIL" if slow else "ok", links, FIX[CHECKS[1]] if slow else "")
    if verdict.get("intra") == "SHM":
        return Item(CHECKS[1], "", "warn", text + " (through host memory, not P2P/NVLink)", FIX[CHECKS[1]])
    return Item(CHECKS[1], "", "ok", text)


def _fabric(row: ServerRow) -> Item:
    if len(row.rank_list()) < 2:
        return Item(CHECKS[2], "", "n/a", "one node: the probe runs across nodes")
    probe = row.fabric_record()
    if probe is None:
        return Item(CHECKS[2], "", "not seen", "no probe was recorded", FIX[CHECKS[2]])
    bw = probe.get("busbw_gbps")
    if probe.get("error") or bw is None:
        return Item(CHECKS[2], "", "FAIL", f"the probe failed: {probe.get('error')}", FIX[CHECKS[2]])
    base = probe.get("baseline_gbps")
    return Item(CHECKS[2], "", "ok", f"{bw:.2f} GB/s bus bandwidth ({probe.get('backend')}, {probe.get('world')} "
                f"ranks)" + (f", baseline {base:.2f} GB/s" if isinstance(base, (int, float)) else ""))


def _number(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _telemetry(points: pd.DataFrame) -> Item:
    if points.empty:
        return Item(CHECKS[3], "", "not seen", "no point finished", FIX[CHECKS[3]])
    util = [u for u in (_number(v) for v in points.get("gpu_util_mean_pct", pd.Series(dtype=float))) if u is not None]
    sources = sorted({str(s) for s in points.get("gpu_telemetry", pd.Series(dtype=str)).dropna()})
    if not util:
        return Item(CHECKS[3], "", "FAIL", f"no GPU samples in {len(points)} point(s) "
                    f"(gpu_telemetry: {', '.join(sources) or 'not recorded'})", FIX[CHECKS[3]])
    power = [p for p in (_number(v) for v in points.get("gpu_power_mean_w", pd.Series(dtype=float))) if p is not None]
    return Item(CHECKS[3], "", "ok", f"{len(util)} of {len(points)} point(s) sampled ({', '.join(sources)}): GPU "
                f"utilisation {sum(util) / len(util):.0f} % on average"
                + (f", {sum(power) / len(power):.0f} W" if power else ""))


def _start(rows: list[ServerRow]) -> Item:
    ready = [r for r in rows if r.ready_at is not None]
    if ready:
        r = ready[-1]
        return Item(CHECKS[4], "", "ok", f"ready in {r.ready_at - r.started_at:.0f} s"  # type: ignore[operator]
                    + (f" ({len(rows) - len(ready)} earlier start(s) failed)" if len(rows) > len(ready) else ""))
    last = rows[-1]
    return Item(CHECKS[4], "", "FAIL", f"{len(rows)} start(s), none ready: {last.error or last.state}", FIX[CHECKS[4]])


def checklist(servers: list[ServerRow], results: pd.DataFrame, labels: dict[str, str] | None = None,
              not_run: dict[str, str] | None = None) -> list[Item]:
    """The items of every configuration with a server (by its latest server), then those not run."""
    labels = labels or {}
    by_serve: dict[str, list[ServerRow]] = {}
    for row in sorted(servers, key=lambda s: s.started_at):
        by_serve.setdefault(row.serve_id, []).append(row)
    items = []
    for serve_id, rows in by_serve.items():
        subject = labels.get(serve_id, serve_id)
        latest = next((r for r in reversed(rows) if r.ready_at is not None), rows[-1])
        ngpus = sum(len(_gpu_set(r.get("gpu_ids"))) for r in latest.rank_list())
        points = results[results["serve_id"] == serve_id] if "serve_id" in results.columns else results.iloc[0:0]
        for item in (_gpus(latest), _transport(latest, ngpus), _fabric(latest), _telemetry(points), _start(rows)):
            items.append(replace(item, subject=subject))
    for subject, why in (not_run or {}).items():
        items.append(Item("not run", subject, "n/a", why))
    return items


def failed(items: list[Item]) -> list[Item]:
    return [i for i in items if i.status in ("FAIL", "not seen")]


def text_lines(items: list[Item]) -> list[str]:
    """The checklist for people: one line per item, and the fix under each that did not pass."""
    lines, subject = [], None
    for i in items:
        if i.subject != subject:
            subject = i.subject
            lines.append(f"{subject}:")
        lines.append(f"  [{i.status:>8}] {i.check}: {i.seen}")
        if i.fix and i.status in ("FAIL", "warn", "not seen"):
            lines.append(f"             fix: {i.fix}")
    bad = failed(items)
    lines.append(f"{len(bad)} item(s) failed or not seen" if bad else "every item passed")
    return lines


def placeable(spec: CampaignSpec, nodes: list[placement.NodeInfo]) -> tuple[CampaignSpec, dict[str, str]]:
    """The campaign without the configurations this cluster cannot hold, and why each was left out."""
    from raysweep.grid import combo_label
    from raysweep.place.pd import layout_of
    from raysweep.plan.plan import make_serve

    keep, skipped = [], {}
    for combo in spec.serve_combos:
        serve = make_serve(spec, combo)
        lay = layout_of(serve, nodes)  # a P/D deployment: its bundles
        if isinstance(lay, str):
            skipped[combo_label(combo)] = f"this cluster cannot hold it: {lay}"
        else:
            keep.append(combo)
    return replace(spec, serve_combos=keep), skipped


def dry_run_lines(has_gpus: bool) -> list[str]:
    """What the acceptance run checks afterwards (for its dry run)."""
    lines = ["", "After the run, raysweep prints this checklist per server configuration:"]
    lines += [f"  - {name}: {_WHAT[name]}" for name in CHECKS]
    if not has_gpus:
        lines += ["", "This machine has no GPUs: here every configuration would run on the CPU with no GPU reserved, "
                  "and the checks of GPUs, NCCL, the probe and telemetry would find nothing. Run it on the cluster: "
                  "raysweep acceptance configs/gpu-acceptance.yaml --address auto"]
    return lines


_WHAT = {
    "GPUs per bundle": "each rank's CUDA_VISIBLE_DEVICES equals the GPUs Ray reserved for its bundle",
    "NCCL transport": "the NCCL link per pair of nodes (InfiniBand/GPUDirect, not TCP sockets) and inside a node "
                      "(P2P/NVLink, not host memory)",
    "fabric probe": "the all-reduce bus bandwidth across a multi-node configuration's bundles, before its server "
                    "starts",
    "GPU telemetry": "NVML samples (utilisation, memory, power, clocks, throttling) in every point",
    "server start": "every server became ready, and how long it took",
}

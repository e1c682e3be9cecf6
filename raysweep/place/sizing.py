"""A batch job's size and time from a campaign's plan, for the schedulers that run raysweep as a job (Slurm's
sbatch, `raysweep.place.slurm`; KubeRay's RayJob, `raysweep.place.kuberay`).

The nodes are as many as the configuration spanning the most needs, each with as many GPUs as the configuration
holding the most on one node needs (every configuration then fits, one after the other); each configuration is
laid out as raysweep's scheduler would lay it out on such nodes. The time is the plan's estimate with a margin,
the cluster's own start and any grace period, in whole minutes.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from raysweep.errors import UserError
from raysweep.place import pd as pd_place
from raysweep.place.placement import NodeInfo

if TYPE_CHECKING:
    from raysweep.plan.plan import Plan

__all__ = ["MARGIN", "Size", "parse_duration", "size", "time_s"]

MARGIN = 1.5           # the estimate is a guess: this much more time


@dataclass(frozen=True)
class Size:
    nodes: int                                   # GPU nodes (or pods)
    gpus: int                                    # GPUs on each
    which: str                                   # the configuration that decided, in words
    labels: dict[str, str] = field(default_factory=dict)       # the Ray labels the placement rules ask of nodes
    resources: dict[str, float] = field(default_factory=dict)  # the custom resources they ask


def size(plan: Plan, gpus_per_node: int, cpus_per_node: int | None = None) -> Size:
    """The job's GPU nodes for `plan` on nodes of `gpus_per_node` GPUs (0: a cluster without GPUs); a UserError
    naming every configuration that could never be placed on such nodes."""
    with_gpus = gpus_per_node > 0
    labels: dict[str, str] = {}
    resources: dict[str, float] = {}
    for serve in plan.serves:       # the nodes carry what the rules ask for (the first accepted value)
        for key, value in serve.rule.node_labels.items():
            labels.setdefault(key, str(value[0] if isinstance(value, list) else value))
        for key, amount in serve.rule.resources.items():
            resources[key] = max(resources.get(key, 0.0), amount * max(1, gpus_per_node))
    cpus = float(cpus_per_node or 64)
    nodes = [NodeInfo(node_id=f"n{i}", ip=f"10.0.0.{i + 1}", gpus=gpus_per_node, cpus=cpus, labels=dict(labels),
                      resources={"GPU": float(gpus_per_node), "CPU": cpus, **resources}) for i in range(64)]
    count, gpus, which, bad = 0, 0, "", []
    for serve in plan.serves:
        if not plan.points_of(serve.id):
            continue
        lay = pd_place.layout_of(serve, nodes, with_gpus)
        if isinstance(lay, str):
            bad.append(f"{serve.id} ({serve.label}): {lay}")
            continue
        n, g = _packed(lay.node_gpus(), gpus_per_node) if lay.bundle_gpus else (max(1, lay.nnodes), lay.gpus_per_node)
        if (n, g) > (count, gpus) or not which:
            which = f"{serve.label} ({lay.describe()})"
        count, gpus = max(count, n), max(gpus, g)
    if bad:
        raise UserError(f"--gpus-per-node {gpus_per_node}: these configurations can never be placed on such nodes:\n  "
                        + "\n  ".join(bad))
    if not which:
        raise UserError("the campaign has no point to run: nothing to submit")
    # Ray sets its own labels (ray.io/accelerator-type from the GPU): only the others are the job's to set
    return Size(count, gpus, which, {k: v for k, v in labels.items() if not k.startswith("ray.io/")}, resources)


def _packed(bundle_gpus: list[int], per_node: int) -> tuple[int, int]:
    """A P/D deployment's bundles packed first-fit onto nodes of `per_node` GPUs: (nodes, most GPUs on one)."""
    free: list[int] = []
    for g in sorted(bundle_gpus, reverse=True):
        i = next((i for i, f in enumerate(free) if f >= g), None)
        if i is None:
            free.append(per_node - g)
        else:
            free[i] -= g
    return max(1, len(free)), max((per_node - f for f in free), default=0)


def time_s(estimate_s: float, start_s: float, extra_s: float = 0.0) -> int:
    """A job's time from the plan's estimate: with the margin, the cluster's start (`start_s`) and `extra_s` (a
    grace period), in whole minutes."""
    return int(math.ceil((estimate_s * MARGIN + start_s + extra_s) / 60.0) * 60)


def parse_duration(text: str, option: str = "--time", floor: str = "a campaign's cluster alone takes longer to "
                   "start") -> int:
    """Seconds from `90` (minutes, as Slurm reads it), `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM`, `D-HH:MM:SS`, or
    `2h`, `45m`, `600s`, `1d`; a UserError naming `option` otherwise, or under a minute (`floor` says why)."""
    t = text.strip()
    unit = re.fullmatch(r"(\d+)([smhd])", t)
    if unit:
        secs = int(unit.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit.group(2)]
    else:
        m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", t)
        if not m:
            raise UserError(f"{option}: {text!r} is not accepted: minutes, MM:SS, HH:MM:SS, D-HH:MM:SS, or a number "
                            "with s, m, h or d (2h)")
        d, a, b, c = m.groups()
        if d is not None:
            secs = int(d) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
        elif c is not None:
            secs = int(a) * 3600 + int(b) * 60 + int(c)
        elif b is not None:
            secs = int(a) * 60 + int(b)
        else:
            secs = int(a) * 60
    if secs < 60:
        raise UserError(f"{option}: {text!r} is under a minute: {floor}")
    return secs

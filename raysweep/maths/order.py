"""The order runs go in, by design, so that a slow drift of the machine spreads over every point instead of
landing on one.

*Rounds*: within a server's life, every point runs once per round (round r holds the runs numbered r), and
the order of the points within a round is a permutation drawn from the campaign's seed
(`order.seed`), one per round and configuration: `round_key`. It is a hash, so a resumed campaign runs
what is left in the same order, and a run added by `bench.precision` takes its place in the next round (a
point that reached its precision has no run there: it drops out of the later rounds).

*Instances* (`order.instances: N`): every configuration is measured on N separate server starts, in blocks:
block k starts instance k of every configuration, in the configurations' order on even blocks and the
reverse on odd ones (A B, B A, A B, ...: AB BA), so that a slow drift cancels between configurations and a
point's interval includes the variation between server starts. The first runs of a point are dealt to the
instances in turn (run r on instance r mod N); runs `bench.precision` adds go to the last instance. Where
the cluster has room for several servers, a block's configurations run at once (their runs paired in
time); else one after another, in the block's order.

Every run records where it sat: `round`, `instance`, `block`, `turn` (its configuration's place in the
block) and `slot` (its place in its server's life), so that the verdicts can pair runs measured together.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

if TYPE_CHECKING:
    from raysweep.campaign.models import Campaign
    from raysweep.plan.plan import PointRun

__all__ = ["ROOM", "ConfirmSpec", "OrderSpec", "Turn", "block_order", "in_rounds", "instance_of", "open_turns",
           "order_lines", "order_of", "round_key", "turns"]


class OrderSpec(BaseModel):
    """`order:`: in which order runs go (see `raysweep.maths.order`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rounds: bool = Field(True, description="within a server's life, every point once per round (the order within "
                         "a round drawn from `seed`), instead of each point's runs back to back")
    seed: int = Field(0, description="the seed of the order within rounds (the same seed gives the same order)")
    instances: int = Field(1, ge=1, le=64, description="server starts every configuration is measured on, in blocks "
                           "ordered AB BA across configurations, so that a point's interval includes the variation "
                           "between starts; a point's first runs are dealt to them in turn (at most the runs of a "
                           "point: `runs`, or bench.precision.min_runs)")


ROOM = 0.25  # `confirm.enabled: auto` confirms when it costs at most this fraction of the sweep's estimated time


class ConfirmSpec(BaseModel):
    """`confirm:` (or `confirm: true|false`): the leader and the runner-up re-measured after the sweep
    (`raysweep.confirm` runs it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool | Literal["auto"] = Field("auto", description="true: always; false: never; auto: when the "
                                            f"confirmation costs at most {ROOM * 100:.0f} % of the sweep's estimated "
                                            "time (a plain sweep of servers raysweep starts)")
    starts: int = Field(2, ge=1, le=16, description="fresh server starts per configuration confirmed, in blocks "
                        "ordered AB BA (2: A B B A)")
    runs: int = Field(2, ge=1, le=100, description="runs of each confirmed point per start")
    objective: str | None = Field(None, description="the objective that names the leader (default: the report's, "
                                  "output_throughput_per_gpu)")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        return {"enabled": data} if isinstance(data, bool) else data

    @property
    def per_arm(self) -> int:
        return self.starts * self.runs


def order_of(campaign: Campaign) -> OrderSpec:
    """The campaign's `order:` section (its defaults when absent)."""
    return getattr(campaign, "order", None) or OrderSpec()


def round_key(seed: int, serve_id: str, run: int, bench_id: str) -> tuple[int, str]:
    """Where a run goes: its round (the run number), then its place in that round's permutation."""
    digest = hashlib.sha256(f"{seed}/{serve_id}/{run}/{bench_id}".encode()).hexdigest()
    return run, digest


def in_rounds(points: Sequence[PointRun], seed: int) -> list[PointRun]:
    """Runs (`PointRun`s) in rounds: run number first, then the seeded permutation within the round."""
    return sorted(points, key=lambda p: round_key(seed, p.serve.id, p.run, p.bench.id))


def instance_of(run: int, instances: int, first_runs: int) -> int:
    """The instance a run goes to: the first runs dealt in turn, the runs added later to the last one."""
    if instances <= 1:
        return 0
    return run % instances if run < first_runs else instances - 1


@dataclass(frozen=True)
class Turn:
    """One server start of the design: instance `instance` of configuration `serve_id`, in block `block` at
    place `turn` of it."""

    serve_id: str
    instance: int
    block: int
    turn: int


def block_order(serve_ids: Sequence[str], block: int) -> list[str]:
    """The configurations of one block: in order on even blocks, reversed on odd ones (AB BA)."""
    return list(serve_ids) if block % 2 == 0 else list(reversed(serve_ids))


def turns(serve_ids: Sequence[str], instances: int) -> list[Turn]:
    """Every server start of the design, in order."""
    return [Turn(sid, b, b, t) for b in range(instances) for t, sid in enumerate(block_order(serve_ids, b))]


def open_turns(design: Sequence[Turn], unfinished: Callable[[str, int], bool], together: bool) -> list[Turn]:
    """The turns that may run now: of the first block with runs left, those with runs left (`together`:
    the cluster runs several servers at once), else only the first of them."""
    for block in sorted({t.block for t in design}):
        left = [t for t in design if t.block == block and unfinished(t.serve_id, t.instance)]
        if left:
            return left if together else left[:1]
    return []


def order_lines(spec: OrderSpec, serve_labels: Sequence[str], bench_ids: Sequence[str], first_runs: int,
                seed_serve: str = "", start_s: float | None = None) -> list[str]:
    """The dry run's lines: how runs are ordered, and what instances cost in server starts."""
    lines = []
    if spec.rounds and len(bench_ids) > 1:
        lines.append(f"Order: in rounds (every point once per round, {first_runs} round(s) to start with, the order "
                     f"within a round drawn from seed {spec.seed}), so that a drift spreads over every point")
        if seed_serve:
            first = sorted(range(len(bench_ids)), key=lambda i: round_key(spec.seed, seed_serve, 0, bench_ids[i])[1])
            lines.append("  round 0 of the first server: " + ", ".join(str(i + 1) for i in first)
                         + " (bench points numbered as listed)")
    elif not spec.rounds:
        lines.append("Order: each point's runs back to back (order.rounds is off)")
    if spec.instances > 1:
        blocks = [" ".join(f"{block_order(serve_labels, b)[t]}#{b}" for t in range(len(serve_labels)))
                  for b in range(spec.instances)]
        cost = (f", about {spec.instances - 1} x {start_s:.0f} s more per configuration"
                if start_s is not None else "")
        lines.append(f"Instances: every configuration on {spec.instances} server starts ({len(serve_labels)} x "
                     f"{spec.instances} = {len(serve_labels) * spec.instances} start(s) instead of "
                     f"{len(serve_labels)}{cost}), in blocks ordered AB BA: " + " | ".join(blocks)
                     + f"; run r of a point on instance r mod {spec.instances}")
    return lines

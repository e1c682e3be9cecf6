"""The Pareto geometry of two objectives, each maximized or minimized: dominance, a point beaten with a
margin, the hypervolume a set of points dominates, the front (the points no other point dominates).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# a bench point is beaten only by one that stays better when it is this much better (the noise of one
# measurement is a few %); a point LIFT better in each objective says whether its owner is on or near the front
FRONT_MARGIN = 0.03


LIFT = 0.03


def _dominates(q: Sequence[float], p: Sequence[float], directions: Sequence[str]) -> bool:
    """q is at least as good as p in both objectives, and not the same point."""
    sign = [1 if d == "maximize" else -1 for d in directions]
    return all(a * s >= b * s for a, b, s in zip(q, p, sign)) and list(q) != list(p)


def _lifted(p: Sequence[float], directions: Sequence[str], margin: float) -> list[float]:
    """p made `margin` (a fraction of each value) better in each objective: larger when maximized, else smaller."""
    return [v + abs(v) * margin if d == "maximize" else v - abs(v) * margin for v, d in zip(p, directions)]


def beaten(p: Sequence[float], others: Sequence[Sequence[float]], directions: Sequence[str], margin: float) -> bool:
    """Some point of `others` dominates p even when p is `margin` better in each objective."""
    lifted = _lifted(p, directions, margin)
    return any(_dominates(q, lifted, directions) for q in others)


def hypervolume(points: Sequence[Sequence[float]], directions: Sequence[str], ref: Sequence[float]) -> float:
    """The area two-objective points dominate, bounded by the reference point `ref`."""
    sx, sy = (1 if d == "maximize" else -1 for d in directions)
    flat = [(sx * (p[0] - ref[0]), sy * (p[1] - ref[1])) for p in points]  # both maximized from (0, 0)
    flat = [q for q in flat if q[0] > 0 and q[1] > 0]
    area, top = 0.0, 0.0
    for x, y in sorted(flat, reverse=True):
        if y > top:
            area += x * (y - top)
            top = y
    return area


def pareto_front(points: Sequence[Sequence[float]], directions: Sequence[str], distinct: bool = False) -> list[int]:
    """Indices (ascending) of the points no other point dominates; of identical points on the front, all, or
    with `distinct` the first only. A point with a NaN value is never on it.

    One sweep: by the first objective then the second, best first, a point is on the front when its second
    objective beats every point before it (or repeats the last point on the front)."""
    sx, sy = (1 if d == "maximize" else -1 for d in directions)
    usable = [i for i, p in enumerate(points) if not (math.isnan(p[0]) or math.isnan(p[1]))]
    order = sorted(usable, key=lambda i: (-sx * points[i][0], -sy * points[i][1], i))
    keep: list[int] = []
    best = -math.inf
    for i in order:
        y = sy * points[i][1]
        if y > best:
            keep.append(i)
            best = y
        elif not distinct and keep and y == best and list(points[i]) == list(points[keep[-1]]):
            keep.append(i)
    return sorted(keep)

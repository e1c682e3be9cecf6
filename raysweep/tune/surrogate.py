"""The Pareto tuner's model: where the next candidate adds the most to the front.

Each bench point a candidate ran is one observation: the candidate's parameters and the point's load
(features scaled to [0, 1]) against the logarithm of both objectives. A Gaussian process per objective
(squared-exponential kernel of one length scale, the observations standardized, a small noise term) predicts
every untried configuration at every bench load, with its uncertainty. Each configuration's optimistic
points (mean plus one standard deviation, in log space) are added to the points run so far, and the one
whose points add the most hypervolume is proposed. Untried configurations far from everything run are
uncertain, so they look promising until they are tried or their neighbours say otherwise: the search
explores where it knows little and exploits where the front can still move.

Pure numpy, no Optuna, no Ray: `raysweep.tune.proposals` gives it the observations, the candidates and the points
run, and asks the sampler for nothing while it proposes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["GaussianProcess", "best_addition"]

LENGTH_SCALE = 0.35   # in the [0, 1] scale of every feature
NOISE = 0.01          # variance of an observation, in standardized units (the noise of a point is a few %)
OPTIMISM = 1.0        # standard deviations added to the mean


@dataclass
class GaussianProcess:
    """Regression of several outputs on shared inputs (one process per output, one kernel)."""

    x: np.ndarray
    mean: np.ndarray
    scale: np.ndarray
    chol: np.ndarray
    alpha: np.ndarray
    length_scale: float = LENGTH_SCALE

    @classmethod
    def fit(cls, x: Sequence[Sequence[float]], y: Sequence[Sequence[float]], length_scale: float = LENGTH_SCALE,
            noise: float = NOISE) -> GaussianProcess:
        xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
        mean, scale = ys.mean(axis=0), ys.std(axis=0) + 1e-9
        k = _kernel(xs, xs, length_scale) + noise * np.eye(len(xs))
        chol = np.linalg.cholesky(k)
        alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, (ys - mean) / scale))
        return cls(xs, mean, scale, chol, alpha, length_scale)

    def predict(self, q: Sequence[Sequence[float]]) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard deviation of every output at each query point (in the outputs' units)."""
        qs = np.asarray(q, dtype=float)
        ks = _kernel(qs, self.x, self.length_scale)
        mean = ks @ self.alpha
        var = np.clip(1.0 - (np.linalg.solve(self.chol, ks.T) ** 2).sum(axis=0), 1e-12, None)
        return mean * self.scale + self.mean, np.sqrt(var)[:, None] * self.scale


def _kernel(a: np.ndarray, b: np.ndarray, length_scale: float) -> np.ndarray:
    d2 = ((a[:, None, :] - b[None, :, :]) ** 2).sum(axis=-1)
    return np.exp(-d2 / (2 * length_scale * length_scale))


def best_addition(observed_x: Sequence[Sequence[float]], observed_y: Sequence[Sequence[float]],
                  candidates: Sequence[Sequence[Sequence[float]]], run: Sequence[Sequence[float]],
                  directions: Sequence[str], hypervolume: Callable[..., float]) -> tuple[int, float] | None:
    """Which candidate's optimistic points add the most hypervolume to the points `run`, and how much.

    `observed_x` / `observed_y`: one row per bench point run (features; the objectives' values, all > 0).
    `candidates`: per candidate, the features of each of its bench points. `hypervolume(points, directions,
    reference)` is the tuner's. None when there is nothing to go on (fewer than 2 observations, no candidate).
    """
    if len(observed_x) < 2 or not candidates or not run:
        return None
    logs = [[math.log(v) for v in row] for row in observed_y]
    gp = GaussianProcess.fit(observed_x, logs)
    flat = [f for c in candidates for f in c]
    mean, sd = gp.predict(flat)
    sign = np.array([1.0 if d == "maximize" else -1.0 for d in directions])
    optimistic = np.exp(mean + OPTIMISM * sd * sign)
    reference = [min(v) if d == "maximize" else max(v) for v, d in zip(zip(*run), directions)]
    whole = hypervolume(run, directions, reference)
    best: tuple[int, float] | None = None
    at = 0
    for i, c in enumerate(candidates):
        points = [list(p) for p in optimistic[at:at + len(c)]]
        at += len(c)
        gain = hypervolume([*run, *points], directions, reference) - whole
        if best is None or gain > best[1]:
            best = (i, gain)
    return best

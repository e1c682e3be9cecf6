"""When each request of a point is due, in seconds after the start, as `vllm bench serve` schedules them.

- `request_rate = inf`: every request is due at 0 (a `max_concurrency` limit then makes a closed loop).
- Finite rate: gaps drawn from Gamma(shape=burstiness, scale=1/(rate*burstiness)) (burstiness 1 = Poisson,
  below 1 burstier, above 1 steadier, inf = constant spacing), then scaled so the last request is due at
  exactly N/rate, so the asked rate is the achieved one over the point.
- Ramp-up (`linear` or `exponential` from start to end rps): the rate of each gap follows the ramp over the
  requests; no rescaling.
"""

from __future__ import annotations

import math

import numpy as np

from raysweep.bench.options import LoadOptions

__all__ = ["due_times", "asked_rate"]


def asked_rate(opts: LoadOptions) -> float:
    """The rate the point asks for (inf for a burst or a closed loop; the mean rate of a ramp)."""
    if opts.ramp_up_strategy:
        s, e = opts.ramp_up_start_rps or 0.0, opts.ramp_up_end_rps or 0.0
        if opts.ramp_up_strategy == "linear":
            return (s + e) / 2
        return (e - s) / math.log(e / s) if e != s else e
    return opts.request_rate


def due_times(n: int, opts: LoadOptions, seed: int | None = None) -> np.ndarray:
    """Offsets (s) from the start at which each of the n requests is due, non-decreasing."""
    rng = np.random.default_rng(opts.seed if seed is None else seed)
    if n == 0:
        return np.zeros(0)
    if opts.ramp_up_strategy:
        s, e = float(opts.ramp_up_start_rps or 0.0), float(opts.ramp_up_end_rps or 0.0)
        progress = np.arange(n) / max(n - 1, 1)
        rates = s + (e - s) * progress if opts.ramp_up_strategy == "linear" else s * (e / s) ** progress
        rates = np.maximum(rates, 1e-3)
        return np.cumsum(_gaps(rng, rates, opts.burstiness))
    rate = opts.request_rate
    if math.isinf(rate):
        return np.zeros(n)
    gaps = _gaps(rng, np.full(n, rate), opts.burstiness)
    times = np.cumsum(gaps)
    return times * ((n / rate) / times[-1])


def _gaps(rng: np.random.Generator, rates: np.ndarray, burstiness: float) -> np.ndarray:
    if math.isinf(burstiness):
        return 1.0 / rates
    return rng.gamma(shape=burstiness, scale=1.0 / (rates * burstiness))

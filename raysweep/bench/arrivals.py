"""When each request of a point is due, in seconds after the start, as `vllm bench serve` schedules them.

- `request_rate = inf`: every request is due at 0 (a `max_concurrency` limit then makes a closed loop).
- Finite rate: gaps drawn from Gamma(shape=burstiness, scale=1/(rate*burstiness)) (burstiness 1 = Poisson,
  below 1 burstier, above 1 steadier, inf = constant spacing), then scaled so the last request is due at
  exactly N/rate, so the asked rate is the achieved one over the point.
- Ramp-up (`linear` or `exponential` from start to end rps, both above 0): the rate of each gap follows the
  ramp over the request index (vLLM's `_get_current_request_rate`); no rescaling. The rate a ramp really asks
  for is N over the span of its due times, near the harmonic mean of the per-request rates (a linear 1 to 10
  ramp runs at 3.9 req/s, not 5.5).
- `--dataset-name timed_trace` (self-timed): the trace's own timestamps over `--trace-speedup`.
- `--duration S`: see `for_duration`.
"""

from __future__ import annotations

import math

import numpy as np

from raysweep.bench.options import LoadOptions

__all__ = ["due_times", "asked_rate", "for_duration"]


def asked_rate(opts: LoadOptions, due: np.ndarray | None = None) -> float:
    """The rate the point asks for: inf for a burst or a closed loop; for a ramp, N over the span of its due
    times when they are given, else the rate its schedule tends to (the harmonic mean over the index)."""
    if opts.timed and due is not None and due.size and due[-1] > 0:
        return float(due.size / due[-1])
    if not opts.ramp_up_strategy:
        return opts.request_rate
    if due is not None and due.size and due[-1] > 0:
        return float(due.size / due[-1])
    s, e = float(opts.ramp_up_start_rps or 0.0), float(opts.ramp_up_end_rps or 0.0)
    if s <= 0 or e <= 0 or math.isclose(s, e):
        return e
    if opts.ramp_up_strategy == "linear":  # 1 / mean over p in [0, 1] of 1 / (s + (e - s) p)
        return (e - s) / math.log(e / s)
    return s * e * math.log(e / s) / (e - s)  # exponential: 1 / mean of 1 / (s (e/s)^p)


def for_duration(opts: LoadOptions) -> tuple[LoadOptions, bool]:
    """A duration-bounded point as requests: with a finite rate, the requests (or sessions) due within the
    duration (rate x duration of them); a closed loop keeps --num-prompts as the pool it cycles through until
    the duration is over (the bool: whether the client cycles); a timed trace keeps the lines due within it."""
    if opts.duration is None or opts.timed:
        return opts, False
    if math.isfinite(opts.request_rate):
        return opts.with_prompts(max(1, round(opts.request_rate * opts.duration))), False
    return opts, True


def due_times(n: int, opts: LoadOptions, seed: int | None = None) -> np.ndarray:
    """Offsets (s) from the start at which each of the n requests is due, non-decreasing."""
    rng = np.random.default_rng(opts.seed if seed is None else seed)
    if n == 0:
        return np.zeros(0)
    if opts.timed:  # a replayed trace keeps its own timeline (raysweep.bench.trace)
        from raysweep.bench.trace import trace_due
        return trace_due(opts)[:n]
    if opts.ramp_up_strategy:
        s, e = float(opts.ramp_up_start_rps or 0.0), float(opts.ramp_up_end_rps or 0.0)
        progress = np.arange(n) / max(n - 1, 1)
        rates = s + (e - s) * progress if opts.ramp_up_strategy == "linear" else s * (e / s) ** progress
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

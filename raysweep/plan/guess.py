"""What a run and a server start cost where nothing was measured: a guess from the benchmark command, with the
constants of `Defaults` for what it does not say (`raysweep.plan.estimate` calibrates it by measurements).
Pure: no Ray, no processes."""

from __future__ import annotations

import math
from dataclasses import dataclass

from raysweep import grid
from raysweep.bench.load import Load, load_of

__all__ = ["DEFAULTS", "Defaults", "guess_point_s"]


@dataclass(frozen=True)
class Defaults:
    """What the command-based guess assumes where nothing was measured (vLLM's own defaults for the
    benchmark options: 1000 prompts, 128 output tokens, unbounded rate and concurrency)."""

    server_start_s: float = 120.0  # `vllm serve` on GPUs: weights, torch.compile, CUDA graphs
    ttft_s: float = 0.2  # time to the first token of one request
    itl_s: float = 0.025  # seconds per further output token of one request
    point_overhead_s: float = 5.0  # cache reset, metrics scrapes, result file, per point
    num_prompts: int = 1000
    output_len: int = 128
    unbounded_concurrency: int = 256  # requests in flight when neither rate nor concurrency bounds them
    offline_iterations: int = 40  # `vllm bench latency`: 30 measured + 10 warmup iterations


DEFAULTS = Defaults()

_OUTPUT_FLAGS = ("--random-output-len", "--random_output_len", "--output-len", "--output_len",
                 "--sharegpt-output-len", "--custom-output-len", "--max-tokens")


def _number(argv: list[str], *flags: str) -> float | None:
    value = grid.find_flag_value(argv, *flags)
    try:
        return None if value is None else float(value)
    except ValueError:
        return None


def guess_point_s(argv: list[str], offline: bool = False, defaults: Defaults = DEFAULTS,
                  load: Load | None = None) -> float:
    """Seconds one run of a benchmark command takes, from its options (the constants of `defaults` fill
    in what it does not say): `num_prompts` requests of `output_len` tokens, under its load (a bench
    point's `load`, else read from `argv`): sent at `request_rate` or kept `max_concurrency` in flight."""
    prompts = _number(argv, "--num-prompts", "--num_prompts") or defaults.num_prompts
    out_len = _number(argv, *_OUTPUT_FLAGS)
    out_len = defaults.output_len if out_len is None else out_len
    request_s = defaults.ttft_s + max(out_len - 1, 0) * defaults.itl_s
    if offline:
        if "latency" in argv:
            iterations = (_number(argv, "--num-iters", "--num_iters") or 30) + (
                _number(argv, "--num-iters-warmup", "--num_iters_warmup") or 10)
            return defaults.server_start_s + iterations * request_s + defaults.point_overhead_s
        waves = math.ceil(prompts / defaults.unbounded_concurrency)
        return defaults.server_start_s + waves * request_s + defaults.point_overhead_s
    load = load_of(argv) if load is None else load
    rate, concurrency = load.request_rate, load.max_concurrency
    duration = _number(argv, "--duration")  # a duration-bounded point (docs/workloads.md) runs that long
    if duration:
        return duration + request_s + defaults.point_overhead_s
    waves = math.ceil(prompts / (concurrency or defaults.unbounded_concurrency))
    by_concurrency = waves * request_s
    by_rate = prompts / rate + request_s if rate and math.isfinite(rate) else 0.0
    return max(by_concurrency, by_rate) + defaults.point_overhead_s

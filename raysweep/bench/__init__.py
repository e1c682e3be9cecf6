"""Benchmark clients. The `command` backend runs `vllm bench serve` inside a Ray client actor."""

from raysweep.bench.command import CommandClient, bench_argv, result_record

__all__ = ["CommandClient", "bench_argv", "result_record"]

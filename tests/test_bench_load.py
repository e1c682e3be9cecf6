"""The load of a bench point, typed (raysweep/bench/load.py): read once from its command, the same as the
client's option parser reads it, carried on the bench point and read from there."""

from __future__ import annotations

import math

import pytest

from raysweep.bench.load import CONCURRENCY, RATE, Load, flags, load_of
from raysweep.bench.options import parse_load_options
from raysweep.plan.estimate import guess_point_s
from raysweep.plan.plan import BenchPoint

COMMANDS = [
    ["vllm", "bench", "serve", "--model", "m"],
    ["vllm", "bench", "serve", "--model", "m", "--max-concurrency", "8"],
    ["vllm", "bench", "serve", "--model", "m", "--request-rate=2.5", "--max_concurrency", "4"],
    ["vllm", "bench", "serve", "--model", "m", "--request_rate", "inf", "--max-concurrency", "3",
     "--max-concurrency", "5"],
]


@pytest.mark.parametrize("argv", COMMANDS)
def test_the_load_of_a_command_is_what_the_option_parser_reads(argv):
    assert load_of(argv) == parse_load_options(argv).load


def test_the_variable_that_sets_the_pace():
    assert Load().variable is None
    assert Load(max_concurrency=4).variable == CONCURRENCY
    assert Load(max_concurrency=4, request_rate=2.0).variable == RATE
    assert Load(max_concurrency=4).value(CONCURRENCY) == 4 and Load().value(RATE) == math.inf
    assert Load().key() == (math.inf, math.inf) and Load(3, 1.5).key() == (3.0, 1.5)
    assert flags(CONCURRENCY) == ("--max-concurrency", "--max_concurrency")


def test_a_load_not_a_number_reads_as_unset():
    assert load_of(["--max-concurrency", "many", "--request-rate", "fast"]) == Load()
    assert load_of(["--max_concurrency", "6", "--request-rate", "inf"]) == Load(max_concurrency=6)
    assert load_of(["--request-rate", "0.5"]) == Load(request_rate=0.5)


def test_a_bench_point_carries_its_load_and_the_estimate_reads_it():
    argv = ["vllm", "bench", "serve", "--num-prompts", "100", "--max-concurrency", "10"]
    b = BenchPoint(id="b", params={"max_concurrency": 10}, argv=argv, label="")
    assert b.load == Load(max_concurrency=10)
    # the estimate takes the point's load over its command: given a rate, it paces the same prompts by it
    assert guess_point_s(argv, load=b.load) == guess_point_s(argv)
    assert guess_point_s(argv, load=Load(request_rate=0.5)) > guess_point_s(argv) + 150

"""The load of a bench point, typed (raysweep/bench/load.py): read once from its command, the same as the
client's option parser reads it, carried on the bench point and read from there."""

from __future__ import annotations

import math
from dataclasses import replace

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


def _points(tmp_path, loads):
    from helpers import standin_campaign

    from raysweep.campaign import load_campaign
    from raysweep.plan.plan import build_plan

    f = standin_campaign(tmp_path, bench_params={"grid": {"max_concurrency": loads}}, order={"seed": 3})
    return build_plan(load_campaign(f)).points


def test_the_warmup_runs_at_the_heaviest_load_of_a_servers_points(tmp_path):
    """The warmup's prompts go to the point of the heaviest load (concurrency, then rate; the first of equals),
    whatever the order the points run in: at a concurrency of 4 the CPU demo's server took about 9 s for them,
    at 16 about 4 s."""
    from raysweep.drive.point import heaviest

    points = _points(tmp_path, [4, 16, 8])
    assert [p.bench.load.max_concurrency for p in points] == [4, 16, 8]
    for order in (points, points[::-1], [points[2], points[0], points[1]]):
        assert heaviest(order).bench.load == Load(max_concurrency=16)
    unlimited = BenchPoint(id="u", params={}, argv=["vllm", "bench", "serve", "--request-rate", "2"], label="")
    faster = BenchPoint(id="f", params={}, argv=["vllm", "bench", "serve", "--request-rate", "5"], label="")
    rated = [replace(points[0], bench=b) for b in (unlimited, faster)]
    assert heaviest([*points, *rated]).bench.id == "f"  # no limit on what is in flight, and the faster rate


def test_a_campaign_warms_each_server_at_its_heaviest_point(gpu_cluster, tmp_path, monkeypatch):
    """The driver hands the warmup the heaviest point of the server's (here the second of three in the plan's
    order), not the first it runs."""
    from helpers import run_file, standin_campaign

    from raysweep.drive.point import PointRunner

    warmed = []
    real = PointRunner.warmup
    monkeypatch.setattr(PointRunner, "warmup", lambda self, run, server, point: (
        warmed.append(point.bench.load.max_concurrency), real(self, run, server, point))[1])
    f = standin_campaign(tmp_path, bench_params={"grid": {"max_concurrency": [4, 16, 8]}}, warmup=3,
                         placement={"node_labels": {"node-name": "w2"}})
    summary, _ = run_file(f)
    assert summary.counts["done"] == 3, summary.failures
    assert warmed == [16]

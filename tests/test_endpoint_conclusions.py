"""One server config swept over loads (an endpoint) is judged by load: its capacity, its knee and the latencies
at each load, never one load "better" than another as if they were configs; per-GPU figures only where the GPU
count is declared."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from raysweep.results import conclusions


def _runs(serves: tuple[str, ...] = ("ep",), gpu_count: float | None = None) -> pd.DataFrame:
    rng = np.random.default_rng(3)
    rows = []
    for s_i, serve in enumerate(serves):
        for load, level, e2el in ((1, 100.0, 200.0), (4, 360.0, 230.0), (16, 900.0, 380.0), (64, 980.0, 1500.0)):
            for run in range(3):
                rows.append({"campaign": "p", "serve_id": serve, "bench_id": f"b{load}",
                             "point_id": f"{serve}-{load}-{run}",
                             "serve_label": f"endpoint=http://h{s_i}:8000", "bench_label": f"max_concurrency={load}",
                             "run_number": run, "max_concurrency": load, "gpu_count": gpu_count,
                             "output_throughput": level * (1 + s_i) * (1 + 0.01 * rng.standard_normal()),
                             "request_throughput": level / 16, "median_ttft_ms": 20.0 + load,
                             "p99_ttft_ms": 40.0 + load, "median_tpot_ms": 2.0 + load / 8,
                             "p99_tpot_ms": 3.0 + load / 8,
                             "median_e2el_ms": e2el, "completed": 100, "failed": 0, "validity_ok": True,
                             "client_limited": False})
    return pd.DataFrame(rows)


def test_one_endpoint_is_judged_by_load():
    c = conclusions.conclude(_runs(), ["max_concurrency"])
    assert c.single_config
    lines = conclusions.headlines(c)
    text = "\n".join(lines)
    assert "better than" not in text and " over endpoint" not in text and "Best for" not in text
    assert lines[0].startswith("Capacity for all bench points: output_throughput ")
    assert "at max_concurrency=64, the highest mean of 4 load(s)" in lines[0]
    # its value and interval in the words of every answer: `990.4 tok/s [942.3, 1,039 at 95 %] (on ...)`
    assert re.search(r"output_throughput [\d,.]+ tok/s \[[\d,.]+, [\d,.]+ at 95 %\] \(on 1 server start\(s\), "
                     r"3 run\(s\)\) at", lines[0]), lines[0]
    knee = next(line for line in lines if line.startswith("Knee for"))
    assert knee.startswith("Knee for all bench points: max_concurrency=16, output_throughput ")  # e2el within 2x
    by_load = next(line for line in lines if line.startswith("By max_concurrency for"))
    steps = by_load.removeprefix("By max_concurrency for all bench points: ").split("; ")
    assert [step.split(":")[0] for step in steps] == ["1", "4", "16", "64"]
    assert "median ttft 21 ms" in by_load and "median tpot" in by_load


def test_per_gpu_only_where_the_gpu_count_is_declared():
    undeclared = conclusions.conclude(_runs(), ["max_concurrency"])
    assert undeclared.objective.name == "output_throughput"
    assert any("No GPU count is declared" in n for n in undeclared.notes)
    declared = conclusions.conclude(_runs(gpu_count=2), ["max_concurrency"])
    assert declared.objective.name == "output_throughput_per_gpu"
    assert declared.verdicts[0].leader["objective_mean"] < undeclared.verdicts[0].leader["objective_mean"] / 1.9
    assert not any("No GPU count" in n for n in declared.notes)


def test_two_endpoints_are_still_compared_as_configs():
    c = conclusions.conclude(_runs(("a", "b")), ["max_concurrency"])
    assert not c.single_config
    lines = conclusions.headlines(c)
    assert lines[0].startswith("Best for all bench points: endpoint=http://h1:8000 at max_concurrency=64")

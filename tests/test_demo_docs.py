"""The README's example output is the CPU demo's of this version: the paths `raysweep run` prints for the demo's
output dir, and one conclusion line per bench shape naming the demo's configurations and loads, in the words
and fields the conclusions print today (numbers aside: they come from a real run)."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from raysweep.campaign import load_campaign
from raysweep.plan.plan import build_plan
from raysweep.results import conclusions

REPO = Path(__file__).resolve().parent.parent
PAIR = re.compile(r"\b([a-z_]+)=([0-9][\w.]*)")
NUMBER = re.compile(r"(?<![=\w.])[-+]?\d+(?:[.,]\d+)*(?:e[-+]?\d+)?")
FLAGGED = "; some of their runs were flagged"  # said only when a run of the leader or runner-up was flagged


def _demo():
    spec = load_campaign(REPO / "configs" / "demo-cpu.yaml", env={"RAYSWEEP_DEMO_MODEL": "/nonexistent/model"})
    return spec, build_plan(spec)


def _example() -> list[str]:
    """The README's example of what `make demo` prints at its end."""
    text = (REPO / "README.md").read_text().split("## A minimal campaign")[0]
    blocks: list[list[str]] = []
    block: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("```"):  # a fence opens a block, or closes the open one
            if block is not None:
                blocks.append(block)
            block = [] if block is None else None
        elif block is not None:
            block.append(line)
    [example] = [b for b in blocks if any(line.startswith("Best for") for line in b)]
    return [line for line in example if line.strip()]


def _values(plan) -> dict[str, set[str]]:
    values: dict[str, set[str]] = {}
    for params in [s.params for s in plan.serves] + [b.params for b in plan.benches]:
        for k, v in params.items():
            values.setdefault(k, set()).add(str(v))
    return values


def _masked(line: str, values: dict[str, set[str]]) -> str:
    """The line with its numbers and parameter values replaced (each value checked against the demo's)."""
    def param(m: re.Match[str]) -> str:
        key, value = m.group(1), m.group(2)
        assert key in values, f"{key} is not a parameter of the demo: {line}"
        assert value in values[key], f"{key}={value} is not a value of the demo ({sorted(values[key])}): {line}"
        return f"{key}=<v>"

    line = re.sub(r"adjusted p=[^)]*", "adjusted p=#", line.removesuffix(FLAGGED))
    line = re.sub(r"(Welch's t|t over server starts) p=[^ (]*", r"\1 p=#", line)  # the confirmation's p-value
    return NUMBER.sub("#", PAIR.sub(param, line))


def _printed_today(plan, spec, clear: bool = True, confirmed: bool = False) -> list[str]:
    """What the conclusions print for the demo's plan, on made-up runs with a clear leader (`clear`), or with
    a leader 2 % ahead through a 10 % spread, which neither the sweep nor the confirmation can show; or
    (`confirmed`) that sweep, with a confirmation whose fresh runs read the leader 15 % ahead at a 1 % spread."""
    rows = []
    spread = 0.01 if clear else 0.1
    starts = plan.spec.campaign.order.instances  # the demo's design: each run on its server start (run r on r mod N)
    for p in plan.points:
        level = 100.0 * (1 + p.serve.params["max_num_seqs"] / 4) * (1 + p.bench.params["max_concurrency"] / 16)
        if not clear:
            level = 100.0 * (1 + 0.02 * (p.serve.params["max_num_seqs"] == 16)) * (1 + p.bench.params[
                "max_concurrency"] / 16)
        rows.append({"campaign": spec.campaign.name, "point_id": p.id, "serve_id": p.serve.id, "bench_id": p.bench.id,
                     "serve_label": p.serve.label, "bench_label": p.bench.label, "run_number": p.run,
                     **p.serve.params, **p.bench.params, "gpu_count": 0, "tensor_parallel_size": 1,
                     "pipeline_parallel_size": 1, "data_parallel_size": 1, "num_nodes": 1,
                     # not a straight line over the runs (a perfect line is a drift, and a drift is never green)
                     "output_throughput": level * (1 + spread * (0, -1, 1, 0.5)[p.run % 4]),
                     "request_throughput": level / 16,
                     "median_ttft_ms": 50.0, "p99_ttft_ms": 80.0, "median_tpot_ms": 10.0, "p99_tpot_ms": 12.0,
                     "median_e2el_ms": 200.0, "completed": 100, "failed": 0, "validity_ok": True,
                     "client_limited": False, "server_id": f"{p.serve.id}-{p.run % starts}",
                     "instance": p.run % starts})
    c = conclusions.conclude(pd.DataFrame(rows), list(plan.benches[0].params))
    if spec.campaign.confirm.enabled is True:  # the demo confirms its winner: the leader and runner-up again
        from raysweep.confirm.runs import confirm_bench_id

        for v in c.verdicts:
            for row in (v.leader, v.runner_up):
                base = next(r for r in rows if r["serve_id"] == row["serve_id"] and r["bench_id"] == row["bench_id"])
                lead = 1.15 if confirmed and row is v.leader else 1.0
                for r in range(spec.campaign.confirm.per_arm):
                    rows.append({**base, "bench_id": confirm_bench_id(base["bench_id"]), "run_number": r,
                                 "point_id": f"c{r}", "phase": "confirm", "confirms_bench_id": base["bench_id"],
                                 "server_id": f"{base['serve_id']}-{r % spec.campaign.confirm.starts}",
                                 "output_throughput": base["output_throughput"] * lead
                                 * (1 + (0.01 if confirmed else spread) * (0, -1, 1, 0.5)[r % 4])})
        c = conclusions.conclude(pd.DataFrame(rows), list(plan.benches[0].params))
    return conclusions.headlines(c)


def test_readme_example_is_the_demo_of_this_version():
    spec, plan = _demo()
    lines = _example()
    out = spec.campaign.output_dir
    assert lines[0] == f"Report: {out}/report.html"
    assert lines[1].startswith(f"Figures: {out}/plots/") and lines[1].count(".png") >= 2
    best = [line for line in lines if line.startswith("Best for ")]
    values = _values(plan)
    today = [[_masked(line, values) for line in _printed_today(plan, spec, clear, confirmed)]
             for clear, confirmed in ((True, False), (False, False), (False, True))]
    # a clear leader, one not shown better, or one the confirmation showed better where the sweep could not
    assert [_masked(line, values) for line in best] in today
    named = {m.group(0) for line in best for m in PAIR.finditer(line) if m.group(1) == "max_num_seqs"}
    assert named == {s.label for s in plan.serves}  # the leader and the best other configuration, both the demo's


def test_masking_keeps_what_the_test_must_see():
    values = {"max_num_seqs": {"2", "16"}, "max_concurrency": {"4", "16"}}
    line = ("Best for all bench points: max_num_seqs=16 at max_concurrency=16, output_throughput_per_gpu 2389 tok/s; "
            "+226.4% over max_num_seqs=2 at max_concurrency=4 (731.7), better than every other config (Welch's t "
            "over runs, Holm over the configs, adjusted p=0.00015)" + FLAGGED)
    assert _masked(line, values) == (
        "Best for all bench points: max_num_seqs=<v> at max_concurrency=<v>, output_throughput_per_gpu # tok/s; "
        "#% over max_num_seqs=<v> at max_concurrency=<v> (#), better than every other config (Welch's t over runs, "
        "Holm over the configs, adjusted p=#)")
    try:
        _masked(line.replace("max_num_seqs=2 ", "max_num_seqs=32 "), values)
    except AssertionError as exc:
        assert "max_num_seqs=32 is not a value of the demo" in str(exc)
    else:
        raise AssertionError("a configuration the demo does not have was accepted")

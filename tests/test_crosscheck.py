"""`raysweep crosscheck`: the comparison and its verdict (pure), choosing what to run, bad input, and one real
check of both clients taking turns on the real vLLM CPU server."""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from raysweep.campaign import load_campaign
from raysweep.cli import main
from raysweep.drive import crosscheck as xc
from raysweep.errors import UserError
from raysweep.plan.plan import build_plan


def run(tool: str, rnd: int, bench: str = "b1", ok: bool = True, **metrics: float) -> dict:
    base = {"output_throughput": 1000.0, "request_throughput": 30.0, "median_ttft_ms": 50.0, "median_tpot_ms": 8.0,
            "median_itl_ms": 8.0, "median_e2el_ms": 300.0}
    return {"tool": tool, "round": rnd, "bench_id": bench, "ok": ok, "error": None if ok else "boom",
            **base, **metrics}


def row(rows: list[xc.CompareRow], metric: str, bench: str = "b1") -> xc.CompareRow:
    return next(r for r in rows if r.metric == metric and r.bench_id == bench)


def runs_of(tool: str, values: list[float], metric: str = "output_throughput", bench: str = "b1") -> list[dict]:
    return [run(tool, i, bench, **{metric: v}) for i, v in enumerate(values)]


def test_the_ratio_of_the_clients_means_with_its_interval():
    runs = runs_of("native", [990.0, 1000.0, 1010.0, 1005.0]) + runs_of("vllm", [1000.0, 1010.0, 995.0, 1005.0])
    r = row(xc.compare(runs, xc.Tolerances()), "output_throughput")
    assert r.native == pytest.approx(1001.25) and r.vllm == pytest.approx(1002.5)
    assert r.low < r.ratio < r.high and r.ratio == pytest.approx(1001.25 / 1002.5, rel=1e-4)
    assert r.word == "equivalent" and r.within is True and r.runs == {"native": 4, "vllm": 4}


def test_one_slow_run_widens_the_interval_instead_of_deciding():
    # native's runs spread over 77 to 127 req/s as on 2026-11-25: the ratio's interval straddles 5 %
    nat = runs_of("native", [77.0, 127.0, 100.0, 95.0, 110.0, 84.0, 120.0], "request_throughput")
    vll = runs_of("vllm", [100.0, 103.0, 97.0, 101.0, 99.0, 104.0, 96.0], "request_throughput")
    r = row(xc.compare(nat + vll, xc.Tolerances()), "request_throughput")
    assert r.word == "not shown" and r.within is None and r.low < 0.95 and r.high > 1.0
    assert "not shown within 5% with 7 and 7 runs" in r.text
    v = xc.verdict(xc.compare(nat + vll, xc.Tolerances()), nat + vll)
    assert v["verdict"] == "not shown" and not v["within_tolerance"]
    assert any("request_throughput" in line for line in v["not_shown"])


@pytest.mark.parametrize("metric, factor, word", [
    ("output_throughput", 1.02, "equivalent"), ("output_throughput", 1.20, "different"),
    ("median_ttft_ms", 1.08, "equivalent"), ("median_ttft_ms", 1.25, "different"),
    ("median_tpot_ms", 0.97, "equivalent"), ("median_tpot_ms", 0.70, "different"),
])
def test_each_judged_metric_against_its_tolerance(metric, factor, word):
    base = run("vllm", 0)[metric]
    wobble = [0.995, 1.0, 1.005, 1.0, 0.998]
    runs = runs_of("native", [base * factor * w for w in wobble], metric) + runs_of("vllm", [base * w for w in wobble],
                                                                                   metric)
    rows = xc.compare(runs, xc.Tolerances())
    assert row(rows, metric).word == word
    v = xc.verdict(rows, runs)
    assert v["within_tolerance"] is (word == "equivalent")
    assert v["verdict"] == ("equivalent within tolerance" if word == "equivalent" else "different")


def test_tolerances_can_be_changed():
    wobble = [0.99, 1.0, 1.01]
    runs = runs_of("native", [1080.0 * w for w in wobble]) + runs_of("vllm", [1000.0 * w for w in wobble])
    assert xc.verdict(xc.compare(runs, xc.Tolerances()), runs)["verdict"] == "different"
    rows = xc.compare(runs, xc.Tolerances(throughput=0.2, latency=0.5))
    assert xc.verdict(rows, runs)["within_tolerance"]


def test_one_run_each_is_not_judged():
    runs = [run("native", 0), run("vllm", 0)]
    rows = xc.compare(runs, xc.Tolerances())
    assert row(rows, "output_throughput").word == "not judged"
    assert xc.verdict(rows, runs)["verdict"] == "not shown"


def test_itl_and_e2el_are_shown_not_judged():
    runs = [run("native", i, median_itl_ms=80, median_e2el_ms=3000) for i in range(3)] + \
        [run("vllm", i) for i in range(3)]
    rows = xc.compare(runs, xc.Tolerances())
    assert row(rows, "median_itl_ms").ratio == pytest.approx(10) and row(rows, "median_itl_ms").within is None
    assert row(rows, "median_itl_ms").word == ""
    assert xc.verdict(rows, runs)["within_tolerance"]


def test_client_limited_native_runs_never_pass():
    """Equal figures from a native client that could not drive the load say nothing of the server."""
    wobble = [0.995, 1.0, 1.005, 1.0, 0.998]
    runs = runs_of("native", [1000.0 * w for w in wobble]) + runs_of("vllm", [1000.0 * w for w in wobble])
    assert xc.verdict(xc.compare(runs, xc.Tolerances()), runs)["within_tolerance"] is True
    runs[1]["client_limited"] = True
    v = xc.verdict(xc.compare(runs, xc.Tolerances()), runs)
    assert v["within_tolerance"] is False and v["verdict"] == "not shown"
    assert v["client_limited_runs"] == ["b1 native run 1"]


def test_failed_runs_are_left_out_and_fail_the_verdict():
    runs = [run("native", 0), run("vllm", 0), run("native", 1, ok=False, output_throughput=1.0), run("vllm", 1),
            run("native", 2), run("vllm", 2)]
    rows = xc.compare(runs, xc.Tolerances())
    assert row(rows, "output_throughput").native == 1000 and row(rows, "output_throughput").runs["native"] == 2
    v = xc.verdict(rows, runs)
    assert not v["within_tolerance"] and v["failed_runs"] == ["b1 native run 1: boom"] and v["verdict"] == "different"


def test_a_missing_or_zero_vllm_value_fails_the_metric():
    runs = [run("native", 0), run("vllm", 0, median_tpot_ms=0.0)]
    rows = xc.compare(runs, xc.Tolerances())
    assert row(rows, "median_tpot_ms").ratio is None and row(rows, "median_tpot_ms").within is False
    assert "b1 median_tpot_ms (missing)" in xc.verdict(rows, runs)["outside"]


def test_bench_points_are_compared_apart():
    wobble = [0.99, 1.0, 1.01]
    runs = (runs_of("native", [1000.0 * w for w in wobble], bench="a") + runs_of("vllm", [1000.0 * w for w in wobble],
                                                                                 bench="a")
            + runs_of("native", [500.0 * w for w in wobble], bench="b")
            + runs_of("vllm", [1000.0 * w for w in wobble], bench="b"))
    rows = xc.compare(runs, xc.Tolerances())
    assert row(rows, "output_throughput", "a").within and row(rows, "output_throughput", "b").within is False
    assert xc.verdict(rows, runs)["outside"][0].startswith("b output_throughput")


def test_markdown_shows_both_clients_side_by_side():
    runs = [run("native", 0), run("vllm", 0, output_throughput=1200), run("native", 1),
            run("vllm", 1, output_throughput=1200)]
    rows = xc.compare(runs, xc.Tolerances())
    report = {"campaign": "c", "serve_id": "s1", "serve_label": "max_num_seqs=8", "server": "http://x", "n": 2,
              "tolerances": {"throughput": 0.05, "latency": 0.1}, "bench_labels": {"b1": "in=32"},
              "bench": {"native": "vllm bench serve", "vllm": "vllm bench serve --base-url http://x"},
              "runs": runs, "comparison": [r.__dict__ for r in rows], "verdict": xc.verdict(rows, runs)}
    text = xc.markdown(report)
    # no spread at all: the interval is the ratio itself, wholly outside 5 %
    assert "| output_throughput | 1,000.00 | 1,200.00 | 0.833 | 0.833 to 0.833 | 5% | **different** |" in text
    assert "| median_ttft_ms | 50.00 | 50.00 | 1.000 | 1.000 to 1.000 | 10% | equivalent |" in text
    assert "Verdict: different" in text and "| 1 | b1 | vllm |" in text


@pytest.fixture
def campaign(tmp_path: Path) -> Path:
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump({
        "name": "x", "output_dir": str(tmp_path / "out"),
        "serve": {"cmd": "vllm serve m", "params": [{"max_num_seqs": 8}, {"max_num_seqs": 16}]},
        "bench": {"cmd": "vllm bench serve --model m --dataset-name random --num-prompts 4",
                  "params": [{"random_input_len": 16}, {"random_input_len": 32}, {"random_input_len": 64}]}}))
    return f


def test_select_by_index_and_id(campaign):
    plan = build_plan(load_campaign(campaign))
    serve, benches = xc.select(plan, None, None, ())
    assert serve is plan.serves[0] and benches == [plan.benches[0]]
    serve, benches = xc.select(plan, 1, None, ("2", plan.benches[0].id[:6]))
    assert serve is plan.serves[1] and benches == [plan.benches[2], plan.benches[0]]
    assert xc.select(plan, None, plan.serves[1].id[:8], ())[0] is plan.serves[1]
    with pytest.raises(UserError, match="--point 'zz' is neither"):
        xc.select(plan, None, None, ("zz",))
    with pytest.raises(UserError, match="not both"):
        xc.select(plan, 0, plan.serves[0].id, ())


def test_vllm_runs_the_campaigns_command_without_native_only_options():
    from raysweep.plan.plan import BenchPoint, PointRun

    point = PointRun("p", None, BenchPoint("b", {}, ["--dataset-name", "random", "--clients", "2", "--vocab-size",
                                                     "100", "--prompt-format", "text", "--num-prompts", "5"], ""), 0)
    assert xc.vllm_point(point).bench.argv == ["vllm", "bench", "serve", "--dataset-name", "random",
                                               "--num-prompts", "5"]
    full = PointRun("p", None, BenchPoint("b", {}, ["vllm", "bench", "serve", "--model", "m"], ""), 0)
    assert xc.vllm_point(full).bench.argv == ["vllm", "bench", "serve", "--model", "m"]


@pytest.mark.parametrize("given, expected", [
    (["--trace-format", "mooncake", "--trace-speedup", "4"],
     ["--timed-trace-chunk-hash-size", "512", "--timed-trace-sec-multiplier", "0.00025"]),
    (["--trace-format", "mooncake"], ["--timed-trace-chunk-hash-size", "512", "--timed-trace-sec-multiplier", "0.001"]),
    (["--trace_speedup=2"], ["--timed-trace-sec-multiplier", "0.5"]),
    (["--trace-format", "vllm"], ["--timed-trace-chunk-hash-size", "16", "--timed-trace-sec-multiplier", "1"]),
    # vLLM's own options override the preset, and the speed-up divides the given multiplier
    (["--timed-trace-sec-multiplier", "0.01", "--trace-format", "mooncake", "--timed-trace-chunk-hash-size", "64",
      "--trace-speedup", "2"], ["--timed-trace-sec-multiplier", "0.005", "--timed-trace-chunk-hash-size", "64"]),
])
def test_vllm_gets_the_trace_format_and_speedup_as_its_own_timed_trace_units(given, expected):
    from raysweep.plan.plan import BenchPoint, PointRun

    head = ["vllm", "bench", "serve", "--dataset-name", "timed_trace", "--dataset-path", "t.jsonl"]
    point = PointRun("p", None, BenchPoint("b", {}, [*head, *given, "--num-prompts", "5"], ""), 0)
    argv = xc.vllm_point(point).bench.argv
    assert argv[:len(head)] == head and "--num-prompts" in argv
    rest = [t for t in argv[len(head):] if t not in ("--num-prompts", "5")]
    assert dict(zip(rest[::2], rest[1::2])) == dict(zip(expected[::2], expected[1::2]))
    assert len(rest) == len(expected)


@pytest.mark.parametrize("args, message", [
    (["--serve-index", "5"], "--serve-index '5'"),
    (["--point", "zz"], "--point 'zz'"),
    (["--throughput-tolerance", "0"], "--throughput-tolerance"),
    (["-n", "0"], "-n"),
])
def test_bad_input_exits_2_before_anything_starts(campaign, args, message):
    res = CliRunner().invoke(main, ["crosscheck", str(campaign), *args])
    assert res.exit_code == 2, res.output
    assert message in res.output


# ---------------------------------------------------------------------------------------------------
# Real vLLM CPU server (the shared session server, given by --url)
# ---------------------------------------------------------------------------------------------------

@pytest.mark.vllm
def test_crosscheck_alternates_both_clients_on_the_real_server(vllm_server, tmp_path):
    model = vllm_server["model"]
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump({
        "name": "xc", "output_dir": str(tmp_path / "out"), "warmup": 0,
        "serve": {"cmd": f"vllm serve {model} --load-format dummy --enforce-eager"},
        "bench": {"cmd": f"vllm bench serve --model {model} --dataset-name random --random-input-len 32 "
                         "--random-output-len 8 --num-prompts 8 --max-concurrency 4 --ignore-eos --temperature 0",
                  "client_cpus": 0.5}}))
    bindir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ.get('PATH', '')}"}
    proc = subprocess.run([sys.executable, "-m", "raysweep", "crosscheck", str(f), "--url", vllm_server["url"],
                           "-n", "2", "--json"], capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode in (0, 1) and proc.stdout, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    # the first of a round alternates, so that a drift of the server, or going first, falls on both alike
    assert [(r["tool"], r["round"]) for r in report["runs"]] == [("native", 0), ("vllm", 0), ("vllm", 1),
                                                                 ("native", 1)]
    assert all(r["ok"] and r["reset"] == "reset" for r in report["runs"]), report["runs"]
    assert all(r["completed"] == 8 for r in report["runs"])
    # each run's server counters lie between the scrape before its load and the one after it (a command: before
    # its launch and after its exit; `vllm bench serve` sends no initial test prompt unless
    # --ready-check-timeout-sec), so they hold exactly the requests it sent: a baseline taken inside the load,
    # or a last scrape before its end, would miss some
    for r in report["runs"]:
        assert r["server_metrics_complete"] and r["server_request_success"] == 8, r
        assert r["server_generation_tokens"] == 8 * 8, r
    # each tool's CPU over its load is measured: on shared cores, what it took from the server
    assert all(r["client_cpu_s"] > 0 for r in report["runs"]), report["runs"]
    # and both run at niceness 0 (the `vllm bench serve` process too, started from a Ray worker), on CPUs named
    assert all(r["client_nice"] == 0 and r["client_cpu_affinity"] for r in report["runs"]), report["runs"]
    vllm_cmd = [r["command"] for r in report["runs"] if r["tool"] == "vllm"]
    assert all(c.split()[1:3] == ["bench", "serve"] and "--base-url" in c for c in vllm_cmd)
    tput = next(r for r in report["comparison"] if r["metric"] == "output_throughput")
    assert tput["native"] > 0 and tput["vllm"] > 0 and tput["runs"] == {"native": 2, "vllm": 2}
    # the ratio of the geometric means of the runs, with its interval, and the equivalence verdict
    logs = {t: [math.log(r["output_throughput"]) for r in report["runs"] if r["tool"] == t] for t in ("native", "vllm")}
    assert tput["ratio"] == pytest.approx(math.exp(statistics.fmean(logs["native"]) - statistics.fmean(logs["vllm"])))
    assert tput["low"] <= tput["ratio"] <= tput["high"]
    assert tput["word"] in ("equivalent", "different", "not shown")
    v = report["verdict"]
    assert set(v) >= {"within_tolerance", "verdict", "outside", "failed_runs"}
    assert proc.returncode == (0 if v["within_tolerance"] else 1)
    written = Path(report["report_dir"])
    assert json.loads((written / "crosscheck.json").read_text())["runs"] == report["runs"]
    md = (written / "crosscheck.md").read_text()
    assert "| native | vllm bench serve |" in md and "Verdict:" in md
    assert written.parent == tmp_path / "out" / "crosscheck"

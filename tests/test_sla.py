"""The SLA search and judges on synthetic response curves (pure: no Ray, no server)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from raysweep.errors import CampaignError
from raysweep.record.directory import CampaignDir
from raysweep.sla.search import (
    INFINITE,
    Target,
    Threshold,
    Verdict,
    judge_attainment,
    judge_percentile,
    parse_targets,
    search,
    wilson,
)


def test_targets_use_vllms_expressions():
    t1, t2 = parse_targets([{"p99_e2el_ms": "<=200"}, {"p99_e2el_ms": "< 500", "output_throughput": ">=1e3"}])
    assert t1.thresholds == (Threshold("p99_e2el_ms", "<=", 200.0),)
    assert t2.label == "p99_e2el_ms<500 & output_throughput>=1000"


@pytest.mark.parametrize("raw, where, words", [
    ([{"p99_latency": "<=5"}], "sla.targets[0].p99_latency", "not a metric"),
    ([{"p99_e2el_ms": "=5"}], "sla.targets[0].p99_e2el_ms", "<=, <, >=, >"),
    ([{"p99_e2el_ms": 200}], "sla.targets[0].p99_e2el_ms", "quote it"),
    ([], "sla.targets", "non-empty list"),
    ([{"p50_ttft_ms": "<=1"}, "x"], "sla.targets[1]", "mapping"),
])
def test_bad_targets_name_the_target_and_metric(raw, where, words):
    with pytest.raises(CampaignError) as e:
        parse_targets(raw)
    assert e.value.field == where and words in str(e.value)


def test_percentile_judge():
    t = Target((Threshold("p99_e2el_ms", "<=", 200), Threshold("request_throughput", ">", 5)))
    assert judge_percentile({"p99_e2el_ms": 150.0, "request_throughput": 6.0}, t) is Verdict.PASS
    assert judge_percentile({"p99_e2el_ms": 250.0, "request_throughput": 6.0}, t) is Verdict.FAIL
    assert judge_percentile({"p99_e2el_ms": 150.0, "request_throughput": 5.0}, t) is Verdict.FAIL
    assert judge_percentile({"request_throughput": 6.0}, t) is Verdict.UNRESOLVED


def test_wilson_interval():
    lo, hi = wilson(99, 100)
    assert lo == pytest.approx(0.9455, abs=1e-3) and hi == pytest.approx(0.9983, abs=1e-3)
    assert wilson(0, 0) == (0.0, 1.0)


def test_attainment_judge_leaves_an_unjudgeable_server_target_unresolved_not_failed():
    """A server counter from incomplete server metrics cannot be judged: the percentile judge says
    unresolved, and so must the attainment judge (its documentation says so), not fail the probe."""
    t = Target((Threshold("p99_e2el_ms", "<=", 100), Threshold("server_num_preemptions", "<=", 0)))
    reqs = {"ok": np.ones(2000, bool), **{k: np.full(2000, 50.0) for k in ("e2el", "ttft", "tpot", "itl")}}
    assert judge_attainment(reqs, {}, t)[0] is Verdict.UNRESOLVED
    assert judge_attainment(reqs, {"server_num_preemptions": 0}, t)[0] is Verdict.PASS
    assert judge_attainment(reqs, {"server_num_preemptions": 3}, t)[0] is Verdict.FAIL
    bad = {**reqs, "e2el": np.full(2000, 500.0)}
    assert judge_attainment(bad, {}, t)[0] is Verdict.FAIL  # the latencies alone decide it


def test_attainment_judge_says_unresolved_when_the_interval_straddles_the_level():
    t = Target((Threshold("p99_e2el_ms", "<=", 100),))

    def reqs(n, good):
        e2el = np.where(np.arange(n) < good, 50.0, 150.0)
        return {"ok": np.ones(n, bool), "e2el": e2el, "ttft": e2el, "tpot": e2el, "itl": e2el}

    assert judge_attainment(reqs(2000, 2000), {}, t)[0] is Verdict.PASS
    assert judge_attainment(reqs(2000, 1900), {}, t)[0] is Verdict.FAIL       # 95 %, clearly under 99 %
    v, frac, (lo, hi) = judge_attainment(reqs(100, 99), {}, t)
    assert v is Verdict.UNRESOLVED and frac == 0.99 and lo < 0.99 < hi
    failed = reqs(2000, 2000)
    failed["ok"][:100] = False                                              # failed requests meet nothing
    assert judge_attainment(failed, {}, t)[0] is Verdict.FAIL


def curve(capacity: float, calls: list[float] | None = None, noise: dict[float, Verdict] | None = None):
    """A monotone response: the targets hold up to `capacity` (infinite load always fails)."""
    def evaluate(v: float) -> Verdict:
        if calls is not None:
            calls.append(v)
        if noise and v in noise:
            return noise[v]
        return Verdict.PASS if v <= capacity else Verdict.FAIL
    return evaluate


@pytest.mark.parametrize("capacity", [1, 2, 7, 32, 50, 63, 64, 1000, 4097])
def test_known_boundary_within_doubling_plus_bisection_probes(capacity):
    calls: list[float] = []
    out = search(curve(capacity, calls), start=1, max_value=65536, precision=0.0)
    assert out.state == "found" and out.largest_pass == capacity and out.smallest_fail == capacity + 1
    doubling = math.ceil(math.log2(capacity + 1)) + 1
    assert len(calls) == len(set(calls)) <= 1 + doubling + math.ceil(math.log2(capacity + 1)) + 1


def test_capacity_estimate_saves_probes_and_keeps_the_answer():
    plain, hinted = [], []
    a = search(curve(900, plain), precision=0.05)
    b = search(curve(900, hinted), precision=0.05, estimate=lambda: 1000.0)
    assert a.largest_pass <= 900 < a.smallest_fail and b.largest_pass <= 900 < b.smallest_fail
    assert (b.smallest_fail - b.largest_pass) <= 0.05 * b.smallest_fail
    assert len(hinted) < len(plain)
    high = []   # an estimate far above the boundary: the first probe fails and the search halves back down
    c = search(curve(10, high), precision=0.0, estimate=lambda: 5000.0)
    assert (c.largest_pass, c.smallest_fail) == (10, 11)


def test_relative_precision_for_a_rate():
    out = search(curve(37.3), start=0.5, integer=False, precision=0.02)
    assert out.largest_pass <= 37.3 < out.smallest_fail
    assert out.smallest_fail - out.largest_pass <= 0.02 * out.smallest_fail


def test_states_never_met_above_max_and_unbounded():
    assert search(curve(0.5), start=1).state == "never met"
    out = search(curve(10**9), max_value=1024)
    assert out.state == "above max" and out.largest_pass == 1024
    assert out.probes == [INFINITE, *[2.0**k for k in range(11)]]
    assert search(lambda v: Verdict.PASS).state == "above max"  # holds even at unbounded load


def test_noise_larger_than_the_step_is_unresolved():
    out = search(curve(20, noise={24: Verdict.UNRESOLVED}), precision=0.0)
    assert out.state == "unresolved" and out.largest_pass == 16 and out.smallest_fail == 32


def test_inversion_is_rechecked_once():
    known = {5.0: Verdict.FAIL}   # another target's probe at 5 failed for this target's thresholds too
    rechecked = []
    out = search(curve(12), precision=0.0, known=lambda: known,
                 recheck=lambda v: rechecked.append(v) or Verdict.PASS)
    assert out.state == "found" and rechecked == [5.0] and "not monotone" in out.notes[0]
    still = search(curve(12), precision=0.0, known=lambda: known, recheck=lambda v: Verdict.FAIL)
    assert still.state == "unresolved"


def test_targets_share_probes():
    """Two targets on one curve (e2el grows with load): the second reuses the first one's probes."""
    e2el = {}

    def run(v: float) -> float:
        e2el.setdefault(v, 10.0 * v if math.isfinite(v) else math.inf)
        return e2el[v]

    def judge(limit: float):
        return lambda v: Verdict.PASS if run(v) <= limit else Verdict.FAIL

    first = search(judge(400), precision=0.0)
    second = search(judge(450), precision=0.0, known=lambda: {v: judge(450)(v) for v in e2el})
    assert (first.largest_pass, second.largest_pass) == (40, 45)
    separate_runs = len(first.probes) + len(search(judge(450), precision=0.0).probes)
    assert len(e2el) < separate_runs


def test_resume_replays_from_recorded_probes():
    """A search stopped halfway resumes: recorded probes are looked up, only the rest are run."""
    ledger: dict[float, Verdict] = {}
    runs: list[float] = []

    def evaluate(v: float) -> Verdict:
        if v not in ledger:
            runs.append(v)
            ledger[v] = curve(300)(v)
        return ledger[v]

    full = search(evaluate, precision=0.0)
    done = list(runs)
    for v in done[len(done) // 2:]:
        del ledger[v]        # the driver died after half the probes
    runs.clear()
    again = search(evaluate, precision=0.0)
    assert (again.largest_pass, again.smallest_fail) == (full.largest_pass, full.smallest_fail) == (300, 301)
    assert runs == done[len(done) // 2:]


def _campaign(**sla_fields):
    from raysweep.campaign import campaign_from_dict

    data = {"name": "s", "serve": {"cmd": "vllm serve m"},
            "bench": {"cmd": "vllm bench serve --model m --max-concurrency 8", "params": [{"random_input_len": 8}]},
            "sla": {"targets": [{"p99_e2el_ms": "<=200"}], **sla_fields}}
    return data, campaign_from_dict


@pytest.mark.parametrize("change, where, words", [
    ({"variable": "max_num_seqs"}, "sla.variable", "max_concurrency"),
    ({"targets": [{"p99_e2el_ms": "==3"}]}, "sla.targets[0].p99_e2el_ms", "<=, <, >=, >"),
    ({"judge": "mean"}, "sla.judge", "attainment"),
    ({"precision": 0}, "sla.precision", "greater than 0"),
    ({"start": 100, "max_value": 10}, "sla", "above max_value"),
    ({"bench_params": [{"max_concurrency": 4}]}, "bench.params[0].max_concurrency", "SLA search sets"),
    ({"backend": "command"}, "sla", "native"),
])
def test_campaign_refuses_bad_sla_sections(tmp_path, change, where, words):
    data, load = _campaign()
    if "bench_params" in change:
        data["bench"]["params"] = change.pop("bench_params")
    if "backend" in change:
        data["bench"]["backend"] = change.pop("backend")
    data["sla"].update(change)
    with pytest.raises(CampaignError) as e:
        load(data, base_dir=tmp_path, env={})
    assert str(e.value).startswith(where) and words in str(e.value)


def test_sla_plan_starts_every_search_at_unbounded_load(tmp_path):
    from raysweep.plan.plan import build_plan, dry_run_text
    from raysweep.sla.plan import probe_bench

    data, load = _campaign()
    data["serve"]["params"] = {"grid": {"max_num_seqs": [4, 8]}}
    plan = build_plan(load(data, base_dir=tmp_path, env={}))
    assert len(plan.searches) == 2 and len(plan.points) == 2 * 3        # 2 configs x 1 bench x 3 runs
    assert all(p.bench.sla_value == INFINITE and "--max-concurrency" not in p.bench.argv for p in plan.points)
    probe = probe_bench(plan.spec, plan.benches[0], 12.0)
    assert probe.argv[probe.argv.index("--max-concurrency") + 1] == "12" and probe.base_id == plan.benches[0].id
    assert probe_bench(plan.spec, plan.benches[0], 12.0).id == probe.id != plan.points[0].bench.id
    assert "SLA search on max_concurrency" in dry_run_text(plan)


def test_per_request_latencies_for_attainment():
    from raysweep.bench import stats

    s = stats.empty_samples()
    for col, v in zip(stats.COLUMNS, (0, 0, 0.0, 0.0, 0.0, 0.010, 0.050, 5, 3, True, None, [0.010, 0.030, 0.050])):
        s[col].append(v)
    for col, v in zip(stats.COLUMNS, (1, 0, 0.0, 0.0, 0.0, math.nan, 0.020, -1, 0, False, "HTTP 500", [])):
        s[col].append(v)
    r = stats.per_request(s)
    assert r["ttft"][0] == pytest.approx(10) and r["e2el"][0] == pytest.approx(50)
    assert r["tpot"][0] == pytest.approx(20) and r["itl"][0] == pytest.approx(20)
    assert list(r["ok"]) == [True, False] and math.isnan(r["e2el"][1])


def test_unbounded_pass_contradicted_by_a_failing_probe_is_not_above_max():
    known = {12.0: Verdict.FAIL}
    out = search(lambda v: Verdict.PASS if not math.isfinite(v) else Verdict.FAIL, known=lambda: known,
                 recheck=lambda v: Verdict.FAIL)
    assert out.state == "unresolved" and "not monotone" in out.notes[-1]
    fixed = search(lambda v: Verdict.PASS, known=lambda: known, recheck=lambda v: Verdict.PASS)
    assert fixed.state == "above max"


def test_a_recheck_that_passes_moves_the_boundary_up():
    """8 failed once, 12 passed for another target: 8 passes on re-check, so the answer lies above 12."""
    first = {8.0: Verdict.FAIL}

    def evaluate(v: float) -> Verdict:
        if v in first:
            return first[v]
        return Verdict.PASS if v <= 20 else Verdict.FAIL

    out = search(evaluate, precision=0.0, known=lambda: {12.0: Verdict.PASS}, recheck=lambda v: Verdict.PASS)
    assert out.state == "found" and (out.largest_pass, out.smallest_fail) == (20, 21), out


def test_bisection_never_borrows_an_unresolved_value():
    calls = []
    noisy = {44.0: Verdict.UNRESOLVED}   # another target's probe at 44 decided nothing, and would not for this one
    out = search(curve(50, calls, noise=noisy), precision=0.0, known=lambda: noisy)
    assert out.state == "found" and out.largest_pass == 50 and 44.0 not in calls


def _run_samples(n: int = 20, gap: float = 0.1, e2el: float = 0.5, failed: int = 0) -> dict:
    """One run's raw samples, timed from the run's own start: a request every `gap` s lasting `e2el` s,
    4 output tokens in 4 chunks; the last `failed` requests fail."""
    from raysweep.bench import stats

    s = stats.empty_samples()
    for i in range(n):
        ok = i < n - failed
        t = i * gap
        row = {"index": i, "actor": 0, "due": t, "ready": t, "begin": t, "sent": t,
               "first": t + 0.1 if ok else math.nan,
               "end": t + e2el, "done": t + e2el, "in_tok": 8, "out_tok": 4 if ok else 0, "ok": ok,
               "error": None if ok else "HTTP 500", "chunks": [0.1, 0.2, 0.3, e2el] if ok else [], "text": None}
        for col in s:
            if col != "loop_lag":
                s[col].append(row.get(col))
    return s


def _write_runs(out, runs: list[dict], extra: list[dict] | None = None) -> list[str]:
    import json

    from raysweep.record.runs import write_samples

    paths = []
    for i, s in enumerate(runs):
        write_samples(out / f"run={i}.samples.parquet", s)
        (out / f"run={i}.json").write_text(json.dumps({"samples_path": f"run={i}.samples.parquet",
                                                       **((extra or [{}] * len(runs))[i])}))
        paths.append(f"run={i}.json")
    return paths


def test_a_probe_of_several_runs_reports_one_runs_throughput_not_their_sum(tmp_path):
    """Each run starts at its own zero: pooled as one run, two runs would look twice as fast."""
    from raysweep.bench import stats
    from raysweep.bench.options import parse_load_options
    from raysweep.sla.probe import capacity, pool_probe

    argv = ["vllm", "bench", "serve", "--model", "m", "--num-prompts", "20"]
    one = stats.point_metrics(_run_samples(), parse_load_options(argv))
    probe = pool_probe(CampaignDir(tmp_path), _write_runs(tmp_path, [_run_samples(), _run_samples()]), argv)
    assert probe.metrics["request_throughput"] == pytest.approx(one["request_throughput"])
    assert probe.metrics["output_throughput"] == pytest.approx(one["output_throughput"])
    assert probe.metrics["max_concurrent_requests"] == one["max_concurrent_requests"]
    assert probe.metrics["completed"] == 40 and probe.metrics["duration"] == pytest.approx(2 * one["duration"])
    assert probe.metrics["p99_e2el_ms"] == pytest.approx(500)
    assert capacity(probe, "request_rate") == pytest.approx(one["request_throughput"])
    # runs of unequal length: everything completed over the summed durations
    slow = _run_samples(gap=0.2)
    s_m = stats.point_metrics(slow, parse_load_options(argv))
    both = pool_probe(CampaignDir(tmp_path), _write_runs(tmp_path, [_run_samples(), slow]), argv)
    assert both.metrics["request_throughput"] == pytest.approx(40 / (one["duration"] + s_m["duration"]))


def test_the_percentile_judge_counts_failed_requests_against_latency_targets():
    from raysweep.bench import stats
    from raysweep.bench.options import parse_load_options

    opts = parse_load_options(["vllm", "bench", "serve", "--model", "m", "--percentile-metrics", "ttft,tpot,itl,e2el",
                               "--metric-percentiles", "50,99"])
    s = _run_samples(n=100, failed=30)     # every request that finished took 500 ms; 30 % failed
    m, per = stats.point_metrics(s, opts), stats.per_request(s)
    assert m["p99_e2el_ms"] == pytest.approx(500) and m["failed"] == 30
    for metric in ("p99_e2el_ms", "mean_e2el_ms", "p99_ttft_ms", "p99_tpot_ms", "p99_itl_ms"):
        t = Target((Threshold(metric, "<=", 1000),))
        assert judge_percentile(m, t) is Verdict.FAIL, metric
        assert judge_percentile(m, t, per) is Verdict.FAIL, metric
    median = Target((Threshold("median_e2el_ms", "<=", 1000),))
    assert judge_percentile(m, median, per) is Verdict.PASS        # 70 % finished in time: the median holds
    # few failures: p50 over all requests is still a finished one; p99 is not when over 1 % failed
    s2 = _run_samples(n=100, failed=2)
    m2, per2 = stats.point_metrics(s2, opts), stats.per_request(s2)
    assert judge_percentile(m2, Target((Threshold("p50_e2el_ms", "<=", 1000),)), per2) is Verdict.PASS
    assert judge_percentile(m2, Target((Threshold("p99_e2el_ms", "<=", 1000),)), per2) is Verdict.FAIL
    clean = _run_samples(n=100)
    mc = stats.point_metrics(clean, opts)
    p99 = Target((Threshold("p99_e2el_ms", "<=", 1000),))
    assert judge_percentile(mc, p99, stats.per_request(clean)) is Verdict.PASS


def test_failures_ranked_last_match_numpy_on_all_requests():
    from raysweep.sla.search import _with_failures

    rng = np.random.default_rng(1)
    ok = np.sort(rng.uniform(10, 100, 995))
    for pct in (50.0, 90.0, 99.0, 99.4):
        ref = float(np.percentile(np.concatenate([ok, np.full(5, 1e9)]), pct))
        got = _with_failures(ok, 5, pct)
        assert got == pytest.approx(ref) if ref < 1e8 else got == math.inf


def test_server_metric_targets_are_judged_from_the_probes_runs(tmp_path):
    from raysweep.sla.probe import pool_probe

    argv = ["vllm", "bench", "serve", "--model", "m", "--num-prompts", "20"]
    server = [{"server_num_preemptions": 0, "server_kv_cache_usage_perc_peak": 0.4, "server_metrics_complete": True},
              {"server_num_preemptions": 3, "server_kv_cache_usage_perc_peak": 0.9, "server_metrics_complete": True}]
    probe = pool_probe(CampaignDir(tmp_path), _write_runs(tmp_path, [_run_samples(), _run_samples()], server), argv)
    [preempt, kv] = parse_targets([{"server_num_preemptions": "<=0"}, {"server_kv_cache_usage_perc_peak": "<0.95"}])
    assert judge_percentile(probe.metrics, preempt) is Verdict.FAIL        # 3 preemptions in the second run
    assert judge_percentile(probe.metrics, kv) is Verdict.PASS
    partial = [server[0], {"server_metrics_complete": False, "server_metrics_incomplete_reason": "no scrape after"}]
    probe = pool_probe(CampaignDir(tmp_path), _write_runs(tmp_path, [_run_samples(), _run_samples()], partial), argv)
    # a counter over a partial window decides nothing
    assert judge_percentile(probe.metrics, preempt) is Verdict.UNRESOLVED
    with pytest.raises(CampaignError) as e:
        parse_targets([{"server_kv_cache_peak": "<=0.9"}])
    assert e.value.field == "sla.targets[0].server_kv_cache_peak" and "server_kv_cache_usage_perc_peak" in str(e.value)


@pytest.mark.timing
@pytest.mark.ray
def test_sla_campaign_with_two_runs_reports_one_runs_throughput_and_judges_server_targets(gpu_cluster, tmp_path):
    """On the stand-in (4 generation slots), 2 runs per probe: the passing probe's throughput is the runs'
    combined throughput (not their sum), and a server-metric target is judged from the scraped metrics."""
    from helpers import native_campaign, run_file

    from raysweep.results.table import results_table, sla_table

    f = native_campaign(tmp_path, server_args="--ttft-delay 0.01 --itl-delay 0.005 --slots 4", runs=2,
                        bench_args="--random-output-len 4 --random-input-len 8 --num-prompts 24",
                        bench_params=[{"random_input_len": 8}], bench={"client_cpus": 0.5, "metrics_interval_s": 0.1},
                        sla={"targets": [{"p90_ttft_ms": "<=30"}, {"server_prompt_tokens": ">=1"}], "max_value": 64})
    summary, out = run_file(f)
    points = results_table(CampaignDir(out))
    assert points["server_metrics_complete"].all(), points.get("server_metrics_incomplete_reason")
    assert (points["server_prompt_tokens"] == points["total_input_tokens"]).all()
    df = sla_table(CampaignDir(out))
    first = df[df["target"] == "p90_ttft_ms<=30"].iloc[0]
    assert first["state"] == "found", df.to_dict("records")
    runs = points[points["max_concurrency"] == first["largest_pass"]]
    assert len(runs) == 2
    combined = runs["completed"].sum() / runs["duration"].sum()
    assert first["at_pass_request_throughput"] == pytest.approx(combined, rel=1e-6)
    assert first["at_pass_request_throughput"] <= 1.01 * runs["request_throughput"].max()
    server = df[df["target"] == "server_prompt_tokens>=1"].iloc[0]
    assert server["state"] == "above max" and server["at_pass_server_prompt_tokens"] == 2 * 24 * 8

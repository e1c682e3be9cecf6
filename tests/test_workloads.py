"""Workloads: multi-turn sessions, trace replay, duration-bounded points, time series and the steady-state
window, reasoning models' time to first output token, and the refusal of what the native client does not
run. Pure tests first, then the native client on Ray against the streaming stand-in, then real vLLM."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from raysweep.bench import arrivals, stats, timeseries
from raysweep.bench.datasets import make_requests
from raysweep.bench.options import DATASETS, VLLM_ONLY_DATASETS, VLLM_ONLY_OPTIONS, parse_load_options
from raysweep.bench.sessions import with_history
from raysweep.errors import CampaignError
from raysweep.record.directory import CampaignDir


def opts(*argv: str, model: str = "m"):
    return parse_load_options(["--model", model, *argv])


def _trace(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# -- options ---------------------------------------------------------------------------------------------------

def _vllm_serve_options() -> set[str]:
    """Every option `vllm bench serve` 0.32 defines, read from its installed source."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")  # its files, without importing it
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed")
    root = Path(spec.origin).parent / "benchmarks"
    text = (root / "serve.py").read_text() + (root / "datasets" / "datasets.py").read_text()
    return set(re.findall(r'"(--[a-z0-9-]+)"', text))


def test_every_vllm_bench_serve_option_is_accepted_or_refused_with_the_way_out():
    from raysweep.bench.options import accepted_options

    accepted = set(accepted_options())
    for option in sorted(_vllm_serve_options() - accepted):
        with pytest.raises(CampaignError) as e:
            opts(option, "1")
        assert option in str(e.value) and "bench.backend: command" in str(e.value), option


def test_crosscheck_hands_vllm_none_of_the_workload_options_only_raysweep_knows():
    from raysweep.bench.options import accepted_options
    from raysweep.drive.crosscheck import NATIVE_ONLY_FLAGS

    ours = set(accepted_options()) - _vllm_serve_options() - {"--no-self-timed"}  # vLLM's, made by argparse
    workload = {"--duration", "--trace-format", "--trace-speedup", "--multi-turn-turns", "--multi-turn-think-time",
                "--timeseries-interval"}
    assert workload <= ours
    assert {f"--{f.replace('_', '-')}" for f in NATIVE_ONLY_FLAGS} >= workload


@pytest.mark.parametrize("name", VLLM_ONLY_DATASETS)
def test_vllm_only_datasets_are_refused_naming_them(name):
    with pytest.raises(CampaignError) as e:
        opts("--dataset-name", name)
    assert f"--dataset-name {name}" in str(e.value) and "bench.backend: command" in str(e.value)
    assert set(VLLM_ONLY_DATASETS).isdisjoint(DATASETS) and "num_warmups" in VLLM_ONLY_OPTIONS


@pytest.mark.parametrize("argv, words", [
    (["--duration", "5"], ["--duration", "--max-concurrency"]),
    (["--duration", "0", "--max-concurrency", "2"], ["--duration", "positive"]),
    (["--duration", "5", "--ramp-up-strategy", "linear", "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "2"],
     ["exclude each other"]),
    (["--dataset-name", "multi_turn"], ["openai-chat"]),
    (["--dataset-name", "timed_trace"], ["--dataset-path", "timed_trace"]),
    (["--trace-speedup", "2"], ["--trace-speedup", "timed_trace"]),
    (["--multi-turn-turns", "3"], ["--multi-turn-turns", "multi_turn"]),
    (["--self-timed"], ["--self-timed", "timed_trace"]),
    (["--timeseries-interval", "-1"], ["--timeseries-interval", "positive"]),
])
def test_bad_workload_options_are_refused_naming_the_option(argv, words):
    with pytest.raises(CampaignError) as e:
        opts(*argv)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_duration_makes_an_open_loop_of_rate_times_duration_and_a_closed_loop_cycle():
    o, cycle = arrivals.for_duration(opts("--duration", "4", "--request-rate", "2.5"))
    assert o.num_prompts == 10 and not cycle
    o, cycle = arrivals.for_duration(opts("--duration", "4", "--max-concurrency", "2", "--num-prompts", "7"))
    assert o.num_prompts == 7 and cycle
    assert arrivals.for_duration(opts("--max-concurrency", "2"))[1] is False
    from raysweep.plan.estimate import guess_point_s  # the dry run's estimate follows the duration, not the count
    assert 300 < guess_point_s(["vllm", "bench", "serve", "--duration", "300", "--max-concurrency", "4"]) < 310


# -- trace replay ----------------------------------------------------------------------------------------------

def test_trace_prompts_share_prefixes_where_hash_ids_agree(tmp_path):
    f = _trace(tmp_path / "t.jsonl", [
        {"timestamp": 0, "input_length": 40, "output_length": 3, "hash_ids": [1, 2, 3]},
        {"timestamp": 500, "input_length": 40, "output_length": 4, "hash_ids": [1, 2, 9]},
        {"timestamp": 1000, "input_length": 20, "output_length": 5, "hash_ids": [7]},
        {"timestamp": 2000, "input_length": 30, "output_length": 6}])
    o = opts("--dataset-name", "timed_trace", "--dataset-path", str(f), "--timed-trace-chunk-hash-size", "16",
             "--timed-trace-sec-multiplier", "0.001", "--trace-speedup", "2")
    reqs = make_requests(o)
    assert [len(r.prompt) for r in reqs] == [40, 40, 20, 30] and [r.output_len for r in reqs] == [3, 4, 5, 6]
    assert reqs[0].prompt[:32] == reqs[1].prompt[:32] and reqs[0].prompt[32:] != reqs[1].prompt[32:]
    assert reqs[2].prompt[:16] != reqs[0].prompt[:16]
    assert make_requests(o) == reqs  # the seed makes them, nothing else
    due = arrivals.due_times(len(reqs), o)
    assert due.tolist() == pytest.approx([0.0, 0.25, 0.5, 1.0])
    assert arrivals.asked_rate(o, due) == pytest.approx(4.0)
    # Mooncake's units: milliseconds and 512-token blocks; a duration keeps the lines due before it
    m = opts("--dataset-name", "timed_trace", "--dataset-path", str(f), "--trace-format", "mooncake",
             "--duration", "0.7")
    assert m.timed_trace_chunk_hash_size == 512 and m.timed_trace_sec_multiplier == 0.001
    assert len(make_requests(m)) == 2
    # --no-self-timed: the trace's lengths at --request-rate
    n = opts("--dataset-name", "timed_trace", "--dataset-path", str(f), "--no-self-timed", "--request-rate", "10")
    assert not n.timed and arrivals.due_times(4, n)[-1] == pytest.approx(0.4)


def test_a_bad_trace_line_is_refused_naming_the_line_and_the_labels(tmp_path):
    f = _trace(tmp_path / "t.jsonl", [{"timestamp": 0, "input_length": 4, "output_length": 2},
                                      {"ts": 1, "input_length": 4, "output_length": 2}])
    with pytest.raises(CampaignError, match=r"line 2 .*timestamp.*--timed-trace-label-timestamp"):
        make_requests(opts("--dataset-name", "timed_trace", "--dataset-path", str(f)))
    ok = opts("--dataset-name", "timed_trace", "--dataset-path", str(f), "--timed-trace-label-timestamp", "ts")
    with pytest.raises(CampaignError, match="line 1"):
        make_requests(ok)


# -- multi-turn sessions ---------------------------------------------------------------------------------------

def test_sessions_from_a_sharegpt_file_keep_their_turns_in_order(tmp_path, tiny_model):
    from raysweep.bench.native import _requests

    data = [{"conversations": [{"from": "human", "value": "a b c"}, {"from": "gpt", "value": "x y"},
                               {"from": "human", "value": "d e"}, {"from": "gpt", "value": "z"},
                               {"from": "human", "value": "f"}]},
            {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "g h"},
                          {"role": "assistant", "content": "w"}]}]
    f = tmp_path / "chats.json"
    f.write_text(json.dumps(data))
    o = opts("--backend", "openai-chat", "--dataset-name", "multi_turn", "--dataset-path", str(f),
             "--num-prompts", "2", "--disable-shuffle", "--sharegpt-output-len", "3", "--multi-turn-turns", "2",
             model=str(tiny_model))
    reqs, spans, _ = _requests(o)
    assert spans == [(0, 2), (2, 1)] and [r.prompt for r in reqs] == ["a b c", "d e", "g h"]
    assert {r.output_len for r in reqs} == {3}
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "d e"}]}).encode()
    history = [{"role": "user", "content": "a b c"}, {"role": "assistant", "content": "xy"}]
    assert json.loads(with_history(body, history))["messages"] == [*history, {"role": "user", "content": "d e"}]


def test_synthetic_sessions_have_the_asked_turns_and_lengths(tiny_model):
    from raysweep.bench.datasets import tokenizer_for
    from raysweep.bench.native import _requests

    o = opts("--backend", "openai-chat", "--dataset-name", "multi_turn", "--num-prompts", "3",
             "--multi-turn-turns", "2", "--random-input-len", "12", "--random-output-len", "5",
             "--random-prefix-len", "6", model=str(tiny_model))
    reqs, spans, _ = _requests(o)
    assert spans == [(0, 2), (2, 2), (4, 2)] and {r.output_len for r in reqs} == {5}
    tok = tokenizer_for(o)
    firsts = [reqs[a].prompt for a, _ in spans]
    assert len({p.split(" ")[0] for p in firsts}) == 1  # the shared opening (a system prompt)
    assert [len(tok(reqs[a + 1].prompt, add_special_tokens=False).input_ids) for a, _ in spans] == [12] * 3


def _session_samples() -> dict:
    """Two sessions of two turns, the second of session 1 failed; one request with reasoning."""
    s = stats.empty_samples()
    rows = [  # session, turn, begin, first, first_out, end, in_tok, ok
        (0, 0, 0.0, 0.10, 0.30, 0.5, 10, True), (0, 1, 0.6, 0.75, 0.75, 1.0, 25, True),
        (1, 0, 0.0, 0.20, 0.20, 0.6, 12, True), (1, 1, 0.7, math.nan, math.nan, 0.8, 30, False)]
    for i, (u, t, b, f, fo, e, n_in, ok) in enumerate(rows):
        for k, v in dict(index=i, actor=0, due=b, ready=b, sent=b, begin=b, first=f, first_out=fo, end=e, done=e,
                         in_tok=n_in, out_tok=4 if ok else -1, ok=ok, error=None if ok else "boom",
                         chunks=[f - b, (e - b) / 2 + (f - b) / 2, e - b] if ok else [], text=None,
                         reasoning=(i == 0), session=u, turn=t).items():
            s[k].append(v)
    return s


def test_per_turn_metrics_and_time_to_first_output_token():
    s = _session_samples()
    o = opts("--backend", "openai-chat", "--dataset-name", "multi_turn", "--max-concurrency", "2")
    r = stats.point_metrics(s, o)
    assert r["num_sessions"] == 2 and r["sessions_failed"] == 1 and r["mean_turns_per_session"] == 1.5
    t0, t1 = r["per_turn"]
    assert (t0["turn"], t0["requests"], t0["completed"], t1["completed"]) == (0, 2, 2, 1)
    assert t0["mean_input_tokens"] == 11 and t1["mean_input_tokens"] == 25
    assert t0["mean_ttft_ms"] == pytest.approx(150.0) and t1["mean_ttft_ms"] == pytest.approx(150.0)
    assert r["mean_ttft_ms"] == pytest.approx(150.0)
    assert r["mean_ttfot_ms"] == pytest.approx((300 + 150 + 200) / 3) and r["reasoning_requests"] == 1
    plain = stats.point_metrics(stats.pool([{k: v[2:3] for k, v in s.items()} | {"session": [-1], "turn": [-1]}]),
                                opts())
    assert "per_turn" not in plain and plain["mean_ttfot_ms"] == pytest.approx(plain["mean_ttft_ms"])


# -- time series and the steady-state window -------------------------------------------------------------------

def _ramp_samples(seed: int = 0) -> dict:
    """A closed loop that ramps up over 4 s, holds 12 s, then drains: one request ends every 0.1 s at the
    plateau."""
    rng = np.random.default_rng(seed)
    s = stats.empty_samples()
    begins = np.concatenate([np.sort(rng.uniform(0, 4, 20)), np.arange(4, 16, 0.1), np.sort(rng.uniform(16, 17, 5))])
    for i, b in enumerate(begins):
        e = b + 1.0
        for k, v in dict(index=i, actor=0, due=b, ready=b, sent=b, begin=b, first=b + 0.1, first_out=b + 0.1,
                         end=e, done=e, in_tok=8, out_tok=10, ok=True, error=None,
                         chunks=list(np.linspace(0.1, 1.0, 10)),
                         text=None, reasoning=False, session=-1, turn=-1).items():
            s[k].append(v)
    return s


def test_series_counts_every_token_and_the_in_flight_mean_is_exact():
    s = _ramp_samples()
    ts = timeseries.series(s, interval=0.5)
    width = np.diff(np.append(ts["t_s"], max(s["done"])))
    assert float(np.sum(ts["output_throughput"] * width)) == pytest.approx(10 * len(s["ok"]))
    assert float(np.sum(ts["request_throughput"] * width)) == pytest.approx(len(s["ok"]))
    b, d = np.asarray(s["begin"]), np.asarray(s["done"])
    grid = np.arange(6.0, 6.5, 1e-4) + 5e-5
    assert ts["in_flight"][12] == pytest.approx(np.mean([((b <= t) & (d > t)).sum() for t in grid]), abs=0.01)
    assert np.nanmax(ts["ttft_p99_ms"]) == pytest.approx(100.0)


def test_steady_window_leaves_out_the_ramp_and_the_drain():
    s = _ramp_samples()
    ts = timeseries.series(s, interval=1.0)
    a, b = timeseries.steady_window(ts["output_throughput"][:-1])
    assert 4 <= a <= 6 and 15 <= b <= 17
    f = timeseries.steady_fields(s, ts, 1.0)
    assert f["steady_window_start_s"] == a and f["steady_output_throughput"] == pytest.approx(100.0, rel=0.05)
    assert f["steady_request_throughput"] == pytest.approx(10.0, rel=0.05)
    assert f["steady_mean_ttft_ms"] == pytest.approx(100.0) and f["steady_requests"] > 0
    assert timeseries.steady_window(np.array([1.0, 10, 1, 10, 1, 10])) is None


def test_the_time_series_keeps_the_servers_gauges_by_bin(tmp_path):
    from raysweep.serve.metrics import _Sample

    s = _ramp_samples()
    scrapes = [_Sample(1000.0 + t, {"vllm:kv_cache_usage_perc": t / 20, "vllm:num_requests_running": 3.0})
               for t in np.arange(0.0, 17.0, 0.5)]
    ts = timeseries.series(s, scrapes, 1.0, start_wall=1000.0)
    assert ts["server_kv_cache_usage_perc"][2] == pytest.approx((2.0 + 2.5) / 2 / 20)
    assert set(ts["server_num_requests_running"][:17]) == {3.0}
    path = timeseries.write_timeseries(tmp_path / "run=0.timeseries.parquet", ts)
    back = timeseries.read_timeseries(path)
    assert set(back) == set(ts) and np.allclose(back["in_flight"], ts["in_flight"])
    fig = timeseries.figure(back, {"steady_window_start_s": 5.0, "steady_window_end_s": 15.0})
    assert len(fig.axes) >= 3
    # the twin axis (requests in flight) and its label stay clear of the next panel's label and ticks
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    twin = next(ax for ax in fig.axes if ax.get_ylabel() == "requests in flight")
    middle = next(ax for ax in fig.axes if ax.get_ylabel() == "ms")
    right_edge = max(twin.yaxis.label.get_window_extent(renderer).x1,
                     *(t.get_window_extent(renderer).x1 for t in twin.get_yticklabels() if t.get_text()))
    left_edge = min(middle.yaxis.label.get_window_extent(renderer).x0,
                    *(t.get_window_extent(renderer).x0 for t in middle.get_yticklabels() if t.get_text()))
    assert right_edge < left_edge, (right_edge, left_edge)


# -- the native client on Ray against the streaming stand-in ---------------------------------------------------

from test_native import _run, stream_server  # noqa: E402,F401 - the stand-in fixture and the point runner


@pytest.mark.ray
@pytest.mark.parametrize("stream_server", [["--ttft-delay", "0.02", "--itl-delay", "0.005"]], indirect=True)
def test_multi_turn_sessions_carry_the_conversation_in_order_across_actors(gpu_cluster, stream_server, tiny_model):
    from raysweep.bench.native import NativeBench

    nb = NativeBench(cpus=0.5)
    try:
        out = _run(nb, ["--backend", "openai-chat", "--tokenizer", str(tiny_model), "--dataset-name", "multi_turn",
                        "--num-prompts", "3", "--multi-turn-turns", "3", "--random-input-len", "6",
                        "--random-output-len", "4", "--max-concurrency", "2", "--multi-turn-think-time", "0.05"],
                   stream_server, clients=2)
    finally:
        nb.close()
    r, s = out["result"], out["samples"]
    assert r["completed"] == 9 and r["num_sessions"] == 3 and r["sessions_failed"] == 0, r.get("errors_sample")
    assert len(set(s["actor"])) == 2 and [row["completed"] for row in r["per_turn"]] == [3, 3, 3]
    for u in range(3):
        turns = sorted((t, b, d, n) for t, b, d, n, sess in zip(s["turn"], s["begin"], s["done"], s["in_tok"],
                                                                 s["session"]) if sess == u)
        assert [t for t, *_ in turns] == [0, 1, 2]
        for (_, _, done, n_in), (_, begin, _, n_next) in zip(turns, turns[1:]):
            assert begin >= done + 0.05 - 0.002  # in order, after the think time (asyncio timers may fire
            # up to the loop's clock resolution early)
            assert n_next > n_in + 1  # the conversation so far: earlier messages and the answer ("xxxx")
    means = [row["mean_input_tokens"] for row in r["per_turn"]]
    assert means == sorted(means) and r["multi_turn_think_time_s"] == 0.05


@pytest.mark.ray
@pytest.mark.parametrize("stream_server", [["--reasoning-chunks", "3", "--itl-delay", "0.01"]], indirect=True)
def test_reasoning_content_delays_the_first_output_token_not_the_first_token(gpu_cluster, stream_server,
                                                                             tiny_model):
    from raysweep.bench.native import NativeBench

    nb = NativeBench(cpus=0.5)
    try:
        out = _run(nb, ["--backend", "openai-chat", "--tokenizer", str(tiny_model), "--num-prompts", "4",
                        "--random-input-len", "8", "--random-output-len", "6", "--max-concurrency", "2"],
                   stream_server)
    finally:
        nb.close()
    r, s = out["result"], out["samples"]
    assert r["completed"] == 4 and r["reasoning_requests"] == 4
    ttfot = [1000 * (fo - b) for fo, b in zip(s["first_out"], s["begin"])]
    gaps = [1000 * (c[3] - c[0]) for c in s["chunks"]]  # three reasoning chunks come before the output
    assert r["mean_ttfot_ms"] == pytest.approx(float(np.mean(ttfot)))
    assert all(t - 1000 * (f - b) == pytest.approx(g) for t, f, b, g in zip(ttfot, s["first"], s["begin"], gaps))


@pytest.mark.ray
@pytest.mark.parametrize("stream_server", [["--ttft-delay", "0.03", "--itl-delay", "0.005"]], indirect=True)
def test_a_duration_bounded_closed_loop_cycles_its_prompts_until_the_time_is_over(gpu_cluster, stream_server):
    from raysweep.bench.native import NativeBench

    nb = NativeBench(cpus=0.5)
    try:
        out = _run(nb, ["--num-prompts", "3", "--random-input-len", "8", "--random-output-len", "4",
                        "--max-concurrency", "2", "--duration", "1.2"], stream_server)
    finally:
        nb.close()
    r, s = out["result"], out["samples"]
    assert r["completed"] > 3 and r["failed"] == 0 and r["duration_limit_s"] == 1.2
    assert max(s["begin"]) < 1.2 and len(set(s["index"])) == len(s["index"])
    assert r["total_input_tokens"] == 8 * r["completed"] and r["num_prompts"] == 3


@pytest.mark.ray
@pytest.mark.parametrize("stream_server", [["--ttft-delay", "0.01"]], indirect=True)
def test_a_trace_is_replayed_on_its_timeline_sped_up(gpu_cluster, stream_server, tmp_path):
    from raysweep.bench.native import NativeBench

    rows = [{"timestamp": 200 * i, "input_length": 20, "output_length": 3, "hash_ids": [1, i]} for i in range(6)]
    f = _trace(tmp_path / "trace.jsonl", rows)
    nb = NativeBench(cpus=0.5)
    try:
        out = _run(nb, ["--dataset-name", "timed_trace", "--dataset-path", str(f), "--trace-format", "mooncake",
                        "--timed-trace-chunk-hash-size", "10", "--trace-speedup", "2"], stream_server)
    finally:
        nb.close()
    r, s = out["result"], out["samples"]
    assert r["completed"] == 6 and r["trace_speedup"] == 2 and r["total_input_tokens"] == 120
    assert sorted(s["due"]) == pytest.approx([0.1 * i for i in range(6)])
    assert r["asked_request_rate"] == pytest.approx(6 / 0.5) and "client_late_sends" in r


@pytest.mark.ray
def test_a_campaign_stores_time_series_and_the_report_draws_them(gpu_cluster, tmp_path):
    from helpers import native_campaign, run_file

    from raysweep.report.page import build_report
    from raysweep.results.table import results_table

    # Each request lasts about 0.13 s, so at 30 req/s about four are running at any time: every 0.5-s bin's
    # mean of the running-requests gauge is well above one even when the machine is loaded (a 0.02-s request
    # left the mean near 0.6 and the check to chance).
    f = native_campaign(tmp_path, server_args="--ttft-delay 0.01 --itl-delay 0.02",
                        bench_args="--random-output-len 6 --request-rate 30 --duration 3 --timeseries-interval 0.5",
                        bench_params={"grid": {"random_input_len": [16]}},
                        bench={"client_cpus": 0.5, "metrics_interval_s": 0.2})
    summary, out = run_file(f)
    assert summary.counts["done"] == 1, summary.failures
    df = results_table(CampaignDir(out))
    row = df.iloc[0]
    assert row["num_prompts"] == 90 and row["completed"] == 90 and row["timeseries_interval_s"] == 0.5
    ts = timeseries.read_timeseries(out / row["timeseries_path"])
    assert ts["t_s"][1] == 0.5 and np.nanmax(ts["server_num_requests_running"]) >= 1
    width = np.diff(np.append(ts["t_s"], row["duration"]))
    assert float(np.sum(ts["request_throughput"] * width)) == pytest.approx(90)
    assert "steady_window_start_s" in df.columns
    page = build_report(CampaignDir(out))
    section = page[page.index('<section id="timeseries">'):]
    assert "data:image/png;base64," in section[:section.index("</section>")]


# -- real vLLM (the shared server: tiny model with a chat template) --------------------------------------------

@pytest.mark.ray
@pytest.mark.vllm
def test_real_server_runs_sessions_a_trace_and_a_duration_point(gpu_cluster, vllm_server, tmp_path):
    """Multi-turn with the tiny model's chat template (the prefix cache serves the later turns), a small
    trace with shared blocks, and a duration-bounded closed loop, each with its time series."""
    from raysweep.bench.native import NativeBench
    from raysweep.serve import metrics
    from raysweep.serve.server import reset_caches

    url, model = vllm_server["url"], vllm_server["model"]
    trace = _trace(tmp_path / "trace.jsonl", [{"timestamp": 0.1 * i, "input_length": 48, "output_length": 4,
                                               "hash_ids": [1, 2, 3 + i]} for i in range(4)])
    points = {
        "sessions": ["--backend", "openai-chat", "--dataset-name", "multi_turn", "--num-prompts", "2",
                     "--multi-turn-turns", "3", "--random-input-len", "150", "--random-output-len", "4",
                     "--max-concurrency", "2", "--ignore-eos"],
        "trace": ["--dataset-name", "timed_trace", "--dataset-path", str(trace), "--ignore-eos"],
        # the server's gauges are only sampled here: with the tiny model its API process, not the engine, is the
        # bottleneck, so its running-requests gauge can read 0 for a whole short point while 8 are in flight
        "duration": ["--random-input-len", "16", "--random-output-len", "16", "--max-concurrency", "8",
                     "--num-prompts", "4", "--duration", "2", "--timeseries-interval", "0.5"],
    }
    nb = NativeBench(cpus=0.5)
    results = {}
    try:
        for name, argv in points.items():
            reset_caches(url)  # each point starts cold, as between the points of a campaign
            scraper = metrics.Scraper(url, 0.2).start()
            try:
                out = _run(nb, argv, url, model=model)
            finally:
                scraper.stop()
            out["result"].update(scraper.summary((out["result"]["start_time"], out["result"]["end_time"])))
            timeseries.attach(out, scraper.samples)
            out["scrapes"] = scraper.samples
            results[name] = out
    finally:
        nb.close()
    r = results["sessions"]["result"]
    assert r["completed"] == 6 and r["num_sessions"] == 2, r.get("errors_sample")
    turns = r["per_turn"]
    assert turns[0]["mean_input_tokens"] < turns[1]["mean_input_tokens"] < turns[2]["mean_input_tokens"]
    assert r["server_prefix_cache_hit_rate"] > 0  # later turns reuse the conversation's full blocks
    r = results["trace"]["result"]
    assert r["completed"] == 4 and r["total_input_tokens"] == 4 * 48, r.get("errors_sample")
    r, out = results["duration"]["result"], results["duration"]
    assert r["completed"] > 4 and max(out["samples"]["begin"]) < 2.0
    ts = out["timeseries"]
    assert ts["t_s"].size >= 4
    # each bin holds the mean of the real server's gauge samples taken in it, on the point's own clock
    gauge, col = "vllm:num_requests_running", ts["server_num_requests_running"]
    taken: dict[int, list[float]] = {}
    for sc in out["scrapes"]:
        t = sc.at - r["start_time"]
        if 0 <= t < ts["t_s"][-1] + 0.5 and gauge in sc.values:
            taken.setdefault(int(t // 0.5), []).append(sc.values[gauge])
    assert len(taken) >= 2 and np.isfinite(col).sum() == len(taken), (taken, col)
    assert all(col[i] == pytest.approx(np.mean(v)) for i, v in taken.items())
    # and the server's counters cover the point's window: it generated what the client received
    assert r["server_generation_tokens"] == r["total_output_tokens"]
    assert timeseries.figure(ts, r) is not None


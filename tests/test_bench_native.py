"""The native client's pure parts: load options, data sets, arrival processes, pooled metrics, the
client-bottleneck guard and the /metrics parser. No Ray, no server."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raysweep import metrics
from raysweep.bench import arrivals, stats
from raysweep.bench.datasets import make_requests, payload, vocab_size
from raysweep.bench.options import LoadOptions, parse_load_options
from raysweep.errors import CampaignError


def opts(*flags: str) -> LoadOptions:
    return parse_load_options(["vllm", "bench", "serve", "--model", "m", *flags])


# -- options ---------------------------------------------------------------------------------------

def test_options_follow_vllm_bench_serve_defaults_and_spellings():
    o = opts()
    assert (o.dataset_name, o.num_prompts, o.random_input_len, o.random_output_len) == ("random", 1000, 1024, 128)
    assert math.isinf(o.request_rate) and o.burstiness == 1.0 and o.max_concurrency is None
    assert o.ignore_eos and o.path == "/v1/completions" and not o.chat
    assert o.metric_percentiles == (50.0, 90.0, 95.0, 99.0)
    o = parse_load_options(["--model", "m", "--random_input_len", "64", "--output-len", "7", "--metric-percentiles",
                            "99.9", "--goodput", "ttft:100", "e2el:500", "--backend", "openai-chat",
                            "--temperature", "0", "--header", "X-A=1", "--extra-body", '{"min_tokens": 7}',
                            "--save-result", "--result-dir", "/x"])
    assert o.random_input_len == 64 and o.random_output_len == 7 and 99.9 in o.metric_percentiles
    assert o.goodput == {"ttft": 100.0, "e2el": 500.0} and o.chat and o.sampling == {"temperature": 0.0}
    assert o.headers == {"X-A": "1"} and o.extra_body == {"min_tokens": 7}
    assert parse_load_options(["--model", "m", "--dataset-name", "prefix"]).dataset_name == "prefix_repetition"


@pytest.mark.parametrize("flags, words", [
    (["--num-warmups", "3"], ["unrecognized", "--num-warmups", "--random-input-len"]),
    (["--request-rate", "0"], ["--request-rate", "positive"]),
    (["--burstiness", "-1"], ["--burstiness"]),
    (["--goodput", "latency:5"], ["--goodput", "ttft, tpot, e2el"]),
    (["--random-range-ratio", "1.5"], ["--random-range-ratio", "[0, 1)"]),
    (["--ramp-up-strategy", "linear", "--request-rate", "5"], ["exclude each other"]),
    (["--ramp-up-strategy", "linear"], ["--ramp-up-start-rps"]),
    (["--dataset-name", "sharegpt"], ["--dataset-path", "required"]),
    (["--dataset-name", "hf"], ["--dataset-name", "invalid choice"]),
    (["--extra-body", "[1]"], ["--extra-body", "JSON object"]),
    (["--max-concurrency", "0"], ["--max-concurrency", "at least 1"]),
])
def test_bad_options_are_refused_naming_the_option(flags, words):
    with pytest.raises(CampaignError) as e:
        parse_load_options(["--model", "m", *flags], "bench.params[3]")
    assert e.value.field == "bench.params[3]"
    for w in words:
        assert w in str(e.value)


def test_another_program_is_refused_with_the_way_out():
    with pytest.raises(CampaignError) as e:
        parse_load_options(["python", "mybench.py", "--model", "m"])
    assert "bench.backend: command" in str(e.value) and "'python mybench.py'" in str(e.value)


def test_campaign_refuses_a_bad_native_point_at_load_time(tmp_path):
    from raysweep.campaign import campaign_from_dict

    data = {"name": "n", "serve": {"cmd": "vllm serve m"},
            "bench": {"cmd": "vllm bench serve --model m", "params": [{"max_concurrency": 4},
                                                                     {"request_rate": -2}]}}
    with pytest.raises(CampaignError) as e:
        campaign_from_dict(data, base_dir=tmp_path, env={})
    assert e.value.field == "bench.params[1]" and "--request-rate" in str(e.value)
    data["bench"]["params"] = [{"dataset_name": "sharegpt", "dataset_path": str(tmp_path / "nope.json")}]
    with pytest.raises(CampaignError, match="not a file"):
        campaign_from_dict(data, base_dir=tmp_path, env={})
    data["bench"] = {"backend": "command"}
    with pytest.raises(CampaignError, match="bench"):
        campaign_from_dict(data, base_dir=tmp_path, env={})
    spec = campaign_from_dict({"name": "n", "serve": {"cmd": "vllm serve m"}, "bench": {}}, base_dir=tmp_path, env={})
    assert spec.bench_argv == ["vllm", "bench", "serve"] and spec.campaign.bench.backend == "native"


# -- data sets -------------------------------------------------------------------------------------

def test_random_prompts_have_exact_lengths_inside_the_vocabulary(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 512}))
    o = parse_load_options(["--model", str(tmp_path), "--num-prompts", "50", "--random-input-len", "20",
                            "--random-output-len", "6", "--random-prefix-len", "5"])
    assert vocab_size(o) == 512
    reqs = make_requests(o)
    assert len(reqs) == 50 and {len(r.prompt) for r in reqs} == {25} and {r.output_len for r in reqs} == {6}
    ids = np.concatenate([r.prompt for r in reqs])
    assert ids.min() >= 4 and ids.max() < 512
    assert len({tuple(r.prompt[:5]) for r in reqs}) == 1 and len({tuple(r.prompt[5:]) for r in reqs}) == 50
    ranged = make_requests(o.__class__(**{**o.__dict__, "random_range_ratio": 0.5, "random_prefix_len": 0}))
    lens = [len(r.prompt) for r in ranged]
    assert min(lens) >= 10 and max(lens) <= 30 and len(set(lens)) > 5
    assert make_requests(o) == reqs  # the seed makes the same requests again
    body = json.loads(payload(reqs[0], o, "served"))
    assert body["prompt"] == reqs[0].prompt and body["max_tokens"] == 6 and body["ignore_eos"] is True
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True} and body["model"] == "served"


def test_prefix_repetition_repeats_few_long_prefixes():
    o = opts("--dataset-name", "prefix", "--num-prompts", "40", "--prefix-repetition-prefix-len", "30",
             "--prefix-repetition-suffix-len", "4", "--prefix-repetition-num-prefixes", "4",
             "--prefix-repetition-output-len", "3")
    reqs = make_requests(o)
    prefixes = [tuple(r.prompt[:30]) for r in reqs]
    assert len(reqs) == 40 and len(set(prefixes)) == 4 and all(prefixes.count(p) == 10 for p in set(prefixes))
    assert {len(r.prompt) for r in reqs} == {34} and {r.output_len for r in reqs} == {3}
    dup = make_requests(opts("--dataset-name", "prefix", "--num-prompts", "6", "--prefix-repetition-num-prefixes", "1",
                             "--prefix-repetition-suffix-len", "0", "--prefix-repetition-prefix-len", "8"))
    assert len({tuple(r.prompt) for r in dup}) == 1  # fully duplicated prompts


def test_sharegpt_jsonl_and_hook_data_sets(tmp_path):
    share = tmp_path / "share.json"
    share.write_text(json.dumps([{"conversations": [{"from": "human", "value": f"question {i} " * 5},
                                                    {"from": "gpt", "value": "answer " * (i + 4)}]}
                                 for i in range(6)] + [{"conversations": [{"from": "human", "value": "alone"}]}]))
    reqs = make_requests(opts("--dataset-name", "sharegpt", "--dataset-path", str(share), "--num-prompts", "9"))
    assert len(reqs) == 9 and all(isinstance(r.prompt, str) and r.prompt.startswith("question") for r in reqs)
    assert all(r.output_len >= 4 for r in reqs)  # no tokenizer for model "m": about 4 characters per token
    fixed = make_requests(opts("--dataset-name", "sharegpt", "--dataset-path", str(share), "--sharegpt-output-len",
                               "11", "--num-prompts", "3"))
    assert {r.output_len for r in fixed} == {11}

    lines = tmp_path / "p.jsonl"
    lines.write_text('{"prompt": "hello there", "output_tokens": 3}\n\n{"prompt": [5, 6, 7], "output_tokens": 9}\n')
    reqs = make_requests(opts("--dataset-name", "jsonl", "--dataset-path", str(lines), "--num-prompts", "4"))
    assert [(r.prompt, r.output_len) for r in reqs] == [("hello there", 3), ([5, 6, 7], 9)] * 2
    reqs = make_requests(opts("--dataset-name", "custom", "--dataset-path", str(lines), "--num-prompts", "2"))
    assert {r.output_len for r in reqs} == {256}  # vLLM's custom set: --custom-output-len unless -1

    hook = tmp_path / "hook.py"
    hook.write_text("def make(num_prompts, seed):\n"
                    "    return [{'prompt': 'p%d' % i, 'output_len': 2 + i} for i in range(num_prompts)]\n")
    reqs = make_requests(opts("--dataset-name", "custom", "--dataset-path", f"{hook}:make", "--num-prompts", "3"))
    assert [(r.prompt, r.output_len) for r in reqs] == [("p0", 2), ("p1", 3), ("p2", 4)]
    with pytest.raises(CampaignError, match="no function 'nope'"):
        make_requests(opts("--dataset-name", "custom", "--dataset-path", f"{hook}:nope"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "x"}\n')
    with pytest.raises(CampaignError, match="line 1 needs a \"prompt\""):
        make_requests(opts("--dataset-name", "jsonl", "--dataset-path", str(bad)))


def test_chat_needs_text_prompts():
    with pytest.raises(CampaignError, match="chat API takes text"):
        make_requests(opts("--backend", "openai-chat", "--num-prompts", "2"))


# -- arrivals --------------------------------------------------------------------------------------

def test_infinite_rate_sends_everything_at_once():
    assert not arrivals.due_times(50, opts()).any()


@pytest.mark.parametrize("burstiness, cv", [(1.0, 1.0), (4.0, 0.5), (0.25, 2.0)])
def test_gamma_arrivals_have_the_asked_rate_and_burstiness(burstiness, cv):
    o = opts("--request-rate", "40", "--burstiness", str(burstiness), "--seed", "3")
    t = arrivals.due_times(20000, o)
    assert t[-1] == pytest.approx(20000 / 40)  # rescaled: the last request is due at N/rate
    gaps = np.diff(t)
    assert (gaps >= 0).all() and np.mean(gaps) == pytest.approx(1 / 40, rel=0.02)
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(cv, rel=0.1)  # gamma: CV = 1/sqrt(shape)


def test_constant_spacing_and_ramp_up():
    t = arrivals.due_times(10, opts("--request-rate", "5", "--burstiness", "inf"))
    assert np.allclose(np.diff(t), 0.2) and t[-1] == pytest.approx(2.0)
    o = opts("--ramp-up-strategy", "linear", "--ramp-up-start-rps", "10", "--ramp-up-end-rps", "100", "--seed", "1")
    t = arrivals.due_times(4000, o)
    first, last = np.diff(t[:400]).mean(), np.diff(t[-400:]).mean()
    assert first > 4 * last and arrivals.asked_rate(o) == pytest.approx(55)


# -- metrics from pooled samples -------------------------------------------------------------------

def _samples(rng: np.random.Generator, n: int) -> dict:
    s = stats.empty_samples()
    for i in range(n):
        due = float(rng.uniform(0, 2))
        sent = due + float(rng.uniform(0, 0.002))
        k = int(rng.integers(1, 6))
        chunks = np.cumsum(rng.uniform(0.001, 0.05, size=k)).tolist()
        ok = bool(rng.random() > 0.1)
        s["index"].append(i)
        s["actor"].append(0)
        s["due"].append(due)
        s["ready"].append(due)
        s["sent"].append(sent)
        s["begin"].append(sent)
        s["first"].append(sent + chunks[0] if ok else math.nan)
        s["end"].append(sent + chunks[-1] + 0.001)
        s["in_tok"].append(int(rng.integers(1, 100)))
        s["out_tok"].append(k if ok else 0)
        s["ok"].append(ok)
        s["error"].append(None if ok else "HTTP 500: boom")
        s["chunks"].append(chunks if ok else [])
    s["loop_lag"] = rng.uniform(0, 0.001, size=20).tolist()
    return s


def _split(s: dict, owner: list[int], k: int) -> list[dict]:
    parts = [stats.empty_samples() for _ in range(k)]
    for i, a in enumerate(owner):
        for col in stats.COLUMNS:
            parts[a][col].append(s[col][i])
    for a in range(k):
        parts[a]["loop_lag"] = s["loop_lag"][a::k]
    return parts


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 120), k=st.integers(1, 6), data=st.data())
def test_merging_actors_is_exactly_the_pooled_computation(seed, n, k, data):
    """Split any sample set across k actors in any way; the merged metrics equal the pooled ones."""
    s = _samples(np.random.default_rng(seed), n)
    owner = data.draw(st.lists(st.integers(0, k - 1), min_size=n, max_size=n))
    o = opts("--goodput", "ttft:20", "tpot:30", "--metric-percentiles", "50,90,99,99.9", "--max-concurrency", "8")
    merged = stats.point_metrics(stats.pool(_split(s, owner, k)), o)
    whole = stats.point_metrics(s, o)
    assert merged.keys() == whole.keys()
    for key, value in whole.items():
        assert merged[key] == pytest.approx(value, rel=1e-12, abs=1e-12) if isinstance(value, float) \
            else merged[key] == value, key


def test_metrics_on_known_samples():
    s = stats.empty_samples()
    # request 0: sent at 0, chunks at +10, +30, +60 ms (3 tokens); request 1: sent at 5 ms, one chunk at +20 ms
    for i, (sent, chunks, out) in enumerate([(0.0, [0.010, 0.030, 0.060], 3), (0.005, [0.020], 1)]):
        for col, v in zip(stats.COLUMNS, (i, 0, sent, sent, sent, sent + chunks[0], sent + chunks[-1], 10, out,
                                          True, None, chunks)):
            s[col].append(v)
    m = stats.point_metrics(s, opts("--goodput", "ttft:15"))
    assert m["completed"] == 2 and m["failed"] == 0 and m["duration"] == pytest.approx(0.060)
    assert m["total_input_tokens"] == 20 and m["total_output_tokens"] == 4
    assert m["mean_ttft_ms"] == pytest.approx(15.0) and m["p99_ttft_ms"] == pytest.approx(19.9)
    assert m["mean_tpot_ms"] == pytest.approx(25.0)          # (60 - 10) / (3 - 1); 1-token output excluded
    assert m["median_itl_ms"] == pytest.approx(25.0)         # gaps 20 and 30 ms
    assert m["mean_e2el_ms"] == pytest.approx(40.0)
    assert m["request_throughput"] == pytest.approx(2 / 0.060)
    assert m["request_goodput"] == pytest.approx(1 / 0.060)  # only request 0 has TTFT <= 15 ms
    assert m["max_concurrent_requests"] == 2


def test_peak_in_flight_is_exact():
    assert stats.peak_in_flight(np.array([0, 1, 2, 10.0]), np.array([1, 2, 3, 11.0])) == 1  # back to back
    assert stats.peak_in_flight(np.array([0, 0.5, 0.6]), np.array([1, 1, 1.0])) == 3


def test_client_check_flags_a_client_that_fell_behind():
    o = opts("--request-rate", "100")
    s = stats.empty_samples()
    due = arrivals.due_times(100, o)
    s["due"], s["ready"], s["sent"] = due.tolist(), due.tolist(), (due + 0.0005).tolist()
    s["begin"] = s["sent"]
    fine = stats.client_check(s, o, 100.0)
    assert not fine["client_limited"] and fine["achieved_request_rate"] == pytest.approx(100, rel=0.01)
    s["sent"] = s["begin"] = (due * 1.2).tolist()   # the client sent over 1.2x the span: 83 req/s
    slow = stats.client_check(s, o, 100.0)
    assert slow["client_limited"] and "req/s of the 100 asked" in slow["client_limited_reason"]
    closed = opts("--max-concurrency", "4")
    s["due"] = s["ready"] = [0.0] * 100
    s["sent"] = s["begin"] = [0.02] * 100          # 20 ms between a free slot and the send
    assert "send lag p99" in stats.client_check(s, closed, math.inf)["client_limited_reason"]
    assert not stats.client_check(s, opts(), math.inf)["client_limited"]  # a pure burst is not judged on lag
    s["sent"] = s["begin"] = [0.0005] * 99 + [0.03]   # one hiccup is not a client that falls behind
    assert not stats.client_check(s, closed, math.inf)["client_limited"]
    s["begin"], s["sent"] = [0.0005] * 100, [0.03] * 100  # opening connections is not the client falling behind
    assert not stats.client_check(s, closed, math.inf)["client_limited"]


# -- server /metrics -------------------------------------------------------------------------------

VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="m"} 4.0
vllm:num_preemptions_total{engine="1",model_name="m"} 1.0
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 1000.0
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 800.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 200.0
# TYPE vllm:request_success counter
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 7.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 3.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="m"} 0.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 10.0
"""


def test_metrics_parser_combines_engines():
    v = metrics.parse_metrics(VLLM_METRICS)
    assert v["vllm:num_requests_running"] == 5 and v["vllm:num_requests_waiting"] == 1
    assert v["vllm:kv_cache_usage_perc"] == 0.5        # the fullest engine
    assert v["vllm:num_preemptions"] == 5 and v["vllm:request_success"] == 10 and v["vllm:prompt_tokens"] == 1000


def test_metrics_summary_over_the_window_and_counter_deltas():
    S = metrics._Sample
    samples = [S(0.0, {"vllm:kv_cache_usage_perc": 0.0, "vllm:num_preemptions": 2, "vllm:prompt_tokens": 100,
                       "vllm:prefix_cache_queries": 0, "vllm:prefix_cache_hits": 0}),
               S(1.0, {"vllm:kv_cache_usage_perc": 0.4, "vllm:num_requests_running": 8}),
               S(2.0, {"vllm:kv_cache_usage_perc": 0.8, "vllm:num_requests_running": 16}),
               S(9.0, {"vllm:kv_cache_usage_perc": 0.1, "vllm:num_preemptions": 5, "vllm:prompt_tokens": 600,
                       "vllm:prefix_cache_queries": 500, "vllm:prefix_cache_hits": 100})]
    out = metrics.summarize(samples, [], (0.5, 2.5))
    assert out["server_kv_cache_usage_perc_peak"] == 0.8 and out["server_kv_cache_usage_perc_mean"] == pytest.approx(0.6)
    assert out["server_num_requests_running_peak"] == 16 and out["server_num_preemptions"] == 3
    assert out["server_prompt_tokens"] == 500 and out["server_prefix_cache_hit_rate"] == pytest.approx(0.2)
    failed = metrics.summarize([], ["URLError: refused"], None)
    assert failed == {"server_metrics_samples": 0, "server_metrics_error": "URLError: refused"}

"""The native client's pure parts: load options, data sets, arrival processes, pooled metrics, the
client-bottleneck guard and the /metrics parser. No Ray, no server."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raysweep.bench import arrivals, stats
from raysweep.bench.datasets import make_requests, payload, vocab_size
from raysweep.bench.options import LoadOptions, parse_load_options
from raysweep.errors import CampaignError
from raysweep.serve import metrics


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
    (["--num-warmups", "3"], ["--num-warmups", "warmup", "bench.backend: command"]),
    (["--bogus-flag", "3"], ["--bogus-flag: not an option of the native client", "options accepted"]),
    (["--max-concurency", "3"], ["did you mean --max-concurrency"]),
    (["--request-rate", "0"], ["--request-rate", "positive"]),
    (["--burstiness", "-1"], ["--burstiness"]),
    (["--goodput", "latency:5"], ["--goodput", "ttft, tpot, e2el"]),
    (["--random-range-ratio", "1.5"], ["--random-range-ratio", "[0, 1)"]),
    (["--ramp-up-strategy", "linear", "--request-rate", "5"], ["exclude each other"]),
    (["--ramp-up-strategy", "linear"], ["--ramp-up-start-rps"]),
    (["--dataset-name", "sharegpt"], ["--dataset-path", "required"]),
    (["--dataset-name", "hf"], ["--dataset-name hf", "bench.backend: command"]),
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
    # a shared prefix, then runs of consecutive ids from random offsets (vLLM's; offsets may repeat)
    assert len({tuple(r.prompt[:5]) for r in reqs}) == 1 and len({tuple(r.prompt[5:]) for r in reqs}) > 40
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
    with pytest.raises(CampaignError, match="needs the model's tokenizer"):  # vLLM's length filter needs it
        make_requests(opts("--dataset-name", "sharegpt", "--dataset-path", str(share), "--num-prompts", "9"))

    lines = tmp_path / "p.jsonl"
    lines.write_text('{"prompt": "hello there", "output_tokens": 3}\n\n{"prompt": [5, 6, 7], "output_tokens": 9}\n')
    reqs = make_requests(opts("--dataset-name", "jsonl", "--dataset-path", str(lines), "--num-prompts", "4"))
    got = [(r.prompt, r.output_len) for r in reqs]  # the file, then seeded random picks of it (vLLM's oversampling)
    assert len(got) == 4 and got[:2] == [("hello there", 3), ([5, 6, 7], 9)] and all(g in got[:2] for g in got[2:])
    reqs = make_requests(opts("--dataset-name", "custom", "--dataset-path", str(lines), "--num-prompts", "2",
                              "--skip-chat-template"))
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
    assert first > 4 * last


@pytest.mark.parametrize("ramp, start, end, runs_at", [("linear", 1, 10, 9 / math.log(10)),
                                                       ("exponential", 2, 50, 2 * 50 * math.log(25) / 48)])
def test_a_ramp_asks_for_the_rate_it_schedules(ramp, start, end, runs_at):
    """A linear 1 to 10 ramp runs at 3.91 req/s (N over the span of its due times), not at 5.5."""
    o = opts("--ramp-up-strategy", ramp, "--ramp-up-start-rps", str(start), "--ramp-up-end-rps", str(end),
             "--burstiness", "inf", "--num-prompts", "2000")
    t = arrivals.due_times(2000, o)
    assert arrivals.asked_rate(o, t) == pytest.approx(2000 / t[-1])
    assert arrivals.asked_rate(o, t) == pytest.approx(runs_at, rel=0.01)
    assert arrivals.asked_rate(o) == pytest.approx(runs_at, rel=0.01)   # before the schedule is drawn


@pytest.mark.parametrize("flags, words", [
    (["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "0", "--ramp-up-end-rps", "10"],
     ["--ramp-up-start-rps", "above 0"]),
    (["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "20", "--ramp-up-end-rps", "10"],
     ["--ramp-up-start-rps", "--ramp-up-end-rps"]),
    (["--ramp-up-strategy", "exponential", "--ramp-up-start-rps", "0", "--ramp-up-end-rps", "10"],
     ["--ramp-up-strategy", "positive"]),
])
def test_ramps_vllm_refuses_are_refused(flags, words):
    """vLLM refuses start > end and an exponential ramp from 0; a linear ramp from 0 fails its scheduler's
    assertion (the first request's rate is 0): all three are refused here, naming the option."""
    with pytest.raises(CampaignError) as e:
        parse_load_options(["--model", "m", *flags])
    for w in words:
        assert w in str(e.value)


# -- metrics from pooled samples -------------------------------------------------------------------

def _samples(rng: np.random.Generator, n: int, t0: float = 0.0) -> dict:
    s = stats.empty_samples()
    for i in range(n):
        due = t0 + float(rng.uniform(0, 2))
        begin = due + float(rng.uniform(0, 0.002))
        sent = begin + float(rng.uniform(0, 0.003))
        k = int(rng.integers(1, 6))
        chunks = (begin - sent + np.cumsum(rng.uniform(0.004, 0.05, size=k)) + sent - begin).tolist()
        ok = bool(rng.random() > 0.1)
        values = dict(index=i, actor=0, due=due, ready=due, sent=sent, begin=begin,
                      first=begin + chunks[0] if ok else math.nan, end=begin + chunks[-1] if ok else begin + 0.001,
                      done=begin + chunks[-1] + 0.002, in_tok=int(rng.integers(1, 100)),
                      out_tok=int(rng.integers(k, 3 * k)) if ok else -1, ok=ok,
                      error=None if ok else "HTTP 500: boom", chunks=chunks if ok else [], text=None)
        for col in stats.COLUMNS:
            s[col].append(values[col])
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


def _reference(parts: list[dict], pcts: tuple[float, ...]) -> dict:
    """vLLM's formulas written out again on the plain concatenation of every actor's lists."""
    cat = {c: [v for p in parts for v in p[c]] for c in stats.COLUMNS}
    good = [i for i, ok in enumerate(cat["ok"]) if ok]
    ttft = np.array([cat["first"][i] - cat["begin"][i] for i in good])
    e2el = np.array([cat["end"][i] - cat["begin"][i] for i in good])
    outs = np.array([cat["out_tok"][i] for i in good])
    itl = np.array([b - a for i in good for a, b in zip(cat["chunks"][i], cat["chunks"][i][1:])])
    tpot = np.array([(e - t) / (o - 1) for e, t, o in zip(e2el, ttft, outs) if o > 1])
    ref = {"duration": max(cat["done"]), "completed": len(good)}
    for name, v in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el)):
        for p in pcts:
            ref[f"p{p:g}_{name}_ms"] = float(np.percentile(v * 1000, p)) if v.size else 0.0
        ref[f"mean_{name}_ms"] = float(np.mean(v * 1000)) if v.size else 0.0
    ref["output_throughput"] = float(outs.sum()) / ref["duration"]
    ref["request_throughput"] = len(good) / ref["duration"]
    return ref


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), sizes=st.lists(st.integers(0, 40), min_size=1, max_size=6),
       shifts=st.lists(st.floats(0, 3), min_size=6, max_size=6))
def test_merged_actors_match_an_independent_reference(seed, sizes, shifts):
    """Actors of uneven sizes whose windows overlap (each starts at its own shift): the merged percentiles,
    duration and throughputs equal numpy's on the concatenation of their samples."""
    rng = np.random.default_rng(seed)
    parts = [_samples(rng, n, t0=shift) for n, shift in zip(sizes, shifts)]
    if not any(sizes):
        return
    pcts = (50.0, 90.0, 99.0, 99.9)
    o = opts("--metric-percentiles", "50,90,99,99.9")
    merged = stats.point_metrics(stats.pool(parts), o)
    for key, value in _reference(parts, pcts).items():
        assert merged[key] == pytest.approx(value, rel=1e-9, abs=1e-9), key


@settings(max_examples=40, deadline=None)
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


def _known(rows: list[dict]) -> dict:
    s = stats.empty_samples()
    for i, r in enumerate(rows):
        begin, chunks = r["begin"], r.get("chunks", [])
        values = dict(index=i, actor=0, due=r.get("due", 0.0), ready=r.get("due", 0.0), begin=begin,
                      sent=r.get("sent", begin), first=begin + chunks[0] if chunks else math.nan,
                      end=begin + chunks[-1] if chunks else begin, done=r.get("done", begin + (chunks or [0])[-1]),
                      in_tok=r.get("in_tok", 10), out_tok=r.get("out", len(chunks)), ok=r.get("ok", True),
                      error=r.get("error"), chunks=chunks, text=r.get("text"))
        for col in stats.COLUMNS:
            s[col].append(values[col])
    return s


def test_metrics_on_known_samples():
    # request 0: begun at 0.1, on the wire 4 ms later, chunks at +10, +30, +60 ms (3 tokens), its stream done
    # 200 ms after its last token; request 1: begun at 0.105, one chunk at +20 ms
    s = _known([dict(begin=0.1, sent=0.104, chunks=[0.010, 0.030, 0.060], done=0.36),
                dict(begin=0.105, chunks=[0.020], out=1)])
    m = stats.point_metrics(s, opts("--goodput", "ttft:15"))
    assert m["completed"] == 2 and m["failed"] == 0
    assert m["duration"] == pytest.approx(0.36)  # from the start (0), through the wait and the end of the stream
    assert m["total_input_tokens"] == 20 and m["total_output_tokens"] == 4
    assert m["mean_ttft_ms"] == pytest.approx(15.0) and m["p99_ttft_ms"] == pytest.approx(19.9)
    assert m["mean_ttft_on_wire_ms"] == pytest.approx(13.0)  # request 0 went on the wire 4 ms after its begin
    assert m["mean_tpot_ms"] == pytest.approx(25.0)          # (60 - 10) / (3 - 1); 1-token output excluded
    assert m["median_itl_ms"] == pytest.approx(25.0)         # gaps 20 and 30 ms
    assert m["mean_e2el_ms"] == pytest.approx(40.0)          # to the last token chunk, not to [DONE]
    assert m["request_throughput"] == pytest.approx(2 / 0.36)
    assert m["request_goodput"] == pytest.approx(1 / 0.36)   # only request 0 has TTFT <= 15 ms
    assert m["max_concurrent_requests"] == 2 and m["peak_in_flight_requests"] == 2


def test_chunks_with_several_tokens_count_as_vllm_counts_them():
    """Two chunks carrying 4 tokens each: ITL holds one gap per chunk, TPOT divides by the 7 later tokens,
    and vLLM's peak tokens per second counts a chunk as one token."""
    m = stats.point_metrics(_known([dict(begin=0.0, chunks=[0.010, 0.080], out=8)]), opts())
    assert m["median_itl_ms"] == pytest.approx(70.0) and m["mean_tpot_ms"] == pytest.approx(10.0)
    assert m["total_output_tokens"] == 8 and m["max_output_tokens_per_s"] == 2


def test_max_concurrent_requests_uses_vllms_one_second_buckets():
    """Back-to-back requests, one at a time: the exact peak is 1, vLLM's per-second count is 2 (two requests
    touch the same second)."""
    s = _known([dict(begin=0.0, chunks=[0.1, 0.4]), dict(begin=0.4, chunks=[0.1, 0.3])])
    m = stats.point_metrics(s, opts())
    assert m["peak_in_flight_requests"] == 1 and m["max_concurrent_requests"] == 2
    assert stats.peak_in_flight(np.array([0, 1, 2, 10.0]), np.array([1, 2, 3, 11.0])) == 1  # back to back
    assert stats.peak_in_flight(np.array([0, 0.5, 0.6]), np.array([1, 1, 1.0])) == 3
    assert stats.vllm_buckets(np.array([0.0, 1.5]), np.array([0.9, 2.2]), [np.array([0.5]), np.array([0.1])]) \
        == (1.0, 1)


def test_settle_fills_counts_as_vllm_and_checks_ignore_eos():
    s = _known([dict(begin=0.0, chunks=[0.01, 0.02], in_tok=-1, out=5),      # no prompt_tokens in the usage
                dict(begin=0.0, chunks=[0.01, 0.02], out=-1, text="a b c"),  # no completion_tokens
                dict(begin=0.0, chunks=[0.01], out=3),                       # stopped before max_tokens
                dict(begin=0.0, ok=False, error="HTTP 500: x", out=-1)])
    stats.settle(s, [12, 12, 12, 12], [5, 5, 5, 5], ignore_eos=False)
    assert s["in_tok"][:3] == [12, 10, 10] and s["out_tok"][:3] == [5, 1, 3]  # no tokenizer: 1, as vLLM
    assert s["ok"] == [True, True, True, False]

    class Tok:
        def __call__(self, text, add_special_tokens):
            return type("Enc", (), {"input_ids": text.split()})()

    s = _known([dict(begin=0.0, chunks=[0.01, 0.02], out=-1, text="a b c"), dict(begin=0.0, chunks=[0.01], out=3),
                dict(begin=0.0, chunks=[0.01], out=5)])
    stats.settle(s, [8, 8, 8], [5, 5, 5], ignore_eos=True, tokenizer=Tok())
    assert s["out_tok"][0] == 3 and s["ok"] == [False, False, True]
    assert "3 output tokens where max_tokens is 5" in s["error"][1]
    m = stats.point_metrics(s, opts())
    assert m["completed"] == 1 and m["failed"] == 2 and m["total_output_tokens"] == 5


def test_settle_counts_a_text_prompt_without_usage_prompt_tokens_by_tokenizing_it():
    """vLLM's client counts a text prompt's tokens itself; without `prompt_tokens` in the usage the native
    client tokenizes the prompt (special tokens included) instead of counting 0 input tokens."""
    class Tok:
        def __call__(self, text, add_special_tokens):
            return type("Enc", (), {"input_ids": ["<s>"] * add_special_tokens + text.split()})()

    s = _known([dict(begin=0.0, chunks=[0.01, 0.02], in_tok=-1, out=2), dict(begin=0.0, chunks=[0.01], in_tok=7,
                                                                            out=1)])
    stats.settle(s, [None, None], [2, 1], ignore_eos=False, tokenizer=Tok(), prompt_texts=["one two three", "x"])
    assert s["in_tok"] == [4, 7]
    assert stats.point_metrics(s, opts())["total_input_tokens"] == 11


def test_steady_state_from_per_second_throughput():
    def steady(rates: list[float]) -> dict:
        rows = []
        for sec, r in enumerate(rates):  # r one-token requests finishing inside second `sec`
            rows += [dict(begin=sec + 0.1 + j / (r + 1), chunks=[0.01], out=1) for j in range(int(r))]
        return stats.steady_state(_known(rows))

    flat = steady([50] * 20)
    assert flat["steady_state"] is True and abs(flat["steady_state_slope_pct_per_s"]) < 1
    rising = steady([20 + 5 * i for i in range(20)])
    assert rising["steady_state"] is False and rising["steady_state_slope_pct_per_s"] > 1
    short = steady([50] * 4)   # a window under 5 s: too short to judge
    assert short["steady_state"] is None and short["steady_state_slope_pct_per_s"] is None
    assert short["steady_state_note"] == "not judged: too short"
    tokens = stats.per_second_throughput(_known([dict(begin=0.2, chunks=[0.1, 0.9], out=4)]))["tokens"]
    assert tokens.tolist() == [2.0]   # 4 tokens over 2 chunks, the partial second 1.x left out


def test_client_check_flags_a_client_that_fell_behind():
    o = opts("--request-rate", "100")
    s = stats.empty_samples()
    due = arrivals.due_times(100, o)
    s["ok"] = [True] * 100
    s["due"], s["ready"], s["begin"] = due.tolist(), due.tolist(), (due + 0.0005).tolist()
    s["sent"] = s["begin"]
    fine = stats.client_check(s, o, 100.0)
    assert not fine["client_limited"] and fine["achieved_request_rate"] == pytest.approx(100, rel=0.01)
    s["sent"] = s["begin"] = (due * 1.2).tolist()   # the client sent over 1.2x the span: 83 req/s
    slow = stats.client_check(s, o, 100.0)
    assert slow["client_limited"] and "req/s of the 100 asked" in slow["client_limited_reason"]
    closed = opts("--max-concurrency", "4")
    s["due"] = s["ready"] = [0.0] * 100
    s["sent"] = s["begin"] = [0.02] * 100          # 20 ms between a free slot and the send
    assert "send lag p99" in stats.client_check(s, closed, math.inf)["client_limited_reason"]
    s["actor"] = [0] * 100
    assert not stats.client_check(s, opts(), math.inf)["client_limited"]  # a burst is due at once: 1 late start
    s["sent"] = s["begin"] = (np.arange(100) * 0.0003).tolist()   # a burst begun 0.3 ms apart: as fast as can be
    assert not stats.client_check(s, opts(), math.inf)["client_limited"]
    s["sent"] = s["begin"] = (np.arange(100) * 0.015).tolist()    # one request every 15 ms: the client is slow
    assert "send lag p99" in stats.client_check(s, opts(), math.inf)["client_limited_reason"]  # bursts judged
    s["sent"] = s["begin"] = [0.02] * 100
    s["sent"] = s["begin"] = [0.0005] * 99 + [0.03]   # one hiccup is not a client that falls behind
    assert not stats.client_check(s, closed, math.inf)["client_limited"]
    s["begin"], s["sent"] = [0.0005] * 100, [0.03] * 100  # opening connections is not the client falling behind
    assert not stats.client_check(s, closed, math.inf)["client_limited"]
    s["loop_lag"] = [0.001] * 50 + [0.05] * 50     # a saturated loop: requests look on time, the loop is not
    busy = stats.client_check(s, closed, math.inf)
    assert busy["client_limited"] and "event-loop lag p99 50.0 ms > 20 ms" in busy["client_limited_reason"]
    assert not stats.client_check(s, closed, math.inf, max_loop_lag_ms=60)["client_limited"]



@pytest.mark.parametrize("units, conc, n", [(640, 512, 2), (2304, 2048, 4), (60, 4, 3), (5, 8, 3), (10, 7, 7)])
def test_each_slots_first_request_goes_with_its_actors_call(units, conc, n):
    """A closed loop over several actors: every slot gets its first request with its actor's call (round robin
    over the first --max-concurrency requests, or all of them when fewer), none twice, so that nothing asks the
    dispenser at the start; the dispenser hands out the rest."""
    from raysweep.bench.native import deal, slots_of

    dealt = min(conc, units)
    shares = deal(units, n, dealt)
    assert sorted(k for share in shares for k in share) == list(range(dealt))
    assert sum(slots_of(conc, n, a) for a in range(n)) == conc
    for a, share in enumerate(shares):
        assert len(share) == min(slots_of(conc, n, a), len(range(a, units, n)))
        assert share == sorted(share)                      # the earliest requests first
    assert deal(units, n, 0) == [list(range(a, units, n)) for a in range(n)]   # no dispenser: all dealt


def test_slots_that_free_together_take_from_the_dispenser_in_one_call():
    """A wave of 128 slots of one actor freeing at once (a server's batch ending) asks the dispenser a few
    times, not 128 times one after the other: the slots that free while a take is on its way are served by the
    next call together. Every slot gets a different index until the point runs out, then None; the dispenser
    hands out no index past the point, nor any of another point."""
    import asyncio

    from raysweep.bench.native import Dispenser, _Taker

    disp = Dispenser()  # the actor's class, called in place
    disp.reset(epoch=3, n=100, start=10)
    calls: list[int] = []

    class Remote:
        @staticmethod
        async def remote(epoch: int, wanted: int) -> list[int]:
            calls.append(wanted)
            await asyncio.sleep(0.01)                  # a round trip
            return disp.take(epoch, wanted)

    class Handle:
        take = Remote

    async def wave() -> list[int | None]:
        taker = _Taker(Handle, 3)
        return await asyncio.gather(*(taker.take() for _ in range(128)))

    got = asyncio.run(wave())
    assert sorted(k for k in got if k is not None) == list(range(10, 100)) and got.count(None) == 38
    assert len(calls) <= 3 and sum(calls) == 128, calls
    assert disp.take(3, 5) == [] and disp.take(2, 5) == []
    disp.reset(epoch=4, n=3)
    assert disp.take(3, 2) == [] and disp.take(4, 2) == [0, 1] and disp.take(4, 2) == [2]


def test_a_closed_loops_send_lag_counts_where_it_left_the_slots_idle():
    """The start-up storm of a large closed loop: 512 slots whose first requests began up to 50 ms after the
    start, on a server that holds each request for 2 s, left the slots idle 1 % of their time: the server got
    its concurrency, so the point is not client-limited, though the lags are over 10 ms. The same lags before
    requests of 20 ms left the slots idle most of the time: client-limited, saying so."""
    closed = opts("--max-concurrency", "512")
    s = stats.empty_samples()
    n = 1024
    s["ok"] = [True] * n
    s["due"] = s["ready"] = [0.0] * 512 + [2.05] * 512
    lag = np.r_[np.linspace(0.0, 0.05, 512), np.full(512, 0.001)]
    s["begin"] = s["sent"] = (np.asarray(s["ready"]) + lag).tolist()
    s["done"] = (np.asarray(s["begin"]) + 2.0).tolist()
    held = stats.client_check(s, closed, math.inf)
    assert held["client_late_sends"] > 400 and held["client_send_lag_p99_ms"] > 10
    assert held["client_slot_idle_pct"] == pytest.approx(100 * lag.sum() / (lag + 2.0).sum())
    assert held["client_slot_idle_pct"] < 5 and not held["client_limited"], held["client_limited_reason"]
    s["done"] = (np.asarray(s["begin"]) + 0.02).tolist()   # the server answers in 20 ms: the client held it back
    quick = stats.client_check(s, closed, math.inf)
    assert quick["client_limited"] and quick["client_slot_idle_pct"] > 5
    assert "slots idle" in quick["client_limited_reason"] and "send lag p99" in quick["client_limited_reason"]
    # the open loop and the burst keep the flat threshold: their due times are the schedule
    assert stats.client_check(s, opts("--request-rate", "100"), 100.0)["client_slot_idle_pct"] is None


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
    assert out["server_kv_cache_usage_perc_peak"] == 0.8
    assert out["server_kv_cache_usage_perc_mean"] == pytest.approx(0.6)
    assert out["server_num_requests_running_peak"] == 16 and out["server_num_preemptions"] == 3
    assert out["server_prompt_tokens"] == 500 and out["server_prefix_cache_hit_rate"] == pytest.approx(0.2)
    failed = metrics.summarize([], ["URLError: refused"], None)
    assert failed["server_metrics_samples"] == 0 and failed["server_metrics_error"] == "URLError: refused"
    assert failed["server_metrics_complete"] is False


def test_client_guard_thresholds_reach_the_native_client(tmp_path):
    """Every `bench.client_guard` setting of the campaign is what the native client judges with."""
    from raysweep.bench import backend_for
    from raysweep.campaign import campaign_from_dict

    data = {"name": "g", "serve": {"cmd": "vllm serve m"},
            "bench": {"backend": "native", "cmd": "vllm bench serve --model m --num-prompts 4",
                      "client_guard": {"max_send_lag_ms": 7, "min_rate_fraction": 0.5, "max_loop_lag_ms": 33}}}
    spec = campaign_from_dict(data, tmp_path)
    nb = backend_for(spec.campaign.bench, {})
    assert nb.guard == {"max_send_lag_ms": 7.0, "min_rate_fraction": 0.5, "max_loop_lag_ms": 33.0}


def test_a_connection_idle_longer_than_the_keep_alive_is_not_reused():
    """A server that keeps an idle connection 3 s (vLLM: 5 s): after 2.5 s idle, the native client's pool
    opens a new connection rather than send on one the server may be closing at that moment; aiohttp's own
    default (15 s) would reuse it, as the control shows."""
    import asyncio

    import aiohttp
    from aiohttp import web

    from raysweep.bench import native

    async def peer(request: web.Request) -> web.Response:
        return web.Response(text=str(request.transport.get_extra_info("peername")[1]))

    async def ports(conn: aiohttp.TCPConnector, url: str) -> tuple[str, str]:
        async with aiohttp.ClientSession(connector=conn) as session:
            async with session.get(url) as r:
                first = await r.text()
            await asyncio.sleep(2.5)
            async with session.get(url) as r:
                return first, await r.text()

    async def main() -> tuple[tuple[str, str], tuple[str, str]]:
        app = web.Application()
        app.router.add_get("/", peer)
        runner = web.AppRunner(app, keepalive_timeout=3.0)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/"
        try:
            return await ports(native.connector(), url), await ports(aiohttp.TCPConnector(), url)
        finally:
            await runner.cleanup()

    ours, default = asyncio.run(main())
    assert native.KEEPALIVE_S < 5.0
    assert ours[0] != ours[1]          # a new connection after 2.5 s idle
    assert default[0] == default[1]    # the control: aiohttp's default pool reuses it

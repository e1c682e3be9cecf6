"""The native client's data sets and payloads against vLLM 0.32's `vllm bench serve` definitions
(vllm/benchmarks/datasets/, lib/endpoint_request_func.py): lengths, token-id structure, shuffling,
oversampling, ShareGPT's length filter and the request bodies. Uses the tiny model's tokenizer (no server)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from raysweep.bench.datasets import make_requests, payload
from raysweep.bench.options import LoadOptions, parse_load_options
from raysweep.errors import CampaignError


def opts(*flags: str, model: str = "m") -> LoadOptions:
    return parse_load_options(["vllm", "bench", "serve", "--model", model, *flags])


@pytest.fixture(scope="module")
def tok(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model), local_files_only=True)


def _allowed(tok) -> np.ndarray:
    return np.setdiff1d(np.arange(tok.vocab_size), tok.all_special_ids)


# -- random ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("input_len, prefix_len", [(64, 0), (200, 0), (40, 16)])
def test_chat_random_prompts_re_encode_to_the_asked_length(tiny_model, tok, input_len, prefix_len):
    """vLLM decodes the ids, re-encodes and cuts or pads until the text has the asked length (the server
    adds the special tokens: BOS here). Exact for every prompt with the tiny model's tokenizer."""
    o = opts("--backend", "openai-chat", "--num-prompts", "30", "--random-input-len", str(input_len),
             "--random-prefix-len", str(prefix_len), model=str(tiny_model))
    reqs = make_requests(o)
    assert len(reqs) == 30 and all(isinstance(r.prompt, str) for r in reqs)
    lens = [len(tok(r.prompt).input_ids) for r in reqs]  # as the server encodes a text prompt
    assert lens == [prefix_len + input_len] * 30
    if prefix_len:  # the prefix is shared, as text too
        heads = {tuple(tok.encode(r.prompt, add_special_tokens=False)[:prefix_len // 2]) for r in reqs}
        assert len(heads) == 1


def test_chat_random_prompts_with_a_range_stay_in_the_range(tiny_model, tok):
    o = opts("--backend", "openai-chat", "--num-prompts", "40", "--random-input-len", "100",
             "--random-range-ratio", "0.5", model=str(tiny_model))
    lens = [len(tok(r.prompt).input_ids) for r in make_requests(o)]
    assert min(lens) >= 50 and max(lens) <= 150 and len(set(lens)) > 10


def test_random_ids_are_runs_of_consecutive_allowed_ids(tiny_model, tok):
    """vLLM's RandomDataset: allowed[(offset + index + arange(len)) % len(allowed)], no special id."""
    o = opts("--num-prompts", "20", "--random-input-len", "50", "--prompt-format", "token_ids", model=str(tiny_model))
    allowed = _allowed(tok)
    pos = {int(t): i for i, t in enumerate(allowed)}
    for r in make_requests(o):
        assert isinstance(r.prompt, list) and len(r.prompt) == 50
        assert not set(r.prompt) & set(tok.all_special_ids)
        steps = {(pos[b] - pos[a]) % len(allowed) for a, b in zip(r.prompt, r.prompt[1:])}
        assert steps == {1}


def test_completions_random_prompts_go_as_text_as_vllm_sends_them(tiny_model, tok):
    """With the tokenizer at hand, the default sends text (the server tokenizes, as for `vllm bench serve`),
    one special token short of the asked length: the server adds BOS."""
    reqs = make_requests(opts("--num-prompts", "20", "--random-input-len", "50", model=str(tiny_model)))
    assert all(isinstance(r.prompt, str) for r in reqs)
    assert {len(tok(r.prompt).input_ids) for r in reqs} == {50}
    # the same ids as the token-id form, decoded: the two formats send one workload
    ids = make_requests(opts("--num-prompts", "20", "--random-input-len", "50", "--prompt-format", "token_ids",
                             model=str(tiny_model)))
    assert [r.output_len for r in reqs] == [r.output_len for r in ids]


def test_text_prompts_without_a_tokenizer_are_refused_and_auto_falls_back_to_ids():
    with pytest.raises(CampaignError, match="--prompt-format text"):
        make_requests(opts("--num-prompts", "2", "--prompt-format", "text"))
    assert all(isinstance(r.prompt, list) for r in make_requests(opts("--num-prompts", "2")))
    with pytest.raises(CampaignError, match="--prompt-format"):
        opts("--prompt-format", "bytes")


def test_random_ids_without_a_tokenizer_are_consecutive_runs_too():
    reqs = make_requests(opts("--num-prompts", "10", "--random-input-len", "30", "--random-prefix-len", "4"))
    for r in reqs:
        steps = np.diff(np.array(r.prompt[4:]))
        assert len(r.prompt) == 34 and ((steps == 1) | (steps < 0)).all() and (steps < 0).sum() <= 1


def test_output_lengths_never_reach_zero():
    """vLLM clamps both ends of the output range to at least 1."""
    reqs = make_requests(opts("--num-prompts", "200", "--random-input-len", "20", "--random-output-len", "2",
                              "--random-range-ratio", "0.9"))
    outs = [r.output_len for r in reqs]
    assert min(outs) >= 1 and max(outs) <= 4


def test_an_empty_random_prompt_is_refused():
    with pytest.raises(CampaignError, match="--random-input-len"):
        make_requests(opts("--num-prompts", "5", "--random-input-len", "1", "--random-range-ratio", "0.99"))


# -- prefix repetition -----------------------------------------------------------------------------

def test_prefix_repetition_does_not_force_ignore_eos_and_makes_vllms_count():
    o = opts("--dataset-name", "prefix_repetition", "--num-prompts", "23", "--prefix-repetition-num-prefixes", "4",
             "--prefix-repetition-prefix-len", "10", "--prefix-repetition-suffix-len", "3")
    assert not o.ignore_eos and opts("--dataset-name", "prefix", "--ignore-eos").ignore_eos
    assert opts().ignore_eos  # the random set: forced, as vllm bench serve does
    reqs = make_requests(o)
    assert len(reqs) == 20  # 4 prefixes x (23 // 4)
    assert json.loads(payload(reqs[0], o, "x")).get("ignore_eos") is None
    with pytest.raises(CampaignError, match="--num-prompts.*--prefix-repetition-num-prefixes"):
        opts("--dataset-name", "prefix", "--num-prompts", "3")


def test_prefix_repetition_disable_shuffle_keeps_prefix_groups_in_order():
    flags = ("--dataset-name", "prefix", "--num-prompts", "12", "--prefix-repetition-num-prefixes", "3",
             "--prefix-repetition-prefix-len", "8", "--prefix-repetition-suffix-len", "2")
    ordered = [tuple(r.prompt[:8]) for r in make_requests(opts(*flags, "--disable-shuffle"))]
    assert ordered == [ordered[0]] * 4 + [ordered[4]] * 4 + [ordered[8]] * 4
    shuffled = [tuple(r.prompt[:8]) for r in make_requests(opts(*flags))]
    assert sorted(shuffled) == sorted(ordered) and shuffled != ordered


def test_chat_prefix_repetition_prompts_have_their_lengths(tiny_model, tok):
    o = opts("--backend", "openai-chat", "--dataset-name", "prefix", "--num-prompts", "8",
             "--prefix-repetition-num-prefixes", "2", "--prefix-repetition-prefix-len", "40",
             "--prefix-repetition-suffix-len", "20", model=str(tiny_model))
    lens = {len(tok.encode(r.prompt, add_special_tokens=False)) for r in make_requests(o)}
    assert lens <= {59, 60, 61}  # prefix and suffix are fitted apart, then joined, as vLLM does


# -- files -----------------------------------------------------------------------------------------

def _sharegpt(tmp_path, n: int = 8):
    conv = [{"conversations": [{"from": "human", "value": f"question number {i} " + "the model serves " * (i + 1)},
                               {"from": "gpt", "value": "a steady answer " * (i + 2)}]} for i in range(n)]
    conv.append({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "a long answer " * 5}]})
    conv.append({"conversations": [{"from": "human", "value": "the cache " * 600},
                                   {"from": "gpt", "value": "ok " * 9}]})
    path = tmp_path / "share.json"
    path.write_text(json.dumps(conv))
    return path


def test_sharegpt_without_a_tokenizer_is_refused(tmp_path):
    with pytest.raises(CampaignError) as e:
        make_requests(opts("--dataset-name", "sharegpt", "--dataset-path", str(_sharegpt(tmp_path))))
    assert "tokenizer" in str(e.value) and "bench.backend: command" in str(e.value)


def test_sharegpt_applies_vllms_length_filter(tmp_path, tiny_model, tok):
    path = _sharegpt(tmp_path)
    reqs = make_requests(opts("--dataset-name", "sharegpt", "--dataset-path", str(path), "--num-prompts", "10",
                              "--disable-shuffle", "--no-oversample", model=str(tiny_model)))
    # the 2-token prompt and the 1800-token prompt are dropped (4 <= prompt <= 1024, as vLLM)
    assert [r.prompt.split()[2] for r in reqs] == [str(i) for i in range(8)]
    for r in reqs:
        i = int(r.prompt.split()[2])
        assert r.output_len == len(tok("a steady answer " * (i + 2)).input_ids)


def test_oversampling_and_no_oversample(tmp_path, tiny_model):
    path = _sharegpt(tmp_path, n=3)
    flags = ("--dataset-name", "sharegpt", "--dataset-path", str(path), "--num-prompts", "7")
    assert len(make_requests(opts(*flags, "--no-oversample", model=str(tiny_model)))) == 3
    full = make_requests(opts(*flags, model=str(tiny_model)))
    assert len(full) == 7 and {r.prompt for r in full[3:]} <= {r.prompt for r in full[:3]}
    lines = tmp_path / "c.jsonl"
    lines.write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(6)))
    custom = ("--dataset-name", "custom", "--dataset-path", str(lines), "--num-prompts", "6", "--skip-chat-template")
    assert [r.prompt for r in make_requests(opts(*custom, "--disable-shuffle"))] == [f"p{i}" for i in range(6)]
    assert [r.prompt for r in make_requests(opts(*custom))] != [f"p{i}" for i in range(6)]


# -- payloads and options --------------------------------------------------------------------------

def test_payloads_carry_vllms_fields():
    o = opts("--num-prompts", "1", "--random-input-len", "4")
    req = make_requests(o)[0]
    body = json.loads(payload(req, o, "served"))
    assert body["repetition_penalty"] == 1.0 and body["max_tokens"] == o.random_output_len
    o2 = opts("--num-prompts", "1", "--random-input-len", "4", "--repetition-penalty", "1.3")
    assert json.loads(payload(req, o2, "served"))["repetition_penalty"] == 1.3
    chat = opts("--backend", "openai-chat")
    body = json.loads(payload(type(req)("hello", 5), chat, "served"))
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]
    assert body["max_completion_tokens"] == 5 and "repetition_penalty" not in body


@pytest.mark.parametrize("flag", ["--random-batch-size", "--num-warmups", "--lora-modules", "--profile"])
def test_unsupported_options_are_refused_with_the_way_out(flag):
    with pytest.raises(CampaignError) as e:
        opts(flag, "2")
    assert flag in str(e.value) and "bench.backend: command" in str(e.value)

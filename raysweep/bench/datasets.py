"""Data sets of the native client: the prompts and output lengths of one point, made before the clock starts.

- `random`: as vLLM's random set: per request a run of consecutive allowed token ids (the vocabulary less
  the special ids) from a random offset, after a shared random `--random-prefix-len`; lengths drawn around
  the asked ones with `--random-range-ratio` (output lengths at least 1); decoded to text and fitted back to
  the asked length by decoding and re-encoding, as `vllm bench serve` sends them (the model's tokenizer is
  needed; the server adds its special tokens). raysweep's own `--prompt-format token_ids` sends the ids
  themselves to the completions API instead (exact lengths, no tokenizer needed, no tokenizer work on the
  server); the default `auto` sends text when the tokenizer is readable locally, else token ids.
- `prefix_repetition` (alias `prefix`): as vLLM's, `--prefix-repetition-num-prefixes` random prefixes, each
  followed by `num_prompts // num_prefixes` random suffixes (suffix length 0 gives fully duplicated
  prompts), shuffled unless `--disable-shuffle`: the prefix-cache studies.
- `sharegpt`: vLLM's ShareGPT JSON (first two turns of each conversation), from a local path, shuffled
  unless `--disable-shuffle`, with vLLM's length filter (needs the model's tokenizer).
- `jsonl` and `custom`: one JSON object per line, `{"prompt": ..., "output_tokens": N}`, as vLLM's custom set;
  `custom` also takes `FILE.py:FUNCTION`, a hook returning the requests.
A file with fewer usable requests than `--num-prompts` is oversampled as vLLM does (random picks with the
seed), unless `--no-oversample`. Nothing is downloaded: a tokenizer is loaded only from a local folder
(`--tokenizer`, else `--model`).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raysweep.bench.options import LoadOptions
from raysweep.bench.text import (
    Vocab,
    fit_text,
    length_range,
    load_vocab,
    log_mismatch,
    tokenizer_for,
    vocab_size,
)
from raysweep.errors import CampaignError

__all__ = ["Request", "make_requests", "payload", "sharegpt_pairs", "vocab_size"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Request:
    prompt: list[int] | str
    output_len: int | None   # None: let the server decide (text data sets without an output length)

    @property
    def prompt_len(self) -> int | None:
        return len(self.prompt) if isinstance(self.prompt, list) else None



def make_requests(opts: LoadOptions) -> list[Request]:
    """The requests of one point, in send order, made from the options and the seed."""
    name = opts.dataset_name
    if name == "random":
        reqs = _random(opts)
    elif name == "prefix_repetition":
        reqs = _prefix_repetition(opts)
    elif name == "sharegpt":
        reqs = _sharegpt(opts)
    elif name == "timed_trace":
        reqs = _timed_trace(opts)
    elif name == "multi_turn":
        reqs = _multi_turn(opts)
    elif name == "custom" and ":" in (opts.dataset_path or "") and ".py" in (opts.dataset_path or ""):
        reqs = _hook(opts)
    else:
        reqs = _jsonl(opts)
    if opts.chat:
        reqs = _as_text(reqs, opts)
    return reqs


def _timed_trace(opts: LoadOptions) -> list[Request]:
    """The requests of a replayed trace (raysweep.bench.trace): ids, or with --prompt-format text their text
    fitted back to the input length, less the special tokens the server adds (as the random set's prompts)."""
    from raysweep.bench.trace import trace_prompts

    text = opts.prompt_format == "text"
    vocab = load_vocab(opts, need_tokenizer=text)
    reqs = [Request(ids, out) for ids, out in trace_prompts(opts, vocab.allowed)]
    if not text:
        return reqs
    fitted, mismatch = [], 0
    for i, r in enumerate(reqs):
        assert isinstance(r.prompt, list)
        target = max(1, len(r.prompt) - vocab.num_special)
        prompt, ids = fit_text(vocab, r.prompt[:target], target, np.random.default_rng([opts.seed, 1 << 51, i]))
        mismatch += len(ids) - target
        fitted.append(Request(prompt, r.output_len))
    log_mismatch(mismatch, "--dataset-name timed_trace")
    return fitted


def _multi_turn(opts: LoadOptions) -> list[Request]:
    """Every turn of every session, in session order (raysweep.bench.sessions); `session_spans` says which."""
    from raysweep.bench.sessions import conversations

    conv = conversations(opts, tokenizer_for(opts))
    return [Request(m, o) for m, o in zip(conv.messages, conv.output_lens)]


def _random_vocab(opts: LoadOptions) -> tuple[Vocab, bool]:
    """The vocabulary of a random set, and whether its prompts go as text (see --prompt-format)."""
    vocab = load_vocab(opts, need_tokenizer=opts.chat or opts.prompt_format == "text")
    text = opts.chat or opts.prompt_format == "text" or (opts.prompt_format == "auto" and vocab.tok is not None)
    return vocab, text


def _random(opts: LoadOptions) -> list[Request]:
    """vLLM's RandomDataset: lengths, then offsets, then a prefix from one seeded generator; each prompt
    is the shared prefix and `input_len` consecutive allowed ids from `offset + index`."""
    rng = np.random.default_rng(opts.seed)
    vocab, text = _random_vocab(opts)
    n, ratio, prefix_len = opts.num_prompts, opts.random_range_ratio, opts.random_prefix_len
    # text gets the tokenizer's special tokens (BOS) added by the server; token ids are sent as they are
    real_input_len = max(0, opts.random_input_len - (vocab.num_special if text else 0))
    in_lo, in_hi = length_range(real_input_len, ratio, 0)
    if prefix_len + in_lo < 1:
        raise CampaignError("bench.cmd", f"--random-input-len {opts.random_input_len} is too small: with range "
                                         f"ratio {ratio} and --random-prefix-len {prefix_len} a prompt could be "
                                         "empty (vllm bench serve refuses it too)")
    out_lo, out_hi = length_range(opts.random_output_len, ratio, 1)
    in_lens = rng.integers(in_lo, in_hi + 1, size=n)
    out_lens = rng.integers(out_lo, out_hi + 1, size=n)
    offsets = rng.integers(0, vocab.size, size=n)
    allowed = vocab.allowed
    prefix = allowed[rng.integers(0, len(allowed), size=prefix_len)].tolist()
    if text and prefix:
        prefix = fit_text(vocab, prefix, prefix_len, rng)[1]
    reqs, mismatch = [], 0
    for i in range(n):
        ids = prefix + allowed[(int(offsets[i]) + i + np.arange(int(in_lens[i]))) % len(allowed)].tolist()
        prompt: list[int] | str = ids
        if text:
            target = prefix_len + int(in_lens[i])
            prompt, fitted = fit_text(vocab, ids, target, rng)
            mismatch += len(fitted) - target
        reqs.append(Request(prompt, int(out_lens[i])))
    log_mismatch(mismatch, "--dataset-name random")
    return reqs


def _prefix_repetition(opts: LoadOptions) -> list[Request]:
    """vLLM's PrefixRepetitionRandomDataset: `num_prefixes` random prefixes, each followed by
    `num_prompts // num_prefixes` random suffixes, then shuffled (unless --disable-shuffle). With fewer
    prompts than prefixes (warmup), each prompt gets its own prefix."""
    rng = np.random.default_rng(opts.seed)
    vocab, text = _random_vocab(opts)
    k = min(opts.prefix_repetition_num_prefixes, opts.num_prompts)
    per = opts.num_prompts // k
    mismatch = 0

    def draw(length: int) -> list[int]:
        nonlocal mismatch
        ids = vocab.allowed[rng.integers(0, len(vocab.allowed), size=length)].tolist()
        if text and ids:
            ids = fit_text(vocab, ids, length, rng)[1]
            mismatch += len(ids) - length
        return ids

    reqs = []
    for _ in range(k):
        prefix = draw(opts.prefix_repetition_prefix_len)
        for _ in range(per):
            ids = prefix + draw(opts.prefix_repetition_suffix_len)
            reqs.append(Request(vocab.tok.decode(ids) if text else ids, opts.prefix_repetition_output_len))
    log_mismatch(mismatch, "--dataset-name prefix_repetition")
    if len(reqs) < opts.num_prompts:
        log.info("prefix_repetition: %d prompts (%d prefixes x %d), as vllm bench serve makes them",
                 len(reqs), k, per)
    if opts.disable_shuffle:
        return reqs
    return [reqs[i] for i in rng.permutation(len(reqs))]


def _read_path(opts: LoadOptions) -> Path:
    p = Path(opts.dataset_path or "")
    if not p.is_file():
        raise CampaignError("bench.cmd", f"--dataset-path {opts.dataset_path!r} is not a file on this machine")
    return p


def _oversample(reqs: list[Request], opts: LoadOptions, what: str) -> list[Request]:
    """vLLM's oversampling: a file with fewer usable requests than asked is filled up with random picks
    (seeded), unless --no-oversample."""
    if not reqs:
        raise CampaignError("bench.cmd", f"{what} yields no usable request")
    reqs = reqs[:opts.num_prompts]
    if opts.no_oversample or len(reqs) >= opts.num_prompts:
        if len(reqs) < opts.num_prompts:
            log.info("%s: %d requests (--no-oversample)", what, len(reqs))
        return reqs
    pick = random.Random(opts.seed)
    return reqs + [pick.choice(reqs) for _ in range(opts.num_prompts - len(reqs))]


def _valid_sequence(prompt_len: int, output_len: int, fixed_output: bool) -> bool:
    """vLLM's is_valid_sequence with its defaults: prompt 4 to 1024 tokens, output at least 4 (unless
    the output length is given), prompt + output at most 2048."""
    return (4 <= prompt_len <= 1024 and (fixed_output or output_len >= 4)
            and prompt_len + output_len <= 2048)


def _sharegpt(opts: LoadOptions) -> list[Request]:
    path = _read_path(opts)
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise CampaignError("bench.cmd", f"--dataset-path {path} is not ShareGPT JSON: {exc}") from None
    tok = tokenizer_for(opts)
    if tok is None:
        raise CampaignError("bench.cmd", f"--dataset-name sharegpt needs the model's tokenizer for vLLM's length "
                                         f"filter, and none loads from {opts.tokenizer or opts.model!r}: give "
                                         "--tokenizer (a local tokenizer folder), or set bench.backend: command "
                                         "to run `vllm bench serve` itself")
    pairs = sharegpt_pairs(data, path)
    if not opts.disable_shuffle:
        random.Random(opts.seed).shuffle(pairs)
    fixed = opts.sharegpt_output_len is not None
    reqs: list[Request] = []
    for prompt, completion in pairs:
        if len(reqs) >= opts.num_prompts:
            break
        p_len = len(tok(prompt).input_ids)
        out = opts.sharegpt_output_len if opts.sharegpt_output_len is not None else len(tok(completion).input_ids)
        if _valid_sequence(p_len, out, fixed):
            reqs.append(Request(prompt, out))
    return _oversample(reqs, opts, f"the ShareGPT file {path}")


def sharegpt_pairs(data: object, path: Path) -> list[tuple[str, str]]:
    """(prompt, completion) of every conversation with two turns or more, as vLLM's ShareGPT set reads them;
    an entry vLLM would fail on is refused naming it and its field."""
    if not isinstance(data, list):
        raise CampaignError("bench.cmd", f"{path} is not ShareGPT JSON: expected a list of {{\"conversations\": "
                                         f"[...]}} entries, got a {type(data).__name__}")
    pairs = []
    for i, entry in enumerate(data):
        conv = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(conv, list):
            raise CampaignError("bench.cmd", f"{path} entry {i}: no \"conversations\" list (ShareGPT entries are "
                                             "{\"conversations\": [{\"from\": ..., \"value\": ...}, ...]})")
        if len(conv) < 2:
            continue  # vLLM keeps conversations of two turns or more
        for j in (0, 1):
            if not isinstance(conv[j], dict) or not isinstance(conv[j].get("value"), str):
                raise CampaignError("bench.cmd", f"{path} entry {i}: conversations[{j}] has no text \"value\"")
        pairs.append((conv[0]["value"], conv[1]["value"]))
    return pairs


def _jsonl(opts: LoadOptions) -> list[Request]:
    path = _read_path(opts)
    reqs = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            raise CampaignError("bench.cmd", f"{path} line {i} is not JSON (truncated?); one JSON object a line") \
                from None
        prompt = obj.get("prompt") if isinstance(obj, dict) else None
        if not (isinstance(prompt, str) or (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt))):
            raise CampaignError("bench.cmd", f"{path} line {i} needs a \"prompt\" (text or a list of token ids)")
        file_out = obj.get("output_tokens")
        if opts.custom_output_len == -1 or (opts.dataset_name == "jsonl" and isinstance(file_out, int)):
            if not isinstance(file_out, int) or file_out < 1:
                raise CampaignError("bench.cmd", f"{path} line {i} needs \"output_tokens\" (a positive integer)")
            out = file_out
        else:
            out = opts.custom_output_len
        reqs.append(Request(prompt, out))
    if opts.dataset_name == "custom" and not opts.disable_shuffle:  # vLLM shuffles the custom set with the seed
        random.Random(opts.seed).shuffle(reqs)
    if opts.dataset_name == "custom" and not opts.skip_chat_template:
        reqs = _chat_templated(reqs, opts)
    return _oversample(reqs, opts, f"the file {path}")


def _chat_templated(reqs: list[Request], opts: LoadOptions) -> list[Request]:
    """vLLM's custom set: each text prompt as one user message in the tokenizer's chat template, with the
    generation prompt (token-id prompts, which vLLM does not take, go as they are)."""
    tok = tokenizer_for(opts)
    if tok is None or not getattr(tok, "chat_template", None):
        why = "no local tokenizer loads from " + repr(opts.tokenizer or opts.model) if tok is None else \
            "the tokenizer has no chat template"
        raise CampaignError("bench.cmd", f"--dataset-name custom wraps each prompt in the model's chat template, as "
                                         f"vllm bench serve does, and {why}: give --tokenizer (a local tokenizer "
                                         "folder with a chat template), or add --skip-chat-template to send the "
                                         "prompts as they are")
    return [Request(tok.apply_chat_template([{"role": "user", "content": r.prompt}], add_generation_prompt=True,
                                            tokenize=False, **opts.chat_template_kwargs), r.output_len)
            if isinstance(r.prompt, str) else r for r in reqs]


def _hook(opts: LoadOptions) -> list[Request]:
    file, _, func = (opts.dataset_path or "").rpartition(":")
    path = Path(file)
    if not path.is_file():
        raise CampaignError("bench.cmd", f"--dataset-path hook file {file!r} does not exist")
    spec = importlib.util.spec_from_file_location(f"raysweep_hook_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, func, None)
    if not callable(fn):
        raise CampaignError("bench.cmd", f"{file} has no function {func!r}")
    reqs = []
    for i, item in enumerate(fn(num_prompts=opts.num_prompts, seed=opts.seed)):
        prompt, out = (item.get("prompt"), item.get("output_len")) if isinstance(item, dict) else item
        if not isinstance(prompt, (str, list)) or not (out is None or (isinstance(out, int) and out > 0)):
            raise CampaignError("bench.cmd", f"{func} item {i}: expected {{'prompt': str or token ids, "
                                             f"'output_len': positive int}}, got {item!r}")
        reqs.append(Request(prompt, out))
    return _oversample(reqs, opts, f"the hook {opts.dataset_path}")


def _as_text(reqs: list[Request], opts: LoadOptions) -> list[Request]:
    if all(isinstance(r.prompt, str) for r in reqs):
        return reqs
    tok = tokenizer_for(opts)
    if tok is None:
        raise CampaignError("bench.cmd", f"the chat API takes text, and --dataset-name {opts.dataset_name} makes "
                                         "token ids: give --tokenizer (a local tokenizer folder) or use "
                                         "--backend openai (completions)")
    return [r if isinstance(r.prompt, str) else Request(tok.decode(r.prompt), r.output_len) for r in reqs]


def payload(req: Request, opts: LoadOptions, model: str) -> bytes:
    """The JSON body of one streamed request (vLLM's completions or chat payload)."""
    body: dict[str, Any] = {"model": model, "stream": True, "stream_options": {"include_usage": True}}
    if opts.chat:  # vLLM's chat payload: the prompt as one text part
        body["messages"] = [{"role": "user", "content": [{"type": "text", "text": req.prompt}]}]
        if req.output_len is not None:
            body["max_completion_tokens"] = req.output_len
    else:  # vLLM's completions payload: repetition_penalty 1.0 unless the sampling options say otherwise
        body["prompt"] = req.prompt
        body["repetition_penalty"] = 1.0
        if req.output_len is not None:
            body["max_tokens"] = req.output_len
    if opts.ignore_eos:
        body["ignore_eos"] = True
    body.update(opts.sampling)
    body.update(opts.extra_body)
    return json.dumps(body, separators=(",", ":")).encode()

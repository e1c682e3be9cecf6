"""Data sets of the native client: the prompts and output lengths of one point, made before the clock starts.

- `random`: prompts of exact lengths, sent as token ids (no tokenizer needed); output lengths pinned with
  `max_tokens` and `ignore_eos`; `--random-range-ratio` and a shared `--random-prefix-len` as in vLLM.
- `prefix_repetition` (alias `prefix`): a few long random prefixes, each repeated by many requests with a
  random suffix (suffix length 0 gives fully duplicated prompts): the prefix-cache studies.
- `sharegpt`: vLLM's ShareGPT JSON (first two turns of each conversation), from a local path.
- `jsonl` and `custom`: one JSON object per line, `{"prompt": ..., "output_tokens": N}`, as vLLM's custom set;
  `custom` also takes `FILE.py:FUNCTION`, a hook returning the requests.
Nothing is downloaded. A tokenizer is used only when one is found locally (for ShareGPT lengths, or to turn
token ids into text for the chat API).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import random
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from raysweep.bench.options import LoadOptions
from raysweep.errors import CampaignError

__all__ = ["Request", "make_requests", "payload", "vocab_size"]

log = logging.getLogger(__name__)

DEFAULT_VOCAB = 32000
_MAX_RANDOM_ID = 30000  # stay below the special tokens that large vocabularies keep at the top


@dataclass(frozen=True)
class Request:
    prompt: list[int] | str
    output_len: int | None   # None: let the server decide (text data sets without an output length)

    @property
    def prompt_len(self) -> int | None:
        return len(self.prompt) if isinstance(self.prompt, list) else None


def vocab_size(opts: LoadOptions) -> int:
    """The model's vocabulary: --vocab-size, else config.json of a local model or tokenizer folder."""
    if opts.vocab_size:
        return opts.vocab_size
    for name in (opts.tokenizer, opts.model):
        if name and (Path(name) / "config.json").is_file():
            try:
                cfg = json.loads((Path(name) / "config.json").read_text())
            except (OSError, ValueError):
                continue
            v = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
            if isinstance(v, int) and v > 0:
                return v
    return DEFAULT_VOCAB


def _id_range(opts: LoadOptions) -> tuple[int, int]:
    v = vocab_size(opts)
    hi = min(v, _MAX_RANDOM_ID) if v > _MAX_RANDOM_ID else v
    lo = min(1000, max(4, v // 10))
    return lo, hi


@lru_cache(maxsize=4)
def _tokenizer(name: str | None) -> Any:
    if not name:
        return None
    try:
        from transformers import AutoTokenizer
        return AutoTokenizer.from_pretrained(name, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure means "no tokenizer here"
        log.info("no local tokenizer for %s (%s)", name, exc)
        return None


def tokenizer_for(opts: LoadOptions) -> Any:
    return _tokenizer(opts.tokenizer or opts.model)


def make_requests(opts: LoadOptions) -> list[Request]:
    """The requests of one point, in send order, made from the options and the seed."""
    name = opts.dataset_name
    if name == "random":
        reqs = _random(opts)
    elif name == "prefix_repetition":
        reqs = _prefix_repetition(opts)
    elif name == "sharegpt":
        reqs = _sharegpt(opts)
    elif name == "custom" and ":" in (opts.dataset_path or "") and ".py" in (opts.dataset_path or ""):
        reqs = _hook(opts)
    else:
        reqs = _jsonl(opts)
    if opts.chat:
        reqs = _as_text(reqs, opts)
    return reqs


def _lens(rng: np.random.Generator, n: int, length: int, ratio: float) -> np.ndarray:
    low, high = math.floor(length * (1 - ratio)), math.ceil(length * (1 + ratio))
    return rng.integers(max(low, 0), high + 1, size=n)


def _random(opts: LoadOptions) -> list[Request]:
    rng = np.random.default_rng(opts.seed)
    lo, hi = _id_range(opts)
    n = opts.num_prompts
    in_lens = _lens(rng, n, opts.random_input_len, opts.random_range_ratio)
    out_lens = _lens(rng, n, opts.random_output_len, opts.random_range_ratio)
    prefix = rng.integers(lo, hi, size=opts.random_prefix_len).tolist()
    return [Request(prefix + rng.integers(lo, hi, size=max(int(k), 1)).tolist(), int(o))
            for k, o in zip(in_lens, out_lens)]


def _prefix_repetition(opts: LoadOptions) -> list[Request]:
    rng = np.random.default_rng(opts.seed)
    lo, hi = _id_range(opts)
    k = min(opts.prefix_repetition_num_prefixes, opts.num_prompts)
    prefixes = [rng.integers(lo, hi, size=opts.prefix_repetition_prefix_len).tolist() for _ in range(k)]
    reqs = [Request(prefixes[i % k] + rng.integers(lo, hi, size=opts.prefix_repetition_suffix_len).tolist(),
                    opts.prefix_repetition_output_len) for i in range(opts.num_prompts)]
    order = rng.permutation(len(reqs))
    return [reqs[i] for i in order]


def _read_path(opts: LoadOptions) -> Path:
    p = Path(opts.dataset_path or "")
    if not p.is_file():
        raise CampaignError("bench.cmd", f"--dataset-path {opts.dataset_path!r} is not a file on this machine")
    return p


def _cycle(reqs: list[Request], n: int, what: str) -> list[Request]:
    if not reqs:
        raise CampaignError("bench.cmd", f"{what} yields no usable request")
    return [reqs[i % len(reqs)] for i in range(n)]


def _sharegpt(opts: LoadOptions) -> list[Request]:
    path = _read_path(opts)
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise CampaignError("bench.cmd", f"--dataset-path {path} is not ShareGPT JSON: {exc}") from None
    convs = [d.get("conversations") or d.get("conversation") for d in data if isinstance(d, dict)]
    pairs = [(c[0].get("value", ""), c[1].get("value", "")) for c in convs if isinstance(c, list) and len(c) >= 2]
    random.Random(opts.seed).shuffle(pairs)
    tok = tokenizer_for(opts)
    reqs = []
    for prompt, completion in pairs:
        if tok is not None:
            p_len, c_len = len(tok(prompt).input_ids), len(tok(completion).input_ids)
            out = opts.sharegpt_output_len or c_len
            if p_len < 4 or (opts.sharegpt_output_len is None and c_len < 4) or p_len > 1024 or p_len + out > 2048:
                continue
        else:  # no tokenizer here: about 4 characters per token
            out = opts.sharegpt_output_len or max(4, len(completion) // 4)
        reqs.append(Request(prompt, out))
        if len(reqs) >= opts.num_prompts:
            break
    return _cycle(reqs, opts.num_prompts, f"the ShareGPT file {path}")


def _jsonl(opts: LoadOptions) -> list[Request]:
    path = _read_path(opts)
    reqs = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            raise CampaignError("bench.cmd", f"{path} line {i} is not JSON") from None
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
    if opts.dataset_name == "custom":  # vLLM shuffles the custom set with the seed
        random.Random(opts.seed).shuffle(reqs)
    return _cycle(reqs[:opts.num_prompts], opts.num_prompts, f"the file {path}")


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
    return _cycle(reqs[:opts.num_prompts], opts.num_prompts, f"the hook {opts.dataset_path}")


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
    if opts.chat:
        body["messages"] = [{"role": "user", "content": req.prompt}]
        if req.output_len is not None:
            body["max_completion_tokens"] = req.output_len
    else:
        body["prompt"] = req.prompt
        if req.output_len is not None:
            body["max_tokens"] = req.output_len
    if opts.ignore_eos:
        body["ignore_eos"] = True
    body.update(opts.sampling)
    body.update(opts.extra_body)
    return json.dumps(body, separators=(",", ":")).encode()

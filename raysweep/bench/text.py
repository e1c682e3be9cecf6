"""Text shared by the data sets and the multi-turn sessions: the model's vocabulary and tokenizer (read only
from a local folder), vLLM's integer length ranges, and random token ids fitted to a text of an asked length
(decode, re-encode, cut or pad, as `vllm bench serve` does)."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from raysweep.bench.options import LoadOptions
from raysweep.errors import CampaignError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["DEFAULT_VOCAB", "Vocab", "fit_text", "length_range", "load_vocab", "log_mismatch", "tokenizer_for",
           "vocab_size"]

log = logging.getLogger(__name__)

DEFAULT_VOCAB = 32000
_MAX_RANDOM_ID = 30000  # stay below the special tokens that large vocabularies keep at the top


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


@dataclass(frozen=True)
class Vocab:
    """Where random prompts draw their ids: vLLM's `allowed_tokens` (every id below the tokenizer's
    vocab_size that is not special) with a tokenizer, else a safe middle range of the vocabulary."""

    size: int
    allowed: np.ndarray
    tok: Any = None

    @property
    def num_special(self) -> int:
        return int(self.tok.num_special_tokens_to_add()) if self.tok is not None else 0


def load_vocab(opts: LoadOptions, need_tokenizer: bool) -> Vocab:
    tok = tokenizer_for(opts)
    if tok is None:
        if need_tokenizer:
            why = "the chat API takes text" if opts.chat else "--prompt-format text sends text"
            raise CampaignError("bench.cmd", f"{why}, and --dataset-name {opts.dataset_name} makes token ids: give "
                                             "--tokenizer (a local tokenizer folder), or use --backend openai "
                                             "(completions) with --prompt-format token_ids")
        lo, hi = _id_range(opts)
        return Vocab(vocab_size(opts), np.arange(lo, hi))
    size = int(tok.vocab_size)
    allowed = np.setdiff1d(np.arange(size), np.asarray(tok.all_special_ids, dtype=int))
    return Vocab(size, allowed, tok)


_FIT_RETRIES = 10  # vLLM's max_retry of gen_prompt_decode_to_target_len


def fit_text(vocab: Vocab, ids: list[int], target: int, rng: np.random.Generator) -> tuple[str, list[int]]:
    """Text whose re-encoding (without special tokens) has `target` ids: decode, re-encode, then cut or
    pad with random allowed ids, up to vLLM's number of tries (a remaining mismatch is kept, as vLLM does)."""
    tok, last = vocab.tok, None
    for attempt in range(_FIT_RETRIES + 1):
        text = tok.decode(ids)
        ids = tok.encode(text, add_special_tokens=False)
        if len(ids) == target or attempt == _FIT_RETRIES or ids == last:  # done, out of tries, or stuck
            break
        last = ids
        if len(ids) < target:
            ids = ids + vocab.allowed[rng.integers(0, len(vocab.allowed), size=target - len(ids))].tolist()
        else:
            ids = ids[:target]
    return _repair_tail(vocab, text, ids, target, rng) if len(ids) != target else (text, ids)


def _repair_tail(vocab: Vocab, text: str, ids: list[int], target: int,
                 rng: np.random.Generator) -> tuple[str, list[int]]:
    """Where vLLM's loop keeps a mismatch (a cut inside a multi-byte character decodes to U+FFFD, which
    re-encodes longer), cut back to whole characters and pad with ids that decode and re-encode to
    themselves. Keeps the best text found."""
    tok, best = vocab.tok, (text, ids)
    for _ in range(_FIT_RETRIES):
        ids = ids[:target]
        while ids and tok.decode(ids).endswith("\ufffd"):
            ids = ids[:-1]
        while len(ids) < target:
            cand = int(vocab.allowed[rng.integers(0, len(vocab.allowed))])
            if tok.encode(tok.decode([cand]), add_special_tokens=False) == [cand]:
                ids.append(cand)
        text = tok.decode(ids)
        ids = tok.encode(text, add_special_tokens=False)
        if abs(len(ids) - target) < abs(len(best[1]) - target):
            best = (text, ids)
        if len(ids) == target:
            break
    return best


def log_mismatch(total: int, what: str) -> None:
    if total:
        log.warning("%s: the prompts have %d token(s) %s than asked after decoding and re-encoding (vLLM's "
                    "random sets have the same imprecision)", what, abs(total), "more" if total > 0 else "fewer")


@lru_cache(maxsize=4)
def _tokenizer(name: str | None) -> PreTrainedTokenizerBase | None:
    if not name:
        return None
    try:
        from transformers import AutoTokenizer
        return AutoTokenizer.from_pretrained(name, local_files_only=True)
    except Exception as exc:
        log.info("no local tokenizer for %s (%s)", name, exc)
        return None


def tokenizer_for(opts: LoadOptions) -> PreTrainedTokenizerBase | None:
    return _tokenizer(opts.tokenizer or opts.model)




def length_range(length: int, ratio: float, floor_at: int) -> tuple[int, int]:
    """vLLM's integer range around a length: [floor(L(1-r)), ceil(L(1+r))], both ends at least `floor_at`."""
    return max(math.floor(length * (1 - ratio)), floor_at), max(math.ceil(length * (1 + ratio)), floor_at)

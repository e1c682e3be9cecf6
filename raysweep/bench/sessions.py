"""Multi-turn sessions: `--dataset-name multi_turn` (chat API only).

A session is a conversation of N turns. Each turn's request carries the conversation so far: every earlier
user message and the answer the server really gave to it (the client keeps the history), then the new user
message, so the server sees the growing shared prefix that prefix caching serves. A session's turns are
sent in order by one client slot, `--multi-turn-think-time` seconds after the previous answer ended; a
failed turn ends its session, and its unsent turns count as failed ("session aborted"). `--num-prompts` counts
sessions. With `--max-concurrency C`, C sessions run at
once over the client actors (a free slot takes the next session); otherwise sessions start at the
`--request-rate` arrival times (Poisson, `--burstiness`) and run side by side.

Conversations come from a file or are synthetic:
- `--dataset-path FILE`: ShareGPT-style JSON (a list of `{"conversations": [{"from": "human"|"gpt", "value":
  ...}, ...]}`) or JSONL, or OpenAI-style `{"messages": [{"role": "user"|"assistant", "content": ...}]}`.
  Each user message is a turn; a system message before the first user message is the session's system
  prompt (sent first in every turn's history), and an assistant message before it is skipped, as vLLM's
  multi-turn benchmark does. A turn's output length is `--sharegpt-output-len`, else the token count of the
  file's answer to it (the model's tokenizer is needed). At most `--multi-turn-turns` turns per session
  (default: all); shuffled with the seed unless `--disable-shuffle`; oversampled to `--num-prompts` unless
  `--no-oversample`.
- synthetic (no `--dataset-path`): `--multi-turn-turns` turns (default 4), user messages of
  `--random-input-len` tokens and answers of `--random-output-len` (both drawn with `--random-range-ratio`),
  random text fitted to its length as the random set's; `--random-prefix-len` tokens of shared text open
  every session's first message (a system prompt).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from raysweep.bench.options import LoadOptions
from raysweep.bench.text import fit_text, length_range, load_vocab
from raysweep.errors import CampaignError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["DEFAULT_TURNS", "Conversations", "conversations", "system_history", "turns_of", "with_history"]

DEFAULT_TURNS = 4


@dataclass(frozen=True)
class Conversations:
    """The turns of every session, flattened in session order, and where each session's turns are."""

    messages: list[str]                 # the user message of each turn
    output_lens: list[int]              # the answer's length of each turn (max tokens)
    spans: list[tuple[int, int]]        # (index of the first turn, number of turns) per session
    systems: list[str | None] = field(default_factory=list)  # per session: its leading system message, if any


Session = tuple[str | None, list[tuple[str, int]]]  # (system prompt, [(user message, output length), ...])


def conversations(opts: LoadOptions, tok: PreTrainedTokenizerBase | None) -> Conversations:
    """The point's sessions (--num-prompts of them), from the file or synthetic."""
    if tok is None:
        raise CampaignError("bench.cmd", "--dataset-name multi_turn sends text to the chat API and needs the model's "
                                         "tokenizer: give --tokenizer (a local tokenizer folder)")
    sessions = _from_file(opts, tok) if opts.dataset_path else [(None, t) for t in _synthetic(opts, tok)]
    messages: list[str] = []
    outs: list[int] = []
    spans: list[tuple[int, int]] = []
    systems: list[str | None] = []
    for system, turns in sessions:
        spans.append((len(messages), len(turns)))
        systems.append(system)
        for text, out in turns:
            messages.append(text)
            outs.append(out)
    return Conversations(messages, outs, spans, systems)


def system_history(system: str | None) -> list[dict[str, Any]]:
    """The history a session starts from: its system message, if it has one."""
    return [{"role": "system", "content": system}] if system else []


def _synthetic(opts: LoadOptions, tok: PreTrainedTokenizerBase) -> list[list[tuple[str, int]]]:
    rng = np.random.default_rng(opts.seed)
    vocab = load_vocab(opts, need_tokenizer=True)
    turns = opts.multi_turn_turns or DEFAULT_TURNS
    in_lo, in_hi = length_range(opts.random_input_len, opts.random_range_ratio, 1)
    out_lo, out_hi = length_range(opts.random_output_len, opts.random_range_ratio, 1)

    def text(n: int) -> str:
        ids = vocab.allowed[rng.integers(0, len(vocab.allowed), size=n)].tolist()
        return fit_text(vocab, ids, n, rng)[0]

    prefix = text(opts.random_prefix_len) + " " if opts.random_prefix_len else ""
    sessions = []
    for _ in range(opts.num_prompts):
        conv = []
        for t in range(turns):
            msg = text(int(rng.integers(in_lo, in_hi + 1)))
            conv.append(((prefix if t == 0 else "") + msg, int(rng.integers(out_lo, out_hi + 1))))
        sessions.append(conv)
    return sessions


_USER, _ASSISTANT = ("human", "user"), ("gpt", "assistant", "model", "chatgpt")


def turns_of(entry: object) -> tuple[str | None, list[tuple[str, str | None]]]:
    """(leading system message or None, [(user message, the file's answer or None), ...]) of one conversation
    of either layout. A system message before the first user message is the session's system prompt; an
    assistant message before it is skipped, as vLLM's multi-turn benchmark skips it (a conversation's follow-up
    part)."""
    if not isinstance(entry, dict):
        return None, []
    raw = entry.get("conversations") if "conversations" in entry else entry.get("messages")
    if not isinstance(raw, list):
        return None, []
    system: str | None = None
    turns: list[tuple[str, str | None]] = []
    for m in raw:
        if not isinstance(m, dict):
            continue
        who = str(m.get("from") or m.get("role") or "").lower()
        text = m.get("value") if "value" in m else m.get("content")
        if not isinstance(text, str):
            continue
        if who in _USER:
            turns.append((text, None))
        elif who in _ASSISTANT and turns and turns[-1][1] is None:
            turns[-1] = (turns[-1][0], text)
        elif who == "system" and not turns and system is None:
            system = text
    return system, turns


def _read(path: Path) -> list[Any]:
    text = path.read_text()
    try:
        data = json.loads(text)
        return data if isinstance(data, list) else [data]
    except ValueError:
        pass
    rows = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError:
            raise CampaignError("bench.cmd", f"{path} line {i} is not JSON (truncated?): the file is neither one "
                                             "JSON document nor JSONL") from None
    return rows


def _from_file(opts: LoadOptions, tok: PreTrainedTokenizerBase) -> list[Session]:
    path = Path(opts.dataset_path or "")
    if not path.is_file():
        raise CampaignError("bench.cmd", f"--dataset-path {opts.dataset_path!r} is not a file on this machine")
    convs = [c for c in (turns_of(e) for e in _read(path)) if c[1]]
    if not convs:
        raise CampaignError("bench.cmd", f"{path} has no conversation with a user turn (\"conversations\" with "
                                         "from/value, or \"messages\" with role/content)")
    if not opts.disable_shuffle:
        random.Random(opts.seed).shuffle(convs)
    fixed = opts.sharegpt_output_len
    sessions: list[Session] = []
    for system, conv in convs[:opts.num_prompts]:
        turns = conv[:opts.multi_turn_turns] if opts.multi_turn_turns else conv
        sessions.append((system, [(msg, fixed if fixed is not None else
                                   max(1, len(tok(answer or "", add_special_tokens=False).input_ids)))
                                  for msg, answer in turns]))
    if len(sessions) < opts.num_prompts and not opts.no_oversample:
        pick = random.Random(opts.seed)
        sessions += [pick.choice(sessions) for _ in range(opts.num_prompts - len(sessions))]
    return sessions


def with_history(body: bytes, history: list[dict[str, Any]]) -> bytes:
    """A turn's chat body with the conversation so far in front of its user message."""
    obj = json.loads(body)
    obj["messages"] = history + obj["messages"]
    return json.dumps(obj, separators=(",", ":")).encode()

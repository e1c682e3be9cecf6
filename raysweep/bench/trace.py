"""Trace replay: `--dataset-name timed_trace`, a JSONL trace replayed on its own timeline.

One JSON object per line with an arrival time, an input and an output length, and optional block hash ids
for shared prefixes. The field names and units are vLLM's `timed_trace` options: `timestamp` (times
`--timed-trace-sec-multiplier` gives seconds), `input_length`, `output_length`, `hash_ids` (each id one
block of `--timed-trace-chunk-hash-size` tokens), renamed with `--timed-trace-label-*`. `--trace-format
mooncake` presets the Mooncake traces' units (milliseconds, 512-token blocks).

Prompts: each hash id is one block of random allowed token ids drawn from a generator seeded by (`--seed`, the
id), so equal hash ids give equal blocks and equal leading hash ids equal prefixes; the blocks are cut to the
input length (vLLM's `_expand_prompt`), and a prompt whose blocks are shorter than its input length is padded
with ids of its own (vLLM leaves it short). The completions API gets the ids; the chat API, or
`--prompt-format text`, their decoded text (decoding may merge tokens at block borders).

Timeline: a request is due at its timestamp in seconds divided by `--trace-speedup`, as vLLM's self-timed
replay (the timestamps are offsets from the start; vLLM does not shift them either). `--no-self-timed`
replaces the timeline by `--request-rate`. At most `--num-prompts` lines are replayed (the first ones), or,
with `--duration`, every line due before it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from raysweep.bench.options import LoadOptions
from raysweep.errors import CampaignError

__all__ = ["TraceEntry", "read_trace", "trace_due", "trace_entries", "trace_prompts"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TraceEntry:
    at_s: float            # the arrival in seconds (timestamp x multiplier), before any speed-up
    input_len: int
    output_len: int
    hash_ids: tuple[int, ...]


def read_trace(opts: LoadOptions) -> list[TraceEntry]:
    """Every line of the trace file, read with the options' field names and units."""
    path = Path(opts.dataset_path or "")
    if not path.is_file():
        raise CampaignError("bench.cmd", f"--dataset-path {opts.dataset_path!r} is not a file on this machine")
    labels = (opts.timed_trace_label_timestamp, opts.timed_trace_label_input_length,
              opts.timed_trace_label_output_length, opts.timed_trace_label_hash_ids)
    return list(_read(str(path), path.stat().st_mtime_ns, labels, opts.timed_trace_sec_multiplier))


@lru_cache(maxsize=8)
def _read(path: str, mtime: int, labels: tuple[str, str, str, str], mult: float) -> tuple[TraceEntry, ...]:
    ts, inp, outp, hashes = labels
    out = []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            raise CampaignError("bench.cmd", f"trace {path} line {i} is not JSON") from None
        if not isinstance(obj, dict):
            raise CampaignError("bench.cmd", f"trace {path} line {i} is not a JSON object")
        missing = [k for k in (ts, inp, outp) if not isinstance(obj.get(k), (int, float))]
        if missing:
            raise CampaignError("bench.cmd", f"trace {path} line {i} has no number in {', '.join(missing)} (fields: "
                                             f"{', '.join(obj)}); name the fields with --timed-trace-label-timestamp, "
                                             "--timed-trace-label-input-length, --timed-trace-label-output-length")
        ids = obj.get(hashes) or []
        if not isinstance(ids, list) or not all(isinstance(h, int) for h in ids):
            raise CampaignError("bench.cmd", f"trace {path} line {i}: {hashes!r} must be a list of integers")
        if int(obj[inp]) < 1 or int(obj[outp]) < 1:
            raise CampaignError("bench.cmd", f"trace {path} line {i}: input and output lengths must be at least 1")
        out.append(TraceEntry(float(obj[ts]) * mult, int(obj[inp]), int(obj[outp]), tuple(ids)))
    if not out:
        raise CampaignError("bench.cmd", f"trace {path} has no request")
    return tuple(out)


def trace_entries(opts: LoadOptions) -> list[TraceEntry]:
    """The lines a point replays: the first --num-prompts, or with --duration those due before it."""
    entries = read_trace(opts)
    if opts.duration is not None and opts.timed:
        return [e for e in entries if e.at_s / opts.trace_speedup < opts.duration] or entries[:1]
    return entries[:opts.num_prompts]


def trace_due(opts: LoadOptions) -> np.ndarray:
    """When each replayed request is due (s from the start): its timestamp over the speed-up."""
    return np.asarray([e.at_s for e in trace_entries(opts)], dtype=float) / opts.trace_speedup


def trace_prompts(opts: LoadOptions, allowed: np.ndarray) -> list[tuple[list[int], int]]:
    """(prompt ids, output length) of each replayed request; equal hash ids give equal blocks."""
    size, blocks = opts.timed_trace_chunk_hash_size, {}
    out = []
    for i, e in enumerate(trace_entries(opts)):
        ids: list[int] = []
        left = e.input_len
        for h in e.hash_ids:
            if left <= 0:
                break
            n = min(size, left)
            if (h, n) not in blocks:
                rng = np.random.default_rng([opts.seed, h & 0xFFFFFFFFFFFF, n])
                blocks[(h, n)] = allowed[rng.integers(0, len(allowed), size=n)].tolist()
            ids += blocks[(h, n)]
            left -= n
        if left > 0:  # no (or too few) hash ids: ids of its own
            rng = np.random.default_rng([opts.seed, 1 << 50, i])
            ids += allowed[rng.integers(0, len(allowed), size=left)].tolist()
        out.append((ids, e.output_len))
    return out

"""Trace replay: `--dataset-name timed_trace`, a JSONL trace replayed on its own timeline.

One JSON object per line with an arrival time, an input and an output length, and optional block hash ids
for shared prefixes. The field names and units are vLLM's `timed_trace` options: `timestamp` (times
`--timed-trace-sec-multiplier` gives seconds), `input_length`, `output_length`, `hash_ids` (each id one
block of `--timed-trace-chunk-hash-size` tokens), renamed with `--timed-trace-label-*`. `--trace-format
mooncake` presets the Mooncake traces' units (milliseconds, 512-token blocks).

Prompts: each hash id is one block of random allowed token ids drawn from a generator seeded by (`--seed`, the
id), so equal hash ids give equal blocks and equal leading hash ids equal prefixes; the blocks are cut to the
input length (vLLM's `_expand_prompt`), and a prompt whose blocks are shorter than its input length is padded
with ids of its own (vLLM leaves it short). The completions API gets the ids, as vLLM sends them; with
`--prompt-format text` their decoded text, fitted back to the input length (less the special tokens the server
adds) as the random set's prompts are. The chat API is refused, as vLLM refuses it (a trace is token ids).
Every replayed request carries `ignore_eos`, as vLLM forces it for a trace, so it generates the trace's output
length.

Timeline: a request is due at its timestamp in seconds divided by `--trace-speedup`, as vLLM's self-timed
replay (the timestamps are offsets from the start; vLLM does not shift them either). Lines out of time order
are replayed in time order (vLLM sends them in file order, so a line behind a later one waits for it); the
result says how many were out of order (`trace_lines_out_of_order`) and the log names the first lines. A
negative timestamp is refused naming its line; blank lines are skipped and reported once.
`--no-self-timed` replaces the timeline by `--request-rate`. At most `--num-prompts` requests are replayed
(the earliest), or, with `--duration`, every one due before it; a trace with fewer lines records the number
sent as `num_prompts_sent` (`num_prompts` stays the asked number, as in vLLM's result).
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

__all__ = ["TraceEntry", "parse_line", "read_trace", "trace_due", "trace_entries", "trace_prompts", "trace_report"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TraceEntry:
    at_s: float            # the arrival in seconds (timestamp x multiplier), before any speed-up
    input_len: int
    output_len: int
    hash_ids: tuple[int, ...]
    line: int = 0          # its line in the file


@dataclass(frozen=True)
class _Trace:
    entries: tuple[TraceEntry, ...]   # in time order
    out_of_order: tuple[int, ...]     # the lines that came after a later timestamp in the file
    blank: int                        # blank (or whitespace) lines skipped


def _trace_path(opts: LoadOptions) -> Path:
    path = Path(opts.dataset_path or "")
    if not path.is_file():
        raise CampaignError("bench.cmd", f"--dataset-path {opts.dataset_path!r} is not a file on this machine")
    return path


def _labels(opts: LoadOptions) -> tuple[str, str, str, str]:
    return (opts.timed_trace_label_timestamp, opts.timed_trace_label_input_length,
            opts.timed_trace_label_output_length, opts.timed_trace_label_hash_ids)


def _load(opts: LoadOptions) -> _Trace:
    path = _trace_path(opts)
    return _read(str(path), path.stat().st_mtime_ns, _labels(opts), opts.timed_trace_sec_multiplier)


def read_trace(opts: LoadOptions) -> list[TraceEntry]:
    """Every request of the trace file in time order, read with the options' field names and units."""
    return list(_load(opts).entries)


def trace_report(opts: LoadOptions) -> dict[str, int]:
    """What the reading changed: lines replayed out of their file order, blank lines skipped."""
    t = _load(opts)
    return {"trace_lines_out_of_order": len(t.out_of_order), "trace_blank_lines": t.blank}


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def parse_line(line: str, i: int, path: str, labels: tuple[str, str, str, str], mult: float) -> TraceEntry:
    """One trace line, or a CampaignError naming the file, the line and the field."""
    ts, inp, outp, hashes = labels
    where = f"trace {path} line {i}"
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise CampaignError("bench.cmd", f"{where} is not JSON ({exc}); a trace is one JSON object per line") from None
    if not isinstance(obj, dict):
        raise CampaignError("bench.cmd", f"{where} is not a JSON object")
    missing = [k for k in (ts, inp, outp) if not _is_number(obj.get(k))]
    if missing:
        raise CampaignError("bench.cmd", f"{where} has no number in {', '.join(missing)} (fields: "
                                         f"{', '.join(obj) or 'none'}); name the fields with "
                                         "--timed-trace-label-timestamp, --timed-trace-label-input-length, "
                                         "--timed-trace-label-output-length")
    ids = obj.get(hashes) or []
    if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
        raise CampaignError("bench.cmd", f"{where}: {hashes!r} must be a list of integers")
    for k in (inp, outp):
        if obj[k] != int(obj[k]) or obj[k] < 1:
            raise CampaignError("bench.cmd", f"{where}: {k!r} must be a whole number of tokens, at least 1, "
                                             f"got {obj[k]!r}")
    if obj[ts] < 0:
        raise CampaignError("bench.cmd", f"{where}: {ts!r} is negative ({obj[ts]!r}); a trace's timestamps are "
                                         "offsets from its start, 0 or more")
    return TraceEntry(float(obj[ts]) * mult, int(obj[inp]), int(obj[outp]), tuple(ids), i)


@lru_cache(maxsize=8)
def _read(path: str, mtime: int, labels: tuple[str, str, str, str], mult: float) -> _Trace:
    out, blank = [], 0
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            blank += 1
            continue
        out.append(parse_line(line, i, path, labels, mult))
    if not out:
        raise CampaignError("bench.cmd", f"trace {path} has no request (an empty file)")
    if blank:
        log.warning("trace %s: %d blank line(s) skipped", path, blank)
    latest, late = -1.0, []
    for e in out:
        if e.at_s < latest:
            late.append(e.line)
        latest = max(latest, e.at_s)
    if late:
        log.warning("trace %s: %d line(s) out of time order (line %s), replayed in time order", path, len(late),
                    ", ".join(map(str, late[:5])) + (", ..." if len(late) > 5 else ""))
    return _Trace(tuple(sorted(out, key=lambda e: e.at_s)), tuple(late), blank)


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
    for e in trace_entries(opts):
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
            rng = np.random.default_rng([opts.seed, 1 << 50, e.line])
            ids += allowed[rng.integers(0, len(allowed), size=left)].tolist()
        out.append((ids, e.output_len))
    return out

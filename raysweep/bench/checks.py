"""The bench's checks before anything starts (`raysweep validate`, and `run` before its ledger or any server).

- Parameter names: a serve or bench parameter named as a measured result field (`duration`, `completed`,
  `mean_ttft_ms`, `server_*`, ...) would overwrite the measurement in its row, and is refused; the native
  client's time limit is swept as `duration_limit` (the option `--duration-limit`, an alias of `--duration`).
- Parameters that change nothing: a bench parameter that the point's data set does not read (vLLM's own
  sweep example pairs a ShareGPT command with `random_input_len` values: points that send identical requests)
  is refused by name, with the data sets that read it.
- Data files: every data file a campaign names (a trace, a custom or JSONL set, ShareGPT, multi-turn sessions),
  in `bench.cmd` or given as a bench parameter, is read whole as the point will read it, and a truncated or
  non-JSON line, a missing or non-numeric field, an empty file, a file whose entries yield no usable request,
  or a missing local tokenizer where one is needed is refused naming the file, the line and the field. For the
  `command` backend running `vllm bench serve`, the files that vLLM reads are checked for what vLLM needs
  (its own tokenizer is its business).
A refusal is a `CampaignError` (exit 2) naming the campaign field the point comes from.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysweep import grid
from raysweep.bench.options import PROGRAM, LoadOptions, parse_load_options
from raysweep.errors import CampaignError

if TYPE_CHECKING:
    from raysweep.campaign.loading import CampaignSpec

__all__ = ["MEASURED_FIELDS", "check_data_files", "check_param_names", "check_params_used", "is_measured"]

log = logging.getLogger(__name__)

# what a point measures (vLLM's result fields and raysweep's own): never a parameter's name
MEASURED_FIELDS = frozenset({
    "duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
    "request_goodput", "output_throughput", "total_token_throughput", "max_output_tokens_per_s",
    "max_concurrent_requests", "peak_in_flight_requests", "input_lens", "output_lens", "ttfts", "itls",
    "generated_texts", "errors", "errors_sample", "start_time", "end_time", "date", "num_sessions",
    "sessions_failed", "mean_turns_per_session", "per_turn", "reasoning_requests", "num_prompts_sent",
    "achieved_request_rate", "asked_request_rate", "run_number", "elapsed_time", "requests_per_second",
    "tokens_per_second", "avg_latency", "latencies", "percentiles", "bench_wall_s", "started_at", "ended_at",
})
_MEASURED_PATTERN = re.compile(r"^(mean|median|std|p\d+(\.\d+)?)_\w+_ms$|^(server|client|steady|gpu|trace_lines)_"
                               r"|_throughput$|^timeseries_path$|^samples_path$")


def is_measured(name: str) -> bool:
    """Whether a name is one of a point's measured fields."""
    key = grid.normalize_key(name)
    return key in MEASURED_FIELDS or bool(_MEASURED_PATTERN.search(key))


def check_param_names(serve_combos: list[dict[str, Any]], bench_combos: list[dict[str, Any]]) -> None:
    """No parameter may be named as a measured field: its value would hide the measurement in the row."""
    for section, combos in (("serve.params", serve_combos), ("bench.params", bench_combos)):
        for i, combo in enumerate(combos):
            for key in combo:
                if is_measured(key):
                    hint = (" (the native client's time limit is swept as `duration_limit`, the option "
                            "--duration-limit)") if grid.normalize_key(key) == "duration" else ""
                    raise CampaignError(f"{section}[{i}].{key}", f"is the name of a measured result field, which "
                                                                 f"a parameter's value would hide in the results"
                                                                 f"{hint}; rename the parameter")


# bench options each data set reads (vllm bench serve's names); the others change nothing for it
_RANDOM = ("random", "random-mm", "random-rerank")
_RANDOM_OPTIONS = ("random_input_len", "input_len", "random_output_len", "random_range_ratio", "random_prefix_len")
_READ_BY: dict[str, tuple[str, ...]] = {
    **{k: (*_RANDOM, "multi_turn") for k in _RANDOM_OPTIONS},
    "sharegpt_output_len": ("sharegpt", "multi_turn"),
    "custom_output_len": ("custom", "jsonl"),
    **{f"prefix_repetition_{k}": ("prefix_repetition", "prefix") for k in ("prefix_len", "suffix_len",
                                                                          "num_prefixes", "output_len")},
    **{k: ("timed_trace",) for k in ("timed_trace_chunk_hash_size", "timed_trace_sec_multiplier",
                                     "timed_trace_label_timestamp", "timed_trace_label_input_length",
                                     "timed_trace_label_output_length", "timed_trace_label_hash_ids",
                                     "trace_format", "trace_speedup")},
    "multi_turn_turns": ("multi_turn",), "multi_turn_think_time": ("multi_turn",),
}


def _dataset(argv: list[str]) -> str:
    name = grid.find_flag_value(argv, "--dataset-name", "--dataset_name") or "random"
    return "prefix_repetition" if name == "prefix" else name


def _is_vllm_bench_serve(argv: list[str]) -> bool:
    head = [t for t in argv[:4] if not t.startswith("-")]
    return not head or tuple(head[:3]) == PROGRAM


def _unused(key: str, argv: list[str]) -> str | None:
    """Why a bench option changes nothing for this point's data set, or None."""
    name = _dataset(argv)
    has_file = grid.find_flag_value(argv, "--dataset-path", "--dataset_path") is not None
    readers = _READ_BY.get(key)
    if readers is not None and name not in readers:
        return f"is not read by --dataset-name {name} (only by {', '.join(r for r in readers if r != 'prefix')})"
    if name == "multi_turn":
        if has_file and key in _RANDOM_OPTIONS:
            return "is not read by --dataset-name multi_turn with a --dataset-path (its turns come from the file)"
        if not has_file and key == "sharegpt_output_len":
            return "is only read by --dataset-name multi_turn with a --dataset-path (synthetic turns use " \
                   "--random-output-len)"
    self_timed = name == "timed_trace" and "--no-self-timed" not in argv and "--no_self_timed" not in argv
    if self_timed and key in ("request_rate", "burstiness"):
        return "is not read by a self-timed trace replay (the trace's timestamps are the arrivals; add " \
               "--no-self-timed to replay at --request-rate)"
    return None


def check_params_used(argv: list[str], combos: list[dict[str, Any]], origins: list[str | None]) -> None:
    """Refuse, by name, a bench parameter that changes nothing for its point's data set (every value would send
    the same requests). Only for `vllm bench serve` commands (either backend)."""
    if not _is_vllm_bench_serve(argv):
        return
    for i, combo in enumerate(combos):
        cmd = grid.apply_to_cmd(argv, combo)
        for key, value in combo.items():
            if value is None:
                continue
            why = _unused(grid.normalize_key(key), cmd)
            if why:
                where = f"{origins[i]}: " if i < len(origins) and origins[i] else ""
                raise CampaignError(f"bench.params[{i}].{key}", f"{where}{why}: every value would send the same "
                                                                "requests; remove it, or sweep an option this data "
                                                                "set reads")


# -- data files ---------------------------------------------------------------------------------------------

_FILE_SETS = ("sharegpt", "custom", "jsonl", "timed_trace", "multi_turn")
_LOAD_ONLY: dict[str, Any] = {  # what shapes the load, not the requests: points differing only here share a check
    "request_rate": 1.0, "burstiness": 1.0, "max_concurrency": None, "ramp_up_strategy": None,
    "ramp_up_start_rps": None, "ramp_up_end_rps": None, "clients": None, "timeseries_interval": 1.0,
    "trace_speedup": 1.0, "multi_turn_think_time": 0.0, "duration": None, "goodput": {}, "headers": {}}


_CHECKED: dict[str, list[str]] = {}


def _mtime(path: str | None) -> int | None:
    try:
        return Path((path or "").rsplit(":", 1)[0] if ".py:" in (path or "") else path or "").stat().st_mtime_ns
    except OSError:
        return None


def check_data_files(spec: CampaignSpec) -> list[str]:
    """Read every data file of a campaign's bench points as its points will; refuse a bad one (CampaignError
    naming the field, the file, the line and the field in the file). Returns notes worth showing (blank lines
    skipped, trace lines out of order)."""
    if getattr(spec, "offline", False) or spec.campaign.bench is None:
        return []
    native = spec.campaign.bench.backend == "native"
    if not native and not _is_vllm_bench_serve(spec.bench_argv):
        return []
    notes: list[str] = []
    seen: set[str] = set()
    for i, combo in enumerate(spec.bench_combos):
        argv = grid.apply_to_cmd(spec.bench_argv, combo)
        keys = {grid.normalize_key(k) for k in combo}
        fld = f"bench.params[{i}]" if keys & {"dataset_path", "dataset_name", "tokenizer", "model"} else "bench.cmd"
        try:
            opts = parse_load_options(argv, fld) if native else _vllm_options(argv)
        except CampaignError:
            if native:
                raise
            continue  # a command the native parser does not read: vLLM's own checks apply
        key = f"{native}:{replace(opts, **_LOAD_ONLY)!r}:{_mtime(opts.dataset_path)}"
        if key in seen:
            continue
        seen.add(key)
        if key in _CHECKED:  # this process read it unchanged already (`run` checks before its ledger and again)
            notes += _CHECKED[key]
            continue
        try:
            _CHECKED[key] = _check_native(opts) if native else _check_vllm(opts)
            notes += _CHECKED[key]
        except CampaignError as exc:
            raise CampaignError(fld, exc.message) from None
        except Exception as exc:
            raise CampaignError(fld, f"--dataset-path {opts.dataset_path!r} cannot be read as --dataset-name "
                                     f"{opts.dataset_name}: {type(exc).__name__}: {exc}") from None
    for note in notes:
        log.warning("%s", note)
    return list(dict.fromkeys(notes))


def _vllm_options(argv: list[str]) -> LoadOptions:
    """What a `vllm bench serve` command's data set reads, for the command backend (no tokenizer of ours)."""
    def flag(name: str) -> str | None:
        return grid.find_flag_value(argv, f"--{name.replace('_', '-')}", f"--{name}")

    kw: dict[str, Any] = {"dataset_name": _dataset(argv), "dataset_path": flag("dataset_path"),
                          "skip_chat_template": True}
    for name in ("timed_trace_label_timestamp", "timed_trace_label_input_length", "timed_trace_label_output_length",
                 "timed_trace_label_hash_ids"):
        if flag(name):
            kw[name] = flag(name)
    for name, typ in (("timed_trace_sec_multiplier", float), ("custom_output_len", int), ("num_prompts", int)):
        value = flag(name)
        if value:
            try:
                kw[name] = typ(value)
            except ValueError:
                pass
    return LoadOptions(**kw)


def _check_native(opts: LoadOptions) -> list[str]:
    """Build the point's requests from its file (every line read and checked), or check its tokenizer."""
    if opts.dataset_name not in _FILE_SETS:
        # random ids need no tokenizer to be checked; text prompts and the chat API need one: loaded to check
        if opts.chat or opts.prompt_format == "text":
            from raysweep.bench import text

            text.load_vocab(opts, need_tokenizer=True)
        return []
    from raysweep.bench import datasets, sessions, text

    if opts.dataset_name == "multi_turn":
        sessions.conversations(opts, text.tokenizer_for(opts))
        return []
    reqs = datasets.make_requests(opts)
    return _notes(opts, len(reqs))


def _check_vllm(opts: LoadOptions) -> list[str]:
    """The files `vllm bench serve` reads: a trace, a custom JSONL set (vLLM takes .jsonl only), ShareGPT."""
    from raysweep.bench import datasets

    path = opts.dataset_path
    if opts.dataset_name not in ("sharegpt", "custom", "timed_trace") or not path:
        return []
    if not Path(path).is_file():
        raise CampaignError("bench.cmd", f"--dataset-path {path!r} is not a file on this machine")
    if opts.dataset_name == "custom":
        if not path.endswith(".jsonl"):
            raise CampaignError("bench.cmd", f"--dataset-path {path!r}: vllm bench serve reads a custom set from a "
                                             ".jsonl file only")
        return _notes(opts, len(datasets.make_requests(opts)))
    if opts.dataset_name == "timed_trace":
        datasets.make_requests(replace(opts, prompt_format="token_ids"))
        return _notes(opts, 0)
    try:
        data = json.loads(Path(path).read_text())
    except ValueError as exc:
        raise CampaignError("bench.cmd", f"--dataset-path {path} is not ShareGPT JSON: {exc}") from None
    if not datasets.sharegpt_pairs(data, Path(path)):
        raise CampaignError("bench.cmd", f"the ShareGPT file {path} yields no usable request (no conversation "
                                         "of two turns)")
    return []


def _notes(opts: LoadOptions, made: int) -> list[str]:
    out = []
    if opts.dataset_name == "timed_trace":
        from raysweep.bench.trace import trace_report

        rep = trace_report(opts)
        if rep["trace_blank_lines"]:
            out.append(f"{opts.dataset_path}: {rep['trace_blank_lines']} blank line(s) skipped")
        if rep["trace_lines_out_of_order"]:
            out.append(f"{opts.dataset_path}: {rep['trace_lines_out_of_order']} line(s) out of time order, "
                       "replayed in time order")
    elif opts.dataset_path and made and not (opts.dataset_name == "custom" and ".py:" in opts.dataset_path):
        blank = sum(1 for line in Path(opts.dataset_path).read_text().splitlines() if not line.strip())
        if blank:
            out.append(f"{opts.dataset_path}: {blank} blank line(s) skipped")
    return out

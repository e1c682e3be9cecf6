"""The load options of the `native` backend, read from `vllm bench serve` flags.

A campaign that runs `vllm bench serve` can switch to the native client without rewriting anything: the
benchmark command (`bench.cmd` plus each point's parameters) is parsed with the same option names and
defaults as `vllm bench serve`. Options the native client does not implement are refused at load time,
naming the option and listing what is accepted; options that only shape vLLM's own output files are
accepted and ignored.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from raysweep.bench.load import Load
from raysweep.errors import CampaignError

__all__ = ["DATASETS", "PROGRAM", "LoadOptions", "parse_load_options"]

PROGRAM = ("vllm", "bench", "serve")
DATASETS = ("random", "sharegpt", "custom", "jsonl", "prefix_repetition", "prefix", "timed_trace", "multi_turn")
# `vllm bench serve` data sets the native client does not build: refused, naming `backend: command`
VLLM_ONLY_DATASETS = ("burstgpt", "random-mm", "random-rerank", "hf", "custom_audio", "custom_image", "spec_bench",
                      "speed_bench", "sonnet")
# `vllm bench serve` options the native client does not implement, each refused with what to do instead
VLLM_ONLY_OPTIONS = {
    "num_warmups": "use the campaign's `warmup`", "profile": None, "use_beam_search": None, "logprobs": None,
    "no_stream": None, "insecure": None, "lora_modules": None, "lora_assignment": None,
    "enable_multimodal_chat": None,
    "plot_dataset_stats": None, "plot_timeline": None, "timeline_itl_thresholds": None,
    "probe_request_rate": None, "custom_ensure_client_side_data": None, "no_reranker": None,
    "random_batch_size": None, "random_mm_base_items_per_request": None, "random_mm_bucket_config": None,
    "random_mm_limit_mm_per_prompt": None, "random_mm_num_mm_items_range_ratio": None,
    "hf_name": None, "hf_split": None, "hf_subset": None, "hf_output_len": None,
    "spec_bench_category": None, "spec_bench_output_len": None, "speed_bench_category": None,
    "speed_bench_dataset_subset": None, "speed_bench_output_len": None, "asr_max_audio_len_sec": None,
    "asr_min_audio_len_sec": None, "bfcl_categories": None, "blazedit_max_distance": None,
    "blazedit_min_distance": None,
}
# what the timed_trace data set reads, as vLLM names it; `--trace-format mooncake` presets Mooncake's units
TRACE_FORMATS = {"vllm": (16, 1.0), "mooncake": (512, 0.001)}  # (hash block size in tokens, s per time unit)
# raysweep's own --prompt-format: how the random sets' prompts go to the completions API. `text` is what
# `vllm bench serve` sends (the server tokenizes); `token_ids` skips the tokenizer; `auto` is text when the
# model's tokenizer is readable locally, else token ids.
PROMPT_FORMATS = ("auto", "text", "token_ids")
BACKENDS = {"openai": "/v1/completions", "vllm": "/v1/completions", "openai-chat": "/v1/chat/completions"}
PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")
GOODPUT_METRICS = ("ttft", "tpot", "e2el")
# vLLM options that only shape vLLM's own output or console: accepted and ignored
_IGNORED = ("save_result", "save_detailed", "append_result", "result_dir", "result_filename", "label",
            "metadata", "disable_tqdm", "trust_remote_code", "ready_check_timeout_sec", "host", "port",
            "base_url", "request_id_prefix", "skip_tokenizer_init", "tokenizer_mode", "percentile_metrics")
_FLAGS_IGNORED = {"save_result", "save_detailed", "append_result", "disable_tqdm", "trust_remote_code",
                  "skip_tokenizer_init"}


@dataclass(frozen=True)
class LoadOptions:
    """One benchmark point's load, as the native client runs it."""

    model: str | None = None
    served_model_name: str | None = None
    tokenizer: str | None = None
    backend: str = "openai"
    endpoint: str | None = None
    dataset_name: str = "random"
    dataset_path: str | None = None
    num_prompts: int = 1000
    seed: int = 0
    random_input_len: int = 1024
    random_output_len: int = 128
    random_range_ratio: float = 0.0
    random_prefix_len: int = 0
    sharegpt_output_len: int | None = None
    custom_output_len: int = 256
    prefix_repetition_prefix_len: int = 256
    prefix_repetition_suffix_len: int = 256
    prefix_repetition_num_prefixes: int = 10
    prefix_repetition_output_len: int = 128
    request_rate: float = math.inf
    burstiness: float = 1.0
    max_concurrency: int | None = None
    ramp_up_strategy: str | None = None
    ramp_up_start_rps: float | None = None
    ramp_up_end_rps: float | None = None
    ignore_eos: bool = False
    disable_shuffle: bool = False
    no_oversample: bool = False
    skip_chat_template: bool = False        # vLLM's: the custom set's prompts go without the chat template
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    sampling: dict[str, Any] = field(default_factory=dict)
    extra_body: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    metric_percentiles: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0)
    goodput: dict[str, float] = field(default_factory=dict)
    vocab_size: int | None = None
    clients: int | None = None
    prompt_format: str = "auto"   # raysweep's own: how random prompts are sent (see datasets.py)
    # workloads (raysweep/bench/trace.py, sessions.py, timeseries.py): see docs/workloads.md
    duration: float | None = None           # raysweep's own: the point sends for this long, not N requests
    timed_trace_chunk_hash_size: int = 16   # vLLM's timed_trace options
    timed_trace_sec_multiplier: float = 1.0
    timed_trace_label_timestamp: str = "timestamp"
    timed_trace_label_input_length: str = "input_length"
    timed_trace_label_output_length: str = "output_length"
    timed_trace_label_hash_ids: str = "hash_ids"
    self_timed: bool | None = None
    trace_speedup: float = 1.0              # raysweep's own: the trace's timeline runs this many times faster
    multi_turn_turns: int | None = None     # raysweep's own multi-turn options
    multi_turn_think_time: float = 0.0
    timeseries_interval: float = 1.0        # raysweep's own: the time series' bin, s

    @property
    def load(self) -> Load:
        """The point's load, typed (`raysweep.bench.load`)."""
        return Load(max_concurrency=self.max_concurrency, request_rate=self.request_rate)

    @property
    def timed(self) -> bool:
        """Whether the requests keep the trace's own timestamps (vLLM's --self-timed; on for timed_trace)."""
        return self.dataset_name == "timed_trace" and self.self_timed is not False

    @property
    def path(self) -> str:
        return self.endpoint or BACKENDS[self.backend]

    @property
    def chat(self) -> bool:
        return self.path.rstrip("/").endswith("chat/completions")

    @property
    def served_name(self) -> str | None:
        return self.served_model_name or self.model

    def with_prompts(self, n: int) -> LoadOptions:
        from dataclasses import replace
        return replace(self, num_prompts=n)


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # never exit: the caller names the field
        raise _Refused(message)


def _opt(p: argparse.ArgumentParser, name: str, **kw: Any) -> None:
    flags = [f"--{name.replace('_', '-')}"] + ([f"--{name}"] if "_" in name else [])
    p.add_argument(*flags, dest=name, **kw)


def _build_parser() -> _Parser:
    p = _Parser(prog="vllm bench serve (native)", add_help=False, allow_abbrev=False)
    for name in ("model", "served_model_name", "tokenizer", "endpoint", "dataset_path", "ramp_up_strategy",
                 "extra_body", "metric_percentiles"):
        _opt(p, name)
    _opt(p, "backend", choices=sorted(BACKENDS))
    _opt(p, "dataset_name", choices=DATASETS)
    _opt(p, "prompt_format", choices=PROMPT_FORMATS)
    _opt(p, "trace_format", choices=sorted(TRACE_FORMATS))
    for name in ("timed_trace_label_timestamp", "timed_trace_label_input_length", "timed_trace_label_output_length",
                 "timed_trace_label_hash_ids"):
        _opt(p, name)
    for name in ("timed_trace_sec_multiplier", "trace_speedup", "multi_turn_think_time", "timeseries_interval"):
        _opt(p, name, type=float)
    # raysweep's time limit; swept as `duration_limit` (a `duration` parameter would hide the measured duration)
    p.add_argument("--duration", "--duration-limit", "--duration_limit", dest="duration", type=float)
    for name in ("timed_trace_chunk_hash_size", "multi_turn_turns"):
        _opt(p, name, type=int)
    p.add_argument("--self-timed", "--self_timed", dest="self_timed", action=argparse.BooleanOptionalAction,
                   default=None)
    for name in ("num_prompts", "seed", "random_input_len", "random_output_len", "random_prefix_len",
                 "sharegpt_output_len", "custom_output_len", "prefix_repetition_prefix_len",
                 "prefix_repetition_suffix_len", "prefix_repetition_num_prefixes", "prefix_repetition_output_len",
                 "max_concurrency", "input_len", "output_len", "vocab_size", "clients", "top_k", "max_tokens"):
        _opt(p, name, type=int)
    for name in ("request_rate", "burstiness", "ramp_up_start_rps", "ramp_up_end_rps", "temperature", "top_p",
                 "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty"):
        _opt(p, name, type=float)
    _opt(p, "random_range_ratio")
    for name in ("ignore_eos", "disable_shuffle", "no_oversample", "skip_chat_template"):
        _opt(p, name, action="store_true")
    _opt(p, "chat_template_kwargs")
    _opt(p, "header", action="append", default=[])
    _opt(p, "goodput", nargs="+", default=[])
    for name in _IGNORED:
        if name in _FLAGS_IGNORED:
            _opt(p, name, action="store_true")
        elif name == "metadata":
            _opt(p, name, nargs="+", default=[])
        else:
            _opt(p, name)
    return p


_PARSER = _build_parser()


def _value_of(argv: list[str], name: str) -> str | None:
    """The value given to an option in an argv (either spelling, `--x v` or `--x=v`), or None."""
    flags = (f"--{name.replace('_', '-')}", f"--{name}")
    for i, token in enumerate(argv):
        key, eq, value = token.partition("=")
        if key in flags:
            return value if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return None


def accepted_options() -> list[str]:
    return sorted(o for a in _PARSER._actions for o in a.option_strings if "_" not in o)


def _unrecognized(argv: list[str]) -> str:
    """Each option of `argv` the native client does not read, with at most three closest names it does."""
    import difflib

    accepted = accepted_options()
    parts = []
    for token in argv:
        name = token.split("=", 1)[0]
        if not name.startswith("--") or "--" + name[2:].replace("_", "-") in accepted:
            continue
        spelled = "--" + name[2:].replace("_", "-")
        near = difflib.get_close_matches(spelled, accepted, n=3, cutoff=0.6)
        parts.append(f"{name}: not an option of the native client (it reads `vllm bench serve`'s options)"
                     + (f"; did you mean {', '.join(near)}?" if near else ""))
    return ("; ".join(parts) or "unrecognized arguments") + (
        f" ({len(accepted)} options accepted; or set "
        "bench.backend: command to run `vllm bench serve` itself)")


def parse_load_options(argv: list[str], fld: str = "bench.cmd") -> LoadOptions:
    """Parse a `vllm bench serve ...` command line (program tokens optional) into LoadOptions."""
    args_list = list(argv)
    if args_list and not args_list[0].startswith("-"):
        prog = []
        while args_list and not args_list[0].startswith("-"):
            prog.append(args_list.pop(0))
        if tuple(prog) != PROGRAM:
            raise CampaignError(fld, f"the native backend reads `vllm bench serve` options, but the command starts "
                                     f"with {' '.join(prog)!r}; write `vllm bench serve --model ...` (or only the "
                                     f"options), or set bench.backend: command to run another program")
    try:
        ns = _PARSER.parse_args(args_list)
    except _Refused as exc:
        msg = str(exc)
        for token in args_list:
            if token.startswith("--") and (why := refusal(token)):
                raise CampaignError(fld, why) from None
        if "--dataset-name" in msg or "--dataset_name" in msg:
            given = _value_of(args_list, "dataset_name")
            if given in VLLM_ONLY_DATASETS:
                raise CampaignError(fld, f"--dataset-name {given} is a `vllm bench serve` data set the native "
                                         f"client does not build (it builds {', '.join(DATASETS)}); set "
                                         "bench.backend: command to run `vllm bench serve` itself") from None
        if "unrecognized arguments" in msg:
            msg = _unrecognized(args_list)
        raise CampaignError(fld, msg) from None
    return _to_options(vars(ns), fld)


def _json_object(a: dict[str, Any], option: str, bad: Callable[[str, str], CampaignError]) -> dict[str, Any]:
    """The value of an option that takes a JSON object (--extra-body, --chat-template-kwargs)."""
    try:
        value = json.loads(a[option])
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise bad(option, f"must be a JSON object, got {a[option]!r}")
    return value


def _to_options(a: dict[str, Any], fld: str) -> LoadOptions:
    def bad(option: str, what: str) -> CampaignError:
        return CampaignError(fld, f"--{option.replace('_', '-')} {what}")

    kw: dict[str, Any] = {}
    for name in ("model", "served_model_name", "tokenizer", "endpoint", "dataset_path", "backend", "dataset_name",
                 "num_prompts", "seed", "random_input_len", "random_output_len", "random_prefix_len",
                 "sharegpt_output_len", "custom_output_len", "prefix_repetition_prefix_len",
                 "prefix_repetition_suffix_len", "prefix_repetition_num_prefixes", "prefix_repetition_output_len",
                 "max_concurrency", "request_rate", "burstiness", "ramp_up_strategy", "ramp_up_start_rps",
                 "ramp_up_end_rps", "vocab_size", "clients", "prompt_format", *_WORKLOAD_OPTIONS):
        if a.get(name) is not None:
            kw[name] = a[name]
    if a.get("input_len") is not None:
        kw["random_input_len"] = a["input_len"]
    if a.get("output_len") is not None:
        for k in ("random_output_len", "sharegpt_output_len", "custom_output_len", "prefix_repetition_output_len"):
            kw[k] = a["output_len"]
    if a.get("max_tokens") is not None:
        kw["random_output_len"] = a["max_tokens"]
    for name in ("num_prompts", "random_input_len", "prefix_repetition_num_prefixes", "clients", "max_concurrency",
                 "vocab_size"):
        if name in kw and kw[name] < 1:
            raise bad(name, f"must be at least 1, got {kw[name]}")
    for name in ("random_output_len", "random_prefix_len", "prefix_repetition_prefix_len",
                 "prefix_repetition_suffix_len", "prefix_repetition_output_len", "seed"):
        if name in kw and kw[name] < 0:
            raise bad(name, f"must be 0 or more, got {kw[name]}")
    if "request_rate" in kw and not kw["request_rate"] > 0:
        raise bad("request_rate", f"must be a positive number of requests per second or inf, got {kw['request_rate']}")
    if "burstiness" in kw and not kw["burstiness"] > 0:
        raise bad("burstiness", f"must be positive (1 = Poisson, <1 burstier, >1 steadier), got {kw['burstiness']}")
    if a.get("random_range_ratio") is not None:
        try:
            r = float(a["random_range_ratio"])
        except ValueError:
            raise bad("random_range_ratio", f"must be a number in [0, 1), got {a['random_range_ratio']!r}") from None
        if not 0 <= r < 1:
            raise bad("random_range_ratio", f"must be in [0, 1), got {r}")
        kw["random_range_ratio"] = r
    ramp = kw.get("ramp_up_strategy")
    if ramp is not None:
        if ramp not in ("linear", "exponential"):
            raise bad("ramp_up_strategy", f"accepts linear or exponential, got {ramp!r}")
        if "request_rate" in kw:
            raise bad("ramp_up_strategy", "and --request-rate exclude each other (as in vllm bench serve)")
        s, e = kw.get("ramp_up_start_rps"), kw.get("ramp_up_end_rps")
        if s is None or e is None or s < 0 or e <= 0 or (ramp == "exponential" and s <= 0):
            raise bad("ramp_up_strategy", "needs --ramp-up-start-rps and --ramp-up-end-rps (positive)")
        if s > e:
            raise bad("ramp_up_start_rps", f"must not exceed --ramp-up-end-rps ({s:g} > {e:g}; as in vllm bench serve)")
        if s == 0:  # vLLM's scheduler asserts a positive rate for every request: the first would have rate 0
            raise bad("ramp_up_start_rps", "must be above 0: the first request of a ramp is sent at the start rate "
                                           "(vllm bench serve refuses 0 too)")
    if a.get("metric_percentiles"):
        try:
            pcts = tuple(sorted({float(x) for x in str(a["metric_percentiles"]).split(",") if x.strip()}))
        except ValueError:
            raise bad("metric_percentiles",
                      f"must be comma-separated numbers, got {a['metric_percentiles']!r}") from None
        if not pcts or not all(0 <= p <= 100 for p in pcts):
            raise bad("metric_percentiles", f"takes comma-separated percentiles from 0 to 100, got "
                                            f"{a['metric_percentiles']!r}")
        kw["metric_percentiles"] = tuple(sorted(set(pcts) | {50.0, 90.0, 95.0, 99.0}))
    goodput = {}
    for item in a.get("goodput") or []:
        key, sep, value = item.partition(":")
        if not sep or key not in GOODPUT_METRICS:
            raise bad("goodput", f"takes KEY:VALUE pairs with KEY in {', '.join(GOODPUT_METRICS)} (ms), got {item!r}")
        try:
            goodput[key] = float(value)
        except ValueError:
            raise bad("goodput", f"value of {key} must be a number of milliseconds, got {value!r}") from None
        if goodput[key] < 0:
            raise bad("goodput", f"value of {key} must be 0 or more, got {value!r}")
    kw["goodput"] = goodput
    sampling = {k: a[k] for k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                                  "frequency_penalty", "presence_penalty") if a.get(k) is not None}
    kw["sampling"] = sampling
    if a.get("extra_body"):
        kw["extra_body"] = _json_object(a, "extra_body", bad)
    headers = {}
    for item in a.get("header") or []:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise bad("header", f"takes KEY=VALUE, got {item!r}")
        headers[k] = v
    kw["headers"] = headers
    name = kw.get("dataset_name", "random")
    if name == "prefix":
        kw["dataset_name"] = name = "prefix_repetition"
    # vllm bench serve forces ignore_eos for the random set and for trace replay (the output lengths are the asked
    # ones, the trace's own for a trace)
    kw["ignore_eos"] = bool(a.get("ignore_eos")) or name in ("random", "timed_trace")
    kw["disable_shuffle"], kw["no_oversample"] = bool(a.get("disable_shuffle")), bool(a.get("no_oversample"))
    kw["skip_chat_template"] = bool(a.get("skip_chat_template"))
    if a.get("chat_template_kwargs"):
        kw["chat_template_kwargs"] = _json_object(a, "chat_template_kwargs", bad)
    if name == "prefix_repetition" and kw.get("num_prompts", 1000) < kw.get("prefix_repetition_num_prefixes", 10):
        raise bad("num_prompts", f"({kw.get('num_prompts', 1000)}) must be at least --prefix-repetition-num-prefixes "
                                 f"({kw.get('prefix_repetition_num_prefixes', 10)}) for --dataset-name "
                                 "prefix_repetition, as in vllm bench serve")
    if name in ("sharegpt", "custom", "jsonl") and not kw.get("dataset_path"):
        raise bad("dataset_path", f"is required by --dataset-name {name}"
                  + (" (a .jsonl file, or FILE.py:FUNCTION for a Python hook)" if name == "custom" else ""))
    _check_workload(kw, a, bad)
    return LoadOptions(**kw)


_WORKLOAD_OPTIONS = ("duration", "timed_trace_chunk_hash_size", "timed_trace_sec_multiplier",
                     "timed_trace_label_timestamp", "timed_trace_label_input_length",
                     "timed_trace_label_output_length", "timed_trace_label_hash_ids", "self_timed", "trace_speedup",
                     "multi_turn_turns", "multi_turn_think_time", "timeseries_interval")


def _check_workload(kw: dict[str, Any], a: dict[str, Any], bad: Callable[[str, str], CampaignError]) -> None:
    """The workload options (duration, timed traces, multi-turn sessions, time series), checked in place."""
    name = kw.get("dataset_name", "random")
    if a.get("trace_format"):
        size, mult = TRACE_FORMATS[a["trace_format"]]
        kw.setdefault("timed_trace_chunk_hash_size", size)
        kw.setdefault("timed_trace_sec_multiplier", mult)
    for opt in ("duration", "trace_speedup", "timeseries_interval", "timed_trace_sec_multiplier"):
        if opt in kw and not (kw[opt] > 0 and math.isfinite(kw[opt])):
            raise bad(opt, f"must be a positive number, got {kw[opt]}")
    if kw.get("timed_trace_chunk_hash_size", 1) < 1:
        raise bad("timed_trace_chunk_hash_size", f"must be at least 1, got {kw['timed_trace_chunk_hash_size']}")
    if kw.get("multi_turn_turns", 1) < 1:
        raise bad("multi_turn_turns", f"must be at least 1, got {kw['multi_turn_turns']}")
    if kw.get("multi_turn_think_time", 0.0) < 0:
        raise bad("multi_turn_think_time", f"must be 0 or more seconds, got {kw['multi_turn_think_time']}")
    if kw.get("self_timed") is not None and name != "timed_trace":
        raise bad("self_timed", "is only supported with --dataset-name timed_trace (as in vllm bench serve)")
    if name == "timed_trace" and not kw.get("dataset_path"):
        raise bad("dataset_path", "is required by --dataset-name timed_trace (a JSONL trace)")
    if name == "timed_trace" and str(kw.get("endpoint") or BACKENDS[kw.get("backend", "openai")]).rstrip(
            "/").endswith("chat/completions"):
        raise bad("dataset_name", "timed_trace replays token ids and needs the completions API, as in vllm bench "
                                  "serve: use --backend openai (or vllm)")
    if name == "multi_turn" and not str(kw.get("endpoint") or BACKENDS[kw.get("backend", "openai")]).rstrip(
            "/").endswith("chat/completions"):
        raise bad("dataset_name", "multi_turn sends each turn with the conversation so far, which needs the chat "
                                  "API: add --backend openai-chat")
    for opt in ("trace_speedup",):
        if opt in kw and name != "timed_trace":
            raise bad(opt, "is only for --dataset-name timed_trace")
    for opt in ("multi_turn_turns", "multi_turn_think_time"):
        if opt in kw and name != "multi_turn":
            raise bad(opt, "is only for --dataset-name multi_turn")
    if kw.get("duration") is not None:
        timed = name == "timed_trace" and kw.get("self_timed") is not False
        if kw.get("ramp_up_strategy"):
            raise bad("duration", "and --ramp-up-strategy exclude each other (a ramp is defined over its requests)")
        if not timed and math.isinf(kw.get("request_rate", math.inf)) and not kw.get("max_concurrency"):
            raise bad("duration", "needs --max-concurrency (a closed loop) or a finite --request-rate: a burst "
                                  "sends everything at once")


def refusal(option: str) -> str | None:
    """Why a `vllm bench serve` option is refused by the native client, or None when it is not one of those."""
    name = option.lstrip("-").split("=", 1)[0].replace("-", "_")
    if name.startswith("no_") and name[3:] in VLLM_ONLY_OPTIONS and name not in VLLM_ONLY_OPTIONS:
        name = name[3:]
    if name not in VLLM_ONLY_OPTIONS:
        return None
    instead = VLLM_ONLY_OPTIONS[name]
    return (f"--{name.replace('_', '-')} is a `vllm bench serve` option the native client does not implement"
            + (f" ({instead})" if instead else "") + "; set bench.backend: command to run `vllm bench serve` "
            "itself with it")

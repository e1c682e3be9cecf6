"""Offline points: `vllm bench throughput` and `vllm bench latency`, run to their end with `--output-json`.

No server and no client: the command loads the engine, runs its requests and writes one JSON. Its keys
become result columns in the names the rest of raysweep uses:

- throughput (`elapsed_time`, `num_requests`, `total_num_tokens`, `requests_per_second`,
  `tokens_per_second`): `duration`, `completed`, `request_throughput`, `total_token_throughput`, and,
  from the two `Total num prompt|output tokens:` lines the command prints (the JSON lacks them),
  `total_input_tokens`, `total_output_tokens` and `output_throughput`;
- latency (`avg_latency`, `latencies`, `percentiles` in seconds): `mean_latency_ms`,
  `median_latency_ms`, `pNN_latency_ms`, `std_latency_ms`, `num_iters`.
The JSON's own keys are kept as well.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from typing import Any

from raysweep import grid
from raysweep.errors import CampaignError

__all__ = ["KINDS", "BENCH_ONLY_FLAGS", "offline_argv", "offline_kind", "parse_result", "worker_argv"]

KINDS = ("throughput", "latency", "startup")
# The options of `vllm bench throughput|latency` that are not engine options (vLLM 0.32): a follower node
# runs `vllm serve MODEL --headless` with the engine options only. Switches take no value.
_BENCH_SWITCHES = frozenset((
    "async-engine", "disable-detokenize", "enable-log-requests", "enable-multimodal-chat", "hf-enable-torch-compile",
    "no-enable-log-requests", "no-oversample", "no-reranker", "prequeue-requests", "profile", "use-beam-search"))
_BENCH_VALUED = frozenset((
    "asr-max-audio-len-sec", "asr-min-audio-len-sec", "backend", "batch-size", "custom-output-len", "dataset-name",
    "dataset-path", "hf-max-batch-size", "hf-name", "hf-split", "hf-subset", "input-len", "lora-assignment",
    "lora-path", "n", "num-iters", "num-iters-warmup", "num-prompts", "num-warmups", "output-json", "output-len",
    "prefix-len", "prefix-repetition-num-prefixes", "prefix-repetition-output-len", "prefix-repetition-prefix-len",
    "prefix-repetition-suffix-len", "random-batch-size", "random-input-len", "random-mm-base-items-per-request",
    "random-mm-bucket-config", "random-mm-limit-mm-per-prompt", "random-mm-num-mm-items-range-ratio",
    "random-output-len", "random-prefix-len", "random-range-ratio"))
BENCH_ONLY_FLAGS = _BENCH_SWITCHES | _BENCH_VALUED
_TOKENS = re.compile(r"Total num (?P<kind>prompt|output) tokens:\s*(?P<n>\d+)")


def offline_kind(argv: list[str]) -> str:
    """`throughput` or `latency`: the first of those words before the command's first `--option`."""
    for tok in argv[:8]:
        if tok.startswith("--"):
            break
        if tok in KINDS:
            return tok
    raise CampaignError("offline.cmd", f"must be `vllm bench throughput ...` or `vllm bench latency ...` (or "
                                       "`vllm bench startup ...`) "
                                       f"(got {grid.shell_join(argv[:4])} ...)")


def offline_argv(argv: list[str], json_path: str) -> list[str]:
    """The point's command with its JSON sent to `json_path`."""
    return grid.apply_to_cmd(argv, {"output_json": json_path})


def worker_argv(argv: list[str]) -> list[str]:
    """What a follower node of a multi-node offline point runs: vLLM's offline benchmarks cannot run on a
    follower (its engine refuses: "collective_rpc should not be called on follower node"), so the follower
    is `vllm serve MODEL` with the point's engine options (the benchmark's own options dropped); the caller
    adds `--headless` and the multi-node flags. `vllm ... bench throughput --model M -tp 4` gives
    `vllm ... serve M -tp 4`."""
    kind_at = next(i for i, tok in enumerate(argv) if tok in KINDS)
    prefix = argv[:kind_at - 1] if kind_at and argv[kind_at - 1] == "bench" else argv[:kind_at]
    rest, model, i = [], None, kind_at + 1
    while i < len(argv):
        tok = argv[i]
        name, eq, _ = tok[2:].partition("=") if tok.startswith("--") else ("", "", "")
        takes_value = not eq and i + 1 < len(argv) and not argv[i + 1].startswith("--")
        if name == "model":
            model = tok.split("=", 1)[1] if eq else argv[i + 1] if takes_value else None
            i += 1 if eq or not takes_value else 2
        elif name in _BENCH_SWITCHES:
            i += 1
        elif name in _BENCH_VALUED:
            i += 1 if eq or not takes_value else 2
        else:
            rest.append(tok)
            i += 1
    return [*prefix, "serve", *([model] if model else []), *rest]


def parse_result(kind: str, json_text: str, log_text: str = "") -> dict[str, Any]:
    """The result fields of one offline run from its JSON (and its printed token counts)."""
    data = json.loads(json_text)
    if not isinstance(data, dict):
        raise ValueError("the result JSON is not an object")
    res: dict[str, Any] = {"offline_kind": kind, **{k: v for k, v in data.items() if k != "latencies"}}
    if kind == "throughput":
        res.update(_throughput(data, log_text))
    elif kind == "startup":
        res = {"offline_kind": kind, **_startup(data)}
    else:
        res.update(_latency(data))
    return res


def _startup(data: dict[str, Any]) -> dict[str, Any]:
    """`vllm bench startup`'s JSON: per phase (cold, warm) and metric (startup, compilation, encoder
    compilation) the mean over its iterations, their spread and count, in seconds: `cold_startup_s`,
    `cold_startup_std_s`, `cold_startup_iters`, `warm_compilation_s`, ..."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        m = re.fullmatch(r"avg_(cold|warm)_(startup|compilation|encoder_compilation)_time", key)
        if m is None:
            continue
        name = f"{m.group(1)}_{m.group(2)}"
        times = [float(t) for t in data.get(f"{name}_times") or []]
        out[f"{name}_s"] = float(value)
        out[f"{name}_iters"] = len(times)
        if len(times) > 1:
            out[f"{name}_std_s"] = statistics.stdev(times)
            out[f"{name}_min_s"], out[f"{name}_max_s"] = min(times), max(times)
    if not out:
        raise ValueError("no avg_cold_startup_time or avg_warm_startup_time in the result JSON")
    return out


def _throughput(data: dict[str, Any], log_text: str) -> dict[str, Any]:
    elapsed = float(data["elapsed_time"])
    out: dict[str, Any] = {"duration": elapsed, "completed": int(data.get("num_requests") or 0), "failed": 0,
                           "request_throughput": float(data["requests_per_second"]),
                           "total_token_throughput": float(data["tokens_per_second"])}
    counts = {m.group("kind"): int(m.group("n")) for m in _TOKENS.finditer(log_text)}
    if "output" in counts:
        out["total_output_tokens"] = counts["output"]
        out["output_throughput"] = counts["output"] / elapsed if elapsed > 0 else math.nan
    if "prompt" in counts:
        out["total_input_tokens"] = counts["prompt"]
    return out


def _latency(data: dict[str, Any]) -> dict[str, Any]:
    lat = [float(x) for x in data.get("latencies") or []]
    out: dict[str, Any] = {"mean_latency_ms": 1000.0 * float(data["avg_latency"]), "num_iters": len(lat)}
    if lat:
        out["median_latency_ms"] = 1000.0 * statistics.median(lat)
        out["std_latency_ms"] = 1000.0 * statistics.pstdev(lat)
        out["min_latency_ms"], out["max_latency_ms"] = 1000.0 * min(lat), 1000.0 * max(lat)
    for pct, value in (data.get("percentiles") or {}).items():
        out[f"p{int(float(pct))}_latency_ms"] = 1000.0 * float(value)
    return out

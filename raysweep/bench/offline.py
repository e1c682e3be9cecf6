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

__all__ = ["KINDS", "offline_argv", "offline_kind", "parse_result"]

KINDS = ("throughput", "latency")
_TOKENS = re.compile(r"Total num (?P<kind>prompt|output) tokens:\s*(?P<n>\d+)")


def offline_kind(argv: list[str]) -> str:
    """`throughput` or `latency`: the first of those words before the command's first `--option`."""
    for tok in argv[:8]:
        if tok.startswith("--"):
            break
        if tok in KINDS:
            return tok
    raise CampaignError("offline.cmd", f"must be `vllm bench throughput ...` or `vllm bench latency ...` "
                                       f"(got {grid.shell_join(argv[:4])} ...)")


def offline_argv(argv: list[str], json_path: str) -> list[str]:
    """The point's command with its JSON sent to `json_path`."""
    return grid.apply_to_cmd(argv, {"output_json": json_path})


def parse_result(kind: str, json_text: str, log_text: str = "") -> dict[str, Any]:
    """The result fields of one offline run from its JSON (and its printed token counts)."""
    data = json.loads(json_text)
    if not isinstance(data, dict):
        raise ValueError("the result JSON is not an object")
    res: dict[str, Any] = {"offline_kind": kind, **{k: v for k, v in data.items() if k != "latencies"}}
    if kind == "throughput":
        res.update(_throughput(data, log_text))
    else:
        res.update(_latency(data))
    return res


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

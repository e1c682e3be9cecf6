"""What a catalogue row holds: one run, with what makes two runs comparable.

Every row carries
- who: `campaign_id` (stable over re-adds), `campaign`, `source` (raysweep, vllm-sweep, aiperf, guidellm),
  `source_path`, the point (`config`, `point`, `run_number`);
- the model (`model`, `model_revision`);
- the workload: `dataset`, `dataset_params` (the bench command's data-set and sampling flags but the lengths,
  as canonical JSON), `input_len`, `output_len`, their fingerprint `workload` (a hash of those four), and the load
  (`load_variable`: max_concurrency or request_rate, `load_value`);
- the server's effective settings (`server_settings`: its command with the point's parameters applied);
- the hardware (`hardware`: raysweep's signature, GPU type and count, nodes, `interconnect`);
- the versions (vLLM, raysweep, Ray, torch and its `build`: cpu or cuda);
- the date (`date`, seconds since the epoch) and the validity record (`validity_ok`, `validity_issues`,
  `client_limited`);
- the metrics (`METRICS`).

What a source does not say is missing (null), never guessed. `LIKE` is what like-for-like matches on;
`mismatches` says, in words, why two points are not comparable.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from raysweep import grid
from raysweep.bench.load import load_of

__all__ = ["COLUMNS", "LABELS", "LIKE", "METRICS", "bench_fields", "empty_frame", "frame", "mismatches",
           "serve_fields", "workload_id"]

METRICS = ("request_throughput", "output_throughput", "total_token_throughput",
           "mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms",
           "mean_tpot_ms", "median_tpot_ms", "p90_tpot_ms", "p99_tpot_ms",
           "mean_itl_ms", "median_itl_ms", "p99_itl_ms",
           "mean_e2el_ms", "median_e2el_ms", "p99_e2el_ms")

TEXT = ("campaign_id", "campaign", "source", "source_path", "config", "point", "server_settings", "model",
        "model_revision", "workload", "dataset", "dataset_params", "input_len", "output_len", "load_variable",
        "hardware", "gpu_type", "interconnect", "vllm_version", "raysweep_version", "ray_version",
        "torch_version", "build", "validity_issues")
NUMBERS = ("run_number", "load_value", "gpu_count", "num_nodes", "date")
FLAGS = ("validity_ok", "client_limited")
COLUMNS = (*TEXT, *NUMBERS, *FLAGS, *METRICS)

# what like-for-like matches on, in the order a mismatch is named, with the words it is named in
LIKE = ("model", "dataset", "dataset_params", "input_len", "output_len", "load_variable", "load_value", "hardware")
LABELS = {"model": "model", "dataset": "data set", "dataset_params": "data-set parameters",
          "input_len": "input length", "output_len": "output length", "load_variable": "load variable",
          "load_value": "load", "hardware": "hardware", "server_settings": "server settings"}

# bench flags that shape the workload (the data set, its lengths, the sampling), by name or prefix
_WORKLOAD_PREFIXES = ("--dataset-", "--random-", "--sonnet-", "--sharegpt-", "--hf-", "--custom-", "--prefix-",
                      "--input-len", "--output-len", "--num-prompts", "--seed", "--ignore-eos", "--temperature",
                      "--top-p", "--top-k", "--burstiness", "--no-oversample")
_INPUT = ("--random-input-len", "--input-len", "--sonnet-input-len", "--prefix-repetition-prefix-len")
_OUTPUT = ("--random-output-len", "--output-len", "--sonnet-output-len", "--sharegpt-output-len",
           "--custom-output-len", "--hf-output-len", "--prefix-repetition-output-len")


def _flags(argv: Sequence[str]) -> dict[str, str]:
    """`--flag value` and `--flag=value` pairs of a command (a bare flag: "true")."""
    out: dict[str, str] = {}
    for i, tok in enumerate(argv):
        if not tok.startswith("--"):
            continue
        name, eq, value = tok.partition("=")
        if not eq:
            value = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else "true"
        out[name] = value
    return out


def workload_id(dataset: object, params: object, input_len: object, output_len: object) -> str:
    """The workload's fingerprint: a hash of its data set, parameters and lengths (the load apart)."""
    return grid.params_id({"dataset": dataset, "params": params, "input_len": input_len, "output_len": output_len})


def bench_fields(argv: Sequence[str]) -> dict[str, Any]:
    """The workload and load of a bench command (its point's parameters applied)."""
    flags = _flags(argv)
    params = {k: v for k, v in flags.items()
              if k.startswith(_WORKLOAD_PREFIXES) and k not in ("--dataset-name", *_INPUT, *_OUTPUT)}
    dataset = flags.get("--dataset-name")
    input_len = next((flags[f] for f in _INPUT if f in flags), None)
    output_len = next((flags[f] for f in _OUTPUT if f in flags), None)
    load = load_of(argv)
    variable = load.variable
    value = _float(load.value(variable)) if variable is not None else math.nan
    dparams = json.dumps(params, sort_keys=True)
    return {"dataset": dataset, "dataset_params": dparams, "input_len": input_len, "output_len": output_len,
            "workload": workload_id(dataset, dparams, input_len, output_len), "load_variable": variable,
            "load_value": value}


def serve_fields(argv: Sequence[str]) -> dict[str, Any]:
    """The model and the server's effective settings of a serve command (its point's parameters applied)."""
    from raysweep.serve.provenance import model_source

    model, revision = model_source(list(argv))
    return {"model": model, "model_revision": revision, "server_settings": grid.shell_join(list(argv))}


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def empty_frame() -> pd.DataFrame:
    return frame([])


def frame(rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Catalogue rows as a table of exactly `COLUMNS`, typed (missing values null)."""
    df = pd.DataFrame.from_records(list(rows), columns=list(COLUMNS))
    for c in TEXT:
        df[c] = df[c].map(lambda v: None if v is None or (isinstance(v, float) and math.isnan(v)) else str(v))
        df[c] = df[c].astype("string")
    for c in (*NUMBERS, *METRICS):
        df[c] = pd.to_numeric(df[c], errors="coerce").astype("float64")
    for c in FLAGS:
        df[c] = df[c].astype("boolean")
    return df


def mismatches(a: Mapping[str, Any], b: Mapping[str, Any], fields: Sequence[str] = LIKE) -> list[str]:
    """Why two points are not comparable ("not comparable: input length 1024 vs 2048"), one line per field
    that differs; empty when they are."""
    out = []
    for f in fields:
        va, vb = _norm(a.get(f)), _norm(b.get(f))
        if va != vb:
            out.append(f"not comparable: {LABELS.get(f, f)} {_show(va)} vs {_show(vb)}")
    return out


def _norm(value: object) -> Any:
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _show(value: object) -> str:
    return "missing" if value is None else str(value)

"""Benchmark Report v0.2, the results format of llm-d (llm-d/llm-d-benchmark, `benchmark_report/`), which llm-d's
Prism dashboard reads and which llm-d's converters write for the harnesses it runs (inference-perf, GuideLLM,
vLLM's benchmark, InferenceMAX, AIPerf): export of a raysweep campaign, and import of such reports into the
catalogue.

A report describes one measurement: `run` (ids, times), `scenario` (`stack`: the serving components, here one
`inference_engine`; `load`: the workload generator), `results.request_performance.aggregate` (request counts,
latency and throughput `Statistics`: `units`, `mean`, percentiles). raysweep writes one report per point
(server configuration x bench point) over its runs:
- latency: `mean` is the mean over runs of each run's mean, `p50`/`p90`/`p99` the mean over runs of each run's
  percentile (what the runs measured, not a percentile of pooled requests), in ms (ms/token for TPOT and ITL);
- throughput: the mean over runs of each run's rate;
- `raysweep`, an extra field the format allows in a `Statistics` (its only open object in the results), on every
  metric: the confidence interval of the point's value (`ci_low`, `ci_high`, `level`, `method`), the runs it
  rests on and their spread (`std_between_runs`: not a spread of requests); on the campaign's objective metric
  also the point's verdict: `leader`, `tied` (not shown worse than the leader), `behind` (shown worse), `not
  shown` (the data cannot decide) or `not ranked` (not its configuration's best point of that workload), with
  the reason in words. The same verdict is in `run.keywords`.
Everything else the format has no field for (validity issues, drift, server-side metrics) stays in raysweep's
own files.

Import: a report becomes one catalogue row (one run of one point): the model, the accelerator and its count,
the engine's version, the workload (its source, input and output lengths, rate or concurrency), the request
counts and the metrics, converted to raysweep's units (ms, tokens/s, requests/s).
"""

from __future__ import annotations

import datetime
import math
from typing import Any

from raysweep.bench.load import CONCURRENCY, RATE

__all__ = ["LATENCY", "THROUGHPUT", "VERSION", "is_report", "num", "report_rows"]

VERSION = "0.2"
LATENCY = (("ttft", "time_to_first_token", "ms"), ("tpot", "time_per_output_token", "ms/token"),
            ("itl", "inter_token_latency", "ms/token"), ("e2el", "request_latency", "ms"))
THROUGHPUT = (("request_throughput", "request_rate", "queries/s"),
               ("output_throughput", "output_token_rate", "tokens/s"),
               ("total_token_throughput", "total_token_rate", "tokens/s"))
_TO_MS = {"ms": 1.0, "s": 1000.0, "ms/token": 1.0, "s/token": 1000.0}


def num(value: Any) -> float | None:
    """A finite number, or None."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


# ---------------------------------------------------------------------------------------------------
# Import
# ---------------------------------------------------------------------------------------------------

def is_report(data: object) -> bool:
    """Whether parsed YAML/JSON is a Benchmark Report v0.2."""
    return (isinstance(data, dict) and str(data.get("version")) == VERSION and isinstance(data.get("run"), dict)
            and isinstance(data.get("results"), dict))


def _get(data: object, *path: str) -> Any:
    for key in path:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def _ms(stats: object, key: str) -> float:
    if not isinstance(stats, dict):
        return math.nan
    value = num(stats.get(key))
    scale = _TO_MS.get(str(stats.get("units")))
    return value * scale if value is not None and scale is not None else math.nan


def _rate(stats: object, units: str) -> float:
    if not isinstance(stats, dict) or stats.get("units") != units:
        return math.nan
    value = num(stats.get("mean"))
    return value if value is not None else math.nan


def report_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The catalogue row of one report (see the module docstring)."""
    from raysweep.catalog import fields

    engine = next((c for c in _get(data, "scenario", "stack") or []
                   if _get(c, "standardized", "kind") == "inference_engine"), None)
    load = _get(data, "scenario", "load", "standardized") or {}
    agg = _get(data, "results", "request_performance", "aggregate") or {}
    lat, thr = agg.get("latency") or {}, agg.get("throughput") or {}
    acc = _get(engine, "standardized", "accelerator") or {}
    rate, conc = num(load.get("rate_qps")), num(load.get("concurrency"))
    variable, value = (RATE, rate) if rate is not None else (CONCURRENCY, conc) if conc is not None else (None,
                                                                                                          math.nan)
    isl, osl = num(_get(load, "input_seq_len", "value")), num(_get(load, "output_seq_len", "value"))
    dataset = load.get("source")
    failures = num(_get(agg, "requests", "failures")) or 0.0
    tool = load.get("tool") or "unknown"
    par = acc.get("parallelism") or {}
    config = _get(engine, "metadata", "label") or "br"
    dparams = "{}"
    row: dict[str, Any] = {
        "dataset": dataset, "dataset_params": dparams,
        "input_len": f"{isl:g}" if isl is not None else None, "output_len": f"{osl:g}" if osl is not None else None,
        "workload": fields.workload_id(dataset, dparams, f"{isl:g}" if isl is not None else None,
                                       f"{osl:g}" if osl is not None else None),
        "load_variable": variable, "load_value": value if value is not None else math.nan,
        "model": _get(engine, "standardized", "model", "name"), "config": str(config),
        "point": f"{tool} {variable}={value:g}" if variable and value is not None else str(tool),
        "server_settings": ", ".join(f"{k}={par[k]}" for k in ("tp", "pp", "dp") if k in par) or None,
        "run_number": num(load.get("stage")) or 0, "date": _when(_get(data, "run", "time", "start")),
        "gpu_type": acc.get("model"), "hardware": acc.get("model"), "gpu_count": num(acc.get("count")),
        "vllm_version": _get(engine, "standardized", "tool_version")
        if _get(engine, "standardized", "tool") in ("vllm", "llm-d") else None,
        "validity_ok": failures == 0,
        "validity_issues": f"{failures:g} failed request(s)" if failures else None,
        "request_throughput": _rate(thr.get("request_rate"), "queries/s"),
        "output_throughput": _rate(thr.get("output_token_rate"), "tokens/s"),
        "total_token_throughput": _rate(thr.get("total_token_rate"), "tokens/s")}
    for short, name, _units in LATENCY:
        stats = lat.get(name)
        for key, col in (("mean", "mean"), ("p50", "median"), ("p90", "p90"), ("p99", "p99")):
            row[f"{col}_{short}_ms"] = _ms(stats, key)
    return [row]


def _when(value: object) -> float:
    if isinstance(value, datetime.datetime):
        when = value
    else:
        try:
            when = datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except ValueError:
            return math.nan
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when.timestamp()

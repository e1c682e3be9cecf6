"""Other tools' result files, recognised by their content (`kind_of`) and read into catalogue rows (`read`).

- AIPerf's JSON export (`profile_export_aiperf.json`: a metric per key, `{"unit", "avg", "p50", ...}`, and
  `input_config`): one row (one run of one point). The model, the data set (its type and requested input
  length), the load (the profiling phase's concurrency or request rate) and the date come from its
  `input_config` and `start_time`; the requested output length only where the config holds it.
- GuideLLM's benchmarks JSON (`benchmarks.json`: `{"benchmarks": [{"type_": "generative_benchmark", ...}]}`):
  one row per benchmark (each strategy of a sweep is a point), the model from its worker, the data from its
  request loader (`prompt_tokens=256,output_tokens=128`), the load from its strategy (synchronous: one at a
  time, `concurrent`: its streams, `constant`/`poisson`: its rate; `throughput`: all at once, no value), and
  the metrics over its successful requests (GuideLLM's request latency is in seconds: written in ms).

- AIPerf's CSV export (`profile_export_aiperf.csv`: a table `Metric,avg,min,max,p1,...,p99,std` of the
  per-request metrics, a blank line, then `Metric,Value` of the run's totals), read only where no AIPerf JSON
  export lies beside it (the JSON says more): one row. The CSV holds no configuration: the model, the data
  set, the requested lengths and the load are missing; the input length is the measured mean input length
  of its requests (`Input Sequence Length (tokens)`, as it is the requested one for a fixed-length data
  set), the date the first request's timestamp.

- Benchmark Report v0.2 (llm-d's results format, YAML or JSON: `version: "0.2"`, `run`, `results`), which llm-d
  writes for the harnesses it runs (inference-perf, GuideLLM, vLLM's benchmark, InferenceMAX, AIPerf): one row
  per report, read by `raysweep.catalog.br` (the model, the accelerator, the engine's version and parallelism,
  the workload, the metrics in raysweep's units).

The first three say neither the hardware, the server's settings or the server's versions: missing. A run counts as
valid when the tool reports no error (no errored request in the CSV) and no cancellation.
"""

from __future__ import annotations

import datetime
import hashlib
import io
import json
import math
from pathlib import Path
from typing import Any

from raysweep import grid
from raysweep.bench.load import CONCURRENCY, RATE
from raysweep.catalog import fields

__all__ = ["AIPERF", "AIPERF_CSV", "BR", "GUIDELLM", "kind_of", "read"]

AIPERF, AIPERF_CSV, GUIDELLM, BR = "aiperf", "aiperf-csv", "guidellm", "br-v0.2"
_AIPERF_CSV_HEAD = "Metric,avg,min,max,"
_MAX_SNIFF = 512 * 1024 * 1024  # a JSON file larger than this is not read to find out what wrote it


def kind_of(path: Path) -> str | None:
    """The tool that wrote a JSON, YAML (a Benchmark Report) or AIPerf CSV file, or None when it is none this
    reads."""
    if path.suffix == ".csv" and path.is_file():
        try:
            with path.open(encoding="utf-8") as f:
                head = f.readline()
        except (OSError, UnicodeDecodeError):
            return None
        return AIPERF_CSV if head.startswith(_AIPERF_CSV_HEAD) else None
    if path.suffix not in (".json", ".yaml", ".yml") or not path.is_file() or path.stat().st_size > _MAX_SNIFF:
        return None
    try:
        data = _load(path)
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return _kind(data)


def _load(path: Path) -> Any:
    if path.suffix == ".json":
        return json.loads(path.read_text())
    import yaml

    try:
        return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise ValueError(str(exc)) from exc


def _kind(data: object) -> str | None:
    from raysweep.catalog import br

    if not isinstance(data, dict):
        return None
    if br.is_report(data):
        return BR
    if isinstance(data.get("request_throughput"), dict) and ("aiperf_version" in data or "input_config" in data):
        return AIPERF
    benches = data.get("benchmarks")
    if isinstance(benches, list) and benches and isinstance(benches[0], dict) and \
            str(benches[0].get("type_", "")).startswith("generative_benchmark"):
        return GUIDELLM
    return None


def read(kind: str, path: Path) -> dict[str, Any]:
    """The fields of the `sources.Source` of one AIPerf export or GuideLLM benchmarks file."""
    stat = path.stat()
    signature = hashlib.sha256(json.dumps([stat.st_size, stat.st_mtime_ns]).encode()).hexdigest()[:16]
    cid = grid.params_id({kind: str(path.resolve())}, 16)
    name = f"{path.parent.name}/{path.name}"
    if kind == AIPERF_CSV:
        rows = _aiperf_csv(path.read_text(encoding="utf-8"))
    elif kind == BR:
        from raysweep.catalog import br

        rows = br.report_rows(_load(path))
    else:
        data = json.loads(path.read_text())
        rows = _aiperf(data) if kind == AIPERF else _guidellm(data)
    for r in rows:
        r.update(campaign_id=cid, campaign=name, source=kind, source_path=str(path.resolve()))
    return {"id": cid, "name": name, "kind": kind, "path": str(path.resolve()), "signature": signature,
            "complete": True, "rows": fields.frame(rows)}


def _stat(data: dict[str, Any], key: str, stat: str) -> float:
    block = data.get(key)
    value = block.get(stat) if isinstance(block, dict) else None
    return float(value) if isinstance(value, (int, float)) else math.nan


def _length(value: object) -> str | None:
    if not isinstance(value, (int, float)) or math.isnan(float(value)):
        return None
    return f"{float(value):g}"


def _workload(dataset: str | None, params: dict[str, Any], input_len: str | None, output_len: str | None,
              variable: str | None, value: float) -> dict[str, Any]:
    dparams = json.dumps(params, sort_keys=True)
    return {"dataset": dataset, "dataset_params": dparams, "input_len": input_len, "output_len": output_len,
            "workload": fields.workload_id(dataset, dparams, input_len, output_len), "load_variable": variable,
            "load_value": value}


def _aiperf(data: dict[str, Any]) -> list[dict[str, Any]]:
    config = data.get("input_config") or {}
    models = ((config.get("models") or {}).get("items") or [{}])
    dataset = (config.get("datasets") or [{}])[0]
    prompts = dataset.get("prompts") or {}
    phase: dict[str, Any] = next((p for p in config.get("phases") or [] if p.get("name") == "profiling"), {})
    if phase.get("concurrency") is not None:
        variable, value = CONCURRENCY, float(phase["concurrency"])
    elif phase.get("request_rate") is not None:
        variable, value = RATE, float(phase["request_rate"])
    else:
        variable, value = None, math.nan
    params = {k: dataset.get(k) for k in ("entries", "random_seed") if dataset.get(k) is not None}
    errors = data.get("error_summary") or []
    issues = [f"{len(errors)} error kind(s)"] if errors else []
    if data.get("was_cancelled"):
        issues.append("cancelled")
    row: dict[str, Any] = {
        **_workload(dataset.get("type"), params, _length((prompts.get("isl") or {}).get("mean")),
                    _length((prompts.get("osl") or {}).get("mean")), variable, value),
        "model": models[0].get("name"), "config": "aiperf", "point": f"{variable}={value:g}",
        "run_number": 0, "date": _iso(data.get("start_time")), "validity_ok": not issues,
        "validity_issues": "; ".join(issues) or None,
        "request_throughput": _stat(data, "request_throughput", "avg"),
        "output_throughput": _stat(data, "output_token_throughput", "avg"),
        "total_token_throughput": _stat(data, "total_token_throughput", "avg")}
    for key, metric in (("time_to_first_token", "ttft"), ("inter_token_latency", "itl"),
                        ("request_latency", "e2el")):
        for stat, name in (("avg", "mean"), ("p50", "median"), ("p90", "p90"), ("p99", "p99")):
            row[f"{name}_{metric}_ms"] = _stat(data, key, stat)
    return [row]


def _aiperf_csv(text: str) -> list[dict[str, Any]]:
    """One row from an AIPerf CSV export (see the module docstring)."""
    import csv

    stats: dict[str, dict[str, float]] = {}
    totals: dict[str, float] = {}
    header: list[str] = []
    for line in csv.reader(io.StringIO(text)):
        if not line:
            header = []
            continue
        if line[0] == "Metric":
            header = line
            continue
        if not header:
            raise ValueError(f"a row before any `Metric,...` header: {line[:3]}")
        if len(header) == 2:
            totals[line[0]] = float(line[1])
        else:
            stats[line[0]] = {h: float(v) for h, v in zip(header[1:], line[1:]) if v}
    if "Request Throughput (requests/sec)" not in totals:
        raise ValueError("no `Request Throughput (requests/sec)` in its totals: not an AIPerf CSV export")
    errors = int(totals.get("Error Request Count", 0.0))
    isl = stats.get("Input Sequence Length (tokens)", {})
    first = totals.get("Minimum Request Timestamp (ns)")
    row: dict[str, Any] = {
        **_workload(None, {}, _length(isl.get("avg")), None, None, math.nan),
        "model": None, "config": "aiperf", "point": "aiperf", "run_number": 0,
        "date": first / 1e9 if first is not None else math.nan, "validity_ok": errors == 0,
        "validity_issues": f"{errors} errored request(s)" if errors else None,
        "request_throughput": totals.get("Request Throughput (requests/sec)", math.nan),
        "output_throughput": totals.get("Output Token Throughput (tokens/sec)", math.nan),
        "total_token_throughput": math.nan}
    for key, metric in (("Time to First Token (ms)", "ttft"), ("Inter Token Latency (ms)", "itl"),
                        ("Request Latency (ms)", "e2el")):
        for stat, name in (("avg", "mean"), ("p50", "median"), ("p90", "p90"), ("p99", "p99")):
            row[f"{name}_{metric}_ms"] = stats.get(key, {}).get(stat, math.nan)
    return [row]


def _iso(text: object) -> float:
    try:
        when = datetime.datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return math.nan
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when.timestamp()


def _data_spec(text: object) -> dict[str, str]:
    """GuideLLM's synthetic data string (`prompt_tokens=256,output_tokens=128`) as a mapping; {} otherwise."""
    out: dict[str, str] = {}
    for part in str(text or "").split(","):
        key, eq, value = part.partition("=")
        if eq:
            out[key.strip()] = value.strip()
    return out


def _guidellm(data: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for i, b in enumerate(data["benchmarks"]):
        args = b.get("args") or {}
        strategy = args.get("strategy") or {}
        kind: str | None = strategy.get("type_")
        variable: str | None
        if kind == "synchronous":
            variable, value = CONCURRENCY, 1.0
        elif kind == "concurrent":
            variable, value = CONCURRENCY, float(strategy.get("streams") or math.nan)
        elif kind in ("constant", "poisson", "async"):
            variable, value = RATE, float(strategy.get("rate") or math.nan)
        else:
            variable, value = kind, math.nan
        loader = b.get("request_loader") or {}
        spec = _data_spec(loader.get("data"))
        synthetic = "prompt_tokens" in spec
        params = {k: v for k, v in spec.items() if k not in ("prompt_tokens", "output_tokens")}
        worker = b.get("worker") or {}
        totals = b.get("request_totals") or {}
        errored = int(totals.get("errored") or 0)
        metrics = b.get("metrics") or {}

        row: dict[str, Any] = {
            **_workload("synthetic" if synthetic else str(loader.get("data")), dict(params),
                        spec.get("prompt_tokens"), spec.get("output_tokens"), variable, value),
            "model": worker.get("backend_model"), "config": "guidellm",
            "point": f"{kind}" + ("" if math.isnan(value) else f" {value:g}"), "run_number": i,
            "date": float(b.get("start_time") or math.nan), "validity_ok": errored == 0,
            "validity_issues": f"{errored} errored request(s)" if errored else None,
            "request_throughput": _successful(metrics, "requests_per_second", "mean"),
            "output_throughput": _successful(metrics, "output_tokens_per_second", "mean"),
            "total_token_throughput": _successful(metrics, "tokens_per_second", "mean")}
        for key, metric, scale in (("time_to_first_token_ms", "ttft", 1.0), ("time_per_output_token_ms", "tpot", 1.0),
                                   ("inter_token_latency_ms", "itl", 1.0), ("request_latency", "e2el", 1000.0)):
            for stat, name in (("mean", "mean"), ("median", "median"), ("p90", "p90"), ("p99", "p99")):
                row[f"{name}_{metric}_ms"] = _successful(metrics, key, stat, scale)
        rows.append(row)
    return rows


def _successful(metrics: dict[str, Any], key: str, stat: str, scale: float = 1.0) -> float:
    """A statistic of a GuideLLM metric over its successful requests (mean, median or a percentile)."""
    block = (metrics.get(key) or {}).get("successful") or {}
    value = block.get(stat) if stat in ("mean", "median") else (block.get("percentiles") or {}).get(stat)
    return float(value) * scale if isinstance(value, (int, float)) else math.nan

"""Export of a raysweep campaign as Benchmark Reports v0.2 (`raysweep export --format br-v0.2`): one report
per point (server configuration x bench point) over its runs; what each field holds is told in
`raysweep.catalog.br`."""

from __future__ import annotations

import datetime
import hashlib
import math
from pathlib import Path
from typing import Any

import pandas as pd

from raysweep.bench.load import CONCURRENCY, RATE
from raysweep.catalog.br import LATENCY, THROUGHPUT, VERSION, num

__all__ = ["export_reports", "write_reports"]


def _iso(ts: float | None) -> str | None:
    if ts is None or ts <= 0:
        return None
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def _hash(*parts: object) -> str:
    return hashlib.sha256("\x1f".join(map(str, parts)).encode()).hexdigest()[:32]


def _extension(row: pd.Series, metric: str, level: float, method: str) -> dict[str, Any] | None:
    """The `raysweep` extra field of one metric's Statistics: its interval and the runs it rests on."""
    low, high = num(row.get(f"{metric}_ci_low")), num(row.get(f"{metric}_ci_high"))
    runs = num(row.get("runs"))
    out: dict[str, Any] = {"metric": metric, "runs": int(runs) if runs is not None else None}
    if low is not None and high is not None:
        out.update(ci_low=low, ci_high=high, level=level, method=method)
    std = num(row.get(f"{metric}_std"))
    if std is not None:
        out["std_between_runs"] = std
    return out


def _statistics(row: pd.Series, units: str, mean_col: str, pct_cols: dict[str, str], level: float, method: str,
                ) -> dict[str, Any] | None:
    mean = num(row.get(f"{mean_col}_mean"))
    if mean is None:
        return None
    stats: dict[str, Any] = {"units": units, "mean": mean}
    for key, col in pct_cols.items():
        value = num(row.get(f"{col}_mean"))
        if value is not None:
            stats[key] = value
    ext = _extension(row, mean_col, level, method)
    if ext is not None:
        stats["raysweep"] = ext
    return stats


def _verdicts(output_dir: Path) -> tuple[str | None, dict[tuple[str, str], dict[str, Any]]]:
    """The campaign's objective metric and each point's verdict on it, from the campaign's one answer."""
    from raysweep.results import conclusions
    from raysweep.results.answer import ALONE, BETTER
    from raysweep.results.data import answer_of, read_data

    try:
        answer = answer_of(read_data(output_dir))
    except Exception:  # noqa: BLE001 - a campaign the answer cannot be made of: its points are `not shown`
        return None, {}
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for v, shape in zip(answer.verdicts, answer.answer.shapes):   # the answer's words, never made again here
        text = shape.headline
        rivals = {rv.config: rv for rv in shape.rivals}
        for i, r in v.ranking.reset_index(drop=True).iterrows():
            key = (str(r.get("serve_id")), str(r.get("bench_id")))
            if i == 0:
                word = "leader" if shape.verdict in (BETTER, ALONE) else shape.verdict
            else:
                rival = rivals.get(conclusions.at_load(r, answer.load))
                word = "not shown" if rival is None else "behind" if rival.verdict == BETTER else rival.verdict
            metric = answer.objective.metric
            value = {k: num(r.get(f"{metric}_{s}")) for k, s in (("value", "mean"), ("ci_low", "ci_low"),
                                                                   ("ci_high", "ci_high"))}
            out[key] = {"verdict": word, "why": text, "workload": v.shape, "objective": metric,
                        "maximize": answer.objective.maximize,
                        **{k: x for k, x in value.items() if x is not None},
                        "leader": str(v.leader.get("serve_label", v.leader.get("serve_id")))}
    return answer.objective.metric, out


def export_reports(output_dir: str | Path) -> list[dict[str, Any]]:
    """One Benchmark Report v0.2 (as a dict) per point of a raysweep output dir, in the summary's order.

    :raises UserError: the dir has no finished run."""
    from raysweep.catalog import sources
    from raysweep.errors import UserError
    from raysweep.results import aggregate
    from raysweep.results.importer import read_table

    out = Path(output_dir)
    results = read_table(out).df
    if results.empty:
        raise UserError(f"OUTPUT_DIR {output_dir}: no finished run to export")
    summary = aggregate.summary_table(out, results=results)
    level = float(summary.attrs.get("confidence") or 0.95)
    catalogue = sources.read(sources.Found(sources.RAYSWEEP, out)).rows
    objective, verdicts = _verdicts(out)
    from raysweep.results.directory import CampaignDir

    with CampaignDir(out) as campaign_dir:
        points = campaign_dir.ledger.points()
    serve_names = list(dict.fromkeys(k for p in points for k in p.serve_params))
    bench_names = list(dict.fromkeys(k for p in points for k in p.bench_params))
    campaign_id = _hash("raysweep", str(out.resolve()))
    reports = []
    for _, row in summary.iterrows():
        sid, bid = str(row.get("serve_id")), str(row.get("bench_id"))
        runs = results[(results["serve_id"].astype(str) == sid) & (results["bench_id"].astype(str) == bid)]
        cat = catalogue[catalogue["point"].astype(str).str.startswith(f"{row.get('serve_label')} | ")]
        cat = cat[cat["point"].astype(str) == f"{row.get('serve_label')} | {row.get('bench_label')}"]
        first = cat.iloc[0] if len(cat) else pd.Series(dtype=object)
        verdict = verdicts.get((sid, bid))
        if verdict is None and objective is not None:
            verdict = {"verdict": "not ranked", "objective": objective,
                       "why": "not its configuration's best point of this workload (configurations are compared "
                              "at their best)"}
        reports.append(_report(row, runs, first, level, objective, verdict, campaign_id, (serve_names, bench_names)))
    return reports


def _report(row: pd.Series, runs: pd.DataFrame, cat: pd.Series, level: float, objective: str | None,
            verdict: dict[str, Any] | None, campaign_id: str, names: tuple[list[str], list[str]]) -> dict[str, Any]:
    method = str(row.get("ci_method") or "t")
    latency: dict[str, Any] = {}
    for short, name, units in LATENCY:
        stats = _statistics(row, units, f"mean_{short}_ms",
                            {"p50": f"median_{short}_ms", "p90": f"p90_{short}_ms", "p99": f"p99_{short}_ms"},
                            level, method)
        if stats is not None:
            latency[name] = stats
    throughput: dict[str, Any] = {}
    for col, name, units in THROUGHPUT:
        stats = _statistics(row, units, col, {}, level, method)
        if stats is not None:
            throughput[name] = stats
    if "total_token_rate" in throughput and "output_token_rate" in throughput:
        throughput["input_token_rate"] = {"units": "tokens/s", "mean": throughput["total_token_rate"]["mean"]
                                          - throughput["output_token_rate"]["mean"]}
    words = ["raysweep"]
    if verdict is not None and objective is not None:
        # on the Statistics of the objective's metric (per GPU or not: the verdict carries its own value)
        base = objective[: -len("_per_gpu")] if objective.endswith("_per_gpu") else objective
        for group in (latency, throughput):
            for stats in group.values():
                ext = stats.get("raysweep") or {}
                if ext.get("metric") == base:
                    ext["verdict"] = verdict
        words.append(verdict["verdict"])
    if bool((runs.get("validity_ok", pd.Series(dtype=object)) == False).any()):  # noqa: E712 - None: not judged
        words.append("flagged")
    completed = pd.to_numeric(runs.get("completed", pd.Series(dtype=float)), errors="coerce").sum()
    failed = pd.to_numeric(runs.get("failed", pd.Series(dtype=float)), errors="coerce").sum()
    aggregate: dict[str, Any] = {"requests": {"total": int(completed + failed), "failures": int(failed)}}
    if latency:
        aggregate["latency"] = latency
    if throughput:
        aggregate["throughput"] = throughput
    starts = pd.to_numeric(runs.get("started_at", pd.Series(dtype=float)), errors="coerce").dropna()
    ends = pd.to_numeric(runs.get("ended_at", pd.Series(dtype=float)), errors="coerce").dropna()
    time: dict[str, Any] = {}
    if len(starts) and len(ends):
        time = {"start": _iso(float(starts.min())), "end": _iso(float(ends.max())),
                "duration": f"PT{max(0.0, float(ends.max() - starts.min())):.3f}S"}
    sid, bid = str(row.get("serve_id")), str(row.get("bench_id"))
    run: dict[str, Any] = {"uid": _hash(campaign_id, sid, bid), "eid": campaign_id,
                           "description": f"raysweep campaign {row.get('campaign')}: {row.get('serve_label')} | "
                                          f"{row.get('bench_label')}",
                           "keywords": words}
    if time:
        run["time"] = {k: v for k, v in time.items() if v is not None}
    return {"version": VERSION, "run": run,
            "scenario": {"stack": [_engine(row, cat, names[0])], "load": _load(row, cat, names[1])},
            "results": {"request_performance": {"aggregate": aggregate}}}


def _int(value: object, default: int) -> int:
    v = num(value)
    return int(v) if v is not None else default


def _engine(row: pd.Series, cat: pd.Series, names: list[str]) -> dict[str, Any]:
    tp, pp, dp = (_int(row.get(k), 1) for k in ("tensor_parallel_size", "pipeline_parallel_size",
                                                "data_parallel_size"))
    nodes = _int(row.get("num_nodes"), 1)
    args = {f"--{k.replace('_', '-')}": _plain(row.get(k)) for k in names if k in row.index}
    return {
        "metadata": {"schema_version": "0.0.1", "label": str(row.get("serve_label") or row.get("serve_id")),
                     "cfg_id": str(row.get("serve_id")), "description": "vLLM server started by raysweep"},
        "standardized": {
            "kind": "inference_engine", "tool": "vllm",
            "tool_version": str(_text(cat.get("vllm_version")) or "unknown"),
            "role": "replica", "replicas": 1, "model": {"name": str(_text(cat.get("model")) or "unknown")},
            "accelerator": {"model": str(_text(cat.get("gpu_type")) or _text(row.get("hardware")) or "unknown"),
                            "count": _int(row.get("gpu_count"), 0),
                            "parallelism": {"tp": tp, "pp": pp, "dp": dp, "dp_local": max(1, dp // max(1, nodes)),
                                            "workers": nodes, "ep": 1}}},
        "native": {"args": args}}


def _text(value: object) -> str | None:
    """A catalogue cell as text; None where it is missing (None, NaN, pandas' NA)."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    return str(value)


def _plain(value: object) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    return value if isinstance(value, (bool, int, float, str)) or value is None else str(value)


def _seq(value: object) -> dict[str, Any]:
    v = num(value)
    return {"distribution": "fixed", "value": v} if v is not None else {"distribution": "other", "value": 0}


def _load(row: pd.Series, cat: pd.Series, names: list[str]) -> dict[str, Any]:
    dataset = str(_text(cat.get("dataset")) or "")
    source = "random" if dataset in ("random", "random-mm", "prefix_repetition") else \
        "sampled" if dataset else "unknown"
    std: dict[str, Any] = {"tool": "raysweep", "tool_version": str(_text(cat.get("raysweep_version")) or "unknown"),
                           "source": source, "input_seq_len": _seq(cat.get("input_len"))}
    if num(cat.get("output_len")) is not None:
        std["output_seq_len"] = _seq(cat.get("output_len"))
    variable, value = _text(cat.get("load_variable")), num(cat.get("load_value"))
    if variable == RATE and value is not None and value > 0:
        std["rate_qps"] = value
    if variable == CONCURRENCY and value is not None and value >= 1:
        std["concurrency"] = int(value)
    bench = {k: _plain(row.get(k)) for k in names if k in row.index and _plain(row.get(k)) is not None}
    return {"metadata": {"schema_version": "0.0.1", "cfg_id": str(row.get("bench_id")),
                         "description": str(row.get("bench_label") or "")},
            "standardized": std, "native": {"args": {f"--{k.replace('_', '-')}": v for k, v in bench.items()}}}


def write_reports(output_dir: str | Path, dest: str | Path) -> list[Path]:
    """Every point's report as YAML in `dest`, one file per point (`br-v0.2-SERVE_ID-BENCH_ID.yaml`), each written
    whole."""
    import yaml

    from raysweep.record.files import write_text_atomic

    reports = export_reports(output_dir)
    dest = Path(dest)
    paths = []
    for rep in reports:
        sid = rep["scenario"]["stack"][0]["metadata"]["cfg_id"]
        bid = rep["scenario"]["load"]["metadata"]["cfg_id"]
        paths.append(write_text_atomic(dest / f"br-v0.2-{sid}-{bid}.yaml", yaml.safe_dump(rep, sort_keys=False)))
    return paths

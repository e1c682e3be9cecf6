"""Finding campaigns under a directory and reading each into catalogue rows (`fields`).

`discover(path)` walks a directory: a directory with a ledger is a raysweep campaign (not descended into); a
directory holding a `summary.json`, or whose sub-directories do, is a `vllm bench sweep` output dir; files
other tools write (`others`: AIPerf's JSON export, GuideLLM's benchmarks JSON) are recognised by their
content. A path that holds none of them is bad input (`UserError`, naming it).

`read(found)` gives a `Source`: its stable id (a raysweep campaign: its name, fingerprint and creation time,
so a copy of it moved elsewhere is the same campaign; another tool's output: its resolved path), a signature
that changes when the campaign does (a running campaign finishes more points) and its rows.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from raysweep import grid
from raysweep.bench.load import VARIABLES, flags
from raysweep.catalog import fields
from raysweep.errors import UserError
from raysweep.ledger import LEDGER_FILE, PointState
from raysweep.results.directory import CampaignDir

if TYPE_CHECKING:
    from raysweep.ledger import Ledger

__all__ = ["Found", "Source", "discover", "read"]

RAYSWEEP, VLLM = "raysweep", "vllm-sweep"
SUMMARY_FILE = "summary.json"


@dataclass(frozen=True)
class Found:
    kind: str
    path: Path


@dataclass
class Source:
    """One campaign (or another tool's output) as the catalogue keeps it."""

    id: str
    name: str
    kind: str
    path: str
    signature: str
    complete: bool
    rows: pd.DataFrame
    answer: list[str] = field(default_factory=list)  # a raysweep campaign's answer as its run kept it
    answer_object: dict[str, Any] | None = None  # the same answer as an object (`Answer.to_dict`)


def discover(path: str | Path) -> list[Found]:
    """Every campaign and known tool output under `path` (recursively).

    :raises UserError: `path` does not exist or holds none.
    """
    from raysweep.catalog import others

    root = Path(path)
    if not root.exists():
        raise UserError(f"DIR {path}: does not exist")
    found = _walk(root) if root.is_dir() else ([Found(k, root)] if (k := others.kind_of(root)) else [])
    if not found:
        raise UserError(f"DIR {path}: neither a campaign nor a known tool's output; accepted: a raysweep output "
                        f"dir (with {LEDGER_FILE}), a `vllm bench sweep` output dir (with **/{SUMMARY_FILE}), "
                        "an AIPerf JSON or CSV export, a GuideLLM benchmarks JSON or a Benchmark Report v0.2 (YAML or "
                        "JSON), or a directory holding them")
    return found


def _walk(d: Path) -> list[Found]:
    from raysweep.catalog import others

    if (d / LEDGER_FILE).is_file():
        return [Found(RAYSWEEP, d)]
    subdirs = sorted(p for p in d.iterdir() if p.is_dir() and not p.name.startswith("."))
    if (d / SUMMARY_FILE).is_file() or any((s / SUMMARY_FILE).is_file() for s in subdirs):
        return [Found(VLLM, d)]
    out = [Found(k, f) for f in sorted([*d.glob("*.json"), *d.glob("*.yaml"), *d.glob("*.yml")])
           if (k := others.kind_of(f))]
    if not any(f.kind == others.AIPERF for f in out):  # an AIPerf CSV beside its JSON export says less
        out += [Found(k, f) for f in sorted(d.glob("*.csv")) if (k := others.kind_of(f))]
    for s in subdirs:
        out += _walk(s)
    return out


def read(found: Found) -> Source:
    """The rows of one campaign or tool output.

    :raises UserError: a file of it cannot be read (naming it)."""
    from raysweep.catalog import others

    try:
        if found.kind == RAYSWEEP:
            return _read_raysweep(found.path)
        if found.kind == VLLM:
            return _read_vllm(found.path)
        return Source(**others.read(found.kind, found.path))
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - a damaged file of any kind: named, nothing added
        raise UserError(f"DIR {found.path}: cannot be read as a {found.kind} output ({type(exc).__name__}: "
                        f"{exc})") from exc


def raysweep_signature(path: Path) -> tuple[str, bool]:
    """What changes when a raysweep campaign does (its points' states and ends, its results file) and
    whether it is complete (no point pending or running).

    :raises UserError: its ledger cannot be read."""
    try:
        return _signature(path)
    except Exception as exc:  # noqa: BLE001 - a damaged ledger: named, nothing added
        raise UserError(f"DIR {path}: its {LEDGER_FILE} cannot be read ({type(exc).__name__}: {exc})") from exc


def _signature(path: Path) -> tuple[str, bool]:
    import sqlite3

    con = sqlite3.connect(f"{(path / LEDGER_FILE).resolve().as_uri()}?mode=ro", uri=True)
    try:
        states = con.execute("SELECT state, count(*), max(coalesce(ended_at, 0)) FROM points GROUP BY state "
                             "ORDER BY state").fetchall()
    finally:
        con.close()
    results = path / "results.parquet"
    stamp = [states, results.stat().st_mtime_ns if results.is_file() else 0]
    complete = not any(state in (PointState.PENDING.value, PointState.RUNNING.value) for state, _, _ in states)
    return hashlib.sha256(json.dumps(stamp).encode()).hexdigest()[:16], complete


def campaign_id(path: Path) -> str | None:
    """The catalogue id of the raysweep campaign in `path` (its name, fingerprint and creation time), None where
    its ledger cannot be read."""
    try:
        with CampaignDir(path) as campaign_dir:
            return _id_of(campaign_dir.ledger, path)
    except Exception:  # noqa: BLE001 - not a campaign, or a damaged one: no id
        return None


def _id_of(ledger: Ledger, path: Path) -> str:
    """A raysweep campaign's stable id: a copy moved elsewhere is the same campaign."""
    name = ledger.meta("name") or path.name
    created = float(ledger.meta("created_at") or 0.0)
    return grid.params_id({"name": name, "fingerprint": ledger.meta("fingerprint"), "created_at": created}, 16)


def _read_raysweep(path: Path) -> Source:
    from raysweep.results.records import results_table

    signature, complete = raysweep_signature(path)
    with CampaignDir(path) as campaign_dir:
        ledger = campaign_dir.ledger
        name = ledger.meta("name") or path.name
        meaning = json.loads(ledger.meta("meaning") or "{}")
        created = float(ledger.meta("created_at") or 0.0)
        cid = _id_of(ledger, path)
        params = {p.point_id: (p.serve_params, p.bench_params) for p in ledger.points()}
    kept = path / "results.parquet"
    table = pd.read_parquet(kept) if complete and kept.is_file() else results_table(path)
    outliers, cut = _outlier_runs(table), _values_cut(table)
    serve_cmd, bench_cmd = list(meaning.get("serve_cmd") or []), list(meaning.get("bench_cmd") or [])
    per_point: dict[str, dict[str, Any]] = {}
    rows = []
    for rec in table.to_dict("records"):
        pid = str(rec.get("point_id"))
        key = f"{rec.get('serve_id')}/{rec.get('bench_id')}"
        if key not in per_point:
            sp, bp = params.get(pid, ({}, {}))
            served = fields.serve_fields(grid.apply_to_cmd(serve_cmd, sp))
            bench_argv = grid.apply_to_cmd(bench_cmd, bp)
            if not served.get("model"):  # an endpoint raysweep did not start: the model its bench command names
                served["model"] = grid.find_flag_value(bench_argv, "--model")
            per_point[key] = {**served, **fields.bench_fields(bench_argv),
                              "config": rec.get("serve_label") or grid.combo_label(sp) or "base command",
                              "point": f"{rec.get('serve_label')} | {rec.get('bench_label')}"}
        common = _common(rec)
        if pid in outliers:  # left out of its point's statistics by the campaign: out of the catalogue's too
            common.update(validity_ok=False, validity_issues="; ".join(
                i for i in (common.get("validity_issues"), OUTLIER) if i))
        for m in cut.get(pid, ()):   # a warm-up run's or an outlier's value, left out of that metric by the campaign
            if m in common:
                common[m] = None
        rows.append({**common, **per_point[key], "campaign_id": cid, "campaign": name, "source": RAYSWEEP,
                     "source_path": str(path.resolve()),
                     "date": _num(rec.get("started_at")) if _num(rec.get("started_at")) > 0 else created})
    from raysweep.results.answer_file import kept_answer

    answer = kept_answer(path)
    return Source(cid, name, RAYSWEEP, str(path.resolve()), signature, complete, fields.frame(rows),
                  list((answer or {}).get("lines") or []), (answer or {}).get("answer"))


OUTLIER = "outlier run (left out of its point's statistics by the campaign's aggregates)"


def _outlier_runs(table: pd.DataFrame) -> set[str]:
    """The point ids of the runs the campaign's own aggregates leave out as outliers (Grubbs' rule on a point's
    runs that do not drift, `aggregate.runs_over_time`), so that `history`, `catalog compare` and the site judge
    the runs the campaign judged. Its flagged and client-limited runs are left out by the catalogue already."""
    from raysweep.results import aggregate

    if table.empty or not {"serve_id", "bench_id", "point_id"} <= set(table.columns):
        return set()
    metric = next((m for m in aggregate.TREND_METRICS if m in table.columns), None)
    if metric is None:
        return set()
    used = table[~aggregate.left_out_mask(table)]
    out: set[str] = set()
    for _, runs in used.groupby(["serve_id", "bench_id"], sort=False):
        if len(runs) < 3:
            continue
        _, label = aggregate.runs_over_time(runs, [metric])
        if label is not None:
            out.add(str(runs.at[label, "point_id"]))
    return out


def _values_cut(table: pd.DataFrame) -> dict[str, list[str]]:
    """By run (its point id): the metrics whose value the campaign's own aggregates leave out, a warm-up of its
    server starts or an outlier of that metric (`aggregate.summarize`'s `values_cut`)."""
    from raysweep.results import aggregate

    if table.empty or not {"serve_id", "bench_id", "point_id"} <= set(table.columns):
        return {}
    return dict(aggregate.summarize(table).attrs.get("values_cut") or {})


def _common(rec: dict[str, Any]) -> dict[str, Any]:
    """What a result record (raysweep's or vLLM's) says of the run itself: hardware, versions, validity,
    metrics."""
    torch = rec.get("provenance_torch")
    build = None if not torch else "cpu" if "+cpu" in str(torch) else "cuda" if "+cu" in str(torch) else None
    out = {"run_number": rec.get("run_number"), "hardware": rec.get("hardware"), "gpu_type": rec.get("provenance_gpu"),
           "gpu_count": rec.get("gpu_count"), "num_nodes": rec.get("num_nodes"), "interconnect": _interconnect(rec),
           "vllm_version": rec.get("provenance_vllm"), "raysweep_version": rec.get("provenance_raysweep"),
           "ray_version": rec.get("provenance_ray"), "torch_version": torch, "build": build,
           "validity_ok": rec.get("validity_ok"), "validity_issues": rec.get("validity_issues") or None,
           "client_limited": rec.get("client_limited")}
    if rec.get("provenance_model_path"):
        out["model"] = rec["provenance_model_path"]
    out.update({m: rec.get(m) for m in fields.METRICS})
    return out


def _interconnect(rec: dict[str, Any]) -> str | None:
    """The transport the run's server used, as its NCCL lines said (the `transport_*` columns of a raysweep
    result): between nodes for a server on several (`IB`, `Socket`, ...), else within its node (`P2P/NVLink
    within one node`); None where the record has neither (no NCCL lines read, another tool's record)."""
    inter, intra = rec.get("transport_inter"), rec.get("transport_intra")
    if inter and inter != "n/a":
        return f"{inter} between nodes"
    return f"{intra} within one node" if intra else None


def _num(value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return math.nan
    return v


def _read_vllm(path: Path) -> Source:
    """A `vllm bench sweep` dir, read as `raysweep import` reads it (`results.importer.read_vllm_sweep`). Its
    records say the model, the data set, the lengths and the load; no hardware, no versions: missing."""
    from raysweep.results.importer import read_vllm_sweep

    table = read_vllm_sweep(path).df
    files = sorted(path.rglob(SUMMARY_FILE))
    stamp = [(str(f.relative_to(path)), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    signature = hashlib.sha256(json.dumps(stamp).encode()).hexdigest()[:16]
    cid = grid.params_id({"vllm-sweep": str(path.resolve())}, 16)
    rows = []
    for rec in table.to_dict("records"):
        argv = ["--dataset-name", str(rec.get("dataset_name") or rec.get("dataset") or "")]
        for key, flag in (("random_input_len", "--random-input-len"), ("random_output_len", "--random-output-len"),
                          ("num_prompts", "--num-prompts"), *((v, flags(v)[0]) for v in VARIABLES)):
            value = rec.get(key)
            if value is not None and not (isinstance(value, float) and math.isnan(value)):
                argv += [flag, _text(value)]
        if argv[1] == "":
            argv = argv[2:]
        bench = fields.bench_fields(argv)
        date = _vllm_date(rec.get("date"))
        rows.append({**_common(rec), **bench, "campaign_id": cid, "campaign": rec.get("campaign") or path.name,
                     "source": VLLM, "source_path": str(path.resolve()), "model": rec.get("model_id"),
                     "server_settings": None, "config": rec.get("serve_label"),
                     "point": f"{rec.get('serve_label')} | {rec.get('bench_label')}", "date": date})
    name = path.resolve().name
    return Source(cid, name, VLLM, str(path.resolve()), signature, True, fields.frame(rows))


def _text(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _vllm_date(value: object) -> float:
    """vLLM's `date` ("20250101-120000") as seconds since the epoch; NaN when absent."""
    import datetime

    try:
        return datetime.datetime.strptime(str(value), "%Y%m%d-%H%M%S").replace(tzinfo=datetime.timezone.utc).timestamp()
    except ValueError:
        return math.nan

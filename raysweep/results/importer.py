"""Reading result tables from any directory the plots accept, and importing `vllm bench sweep` output.

Three kinds of directory hold a results table:
- a raysweep output dir (`ledger.sqlite`): the table is rebuilt from the ledger and the run files, or read from
  the results.parquet the campaign's end kept while no point finished since (`records.kept_results`);
- a `vllm bench sweep serve` dir: every `**/summary.json` (a JSON list of run records, reference/vllm.md
  §1.6) becomes rows, as `vllm bench sweep plot` reads them;
- a dir written by `raysweep import` (`results.parquet` without a ledger).

A vLLM record holds no GPU count, no server/bench ids and no labels: the importer takes the labels from the
combo directory name (`SERVE--<serve>-BENCH--<bench>`), derives stable ids from them, and leaves the GPU
count out rather than guess it (the Pareto plot says where its per-GPU figures come from).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from raysweep.bench.load import CONCURRENCY
from raysweep.errors import UserError
from raysweep.grid import normalize_key, params_id
from raysweep.ledger import LEDGER_FILE
from raysweep.record.directory import CampaignDir
from raysweep.record.files import write_bytes_atomic, write_text_atomic
from raysweep.results.records import PER_REQUEST_KEYS, kept_results, records_table, results_table, sla_table

__all__ = ["SourceTable", "combo_labels", "import_vllm_sweep", "read_sla", "read_table", "read_vllm_sweep",
           "workload_part"]

SUMMARY_FILE = "summary.json"
_SPECIAL_FLOATS = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}
_WORKLOAD_DIR = re.compile(r"(?:^|-)WL--(?P<var>max_concurrency|request_rate)=(?P<value>[0-9.]+)$")


@dataclass
class SourceTable:
    """A results table and where it came from: `raysweep`, `vllm` (a sweep dir) or `imported`."""

    df: pd.DataFrame
    kind: str
    notes: list[str] = field(default_factory=list)


def read_table(directory: str | Path | CampaignDir, option: str = "OUTPUT_DIR") -> SourceTable:
    """The results table of a raysweep output dir, a vLLM sweep dir or an imported dir (checked in that order).

    :raises UserError: the directory is none of them (naming `option` and what is accepted).
    """
    if isinstance(directory, CampaignDir):
        campaign_dir = directory
    else:
        campaign_dir = CampaignDir(directory)
    path = campaign_dir.path
    if (path / LEDGER_FILE).is_file():
        try:
            kept = kept_results(campaign_dir)  # as the campaign's end wrote it, when nothing finished since
            return SourceTable(kept if kept is not None else results_table(campaign_dir), "raysweep")
        finally:
            if campaign_dir is not directory:
                campaign_dir.close()
    if path.is_dir() and next(path.rglob(SUMMARY_FILE), None) is not None:
        return read_vllm_sweep(path)
    if (path / "results.parquet").is_file():
        return SourceTable(pd.read_parquet(path / "results.parquet"), "imported")
    raise UserError(f"{option} {campaign_dir.given}: not a directory this reads; accepted: a raysweep output dir "
                    f"(with {LEDGER_FILE}), a `vllm bench sweep` output dir (with **/{SUMMARY_FILE}), or a dir "
                    "written by `raysweep import` (with results.parquet)")


def read_sla(directory: CampaignDir) -> tuple[pd.DataFrame, str]:
    """The SLA table of a raysweep output dir (`results.sla_table`) and its searched variable; an empty
    table where the campaign has no `sla:` or the dir is not a raysweep one (vLLM's sweep has no SLA search)."""
    if not (directory.path / LEDGER_FILE).is_file():
        return pd.DataFrame(), ""
    variable = (directory.ledger.stored_campaign().get("sla") or {}).get("variable") or ""
    return sla_table(directory), variable


def read_vllm_sweep(directory: str | Path) -> SourceTable:
    """Every run record of every `summary.json` under `directory`, one row each, per-request arrays dropped.

    Parameter names are normalised (`max-num-seqs` -> `max_num_seqs`), vLLM's `"inf"`/`"-inf"`/`"nan"`
    strings become floats, nested values JSON text, and failure records are counted in the notes.
    """
    root = Path(directory)
    records: list[dict[str, Any]] = []
    notes: list[str] = []
    for summary in sorted(root.rglob(SUMMARY_FILE)):
        try:
            runs = json.loads(summary.read_text())
        except (OSError, ValueError) as exc:
            notes.append(f"{summary.relative_to(root)}: unreadable, left out ({exc})")
            continue
        if not isinstance(runs, list):
            notes.append(f"{summary.relative_to(root)}: not a list of run records, left out")
            continue
        records += [_row(run, summary.parent, root) for run in runs if isinstance(run, dict)]
    failures = sorted(str(p.relative_to(root)) for p in root.rglob("*failure.json"))
    if failures:
        notes.append(f"{len(failures)} failure record(s), not in the table: {', '.join(failures)}")
    return SourceTable(_frame(records), "vllm", notes)


def _row(run: dict[str, Any], combo_dir: Path, root: Path) -> dict[str, Any]:
    """One table row from one vLLM run record; later keys win on a normalised-name clash, as the sweep's
    parameter overrides come after `vllm bench serve`'s own fields in a record."""
    row: dict[str, Any] = {}
    for key, value in run.items():
        if key in PER_REQUEST_KEYS:
            continue
        row[normalize_key(key)] = _SPECIAL_FLOATS.get(value, value) if isinstance(value, str) else value
    name, wl_var, wl_value = workload_part(combo_dir.name if combo_dir != root else "")
    serve_label, bench_label = combo_labels(name)
    if wl_var and wl_value is not None:  # a `vllm bench sweep serve_workload` level: a bench point of its own
        bench_label = f"{bench_label}-{wl_var}={wl_value:g}"
        row.update(workload_variable=wl_var, workload_value=wl_value,
                   workload_role=_workload_role(row, wl_var, wl_value))
    rel = combo_dir.relative_to(root)
    campaign = str(rel.parent) if str(rel.parent) != "." else root.resolve().name
    row.update(campaign=campaign, combo_dir=str(rel), serve_label=serve_label, bench_label=bench_label,
               serve_id=params_id({"campaign": campaign, "serve": serve_label}),
               bench_id=params_id({"bench": bench_label}))
    row["point_id"] = params_id({"combo": str(rel), "run": row.get("run_number")})
    return row


def workload_part(name: str) -> tuple[str, str | None, float | None]:
    """A `serve_workload` combo directory name (`...-WL--request_rate=4`, or `WL--request_rate=4` alone)
    without its level, the level's variable and value; the name itself and None, None for any other."""
    m = _WORKLOAD_DIR.search(name)
    if m is None:
        return name, None, None
    return name[:m.start()], m.group("var"), float(m.group("value"))


def _workload_role(row: dict[str, Any], variable: str, value: float) -> str:
    """serial (max_concurrency 1), batch (every prompt at once) or level, as serve_workload runs them."""
    if value == 1 and row.get(CONCURRENCY) == 1:
        return "serial"
    if row.get(CONCURRENCY) == value and row.get("num_prompts") == value:
        return "batch"
    return "level"


def combo_labels(name: str) -> tuple[str, str]:
    """The serve and bench labels of a vLLM combo directory name (`SERVE--a=1-BENCH--b=2`); `default` for an
    empty combo (the experiment dir itself, or a name without that part)."""
    serve, bench = "", ""
    if name.startswith("SERVE--"):
        serve, _, bench = name.removeprefix("SERVE--").partition("-BENCH--")
    elif name.startswith("BENCH--"):
        bench = name.removeprefix("BENCH--")
    return serve or "default", bench or "default"


def _frame(records: list[dict[str, Any]]) -> pd.DataFrame:
    """Records as a typed table, identifying columns first, sorted by combo and run."""
    return records_table(records, sort_by=("combo_dir", "run_number"), first=("combo_dir",))


def import_vllm_sweep(vllm_dir: str | Path, output_dir: str | Path) -> tuple[list[Path], SourceTable]:
    """Write a vLLM sweep dir's table as `results.parquet` and `results.csv` in `output_dir`.

    :raises UserError: `vllm_dir` holds no `summary.json`, or `output_dir` is a raysweep output dir
        (its table is rebuilt from its ledger, so an import there would be overwritten).
    """
    src = Path(vllm_dir)
    if not src.is_dir() or next(src.rglob(SUMMARY_FILE), None) is None:
        raise UserError(f"VLLM_DIR {vllm_dir}: no **/{SUMMARY_FILE} under it; accepted: the output dir of "
                        "`vllm bench sweep serve` (or one experiment dir inside it)")
    out = Path(output_dir)
    if (out / LEDGER_FILE).is_file():
        raise UserError(f"OUTPUT_DIR {output_dir} is a raysweep campaign's output dir ({LEDGER_FILE}); "
                        "accepted: a new or empty dir, or one written by an earlier import")
    table = read_vllm_sweep(src)
    if table.df.empty:
        raise UserError(f"VLLM_DIR {vllm_dir}: its {SUMMARY_FILE} files hold no run record")
    paths = [write_bytes_atomic(out / "results.parquet", table.df.to_parquet(index=False)),
             write_text_atomic(out / "results.csv", table.df.to_csv(index=False))]
    return paths, table

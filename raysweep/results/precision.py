"""The precision record of each point in a summary, for a campaign with `bench.precision`: how the sequential
rule (`raysweep.maths.precision`) ended for it, and its interval at the level the rule reports.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from raysweep.errors import LedgerError
from raysweep.ledger import LEDGER_FILE, Ledger
from raysweep.maths import hierarchy
from raysweep.maths.precision import (
    AT_DURATION,
    AT_MAX,
    MEASURING,
    REACHED,
    PrecisionSpec,
    reported_confidence,
    runs_to_reach,
)

__all__ = ["precision_counts", "precision_columns"]

log = logging.getLogger(__name__)


def precision_columns(output_dir: Any, summary: Any) -> Any:
    """The summary (one row per point) with the ledger's precision record of each point, for a campaign with
    `bench.precision`: `precision_state` (reached, max_runs, measuring), `precision_reached` and
    `precision_rel_half_width` (its interval's half-width over the mean when it was decided). The precision
    metric's `_ci_low`/`_ci_high` of a decided point are the interval the rule judged (`_widen_for_looks`;
    widened too by the spread between server starts where the campaign measured it, as every interval of the
    summary is: the rule, deciding run by run, judges one start's runs), and `runs_needed` is the runs the
    rule would need at the spread seen (`runs_to_reach`), so that the terminal, the summary, the report and
    `--json` quote one interval and one count. Unchanged for any other directory."""
    path = Path(output_dir)
    if not (path / LEDGER_FILE).is_file() or summary is None or "serve_id" not in getattr(summary, "columns", ()):
        return summary
    ledger = Ledger.open_existing(path)
    try:
        rows = {(r["serve_id"], r["bench_id"]): r for r in ledger.precision()}
        spec = _spec_of(ledger)
    finally:
        ledger.close()
    if not rows:
        return summary
    keys = list(zip(summary["serve_id"], summary["bench_id"], strict=True))
    out = summary.copy()
    out["precision_state"] = [rows[k]["state"] if k in rows else None for k in keys]
    out["precision_reached"] = [rows[k]["state"] == REACHED if k in rows else None for k in keys]
    out["precision_rel_half_width"] = [rows[k]["rel_half_width"] if k in rows else None for k in keys]
    if spec is not None:
        _widen_for_looks(out, [k in rows for k in keys], spec)
        cvs = out.get(f"{spec.metric}_cv")
        if cvs is not None and "runs_needed" in out.columns:
            needed = [runs_to_reach(_real(cv), spec) if k in rows else _real(n)
                      for cv, k, n in zip(cvs, keys, out["runs_needed"], strict=True)]
            out["runs_needed"] = pd.array([None if n is None or not math.isfinite(n) else int(n) for n in needed],
                                          dtype="Int64")
    return out


def precision_counts(ledger: Ledger) -> dict[str, int] | None:
    """For a campaign with `bench.precision`: how many points reached the target, stopped at max_runs or at
    max_duration_s without it, or are still measuring (None for any other campaign)."""
    if not (ledger.stored_campaign().get("bench") or {}).get("precision"):
        return None
    states = [r["state"] for r in ledger.precision()]
    return {state: states.count(state) for state in (REACHED, AT_MAX, AT_DURATION, MEASURING)}


def _spec_of(ledger: Ledger) -> PrecisionSpec | None:
    """The `bench.precision` of the campaign a ledger holds (None when absent or unreadable)."""
    try:
        section = ((ledger.stored_campaign().get("bench") or {}).get("precision"))
        return PrecisionSpec.model_validate(section) if section else None
    except (ValueError, LookupError, AttributeError, LedgerError) as exc:  # pydantic's error is a ValueError
        log.warning("bench.precision of the stored campaign unreadable (%s): plain intervals kept", exc)
        return None


def _real(value: Any) -> float:
    """A number of a summary cell (numpy scalars included), nan for anything else."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _widen_for_looks(out: pd.DataFrame, decided: list[bool], spec: PrecisionSpec) -> None:
    """The precision metric's `_ci_low`/`_ci_high` of the points the rule decided, at `reported_confidence`
    (`precision_confidence` and `ci_level` say which level a row's interval has), in place: the model's interval
    (`raysweep.maths.hierarchy`: over server starts where a point has several, else over its one start's runs)
    at that level, as the rule judged it."""
    m = spec.metric
    if not {f"{m}_mean", f"{m}_se", f"{m}_df", f"{m}_ci_low", f"{m}_ci_high"} <= set(out.columns):
        return
    level = reported_confidence(spec)
    mean, se, dof = (out[f"{m}_{k}"].to_numpy(dtype=float) for k in ("mean", "se", "df"))
    low, high = hierarchy.interval(mean, se, dof, level)
    mine = np.asarray(decided, dtype=bool) & np.isfinite(low)
    out[f"{m}_ci_low"] = np.where(mine, low, out[f"{m}_ci_low"].to_numpy(dtype=float))
    out[f"{m}_ci_high"] = np.where(mine, high, out[f"{m}_ci_high"].to_numpy(dtype=float))
    out["precision_confidence"] = [level if x else None for x in mine]
    # the level printed is the level used: this metric's own where it differs from the summary's `ci_level`
    out[f"{m}_ci_level"] = [level if x else c for x, c in zip(mine, out.get("ci_level", [None] * len(out)),
                                                               strict=True)]

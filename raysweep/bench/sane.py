"""Raw samples a statistic can always read, and statistics that can never stop a campaign.

`finite_samples(s)` gives a point's pooled samples with every time finite and inside the point: a successful
request whose begin, first or last chunk time is not a finite number within `MAX_TIME_S` of the start
becomes a failed one ("its times are not finite"), the times of a failed request that are unknown fall back
to the ones it has (its end to its begin, its finish to its end), token chunk offsets that are not finite are
dropped, token counts that are missing count as unknown (-1) and event-loop lags that are not finite are
dropped. Samples that are already so are returned as they are (no copy).

`guarded(name, fn, *args)` runs one analysis of a point and returns its fields, or, when it raises, the
fields `<name>_not_computed` (the exception in one line) and `analysis_errors` (the names of the analyses
that failed), the traceback logged: one statistic's failure marks its own fields, the point keeps the
others, and the campaign goes on.
"""

from __future__ import annotations

import logging
import math
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["MAX_TIME_S", "finite_samples", "guarded", "not_computed"]

log = logging.getLogger(__name__)

MAX_TIME_S = 86_400.0   # a time more than a day after the point's start is not a time of this point
_TIMES = ("due", "ready", "sent", "begin", "first", "end", "done")


def _finite(values: Sequence[float | None] | None, n: int) -> np.ndarray | None:
    if values is None or len(values) != n:
        return None
    x = np.asarray([math.nan if v is None else v for v in values], dtype=float)
    return x


def _good(x: np.ndarray) -> np.ndarray:
    return np.isfinite(x) & (np.abs(x) <= MAX_TIME_S)


def finite_samples(s: dict[str, Any]) -> dict[str, Any]:
    """The samples with every time finite (see the module docstring); `s` itself when nothing needs mending."""
    ok = [bool(v) for v in s.get("ok") or []]
    n = len(ok)
    times = {k: _finite(s.get(k), n) for k in _TIMES}
    chunks = s.get("chunks") or [[] for _ in range(n)]
    bad_chunks = [i for i, c in enumerate(chunks) if len(c) and not _good(np.asarray(c, dtype=float)).all()]
    bad_times = {k: ~_good(x) for k, x in times.items() if x is not None}
    lags = np.asarray(s.get("loop_lag") or [], dtype=float)
    counts_bad = any(v is None for k in ("in_tok", "out_tok") for v in s.get(k) or [])
    if not bad_chunks and not any(b.any() for b in bad_times.values()) and np.isfinite(lags).all() \
            and not counts_bad and len(chunks) == n:
        return s
    out = dict(s)
    begin = times.get("begin") if times.get("begin") is not None else times.get("sent")
    begin = begin if begin is not None else np.zeros(n)
    known = {k: (x if x is not None else None) for k, x in times.items()}
    broken = np.zeros(n, dtype=bool)
    for k in ("begin", "first", "end"):
        x = known.get(k) if known.get(k) is not None else (known.get("sent") if k == "begin" else None)
        if x is not None:
            broken |= ~_good(x)
    start = np.where(_good(begin), begin, 0.0)
    for k, x in known.items():
        if x is None:
            continue
        fallback = {"first": known.get("end"), "end": known.get("first"), "done": known.get("end")}.get(k)
        alt = fallback if fallback is not None else start
        mended = np.where(_good(x), x, np.where(_good(alt), alt, start))
        out[k] = mended.tolist()
    new_ok = [g and not b for g, b in zip(ok, broken)]
    if new_ok != ok:
        errors = list(s.get("error") or [None] * n)
        for i, (before, after) in enumerate(zip(ok, new_ok)):
            if before and not after:
                errors[i] = "its times are not finite"
        out["ok"], out["error"] = new_ok, errors
    out["chunks"] = [[float(v) for v in c if math.isfinite(float(v)) and abs(float(v)) <= MAX_TIME_S]
                     for c in chunks] if bad_chunks or len(chunks) != n else chunks
    if len(out["chunks"]) != n:
        out["chunks"] = (list(out["chunks"]) + [[] for _ in range(n)])[:n]
    for k in ("in_tok", "out_tok"):
        if s.get(k) is not None:
            out[k] = [-1 if v is None else v for v in s[k]]
    out["loop_lag"] = lags[np.isfinite(lags)].tolist()
    return out


def not_computed(name: str, exc: BaseException) -> dict[str, Any]:
    """The fields that say an analysis raised instead of answering."""
    return {f"{name}_not_computed": f"{type(exc).__name__}: {exc}"[:300], "analysis_errors": [name]}


def guarded(name: str, fn: Callable[..., dict[str, Any]], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """`fn(*args, **kwargs)`, or the fields that say it raised (`not_computed`), its traceback logged."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # one statistic's failure is recorded on the point, never raised
        log.warning("the %s analysis of a point raised; its fields are marked not computed:\n%s", name,
                    traceback.format_exc())
        return not_computed(name, exc)


def merge(out: dict[str, Any], fields: dict[str, Any]) -> None:
    """Add an analysis's fields to a result, keeping every failed analysis named in `analysis_errors`."""
    errors = list(out.get("analysis_errors") or []) + list(fields.get("analysis_errors") or [])
    out.update(fields)
    if errors:
        out["analysis_errors"] = errors

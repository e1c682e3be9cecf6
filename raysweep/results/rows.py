"""The rows of a results table that a figure draws or a verdict weighs: comma-list options, column checks,
`--filter-by` and `--bin-by`, groups of rows and their labels, the load variable and the parameters that only
follow it, the columns of the SLA table, and the notes on runs left out or flagged (client-limited, failed
validity checks). The figures (`raysweep.report.plots`), the Pareto front (`raysweep.results.front`) and the
conclusions read them here.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from raysweep.bench.load import VARIABLES
from raysweep.errors import UserError, unknown_names
from raysweep.results.labels import fmt_value, keyed_label, sort_key

_FILTER = re.compile(r"^\s*([^<>=!]+?)\s*(==|!=|<=|>=|<|>)\s*(.*?)\s*$")  # longest operator first
_OPS: dict[str, Callable[[Any, Any], Any]] = {"==": operator.eq, "!=": operator.ne, "<=": operator.le,
                                              ">=": operator.ge, "<": operator.lt, ">": operator.gt}


def split_list(text: str | Iterable[str] | None) -> tuple[str, ...]:
    """A comma list option (`a,b`), or several of them, as a tuple of names."""
    parts = [text] if isinstance(text, str) else list(text or ())
    return tuple(n.strip() for p in parts for n in p.split(",") if n.strip())


def _columns_text(df: pd.DataFrame) -> str:
    return ", ".join(map(str, df.columns))


def check_columns(df: pd.DataFrame, names: Iterable[str], option: str) -> None:
    """:raises UserError: a name is not a column (naming `option` and listing the columns)."""
    missing = [n for n in names if n not in df.columns]
    if missing:
        raise UserError(unknown_names(option, missing, [str(c) for c in df.columns]))


def apply_filters(df: pd.DataFrame, exprs: Iterable[str], option: str = "--filter-by") -> pd.DataFrame:
    """Keep the rows that meet every `column<op>value` (ops `==, !=, <, <=, >, >=`), as vLLM's plot does:
    `==`/`!=` compare as booleans on a boolean column, as numbers when the value is one, else as text;
    the ordering operators always compare numbers."""
    for expr in split_list(exprs):
        m = _FILTER.match(expr)
        if not m:
            raise UserError(f"{option} {expr!r}: expected COLUMN<op>VALUE with op one of ==, !=, <, <=, >, >=")
        name, op, raw = m.groups()
        check_columns(df, [name], f"{option} {expr!r}:")
        df = df[_compare(df[name], op, raw, f"{option} {expr!r}")]
    return df


def _compare(col: pd.Series, op: str, raw: str, where: str) -> pd.Series:
    number = _number(raw)
    if op in ("==", "!=") and _is_bool(col) and raw.lower() in ("true", "false", "1", "0"):
        return _OPS[op](col.fillna(False).astype(bool), raw.lower() in ("true", "1"))
    if number is not None:
        return _OPS[op](pd.to_numeric(col, errors="coerce"), number)
    if op in ("==", "!="):
        return _OPS[op](col.map(fmt_value), raw)
    raise UserError(f"{where}: {op} needs a number, not {raw!r}")


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _is_bool(col: pd.Series) -> bool:
    values = col.dropna()
    return len(values) > 0 and all(isinstance(v, (bool, np.bool_)) for v in values)


def _apply_bins(df: pd.DataFrame, exprs: Iterable[str]) -> pd.DataFrame:
    """vLLM's `--bin-by var%size`: the column becomes floor(v / size) * size, pooling nearby x values."""
    for expr in split_list(exprs):
        name, _, size = expr.partition("%")
        step = _number(size)
        if not step or step <= 0:
            raise UserError(f"--bin-by {expr!r}: expected COLUMN%SIZE with a positive SIZE")
        check_columns(df, [name], f"--bin-by {expr!r}:")
        df = df.assign(**{name: np.floor(pd.to_numeric(df[name], errors="coerce") / step) * step})
    return df


def _groups(df: pd.DataFrame, keys: Sequence[str]) -> tuple[pd.Series, list[str]]:
    """Each row's group label (`k=v, k2=v2`, or `(all)` without keys) and the labels in natural order."""
    if not keys:
        return pd.Series("(all)", index=df.index, dtype=object), ["(all)"]
    tuples = list(df[list(keys)].itertuples(index=False, name=None))
    labels = [keyed_label(keys, t) for t in tuples]
    first: dict[str, tuple[Any, ...]] = {}
    for label, t in zip(labels, tuples, strict=True):
        first.setdefault(label, t)
    order = sorted(first, key=lambda lab: tuple(sort_key(v) for v in first[lab]))
    return pd.Series(labels, index=df.index, dtype=object), order


def _curve_title(keys: Sequence[str]) -> str:
    return "server config" if tuple(keys) == ("serve_label",) else ", ".join(keys)


def client_limited_mask(df: pd.DataFrame) -> pd.Series:
    if "client_limited" not in df.columns:
        return pd.Series(False, index=df.index)
    return df["client_limited"].map(lambda v: v is True or v == 1 or str(v).lower() == "true")


def _numeric(df: pd.DataFrame, names: Sequence[str]) -> tuple[pd.DataFrame, list[str]]:
    """Rows whose `names` are finite numbers (as floats), and a note on the rows left out."""
    values = {n: pd.to_numeric(df[n], errors="coerce").astype(float) for n in names}
    finite = np.logical_and.reduce([np.isfinite(v.to_numpy()) for v in values.values()])
    dropped = int((~finite).sum())
    notes = [f"{dropped} run(s) with a non-finite or missing {' or '.join(names)} left out"] if dropped else []
    return df[finite].assign(**{n: v[finite] for n, v in values.items()}), notes


_POINT = ["serve_id", "bench_id"]


def _measured_x(df: pd.DataFrame, x: str) -> bool:
    """Whether x is a measurement (it differs between the runs of one point), not a parameter."""
    if not set(_POINT) <= set(df.columns) or df.empty:
        return False
    return bool(df.groupby(_POINT, dropna=False)[x].nunique().max() > 1)


def _flagged(df: pd.DataFrame) -> pd.Series:
    """Runs that fail a validity check, client-limited ones aside (they are drawn hollow)."""
    if "validity_ok" not in df.columns:
        return pd.Series(False, index=df.index)
    bad = df["validity_ok"].map(lambda v: v is False or v == 0 or str(v).lower() == "false")
    return bad & ~client_limited_mask(df)


def _flagged_note(df: pd.DataFrame) -> list[str]:
    n = int(_flagged(df).sum())
    return [f"{n} run(s) fail a validity check (niced, shared CPUs, errors, not steady, ...), marked with a red "
            "cross (validity_issues in the results)"] if n else []


def _limited_note(df: pd.DataFrame, where: str = "in the curves") -> list[str]:
    n = int(client_limited_mask(df).sum())
    return [f"{n} client-limited run(s) drawn hollow, not {where}"] if n else []


def load_linked(df: pd.DataFrame, load: str | None, names: Iterable[str]) -> list[str]:
    """The parameters among `names` that only follow the load: one value per load value (a num_prompts
    scaled with max_concurrency); they tell nothing apart that the load does not."""
    if not load or load not in df.columns:
        return []
    return [n for n in names if n != load and n in df.columns
            and df.groupby(df[load].astype(str))[n].agg(lambda s: s.astype(str).nunique()).max() <= 1]


def load_variable(df: pd.DataFrame, fallback: str) -> str:
    """The load variable of a table: `max_concurrency` or `request_rate`, whichever takes several finite
    values, else `fallback`."""
    for name in VARIABLES:
        if name in df.columns:
            values = pd.to_numeric(df[name], errors="coerce")
            if values[np.isfinite(values)].nunique() > 1:
                return name
    return fallback


SLA_COLUMNS = ("serve_label", "bench_label", "target", "state", "largest_pass")  # what an SLA figure or verdict reads

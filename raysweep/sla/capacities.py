"""SLA search's part of the conclusions: per bench point and target, the configs ranked by their capacity (the
largest load that met the target), with the cost (else energy) per output token of each search's probe at that
load and the cheapest config that meets the bound (`raysweep.results.conclusions.CHEAPEST_METRICS`;
docs/energy.md). The conclusions ask for `capacities` through `raysweep.drive.hooks` (`sla_capacities`), where
`raysweep.sla` lends it; `raysweep sla` (the CLI) adds the costs to its table with `sla_costs`."""

from __future__ import annotations

import math

import pandas as pd

from raysweep.results.conclusions import CHEAPEST_METRICS
from raysweep.results.rows import SLA_COLUMNS

__all__ = ["capacities", "sla_costs"]


def capacities(sla: pd.DataFrame, df: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per bench point and target, each config's largest passing value, best first (unbounded first, none
    last); with the cost (else energy) per output token of its probe at that value (`<metric>_at_pass`, the
    mean of its runs) and `cheapest` marking the least of them per bench point and target."""
    if sla.empty or not set(SLA_COLUMNS) <= set(sla.columns):
        return pd.DataFrame()
    value = pd.to_numeric(sla["largest_pass"], errors="coerce")
    ranked = sla.assign(_v=value.fillna(-math.inf)).sort_values(["bench_label", "target", "_v"],
                                                               ascending=[True, True, False], kind="stable")
    return _cheapest_at_pass(ranked.drop(columns="_v").reset_index(drop=True), df)


def sla_costs(table: pd.DataFrame, df: pd.DataFrame | None) -> pd.DataFrame:
    """An SLA table (`results.sla_table`) with the cost (else energy) per output token of each search's probe
    at its largest passing value and `cheapest` marking the least per bench point and target; as it was
    where the runs have neither."""
    return _cheapest_at_pass(table, df)


def _cheapest_at_pass(table: pd.DataFrame, df: pd.DataFrame | None) -> pd.DataFrame:
    """`capacities`' cost columns, from the runs of each search's probe at its largest passing value."""
    if df is None or not {"sla_base_id", "sla_value", "serve_id"} <= set(df.columns):
        return table
    for metric in CHEAPEST_METRICS:
        if metric not in df.columns or not pd.to_numeric(df[metric], errors="coerce").notna().any():
            continue
        col = f"{metric}_at_pass"
        values = []
        for _, r in table.iterrows():
            runs = df[(df["serve_id"] == r["serve_id"]) & (df["sla_base_id"] == r["bench_id"])
                      & (pd.to_numeric(df["sla_value"], errors="coerce") == r["largest_pass"])]
            got = pd.to_numeric(runs[metric], errors="coerce").dropna()
            values.append(float(got.mean()) if len(got) else math.nan)
        table = table.assign(**{col: values, "cheapest_metric": metric})
        least = table.groupby(["bench_label", "target"])[col].transform("min")
        return table.assign(cheapest=table[col].notna() & (table[col] == least))
    return table

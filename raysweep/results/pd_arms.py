"""Whether a campaign's P/D deployments differ only where the campaign declared that they differ.

Deployments compared in one campaign are fair arms only where their role servers started alike but for the
campaign's declared sweep axes: a setting that one arm's decode server has and the other's lacks (CUDA graphs
off, a smaller `max_num_seqs`) moves the comparison as much as the ratio under test. Each P/D point's result
carries the effective settings of every role server as it started (`pd_role_settings`, read from its log by
`raysweep.serve.pd`); here, per pair of deployments, every difference beyond the declared axes
(`raysweep.serve.pd_settings.declared_axes` of the campaign's serve parameters), role server by role server.
A role server that only one arm has (a 2P1D against a 1P1D: its ratio is declared) is compared with the other
arm's first server of the role. A deployment whose runs carry no settings says `not recorded`, never that
nothing differs. A deployment whose decode servers prefilled requests again (their KV did not arrive
through the connector: `pd_decode_prefilled_requests`) is not the deployment under test either: a line
says how many, at which loads. Pure: a function of the results table, without Ray.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from itertools import combinations
from typing import Any

import pandas as pd

from raysweep.serve.pd_settings import declared_axes, settings_differences

__all__ = ["ROLE_SETTINGS", "arm_lines", "prefilled_again_lines", "role_settings_by_deployment",
           "undeclared_differences"]

log = logging.getLogger(__name__)

ROLE_SETTINGS = "pd_role_settings"  # a P/D point's JSON: each role server's effective settings


def role_settings_by_deployment(df: pd.DataFrame, serve_ids: Iterable[str]) -> dict[str, dict[str, Any] | None]:
    """Each deployment's role servers' settings as its runs recorded them (the first readable record of its
    runs), None where none of its runs carries them."""
    out: dict[str, dict[str, Any] | None] = {str(s): None for s in serve_ids}
    if ROLE_SETTINGS not in df.columns or "serve_id" not in df.columns:
        return out
    for sid, text in zip(df["serve_id"].astype(str), df[ROLE_SETTINGS], strict=True):
        if sid not in out or out[sid] is not None or not isinstance(text, str) or not text:
            continue
        try:
            value = json.loads(text)
        except ValueError:
            log.info("serve %s has unreadable %s", sid, ROLE_SETTINGS)
            continue
        if isinstance(value, dict) and value:
            out[sid] = value
    return out


def _aligned(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both arms' servers under the same names: a server only one arm has (`prefill-1`) stands against the
    other arm's first server of its role (`prefill-0`), where that arm has the role."""
    def first(side: Mapping[str, Any], name: str) -> Any:
        role = name.rsplit("-", 1)[0]
        return side.get(name, side.get(f"{role}-0"))

    names = sorted(set(a) | set(b))
    return ({n: first(a, n) for n in names if first(a, n) is not None},
            {n: first(b, n) for n in names if first(b, n) is not None})


def undeclared_differences(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None,
                           declared: set[str] | frozenset[str]) -> list[str] | None:
    """Every difference of two deployments' role servers' settings beyond the `declared` axes (vLLM names);
    None where either side's settings were not recorded."""
    if a is None or b is None:
        return None
    left, right = _aligned(a, b)
    return settings_differences(left, right, declared)


def arm_lines(df: pd.DataFrame, names: Mapping[str, str], serve_params: Iterable[Mapping[str, Any]]) -> list[str]:
    """What the conclusions say of a campaign's P/D deployments `names` (by serve_id, `pd_regions`) as arms:
    a line per pair that differs beyond the declared sweep axes of `serve_params` (the campaign's serve
    parameter combinations), one for the deployments whose settings were not recorded, or one saying that
    they differ only where declared. [] with fewer than two deployments."""
    if len(names) < 2:
        return []
    declared = declared_axes([dict(p) for p in serve_params])
    axes = ", ".join(sorted(declared)) or "none"
    settings = role_settings_by_deployment(df, names)
    missing = [names[s] for s, v in settings.items() if v is None]
    lines = []
    for sa, sb in combinations(sorted(names), 2):
        diffs = undeclared_differences(settings[sa], settings[sb], declared)
        if diffs:
            lines.append(f"Deployments {names[sa]} and {names[sb]} differ beyond the declared sweep axes ({axes}): "
                         f"{'; '.join(diffs)}; their comparison is not like for like")
    if missing:
        lines.append(f"Role servers' settings not recorded for {', '.join(sorted(missing))}: whether the "
                     "deployments differ beyond the declared sweep axes is not known")
    elif not lines:
        lines.append(f"The {len(names)} deployments' role servers differ only in the declared sweep axes ({axes}), "
                     "as their settings were recorded at their start")
    return lines


def prefilled_again_lines(df: pd.DataFrame, names: Mapping[str, str], load: str | None = None) -> list[str]:
    """A line per P/D deployment (`names`, by serve_id) whose decode servers prefilled some of its requests
    again (`pd_decode_prefilled_requests` of its runs, out of `pd_decode_finished_requests`), with the loads
    (`load`, the campaign's load column) where they did; [] where none did or none was counted."""
    cols = {"serve_id", "pd_decode_prefilled_requests", "pd_decode_finished_requests"}
    if not names or not cols <= set(df.columns):
        return []
    lines = []
    for sid, name in sorted(names.items(), key=lambda kv: kv[1]):
        runs = df[df["serve_id"].astype(str) == sid]
        again = pd.to_numeric(runs["pd_decode_prefilled_requests"], errors="coerce")
        if not (again > 0).any():
            continue
        finished = pd.to_numeric(runs["pd_decode_finished_requests"], errors="coerce")[again.notna()]
        where = ""
        if load and load in runs.columns:
            loads = sorted(set(runs.loc[again > 0, load].dropna().tolist()))
            where = f" at {load} {', '.join(f'{v:g}' if isinstance(v, float) else str(v) for v in loads)}"
        lines.append(f"Deployment {name}: its decode servers prefilled {int(again.sum())} of {int(finished.sum())} "
                     f"requests again{where} (their KV did not arrive through the connector): its latencies "
                     "include prefills a working transfer does not do")
    return lines

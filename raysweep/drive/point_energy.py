"""A point's energy and cost columns: the energy of its server's devices over the point's steady window.

The window is the one the steady-state test judged (`steady_state_window_start_s`/`_end_s`, seconds from the
load's start: no ramp-up, no drain; never the server's start or the warmup, which come before the load).
A point without it (too short to judge, or a command backend's JSON without per-request samples) is
measured over its whole load, and `energy_window` says which. The tokens are those made inside the window:
each request's output tokens spread evenly over its streamed chunks, and its input tokens counted when its
first token came (its prefill done). Every node of the server gives its own GPUs' readings
(`ServerHost.telemetry_energy`), so two servers sharing a node each count only their own GPUs.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import ray

from raysweep.maths import energy

__all__ = ["load_window", "node_label_values", "point_energy_fields", "window_tokens"]

log = logging.getLogger(__name__)


def load_window(result: dict[str, Any], started: float, ended: float) -> tuple[float, float, str]:
    """The absolute window to measure and its name: the steady-state test's window, else the whole load (for a
    command's JSON, which gives no start, its duration back from the process's return: `point.load_windows`)."""
    t0 = float(result.get("start_time") or started)
    lo, hi = result.get("steady_state_window_start_s"), result.get("steady_state_window_end_s")
    if lo is not None and hi is not None and hi > lo:
        return t0 + float(lo), t0 + float(hi), "steady"
    why = str(result.get("steady_state_note") or "no steady-state window")
    if result.get("offline_kind") and result.get("load_window_start") is not None:  # raysweep.offline.points
        return (float(result["load_window_start"]), float(result["load_window_end"]),
                "load (offline: its elapsed time back from the command's exit)")
    if result.get("start_time") is None and result.get("load_window_start") is not None:  # a command's JSON
        return float(result["load_window_start"]), float(result["load_window_end"]), f"load ({why})"
    return t0, float(result.get("end_time") or ended), f"load ({why})"


def window_tokens(samples: dict[str, Any] | None, lo: float, hi: float) -> tuple[float, float] | None:
    """Output and total tokens made between lo and hi (seconds from the load's start), from the raw samples."""
    if not samples or not len(samples.get("ok") or []):
        return None
    ok = np.asarray(samples["ok"], dtype=bool)
    begin = np.asarray(samples.get("begin") if len(samples.get("begin") or []) == ok.size else samples["sent"],
                       dtype=float)
    first, end = np.asarray(samples["first"], dtype=float), np.asarray(samples["end"], dtype=float)
    outs, ins = np.asarray(samples["out_tok"], dtype=float), np.asarray(samples["in_tok"], dtype=float)
    out_tokens = in_tokens = 0.0
    for i in np.flatnonzero(ok):
        chunks = np.asarray(samples["chunks"][i], dtype=float)
        times = begin[i] + chunks if chunks.size else np.asarray([end[i]])
        out_tokens += float(outs[i]) * float(np.mean((times >= lo) & (times <= hi)))
        if np.isfinite(first[i]) and lo <= first[i] <= hi and ins[i] > 0:
            in_tokens += float(ins[i])
    return out_tokens, out_tokens + in_tokens


def _tokens(result: dict[str, Any], samples: dict[str, Any] | None, kind: str) -> tuple[float | None, float | None]:
    """The window's output and total tokens: counted in the samples for the steady window, else the load's."""
    if kind == "steady":
        got = window_tokens(samples, float(result["steady_state_window_start_s"]),
                            float(result["steady_state_window_end_s"]))
        if got is not None:
            return got
    out, inp = result.get("total_output_tokens"), result.get("total_input_tokens")
    return (float(out) if out is not None else None,
            float(out) + float(inp or 0) if out is not None else None)


def point_energy_fields(hosts: list[Any], result: dict[str, Any], samples: dict[str, Any] | None, started: float,
                        ended: float, enabled: bool) -> dict[str, Any]:
    """The point's `energy_*`, `power_*` and per-token columns (see the module docstring), or only
    `energy_note` saying why there are none (never zeros)."""
    if not enabled:
        return {"energy_note": "off (transport.telemetry: false)"}
    if not hosts:
        return {"energy_note": "no energy reading: the server is not raysweep's (an endpoint), its devices are "
                               "not read"}
    offline = result.get("offline_kind")
    if offline == "startup":
        return {"energy_note": "not applicable: a startup point makes no tokens (per-token energy and cost do "
                               "not apply)"}
    if offline and result.get("load_window_start") is None:
        return {"energy_note": "no energy reading: the offline run gave no elapsed time to window its energy"}
    t0, t1, kind = load_window(result, started, ended)
    try:
        windows = ray.get([h.telemetry_energy.remote(t0, t1) for h in hosts], timeout=60)
    except (ray.exceptions.RayError, AttributeError) as exc:
        return {"energy_note": f"no energy reading: {type(exc).__name__}"}
    devices: dict[str, Any] = {}
    idle: dict[str, float | None] = {}
    wraps: dict[str, float] = {}
    sources, whys = set(), set()
    for r, w in enumerate(windows):
        w = w or {}
        if w.get("source"):
            sources.add(str(w["source"]))
        elif w.get("why"):
            whys.add(str(w["why"]))
        for dev, rows in (w.get("devices") or {}).items():
            key = f"node{r}:{dev}"
            devices[key] = [tuple(x) for x in rows]
            idle[key] = (w.get("idle_w") or {}).get(dev)
            if dev in (w.get("wraps") or {}):
                wraps[key] = w["wraps"][dev]
    if not devices:
        return {"energy_note": "; ".join(sorted(whys)) or "no energy reading: telemetry not started"}
    if offline:  # its devices were read for idle while the command loaded its weights: not idle
        idle = {k: None for k in idle}
    e = energy.window_energy(devices, idle, t0, t1, wraps)
    if "energy_j" not in e:
        return e
    if offline:
        e["energy_note"] = "offline: no idle reading (the command was loading), net of idle not given"
    elif any(v is None for v in idle.values()):
        e["energy_note"] = "idle power not measured: net of idle not given"
    out_tok, tot_tok = _tokens(result, samples, kind)
    fields = energy.energy_fields(e, out_tok, tot_tok)
    fields.update(energy_source=", ".join(sorted(sources)), energy_window=kind)
    return fields


def node_label_values(nodes: list[dict[str, Any]]) -> list[str]:
    """The Ray label values of a server's nodes (a node type such as an instance type, for `cost.gpu_hour`)."""
    ids = {str(n.get("node_id") or "") for n in nodes}
    try:
        return sorted({str(v) for n in ray.nodes() if n.get("NodeID") in ids
                       for v in (n.get("Labels") or {}).values()})
    except Exception:
        return []

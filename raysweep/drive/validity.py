"""The validity record of a result: was the point measured fairly? (pure logic)

`validity_fields(record)` reads a result record (the client's verdict, the niceness and CPU affinity of
the server and of the client actors, the node each ran on, the request counts, the steady-state test and
the transport verdict) and returns the fields every result row carries:

- `shared_cpus`: a client actor ran on a node of the server with CPUs in common with the server process
  (None when the affinities are unknown);
- `error_rate`: failed / (completed + failed) requests;
- `validity_ok` (no check failed) and `validity_issues` (the failed checks, "; "-separated).

The checks: `client-limited` (the client could not send the load asked: `client_limited`), `niced`
(the server process or a client actor ran at a niceness above 0), `shared CPUs`, `errors` (any request
failed), `not steady` (the per-second throughput still drifted: `steady_state` false; absent means unknown
and fails nothing), `socket transport` (a multi-node server whose cross-node traffic went over TCP
sockets), `throttled` (the server's GPUs were throttled, by power cap, heat or a hardware slowdown, in
more than 5 % of the point's NVML samples: `gpu_throttled_fraction`), `cache not reset` (the point did not
start from reset caches: `cache_state_before` says the reset or the after_bench_cmd failed, e.g. a server
that refuses /reset_prefix_cache), `client started late` (a native client actor began the point more than
`START_LATE_MS` after the common start: `client_start_late_ms`, its first requests late by as much).
`unknown_checks(record)` names the checks that had nothing to judge (the `command` backend's JSON holds no
send times: its client is "not judged").
"""

from __future__ import annotations

import math
import re
from typing import Any

from raysweep.procs import cpu_set
from raysweep.serve.telemetry import THROTTLED_FRACTION

__all__ = ["CHECKS", "shared_cpus", "unknown_checks", "validity_fields"]

CHECKS = ("client-limited", "niced", "shared CPUs", "errors", "not steady", "socket transport", "throttled",
          "cache not reset", "client started late", "other hardware")
START_LATE_MS = 10.0  # an actor that began later than this after the common start: the guard's send-lag bound
_SPLIT_ACTORS = re.compile(r"[;|]")


def _per_actor(value: object) -> list[Any]:
    """A per-actor field (a list, or text with one entry per actor separated by ';' or '|')."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    text = str(value)
    return [v for v in _SPLIT_ACTORS.split(text)] if _SPLIT_ACTORS.search(text) else [text]


def _nices(value: object) -> list[int]:
    """Niceness values from a field that holds one or several (ints, or text "0,15")."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return []
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [int(value)]
    if isinstance(value, (list, tuple)):
        return [n for v in value for n in _nices(v)]
    return [int(t) for t in re.findall(r"-?\d+", str(value))]


def _server_cpus_by_node(r: dict[str, Any]) -> dict[str, set[int] | None]:
    """The server's CPU affinity on each of its nodes, by node IP."""
    per_node = r.get("server_cpu_affinity_per_node")
    out: dict[str, set[int] | None] = {}
    if per_node:
        for entry in str(per_node).split(";"):
            ip, _, cpus = entry.partition("=")
            if ip:
                out[ip.strip()] = cpu_set(cpus)
    elif r.get("node_ip"):
        out[str(r["node_ip"])] = cpu_set(r.get("server_cpu_affinity"))
    return out


def shared_cpus(r: dict[str, Any]) -> bool | None:
    """Whether a client actor ran on a node of the server with CPUs in common with it; None if unknown."""
    server = _server_cpus_by_node(r)
    ips = [ip.strip() for ip in str(r.get("client_node_ips") or "").split(",") if ip.strip()]
    if not server or not ips:
        return None
    same = [i for i, ip in enumerate(ips) if ip in server]
    if not same:
        return False
    affinities = _per_actor(r.get("client_cpu_affinity"))
    if not affinities:
        return None
    unknown = False
    for i in same:
        # one entry per actor when they line up with the nodes; otherwise every actor's CPUs count
        mine = cpu_set(affinities[i]) if len(affinities) == len(ips) else cpu_set(affinities)
        theirs = server[ips[i]]
        if mine is None or theirs is None:
            unknown = True
        elif mine & theirs:
            return True
    return None if unknown else False


def _known(v: object) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def _error_rate(r: dict[str, Any]) -> float | None:
    done, failed = r.get("completed"), r.get("failed")
    if done is None and failed is None:
        return None
    total = float(done or 0) + float(failed or 0)
    return float(failed or 0) / total if total else None


def _issues(r: dict[str, Any], shared: bool | None, errors: float | None) -> list[str]:
    issues = []
    if _known(r.get("client_limited")) and bool(r["client_limited"]):
        reason = r.get("client_limited_reason")
        issues.append("client-limited" + (f" ({str(reason).replace('; ', ', ')})" if reason else ""))
    niced = [f"server {n}" for n in _nices(r.get("server_nice")) if n > 0][:1] + \
            [f"client {n}" for n in _nices(r.get("client_nice")) if n > 0][:1]
    if niced:
        issues.append(f"niced ({', '.join(niced)})")
    if shared:
        issues.append("shared CPUs")
    if errors:
        issues.append(f"errors ({int(r.get('failed') or 0)} failed, {100 * errors:.1f} %)")
    if _known(r.get("steady_state")) and not bool(r["steady_state"]):
        slope = r.get("steady_state_slope_pct_per_s")
        issues.append("not steady" + (f" (slope {float(slope):+.1f} %/s)" if isinstance(slope, (int, float)) else ""))
    if str(r.get("transport_inter") or "") == "Socket":
        issues.append("socket transport")
    hot = r.get("gpu_throttled_fraction")
    if isinstance(hot, (int, float)) and hot > THROTTLED_FRACTION:
        issues.append(f"throttled ({r.get('gpu_throttle_reasons') or '?'} in {100 * hot:.0f} % of samples)")
    cache = str(r.get("cache_state_before") or "")
    if cache.startswith(("reset failed", "after_bench_cmd failed")):
        issues.append(f"cache not reset ({cache[:120]})")
    late = r.get("client_start_late_ms")
    if isinstance(late, (int, float)) and not isinstance(late, bool) and late > START_LATE_MS:
        issues.append(f"client started late ({float(late):.1f} ms after the common start)")
    return issues


def validity_fields(record: dict[str, Any]) -> dict[str, Any]:
    """The validity fields of a result record (see the module docstring)."""
    shared = shared_cpus(record)
    errors = _error_rate(record)
    issues = _issues(record, shared, errors)
    steady = record.get("steady_state")
    return {"shared_cpus": shared, "error_rate": errors, "steady_state": bool(steady) if _known(steady) else None,
            "validity_ok": not issues, "validity_issues": "; ".join(issues)}


def unknown_checks(record: dict[str, Any]) -> list[str]:
    """The checks a record had nothing to judge with (a field missing), by name."""
    out = []
    if not _known(record.get("client_limited")):
        out.append("client-limited")
    if not _nices(record.get("server_nice")) or not _nices(record.get("client_nice")):
        out.append("niced")
    if shared_cpus(record) is None:
        out.append("shared CPUs")
    if not _known(record.get("steady_state")):
        out.append("not steady")
    return out

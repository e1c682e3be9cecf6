"""Time series inside a point, its steady-state window, and the report's time-series figures.

Per bin of `--timeseries-interval` seconds (default 1) from the point's common start to the end of its last
request (`series`):
- `request_throughput` (requests finished in the bin, per s), `output_throughput` (output tokens per s, each
  request's tokens spread evenly over its chunks), `failed` (requests that failed, by when they ended);
- `in_flight`: the time-weighted mean of requests in flight (from the start of each to the end of its stream);
- `ttft_p50_ms`, `ttft_p99_ms` over the requests whose first token came in the bin, `itl_p50_ms`,
  `itl_p99_ms` over the inter-chunk gaps that ended in it (NaN where none);
- the server's gauges from its `/metrics` scrapes in the bin (their mean; NaN where none):
  `server_kv_cache_usage_perc`, `server_num_requests_running`, `server_num_requests_waiting`.
A partial last bin is kept (its rates are over its own length); `t_s` is each bin's start.

The steady-state window (`steady_window`) is the longest run of whole bins, at least `MIN_BINS` long, over
which a least-squares line through the output throughput changes by at most `MAX_DRIFT_PCT` of its mean,
and so does the line through each of its halves (the slope test of the point's `steady_state` field,
applied to every window instead of the fixed middle; the halves keep a ramp-up at one end and a drain at the
other from cancelling out): the ramp-up before it and the drain after it are left out. The point's headline
metrics are then computed
again over the requests begun inside the window (`steady_*` fields; `steady_window_start_s`/`_end_s`).

The series is stored beside the result as `points/SERVE/BENCH/run=N.timeseries.parquet` (its path in the
result's `timeseries_path`); `report_section` draws one figure per bench point of each server config.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raysweep.bench.sane import finite_samples, guarded, merge
from raysweep.bench.stats import _arr, _begin, _summary
from raysweep.record.files import write_bytes_atomic

__all__ = ["MAX_DRIFT_PCT", "MIN_BINS", "SERVER_GAUGES", "attach", "read_timeseries", "series",
           "steady_fields", "steady_window", "write_timeseries"]

log = logging.getLogger(__name__)

MIN_BINS = 5
MAX_DRIFT_PCT = 10.0
SERVER_GAUGES = {"vllm:kv_cache_usage_perc": "server_kv_cache_usage_perc",
                 "vllm:num_requests_running": "server_num_requests_running",
                 "vllm:num_requests_waiting": "server_num_requests_waiting"}


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else math.nan


def series(s: dict[str, Any], scrapes: list[Any] | None = None, interval: float = 1.0,
           start_wall: float | None = None) -> dict[str, np.ndarray]:
    """The point's time series (see the module docstring) from its pooled samples and the server scrapes
    (objects with `.at`, a wall time, and `.values`; `start_wall` is the point's start on that clock)."""
    s = finite_samples(s)
    ok = _arr(s, "ok", bool)
    begin, end, first = _begin(s), _arr(s, "end"), _arr(s, "first")
    done = np.maximum(_arr(s, "done", instead="end"), end)
    last = float(np.max(done)) if done.size else 0.0
    n = max(1, int(math.ceil(last / interval - 1e-9)))
    edges = np.arange(n + 1) * interval
    width = np.minimum(edges[1:], max(last, interval if not done.size else last)) - edges[:-1]
    width = np.where(width > 0, width, interval)
    idx = lambda t: np.clip((np.asarray(t) // interval).astype(np.int64), 0, n - 1)  # noqa: E731
    out: dict[str, np.ndarray] = {"t_s": edges[:-1]}
    out["request_throughput"] = np.bincount(idx(end[ok]), minlength=n)[:n] / width
    out["failed"] = np.bincount(idx(done[~ok]), minlength=n)[:n].astype(float)
    chunks = [np.asarray(c, dtype=float) for c, good in zip(s["chunks"], ok) if good]
    outs = _arr(s, "out_tok", float)[ok]
    times = np.concatenate([b + c for b, c in zip(begin[ok], chunks)]) if chunks else np.zeros(0)
    weights = np.concatenate([np.zeros(0), *(np.full(c.size, o / c.size) for c, o in zip(chunks, outs) if c.size)])
    out["output_throughput"] = np.bincount(idx(times), weights=weights, minlength=n)[:n] / width
    out["in_flight"] = np.diff(_in_flight_integral(begin, done, edges)) / width
    ttft, at = ((first - begin) * 1000.0)[ok], idx(first[ok])
    gaps = [(b + c[1:], np.diff(c) * 1000.0) for b, c in zip(begin[ok], chunks) if c.size > 1]
    gap_at = idx(np.concatenate([g[0] for g in gaps])) if gaps else np.zeros(0, dtype=np.int64)
    gap_ms = np.concatenate([g[1] for g in gaps]) if gaps else np.zeros(0)
    for name, values, where in (("ttft", ttft, at), ("itl", gap_ms, gap_at)):
        for q in (50, 99):
            out[f"{name}_p{q}_ms"] = np.array([_pct(values[where == i], q) for i in range(n)])
    for metric, col in SERVER_GAUGES.items():
        vals: list[list[float]] = [[] for _ in range(n)]
        for sc in scrapes or []:
            if start_wall is None or metric not in sc.values:
                continue
            t = sc.at - start_wall
            if 0 <= t <= last + interval:
                vals[min(int(t // interval), n - 1)].append(sc.values[metric])
        out[col] = np.array([float(np.mean(v)) if v else math.nan for v in vals])
    return out


def _in_flight_integral(begin: np.ndarray, done: np.ndarray, at: np.ndarray) -> np.ndarray:
    """For each time T in `at`, the integral from 0 to T of the number of requests in flight:
    sum over begins before T of (T - begin) less the same over ends (every end follows its begin)."""
    def part(times: np.ndarray) -> np.ndarray:
        times = np.sort(times)
        csum = np.concatenate([[0.0], np.cumsum(times)])
        k = np.searchsorted(times, at, side="left")
        return k * at - csum[k]
    return part(begin) - part(done)


def steady_window(tokens: np.ndarray, min_bins: int = MIN_BINS,
                  max_drift_pct: float = MAX_DRIFT_PCT) -> tuple[int, int] | None:
    """(first bin, bin after the last) of the longest window passing the slope test, over the whole window
    and over each of its halves (a ramp-up and a drain at both ends would otherwise cancel out in one line);
    None when none does. Ties go to the earliest window."""
    y = np.asarray(tokens, dtype=float)
    n = y.size
    if n < min_bins:
        return None
    x = np.arange(n, dtype=float)
    sums = [np.concatenate([[0.0], np.cumsum(v)]) for v in (y, x * y, x, x * x)]

    def drift(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """The fitted line's change over [a, b) in % of the mean, for arrays of windows."""
        m = (b - a).astype(float)
        sy, sxy, sx, sxx = (c[b] - c[a] for c in sums)
        with np.errstate(divide="ignore", invalid="ignore"):
            slope = np.where(m > 1, (m * sxy - sx * sy) / (m * sxx - sx * sx), 0.0)
            mean = sy / m
            return np.where(mean > 0, 100.0 * np.abs(slope) * (m - 1) / mean, np.inf)

    best: tuple[int, int] | None = None
    for a in range(0, n - min_bins + 1):
        b = np.arange(a + min_bins, n + 1)
        if best is not None and b[-1] - a <= best[1] - best[0]:
            break  # no longer window can start here or later
        lo = np.full(b.size, a)
        mid = (lo + b) // 2
        passed = (drift(lo, b) <= max_drift_pct) & (drift(lo, mid) <= max_drift_pct) & \
                 (drift(mid, b) <= max_drift_pct)
        good = np.flatnonzero(passed)
        if good.size and (best is None or int(b[good[-1]]) - a > best[1] - best[0]):
            best = (a, int(b[good[-1]]))
    return best


def steady_fields(s: dict[str, Any], ts: dict[str, np.ndarray], interval: float,
                  pcts: tuple[float, ...] = (99.0,)) -> dict[str, Any]:
    """The steady-state window and the headline metrics over it (requests begun inside it)."""
    tokens = ts["output_throughput"]
    whole = tokens[:-1] if tokens.size > 1 else tokens  # the partial last bin is not judged
    window = steady_window(whole)
    out: dict[str, Any] = {"steady_window_start_s": None, "steady_window_end_s": None}
    if window is None:
        return out
    a, b = window
    t0, t1 = a * interval, b * interval
    s = finite_samples(s)
    ok = _arr(s, "ok", bool)
    begin, end, first = _begin(s), _arr(s, "end"), _arr(s, "first")
    inside = ok & (begin >= t0) & (begin < t1)
    outs = _arr(s, "out_tok", np.int64)
    e2el, ttft = (end - begin)[inside], (first - begin)[inside]
    multi = outs[inside] > 1
    tpot = (e2el[multi] - ttft[multi]) / (outs[inside][multi] - 1)
    chunks = [np.asarray(c, dtype=float) for c, good in zip(s["chunks"], inside) if good]
    itl = np.concatenate([np.diff(c) for c in chunks]) if chunks else np.zeros(0)
    out.update(steady_window_start_s=t0, steady_window_end_s=t1, steady_requests=int(inside.sum()),
               steady_request_throughput=float(np.mean(ts["request_throughput"][a:b])),
               steady_output_throughput=float(np.mean(tokens[a:b])))
    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el)):
        out.update({f"steady_{k}": v for k, v in _summary(values, name, pcts).items() if not k.startswith("std")})
    return out


def attach(out: dict[str, Any], scrapes: list[Any] | None) -> None:
    """Give a native point's outcome its time series (`out["timeseries"]`) and its steady-state fields."""
    res, samples = out.get("result"), out.get("samples")
    if res is None or samples is None or not len(samples.get("ok") or []):
        return
    interval = float(res.get("timeseries_interval_s") or 1.0)
    try:
        ts = series(samples, scrapes, interval, res.get("start_time"))
    except Exception as exc:  # the point keeps its result without a time series, and says why
        merge(res, guarded("timeseries", _raise, exc))
        return
    out["timeseries"] = ts
    merge(res, guarded("steady_window", steady_fields, samples, ts, interval))


def _raise(exc: BaseException) -> dict[str, Any]:
    raise exc


def write_timeseries(path: str | Path, ts: dict[str, np.ndarray]) -> Path:
    """The series as a parquet file, written whole or not at all."""
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({k: pa.array(np.asarray(v, dtype=float)) for k, v in ts.items()}), sink,
                   compression="zstd")
    return write_bytes_atomic(path, sink.getvalue().to_pybytes())


def read_timeseries(path: str | Path) -> dict[str, np.ndarray]:
    return {k: np.asarray(v, dtype=float) for k, v in pq.read_table(path).to_pydict().items()}


def figure(ts: dict[str, np.ndarray], record: dict[str, Any]) -> Any:
    """Throughput and requests in flight, TTFT and ITL percentiles, the server's gauges, against time; the
    steady-state window shaded."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 2.8), layout="constrained")  # room for the twin axis between the panels
    axes = fig.subplots(1, 3)
    t = ts["t_s"]
    ax = axes[0]
    ax.plot(t, ts["output_throughput"], color="tab:blue", label="output tok/s")
    ax.set_ylabel("output tok/s", color="tab:blue")
    twin = ax.twinx()
    twin.plot(t, ts["in_flight"], color="tab:orange", label="in flight")
    twin.set_ylabel("requests in flight", color="tab:orange")
    twin.tick_params(axis="y", colors="tab:orange")
    twin.spines["right"].set_visible(True)
    ax = axes[1]
    for col, style in (("ttft_p50_ms", "-"), ("ttft_p99_ms", "--"), ("itl_p50_ms", "-"), ("itl_p99_ms", "--")):
        if col in ts and np.isfinite(ts[col]).any():
            ax.plot(t, ts[col], style, label=col.replace("_ms", ""))
    ax.set_ylabel("ms")
    ax.legend(fontsize=7)
    ax = axes[2]
    for col in SERVER_GAUGES.values():
        if col in ts and np.isfinite(ts[col]).any():
            values = ts[col] * (100.0 if col.endswith("perc") else 1.0)
            ax.plot(t, values, label=col.replace("server_", "") + (" (%)" if col.endswith("perc") else ""))
    ax.set_ylabel("server gauges")
    if ax.lines:
        ax.legend(fontsize=7)
    a, b = record.get("steady_window_start_s"), record.get("steady_window_end_s")
    for ax in axes:
        ax.set_xlabel("s from the start")
        if a is not None and b is not None:
            ax.axvspan(a, b, color="tab:green", alpha=0.08)
    return fig

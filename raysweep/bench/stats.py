"""Metrics of a point from the pooled raw samples of all its client actors.

Every actor returns its raw per-request samples, timed from the point's common start (a wall-clock instant
all actors agreed on): when each request was due, when it could have been sent (due, or later when the
concurrency limit held it), when it was sent, the arrival of each streamed chunk, the end, token counts
from the server's usage, and errors. `pool` concatenates them; `point_metrics` computes everything from the
pooled samples, never from per-actor summaries, with `vllm bench serve`'s field names and definitions:

- TTFT: send to the first chunk carrying `choices`; ITL: gaps between chunks (a chunk may hold several
  tokens); TPOT: (E2EL - TTFT) / (output tokens - 1) for outputs longer than one token; E2EL: send to end.
- Throughputs over max(end) - min(send) of all requests; percentiles as numpy computes them, in ms.
- `max_concurrent_requests` is the exact peak of requests in flight (vLLM counts per 1-s bucket).
- Goodput: requests meeting every SLO (`--goodput ttft:MS tpot:MS e2el:MS`) per second.

`client_check` is the client-bottleneck guard: how late requests were sent against when they could have
been, the actors' event-loop lag, and the achieved vs the asked rate.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from raysweep.bench.options import PERCENTILE_METRICS, LoadOptions

__all__ = ["COLUMNS", "MAX_SEND_LAG_MS", "MIN_RATE_FRACTION", "client_check", "empty_samples", "per_request",
           "point_metrics", "pool"]

# One entry per request (s from the start): due, could be sent (ready), the client began it (begin), it was on
# the wire (sent: after any new connection), first chunk, end; "chunks" holds the chunk offsets from `sent`.
COLUMNS = ("index", "actor", "due", "ready", "sent", "first", "end", "in_tok", "out_tok", "ok", "error", "chunks",
           "begin")
MAX_SEND_LAG_MS = 10.0
MIN_RATE_FRACTION = 0.95


def empty_samples() -> dict[str, Any]:
    return {c: [] for c in COLUMNS} | {"loop_lag": []}


def pool(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The samples of several actors as one set (all are timed from the same start)."""
    out = empty_samples()
    for part in parts:
        for key in out:
            out[key].extend(part.get(key, []))
    return out


def _arr(s: dict[str, Any], key: str, dtype: Any = float) -> np.ndarray:
    return np.asarray(s[key], dtype=dtype)


def _summary(values: np.ndarray, name: str, pcts: tuple[float, ...]) -> dict[str, float]:
    ms = values * 1000.0
    has = ms.size > 0
    out = {f"mean_{name}_ms": float(np.mean(ms)) if has else 0.0,
           f"median_{name}_ms": float(np.median(ms)) if has else 0.0,
           f"std_{name}_ms": float(np.std(ms)) if has else 0.0}
    for p in pcts:
        out[f"p{p:g}_{name}_ms"] = float(np.percentile(ms, p)) if has else 0.0
    return out


def peak_in_flight(starts: np.ndarray, ends: np.ndarray) -> int:
    """The largest number of intervals [start, end) open at one instant."""
    if starts.size == 0:
        return 0
    times = np.concatenate([starts, ends])
    steps = np.concatenate([np.ones(starts.size, dtype=np.int64), -np.ones(ends.size, dtype=np.int64)])
    order = np.lexsort((steps, times))  # at equal times, ends (-1) before starts
    return int(np.max(np.cumsum(steps[order])))


def point_metrics(s: dict[str, Any], opts: LoadOptions) -> dict[str, Any]:
    """Every metric of the point, from the pooled samples."""
    ok = _arr(s, "ok", bool)
    sent, end, first = _arr(s, "sent"), _arr(s, "end"), _arr(s, "first")
    in_tok, out_tok = _arr(s, "in_tok", np.int64), _arr(s, "out_tok", np.int64)
    n = int(ok.size)
    duration = float(np.max(end) - np.min(sent)) if n else 0.0
    dur = duration if duration > 0 else math.nan
    e2el = (end - sent)[ok]
    ttft = (first - sent)[ok]
    outs, ins = out_tok[ok], in_tok[ok]
    multi = outs > 1
    tpot = (e2el[multi] - ttft[multi]) / (outs[multi] - 1)
    chunks = [np.asarray(c, dtype=float) for c, good in zip(s["chunks"], ok) if good]
    itl = np.concatenate([np.diff(c) for c in chunks]) if chunks else np.zeros(0)
    completed = int(ok.sum())
    total_in, total_out = int(ins[ins > 0].sum()), int(outs.sum())
    out: dict[str, Any] = {
        "duration": duration, "completed": completed, "failed": n - completed,
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": completed / dur if n else 0.0,
        "request_goodput": None,
        "output_throughput": total_out / dur if n else 0.0,
        "total_token_throughput": (total_in + total_out) / dur if n else 0.0,
        "max_output_tokens_per_s": _peak_tokens_per_s(sent[ok], chunks, outs),
        "max_concurrent_requests": peak_in_flight(sent, end),
    }
    if opts.goodput:
        out["request_goodput"] = _good(ttft, e2el, outs, opts.goodput) / dur if n else 0.0
    pcts = opts.metric_percentiles
    for name, values in zip(PERCENTILE_METRICS, (ttft, tpot, itl, e2el)):
        out.update(_summary(values, name, pcts))
    queue = (_arr(s, "sent") - _arr(s, "due"))[ok] if opts.max_concurrency else np.zeros(0)
    out.update({k: v for k, v in _summary(queue, "client_queue_time", (99.0,)).items() if not k.startswith("std")})
    errors = [e for e in s["error"] if e]
    if errors:
        out["errors_sample"] = sorted(set(errors))[:5]
    return out


def per_request(s: dict[str, Any]) -> dict[str, np.ndarray]:
    """Per request, in ms: TTFT, TPOT (0 for one-token outputs), mean ITL and E2EL (NaN for failed requests),
    with `ok`: what an attainment judge counts."""
    ok = _arr(s, "ok", bool)
    sent, end, first = _arr(s, "sent"), _arr(s, "end"), _arr(s, "first")
    outs = _arr(s, "out_tok", np.int64)
    e2el, ttft = (end - sent) * 1000.0, (first - sent) * 1000.0
    tpot = np.where(outs > 1, (e2el - ttft) / np.maximum(outs - 1, 1), 0.0)
    itl = np.array([float(np.mean(np.diff(c))) * 1000.0 if len(c) > 1 else 0.0 for c in s["chunks"]])
    bad = ~ok
    return {"ok": ok, **{k: np.where(bad, np.nan, v) for k, v in
                         (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el))}}


def _good(ttft: np.ndarray, e2el: np.ndarray, outs: np.ndarray, slo: dict[str, float]) -> int:
    good = np.ones(ttft.size, dtype=bool)
    if "ttft" in slo:
        good &= ttft * 1000 <= slo["ttft"]
    if "e2el" in slo:
        good &= e2el * 1000 <= slo["e2el"]
    if "tpot" in slo:
        tpot = np.where(outs > 1, (e2el - ttft) / np.maximum(outs - 1, 1), 0.0)
        good &= tpot * 1000 <= slo["tpot"]
    return int(good.sum())


def _peak_tokens_per_s(sent: np.ndarray, chunks: list[np.ndarray], outs: np.ndarray) -> float:
    """The most output tokens received in one 1-s window (buckets from the first send), each chunk
    weighted by the request's tokens per chunk."""
    if not chunks:
        return 0.0
    times = np.concatenate([t0 + c for t0, c in zip(sent, chunks)])
    weights = np.concatenate([np.full(c.size, o / c.size if c.size else 0.0) for c, o in zip(chunks, outs)])
    if times.size == 0:
        return 0.0
    start = float(np.min(sent))
    bins = np.arange(start, float(np.max(times)) + 1.0 + 1e-9, 1.0)
    if bins.size < 2:
        bins = np.array([start, start + 1.0])
    counts, _ = np.histogram(times, bins=bins, weights=weights)
    return float(np.max(counts))


def client_check(s: dict[str, Any], opts: LoadOptions, rate: float, max_send_lag_ms: float = MAX_SEND_LAG_MS,
                 min_rate_fraction: float = MIN_RATE_FRACTION) -> dict[str, Any]:
    """The client-bottleneck guard: fields to store, `client_limited` among them, with the reason."""
    sent, ready, due = _arr(s, "sent"), _arr(s, "ready"), _arr(s, "due")
    lag = (_arr(s, "begin") - ready) * 1000.0  # the client's own lateness; opening a connection is not counted
    loop = np.asarray(s.get("loop_lag") or [0.0], dtype=float) * 1000.0
    fields: dict[str, Any] = {
        "client_send_lag_p50_ms": float(np.percentile(lag, 50)) if lag.size else 0.0,
        "client_send_lag_p99_ms": float(np.percentile(lag, 99)) if lag.size else 0.0,
        "client_send_lag_max_ms": float(np.max(lag)) if lag.size else 0.0,
        "client_loop_lag_p99_ms": float(np.percentile(loop, 99)),
        "client_loop_lag_max_ms": float(np.max(loop)),
        "asked_request_rate": rate,
        "achieved_request_rate": None,
    }
    reasons = []
    burst = math.isinf(rate) and not opts.max_concurrency
    if math.isfinite(rate) and sent.size and not opts.max_concurrency:
        span = float(np.max(sent))
        achieved = rate * float(np.max(due)) / span if span > 0 else rate
        fields["achieved_request_rate"] = achieved
        if achieved < min_rate_fraction * rate:
            reasons.append(f"sent {achieved:.1f} req/s of the {rate:g} asked")
    late = int((lag > max_send_lag_ms).sum())
    if not burst and late > max(1, 0.01 * lag.size):  # the p99 over 10 ms, and never one hiccup alone
        reasons.append(f"send lag p99 {fields['client_send_lag_p99_ms']:.1f} ms > {max_send_lag_ms:g} ms "
                       f"({late} of {lag.size} requests)")
    fields["client_limited"] = bool(reasons)
    fields["client_limited_reason"] = "; ".join(reasons) or None
    return fields

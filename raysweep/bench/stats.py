"""Metrics of a point from the pooled raw samples of all its client actors.

Every actor returns its raw per-request samples, timed in seconds from the point's common start (one instant
all actors agreed on, corrected by each actor's measured clock offset to the driver). `pool` concatenates
them; `point_metrics` computes everything from the pooled samples, never from per-actor summaries, with
`vllm bench serve`'s field names and definitions (vllm/benchmarks/serve.py `calculate_metrics`, `benchmark`;
vllm/benchmarks/lib/endpoint_request_func.py):

- A request starts (`begin`) just before the client posts it, as vLLM's `st`; TTFT ends at the first chunk
  carrying `choices`, E2EL at the last such chunk (not at the usage or `[DONE]` events); ITL holds the gaps
  between those chunks, one per chunk however many tokens it carries; TPOT is (E2EL - TTFT) / (output
  tokens - 1) for outputs longer than one token.
- Output tokens: the usage's `completion_tokens` (else, as vLLM, the tokenized text, or 1 with no
  tokenizer); input tokens: the usage's `prompt_tokens`, else the known prompt length. Only successful
  requests count in tokens, latencies and throughputs; `failed` counts the others.
- `duration`: from the common start (the benchmark's start, so the wait before the first due request is in)
  to the end of the last request; throughputs and goodput are counts over it.
- `max_output_tokens_per_s` and `max_concurrent_requests`: vLLM's 1-s buckets from the first successful
  start (a chunk is one token there); `peak_in_flight_requests` is the exact peak of requests in flight.
- Extra fields with their own names: `*_ttft_on_wire_ms`, `*_e2el_on_wire_ms` (timed from aiohttp's
  "request headers sent", after a connection is obtained), `peak_in_flight_requests`, the steady-state test,
  `*_ttfot_ms` (time to the first output token, not reasoning content) and, for multi-turn sessions, the
  per-turn metrics (`turn_metrics`).

`client_check` is the client-bottleneck guard: how late requests were begun against when they could have
been (due, and a slot free), the actors' event-loop lag, and the achieved vs the asked rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from raysweep.bench.options import PERCENTILE_METRICS, LoadOptions
from raysweep.bench.sane import finite_samples, guarded, merge

if TYPE_CHECKING:
    import numpy.typing as npt
    from transformers import PreTrainedTokenizerBase

__all__ = ["COLUMNS", "WORKLOAD_COLUMNS", "MAX_LOOP_LAG_MS", "MAX_SEND_LAG_MS", "MIN_RATE_FRACTION",
           "STEADY_DETECT_DRIFT_PCT", "STEADY_MAX_DRIFT_PCT",
           "client_check", "empty_samples", "peak_in_flight", "per_request", "per_second_throughput",
           "point_metrics", "pool", "settle", "steady_state", "vllm_buckets"]

# One entry per request (s from the start): due, could be begun (ready: due, and a concurrency slot free),
# sent by the client at vLLM's start (begin: before the post), on the wire (sent: headers written, after any
# new connection), first and last token chunk (first, end), finished with the stream (done), token counts
# (-1: not in the usage), ok/error, the chunk offsets from `begin`, and the generated text where the usage
# held no completion_tokens (else None).
COLUMNS = ("index", "actor", "due", "ready", "sent", "first", "end", "in_tok", "out_tok", "ok", "error", "chunks",
           "begin", "done", "text")
# Workload columns (samples written before them lack them): the first chunk with output, not reasoning, text
# (first_out, NaN when none), whether any chunk carried reasoning content, and the multi-turn session and
# turn of the request (-1 outside sessions).
WORKLOAD_COLUMNS = ("first_out", "reasoning", "session", "turn")
MAX_SEND_LAG_MS = 10.0
MIN_RATE_FRACTION = 0.95
MAX_LOOP_LAG_MS = 20.0        # p99 of the client event loop's lag beyond which the client is the bottleneck
STEADY_MIN_BINS = 5           # fewer bins (of STEADY_BIN_REQUESTS requests) to judge: too short to judge (None)
STEADY_MIN_WINDOW_S = 5.0     # a shorter judged window: too short to judge (None)
STEADY_BINS = 100             # the judged window's bins, at most
STEADY_BIN_REQUESTS = 20      # requests per bin, at least (fewer bins for fewer requests)
STEADY_MAX_DRIFT_PCT = 10.0   # allowed: the fitted output throughput at the end of the point within 10 % of the start
STEADY_DETECT_DRIFT_PCT = 30.0  # the drift the test must see, with STEADY_POWER; where the point has too few
STEADY_POWER = 0.9              # requests for that, an unflagged point is "not judged", not steady
STEADY_ALPHA = 0.05           # two-sided: a stationary load is flagged at most this often, whatever its length


def empty_samples() -> dict[str, Any]:
    return {c: [] for c in (*COLUMNS, *WORKLOAD_COLUMNS)} | {"loop_lag": []}


def pool(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The samples of several actors as one set (all are timed from the same start)."""
    out = empty_samples()
    for part in parts:
        for key in out:
            out[key].extend(part.get(key, []))
    return out


def _arr(s: dict[str, Any], key: str, dtype: npt.DTypeLike = float, instead: str | None = None) -> np.ndarray:
    """A column as an array; `instead` for samples written before the column existed."""
    values = s.get(key)
    if instead is not None and (values is None or len(values) != len(s["ok"])):
        values = s[instead]
    return np.asarray(values, dtype=dtype)


def _begin(s: dict[str, Any]) -> np.ndarray:
    return _arr(s, "begin", instead="sent")


def settle(s: dict[str, Any], prompt_lens: list[int | None], max_tokens: list[int | None], ignore_eos: bool,
           tokenizer: PreTrainedTokenizerBase | None = None,
           prompt_texts: list[str | None] | None = None) -> dict[str, Any]:
    """Token counts the server did not report, as vLLM fills them, and the ignore_eos check, in place.

    `prompt_lens` and `max_tokens` are indexed by the request's `index`. An input count missing from the usage
    is the known prompt length, or for a text prompt its token count (`prompt_texts`, tokenized as vLLM's
    client counts a text prompt, special tokens included); an output count missing is the tokenized text
    (vLLM's tokenizer rule), or 1 with no tokenizer. With `ignore_eos`, a request whose output count differs
    from its max_tokens failed."""
    for i, k in enumerate(s["index"]):
        k %= max(len(prompt_lens), 1)  # a cycled request (duration-bounded closed loop) reuses a body
        if s["in_tok"][i] is None or s["in_tok"][i] < 0:
            s["in_tok"][i] = prompt_lens[k] if prompt_lens[k] is not None else -1
            text = prompt_texts[k] if prompt_texts and k < len(prompt_texts) else None
            if s["in_tok"][i] < 0 and tokenizer is not None and isinstance(text, str):
                s["in_tok"][i] = len(tokenizer(text, add_special_tokens=True).input_ids)
        if not s["ok"][i]:
            continue
        if s["out_tok"][i] is None or s["out_tok"][i] <= 0:
            text = s["text"][i] if len(s.get("text", [])) > i else None
            s["out_tok"][i] = (len(tokenizer(text or "", add_special_tokens=False).input_ids) or 1) \
                if tokenizer is not None else 1
        want = max_tokens[k]
        if ignore_eos and want is not None and s["out_tok"][i] != want:
            s["ok"][i] = False
            s["error"][i] = (f"ignore_eos: the server generated {s['out_tok'][i]} output tokens where max_tokens "
                             f"is {want}")
    return s


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


def vllm_buckets(starts: np.ndarray, ends: np.ndarray, chunks: list[np.ndarray]) -> tuple[float, int]:
    """vLLM's `max_output_tokens_per_s` and `max_concurrent_requests` of successful requests: 1-s buckets from
    the earliest start; each token chunk counts 1 in its bucket, each request 1 in every bucket from its start's
    to its end's."""
    if starts.size == 0 or not (np.isfinite(starts).all() and np.isfinite(ends).all()):
        return 0.0, 0
    t0 = float(np.min(starts))
    n = int(np.ceil(float(np.max(ends)) - t0)) + 1
    times = np.concatenate([b + c for b, c in zip(starts, chunks)]) if chunks else np.zeros(0)
    idx = (times - t0).astype(np.int64)
    tokens = np.bincount(idx[(idx >= 0) & (idx < n)], minlength=n)
    first, last = (starts - t0).astype(np.int64), (ends - t0).astype(np.int64)
    delta = np.zeros(n + 1, dtype=np.int64)
    np.add.at(delta, first, 1)
    np.add.at(delta, last + 1, -1)
    return float(np.max(tokens)), int(np.max(np.cumsum(delta)[:n]))


def point_metrics(s: dict[str, Any], opts: LoadOptions) -> dict[str, Any]:
    """Every metric of the point, from the pooled (and `settle`d) samples (made finite first:
    `bench.sane.finite_samples`); an analysis beside the headline metrics that raises (steady state, reasoning,
    turns) marks its own fields not computed (`bench.sane.guarded`) and the point keeps the others."""
    s = finite_samples(s)
    ok = _arr(s, "ok", bool)
    begin, sent, end, first = _begin(s), _arr(s, "sent"), _arr(s, "end"), _arr(s, "first")
    done = _arr(s, "done", instead="end")
    in_tok, out_tok = _arr(s, "in_tok", np.int64), _arr(s, "out_tok", np.int64)
    n = int(ok.size)
    duration = float(max(np.max(done), np.max(end), 0.0)) if n else 0.0
    dur = duration if duration > 0 else math.nan
    e2el, ttft = (end - begin)[ok], (first - begin)[ok]
    outs, ins = out_tok[ok], in_tok[ok]
    multi = outs > 1
    tpot = (e2el[multi] - ttft[multi]) / (outs[multi] - 1)
    chunks = [np.asarray(c, dtype=float) for c, good in zip(s["chunks"], ok) if good]
    itl = np.concatenate([np.diff(c) for c in chunks]) if chunks else np.zeros(0)
    completed = int(ok.sum())
    total_in, total_out = int(ins[ins > 0].sum()), int(outs.sum())
    peak_tokens, peak_requests = vllm_buckets(begin[ok], end[ok], chunks)
    out: dict[str, Any] = {
        "duration": duration, "completed": completed, "failed": n - completed,
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": completed / dur if n else 0.0,
        "request_goodput": None,
        "output_throughput": total_out / dur if n else 0.0,
        "total_token_throughput": (total_in + total_out) / dur if n else 0.0,
        "max_output_tokens_per_s": peak_tokens,
        "max_concurrent_requests": peak_requests,
        "peak_in_flight_requests": peak_in_flight(begin, np.maximum(done, end)),
    }
    if opts.goodput:
        out["request_goodput"] = _good(ttft, e2el, outs, opts.goodput) / dur if n else 0.0
    pcts = opts.metric_percentiles
    for name, values in zip(PERCENTILE_METRICS, (ttft, tpot, itl, e2el)):
        out.update(_summary(values, name, pcts))
    extra = {"client_queue_time": (begin - _arr(s, "due"))[ok] if opts.max_concurrency else np.zeros(0),
             "ttft_on_wire": (first - sent)[ok], "e2el_on_wire": (end - sent)[ok]}
    for name, values in extra.items():
        out.update({k: v for k, v in _summary(values, name, (99.0,)).items() if not k.startswith("std")})
    merge(out, guarded("steady_state", steady_state, s))
    merge(out, guarded("reasoning", _reasoning, s, ok, begin, pcts))
    if any(t is not None and t >= 0 for t in s.get("turn") or []):
        merge(out, guarded("turns", turn_metrics, s))
    errors = [e for e in s["error"] if e]
    if errors:
        out["errors_sample"] = sorted(set(errors))[:5]
    return out


def _reasoning(s: dict[str, Any], ok: np.ndarray, begin: np.ndarray, pcts: tuple[float, ...]) -> dict[str, Any]:
    """Time to first output token (`*_ttfot_ms`): from the start to the first chunk with output text, not
    reasoning content (TTFT counts any chunk, as vLLM); equal to TTFT where nothing streams reasoning.
    Requests that streamed no output text are left out; `reasoning_requests` counts those with reasoning."""
    n = ok.size
    first_out = _arr(s, "first_out") if len(s.get("first_out") or []) == n else np.full(n, np.nan)
    has = ok & ~np.isnan(first_out)
    out = {k: v for k, v in _summary((first_out - begin)[has], "ttfot", pcts).items() if not k.startswith("std")}
    reasoning = s.get("reasoning") or []
    out["reasoning_requests"] = int(np.sum(np.asarray(reasoning, dtype=bool) & ok)) if len(reasoning) == n else 0
    return out


def turn_metrics(s: dict[str, Any]) -> dict[str, Any]:
    """Multi-turn sessions: their count, how many ran every turn without a failure, and per turn index
    (`per_turn`) the requests, completed ones, their mean input tokens (the conversation so far), mean and p99
    TTFT, mean TPOT and mean E2EL."""
    ok, turn, sess = _arr(s, "ok", bool), _arr(s, "turn", np.int64), _arr(s, "session", np.int64)
    req, in_tok = per_request(s), _arr(s, "in_tok", float)

    def stat(fn: Callable[[np.ndarray], Any], values: np.ndarray) -> float | None:
        return float(fn(values)) if values.size else None

    rows = []
    for t in sorted(set(turn[turn >= 0].tolist())):
        good = (turn == t) & ok
        rows.append({"turn": t, "requests": int((turn == t).sum()), "completed": int(good.sum()),
                     "mean_input_tokens": stat(np.mean, in_tok[good]),
                     "mean_ttft_ms": stat(np.mean, req["ttft"][good]),
                     "p99_ttft_ms": stat(lambda v: np.percentile(v, 99), req["ttft"][good]),
                     "mean_tpot_ms": stat(np.mean, req["tpot"][good]),
                     "mean_e2el_ms": stat(np.mean, req["e2el"][good])})
    sessions = sorted(set(sess[sess >= 0].tolist()))
    failed = set(sess[(sess >= 0) & ~ok].tolist())
    done = [int(((sess == u) & ok).sum()) for u in sessions]
    return {"num_sessions": len(sessions), "sessions_failed": len(failed),
            "mean_turns_per_session": float(np.mean(done)) if done else 0.0, "per_turn": rows}


def per_request(s: dict[str, Any]) -> dict[str, np.ndarray]:
    """Per request, in ms: TTFT, TPOT (0 for one-token outputs), mean ITL and E2EL (NaN for failed requests),
    with `ok`: what an attainment judge counts."""
    s = finite_samples(s)
    ok = _arr(s, "ok", bool)
    begin, end, first = _begin(s), _arr(s, "end"), _arr(s, "first")
    outs = _arr(s, "out_tok", np.int64)
    e2el, ttft = (end - begin) * 1000.0, (first - begin) * 1000.0
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


PER_SECOND_MAX_S = 7 * 24 * 3600  # the most 1-s buckets `per_second_throughput` makes


def per_second_throughput(s: dict[str, Any]) -> dict[str, np.ndarray]:
    """Completed requests and output tokens of each whole 1-s bucket from the common start to the last token
    (a request's tokens spread evenly over its chunks; a partial last second is left out; no bucket when every
    request ended before the start, none past `PER_SECOND_MAX_S`)."""
    s = finite_samples(s)
    ok = _arr(s, "ok", bool)
    if not ok.any():
        return {"requests": np.zeros(0), "tokens": np.zeros(0)}
    begin, end, outs = _begin(s)[ok], _arr(s, "end")[ok], _arr(s, "out_tok", np.int64)[ok]
    chunks = [np.asarray(c, dtype=float) for c, good in zip(s["chunks"], ok) if good]
    # whole seconds from the common start; none for times before it (degenerate clocks), and at most a week
    n = min(max(0, int(math.floor(float(np.max(end))))), PER_SECOND_MAX_S)
    times = np.concatenate([np.zeros(0), *(b + c for b, c in zip(begin, chunks))])
    weights = np.concatenate([np.zeros(0), *(np.full(c.size, o / c.size) for c, o in zip(chunks, outs) if c.size)])
    tokens = np.histogram(times, bins=n, range=(0, n), weights=weights)[0] if n else np.zeros(0)
    requests = np.histogram(end, bins=n, range=(0, n))[0].astype(float) if n else np.zeros(0)
    return {"requests": requests, "tokens": tokens}


STEADY_FIELDS = ("steady_state", "steady_state_slope_pct_per_s", "steady_state_drift_pct",
                 "steady_state_detectable_pct", "steady_state_note", "steady_state_window_start_s",
                 "steady_state_window_end_s")


def _ratio_c(pct: float) -> float:
    """A change between the start and the end of a line, as the end over the start (1 + pct/100), in units of
    the line's change over its mean: 2 (R - 1) / (R + 1)."""
    r = 1.0 + pct / 100.0
    return 2.0 * (r - 1.0) / (r + 1.0)


def _c_ratio_pct(c: float) -> float:
    """The inverse of `_ratio_c`: a change over the mean as the end over the start, in % (inf past 2)."""
    return 100.0 * ((1.0 + c / 2.0) / (1.0 - c / 2.0) - 1.0) if abs(c) < 2.0 else math.copysign(math.inf, c)


def _token_mass(s: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per successful request: when it began, the mean time of its output tokens (tokens spread evenly over
    its chunks; its end without chunks) and its output tokens."""
    ok = _arr(s, "ok", bool)
    begin, end, outs = _begin(s)[ok], _arr(s, "end")[ok], _arr(s, "out_tok", np.int64)[ok]
    chunks = [c for c, good in zip(s["chunks"], ok) if good]
    mid = np.array([b + float(np.mean(c)) if len(c) else e for b, e, c in zip(begin, end, chunks)])
    return begin, mid, np.maximum(outs, 1).astype(float)


def steady_state(s: dict[str, Any]) -> dict[str, Any]:
    """Whether the output throughput held steady over the point: `steady_state` false only when the
    fitted throughput at the end of the point is shown to differ from that at its start by more than
    `STEADY_MAX_DRIFT_PCT` (either way: end/start above 1.1 or below 1/1.1).

    Each successful request puts its output tokens at their mean time; the judged window runs from the
    first begin plus the latest such offset to the last begin (inside it, every token comes from a request
    begun inside the point: no ramp-up or drain), cut into bins of whole requests (independent under a
    Poisson load; `STEADY_BINS` at most, `STEADY_BIN_REQUESTS` requests each at least). A least-squares line
    through the bins' tokens, with the t-interval of its slope (`verdicts.slope_test`: widened for a
    positive lag-1 autocorrelation), is extrapolated over the whole point (from the common start to the
    last token); flagged when its 95 % interval lies beyond the allowed drift (`STEADY_ALPHA` two-sided: a
    stationary load is flagged at most 5 % of the time however few its requests, one drifting by exactly
    10 % at most 2.5 %).

    A point that is not flagged is steady only if the test could have seen a drift of
    `STEADY_DETECT_DRIFT_PCT` (its minimum detectable drift at `STEADY_POWER`, from the slope's standard
    error, is at most that); otherwise `steady_state` is None with `steady_state_note` "not judged: too few
    requests" and how many would do (a Poisson load needs roughly 6,000 to 12,000). None too ("not judged: too
    short") with a window under `STEADY_MIN_WINDOW_S` or under `STEADY_MIN_BINS` bins, or nothing generated.
    A judged window's bounds are `steady_state_window_start_s`/`_end_s` (seconds from the load's start): the
    window the point's energy is measured over (`raysweep.drive.point_energy`)."""
    from raysweep.maths.verdicts import slope_test, t_quantile

    out: dict[str, Any] = dict.fromkeys(STEADY_FIELDS)
    s = finite_samples(s)
    if not _arr(s, "ok", bool).any():
        out["steady_state_note"] = "not judged: no request succeeded"
        return out
    begin, mid, tokens = _token_mass(s)
    lo, hi = float(np.min(begin)) + float(np.max(mid - begin)), float(np.max(begin))
    inside = (mid >= lo) & (mid <= hi)
    bins = min(STEADY_BINS, int(inside.sum()) // STEADY_BIN_REQUESTS)
    if hi - lo < STEADY_MIN_WINDOW_S or bins < STEADY_MIN_BINS:
        out["steady_state_note"] = "not judged: too short"
        return out
    out.update(steady_state_window_start_s=lo, steady_state_window_end_s=hi)  # the judged window (energy too)
    series = np.histogram(mid[inside], bins=bins, range=(lo, hi), weights=tokens[inside])[0]
    q = t_quantile(1.0 - STEADY_ALPHA / 2.0, bins - 2)
    slope = slope_test(series.tolist(), STEADY_MAX_DRIFT_PCT, confidence=1.0 - STEADY_ALPHA)
    if slope is None:
        out["steady_state_note"] = "not judged: no output tokens in the judged window"
        return out
    width = (hi - lo) / bins
    span = float(max(np.max(_arr(s, "end")), np.max(_arr(s, "done", instead="end"))))  # the whole point
    per_s = slope.pct_per_step / width
    c, half = per_s * span / 100.0, (slope.high - slope.low) / 2.0 / width * span / 100.0
    allowed, target = _ratio_c(STEADY_MAX_DRIFT_PCT), _ratio_c(STEADY_DETECT_DRIFT_PCT)
    if not (math.isfinite(c) and math.isfinite(half)):
        out["steady_state_note"] = "not judged: the slope of the judged window is not finite"
        return out
    flagged = c - half > allowed or c + half < -allowed
    se = half / q
    detectable = allowed + (q + t_quantile(STEADY_POWER, bins - 2)) * se
    out.update(steady_state_slope_pct_per_s=per_s, steady_state_drift_pct=_c_ratio_pct(c),
               steady_state_detectable_pct=_c_ratio_pct(detectable))
    if flagged:
        out["steady_state"] = False
    elif detectable <= target:
        out["steady_state"] = True
    else:
        need = int(math.ceil(inside.sum() * (detectable - allowed) ** 2 / (target - allowed) ** 2))
        out["steady_state_note"] = (f"not judged: too few requests ({int(inside.sum())} in the judged window; "
                                    f"about {need} would show a {STEADY_DETECT_DRIFT_PCT:g} % drift)")
    return out


def _previous_begin(begin: np.ndarray, actor: np.ndarray) -> np.ndarray:
    """For each request, when its actor began the request before it (the start for its first)."""
    prev = np.zeros(begin.size)
    for a in np.unique(actor):
        idx = np.flatnonzero(actor == a)
        idx = idx[np.argsort(begin[idx], kind="stable")]
        prev[idx[1:]] = begin[idx[:-1]]
    return prev


def _slot_idle_fraction(s: dict[str, Any], begin: np.ndarray, ready: np.ndarray) -> float | None:
    """A closed loop's slots: the share of their time from when each request could be begun (due, and a slot
    free) to its end that was spent waiting for the client to begin it: the concurrency the server did not
    get. None for samples without the `done` column."""
    done = s.get("done")
    if done is None or len(done) != begin.size or not begin.size:
        return None
    cycle = float(np.sum(np.asarray(done, dtype=float) - ready))
    return float(np.sum(np.clip(begin - ready, 0.0, None))) / cycle if cycle > 0 else None


def client_check(s: dict[str, Any], opts: LoadOptions, rate: float, max_send_lag_ms: float = MAX_SEND_LAG_MS,
                 min_rate_fraction: float = MIN_RATE_FRACTION,
                 max_loop_lag_ms: float = MAX_LOOP_LAG_MS) -> dict[str, Any]:
    """The client-bottleneck guard: fields to store, `client_limited` among them, with the reasons. It judges
    every mode (open loop, closed loop, burst): requests begun later than they could have been (due and a slot
    free; in a burst, where all are due at once, an actor's gap between beginning one request and the next),
    the event loop's lag (which also delays seeing a slot free), and the achieved open-loop rate. A closed
    loop's send lag counts only where it left the slots idle: over `1 - min_rate_fraction` of their time
    (`_slot_idle_fraction`); a wait of tens of ms before requests that the server holds for seconds costs the
    server nothing."""
    s = finite_samples(s)
    begin, ready = _begin(s), _arr(s, "ready")
    sessions = opts.dataset_name == "multi_turn"  # later turns are ready when the think time is over
    if math.isinf(rate) and not opts.max_concurrency and not sessions:
        ready = _previous_begin(begin, _arr(s, "actor", np.int64))
    lag = (begin - ready) * 1000.0  # the client's own lateness; opening a connection is not counted
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
    if math.isfinite(rate) and begin.size and not opts.max_concurrency:
        starts = begin[_arr(s, "turn", np.int64) <= 0] if sessions else begin  # sessions arrive at the rate
        span = float(np.max(starts))
        achieved = starts.size / span if span > 0 else rate
        fields["achieved_request_rate"] = achieved
        if achieved < min_rate_fraction * rate:
            reasons.append(f"sent {achieved:.1f} req/s of the {rate:g} asked")
    late = int((lag > max_send_lag_ms).sum())
    fields["client_late_sends"] = late  # begun over max_send_lag_ms after they could be (a trace: its schedule)
    idle = _slot_idle_fraction(s, begin, ready) if opts.max_concurrency else None
    fields["client_slot_idle_pct"] = None if idle is None else 100.0 * idle
    # the p99 over the threshold, and never one hiccup alone; a closed loop's only where its slots sat idle
    if late > max(1, 0.01 * lag.size) and (idle is None or idle > 1.0 - min_rate_fraction):
        reasons.append(f"send lag p99 {fields['client_send_lag_p99_ms']:.1f} ms > {max_send_lag_ms:g} ms "
                       f"({late} of {lag.size} requests" + (")" if idle is None else
                                                             f"; slots idle {100 * idle:.1f} % of their time)"))
    if fields["client_loop_lag_p99_ms"] > max_loop_lag_ms:
        reasons.append(f"event-loop lag p99 {fields['client_loop_lag_p99_ms']:.1f} ms > {max_loop_lag_ms:g} ms")
    fields["client_limited"] = bool(reasons)
    fields["client_limited_reason"] = "; ".join(reasons) or None
    return fields

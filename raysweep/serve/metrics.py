"""Server-side metrics of a point, scraped from the server's Prometheus `/metrics` while the point runs.

A `Scraper` thread reads `/metrics` every `interval_s`, from a baseline taken before the load is submitted
(retried until one succeeds, a few times at most) to one taken after the load has ended. Per point it gives
the peak and mean of the gauges (KV cache usage, running and waiting requests) over the point's window, and
the deltas of the counters (preemptions, prompt and generation tokens, prefix-cache queries and hits)
between the last sample at or before the start and the first at or after the end, and over the same
samples the means of the latencies the server timed itself from each request's arrival
(`server_mean_ttft_ms`, `server_mean_queue_ms`, `server_mean_e2el_ms`): set beside the client's means,
the difference is the time on the wire and in the client. The gauges are snapshots: on a short point whose
engine runs in bursts between samples, the sampled running-requests peak can read 0 while every request
ran. `server_mean_requests_in_inference` has no such gap: the sum of the requests' own inference times
(`vllm:request_inference_time_seconds`, from a request's first scheduling to its last token, so a preempted
request's waiting spells count too: it is not the running requests where `server_num_preemptions` > 0) over
the window, divided by the load's duration, is the time average of requests in inference (Little's law),
exact for the requests the window covers. Without both bracketing
samples the counters would cover a shorter window: they are left out, and `server_metrics_complete` is
false with `server_metrics_incomplete_reason`. With data parallelism each engine has its own series: KV
cache usage takes the fullest engine, requests and counters are summed. These are the numbers one
otherwise reads from the server log by hand to choose max_num_seqs. `combine` joins the summaries of
several runs (an SLA probe): peaks take the largest, means their mean, counters their sum.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from raysweep.record.fields import COUNTER_FIELDS, COUNTERS, GAUGE_FIELDS, HISTOGRAMS, RUNNING_TIME, SERVER_FIELDS

__all__ = ["COUNTERS", "FIELDS", "GAUGES", "HISTOGRAMS", "Scraper", "ServersScraper", "combine", "join_engines",
           "parse_metrics", "summarize"]

log = logging.getLogger(__name__)

# gauge -> how engines combine; counters are summed over engines and label sets
GAUGES: dict[str, Callable[[list[float]], float]] = {
    "vllm:kv_cache_usage_perc": max, "vllm:num_requests_running": sum, "vllm:num_requests_waiting": sum}
_HIST_SERIES = (*(f"{name}{part}" for name in HISTOGRAMS for part in ("_sum", "_count")), RUNNING_TIME + "_sum")
FIELDS = SERVER_FIELDS  # every numeric server field a result (and so an SLA target) can carry

def parse_metrics(text: str) -> dict[str, float]:
    """The gauges and counters raysweep keeps, combined over engines, from one /metrics body."""
    per: dict[str, list[float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            name = s.name[:-len("_total")] if s.name.endswith("_total") else s.name
            if name in GAUGES or name in COUNTERS or name in _HIST_SERIES:
                per.setdefault(name, []).append(float(s.value))
    out = {}
    for name, values in per.items():
        out[name] = GAUGES[name](values) if name in GAUGES else sum(values)
    return out


@dataclass
class _Sample:
    at: float
    values: dict[str, float]


@dataclass
class Scraper:
    """Scrapes `base_url`/metrics in a thread between `start()` and `stop()`."""

    base_url: str
    interval_s: float = 0.5
    timeout_s: float = 2.0
    samples: list[_Sample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def scrape(self) -> bool:
        """One sample, stamped when it was asked for; False (and the error kept) when it failed."""
        asked = time.time()
        try:
            url = self.base_url.rstrip("/")  # a server's base URL, or its metrics URL itself
            with urllib.request.urlopen(url if url.endswith("/metrics") else url + "/metrics",
                                        timeout=self.timeout_s) as r:
                text = r.read().decode(errors="replace")
            self.samples.append(_Sample(asked, parse_metrics(text)))
            return True
        except Exception as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")
            return False

    def start(self, tries: int = 3) -> Scraper:
        """The baseline scrape (tried again, at most `tries` times in all, until one succeeds), then the thread."""
        for i in range(tries):
            if self.scrape():
                break
            if i + 1 < tries:
                time.sleep(min(self.interval_s, 0.2) * (i + 1))
        self._thread = threading.Thread(target=self._loop, name="metrics-scraper", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.scrape()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.scrape()

    def summary(self, window: tuple[float, float] | None = None,
                bracket: tuple[float, float] | None = None) -> dict[str, Any]:
        """The summary over the load's (start, end); gauges also count samples up to one interval after it.
        `bracket`: the instants the counters' deltas must cover (default the window)."""
        return summarize(self.samples, self.errors, window, slack=self.interval_s, bracket=bracket)


@dataclass
class ServersScraper(Scraper):
    """Several servers scraped at each tick (a P/D deployment's role servers, by name): every server's samples
    kept apart (`summaries`), and those of the `pooled` servers joined into one sample per tick as the
    engines of one server are (KV cache usage the fullest, requests and counters summed), which `summary`
    and the time series read. A tick where a pooled server does not answer adds no joined sample."""

    servers: dict[str, str] = field(default_factory=dict)
    pooled: tuple[str, ...] = ()
    each: dict[str, list[_Sample]] = field(default_factory=dict)
    each_errors: dict[str, list[str]] = field(default_factory=dict)

    def scrape(self) -> bool:
        asked = time.time()
        got: dict[str, dict[str, float]] = {}
        for name, url in self.servers.items():
            try:
                with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=self.timeout_s) as r:
                    got[name] = parse_metrics(r.read().decode(errors="replace"))
                self.each.setdefault(name, []).append(_Sample(asked, got[name]))
            except Exception as exc:
                self.each_errors.setdefault(name, []).append(f"{name}: {type(exc).__name__}: {exc}")
        missing = [n for n in self.pooled if n not in got]
        if missing:
            self.errors.append(self.each_errors[missing[0]][-1])
            return False
        self.samples.append(_Sample(asked, join_engines([got[n] for n in self.pooled])))
        return True

    def summaries(self, window: tuple[float, float] | None = None,
                  bracket: tuple[float, float] | None = None) -> dict[str, dict[str, Any]]:
        """`summarize` of every server's own samples, by name."""
        return {name: summarize(self.each.get(name, []), self.each_errors.get(name, []), window,
                                slack=self.interval_s, bracket=bracket) for name in self.servers}


def join_engines(values: list[dict[str, float]]) -> dict[str, float]:
    """Several servers' parsed /metrics as one server's: each gauge combined as `GAUGES` says, the rest summed."""
    out: dict[str, float] = {}
    for name in dict.fromkeys(k for v in values for k in v):
        found = [v[name] for v in values if name in v]
        out[name] = GAUGES[name](found) if name in GAUGES else sum(found)
    return out


def summarize(samples: list[_Sample], errors: list[str], window: tuple[float, float] | None,
              slack: float = 0.0, bracket: tuple[float, float] | None = None) -> dict[str, Any]:
    """Fields for the result record: `server_<gauge>_peak/_mean` over the window (its end stretched by
    `slack`) and `server_<counter>` deltas between the samples that bracket it (None: the first and last), or
    that bracket `bracket` where the load's own instants are not known (a command: from before its launch to
    after its exit)."""
    out: dict[str, Any] = {"server_metrics_samples": len(samples)}
    if errors and not samples:
        out.update(server_metrics_error=errors[-1], server_metrics_complete=False,
                   server_metrics_incomplete_reason=f"no scrape of /metrics succeeded ({errors[-1]})")
        return out
    start, end = window if window is not None else (-math.inf, math.inf)
    inside = [s for s in samples if start <= s.at <= end + slack]
    for name, short in GAUGE_FIELDS.items():
        values = [s.values[name] for s in inside if name in s.values]
        if values:
            out[f"server_{short}_peak"] = max(values)
            out[f"server_{short}_mean"] = sum(values) / len(values)
    b_start, b_end = bracket if bracket is not None else (start, end)
    before = [s for s in samples if s.at <= b_start] if window is not None else samples[:1]
    after = [s for s in samples if s.at >= b_end] if window is not None else samples[1:][-1:]
    missing = [why for why, have in (("at or before the start of the load", before),
                                     ("at or after its end", after)) if not have]
    if missing:
        out.update(server_metrics_complete=False, server_metrics_incomplete_reason=(
            "no successful scrape " + " and none ".join(missing) + "; counter deltas left out"
            + (f" (last error: {errors[-1]})" if errors else "")))
        return out
    out["server_metrics_complete"] = True
    first, last = before[-1].values, after[0].values
    for name, fld in zip(COUNTERS, COUNTER_FIELDS):
        if name in first and name in last:
            out[fld] = last[name] - first[name]
    _hit_rate(out)
    for name, fld in HISTOGRAMS.items():
        total, count = (last.get(name + part, 0.0) - first.get(name + part, 0.0) for part in ("_sum", "_count"))
        if count > 0 and name + "_sum" in last:
            out[fld] = 1000.0 * total / count
    busy = RUNNING_TIME + "_sum"
    if window is not None and end > start and busy in first and busy in last:
        out["server_mean_requests_in_inference"] = (last[busy] - first[busy]) / (end - start)
    return out


def _hit_rate(out: dict[str, Any]) -> None:
    q, h = out.get("server_prefix_cache_queries"), out.get("server_prefix_cache_hits")
    if q:
        out["server_prefix_cache_hit_rate"] = (h or 0.0) / q


def combine(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """The server fields of several runs as one: the largest peak, the mean of the means, counter deltas
    summed (only where every run has one), complete only where every run is."""
    out: dict[str, Any] = {}
    if not summaries:
        return out
    for fld in FIELDS:
        values = [float(s[fld]) for s in summaries if s.get(fld) is not None]
        if not values:
            continue
        if fld.endswith("_peak"):
            out[fld] = max(values)
        elif fld.endswith("_mean") or fld in HISTOGRAMS.values() or fld == "server_mean_requests_in_inference":
            out[fld] = sum(values) / len(values)
        elif fld in COUNTER_FIELDS and len(values) == len(summaries):
            out[fld] = sum(values)
    _hit_rate(out)
    reasons = [str(s.get("server_metrics_incomplete_reason") or "no server metrics")
               for s in summaries if s.get("server_metrics_complete") is not True]
    out["server_metrics_complete"] = not reasons
    if reasons:
        out["server_metrics_incomplete_reason"] = f"{len(reasons)} of {len(summaries)} runs: {reasons[0]}"
    return out

"""Server-side metrics of a point, scraped from the server's Prometheus `/metrics` while the point runs.

A `Scraper` thread reads `/metrics` every `interval_s` (and once just before and once just after the
point). Per point it gives the peak and mean of the gauges (KV cache usage, running and waiting requests)
over the point's window, and the deltas of the counters (preemptions, prompt and generation tokens,
prefix-cache queries and hits). With data parallelism each engine has its own series: KV cache usage takes
the fullest engine, requests and counters are summed. These are the numbers one otherwise reads from the
server log by hand to choose max_num_seqs.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["GAUGES", "COUNTERS", "Scraper", "parse_metrics", "summarize"]

log = logging.getLogger(__name__)

# gauge -> how engines combine; counters are summed over engines and label sets
GAUGES = {"vllm:kv_cache_usage_perc": max, "vllm:num_requests_running": sum, "vllm:num_requests_waiting": sum}
COUNTERS = ("vllm:num_preemptions", "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:prefix_cache_queries",
            "vllm:prefix_cache_hits", "vllm:request_success")
_FIELD = {"vllm:kv_cache_usage_perc": "kv_cache_usage_perc", "vllm:num_requests_running": "num_requests_running",
          "vllm:num_requests_waiting": "num_requests_waiting"}


def parse_metrics(text: str) -> dict[str, float]:
    """The gauges and counters raysweep keeps, combined over engines, from one /metrics body."""
    per: dict[str, list[float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            name = s.name[:-len("_total")] if s.name.endswith("_total") else s.name
            if name in GAUGES or name in COUNTERS:
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

    def scrape(self) -> None:
        try:
            with urllib.request.urlopen(self.base_url.rstrip("/") + "/metrics", timeout=self.timeout_s) as r:
                text = r.read().decode(errors="replace")
            self.samples.append(_Sample(time.time(), parse_metrics(text)))
        except Exception as exc:  # noqa: BLE001 - a failed scrape is recorded, the point goes on
            self.errors.append(f"{type(exc).__name__}: {exc}")

    def start(self) -> Scraper:
        self.scrape()
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

    def summary(self, window: tuple[float, float] | None = None) -> dict[str, Any]:
        return summarize(self.samples, self.errors, window)


def summarize(samples: list[_Sample], errors: list[str], window: tuple[float, float] | None) -> dict[str, Any]:
    """Fields for the result record: `server_<gauge>_peak/_mean` over the window and `server_<counter>` deltas."""
    out: dict[str, Any] = {"server_metrics_samples": len(samples)}
    if errors and not samples:
        out["server_metrics_error"] = errors[-1]
        return out
    inside = [s for s in samples if window is None or window[0] <= s.at <= window[1]] or samples
    for name, short in _FIELD.items():
        values = [s.values[name] for s in inside if name in s.values]
        if values:
            out[f"server_{short}_peak"] = max(values)
            out[f"server_{short}_mean"] = sum(values) / len(values)
    if len(samples) >= 2:
        first, last = samples[0].values, samples[-1].values
        for name in COUNTERS:
            if name in first and name in last:
                out[f"server_{name.split(':', 1)[1]}"] = last[name] - first[name]
        q, h = out.get("server_prefix_cache_queries"), out.get("server_prefix_cache_hits")
        if q:
            out["server_prefix_cache_hit_rate"] = (h or 0.0) / q
    return out

"""The names of the server-side fields a result record carries (`raysweep.serve.metrics` scrapes them from a
server's `/metrics`): what a campaign file may name in an SLA target or an objective before any server runs.
"""

from __future__ import annotations

__all__ = ["COUNTERS", "COUNTER_FIELDS", "GAUGE_FIELDS", "HISTOGRAMS", "RUNNING_TIME", "SERVER_FIELDS"]

COUNTERS = ("vllm:num_preemptions", "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:prefix_cache_queries",
            "vllm:prefix_cache_hits", "vllm:request_success")
GAUGE_FIELDS = {"vllm:kv_cache_usage_perc": "kv_cache_usage_perc", "vllm:num_requests_running": "num_requests_running",
                "vllm:num_requests_waiting": "num_requests_waiting"}
COUNTER_FIELDS = tuple(f"server_{name.split(':', 1)[1]}" for name in COUNTERS)
# histograms whose mean over the window the server measured itself (from its arrival of a request): the
# server's side of the client's TTFT, queueing and E2EL, so that a client's overhead shows as the difference
HISTOGRAMS = {"vllm:time_to_first_token_seconds": "server_mean_ttft_ms",
              "vllm:request_queue_time_seconds": "server_mean_queue_ms",
              "vllm:e2e_request_latency_seconds": "server_mean_e2el_ms"}
# histogram whose sum over the window, divided by the load's duration, is the mean of the running requests
RUNNING_TIME = "vllm:request_inference_time_seconds"
# every numeric server field a result (and so an SLA target) can carry
SERVER_FIELDS = (*(f"server_{short}_{kind}" for short in GAUGE_FIELDS.values() for kind in ("peak", "mean")),
                 *COUNTER_FIELDS, "server_prefix_cache_hit_rate", *HISTOGRAMS.values(),
                 "server_mean_requests_in_inference")

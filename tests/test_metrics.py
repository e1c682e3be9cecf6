"""Server metrics of a point: the window the counter deltas cover, the baseline scrape, runs combined.
A small local HTTP server stands in for vLLM's /metrics (no Ray)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from raysweep.serve import metrics

S = metrics._Sample


def _counters(at: float, prompt: float, running: float = 0.0) -> metrics._Sample:
    return S(at, {"vllm:prompt_tokens": prompt, "vllm:num_preemptions": 0.0, "vllm:num_requests_running": running})


def test_counter_deltas_run_between_the_samples_that_bracket_the_load():
    samples = [_counters(0.0, 10), _counters(0.9, 40), _counters(1.5, 70, 8), _counters(3.2, 100), _counters(8.0, 500)]
    out = metrics.summarize(samples, [], (1.0, 3.0))
    assert out["server_metrics_complete"] is True
    assert out["server_prompt_tokens"] == 100 - 40        # last at/before the start, first at/after the end
    assert out["server_num_requests_running_peak"] == 8


def test_the_servers_own_latency_means_come_from_its_histograms_over_the_bracketed_window():
    """Two engines' histogram series (sums and counts) are summed, and the mean is over the requests the
    window added: (2.0 + 1.0 - 0.5) s over (6 + 4 - 1) requests, whatever came before the load."""
    body = "\n".join([
        "# TYPE vllm:time_to_first_token_seconds histogram",
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf"} 6.0',
        'vllm:time_to_first_token_seconds_sum{engine="0"} 2.0',
        'vllm:time_to_first_token_seconds_count{engine="0"} 6.0',
        'vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf"} 4.0',
        'vllm:time_to_first_token_seconds_sum{engine="1"} 1.0',
        'vllm:time_to_first_token_seconds_count{engine="1"} 4.0', ""])
    after = metrics.parse_metrics(body)
    assert after["vllm:time_to_first_token_seconds_sum"] == 3.0
    assert after["vllm:time_to_first_token_seconds_count"] == 10.0
    before = {"vllm:time_to_first_token_seconds_sum": 0.5, "vllm:time_to_first_token_seconds_count": 1.0}
    out = metrics.summarize([S(0.0, before), S(5.0, after)], [], (1.0, 4.0))
    assert out["server_mean_ttft_ms"] == pytest.approx(1000 * 2.5 / 9)
    assert "server_mean_queue_ms" not in out  # no such series: no field, rather than a 0
    runs = [{"server_mean_ttft_ms": 200.0}, {"server_mean_ttft_ms": 300.0}]
    assert metrics.combine(runs)["server_mean_ttft_ms"] == 250.0


def test_mean_running_requests_is_the_servers_inference_time_over_the_load_when_the_gauge_missed_it():
    """Requests that ran between two samples leave the sampled gauge at 0; their inference times (6 s of
    running, summed over two engines, within a 4 s load) say 1.5 requests ran on average."""
    before = {"vllm:request_inference_time_seconds_sum": 10.0, "vllm:num_requests_running": 0.0}
    body = "\n".join([
        "# TYPE vllm:request_inference_time_seconds histogram",
        'vllm:request_inference_time_seconds_sum{engine="0"} 12.0',
        'vllm:request_inference_time_seconds_count{engine="0"} 7.0',
        'vllm:request_inference_time_seconds_sum{engine="1"} 4.0',
        'vllm:request_inference_time_seconds_count{engine="1"} 2.0', ""])
    after = {**metrics.parse_metrics(body), "vllm:num_requests_running": 0.0}
    out = metrics.summarize([S(0.0, before), S(3.0, {"vllm:num_requests_running": 0.0}), S(6.0, after)], [], (1.0, 5.0))
    assert out["server_num_requests_running_peak"] == 0.0
    assert out["server_mean_requests_in_inference"] == pytest.approx(6.0 / 4.0)
    assert "server_mean_requests_in_inference" not in metrics.summarize([S(0.0, before), S(6.0, after)], [], None)
    runs = [{"server_mean_requests_in_inference": 1.0}, {"server_mean_requests_in_inference": 2.0}]
    assert metrics.combine(runs)["server_mean_requests_in_inference"] == 1.5


@pytest.mark.parametrize("samples, words", [
    ([_counters(1.2, 40), _counters(3.5, 100)], "at or before the start"),    # baseline after the load began
    ([_counters(0.5, 40), _counters(2.5, 100)], "at or after its end"),       # last scrape before the load ended
])
def test_a_window_without_both_bracketing_samples_is_marked_incomplete(samples, words):
    out = metrics.summarize(samples, ["URLError: timed out"], (1.0, 3.0))
    assert out["server_metrics_complete"] is False and words in out["server_metrics_incomplete_reason"]
    assert "timed out" in out["server_metrics_incomplete_reason"]
    assert "server_prompt_tokens" not in out                                  # a shorter window's delta is not kept


def test_no_successful_scrape_is_incomplete_with_the_error():
    out = metrics.summarize([], ["URLError: refused"], (1.0, 3.0))
    assert out["server_metrics_complete"] is False and "refused" in out["server_metrics_incomplete_reason"]


def test_runs_combine_peaks_means_and_counters():
    a = {"server_kv_cache_usage_perc_peak": 0.5, "server_kv_cache_usage_perc_mean": 0.2, "server_prompt_tokens": 100,
         "server_prefix_cache_queries": 100, "server_prefix_cache_hits": 50, "server_metrics_complete": True}
    b = {"server_kv_cache_usage_perc_peak": 0.7, "server_kv_cache_usage_perc_mean": 0.4, "server_prompt_tokens": 300,
         "server_prefix_cache_queries": 300, "server_prefix_cache_hits": 50, "server_metrics_complete": True}
    out = metrics.combine([a, b])
    assert out["server_kv_cache_usage_perc_peak"] == 0.7
    assert out["server_kv_cache_usage_perc_mean"] == pytest.approx(0.3)
    assert out["server_prompt_tokens"] == 400 and out["server_prefix_cache_hit_rate"] == pytest.approx(0.25)
    assert out["server_metrics_complete"] is True
    c = {"server_kv_cache_usage_perc_peak": 0.9, "server_metrics_complete": False,
         "server_metrics_incomplete_reason": "no successful scrape at or after its end"}
    out = metrics.combine([a, c])
    assert "server_prompt_tokens" not in out and out["server_metrics_complete"] is False
    assert "1 of 2 runs" in out["server_metrics_incomplete_reason"]


@pytest.fixture
def flaky_metrics_server() -> Iterator[tuple[str, dict]]:
    """/metrics that fails its first `fail` requests, then counts `prompt` tokens."""
    state = {"fail": 1, "prompt": 0, "asked": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state["asked"] += 1
            if state["fail"] > 0:
                state["fail"] -= 1
                self.send_response(500)
                self.end_headers()
                return
            body = f"# TYPE vllm:prompt_tokens counter\nvllm:prompt_tokens_total{{engine=\"0\"}} {state['prompt']}\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", state
    finally:
        srv.shutdown()
        srv.server_close()


def test_the_baseline_is_retried_until_it_succeeds_and_brackets_the_load(flaky_metrics_server):
    import time

    url, state = flaky_metrics_server
    scraper = metrics.Scraper(url, interval_s=60.0, timeout_s=5.0).start()   # the loop never scrapes on its own
    assert state["asked"] == 2 and len(scraper.samples) == 1                 # one failure, then the baseline
    start = time.time()
    state["prompt"] = 700                                                    # the load
    end = time.time()
    scraper.stop()
    out = scraper.summary((start, end))
    assert out["server_metrics_complete"] is True and out["server_prompt_tokens"] == 700


def test_a_command_runs_counters_cover_it_from_before_its_launch_to_after_its_exit():
    """`vllm bench serve` records no start or end: its load ended before the process returned (its own
    /metrics fetch, the JSON, the interpreter's exit, the Ray return). A window anchored at the return puts the
    baseline inside the load; the counters are bracketed by the scrapes before the launch and after the exit."""
    from raysweep.drive.point import load_windows

    submitted, returned = 0.0, 12.0
    # launched at 0, the load ran from 4 to 8 (1000 prompt tokens), the process returned at 12
    samples = [_counters(0.0, 0), _counters(4.5, 200), _counters(7.9, 950), _counters(8.5, 1000),
               _counters(12.5, 1000)]
    res = {"duration": 4.0, "completed": 10}
    window, bracket = load_windows(res, submitted, returned)
    assert window == (8.0, 12.0) and bracket == (0.0, 12.0)
    assert metrics.summarize(samples, [], window)["server_prompt_tokens"] == 50  # anchored at the return: wrong
    assert metrics.summarize(samples, [], window, bracket=bracket)["server_prompt_tokens"] == 1000
    native = {"start_time": 4.0, "end_time": 8.0, "duration": 4.0}
    assert load_windows(native, submitted, returned) == ((4.0, 8.0), None)

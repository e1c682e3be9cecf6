"""The native client on Ray against the streaming stand-in server: timing accuracy against the server's
own clock, several actors pooled, the client-bottleneck guard, and whole campaigns through the driver
(server metrics, raw samples, reruns of client-limited points, failed requests)."""

from __future__ import annotations

import json
import socket
import subprocess
import urllib.request

import numpy as np
import pytest
from helpers import PY, STANDIN, native_campaign, run_file

from raysweep import procs
from raysweep.record.directory import CampaignDir
from raysweep.record.runs import read_samples
from raysweep.results.table import results_table

pytestmark = pytest.mark.ray


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def stream_server(request):
    """A streaming stand-in on a free port, with the flags the test passes through `request.param`."""
    port = _free_port()
    proc = subprocess.Popen([PY, str(STANDIN / "stream_server.py"), "--model", "m", "--port", str(port),
                             *getattr(request, "param", [])], stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return urllib.request.urlopen(url + "/health", timeout=1).status == 200
        except OSError:
            return False

    assert procs.wait_for(up, 20, 0.05)
    yield url
    proc.kill()
    proc.wait()


def _run(nb, argv, url, clients=None, model="m"):
    import ray

    job = nb.submit(["vllm", "bench", "serve", "--model", model, *argv], url, model, clients=clients)
    return nb.finish(job, ray.get(job.refs, timeout=120))


def _mean_in_flight(s, slots: int) -> float:
    """The time-weighted mean of requests in flight (across all actors) from when the slots were first all
    taken to the begin of the last request."""
    begin, done = np.sort(np.asarray(s["begin"])), np.asarray(s["done"])
    grid = np.linspace(begin[slots - 1], begin[-1], 4000)
    return float(np.mean([((np.asarray(s["begin"]) <= t) & (done > t)).sum() for t in grid]))


@pytest.mark.timing
@pytest.mark.parametrize("stream_server", [["--ttft-delay", "0.03", "--itl-delay", "0.01"]], indirect=True)
def test_timings_match_the_servers_clock_and_actors_pool(gpu_cluster, stream_server):
    """The server times each request from the arrival of its bytes to each chunk written; the client's
    medians agree with it: ITL within 1 ms, TTFT within 2 ms, E2EL within 5 ms. (On a quiet machine the
    gaps are 0.05, 0.7 and 1.0 ms; a client woken for every chunk on a busy shared VM adds to the last two:
    with a vLLM server running beside the test, 0.13, 1.3 and 3.2 ms.)"""
    from raysweep.bench.native import NativeBench

    nb = NativeBench(cpus=0.5)
    try:
        out = _run(nb, ["--num-prompts", "60", "--max-concurrency", "4", "--random-input-len", "12",
                        "--random-output-len", "6", "--clients", "1"], stream_server)
        pooled = _run(nb, ["--num-prompts", "30", "--max-concurrency", "6", "--random-input-len", "12",
                           "--random-output-len", "6", "--clients", "2"], stream_server)
    finally:
        nb.close()
    r = out["result"]
    truth = json.loads(urllib.request.urlopen(stream_server + "/timings").read())[:60]
    assert r["completed"] == 60 and r["failed"] == 0 and r["num_clients"] == 1
    assert r["total_input_tokens"] == 60 * 12 and r["total_output_tokens"] == 60 * 6
    server_ttft = 1000 * np.median([t["ttft"] for t in truth])
    server_itl = 1000 * np.median([x for t in truth for x in t["itls"]])
    server_e2el = 1000 * np.median([t["e2el"] for t in truth])
    seen = {k: (r[f"median_{k}_ms"], v) for k, v in (("ttft", server_ttft), ("itl", server_itl), ("e2el", server_e2el))}
    assert abs(seen["itl"][0] - seen["itl"][1]) < 1.0 and abs(seen["ttft"][0] - seen["ttft"][1]) < 2.0, seen
    assert abs(seen["e2el"][0] - seen["e2el"][1]) < 5.0, seen
    assert r["peak_in_flight_requests"] == 4 and r["max_concurrent_requests"] >= 4 and not r["client_limited"]
    # vLLM's clock starts before the post: the time on the wire is an extra field, never later than it
    samples = out["samples"]
    assert all(b <= w for b, w in zip(samples["begin"], samples["sent"]))
    assert r["mean_ttft_ms"] >= r["mean_ttft_on_wire_ms"] and r["mean_e2el_ms"] >= r["mean_e2el_on_wire_ms"]
    assert r["prompt_format"] == "token_ids" and r["client_nice"] is not None and r["client_cpu_affinity"]
    assert 0 <= r["client_clock_offset_ms_max"] < 1000 and r["client_clock_offset_uncertainty_ms_max"] >= 0
    p, s = pooled["result"], pooled["samples"]
    assert p["completed"] == 30 and p["num_clients"] == 2 and p["peak_in_flight_requests"] == 6
    assert len(p["client_node_ips"].split(",")) == 2
    assert sorted(s["index"]) == list(range(30)) and set(s["actor"]) == {0, 1}


@pytest.mark.timing
def test_guard_fires_when_one_actor_is_asked_for_more_than_it_can_send(gpu_cluster, stream_server):
    from raysweep.bench.native import NativeBench

    nb = NativeBench(cpus=0.5)
    try:
        r = _run(nb, ["--num-prompts", "3000", "--request-rate", "30000", "--random-input-len", "4",
                      "--random-output-len", "1", "--clients", "1"], stream_server)["result"]
        calm = _run(nb, ["--num-prompts", "40", "--request-rate", "100", "--random-input-len", "4",
                         "--random-output-len", "1", "--clients", "1"], stream_server)["result"]
    finally:
        nb.close()
    assert r["client_limited"] and r["achieved_request_rate"] < 0.95 * 30000, r["client_limited_reason"]
    assert not calm["client_limited"] and calm["achieved_request_rate"] == pytest.approx(100, rel=0.05)


@pytest.mark.timing
def test_native_campaign_records_server_metrics_and_raw_samples(gpu_cluster, tmp_path):
    f = native_campaign(tmp_path, server_args="--ttft-delay 0.01 --itl-delay 0.005", warmup=5,
                        bench_args="--random-output-len 8 --max-concurrency 4 --num-prompts 30",
                        bench_params={"grid": {"random_input_len": [16, 32]}},
                        bench={"client_cpus": 0.5, "metrics_interval_s": 0.1})
    summary, out = run_file(f)
    assert summary.counts["done"] == 2, summary.failures
    df = results_table(CampaignDir(out))
    assert set(df["bench_backend"]) == {"native"} and set(df["completed"]) == {30}
    assert (df["server_prompt_tokens"] == df["total_input_tokens"]).all()
    assert (df["server_generation_tokens"] == df["total_output_tokens"]).all()
    assert sorted(df["total_input_tokens"]) == [30 * 16, 30 * 32]
    assert (df["server_num_requests_running_peak"] <= 4).all() and (df["server_num_requests_running_peak"] >= 1).all()
    assert (df["client_limited"] == False).all() and (df["client_limited_reruns"] == 0).all()  # noqa: E712
    assert set(df["cache_state_before"]) == {"reset"}
    for path in df["samples_path"]:
        s = read_samples(out / path)
        assert len(s["sent"]) == 30 and all(len(c) == 8 for c in s["chunks"])


@pytest.mark.timing
def test_client_limited_point_runs_again_with_more_actors(gpu_cluster, tmp_path):
    f = native_campaign(tmp_path, bench_args="--random-output-len 1 --random-input-len 4 --num-prompts 3000",
                        bench_params=[{"request_rate": 30000}],
                        bench={"client_cpus": 0.5, "clients": 1, "max_clients": 2})
    events = []
    summary, out = run_file(f, on_event=lambda kind, **d: events.append((kind, d)))
    assert summary.counts["done"] == 1, summary.failures
    row = results_table(CampaignDir(out)).iloc[0]
    assert row["client_limited_reruns"] == 1 and row["num_clients"] == 2 and row["completed"] == 3000
    # still limited with 2 actors (30,000 req/s on 2 cores): announced once, at the end, with why it stopped
    limited = [d for k, d in events if k == "client_limited"]
    assert [(d["clients"], d["reruns"]) for d in limited] == [(2, 1)] and limited[0]["stop"], limited
    assert row["client_limited"] and row["client_limited_stop"] == limited[0]["stop"]


def test_failed_requests_are_counted_not_fatal(gpu_cluster, tmp_path):
    f = native_campaign(tmp_path, server_args="--fail-every 5", bench_args="--num-prompts 20 --max-concurrency 2",
                        bench_params=[{"random_input_len": 8}], bench={"client_cpus": 0.5})
    summary, out = run_file(f)
    assert summary.counts["done"] == 1, summary.failures
    row = results_table(CampaignDir(out)).iloc[0]
    assert row["completed"] == 16 and row["failed"] == 4 and "HTTP 500" in row["errors_sample"]


@pytest.mark.timing
def test_sla_search_finds_the_largest_concurrency_and_resumes(gpu_cluster, tmp_path):
    """A stand-in with 4 generation slots: TTFT jumps once more than 4 requests are in flight."""
    from raysweep.ledger import Ledger
    from raysweep.results.table import results_table, sla_table

    f = native_campaign(tmp_path, server_args="--ttft-delay 0.01 --itl-delay 0.005 --slots 4",
                        bench_args="--random-output-len 4 --random-input-len 8 --num-prompts 24",
                        bench_params=[{"random_input_len": 8}], bench={"client_cpus": 0.5},
                        sla={"targets": [{"p90_ttft_ms": "<=30"}, {"p90_ttft_ms": "<=60", "completed": ">=24"}],
                             "max_value": 64})
    summary, out = run_file(f)
    df = sla_table(CampaignDir(out))
    first = df[df["target"] == "p90_ttft_ms<=30"].iloc[0]
    second = df[df["target"].str.contains("p90_ttft_ms<=60")].iloc[0]
    assert first["state"] == "found" and 3 <= first["largest_pass"] <= 5, df.to_dict("records")
    assert first["smallest_fail"] == first["largest_pass"] + 1 and first["at_pass_p90_ttft_ms"] <= 30
    assert second["state"] == "found" and second["largest_pass"] > first["largest_pass"]
    led = Ledger.open_existing(out)
    probes = [p for p in led.points() if p.probe_of or p.bench_params.get("max_concurrency") is None]
    assert all(p.state == "done" and p.attempts == 1 for p in probes)
    values = {p.bench_params.get("max_concurrency") for p in probes}
    assert len(values) == len(probes) < first["probes"] + second["probes"]  # each value ran once, shared
    # a search killed halfway: its last probes and its outcome are gone; the resumed one runs only those
    redo = sorted(probes, key=lambda p: p.ended_at)[-2:]

    def verdicts() -> dict[str, tuple[bool, bool]]:  # each probe's side of the two targets
        return {r["point_id"]: (r["p90_ttft_ms"] <= 30, r["p90_ttft_ms"] <= 60 and r["completed"] >= 24)
                for r in results_table(CampaignDir(out)).to_dict("records")}

    judged = verdicts()
    with led._tx() as c:
        c.execute("DELETE FROM sla_searches")
        c.executemany("UPDATE points SET state = 'pending', attempts = 0 WHERE point_id = ?",
                      [(p.point_id,) for p in redo])
    before = {p.point_id: p.ended_at for p in led.points()}
    led.close()
    run_file(f)
    led = Ledger.open_existing(out)
    rerun = [p.point_id for p in led.points() if p.ended_at != before.get(p.point_id)]
    led.close()
    lost, kept = {p.point_id for p in redo}, {p.point_id for p in probes} - {p.point_id for p in redo}
    assert rerun and not set(rerun) & kept, rerun  # a finished probe never runs again
    again = verdicts()
    # a lost probe measured again on the same side of both targets leads the search the same way, so only the
    # lost probes run; one that lands on the other side of a target (a boundary probe's p90 over 24 requests
    # on a shared machine) may send the search to another value, and only then
    flipped = [p for p in lost if p in again and again[p] != judged[p]]
    assert set(rerun) <= lost or flipped, (rerun, judged, again)
    assert len(sla_table(CampaignDir(out))) == 2


@pytest.mark.timing
@pytest.mark.parametrize("stream_server", [["--ttft-delay", "0.5", "--itl-delay", "0.1"]], indirect=True)
def test_the_concurrency_limit_holds_across_actors_to_the_last_request(gpu_cluster, stream_server):
    """3 actors share 4 slots (2, 1, 1): every free slot of any actor takes the next request, so the load
    stays at 4 in flight until the requests run out (dealt in fixed shares, the actor with 2 slots finished
    its third early and the load fell to 2: a mean of about 3); and never more actors than slots: 4 actors
    asked for a limit of 2 run as 2, not as actors without a limit. Each request takes about 0.9 s, so that
    the time a busy machine adds between a request's end and the slot's next request (about 47 ms on average
    with a vLLM test running beside this one, 2026-11-26) leaves the mean near 4, not near the fixed shares'
    3: with requests of 0.09 s that gap alone brought it to 2.63."""
    from raysweep.bench.native import NativeBench

    nb = NativeBench(cpus=0.5)
    try:
        out = _run(nb, ["--num-prompts", "60", "--max-concurrency", "4", "--random-input-len", "8",
                        "--random-output-len", "5"], stream_server, clients=3)
        capped = _run(nb, ["--num-prompts", "20", "--max-concurrency", "2", "--random-input-len", "8",
                           "--random-output-len", "2"], stream_server, clients=4)
    finally:
        nb.close()
    r, s = out["result"], out["samples"]
    assert r["completed"] == 60 and r["num_clients"] == 3 and sorted(s["index"]) == list(range(60))
    assert r["peak_in_flight_requests"] == 4
    assert _mean_in_flight(s, 4) > 3.6   # fixed shares: about 3 (4 for the first half, then 2)
    assert s["actor"].count(0) >= 24, [s["actor"].count(a) for a in range(3)]  # the 2-slot actor took ~half
    assert capped["result"]["num_clients"] == 2 and capped["result"]["peak_in_flight_requests"] == 2


@pytest.mark.timing
@pytest.mark.parametrize("stream_server", [["--slots", "128", "--ttft-delay", "0.1"]], indirect=True)
def test_large_closed_loops_are_not_held_back_by_their_start(gpu_cluster, stream_server):
    """Large closed loops on a server that is the bottleneck (128 requests generated at a time, 0.1 s each:
    the other slots' requests queue there): 2 actors x 256 slots and 4 x 512. Each slot's first request goes
    with its actor's call, so no slot waits at the start for the one dispenser, and the slots are idle under
    5 % of their time: not client-limited. A dispenser that takes 30 ms per request, against requests of
    about 0.1 s on 8 slots, leaves the slots idle most of the time: client-limited, by the send lag. The
    event-loop threshold is raised here: this test judges the send lag, and several actors share 2 cores with
    the server (the loop lag has a test of its own above). The server's batches end 128 requests at once: the
    slots of an actor that free together take their next requests in one call to the dispenser. Taking them one
    call each, with one core kept busy beside the test (2026-11-29, 3 sittings), left the 2 actors' slots idle
    5.2-8.2 % of their time (send lag p99 168-317 ms); in one call, 0.55-0.78 % (14-31 ms), 4 actors 0.55-1.0 %."""
    import ray

    from raysweep.bench.native import NativeBench

    load = ["--random-input-len", "4", "--random-output-len", "1"]
    nb = NativeBench(cpus=0.5, max_loop_lag_ms=1000.0)
    try:
        two = _run(nb, ["--num-prompts", "640", "--max-concurrency", "512", *load], stream_server, clients=2)
        four = _run(nb, ["--num-prompts", "2304", "--max-concurrency", "2048", *load], stream_server, clients=4)
        ray.get(nb._dispenser.slow_down.remote(0.03))
        slow = _run(nb, ["--num-prompts", "40", "--max-concurrency", "8", *load], stream_server, clients=2)
    finally:
        nb.close()
    for out, clients, n, conc in ((two, 2, 640, 512), (four, 4, 2304, 2048)):
        r, s = out["result"], out["samples"]
        assert r["num_clients"] == clients and r["completed"] == n and sorted(s["index"]) == list(range(n))
        assert r["peak_in_flight_requests"] <= conc and r["max_concurrency"] == conc
        assert r["client_slot_idle_pct"] < 5 and not r["client_limited"], (clients, r["client_limited_reason"])
    r = slow["result"]
    assert r["completed"] == 40 and r["client_limited"] and "slots idle" in r["client_limited_reason"], r
    assert r["client_send_lag_p99_ms"] > 30 and r["client_slot_idle_pct"] > 5


@pytest.mark.parametrize("stream_server, check", [
    (["--no-usage"], "without a usage chunk"),
    (["--no-done"], "without [DONE]"),
    (["--short-by", "1"], "ignore_eos: the server generated 3 output tokens where max_tokens is 4"),
], indirect=["stream_server"])
def test_incomplete_streams_and_short_outputs_fail(gpu_cluster, stream_server, check):
    from raysweep.bench.native import NativeBench

    nb = NativeBench(cpus=0.5)
    try:
        r = _run(nb, ["--num-prompts", "6", "--max-concurrency", "2", "--random-input-len", "8",
                      "--random-output-len", "4"], stream_server)["result"]
    finally:
        nb.close()
    assert r["completed"] == 0 and r["failed"] == 6 and r["total_output_tokens"] == 0
    assert any(check in e for e in r["errors_sample"]), r["errors_sample"]


@pytest.mark.timing
@pytest.mark.parametrize("stream_server", [["--ttft-delay", "0.01", "--itl-delay", "0.02", "--tokens-per-chunk", "4",
                                            "--tail-delay", "0.3"]], indirect=True)
def test_multi_token_chunks_and_a_late_usage_are_timed_as_vllm_times_them(gpu_cluster, stream_server):
    """8 tokens in 2 chunks 20 ms apart, the usage and [DONE] 300 ms after the last: E2EL ends at the last token
    chunk, ITL has one gap per chunk, TPOT spreads E2EL - TTFT over 7 tokens; the duration runs to the end of
    the streams."""
    from raysweep.bench.native import NativeBench

    nb = NativeBench(cpus=0.5)
    try:
        r = _run(nb, ["--num-prompts", "4", "--max-concurrency", "1", "--random-input-len", "8",
                      "--random-output-len", "8"], stream_server)["result"]
    finally:
        nb.close()
    assert r["completed"] == 4 and r["total_output_tokens"] == 32
    assert r["median_e2el_ms"] < 200 and r["duration"] > 4 * 0.3
    assert 15 < r["median_itl_ms"] < 100 and r["median_tpot_ms"] == pytest.approx(
        (r["median_e2el_ms"] - r["median_ttft_ms"]) / 7, rel=0.3)


@pytest.mark.timing
def test_a_client_whose_loop_is_blocked_is_flagged(gpu_cluster, stream_server):
    """A closed loop on a zero-work stand-in is client-bound; with the client's event loop blocked half the
    time its throughput falls, and the guard says so (the send lag alone cannot: slots look busy)."""
    import ray

    from raysweep.bench.native import NativeBench

    argv = ["--num-prompts", "1500", "--max-concurrency", "8", "--random-input-len", "4", "--random-output-len", "1"]
    nb = NativeBench(cpus=0.5)
    try:
        free = _run(nb, argv, stream_server, clients=1)["result"]
        ray.get(nb.actors[0].block_loop.remote(0.05, 0.1))
        blocked = _run(nb, argv, stream_server, clients=1)["result"]
        ray.get(nb.actors[0].block_loop.remote(0, 0))
    finally:
        nb.close()
    assert blocked["request_throughput"] < 0.8 * free["request_throughput"]
    assert blocked["client_limited"] and "event-loop lag" in blocked["client_limited_reason"]


@pytest.mark.vllm
def test_real_server_is_timed_as_vllm_bench_serve(gpu_cluster, vllm_server):
    """Against real vLLM: TTFT from before the post, output tokens equal max_tokens with --ignore-eos,
    max_concurrent_requests in vLLM's 1-s buckets next to the exact peak."""
    from raysweep.bench.native import NativeBench

    nb = NativeBench(cpus=0.5)
    try:
        out = _run(nb, ["--num-prompts", "8", "--max-concurrency", "2", "--random-input-len", "16",
                        "--random-output-len", "6", "--ignore-eos"], vllm_server["url"], model=vllm_server["model"])
    finally:
        nb.close()
    r, s = out["result"], out["samples"]
    assert r["completed"] == 8 and r["failed"] == 0, r.get("errors_sample")
    assert set(s["out_tok"]) == {6} and r["total_output_tokens"] == 48
    assert all(b <= w for b, w in zip(s["begin"], s["sent"])) and r["mean_ttft_ms"] >= r["mean_ttft_on_wire_ms"]
    ttft = [1000 * (f - b) for f, b in zip(s["first"], s["begin"])]
    assert r["median_ttft_ms"] == pytest.approx(float(np.median(ttft)))
    assert r["peak_in_flight_requests"] == 2
    from raysweep.bench.stats import vllm_buckets
    ok = np.asarray(s["ok"])
    assert r["max_concurrent_requests"] == vllm_buckets(np.asarray(s["begin"])[ok], np.asarray(s["end"])[ok],
                                                        [np.asarray(c) for c in s["chunks"]])[1]

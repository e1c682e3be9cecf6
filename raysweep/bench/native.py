"""The `native` bench backend: raysweep's own streaming client, in warm Ray actors.

Driver side (`NativeBench`, one per server configuration): per point it makes the requests and their due
times before the clock starts (data set, arrival process), splits them round-robin over its client actors
(and the concurrency limit with them), picks a start instant a little ahead, and makes one Ray call per
actor. Each `NativeClient` actor waits for that instant, sends its share from its own event loop over
aiohttp (SSE streaming, usage included), and returns its raw per-request samples, timed from the moment
each request went on the wire. The driver pools the
samples and computes every metric from them (`stats`), then runs the client-bottleneck guard; a point the
client could not drive is marked `client_limited`, and run again with twice the actors while allowed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import aiohttp
import ray

from raysweep.bench import arrivals, stats
from raysweep.bench.datasets import make_requests, payload
from raysweep.bench.options import LoadOptions, parse_load_options

__all__ = ["NativeBench", "NativeClient", "Job"]

log = logging.getLogger(__name__)

_START_LEAD_S = 0.03          # the start instant is this far ahead, plus the time to ship the payloads
_SHIP_BYTES_PER_S = 200e6
_LOOP_TICK_S = 0.005          # event-loop lag probe period
RATE_PER_CLIENT = 1000.0      # asked req/s per client actor when the count is automatic
CONCURRENCY_PER_CLIENT = 256  # in-flight requests per client actor when the count is automatic
_PLACE_TIMEOUT_S = 60.0


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


@ray.remote(max_restarts=0)
class NativeClient:
    """Sends one share of a point's requests at their due times and times every streamed chunk.

    Its requests run on its own event loop (uvloop when installed) in its own thread, kept for the
    actor's life with its connection pool; Ray's call thread only waits for the result."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._loop = _new_loop()
        threading.Thread(target=self._loop.run_forever, name="native-client-loop", daemon=True).start()

    def node(self) -> str:
        return ray.util.get_node_ip_address()

    def run(self, *args: Any) -> dict[str, Any]:
        return asyncio.run_coroutine_threadsafe(self._run(*args), self._loop).result()

    async def _client(self, timeout_s: float) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            trace = aiohttp.TraceConfig()  # the clock starts when the request is on the wire, not before
            trace.on_request_headers_sent.append(_mark_sent)
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300), trace_configs=[trace],
                timeout=aiohttp.ClientTimeout(total=None, sock_read=timeout_s), auto_decompress=False)
        return self._session

    async def _run(self, url: str, rank: int, indices: list[int], bodies: list[bytes], due: list[float],
                  concurrency: int | None, t0: float, timeout_s: float, headers: dict[str, str]) -> dict[str, Any]:
        session = await self._client(timeout_s)
        hdrs = {"Content-Type": "application/json", **headers}
        n = len(indices)
        out = stats.empty_samples()
        cols = {c: [None] * n for c in stats.COLUMNS}
        cols["index"], cols["actor"], cols["due"] = list(indices), [rank] * n, list(due)
        clock = time.perf_counter
        base = clock() + (t0 - time.time())   # perf_counter value of the common start
        late = clock() - base

        async def send(k: int, ready: float) -> None:
            chunks: list[float] = []
            in_tok = out_tok = -1
            t_last = 0.0
            err = None
            begin = clock()
            mark = [begin]
            try:
                async with session.post(url, data=bodies[k], headers=hdrs, trace_request_ctx=mark) as resp:
                    t_sent = mark[0]
                    if resp.status != 200:
                        err = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                    else:
                        async for line in resp.content:
                            if not line.startswith(b"data:"):
                                continue
                            data = line[5:].strip()
                            now = clock()
                            if data == b"[DONE]" or not data:
                                t_last = now
                                continue
                            obj = json.loads(data)
                            t_last = now
                            if obj.get("choices"):
                                chunks.append(now - t_sent)
                            usage = obj.get("usage")
                            if usage:
                                in_tok = usage.get("prompt_tokens", -1)
                                out_tok = usage.get("completion_tokens", -1)
                            if "error" in obj:
                                err = f"stream error: {str(obj['error'])[:300]}"
            except Exception as exc:  # noqa: BLE001 - a failed request is a sample, not a crash
                err = f"{type(exc).__name__}: {exc}"[:300]
            t_sent = mark[0]
            t_end = t_last or clock()  # the last event of the stream; a failed request ends now
            if err is None and not chunks:
                err = "no token was streamed"
            cols["ready"][k], cols["begin"][k], cols["sent"][k] = ready, begin - base, t_sent - base
            cols["first"][k] = (t_sent - base + chunks[0]) if chunks else math.nan
            cols["end"][k] = t_end - base
            cols["in_tok"][k] = in_tok
            cols["out_tok"][k] = out_tok if out_tok >= 0 else len(chunks)
            cols["ok"][k], cols["error"][k], cols["chunks"][k] = err is None, err, chunks

        async def wait_until(offset: float) -> None:
            delay = base + offset - clock()
            if delay > 0:
                await asyncio.sleep(delay)

        stop = asyncio.Event()
        lags: list[float] = []

        async def probe() -> None:
            while not stop.is_set():
                t = clock()
                await asyncio.sleep(_LOOP_TICK_S)
                lags.append(clock() - t - _LOOP_TICK_S)

        await wait_until(0.0)
        prober = asyncio.create_task(probe())
        if concurrency:
            order = iter(range(n))

            async def worker() -> None:
                free = 0.0
                for k in order:
                    await wait_until(due[k])
                    await send(k, max(due[k], free))
                    free = clock() - base

            await asyncio.gather(*(worker() for _ in range(min(concurrency, n))))
        else:
            tasks = []
            for k in range(n):
                await wait_until(due[k])
                tasks.append(asyncio.create_task(send(k, due[k])))
            await asyncio.gather(*tasks)
        stop.set()
        await prober
        for c in stats.COLUMNS:
            out[c] = cols[c]
        out["loop_lag"] = lags
        out["start_late_s"] = max(late, 0.0)
        return out


async def _mark_sent(session: Any, ctx: Any, params: Any) -> None:
    ctx.trace_request_ctx[0] = time.perf_counter()


@dataclass
class Job:
    """A point in flight: the Ray calls and what is needed to read their answers."""

    refs: list[Any]
    opts: LoadOptions
    model: str
    clients: int
    rate: float
    started: float
    nodes: list[str]


class NativeBench:
    """The native client actors of one server configuration, kept warm between points."""

    def __init__(self, clients: int | str = "auto", max_clients: int = 8, cpus: float = 1.0,
                 timeout_s: float = 3600.0, max_send_lag_ms: float = stats.MAX_SEND_LAG_MS,
                 min_rate_fraction: float = stats.MIN_RATE_FRACTION) -> None:
        self.setting, self.max_clients, self.cpus, self.timeout_s = clients, max_clients, cpus, timeout_s
        self.guard = {"max_send_lag_ms": max_send_lag_ms, "min_rate_fraction": min_rate_fraction}
        self.actors: list[Any] = []
        self.nodes: list[str] = []
        self._starting: list[Any] = []

    def warm(self) -> None:
        """Start the first actor now, without waiting: its worker process starts while the server does."""
        if not self.actors and not self._starting:
            self._starting = [NativeClient.options(num_cpus=self.cpus, scheduling_strategy="SPREAD").remote()]

    def _ensure(self, n: int) -> None:
        """At least n actors, each started and answering before the point's clock is set; actors that
        cannot be placed in 60 s (no node has `client_cpus` free) are given up."""
        fresh, self._starting = self._starting, []
        want = n - len(self.actors) - len(fresh)
        if want > 0:  # as many as the free CPUs hold now (one at least, to say why when none fits)
            room = int(ray.available_resources().get("CPU", 0.0) // self.cpus)
            for _ in range(min(want, room) if self.actors or fresh else max(1, min(want, room))):
                fresh.append(NativeClient.options(num_cpus=self.cpus, scheduling_strategy="SPREAD").remote())
        if not fresh:
            return
        refs = [a.node.remote() for a in fresh]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=_PLACE_TIMEOUT_S)
        for a, ref in zip(fresh, refs):
            if ref in ready:
                self.actors.append(a)
                self.nodes.append(ray.get(ref))
            else:
                with contextlib.suppress(Exception):
                    ray.kill(a)
        if not self.actors:
            raise RuntimeError(f"no client actor could be placed in {_PLACE_TIMEOUT_S:.0f} s: each takes "
                               f"{self.cpus:g} CPU (bench.client_cpus)")
        if len(self.actors) < n:
            log.warning("only %d of %d client actors could be placed", len(self.actors), n)

    def clients_for(self, opts: LoadOptions) -> int:
        """How many actors drive the point: --clients, bench.clients, or from the asked load."""
        if opts.clients:
            n = opts.clients
        elif self.setting != "auto":
            n = int(self.setting)
        else:
            rate = arrivals.asked_rate(opts)
            n = 1
            if math.isfinite(rate):
                n = max(n, math.ceil(rate / RATE_PER_CLIENT))
            if opts.max_concurrency:
                n = max(n, math.ceil(opts.max_concurrency / CONCURRENCY_PER_CLIENT))
            n = min(n, self.max_clients)
        n = min(n, opts.num_prompts)
        return max(1, min(n, opts.max_concurrency) if opts.max_concurrency else n)

    def submit(self, argv: list[str], base_url: str, model: str, num_prompts: int | None = None,
               clients: int | None = None) -> Job:
        opts = parse_load_options(argv)
        if num_prompts is not None:
            opts = opts.with_prompts(num_prompts)
        model = opts.served_name or model
        n = clients or self.clients_for(opts)
        self._ensure(n)
        n = min(n, len(self.actors))
        reqs = make_requests(opts)
        bodies = [payload(r, opts, model) for r in reqs]
        due = arrivals.due_times(len(reqs), opts).tolist()
        size = sum(len(b) for b in bodies)
        url = base_url.rstrip("/") + opts.path
        conc = opts.max_concurrency
        t0 = time.time() + _START_LEAD_S + size / _SHIP_BYTES_PER_S + 0.002 * n
        refs = []
        for a in range(n):
            idx = list(range(a, len(reqs), n))
            share = None if not conc else conc // n + (1 if a < conc % n else 0)
            refs.append(self.actors[a].run.remote(url, a, idx, [bodies[i] for i in idx], [due[i] for i in idx],
                                                  share, t0, self.timeout_s, opts.headers))
        return Job(refs, opts, model, n, arrivals.asked_rate(opts), t0, self.nodes[:n])

    def finish(self, job: Job, answers: list[dict[str, Any]]) -> dict[str, Any]:
        """The point's result (vLLM's field names), from the pooled samples of every actor."""
        samples = stats.pool(answers)
        opts = job.opts
        result: dict[str, Any] = {
            "date": datetime.now().strftime("%Y%m%d-%H%M%S"), "endpoint_type": opts.backend,
            "backend": opts.backend, "label": None, "model_id": job.model, "tokenizer_id": opts.tokenizer or job.model,
            "num_prompts": opts.num_prompts,
            "request_rate": "inf" if math.isinf(opts.request_rate) else opts.request_rate,
            "burstiness": opts.burstiness, "max_concurrency": opts.max_concurrency,
        }
        if opts.ramp_up_strategy:
            result.update(ramp_up_strategy=opts.ramp_up_strategy, ramp_up_start_rps=opts.ramp_up_start_rps,
                          ramp_up_end_rps=opts.ramp_up_end_rps)
        result.update(stats.point_metrics(samples, opts))
        result.update(stats.client_check(samples, opts, job.rate, **self.guard))
        result.update(bench_backend="native", num_clients=job.clients, dataset_name=opts.dataset_name,
                      client_node_ips=",".join(job.nodes),
                      client_start_late_ms=1000 * max(a.get("start_late_s", 0.0) for a in answers),
                      start_time=job.started, end_time=job.started + max(samples["end"] or [0.0]))
        return {"ok": True, "error": None, "result": result, "samples": samples, "output_tail": "",
                "duration_s": time.time() - job.started, "command": None}

    def close(self) -> None:
        for a in self.actors:
            with contextlib.suppress(Exception):
                ray.kill(a)
        for a in self._starting:
            with contextlib.suppress(Exception):
                ray.kill(a)
        self.actors, self.nodes, self._starting = [], [], []

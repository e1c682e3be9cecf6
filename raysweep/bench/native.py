"""The `native` bench backend: raysweep's own streaming client, in warm Ray actors.

Driver side (`NativeBench`, one per server configuration): per point it makes the requests and their due
times before the clock starts (data set, arrival process), ships the bodies once (`ray.put`), measures each
client actor's clock offset to the driver (ping-pong, the least round trip of several), picks a start instant
a little ahead and makes one Ray call per actor. The load is one load across actors, as in one
`vllm bench serve` process:
- with `--max-concurrency`, the limit is split into slots over the actors (never more actors than slots);
  each actor is dealt the first request of each of its slots with its call (round robin over the first
  `--max-concurrency` requests), and every slot of any actor that frees takes the next request from a shared
  `Dispenser` (the slots of an actor that free together, in one call), so the limit holds across all actors to
  the last request, and neither the start nor a wave of requests ending at once queues every slot on the one
  dispenser; a request is begun at its due time or when a slot frees, whichever is later;
- without it (open loop or burst), requests are dealt round robin and sent at their absolute due times.
A unit of work is one request, or with `--dataset-name multi_turn` one session whose turns a slot sends in
order, each carrying the conversation so far (`sessions`); with `--duration` no unit begins after it, and a
closed loop cycles through its requests until then (`arrivals.for_duration`).
Each `NativeClient` actor waits for the start, sends from its own event loop over aiohttp (SSE streaming,
usage included) and returns raw per-request samples, timed as vLLM times them (from just before the post),
plus the time each request went on the wire. The driver pools the samples and computes every metric from
them (`stats`), then runs the client-bottleneck guard; a point the client could not drive is marked
`client_limited`, and run again with more actors while allowed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import aiohttp
import ray

from raysweep import procs
from raysweep.bench import arrivals, sane, stats
from raysweep.bench.datasets import Request, make_requests, payload, tokenizer_for
from raysweep.bench.load import CONCURRENCY, RATE
from raysweep.bench.options import LoadOptions, parse_load_options
from raysweep.bench.sessions import conversations, system_history, with_history
from raysweep.procs import cpu_text

if TYPE_CHECKING:
    from ray.actor import ActorHandle

__all__ = ["Dispenser", "Job", "NativeBench", "NativeClient", "deal", "planned_prompts", "slots_of"]

log = logging.getLogger(__name__)

_START_LEAD_S = 0.03          # the start instant is this far ahead, plus the time to ship the payloads
_SHIP_BYTES_PER_S = 200e6
_LOOP_TICK_S = 0.005          # event-loop lag probe period
_CLOCK_ROUNDS = 5             # ping-pongs per actor and point to measure its clock offset
RATE_PER_CLIENT = 1000.0      # asked req/s per client actor when the count is automatic
CONCURRENCY_PER_CLIENT = 256  # in-flight requests per client actor when the count is automatic
_PLACE_TIMEOUT_S = 60.0
# A pooled connection idle this long is closed rather than reused: below vLLM's own keep-alive
# (VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s), so that a request never goes out on a connection the server is
# closing at that moment (aiohttp keeps one 15 s; on a loaded machine, between points, such a request
# failed with "Can not write request body" and counted as a failed request of the server).
KEEPALIVE_S = 2.0


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


class Dispenser:
    """Hands out the next request index of a point to whichever client slot is free (one load across actors);
    `NativeBench` runs it as a Ray actor of no CPU."""

    def __init__(self) -> None:
        self._epoch, self._next, self._n = -1, 0, 0
        self._delay = 0.0

    def slow_down(self, seconds: float) -> None:
        """Test hook: every index handed out waits `seconds` first (a dispenser that cannot keep up with the slots)."""
        self._delay = seconds

    def reset(self, epoch: int, n: int, start: int = 0) -> None:
        """A new point of `n` units whose first `start` were dealt to the actors with their calls."""
        self._epoch, self._next, self._n = epoch, start, n

    def take(self, epoch: int, wanted: int = 1) -> list[int]:
        """The next `wanted` indices of point `epoch`, fewer (or none) when the point has run out: one call for
        all the slots of an actor that freed together (`_Taker`)."""
        if epoch != self._epoch:
            return []
        got = list(range(self._next, min(self._next + wanted, self._n)))
        self._next += len(got)
        if self._delay:
            time.sleep(self._delay * max(len(got), 1))
        return got


class _Taker:
    """An actor's side of the dispenser: the slots that free while a take is on its way wait for it and are
    then served by one call together, so a wave of requests that end at once (a server's batch) costs a few
    round trips to the dispenser, not one each queued behind the others. A slot only asks once it is free, so
    the concurrency limit still holds across actors."""

    def __init__(self, dispenser: ActorHandle, epoch: int) -> None:
        self._dispenser, self._epoch = dispenser, epoch
        self._waiting: list[asyncio.Future[int | None]] = []
        self._busy = False

    async def take(self) -> int | None:
        fut: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        self._waiting.append(fut)
        if not self._busy:
            self._busy = True
            asyncio.get_running_loop().create_task(self._serve())
        return await fut

    async def _serve(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                try:
                    got = await self._dispenser.take.remote(self._epoch, len(batch))
                except Exception as exc:  # every waiting slot sees the failure
                    for f in batch:
                        f.set_exception(exc)
                    continue
                for i, f in enumerate(batch):
                    f.set_result(got[i] if i < len(got) else None)
        finally:
            self._busy = False


def connector() -> aiohttp.TCPConnector:
    """The client's connection pool: unbounded, an idle connection kept `KEEPALIVE_S` at most."""
    return aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=KEEPALIVE_S)


@ray.remote(max_restarts=0)
class NativeClient:
    """Sends requests of a point at their due times and times every streamed chunk.

    Its requests run on its own event loop (uvloop when installed) in its own thread, kept for the
    actor's life with its connection pool; Ray's call thread only waits for the result. At start it lowers
    its niceness to 0 where the OS allows (Ray starts workers niced)."""

    def __init__(self, cpu_ids: list[int] | None = None) -> None:
        self._nice_failure = procs.niceness_zero()
        if cpu_ids and (failure := procs.pin_cpus(set(cpu_ids))):  # bench.cpu_affinity
            log.warning("native client: %s; it runs on CPUs %s", failure, sorted(os.sched_getaffinity(0)))
        self._session: aiohttp.ClientSession | None = None
        self._blocking = False
        self._skew = 0.0
        self._loop = _new_loop()
        threading.Thread(target=self._loop.run_forever, name="native-client-loop", daemon=True).start()

    def node(self) -> str:
        return ray.util.get_node_ip_address()

    def clock(self) -> float:
        return time.time() + self._skew

    def skew_clock(self, seconds: float) -> None:
        """Test hook: this actor's wall clock runs `seconds` ahead of the machine's (a node whose clock is off)."""
        self._skew = seconds

    def block_loop(self, busy_s: float, period_s: float) -> None:
        """Test hook: block the client's event loop `busy_s` of every `period_s` (0, 0 stops it)."""
        self._blocking = busy_s > 0
        if self._blocking:
            asyncio.run_coroutine_threadsafe(self._block(busy_s, period_s), self._loop)

    async def _block(self, busy_s: float, period_s: float) -> None:
        while self._blocking:
            time.sleep(busy_s)
            await asyncio.sleep(max(period_s - busy_s, 0.0))

    def run(self, *args: Any) -> dict[str, Any]:
        return asyncio.run_coroutine_threadsafe(self._run(*args), self._loop).result()

    async def _client(self, timeout_s: float) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            trace = aiohttp.TraceConfig()  # when the request went on the wire: an extra, separately named time
            trace.on_request_headers_sent.append(_mark_sent)
            self._session = aiohttp.ClientSession(
                connector=connector(), trace_configs=[trace],
                timeout=aiohttp.ClientTimeout(total=None, sock_read=timeout_s), auto_decompress=False)
        return self._session

    async def _run(self, url: str, rank: int, bodies: list[bytes], due: list[float], share: list[int] | None,
                   slots: int | None, t0: float, timeout_s: float, headers: dict[str, str],
                   dispenser: ActorHandle | None = None, epoch: int = 0,
                   work: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send this actor's requests: its `share` at their due times (open loop, burst), or with `slots`
        in-flight requests taking indices from `share` (with a `dispenser`: the slots' first requests, dealt
        here) and then from `dispenser`, until none is left.
        `t0` is the common start in this actor's clock. `work` (made by `NativeBench.submit`) shapes the units of work:
        `spans` makes each unit a multi-turn session (its turns in order, each with the conversation so far,
        `think_s` after the previous answer); `duration_s` stops taking new units after that long; `cycle`
        lets a closed loop take unit numbers past the pool (unit k sends body k % pool)."""
        cpu0 = time.process_time()  # this actor's CPU time over the point: what the client took from its cores
        work = work or {}
        spans, think_s = work.get("spans"), float(work.get("think_s") or 0.0)
        systems = work.get("systems")
        duration, cycle = work.get("duration_s"), bool(work.get("cycle"))
        pool_n = len(spans) if spans else len(bodies)
        session = await self._client(timeout_s)
        hdrs = {"Content-Type": "application/json", **headers}
        cols: dict[str, list[Any]] = {c: [] for c in (*stats.COLUMNS, *stats.WORKLOAD_COLUMNS)}
        clock = time.perf_counter
        base = clock() + (t0 - self.clock())  # perf_counter value of the common start (t0 is in this actor's clock)
        late = clock() - base

        async def send(k: int, ready: float, body: bytes | None = None, due_at: float | None = None,
                       unit: int = -1, turn: int = -1) -> str | None:
            """One request; its generated text (None when it failed)."""
            chunks: list[float] = []
            texts: list[str] = []
            in_tok = out_tok = -1
            t_last = 0.0
            first_out = math.nan
            reasoning = False
            err = None
            got_done = got_usage = False
            begin = clock()               # vLLM's start: before the post
            mark = [begin]
            try:
                async with session.post(url, data=body if body is not None else bodies[k % len(bodies)],
                                        headers=hdrs, trace_request_ctx=mark) as resp:
                    if resp.status != 200:
                        err = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                    else:
                        async for line in resp.content:
                            if not line.startswith(b"data:"):
                                continue
                            data = line[5:].strip()
                            if data == b"[DONE]":
                                got_done = True
                                continue
                            if not data:
                                continue
                            now = clock()
                            obj = json.loads(data)
                            if choices := obj.get("choices"):
                                chunks.append(now - begin)
                                t_last = now
                                c = choices[0]
                                delta = c.get("delta") or {}
                                piece = c.get("text") or delta.get("content") or ""
                                texts.append(piece)
                                if piece and math.isnan(first_out):  # the first output (not reasoning) token
                                    first_out = now - begin
                                reasoning = reasoning or bool(delta.get("reasoning_content") or delta.get("reasoning"))
                            if usage := obj.get("usage"):
                                got_usage = True
                                in_tok = _count(usage.get("prompt_tokens"))
                                out_tok = _count(usage.get("completion_tokens"))
                            if "error" in obj:
                                err = f"stream error: {str(obj['error'])[:300]}"
            except Exception as exc:
                err = f"{type(exc).__name__}: {exc}"[:300]
            done = clock()
            if err is None:
                err = _incomplete(bool(chunks), got_usage, got_done)
            cols["index"].append(k)
            cols["due"].append(due[k % len(due)] if due_at is None else due_at)
            cols["ready"].append(ready)
            cols["begin"].append(begin - base)
            cols["sent"].append(mark[0] - base)
            cols["first"].append(begin - base + chunks[0] if chunks else math.nan)
            cols["end"].append((t_last or done) - base)
            cols["done"].append(done - base)
            cols["in_tok"].append(in_tok)
            cols["out_tok"].append(out_tok)
            cols["ok"].append(err is None)
            cols["error"].append(err)
            cols["chunks"].append(chunks)
            cols["text"].append("".join(texts) if out_tok <= 0 and err is None else None)
            cols["first_out"].append(begin - base + first_out)
            cols["reasoning"].append(reasoning)
            cols["session"].append(unit)
            cols["turn"].append(turn)
            return "".join(texts) if err is None else None

        async def run_unit(u: int, ready: float) -> None:
            """One unit of work: a request, or a session's turns in order."""
            if not spans:
                await send(u, ready)
                return
            first, turns = spans[u % pool_n]
            offset = (u // pool_n) * len(bodies)  # a cycled session's requests get indices of their own
            history = system_history(systems[u % pool_n] if systems else None)
            for t in range(turns):
                k = first + t
                if t:
                    ready = clock() - base + think_s
                    await wait_until(ready)
                body = bodies[k] if not history else with_history(bodies[k], history)
                text = await send(offset + k, ready, body, due_at=ready if t else due[u % len(due)], unit=u, turn=t)
                if text is None:  # the session ends here: its unsent turns count as failed
                    for later in range(t + 1, turns):
                        aborted(offset + first + later, u, later, t)
                    return
                history += [json.loads(bodies[k])["messages"][-1], {"role": "assistant", "content": text}]

        def aborted(k: int, unit: int, turn: int, failed_turn: int) -> None:
            """A turn never sent because an earlier turn of its session failed: a failed sample at this instant."""
            now = clock() - base
            row = {"index": k, "due": now, "ready": now, "begin": now, "sent": now, "first": math.nan, "end": now,
                   "done": now, "in_tok": -1, "out_tok": -1, "ok": False, "chunks": [], "text": None,
                   "error": f"session aborted: turn {failed_turn} failed", "first_out": math.nan,
                   "reasoning": False, "session": unit, "turn": turn}
            for c, v in row.items():
                cols[c].append(v)

        def over() -> bool:
            return duration is not None and clock() - base >= duration

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
        if slots:
            local = itertools.count() if cycle and dispenser is None else iter(share or [])
            taker = _Taker(dispenser, epoch) if dispenser is not None else None

            async def take() -> int | None:
                k = next(local, None)  # dealt with the call: the start asks the dispenser nothing
                if k is None and taker is not None:
                    return await taker.take()
                return k

            async def slot() -> None:
                while not over():
                    free = clock() - base
                    k = await take()
                    if k is None:
                        return
                    await wait_until(due[k % len(due)])
                    if over():
                        return
                    await run_unit(k, max(due[k % len(due)], free))

            await asyncio.gather(*(slot() for _ in range(slots)))
        else:
            tasks = []
            for k in share or []:
                await wait_until(due[k])
                if over():
                    break
                tasks.append(asyncio.create_task(run_unit(k, due[k])))
            await asyncio.gather(*tasks)
        stop.set()
        await prober
        cols["actor"] = [rank] * len(cols["index"])
        return {**cols, "loop_lag": lags, "start_late_s": max(late, 0.0), "cpu_s": time.process_time() - cpu0,
                "nice": os.getpriority(os.PRIO_PROCESS, 0),
                "affinity": sorted(os.sched_getaffinity(0)), "nice_failure": self._nice_failure}


def _count(value: object) -> int:
    return int(value) if isinstance(value, (int, float)) else -1


def _incomplete(tokens: bool, usage: bool, done: bool) -> str | None:
    """Why a 200 stream is not a complete answer, if it is not."""
    if not tokens:
        return "no token was streamed"
    missing = [what for what, seen in (("a usage chunk", usage), ("[DONE]", done)) if not seen]
    return f"the stream ended without {' and '.join(missing)}" if missing else None


async def _mark_sent(session: aiohttp.ClientSession, ctx: SimpleNamespace,
                     params: aiohttp.TraceRequestHeadersSentParams) -> None:
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
    prompt_lens: list[int | None] = field(default_factory=list)
    max_tokens: list[int | None] = field(default_factory=list)
    clock_offsets: list[tuple[float, float]] = field(default_factory=list)  # (offset, uncertainty) s per actor
    prompt_format: str = "token_ids"
    units: int = 0                      # requests (or sessions) made for the point
    prompt_texts: list[str | None] = field(default_factory=list)  # text prompts, to count a missing usage


class NativeBench:
    """The native client actors of one server configuration, kept warm between points."""

    def __init__(self, clients: int | str = "auto", max_clients: int = 8, cpus: float = 1.0,
                 timeout_s: float = 3600.0, max_send_lag_ms: float = stats.MAX_SEND_LAG_MS,
                 min_rate_fraction: float = stats.MIN_RATE_FRACTION,
                 max_loop_lag_ms: float = stats.MAX_LOOP_LAG_MS, cpu_ids: list[int] | None = None) -> None:
        self.setting, self.max_clients, self.cpus, self.timeout_s = clients, max_clients, cpus, timeout_s
        self.cpu_ids = cpu_ids  # bench.cpu_affinity: every actor runs on these CPUs
        self.guard = {"max_send_lag_ms": max_send_lag_ms, "min_rate_fraction": min_rate_fraction,
                      "max_loop_lag_ms": max_loop_lag_ms}
        self.actors: list[Any] = []
        self.nodes: list[str] = []
        self._starting: list[Any] = []
        self._dispenser: ActorHandle | None = None
        self._epoch = 0

    def _new_actor(self) -> Any:
        return NativeClient.options(  # type: ignore[attr-defined]  # a Ray actor class
            num_cpus=self.cpus, scheduling_strategy="SPREAD").remote(self.cpu_ids)

    def warm(self) -> None:
        """Start the first actor now, without waiting: its worker process starts while the server does."""
        if not self.actors and not self._starting:
            self._starting = [self._new_actor()]

    def _ensure(self, n: int) -> None:
        """At least n actors, each started and answering before the point's clock is set; actors that
        cannot be placed in 60 s (no node has `client_cpus` free) are given up."""
        fresh, self._starting = self._starting, []
        want = n - len(self.actors) - len(fresh)
        if want > 0:  # as many as the free CPUs hold now (one at least, to say why when none fits)
            room = int(ray.available_resources().get("CPU", 0.0) // self.cpus)
            for _ in range(min(want, room) if self.actors or fresh else max(1, min(want, room))):
                fresh.append(self._new_actor())
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
        """How many actors drive the point: --clients, bench.clients, or from the asked load; never more
        than the requests, nor than the --max-concurrency slots."""
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
        return _cap_clients(n, opts)

    @staticmethod
    def clock_offset(actor: ActorHandle, rounds: int = _CLOCK_ROUNDS) -> tuple[float, float]:
        """The actor's wall clock minus the driver's (s), from the ping-pong with the least round trip, and
        its uncertainty (half that round trip)."""
        best = (math.inf, 0.0)
        for _ in range(rounds):
            t1 = time.time()
            theirs = ray.get(actor.clock.remote())
            t2 = time.time()
            if t2 - t1 < best[0]:
                best = (t2 - t1, theirs - (t1 + t2) / 2)
        return best[1], best[0] / 2

    def _dispense(self, n: int, dealt: int) -> tuple[Any, int]:
        if self._dispenser is None:
            self._dispenser = ray.remote(num_cpus=0, max_restarts=0)(Dispenser).remote()
        self._epoch += 1
        ray.get(self._dispenser.reset.remote(self._epoch, n, dealt))
        return self._dispenser, self._epoch

    def submit(self, argv: list[str], base_url: str, model: str, num_prompts: int | None = None,
               clients: int | None = None) -> Job:
        opts = parse_load_options(argv)
        if num_prompts is not None:  # a warmup: that many requests (or sessions), never a duration
            opts = replace(opts.with_prompts(num_prompts), duration=None)
        opts, cycle = arrivals.for_duration(opts)
        model = opts.served_name or model
        n = _cap_clients(clients, opts) if clients else self.clients_for(opts)
        self._ensure(n)
        n = min(n, len(self.actors))
        reqs, spans, systems = _requests(opts)
        units = len(spans) if spans else len(reqs)
        bodies = [payload(r, opts, model) for r in reqs]
        due_arr = arrivals.due_times(units, opts)
        due = due_arr.tolist()
        url = base_url.rstrip("/") + opts.path
        conc = opts.max_concurrency
        actors = self.actors[:n]
        offsets = [self.clock_offset(a) for a in actors]
        shipped = ray.put(bodies)
        total = _UNBOUNDED if cycle else units
        dealt = min(conc, total) if conc and n > 1 else 0  # each slot's first request goes with its actor's call
        dispenser, epoch = self._dispense(total, dealt) if conc and n > 1 else (None, 0)
        # only a cycling closed loop is stopped by the clock: an open loop's requests are all due within it
        work = {"spans": spans, "systems": systems, "think_s": opts.multi_turn_think_time,
                "duration_s": opts.duration if cycle else None, "cycle": cycle}
        t0 = time.time() + _START_LEAD_S + sum(len(b) for b in bodies) / _SHIP_BYTES_PER_S + 0.002 * n
        refs = []
        shares = deal(units, n, dealt)
        for a, actor in enumerate(actors):
            share, slots = shares[a], slots_of(conc, n, a)
            refs.append(actor.run.remote(url, a, shipped, due, share, slots, t0 + offsets[a][0], self.timeout_s,
                                         opts.headers, dispenser, epoch, work))
        fmt = "token_ids" if reqs and all(isinstance(r.prompt, list) for r in reqs) else "text"
        return Job(refs, opts, model, n, arrivals.asked_rate(opts, due_arr), t0, self.nodes[:n],
                   prompt_lens=[r.prompt_len for r in reqs], max_tokens=[r.output_len for r in reqs],
                   clock_offsets=offsets, prompt_format=fmt, units=units,
                   prompt_texts=[r.prompt if isinstance(r.prompt, str) and not spans else None for r in reqs])

    def finish(self, job: Job, answers: list[dict[str, Any]]) -> dict[str, Any]:
        """The point's result (vLLM's field names), from the pooled samples of every actor."""
        samples = stats.pool(answers)
        opts = job.opts
        need_tokenizer = any(ok and (o is None or o <= 0) for ok, o in zip(samples["ok"], samples["out_tok"])) or \
            (any(t is not None for t in job.prompt_texts) and any(n is None or n < 0 for n in samples["in_tok"]))
        stats.settle(samples, job.prompt_lens, job.max_tokens, opts.ignore_eos,
                     tokenizer_for(opts) if need_tokenizer else None, job.prompt_texts)
        result: dict[str, Any] = {
            "date": datetime.now().strftime("%Y%m%d-%H%M%S"), "endpoint_type": opts.backend,
            "backend": opts.backend, "label": None, "model_id": job.model, "tokenizer_id": opts.tokenizer or job.model,
            **planned_prompts(opts, job.units),
            RATE: "inf" if math.isinf(opts.request_rate) else opts.request_rate,
            "burstiness": opts.burstiness, CONCURRENCY: opts.max_concurrency,
        }
        if opts.ramp_up_strategy:
            result.update(ramp_up_strategy=opts.ramp_up_strategy, ramp_up_start_rps=opts.ramp_up_start_rps,
                          ramp_up_end_rps=opts.ramp_up_end_rps)
        result.update(stats.point_metrics(samples, opts))
        sane.merge(result, sane.guarded("client_check", stats.client_check, samples, opts, job.rate, **self.guard))
        result.update(bench_backend="native", num_clients=job.clients, dataset_name=opts.dataset_name,
                      prompt_format=job.prompt_format, client_node_ips=",".join(job.nodes),
                      client_start_late_ms=1000 * max(a.get("start_late_s", 0.0) for a in answers),
                      start_time=job.started, end_time=job.started + result["duration"])
        result.update(_client_fields(answers, job.clock_offsets))
        result.update(_workload_fields(opts))
        return {"ok": True, "error": None, "result": result, "samples": samples, "output_tail": "",
                "duration_s": time.time() - job.started, "command": None}

    def close(self) -> None:
        for a in [*self.actors, *self._starting, *([self._dispenser] if self._dispenser is not None else [])]:
            with contextlib.suppress(Exception):
                ray.kill(a)
        self.actors, self.nodes, self._starting, self._dispenser = [], [], [], None


_UNBOUNDED = 2**62  # units a cycling closed loop may take: it stops at its duration


def slots_of(conc: int | None, n: int, a: int) -> int | None:
    """Actor `a`'s share of the --max-concurrency slots over `n` actors (None: an open loop)."""
    return conc // n + (1 if a < conc % n else 0) if conc else None


def deal(units: int, n: int, dealt: int) -> list[list[int]]:
    """The units each of `n` actors gets with its call: round robin, all of them, or with a dispenser
    (`dealt` > 0) only the first `dealt`, one for each slot (actor a's count is `slots_of(dealt, n, a)`)."""
    return [list(range(a, dealt or units, n)) for a in range(n)]


def _requests(opts: LoadOptions) -> tuple[list[Request], list[tuple[int, int]] | None, list[str | None] | None]:
    """The point's requests, and for multi-turn sessions the (first turn, turns) span and the system prompt of
    each session."""
    if opts.dataset_name != "multi_turn":
        return make_requests(opts), None, None
    conv = conversations(opts, tokenizer_for(opts))
    return [Request(m, o) for m, o in zip(conv.messages, conv.output_lens)], conv.spans, conv.systems


def planned_prompts(opts: LoadOptions, units: int) -> dict[str, int]:
    """`num_prompts` as asked (vLLM's field, which a swept `num_prompts` parameter matches) and, where a file
    with fewer usable requests (a short trace, --no-oversample) sends fewer, `num_prompts_sent`."""
    if 0 < units < opts.num_prompts:
        return {"num_prompts": opts.num_prompts, "num_prompts_sent": units}
    return {"num_prompts": opts.num_prompts}


def _cap_clients(n: int, opts: LoadOptions) -> int:
    """Never more actors than requests, nor than --max-concurrency slots (an actor needs one slot at least)."""
    n = min(n, opts.num_prompts)
    return max(1, min(n, opts.max_concurrency) if opts.max_concurrency else n)


def _workload_fields(opts: LoadOptions) -> dict[str, Any]:
    """What shaped the point's workload (docs/workloads.md): its duration bound, the trace's speed-up, the
    time series' bin, the multi-turn think time."""
    out: dict[str, Any] = {"duration_limit_s": opts.duration, "timeseries_interval_s": opts.timeseries_interval}
    if opts.dataset_name == "timed_trace":
        from raysweep.bench.trace import trace_report
        out.update(trace_speedup=opts.trace_speedup, trace_self_timed=opts.timed, **trace_report(opts))
    if opts.dataset_name == "multi_turn":
        out["multi_turn_think_time_s"] = opts.multi_turn_think_time
    return out


def _client_fields(answers: list[dict[str, Any]], offsets: list[tuple[float, float]]) -> dict[str, Any]:
    """The actors' priority, CPUs and clock offsets to the driver, over all actors."""
    nice = [a["nice"] for a in answers if a.get("nice") is not None]
    cpus = sorted({cpu_text(a["affinity"]) for a in answers if a.get("affinity")})
    failures = [a["nice_failure"] for a in answers if a.get("nice_failure")]
    cpu = [a["cpu_s"] for a in answers if a.get("cpu_s") is not None]
    return {"client_nice": max(nice) if nice else None, "client_cpu_affinity": ";".join(cpus) or None,
            "client_nice_lowering_failed": bool(failures), "client_cpu_s": sum(cpu) if cpu else None,
            "client_clock_offset_ms_max": 1000 * max((abs(o) for o, _ in offsets), default=0.0),
            "client_clock_offset_uncertainty_ms_max": 1000 * max((u for _, u in offsets), default=0.0)}

"""A streaming stand-in for `vllm serve` with known, fixed delays, on a bare asyncio protocol.

`/v1/completions` and `/v1/chat/completions` stream `max_tokens` chunks (one token each) as vLLM does:
the first after --ttft-delay, the next ones --itl-delay apart, then a usage chunk and `[DONE]`. With no
delays it is the zero-work stub of the client capacity benchmark. `/metrics` counts tokens and requests
in flight like vLLM's Prometheus endpoint; `/health`, `/v1/models` and the cache resets answer as vLLM's.
Flags bend the stream the way servers do: `--tokens-per-chunk` packs several tokens in one chunk,
`--short-by` stops that many tokens early (as an EOS would), `--tail-delay` waits before the usage chunk and
`[DONE]`, `--no-usage` and `--no-done` leave those events out, `--reasoning-chunks N` streams N chunks of
`reasoning_content` before the content (chat), `--exit-after N` dies at request N + 1 (a crashing server).
A chat prompt's token count is the words of every message.
`/timings` gives the server's own clock for every streamed request (from the arrival of its bytes to each
chunk written), the truth the client's measurements are checked against.

HTTP/1.1 with keep-alive and chunked streaming, written by hand so that nothing but the socket sits
between the request's arrival and the server's clock.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import time

REASONS = {200: "OK", 404: "Not Found", 500: "Internal Server Error"}


def non_default_args(argv: list[str]) -> dict:
    """The settings it started with, as vLLM logs them at its start (`non-default args: {...}`): every
    `--flag value` it was given (a JSON value read as such; a flag without a value is true)."""
    out: dict = {}
    i = 0
    while i < len(argv):
        if argv[i].startswith("--"):
            key, eq, value = argv[i][2:].partition("=")
            if not eq:
                has_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
                value, i = (argv[i + 1], i + 1) if has_value else ("true", i)
            try:
                out[key.replace("-", "_")] = json.loads(value)
            except ValueError:
                out[key.replace("-", "_")] = value
        i += 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?")
    ap.add_argument("--model", dest="model_opt")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--ttft-delay", type=float, default=0.0)
    ap.add_argument("--itl-delay", type=float, default=0.0)
    ap.add_argument("--slots", type=int, default=0, help="generate at most this many requests at once; the others "
                                                         "queue (latency grows with load, as a real server's)")
    ap.add_argument("--fail-every", type=int, default=0, help="answer HTTP 500 to every Nth request")
    ap.add_argument("--exit-after", type=int, default=0, help="die (exit code 3, an error line in the log) when "
                                                             "request N + 1 arrives, as a crashing server does")
    ap.add_argument("--tokens-per-chunk", type=int, default=1)
    ap.add_argument("--short-by", type=int, default=0, help="generate this many tokens fewer than asked")
    ap.add_argument("--tail-delay", type=float, default=0.0, help="seconds between the last token and the usage")
    ap.add_argument("--no-usage", action="store_true", help="stream no usage chunk")
    ap.add_argument("--no-done", action="store_true", help="end the stream without [DONE]")
    ap.add_argument("--reasoning-chunks", type=int, default=0, help="chat: stream this many chunks of "
                                                                      "reasoning_content before the content")
    ap.add_argument("--reuse-port", action="store_true", help="let several of these processes share the port")
    ap.add_argument("--headless", action="store_true", help="a multi-node rank > 0: no HTTP, it runs until stopped")
    args, _ = ap.parse_known_args()
    print(f"INFO [api_utils.py] non-default args: {non_default_args(sys.argv[1:])!r}", flush=True)
    if args.headless:
        print("standin: headless rank", flush=True)
        while True:
            time.sleep(3600)
    model = args.model_opt or args.model or "standin"
    state = {"running": 0, "prompt": 0, "generation": 0, "requests": 0}
    timings: list[dict] = []
    slots: list[asyncio.Semaphore] = []  # made inside the event loop

    def metrics_text() -> str:
        lab = f'{{engine="0",model_name="{model}"}}'
        return (f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{lab} {state['running']}\n"
                f"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{lab} 0\n"
                f"# TYPE vllm:kv_cache_usage_perc gauge\n"
                f"vllm:kv_cache_usage_perc{lab} {min(1.0, state['running'] / 64)}\n"
                f"# TYPE vllm:prompt_tokens counter\nvllm:prompt_tokens_total{lab} {state['prompt']}\n"
                f"# TYPE vllm:generation_tokens counter\nvllm:generation_tokens_total{lab} {state['generation']}\n"
                f"# TYPE vllm:num_preemptions counter\nvllm:num_preemptions_total{lab} 0\n"
                f"# TYPE vllm:prompt_tokens_by_source counter\nvllm:prompt_tokens_by_source_total"
                f'{{engine="0",model_name="{model}",source="local_compute"}} {state["prompt"]}\n')

    class Conn(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.t = transport
            self.buf = b""
            self.arrived = 0.0
            self.busy = False
            transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def data_received(self, data: bytes) -> None:
            if not self.buf:
                self.arrived = time.perf_counter()
            self.buf += data
            self._next()

        def _next(self) -> None:
            if self.busy:
                return
            head, sep, rest = self.buf.partition(b"\r\n\r\n")
            if not sep:
                return
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            length = 0
            for line in lines[1:]:
                k, _, v = line.partition(":")
                if k.strip().lower() == "content-length":
                    length = int(v.strip())
            if len(rest) < length:
                return
            body, self.buf = rest[:length], rest[length:]
            arrived, self.arrived = self.arrived, time.perf_counter()
            self.busy = True
            asyncio.get_running_loop().create_task(self._handle(method, path, body, arrived))

        def _reply(self, code: int, body: bytes, ctype: str = "application/json") -> None:
            self.t.write(f"HTTP/1.1 {code} {REASONS.get(code, 'OK')}\r\nContent-Type: {ctype}\r\n"
                         f"Content-Length: {len(body)}\r\n\r\n".encode() + body)

        async def _handle(self, method: str, path: str, body: bytes, arrived: float) -> None:
            try:
                if method == "GET" and path == "/health":
                    self._reply(200, b"")
                elif method == "GET" and path == "/v1/models":
                    self._reply(200, json.dumps({"object": "list",
                                                 "data": [{"id": model, "object": "model"}]}).encode())
                elif method == "GET" and path == "/metrics":
                    self._reply(200, metrics_text().encode(), "text/plain")
                elif method == "GET" and path == "/timings":
                    self._reply(200, json.dumps(timings).encode())
                elif method == "POST" and path.startswith(("/reset_prefix_cache", "/reset_mm_cache",
                                                           "/reset_encoder_cache")):
                    self._reply(200, b'{"success": true}')
                elif method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
                    await self._stream(json.loads(body), arrived)
                else:
                    self._reply(404, b'{"detail": "not found"}')
            finally:
                self.busy = False
                if self.buf:
                    self._next()

        async def _stream(self, body: dict, arrived: float) -> None:
            state["requests"] += 1
            if args.exit_after and state["requests"] > args.exit_after:
                print(f"RuntimeError: exiting at request {state['requests']}, on purpose", flush=True)
                os._exit(3)
            if args.fail_every and state["requests"] % args.fail_every == 0:
                self._reply(500, b'{"error": "failing on purpose"}')
                return
            chat = "messages" in body
            prompt = body.get("prompt")
            if chat:  # every message counts (a multi-turn request carries the conversation so far)
                prompt = " ".join(_text(m.get("content")) for m in body["messages"])
            n_in = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
            n_out = max(int(body.get("max_tokens") or body.get("max_completion_tokens") or 16) - args.short_by, 1)
            n_chunks = -(-n_out // args.tokens_per_chunk)
            data = (b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n' if chat
                    else b'data: {"choices":[{"index":0,"text":"x"}]}\n\n')
            chunk = b"%x\r\n%s\r\n" % (len(data), data)
            think = b'data: {"choices":[{"index":0,"delta":{"reasoning_content":"r"}}]}\n\n'
            thinking = min(args.reasoning_chunks if chat else 0, n_chunks - 1)
            chunks = [b"%x\r\n%s\r\n" % (len(think), think)] * thinking + [chunk] * (n_chunks - thinking)
            usage = {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}
            tail_data = (b"" if args.no_usage else b"data: " + json.dumps({"choices": [], "usage": usage}).encode()
                         + b"\n\n") + (b"" if args.no_done else b"data: [DONE]\n\n")
            tail = (b"%x\r\n%s\r\n" % (len(tail_data), tail_data) if tail_data else b"") + b"0\r\n\r\n"
            head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            state["running"] += 1
            state["prompt"] += n_in
            try:
                if args.ttft_delay == 0 and args.itl_delay == 0 and args.tail_delay == 0:  # zero work: one write
                    self.t.write(head + b"".join(chunks) + tail)
                    return
                self.t.write(head)
                marks = []
                if args.slots:
                    if not slots:
                        slots.append(asyncio.Semaphore(args.slots))
                    await slots[0].acquire()
                try:
                    await self._generate(chunks, marks)
                finally:
                    if args.slots:
                        slots[0].release()
                last = time.perf_counter()
                await asyncio.sleep(args.tail_delay)
                self.t.write(tail)
                timings.append({"ttft": marks[0] - arrived, "itls": [b - a for a, b in zip(marks, marks[1:])],
                                "e2el": last - arrived})
            finally:
                state["running"] -= 1
                state["generation"] += n_out

        async def _generate(self, chunks: list[bytes], marks: list[float]) -> None:
            await asyncio.sleep(args.ttft_delay)
            for i, chunk in enumerate(chunks):
                if i:
                    await asyncio.sleep(args.itl_delay)
                self.t.write(chunk)
                marks.append(time.perf_counter())

    async def serve() -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if args.reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((args.host, args.port))
        server = await asyncio.get_running_loop().create_server(Conn, sock=sock, backlog=4096)
        print(f"standin: listening on {args.host}:{args.port}", flush=True)
        await server.serve_forever()

    try:
        import uvloop
        uvloop.run(serve())
    except ImportError:
        asyncio.run(serve())


def _text(content: object) -> str:
    """A chat message's text: a string, or content parts as vllm bench serve sends them."""
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content or "")


if __name__ == "__main__":
    main()

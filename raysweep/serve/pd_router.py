"""raysweep's router in front of a prefill/decode deployment: every completion goes first to a prefill server
with `max_tokens` 1, which computes the prompt's KV and hands it to the connector, then to a decode server,
whose answer (streamed or not) is passed back to the client unchanged.

Servers of a role are taken in turn, each the one with the fewest requests in flight. Where the prefill
answer carries `kv_transfer_params` (NIXL and the other connectors that pull the KV by reference), the decode
request gets them; `send_kv_params` also asks the prefill server for them (`do_remote_decode`), as NIXL
needs. A role that fails a request (an HTTP error, a refused connection) is answered as HTTP 502 naming the
role and server, and counted per role (`/pd/stats`), so that a point's failures say which role failed.

`/health` answers 200 only while every server of both roles does; `/v1/models` is the decode servers';
`/reset_prefix_cache` is sent to every server; `/metrics` gives the router's own counters.

Run it as `python -m raysweep.serve.pd_router --prefill URL [--prefill URL ...] --decode URL --port P`, or in a
thread of the caller (`RouterThread`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

__all__ = ["PDRouter", "RoleServer", "RouterThread", "main"]

log = logging.getLogger(__name__)

COMPLETION_PATHS = ("/v1/completions", "/v1/chat/completions")
_KV_ASK = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None, "remote_block_ids": None,
           "remote_host": None, "remote_port": None}


@dataclass
class RoleServer:
    """One server of a role, as the router sees it."""

    role: str
    url: str
    in_flight: int = 0
    requests: int = 0
    failures: int = 0


@dataclass
class PDRouter:
    """The router's state and its aiohttp application (`app()`)."""

    prefill: list[RoleServer]
    decode: list[RoleServer]
    send_kv_params: bool = False
    timeout_s: float = 3600.0
    _turn: dict[str, int] = field(default_factory=lambda: {"prefill": 0, "decode": 0})
    _session: aiohttp.ClientSession | None = None

    @classmethod
    def of(cls, prefill: Sequence[str], decode: Sequence[str], send_kv_params: bool = False) -> PDRouter:
        if not prefill or not decode:
            raise ValueError("a P/D router needs at least one prefill and one decode server")
        return cls([RoleServer("prefill", u.rstrip("/")) for u in prefill],
                   [RoleServer("decode", u.rstrip("/")) for u in decode], send_kv_params)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 20)
        for path in COMPLETION_PATHS:
            app.router.add_post(path, self._complete)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/pd/stats", self._stats)
        app.router.add_post("/reset_prefix_cache", self._reset)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, _app: web.Application) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                                              connector=aiohttp.TCPConnector(limit=0))

    async def _close(self, _app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "the router's application has not started"
        return self._session

    def _pick(self, role: str) -> RoleServer:
        """The server of `role` with the fewest requests in flight, ties taken in turn."""
        servers = self.prefill if role == "prefill" else self.decode
        start = self._turn[role]
        self._turn[role] = (start + 1) % len(servers)
        order = servers[start:] + servers[:start]
        return min(order, key=lambda s: s.in_flight)

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for s in self.prefill + self.decode:
            role = out.setdefault(s.role, {"requests": 0, "failures": 0, "servers": {}})
            role["requests"] += s.requests
            role["failures"] += s.failures
            role["servers"][s.url] = {"requests": s.requests, "failures": s.failures}
        return out

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        first = {**body, "max_tokens": 1, "stream": False}
        first.pop("stream_options", None)
        if "max_completion_tokens" in first:
            first["max_completion_tokens"] = 1
        if self.send_kv_params:
            first["kv_transfer_params"] = dict(_KV_ASK)
        pre = self._pick("prefill")
        pre.in_flight, pre.requests = pre.in_flight + 1, pre.requests + 1
        try:
            async with self.session.post(pre.url + request.path, json=first) as resp:
                text = await resp.text()
                if resp.status != 200:
                    pre.failures += 1
                    return _failed("prefill", pre.url, f"HTTP {resp.status}: {text[:300]}")
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            pre.failures += 1
            return _failed("prefill", pre.url, f"{type(exc).__name__}: {exc}")
        finally:
            pre.in_flight -= 1
        second = dict(body)
        params = _kv_params(text)
        if params is not None:
            second["kv_transfer_params"] = params
        return await self._decode(request, second)

    async def _decode(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        dec = self._pick("decode")
        dec.in_flight, dec.requests = dec.in_flight + 1, dec.requests + 1
        out: web.StreamResponse | None = None
        try:
            async with self.session.post(dec.url + request.path, json=body) as resp:
                if resp.status != 200:
                    dec.failures += 1
                    return _failed("decode", dec.url, f"HTTP {resp.status}: {(await resp.text())[:300]}")
                out = web.StreamResponse(status=200, headers={
                    "Content-Type": resp.headers.get("Content-Type", "application/json")})
                await out.prepare(request)
                async for chunk in resp.content.iter_any():
                    await out.write(chunk)
                await out.write_eof()
                return out
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            dec.failures += 1
            if out is not None:  # the answer had begun: the client sees it cut short
                log.warning("decode server %s failed mid-answer: %s", dec.url, exc)
                return out
            return _failed("decode", dec.url, f"{type(exc).__name__}: {exc}")
        finally:
            dec.in_flight -= 1

    async def _each(self, method: str, path: str) -> list[tuple[RoleServer, int, str]]:
        async def one(s: RoleServer) -> tuple[RoleServer, int, str]:
            try:
                async with self.session.request(method, s.url + path,
                                                timeout=aiohttp.ClientTimeout(total=30)) as resp:
                    return s, resp.status, await resp.text()
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                return s, 0, f"{type(exc).__name__}: {exc}"

        return list(await asyncio.gather(*(one(s) for s in self.prefill + self.decode)))

    async def _health(self, _request: web.Request) -> web.Response:
        bad = [f"{s.role} {s.url}: {'HTTP ' + str(code) if code else text}"
               for s, code, text in await self._each("GET", "/health") if code != 200]
        return web.Response(status=503 if bad else 200, text="; ".join(bad))

    async def _reset(self, _request: web.Request) -> web.Response:
        answers = await self._each("POST", "/reset_prefix_cache")
        bad = [f"{s.role} {s.url}: HTTP {code}" for s, code, _ in answers if code != 200]
        return web.json_response({"success": not bad, "failed": bad}, status=500 if bad else 200)

    async def _models(self, _request: web.Request) -> web.Response:
        dec = self.decode[0]
        try:
            async with self.session.get(dec.url + "/v1/models") as resp:
                return web.Response(status=resp.status, text=await resp.text(), content_type="application/json")
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            return _failed("decode", dec.url, f"{type(exc).__name__}: {exc}")

    async def _metrics(self, _request: web.Request) -> web.Response:
        lines = ["# TYPE raysweep_pd_requests_total counter", "# TYPE raysweep_pd_failures_total counter"]
        for s in self.prefill + self.decode:
            lab = f'{{role="{s.role}",server="{s.url}"}}'
            lines += [f"raysweep_pd_requests_total{lab} {s.requests}", f"raysweep_pd_failures_total{lab} {s.failures}"]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def _stats(self, _request: web.Request) -> web.Response:
        return web.json_response(self.stats())


def _kv_params(text: str) -> Any:
    """The `kv_transfer_params` of a prefill server's answer (None when it has none or is no JSON)."""
    try:
        return json.loads(text).get("kv_transfer_params")
    except (ValueError, AttributeError):
        return None


def _failed(role: str, url: str, why: str) -> web.Response:
    log.warning("%s server %s failed a request: %s", role, url, why)
    return web.json_response({"error": {"message": f"{role} server {url} failed: {why}", "type": "pd_role_failed",
                                        "role": role}}, status=502)


class RouterThread:
    """The router serving on `host` (a free port) in a thread of this process, until `stop()`."""

    def __init__(self, router: PDRouter, host: str = "127.0.0.1", port: int = 0) -> None:
        self.router = router
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.host, self.port = host, port
        self._thread = threading.Thread(target=self._serve, name="pd-router", daemon=True)
        self._thread.start()
        self._ready.wait(60)
        if self._error is not None:
            raise RuntimeError(f"the P/D router did not start: {self._error}")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._start())
        except BaseException as exc:  # reported by the constructor
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()

    async def _start(self) -> None:
        self._runner = web.AppRunner(self.router.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])  # the port bound (a free one when asked for 0)

    def stop(self) -> None:
        if self._runner is not None and self._loop.is_running():
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()

    def __enter__(self) -> RouterThread:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m raysweep.serve.pd_router", description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefill", action="append", required=True, help="a prefill server's base URL (repeatable)")
    ap.add_argument("--decode", action="append", required=True, help="a decode server's base URL (repeatable)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--send-kv-params", action="store_true", help="ask the prefill server for kv_transfer_params "
                                                                  "(do_remote_decode), as NIXL needs")
    args = ap.parse_args(argv)
    router = PDRouter.of(args.prefill, args.decode, args.send_kv_params)
    web.run_app(router.app(), host=args.host, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()

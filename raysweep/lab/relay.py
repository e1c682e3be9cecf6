"""A slow or lossy link where the kernel has no `netem`: a small TCP relay that forwards every connection to a
target after a delay per chunk each way, drops a share of the connections (reset once accepted; never the
first `--spare`) and cuts answers mid-stream: a share of their chunks at random (`--cut`), or every Nth chunk
(`--cut-every`, so that a test knows every answer-heavy stretch of traffic loses some).

    python -m raysweep.lab.relay --listen 10.77.0.4:9000 --to 10.77.0.3:8000 --delay-ms 20 --drop 0.1 --cut 0.02

Run it inside a lab host (`raysweep lab exec`) and point a campaign's `serve.url` at it: the clients' traffic
then crosses two links and the relay. It counts the connections it forwarded and dropped on stdout when it
ends (SIGTERM or SIGINT).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import signal
import socket
import struct
from collections.abc import Callable

__all__ = ["main", "relay"]


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float,
                cut: Callable[[], bool] | None = None) -> None:
    try:
        while data := await reader.read(65536):
            if delay_s:
                await asyncio.sleep(delay_s)
            if cut is not None and cut():
                _reset(writer)       # the link lost the connection in the middle of an answer
                return
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset, as a link that lost the connection would leave it."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.close()


async def relay(listen: tuple[str, int], to: tuple[str, int], delay_ms: float, drop: float, seed: int,
                spare: int = 0, cut: float = 0.0, cut_every: int = 0) -> None:
    rng = random.Random(seed)
    counts = {"forwarded": 0, "dropped": 0, "cut": 0, "answer_chunks": 0}

    def cut_now() -> bool:
        counts["answer_chunks"] += 1
        if (cut and rng.random() < cut) or (cut_every and counts["answer_chunks"] % cut_every == 0):
            counts["cut"] += 1
            return True
        return False

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen = counts["forwarded"] + counts["dropped"]
        if seen >= spare and rng.random() < drop:
            counts["dropped"] += 1
            _reset(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*to)
        except OSError:
            _reset(writer)
            return
        counts["forwarded"] += 1
        await asyncio.gather(_pipe(reader, up_writer, delay_ms / 1000),
                             _pipe(up_reader, writer, delay_ms / 1000, cut_now))

    server = await asyncio.start_server(handle, *listen, reuse_address=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"relay {listen[0]}:{listen[1]} -> {to[0]}:{to[1]}, delay {delay_ms:g} ms, drop {drop:g}", flush=True)
    async with server:
        await stop.wait()
    print(f"relay: {counts['forwarded']} forwarded, {counts['dropped']} dropped, {counts['cut']} cut", flush=True)


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--listen", required=True, type=_addr, help="HOST:PORT to listen on")
    ap.add_argument("--to", required=True, type=_addr, help="HOST:PORT to forward to")
    ap.add_argument("--delay-ms", type=float, default=0.0, help="delay per chunk, each way")
    ap.add_argument("--drop", type=float, default=0.0, help="share of connections reset when accepted (0 to 1)")
    ap.add_argument("--cut", type=float, default=0.0, help="chance, per chunk of an answer, that the connection is "
                    "reset there (a request lost mid-stream; clients that keep connections open see this)")
    ap.add_argument("--cut-every", type=int, default=0, help="reset the connection at every Nth chunk of the "
                    "answers (counted across connections): every stretch of N answers loses at least one")
    ap.add_argument("--spare", type=int, default=0, help="never drop the first N connections (a health check)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    asyncio.run(relay(args.listen, args.to, args.delay_ms, args.drop, args.seed, args.spare, args.cut,
                      args.cut_every))


if __name__ == "__main__":
    main()

"""What the benchmark scripts share: the loopback environment, and starting and stopping a server process
(its own process group, ready when /health answers, stopped by SIGTERM then SIGKILL to that group)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

# Ray and vLLM on loopback, Ray's token auth and usage stats off, vLLM's cache-reset endpoints on
ENV = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled",
       "RAY_USAGE_STATS_ENABLED": "0", "VLLM_HOST_IP": "127.0.0.1", "VLLM_CPU_KVCACHE_SPACE": "1",
       "VLLM_SERVER_DEV_MODE": "1"}
os.environ.update({k: ENV[k] for k in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_AUTH_MODE",
                                       "RAY_USAGE_STATS_ENABLED", "VLLM_HOST_IP")})


def start_server(argv: list[str], url: str, timeout: float, log: Path) -> subprocess.Popen:
    """Start a server and wait until `url`/health answers 200."""
    proc = subprocess.Popen(argv, env=ENV, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{argv[0]} exited with {proc.returncode}; see {log}")
        try:
            if urllib.request.urlopen(url + "/health", timeout=1).status == 200:
                return proc
        except OSError:
            time.sleep(0.5)
    stop_server(proc)
    raise RuntimeError(f"{argv[0]} not ready after {timeout:.0f} s; see {log}")


def stop_server(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL, to the server's own process group."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(30)
            return
        except subprocess.TimeoutExpired:
            continue

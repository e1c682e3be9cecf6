"""Test session set-up: Ray and vLLM stay on loopback, Ray's token auth is off, usage stats off.

These variables must be set before anything starts Ray or vLLM, so they are set at import time.
"""

from __future__ import annotations

import os

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_AUTH_MODE"] = "disabled"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ["VLLM_HOST_IP"] = "127.0.0.1"
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

"""A server start as data: its phases, read from the server's own log.

`vllm serve` logs each step of its start with a time stamp (to the second, the node's local time) and
reports the length of several of them itself. `phases` reads them into one record per start:

- `startup_s`: launch to ready (`/health` and `/v1/models` answer), raysweep's clock;
- `startup_imports_s`: launch to the server's first log line (Python and vLLM imports), log time stamps;
- `startup_process_s`: first log line to the engine's start (the configuration, the engine process and its
  imports), log time stamps;
- `startup_engine_s`: engine start to loading the model (engine and worker processes, distributed set-up);
- `startup_weights_s`: loading the weights, vLLM's own figure (`Model loading took`, `Loading weights took`);
- `startup_kv_cache_s`: memory profiling, KV cache, compilation, graph capture and warm-up together, vLLM's
  `init engine (...) took`; inside it `startup_compile_s` (`compilation: X s`, `torch.compile took`; on the
  CPU build, which compiles while it warms up, the time stamps of `Warming up model for the compilation`
  and `Warming up done`),
  `startup_graph_capture_s` (`Graph capturing finished in`), `startup_memory_profiling_s`;
- `startup_api_s`: the engine ready to the API ready (routes, the HTTP server, raysweep's readiness poll).

A field the log does not give (an eager start compiles nothing, a CPU build captures no graph) is absent.
Time stamps count whole seconds, so the fields read from them are +-1 s; vLLM's own figures are exact.
`summarize` gives the medians per configuration for `status`, the report and the results.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["PHASES", "by_config", "phases", "report_section", "start_rows", "summarize", "table_rows"]

PHASES = ("startup_s", "startup_imports_s", "startup_process_s", "startup_engine_s", "startup_weights_s",
          "startup_kv_cache_s", "startup_compile_s", "startup_graph_capture_s", "startup_memory_profiling_s",
          "startup_api_s", "startup_cache_mb")

_STAMP = re.compile(r"\b(?:INFO|WARNING|DEBUG|ERROR)\s+(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)\b")
_MARKS = {  # the first line of each step
    "engine": re.compile(r"Initializing a V1 LLM engine"),
    "load": re.compile(r"Starting to load model"),
    "ready": re.compile(r"init engine \(profile, create kv cache, warmup model\) took"),
    "listen": re.compile(r"Starting vLLM server on"),
    "warmup": re.compile(r"Warming up model for the compilation"),  # the CPU build compiles while warming up
    "warmed": re.compile(r"Warming up done"),
}
_FIGURES = {  # vLLM's own lengths, in seconds
    "startup_weights_s": re.compile(r"Model loading took [0-9.]+ GiB memory and ([0-9.]+) seconds"),
    "startup_kv_cache_s": re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+) s"),
    "startup_compile_s": re.compile(r"init engine \(profile, create kv cache, warmup model\) took [0-9.]+ s "
                                    r"\(compilation: ([0-9.]+) s|torch\.compile took ([0-9.]+) s in total"),
    "startup_graph_capture_s": re.compile(r"Graph capturing finished in ([0-9.]+) secs"),
    "startup_memory_profiling_s": re.compile(r"Memory profiling takes ([0-9.]+) seconds"),
}
_WEIGHTS_ONLY = (re.compile(r"Loading weights took ([0-9.]+) seconds"),  # without "Model loading took":
                 re.compile(r"Initializing model took ([0-9.]+) seconds"))  # the CPU build, dummy weights


def _stamp(line: str, year: int) -> float | None:
    m = _STAMP.search(line)
    if m is None:
        return None
    month, day, hh, mm, ss = (int(g) for g in m.groups())
    try:
        return time.mktime((year, month, day, hh, mm, ss, 0, 0, -1))
    except (OverflowError, ValueError):
        return None


def _figure(pattern: re.Pattern[str], text: str) -> float | None:
    m = pattern.search(text)
    if m is None:
        return None
    return float(next(g for g in m.groups() if g is not None))


def phases(log_text: str, started_at: float | None = None, ready_at: float | None = None) -> dict[str, float]:
    """The phases of one server start from its log (see the module docstring); `started_at` and `ready_at`
    (epoch seconds, raysweep's launch and readiness) give the total and anchor the log's time stamps, which
    are the node's local time (assumed to be this machine's time zone; stamps outside the start are left out)."""
    out: dict[str, float] = {}
    if started_at is not None and ready_at is not None and ready_at >= started_at:
        out["startup_s"] = ready_at - started_at
    for key, pattern in _FIGURES.items():
        value = _figure(pattern, log_text)
        if value is not None:
            out[key] = value
    for pattern in _WEIGHTS_ONLY:
        if "startup_weights_s" not in out and (value := _figure(pattern, log_text)) is not None:
            out["startup_weights_s"] = value
    year = time.localtime(started_at if started_at is not None else time.time()).tm_year
    marks: dict[str, float] = {}
    for line in log_text.splitlines():
        if "first" not in marks and (first := _stamp(line, year)) is not None:
            marks["first"] = first
        for name, pattern in _MARKS.items():
            if name not in marks and pattern.search(line) and (at := _stamp(line, year)) is not None:
                marks[name] = at
    if started_at is None:
        return out
    end = ready_at if ready_at is not None else float("inf")
    marks = {k: v for k, v in marks.items() if started_at - 1 <= v <= end + 1}  # another zone, another start
    if "first" in marks:
        out["startup_imports_s"] = max(0.0, marks["first"] - started_at)
    if "engine" in marks:
        out["startup_process_s"] = max(0.0, marks["engine"] - marks.get("first", started_at))
        if "load" in marks:
            out["startup_engine_s"] = max(0.0, marks["load"] - marks["engine"])
    if "startup_compile_s" not in out and "warmup" in marks and "warmed" in marks:
        out["startup_compile_s"] = max(0.0, marks["warmed"] - marks["warmup"])
    if "ready" in marks and ready_at is not None:
        out["startup_api_s"] = max(0.0, ready_at - marks["ready"])
    return out


def summarize(starts: Iterable[dict[str, Any]]) -> dict[str, float]:
    """The median of each phase over several starts (of one configuration); a phase no start has is absent."""
    starts = list(starts)
    out: dict[str, float] = {}
    for key in PHASES:
        values = [float(s[key]) for s in starts if isinstance(s.get(key), (int, float))]
        if values:
            out[key] = statistics.median(values)
    return out


_LABELS = {"startup_s": "ready", "startup_imports_s": "imports", "startup_process_s": "process",
           "startup_engine_s": "engine", "startup_weights_s": "weights", "startup_kv_cache_s": "profile+KV+compile",
           "startup_compile_s": "compile", "startup_graph_capture_s": "graphs",
           "startup_memory_profiling_s": "mem profile", "startup_api_s": "API", "startup_cache_mb": "cache MB"}


def by_config(servers: Iterable[Any]) -> dict[str, tuple[int, dict[str, float], str]]:
    """Per configuration (serve id) its recorded starts: how many, the median of each phase, and what they
    did with compilation (`2 cold, 1 warm`: see `raysweep.serve.caches.compile_cache_state`)."""
    import json
    from collections import Counter

    starts: dict[str, list[dict[str, Any]]] = {}
    for s in servers:
        if getattr(s, "startup", None):
            starts.setdefault(s.serve_id, []).append(json.loads(s.startup))
    out = {}
    for sid, rows in starts.items():
        states = Counter(r.get("compile_cache") for r in rows if r.get("compile_cache"))
        out[sid] = (len(rows), summarize(rows), ", ".join(f"{n} {state}" for state, n in sorted(states.items())))
    return out


def table_rows(servers: Iterable[Any]) -> tuple[list[str], list[list[str]]]:
    """The header and rows of the per-configuration table of starts (status, the report)."""
    per = by_config(servers)
    keys = [k for k in PHASES if any(k in phases_ for _, phases_, _ in per.values())]
    header = ["server config", "starts", "compilation", *(_LABELS[k] + ("" if k.endswith("_mb") else " (s)")
                                                         for k in keys)]
    rows = [[sid, str(n), states or "-", *(f"{p[k]:.1f}" if k in p else "" for k in keys)]
            for sid, (n, p, states) in sorted(per.items())]
    return header, rows


def start_rows(servers: Iterable[Any]) -> list[list[str]]:
    """One row per recorded start, in order: server, configuration, compilation (warm, cold, none), launch to
    ready, the cache's size and where it is."""
    import json

    rows = []
    for s in sorted((s for s in servers if getattr(s, "startup", None)), key=lambda s: s.started_at):
        r = json.loads(s.startup)
        rows.append([s.server_id, s.serve_id, r.get("compile_cache") or "-",
                     f"{r['startup_s']:.1f}" if "startup_s" in r else "",
                     f"{r['startup_cache_mb']:.1f}" if "startup_cache_mb" in r else "", r.get("cache_dir") or ""])
    return rows


def report_section(servers: Sequence[Any]) -> str | None:
    """The report's Server starts section: per configuration the median phases of its starts; None when no
    start recorded any. `servers`: the ledger's server rows (`Ledger.servers`)."""
    header, rows = table_rows(servers)
    if not rows:
        return None
    each = start_rows(servers)
    warm = sum(r[2] == "warm" for r in each)
    return ("<p>Medians over each configuration's starts, from the server's own log: launch to ready, Python "
            "imports, the engine process, the weights, memory profiling with the KV cache, compilation and graph "
            "capture (vLLM's own figures), and the API. Log time stamps count whole seconds (+-1 s). Compilation: "
            "<em>warm</em> starts loaded compiled graphs from the campaign's shared cache, <em>recompiled</em> ones "
            "found them but vLLM could not load them and compiled again with the cached kernels, <em>cold</em> "
            "ones compiled, <em>none</em> compiled nothing (eager).</p>" + _html_table(header, rows)
            + f"<p>{len(each)} start(s), {warm} warm:</p>"
            + _html_table(["server", "server config", "compilation", "ready (s)", "cache MB", "cache"], each))


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    import html

    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

"""Why a server exited before it was ready: the first error line of its own log.

vLLM prints the exception that stopped it (`ValueError: ...`) tens of lines above the traceback that ends
its log ("RuntimeError: Engine core initialization failed. See root cause above"). `root_cause` reads a
log from the top and returns the first line that says what went wrong:

- argparse's message (`vllm serve: error: unrecognized arguments: --max-num-seqz 4`): kind `argument`;
- an out-of-memory line (`torch.OutOfMemoryError: ...`, `... out of memory ...`, the kernel's OOM kill):
  kind `oom`;
- the first exception line of a traceback (`ValueError: ...`; a pydantic `ValidationError` with the
  line that says which value is wrong): kind `argument` for a configuration's validation error, else
  `exception`.

Lines vLLM logs below ERROR (a warning that quotes an exception it recovered from), the wrappers that
only point up ("See root cause above", "Engine core initialization failed") and raysweep's own notes in the
log (`# raysweep: COMMAND` at its top, whose arguments may say anything) are skipped. A start that
fails on an argument fails the same way every time: `deterministic` says so, and the driver does not try
it again (see `live_server`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = ["RootCause", "deterministic", "pick_cause", "root_cause", "same_cause"]

# vLLM's per-process prefix and its logger's prefix: `(EngineCore_DP0 pid=12) ERROR 11-28 14:00:00 [core.py:7] `
_PROC = re.compile(r"^\((?:[\w.-]+ )?pid=\d+\)\s?")
_LOG = re.compile(r"^(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+\[[^\]]*\] ?")
_ARGPARSE = re.compile(r"^[\w./ -]*: error: (?P<msg>.+)$")
_EXC = re.compile(r"^(?P<name>(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Failure))(?::\s*(?P<msg>.*))?$")
_OOM = re.compile(r"out of memory|OutOfMemoryError|Cannot allocate memory|oom-kill|Killed process", re.IGNORECASE)
_POINTERS = ("see root cause above", "engine core initialization failed", "failed core proc",
             "engine process failed to start")
_VALIDATION = ("ValidationError",)  # pydantic: a configuration value refused (vLLM's config classes)
_MAX = 400
# exceptions a start raises from its own arguments, files and code: the same command raises them again, so the
# start is not tried again (a memory shortage aside: it may depend on what else the machine runs)
_SAME_EVERY_TIME = ("ValueError", "TypeError", "AssertionError", "NotImplementedError", "KeyError", "AttributeError",
                    "ImportError", "ModuleNotFoundError", "IndexError", "FileNotFoundError", "NotADirectoryError",
                    "IsADirectoryError", "PermissionError", "SyntaxError")
# what a rank says when another one failed first: the connection to it lost, a timeout waiting for it
_KNOCK_ON = re.compile(r"connect|timed? ?out|timeout|broken pipe|reset by peer|eof|closed|shutdown|terminat",
                       re.IGNORECASE)
_OURS = "# raysweep:"  # what raysweep writes into the log (the command on its first line), never the cause


@dataclass(frozen=True)
class RootCause:
    """The line that says why (as written, without vLLM's log prefix, at most 400 characters), its kind
    (`argument`, `oom`, `exception`) and its 1-based line number in the log."""

    line: str
    kind: str
    lineno: int

    @property
    def deterministic(self) -> bool:
        """An argument error, or an exception the start's own arguments, files or code raise (`ValueError`,
        `AssertionError`, ...; not one about memory): the same command fails the same way every time."""
        return deterministic(self.kind, self.line)


def deterministic(kind: str, line: str) -> bool:
    """Whether a root cause of this kind and line fails the same command the same way every time."""
    if kind == "argument":
        return True
    m = _EXC.match(line)
    if kind != "exception" or m is None or _OOM.search(line) or "memory" in line.lower():
        return False
    return m.group("name").rsplit(".", 1)[-1] in _SAME_EVERY_TIME


def pick_cause(causes: list[dict[str, Any]], exited: int | None = None) -> dict[str, Any] | None:
    """Of the root causes found in every rank's log ({line, kind, rank, ...}), the one that says why the start
    failed: an argument error or out-of-memory first, then an exception that is not another rank's failure seen
    from afar (a connection lost, a timeout), then the rank that exited, then the lowest rank."""
    def order(c: dict[str, Any]) -> tuple[int, bool, int]:
        weight = 0 if c.get("kind") in ("argument", "oom") else 2 if _KNOCK_ON.search(str(c.get("line"))) else 1
        return weight, c.get("rank") != exited, int(c.get("rank") or 0)

    return min(causes, key=order) if causes else None


def _strip(line: str) -> tuple[str, str | None]:
    """The line without vLLM's prefixes, and its log level (None for a raw line, e.g. a traceback on stderr)."""
    line = _PROC.sub("", line.rstrip("\n"))
    m = _LOG.match(line)
    if m is None:
        return line, None
    return line[m.end():], m.group(1)


def _cut(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX else text[: _MAX - 3] + "..."


def root_cause(log: str) -> RootCause | None:
    """The first error line of a server's log (see the module doc), or None when it has none."""
    lines = [_strip(raw) for raw in log.splitlines()]
    for i, (line, level) in enumerate(lines):
        if level in ("DEBUG", "INFO", "WARNING", "WARN") or line.startswith(_OURS):
            continue
        if (m := _ARGPARSE.match(line)) is not None and not line.startswith((" ", "\t")):
            return RootCause(_cut(line), "argument", i + 1)
        if _OOM.search(line) and not line.startswith((" ", "\t", "File ")):
            return RootCause(_cut(line), "oom", i + 1)
        m = _EXC.match(line)
        if m is None or any(p in line.lower() for p in _POINTERS):
            continue
        name = m.group("name")
        if name.rsplit(".", 1)[-1] in _VALIDATION:
            detail = [t.strip() for t, _ in lines[i + 1: i + 4] if t.strip() and not t.strip().startswith("For ")]
            return RootCause(_cut(" ".join([line, *detail[:2]])), "argument", i + 1)
        return RootCause(_cut(line), "exception", i + 1)
    return None


def same_cause(a: str | None, b: str | None) -> bool:
    """Two root-cause lines say the same, numbers aside (a port, a pid, an address may differ between starts)."""
    if not a or not b:
        return False
    def norm(s: str) -> str:
        return re.sub(r"0x[0-9a-f]+|\d+", "N", s.lower())
    return norm(a) == norm(b)

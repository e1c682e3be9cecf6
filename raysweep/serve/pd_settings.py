"""The settings each server of a P/D deployment started with, and the differences between two deployments:
pure functions of a server's log and of the recorded settings, without Ray, so that the readers of a finished
campaign (`raysweep compare`) use them without starting it. `raysweep.serve.pd` reads the logs."""

from __future__ import annotations

import ast
import re
from typing import Any

_ARGS_LINE = re.compile(r"non-default args: (\{.*\})\s*$", re.M)
# where a server runs and what raysweep gives each server of its own: never a difference between deployments
_OWN_ARGS = frozenset({"host", "port", "model_tag"})


def effective_settings(log_text: str) -> dict[str, Any]:
    """The settings a vLLM server reported at its start (its `non-default args: {...}` line), each value as
    Python reads it; an object's repr (`KVTransferConfig(kv_role='kv_consumer', ...)`) becomes a dict of its
    fields, without the ids drawn anew at every start (`engine_id`). {} when the log has no such line."""
    found = _ARGS_LINE.findall(log_text)
    if not found:
        return {}
    try:
        tree = ast.parse(found[-1], mode="eval").body
    except SyntaxError:
        return {}
    value = _value(tree)
    return value if isinstance(value, dict) else {}


_DRAWN = frozenset({"engine_id"})  # drawn anew at every start


def _value(node: ast.expr) -> Any:
    if isinstance(node, ast.Dict):
        return {str(_value(k)) if k is not None else "**": _value(v) for k, v in zip(node.keys, node.values,
                                                                                       strict=True)}
    if isinstance(node, ast.Call):
        return {kw.arg: _value(kw.value) for kw in node.keywords if kw.arg and kw.arg not in _DRAWN}
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node)


def settings_differences(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]],
                         declared: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Every setting in which two deployments' servers differ, role by role (server `prefill-0` of one against
    `prefill-0` of the other), beyond the `declared` sweep axes (`declared_axes`: a vLLM name for every role
    server, e.g. max_num_batched_tokens, or one role's, e.g. decode.max_num_seqs) and
    what differs by nature (host, port); a server one side lacks is a difference too."""
    out = []
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            out.append(f"{name}: only in the {'first' if name in a else 'second'} deployment")
            continue
        role = name.rsplit("-", 1)[0]  # prefill-0: a prefill server
        for key in sorted(set(a[name]) | set(b[name])):
            norm = key.replace("-", "_")
            if norm in _OWN_ARGS or norm in declared or f"{role}.{norm}" in declared:
                continue
            left, right = a[name].get(key, _DEFAULT), b[name].get(key, _DEFAULT)
            if left != right:
                out.append(f"{name}: {key} {_shown(left)} != {_shown(right)}")
    return out


_DEFAULT = object()  # a setting a server did not report: vLLM's default


def _shown(value: object) -> str:
    return "(default)" if value is _DEFAULT else repr(value)


def declared_axes(params: list[dict[str, Any]]) -> set[str]:
    """The vLLM settings that a campaign's serve parameters sweep, each as far as it reaches: a role's setting
    with its role (`decode.max_num_seqs` is max_num_seqs of the decode servers alone), a shared one bare (every
    role server's), `kv_connector` as kv_transfer_config; a role's count is none (it is no server's setting)."""
    out = set()
    for combo in params:
        for key in combo:
            norm = str(key).replace("-", "_")
            role, dot, name = norm.partition(".")
            if norm == "kv_connector":
                out.add("kv_transfer_config")
            elif dot and role in ("prefill", "decode"):
                if name != "count":
                    out.add(f"{role}.{name}")
            else:
                out.add(norm)
    return out

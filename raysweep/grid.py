"""Parameter sets: vLLM's JSON parameter files, cartesian grids, links, exclusions, flag rendering, secrets.

A parameter set is a list of dicts, one dict per combination, exactly as `vllm bench sweep` reads it
(reference/vllm.md §1.4). Parameters become command-line flags with vLLM's rules (§1.5), with two
repairs: `--key=value` tokens already in the base command are found and replaced, and list values are
passed as several arguments after one flag instead of their Python repr.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from raysweep.errors import CampaignError

__all__ = [
    "BENCHMARK_NAME_KEY",
    "MASK",
    "apply_to_cmd",
    "check_flag_key",
    "check_unique",
    "canonical_json",
    "combo_label",
    "expand_grid",
    "exclude_combos",
    "find_flag_value",
    "is_own_key",
    "is_pd_key",
    "is_secret_name",
    "link_matches",
    "load_param_file",
    "mask_argv",
    "mask_env",
    "mask_text",
    "normalize_key",
    "params_id",
    "secret_values",
    "shell_join",
]

BENCHMARK_NAME_KEY = "_benchmark_name"
LAYOUT_KEY = "placement_layout"  # a serve parameter of raysweep's own (pack | spread), never a flag
PD_CONNECTOR_KEY = "kv_connector"  # a P/D deployment's connector (raysweep.campaign.pd), never a flag
PD_ROLES = ("prefill", "decode")   # `prefill.X`, `decode.X`: a P/D role's own setting, never a flag of the base
MASK = "***"

_SECRET_PARTS = {"TOKEN", "SECRET", "SECRETS", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS",
                 "APIKEY", "AUTHORIZATION"}


def normalize_key(key: str) -> str:
    """The canonical spelling of a parameter name: hyphens of the part before the first dot become underscores."""
    head, dot, rest = key.partition(".")
    return head.replace("-", "_") + dot + rest


def is_pd_key(key: str) -> bool:
    """A serve parameter of a P/D deployment (`prefill.count`, `decode.max_num_seqs`, `kv_connector`)."""
    norm = normalize_key(str(key))
    return norm == PD_CONNECTOR_KEY or norm.partition(".")[0] in PD_ROLES and "." in norm


def is_own_key(key: str) -> bool:
    """A parameter of raysweep's own, never a flag of the command: the benchmark's name, the layout, P/D keys."""
    return key in (BENCHMARK_NAME_KEY, LAYOUT_KEY) or is_pd_key(key)


def canonical_json(params: Mapping[str, Any]) -> str:
    """JSON of a parameter dict that does not depend on key order or on `-`/`_` spelling of names."""
    return json.dumps({normalize_key(k): _canonical_value(v) for k, v in params.items()},
                      sort_keys=True, separators=(",", ":"))


def _canonical_value(value: object) -> Any:
    if isinstance(value, float) and value.is_integer() and not math.isinf(value):
        return int(value)
    if isinstance(value, dict):
        return {str(k): _canonical_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical_value(v) for v in value]
    return value


def params_id(params: Mapping[str, Any], length: int = 12) -> str:
    """Stable id of a parameter combination: a hash of its canonical JSON."""
    return hashlib.sha256(canonical_json(params).encode()).hexdigest()[:length]


def combo_label(params: Mapping[str, Any]) -> str:
    """A readable name for a combination: its `_benchmark_name`, else `k1=v1-k2=v2` as vLLM names it."""
    if BENCHMARK_NAME_KEY in params:
        return str(params[BENCHMARK_NAME_KEY])
    if not params:
        return "default"
    return "-".join(f"{k}={MASK if is_secret_name(k) else _display(v)}" for k, v in params.items())


def _display(value: object) -> str:
    return json.dumps(value) if isinstance(value, (dict, list)) else str(value)


# ---------------------------------------------------------------------------------------------------
# Building parameter sets
# ---------------------------------------------------------------------------------------------------

_FLAG_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)*", re.ASCII)


def check_flag_key(key: object, where: str) -> None:
    """Refuse a parameter name that cannot become a command-line flag (`--name`, or vLLM's dotted
    `--config.key`): letters, digits, `_` and `-`, not starting with `-`, dots only between parts."""
    if not isinstance(key, str) or not _FLAG_KEY.fullmatch(key):
        raise CampaignError(where, f"parameter name {key!r} cannot become a command-line flag; write it as the "
                                   "flag without its dashes (letters, digits, _ and -, dotted parts for vLLM's "
                                   "--config.key), e.g. max_num_seqs or compilation_config.mode")


def file_entry(path: Path, entry: int | str) -> str:
    """How an error names one entry of a parameter file."""
    return f"parameter file {str(path)!r}, entry {entry!r}" if isinstance(entry, str) else \
        f"parameter file {str(path)!r}, entry {entry}"


def load_param_file(path: Path, field: str) -> list[dict[str, Any]]:
    """Read a vLLM parameter file: a JSON list of dicts, or a dict of name -> dict (`_benchmark_name`).
    Every error names the file and the entry (its index, or its name)."""
    if not path.is_file():
        raise CampaignError(field, f"parameter file {str(path)!r} does not exist")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CampaignError(field, f"parameter file {str(path)!r} is not valid JSON: {exc}") from None
    if isinstance(data, dict):
        entries: list[tuple[int | str, Any]] = list(data.items())
    elif isinstance(data, list):
        entries = list(enumerate(data))
    else:
        raise CampaignError(field, f"parameter file {str(path)!r} must hold a JSON list of objects, or an object "
                                   "of name -> object")
    records = []
    for entry, combo in entries:
        where = f"{field}[{entry!r}]" if isinstance(entry, str) else f"{field}[{entry}]"
        if not isinstance(combo, dict):
            raise CampaignError(where, f"{file_entry(path, entry)}: must be a JSON object of parameters, got "
                                       f"{type(combo).__name__}")
        for key in combo:
            try:
                check_flag_key(key, where)
            except CampaignError as exc:
                raise CampaignError(where, f"{file_entry(path, entry)}: {exc.message}") from None
        records.append({BENCHMARK_NAME_KEY: entry, **combo} if isinstance(entry, str) else dict(combo))
    return records


def expand_grid(grid: Mapping[str, Any], field: str) -> list[dict[str, Any]]:
    """The cartesian product of a dict of lists (a scalar counts as a one-value list)."""
    if not grid:
        raise CampaignError(field, "the grid is empty; give at least one parameter with a list of values")
    axes: list[list[Any]] = []
    for key, values in grid.items():
        values = values if isinstance(values, list) else [values]
        if not values:
            raise CampaignError(f"{field}.{key}", "the list of values is empty; give at least one value")
        axes.append(values)
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*axes)]


def exclude_combos(combos: list[dict[str, Any]], exclude: Sequence[Mapping[str, Any]],
                   field: str) -> list[dict[str, Any]]:
    """Drop every combination that matches all the key/values of one of the `exclude` dicts."""
    known = {normalize_key(k) for c in combos for k in c}
    for i, rule in enumerate(exclude):
        for key in rule:
            if normalize_key(key) not in known:
                raise CampaignError(f"{field}[{i}].{key}", f"names no parameter of this set; known: {_listing(known)}")

    def matches(combo: Mapping[str, Any], rule: Mapping[str, Any]) -> bool:
        norm = {normalize_key(k): v for k, v in combo.items()}
        return all(normalize_key(k) in norm and _same(norm[normalize_key(k)], v) for k, v in rule.items())

    return [c for c in combos if not any(matches(c, r) for r in exclude)]


def check_unique(combos: Iterable[Mapping[str, Any]], field: str,
                 origins: Sequence[str | None] | None = None) -> None:
    """Refuse duplicate combinations (same canonical parameters) and duplicate `_benchmark_name`s.
    `origins` names where each combination comes from (a parameter file's entry), for the message."""
    seen: dict[str, int] = {}
    names: dict[str, int] = {}

    def refuse(i: int, what: str) -> CampaignError:
        origin = origins[i] if origins is not None and i < len(origins) else None
        return CampaignError(f"{field}[{i}]", f"{origin}: {what}" if origin else what)

    for i, combo in enumerate(combos):
        params = {k: v for k, v in combo.items() if k != BENCHMARK_NAME_KEY}
        key = canonical_json(params)
        if key in seen:
            raise refuse(i, f"duplicate combination {combo_label(params)!r} (same as item {seen[key]})")
        seen[key] = i
        if BENCHMARK_NAME_KEY in combo:
            name = str(combo[BENCHMARK_NAME_KEY])
            if name in names:
                raise refuse(i, f"duplicate {BENCHMARK_NAME_KEY} {name!r} (same as item {names[name]})")
            names[name] = i


def link_matches(serve: Mapping[str, Any], bench: Mapping[str, Any], links: Mapping[str, str]) -> bool:
    """vLLM's `--link-vars`: a pair runs only if every linked key has the same value on both sides."""
    s = {normalize_key(k): v for k, v in serve.items()}
    b = {normalize_key(k): v for k, v in bench.items()}
    return all(normalize_key(sk) in s and normalize_key(bk) in b and _same(s[normalize_key(sk)], b[normalize_key(bk)])
               for sk, bk in links.items())


def _same(a: object, b: object) -> bool:
    return _canonical_value(a) == _canonical_value(b)


def _listing(names: Iterable[str]) -> str:
    names = sorted(names)
    return ", ".join(names) if names else "(none)"


# ---------------------------------------------------------------------------------------------------
# Parameters to flags
# ---------------------------------------------------------------------------------------------------

def _candidates(key: str) -> list[str]:
    head, dot, rest = key.partition(".")
    heads = [head.replace("_", "-"), head, head.replace("-", "_")]
    return list(dict.fromkeys(f"--{h}{dot}{rest}" for h in heads))


def _find_flag(argv: Sequence[str], key: str) -> tuple[int, str, bool] | None:
    """Index, flag spelling and whether it is an `--x=value` token, for the first occurrence of `key`."""
    cands = _candidates(key)
    negs = ["--no-" + c[2:] for c in cands]
    for i, tok in enumerate(argv):
        if tok in cands or tok in negs:
            return i, tok, False
        for c in cands:
            if tok.startswith(c + "="):
                return i, c, True
    return None


def _value_tokens(value: object) -> list[str]:
    if isinstance(value, dict):
        return [json.dumps(value)]
    if isinstance(value, list):
        return [_value_tokens(v)[0] if not isinstance(v, (dict, list)) else json.dumps(v) for v in value]
    return [str(value)]


def _flag_tokens(key: str, value: object) -> list[str]:
    flag = _candidates(key)[0]
    if isinstance(value, bool):
        if "." in key:
            return [f"{flag}={'true' if value else 'false'}"]
        return [flag] if value else ["--no-" + flag[2:]]
    return [flag, *_value_tokens(value)]


def _value_span(argv: Sequence[str], i: int) -> int:
    """How many tokens after a flag at `i` are its values (those up to the next `-x` token)."""
    n = 0
    for tok in argv[i + 1:]:
        if tok.startswith("-") and not _is_number(tok):
            break
        n += 1
    return n


def _is_number(tok: str) -> bool:
    try:
        float(tok)
    except ValueError:
        return False
    return True


def apply_to_cmd(argv: Sequence[str], params: Mapping[str, Any]) -> list[str]:
    """Apply parameters to a command as vLLM's sweep does: replace a flag in place, else append it.

    `None` removes the flag (and its values) from the command.
    """
    out = list(argv)
    for key, value in params.items():
        if is_own_key(key):
            continue
        found = _find_flag(out, key)
        new = [] if value is None else _flag_tokens(key, value)
        if found is None:
            out.extend(new)
            continue
        i, tok, is_eq = found
        switch = isinstance(value, bool) and "." not in key
        bare_bool = tok.startswith("--no-") or switch or (not is_eq and _value_span(out, i) == 0)
        if is_eq or bare_bool:
            span = 0
        else:  # one value token, unless the new value is a list (then all the old values go)
            span = _value_span(out, i) if isinstance(value, list) or value is None else min(1, _value_span(out, i))
        out[i:i + 1 + span] = new
    return out


def find_flag_value(argv: Sequence[str], *flags: str) -> str | None:
    """The value of the last occurrence of any of `flags` (`--x v` or `--x=v`) in a command, or None."""
    value = None
    for i, tok in enumerate(argv):
        for flag in flags:
            if tok == flag and i + 1 < len(argv):
                value = argv[i + 1]
            elif tok.startswith(flag + "="):
                value = tok[len(flag) + 1:]
    return value


def shell_join(argv: Sequence[str]) -> str:
    """A command line that a shell would split back into exactly `argv`."""
    return shlex.join(argv)


# ---------------------------------------------------------------------------------------------------
# Secrets
# ---------------------------------------------------------------------------------------------------

def is_secret_name(name: str) -> bool:
    """True for names of tokens, keys and passwords: HF_TOKEN, OPENAI_API_KEY, --api-key, AWS_SECRET_ACCESS_KEY."""
    parts = [p for p in re.split(r"[_\-.]+", name.upper()) if p]
    if not parts:
        return False
    if any(p in _SECRET_PARTS for p in parts):
        return True
    return len(parts) > 1 and parts[-1] in {"KEY", "PASS"}


_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:-[^}]*)?\}")


def mask_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of an environment with secret values replaced by `***`; a `${VAR}` reference is kept, but a
    literal default in `${VAR:-default}` is masked."""
    return {k: (_mask_value(v) if is_secret_name(k) else v) for k, v in env.items()}


def _mask_value(value: str) -> str:
    m = _REF.fullmatch(str(value))
    if m is None:
        return MASK
    return f"${{{m.group(1)}:-{MASK}}}" if m.group(2) else str(value)


def mask_argv(argv: Sequence[str]) -> list[str]:
    """A copy of a command with the values of secret flags (`--api-key X`, `--hf-token=X`) masked; a
    `${VAR}` reference is kept."""
    out = list(argv)
    for i, tok in enumerate(out):
        if not tok.startswith("--"):
            continue
        name, eq, value = tok[2:].partition("=")
        if not is_secret_name(name):
            continue
        if eq:
            out[i] = f"--{name}={_mask_value(value)}"
        elif i + 1 < len(out) and not out[i + 1].startswith("-"):
            out[i + 1] = _mask_value(out[i + 1])
    return out


def secret_values(argv: Sequence[str], env: Mapping[str, str]) -> set[str]:
    """The literal secret values in a command's secret flags and in an environment's secret variables."""
    found = {v for k, v in env.items() if is_secret_name(k)}
    for plain, masked in zip(argv, mask_argv(argv)):
        if plain != masked:
            found.add(plain.partition("=")[2] if plain.startswith("--") else plain)
    return {v for v in found if len(v) >= 4 and v != MASK and not _REF.fullmatch(v)}


def mask_text(text: str, secrets: Iterable[str]) -> str:
    """`text` with every occurrence of the given secret values replaced by `***`."""
    for value in sorted(secrets, key=len, reverse=True):
        text = text.replace(value, MASK)
    return text

"""Loading a campaign: the YAML file, its parameter files and grids resolved, `${VAR}` references expanded.

`load_campaign(path)` reads a YAML file and returns a `CampaignSpec`: the validated model, the resolved
parameter sets (files read, grids expanded, exclusions applied) and `${VAR}` references expanded.
Every problem raises `CampaignError` naming the field path and what would be accepted.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from raysweep import grid
from raysweep.bench.checks import check_param_names, check_params_used
from raysweep.campaign.checks import (
    Origins,
    _check_affinity,
    _check_confirm,
    _check_design,
    _check_endpoints,
    _check_links,
    _check_mode,
    _check_native,
    _check_order,
    _check_percentiles,
    _check_precision,
    _check_sla,
    _check_tail_replicas,
    _reraise_at,
    run_registered_checks,
)
from raysweep.campaign.messages import _campaign_error, _did_you_mean
from raysweep.campaign.models import NATIVE_DEFAULT_CMD, Campaign, EnvValue
from raysweep.campaign.pd import check_deployments
from raysweep.errors import CampaignError


def _with_layouts(combos: list[dict[str, Any]], layout: str | Sequence[str]) -> list[dict[str, Any]]:
    """Every serve combination once per `placement.layout` (`pack` alone, the default, adds nothing, so the
    ids of existing campaigns stay; a combination that sets `placement_layout` itself keeps it)."""
    layouts = [layout] if isinstance(layout, str) else list(dict.fromkeys(layout))
    if layouts == ["pack"]:
        return combos
    return [c if grid.LAYOUT_KEY in c else {**c, grid.LAYOUT_KEY: lay} for c in combos for lay in
            ([layouts[0]] if grid.LAYOUT_KEY in c else layouts)]


def _has_masked_secret(argv: list[str]) -> bool:
    """Whether a secret flag of a stored command holds `***` instead of its value."""
    for i, tok in enumerate(argv):
        name, eq, value = tok[2:].partition("=")
        if tok.startswith("--") and grid.is_secret_name(name):
            if (value if eq else (argv[i + 1] if i + 1 < len(argv) else "")) == grid.MASK:
                return True
    return False


def _env_str(v: EnvValue) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


@dataclass(frozen=True)
class CampaignSpec:
    """A validated campaign with everything resolved, ready to become a plan."""

    campaign: Campaign
    serve_argv: list[str]
    serve_env: dict[str, str]
    bench_argv: list[str]
    bench_env: dict[str, str]
    after_bench_argv: list[str] | None
    serve_combos: list[dict[str, Any]]
    bench_combos: list[dict[str, Any]]
    source_path: str = ""
    base_dir: Path = field(default_factory=Path.cwd)
    variables: dict[str, str] = field(default_factory=dict)
    """What the `${VAR}` references of the campaign expanded to from the environment (secrets left out:
    the names of tokens and keys, and references in a secret's place, which the stored form masks)."""

    @property
    def offline(self) -> bool:
        """An offline sweep: each point runs `serve_argv` (the offline command) to its end, no server."""
        return self.campaign.mode in ("offline", "startup")  # startup: `vllm bench startup`, an offline command

    @property
    def gpus_per_replica(self) -> int | None:
        c = self.campaign
        return c.offline.gpus_per_point if c.offline is not None else c.serve.gpus_per_replica if c.serve else None

    def stored_form(self) -> dict[str, Any]:
        """The campaign as kept in the ledger: parameters resolved, `${VAR}` kept, literal secrets masked."""
        data = self.campaign.model_dump(mode="json")
        for part in ("serve", "bench", "offline"):
            if data.get(part) is None:
                data.pop(part, None)
        if self.offline:
            data["offline"]["params"] = self.serve_combos
        else:
            if data["serve"].get("url") is None:  # endpoints: their combinations come from serve.url
                data["serve"]["params"] = self.serve_combos
            data["bench"]["params"] = self.bench_combos
        for part in ("serve", "bench", "offline"):
            if part in data:
                data[part]["env"] = grid.mask_env({k: _env_str(v) for k, v in data[part]["env"].items()})
        for part, key in (("serve", "cmd"), ("bench", "cmd"), ("bench", "after_bench_cmd"), ("offline", "cmd")):
            cmd = (data.get(part) or {}).get(key)
            if cmd and grid.mask_argv(shlex.split(cmd)) != shlex.split(cmd):
                data[part][key] = grid.shell_join(grid.mask_argv(shlex.split(cmd)))
        return data


def load_campaign(path: str | Path, env: dict[str, str] | None = None) -> CampaignSpec:
    """Read, validate and resolve a campaign YAML file."""
    path = Path(path)
    if not path.is_file():
        raise CampaignError("", f"campaign file {str(path)!r} does not exist")
    text = path.read_text()
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CampaignError("", f"{path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise CampaignError("", f"{path} must hold a mapping of campaign fields (name, serve, bench, ...)")
    return campaign_from_dict(data, base_dir=path.resolve().parent, source_path=str(path.resolve()), env=env)


def campaign_from_dict(data: dict[str, Any], base_dir: Path, source_path: str = "",
                       env: dict[str, str] | None = None) -> CampaignSpec:
    """Validate a campaign given as a dict (from YAML, or as stored in a ledger)."""
    env = dict(os.environ if env is None else env)
    spec = _resolve(data, base_dir, source_path, env)
    return dataclasses.replace(spec, variables=expanded_variables(spec.stored_form(), env))


def expanded_variables(stored: dict[str, Any], env: dict[str, str]) -> dict[str, str]:
    """The `${VAR}` references in a campaign's stored form that `env` sets, with their values; a secret's name
    (HF_TOKEN, ..._API_KEY) is left out, as are references in a secret's place (masked in the stored form)."""
    names: dict[str, None] = {}

    def walk(value: object) -> None:
        if isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)
        elif isinstance(value, str):
            names.update((m.group(1), None) for m in _VAR.finditer(value))

    walk(stored)
    return {n: env[n] for n in names if n in env and not grid.is_secret_name(n)}


def _resolve(data: dict[str, Any], base_dir: Path, source_path: str, env: dict[str, str]) -> CampaignSpec:
    try:
        campaign = Campaign.model_validate(data)
    except ValidationError as exc:
        raise _campaign_error(exc) from None
    _check_mode(campaign)
    _check_endpoints(campaign)
    _check_tail_replicas(campaign)
    _check_order(campaign)
    _check_confirm(campaign)
    _check_design(campaign)
    _check_precision(campaign)
    _check_affinity(campaign)
    if campaign.slo is not None:
        from raysweep.campaign.slo import parse_slo

        parse_slo(campaign.slo)
    if campaign.offline is not None:
        return _offline_spec(campaign, base_dir, source_path, env)
    assert campaign.serve is not None and campaign.bench is not None
    for fld, cmd in (("serve.cmd", campaign.serve.cmd), ("bench.cmd", campaign.bench.cmd),
                     ("bench.after_bench_cmd", campaign.bench.after_bench_cmd)):
        if cmd and _has_masked_secret(shlex.split(cmd)):
            raise CampaignError(fld, "a secret flag's value was masked when the campaign was stored; write it as "
                                     "${VAR} or resume with `raysweep run CAMPAIGN.yaml`")
    endpoints = _endpoint_combos(campaign.serve.url)
    serve_combos = endpoints if endpoints is not None else _with_layouts(
        _resolve_params(campaign.serve.params, "serve.params", base_dir), campaign.placement.layout)
    bench_combos, bench_origins = _resolve_with_origins(campaign.bench.params, "bench.params", base_dir)
    _check_links(campaign.link, serve_combos, bench_combos)
    _check_pd(campaign, serve_combos)
    after = campaign.bench.after_bench_cmd
    bench_argv = shlex.split(_expand(campaign.bench.cmd or NATIVE_DEFAULT_CMD, "bench.cmd", env))
    _check_percentiles(bench_argv, bench_combos, bench_origins)
    check_param_names(serve_combos, bench_combos)
    check_params_used(bench_argv, bench_combos, bench_origins)
    if campaign.bench.backend == "native":
        _check_native(bench_argv, bench_combos, bench_origins)
    if campaign.bench.workload is not None:
        from raysweep.campaign.levels import check_workload

        check_workload(campaign, serve_combos, bench_combos)
    if campaign.sla is not None:
        _check_sla(campaign, bench_combos)
    run_registered_checks(campaign, serve_combos, bench_combos)
    return CampaignSpec(
        campaign=campaign,
        serve_argv=shlex.split(_expand(campaign.serve.cmd, "serve.cmd", env)) if campaign.serve.cmd else [],
        serve_env=_expand_env(campaign.serve.env, "serve.env", env),
        bench_argv=bench_argv,
        bench_env=_expand_env(campaign.bench.env, "bench.env", env),
        after_bench_argv=shlex.split(_expand(after, "bench.after_bench_cmd", env)) if after else None,
        serve_combos=serve_combos,
        bench_combos=bench_combos,
        source_path=source_path,
        base_dir=base_dir,
    )


def _check_pd(campaign: Campaign, serve_combos: list[dict[str, Any]]) -> None:
    """`serve.pd`: a deployment raysweep starts (not with serve.url), each combination's deployment sound;
    without it, no P/D parameter in serve.params."""
    assert campaign.serve is not None
    pd = campaign.serve.pd
    if pd is None:
        for i, combo in enumerate(serve_combos):
            keys = [k for k in combo if grid.is_pd_key(str(k))]
            if keys:
                raise CampaignError(f"serve.params[{i}].{keys[0]}", "is a parameter of a prefill/decode "
                                    "deployment; describe the deployment in serve.pd (docs/pd.md)")
        return
    if campaign.serve.url is not None or not campaign.serve.cmd:
        raise CampaignError("serve.pd", "needs serve.cmd (the command every role runs); a deployment of "
                            "servers that run already cannot be placed")
    if campaign.tune is not None:
        raise CampaignError("serve.pd", "cannot be tuned yet; sweep its axes in serve.params")
    check_deployments(pd, serve_combos)


def _endpoint_combos(url: Any) -> list[dict[str, Any]] | None:
    """`serve.url`: one server config per endpoint, its one parameter the endpoint's base URL (None: serve.cmd)."""
    if url is None:
        return None
    items = url if isinstance(url, list) else [url]
    return [{"endpoint": (u if isinstance(u, str) else u.url).rstrip("/").removesuffix("/v1"),
             **({} if isinstance(u, str) else u.labels)} for u in items]


def _offline_spec(campaign: Campaign, base_dir: Path, source_path: str, env: dict[str, str]) -> CampaignSpec:
    off = campaign.offline
    assert off is not None
    if _has_masked_secret(shlex.split(off.cmd)):
        raise CampaignError("offline.cmd", "a secret flag's value was masked when the campaign was stored; write it "
                                           "as ${VAR} or resume with `raysweep run CAMPAIGN.yaml`")
    combos = _resolve_params(off.params, "offline.params", base_dir)
    for i, combo in enumerate(combos):
        for key in combo:
            if grid.normalize_key(key) == "output_json":
                raise CampaignError(f"offline.params[{i}].{key}", "is set by raysweep (each point's JSON goes to "
                                                                  "the output dir); remove it")
    return CampaignSpec(
        campaign=campaign,
        serve_argv=shlex.split(_expand(off.cmd, "offline.cmd", env)),
        serve_env=_expand_env(off.env, "offline.env", env),
        bench_argv=[],
        bench_env={},
        after_bench_argv=None,
        serve_combos=combos,
        bench_combos=[{}],
        source_path=source_path,
        base_dir=base_dir,
    )


def _resolve_params(spec: Any, fld: str, base_dir: Path) -> list[dict[str, Any]]:
    return _resolve_with_origins(spec, fld, base_dir)[0]


def _resolve_with_origins(spec: Any, fld: str, base_dir: Path) -> tuple[list[dict[str, Any]], Origins]:
    """The parameter combinations of a section, and for each the file entry it was read from (errors name
    the file and the entry)."""
    origins: Origins
    if spec is None:
        return [{}], [None]
    if isinstance(spec, str):
        p = Path(spec)
        path = p if p.is_absolute() else base_dir / p
        combos = grid.load_param_file(path, fld)
        origins = [grid.file_entry(path, c.get(grid.BENCHMARK_NAME_KEY, i)) for i, c in enumerate(combos)]
    elif isinstance(spec, list):
        combos = []
        for i, item in enumerate(spec):
            if not isinstance(item, dict):
                raise CampaignError(f"{fld}[{i}]",
                                    f"must be a mapping of parameter -> value, got {type(item).__name__}")
            combos.append(dict(item))
        origins = [None] * len(combos)
    elif isinstance(spec, dict):
        combos, origins = _resolve_grid(spec, fld, base_dir)
    else:
        raise CampaignError(fld, "accepted: a path to a vLLM JSON parameter file, a list of mappings, "
                                 "or a mapping with `grid:` (and optional `exclude:`)")
    if not combos:
        raise CampaignError(fld, "yields no combination; give at least one")
    for i, combo in enumerate(combos):
        for key in combo:
            _reraise_at(partial(grid.check_flag_key, key, f"{fld}[{i}]"), origins[i])
    grid.check_unique(combos, fld, origins)
    return combos, origins


def _resolve_grid(spec: dict[str, Any], fld: str, base_dir: Path) -> tuple[list[dict[str, Any]], Origins]:
    allowed = {"grid", "file", "exclude"}
    for key in spec:
        if key not in allowed:
            raise CampaignError(f"{fld}.{key}",
                                f"unknown key{_did_you_mean(key, allowed)}; accepted: exclude, file, grid")
    if ("grid" in spec) == ("file" in spec):
        raise CampaignError(fld, "give exactly one of `grid:` (a mapping of parameter -> list of values) or `file:`")
    if "grid" in spec:
        if not isinstance(spec["grid"], dict):
            raise CampaignError(f"{fld}.grid", "must be a mapping of parameter -> list of values")
        combos = grid.expand_grid(spec["grid"], f"{fld}.grid")
        origins: Origins = [None] * len(combos)
    else:
        combos, origins = _resolve_with_origins(str(spec["file"]), f"{fld}.file", base_dir)
    exclude = spec.get("exclude") or []
    if not isinstance(exclude, list) or not all(isinstance(e, dict) for e in exclude):
        raise CampaignError(f"{fld}.exclude", "must be a list of mappings (parameter -> value)")
    kept = grid.exclude_combos(combos, exclude, f"{fld}.exclude")
    kept_ids = {id(c) for c in kept}
    return kept, [o for c, o in zip(combos, origins) if id(c) in kept_ids]


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _expand(text: str, fld: str, env: dict[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        how = (f"`make demo` makes the tiny model in .cache/tiny-llama: export {name}=$PWD/.cache/tiny-llama"
               if name == "RAYSWEEP_DEMO_MODEL" else f"set it, or write ${{{name}:-default}}")
        raise CampaignError(fld, f"refers to ${{{name}}}, but the environment variable {name} is not set ({how})")
    return _VAR.sub(sub, text)


def _expand_env(values: dict[str, EnvValue], fld: str, env: dict[str, str]) -> dict[str, str]:
    out = {}
    for k, v in values.items():
        s = _env_str(v)
        ref = _VAR.fullmatch(s)
        masked_default = ref is not None and ref.group(2) == grid.MASK and ref.group(1) not in env
        if grid.is_secret_name(k) and (s == grid.MASK or masked_default):
            raise CampaignError(f"{fld}.{k}", "was masked when the campaign was stored; write it as ${VAR} "
                                              "or resume with `raysweep run CAMPAIGN.yaml`")
        out[k] = _expand(s, f"{fld}.{k}", env)
    return out

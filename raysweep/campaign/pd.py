"""A disaggregated prefill/decode deployment (`serve.pd`): its schema, its resolution per serve combination,
and the checks that refuse a deployment that cannot work before anything starts.

A P/D deployment is one server configuration made of roles: `prefill` servers build the KV cache and hand it
over through a KV connector (vLLM's `--kv-transfer-config`), `decode` servers receive it and generate, and a
router in front sends each request to one of each. Every role runs the base `serve.cmd` with the serve
parameters shared by all roles, then its own settings, parallelism and connector role.

The deployment's shape is sweepable like any serve parameter: `prefill.count`, `decode.count`,
`prefill.tensor_parallel_size`, `decode.data_parallel_size`, `prefill.max_num_batched_tokens` (any vLLM option
after `prefill.` or `decode.` is that role's setting) and `kv_connector` (the connector's name). These keys are
raysweep's own: none becomes a flag of the base command (`raysweep.grid.is_pd_key`).
"""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from raysweep import grid
from raysweep.errors import CampaignError

__all__ = ["ROLES", "CONNECTOR_KEY", "PREFILL_TP_ABOVE_DECODE_OK", "Deployment", "PDRoleSpec", "PDSpec",
           "RoleInstance", "RoleSpec", "check_deployments", "deployment_of", "installed_connectors"]

ROLES = ("prefill", "decode")
CONNECTOR_KEY = grid.PD_CONNECTOR_KEY
_ROLE_FIELDS = ("count", "tensor_parallel_size", "data_parallel_size")
_DEFAULT_KV_ROLE = {"prefill": "kv_producer", "decode": "kv_consumer"}

# Connectors known to carry a prefill server's KV to a decode server of smaller tensor parallelism. None is
# known to, on the vLLM this was written against: NIXL refuses it (llm-d#2187), and the shared-storage
# ExampleConnector keys its files per rank, so a decode rank would find no file. A connector added here
# is no longer refused for prefill TP above decode TP.
PREFILL_TP_ABOVE_DECODE_OK: frozenset[str] = frozenset()

EnvValue = str | int | float | bool


class PDRoleSpec(BaseModel):
    """One role of the deployment: how many servers, each with what parallelism and settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    count: int = Field(1, ge=1, description="servers of this role (at least one)")
    tensor_parallel_size: int = Field(1, ge=1, description="tensor parallelism of each server of this role")
    data_parallel_size: int = Field(1, ge=1, description="data-parallel replicas of each server of this role")
    settings: dict[str, Any] = Field(default_factory=dict, description="vLLM options of this role only, e.g. "
                                     "{max_num_batched_tokens: 8192, max_num_seqs: 64}")
    kv_role: Literal["kv_producer", "kv_consumer", "kv_both"] | None = Field(
        None, description="its role in kv_transfer_config (default: kv_producer for prefill, kv_consumer for "
        "decode; NIXL deployments give kv_both to both)")
    env: dict[str, EnvValue] = Field(default_factory=dict, description="environment of this role's servers, "
                                     "over serve.env")

    @field_validator("settings")
    @classmethod
    def _flags(cls, v: dict[str, Any]) -> dict[str, Any]:
        for key in v:
            grid.check_flag_key(key, "settings")
            norm = grid.normalize_key(str(key))
            if norm in ("tensor_parallel_size", "data_parallel_size", "kv_transfer_config", "port", "host"):
                raise ValueError(f"{key!r} is set by raysweep for each role: give tensor_parallel_size and "
                                 "data_parallel_size as fields of the role, the connector as serve.pd."
                                 "kv_transfer_config")
        return v


class PDSpec(BaseModel):
    """A disaggregated prefill/decode deployment: its roles and the KV connector between them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kv_transfer_config: dict[str, Any] = Field(
        description="vLLM's --kv-transfer-config shared by both roles, e.g. {kv_connector: NixlConnector, "
        "kv_buffer_device: cuda}; raysweep adds each role's kv_role")
    prefill: PDRoleSpec = Field(default_factory=PDRoleSpec, description="the prefill servers")
    decode: PDRoleSpec = Field(default_factory=PDRoleSpec, description="the decode servers")
    check_connector: bool = Field(True, description="refuse a connector that the vLLM installed where the "
                                  "campaign is checked does not register (false: the cluster's vLLM differs)")

    @field_validator("kv_transfer_config")
    @classmethod
    def _connector(cls, v: dict[str, Any]) -> dict[str, Any]:
        name = v.get("kv_connector")
        if not isinstance(name, str) or not name:
            raise ValueError("must name the connector as kv_connector, e.g. {kv_connector: NixlConnector}")
        if "kv_role" in v:
            raise ValueError("kv_role is set per role (serve.pd.prefill.kv_role, serve.pd.decode.kv_role)")
        return v


@dataclass(frozen=True)
class RoleSpec:
    """One role of a resolved deployment."""

    name: str
    count: int
    tp: int
    dp: int
    settings: dict[str, Any]
    kv_role: str
    env: dict[str, str] = field(default_factory=dict)
    stages: int = 1  # pipeline x prefill-context parallel sizes of each replica (its settings, or serve.cmd)

    @property
    def gpus_each(self) -> int:
        """GPUs of one server of this role, as vLLM counts them: TP x PP x PCP per replica, times DP."""
        return self.tp * self.stages * self.dp

    @property
    def gpus(self) -> int:
        return self.count * self.gpus_each


@dataclass(frozen=True)
class RoleInstance:
    """One server of a deployment: its role, its index within the role, its command and environment."""

    role: str
    index: int
    argv: list[str]
    env: dict[str, str]
    gpus: int

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"


@dataclass(frozen=True)
class Deployment:
    """A P/D deployment resolved for one serve combination."""

    connector: str
    kv_config: dict[str, Any]
    prefill: RoleSpec
    decode: RoleSpec

    @property
    def roles(self) -> tuple[RoleSpec, RoleSpec]:
        return (self.prefill, self.decode)

    @property
    def gpus(self) -> int:
        """All roles' GPUs: what the deployment holds, and what its per-GPU figures divide by."""
        return sum(r.gpus for r in self.roles)

    @property
    def ratio(self) -> str:
        return f"{self.prefill.count}P{self.decode.count}D"

    def kv_transfer_config(self, role: RoleSpec) -> dict[str, Any]:
        return {**self.kv_config, "kv_connector": self.connector, "kv_role": role.kv_role}

    def identity(self) -> dict[str, Any]:
        """What a point's result carries of its deployment."""
        out: dict[str, Any] = {"pd_ratio": self.ratio, "pd_connector": self.connector, "pd_gpus": self.gpus}
        for r in self.roles:
            out.update({f"pd_{r.name}_count": r.count, f"pd_{r.name}_tp": r.tp, f"pd_{r.name}_dp": r.dp})
        return out

    def instances(self, base_argv: list[str], shared: dict[str, Any], env: dict[str, str]) -> list[RoleInstance]:
        """Every server of the deployment, prefill first: the base command with the shared parameters, then
        the role's settings, its parallelism and its --kv-transfer-config."""
        out = []
        for r in self.roles:
            params = {**shared, **r.settings, "tensor_parallel_size": r.tp,
                      **({"data_parallel_size": r.dp} if r.dp > 1 else {}),
                      "kv_transfer_config": json.dumps(self.kv_transfer_config(r), sort_keys=True)}
            argv = grid.apply_to_cmd(base_argv, params)
            out += [RoleInstance(r.name, i, argv, {**env, **r.env}, r.gpus_each) for i in range(r.count)]
        return out

    def describe(self) -> str:
        parts = [f"{r.count} x {r.name} (tp={r.tp} dp={r.dp}, {r.gpus_each} GPU(s) each)" for r in self.roles]
        return f"P/D {self.ratio} via {self.connector}: " + ", ".join(parts) + f"; {self.gpus} GPU(s) in all"


def _str_env(env: dict[str, EnvValue]) -> dict[str, str]:
    return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in env.items()}


# a role's options that vLLM counts in a replica's world size besides TP (`ParallelConfig.world_size`)
_STAGE_FLAGS = {"pipeline_parallel_size": ("--pipeline-parallel-size", "--pipeline_parallel_size", "-pp"),
                "prefill_context_parallel_size": ("--prefill-context-parallel-size",
                                                  "--prefill_context_parallel_size", "-pcp")}


def _stages(settings: dict[str, Any], base_argv: list[str], label: str, role: str) -> int:
    """Pipeline x prefill-context parallel sizes of a role's replica: from its settings, else the base command."""
    norm = {grid.normalize_key(str(k)): v for k, v in settings.items()}
    out = 1
    for key, flags in _STAGE_FLAGS.items():
        value = norm.get(key, grid.find_flag_value(base_argv, *flags))
        try:
            size = 1 if value is None else int(value)
        except (TypeError, ValueError):
            size = 0
        if size < 1 or isinstance(value, bool):
            raise CampaignError(label, f"{role}.settings.{key} must be a positive integer, got {value!r}")
        out *= size
    return out


def deployment_of(spec: PDSpec, combo: dict[str, Any], where: str = "serve.params",
                  base_argv: list[str] | None = None) -> Deployment:
    """The deployment of one serve combination: `serve.pd` with the combination's `prefill.*`, `decode.*` and
    `kv_connector` laid over it (`base_argv`, the server command, for the pipeline and prefill-context sizes
    its roles inherit). Raises CampaignError naming `where` for a value that cannot be a role's."""
    label = f"{where} ({grid.combo_label(combo)})"
    over: dict[str, dict[str, Any]] = {r: {} for r in ROLES}
    connector = spec.kv_transfer_config["kv_connector"]
    for key, value in combo.items():
        norm = grid.normalize_key(str(key))
        if norm == CONNECTOR_KEY:
            if not isinstance(value, str) or not value:
                raise CampaignError(label, f"{CONNECTOR_KEY} must be a connector's name, got {value!r}")
            connector = value
            continue
        role, dot, name = norm.partition(".")
        if dot and role in ROLES:
            over[role][grid.normalize_key(name)] = value
    roles = []
    for name in ROLES:
        base: PDRoleSpec = getattr(spec, name)
        sizes = {f: over[name].pop(f, getattr(base, f)) for f in _ROLE_FIELDS}
        for f, v in sizes.items():
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise CampaignError(label, f"{name}.{f} must be a positive integer (at least one "
                                    f"{'server' if f == 'count' else 'GPU'} of the {name} role), got {v!r}")
        for k in over[name]:
            if k in ("kv_transfer_config", "port", "host", "kv_role", "env", "settings"):
                raise CampaignError(label, f"{name}.{k} cannot be swept; accepted: {name}.count, "
                                    f"{name}.tensor_parallel_size, {name}.data_parallel_size, or a vLLM option "
                                    f"of the role, e.g. {name}.max_num_batched_tokens")
        settings = {**base.settings, **over[name]}
        roles.append(RoleSpec(name, sizes["count"], sizes["tensor_parallel_size"], sizes["data_parallel_size"],
                              settings, base.kv_role or _DEFAULT_KV_ROLE[name], _str_env(base.env),
                              _stages(settings, base_argv or [], label, name)))
    kv = {k: v for k, v in spec.kv_transfer_config.items() if k != "kv_connector"}
    return Deployment(connector, kv, roles[0], roles[1])


def installed_connectors() -> set[str] | None:
    """The KV connectors the installed vLLM registers, read from its factory's source without importing vLLM
    (seconds of start-up); None where no vLLM is installed or its factory cannot be read."""
    try:
        found = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if found is None or not found.submodule_search_locations:
        return None
    for root in found.submodule_search_locations:
        factory = Path(root) / "distributed" / "kv_transfer" / "kv_connector" / "factory.py"
        if factory.is_file():
            names = set(re.findall(r"register_connector\(\s*[\"']([A-Za-z0-9_]+)[\"']", factory.read_text()))
            return names or None
    return None


def check_deployments(spec: PDSpec, combos: list[dict[str, Any]], where: str = "serve.params") -> list[Deployment]:
    """Resolve and check every combination's deployment: no role with zero servers, no prefill TP above decode
    TP for a connector that cannot carry it, no connector the installed vLLM lacks (`check_connector`)."""
    known = installed_connectors() if spec.check_connector else None
    out = []
    for combo in combos or [{}]:
        dep = deployment_of(spec, combo, where)
        from_params = any(grid.normalize_key(str(k)) == CONNECTOR_KEY for k in combo)
        if known is not None and dep.connector not in known:
            fld = f"{where} ({grid.combo_label(combo)})" if from_params else "serve.pd.kv_transfer_config.kv_connector"
            raise CampaignError(fld, f"connector {dep.connector!r} is not in the installed vLLM; it has: "
                                f"{', '.join(sorted(known))} (serve.pd.check_connector: false when the "
                                "cluster's vLLM differs from this one)")
        if dep.prefill.tp > dep.decode.tp and dep.connector not in PREFILL_TP_ABOVE_DECODE_OK:
            tp_swept = any(grid.normalize_key(str(k)) in ("prefill.tensor_parallel_size",
                                                           "decode.tensor_parallel_size") for k in combo)
            fld = f"{where} ({grid.combo_label(combo)})" if tp_swept else "serve.pd.prefill.tensor_parallel_size"
            raise CampaignError(fld, f"prefill tensor_parallel_size {dep.prefill.tp} is above decode's "
                                f"{dep.decode.tp}, which {dep.connector} does not support (llm-d#2187); accepted: "
                                "prefill TP at most decode TP (exclude these combinations in serve.params)")
        out.append(dep)
    return out

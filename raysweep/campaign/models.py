"""The campaign file: its YAML schema, validation with field-path errors, and parameter resolution.

`load_campaign(path)` reads a YAML file and returns a `CampaignSpec`: the validated model, the resolved
parameter sets (files read, grids expanded, exclusions applied) and `${VAR}` references expanded.
Every problem raises `CampaignError` naming the field path and what would be accepted.
"""

from __future__ import annotations

import difflib
import os
import re
import shlex
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from raysweep import grid
from raysweep.errors import CampaignError

__all__ = ["BenchSpec", "Campaign", "CampaignSpec", "NodeRule", "Pin", "PlacementSpec", "ServeSpec", "SlaSpec", "campaign_from_dict", "load_campaign"]

EnvValue = str | int | float | bool
NATIVE_DEFAULT_CMD = "vllm bench serve"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServeSpec(_Strict):
    """How to start the server: the base command, its environment and the grid of its parameters."""

    cmd: str = Field(description="base server command, e.g. `vllm serve MODEL --max-model-len 4096`")
    env: dict[str, EnvValue] = Field(default_factory=dict, description="environment of the server process")
    ready_timeout_s: float = Field(600.0, gt=0, description="seconds to wait for /health and /v1/models")
    params: Any = Field(None, description="parameter file path, list of dicts, or {grid: ..., exclude: [...]}")
    gpus_per_replica: int | None = Field(None, ge=1, description="GPUs of one replica, for commands that are not "
                                         "`vllm serve` (default: tensor_parallel_size x pipeline_parallel_size)")

    @field_validator("cmd")
    @classmethod
    def _cmd_not_empty(cls, v: str) -> str:
        return _check_cmd(v)


class OfflineSpec(_Strict):
    """An offline sweep: `vllm bench throughput` or `vllm bench latency` run once per point, no server."""

    cmd: str = Field(description="base command, e.g. `vllm bench throughput --model MODEL --dataset-name random` "
                     "(raysweep adds --output-json)")
    env: dict[str, EnvValue] = Field(default_factory=dict, description="environment of the command")
    params: Any = Field(None, description="parameter file path, list of dicts, or {grid: ..., exclude: [...]}")
    timeout_s: float = Field(3600.0, gt=0, description="seconds one point may take, engine start included")
    gpus_per_point: int | None = Field(None, ge=1, description="GPUs of one point, for commands that are not "
                                       "vLLM's (default: tensor_parallel_size x pipeline_parallel_size)")

    @field_validator("cmd")
    @classmethod
    def _cmd_kind(cls, v: str) -> str:
        from raysweep.bench.offline import offline_kind

        offline_kind(shlex.split(_check_cmd(v)))
        return v


LabelValue = str | list[str]


class NodeRule(_Strict):
    """Which nodes a server configuration may use: node labels it requires and custom resources it takes."""

    node_labels: dict[str, LabelValue] = Field(default_factory=dict,
                                               description="label -> value (or list of accepted values)")
    resources: dict[str, float] = Field(default_factory=dict,
                                        description="custom Ray resources every bundle of the server takes")

    @field_validator("resources")
    @classmethod
    def _positive(cls, v: dict[str, float]) -> dict[str, float]:
        for k, amount in v.items():
            if amount <= 0:
                raise ValueError(f"resource {k!r} must be a positive amount, got {amount}")
            if k in ("CPU", "GPU", "memory"):
                raise ValueError(f"{k!r} is sized by raysweep itself; name a custom resource")
        return v


class Pin(NodeRule):
    """Node rules for the server configurations whose parameters match `when`."""

    when: dict[str, Any] = Field(description="serve parameters that select the configurations, e.g. "
                                 "{tensor_parallel_size: 8}")

    @field_validator("when")
    @classmethod
    def _not_empty(cls, v: dict[str, Any]) -> dict[str, Any]:
        if not v:
            raise ValueError("must name at least one serve parameter")
        return v


class PlacementSpec(NodeRule):
    """Where servers may run and how many at once."""

    max_servers: int | None = Field(None, ge=1, description="servers running at the same time (default: as many "
                                    "as free GPUs allow; 1 on a cluster without GPUs)")
    pins: list[Pin] = Field(default_factory=list, description="node rules for some configurations")
    layout: Literal["pack", "spread"] | list[Literal["pack", "spread"]] = Field(
        "pack", description="pack: each configuration on as few nodes as it fits; spread: across as many nodes "
        "as its pipeline stages or data-parallel replicas allow (tensor parallelism stays inside a node); a "
        "list sweeps it: every serve combination once per layout (the `placement_layout` result column)")
    tail_replicas: int = Field(0, ge=0, description="at the campaign's tail (no configuration left waiting), up to "
                               "this many more servers of a running configuration start on GPUs that would idle and "
                               "share its unclaimed points, while each server's share takes longer than a server "
                               "start (0: off). Each point still runs alone on one server; `server_id` says which")


class ClientGuardSpec(_Strict):
    """When the native client itself limited a point (it is then marked `client_limited`)."""

    max_send_lag_ms: float = Field(10.0, gt=0, description="more than 1 % of requests sent later than this after "
                                   "they were due (the client's own lateness)")
    min_rate_fraction: float = Field(0.95, gt=0, le=1, description="an open-loop point that sent less than this "
                                     "fraction of the asked request rate")
    max_loop_lag_ms: float = Field(20.0, gt=0, description="the p99 of the client's event-loop lag above this "
                                   "(the client could not keep up with its own streams)")


class BenchSpec(_Strict):
    """How to drive load: the backend, the benchmark command (or its options) and the grid of its parameters."""

    backend: Literal["native", "command"] = Field(
        "native", description="`native`: raysweep's own streaming client in Ray actors, reading `vllm bench serve` "
        "options; `command`: runs the benchmark command itself (e.g. `vllm bench serve`)")
    cmd: str | None = Field(None, description="base benchmark command, e.g. `vllm bench serve --model MODEL ...` "
                            "(required by the command backend; the native backend reads its options)")
    env: dict[str, EnvValue] = Field(default_factory=dict, description="environment of the benchmark process")
    params: Any = Field(None, description="parameter file path, list of dicts, or {grid: ..., exclude: [...]}")
    after_bench_cmd: str | None = Field(None, description="runs after every point instead of the cache reset")
    timeout_s: float = Field(3600.0, gt=0, description="seconds one benchmark run may take")
    clients: int | Literal["auto"] = Field("auto", description="native client actors per point (auto: from the "
                                           "asked rate and concurrency, doubled while the client limits the point)")
    max_clients: int = Field(8, ge=1, description="most native client actors for one point")
    client_cpus: float = Field(1.0, gt=0, description="CPUs each native client actor takes")
    rerun_client_limited: bool = Field(True, description="run a client-limited point again with twice the actors "
                                       "(up to max_clients)")
    metrics_interval_s: float = Field(0.5, gt=0, description="seconds between scrapes of the server's /metrics")
    client_guard: ClientGuardSpec = Field(default_factory=ClientGuardSpec, description="thresholds of the "
                                          "client-bottleneck guard")

    @field_validator("cmd")
    @classmethod
    def _cmd_not_empty(cls, v: str | None) -> str | None:
        return v if v is None else _check_cmd(v)

    @field_validator("clients")
    @classmethod
    def _clients_positive(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError("must be at least 1, or auto")
        return v

    @model_validator(mode="after")
    def _cmd_for_command(self) -> BenchSpec:
        if self.backend == "command" and not self.cmd:
            raise ValueError("the command backend needs bench.cmd (e.g. `vllm bench serve --model MODEL ...`)")
        return self


# -- tune: search the serve parameters instead of running their whole grid (raysweep.tune) -----------------

class TuneParam(_Strict):
    """One dimension of the search space: `choices`, or a range `low`..`high` (integers when both are)."""

    choices: list[Any] | None = Field(None, description="the values to choose from")
    low: float | None = Field(None, description="lower end of a range (inclusive)")
    high: float | None = Field(None, description="upper end of a range (inclusive)")
    log: bool = Field(False, description="sample the range on a log scale (low > 0)")
    step: float | None = Field(None, gt=0, description="spacing of the values of a range")
    type: Literal["int", "float"] | None = Field(None, description="int or float (default: int when low, high "
                                                 "and step are whole numbers)")


class TuneObjective(_Strict):
    """What a candidate is judged by: a result field (or `sla_capacity`) over its bench points."""

    metric: str = Field(description="a result field (e.g. output_throughput, median_ttft_ms) or sla_capacity (the "
                        "largest load meeting sla.targets)")
    direction: Literal["maximize", "minimize"] = Field("maximize", description="maximize or minimize")
    per: Literal["none", "gpu", "user"] = Field("none", description="divide by the configuration's GPUs, or by the "
                                                "bench point's max_concurrency (per user)")
    aggregate: Literal["best", "worst", "mean"] = Field("best", description="over the bench points of a candidate")


class TuneBudget(_Strict):
    """When no new candidate is started (candidates running then are finished)."""

    candidates: int | None = Field(None, ge=1, description="server configurations tried")
    gpu_hours: float | None = Field(None, gt=0, description="GPU-hours held by the candidates' servers")
    wall_hours: float | None = Field(None, gt=0, description="hours since the first candidate was asked")

    @model_validator(mode="after")
    def _some(self) -> TuneBudget:
        if self.candidates is None and self.gpu_hours is None and self.wall_hours is None:
            raise ValueError("give at least one of candidates, gpu_hours, wall_hours")
        return self


class TuneEarlyStop(_Strict):
    """Successive halving over each candidate's bench points (Pareto: by domination; not for sla_capacity)."""

    enabled: bool = Field(True, description="stop candidates clearly beaten at a rung")
    eta: int = Field(3, ge=2, description="only the best 1/eta of the candidates at a rung go on")
    min_peers: int = Field(3, ge=2, description="candidates that must have reached a rung before one is stopped there")


class TuneSpec(_Strict):
    """Search the serve parameters with an Optuna sampler, asked and told by the driver."""

    space: dict[str, TuneParam] = Field(description="serve parameter -> {choices: [...]} or {low, high, log, step}")
    exclude: list[dict[str, Any]] = Field(default_factory=list, description="candidates matching one of these "
                                          "mappings are refused, as serve.params exclude does")
    objective: TuneObjective | None = Field(None, description="one objective")
    pareto: list[TuneObjective] | None = Field(None, description="two objectives: a Pareto front of candidates")
    budget: TuneBudget = Field(description="when to stop asking for candidates")
    parallel: int | None = Field(None, ge=1, description="candidates at once (default: as many as free GPUs allow)")
    sampler: Literal["tpe", "random", "grid", "nsga2"] = Field("tpe", description="Optuna sampler")
    pareto_model: bool = Field(True, description="pareto over result fields: after the sampler's 16 start-up "
                               "candidates, each next one is the untried configuration whose optimistic predicted "
                               "bench points (a Gaussian process over the parameters and the load) add the most "
                               "hypervolume; false: the sampler proposes them all (not with sampler grid)")
    seed: int | None = Field(None, description="the sampler's seed")
    early_stop: TuneEarlyStop = Field(default_factory=TuneEarlyStop, description="successive halving")

    @model_validator(mode="after")
    def _one_goal(self) -> TuneSpec:
        if (self.objective is None) == (self.pareto is None):
            raise ValueError("give exactly one of objective (one) or pareto (two objectives)")
        if self.pareto is not None and len(self.pareto) != 2:
            raise ValueError(f"pareto takes exactly two objectives, got {len(self.pareto)}")
        return self

    @property
    def objectives(self) -> list[TuneObjective]:
        return [self.objective] if self.objective is not None else list(self.pareto or [])


class SlaSpec(_Strict):
    """The SLA search: per server config and bench point, the largest load that meets each target."""

    variable: Literal["max_concurrency", "request_rate"] = Field(
        "max_concurrency", description="the load variable searched (concurrency by default: a rate above "
        "capacity grows a backlog)")
    targets: list[dict[str, Any]] = Field(description="one search per target, e.g. [{p99_e2el_ms: \"<=200\"}]")
    judge: Literal["percentile", "attainment"] = Field(
        "percentile", description="percentile: the pooled metrics of all runs; attainment: the fraction of "
        "requests meeting every latency threshold, with a Wilson interval")
    attainment: float = Field(0.99, gt=0, lt=1, description="the fraction of requests that must meet the targets")
    precision: float = Field(0.05, gt=0, lt=1, description="stop when the bracket is within this fraction")
    start: float = Field(1.0, gt=0, description="the smallest value searched")
    max_value: float = Field(65536.0, gt=0, description="the largest value searched")

    @model_validator(mode="after")
    def _range(self) -> SlaSpec:
        if self.start > self.max_value:
            raise ValueError(f"start {self.start:g} is above max_value {self.max_value:g}")
        return self


class TransportSpec(_Strict):
    """The NCCL transport check of every server: its log is read, its links classified."""

    require: Literal["any", "rdma", "ib", "gdr"] = Field(
        "any", description="the cross-node links accepted for a multi-node config (every node pair): any, rdma "
        "(InfiniBand or OFI/EFA), ib (InfiniBand) or gdr (GPUDirect RDMA over IB or OFI); a config with a "
        "slower link is stopped before benchmarking")
    nccl_debug: bool = Field(True, description="start servers with NCCL_DEBUG=INFO (unless their env sets it)")
    wait_s: float = Field(30.0, ge=0, description="seconds to wait after ready for the NCCL lines of a "
                          "multi-node config before judging it")
    probe: bool = Field(False, description="before a multi-node server starts, measure the all-reduce bus "
                        "bandwidth across its placement group's GPUs and nodes (NCCL on GPUs, gloo on CPU)")
    probe_mib: float = Field(64.0, gt=0, description="MiB all-reduced by each probe iteration")
    probe_iters: int = Field(5, ge=1, description="timed all-reduce iterations of the probe (after one warmup)")
    min_busbw_gbps: float | None = Field(None, gt=0, description="refuse a multi-node config whose probe measured "
                                         "less bus bandwidth (GB/s) than this")
    min_busbw_fraction: float | None = Field(None, gt=0, le=1, description="refuse a multi-node config whose "
                                             "probe measured less than this fraction of the baseline of its nodes "
                                             "(`raysweep preflight --bandwidth --out FILE`, named by `baseline`)")
    baseline: str | None = Field(None, description="the report JSON written by `raysweep preflight --bandwidth "
                                 "--out FILE` (its per-node bus bandwidth)")
    telemetry: bool = Field(True, description="sample the server's GPUs through NVML during every point "
                            "(utilisation, memory, power, SM clock, throttle reasons); no NVML is recorded, "
                            "not an error")
    telemetry_interval_s: float = Field(0.5, gt=0, description="seconds between GPU telemetry samples")

    @model_validator(mode="after")
    def _fraction_needs_baseline(self) -> TransportSpec:
        if self.min_busbw_fraction is not None and not self.baseline:
            raise ValueError("min_busbw_fraction needs `baseline`: the file `raysweep preflight --bandwidth "
                             "--out FILE` wrote")
        return self


class Campaign(_Strict):
    """A whole campaign, as written in the YAML file."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="campaign name (letters, digits, . _ -)")
    output_dir: str | None = Field(None, description="where the ledger and results go (default results/NAME)")
    runs: int = Field(3, ge=1, description="repeats of every benchmark point")
    warmup: int = Field(0, ge=0, description="prompts run once after every server start, not recorded")
    continue_on_error: bool = Field(True, description="record failures and go on instead of stopping")
    max_attempts: int = Field(2, ge=1, description="attempts per point before it stays failed")
    mode: Literal["serve", "offline"] = Field("serve", description="serve: a server per config, benchmarked "
                                              "by clients; offline: `vllm bench throughput|latency` per point")
    serve: ServeSpec | None = Field(None, description="the server (mode serve)")
    bench: BenchSpec | None = Field(None, description="the benchmark against it (mode serve)")
    offline: OfflineSpec | None = Field(None, description="the offline benchmark (mode offline)")
    link: dict[str, str] = Field(default_factory=dict, description="serve parameter -> bench parameter that must be equal")
    placement: PlacementSpec = Field(default_factory=PlacementSpec, description="node rules and concurrency cap")
    sla: SlaSpec | None = Field(None, description="search, per config and bench point, the largest load that "
                                "meets latency targets")
    transport: TransportSpec = Field(default_factory=TransportSpec, description="the NCCL transport check")
    storage: str | None = Field(None, description="a filesystem URI (s3://..., gs://..., file:///...) the ledger "
                                "and results are mirrored to after every point")
    report: bool = Field(False, description="when `raysweep run` ends, write the HTML report and the default "
                                            "figures into the output dir and print their paths")
    tune: TuneSpec | None = Field(None, description="search the serve parameters (Optuna) instead of running "
                                  "their whole grid")

    @field_validator("storage")
    @classmethod
    def _storage_uri(cls, v: str | None) -> str | None:
        schemes = ("s3", "gs", "gcs", "hdfs", "viewfs", "file", "abfs", "abfss")
        if v is not None and ("://" not in v or v.split("://", 1)[0] not in schemes):
            raise ValueError(f"{v!r} is not a filesystem URI; accepted schemes: {', '.join(f'{s}://' for s in schemes)}")
        return v


def _with_layouts(combos: list[dict[str, Any]], layout: str | list[str]) -> list[dict[str, Any]]:
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


def _check_cmd(v: str) -> str:
    try:
        argv = shlex.split(v)
    except ValueError as exc:
        raise ValueError(f"cannot be split into arguments: {exc}") from None
    if not argv:
        raise ValueError("must be a non-empty command")
    return v


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

    @property
    def offline(self) -> bool:
        """An offline sweep: each point runs `serve_argv` (the offline command) to its end, no server."""
        return self.campaign.mode == "offline"

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


# ---------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------

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
    try:
        campaign = Campaign.model_validate(data)
    except ValidationError as exc:
        raise _campaign_error(exc) from None
    env = dict(os.environ if env is None else env)
    _check_mode(campaign)
    _check_tail_replicas(campaign)
    if campaign.offline is not None:
        return _offline_spec(campaign, base_dir, source_path, env)
    assert campaign.serve is not None and campaign.bench is not None
    for fld, cmd in (("serve.cmd", campaign.serve.cmd), ("bench.cmd", campaign.bench.cmd),
                     ("bench.after_bench_cmd", campaign.bench.after_bench_cmd)):
        if cmd and _has_masked_secret(shlex.split(cmd)):
            raise CampaignError(fld, "a secret flag's value was masked when the campaign was stored; write it as "
                                     "${VAR} or resume with `raysweep run CAMPAIGN.yaml`")
    serve_combos = _with_layouts(_resolve_params(campaign.serve.params, "serve.params", base_dir),
                                 campaign.placement.layout)
    bench_combos, bench_origins = _resolve_with_origins(campaign.bench.params, "bench.params", base_dir)
    _check_links(campaign.link, serve_combos, bench_combos)
    after = campaign.bench.after_bench_cmd
    bench_argv = shlex.split(_expand(campaign.bench.cmd or NATIVE_DEFAULT_CMD, "bench.cmd", env))
    _check_percentiles(bench_argv, bench_combos, bench_origins)
    if campaign.bench.backend == "native":
        _check_native(bench_argv, bench_combos, bench_origins)
    if campaign.sla is not None:
        _check_sla(campaign, bench_combos)
    if campaign.tune is not None:
        from raysweep.tune import check_tune

        check_tune(campaign, serve_combos, bench_combos)
    return CampaignSpec(
        campaign=campaign,
        serve_argv=shlex.split(_expand(campaign.serve.cmd, "serve.cmd", env)),
        serve_env=_expand_env(campaign.serve.env, "serve.env", env),
        bench_argv=bench_argv,
        bench_env=_expand_env(campaign.bench.env, "bench.env", env),
        after_bench_argv=shlex.split(_expand(after, "bench.after_bench_cmd", env)) if after else None,
        serve_combos=serve_combos,
        bench_combos=bench_combos,
        source_path=source_path,
        base_dir=base_dir,
    )


def _check_mode(campaign: Campaign) -> None:
    """Each mode has its own sections: serve + bench, or offline."""
    if campaign.mode == "serve":
        for part in ("serve", "bench"):
            if getattr(campaign, part) is None:
                raise CampaignError(part, "is required (mode: serve); for a sweep without a server write "
                                          "`mode: offline` and an `offline:` section")
        if campaign.offline is not None:
            raise CampaignError("offline", "is only for `mode: offline`; add `mode: offline` (and drop serve and "
                                           "bench) or remove it")
        return
    if campaign.offline is None:
        raise CampaignError("offline", "is required (mode: offline): e.g. `offline: {cmd: vllm bench throughput "
                                       "--model MODEL --dataset-name random}`")
    for part in ("serve", "bench", "sla", "tune"):
        if getattr(campaign, part) is not None:
            raise CampaignError(part, "has no meaning in mode offline (no server runs); remove it, or use mode serve")
    if campaign.link:
        raise CampaignError("link", "has no meaning in mode offline (there are no bench parameters to link to)")


def _check_tail_replicas(campaign: Campaign) -> None:
    """More servers of one configuration share its points: not SLA searches (a search's probes follow one
    another on one server), tuning candidates (stopped by rung) or offline runs."""
    if not campaign.placement.tail_replicas:
        return
    for part, why in (("sla", "an SLA search's probes follow one another on one server"),
                      ("tune", "tuning candidates are stopped early by rung, one server each"),
                      ("offline", "offline runs have no server to share points between")):
        if getattr(campaign, part) is not None:
            raise CampaignError("placement.tail_replicas", f"cannot be used with `{part}:` ({why}); set it to 0 "
                                                            "or remove it")


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


def _check_sla(campaign: Campaign, bench_combos: list[dict[str, Any]]) -> None:
    from raysweep.sla import parse_targets

    sla = campaign.sla
    assert sla is not None
    if campaign.bench.backend != "native":
        raise CampaignError("sla", "needs bench.backend: native (it judges the pooled requests of every run)")
    parse_targets(sla.targets)
    for i, combo in enumerate(bench_combos):
        if any(grid.normalize_key(k) == sla.variable for k in combo):
            raise CampaignError(f"bench.params[{i}].{sla.variable}", "is what the SLA search sets; remove it "
                                                                     "(or search the other variable)")
    if campaign.link and sla.variable in {grid.normalize_key(v) for v in campaign.link.values()}:
        raise CampaignError("link", f"links to {sla.variable}, which the SLA search sets")


def _check_native(argv: list[str], combos: list[dict[str, Any]], origins: Origins) -> None:
    """Every bench point must be load options the native client runs, with its data set on this machine."""
    from raysweep.bench.options import parse_load_options

    parse_load_options(argv, "bench.cmd")
    for i, combo in enumerate(combos):
        fld = f"bench.params[{i}]" if combo else "bench.cmd"
        opts = _reraise_at(lambda: parse_load_options(grid.apply_to_cmd(argv, combo), fld), origins[i])
        path = (opts.dataset_path or "")
        if opts.dataset_name == "custom" and ".py:" in path:
            path = path.rsplit(":", 1)[0]
        if opts.dataset_name in ("sharegpt", "custom", "jsonl") and not Path(path).is_file():
            in_params = "dataset_path" in str(combo)
            _reraise_at(lambda: _refuse(f"bench.params[{i}]" if in_params else "bench.cmd",
                                        f"--dataset-path {opts.dataset_path!r} is not a file on this machine"),
                        origins[i] if in_params else None)


def _refuse(fld: str, message: str) -> None:
    raise CampaignError(fld, message)


def _check_percentiles(argv: list[str], combos: list[dict[str, Any]], origins: Origins) -> None:
    """`--metric-percentiles` (either backend) must be comma-separated numbers from 0 to 100."""
    points = [("bench.cmd", argv, None)] + [(f"bench.params[{i}]", grid.apply_to_cmd(argv, c), origins[i])
                                             for i, c in enumerate(combos) if c]
    for fld, cmd, origin in points:
        value = grid.find_flag_value(cmd, "--metric-percentiles", "--metric_percentiles")
        if value is None or (fld != "bench.cmd" and value == grid.find_flag_value(
                argv, "--metric-percentiles", "--metric_percentiles")):
            continue
        try:
            bad = [p for p in value.split(",") if p.strip() and not 0 <= float(p) <= 100]
        except ValueError:
            bad = [value]
        if bad or not value.strip():
            _reraise_at(lambda: _refuse(fld, f"--metric-percentiles takes comma-separated percentiles from 0 to "
                                             f"100, got {value!r}"), origin)


Origins = list[str | None]  # per combination: the parameter file entry it comes from, if any


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
                raise CampaignError(f"{fld}[{i}]", f"must be a mapping of parameter -> value, got {type(item).__name__}")
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
            _reraise_at(lambda: grid.check_flag_key(key, f"{fld}[{i}]"), origins[i])
    grid.check_unique(combos, fld, origins)
    return combos, origins


def _reraise_at(check: Any, origin: str | None) -> Any:
    """Run a check; a refusal names the parameter file entry the combination comes from."""
    try:
        return check()
    except CampaignError as exc:
        if origin is None or origin in exc.message:
            raise
        raise CampaignError(exc.field, f"{origin}: {exc.message}") from None


def _resolve_grid(spec: dict[str, Any], fld: str, base_dir: Path) -> tuple[list[dict[str, Any]], Origins]:
    allowed = {"grid", "file", "exclude"}
    for key in spec:
        if key not in allowed:
            raise CampaignError(f"{fld}.{key}", f"unknown key{_did_you_mean(key, allowed)}; accepted: exclude, file, grid")
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


def _check_links(links: dict[str, str], serve: list[dict[str, Any]], bench: list[dict[str, Any]]) -> None:
    serve_keys = {grid.normalize_key(k) for c in serve for k in c}
    bench_keys = {grid.normalize_key(k) for c in bench for k in c}
    for sk, bk in links.items():
        if grid.normalize_key(sk) not in serve_keys:
            raise CampaignError(f"link.{sk}", f"is not a serve parameter{_did_you_mean(sk, serve_keys)}; "
                                              f"serve parameters: {', '.join(sorted(serve_keys)) or '(none)'}")
        if grid.normalize_key(bk) not in bench_keys:
            raise CampaignError(f"link.{sk}", f"links to {bk!r}, which is not a bench parameter"
                                              f"{_did_you_mean(bk, bench_keys)}; bench parameters: "
                                              f"{', '.join(sorted(bench_keys)) or '(none)'}")
    if links and not any(grid.link_matches(s, b, links) for s in serve for b in bench):
        raise CampaignError("link", "no serve/bench pair has equal values for the linked parameters; nothing would run")


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _expand(text: str, fld: str, env: dict[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        raise CampaignError(fld, f"refers to ${{{name}}}, but the environment variable {name} is not set "
                                 f"(set it, or write ${{{name}:-default}})")
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


# ---------------------------------------------------------------------------------------------------
# Error messages
# ---------------------------------------------------------------------------------------------------

def _did_you_mean(word: str, choices: set[str] | list[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _loc_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    model: type[BaseModel] = Campaign
    for part in loc:
        info = model.model_fields.get(str(part))
        ann = info.annotation if info else None
        options = typing.get_args(ann) or (ann,)  # `ServeSpec | None` is a union
        found = [a for a in options if isinstance(a, type) and issubclass(a, BaseModel)]
        if not found:
            return None
        model = found[0]
    return model


def _describe(err: dict[str, Any]) -> str:
    kind, loc = err["type"], tuple(err["loc"])
    if kind == "extra_forbidden":
        parent = _model_at(loc[:-1])
        accepted = sorted(parent.model_fields) if parent else []
        return (f"unknown key{_did_you_mean(str(loc[-1]), accepted)}; accepted: {', '.join(accepted)}")
    if kind == "missing":
        model = _model_at(loc[:-1])
        info = model.model_fields.get(str(loc[-1])) if model else None
        what = f" ({info.description})" if info and info.description else ""
        return f"is required{what}"
    got = err.get("input")
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    return f"{msg[0].lower()}{msg[1:]} (got {got!r})"


def _campaign_error(exc: ValidationError) -> CampaignError:
    errors = exc.errors()
    lines = [f"{_loc_path(tuple(e['loc']))}: {_describe(e)}" for e in errors]
    first = _loc_path(tuple(errors[0]["loc"]))
    err = CampaignError(first, _describe(errors[0]))
    if len(lines) > 1:
        err.args = ("\n".join(lines),)
    return err

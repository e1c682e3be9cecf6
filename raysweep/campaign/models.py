"""The campaign file's schema: one pydantic model per section, each field with its rule beside it.

`raysweep.campaign.loading` reads a file into these models; the checks that span several fields or need the
resolved parameters are in `raysweep.campaign.checks`.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from raysweep.bench.backend import BACKENDS
from raysweep.bench.load import CONCURRENCY, LoadVariable
from raysweep.campaign.design import DesignSpec
from raysweep.campaign.levels import WorkloadSpec
from raysweep.campaign.pd import PDSpec
from raysweep.maths.order import ConfirmSpec, OrderSpec
from raysweep.maths.precision import PrecisionSpec

__all__ = ["BenchSpec", "Campaign", "ClientGuardSpec", "CostSpec", "EndpointSpec", "NodeRule", "OfflineSpec",
           "Pin", "PlacementSpec", "ServeSpec", "SlaSpec", "TrackingSpec", "TransportSpec", "TuneBudget",
           "TuneEarlyStop", "TuneObjective", "TuneParam", "TuneSpec"]

EnvValue = str | int | float | bool
NATIVE_DEFAULT_CMD = "vllm bench serve"


def _check_cpus(v: list[int] | str | None) -> list[int] | str | None:
    """CPU ids as a list of non-negative integers or text like "0-3,6" (`raysweep.procs.cpu_set`)."""
    from raysweep.procs import cpu_set

    if v is not None and (not cpu_set(v) or (isinstance(v, list) and any(c < 0 for c in v))):
        raise ValueError(f"{v!r} is not a set of CPU ids; accepted: a list of CPU ids like [0, 1], or text like "
                         "\"0-3,6\"")
    return v


def _check_cmd(v: str) -> str:
    try:
        argv = shlex.split(v)
    except ValueError as exc:
        raise ValueError(f"cannot be split into arguments: {exc}") from None
    if not argv:
        raise ValueError("must be a non-empty command")
    return v


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _http_url(v: str) -> str:
    if not v.startswith(("http://", "https://")) or len(v) <= len("https://"):
        raise ValueError(f"{v!r} is not an http:// or https:// URL")
    return v


class EndpointSpec(_Strict):
    """A server that runs already (`serve.url`): raysweep starts and stops nothing."""

    url: str = Field(description="its base URL, e.g. http://HOST:8000 (it lists its models at /v1/models)")
    metrics_url: str | None = Field(None, description="where its Prometheus metrics are (default: URL/metrics)")
    reset_url: str | None = Field(None, description="a URL POSTed before every point to reset its caches, e.g. "
                                  "URL/reset_prefix_cache (default: none, caches are not reset)")
    model: str | None = Field(None, description="the model the clients ask for (default: the first of /v1/models)")
    gpus: int | None = Field(None, ge=1, description="the GPUs behind it, for per-GPU figures (default: serve.gpus; "
                             "undeclared: no per-GPU figure)")
    labels: dict[str, str | int | float | bool] = Field(
        default_factory=dict, description="values recorded with every point of this endpoint as serve parameters, "
        "e.g. a P/D deployment's identity (pd_ratio: 2P1D, pd_gpus: 4, ...; docs/pd.md)")

    @field_validator("labels")
    @classmethod
    def _label_names(cls, v: dict[str, Any]) -> dict[str, Any]:
        if "endpoint" in v:
            raise ValueError("`endpoint` is the endpoint's URL itself; name the label otherwise")
        return v

    @field_validator("url", "metrics_url", "reset_url")
    @classmethod
    def _is_url(cls, v: str | None) -> str | None:
        return v if v is None else _http_url(v)


class ServeSpec(_Strict):
    """How to start the server: the base command, its environment and the grid of its parameters; or the
    servers that run already (`url`)."""

    cmd: str | None = Field(None, description="base server command, e.g. `vllm serve MODEL --max-model-len 4096`")
    url: str | EndpointSpec | list[str | EndpointSpec] | None = Field(
        None, description="instead of cmd: one or several running endpoints (a base URL, or a mapping with url, "
        "metrics_url, reset_url, model), each a server config; nothing is started or stopped")
    env: dict[str, EnvValue] = Field(default_factory=dict, description="environment of the server process")
    gpus: int | None = Field(None, ge=1, description="with url: the GPUs behind each endpoint, for per-GPU figures "
                             "(undeclared: none; servers raysweep starts record the GPUs they reserve)")
    ready_timeout_s: float = Field(600.0, gt=0, description="seconds to wait for /health and /v1/models")
    params: Any = Field(None, description="parameter file path, list of dicts, or {grid: ..., exclude: [...]}")
    gpus_per_replica: int | None = Field(None, ge=1, description="GPUs of one replica, for commands that are not "
                                         "`vllm serve` (default: tensor_parallel_size x pipeline_parallel_size)")
    cpu_affinity: list[int] | str | None = Field(None, description="CPU ids the server process and everything it "
                                                 "starts run on, on each of its nodes (e.g. [0] or \"0-3\")")
    share_caches: bool = Field(True, description="servers of the campaign on one node share vLLM's, Inductor's and "
                               "Triton's compilation caches (~/.cache/raysweep/<campaign>); false: every server "
                               "starts with empty caches of its own, removed when it stops (a clean cold-start "
                               "study); a VLLM_CACHE_ROOT in serve.env is kept either way")
    warm_weights: bool = Field(False, description="read the model's files once per node before its first server "
                               "there, so that starts read them from the page cache (a local model directory only)")
    pd: PDSpec | None = Field(None, description="a disaggregated prefill/decode deployment: every configuration "
                              "is prefill and decode servers of serve.cmd, a KV connector between them and "
                              "raysweep's router in front (docs/pd.md)")

    @field_validator("cmd")
    @classmethod
    def _cmd_not_empty(cls, v: str | None) -> str | None:
        return v if v is None else _check_cmd(v)

    @field_validator("cpu_affinity")
    @classmethod
    def _cpus(cls, v: list[int] | str | None) -> list[int] | str | None:
        return _check_cpus(v)

    @field_validator("gpus")
    @classmethod
    def _gpus_of_endpoints(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v is not None and info.data.get("cmd"):
            raise ValueError("only with serve.url (endpoints that run already); a server raysweep starts records "
                             "the GPUs it reserves")
        return v

    @field_validator("url")
    @classmethod
    def _urls(cls, v: Any, info: ValidationInfo) -> Any:
        if v is None:
            return v
        if info.data.get("cmd"):
            raise ValueError("cannot be combined with serve.cmd: give `cmd` (a server raysweep starts) or `url` "
                             "(servers that run already), not both")
        items = v if isinstance(v, list) else [v]
        if not items:
            raise ValueError("must name at least one endpoint")
        seen = set()
        for i, item in enumerate(items):
            url = _http_url(item) if isinstance(item, str) else item.url
            if url.rstrip("/") in seen:
                raise ValueError(f"endpoint {i} ({url}) is listed twice")
            seen.add(url.rstrip("/"))
        return v


class TrackingSpec(_Strict):
    """Live export: every point logged to an experiment tracker as it lands, the report at the end."""

    backend: Literal["mlflow", "wandb"] = Field(description="the tracker: mlflow or wandb (the optional extras "
                                                "raysweep[mlflow], raysweep[wandb])")
    uri: str | None = Field(None, description="mlflow: the tracking URI (a server URL or sqlite:///path/mlflow.db)")
    experiment: str | None = Field(None, description="mlflow: the experiment (default: the campaign name)")
    project: str | None = Field(None, description="wandb: the project (default: the campaign name)")
    entity: str | None = Field(None, description="wandb: the team or user (default: yours)")
    mode: Literal["online", "offline"] | None = Field(None, description="wandb: online or offline (default: "
                                                      "W&B's own, WANDB_MODE)")

    @model_validator(mode="after")
    def _uri_for_mlflow(self) -> TrackingSpec:
        if self.backend == "mlflow" and not self.uri:
            raise ValueError("backend mlflow needs `uri`: an MLflow server URL or sqlite:///path/mlflow.db")
        return self


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
    replace_wait_s: float = Field(300.0, ge=0, description="after a node loss, how long a configuration that fits "
                                  "none of the nodes left (the GPUs it asks for, in the layout it ran with) waits "
                                  "for nodes before its points fail with the reason; it never runs on other "
                                  "hardware in the meantime")


class ClientGuardSpec(_Strict):
    """When the native client itself limited a point (it is then marked `client_limited`)."""

    max_send_lag_ms: float = Field(10.0, gt=0, description="more than 1 % of requests sent later than this after "
                                   "they were due (the client's own lateness)")
    min_rate_fraction: float = Field(0.95, gt=0, le=1, description="an open-loop point that sent less than this "
                                     "fraction of the asked request rate; a closed loop whose send lag kept its "
                                     "slots busy less than this fraction of their time")
    max_loop_lag_ms: float = Field(20.0, gt=0, description="the p99 of the client's event-loop lag above this "
                                   "(the client could not keep up with its own streams)")


# the bench backends' names, as their registry holds them (`raysweep.bench.backend`): a new backend needs no edit here
if TYPE_CHECKING:
    BackendName = str
else:
    BackendName = Literal[tuple(BACKENDS.names())]


class BenchSpec(_Strict):
    """How to drive load: the backend, the benchmark command (or its options) and the grid of its parameters."""

    backend: BackendName = Field(
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
    precision: PrecisionSpec | None = Field(None, description="measure every point until the interval of one "
                                            "metric is this narrow (runs from min_runs to max_runs instead of `runs`)")
    cpu_affinity: list[int] | str | None = Field(None, description="CPU ids the client actors (and a command "
                                                 "backend's benchmark process) run on (e.g. [1] or \"4-7\")")
    workload: WorkloadSpec | None = Field(None, description="load levels found from the server, as `vllm bench "
                                          "sweep serve_workload`: per bench point a serial and a batch point, then "
                                          "the levels of `variable` between what they achieved")

    @field_validator("cmd")
    @classmethod
    def _cmd_not_empty(cls, v: str | None) -> str | None:
        return v if v is None else _check_cmd(v)

    @field_validator("cpu_affinity")
    @classmethod
    def _cpus(cls, v: list[int] | str | None) -> list[int] | str | None:
        return _check_cpus(v)

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

    variable: LoadVariable = Field(
        CONCURRENCY, description="the load variable searched (concurrency by default: a rate above "
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
    idle_power_s: float = Field(1.0, ge=0, description="seconds the server's GPUs (or RAPL packages) are read "
                                "after its start and before its first load, for the idle power subtracted from "
                                "the net energy (0: not measured, no net energy)")
    dcgm_url: str | None = Field(None, description="where NVML cannot be read: a DCGM exporter's metrics page "
                                 "giving the GPUs' energy counter and power, `{node_ip}` filled in per node, e.g. "
                                 "http://{node_ip}:9400/metrics (docs/energy.md)")

    @field_validator("dcgm_url")
    @classmethod
    def _dcgm_url(cls, v: str | None) -> str | None:
        return None if v is None else _http_url(v)

    @model_validator(mode="after")
    def _fraction_needs_baseline(self) -> TransportSpec:
        if self.min_busbw_fraction is not None and not self.baseline:
            raise ValueError("min_busbw_fraction needs `baseline`: the file `raysweep preflight --bandwidth "
                             "--out FILE` wrote")
        return self


class CostSpec(_Strict):
    """What the hardware costs: $ per million tokens for every point, and the campaign's own spend."""

    currency: str = Field("USD", pattern=r"^[A-Za-z$€£¥]{1,8}$", description="the unit the prices are in")
    gpu_hour: float | dict[str, float] | None = Field(
        None, description="price per GPU-hour: one price, or by GPU type or node type: a key matches a server "
        "whose GPU name contains it (case-insensitive, e.g. H100) or one of whose Ray nodes has it as a label "
        "value (e.g. p5.48xlarge); `default` for the rest")
    node_hour: float | None = Field(None, gt=0, description="price per node-hour of a server without GPUs (CPU)")
    power_price_kwh: float | None = Field(None, ge=0, description="price per kWh of energy, added to the hardware's "
                                          "price: the measured energy where there is one, else provisioned_w")
    provisioned_w_per_gpu: float | None = Field(None, gt=0, description="the power provisioned per GPU (W): "
                                                "charged at power_price_kwh where no energy was measured")

    @field_validator("gpu_hour")
    @classmethod
    def _prices(cls, v: float | dict[str, float] | None) -> float | dict[str, float] | None:
        prices = v.values() if isinstance(v, dict) else [] if v is None else [v]
        if any(p <= 0 for p in prices):
            raise ValueError(f"prices must be positive numbers, got {v!r}")
        if isinstance(v, dict) and not v:
            raise ValueError("name at least one GPU type, node type or `default`")
        return v

    @model_validator(mode="after")
    def _some_price(self) -> CostSpec:
        if self.gpu_hour is None and self.node_hour is None:
            raise ValueError("give gpu_hour (price per GPU-hour) or node_hour (price per node-hour of CPU servers)")
        if self.provisioned_w_per_gpu is not None and self.power_price_kwh is None:
            raise ValueError("provisioned_w_per_gpu needs power_price_kwh")
        return self


class Campaign(_Strict):
    """A whole campaign, as written in the YAML file."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="campaign name (letters, digits, . _ -)")
    output_dir: str | None = Field(None, description="where the ledger and results go (default results/NAME)")
    runs: int = Field(3, ge=1, description="repeats of every benchmark point")
    warmup: int = Field(0, ge=0, description="prompts run once after every server start, not recorded, at the "
                        "heaviest load among the server's bench points")
    continue_on_error: bool = Field(True, description="record failures and go on instead of stopping")
    max_attempts: int = Field(2, ge=1, description="attempts per point before it stays failed")
    mode: Literal["serve", "offline", "startup"] = Field(
        "serve", description="serve: a server per config, benchmarked by clients; offline: `vllm bench "
        "throughput|latency` per point; startup: `vllm bench startup` per point (cold and warm starts)")
    serve: ServeSpec | None = Field(None, description="the server (mode serve)")
    bench: BenchSpec | None = Field(None, description="the benchmark against it (mode serve)")
    offline: OfflineSpec | None = Field(None, description="the offline benchmark (mode offline)")
    link: dict[str, str] = Field(default_factory=dict,
                                 description="serve parameter -> bench parameter that must be equal")
    placement: PlacementSpec = Field(default_factory=PlacementSpec, description="node rules and concurrency cap")
    order: OrderSpec = Field(default_factory=OrderSpec, description="the order runs go in: rounds within a "
                             "server's life (the order within a round drawn from a seed), and server starts "
                             "per configuration ordered AB BA (`instances`)")
    design: DesignSpec | None = Field(None, description="a campaign that asks for verdicts: several server "
                                      "starts per configuration in interleaved blocks, and runs per start, chosen "
                                      "from the spread and the cost of a start and of a run (`design: auto`, or a "
                                      "mapping); unset: one start per configuration, ranked but not compared")
    confirm: ConfirmSpec = Field(default_factory=ConfirmSpec, description="after the sweep, the leader and the "
                                 "runner-up of each bench shape re-measured on fresh servers in AB BA order; the "
                                 "headline's verdict and the leader's interval come from these runs (true, false, "
                                 "or a mapping; default: on where it costs at most a quarter of the sweep)")
    sla: SlaSpec | None = Field(None, description="search, per config and bench point, the largest load that "
                                "meets latency targets")
    slo: dict[str, float | str] | None = Field(None, description="the service-level objective the report, its "
                                              "conclusions and `compare` rank by: metric -> bound, e.g. "
                                              "{p99_ttft_ms: 500, median_tpot_ms: 50} (a number is <= for a "
                                              "latency, >= for a rate; or \"<=500\" as in sla.targets); only "
                                              "points that meet it are ranked")
    transport: TransportSpec = Field(default_factory=TransportSpec, description="the NCCL transport check")
    storage: str | None = Field(None, description="a filesystem URI (s3://..., gs://..., file:///...) the ledger "
                                "and results are mirrored to after every point")
    report: bool = Field(False, description="when `raysweep run` ends, write the HTML report and the default "
                                            "figures into the output dir and print their paths")
    tracking: TrackingSpec | None = Field(None, description="log every point to MLflow or W&B as it lands, and the "
                                          "report at the end")
    tune: TuneSpec | None = Field(None, description="search the serve parameters (Optuna) instead of running "
                                  "their whole grid")
    cost: CostSpec | None = Field(None, description="prices: $ per million tokens beside every point, and the "
                                  "campaign's own GPU-hours and cost (docs/energy.md)")

    @field_validator("storage")
    @classmethod
    def _storage_uri(cls, v: str | None) -> str | None:
        schemes = ("s3", "gs", "gcs", "hdfs", "viewfs", "file", "abfs", "abfss")
        if v is not None and ("://" not in v or v.split("://", 1)[0] not in schemes):
            accepted = ", ".join(f"{s}://" for s in schemes)
            raise ValueError(f"{v!r} is not a filesystem URI; accepted schemes: {accepted}")
        return v

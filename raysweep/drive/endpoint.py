"""Endpoints that already run: a campaign with `serve.url` instead of `serve.cmd`.

Each endpoint is one server configuration of the plan (its one serve parameter is `endpoint`, its URL), so
the bench grid, runs, ledger, resume, aggregates, SLA searches, report and compare work as for servers
raysweep starts. Nothing is started or stopped: `EndpointLife` runs a configuration's points against the
endpoint from the campaign's client actors (on the Ray cluster given with `--address`, else on an embedded
local Ray on this machine, where AIPerf, GuideLLM and `vllm bench serve --base-url` run their clients too).

Before anything starts, `check_endpoints` asks every endpoint for `/v1/models` (an endpoint that does not
answer, or answers without an OpenAI API, is a user error naming `serve.url[i]`) and for `/version`. The
validity record of every point says that the server was not raysweep's (`server_origin: endpoint`): its
niceness, CPUs and GPUs are unknown, and its versions too unless `/version` answered. Caches are reset
between points only when the endpoint names a `reset_url` (POSTed before every point); `metrics_url`
(default: the endpoint's own `/metrics`) is scraped during every point.

An endpoint that stops answering fails the point that was running (recorded with the reason, as any failed
point), its other points stay pending and the campaign ends early; `raysweep resume` continues once it
answers again.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from raysweep.drive import hooks
from raysweep.drive.config_life import ConfigLife
from raysweep.drive.point import PointRunner
from raysweep.drive.state import EventSink, RunState
from raysweep.errors import CampaignError
from raysweep.place import placement

if TYPE_CHECKING:
    from raysweep.campaign.loading import CampaignSpec
    from raysweep.campaign.models import Campaign
    from raysweep.record.directory import CampaignDir
from raysweep.plan.cost import point_cost_fields
from raysweep.plan.plan import Plan, PointRun
from raysweep.serve.live_server import ConfigRun, Server, Servers, new_server_id

__all__ = ["ENDPOINT_KEY", "Endpoint", "EndpointCluster", "EndpointLife", "EndpointServer", "EndpointWork",
           "check_endpoints", "endpoint_lines", "endpoints_of", "is_endpoint_campaign", "probe", "run_parts"]

log = logging.getLogger(__name__)

ENDPOINT_KEY = "endpoint"   # the one serve parameter of an endpoint campaign: the endpoint's URL
ORIGIN = "endpoint"         # `server_origin` of a point measured on an endpoint raysweep did not start
UNKNOWN = "niceness, CPU affinity, GPUs"  # what raysweep cannot know of a server it did not start
NODE_ID = "endpoints"       # the one pseudo-node endpoint configurations are "placed" on (no GPUs taken)


@dataclass(frozen=True)
class Endpoint:
    """One running endpoint: its base URL, where its Prometheus metrics are, what resets its caches."""

    url: str
    metrics_url: str | None = None
    reset_url: str | None = None
    model: str | None = None
    gpus: int | None = None   # declared (`gpus`, else `serve.gpus`): the runs' gpu_count; None: unknown


def _base(url: str) -> str:
    return url.rstrip("/").removesuffix("/v1")


def endpoints_of(spec: CampaignSpec | Campaign) -> list[Endpoint]:
    """The endpoints of a campaign's `serve.url` (a URL, or a list of URLs and mappings), in order."""
    serve = getattr(spec.campaign if hasattr(spec, "campaign") else spec, "serve", None)
    given = getattr(serve, "url", None) if serve is not None else None
    if given is None:
        return []
    items = given if isinstance(given, list) else [given]
    gpus = getattr(serve, "gpus", None)
    out = []
    for item in items:
        if isinstance(item, str):
            out.append(Endpoint(_base(item), gpus=gpus))
        else:
            data = item if isinstance(item, dict) else item.model_dump()
            out.append(Endpoint(_base(data["url"]), data.get("metrics_url"), data.get("reset_url"), data.get("model"),
                                data.get("gpus") or gpus))
    return out


def is_endpoint_campaign(spec: CampaignSpec | Campaign) -> bool:
    return bool(endpoints_of(spec))


def _get(url: str, timeout_s: float) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status, resp.read(1 << 20).decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(4096).decode(errors="replace")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return 0, f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"


def probe(url: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """What an endpoint says of itself: `{"ok", "error", "models", "version"}`. ok: `/v1/models` answered with
    an OpenAI model list; `version` is vLLM's `/version` when it answers (None otherwise)."""
    status, body = _get(url + "/v1/models", timeout_s)
    if status == 0:
        return {"ok": False, "error": f"does not answer ({body})", "models": [], "version": None}
    try:
        data = json.loads(body)
        models = [str(m["id"]) for m in data["data"]]
    except (ValueError, KeyError, TypeError):
        return {"ok": False, "models": [], "version": None,
                "error": f"answers without an OpenAI API: GET /v1/models gave HTTP {status}, not a model list "
                         f"({body.strip()[:120]!r})"}
    vstatus, vbody = _get(url + "/version", min(timeout_s, 5.0))
    version = None
    if vstatus == 200:
        try:
            version = str(json.loads(vbody).get("version")) or None
        except (ValueError, AttributeError):
            version = None
    return {"ok": True, "error": None, "models": models, "version": version}


def check_endpoints(spec: CampaignSpec, timeout_s: float = 10.0) -> dict[str, dict[str, Any]]:
    """Every endpoint of the campaign answers with an OpenAI API (and serves `model` where one is named);
    what each said, by URL.

    :raises CampaignError: naming `serve.url[i]` (or `serve.url`) and what was wrong.
    """
    eps = endpoints_of(spec)
    assert spec.campaign.serve is not None  # an endpoint campaign has serve.url
    many = isinstance(spec.campaign.serve.url, list)
    out = {}
    for i, ep in enumerate(eps):
        where = f"serve.url[{i}]" if many else "serve.url"
        info = probe(ep.url, timeout_s)
        if not info["ok"]:
            raise CampaignError(where, f"{ep.url} {info['error']}; it must be the base URL of a running "
                                       "OpenAI-compatible server (e.g. http://HOST:8000), which lists its models "
                                       "at /v1/models")
        if not info["models"]:
            raise CampaignError(where, f"{ep.url} serves no model (/v1/models is empty)")
        if ep.model is not None and ep.model not in info["models"]:
            raise CampaignError(where, f"{ep.url} serves {', '.join(info['models'])}, not model {ep.model!r}")
        out[ep.url] = info
    return out


def endpoint_lines(ep: Endpoint) -> list[str]:
    """Where an endpoint configuration runs (for the dry run)."""
    return [f"  endpoint: {ep.url} (running already; raysweep starts and stops nothing)",
            (f"  metrics: {ep.metrics_url or ep.url + '/metrics'}; cache reset: "
             f"{('POST ' + ep.reset_url) if ep.reset_url else 'none (no reset_url)'}")]


# ---------------------------------------------------------------------------------------------------
# Running against endpoints
# ---------------------------------------------------------------------------------------------------

@dataclass
class EndpointServer(Server):
    """An endpoint seen as a live server: no host actor, no process of ours; down when it stops answering."""

    endpoint: Endpoint = field(default_factory=lambda: Endpoint(""))

    @property
    def metrics_url(self) -> str:
        return self.endpoint.metrics_url or self.url

    def down(self, tries: int = 3, wait_s: float = 1.0) -> str | None:
        """Why the endpoint is down, or None: it is down when `/v1/models` failed `tries` times in a row, `wait_s`
        apart (one connection reset on a lossy link is not a server gone)."""
        for i in range(tries):
            status, body = _get(self.url + "/v1/models", 5.0)
            if status == 200:
                return None
            if i + 1 < tries:
                time.sleep(wait_s)
        return (f"the endpoint {self.url} stopped answering ({f'HTTP {status}' if status else body}; "
                f"{tries} tries, {wait_s:g} s apart)")

    def log_tail(self, lines: int = 40) -> str:
        return f"(no server log: the endpoint {self.url} is not raysweep's)"

    def reset_caches(self) -> str:
        if not self.endpoint.reset_url:
            return "not reset (endpoint without reset_url)"
        req = urllib.request.Request(self.endpoint.reset_url, method="POST", data=b"")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return "reset" if 200 <= resp.status < 300 else f"reset failed: HTTP {resp.status}"
        except urllib.error.HTTPError as exc:
            return f"reset failed: HTTP {exc.code}"
        except (urllib.error.URLError, OSError) as exc:
            return f"reset failed: {exc}"


class EndpointPoints(PointRunner):
    """Points against an endpoint: its own cache reset, and the record saying the server was not ours."""

    def reset(self, run: ConfigRun, server: Server) -> str:
        if self.work.plan.spec.after_bench_argv or not isinstance(server, EndpointServer):
            return super().reset(run, server)
        return server.reset_caches()

    def record(self, run: ConfigRun, server: Server, point: PointRun, result: dict[str, Any], attempt: int,
               started: float, reset: str, out: dict[str, Any]) -> dict[str, Any]:
        rec = super().record(run, server, point, result, attempt, started, reset, out)
        version = (server.provenance or {}).get("vllm")
        endpoint = getattr(self.work, "endpoints", {}).get(run.serve.id)
        gpus = endpoint.gpus if endpoint is not None else None  # declared with the endpoint, else unknown
        rec.update(server_origin=ORIGIN, endpoint_url=server.url,
                   server_unknown=UNKNOWN + ("" if version else ", versions"),
                   gpu_count=gpus, gpus_per_node=None, num_nodes=None)
        if self.c.cost is not None:  # priced again without the GPUs the endpoint's are not known to be
            for key in [k for k in rec if k.startswith("cost_")]:
                del rec[key]
            rec.update(point_cost_fields(self.c.cost, rec))
        return rec


class EndpointServers(Servers):
    """No transport to read and nothing to stop on an endpoint."""

    def check_transport(self, run: ConfigRun, server: Server) -> str | None:
        return None

    def read_transport(self, run: ConfigRun | None, server: Server) -> dict[str, Any] | None:
        return None


class EndpointWork(RunState):
    """A campaign's shared state where an endpoint that stopped answering has no work left in this run."""

    def __init__(self, plan: Plan, directory: CampaignDir, emit: EventSink) -> None:
        super().__init__(plan, directory, emit, with_gpus=False)
        self.lost: dict[str, str] = {}
        self.endpoints = {s.id: ep for s, ep in zip(plan.serves, endpoints_of(plan.spec))}

    def work_left(self, serve_id: str) -> int:
        return 0 if serve_id in self.lost else super().work_left(serve_id)

    def pace(self, serve_id: str) -> tuple[float, float] | None:
        return None


class EndpointLife(ConfigLife):
    """The life of one endpoint configuration: connect, run its points or SLA searches, let go."""

    def __init__(self, work: EndpointWork) -> None:
        super().__init__(work)
        self.ework = work
        self.servers = EndpointServers(work)
        self.points = EndpointPoints(work)
        self.searches = hooks.sla_searches()(work, self.points)

    def main(self, run: ConfigRun) -> None:
        try:
            try:
                run.outcome = self._run_endpoint(run)
            finally:
                run.drop_client()
        except Exception as exc:  # reported to the scheduler, which stops the campaign
            log.exception("endpoint config %s", run.serve.id)
            run.outcome = f"error: {type(exc).__name__}: {exc}"

    def _run_endpoint(self, run: ConfigRun) -> str:
        w = self.ework
        runnable = w.ledger.runnable(run.serve.id, self.c.max_attempts)
        if not w.work_left(run.serve.id):
            return "finished"
        server = self.connect(run)
        if server is None:
            return "stopped"
        try:
            self._run_points(run, server, runnable)
        finally:
            why = server.down()
            w.ledger.update_server(server.server_id, stopped_at=time.time(),
                                   state="released" if why is None else "lost", **({"error": why} if why else {}))
            w.emit("server_stopped", server_id=server.server_id, left=[])
            if why is not None:
                self._lost(run, server.server_id, why)
        return "aborted" if run.abort else "stopped"

    def connect(self, run: ConfigRun) -> EndpointServer | None:
        """The endpoint as a ready server (its ledger row written), or None when it does not answer."""
        w = self.ework
        ep = w.endpoints[run.serve.id]
        server_id = new_server_id(run.serve.id)
        w.ledger.add_server(server_id, run.serve.id, f"endpoint {ep.url} (not started by raysweep)")
        w.emit("server_starting", serve=run.serve, server_id=server_id, layout=run.layout)
        t0 = time.monotonic()
        info = probe(ep.url)
        if not info["ok"] or not info["models"]:
            why = f"the endpoint {ep.url} {info['error'] or 'serves no model'}"
            w.ledger.update_server(server_id, state="failed", error=why, stopped_at=time.time())
            self._lost(run, server_id, why)
            return None
        model = ep.model or info["models"][0]
        run.serve = replace(run.serve, argv=["--served-model-name", model])  # the model the clients ask for
        host = urllib.parse.urlsplit(ep.url).hostname or ""
        server = EndpointServer(server_id, [], url=ep.url, endpoint=ep,
                                nodes=[{"hostname": host, "node_ip": host, "node_id": "", "gpu_ids": ""}])
        server.provenance = {"vllm": info["version"], "model": model, "hostnames": [host]}
        w.ledger.update_server(server_id, state="ready", ready_at=time.time(), hostname=host,
                               provenance=json.dumps(server.provenance))
        w.emit("server_ready", serve=run.serve, server_id=server_id, elapsed=time.monotonic() - t0)
        return server

    def _lost(self, run: ConfigRun, server_id: str, why: str) -> None:
        """The endpoint stopped answering: its points left stay pending for a resume."""
        w = self.ework
        w.lost[run.serve.id] = why
        log.error("server config %s: %s; its points left stay pending (`raysweep resume` continues)",
                  run.serve.id, why)
        w.emit("server_failed", serve=run.serve, server_id=server_id, error=why, log_tail="")
        if not w.stop_reason and len(w.lost) == len(w.endpoints):
            w.stop_reason = f"{why}; `raysweep resume` continues once it answers"


class EndpointCluster:
    """The scheduler's `Cluster` for endpoints: one pseudo-node without GPUs (an endpoint takes nothing of
    the Ray cluster but the CPUs of its client actors), each configuration in its own thread."""

    def __init__(self, life: EndpointLife, cluster: Callable[[EndpointLife], Any]) -> None:
        self._inner = cluster(life)  # the driver's RayCluster: threads per configuration, as on Ray

    def nodes(self) -> list[placement.NodeInfo]:
        return [placement.NodeInfo(NODE_ID, "", 0, 0.0)]

    def __getattr__(self, name: str) -> Any:  # start, finished, abort, wait, join: as on Ray
        return getattr(self._inner, name)


def run_parts(plan: Plan, directory: CampaignDir, emit: EventSink,
              cluster: Callable[[EndpointLife], Any]) -> tuple[EndpointWork, EndpointCluster]:
    """The work and cluster of an endpoint campaign, for `raysweep.drive.driver.run_plan`, which passes its
    `RayCluster` as `cluster` (so this module needs nothing of the driver)."""
    work = EndpointWork(plan, directory, emit)
    return work, EndpointCluster(EndpointLife(work), cluster)

"""The life of a P/D deployment's servers: every role's servers started in their bundles of the deployment's
placement group (`raysweep.place.pd`), each by a `ServerHost` as any server raysweep starts, then raysweep's
router in front (`raysweep.serve.pd_router`), the URL a bench runs against.

With NIXL, every server of the deployment gets a side channel of its own: `VLLM_NIXL_SIDE_CHANNEL_HOST` its
node's address (vLLM's default, localhost, is unreachable from another node) and
`VLLM_NIXL_SIDE_CHANNEL_PORT` the first of as many free ports on its node as its data-parallel ranks (vLLM
adds the rank to it), none shared with another server of the deployment; a role's `env` that sets either
keeps its value (`nixl_side_channels`).

A server that dies is its role's failure (`down()` names the role and server); the deployment is then
stopped whole and started again, never a role alone: a decode server can crash on stale transfer state after
its prefill peer restarts (vllm#49238).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ray

from raysweep.campaign.pd import Deployment, RoleInstance
from raysweep.place.pd import ROUTER, PDReservation
from raysweep.serve.pd_router import PDRouter, RouterThread
from raysweep.serve.pd_settings import effective_settings
from raysweep.serve.server import ServerHost, engine_timeout_env, expected_model

if TYPE_CHECKING:
    from ray.actor import ActorHandle

__all__ = ["PDServers", "PrefilledRequests", "RoleFailure", "RouterHost", "deployment_counts", "nixl_side_channels",
           "point_fields", "prefilled_requests", "prompt_sources", "read_role_settings", "role_of", "role_settings",
           "start_deployment"]

log = logging.getLogger(__name__)


@ray.remote(max_restarts=0, max_concurrency=4)
class RouterHost:
    """The router of one deployment, in its own bundle of the deployment's placement group, on that node's
    address (where the bench's clients reach it)."""

    def __init__(self, prefill: list[str], decode: list[str], send_kv_params: bool) -> None:
        self.thread = RouterThread(PDRouter.of(prefill, decode, send_kv_params), ray.util.get_node_ip_address())

    def url(self) -> str:
        return self.thread.url

    def stats(self) -> dict[str, Any]:
        return self.thread.router.stats()

    def stop(self) -> None:
        self.thread.stop()


@dataclass(frozen=True)
class RoleFailure:
    """Why a deployment failed: the role and server at fault, and what happened to it."""

    role: str
    server: str
    why: str

    def text(self) -> str:
        return f"{self.role} server {self.server}: {self.why}"


@dataclass
class PDServers:
    """A started deployment: its role servers (prefill first), their hosts and URLs, and the router."""

    deployment: Deployment
    instances: list[RoleInstance]
    hosts: list[Any]
    urls: list[str]
    router: ActorHandle | None = None  # its RouterHost actor
    url: str = ""       # the router's URL: what the bench runs against
    infos: list[dict[str, Any]] = field(default_factory=list)

    def identity(self) -> dict[str, Any]:
        return self.deployment.identity()

    def down(self) -> RoleFailure | None:
        """None while every server of both roles runs; otherwise the first role server that ended."""
        for inst, host in zip(self.instances, self.hosts, strict=True):
            try:
                code = ray.get(host.exit_code.remote(), timeout=30)
            except ray.exceptions.RayError as exc:
                return RoleFailure(inst.role, inst.name, f"its host actor was lost ({type(exc).__name__})")
            if code is not None:
                return RoleFailure(inst.role, inst.name, f"exit code {code}")
        return None

    def decode_prompt_sources(self) -> dict[str, float]:
        """The decode servers' prompt tokens by source, summed: what they received through the connector
        (external_kv_transfer) against what they prefilled themselves (local_compute)."""
        import urllib.request

        total: dict[str, float] = {}
        for inst, url in zip(self.instances, self.urls, strict=True):
            if inst.role == "decode":
                with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
                    for k, v in prompt_sources(resp.read().decode()).items():
                        total[k] = total.get(k, 0.0) + v
        return total

    def role_stats(self) -> dict[str, Any]:
        """The router's requests and failures per role."""
        return ray.get(self.router.stats.remote(), timeout=30) if self.router is not None else {}

    def logs(self, role: str) -> list[str]:
        """The whole logs of the servers of `role`."""
        return [ray.get(h.read_log.remote()) for i, h in zip(self.instances, self.hosts, strict=True)
                if i.role == role]

    def stop(self) -> list[dict[str, Any]]:
        """Stop the router, then every server (decode first: it holds transfers from prefill); kill the hosts."""
        if self.router is not None:
            try:
                ray.get(self.router.stop.remote(), timeout=60)
            except ray.exceptions.RayError as exc:
                log.warning("the P/D router did not stop cleanly: %s", exc)
            ray.kill(self.router)
            self.router = None
        out = []
        for host in reversed(self.hosts):
            try:
                out.append(ray.get(host.stop.remote(), timeout=120))
            except ray.exceptions.RayError as exc:
                out.append({"error": f"{type(exc).__name__}: {exc}"})
            ray.kill(host)
        return out


def start_deployment(dep: Deployment, argv: list[str], env: dict[str, str], res: PDReservation, name: str,
                     ready_timeout_s: float = 600.0, log_dir: str | None = None) -> PDServers | RoleFailure:
    """Start every server of `dep` in its bundle of `res`, wait until all are ready, start the router.
    A server that does not become ready is returned as its role's failure, with everything stopped."""
    instances = dep.instances(argv, {}, env)
    hosts = [ServerHost.options(  # type: ignore[attr-defined]
        **res.actor_options(i.role, i.index)).remote(f"{name}-{i.name}", log_dir)
             for i in instances]
    started = PDServers(dep, instances, hosts, [])
    try:
        side = nixl_side_channels(dep, instances, hosts) if dep.connector.startswith("Nixl") else {}
        for inst, host in zip(instances, hosts, strict=True):
            env = engine_timeout_env({**inst.env, **side.get(inst.name, {})}, ready_timeout_s)
            started.infos.append(ray.get(host.start.remote(inst.argv, env, nccl_debug=False), timeout=120))
        model = expected_model(argv)
        for inst, host in zip(instances, hosts, strict=True):
            ready = ray.get(host.wait_ready.remote(ready_timeout_s, model), timeout=ready_timeout_s + 60)
            if not ready.get("ok"):
                tail = ray.get(host.log_tail.remote(20))
                started.stop()
                return RoleFailure(inst.role, inst.name, f"{ready.get('error')}\n{tail}")
        started.urls = [ray.get(h.url.remote()) for h in hosts]
    except Exception:
        started.stop()
        raise
    pre = [u for u, i in zip(started.urls, instances, strict=True) if i.role == "prefill"]
    dec = [u for u, i in zip(started.urls, instances, strict=True) if i.role == "decode"]
    try:
        started.router = RouterHost.options(**res.actor_options(ROUTER)).remote(  # type: ignore[attr-defined]
            pre, dec, dep.connector.startswith("Nixl"))
        started.url = ray.get(started.router.url.remote(), timeout=120)
    except Exception:
        started.stop()
        raise
    log.info("deployment %s ready behind %s", dep.describe(), started.url)
    return started


NIXL_HOST, NIXL_PORT = "VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT"


def nixl_side_channels(dep: Deployment, instances: list[RoleInstance], hosts: list[Any]) -> dict[str, dict[str, str]]:
    """Per server (by name), the NIXL side-channel variables it gets (see the module docstring)."""
    ranks = {r.name: r.dp for r in dep.roles}
    taken: dict[str, list[int]] = {}  # per node address, the ports given so far
    out: dict[str, dict[str, str]] = {}
    for inst, host in zip(instances, hosts, strict=True):
        ip = ray.get(host.node_info.remote(), timeout=120)["node_ip"]
        env = {} if NIXL_HOST in inst.env else {NIXL_HOST: ip}
        if NIXL_PORT not in inst.env:
            n = ranks[inst.role]
            base = int(ray.get(host.pick_ports.remote(n, taken.get(ip, [])), timeout=120))
            taken.setdefault(ip, []).extend(range(base, base + n))
            env[NIXL_PORT] = str(base)
        out[inst.name] = env
    return out


# Effective settings of each role (read here; parsed and compared in raysweep.serve.pd_settings)
# ---------------------------------------------------------------------------------------------------

def role_settings(servers: PDServers) -> dict[str, dict[str, Any]]:
    """The effective settings of every server of a started deployment, by server name (prefill-0, ...)."""
    return read_role_settings(servers.instances, servers.hosts)


def read_role_settings(instances: list[RoleInstance], hosts: list[Any]) -> dict[str, dict[str, Any]]:
    """`effective_settings` of each role server, read from the log its host keeps, by server name: a server
    whose log has no `non-default args` line (or whose host does not answer) has {}."""
    refs = [h.read_log.remote() for h in hosts]
    out: dict[str, dict[str, Any]] = {}
    for inst, ref in zip(instances, refs, strict=True):
        try:
            out[inst.name] = effective_settings(ray.get(ref, timeout=60))
        except ray.exceptions.RayError as exc:
            log.info("the log of %s server %s was not read (%s)", inst.role, inst.name, exc)
            out[inst.name] = {}
    return out


_SOURCE = re.compile(r'^vllm:prompt_tokens_by_source_total\{([^}]*)\}\s+([0-9.eE+-]+)', re.M)


def prompt_sources(metrics_text: str) -> dict[str, float]:
    """A vLLM server's prompt tokens by source (`vllm:prompt_tokens_by_source_total`): local_compute (prefilled
    by the server itself), local_cache_hit, external_kv_transfer (received through the connector)."""
    out: dict[str, float] = {}
    for labels, value in _SOURCE.findall(metrics_text):
        m = re.search(r'source="([^"]+)"', labels)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(value)
    return out


_COMPUTED = "vllm:request_prefill_kv_computed_tokens"


@dataclass(frozen=True)
class PrefilledRequests:
    """A vLLM server's finished requests, counted from `vllm:request_prefill_kv_computed_tokens` (per request,
    the prompt tokens the server computed itself, its cache hits, local or received through the connector,
    left out): `finished` in all, and `over` those it computed more than `bound` tokens of, `bound` being
    the histogram's first bucket bound at or above one KV block (`block_size`, from `vllm:cache_config_info`).
    A decode server whose KV arrived computes less than a block of each prompt (the tail the blocks do not
    cover); one that computed more prefilled the prompt again. The buckets set the resolution: with vLLM's
    default bounds (1, 2, 5, 10, 20, 50, 100, 200, 500, ...) and the CPU build's 128-token blocks the bound
    is 200 tokens, and a prompt of fewer tokens prefilled again shows only in the tokens
    (`pd_decode_prefilled_tokens`)."""

    finished: float
    over: float
    bound: float


def prefilled_requests(metrics_text: str) -> PrefilledRequests | None:
    """`PrefilledRequests` from one server's /metrics body, summed over its engines; None where the server
    reports no such histogram or no block size."""
    from prometheus_client.parser import text_string_to_metric_families

    block: float | None = None
    buckets: dict[float, float] = {}
    finished = 0.0
    for fam in text_string_to_metric_families(metrics_text):
        for s in fam.samples:
            if s.name == "vllm:cache_config_info" and s.labels.get("block_size", "").isdigit():
                block = float(s.labels["block_size"])
            elif s.name == _COMPUTED + "_bucket":
                le = float(s.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + float(s.value)
            elif s.name == _COMPUTED + "_count":
                finished += float(s.value)
    bounds = sorted(le for le in buckets if block is not None and block <= le < float("inf"))
    if not bounds:
        return None
    return PrefilledRequests(finished, finished - buckets[bounds[0]], bounds[0])


# ---------------------------------------------------------------------------------------------------
# What one point did to a deployment: requests and failures per role, KV received against prefilled again
# ---------------------------------------------------------------------------------------------------

def deployment_counts(router: ActorHandle, servers: dict[str, str] | list[str]) -> dict[str, Any]:
    """The counters a point's fields are the difference of: the router's requests and failures per role, and
    the role servers' prompt tokens by source, each server's apart (`by_server`, by name: `prefill-0`, ...;
    None for one whose /metrics did not answer) and the decode servers' summed (`sources`: None where one of
    them did not answer). `servers`: the role servers' URLs by name (a list: decode servers only)."""
    import urllib.request

    if isinstance(servers, list):
        servers = {f"decode-{i}": url for i, url in enumerate(servers)}
    stats = ray.get(router.stats.remote(), timeout=30)
    by_server: dict[str, dict[str, float] | None] = {}
    requests: dict[str, PrefilledRequests | None] = {}
    for name, url in servers.items():
        try:
            with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
                text = resp.read().decode()
        except OSError as exc:
            log.info("the %s server at %s gave no /metrics (%s)", name, url, exc)
            by_server[name] = requests[name] = None
            continue
        by_server[name], requests[name] = prompt_sources(text), prefilled_requests(text)
    return {"stats": stats, "sources": _summed(by_server, "decode"), "by_server": by_server, "requests": requests}


def role_of(server_name: str) -> str:
    """The role of a role server by its name (`decode-1` -> `decode`)."""
    return server_name.rpartition("-")[0]


def _summed(by_server: dict[str, dict[str, float] | None], role: str) -> dict[str, float] | None:
    """The prompt tokens by source of a role's servers summed; None where one of them gave none."""
    total: dict[str, float] = {}
    for name, found in by_server.items():
        if role_of(name) != role:
            continue
        if found is None:
            return None
        for k, v in found.items():
            total[k] = total.get(k, 0.0) + v
    return total


def point_fields(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """A point's P/D fields from the counters before and after it (`deployment_counts`):
    `pd_<role>_requests` and `pd_<role>_failures` as the router counted them, and, where the decode servers
    report their prompt tokens by source, `pd_kv_received_tokens` (received through the connector) and
    `pd_decode_prefilled_tokens` (computed by the decode servers themselves: a transfer that silently fails
    shows here, as prompts prefilled twice, not only as a slower point), summed over every decode server; and
    where every decode server reports `vllm:request_prefill_kv_computed_tokens`, the requests it prefilled
    again (`pd_decode_prefilled_requests`, more than `pd_decode_prefilled_bound_tokens` of the prompt computed
    by the decode server itself: `PrefilledRequests`) out of `pd_decode_finished_requests`.
    Where the counters were read server by server: `pd_prefill_computed_tokens` (the prompt tokens the
    prefill servers computed, summed over them, where each reports them) and `pd_server_tokens`, a JSON
    object of each role server's prompt tokens by source over the point (`{"decode-0": {"external_kv_transfer":
    2048.0, "local_compute": 352.0, ...}, "prefill-0": {...}}`; a server without them is left out)."""
    out: dict[str, Any] = {}
    for role in ("prefill", "decode"):
        a, b = (after.get("stats") or {}).get(role) or {}, (before.get("stats") or {}).get(role) or {}
        for k in ("requests", "failures"):
            out[f"pd_{role}_{k}"] = int(a.get(k, 0)) - int(b.get(k, 0))
    src_a, src_b = after.get("sources"), before.get("sources")
    if src_a and src_b is not None:
        out["pd_kv_received_tokens"] = src_a.get("external_kv_transfer", 0.0) - src_b.get("external_kv_transfer", 0.0)
        out["pd_decode_prefilled_tokens"] = src_a.get("local_compute", 0.0) - src_b.get("local_compute", 0.0)
    out.update(_prefilled_fields(before.get("requests"), after.get("requests")))
    each_a, each_b = after.get("by_server"), before.get("by_server")
    if each_a is None or each_b is None:
        return out
    per = {name: {k: v - (each_b[name] or {}).get(k, 0.0) for k, v in sorted(found.items())}
           for name, found in each_a.items() if found and each_b.get(name) is not None}
    if per:
        out["pd_server_tokens"] = json.dumps(per, sort_keys=True)
    prefill = [n for n in each_a if role_of(n) == "prefill"]
    if prefill and all(n in per and "local_compute" in per[n] for n in prefill):
        out["pd_prefill_computed_tokens"] = sum(per[n]["local_compute"] for n in prefill)
    return out


def _prefilled_fields(before: dict[str, PrefilledRequests | None] | None,
                      after: dict[str, PrefilledRequests | None] | None) -> dict[str, Any]:
    """`pd_decode_prefilled_requests` (the point's requests whose prompt a decode server computed more than
    `pd_decode_prefilled_bound_tokens` tokens of itself, summed over the decode servers) and
    `pd_decode_finished_requests`, where every decode server gave its histogram before and after."""
    decode = [n for n in (after or {}) if role_of(n) == "decode"]
    pairs = [((before or {}).get(n), (after or {}).get(n)) for n in decode]
    done = [(b, a) for b, a in pairs if a is not None and b is not None]
    if not decode or len(done) < len(pairs):
        return {}
    return {"pd_decode_prefilled_requests": int(sum(a.over - b.over for b, a in done)),
            "pd_decode_finished_requests": int(sum(a.finished - b.finished for b, a in done)),
            "pd_decode_prefilled_bound_tokens": int(max(a.bound for _, a in done))}

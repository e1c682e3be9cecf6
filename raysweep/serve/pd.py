"""The life of a P/D deployment's servers: every role's servers started in their bundles of the deployment's
placement group (`raysweep.place.pd`), each by a `ServerHost` as any server raysweep starts, then raysweep's
router in front (`raysweep.serve.pd_router`), the URL a bench runs against.

A server that dies is its role's failure (`down()` names the role and server); the deployment is then
stopped whole and started again, never a role alone: a decode server can crash on stale transfer state after
its prefill peer restarts (vllm#49238).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import ray

from raysweep.campaign.pd import Deployment, RoleInstance
from raysweep.place.pd import ROUTER, PDReservation
from raysweep.serve.pd_router import PDRouter, RouterThread
from raysweep.serve.server import ServerHost, expected_model

__all__ = ["PDServers", "RoleFailure", "RouterHost", "start_deployment"]

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
    router: Any = None  # its RouterHost actor
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
        for inst, host in zip(instances, hosts, strict=True):
            started.infos.append(ray.get(host.start.remote(inst.argv, inst.env, nccl_debug=False), timeout=120))
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

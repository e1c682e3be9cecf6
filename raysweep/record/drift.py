"""Settings drift: what a campaign's points were measured with, and a resume that finds it changed.

Beside the campaign's fingerprint (the commands: what a point means), the ledger keeps what the points were
measured with: the raysweep, vLLM and Ray versions (of the driver's host, and the distinct versions on the
cluster's nodes), the warmup, the client backend, its actors and its guard, and the transport settings. A
run or resume that finds any of them changed after points were finished refuses, listing the differences,
unless the change is accepted (`--accept-changes`); an accepted change is kept as a `settings_changed` event,
which `raysweep status` and the report show.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
from typing import TYPE_CHECKING, Any

import ray

from raysweep.errors import LedgerError
from raysweep.ledger import Ledger, PointState
from raysweep.version import __version__

if TYPE_CHECKING:
    from raysweep.campaign.loading import CampaignSpec

__all__ = ["EVENT", "SETTINGS_KEY", "SettingsChanged", "check", "differences", "measured_with", "node_versions",
           "record"]

log = logging.getLogger(__name__)

SETTINGS_KEY = "measured_with"
EVENT = "settings_changed"
NOT_INSTALLED = "not installed"


class SettingsChanged(LedgerError):
    """What the finished points were measured with differs from what this run would measure with."""

    def __init__(self, diffs: list[str]) -> None:
        super().__init__("what the finished points were measured with changed since:\n  " + "\n  ".join(diffs)
                         + "\nNew points would not be comparable with them. Use another output_dir, or "
                         "--accept-changes to go on (the change is recorded as an event that status and the "
                         "report show)")
        self.diffs = diffs


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return NOT_INSTALLED


def measured_with(spec: CampaignSpec, nodes: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """The settings a campaign's points are measured with here (`nodes`: the distinct versions of raysweep,
    vLLM and Ray on the cluster's nodes, from `node_versions`)."""
    c = spec.campaign
    out: dict[str, Any] = {"raysweep": __version__, "vllm": _version("vllm"), "ray": _version("ray"),
                           "warmup": c.warmup, "transport": c.transport.model_dump(mode="json")}
    if c.bench is not None:
        b = c.bench
        out.update(bench_backend=b.backend, clients=b.clients, max_clients=b.max_clients, client_cpus=b.client_cpus,
                   rerun_client_limited=b.rerun_client_limited, client_guard=b.client_guard.model_dump(mode="json"))
    for name, versions in (nodes or {}).items():
        out[f"nodes_{name}"] = versions
    return out


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """`key: old -> new` for each setting recorded in both that differs (a setting only one side knows, from
    an older raysweep or a check made before Ray started, is no difference)."""
    a, b = _flat(old), _flat(new)
    return [f"{k}: {a[k]!r} -> {b[k]!r}" for k in sorted(set(a) & set(b)) if a[k] != b[k]]


def recorded(ledger: Ledger) -> dict[str, Any] | None:
    text = ledger.meta(SETTINGS_KEY)
    return json.loads(text) if text else None


def check(ledger: Ledger, settings: dict[str, Any], accept: bool) -> list[str]:
    """The differences from what the finished points were measured with (none when no point is done yet);
    refuses them (`SettingsChanged`) unless `accept`. Reads only."""
    old = recorded(ledger)
    if old is None or not ledger.counts().get(PointState.DONE):
        return []
    diffs = differences(old, settings)
    if diffs and not accept:
        raise SettingsChanged(diffs)
    return diffs


def record(ledger: Ledger, settings: dict[str, Any], accepted: list[str]) -> None:
    """Keep what this run measures with; an accepted change becomes a `settings_changed` event."""
    if accepted:
        log.warning("measuring with changed settings (accepted): %s", "; ".join(accepted))
        ledger.add_event(EVENT, [], [], "accepted: " + "; ".join(accepted))
    merged = {**(recorded(ledger) or {}), **settings}
    ledger.set_meta(SETTINGS_KEY, json.dumps(merged, sort_keys=True))


def node_versions(timeout_s: float = 30.0, embedded: bool = False) -> dict[str, list[str]]:
    """The distinct raysweep, vLLM and Ray versions on the cluster's alive nodes (one task each, at once);
    a node that does not answer within `timeout_s` is left out. `embedded`: the cluster is this driver's own
    embedded Ray, whose workers run this interpreter: its versions, without a task (a worker start saved)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if embedded:
        return {k: [v] for k, v in _versions().items()}

    refs = [_versions_here.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
            .remote() for n in ray.nodes() if n.get("Alive")]
    if not refs:
        return {}
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    found: dict[str, set[str]] = {"raysweep": set(), "vllm": set(), "ray": set()}
    for ref in ready:
        try:
            got = ray.get(ref)
        except Exception as exc:
            log.debug("versions of a node: %s", exc)
            continue
        for k, seen in found.items():
            seen.add(got[k])
    return {k: sorted(v) for k, v in found.items()}


def _versions() -> dict[str, str]:
    return {"raysweep": __version__, "vllm": _version("vllm"), "ray": _version("ray")}


@ray.remote(num_cpus=0)
def _versions_here() -> dict[str, str]:
    return _versions()

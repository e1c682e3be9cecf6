"""What the ledger's readers get back: point states, point and server rows, the sync report, and the
refusal when another driver holds the campaign; the conversions from SQLite rows."""

from __future__ import annotations

import json
import math
import sqlite3
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from raysweep.errors import LedgerError


class PointState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True)
class PointRow:
    point_id: str
    serve_id: str
    bench_id: str
    run: int
    serve_params: dict[str, Any]
    bench_params: dict[str, Any]
    in_plan: bool
    state: PointState
    attempts: int
    started_at: float | None
    ended_at: float | None
    server_id: str | None
    error: str | None
    log_tail: str | None
    result_path: str | None
    probe_of: str | None = None  # the bench point whose SLA search added this probe
    tried: int | None = None  # given up: the attempts it really had (`attempts` then counts them all spent)

    @property
    def attempts_made(self) -> int:
        """How many times it was really tried (a point given up has all its attempts counted as spent)."""
        return self.attempts if self.tried is None else self.tried


@dataclass(frozen=True)
class ServerRow:
    server_id: str
    serve_id: str
    command: str
    hostname: str | None
    node_id: str | None
    node_ip: str | None
    port: int | None
    pid: int | None
    pid_create_time: float | None
    gpu_ids: str | None
    ranks: str | None  # JSON: one entry per node of a multi-node server (rank, node, pid, GPUs, log)
    started_at: float
    ready_at: float | None
    stopped_at: float | None
    state: str
    error: str | None
    log_tail: str | None
    log_path: str | None
    transport: str | None = None  # JSON: the NCCL transport verdict (raysweep.place.transport.server_verdict)
    nice: str | None = None  # the server process's niceness (the highest of its ranks)
    cpu_affinity: str | None = None  # its CPU affinity per node: "ip=0-3;ip=0-7"
    provenance: str | None = None  # JSON: versions, GPUs, model, hostnames (raysweep.serve.provenance)
    fabric: str | None = None  # JSON: the all-reduce bandwidth probe before it started (raysweep.place.fabric)
    topology: str | None = None  # JSON: per node, its GPUs' NVLink / PCIe / NUMA topology and the TP warnings
    startup: str | None = None  # JSON: the phases of its start, from its log (raysweep.serve.startup)
    role_settings: str | None = None  # JSON: a P/D deployment's effective settings per role server

    def transport_verdict(self) -> dict[str, Any] | None:
        return dict(json.loads(self.transport)) if self.transport else None

    def fabric_record(self) -> dict[str, Any] | None:
        return dict(json.loads(self.fabric)) if self.fabric else None

    def topology_record(self) -> list[dict[str, Any]] | None:
        return list(json.loads(self.topology)) if self.topology else None

    def role_settings_record(self) -> dict[str, Any] | None:
        return dict(json.loads(self.role_settings)) if self.role_settings else None

    def provenance_record(self) -> dict[str, Any] | None:
        return dict(json.loads(self.provenance)) if self.provenance else None

    def rank_list(self) -> list[dict[str, Any]]:
        """Every node's part of the server: rank, hostname, node_id, node_ip, pid, pid_create_time, gpu_ids."""
        if self.ranks:
            return list(json.loads(self.ranks))
        return [{"rank": 0, "hostname": self.hostname, "node_id": self.node_id, "node_ip": self.node_ip,
                 "pid": self.pid, "pid_create_time": self.pid_create_time, "gpu_ids": self.gpu_ids}]


class CampaignHeld(LedgerError):
    """Another driver that still runs holds the campaign."""

    def __init__(self, driver: dict[str, Any]) -> None:
        super().__init__(f"this campaign is being run by pid {driver['pid']} on {driver['hostname']}; wait for it, "
                         "stop it, or use --force if it is gone (nothing was changed in its output directory)")
        self.driver = driver


@dataclass(frozen=True)
class SyncReport:
    added: int
    in_plan: int
    out_of_plan: int
    fingerprint_changed: bool


def finite(v: float | None) -> float | None:
    return v if v is None or math.isfinite(v) else None


def levels_row(r: sqlite3.Row) -> dict[str, Any]:
    d = dict(r)
    d["levels"] = json.loads(d["levels"])
    return d


def point_row(r: sqlite3.Row) -> PointRow:
    d = dict(r)
    d["serve_params"] = json.loads(d["serve_params"])
    d["bench_params"] = json.loads(d["bench_params"])
    d["in_plan"] = bool(d["in_plan"])
    d["state"] = PointState(d["state"])
    d.pop("updated_at")
    d["tried"] = None if d.get("tried") is None else int(d["tried"])
    return PointRow(**d)


def server_row(r: sqlite3.Row) -> ServerRow:
    return ServerRow(**dict(r))

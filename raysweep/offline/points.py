"""Offline points: `vllm bench throughput` / `latency` run to their end inside a configuration's placement group.

Each point gets fresh host actors (`Servers.hosts`), runs the offline command on every rank (rank 0 writes
`--output-json`, the others run as workers), waits for rank 0 to exit while watching the other ranks, the
time limit and (multi-node) NCCL's transport, and records the parsed result (`raysweep.bench.offline`) as
a point's result. The bench backend itself lives in `raysweep.bench.offline`.
"""

from __future__ import annotations

import time
from typing import Any

import ray

from raysweep.bench import offline
from raysweep.drive.point import PointRunner
from raysweep.drive.state import RunState
from raysweep.place import transport
from raysweep.plan.plan import PointRun
from raysweep.serve.live_server import Aborted, ConfigRun, Server, Servers, new_server_id, resolve_provenance

__all__ = ["OfflinePoints", "load_window_fields"]


def load_window_fields(result: dict[str, Any], exited: float) -> dict[str, float]:
    """Where an offline run's load lies, for its energy (`raysweep.drive.point_energy`): its elapsed time
    (throughput's `elapsed_time`, latency's measured iterations) back from the command's exit, so the weights'
    loading, the engine's start and the warmup iterations before it are not in it; nothing for startup."""
    kind = result.get("offline_kind")
    if kind == "throughput":
        span = result.get("duration")
    elif kind == "latency" and result.get("mean_latency_ms") is not None:
        span = float(result["mean_latency_ms"]) / 1000.0 * int(result.get("num_iters") or 0)
    else:
        return {}
    if span is None or not float(span) > 0:
        return {}
    return {"load_window_start": exited - float(span), "load_window_end": exited}


class OfflinePoints:
    """Runs the offline points of a configuration (see the module docstring)."""

    def __init__(self, work: RunState, servers: Servers, points: PointRunner) -> None:
        self.work, self.servers, self.points = work, servers, points
        self.c = work.c

    def run(self, run: ConfigRun) -> str:
        """Every runnable point of an offline config, one after another in its placement group: each runs the
        offline command to its end on fresh host actors and leaves one JSON."""
        w = self.work
        while not run.abort and not w.stopping():
            points = [p for p in (w.plan.point(r.point_id) for r in
                                  w.ledger.runnable(run.serve.id, self.c.max_attempts)) if p is not None]
            if not points:
                return "finished"
            for point in points:
                outcome = self.one(run, point)
                if outcome == "failed" and not self.c.continue_on_error and not run.abort:
                    w.stop_reason = f"point {point.id} failed and continue_on_error is false"
                if outcome in ("refused", "host lost"):
                    return "finished" if outcome == "refused" else outcome
                if run.abort or w.stopping():
                    break
        return "aborted" if run.abort else "stopped"

    def one(self, run: ConfigRun, point: PointRun) -> str:
        """One offline run: `done`, `failed`, `refused` (transport), `host lost` or `aborted`."""
        w = self.work
        server_id = new_server_id(run.serve.id)
        attempt = w.ledger.mark_running(point.id, server_id)
        w.emit("point_start", point=point, attempt=attempt, server_id=server_id)
        started, t0 = time.time(), time.monotonic()
        server = self.servers.hosts(run, server_id)
        try:
            error, result, command = self._execute(run, server, point)
        except Aborted as exc:
            self.servers.stop(server, state="stopped")
            self.points.abandon(point, str(exc), attempt)
            return "aborted"
        if server.transport is None and not server.host_lost:
            self.servers.read_transport(run if not run.abort else None, server)
        if not server.host_lost:  # read while its host actors live: the result record carries it
            resolve_provenance(server, w.ledger)
        refused = transport.refusal(server.transport, self.c.transport.require) if server.transport else None
        tail = server.log_tail() if error or refused else None
        self.servers.stop(server, state="stopped" if error is None else "failed")
        if refused:
            w.ledger.mark_failed(point.id, refused, tail)
            w.give_up(run.serve, refused, search_state="transport refused")
            w.emit("point_failed", point=point, error=refused, attempt=attempt)
            return "refused"
        if error is not None or result is None:
            error = error or "no result"
            if server.host_lost:
                w.ledger.requeue(point.id, error, self.c.max_attempts)
            else:
                w.ledger.mark_failed(point.id, error, tail)
            w.ledger.update_server(server_id, error=error, log_tail=tail)
            w.emit("point_failed", point=point, error=error, attempt=attempt)
            return "host lost" if server.host_lost else "failed"
        out = {"command": command, "duration_s": time.monotonic() - t0}
        self.points.finish(run, server, point, result, attempt, started, "n/a (offline)", out)
        return "done"

    def _execute(self, run: ConfigRun, server: Server,
                 point: PointRun) -> tuple[str | None, dict[str, Any] | None, str | None]:
        """Launch the command on every rank and read rank 0's result: (error, result, command). Raises Aborted."""
        error, result, command = None, None, None
        kind = offline.offline_kind(run.serve.argv)
        try:
            json_path = run.wait(server.hosts[0].scratch_path.remote(f"{server.server_id}.json"), 300)[1]
            self.servers.launch(run, server, offline.offline_argv(run.serve.argv, json_path), serve_http=False,
                                follower_argv=offline.worker_argv(run.serve.argv))
            command = server.infos[0]["command"]
            self.work.ledger.update_server(server.server_id, state="running")
            code, error = self._wait(run, server)
            exited = time.time()
            if error is None:
                text = run.wait(server.hosts[0].read_text.remote(json_path), 120)[1]
                log_text = run.wait(server.hosts[0].read_log.remote(), 120)[1]
                if code != 0:
                    error = f"the command exited with code {code}"
                elif text is None:
                    error = "the command ended without writing its --output-json file"
                else:
                    result = offline.parse_result(kind, text, log_text)
                    result["offline_params"] = ",".join(point.serve.params)
                    result.update(load_window_fields(result, exited))
        except ray.exceptions.RayError as exc:
            server.host_lost = True
            error = f"host actor failed: {type(exc).__name__}: {exc}"
        except (ValueError, KeyError, TypeError) as exc:
            error = f"the result JSON could not be read: {type(exc).__name__}: {exc}"
        return error, result, command

    def _wait(self, run: ConfigRun, server: Server) -> tuple[int | None, str | None]:
        """Wait for rank 0's command to end: (its exit code, None), or (None, why) when it ran past
        `offline.timeout_s`, another rank ended first, or (multi-node, `transport.require` set) NCCL's
        cross-node links turned out slower than required."""
        assert self.c.offline is not None
        limit, cfg = self.c.offline.timeout_s, self.c.transport
        gated = len(server.hosts) > 1 and cfg.require != "any"
        t0 = time.monotonic()
        while True:
            _, code = run.wait(server.hosts[0].wait_exit.remote(2.0), 120)
            if code is not None:
                return code, None
            for rank, h in enumerate(server.hosts[1:], start=1):
                other = run.wait(h.exit_code.remote(), 60)[1]
                if other is not None:
                    return None, f"rank {rank} exited with code {other} before rank 0 finished"
            if gated:
                verdict = self.servers.read_transport(run, server)
                if verdict is not None and not transport.meets(verdict, cfg.require) \
                        and time.monotonic() - t0 > cfg.wait_s and verdict["inter"] != "none":
                    return None, "stopped: " + str(transport.refusal(verdict, cfg.require)).split(";")[0]
            if time.monotonic() - t0 > limit:
                return None, f"the command ran past offline.timeout_s ({limit:.0f} s)"

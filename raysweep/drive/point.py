"""One benchmark point against a live server: reset, warmup, bench, client-limited re-runs, the record.

`PointRunner.run` marks the point running in the ledger, benchmarks it through the configuration's bench
backend while the server's `/metrics` are scraped, runs it again with more client actors while the client
limits it (as long as the new actors get CPUs of their own and the send lag drops), and writes the result
file whole (with its raw samples, validity record, transport and provenance columns) before the point is
marked done. A server that dies during the point spoils it; a lost host actor or an abort puts the point
back. `reset` clears the server's caches (or runs `after_bench_cmd`) between points.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import sqlite3
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import ray

from raysweep.bench import sane, timeseries
from raysweep.bench.command import CommandBench, result_record
from raysweep.bench.load import CONCURRENCY
from raysweep.campaign import BenchSpec
from raysweep.drive import validity
from raysweep.drive.point_energy import node_label_values, point_energy_fields
from raysweep.drive.state import RunState
from raysweep.errors import UserError
from raysweep.place import placement
from raysweep.place.scheduler import INTERRUPTED
from raysweep.plan.cost import point_cost_fields
from raysweep.plan.plan import PointRun
from raysweep.record import files
from raysweep.record.files import write_json_atomic
from raysweep.record.runs import write_samples
from raysweep.serve import hardware, metrics, provenance
from raysweep.serve.live_server import (
    Aborted,
    ConfigRun,
    Server,
    fabric_fields,
    resolve_provenance,
    server_process_fields,
    telemetry_fields,
    transport_fields,
)
from raysweep.serve.pd import deployment_counts
from raysweep.serve.pd import point_fields as pd_point_fields
from raysweep.serve.server import expected_model, reset_caches

__all__ = ["PointRunner", "client_room", "load_windows"]

log = logging.getLogger(__name__)

DISK_RETRY_S = 2.0  # seconds between tries to write a finished point on a full disk


def load_windows(res: dict[str, Any], submitted: float, returned: float) -> tuple[tuple[float, float],
                                                                              tuple[float, float] | None]:
    """The load's window for the server's gauges, and where its instants are not known the bracket its
    counters must cover. The native client records the load's start and end. A command's JSON does not: its
    load ended before the process returned (vLLM's own /metrics fetch, saving the JSON, the interpreter's
    exit and the Ray return come after), so a window anchored at the return can start inside the load. Its
    counters are taken between the scrape before the launch and the one after the exit, as the native
    client's are between the scrapes around its load."""
    if res.get("start_time") is not None and res.get("end_time") is not None:
        return (float(res["start_time"]), float(res["end_time"])), None
    end = returned
    start = max(submitted, end - float(res.get("duration") or 0.0))
    return (start, end), (submitted, returned)


def client_room(ray_free_cpus: float, server_nodes: list[tuple[float, float, int]], other_cpus: float,
                client_cpus: float) -> int:
    """How many more client actors get CPUs of their own: on each node of the server its physical cores less
    the server's bundle CPUs and the clients already there (`server_nodes`: (cores, bundle CPUs, clients)),
    plus the CPUs of the other nodes, and never more than Ray has free."""
    own = sum(int(max(0.0, cores - bundle - n * client_cpus) // client_cpus) for cores, bundle, n in server_nodes)
    return max(0, min(own + int(other_cpus // client_cpus), int(ray_free_cpus // client_cpus)))


def _client_room(run: ConfigRun, server: Server, res: dict[str, Any], client_cpus: float) -> int:
    """`client_room` for a running configuration, its clients' nodes taken from the point's result."""
    clients_at = [ip.strip() for ip in str(res.get("client_node_ips") or "").split(",") if ip.strip()]
    bundles = run.res.bundles if run.res is not None else []
    mine = []
    for r, node in enumerate(server.nodes):
        bundle = float((bundles[r] if r < len(bundles) else {}).get("CPU", placement.HOST_CPUS))
        mine.append((float(node.get("physical_cores") or 1), bundle, clients_at.count(node.get("node_ip") or "")))
    server_ids = {n.get("node_id") for n in server.nodes}
    other = sum(n.cpus for n in placement.cluster_nodes() if n.node_id not in server_ids)
    return client_room(ray.available_resources().get("CPU", 0.0), mine, other, client_cpus)


def _pd_counts(server: Server) -> dict[str, Any] | None:
    """A P/D deployment's counters now (`raysweep.serve.pd.deployment_counts`); None for any other server, or
    when they cannot be read (the point then has no P/D fields, and runs all the same)."""
    if not getattr(server, "roles", None) or server.router is None:
        return None
    try:
        return deployment_counts(server.router, server.server_urls())
    except ray.exceptions.RayError as exc:
        log.info("server %s: the P/D counters were not read (%s)", server.server_id, exc)
        return None


def _scraper(server: Server, interval_s: float) -> metrics.Scraper:
    """Whose /metrics a point scrapes: the server's; a P/D deployment's every role server, its decode servers'
    joined as one server's engines (the point's `server_*` fields), each server's kept apart
    (`pd_server_metrics`)."""
    if not getattr(server, "roles", None):
        return metrics.Scraper(getattr(server, "metrics_url", server.url), interval_s)
    urls = server.server_urls()
    decode = tuple(r.name for r in server.roles if r.role == "decode")
    return metrics.ServersScraper(urls[decode[0]], interval_s, servers=urls, pooled=decode)


def heaviest(points: Sequence[PointRun]) -> PointRun:
    """The point of the heaviest load (`Load.key`: concurrency, then rate; the first of equals), where a server's
    warmup runs: the same prompts warm it in the least time (384 prompts on the CPU demo's server took about 9 s
    at a concurrency of 4, about 4 s at 16)."""
    return max(points, key=lambda p: p.bench.load.key())


class PointRunner:
    """Runs benchmark points of a configuration run against its live server (see the module docstring)."""

    def __init__(self, work: RunState) -> None:
        self.work = work
        self.c = work.c
        self._slots: dict[str, int] = {}  # runs started per server: a run's place in its server's life

    @property
    def bench_spec(self) -> BenchSpec:
        """The campaign's bench section: points run against a server in mode serve only, which requires one."""
        assert self.c.bench is not None, "mode serve has a bench section"
        return self.c.bench

    def reset(self, run: ConfigRun, server: Server) -> str:
        """Reset caches (or run after_bench_cmd); returns what the next point starts from."""
        spec = self.work.plan.spec
        try:
            if spec.after_bench_argv:
                if run.helper is None:
                    run.helper = run.bench if isinstance(run.bench, CommandBench) else \
                        CommandBench(spec.bench_env, self.bench_spec.timeout_s)
                timeout_s = self.bench_spec.timeout_s
                _, out = run.wait(run.helper.run_plain(spec.after_bench_argv, spec.bench_env, timeout_s),
                                  timeout_s + 120)
                return "after_bench_cmd" if out.get("ok") else f"after_bench_cmd failed: {out.get('error')}"
            if getattr(server, "roles", None):  # a P/D deployment: every role server's caches
                _, outs = run.wait([h.reset_caches.remote() for h in server.hosts], 120)
                bad = [f"{server.who(r)}: {o['detail']}" for r, o in enumerate(outs) if not o["ok"]]
                out = {"ok": not bad, "detail": "; ".join(bad)}
            elif server.hosts:
                _, out = run.wait(server.hosts[0].reset_caches.remote(), 120)
            else:  # a server given by URL (crosscheck --url): no host actor of ours
                out = reset_caches(server.url)
        except Aborted:
            return "aborted"
        except ray.exceptions.RayError as exc:
            return f"reset failed: {exc}"
        return "reset" if out["ok"] else f"reset failed: {out['detail']}"

    def warmup(self, run: ConfigRun, server: Server, point: PointRun) -> None:
        """`warmup` requests of a point (the heaviest of its server's: `ConfigLife`), recorded nowhere."""
        ok = False
        with contextlib.suppress(Aborted, ray.exceptions.RayError):
            status, out = self.bench(run, server, point, num_prompts=self.c.warmup)
            ok = status == "ok" and bool(out.get("ok"))
            if not ok:
                log.warning("warmup against server %s failed: %s", server.server_id, out.get("error", out))
        self.work.emit("warmup_done", server_id=server.server_id, ok=ok)

    def bench(self, run: ConfigRun, server: Server, point: PointRun,
              num_prompts: int | None = None, clients: int | None = None) -> tuple[str, Any]:
        """One benchmark of a point through the backend, with the server's /metrics scraped meanwhile: the
        baseline before the load is submitted (submit fixes its start), the last scrape after it returned."""
        pd_before = _pd_counts(server)  # a P/D deployment: its counters before the load
        scraper = _scraper(server, self.bench_spec.metrics_interval_s).start()
        submitted = time.time()
        try:
            assert run.bench is not None, "mode serve: its bench backend is made with the run"
            try:
                job = run.bench.submit(point.bench.argv, server.url, expected_model(run.serve.argv) or "",
                                       num_prompts=num_prompts, clients=clients)
            except UserError as exc:  # its options or data: the same on every attempt and every server
                log.warning("point %s could not be prepared: %s", point.id, exc)
                return "ok", {"ok": False, "error": f"the point could not be prepared: {exc}", "final": True}
            except Exception as exc:
                log.warning("point %s could not be prepared", point.id, exc_info=True)
                return "ok", {"ok": False, "error": f"the point could not be prepared: {exc}"}
            status, answers = run.wait(job.refs, self.bench_spec.timeout_s + 120, server)
            returned = time.time()
        finally:
            scraper.stop()
        if status != "ok":
            return status, answers
        assert run.bench is not None
        try:
            out = run.bench.finish(job, answers)
        except Exception as exc:  # its analysis raised: the point fails with the traceback, the campaign goes on
            trace = traceback.format_exc()
            log.error("point %s: its analysis raised; the point is recorded failed:\n%s", point.id, trace)
            return "ok", {"ok": False, "error": f"the point's analysis failed: {type(exc).__name__}: {exc}",
                          "output_tail": trace}
        res = out.get("result") if out.get("ok") else None
        if res is not None:
            window, bracket = load_windows(res, submitted, returned)
            res.setdefault("load_window_start", window[0])  # where the energy is measured without a steady
            res.setdefault("load_window_end", window[1])    # window (raysweep.drive.point_energy)
            sane.merge(res, sane.guarded("server_metrics", scraper.summary, window, bracket))
            if isinstance(scraper, metrics.ServersScraper):  # a P/D deployment: each role server's own
                res["pd_server_metrics"] = json.dumps(scraper.summaries(window, bracket), sort_keys=True,
                                                      default=str)
            timeseries.attach(out, scraper.samples)  # per-bin series and the steady-state window (native)
            out["clients"] = job.clients
            pd_after = _pd_counts(server) if pd_before is not None else None
            if pd_before is not None and pd_after is not None:
                res.update(pd_point_fields(pd_before, pd_after))
        return status, out

    def bench_point(self, run: ConfigRun, server: Server, point: PointRun) -> tuple[str, Any]:
        """A point's benchmark; while the client limits it (and that is allowed), again with twice the actors,
        as long as the new actors get CPUs of their own and the last step lowered the send lag. A point that
        stays client-limited says why in `client_limited_stop`, logged and announced once."""
        clients, reruns, used, lag, stop = None, 0, 0, math.inf, None
        while True:
            status, out = self.bench(run, server, point, clients=clients)
            res = out.get("result") if status == "ok" and out.get("ok") else None
            if res is None or not res.get("client_limited"):
                break
            new_lag = float(res.get("client_send_lag_p99_ms") or 0.0)
            if reruns and new_lag >= lag:
                stop = (f"{out['clients']} client(s) did not lower the send lag p99 of {used} "
                        f"({lag:.1f} -> {new_lag:.1f} ms)")
                break
            if out["clients"] <= used:
                stop = f"no more than {used} client actor(s) could be placed"
                break
            used, lag = out["clients"], new_lag
            more = min(2 * used, self.bench_spec.max_clients, int(res.get("num_prompts") or 1),
                       int(res.get(CONCURRENCY) or 2 * used))  # never more actors than slots
            room = used + _client_room(run, server, res, getattr(run.bench, "cpus", self.bench_spec.client_cpus))
            if not self.bench_spec.rerun_client_limited:
                stop = "re-runs are off (bench.rerun_client_limited)"
                break
            if min(more, room) <= used:
                stop = ("no free CPUs of their own for more client actors" if room <= used
                        else f"{used} client actor(s) is the most allowed")
                break
            more = min(more, room)
            log.info("point %s is client-limited with %d client(s) (%s); running it again with %d",
                     point.id, used, res.get("client_limited_reason"), more)
            clients, reruns = more, reruns + 1
            self.reset(run, server)
        if res is not None:
            res["client_limited_reruns"] = reruns
            if res.get("client_limited"):
                res["client_limited_stop"] = stop
                log.info("point %s stays client-limited with %d client(s) after %d re-run(s) (%s): %s", point.id,
                         out["clients"], reruns, res.get("client_limited_reason"), stop)
                self.work.emit("client_limited", point=point, clients=out["clients"], reruns=reruns,
                               reason=res.get("client_limited_reason"), stop=stop)
        return status, out

    def run(self, run: ConfigRun, server: Server, point: PointRun, reset: str, attempt: int | None = None) -> bool:
        """Run one point and record it in the ledger (done, failed, or back to pending); True when done.
        `attempt`: the point was claimed already (`Ledger.claim`) as this attempt."""
        ledger, emit = self.work.ledger, self.work.emit
        if attempt is None:
            attempt = ledger.mark_running(point.id, server.server_id)
        emit("point_start", point=point, attempt=attempt, server_id=server.server_id)
        self._slots[server.server_id] = self._slots.get(server.server_id, -1) + 1
        started = time.time()
        try:
            status, out = self.bench_point(run, server, point)
        except Aborted as exc:
            run.drop_client()
            self.abandon(point, str(exc), attempt)
            return False
        except ray.exceptions.RayError as exc:
            run.drop_client()
            status, out = "ok", {"ok": False, "error": f"client actor failed: {type(exc).__name__}: {exc}"}
        if status == "down":
            run.drop_client()  # its benchmark may hang on a server with a dead rank
            why, out = out, {"ok": False, "error": "the benchmark was stopped"}
        else:
            why = server.down()  # a server that died during the point spoils it, whatever the client saw
        error = out.get("error")
        result = out.get("result") if out.get("ok") else None
        if result is not None and not result.get("completed"):
            error = f"no request completed ({result.get('failed', '?')} failed)"
            if result.get("errors_sample"):
                error += f": {result['errors_sample'][0]}"
        if why is not None:
            tail = server.log_tail()
            error = f"server died during the point ({why}); benchmark: {error or 'finished'}"
            if (getattr(server, "roles", None) or len(getattr(server, "hosts", ())) > 1) and not server.host_lost:
                # a P/D role or a rank of a server across nodes: the root cause from every rank's log
                cause = server.root_cause(server.failed_rank)
                if cause is not None:
                    error += f"; {server.who(cause['rank'])}: {cause['line']}"
            if server.host_lost:
                ledger.requeue(point.id, error, self.c.max_attempts)
                emit("point_failed", point=point, error=error, attempt=attempt)
                return False
        else:
            tail = out.get("output_tail") or server.log_tail()
        if error is None and result is not None:
            try:
                self.keep(run, point, lambda: self.write(run, server, point, result, attempt, started, reset, out))
            except Aborted as exc:  # stopped while waiting for space: nothing of it is recorded as done
                self.abandon(point, str(exc), attempt)
                return False
            except Exception as exc:  # its record could not be written: the point fails once, the campaign goes on
                trace = traceback.format_exc()
                log.error("point %s: its record could not be written; the point is recorded failed:\n%s", point.id,
                          trace)
                # the server and the benchmark did their part: running the point again would only fail the same
                # way (the cause is where the record goes), so no attempt is left to it
                error = (f"the point's record could not be written: {type(exc).__name__}: {exc} (not run again: "
                         "the fault is where its record goes, not the server)")
                ledger.mark_failed(point.id, error, trace)
                ledger.give_up(point.id, error, self.c.max_attempts)
                emit("point_failed", point=point, error=error, attempt=attempt)
                return False
            return True
        if out.get("final"):  # a deterministic failure: not tried again (nor with another server start)
            ledger.give_up(point.id, error or "unknown failure", self.c.max_attempts)
        else:
            ledger.mark_failed(point.id, error or "unknown failure", tail)
        emit("point_failed", point=point, error=error, attempt=attempt)
        return False

    def abandon(self, point: PointRun, why: str, attempt: int) -> None:
        """A point stopped by an abort: back to pending (an interrupt does not count the attempt) or requeued."""
        if why == INTERRUPTED:  # the point did not run, and the attempt does not count
            self.work.ledger.mark_pending(point.id)
        else:
            self.work.ledger.requeue(point.id, f"{why} during the point", self.c.max_attempts)
            self.work.emit("point_failed", point=point, error=why, attempt=attempt)

    def write(self, run: ConfigRun, server: Server, point: PointRun, result: dict[str, Any], attempt: int,
              started: float, reset: str, out: dict[str, Any]) -> None:
        """A finished point's files (samples, time series, then its result), and the point done."""
        base = self.work.output_dir / "points" / point.serve.id / point.bench.id
        if out.get("samples") is not None:
            samples = base / f"run={point.run}.samples.parquet"
            write_samples(samples, out["samples"])
            result["samples_path"] = str(samples.relative_to(self.work.output_dir))
        if out.get("timeseries") is not None:
            series = timeseries.write_timeseries(base / f"run={point.run}.timeseries.parquet", out["timeseries"])
            result["timeseries_path"] = str(series.relative_to(self.work.output_dir))
        self.finish(run, server, point, result, attempt, started, reset, out)

    def keep(self, run: ConfigRun, point: PointRun, write: Callable[[], None]) -> None:
        """Write a finished point; on a full disk (or quota) wait with the result in memory, saying which
        path failed and how much space is free (at once, then every minute), and try again every few seconds
        until it is written. Raises Aborted when the run is stopped meanwhile."""
        said = -math.inf
        while True:
            try:
                write()
                return
            except (OSError, sqlite3.OperationalError) as exc:
                if not files.no_space(exc):
                    raise
                where = getattr(exc, "filename", None) or self.work.output_dir
                if time.monotonic() - said >= 60:
                    said = time.monotonic()
                    msg = (f"cannot write the result of point {point.id}: {exc} ({files.free_space(where)}); "
                           f"waiting for space, the result is kept in memory until it can be written")
                    log.error("disk full: %s", msg)
                    self.work.emit("disk_full", point=point, error=msg)
                    with contextlib.suppress(Exception):  # the ledger may be on the full disk too
                        self.work.ledger.add_event("disk_full", [point.serve.id], [], msg)
            if run.abort:
                raise Aborted(run.abort)
            time.sleep(DISK_RETRY_S)

    def finish(self, run: ConfigRun, server: Server, point: PointRun, result: dict[str, Any], attempt: int,
               started: float, reset: str, out: dict[str, Any]) -> None:
        """Write a point's result file whole, then mark it done."""
        path = self.work.output_dir / "points" / point.serve.id / point.bench.id / f"run={point.run}.json"
        write_json_atomic(path, self.record(run, server, point, result, attempt, started, reset, out))
        self.work.ledger.mark_done(point.id, str(path.relative_to(self.work.output_dir)))
        self.work.emit("point_done", point=point, result=result)

    def record(self, run: ConfigRun, server: Server, point: PointRun, result: dict[str, Any], attempt: int,
               started: float, reset: str, out: dict[str, Any]) -> dict[str, Any]:
        """A point's result record: the bench result, its parameters, where and how it ran, its validity."""
        sh, lay = point.serve.shape, run.layout
        head = server.nodes[0]
        extra = {
            "campaign": self.c.name, "point_id": point.id, "serve_id": point.serve.id, "bench_id": point.bench.id,
            "server_id": server.server_id, "serve_label": point.serve.label, "bench_label": point.bench.label,
            "tensor_parallel_size": sh.tp, "pipeline_parallel_size": sh.pp, "data_parallel_size": sh.dp,
            "gpu_count": lay.gpu_count if self.work.with_gpus else 0, "num_nodes": lay.nnodes,
            "gpus_per_node": lay.gpus_per_node if self.work.with_gpus else 0, "placement_mode": lay.mode,
            "placement_layout": "spread" if sh.spread else "pack",
            "node_id": head.get("node_id"), "node_ip": head.get("node_ip"), "hostname": head.get("hostname"),
            "gpu_ids": head.get("gpu_ids"),
            "node_ids": ",".join(n.get("node_id") or "" for n in server.nodes),
            "node_ips": ",".join(n.get("node_ip") or "" for n in server.nodes),
            "gpu_ids_per_node": ";".join(f"{n.get('node_ip')}/{(n.get('node_id') or '')[:8]}={n.get('gpu_ids') or ''}"
                                         for n in server.nodes),
            "node_types": hardware.node_types(n.get("node_id") or "" for n in server.nodes),  # from Ray's view
            "attempt": attempt, "started_at": started,
            "ended_at": time.time(), "bench_wall_s": out.get("duration_s"), "cache_state_before": reset,
            "bench_command": out.get("command"),
            **(self.work.order_fields(point.serve.id, point.bench.id, point.run, self._slots.get(server.server_id, 0))
               if hasattr(self.work, "order_fields") else {}),
            **transport_fields(server.transport), **fabric_fields(server.fabric),
            # GPU telemetry over the load's own window, not from the start of the data set's building
            **telemetry_fields(server, float(result.get("start_time") or started),
                               float(result.get("end_time") or time.time()), self.c.transport.telemetry),
            **server_process_fields(server.nodes, server.facts),
            **provenance.result_fields(resolve_provenance(server, self.work.ledger),
                                       [n.get("hostname") or "" for n in server.nodes]),
        }
        if point.serve.deployment is not None:  # a P/D deployment: its shape, its GPUs all its roles', its nodes
            extra.update(point.serve.deployment.identity(), tensor_parallel_size=None, pipeline_parallel_size=None,
                         data_parallel_size=None, gpus_per_node=None, placement_mode="pd",
                         num_nodes=len({n.get("node_id") for n in server.nodes}),
                         pd_servers=";".join(f"{r.name}@{n.get('node_ip')}/{(n.get('node_id') or '')[:8]}="
                                             f"{n.get('gpu_ids') or ''}" for r, n in zip(server.roles, server.nodes)))
            if server.role_settings is not None:  # each role server's effective settings, as it started
                extra["pd_role_settings"] = json.dumps(server.role_settings, sort_keys=True, default=str)
        if point.bench.base_id is not None:
            extra.update(sla_base_id=point.bench.base_id, sla_value=point.bench.sla_value)
        extra.update(getattr(server, "startup", None) or {})  # the phases of its start (raysweep.serve.startup)
        if point.bench.workload_of is not None:  # bench.workload: which load level of which bench point
            extra.update(workload_of=point.bench.workload_of, workload_role=point.bench.workload_role,
                         workload_value=point.bench.workload_value,
                         workload_variable=self.c.bench.workload.variable
                         if self.c.bench and self.c.bench.workload else None)
        # energy over the point's steady window (raysweep.drive.point_energy), then its price per token
        extra.update(point_energy_fields(server.hosts, result, out.get("samples"), started, extra["ended_at"],
                                         self.c.transport.telemetry))
        record = result_record(result, point.serve.params, point.bench.params, point.run, extra)
        sane.merge(record, sane.guarded("cost", point_cost_fields, self.c.cost, record,
                                        node_label_values(server.nodes)))
        sane.merge(record, sane.guarded("validity", validity.validity_fields, record))
        sane.merge(record, sane.guarded("hardware", hardware.fields, record))  # compared per configuration later
        return record

"""The driver: connects to Ray, syncs the plan with the ledger, and runs every pending point.

`run_campaign` opens the campaign (plan and ledger), refuses configurations that can never be placed,
takes the driver's place in the ledger and cleans up after dead drivers (`recovery`), then `run_plan`
wires the parts: the `scheduler` decides which server configurations start where, against `RayCluster`
(the scheduler's cluster on Ray: each configuration lives in its own thread through `config_life`, which
starts its server (`live_server`), runs its points (`point`, `offline_points`) or SLA searches
(`sla_probe`), and stops it). Every finished point is in the ledger at once, so a campaign resumes where it
stopped.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import ray

from raysweep import procs
from raysweep.bench import offline
from raysweep.campaign import CampaignSpec
from raysweep.drive import endpoint, hooks, recovery, sequential
from raysweep.drive.config_life import ConfigLife
from raysweep.drive.endpoint import is_endpoint_campaign
from raysweep.drive.progress_metrics import Progress
from raysweep.drive.recovery import driver_alive, embedded_temp_dir
from raysweep.drive.state import EventSink, RunState
from raysweep.errors import RayStartError, UserError
from raysweep.grid import mask_argv as grid_mask
from raysweep.grid import shell_join
from raysweep.ledger import LEDGER_FILE, CampaignHeld, Ledger, PointRow
from raysweep.place import pd as pd_place
from raysweep.place import placement
from raysweep.place.scheduler import Cluster, Scheduler, replica_key, with_event_log
from raysweep.plan.plan import Plan, ServeConfig, build_plan, meaning
from raysweep.procs import cpu_set, cpu_text
from raysweep.record import drift, storage
from raysweep.record.directory import CampaignDir
from raysweep.serve.live_server import ConfigRun
from raysweep.serve.server import rank_argv

__all__ = ["RayCluster", "RunSummary", "check_placement", "driver_alive", "driver_cpus", "embedded_temp_dir",
           "open_campaign", "placement_lines", "ray_session", "run_campaign", "run_plan"]

log = logging.getLogger(__name__)

NAMESPACE = "raysweep"
WORKER_NICENESS_ENV = "RAY_worker_niceness"  # read by the raylet when it starts


@dataclass
class RunSummary:
    output_dir: Path
    counts: dict[str, int]
    failures: list[PointRow] = field(default_factory=list)
    stopped_early: str | None = None


# ---------------------------------------------------------------------------------------------------
# Ray connection
# ---------------------------------------------------------------------------------------------------

_embedded = False  # the Ray session is this process's own embedded Ray (ray_session started it)


def driver_cpus(spec: CampaignSpec) -> set[int] | None:
    """Where the driver runs with `address` None: the client actors' CPUs (`bench.cpu_affinity`) when the
    server has CPUs of its own (`serve.cpu_affinity` set and disjoint from them), so that the driver and the
    embedded Ray it starts (GCS, raylet, every worker: they inherit its affinity) leave the server's CPUs to
    the server. None otherwise: the driver runs where it was started."""
    c = spec.campaign
    if c.serve is None or c.bench is None:
        return None
    serve, bench = cpu_set(c.serve.cpu_affinity), cpu_set(getattr(c.bench, "cpu_affinity", None))
    return bench if serve and bench and not serve & bench else None


@contextlib.contextmanager
def _pinned(cpus: set[int] | None) -> Iterator[None]:
    """This process (every thread, and what it starts meanwhile) on `cpus` while inside; its own CPUs again
    after. CPUs this machine lacks are left out; with none left, when refused, or where the system has no
    CPU affinity (macOS), it runs where it was."""
    if not cpus or not hasattr(os, "sched_getaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)
    wanted = cpus & before
    failure = procs.pin_cpus(wanted) if wanted and wanted != before else None
    if failure:
        log.warning("the driver could not be pinned: %s", failure)
    elif wanted and wanted != before:
        log.info("the driver and its embedded Ray run on CPU(s) %s, beside the client actors", cpu_text(wanted))
    try:
        yield
    finally:
        if wanted and wanted != before:
            procs.pin_cpus(before)


def ray_start_error(address: str | None, exc: BaseException) -> RayStartError:
    """What Ray's failure to start (or to be joined) means, and what to try, in one message."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    low = text.lower()
    if address is None:
        head = f"the embedded local Ray did not start ({text})"
        if "timed out" in low or "timeout" in low:
            tip = ("Ray gives its processes 30 s to start, and a heavily loaded machine can take longer: run the "
                   "command again when the machine is less busy (`raysweep resume OUTPUT_DIR` keeps every finished "
                   "point), or start Ray yourself (`ray start --head`) and pass `--address auto`")
        elif "in use" in low or "address already" in low or "port" in low:
            tip = ("a port Ray needs is taken, perhaps by another Ray on this machine: join that one with "
                   "`--address auto`, or stop it, then run the command again")
        else:
            tip = ("see the logs under /tmp/ray/session_latest/logs; try again, or start Ray yourself "
                   "(`ray start --head`) and pass `--address auto`")
    else:
        head = f"could not join the Ray cluster at --address {address} ({text})"
        tip = (f"check that it runs and is reachable from here (`ray status --address {address}`), or leave "
               "--address out to start an embedded local Ray")
    return RayStartError(f"{head}. Nothing was run. {tip[0].upper()}{tip[1:]}.")


@contextlib.contextmanager
def ray_session(address: str | None, cpus: set[int] | None = None) -> Iterator[None]:
    """Join the cluster at `address`, or start an embedded local Ray (on loopback) when there is none: with
    `cpus` (`driver_cpus`), the driver and that Ray run on those CPUs only, until the session ends."""
    if address is None and cpus and not ray.is_initialized():
        with _pinned(cpus), ray_session(address):
            yield
        return
    global _embedded
    if ray.is_initialized():
        yield
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    temp_dir = None
    if address is None:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        # Ray starts its workers at nice 15 by default; servers and clients run in (or under) them
        os.environ.setdefault(WORKER_NICENESS_ENV, "0")
        temp_dir = embedded_temp_dir(os.getpid())
        try:
            ray.init(address="local", include_dashboard=False, namespace=NAMESPACE, log_to_driver=False,
                     num_cpus=max(os.cpu_count() or 1, 4), _temp_dir=temp_dir)
        except Exception as exc:
            with contextlib.suppress(Exception):
                ray.shutdown()
            shutil.rmtree(temp_dir, ignore_errors=True)
            raise ray_start_error(None, exc) from None
        _embedded = True
    else:
        try:
            ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
        except Exception as exc:
            with contextlib.suppress(Exception):
                ray.shutdown()
            raise ray_start_error(address, exc) from None
    try:
        yield
    finally:
        _embedded = False
        ray.shutdown()
        if temp_dir:
            shutil.rmtree(temp_dir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------
# The campaign
# ---------------------------------------------------------------------------------------------------

def open_campaign(spec: CampaignSpec, directory: CampaignDir, force: bool = False,
                  accept_changes: bool = False) -> tuple[Plan, Ledger]:
    """Check the campaign's data files, build the plan and bring the ledger in line with it (refusing a changed
    meaning unless `force`). Nothing is written before the data files are read, and nothing at all when the
    campaign is refused: held by a live driver (unless `force`), or measured with other settings than this
    run's (`raysweep.record.drift`, unless `accept_changes`)."""
    from raysweep.bench.checks import check_data_files
    from raysweep.campaign.vllm_options import check_campaign

    check_campaign(spec)  # serve and bench options against vLLM's own parser
    check_data_files(spec)
    plan = build_plan(spec)
    if spec.campaign.storage:
        storage.restore(spec.campaign.storage, directory)
    directory.path.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(directory.path / LEDGER_FILE)  # the driver's own, made on the first run
    try:
        if not force and (holder := ledger.live_driver(driver_alive)) is not None:
            raise CampaignHeld(holder)
        drift.check(ledger, drift.measured_with(spec), accept_changes or force)
        if spec.campaign.tune is not None:  # the candidates tried so far are part of the plan
            hooks.tune().restore_plan(plan, ledger)
        hooks.levels().restore_plan(plan, ledger)  # levels bench.workload decided before
        sequential.restore_plan(plan, ledger)  # runs bench.precision added to points before
        hooks.confirmation().restore_plan(plan, ledger)  # the winner's confirmation chosen before (raysweep.confirm)
        ledger.sync(name=spec.campaign.name, fingerprint=plan.fingerprint, meaning=meaning(spec),
                    campaign=spec.stored_form(), campaign_file=spec.source_path,
                    points=[(p.id, p.serve.id, p.bench.id, p.run, p.serve.params, p.bench.params) for p in plan.points],
                    force=force, searches=plan.searches)
        ledger.set_meta("variables", json.dumps(spec.variables))  # for a resume where they are no longer set
    except BaseException:
        ledger.close()
        raise
    return plan, ledger


def run_campaign(spec: CampaignSpec, directory: CampaignDir, *, force: bool = False, retry_failed: bool = False,
                 on_event: EventSink | None = None, accept_changes: bool = False,
                 finish: Callable[[CampaignDir], object] | None = None) -> RunSummary:
    """Run every pending point of a campaign on the connected Ray cluster. Resumes from the ledger;
    `retry_failed` gives points that used up their attempts a fresh set; `accept_changes` goes on with
    settings that changed since points were finished (`raysweep.record.drift`), recording the change.
    `finish`: what the caller writes into the output dir when the run ends (the faces pass the results table's
    `raysweep.results.table.write_results`), called before the storage mirror's last copy so that it goes
    there too; the faces write it again after the run either way."""
    output_dir = directory.path
    emit = on_event or (lambda kind, **data: None)
    mirror = storage.Mirror(spec.campaign.storage, directory) if spec.campaign.storage else None
    if mirror is not None:
        emit = _mirrored(emit, mirror)
    tracker = hooks.tracking().LiveTracker(spec.campaign, directory) if spec.campaign.tracking is not None else None
    if tracker is not None:  # tracking: each point logged as it lands
        emit = tracker.sink(emit)
    plan, ledger = open_campaign(spec, directory, force=force, accept_changes=accept_changes)
    progress = Progress(spec.campaign.name, ledger.counts)  # Ray's metrics: the cluster's Prometheus sees it
    emit = progress.sink(emit)
    try:
        nodes = placement.cluster_nodes()
        endpoints = is_endpoint_campaign(spec)  # serve.url: nothing is placed, the endpoints run already
        with_gpus = not endpoints and campaign_gpus(ledger, nodes)
        if not endpoints:
            check_placement(plan, nodes, with_gpus)
        if with_gpus and ledger.meta(GPUS_META) != "1":  # kept for later drivers (`campaign_gpus`)
            ledger.set_meta(GPUS_META, "1")
        settings = drift.measured_with(spec, drift.node_versions(embedded=_embedded))
        accepted = drift.check(ledger, settings, accept_changes or force)
        me = psutil.Process()
        driver_id = ledger.acquire_driver(me.pid, me.create_time(), driver_alive, force=force)
        ledger.record_driver_helpers(driver_id, recovery.helper_processes(me))
        drift.record(ledger, settings, accepted)
        outcome = "interrupted"
        try:
            recovery.recover(ledger, retry_failed)
            # the stages read the directory through the driver's own ledger, which it closes below
            stopped = run_plan(plan, CampaignDir.around(directory.given, ledger), emit, with_gpus=with_gpus)
            outcome = "stopped" if stopped else "finished"
        finally:
            ledger.release_driver(driver_id, outcome)
        return RunSummary(output_dir=output_dir, counts=ledger.counts(),
                          failures=[p for p in ledger.points() if p.state == "failed"], stopped_early=stopped)
    finally:
        progress.close()
        ledger.close()
        if tracker is not None:
            tracker.close()
        if mirror is not None:
            if finish is not None:
                finish(directory)
            mirror.close()


_MIRROR_AFTER = ("point_done", "point_failed", "config_failed", "sla_done")


def _mirrored(emit: EventSink, mirror: storage.Mirror) -> EventSink:
    """The event sink that also mirrors the output dir after every finished or failed point."""
    def sink(kind: str, **data: Any) -> None:
        emit(kind, **data)
        if kind in _MIRROR_AFTER:
            mirror.request()
    return sink


GPUS_META = "cluster_gpus"  # ledger meta: "1" once the campaign ran on a cluster with GPUs


def campaign_gpus(ledger: Ledger, nodes: list[placement.NodeInfo]) -> bool:
    """Whether the campaign runs on GPUs, decided once: the cluster has GPUs now, or had them when an earlier
    driver of this campaign ran (kept in the ledger). The CPU fallback is only for a campaign whose cluster
    never had a GPU: a driver started while the GPU nodes are gone does not turn a GPU campaign into a CPU one."""
    had = ledger.meta(GPUS_META) == "1"
    now = placement.has_gpus(nodes)
    if had and not now:
        log.warning("no alive node has GPUs, but this campaign ran on GPUs before: its configurations wait for "
                    "GPU nodes rather than run on CPUs")
    return now or had


def check_placement(plan: Plan, nodes: list[placement.NodeInfo],
                    with_gpus: bool | None = None) -> dict[str, placement.Layout]:
    """The layout of every configuration with points on this cluster (`with_gpus`: the campaign's decision,
    `campaign_gpus`; None: from the nodes); refuses (a UserError naming each configuration and why) those
    that can never be placed."""
    layouts, bad = {}, []
    for serve in plan.serves:
        if not plan.points_of(serve.id):
            continue
        lay = pd_place.layout_of(serve, nodes, with_gpus)  # P/D: one placement group of its roles' bundles
        if isinstance(lay, str):
            bad.append(f"server config {serve.id} ({serve.label}): {lay}")
        else:
            layouts[serve.id] = lay
    if bad:
        raise UserError("can never be placed on this cluster:\n  " + "\n  ".join(bad))
    return layouts


def placement_lines(serve: ServeConfig, layout: placement.Layout, offline_mode: bool = False) -> list[str]:
    """Where a configuration goes and the command each of its nodes runs (for the dry run)."""
    rule = placement.rule_text(serve.rule)
    if serve.deployment is not None:  # P/D: its bundles, GPUs, and the command of each role
        lines = pd_place.bundle_lines(serve.deployment, serve.rule, gpus=layout.gpu_count > 0)
        done: set[str] = set()
        for inst in serve.deployment.instances(serve.argv, {}, serve.env):
            if inst.role not in done:
                done.add(inst.role)
                lines.append(f"  command ({inst.role}): {shell_join(grid_mask(inst.argv))} --host <node ip> "
                             "--port <free port>")
        return lines + ["  router: raysweep's P/D router (raysweep.serve.pd_router) in front, the bench's target"]
    lines = [f"  placement: {layout.describe()}" + (f" on nodes with {rule}" if rule else "")]
    for rank in range(layout.nnodes):
        base = offline.worker_argv(serve.display_argv()) if offline_mode and rank else serve.display_argv()
        argv = rank_argv(base, layout, rank, "<rank 0 ip>", 0)
        text = shell_join(argv).replace("--master-port 0", "--master-port <free port>").replace(
            "--data-parallel-rpc-port 0", "--data-parallel-rpc-port <free port>")
        http = ("" if rank else " --output-json <result file>" if offline_mode
                else " --host <node ip> --port <free port>")
        lines.append(f"  command{f' (rank {rank})' if layout.nnodes > 1 else ''}: {text}{http}")
    return lines


# ---------------------------------------------------------------------------------------------------
# Running a plan: the scheduler on Ray
# ---------------------------------------------------------------------------------------------------

class RayCluster:
    """The scheduler's `Cluster` on Ray: the nodes Ray reports; each configuration started lives in its own
    thread (`ConfigLife.main`), which wakes the scheduler when it ends."""

    def __init__(self, life: ConfigLife) -> None:
        self.life = life
        self._runs: dict[str, tuple[ConfigRun, threading.Thread]] = {}
        self._wake = threading.Event()

    def nodes(self) -> list[placement.NodeInfo]:
        return placement.cluster_nodes()

    def start(self, serve: ServeConfig, layout: placement.Layout, node_ids: list[str], replica: int = 0) -> None:
        key = replica_key(serve.id, replica)
        run = self.life.new_run(serve, layout, node_ids, replica)
        thread = threading.Thread(target=self._main, args=(run,), name=f"config-{key}", daemon=True)
        self._runs[key] = (run, thread)
        thread.start()

    def _main(self, run: ConfigRun) -> None:
        try:
            self.life.main(run)
        finally:
            self._wake.set()

    def finished(self) -> list[tuple[str, str]]:
        ended = [(sid, run.outcome) for sid, (run, thread) in self._runs.items() if not thread.is_alive()]
        for sid, _ in ended:
            del self._runs[sid]
        return ended

    def abort(self, serve_id: str, reason: str) -> None:
        if serve_id in self._runs:
            self._runs[serve_id][0].abort = reason

    def wait(self, timeout_s: float) -> None:
        self._wake.wait(timeout_s)
        self._wake.clear()

    def join(self) -> None:
        for _, thread in list(self._runs.values()):
            thread.join()


IN_FLIGHT_WINDOW_S = 60.0  # a node's actors die at once; Ray marks the node dead seconds (up to ~30 s) later


def in_flight(ledger: Ledger, serve_id: str, now: float | None = None) -> list[str]:
    """The points of a configuration that a node loss interrupts: those running now, and those whose attempt
    ended with an error in the last `IN_FLIGHT_WINDOW_S` (the host actors on a lost node die before Ray
    marks the node dead, so the point has often failed by the time the loss is seen)."""
    now = time.time() if now is None else now
    points = ledger.points(serve_id=serve_id)
    ids = {p.point_id for p in points}
    recent = {e["point_id"] for e in ledger.attempt_errors() if e["point_id"] in ids
              and e["at"] >= now - IN_FLIGHT_WINDOW_S}
    return sorted({p.point_id for p in points if p.state == "running"} | recent)


def run_plan(plan: Plan, directory: CampaignDir, emit: EventSink, with_gpus: bool) -> str | None:
    """Run the pending points of a plan, writing into `directory` through its ledger: as many server
    configurations at once as free GPUs allow (most work first, largest first among equals, smaller ones filling
    the gaps), each in its own thread with its own client actors. Returns why it stopped early, or None when it
    went through."""
    c = plan.spec.campaign
    ledger = directory.ledger
    cluster: Cluster
    work: RunState
    if is_endpoint_campaign(plan.spec):  # serve.url: running endpoints, none started here
        work, cluster = endpoint.run_parts(plan, directory, emit, RayCluster)
    elif c.tune is not None:  # candidates asked as GPUs free up, stopped early, told when they end
        tune: hooks.Tune[RunState] = hooks.tune()
        work = tune.TuneWork(plan, directory, emit, with_gpus)
        cluster = tune.TunedCluster(RayCluster(ConfigLife(work)), work)
    else:
        work = RunState(plan, directory, emit, with_gpus)
        cluster = RayCluster(ConfigLife(work))
    scheduler = Scheduler(cluster, work, with_event_log(emit, ledger.add_event, lambda sid: in_flight(ledger, sid)),
                          max_servers=c.placement.max_servers or (None if with_gpus else 1),  # node losses: ledger rows
                          tail_replicas=c.placement.tail_replicas, with_gpus=with_gpus,
                          replace_wait_s=c.placement.replace_wait_s)
    sequential.settle_all(work)  # a point whose last run ended as the previous driver died
    hooks.levels().settle_all(work)  # endpoints of bench.workload that ended as it died
    emit("campaign_start", total=len(plan.points), counts=ledger.counts())
    scheduler.run()
    if not work.stop_reason and type(work) is RunState:  # the winner confirmed on fresh servers (confirm:)
        def run_work(cw: RunState) -> str | None:
            Scheduler(RayCluster(ConfigLife(cw)), cw, with_event_log(emit, ledger.add_event),
                      max_servers=c.placement.max_servers or (None if with_gpus else 1)).run()
            return cw.stop_reason

        work.stop_reason = hooks.confirmation().run_after(plan, directory, emit, with_gpus, run_work)
    emit("campaign_end", counts=ledger.counts(), stopped=work.stop_reason)
    return work.stop_reason

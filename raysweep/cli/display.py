"""The live progress of `raysweep run`: one line per driver event above a bar of points done, servers
running and an ETA."""

from __future__ import annotations

import logging
import threading
from typing import Any

from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from raysweep.cli._common import console

# Every event the driver emits, by what the display does with it: a line of its own (or, for point_done,
# the bar advanced with it), or nothing (a later event or the final summary says it).
SHOWN = frozenset({"server_starting", "server_ready", "server_failed", "transport", "node_lost", "config_failed",
                   "point_done", "point_failed", "sla_done", "candidate_start", "candidate_done", "fabric",
                   "topology_warning", "replica", "precision", "workload_levels", "disk_full", "replaced",
                   "waiting_for_nodes", "cannot_place", "confirm_start"})
SILENT = frozenset({"campaign_start", "campaign_end", "server_stopped", "warmup_done", "client_limited",
                    "point_start"})
# The driver's log records that an event line already says (they still go to the log file).
_TOLD = frozenset({"server config %s: %s; tearing its server down",  # node_lost
                   "server config %s: %s",  # config_failed, and transport with `refused`
                   "candidate %d: %s (%s)", "candidate %d (%s) %s: %s", "candidate %d (%s) stopped: %s",
                   "server config %s, bench %s: serial %s=%d, batch %s=%d; levels %s",  # workload_levels
                   "disk full: %s",  # disk_full
                   "server config %s fits none of the nodes left (%s); waiting up to %.0f s for nodes",
                   "confirmation: %s re-measured on fresh servers, %d start(s) each (AB BA), %d run(s) per start"})


def told_by_event(record: logging.LogRecord) -> bool:
    """Whether a log record repeats what an event line of the display says."""
    return record.name.startswith("raysweep.") and record.msg in _TOLD


class _ProgressDisplay:
    """Points done / total, the servers running and an ETA, from the driver's events."""

    def __init__(self) -> None:
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console)
        self.task: TaskID | None = None
        self.running: set[str] = set()
        self._lock = threading.Lock()  # events come from every running configuration's thread

    def __enter__(self) -> _ProgressDisplay:
        return self  # the bar appears with the campaign's first event, not while Ray starts

    def __exit__(self, *exc: object) -> None:
        if self.task is not None:
            self.progress.stop()

    def event(self, kind: str, **data: Any) -> None:
        with self._lock:
            self._event(kind, data)

    def _event(self, kind: str, data: dict[str, Any]) -> None:
        p = self.progress
        if kind == "campaign_start":
            done = data["counts"].get("done", 0)
            if self.task is None:
                p.start()
                self.task = p.add_task("starting", total=data["total"], completed=done)
        elif self.task is None:
            return
        elif kind == "server_starting":
            lay = data["layout"]
            p.console.print(f"server {data['server_id']} ({escape(data['serve'].label)}) starting on {lay.describe()}",
                            highlight=False)
        elif kind == "server_ready":
            self.running.add(data["server_id"])
            p.console.print(f"server {data['server_id']} ready in {data['elapsed']:.1f} s", highlight=False)
        elif kind == "server_stopped":
            self.running.discard(data["server_id"])
        elif kind == "node_lost":
            what = (f"replica {data['replica']} of server config {data['serve'].id} is torn down (its other servers go "
                    "on)" if data.get("replica") else f"server config {data['serve'].id} is torn down, to be placed "
                    "again where its shape fits")
            points = data.get("points")
            what += f" (points in flight: {', '.join(points) or 'none'})" if points is not None else ""
            p.console.print(f"[yellow]{escape(data['reason'])}[/]: {escape(what)}", highlight=False)
        elif kind == "replaced":
            p.console.print(f"server config {data['serve'].id} placed again on {escape(str(data.get('where')))} "
                            f"({data['layout'].describe()})", highlight=False)
        elif kind == "waiting_for_nodes":
            p.console.print(f"[yellow]server config {data['serve'].id} waits for nodes:[/] {escape(data['reason'])}",
                            highlight=False)
        elif kind == "cannot_place":
            p.console.print(f"[red]server config {data['serve'].id} cannot be placed:[/] {escape(data['reason'])}",
                            highlight=False)
        elif kind == "confirm_start":  # the leaders re-measured after the sweep (raysweep/confirm/runs.py)
            pairs = ", ".join(f"{role} {s}/{b}" for s, b, role, *_ in data["pairs"])
            p.console.print(f"confirmation: {escape(pairs)} re-measured on fresh servers, {data['starts']} start(s) "
                            f"each (AB BA), {data['runs']} run(s) per start", highlight=False)
        elif kind == "replica":
            p.console.print(f"server config {data['serve'].id}: one more server (replica {data['replica']}) to share "
                            f"its {data['points_left']} points left", highlight=False)
        elif kind == "transport":
            from raysweep.place.transport import describe

            refused = data["refused"]
            if not (refused or _says_something(data["verdict"])):
                return
            p.console.print(f"server {data['server_id']} transport: {escape(describe(data['verdict']))}"
                            + (f" [red]refused[/] ({escape(refused.splitlines()[0])})" if refused else ""),
                            highlight=False)
        elif kind == "fabric":
            probe, refused = data["probe"], data["refused"]
            bw = (f"{probe['busbw_gbps']:.2f} GB/s bus bandwidth ({probe.get('backend')}, {probe.get('world')} ranks)"
                  if probe.get("busbw_gbps") is not None else f"failed ({probe.get('error')})")
            p.console.print(f"server config {data['serve'].id} fabric probe: {escape(bw)}"
                            + (f" [red]refused[/] ({escape(refused)})" if refused else ""), highlight=False)
        elif kind == "topology_warning":
            p.console.print(f"[yellow]server {data['server_id']}:[/] {escape(data['warning'])}", highlight=False)
        elif kind == "config_failed":
            p.console.print(f"[red]server config {data['serve'].id} failed:[/] {escape(data['error'])}",
                            highlight=False)
        elif kind == "server_failed":
            p.console.print(f"[red]server {data['server_id']} failed:[/] {escape(str(data['error']))}", highlight=False)
        elif kind in ("candidate_start", "candidate_done"):  # a tuning campaign
            task = next(t for t in p.tasks if t.id == self.task)
            if kind == "candidate_start":
                p.update(self.task, total=(task.total or 0) + data["points"])
            what = data.get("state", "started") + (f": {', '.join(f'{v:.4g}' for v in data['objective'])}"
                                                   if data.get("objective") else
                                                   f" ({data['reason']})" if data.get("reason") else "")
            p.console.print(f"candidate {data['number']} {escape(data['serve'].label)} {escape(what)}", highlight=False)
        if kind in ("server_ready", "server_stopped"):
            p.update(self.task, description=f"{len(self.running)} server(s) running")
        elif kind == "point_done":
            task = next(t for t in p.tasks if t.id == self.task)
            if task.total is not None and task.completed >= task.total:  # an SLA search added a probe
                p.update(self.task, total=task.completed + 1)
            p.advance(self.task)
            r = data["result"]
            if r.get("offline_kind") == "latency":
                figures = f"mean latency {r.get('mean_latency_ms', float('nan')):.1f} ms"
            elif r.get("offline_kind") == "startup":
                figures = (f"cold start {r.get('cold_startup_s', float('nan')):.1f} s, warm "
                           f"{r.get('warm_startup_s', float('nan')):.1f} s")
            elif r.get("offline_kind") == "throughput":
                figures = (f"{r.get('request_throughput', 0):.2f} req/s, "
                           f"{r.get('total_token_throughput', 0):.1f} tok/s")
            else:
                figures = (f"{r.get('request_throughput', 0):.1f} req/s, "
                           f"median TTFT {r.get('median_ttft_ms', float('nan')):.1f} ms")
            p.console.print(f"done {escape(data['point'].serve.label)} / {escape(data['point'].bench.label)} "
                            f"run {data['point'].run}: {figures}"
                            + _client_limited_note(r), highlight=False)
        elif kind == "sla_done":
            o = data["outcome"]
            p.console.print(f"SLA {escape(data['serve'].label)} / {data['bench_id']} [{escape(data['target'])}]: "
                            f"{o.state}, largest pass {o.largest_pass}, smallest fail {o.smallest_fail}, "
                            f"{len(o.probes)} probe(s)", highlight=False)
        elif kind == "precision":  # bench.precision decided a point
            what = {"reached": "reached", "max_runs": "[yellow]stopped at max_runs without[/]",
                    "max_duration": "[yellow]stopped at max_duration_s without[/]"}.get(data["state"], data["state"])
            said = (f"{what} +-{100 * data['target']:g} % of {data['metric']} after {data['runs_done']} run(s) "
                    f"(+-{100 * data['rel_half_width']:.1f} %)") if not data.get("text") else \
                f"{'reached' if data['state'] == 'reached' else '[yellow]not reached[/]'} after " \
                f"{data['runs_done']} run(s): {escape(data['text'])}"  # the text says where it stopped
            p.console.print(f"precision {escape(data['serve'].label)} / {data['bench_id']}: {said}", highlight=False)
        elif kind == "workload_levels":  # bench.workload decided a shape's load levels
            levels = ", ".join(str(v) for v in data["levels"]) or "none"
            p.console.print(f"load levels {escape(data['serve'].label)} / {data['bench_id']}: {data['variable']} "
                            f"serial {data['serial']}, batch {data['batch']}; levels {levels} ({data['state']})",
                            highlight=False)
        elif kind == "disk_full":
            p.console.print(f"[red]disk full[/] {escape(str(data['error']))}", highlight=False)
        elif kind == "point_failed":
            p.console.print(f"[red]failed[/] {escape(data['point'].serve.label)} / {escape(data['point'].bench.label)} "
                            f"run {data['point'].run} "
                            f"(attempt {data['attempt']}): {escape(str(data['error']))}", highlight=False)


def _says_something(verdict: dict[str, Any]) -> bool:
    """A transport verdict worth a line: a server across nodes, or one whose NCCL links were seen (a server
    on one node without NCCL, e.g. on CPUs or one GPU, has nothing to report)."""
    return int(verdict.get("nnodes", 1) or 1) > 1 or bool(verdict.get("channels"))


def _client_limited_note(r: dict[str, Any]) -> str:
    """The mark of a point the client limited (its `client_limited` event says no more: one line a point)."""
    if not r.get("client_limited"):
        return ""
    why = "; ".join(str(x) for x in (r.get("client_limited_reason"), r.get("client_limited_stop")) if x)
    return f" [yellow](client-limited{': ' + escape(why) if why else ''})[/]"


def _print_counts(counts: dict[str, int]) -> None:
    console.print("points: " + ", ".join(f"{k} {v}" for k, v in counts.items()), highlight=False)


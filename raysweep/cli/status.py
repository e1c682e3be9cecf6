"""`raysweep status`: where a campaign stands (counts, every server configuration's progress, an ETA from
measured durations, servers, transport, validity, failures), once or followed with `--watch`."""

from __future__ import annotations

import time
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from raysweep.cli._common import _say, main, out, print_table
from raysweep.cli.jsonout import json_option, print_json


@main.command()
@click.argument("output_dir")
@click.option("--watch", type=click.FloatRange(min=0, min_open=True), is_flag=False, flag_value=5.0, default=None,
              metavar="[SECONDS]", help="Show the status again every SECONDS (default 5) until the campaign is "
                                       "complete, or Ctrl-C; a storage URI is downloaded again every time. "
                                       "With --json: one document per line (JSON lines), one per refresh.")
@json_option
def status(output_dir: str, watch: float | None, as_json: bool) -> None:
    """Done / running / failed / pending counts, per server config progress and an ETA, running servers,
    failures with reasons. OUTPUT_DIR: a directory, or the storage URI a campaign is mirrored to. Writes
    nothing."""
    if as_json and watch is not None:
        _watch_json(output_dir, watch)
        return
    if as_json:
        print_json("status", _status_document(_local(output_dir)))
        return
    if watch is None:
        _show(_local(output_dir))
        return
    try:
        while True:
            local = _local(output_dir)
            if out.is_terminal:
                out.clear()
            complete = _show(local)
            if complete:
                _say("campaign complete")
                return
            _say(f"(every {watch:g} s; Ctrl-C to stop watching)")
            time.sleep(watch)
    except KeyboardInterrupt:
        return


def _watch_json(output_dir: str, every: float) -> None:
    """`--watch --json`: one status document per line on stdout (JSON lines) every `every` seconds, the last
    one the read that found the campaign complete; Ctrl-C ends it quietly."""
    try:
        while True:
            doc = _status_document(_local(output_dir))
            print_json("status", doc, one_line=True)
            if doc["complete"]:
                return
            time.sleep(every)
    except KeyboardInterrupt:
        return


def _local(output_dir: str) -> str:
    """The output dir as a local directory (a URI is downloaded, again on every call)."""
    from raysweep.record import storage

    return str(storage.resolve_output(output_dir))


def _show(output_dir: str) -> bool:
    """Print the status; whether the campaign is complete (nothing pending or running, no driver at work)."""
    from raysweep.ledger import PointState
    from raysweep.results.directory import CampaignDir

    with CampaignDir(output_dir) as campaign_dir:
        ledger = campaign_dir.ledger
        counts, points, servers = ledger.counts(), ledger.points(), ledger.servers()
        name, extra, driver = ledger.meta("name"), ledger.out_of_plan(), ledger.last_driver()
        stored = ledger.stored_campaign()
        events, earlier = ledger.events(), ledger.attempt_errors()
        precision = _precision_facts(ledger, stored)
        levels = ledger.all_workload_levels() if (stored.get("bench") or {}).get("workload") else []
    active = [s for s in servers if s.stopped_at is None]
    table = Table(title=f"campaign {name}")
    for col in ("done", "running", "failed", "pending", "total"):
        table.add_column(col, justify="right")
    table.add_row(*(str(counts.get(k, 0)) for k in ("done", "running", "failed", "pending")), str(sum(counts.values())))
    print_table(table, out)
    live = False
    if driver:
        from raysweep.drive.driver import driver_alive

        live = driver["ended_at"] is None and driver_alive(driver["hostname"], driver["pid"], driver["pid_create_time"])
        state = "running" if live else (driver["outcome"] or "gone without a trace (killed?)")
        _say(f"driver: pid {driver['pid']} on {driver['hostname']}, {state}")
    if extra:
        out.print(f"{extra} point(s) in the ledger are no longer in the campaign (kept, not shown)")
    _progress(output_dir, points, {s.serve_id for s in active} if live else set())
    _precision_line(stored, precision)
    _workload_lines(levels, stored)
    _spend_line(servers, stored)
    if active:
        st = Table(title="servers running" if live else "servers left by a driver that is gone (reaped on resume)")
        for col in ("server", "nodes", "port", "pids", "gpus per node", "state"):
            st.add_column(col, no_wrap=True)
        for s in active:
            ranks = s.rank_list()
            nodes = "\n".join(f"{r.get('node_ip') or '?'} {(r.get('node_id') or '')[:8]}" for r in ranks)
            st.add_row(s.server_id, nodes, str(s.port or ""), "\n".join(str(r.get("pid") or "") for r in ranks),
                       "\n".join(r.get("gpu_ids") or "-" for r in ranks), s.state)
        print_table(st, out)
        for s in active:
            _say(f"{s.server_id}: {s.command}")
    _transport_table(servers, (stored.get("transport") or {}).get("require", "any"))
    _startup_table(servers)
    _events_table(events)
    if counts.get("done"):
        _validity_lines(output_dir)
    retried = {e["point_id"] for e in earlier} & {p.point_id for p in points if p.state == PointState.DONE}
    if retried:
        last = {e["point_id"]: e for e in earlier}
        _say(f"{len(retried)} point(s) done after failed attempts (the last error of each):")
        for pid in sorted(retried)[:10]:
            out.print(f"  {pid} attempt {last[pid]['attempt']}: {escape(str(last[pid]['error']))[:200]}",
                      highlight=False)
    complete = not counts.get("pending") and not counts.get("running") and not live
    if complete and counts.get("done"):
        for line in _answer_lines(output_dir):
            out.print(escape(line), highlight=False)
    for p in points:
        if p.state == PointState.FAILED:
            out.print(f"[red]failed[/] {p.point_id} ({p.serve_id}/{p.bench_id} run {p.run}, "
                      f"{p.attempts_made} attempt(s)): "
                      f"{escape(str(p.error))}", highlight=False)
            if p.log_tail:
                _say("  " + "\n  ".join(p.log_tail.splitlines()[-5:]), style="dim")
    return complete


def _answer_of(output_dir: str) -> Any:
    """The campaign's answer (`raysweep.results.answer.Answer`), as `run` and the report give it; None when it
    cannot be made (the report says why)."""
    from raysweep.report.page import conclusions_of

    try:
        c = conclusions_of(output_dir)
    except Exception as exc:  # a courtesy line: the report says why
        _say(f"answer not made: {exc}", style="dim")
        return None
    return c.answer if c is not None else None


def _kept(output_dir: str) -> dict[str, Any] | None:
    """The answer as `run` kept it (answer.json: its lines and JSON) while no point finished after; None when
    none is kept fresh, or it is not whole."""
    from raysweep.results.answer_file import kept_answer

    kept = kept_answer(output_dir)
    if kept is None or not isinstance(kept.get("lines"), list) or not isinstance(kept.get("answer"), dict):
        return None
    return kept


def _answer_lines(output_dir: str) -> list[str]:
    kept = _kept(output_dir)
    if kept is not None:   # made once, at the run's end
        return ["answer:", *(str(line) for line in kept["lines"])]
    found = _answer_of(output_dir)
    return ["answer:", *found.lines()] if found is not None else []


def _spend_line(servers: list[Any], stored: dict[str, Any]) -> None:
    """The GPU-hours held so far and, with a `cost:` block, what they cost (`raysweep.plan.cost`)."""
    if not servers:
        return
    from raysweep.campaign import CostSpec
    from raysweep.plan.cost import spend_line

    block = stored.get("cost")
    _say(spend_line(CostSpec.model_validate(block) if block else None, servers))


def _progress(output_dir: str, points: list[Any], running: set[str]) -> None:
    """Done / total per server configuration, and the ETA of what is left from the measured durations."""
    from raysweep import grid
    from raysweep.ledger import PointState
    from raysweep.plan.estimate import eta_s, format_duration, measured_from

    by_serve: dict[str, list[Any]] = {}
    for p in points:
        by_serve.setdefault(p.serve_id, []).append(p)
    if not by_serve:
        return
    table = Table(title="server configs")
    for col, justify in (("server config", "left"), ("parameters", "left"), ("done", "right"), ("failed", "right"),
                         ("left", "right"), ("state", "left")):
        table.add_column(col, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for serve_id, pts in by_serve.items():
        n = {s: sum(1 for p in pts if p.state == s) for s in PointState}
        left = n[PointState.PENDING] + n[PointState.RUNNING]
        state = "running" if serve_id in running else "finished" if not left else "waiting"
        table.add_row(serve_id, escape(grid.combo_label(pts[0].serve_params) or "base command"),
                      f"{n[PointState.DONE]}/{len(pts)}", str(n[PointState.FAILED]), str(left), state)
    print_table(table, out)
    left_runs = [(p.serve_id, p.bench_id) for p in points if p.state in (PointState.PENDING, PointState.RUNNING)]
    if not left_runs:
        return
    eta = eta_s(left_runs, measured_from(output_dir), running, max(1, len(running)))
    _say(f"ETA: about {format_duration(eta)} for {len(left_runs)} run(s) left (from measured durations"
         f"{', ' + str(len(running)) + ' server(s) at a time' if len(running) > 1 else ''})" if eta is not None
         else f"ETA: after the first point is done ({len(left_runs)} run(s) left)")


def _precision_facts(ledger: Any, stored: dict[str, Any]) -> tuple[list[Any], list[Any], dict[str, int]] | None:
    """bench.precision's rows, the points and the counts (`precision_counts`); None without bench.precision."""
    if not (stored.get("bench") or {}).get("precision"):
        return None
    from raysweep.results.precision import precision_counts

    return ledger.precision(), ledger.points(), precision_counts(ledger) or {}


def _precision_line(stored: dict[str, Any], facts: tuple[list[Any], list[Any], dict[str, int]] | None) -> None:
    """bench.precision: how many points reached the width, stopped at max_runs, or are still measuring."""
    spec = (stored.get("bench") or {}).get("precision")
    if not spec or facts is None:
        return
    rows, points, n = facts
    decided = {(r["serve_id"], r["bench_id"]) for r in rows if r["state"] != "measuring"}
    spent: dict[tuple[str, str], int] = {}
    for p in points:
        key = (p.serve_id, p.bench_id)
        spent[key] = max(spent.get(key, 0), p.run + 1)
    more = sum(max(0, int(spec["max_runs"]) - used) for key, used in spent.items() if key not in decided)
    _say(f"bench.precision ({spec['metric']} within +-{100 * spec['rel_half_width']:g} %, {spec['min_runs']} to "
         f"{spec['max_runs']} runs): {n['reached']} point(s) reached it, {n['max_runs']} stopped at max_runs "
         "without it, " + (f"{n['max_duration']} at max_duration_s without it, " if n["max_duration"] else "")
         + f"{n['measuring']} measuring"
         + (f"; up to {more} more run(s) beyond those planned" if more else ""))


def _startup_table(servers: list[Any]) -> None:
    """The phases of the server starts, medians per configuration (raysweep.serve.startup)."""
    from raysweep.serve.startup import table_rows

    header, rows = table_rows(servers)
    if not rows:
        return
    table = Table(title="server starts (medians, seconds)")
    for col in header:
        table.add_column(col, justify="left" if col == "server config" else "right")
    for row in rows:
        table.add_row(*row)
    print_table(table, out)


def _workload_lines(rows: list[dict[str, Any]], stored: dict[str, Any]) -> None:
    """bench.workload: the levels decided per server config and bench point."""
    from raysweep.levels.search import status_lines

    if not (stored.get("bench") or {}).get("workload"):
        return
    for line in status_lines(rows, stored):
        _say(line)


def _validity_lines(output_dir: str, limit: int = 20) -> None:
    """How many finished runs fail a validity check, and which (the first `limit`) with the checks."""
    from raysweep.results.table import flagged, load_records
    from raysweep.results.validity_story import validity_counts
    from raysweep.serve.hardware import mixed

    records = load_records(output_dir)
    for serve_id, kinds in mixed(records).items():
        out.print(f"[yellow]hardware: server config {serve_id} ran on {len(kinds)} kinds of hardware[/] ("
                  + "; ".join(f"{n} run(s) on {escape(h)}" for h, n in kinds.items())
                  + "): the runs off its main hardware fail the 'other hardware' check and are left out of its "
                  "aggregates", highlight=False)
    bad = flagged(records)
    counts = validity_counts(records)
    if not bad:
        out.print(f"validity: {escape(counts.sentence())}", highlight=False)
        return
    out.print(f"[yellow]validity: {escape(counts.sentence())}[/]", highlight=False)
    for r in bad[:limit]:
        out.print(f"  [yellow]![/] {r.get('point_id')} ({r.get('serve_id')}/{r.get('bench_id')} run "
                  f"{r.get('run_number')}): {escape(str(r.get('validity_issues')))}", highlight=False)
    if len(bad) > limit:
        out.print(f"  ... and {len(bad) - limit} more (results table: validity_ok, validity_issues)")


def _transport_table(servers: list[Any], require: str) -> None:
    """The NCCL transport verdict of the latest server of every configuration, refused ones in red."""
    from raysweep.place import transport

    latest = {s.serve_id: s for s in servers if s.transport}
    if not latest:
        return
    table = Table(title=f"transport (require: {require})")
    for col in ("server config", "server", "nodes", "links", "gate"):
        table.add_column(col)
    for serve_id, s in latest.items():
        v = s.transport_verdict()
        refused = transport.refusal(v, require)
        links = transport.describe(v)
        probe = s.fabric_record()
        if probe:
            links += "\nfabric probe: " + (f"{probe['busbw_gbps']:.2f} GB/s bus bandwidth ({probe.get('backend')}, "
                                            f"{probe.get('world')} ranks)" if probe.get("busbw_gbps") is not None
                                            else f"failed: {probe.get('error')}")
        table.add_row(serve_id, s.server_id, str(v.get("nnodes", 1)), escape(links),
                      "[red]refused[/]" if refused else "ok")
    print_table(table, out)
    for s in latest.values():  # the node-pair table of each multi-node server, and the links the probe measured
        names = [str(r.get("node_ip") or r.get("hostname") or "?") for r in s.rank_list()]
        measured = transport.describe_probe_links(s.fabric_record())
        if measured:
            _say(f"links of {s.server_id} (fabric probe):\n  " + "\n  ".join(measured))
        pairs = transport.describe_links(s.transport_verdict() or {}, names)
        if int((s.transport_verdict() or {}).get("nnodes", 1) or 1) > 1 and pairs:
            _say(f"links of {s.server_id}:\n  " + "\n  ".join(pairs))


def _events_table(events: list[dict[str, Any]]) -> None:
    """Node losses, re-placements and tail replicas, with when, which nodes and which configurations."""
    if not events:
        return
    import datetime

    table = Table(title="cluster events")
    for col in ("time", "event", "server config", "nodes", "detail"):
        table.add_column(col)
    for e in events:
        when = datetime.datetime.fromtimestamp(e["at"]).strftime("%H:%M:%S")
        table.add_row(when, e["kind"].replace("_", " "), ",".join(e["serve_ids"]),
                      "\n".join(n[:12] for n in e["nodes"]), escape(str(e["detail"] or "")))
    print_table(table, out)


def _status_document(output_dir: str) -> dict[str, Any]:
    from raysweep.results.directory import CampaignDir

    with CampaignDir(output_dir) as directory:
        doc = directory.status_document()
    done = (doc.get("counts") or {}).get("done")
    if not (doc.get("complete") and done):
        return {**doc, "answer": None}
    kept = _kept(output_dir)   # made once, at the run's end
    if kept is not None:
        return {**doc, "answer": kept["answer"]}
    found = _answer_of(output_dir)
    return {**doc, "answer": found.to_dict() if found is not None else None}

"""Running a campaign on this machine or a cluster: `run` (with its dry run) and `resume`."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.markup import escape

from raysweep.cli import logs
from raysweep.cli._common import (
    EXISTING_OUTPUT_DIR,
    _output_dir,
    _say,
    _sigterm_to_interrupt,
    address_option,
    console,
    main,
    running_dir,
)
from raysweep.cli.display import _print_counts, _ProgressDisplay, told_by_event
from raysweep.cli.jsonout import json_option, print_json
from raysweep.errors import LedgerError, UserError

if TYPE_CHECKING:
    from raysweep.campaign import CampaignSpec
    from raysweep.plan.plan import Plan
    from raysweep.record.directory import CampaignDir
    from raysweep.results.answer import Answer

ACCEPT_HELP = ("Go on although what the finished points were measured with changed (versions, warmup, client, "
               "transport); the change is recorded as an event.")


@main.command()
@click.argument("campaign_file", type=click.Path(dir_okay=False))
@address_option
@click.option("--output-dir", default=None, help="Override the campaign's output_dir.")
@click.option("--dry-run", is_flag=True, help="Print the plan (every server and bench command, run counts) and an "
                                              "estimate of server starts, GPU-hours and wall time; exit.")
@click.option("--estimate-from", "estimate_from", multiple=True, type=EXISTING_OUTPUT_DIR,
              help="With --dry-run: the output dir of an earlier campaign whose measured server start and point "
                   "durations the estimate uses (repeatable; the campaign's own output dir is always read).")
@click.option("--force", is_flag=True, help="Run even if the campaign's commands changed since points were finished.")
@click.option("--retry-failed", is_flag=True, help="Give points that used up max_attempts a fresh set of attempts.")
@click.option("--accept-changes", is_flag=True, help=ACCEPT_HELP)
@json_option
def run(campaign_file: str, address: str | None, output_dir: str | None, dry_run: bool, estimate_from: tuple[str, ...],
        force: bool, retry_failed: bool, accept_changes: bool, as_json: bool) -> None:
    """Run a campaign (resuming it if its output directory already has a ledger). A campaign with nothing
    left to run is answered from its files, without starting Ray."""
    from raysweep.campaign import load_campaign

    spec = load_campaign(campaign_file)
    if estimate_from and not dry_run:
        raise UserError("--estimate-from: only with --dry-run (a running campaign measures its own durations)")
    if dry_run and as_json:
        raise UserError("--json: the final summary of a run; --dry-run prints a plan for people. Accepted: one of them")
    if dry_run:
        _dry_run(spec, address, _output_dir(spec, output_dir), estimate_from)
        return
    _run(spec, _output_dir(spec, output_dir), address, force, retry_failed, as_json, accept_changes)


def _dry_run(spec: CampaignSpec, address: str | None, output_dir: Path, estimate_from: tuple[str, ...]) -> None:
    from raysweep.bench.command import bench_argv
    from raysweep.campaign.vllm_options import check_campaign
    from raysweep.drive.driver import check_placement, placement_lines, ray_session
    from raysweep.place import placement
    from raysweep.plan.plan import build_plan, dry_run_text

    plan = build_plan(spec)
    options = check_campaign(spec)  # refused here as `validate` and `run` refuse it
    if _endpoint_dry_run(spec, plan, output_dir, options.line() if options.checked or options.note else None):
        return
    if address:
        with logs.routed(), ray_session(address):
            nodes, where = placement.cluster_nodes(), f"the cluster at {address}"
    else:
        nodes, where = placement.local_nodes(), "this machine (an embedded Ray)"
    try:
        layouts = check_placement(plan, nodes)
    except UserError as exc:
        if address:
            raise
        raise UserError(f"{exc}\n(planned for this machine; pass --address to plan for a cluster)") from None
    if spec.offline or (spec.campaign.bench is not None and spec.campaign.bench.backend == "native"):
        def render(argv: list[str]) -> list[str]:
            return argv
    else:
        def render(argv: list[str]) -> list[str]:
            return bench_argv(argv, "http://<node ip>:<port>", "<result dir>")
    text = dry_run_text(plan, render,
                        lambda s: placement_lines(s, layouts[s.id], spec.offline))
    if options.checked or options.note:
        text += f"\n\n{options.line()}"
    if spec.campaign.tune is None:  # the winner's confirmation after the sweep: on or off, and its cost
        from raysweep.confirm.runs import dry_run_lines as confirm_lines
        from raysweep.plan.estimate import estimate

        said = confirm_lines(plan, estimate(plan).wall_s)
        text += "\n\n" + "\n".join(said) if said else ""
    if spec.campaign.tune is not None:  # the space, budget and first candidates instead of a server list
        from raysweep.tune import dry_run_lines

        text += "\n".join(dry_run_lines(plan, nodes, lambda s, lay: placement_lines(s, lay)))
    gpus = sum(n.gpus for n in nodes)
    _say(f"{text}\n\nPlaced for {where}: {len(nodes)} node(s), {gpus} GPU(s)"
         f"\nResults would go to {output_dir}")
    if links := _recorded_links(output_dir):  # a campaign being resumed
        _say(links)
    if spec.campaign.tune is not None:
        from contextlib import ExitStack

        from raysweep.plan.estimate import measured_from
        from raysweep.record.directory import CampaignDir
        from raysweep.tune import dry_run_estimate

        with ExitStack() as stack:
            _say(dry_run_estimate(plan, measured_from(*(stack.enter_context(CampaignDir(d)) for d in estimate_from))))
        return
    if advice := _measured_design(plan, output_dir, estimate_from):
        _say(advice)
    _say(_estimate_text(plan, output_dir, estimate_from, layouts, gpus, spec.campaign.placement.max_servers,
                        spec.campaign.cost))


def _measured_design(plan: Plan, output_dir: Path, estimate_from: tuple[str, ...]) -> str:
    """The spreads between starts and between runs that the output dir (and `--estimate-from`) measured on 2
    server starts or more, and the design they choose ("" where none did): a pilot's answer."""
    import statistics
    from contextlib import ExitStack

    from raysweep.errors import UserError
    from raysweep.ledger import LEDGER_FILE
    from raysweep.plan import design
    from raysweep.plan.estimate import measured_from
    from raysweep.record.directory import CampaignDir
    from raysweep.record.runs import read_records

    if plan.spec.offline or plan.spec.campaign.tune is not None or plan.spec.campaign.sla is not None:
        return ""
    dirs = [d for d in [str(output_dir), *estimate_from] if (Path(d) / LEDGER_FILE).is_file()]
    with ExitStack() as stack:
        opened = [stack.enter_context(CampaignDir(d)) for d in dirs]
        records: list[dict[str, Any]] = []
        for d, directory in zip(dirs, opened):
            try:
                records += [{**r, "serve_id": f"{d}/{r.get('serve_id')}"} for r in read_records(directory)]
            except (OSError, ValueError, UserError):
                continue
        d_spec = plan.spec.campaign.design
        metric = d_spec.metric if d_spec is not None else "output_throughput"
        found = design.components_of(records, metric)
        if found is None:
            return ""
        m = measured_from(*opened)
    starts = [v for vs in m.server_start_s.values() for v in vs]
    runs = [v for vs in m.point_s.values() for v in vs]
    lines = design.measured_lines(plan.spec, found, statistics.median(starts) if starts else None,
                                  statistics.median(runs) if runs else None, max(len(plan.benches), 1),
                                  ", ".join(dirs))
    return "\n".join(lines)


def _endpoint_dry_run(spec: CampaignSpec, plan: Plan, output_dir: Path, options: str | None = None) -> bool:
    """The dry run of a `serve.url` campaign (nothing is placed: the endpoints run already); False otherwise.
    `options` is the verdict of the vLLM options check, when there was one."""
    from raysweep.drive.endpoint import endpoint_lines, endpoints_of
    from raysweep.plan.plan import dry_run_text

    eps = {s.id: ep for s, ep in zip(plan.serves, endpoints_of(spec))}
    if not eps:
        return False
    _say(dry_run_text(plan, lambda argv: argv, lambda s: endpoint_lines(eps[s.id]))
         + (f"\n\n{options}" if options else "")
         + f"\n\nClients: Ray actors (an embedded local Ray here, or the cluster given with --address)"
         f"\nResults would go to {output_dir}")
    return True


def _recorded_links(output_dir: Path) -> str:
    """For a campaign being resumed: the links and fabric probe its servers got so far (empty otherwise)."""
    from raysweep.ledger import LEDGER_FILE
    from raysweep.place.transport import recorded_lines
    from raysweep.record.directory import CampaignDir

    if not (output_dir / LEDGER_FILE).is_file():
        return ""
    with CampaignDir(output_dir) as campaign_dir:
        ledger = campaign_dir.ledger
        lines = recorded_lines(ledger.servers())
    return "Links recorded so far (latest server of each configuration):\n" + "\n".join(lines) if lines else ""


def _estimate_text(plan: Plan, output_dir: Path, estimate_from: tuple[str, ...], layouts: dict[str, Any], gpus: int,
                   max_servers: int | None, cost: Any = None) -> str:
    """The estimate of what is left: the output dir's own finished points are not counted again."""
    from contextlib import ExitStack

    from raysweep.ledger import LEDGER_FILE, PointState
    from raysweep.plan.estimate import estimate, measured_from
    from raysweep.record.directory import CampaignDir

    own = (output_dir / LEDGER_FILE).is_file()
    done: set[str] = set()
    with ExitStack() as stack:
        wanted: list[str | Path] = [*([output_dir] if own else []), *estimate_from]
        opened = [stack.enter_context(CampaignDir(d)) for d in wanted]
        if own:
            done = {p.point_id for p in opened[0].ledger.points() if p.state == PointState.DONE}
        measured = measured_from(*opened)
    widest = max((lay.gpu_count for lay in layouts.values()), default=0)
    lanes = gpus // widest if gpus and widest else 1
    if max_servers:
        lanes = min(lanes, max_servers)
    gpus_of = {sid: lay.gpu_count for sid, lay in layouts.items()} if gpus else None  # None: their shapes
    est = estimate(plan, done=done, measured=measured, lanes=max(1, lanes), gpus_of=gpus_of)
    source = ("measured in " + ", ".join([str(output_dir)] * own + list(estimate_from))) if measured else (
        "from the commands and raysweep.plan.estimate.DEFAULTS")
    notes = [f"durations {source}"] + [f"{len(done)} run(s) already done are not counted"] * bool(done)
    if not gpus:  # servers without GPUs bill node-hours (raysweep.plan.cost), not their shapes' GPU-hours
        nodes = {sid: max(1, getattr(lay, "nnodes", 1)) for sid, lay in layouts.items()}
        est = dataclasses.replace(est, node_hours=sum(nodes.get(sid, 1) * s for sid, s in est.per_serve_s.items())
                                  / 3600)
    from raysweep.plan.cost import estimate_line

    priced = estimate_line(cost, est.gpu_hours, est.node_hours)
    return f"{est.text()} ({'; '.join(notes)})" + (f"\n{priced}" if priced else "")


@main.command()
@click.argument("output_dir", type=click.Path(file_okay=False))
@address_option
@click.option("--force", is_flag=True, help="Take over the campaign even if another driver seems to hold it.")
@click.option("--retry-failed", is_flag=True, help="Give points that used up max_attempts a fresh set of attempts.")
@click.option("--accept-changes", is_flag=True, help=ACCEPT_HELP)
@json_option
def resume(output_dir: str, address: str | None, force: bool, retry_failed: bool, accept_changes: bool,
           as_json: bool) -> None:
    """Continue an interrupted campaign from its output directory."""
    from raysweep.campaign import campaign_from_dict, load_campaign
    from raysweep.errors import CampaignError
    from raysweep.record.directory import CampaignDir

    with CampaignDir(output_dir) as campaign_dir:
        ledger = campaign_dir.ledger
        stored, source = ledger.stored_campaign(), ledger.meta("campaign_file") or ""
        recorded = json.loads(ledger.meta("variables") or "{}")
    unset = {k: v for k, v in recorded.items() if k not in os.environ}
    for name, value in unset.items():  # nothing to export again: what the campaign expanded at `run`
        console.print(f"${{{name}}} is not set: using the value it had when the campaign was run ({name}="
                      f"{escape(value)})", highlight=False)
    try:
        spec = campaign_from_dict(stored, base_dir=Path(output_dir).resolve(), source_path=source,
                                  env={**os.environ, **unset})
    except CampaignError as exc:
        if not (source and Path(source).is_file() and "was masked" in str(exc)):
            raise
        spec = load_campaign(source)  # the original file still has the secret; the ledger checks its meaning
    _run(spec, Path(output_dir), address, force, retry_failed, as_json, accept_changes)


def _run(spec: CampaignSpec, output_dir: Path, address: str | None, force: bool, retry_failed: bool = False,
         as_json: bool = False, accept_changes: bool = False) -> None:
    from raysweep.record.directory import CampaignDir

    with CampaignDir(output_dir) as directory:
        _run_in(spec, directory, address, force, retry_failed, as_json, accept_changes)


def _run_in(spec: CampaignSpec, directory: CampaignDir, address: str | None, force: bool, retry_failed: bool,
            as_json: bool, accept_changes: bool) -> None:
    from raysweep.drive import checks as run_checks

    output_dir = directory.path
    finished = run_checks.finished(spec, directory, retry_failed)
    if finished is not None:  # nothing left to run: answered from the files; Ray is not even imported
        _answer_finished(spec, directory, finished, as_json)
        return
    from raysweep.drive.driver import driver_cpus, ray_session, run_campaign
    from raysweep.results.table import write_results

    # endpoints, tracking, a changed campaign, a live driver or changed settings: refused before Ray starts
    run_checks.check_before_run(spec, directory, force=force, accept_changes=accept_changes)
    running_dir.append(output_dir)
    _sigterm_to_interrupt()
    display = _ProgressDisplay()
    summary, refused = None, False
    try:
        with logs.routed(output_dir / logs.LOG_FILE, drop=told_by_event), display, \
                ray_session(address, driver_cpus(spec)):
            _sigterm_to_interrupt()  # again: starting Ray installs its own handler, which aborts
            summary = run_campaign(spec, directory, force=force, retry_failed=retry_failed, on_event=display.event,
                                   accept_changes=accept_changes, finish=write_results)
    except LedgerError:  # refused meanwhile (another driver took the campaign): its results are not ours to write
        refused = True
        raise
    finally:
        if not refused:
            paths = write_results(directory)
            console.print(f"Results: {', '.join(str(p) for p in paths)}", highlight=False)
    _print_counts(summary.counts)
    for p in summary.failures[:10]:
        console.print(f"[red]failed[/] {p.point_id} ({p.serve_id}/{p.bench_id} run {p.run}, "
                      f"{p.attempts_made} attempt(s)): {escape(str(p.error))}", highlight=False)
    if summary.stopped_early:
        console.print(f"[yellow]stopped early:[/] {escape(str(summary.stopped_early))}")
    drawn = _write_report(directory) if spec.campaign.report and summary.counts.get("done") else None
    if drawn is None and summary.counts.get("done"):
        _answer_kept(directory)
    if as_json:
        print_json("run", _run_document(spec, directory, summary.counts, summary.failures, summary.stopped_early,
                                        paths, drawn, ran=True))
    if summary.failures or summary.stopped_early or summary.counts.get("pending"):
        sys.exit(1)


def _answer_finished(spec: CampaignSpec, directory: CampaignDir, finished: tuple[dict[str, int], list[Any]],
                     as_json: bool) -> None:
    """A finished campaign run again: its counts, results and report, each made again only where a point
    finished after it was written."""
    from raysweep.results.table import write_results

    counts, failed = finished
    output_dir = directory.path
    last = max((p.ended_at or 0.0 for p in directory.ledger.points()), default=0.0)

    def fresh(path: Path) -> bool:
        return path.is_file() and path.stat().st_mtime >= last

    console.print("nothing left to run: every point is done or failed for good (--retry-failed runs the failed "
                  "ones again)", highlight=False)
    paths = [output_dir / f"results.{f}" for f in ("parquet", "csv")]
    if not all(fresh(p) for p in paths):
        paths = write_results(directory)
    console.print(f"Results: {', '.join(str(p) for p in paths)}", highlight=False)
    _print_counts(counts)
    for p in failed[:10]:
        console.print(f"[red]failed[/] {p.point_id} ({p.serve_id}/{p.bench_id} run {p.run}, "
                      f"{p.attempts_made} attempt(s)): {escape(str(p.error))}", highlight=False)
    drawn: tuple[Path, list[Path], list[str]] | None = None
    if spec.campaign.report and counts.get("done"):
        report = output_dir / "report.html"  # report.REPORT_FILE, without importing the report's modules
        if fresh(report):
            console.print(f"Report: {report} (up to date)", highlight=False)
            drawn = (report, [], _headlines(directory))
        else:
            drawn = _write_report(directory)
    if drawn is None and counts.get("done"):
        _answer_kept(directory)
    if as_json:
        print_json("run", _run_document(spec, directory, counts, failed, None, paths, drawn, ran=False))
    if failed:
        sys.exit(1)


def _run_document(spec: CampaignSpec, directory: CampaignDir, counts: dict[str, int], failures: list[Any],
                  stopped_early: str | None, results: list[Path], drawn: tuple[Path, list[Path], list[str]] | None,
                  ran: bool) -> dict[str, Any]:
    """What `run --json` prints at the end (raysweep/schemas/run.json)."""
    return {"campaign": spec.campaign.name, "output_dir": directory.path, "ran": ran, "counts": counts,
            "failures": [{"point_id": p.point_id, "serve_id": p.serve_id, "bench_id": p.bench_id, "run": p.run,
                          "attempts": p.attempts_made, "error": p.error} for p in failures],
            "stopped_early": stopped_early, "results": results, "report": drawn[0] if drawn else None,
            "figures": drawn[1] if drawn else [], "conclusions": drawn[2] if drawn else [],
            "answer": _answer_json(directory) if drawn and drawn[2] else None}


def _answer_json(directory: CampaignDir) -> dict[str, Any] | None:
    """The campaign's answer as JSON (`raysweep.results.answer.Answer.to_dict`), as the lines printed render it."""
    from raysweep.report.page import conclusions_of

    try:
        c = conclusions_of(directory)
    except Exception:  # as `_headlines`: the lines said why
        return None
    return c.answer.to_dict() if c is not None else None


def _keep(directory: CampaignDir, answer: Answer) -> None:
    """The answer kept beside the results (`answer.json`), for the faces that read many campaigns."""
    from raysweep.results.answer_file import keep_answer

    try:
        keep_answer(directory, answer)
    except OSError as exc:  # a courtesy to the other faces: the run's results stand without it
        console.print(f"answer.json not written: {escape(str(exc))}", highlight=False)


def _answer_kept(directory: CampaignDir) -> None:
    """Without a report: the answer made once and kept (`answer.json`) unless the one kept is fresh, so that
    `status`, `compare` and the catalogue read it instead of making it again. Nothing is printed but a failure;
    the results stand without it."""
    from raysweep.report.page import conclusions_of
    from raysweep.results.answer_file import kept_answer

    if kept_answer(directory) is not None:
        return
    try:
        answer = conclusions_of(directory)
    except Exception as exc:  # as `_headlines`: the answer is a courtesy beside the results
        console.print(f"answer not kept: {escape(str(exc))}", highlight=False)
        return
    if answer is not None:
        _keep(directory, answer.answer)


def _headlines(directory: CampaignDir) -> list[str]:
    """The report's conclusions, one line per bench shape, without writing the report (printed, as
    `_write_report` prints them)."""
    from raysweep.cli import logs
    from raysweep.report.page import conclusions_of
    from raysweep.results.conclusions import headlines

    try:
        answer = conclusions_of(directory)
        lines = headlines(answer, verbose=logs.verbosity > 0) if answer is not None else []
        if answer is not None:
            _keep(directory, answer.answer)
    except Exception as exc:  # as write_report_with_headlines: the report says why, the lines are a courtesy
        console.print(f"conclusions not made: {escape(str(exc))}", highlight=False)
        lines = []
    for line in lines:
        console.print(escape(line), highlight=False)
    return lines


def _write_report(directory: CampaignDir) -> tuple[Path, list[Path], list[str]]:
    """`report: true`: the HTML report and the default figures, with their paths; (report, figures,
    conclusions)."""
    from raysweep.cli import logs
    from raysweep.cli.analysing import default_figures
    from raysweep.report.page import write_report_with_answer

    figures, _ = default_figures(directory.path)  # their notes are in the report
    path, found = write_report_with_answer(directory)
    lines = found.lines(verbose=logs.verbosity > 0) if found is not None else []  # tests and p-values with -v
    if found is not None:
        _keep(directory, found)
    console.print(f"Report: {path}", highlight=False)
    console.print(f"Figures: {', '.join(str(p) for p in figures)}", highlight=False)
    for line in lines:  # the report's conclusions, one line per bench shape
        console.print(escape(line), highlight=False)
    return path, figures, lines

"""The `raysweep` command (run, resume, status, results, sla, plot, pareto, report, import, tiny-model, preflight,
submit, jobs, stop, crosscheck); only it prints.

Exit codes: 0 everything done; 1 some points failed or the campaign stopped early; 2 bad input (nothing
was started); 130 interrupted (finished points are kept; `raysweep resume` continues).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from raysweep.errors import UserError

console = Console(stderr=True, soft_wrap=True)
out = Console(soft_wrap=True)


def _say(text: str, err: bool = False, style: str | None = None) -> None:
    """Print text as it is (no rich markup), to stdout or stderr."""
    (console if err else out).print(text, markup=False, highlight=False, style=style)


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except UserError as exc:
            console.print("error:", style="bold red", end=" ")
            _say(str(exc), err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            console.print("[yellow]interrupted[/]: finished points are kept; continue with `raysweep resume OUTPUT_DIR`")
            sys.exit(130)


class _OutputDir(click.ParamType):
    """An output directory, or the filesystem URI a campaign was mirrored to (`storage:`), which is
    downloaded first (into ~/.cache/raysweep/mirrors)."""

    name = "OUTPUT_DIR"

    def __init__(self, must_exist: bool = False) -> None:
        self.must_exist = must_exist

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        from raysweep import storage

        if storage.is_uri(str(value)):
            return str(storage.resolve_output(str(value)))
        if self.must_exist and not Path(value).is_dir():
            self.fail(f"directory {value!r} does not exist", param, ctx)
        return str(value)


OUTPUT_DIR = _OutputDir()
EXISTING_OUTPUT_DIR = _OutputDir(must_exist=True)


@click.group(cls=_Group)
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
def main(verbose: int) -> None:
    """vLLM serving benchmark sweeps across a Ray cluster."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def _sigterm_to_interrupt() -> None:
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, handler)


def _output_dir(spec: Any, override: str | None) -> Path:
    c = spec.campaign
    path = Path(override or c.output_dir or f"results/{c.name}")
    blocker = next((p for p in (path, *path.parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        source = "--output-dir" if override else "output_dir"
        raise UserError(f"{source}: {str(path)!r} cannot be a directory: {str(blocker)!r} exists and is not a "
                        "directory; name a new or existing directory")
    return path


@main.command()
@click.argument("campaign_file", type=click.Path(dir_okay=False))
@click.option("--address", default=None, help="Ray cluster to join (`auto`, or HOST:PORT). Default: an embedded local Ray.")
@click.option("--output-dir", default=None, help="Override the campaign's output_dir.")
@click.option("--dry-run", is_flag=True, help="Print the plan (every server and bench command, run counts) and exit.")
@click.option("--force", is_flag=True, help="Run even if the campaign's commands changed since points were finished.")
@click.option("--retry-failed", is_flag=True, help="Give points that used up max_attempts a fresh set of attempts.")
def run(campaign_file: str, address: str | None, output_dir: str | None, dry_run: bool, force: bool,
        retry_failed: bool) -> None:
    """Run a campaign (resuming it if its output directory already has a ledger)."""
    from raysweep.campaign import load_campaign
    from raysweep.plan import build_plan, dry_run_text

    spec = load_campaign(campaign_file)
    if dry_run:
        from raysweep import placement
        from raysweep.bench.command import bench_argv
        from raysweep.driver import check_placement, placement_lines, ray_session

        plan = build_plan(spec)
        if address:
            with ray_session(address):
                nodes, where = placement.cluster_nodes(), f"the cluster at {address}"
        else:
            nodes, where = placement.local_nodes(), "this machine (an embedded Ray)"
        try:
            layouts = check_placement(plan, nodes)
        except UserError as exc:
            if address:
                raise
            raise UserError(f"{exc}\n(planned for this machine; pass --address to plan for a cluster)") from None
        if spec.offline or spec.campaign.bench.backend == "native":
            def render(argv: list[str]) -> list[str]:
                return argv
        else:
            def render(argv: list[str]) -> list[str]:
                return bench_argv(argv, "http://<node ip>:<port>", "<result dir>")
        text = dry_run_text(plan, render,
                            lambda s: placement_lines(s, layouts[s.id], spec.offline))
        gpus = sum(n.gpus for n in nodes)
        _say(f"{text}\n\nPlaced for {where}: {len(nodes)} node(s), {gpus} GPU(s)"
             f"\nResults would go to {_output_dir(spec, output_dir)}")
        return
    _run(spec, _output_dir(spec, output_dir), address, force, retry_failed)


@main.command()
@click.argument("output_dir", type=click.Path(file_okay=False))
@click.option("--address", default=None, help="Ray cluster to join (`auto`, or HOST:PORT). Default: an embedded local Ray.")
@click.option("--force", is_flag=True, help="Take over the campaign even if another driver seems to hold it.")
@click.option("--retry-failed", is_flag=True, help="Give points that used up max_attempts a fresh set of attempts.")
def resume(output_dir: str, address: str | None, force: bool, retry_failed: bool) -> None:
    """Continue an interrupted campaign from its output directory."""
    from raysweep.campaign import campaign_from_dict, load_campaign
    from raysweep.errors import CampaignError
    from raysweep.ledger import Ledger

    ledger = Ledger.open_existing(output_dir)
    try:
        stored, source = ledger.stored_campaign(), ledger.meta("campaign_file") or ""
    finally:
        ledger.close()
    try:
        spec = campaign_from_dict(stored, base_dir=Path(output_dir).resolve(), source_path=source)
    except CampaignError as exc:
        if not (source and Path(source).is_file() and "was masked" in str(exc)):
            raise
        spec = load_campaign(source)  # the original file still has the secret; the ledger checks its meaning
    _run(spec, Path(output_dir), address, force, retry_failed)


def _run(spec: Any, output_dir: Path, address: str | None, force: bool, retry_failed: bool = False) -> None:
    from raysweep.driver import open_campaign, ray_session, run_campaign
    from raysweep.results import write_results

    _, ledger = open_campaign(spec, output_dir, force=force)  # refuse a changed campaign before starting Ray
    ledger.close()
    _sigterm_to_interrupt()
    display = _ProgressDisplay()
    summary = None
    try:
        with display, ray_session(address):
            _sigterm_to_interrupt()  # again: starting Ray installs its own handler, which aborts
            summary = run_campaign(spec, output_dir, force=force, retry_failed=retry_failed, on_event=display.event)
    finally:
        paths = write_results(output_dir)
        console.print(f"Results: {', '.join(str(p) for p in paths)}", highlight=False)
    _print_counts(summary.counts)
    for p in summary.failures[:10]:
        console.print(f"[red]failed[/] {p.point_id} ({p.serve_id}/{p.bench_id} run {p.run}, "
                      f"{p.attempts} attempt(s)): {escape(str(p.error))}", highlight=False)
    if summary.stopped_early:
        console.print(f"[yellow]stopped early:[/] {escape(str(summary.stopped_early))}")
    if summary.failures or summary.stopped_early or summary.counts.get("pending"):
        sys.exit(1)


class _ProgressDisplay:
    """Points done / total, the servers running and an ETA, from the driver's events."""

    def __init__(self) -> None:
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console)
        self.task: Any = None
        self.running: set[str] = set()
        self._lock = threading.Lock()  # events come from every running configuration's thread

    def __enter__(self) -> _ProgressDisplay:
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    def event(self, kind: str, **data: Any) -> None:
        with self._lock:
            self._event(kind, data)

    def _event(self, kind: str, data: dict[str, Any]) -> None:
        p = self.progress
        if kind == "campaign_start":
            done = data["counts"].get("done", 0)
            self.task = p.add_task("starting", total=data["total"], completed=done)
        elif self.task is None:
            return
        elif kind == "server_starting":
            lay = data["layout"]
            p.console.print(f"server {data['server_id']} ({data['serve'].label}) starting on {lay.describe()}",
                            highlight=False)
        elif kind == "server_ready":
            self.running.add(data["server_id"])
            p.console.print(f"server {data['server_id']} ready in {data['elapsed']:.1f} s", highlight=False)
        elif kind == "server_stopped":
            self.running.discard(data["server_id"])
        elif kind == "node_lost":
            p.console.print(f"[yellow]{escape(data['reason'])}[/]: server config {data['serve'].id} is torn down "
                            "and placed again", highlight=False)
        elif kind == "transport":
            from raysweep.transport import describe

            refused = data["refused"]
            p.console.print(f"server {data['server_id']} transport: {escape(describe(data['verdict']))}"
                            + (f" [red]refused[/] ({escape(refused.splitlines()[0])})" if refused else ""),
                            highlight=False)
        elif kind == "config_failed":
            p.console.print(f"[red]server config {data['serve'].id} failed:[/] {escape(data['error'])}", highlight=False)
        elif kind == "server_failed":
            p.console.print(f"[red]server {data['server_id']} failed:[/] {escape(str(data['error']))}", highlight=False)
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
        elif kind == "point_failed":
            p.console.print(f"[red]failed[/] {escape(data['point'].serve.label)} / {escape(data['point'].bench.label)} "
                            f"run {data['point'].run} "
                            f"(attempt {data['attempt']}): {escape(str(data['error']))}", highlight=False)


def _client_limited_note(r: dict[str, Any]) -> str:
    """The mark of a point the client limited (its `client_limited` event says no more: one line a point)."""
    if not r.get("client_limited"):
        return ""
    why = "; ".join(str(x) for x in (r.get("client_limited_reason"), r.get("client_limited_stop")) if x)
    return f" [yellow](client-limited{': ' + escape(why) if why else ''})[/]"


def _print_counts(counts: dict[str, int]) -> None:
    console.print("points: " + ", ".join(f"{k} {v}" for k, v in counts.items()), highlight=False)


@main.command()
@click.argument("output_dir", type=OUTPUT_DIR)
def status(output_dir: str) -> None:
    """Done / running / failed / pending counts, running servers, failures with reasons."""
    from raysweep.ledger import Ledger, PointState

    ledger = Ledger.open_existing(output_dir)
    try:
        counts, points, servers = ledger.counts(), ledger.points(), ledger.servers()
        name, extra, driver = ledger.meta("name"), ledger.out_of_plan(), ledger.last_driver()
        stored = ledger.stored_campaign()
    finally:
        ledger.close()
    active = [s for s in servers if s.stopped_at is None]
    table = Table(title=f"campaign {name}")
    for col in ("done", "running", "failed", "pending", "total"):
        table.add_column(col, justify="right")
    table.add_row(*(str(counts.get(k, 0)) for k in ("done", "running", "failed", "pending")), str(sum(counts.values())))
    out.print(table)
    live = False
    if driver:
        from raysweep.driver import driver_alive

        live = driver["ended_at"] is None and driver_alive(driver["hostname"], driver["pid"], driver["pid_create_time"])
        state = "running" if live else (driver["outcome"] or "gone without a trace (killed?)")
        _say(f"driver: pid {driver['pid']} on {driver['hostname']}, {state}")
    if extra:
        out.print(f"{extra} point(s) in the ledger are no longer in the campaign (kept, not shown)")
    if active:
        st = Table(title="servers running" if live else "servers left by a driver that is gone (reaped on resume)")
        for col in ("server", "nodes", "port", "pids", "gpus per node", "state"):
            st.add_column(col, no_wrap=True)
        for s in active:
            ranks = s.rank_list()
            st.add_row(s.server_id, "\n".join(f"{r.get('node_ip') or '?'} {(r.get('node_id') or '')[:8]}" for r in ranks),
                       str(s.port or ""), "\n".join(str(r.get("pid") or "") for r in ranks),
                       "\n".join(r.get("gpu_ids") or "-" for r in ranks), s.state)
        out.print(st)
        for s in active:
            _say(f"{s.server_id}: {s.command}")
    _transport_table(servers, (stored.get("transport") or {}).get("require", "any"))
    if counts.get("done"):
        _validity_lines(output_dir)
    for p in points:
        if p.state == PointState.FAILED:
            out.print(f"[red]failed[/] {p.point_id} ({p.serve_id}/{p.bench_id} run {p.run}, {p.attempts} attempt(s)): "
                      f"{escape(str(p.error))}", highlight=False)
            if p.log_tail:
                _say("  " + "\n  ".join(p.log_tail.splitlines()[-5:]), style="dim")


def _validity_lines(output_dir: str, limit: int = 20) -> None:
    """How many finished runs fail a validity check, and which (the first `limit`) with the checks."""
    from raysweep.results import flagged, load_records

    records = load_records(output_dir)
    bad = flagged(records)
    if not bad:
        out.print(f"validity: all {len(records)} finished run(s) pass every check", highlight=False)
        return
    out.print(f"[yellow]validity: {len(bad)} of {len(records)} finished run(s) fail a check[/]", highlight=False)
    for r in bad[:limit]:
        out.print(f"  [yellow]![/] {r.get('point_id')} ({r.get('serve_id')}/{r.get('bench_id')} run "
                  f"{r.get('run_number')}): {escape(str(r.get('validity_issues')))}", highlight=False)
    if len(bad) > limit:
        out.print(f"  ... and {len(bad) - limit} more (results table: validity_ok, validity_issues)")


def _transport_table(servers: list[Any], require: str) -> None:
    """The NCCL transport verdict of the latest server of every configuration, refused ones in red."""
    from raysweep import transport

    latest = {s.serve_id: s for s in servers if s.transport}
    if not latest:
        return
    table = Table(title=f"transport (require: {require})")
    for col in ("server config", "server", "nodes", "links", "gate"):
        table.add_column(col)
    for serve_id, s in latest.items():
        v = s.transport_verdict()
        refused = transport.refusal(v, require)
        table.add_row(serve_id, s.server_id, str(v.get("nnodes", 1)), transport.describe(v),
                      "[red]refused[/]" if refused else "ok")
    out.print(table)


@main.command()
@click.argument("output_dir", type=OUTPUT_DIR)
@click.option("--format", "formats", type=click.Choice(["csv", "parquet", "json"]), multiple=True,
              help="Format(s) to write (default: parquet and csv).")
def results(output_dir: str, formats: tuple[str, ...]) -> None:
    """Write the merged results table (one row per run) and print where it is."""
    from raysweep.ledger import Ledger
    from raysweep.results import results_table, write_results

    Ledger.open_existing(output_dir).close()
    paths = write_results(output_dir, formats or ("parquet", "csv"))
    df = results_table(output_dir)
    out.print(f"{len(df)} row(s), {len(df.columns)} column(s)")
    for p in paths:
        out.print(str(p), highlight=False)


@main.command()
@click.argument("output_dir", type=OUTPUT_DIR)
def sla(output_dir: str) -> None:
    """The SLA table: per server config x bench point x target, the largest load that meets the target."""
    import math

    from raysweep.files import write_text_atomic
    from raysweep.results import sla_table

    df = sla_table(output_dir)
    if df.empty:
        raise UserError(f"{output_dir}: no SLA search has finished here (does the campaign have `sla:`?)")
    table = Table("server config", "bench point", "target", "state", "largest pass", "smallest fail", "probes",
                  "at pass: req/s", "notes")

    def num(v: Any) -> str:
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:g}"

    for r in df.itertuples():
        table.add_row(escape(r.serve_label), escape(r.bench_label), escape(r.target), r.state, num(r.largest_pass),
                      num(r.smallest_fail), str(r.probes), num(getattr(r, "at_pass_request_throughput", None)),
                      escape(r.notes))
    out.print(table)
    path = write_text_atomic(Path(output_dir) / "sla.csv", df.to_csv(index=False))
    out.print(str(path), highlight=False)


@main.command()
@click.option("--address", default=None, help="Ray cluster to join (`auto`, or HOST:PORT). Default: an embedded "
                                              "local Ray (this machine only).")
@click.option("--json", "as_json", is_flag=True, help="Print the whole report as JSON instead of tables.")
@click.option("--out", "out_path", default=None, type=click.Path(dir_okay=False),
              help="Also write the whole report as JSON to this file.")
@click.option("--strict", is_flag=True, help="Exit 1 when nodes differ or a node has a warning (default: exit 0).")
def preflight(address: str | None, as_json: bool, out_path: str | None, strict: bool) -> None:
    """Check every node before a sweep: GPUs and driver, InfiniBand ports, NCCL environment, Python, Ray and
    vLLM versions; flag the nodes that differ from the others."""
    import json

    from raysweep.driver import ray_session
    from raysweep.files import write_json_atomic
    from raysweep.preflight import describe_node, finding_text, node_label, run_preflight

    with ray_session(address):
        pre = run_preflight()
    data = pre.to_dict()
    if out_path:
        write_json_atomic(out_path, data)
    if as_json:
        _say(json.dumps(data, indent=2, default=str))
    else:
        for node in pre.nodes:
            table = Table("", "", title=f"node {escape(node_label(node))}" + (" (head)" if node["is_head"] else ""),
                          show_header=False)
            for what, value in describe_node(node):
                table.add_row(what, escape(value))
            out.print(table)
        if pre.findings:
            table = Table("node", "field", "value", "most common", title="nodes that differ")
            for f in pre.findings:
                table.add_row(escape(f.node), f.field, escape(finding_text(f.value, f.field)),
                              "no majority (tie)" if f.tie else escape(finding_text(f.majority, f.field)))
            out.print(table)
        for w in pre.warnings:
            out.print(f"[yellow]warning[/] {escape(w.node)}: {escape(w.message)}", highlight=False)
        _say(f"{len(pre.nodes)} node(s), {len(pre.findings)} finding(s), {len(pre.warnings)} warning(s)")
    if out_path:
        console.print(f"report: {out_path}", highlight=False)
    if strict and (pre.findings or pre.warnings):
        sys.exit(1)


@main.command("tiny-model")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--overwrite", is_flag=True)
def tiny_model(directory: str, overwrite: bool) -> None:
    """Write a tiny dummy-weight Llama (config + tokenizer) that the vLLM CPU build can serve."""
    from raysweep.demo import make_tiny_model

    out.print(str(make_tiny_model(directory, overwrite=overwrite)))


_FORMAT = click.Choice(["png", "svg", "pdf"])


def _figure_dir(output_dir: str, out_path: str | None, default: str) -> Path:
    """Where figures go: `--out` as given, else OUTPUT_DIR/<default>."""
    return Path(out_path) if out_path else Path(output_dir) / default


def _print_paths(paths: list[Path], notes: list[str]) -> None:
    for note in notes:
        _say(f"note: {note}", err=True, style="yellow")
    for p in paths:
        out.print(str(p), highlight=False)


@main.command()
@click.argument("output_dir", type=EXISTING_OUTPUT_DIR)
@click.option("--var-x", default=None, help="The x variable (any column). Default: total_token_throughput; for an "
                                           "offline sweep, its first swept parameter.")
@click.option("--var-y", default=None, help="The y variable (any numeric column). Default: median_ttft_ms; for an "
                                           "offline sweep, one figure per throughput or latency metric.")
@click.option("--row-by", default="", help="Comma list: one row of panels per value combination.")
@click.option("--col-by", default="", help="Comma list: one column of panels per value combination.")
@click.option("--curve-by", default="", help="Comma list: one curve per value combination.")
@click.option("--fig-by", default="", help="Comma list: one figure per value combination.")
@click.option("--filter-by", multiple=True, help="COLUMN<op>VALUE, op one of == != < <= > >= (comma list, repeatable).")
@click.option("--bin-by", default="", help="Comma list of COLUMN%SIZE: the column becomes floor(v/SIZE)*SIZE.")
@click.option("--scale-x", default=None, help="Axis scale: linear, log, symlog, logit, asinh.")
@click.option("--scale-y", default=None, help="Axis scale: linear, log, symlog, logit, asinh.")
@click.option("--no-error-bars", is_flag=True, help="No band for the spread over runs.")
@click.option("--fig-name", default="FIGURE", show_default=True, help="File name prefix.")
@click.option("--fig-height", type=float, default=4.0, show_default=True, help="Inches per panel.")
@click.option("--fig-dpi", type=int, default=150, show_default=True)
@click.option("--format", "fmt", type=_FORMAT, default="png", show_default=True)
@click.option("--load-var", default=None,
              help="x of the server-metric figures (default: max_concurrency or request_rate, whichever varies).")
@click.option("--no-server-metrics", is_flag=True, help="Skip the server-metric figures.")
@click.option("--out", "out_path", default=None, help="Directory for the figures (default OUTPUT_DIR/plots).")
@click.option("--fig-dir", default=None, help="vLLM's spelling of --out: a directory relative to OUTPUT_DIR.")
@click.option("--dry-run", is_flag=True, help="List the figures and curves it would draw; write nothing.")
def plot(output_dir: str, fmt: str, fig_dpi: int, load_var: str | None, no_server_metrics: bool,
         out_path: str | None, fig_dir: str | None, dry_run: bool, **spec: Any) -> None:
    """Curves (mean over runs, band for the spread) from a raysweep output dir or a vLLM sweep dir, plus
    server-metric and SLA figures when the results carry them."""
    from raysweep import plots
    from raysweep.importer import read_sla, read_table

    if fig_dir is not None and out_path is not None:
        raise UserError("--out and --fig-dir both say where the figures go; accepted: one of them")
    table = read_table(output_dir)
    lists = ("row_by", "col_by", "curve_by", "fig_by", "filter_by", "bin_by")
    error_bars = not spec.pop("no_error_bars")
    offline = plots.is_offline(table.df) and spec["var_x"] is None and spec["var_y"] is None
    spec["var_x"] = spec["var_x"] or "total_token_throughput"
    spec["var_y"] = spec["var_y"] or "median_ttft_ms"
    ps = plots.PlotSpec(**{k: plots.split_list(v) if k in lists else v for k, v in spec.items()}, error_bars=error_bars)
    load_var = load_var or plots.load_variable(table.df, ps.var_x)
    specs = plots.offline_specs(table.df, ps) if offline else [plots.default_layout(table.df, ps, load_var)]
    drawn = [(s, plots.plan_curves(table.df, s)) for s in specs]
    if not no_server_metrics and not offline:
        drawn.append((ps, plots.plan_server_metrics(table.df, ps, load_var)))
    plans = [p for _, ps_plans in drawn for p in ps_plans]
    sla, variable = read_sla(output_dir)
    if dry_run:
        _say(plots.describe(plans, fmt) + (f"\nSLA.{fmt}: {sla['target'].nunique()} target(s)" if len(sla) else ""))
        return
    dest = Path(output_dir) / fig_dir if fig_dir is not None else _figure_dir(output_dir, out_path, "plots")
    paths = [path for s, ps_plans in drawn for path in plots.write_plots(ps_plans, s, dest, fmt, fig_dpi)]
    if len(sla):
        paths.append(plots.save_figure(plots.sla_figure(sla, variable), dest / f"SLA.{fmt}", fmt, fig_dpi))
    _print_paths(paths, table.notes + [f"{p.name}: {n}" for p in plans for n in p.notes])


@main.command()
@click.argument("output_dir", type=EXISTING_OUTPUT_DIR)
@click.option("--label-by", default=None,
              help="Comma list of columns written beside each front point (default: the user-count var, gpus).")
@click.option("--user-count-var", default="max_concurrency", show_default=True,
              help="Column of concurrent users; where empty or 0, the observed max_concurrent_requests.")
@click.option("--gpu-count-var", default="gpu_count", show_default=True,
              help="Column of GPUs per run; where 0 or missing, tp x pp x dp from the record (said in the notes).")
@click.option("--filter-by", multiple=True, help="COLUMN<op>VALUE, op one of == != < <= > >= (comma list, repeatable).")
@click.option("--format", "fmt", type=_FORMAT, default="png", show_default=True)
@click.option("--fig-dpi", type=int, default=150, show_default=True)
@click.option("--out", "out_path", default=None, help="Directory for PARETO.<format> and pareto_front.csv "
                                                     "(default OUTPUT_DIR/pareto).")
@click.option("--dry-run", is_flag=True, help="Print the front; write nothing.")
def pareto(output_dir: str, label_by: str | None, user_count_var: str, gpu_count_var: str,
           filter_by: tuple[str, ...], fmt: str, fig_dpi: int, out_path: str | None, dry_run: bool) -> None:
    """The Pareto front of output tokens/s per user against output tokens/s per GPU, as a figure and a CSV."""
    from raysweep import plots
    from raysweep.importer import read_table

    table = read_table(output_dir)
    result = plots.pareto(table.df, user_count_var, gpu_count_var, filter_by)
    labels = plots.split_list(label_by) or (user_count_var, "gpus")
    plots.check_columns(result.points, labels, "--label-by")
    front = Table(*labels, "tokens/s/user", "tokens/s/GPU", "GPUs from", title=f"Pareto front: {len(result.front)} "
                  f"of {len(result.points)} run(s)")
    for _, row in result.front.iterrows():
        front.add_row(*(escape(plots.fmt_value(row[c])) for c in labels), f"{row['tokens_per_user']:.4g}",
                      f"{row['tokens_per_gpu']:.4g}", escape(str(row["gpus_from"])))
    out.print(front)
    paths = [] if dry_run else plots.write_pareto(result, labels, _figure_dir(output_dir, out_path, "pareto"), fmt,
                                                  fig_dpi)
    _print_paths(paths, table.notes + result.notes)


@main.command()
@click.argument("output_dir", type=EXISTING_OUTPUT_DIR)
@click.option("--out", "out_path", default=None, help="The HTML file to write (default OUTPUT_DIR/report.html).")
def report(output_dir: str, out_path: str | None) -> None:
    """One self-contained HTML report: campaign, plan, figures, results, SLA, transport, failures, environment."""
    from raysweep.ledger import Ledger
    from raysweep.report import write_report

    Ledger.open_existing(output_dir).close()
    out.print(str(write_report(output_dir, out_path)), highlight=False)


@main.command("import")
@click.argument("vllm_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("output_dir", type=click.Path(file_okay=False))
def import_(vllm_dir: str, output_dir: str) -> None:
    """Turn a `vllm bench sweep` output dir (its summary.json files) into a results table (parquet + csv)
    that `plot` and `pareto` read."""
    from raysweep.importer import import_vllm_sweep

    paths, table = import_vllm_sweep(vllm_dir, output_dir)
    out.print(f"{len(table.df)} run(s), {len(table.df.columns)} column(s)")
    _print_paths(paths, table.notes)


# ---------------------------------------------------------------------------------------------------
# Ray jobs: submit, jobs, stop
# ---------------------------------------------------------------------------------------------------

_JOB_ADDRESS = click.option("--address", default=None,
                            help="The cluster's job server, e.g. http://HEAD:8265 (default: RAY_API_SERVER_ADDRESS).")


@main.command()
@click.argument("campaign_file", type=click.Path(dir_okay=False))
@_JOB_ADDRESS
@click.option("--output-dir", default=None, help="The output dir on the cluster: an absolute path (shared storage). "
                                                 "Default: the campaign's output_dir, if absolute.")
@click.option("--follow", is_flag=True, help="Stream the job's logs until it ends; exit with its outcome.")
@click.option("--runtime-env", "runtime_env_arg", default=None,
              help="A Ray runtime env (YAML/JSON file or inline JSON) merged with the staged campaign: pip, "
                   "py_modules, env_vars, ...")
@click.option("--python", default=None, help="Run `PYTHON -m raysweep` on the cluster instead of `raysweep`.")
@click.option("--retry-failed", is_flag=True, help="Give points that used up max_attempts a fresh set of attempts.")
@click.option("--stop-wait", default=120, show_default=True, type=click.IntRange(min=1),
              help="Seconds a stopped job gets to stop its servers before Ray kills it.")
def submit(campaign_file: str, address: str | None, output_dir: str | None, follow: bool,
           runtime_env_arg: str | None, python: str | None, retry_failed: bool, stop_wait: int) -> None:
    """Send a campaign to a Ray cluster as a job (`raysweep run` there). Submitting it again resumes it."""
    import tempfile

    from raysweep import jobs
    from raysweep.campaign import load_campaign

    spec = load_campaign(campaign_file)
    target = output_dir or spec.campaign.output_dir or f"results/{spec.campaign.name}"
    if not Path(target).is_absolute():
        raise UserError(f"--output-dir: {target!r} is relative, but a submitted campaign runs in a temporary "
                        "directory on the cluster; give an absolute path on storage the cluster keeps (shared, or "
                        "the head's disk), with --output-dir or output_dir:, and add storage: to mirror results")
    user_env = jobs.read_runtime_env(runtime_env_arg)
    job_client = jobs.client(address)
    with tempfile.TemporaryDirectory(prefix="raysweep-submit-") as tmp:
        staged = jobs.stage(spec, campaign_file, Path(tmp))
        job_id = jobs.submit(job_client, spec, staged, target, python=python, user_env=user_env,
                             retry_failed=retry_failed, stop_wait_s=stop_wait)
    out.print(job_id, highlight=False)
    console.print(f"submitted {spec.campaign.name!r}: output dir {target} on the cluster"
                  + (f", mirrored to {spec.campaign.storage}" if spec.campaign.storage else "")
                  + (f"; sent {', '.join(staged.shipped)}" if staged.shipped else ""), highlight=False, markup=False)
    if staged.secrets_kept:
        console.print(f"[yellow]not sent[/] (secrets; set them on the cluster): {', '.join(staged.secrets_kept)}")
    if follow:
        _follow(job_client, job_id)


def _follow(job_client: Any, job_id: str) -> None:
    from raysweep import jobs

    def write(chunk: str) -> None:
        sys.stdout.write(chunk)
        sys.stdout.flush()

    info = jobs.follow(job_client, job_id, write)
    status = str(info.status)
    console.print(f"job {job_id}: {status}" + (f" ({escape(info.message)})" if info.message and status != "SUCCEEDED"
                                               else ""), highlight=False)
    if status == "STOPPED":
        sys.exit(130)
    if status != "SUCCEEDED":
        sys.exit(info.driver_exit_code or 1)


@main.command()
@_JOB_ADDRESS
@click.option("--all", "show_all", is_flag=True, help="Also jobs that are not raysweep campaigns.")
@click.option("--follow", "follow_id", default=None, metavar="JOB", help="Stream this job's logs until it ends.")
def jobs(address: str | None, show_all: bool, follow_id: str | None) -> None:
    """The cluster's raysweep jobs: id, campaign, status, output dir, start and end."""
    from datetime import datetime

    from raysweep import jobs as jobs_mod

    job_client = jobs_mod.client(address)
    if follow_id:
        _follow(job_client, follow_id)
        return
    rows = job_client.list_jobs() if show_all else jobs_mod.find_jobs(job_client)
    table = Table()
    for name in ("job", "campaign", "status", "output dir", "started", "ended", "message"):
        table.add_column(name, overflow="fold")  # ids and paths are copied from here: never cut short

    def when(ms: int | None) -> str:
        return datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S") if ms else ""

    for j in rows:
        meta = j.metadata or {}
        table.add_row(j.submission_id or j.job_id or "", meta.get(jobs_mod.META_KEY, ""), str(j.status),
                      meta.get("output_dir", ""), when(j.start_time), when(j.end_time),
                      escape((j.message or "").splitlines()[0] if j.message else ""))
    out.print(table)


@main.command("stop")
@click.argument("job_id")
@_JOB_ADDRESS
@click.option("--wait", "wait_s", default=150.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds to wait for the job to end (0: do not wait).")
def stop_job(job_id: str, address: str | None, wait_s: float) -> None:
    """Stop a submitted campaign: its servers are stopped, finished points kept; submit it again to resume."""
    from raysweep import jobs

    status = jobs.stop(jobs.client(address), job_id, wait_s)
    out.print(f"{job_id}: {status}", highlight=False)
    if status not in jobs.TERMINAL and wait_s:
        sys.exit(1)


@main.command()
@click.argument("campaign_file", type=click.Path(dir_okay=False))
@click.option("--serve-index", type=click.IntRange(min=0), default=None,
              help="The server config, by its 0-based position in the campaign's serve parameters (default 0).")
@click.option("--serve-id", default=None, help="The server config, by (a unique prefix of) its id.")
@click.option("--point", "points", multiple=True,
              help="A bench point, by 0-based index or id prefix (repeatable; default the first).")
@click.option("-n", "--runs", "n", type=click.IntRange(min=1), default=5, show_default=True,
              help="Runs of each client per bench point, alternating.")
@click.option("--address", default=None, help="Ray cluster to join (`auto`, or HOST:PORT). Default: an embedded local Ray.")
@click.option("--url", default=None, help="Bench the server already running at this URL instead of starting one.")
@click.option("--throughput-tolerance", type=click.FloatRange(min=0, min_open=True), default=5.0, show_default=True,
              help="Percent: largest accepted difference of output and request throughput.")
@click.option("--latency-tolerance", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True,
              help="Percent: largest accepted difference of median TTFT and median TPOT.")
@click.option("--warmup", type=click.IntRange(min=0), default=None,
              help="Prompts sent once before the runs (default: the campaign's warmup).")
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False),
              help="Directory for the report (default OUTPUT_DIR/crosscheck of the campaign).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON instead of tables.")
def crosscheck(campaign_file: str, serve_index: int | None, serve_id: str | None, points: tuple[str, ...], n: int,
               address: str | None, url: str | None, throughput_tolerance: float, latency_tolerance: float,
               warmup: int | None, out_dir: str | None, as_json: bool) -> None:
    """Run bench points with the native client and `vllm bench serve` in turn on one server; compare.

    Exit 0 when every judged metric is within tolerance, 1 when not (or a run failed), 2 on bad input."""
    import json
    import time

    from raysweep import crosscheck as xc
    from raysweep.campaign import load_campaign
    from raysweep.driver import ray_session
    from raysweep.files import write_json_atomic, write_text_atomic
    from raysweep.plan import build_plan

    spec = load_campaign(campaign_file)
    serve, benches = xc.select(build_plan(spec), serve_index, serve_id, points)
    tol = xc.Tolerances(throughput=throughput_tolerance / 100, latency=latency_tolerance / 100)
    base = Path(out_dir) if out_dir else _output_dir(spec, None) / "crosscheck"
    if base.exists() and not base.is_dir():
        raise UserError(f"--out {base}: exists and is not a directory")
    work = base / f"{time.strftime('%Y%m%d-%H%M%S')}-{serve.id}"

    def progress(rec: dict[str, Any]) -> None:
        what = (f"{rec['output_throughput']:.1f} tok/s, TTFT {rec['median_ttft_ms']:.1f} ms, "
                f"TPOT {rec['median_tpot_ms']:.2f} ms") if rec["ok"] else f"failed: {rec['error']}"
        _say(f"{rec['bench_id']} run {rec['round'] + 1}/{n} {rec['tool']}: {what}", err=True)

    _say(f"crosscheck of server config {serve.id} ({serve.label or 'base command'}), {len(benches)} bench "
         f"point(s), {n} run(s) of each client" + (f", against {url}" if url else ""), err=True)
    try:
        with ray_session(address):
            report = xc.run_crosscheck(spec, serve, benches, n, tol, work, url=url, warmup=warmup, on_run=progress)
    except RuntimeError as exc:
        console.print("error:", style="bold red", end=" ")
        _say(str(exc), err=True)
        sys.exit(1)
    report["report_dir"] = str(work)
    write_json_atomic(work / "crosscheck.json", report)
    text = xc.markdown(report)
    write_text_atomic(work / "crosscheck.md", text)
    if as_json:
        _say(json.dumps(report, indent=2, default=str))
    else:
        _print_crosscheck(report)
    console.print(f"Report: {work / 'crosscheck.md'}, {work / 'crosscheck.json'}", highlight=False)
    if not report["verdict"]["within_tolerance"]:
        sys.exit(1)


def _print_crosscheck(report: dict[str, Any]) -> None:
    def num(v: float | None, metric: str) -> str:
        return "-" if v is None else f"{v:,.0f}" if metric.startswith("total_") else f"{v:,.2f}"

    for bench_id, label in report["bench_labels"].items():
        table = Table(title=f"bench point {bench_id} ({label or 'base command'}): medians of {report['n']} runs")
        for name in ("metric", "native", "vllm bench serve", "native / vllm", "tolerance", "within"):
            table.add_column(name, justify="left" if name == "metric" else "right", no_wrap=name == "metric")
        for r in (r for r in report["comparison"] if r["bench_id"] == bench_id):
            within = "" if r["within"] is None else "[green]yes[/]" if r["within"] else "[red]no[/]"
            table.add_row(r["metric"], num(r["native"], r["metric"]), num(r["vllm"], r["metric"]),
                          "-" if r["ratio"] is None else f"{r['ratio']:.3f}",
                          "" if r["tolerance"] is None else f"{r['tolerance']:.0%}", within)
        out.print(table)
    v = report["verdict"]
    out.print(f"verdict: {'[green]' if v['within_tolerance'] else '[red]'}{v['verdict']}[/]")
    for key in ("outside", "failed_runs", "client_limited_runs"):
        for line in v[key]:
            _say(f"  {key.replace('_', ' ')}: {line}")

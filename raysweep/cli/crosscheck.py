"""`raysweep crosscheck`: the native client and `vllm bench serve` in turn on one server, compared."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from raysweep.cli import logs
from raysweep.cli._common import _output_dir, _say, address_option, console, main, out
from raysweep.errors import UserError


@main.command()
@click.argument("campaign_file", type=click.Path(dir_okay=False))
@click.option("--serve-index", type=click.IntRange(min=0), default=None,
              help="The server config, by its 0-based position in the campaign's serve parameters (default 0).")
@click.option("--serve-id", default=None, help="The server config, by (a unique prefix of) its id.")
@click.option("--point", "points", multiple=True,
              help="A bench point, by 0-based index or id prefix (repeatable; default the first).")
@click.option("-n", "--runs", "n", type=click.IntRange(min=1), default=5, show_default=True,
              help="Runs of each client per bench point, alternating.")
@address_option
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

    Each judged metric is an equivalence test: the ratio native / vllm with its 90 % interval, equivalent only
    when the whole interval lies within the tolerance. Exit 0 when every judged metric is equivalent, 1 when one
    is different or not shown (the report says how many runs would settle it) or a run failed, 2 on bad input."""
    import json
    import time

    from raysweep.campaign import load_campaign
    from raysweep.drive import crosscheck as xc
    from raysweep.drive.driver import ray_session
    from raysweep.plan.plan import build_plan
    from raysweep.record.files import write_json_atomic, write_text_atomic

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
        with logs.routed(work / "raysweep.log"), ray_session(address):
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
        table = Table(title=f"bench point {bench_id} ({label or 'base command'}): means of {report['n']} runs")
        for name in ("metric", "native", "vllm bench serve", "native / vllm", "90 % CI", "tolerance", "verdict"):
            table.add_column(name, justify="left" if name == "metric" else "right", no_wrap=name == "metric")
        for r in (r for r in report["comparison"] if r["bench_id"] == bench_id):
            word = r.get("word") or ""
            style = {"equivalent": "green", "different": "red", "missing": "red"}.get(word, "yellow")
            ci = f"{r['low']:.3f} to {r['high']:.3f}" if r.get("low") is not None and r.get("high") is not None else ""
            table.add_row(r["metric"], num(r["native"], r["metric"]), num(r["vllm"], r["metric"]),
                          "-" if r["ratio"] is None else f"{r['ratio']:.3f}", ci,
                          "" if r["tolerance"] is None else f"{r['tolerance']:.0%}",
                          f"[{style}]{word}[/]" if word else "")
        out.print(table)
    v = report["verdict"]
    out.print(f"verdict: {'[green]' if v['within_tolerance'] else '[red]'}{v['verdict']}[/]")
    for key in ("outside", "not_shown", "failed_runs", "client_limited_runs"):
        for line in v.get(key, []):
            _say(f"  {key.replace('_', ' ')}: {line}")

"""Reading results: `plot`, `pareto`, `report` and `import` (of a `vllm bench sweep` output dir)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from raysweep.bench.load import CONCURRENCY
from raysweep.cli._common import (
    EXISTING_OUTPUT_DIR,
    _figure_dir,
    _print_paths,
    _say,
    fig_format_option,
    main,
    out,
    print_table,
)
from raysweep.cli.jsonout import json_option, print_json
from raysweep.errors import UserError


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
@fig_format_option
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
    _print_paths(*_draw(output_dir, fmt, fig_dpi, load_var, no_server_metrics, out_path, fig_dir, dry_run, **spec))


def default_figures(output_dir: str | Path) -> tuple[list[Path], list[str]]:
    """Draw the figures `raysweep plot OUTPUT_DIR` draws (its defaults); their paths and notes."""
    with plot.make_context("plot", [str(output_dir)]) as ctx:
        return _draw(**ctx.params)


def _draw(output_dir: str, fmt: str, fig_dpi: int, load_var: str | None, no_server_metrics: bool,
          out_path: str | None, fig_dir: str | None, dry_run: bool, **spec: Any) -> tuple[list[Path], list[str]]:
    from raysweep.record.directory import CampaignDir
    from raysweep.report import plots
    from raysweep.results.importer import read_sla, read_table
    from raysweep.results.rows import load_variable, split_list

    if fig_dir is not None and out_path is not None:
        raise UserError("--out and --fig-dir both say where the figures go; accepted: one of them")
    with CampaignDir(output_dir) as directory:
        table = read_table(directory)
        sla, variable = read_sla(directory)
    lists = ("row_by", "col_by", "curve_by", "fig_by", "filter_by", "bin_by")
    error_bars = not spec.pop("no_error_bars")
    offline = plots.is_offline(table.df) and spec["var_x"] is None and spec["var_y"] is None
    spec["var_x"] = spec["var_x"] or "total_token_throughput"
    spec["var_y"] = spec["var_y"] or "median_ttft_ms"
    options: dict[str, Any] = {k: split_list(v) if k in lists else v for k, v in spec.items()}
    ps = plots.PlotSpec(**options, error_bars=error_bars)
    load_var = load_var or load_variable(table.df, ps.var_x)
    specs = plots.offline_specs(table.df, ps) if offline else [plots.default_layout(table.df, ps, load_var)]
    drawn = [(s, plots.plan_curves(table.df, s)) for s in specs]
    if not no_server_metrics and not offline:
        drawn.append((ps, plots.plan_server_metrics(table.df, ps, load_var)))
    plans = [p for _, ps_plans in drawn for p in ps_plans]
    if dry_run:
        _say(plots.describe(plans, fmt) + (f"\nSLA.{fmt}: {sla['target'].nunique()} target(s)" if len(sla) else ""))
        return [], []
    dest = Path(output_dir) / fig_dir if fig_dir is not None else _figure_dir(output_dir, out_path, "plots")
    paths = [path for s, ps_plans in drawn for path in plots.write_plots(ps_plans, s, dest, fmt, fig_dpi)]
    if len(sla):
        paths.append(plots.save_figure(plots.sla_figure(sla, variable), dest / f"SLA.{fmt}", fmt, fig_dpi))
    return paths, table.notes + [f"{p.name}: {n}" for p in plans for n in p.notes]


@main.command()
@click.argument("output_dir", type=EXISTING_OUTPUT_DIR)
@click.option("--label-by", default=None,
              help="Comma list of columns written beside each front point (default: the user-count var, gpus).")
@click.option("--user-count-var", default=CONCURRENCY, show_default=True,
              help="Column of concurrent users; where empty or 0, the observed max_concurrent_requests.")
@click.option("--gpu-count-var", default="gpu_count", show_default=True,
              help="Column of GPUs per run; where 0 or missing, tp x pp x dp from the record (said in the notes).")
@click.option("--gpu-count", "gpu_count", type=float, default=None,
              help="GPUs per run where the table records none (default: tp x pp x dp from the record, else 1 as "
                   "vLLM's plot_pareto takes it).")
@click.option("--filter-by", multiple=True, help="COLUMN<op>VALUE, op one of == != < <= > >= (comma list, repeatable).")
@fig_format_option
@click.option("--fig-dpi", type=int, default=150, show_default=True)
@click.option("--out", "out_path", default=None, help="Directory for PARETO.<format> and pareto_front.csv "
                                                     "(default OUTPUT_DIR/pareto).")
@click.option("--y", "y_axis", default="tokens_per_gpu", show_default=True,
              help="The y axis: tokens_per_gpu (higher is better), or energy or cost per token (lower is better): "
                   "j_per_output_token, net_j_per_output_token, j_per_total_token, cost_per_m_output_tokens, "
                   "cost_per_m_total_tokens (docs/energy.md).")
@click.option("--per", "per", type=click.Choice(["point", "run"]), default="point", show_default=True,
              help="The front of the points' means over their runs, each with its 95 % interval (the report's and "
                   "the API's), or of single runs, as vLLM's plot_pareto draws it.")
@click.option("--dry-run", is_flag=True, help="Print the front; write nothing.")
def pareto(output_dir: str, label_by: str | None, user_count_var: str, gpu_count_var: str, gpu_count: float | None,
           filter_by: tuple[str, ...], fmt: str, fig_dpi: int, out_path: str | None, y_axis: str, per: str,
           dry_run: bool) -> None:
    """The Pareto front of output tokens/s per user against output tokens/s per GPU (or energy or cost per token,
    --y), of the points' means (or single runs, --per run), as a figure and a CSV."""
    from raysweep.report import plots
    from raysweep.results import front as pareto_front
    from raysweep.results.importer import read_table
    from raysweep.results.labels import fmt_value
    from raysweep.results.rows import check_columns, split_list

    table = read_table(output_dir)
    result = pareto_front.pareto(table.df, user_count_var, gpu_count_var, filter_by, gpu_count, y_axis, per)
    labels = split_list(label_by) or (user_count_var, "gpus")
    check_columns(result.points, labels, "--label-by")
    of = (f"{len(result.points)} run(s)" if per == "run" else
          f"{len(result.means) if result.means is not None else 0} point mean(s) of {len(result.points)} run(s)")
    front = Table(*labels, "tokens/s/user", "tokens/s/GPU" if result.y == "tokens_per_gpu" else result.y_label,
                  "GPUs from", title=f"Pareto front: {len(result.front)} of {of}")
    for _, row in result.front.iterrows():
        front.add_row(*(escape(fmt_value(row[c])) for c in labels), f"{row['tokens_per_user']:.4g}",
                      f"{row[result.y]:.4g}", escape(str(row["gpus_from"])))
    print_table(front, out)
    paths = [] if dry_run else plots.write_pareto(result, labels, _figure_dir(output_dir, out_path, "pareto"), fmt,
                                                  fig_dpi)
    _print_paths(paths, table.notes + result.notes + result.drawn_notes)


@main.command()
@click.argument("output_dir", type=EXISTING_OUTPUT_DIR)
@click.option("--out", "out_path", default=None, help="The HTML file to write (default OUTPUT_DIR/report.html).")
@click.option("--objective", default=None, help="What the conclusions rank by: [max:|min:]METRIC[_per_gpu], METRIC "
              "an aggregated metric (default output_throughput_per_gpu).")
@json_option
def report(output_dir: str, out_path: str | None, objective: str | None, as_json: bool) -> None:
    """One self-contained HTML report: conclusions (best config per bench shape, its lead against the noise,
    Pareto front, SLA capacities), warnings, figures, results, SLA, transport, failures, campaign, plan,
    environment. Prints its path and the conclusions."""
    from raysweep.cli import logs
    from raysweep.record.directory import CampaignDir
    from raysweep.report.page import write_report_with_answer

    with CampaignDir(output_dir) as directory:
        directory.check()
        path, found = write_report_with_answer(directory, out_path, objective)
    lines = found.lines(verbose=logs.verbosity > 0) if found is not None else []  # tests and p-values with -v
    if as_json:
        print_json("report", {"output_dir": output_dir, "report": path, "objective": objective, "conclusions": lines,
                              "answer": found.to_dict() if found is not None else None})
        return
    out.print(str(path), highlight=False)
    for line in lines:
        out.print(escape(line), highlight=False)


@main.command("import")
@click.argument("vllm_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("output_dir", type=click.Path(file_okay=False))
def import_(vllm_dir: str, output_dir: str) -> None:
    """Turn a `vllm bench sweep` output dir (its summary.json files) into a results table (parquet + csv)
    that `plot` and `pareto` read."""
    from raysweep.results.importer import import_vllm_sweep

    paths, table = import_vllm_sweep(vllm_dir, output_dir)
    out.print(f"{len(table.df)} run(s), {len(table.df.columns)} column(s)")
    _print_paths(paths, table.notes)

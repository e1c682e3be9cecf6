"""Unit tests for raysweep.report.plots and raysweep.results.importer and the `plot` / `pareto` / `import` commands.

Figures are drawn from results tables made here (a DataFrame, or an output dir with a real ledger) and
checked through the matplotlib objects: axes, lines, points, labels. No Ray.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from matplotlib.collections import PathCollection, PolyCollection
from matplotlib.container import ErrorbarContainer

from raysweep.cli import main
from raysweep.errors import UserError
from raysweep.ledger import LEDGER_FILE, Ledger
from raysweep.record.files import write_json_atomic
from raysweep.report import plots
from raysweep.results.front import pareto
from raysweep.results.importer import combo_labels, import_vllm_sweep, read_table
from raysweep.results.rows import apply_filters, load_linked, load_variable

PNG = b"\x89PNG\r\n\x1a\n"
SERVES = {"s8": {"max_num_seqs": 8}, "s16": {"max_num_seqs": 16, "tensor_parallel_size": 2}}
LENS, CONCS, RUNS = (128, 256), (1, 2, 4, 8), (0, 1)
FAILED = ("s8", 256, 8, 1)     # this run failed (with a log tail)
LIMITED = ("s16", 128, 8, 1)   # this run was client-limited


def throughput(mns: int, conc: int, length: int, run: int) -> float:
    """A made-up output throughput that saturates at max_num_seqs and differs a little between runs."""
    return 100.0 * min(conc, mns / 2) * (128 / length) * (1.0 + 0.1 * run)


def run_record(sid: str, length: int, conc: int, run: int) -> dict[str, Any]:
    """A result record as raysweep writes it: vLLM's fields, the parameters, our ids and server metrics."""
    serve = SERVES[sid]
    mns, tp = serve["max_num_seqs"], serve.get("tensor_parallel_size", 1)
    thr = throughput(mns, conc, length, run)
    bench = {"random_input_len": length, "max_concurrency": conc}
    return {
        "request_rate": "inf", "max_concurrency": conc, "completed": 10, "failed": 0, "duration": 1.0,
        "request_throughput": thr / 32, "output_throughput": thr, "total_token_throughput": thr * 5,
        "median_ttft_ms": 10.0 * conc / mns * (1 + run), "p99_ttft_ms": 20.0 * conc / mns,
        "max_concurrent_requests": conc, "latencies": [0.1] * 10,
        **serve, **bench, "run_number": run,
        "campaign": "camp", "serve_id": sid, "bench_id": f"b{length}-{conc}", "point_id": _pid(sid, length, conc, run),
        "serve_label": f"max_num_seqs={mns}", "bench_label": f"random_input_len={length}-max_concurrency={conc}",
        "tensor_parallel_size": tp, "pipeline_parallel_size": 1, "data_parallel_size": 1, "gpu_count": tp,
        "num_nodes": 1, "server_kv_cache_usage_perc_peak": min(1.0, conc * length / (mns * 128)),
        "server_num_requests_waiting_peak": max(0, conc - mns), "server_num_preemptions": max(0, conc - mns) * 2,
        "client_limited": (sid, length, conc, run) == LIMITED,
    }


def _pid(sid: str, length: int, conc: int, run: int) -> str:
    return f"{sid}-{length}-{conc}-{run}"


def build_output_dir(out: Path, sla: bool = False) -> Path:
    """A raysweep output dir made through the ledger API: every run done but one failed, two servers,
    and (with `sla`) a campaign with `sla:` and three finished searches."""
    out.mkdir(parents=True)
    campaign: dict[str, Any] = {"name": "camp", "runs": 2, "serve": {"cmd": "vllm serve m"},
                                "bench": {"cmd": "vllm bench serve --model m"}}
    if sla:
        campaign["sla"] = {"variable": "max_concurrency", "targets": [{"p99_ttft_ms": "<=10"}]}
    grid = [(sid, length, conc, run) for sid in SERVES for length in LENS for conc in CONCS for run in RUNS]
    led = Ledger(out / LEDGER_FILE)
    try:
        led.sync(name="camp", fingerprint="fp", meaning={}, campaign=campaign, campaign_file="c.yaml",
                 points=[(_pid(*g), g[0], f"b{g[1]}-{g[2]}", g[3], SERVES[g[0]],
                          {"random_input_len": g[1], "max_concurrency": g[2]}) for g in grid])
        for sid in SERVES:
            led.add_server(f"srv-{sid}", sid, "vllm serve m")
            led.update_server(f"srv-{sid}", state="stopped", ranks=json.dumps([
                {"rank": 0, "hostname": "node-a", "node_id": "n" * 56, "node_ip": "10.0.0.1",
                 "gpu_ids": "0,1" if sid == "s16" else "2"}]))
        for g in grid:
            led.mark_running(_pid(*g), f"srv-{g[0]}")
            if g == FAILED:
                led.mark_failed(_pid(*g), "server died during the point", "CUDA out of memory\nlast log line")
                continue
            rel = f"points/{g[0]}/b{g[1]}-{g[2]}/run={g[3]}.json"
            write_json_atomic(out / rel, run_record(*g))
            led.mark_done(_pid(*g), rel)
        if sla:
            for sid, target, state, largest in (("s8", "p99_ttft_ms<=10", "found", 4.0),
                                                ("s16", "p99_ttft_ms<=10", "above max", None),
                                                ("s8", "p99_ttft_ms<=5", "never met", None)):
                led.record_search(sid, "b128-1", target, state, largest, 8.0 if largest else None, 3, [], {})
    finally:
        led.close()
    return out


@pytest.fixture
def outdir(tmp_path: Path) -> Path:
    return build_output_dir(tmp_path / "out")


@pytest.fixture
def table(outdir: Path) -> pd.DataFrame:
    return read_table(outdir).df


def lines_of(ax: Any) -> list[Any]:
    return [ln for ln in ax.get_lines() if len(ln.get_xdata())]


# ---------------------------------------------------------------------------------------------------
# filters and options
# ---------------------------------------------------------------------------------------------------

def test_filters_compare_numbers_text_and_booleans(table):
    assert len(table) == 31  # 32 runs, one failed
    assert set(apply_filters(table, ["max_concurrency<=2"])["max_concurrency"]) == {1, 2}
    assert set(apply_filters(table, ["max_concurrency>2,random_input_len==256"])["max_concurrency"]) == {4, 8}
    assert len(apply_filters(table, ["max_concurrency!=8"])) == 24
    assert len(apply_filters(table, ["max_concurrency>=8", "max_concurrency<8"])) == 0
    assert len(apply_filters(table, ["serve_label==max_num_seqs=8"])) == 15  # split at the first ==
    limited = apply_filters(table, ["client_limited==true"])
    assert list(limited["point_id"]) == [_pid(*LIMITED)]
    assert len(apply_filters(table, ["client_limited==False"])) == 30


@pytest.mark.parametrize("expr, words", [
    ("nope<=3", ["--filter-by", "nope", "no such column", "columns accepted, e.g. campaign, serve_id"]),
    ("max_concurrency<=many", ["--filter-by", "needs a number"]),
    ("max_concurrency~3", ["--filter-by", "COLUMN<op>VALUE"]),
])
def test_bad_filters_are_user_errors(table, expr, words):
    with pytest.raises(UserError) as err:
        apply_filters(table, [expr])
    for w in words:
        assert w in str(err.value)


@pytest.mark.parametrize("opts, option", [
    ({"var_x": "concurrency"}, "--var-x concurrency"),
    ({"var_y": "ttft"}, "--var-y ttft"),
    ({"curve_by": ("max_num_seqs", "tp")}, "--curve-by tp"),
    ({"row_by": ("rows",)}, "--row-by rows"),
    ({"scale_x": "sqrt"}, "--scale-x sqrt"),
    ({"var_y": "serve_label"}, "--var-y serve_label: not a numeric column"),
])
def test_unknown_columns_and_scales_are_refused(table, opts, option):
    with pytest.raises(UserError) as err:
        plots.plan_curves(table, plots.PlotSpec(**{"var_x": "max_concurrency", **opts}))
    assert option in str(err.value)
    if "no such column" in str(err.value):  # the closest names or the first few, never all the columns
        assert "did you mean" in str(err.value) or "columns accepted, e.g. campaign, serve_id" in str(err.value)
        assert str(err.value).count(",") <= 8


def test_filter_that_leaves_nothing_is_refused(table):
    with pytest.raises(UserError, match="no run is left"):
        plots.plan_curves(table, plots.PlotSpec(filter_by=("max_concurrency>100",)))


# ---------------------------------------------------------------------------------------------------
# curves
# ---------------------------------------------------------------------------------------------------

def test_grid_of_panels_one_curve_per_combination(table):
    spec = plots.PlotSpec(var_x="max_concurrency", var_y="output_throughput", col_by=("random_input_len",),
                          curve_by=("max_num_seqs",))
    [plan] = plots.plan_curves(table, spec)
    fig = plots.render(plan, spec)
    axes = fig.get_axes()
    assert len(axes) == 2
    assert [ax.get_title() for ax in axes] == ["random_input_len=128", "random_input_len=256"]
    for ax in axes:
        assert len(lines_of(ax)) == 2  # one per max_num_seqs
        assert all(list(ln.get_xdata()) == [1, 2, 4, 8] for ln in lines_of(ax))
    assert [t.get_text() for t in fig.legends[0].get_texts()][:2] == ["max_num_seqs=8", "max_num_seqs=16"]
    assert axes[0].get_ylabel() == "output_throughput (tok/s)" and axes[1].get_ylabel() == ""
    assert axes[0].get_xlabel() == "max_concurrency"
    # the mean over both runs; one band per curve
    line8 = next(ln for ln in lines_of(axes[0]) if ln.get_label() == "max_num_seqs=8")
    assert list(line8.get_ydata()) == pytest.approx([(throughput(8, c, 128, 0) + throughput(8, c, 128, 1)) / 2
                                                     for c in CONCS])
    assert sum(isinstance(c, PolyCollection) for c in axes[0].collections) == 2


def test_rows_and_columns(table):
    spec = plots.PlotSpec(var_x="max_concurrency", var_y="median_ttft_ms", row_by=("max_num_seqs",),
                          col_by=("random_input_len",))
    [plan] = plots.plan_curves(table, spec)
    fig = plots.render(plan, spec)
    assert len(fig.get_axes()) == 4
    assert fig.get_axes()[3].get_title() == "max_num_seqs=16\nrandom_input_len=256"
    assert plan.curve_labels == ["(all)"]  # one curve: no legend entry for it, only for the hollow run
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["client-limited run\n(not in the curve)"]
    without = plots.render(plots.plan_curves(table, replace(spec, filter_by=("client_limited==false",)))[0], spec)
    assert not without.legends
    # the failed run is missing: that point is the mean of one run
    cell = plan.panels[0][1].curves[0].points
    assert list(cell["n"]) == [2, 2, 2, 1]


def test_client_limited_runs_are_hollow_and_not_in_the_mean(table):
    spec = plots.PlotSpec(var_x="max_concurrency", var_y="output_throughput", row_by=("random_input_len",),
                          curve_by=("max_num_seqs",))
    [plan] = plots.plan_curves(table, spec)
    curve = next(c for c in plan.panels[0][0].curves if c.label == "max_num_seqs=16")
    assert curve.points.set_index("x").loc[8, "y"] == throughput(16, 8, 128, 0)  # run 1 left out
    assert curve.points.set_index("x").loc[8, "n"] == 1
    assert list(curve.limited["y"]) == [throughput(16, 8, 128, 1)]
    assert "1 client-limited run(s) drawn hollow, not in the curves" in plan.notes
    fig = plots.render(plan, spec)
    [hollow] = [c for c in fig.get_axes()[0].collections if isinstance(c, PathCollection)]
    assert hollow.get_offsets().tolist() == [[8, throughput(16, 8, 128, 1)]]
    assert len(hollow.get_facecolors()) == 0  # no fill
    assert "client-limited run\n(not in the curve)" in [t.get_text() for t in fig.legends[0].get_texts()]


def test_one_figure_per_fig_by_value_and_dry_run_text(table, tmp_path):
    spec = plots.PlotSpec(var_x="max_concurrency", var_y="median_ttft_ms", fig_by=("random_input_len",),
                          curve_by=("max_num_seqs",), filter_by=("max_concurrency<=4",), fig_name="LAT")
    plans = plots.plan_curves(table, spec)
    assert [p.name for p in plans] == ["LAT-random_input_len=128", "LAT-random_input_len=256"]
    assert [p.runs for p in plans] == [12, 12]
    text = plots.describe(plans)
    assert "LAT-random_input_len=128.png: 1 row(s) x 1 column(s), 2 curve(s), 12 run(s)" in text
    assert "  max_num_seqs=8: 3 point(s) from 6 run(s)" in text
    paths = plots.write_plots(plans, spec, tmp_path / "figs", "svg")
    assert [p.name for p in paths] == ["LAT-random_input_len=128.svg", "LAT-random_input_len=256.svg"]
    assert all(p.read_text().lstrip().startswith("<?xml") for p in paths)


def test_pooling_configurations_and_non_finite_x_are_noted(table):
    [plan] = plots.plan_curves(table, plots.PlotSpec(var_x="max_concurrency", var_y="output_throughput"))
    assert any("average runs of several configurations" in n for n in plan.notes)
    [plan] = plots.plan_curves(table, plots.PlotSpec(var_x="request_rate", var_y="output_throughput",
                                                     curve_by=("max_num_seqs",)))
    assert "31 run(s) with a non-finite or missing request_rate or output_throughput left out" in plan.notes


def test_single_x_curve_gets_whiskers_and_bins_pool_x(table):
    spec = plots.PlotSpec(var_x="max_concurrency", var_y="output_throughput", filter_by=("max_concurrency==2",),
                          curve_by=("max_num_seqs", "random_input_len"))
    fig = plots.render(plots.plan_curves(table, spec)[0], spec)
    assert sum(isinstance(c, ErrorbarContainer) for c in fig.get_axes()[0].containers) == 4
    binned = plots.plan_curves(table, plots.PlotSpec(var_x="max_concurrency", var_y="output_throughput",
                                                     bin_by=("max_concurrency%4",), curve_by=("max_num_seqs",)))
    assert sorted(binned[0].panels[0][0].curves[0].points["x"]) == [0, 4, 8]


def test_a_measured_x_averages_the_runs_of_each_point(table):
    """x = a throughput differs between the repeats of one point: they make one point (mean x, mean y, SD),
    not one point each joined into a zigzag."""
    spec = plots.PlotSpec(var_x="output_throughput", var_y="median_ttft_ms", curve_by=("serve_label",),
                          col_by=("random_input_len",))
    [plan] = plots.plan_curves(table, spec)
    curve = plan.panels[0][0].curves[0]
    ok = table[~table["client_limited"].astype(bool)]
    mine = ok[(ok["serve_label"] == curve.label) & (ok["random_input_len"] == 128)]
    assert len(curve.points) == mine["bench_id"].nunique() == len(CONCS)
    per_point = mine.groupby("bench_id").agg(x=("output_throughput", "mean"), n=("run_number", "count"))
    per_point = per_point.sort_values("x")
    assert curve.points["x"].tolist() == pytest.approx(per_point["x"].tolist())
    assert curve.points["n"].tolist() == per_point["n"].tolist()  # the client-limited run is not counted


def test_default_layout_never_joins_unrelated_configurations(table):
    spec = plots.default_layout(table, plots.PlotSpec(), "max_concurrency")
    assert spec.curve_by == ("serve_label",) and spec.col_by == ("random_input_len",)
    [plan] = plots.plan_curves(table, spec)
    assert not any("several configurations" in n for n in plan.notes)
    assert plan.curve_title == "server config"
    mine = plots.PlotSpec(curve_by=("max_num_seqs",))
    assert plots.default_layout(table, mine, "max_concurrency") == mine  # the user's layout is kept


def test_a_parameter_that_follows_the_load_is_not_a_bench_shape(table):
    """A num_prompts scaled with max_concurrency (part of every bench label) takes one value per load: the
    default layout keeps one column per input length, not one per num_prompts."""
    linked = table.assign(num_prompts=table["max_concurrency"] * 10)
    linked["bench_label"] = linked["bench_label"] + "-num_prompts=" + linked["num_prompts"].astype(str)
    assert load_linked(linked, "max_concurrency", ["num_prompts", "random_input_len"]) == ["num_prompts"]
    spec = plots.default_layout(linked, plots.PlotSpec(), "max_concurrency")
    assert spec.col_by == ("random_input_len",)
    [plan] = plots.plan_curves(linked, spec)
    assert len(plan.panels[0]) == 2 and all(len(c.points) == 4 for p in plan.panels[0] for c in p.curves)


def test_server_metric_figure(table):
    spec = plots.PlotSpec(row_by=("random_input_len",))
    assert load_variable(table, "x") == "max_concurrency"
    busy = table.assign(server_num_requests_waiting_peak=table["max_concurrency"] // 2,
                        server_num_preemptions=table["max_concurrency"] // 4)
    [plan] = plots.plan_server_metrics(busy, spec, "max_concurrency")
    assert plan.name == "SERVER"
    fig = plots.render(plan, spec)
    axes = fig.get_axes()
    assert len(axes) == 8  # 2 rows x (3 server metrics + p99 TTFT)
    assert [ax.get_ylabel() for ax in axes[:4]] == ["server_kv_cache_usage_perc_peak (1 = full)",
                                                    "server_num_requests_waiting_peak", "server_num_preemptions",
                                                    "p99_ttft_ms (ms)"]
    assert all(len(lines_of(ax)) == 2 for ax in axes)  # by server config
    waiting = next(ln for ln in lines_of(axes[1]) if ln.get_label() == "max_num_seqs=8")
    assert list(waiting.get_ydata()) == [0, 1, 2, 4]
    assert plots.plan_server_metrics(table.drop(columns=list(plots.SERVER_METRICS)), spec, "max_concurrency") == []
    # a metric that is 0 on every run (nothing waited, no preemption: the stub's own) is a note, not a flat panel
    [quiet] = plots.plan_server_metrics(table, spec, "max_concurrency")
    assert [p.ylabel for p in quiet.panels[0]] == ["server_kv_cache_usage_perc_peak (1 = full)", "p99_ttft_ms (ms)"]
    assert ("server_num_requests_waiting_peak, server_num_preemptions: 0 on every run, no panel of its own"
            in quiet.notes)
    assert plots.plan_server_metrics(table.assign(server_kv_cache_usage_perc_peak=0.0), spec, "max_concurrency") == []


# ---------------------------------------------------------------------------------------------------
# Pareto
# ---------------------------------------------------------------------------------------------------

def pareto_frame(rows: list[tuple[str, float, float, int]]) -> pd.DataFrame:
    """(name, output_throughput, max_concurrency, gpu_count) rows."""
    return pd.DataFrame([{"name": n, "output_throughput": t, "max_concurrency": c, "gpu_count": g,
                          "max_concurrent_requests": c} for n, t, c, g in rows])


def test_pareto_front_known_set_without_dominated_ties():
    df = pareto_frame([
        ("a", 100, 1, 1),    # 100 /user, 100 /gpu: front
        ("b", 360, 4, 1),    # 90, 360: front
        ("c", 400, 8, 1),    # 50, 400: front
        ("tie", 400, 16, 1),  # 25, 400: same per GPU as c at fewer per user: dominated (vLLM #55561)
        ("dup", 400, 8, 1),  # identical to c: once on the front
        ("d", 150, 2, 1),    # 75, 150: dominated by b
        ("e", 200, 2, 2),    # 100, 100: a tie of a on both axes: once
    ])
    result = pareto(df)
    assert list(result.front["name"]) == ["c", "b", "a"]
    assert list(result.front["tokens_per_user"]) == [50, 90, 100]
    assert list(result.front["tokens_per_gpu"]) == [400, 360, 100]
    assert len(result.points) == 7 and result.notes == []


def test_pareto_user_count_falls_back_to_observed_concurrency():
    df = pareto_frame([("rate", 300, 0, 1), ("none", 100, 1, 1)])
    df["max_concurrency"] = [None, 2.0]
    df["max_concurrent_requests"] = [6, None]
    result = pareto(df)
    pts = result.points.set_index("name")
    assert pts.loc["rate", "user_count"] == 6 and pts.loc["rate", "tokens_per_user"] == 50
    assert pts.loc["rate", "user_count_from"] == "max_concurrent_requests (observed)"
    assert pts.loc["none", "user_count_from"] == "max_concurrency"
    df.loc[1, "max_concurrency"] = None
    assert "1 run(s) without a user count" in pareto(df).notes[0]


def test_pareto_gpu_count_zero_uses_the_recorded_parallel_sizes():
    df = pareto_frame([("cpu", 100, 1, 0), ("gpu", 400, 2, 4)])
    df["tensor_parallel_size"] = [2, 4]
    df["pipeline_parallel_size"] = [1, 1]
    result = pareto(df)
    pts = result.points.set_index("name")
    assert pts.loc["cpu", "gpus"] == 2 and pts.loc["cpu", "tokens_per_gpu"] == 50
    assert pts.loc["cpu", "gpus_from"] == "tp x pp (record)"
    assert pts.loc["gpu", "gpus"] == 4 and pts.loc["gpu", "gpus_from"] == "gpu_count"
    assert result.notes == ["1 run(s) have no gpu_count (0 or missing: no GPU reserved or recorded); their GPUs "
                            "are tensor_parallel_size x pipeline_parallel_size from the record, other sizes taken as 1"]


def test_pareto_takes_one_gpu_without_a_record_as_vllm_does_and_gpu_count_says_otherwise():
    """A single-GPU `vllm bench sweep` directory records no GPU count and no parallel sizes: vLLM's plot_pareto
    takes 1 GPU (world size 1), and so does raysweep, saying so; --gpu-count N gives another count."""
    result = pareto(pareto_frame([("cpu", 100, 1, 0)]))
    pts = result.points.set_index("name")
    assert pts.loc["cpu", "gpus"] == 1 and pts.loc["cpu", "tokens_per_gpu"] == 100
    assert "vLLM's plot_pareto" in result.notes[0] and "--gpu-count" in result.notes[0]
    result = pareto(pareto_frame([("cpu", 100, 1, 0)]), gpu_count=4)
    assert result.points.set_index("name").loc["cpu", "tokens_per_gpu"] == 25
    with pytest.raises(UserError, match="--gpu-count"):
        pareto(pareto_frame([("cpu", 100, 1, 0)]), gpu_count=0)
    with pytest.raises(UserError, match="--gpu-count-var gpus_total: no such column"):
        pareto(pareto_frame([("a", 1, 1, 1)]), gpu_count_var="gpus_total")
    with pytest.raises(UserError, match="--user-count-var users: no such column"):
        pareto(pareto_frame([("a", 1, 1, 1)]), user_count_var="users")


def test_pareto_keeps_client_limited_runs_off_the_front():
    df = pareto_frame([("a", 100, 1, 1), ("fast-but-limited", 900, 8, 1)])
    df["client_limited"] = [False, True]
    result = pareto(df)
    assert list(result.front["name"]) == ["a"]
    assert result.notes == [] and result.drawn_notes == ["1 client-limited run(s) drawn hollow, not on the front"]
    fig = plots.pareto_figure(result, ["name"])
    ax = fig.get_axes()[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "all runs", "client-limited run (not on the front)", "Pareto front"]
    assert [t.get_text() for t in ax.texts] == ["name=a"]


def test_pareto_label_by_missing_column():
    result = pareto(pareto_frame([("a", 100, 1, 1)]))
    with pytest.raises(UserError, match="--label-by tp: no such column"):
        plots.pareto_figure(result, ["tp"])


# ---------------------------------------------------------------------------------------------------
# SLA
# ---------------------------------------------------------------------------------------------------

def test_sla_figure_from_a_synthetic_table():
    sla = pd.DataFrame([
        {"serve_label": "mns=8", "bench_label": "in=128", "target": "p99_e2el_ms<=200", "state": "found",
         "largest_pass": 12.0},
        {"serve_label": "mns=16", "bench_label": "in=128", "target": "p99_e2el_ms<=200", "state": "above max",
         "largest_pass": math.inf},
        {"serve_label": "mns=8", "bench_label": "in=256", "target": "p99_e2el_ms<=200", "state": "found",
         "largest_pass": 6.0},
        {"serve_label": "mns=16", "bench_label": "in=256", "target": "p99_e2el_ms<=200", "state": "found",
         "largest_pass": 24.0},
        {"serve_label": "mns=8", "bench_label": "in=128", "target": "p99_ttft_ms<=50", "state": "never met",
         "largest_pass": None},
    ])
    fig = plots.sla_figure(sla, "max_concurrency")
    visible = [ax for ax in fig.get_axes() if ax.get_visible()]
    assert [ax.get_title() for ax in visible] == ["p99_e2el_ms<=200", "p99_ttft_ms<=50"]
    assert len(visible[0].patches) == 4 and len(visible[1].patches) == 1
    assert [t.get_text() for t in visible[0].texts] == [" 12", " unbounded (above max)", " 6", " 24"]
    assert [t.get_text() for t in visible[1].texts] == [" none (never met)"]
    assert [t.get_text() for t in visible[0].get_yticklabels()] == ["mns=8", "mns=16"]
    assert visible[0].get_xlabel() == "largest passing max_concurrency"
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["in=128", "in=256"]
    with pytest.raises(UserError, match="largest_pass"):
        plots.sla_figure(sla.drop(columns=["largest_pass"]), "max_concurrency")


# ---------------------------------------------------------------------------------------------------
# vLLM sweep dirs
# ---------------------------------------------------------------------------------------------------

def vllm_record(tp: int, length: int, conc: int, run: int) -> dict[str, Any]:
    """A `vllm bench serve --save-result` record with the sweep's overrides (reference/vllm.md §1.7)."""
    thr = 100.0 * conc / tp + run
    return {"date": "20250101-000000", "backend": "vllm", "model_id": "m", "num_prompts": 10,
            "request_rate": "inf", "burstiness": 1.0, "max_concurrency": conc, "duration": 2.0, "completed": 10,
            "failed": 0, "request_throughput": 5.0, "output_throughput": thr, "total_token_throughput": thr * 3,
            "max_concurrent_requests": conc, "median_ttft_ms": 10.0 * conc, "p99_ttft_ms": 20.0 * conc,
            "latencies": [0.1] * 10, "queue_times": [0.0] * 10, "run_number": run,
            "tensor-parallel-size": tp, "random_input_len": length}


def build_vllm_dir(root: Path, with_tp: bool = True) -> Path:
    """`<output_dir>/<experiment>/SERVE--...-BENCH--.../{run=N.json,summary.json}` as vLLM 0.33 writes it,
    with a top-level summary.csv, a warmup.json and failure records."""
    exp = root / "exp-20250101"
    exp.mkdir(parents=True)
    (exp / "summary.csv").write_text(",a\n0,1\n")
    for tp in (1, 2):
        for conc in (4, 8):
            name = (f"SERVE--tensor-parallel-size={tp}-" if with_tp else "SERVE--big-") + \
                f"BENCH--random_input_len=128-max_concurrency={conc}"
            combo = exp / name
            combo.mkdir(exist_ok=True)
            runs = []
            for run in (0, 1):
                rec = vllm_record(tp, 128, conc, run)
                if not with_tp:
                    rec.pop("tensor-parallel-size")
                (combo / f"run={run}.json").write_text(json.dumps(rec))
                runs.append(rec)
            (combo / "warmup.json").write_text(json.dumps({**runs[0], "run_number": -1}))
            (combo / "summary.json").write_text(json.dumps(runs))
        if not with_tp:
            break
    (exp / "SERVE--tensor-parallel-size=4-BENCH--random_input_len=128-max_concurrency=4").mkdir()
    (exp / "SERVE--tensor-parallel-size=4-BENCH--random_input_len=128-max_concurrency=4" / "run=0.failure.json"
     ).write_text(json.dumps({"run_number": 0, "error_type": "RuntimeError", "error": "x",
                              "serve_overrides": {}, "bench_overrides": {}}))
    (exp / "SERVE--tensor-parallel-size=8-failure.json").write_text(json.dumps({"error_type": "E", "error": "oom"}))
    return root


def test_combo_labels_from_directory_names():
    assert combo_labels("SERVE--max_num_seqs=32-BENCH--random_input_len=128-max_concurrency=8") == (
        "max_num_seqs=32", "random_input_len=128-max_concurrency=8")
    assert combo_labels("SERVE--big-BENCH--scenario_A") == ("big", "scenario_A")
    assert combo_labels("BENCH--x-WL--request_rate=5") == ("default", "x-WL--request_rate=5")
    assert combo_labels("exp-20250101") == ("default", "default")


def test_read_vllm_sweep_dir(tmp_path):
    table = read_table(build_vllm_dir(tmp_path / "vllm"))
    df = table.df
    assert table.kind == "vllm" and len(df) == 8  # 2 tp x 2 concurrencies x 2 runs; warmups not counted
    assert "tensor_parallel_size" in df.columns and "tensor-parallel-size" not in df.columns
    assert pd.api.types.is_float_dtype(df["request_rate"]) and all(np.isinf(df["request_rate"]))
    assert "latencies" not in df.columns and "queue_times" not in df.columns
    assert sorted(set(df["serve_label"])) == ["tensor-parallel-size=1", "tensor-parallel-size=2"]
    assert set(df["bench_label"]) == {f"random_input_len=128-max_concurrency={c}" for c in (4, 8)}
    assert set(df["campaign"]) == {"exp-20250101"} and df["point_id"].nunique() == 8
    assert sorted(df["run_number"].tolist()) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert table.notes == ["2 failure record(s), not in the table: exp-20250101/SERVE--tensor-parallel-size=4-"
                           "BENCH--random_input_len=128-max_concurrency=4/run=0.failure.json, "
                           "exp-20250101/SERVE--tensor-parallel-size=8-failure.json"]


def test_read_table_refuses_other_dirs(tmp_path):
    with pytest.raises(UserError) as err:
        read_table(tmp_path, option="OUTPUT_DIR")
    assert "OUTPUT_DIR" in str(err.value) and "ledger.sqlite" in str(err.value) and "summary.json" in str(err.value)


def test_import_writes_a_results_table_that_plot_reads(tmp_path):
    paths, table = import_vllm_sweep(build_vllm_dir(tmp_path / "vllm"), tmp_path / "imported")
    assert [p.name for p in paths] == ["results.parquet", "results.csv"]
    back = read_table(tmp_path / "imported")
    assert back.kind == "imported" and len(back.df) == 8
    assert all(np.isinf(back.df["request_rate"]))
    assert len(pd.read_csv(paths[1])) == 8
    with pytest.raises(UserError, match="VLLM_DIR"):
        import_vllm_sweep(tmp_path / "imported", tmp_path / "again")


# ---------------------------------------------------------------------------------------------------
# CLI, end to end on a real ledger and on a vLLM dir
# ---------------------------------------------------------------------------------------------------

def invoke(*args: str) -> Any:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_cli_plot_writes_curves_server_and_sla_figures(tmp_path):
    out = build_output_dir(tmp_path / "out", sla=True)
    result = invoke("plot", str(out), "--var-x", "max_concurrency", "--var-y", "output_throughput",
                    "--col-by", "random_input_len", "--curve-by", "max_num_seqs", "--filter-by", "max_concurrency<=4")
    assert result.exit_code == 0, result.output
    files = sorted(p.name for p in (out / "plots").iterdir())
    assert files == ["FIGURE.png", "SERVER.png", "SLA.png"]
    assert all((out / "plots" / f).read_bytes().startswith(PNG) for f in files)
    assert str(out / "plots" / "FIGURE.png") in result.output


def test_cli_plot_dry_run_writes_nothing(outdir):
    result = invoke("plot", str(outdir), "--var-x", "max_concurrency", "--curve-by", "max_num_seqs", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "FIGURE.png: 1 row(s) x 1 column(s), 2 curve(s), 31 run(s)" in result.output
    assert "SERVER.png: 1 row(s) x 2 column(s), 2 curve(s)" in result.output  # waiting and preemptions: all 0
    assert not (outdir / "plots").exists()
    result = invoke("plot", str(outdir), "--var-x", "max_concurrency", "--no-server-metrics", "--dry-run")
    assert "FIGURE.png" in result.output and "SERVER" not in result.output


def test_cli_plot_fig_dir_is_relative_to_the_output_dir(outdir):
    result = invoke("plot", str(outdir), "--var-x", "max_concurrency", "--fig-dir", "figs", "--no-server-metrics",
                    "--format", "pdf")
    assert result.exit_code == 0, result.output
    assert (outdir / "figs" / "FIGURE.pdf").read_bytes().startswith(b"%PDF")
    both = CliRunner().invoke(main, ["plot", str(outdir), "--fig-dir", "a", "--out", "b"])
    assert both.exit_code == 2 and "--out and --fig-dir" in both.output


def test_cli_plot_bad_option_exits_2(outdir):
    result = CliRunner().invoke(main, ["plot", str(outdir), "--var-x", "concurency"])
    assert result.exit_code == 2
    assert "--var-x concurency: no such column; did you mean max_concurrency" in result.output
    result = CliRunner().invoke(main, ["plot", str(outdir), "--filter-by", "tp==2"])
    assert result.exit_code == 2 and "--filter-by 'tp==2': tp: no such column" in result.output


def test_cli_pareto_front_is_the_non_dominated_set(outdir, table):
    """Per run (--per run, vLLM's plot_pareto): the runs no other run dominates."""
    result = invoke("pareto", str(outdir), "--label-by", "max_concurrency,max_num_seqs", "--out",
                    str(outdir / "pp"), "--format", "svg", "--per", "run")
    assert result.exit_code == 0, result.output
    assert (outdir / "pp" / "PARETO.svg").is_file()
    front = pd.read_csv(outdir / "pp" / "pareto_front.csv")
    # brute force over the runs that the client did not limit
    ok = table[~table["client_limited"].astype(bool)]
    x = ok["output_throughput"] / ok["max_concurrency"]
    y = ok["output_throughput"] / ok["gpu_count"]
    best = {pid for pid, xi, yi in zip(ok["point_id"], x, y, strict=True)
            if not ((x >= xi) & (y >= yi) & ((x > xi) | (y > yi))).any()}
    assert set(front["point_id"]) == best and len(front) == len(best)
    assert list(front.columns[:6]) == ["serve_label", "bench_label", "run_number", "point_id", "max_concurrency",
                                       "max_num_seqs"]
    assert set(front["gpus_from"]) == {"gpu_count"}
    assert list(front["tokens_per_user"]) == sorted(front["tokens_per_user"])


def test_one_pareto_front_of_point_means_in_the_command_the_report_and_the_api(outdir, table):
    """By default the front is of the points' means over their runs that the client did not limit (not of the
    luckiest run), each with its 95 % t-interval across runs; the `pareto` command, the report's conclusions
    and `raysweep.load(...).pareto()` give the same front."""
    import raysweep
    from raysweep.results import conclusions

    result = invoke("pareto", str(outdir), "--out", str(outdir / "pp"))
    assert result.exit_code == 0, result.output
    assert "of 16 point mean(s) of 31 run(s)" in " ".join(result.output.split())
    front = pd.read_csv(outdir / "pp" / "pareto_front.csv")
    ok = table[~table["client_limited"].astype(bool)]
    means = ok.groupby(["serve_id", "bench_id"]).agg(
        thr=("output_throughput", "mean"), conc=("max_concurrency", "first"), gpus=("gpu_count", "first"),
        n=("output_throughput", "size"))
    x, y = means["thr"] / means["conc"], means["thr"] / means["gpus"]
    best = {key for key, xi, yi in zip(means.index, x, y, strict=True)
            if not ((x >= xi) & (y >= yi) & ((x > xi) | (y > yi))).any()}
    assert set(zip(front["serve_id"], front["bench_id"], strict=True)) == best and len(front) == len(best)
    row = front.iloc[0]
    runs = ok[(ok["serve_id"] == row["serve_id"]) & (ok["bench_id"] == row["bench_id"])]
    per_user = (runs["output_throughput"] / runs["max_concurrency"]).to_numpy()
    assert row["n_runs"] == len(runs) == 2 and row["tokens_per_user"] == pytest.approx(per_user.mean())
    half = 12.706204736174694 * per_user.std(ddof=1) / np.sqrt(2)   # t(0.975, 1 df)
    assert row["tokens_per_user_low"] == pytest.approx(per_user.mean() - half)
    assert row["tokens_per_user_high"] == pytest.approx(per_user.mean() + half)
    api = raysweep.load(outdir).pareto()
    assert set(zip(api["serve_id"], api["bench_id"], strict=True)) == best
    points = ok.drop_duplicates(["serve_id", "bench_id"]).assign(shape="all")[["serve_id", "bench_id", "shape"]]
    fronts, _ = conclusions._fronts(table, points)
    assert set(zip(fronts["all"]["serve_id"], fronts["all"]["bench_id"], strict=True)) == best


def test_cli_pareto_default_dir_and_dry_run(outdir):
    assert invoke("pareto", str(outdir), "--dry-run").exit_code == 0
    assert not (outdir / "pareto").exists()
    result = invoke("pareto", str(outdir))
    assert sorted(p.name for p in (outdir / "pareto").iterdir()) == ["PARETO.png", "pareto_front.csv"]
    assert "Pareto front:" in result.output


def test_cli_plot_and_pareto_read_a_vllm_dir_directly(tmp_path):
    vdir = build_vllm_dir(tmp_path / "vllm")
    result = invoke("plot", str(vdir), "--var-x", "max_concurrency", "--curve-by", "tensor_parallel_size")
    assert result.exit_code == 0, result.output
    assert (vdir / "plots" / "FIGURE.png").read_bytes().startswith(PNG)
    assert "2 failure record(s)" in result.output
    result = invoke("pareto", str(vdir))
    assert result.exit_code == 0, result.output
    front = pd.read_csv(vdir / "pareto" / "pareto_front.csv")
    assert set(front["gpus_from"]) == {"tp (record)"}
    assert "their GPUs are tensor_parallel_size from the record" in result.output.replace("\n", " ")


def test_cli_pareto_and_import_read_a_single_gpu_vllm_dir(tmp_path):
    """A `vllm bench sweep` directory without TP/PP/DP columns: 1 GPU per run, as vLLM's plot_pareto takes it,
    said in the output; --gpu-count N says otherwise; `import` reads it too."""
    vdir = build_vllm_dir(tmp_path / "vllm", with_tp=False)
    result = CliRunner().invoke(main, ["pareto", str(vdir), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "1 GPU" in result.output and "plot_pareto" in result.output
    two = CliRunner().invoke(main, ["pareto", str(vdir), "--dry-run", "--gpu-count", "2"])
    assert two.exit_code == 0 and "--gpu-count 2" in two.output
    assert invoke("pareto", str(vdir), "--gpu-count-var", "num_prompts").exit_code == 0
    assert invoke("import", str(vdir), str(tmp_path / "imp")).exit_code == 0


def test_cli_import(tmp_path):
    vdir = build_vllm_dir(tmp_path / "vllm")
    result = invoke("import", str(vdir), str(tmp_path / "imp"))
    assert result.exit_code == 0, result.output
    assert "8 run(s)" in result.output and "2 failure record(s)" in result.output
    assert invoke("plot", str(tmp_path / "imp"), "--var-x", "max_concurrency", "--dry-run").exit_code == 0
    refused = CliRunner().invoke(main, ["import", str(vdir), str(build_output_dir(tmp_path / "rs"))])
    assert refused.exit_code == 2 and "raysweep campaign's output dir" in refused.output


def test_a_configuration_keeps_its_colour_on_every_figure(table):
    """One colour per server configuration across the page and `plot`: from the campaign's whole table, in the
    natural order of the configurations (max_num_seqs=8 before 16, as the figures list them), so a figure
    filtered to one configuration, a figure per input length, a figure whose curves are the server parameter
    (the report's figures) or a card's curves by configuration, the server-side metrics and the drift timeline
    all colour max_num_seqs=16 alike (second in the campaign's order, so the first figure colour is not its
    own, even in a figure of 16 alone)."""
    from matplotlib.colors import to_hex

    from raysweep.report import timeline
    from raysweep.report.plots.style import config_colors

    assert list(config_colors(table)) == ["max_num_seqs=8", "max_num_seqs=16"]
    want = to_hex(config_colors(table)["max_num_seqs=16"])
    assert want != to_hex(config_colors(table)["max_num_seqs=8"])
    spec = plots.PlotSpec(var_x="max_concurrency", var_y="output_throughput", curve_by=("serve_label",),
                          fig_by=("random_input_len",))
    by_param = replace(spec, curve_by=("max_num_seqs",))
    seen = []
    for s in (spec, replace(spec, filter_by=("max_num_seqs==16",)), by_param,
              replace(by_param, filter_by=("max_num_seqs==16",))):
        for plan in plots.plan_curves(table, s):
            fig = plots.render(plan, s)
            seen += [to_hex(ln.get_color()) for ax in fig.get_axes() for ln in lines_of(ax)
                     if ln.get_label() == "max_num_seqs=16"]
    assert len(seen) == 8 and set(seen) == {want}
    # curves that split a configuration (by its parameter and the input length) each keep a colour of their own
    split = replace(spec, curve_by=("max_num_seqs", "random_input_len"), fig_by=())
    plan = plots.plan_curves(table, split)[0]
    assert len(plan.curve_labels) > 2 and len(set(map(to_hex, plan.colors.values()))) == len(plan.curve_labels)
    # and listed in that order in the legends, by configuration or by its parameter
    assert plots.plan_curves(table, spec)[0].curve_labels == ["max_num_seqs=8", "max_num_seqs=16"]
    assert plots.plan_curves(table, by_param)[0].curve_labels == ["max_num_seqs=8", "max_num_seqs=16"]
    metrics_spec = plots.PlotSpec(col_by=(), row_by=("random_input_len",), curve_by=("max_num_seqs",))
    plan = plots.plan_server_metrics(table, metrics_spec, "max_concurrency")[0]
    fig = plots.render(plan, metrics_spec)
    drawn = {to_hex(ln.get_color()) for ax in fig.get_axes() for ln in lines_of(ax)
             if ln.get_label() == "max_num_seqs=16"}
    assert drawn == {want}
    timed = table.assign(started_at=np.arange(len(table), dtype=float))
    fig = timeline._figure(timed, "output_throughput", set())
    dots = {c.get_label(): to_hex(c.get_facecolor()[0]) for c in fig.axes[0].collections}
    assert dots["max_num_seqs=16"] == want
    # the report's GPU telemetry, drawn for the points that have it (here 16's only): its colour, not the first
    from raysweep.report import run_sections

    gpus = table[table["max_num_seqs"] == 16].assign(gpu_util_mean_pct=90.0, gpu_power_mean_w=300.0,
                                                      gpu_sm_clock_mean_mhz=1800.0, gpu_throttled_fraction=0.0)
    fig = run_sections._telemetry_figure(gpus, config_colors(table))
    assert {to_hex(ln.get_color()) for ax in fig.axes for ln in ax.get_lines()} == {want}

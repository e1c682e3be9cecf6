"""Unit tests for raysweep.results.aggregate (aggregates per point) and `raysweep results --aggregate`.

Result tables and output dirs are made here (through the ledger API); raw samples are built by hand in the
form the native backend writes them. No Ray, no vLLM.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from raysweep.bench import stats
from raysweep.bench.options import parse_load_options
from raysweep.cli import main
from raysweep.errors import UserError
from raysweep.ledger import LEDGER_FILE, Ledger
from raysweep.maths import hierarchy
from raysweep.record.directory import CampaignDir
from raysweep.record.files import write_json_atomic
from raysweep.results import aggregate
from raysweep.results.table import write_results

T2_975 = 4.302652729911275  # Student t, 2 degrees of freedom, 97.5 %


def run_row(sid: str, conc: int, run: int, thr: float, ttft: float, **extra: Any) -> dict[str, Any]:
    """One run as the results table has it: ids, labels, parameters, metrics."""
    return {"campaign": "c", "serve_id": sid, "bench_id": f"b{conc}", "point_id": f"{sid}-b{conc}-{run}",
            "run_number": run, "serve_label": f"max_num_seqs={sid[1:]}", "bench_label": f"max_concurrency={conc}",
            "max_num_seqs": int(sid[1:]), "max_concurrency": conc, "tensor_parallel_size": 1,
            "pipeline_parallel_size": 1, "data_parallel_size": 1, "gpu_count": 2, "hostname": f"host{run}",
            "output_throughput": thr, "request_throughput": thr / 10, "median_ttft_ms": ttft, "p99_ttft_ms": ttft * 2,
            "mean_tpot_ms": 5.0, "validity_ok": True, "client_limited": False, **extra}


def table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame.from_records(rows)


def test_t_quantile_matches_the_tables():
    assert aggregate.t_quantile(0.975, 1) == pytest.approx(12.7062, abs=1e-4)
    assert aggregate.t_quantile(0.975, 2) == pytest.approx(T2_975, abs=1e-6)
    assert aggregate.t_quantile(0.975, 30) == pytest.approx(2.0423, abs=1e-4)
    assert aggregate.t_quantile(0.995, 10) == pytest.approx(3.1693, abs=1e-4)
    assert aggregate.t_quantile(0.025, 5) == pytest.approx(-2.5706, abs=1e-4)


def test_runs_needed_is_the_fewest_runs_that_tighten_the_interval():
    # 18 runs: t(17) * 0.1 / sqrt(18) = 0.0497 <= 0.05; 17 runs: t(16) * 0.1 / sqrt(17) = 0.0514
    assert aggregate.runs_needed(0.1, 0.05) == 18
    # 2 runs: t(1) * 0.01 / sqrt(2) = 0.090; 3 runs: t(2) * 0.01 / sqrt(3) = 0.025
    assert aggregate.runs_needed(0.01, 0.05) == 3
    assert aggregate.runs_needed(0.0, 0.05) == 2
    assert aggregate.runs_needed(math.nan, 0.05) is None


def test_summary_statistics_of_a_point_over_its_runs():
    rows = [run_row("s8", 1, r, thr, 10.0 + r) for r, thr in enumerate((100.0, 110.0, 120.0))]
    rows += [run_row("s8", 2, r, 200.0, 20.0) for r in range(3)]
    s = aggregate.summarize(table(rows))
    assert list(s["bench_id"]) == ["b1", "b2"] and list(s["runs"]) == [3, 3]
    p = s.iloc[0]
    assert p["output_throughput_mean"] == pytest.approx(110.0)
    assert p["output_throughput_median"] == pytest.approx(110.0)
    assert p["output_throughput_std"] == pytest.approx(10.0)
    assert p["output_throughput_cv"] == pytest.approx(10.0 / 110.0)
    half = T2_975 * 10.0 / math.sqrt(3)
    assert p["output_throughput_ci_low"] == pytest.approx(110.0 - half)
    assert p["output_throughput_ci_high"] == pytest.approx(110.0 + half)
    # one server start: the interval is over its runs, and says that a start's own effect is not in it
    assert p["ci_method"] == hierarchy.RUNS_OF_ONE_START and p["server_starts"] == 1
    assert p["output_throughput_se"] == pytest.approx(10.0 / math.sqrt(3)) and p["output_throughput_df"] == 2
    assert p["ci_level"] == 0.95
    # per GPU: gpu_count is 2
    assert p["output_throughput_per_gpu_mean"] == pytest.approx(55.0)
    # the parameters that differ between points stay, the facts of one run do not
    assert {"max_concurrency", "serve_label", "bench_label", "gpu_count"} <= set(s.columns)
    assert "hostname" not in s.columns and "point_id" not in s.columns and "max_num_seqs" not in s.columns
    assert "max_num_seqs" in aggregate.summarize(table(rows), params=["max_num_seqs", "max_concurrency"]).columns
    # noisy: cv 9 % of throughput; the point without spread is not noisy
    assert bool(p["noisy"]) and "output_throughput" in p["noisy_metrics"]
    assert p["runs_needed"] == aggregate.runs_needed(10.0 / 110.0, 0.05)
    q = s.iloc[1]
    assert not q["noisy"] and q["output_throughput_std"] == 0.0 and q["runs_needed"] == 2


def test_threshold_and_noise_metrics_are_options():
    rows = [run_row("s8", 1, r, thr, 10.0) for r, thr in enumerate((100.0, 110.0, 120.0))]
    assert not aggregate.summarize(table(rows), threshold=0.2)["noisy"].iloc[0]
    judged = aggregate.summarize(table(rows), noise_metrics=["median_ttft_ms"])
    assert not judged["noisy"].iloc[0] and judged["noisy_metrics"].iloc[0] == ""
    with pytest.raises(UserError, match="--noise-metrics nope.*accepted: .*output_throughput"):
        aggregate.summarize(table(rows), noise_metrics=["nope"])
    with pytest.raises(UserError, match="--confidence"):
        aggregate.summarize(table(rows), confidence=95)


def test_one_run_has_no_interval_and_no_verdict():
    s = aggregate.summarize(table([run_row("s8", 1, 0, 100.0, 10.0), run_row("s16", 1, 0, 300.0, 9.0)]))
    assert s["output_throughput_ci_low"].isna().all() and s["output_throughput_cv"].isna().all()
    assert not s["noisy"].any() and s["runs_needed"].isna().all()
    assert not aggregate.lead_is_significant(s.iloc[0], s.iloc[1], "output_throughput")


def test_lead_is_significant_is_the_model_s_test_of_the_server_starts():
    def row(mean: float, starts: int, sd: float = 0.5) -> dict:
        return {"m_mean": mean, "m_se": sd / math.sqrt(starts), "m_df": starts - 1, "server_starts": starts,
                "runs": starts}

    a = row(10.0, 5)
    assert aggregate.lead_is_significant(a, row(11.0, 5), "m") and aggregate.lead_is_significant(row(11.0, 5), a, "m")
    assert not aggregate.lead_is_significant(a, row(10.5, 5), "m")                      # p ~ 0.15
    # the same means and spreads on one server start each: runs of one start are no replicates of a config
    one = {"m_mean": 10.0, "m_se": 0.1, "m_df": 4, "server_starts": 1, "runs": 5}
    assert not aggregate.lead_is_significant(one, {**one, "m_mean": 20.0}, "m")


def test_a_warm_up_of_a_configuration_s_starts_is_cut_from_its_values_and_said():
    """s8's first run on each of its 4 server starts is 15 % slow in throughput (its TTFT alike): those runs are
    left out of both metrics' values, and said; s16, without a warm-up, keeps every run."""
    rng = np.random.default_rng(5)
    rows, t = [], 0
    for start in range(4):
        for sid, warm in (("s8", 0.15), ("s16", 0.0)):
            for j in range(3):
                slow = 1.0 - warm if j == 0 else 1.0
                noise = 1 + 0.01 * rng.standard_normal()
                rows.append(run_row(sid, 4, 3 * start + j, 1000.0 * noise * slow, 20.0 * noise / slow,
                                    server_id=f"{sid}-{start}", started_at=float(t)))
                t += 1
    s = aggregate.summarize(table(rows)).set_index("serve_id")
    df = table(rows)
    for sid in ("s8", "s16"):
        mine = df[df["serve_id"] == sid]
        kept = mine[mine["run_number"] % 3 != 0] if sid == "s8" else mine
        expected = kept.groupby("server_id")["output_throughput"].mean().mean()
        assert s.loc[sid, "output_throughput_mean"] == pytest.approx(expected)
    assert s.loc["s8", "output_throughput_warmup_p"] < 0.01 and s.loc["s8", "output_throughput_warmup_pct"] < -10
    assert s.loc["s8", "median_ttft_ms_warmup_pct"] > 10    # a latency's warm-up, judged on its own
    assert "first run after each of 4 server start(s)" in s.loc["s8", "warmup_text"]
    assert "output_throughput" in s.loc["s8", "warmup_text"] and "median_ttft_ms" in s.loc["s8", "warmup_text"]
    assert s.loc["s16", "warmup_text"] == "" and s.loc["s16", "output_throughput_warmup_p"] > 0.05
    assert s.loc["s8", "server_starts"] == 4


def test_a_rate_s_or_a_latency_s_interval_never_reaches_below_zero():
    rows = [run_row("s8", 4, r, thr, ttft, server_id=f"s8-{r}") for r, (thr, ttft) in
            enumerate([(100.0, 5.0), (1900.0, 95.0)])]   # two starts far apart: t on 1 degree of freedom
    s = aggregate.summarize(table(rows)).iloc[0]
    mean, se = np.array([s["output_throughput_mean"]]), np.array([s["output_throughput_se"]])
    assert hierarchy.interval(mean, se, np.array([1.0]), 0.95)[0][0] < -1000   # Student's t alone
    assert s["output_throughput_ci_low"] == 0.0 and s["median_ttft_ms_ci_low"] == 0.0
    assert s["output_throughput_ci_high"] > s["output_throughput_mean"] > 0


def test_flagged_and_client_limited_runs_are_counted():
    rows = [run_row("s8", 1, 0, 100.0, 10.0), run_row("s8", 1, 1, 100.0, 10.0, validity_ok=False,
                                                       client_limited=True)]
    p = aggregate.summarize(table(rows)).iloc[0]
    assert p["runs_flagged"] == 1 and p["client_limited_runs"] == 1


def test_a_table_without_ids_is_grouped_by_its_parameters():
    rows = [run_row("s8", c, r, 100.0 * c + r, 10.0) for c in (1, 2) for r in range(2)]
    df = table(rows).drop(columns=["serve_id", "bench_id", "point_id", "serve_label", "bench_label"])
    s = aggregate.summarize(df)
    assert sorted(s["max_concurrency"]) == [1, 2] and list(s["runs"]) == [2, 2]
    assert s.attrs["params"] == ["max_num_seqs", "max_concurrency"]


# ---------------------------------------------------------------------------------------------------
# percentiles bootstrapped from raw samples
# ---------------------------------------------------------------------------------------------------

def samples(seed: int, n: int = 60) -> dict[str, Any]:
    """Raw samples of one native run: n requests, TTFT 10-30 ms, 5 chunks each, one failed request."""
    rng = np.random.default_rng(seed)
    begin = np.sort(rng.uniform(0, 1, n))
    ttft = rng.uniform(0.010, 0.030, n)
    gaps = rng.uniform(0.002, 0.004, (n, 4))
    chunks = [list(np.concatenate([[t], t + np.cumsum(g)])) for t, g in zip(ttft, gaps)]
    end = begin + np.array([c[-1] for c in chunks])
    ok = [True] * (n - 1) + [False]
    return {"index": list(range(n)), "actor": [0] * n, "due": list(begin), "ready": list(begin), "sent": list(begin),
            "begin": list(begin), "first": list(begin + ttft), "end": list(end), "done": list(end),
            "in_tok": [32] * n, "out_tok": [5] * n, "ok": ok, "error": [None] * (n - 1) + ["boom"],
            "chunks": chunks, "text": [None] * n}


def test_percentiles_of_the_pooled_requests_are_bootstrapped():
    runs = {f"s8-b1-{r}": samples(r) for r in range(2)}
    opts = parse_load_options([])
    metrics = [stats.point_metrics(s, opts) for s in runs.values()]
    rows = [run_row("s8", 1, r, 100.0 + r, m["median_ttft_ms"], p99_ttft_ms=m["p99_ttft_ms"],
                    median_itl_ms=m["median_itl_ms"], mean_ttft_ms=m["mean_ttft_ms"]) for r, m in enumerate(metrics)]
    s = aggregate.summarize(table(rows), samples=runs, resamples=300)
    p = s.iloc[0]
    pooled = stats.point_metrics(stats.pool(list(runs.values())), opts)
    assert "two-level bootstrap" in p["ci_method"] and "118 requests" in p["ci_method"]
    for m in ("median_ttft_ms", "p99_ttft_ms", "median_itl_ms"):  # the pooled value as bench.stats computes it
        assert p[f"{m}_pooled"] == pytest.approx(pooled[m])
        # the interval is about the per-run percentiles, the pooled value has its own two-level interval
        assert p[f"{m}_pooled_ci_low"] <= p[f"{m}_pooled"] <= p[f"{m}_pooled_ci_high"]
        half = aggregate.t_quantile(0.975, 1) * p[f"{m}_std"] / math.sqrt(2)
        assert p[f"{m}_ci_high"] - p[f"{m}_mean"] == pytest.approx(half)
    # a single run has a pooled value but no interval: its requests are not independent draws of the config
    one = aggregate.summarize(table(rows[:1]), samples=runs, resamples=300).iloc[0]
    assert one["median_ttft_ms_pooled"] == pytest.approx(stats.point_metrics(runs["s8-b1-0"], opts)["median_ttft_ms"])
    assert math.isnan(one["median_ttft_ms_pooled_ci_low"]) and math.isnan(one["median_ttft_ms_ci_low"])
    # means keep the t-interval
    assert "mean_ttft_ms_pooled" not in s.columns
    # a point with a run without samples gets t-intervals only
    partial = aggregate.summarize(table(rows), samples={"s8-b1-0": runs["s8-b1-0"]})
    assert partial["ci_method"].iloc[0] == hierarchy.RUNS_OF_ONE_START


# ---------------------------------------------------------------------------------------------------
# summary files and the CLI
# ---------------------------------------------------------------------------------------------------

def build_dir(out: Path, rows: list[dict[str, Any]], name: str = "c") -> Path:
    """A raysweep output dir with these runs done (their params: max_num_seqs and max_concurrency)."""
    out.mkdir(parents=True)
    led = Ledger(out / LEDGER_FILE)
    try:
        led.sync(name=name, fingerprint="fp", meaning={}, campaign={"name": name}, campaign_file="c.yaml",
                 points=[(r["point_id"], r["serve_id"], r["bench_id"], r["run_number"],
                          {"max_num_seqs": r["max_num_seqs"]}, {"max_concurrency": r["max_concurrency"]})
                         for r in rows])
        for r in rows:
            rel = f"points/{r['serve_id']}/{r['bench_id']}/run={r['run_number']}.json"
            write_json_atomic(out / rel, {**r, "campaign": name})
            led.mark_running(r["point_id"], "srv")
            led.mark_done(r["point_id"], rel)
    finally:
        led.close()
    return out


@pytest.fixture
def outdir(tmp_path: Path) -> Path:
    rows = [run_row(sid, c, r, base * c * (1 + 0.1 * r), 10.0 * c) for sid, base in (("s8", 100.0), ("s16", 150.0))
            for c in (1, 2) for r in range(3)]
    return build_dir(tmp_path / "out", rows)


def test_summary_is_written_beside_the_results(outdir):
    write_results(CampaignDir(outdir))
    for fmt, read in (("parquet", pd.read_parquet), ("csv", pd.read_csv)):
        s = read(outdir / f"summary.{fmt}")
        assert len(s) == 4 and list(s["runs"]) == [3, 3, 3, 3], fmt
        assert {"output_throughput_mean", "output_throughput_ci_low", "noisy", "runs_needed"} <= set(s.columns)
    # the parquet file keeps which columns are the parameters (from the ledger)
    assert pd.read_parquet(outdir / "summary.parquet").attrs["params"] == ["max_num_seqs", "max_concurrency"]


def test_results_aggregate_prints_and_writes_with_its_settings(outdir):
    res = CliRunner().invoke(main, ["results", str(outdir), "--aggregate", "--noise-threshold", "0.5",
                                    "--confidence", "0.9", "--out", str(outdir)])
    assert res.exit_code == 0, res.output
    assert "4 point(s); noisy" in res.output and "90%" in res.output and "summary.csv" in res.output
    s = pd.read_csv(outdir / "summary.csv")
    assert not s["noisy"].any()   # cv 10 % is under 50 %
    p = s.iloc[0]
    half = aggregate.t_quantile(0.95, 2) * p["output_throughput_std"] / math.sqrt(3)
    assert p["output_throughput_ci_high"] - p["output_throughput_mean"] == pytest.approx(half)
    strict = CliRunner().invoke(main, ["results", str(outdir), "--aggregate", "--out", str(outdir)])
    assert strict.exit_code == 0 and pd.read_csv(outdir / "summary.csv")["noisy"].all()
    bad = CliRunner().invoke(main, ["results", str(outdir), "--aggregate", "--confidence", "1.5"])
    assert bad.exit_code == 2 and "--confidence" in bad.output


def test_summary_json_is_not_written_for_json_results(outdir):
    write_results(CampaignDir(outdir), ("json",))
    assert not (outdir / "summary.parquet").exists() and not (outdir / "summary.csv").exists()
    assert json.loads((outdir / "results.json").read_text())


def test_a_vllm_sweep_dir_is_summarized_by_its_swept_parameters(tmp_path):
    from test_plots import build_vllm_dir

    s = aggregate.summary_table(CampaignDir(build_vllm_dir(tmp_path / "vllm")))
    assert sorted(s.attrs["params"]) == ["max_concurrency", "tensor_parallel_size"]
    assert len(s) == 4 and set(s["runs"]) == {2}


def test_weighted_percentiles_equal_numpys_on_the_repeated_values():
    """The bootstrap reads percentiles of values repeated by their request's draw count without building
    the repeats: the same values as np.percentile (linear) on them, and NaN for an empty resample."""
    from raysweep.maths.bootstrap import weighted_percentiles

    rng = np.random.default_rng(7)
    values = np.sort(rng.random(40) * 20)
    owner = rng.integers(0, 12, 40)
    weights = rng.integers(0, 4, (50, 12))
    weights[3] = 0
    got = weighted_percentiles(values, owner, weights, [0, 50, 90, 99, 100])
    for row, w in zip(got, weights):
        if w[owner].sum() == 0:
            assert np.isnan(row).all()
        else:
            assert np.allclose(row, np.percentile(np.repeat(values, w[owner]), [0, 50, 90, 99, 100]))


def test_client_limited_and_flagged_runs_are_left_out_of_the_statistics():
    rows = [run_row("s8", 1, r, 100.0, 10.0) for r in range(3)]
    rows += [run_row("s8", 1, 3, 10.0, 10.0, client_limited=True, validity_issues="client-limited (loop lag)"),
             run_row("s8", 1, 4, 500.0, 10.0, validity_ok=False,
                     validity_issues="shared CPUs; not steady (slope +3 %/s)")]
    p = aggregate.summarize(table(rows)).iloc[0]
    assert p["output_throughput_mean"] == pytest.approx(100.0) and p["output_throughput_std"] == 0.0
    assert p["runs"] == 3 and p["runs_total"] == 5 and p["runs_left_out"] == 2 and not p["on_flagged_runs"]
    assert p["left_out_reasons"] == "client-limited 1, shared CPUs 1, not steady 1"
    # a point whose runs are all flagged keeps them, and says so
    all_flagged = [run_row("s8", 1, r, 100.0 + r, 10.0, validity_ok=False, validity_issues="shared CPUs")
                   for r in range(2)]
    q = aggregate.summarize(table(all_flagged)).iloc[0]
    assert q["runs"] == 2 and q["runs_left_out"] == 0 and bool(q["on_flagged_runs"])
    assert q["output_throughput_mean"] == pytest.approx(100.5)


def one_point_stats(values: np.ndarray, confidence: float) -> dict[str, float]:
    """The statistics of one metric over one point's runs as the summary computed them a point at a time."""
    v = values[~np.isnan(values)]
    n, nan = v.size, math.nan
    if n == 0:
        return dict.fromkeys(aggregate.STATS, nan)
    mean, median = float(np.mean(v)), float(np.median(v))
    std = float(np.std(v, ddof=1)) if n > 1 else nan
    cv = std / abs(mean) if n > 1 and math.isfinite(mean) and mean != 0 and math.isfinite(std) else nan
    half = aggregate.t_quantile(0.5 + confidence / 2.0, n - 1) * std / math.sqrt(n) if n > 1 else nan
    low, high = (mean - half, mean + half) if math.isfinite(half) else (nan, nan)
    return {"mean": mean, "median": median, "std": std, "cv": cv, "ci_low": low, "ci_high": high}


def test_every_points_statistics_at_once_are_those_of_each_point_alone():
    """Points of 1 to 7 runs, NaN values, identical runs (a spread of exactly 0), a metric all NaN for a
    point: the statistics computed for all points at once equal those of each point alone (to 1e-12)."""
    rng = np.random.default_rng(5)
    sizes = [1, 2, 2, 3, 5, 7, 4]
    codes = np.repeat(np.arange(len(sizes)), sizes)
    values = rng.normal(100, 5, (codes.size, 3))
    values[rng.random(values.shape) < 0.15] = np.nan
    values[codes == 2, 1] = 42.0
    values[codes == 4, 2] = np.nan
    got = aggregate._group_stats(values, codes, len(sizes), 0.9)
    for point in range(len(sizes)):
        for j in range(values.shape[1]):
            want = one_point_stats(values[codes == point, j], 0.9)
            for k in aggregate.STATS:
                assert got[k][point, j] == pytest.approx(want[k], rel=1e-12, nan_ok=True), (point, j, k)
    assert got["std"][2, 1] == 0.0 and got["cv"][2, 1] == 0.0


def test_a_point_on_several_server_starts_is_the_mean_of_its_start_means_with_t_over_starts():
    # 3 starts of 2, 2 and 1 runs: the value is the mean of the start means, not of the runs
    runs = [(0, 100.0), (0, 102.0), (1, 120.0), (1, 122.0), (2, 90.0)]
    rows = [run_row("s8", 1, r, thr, 10.0, server_id=f"srv{start}") for r, (start, thr) in enumerate(runs)]
    p = aggregate.summarize(table(rows)).iloc[0]
    starts = np.array([101.0, 121.0, 90.0])
    assert p["output_throughput_mean"] == pytest.approx(starts.mean())
    assert p["output_throughput_se"] == pytest.approx(starts.std(ddof=1) / math.sqrt(3))
    assert p["output_throughput_df"] == 2 and p["server_starts"] == 3 and p["ci_method"] == hierarchy.MODEL
    half = T2_975 * starts.std(ddof=1) / math.sqrt(3)
    assert p["output_throughput_ci_low"] == pytest.approx(starts.mean() - half)
    assert p["output_throughput_ci_low"] < p["output_throughput_mean"] < p["output_throughput_ci_high"]


def test_values_no_statistic_may_read_are_left_out_and_said():
    rows = [run_row("s8", 1, r, thr, 10.0) for r, thr in enumerate((100.0, math.inf, 104.0, -5.0))]
    p = aggregate.summarize(table(rows)).iloc[0]
    assert p["output_throughput_mean"] == pytest.approx(102.0)   # never inf beside a finite interval
    assert p["output_throughput_ci_low"] < 102.0 < p["output_throughput_ci_high"]
    assert "output_throughput: 1 run(s) not finite, left out" in p["value_issues"]
    assert "output_throughput: 1 run(s) negative, left out" in p["value_issues"]


def test_every_metric_s_drift_over_the_runs_is_measured_and_shown_latency_too():
    # throughput steady; p99 TTFT 28, 26, ... 20 ms in the order the runs started (the rows list them backwards)
    rows = [run_row("s8", 1, r, 100.0 * (1 + 0.001 * (-1) ** r), 10.0, p99_ttft_ms=20.0 * (1 + 0.1 * r),
                    started_at=float(100 * (4 - r)), run_number=4 - r) for r in range(5)]
    p = aggregate.summarize(table(rows)).iloc[0]
    assert p["p99_ttft_ms_drift_pct_per_run"] == pytest.approx(-100.0 * 2.0 / 24.0, rel=1e-6)  # -2 ms/run of 24
    assert p["p99_ttft_ms_drift_p"] < 0.001
    assert abs(p["output_throughput_drift_pct_per_run"]) < 0.2 and p["output_throughput_drift_p"] > 0.05
    # the value is the mean of the runs: a drift is shown, never fitted out
    assert p["p99_ttft_ms_mean"] == pytest.approx(24.0)

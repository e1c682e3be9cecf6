"""How often raysweep's verdicts are wrong, on simulated campaigns run through the real code.

Each simulated run of a point draws a run effect (the run-to-run spread: a throughput factor 1 + s * N(0, 1),
and latencies scaled alike) and then its requests, whose TTFT follows an AR(1) process in log space
(neighbouring requests correlated, as a queue makes them: phi = 0.9); the run's output throughput also carries
the noise of its requests. The tables go through the code a user runs: `aggregate.summarize` (the
summary columns), `compare.compare` (`raysweep compare`), `conclusions.conclude` (the report's cards and the
printed conclusion) and `bench.stats.steady_state` (the validity record's steady-state check).

Measured:
- false "better": two (or four) identical configurations; `compare` calls the other one better on output
  throughput or on p99 TTFT, or the conclusions call the leader better than every other config (a clear
  card). Target at most 5 %.
- power: a true 5 % lead in output throughput, 5 runs a side, 2 % run-to-run spread: how often `compare` says
  better and the conclusions name the leader clear. Target at least 85 %.
- coverage: how often the summary's 95 % interval of output throughput (and of p99 TTFT, the mean of per-run
  p99s) holds the true value. Target 93 to 97 %.
- steady state: stationary Poisson loads at 2 to 100 req/s (at most 5 % flagged) and loads whose rate rises
  by 30 % over the point (at least 90 % flagged among the points long enough to be judged: a point whose
  test could not see a 30 % drift is "not judged", counted apart).

    .venv/bin/python benchmarks/bench_verdicts.py [--reps 400] [--quick] [--precision | --time]

`--time` measures the verdicts with time in the model (benchmarks/verdicts_time.py): drift on one arm and
on both, blocked against designed order, a step mid-campaign, instance effects, outlier runs, unequal spreads
with few runs, families, the slo's "met" and the leader's interval after selection.

Writes benchmarks/results/verdicts.md and verdicts.json (`--quick`: a few repetitions, for the test that
checks it runs; nothing written unless --out is given).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from raysweep.bench import stats as bench_stats
from raysweep.results import aggregate, compare, conclusions

PHI = 0.9          # lag-1 correlation of neighbouring requests' log TTFT within a run
REQUESTS = 200     # requests per run
TTFT_MS = 100.0    # median TTFT of a request
TTFT_SIGMA = 0.4   # log-space spread of a request's TTFT
THROUGHPUT = 1000.0


# ---------------------------------------------------------------------------------------------------
# Simulated runs
# ---------------------------------------------------------------------------------------------------

def _ar1(rng: np.random.Generator, n: int, phi: float) -> np.ndarray:
    e = rng.standard_normal(n)
    x = np.empty(n)
    x[0] = e[0]
    scale = math.sqrt(1 - phi * phi)
    for i in range(1, n):
        x[i] = phi * x[i - 1] + scale * e[i]
    return x


def run_metrics(rng: np.random.Generator, level: float, spread: float, phi: float = PHI) -> dict[str, float]:
    """One run: output throughput and TTFT percentiles of its correlated requests."""
    effect = 1.0 + spread * rng.standard_normal()
    ttft = TTFT_MS / effect * np.exp(TTFT_SIGMA * _ar1(rng, REQUESTS, phi))
    # the run's throughput: its level and effect (the run-to-run spread), and a little noise of its own
    thr = THROUGHPUT * level * effect * (1.0 + 0.002 * rng.standard_normal())
    return {"output_throughput": float(thr), "median_ttft_ms": float(np.percentile(ttft, 50)),
            "p99_ttft_ms": float(np.percentile(ttft, 99)), "mean_ttft_ms": float(np.mean(ttft))}


def campaign(rng: np.random.Generator, levels: list[float], runs: int, spread: float, name: str = "c",
             loads: tuple[int, ...] = (8,)) -> pd.DataFrame:
    """A results table: one config per level, each at `loads`, `runs` runs each (one GPU per config)."""
    rows = []
    for i, level in enumerate(levels):
        for load in loads:
            for r in range(runs):
                rows.append({"campaign": name, "serve_id": f"s{i}", "bench_id": f"c{load}",
                             "point_id": f"s{i}-c{load}-{r}", "run_number": r, "serve_label": f"cfg={i}",
                             "bench_label": f"max_concurrency={load}", "max_num_seqs": i, "max_concurrency": load,
                             "gpu_count": 1, "completed": REQUESTS, "failed": 0, "client_limited": False,
                             "validity_ok": True, **run_metrics(rng, level, spread)})
    return pd.DataFrame(rows)


def true_p99(level_effect_spread: float, draws: int = 400) -> float:
    """The expected per-run p99 TTFT of a configuration (what the mean of per-run p99s estimates)."""
    rng = np.random.default_rng(12345)
    return float(np.mean([run_metrics(rng, 1.0, level_effect_spread)["p99_ttft_ms"] for _ in range(draws)]))


def true_throughput(spread: float) -> float:
    """The expected output throughput of a configuration at level 1 (the run effect has mean 1)."""
    return THROUGHPUT


# ---------------------------------------------------------------------------------------------------
# The real code on them
# ---------------------------------------------------------------------------------------------------

PARAMS = ["max_num_seqs", "max_concurrency"]


def side(df: pd.DataFrame, name: str) -> compare.Side:
    summary = aggregate.summarize(df, params=PARAMS)
    return compare.Side(name, Path(name), summary, aggregate.summary_params(summary))


def compare_pair(rng: np.random.Generator, lead: float, runs: int, spread: float) -> dict[str, str]:
    """`compare` of B (level 1 + lead) against A (level 1), one config at one load each."""
    a = campaign(rng, [1.0], runs, spread, "a")
    b = campaign(rng, [1.0 + lead], runs, spread, "b")
    t = compare.compare(side(a, "a"), side(b, "b"), ["max_concurrency"]).table.iloc[0]
    return {"output_throughput": str(t["output_throughput_verdict"]), "p99_ttft_ms": str(t["p99_ttft_ms_verdict"])}


def leader_clear(rng: np.random.Generator, levels: list[float], runs: int, spread: float) -> bool:
    """Whether the conclusions call the leader better than every other config (a clear card)."""
    df = campaign(rng, levels, runs, spread)
    c = conclusions.conclude(df, ["max_concurrency"], objective="output_throughput",
                             summary=aggregate.summarize(df, params=PARAMS))
    v = c.verdicts[0]
    return bool(v.significant) and not v.tied


def coverage(rng: np.random.Generator, runs: int, spread: float, truth: dict[str, float]) -> dict[str, bool]:
    df = campaign(rng, [1.0], runs, spread)
    s = aggregate.summarize(df, params=PARAMS).iloc[0]
    return {m: bool(s[f"{m}_ci_low"] <= truth[m] <= s[f"{m}_ci_high"]) for m in truth}


# ---------------------------------------------------------------------------------------------------
# Steady state on simulated Poisson loads
# ---------------------------------------------------------------------------------------------------

def poisson_samples(rng: np.random.Generator, rate: float, duration: float, drift: float = 0.0,
                    out_tok: int = 64, tpot: float = 0.02) -> dict[str, Any]:
    """Raw samples of a point: Poisson arrivals at `rate` (rising linearly by `drift` over the point),
    each request `out_tok` tokens, TTFT about 50 ms, TPOT about `tpot` s with jitter."""
    peak = rate * (1 + max(drift, 0.0))
    n = rng.poisson(peak * duration)
    t = np.sort(rng.uniform(0, duration, n))
    keep = rng.uniform(0, 1, n) < rate * (1 + drift * t / duration) / peak
    begin = t[keep]
    chunks = []
    for _ in begin:
        gaps = tpot * rng.gamma(4.0, 0.25, out_tok - 1)
        first = 0.05 * rng.gamma(4.0, 0.25)
        chunks.append(list(first + np.concatenate([[0.0], np.cumsum(gaps)])))
    end = begin + np.array([c[-1] for c in chunks]) if len(chunks) else np.zeros(0)
    return {"ok": [True] * len(begin), "begin": list(begin), "sent": list(begin), "end": list(end),
            "out_tok": [out_tok] * len(begin), "chunks": chunks}


def steady_flagged(rng: np.random.Generator, rate: float, duration: float, drift: float) -> bool | None:
    """Whether `steady_state` flags a simulated point (None: not judged, too short or too few requests)."""
    verdict = bench_stats.steady_state(poisson_samples(rng, rate, duration, drift))["steady_state"]
    return None if verdict is None else not verdict


STEADY_CASES = ((2.0, 30.0, 1), (5.0, 30.0, 1), (20.0, 30.0, 1), (100.0, 30.0, 1), (100.0, 60.0, 1), (100.0, 120.0, 2),
                (20.0, 300.0, 4), (100.0, 300.0, 8))  # req/s, s, reps divided by


# ---------------------------------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------------------------------

def rate(hits: int, n: int) -> dict[str, Any]:
    """A rate with its normal-approximation 95 % half-width."""
    p = hits / n if n else math.nan
    half = 1.96 * math.sqrt(p * (1 - p) / n) if n else math.nan
    return {"hits": hits, "n": n, "rate": p, "pm": half}


def measure(reps: int, steady_reps: int, seed: int, coverage_reps: int | None = None) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {"false_better_compare": [], "false_better_leader": [], "power": [], "coverage": [],
                           "steady": []}
    for runs in (3, 5):
        for spread in (0.01, 0.02, 0.05, 0.10):
            got = [compare_pair(rng, 0.0, runs, spread) for _ in range(reps)]
            for m in ("output_throughput", "p99_ttft_ms"):
                out["false_better_compare"].append({"runs": runs, "spread": spread, "metric": m,
                                                    **rate(sum(g[m] == "better" for g in got), reps)})
    for runs, k in ((5, 2), (5, 4)):
        for spread in (0.02, 0.05):
            hits = sum(leader_clear(rng, [1.0] * k, runs, spread) for _ in range(reps))
            out["false_better_leader"].append({"runs": runs, "configs": k, "spread": spread, **rate(hits, reps)})
    for runs, spread in ((5, 0.02), (3, 0.02), (5, 0.05)):
        got = [compare_pair(rng, 0.05, runs, spread)["output_throughput"] for _ in range(reps)]
        lead = sum(leader_clear(rng, [1.05, 1.0], runs, spread) for _ in range(reps))
        out["power"].append({"runs": runs, "spread": spread, "compare": rate(sum(g == "better" for g in got), reps),
                             "leader": rate(lead, reps)})
    for spread in (0.02, 0.10):
        truth = {"output_throughput": true_throughput(spread), "p99_ttft_ms": true_p99(spread)}
        for runs in (3, 5, 10):
            got = [coverage(rng, runs, spread, truth) for _ in range(coverage_reps or reps)]
            for m in truth:
                out["coverage"].append({"runs": runs, "spread": spread, "metric": m,
                                        **rate(sum(g[m] for g in got), len(got))})
    for drift in (0.0, 0.3):
        for r, duration, div in STEADY_CASES:
            got = [steady_flagged(rng, r, duration, drift) for _ in range(max(2, steady_reps // div))]
            judged = [g for g in got if g is not None]
            out["steady"].append({"req_per_s": r, "drift": drift, "duration_s": duration,
                                  **rate(sum(judged), len(judged)), "not_judged": len(got) - len(judged),
                                  "all": rate(sum(judged), len(got))})
    return out


def _pct(r: dict[str, Any]) -> str:
    return f"{100 * r['rate']:.1f} % ± {100 * r['pm']:.1f} ({r['hits']}/{r['n']})"


def markdown(res: dict[str, Any], reps: int, seconds: float) -> str:
    lines = [(f"{reps} simulated campaigns per row (coverage: the count shown); requests AR(1) correlated within "
              f"a run (phi {PHI}); {seconds:.0f} s on one core."), "",
             "| false \"better\" (`compare`, identical configs) | runs | spread | rate |", "|---|---|---|---|"]
    lines += [f"| {r['metric']} | {r['runs']} | {100 * r['spread']:.0f} % | {_pct(r)} |"
              for r in res["false_better_compare"]]
    lines += ["", "| false clear leader (conclusions, identical configs) | runs | spread | rate |", "|---|---|---|---|"]
    lines += [f"| {r['configs']} configs | {r['runs']} | {100 * r['spread']:.0f} % | {_pct(r)} |"
              for r in res["false_better_leader"]]
    lines += ["", "| power, true 5 % lead | runs | spread | `compare` says better | conclusions: clear leader |",
              "|---|---|---|---|---|"]
    lines += [f"| output_throughput | {r['runs']} | {100 * r['spread']:.0f} % | {_pct(r['compare'])} | "
              f"{_pct(r['leader'])} |" for r in res["power"]]
    lines += ["", "| coverage of the 95 % interval | runs | spread | coverage |", "|---|---|---|---|"]
    lines += [f"| {r['metric']} | {r['runs']} | {100 * r['spread']:.0f} % | {_pct(r)} |" for r in res["coverage"]]
    lines += ["", ("| steady state: flagged \"not steady\" | rate (req/s) | drift over the point | flagged, all "
                   "points | not judged (too few requests) | flagged among those judged |"),
              "|---|---|---|---|---|---|"]
    lines += [f"| Poisson, {r['duration_s']:.0f} s | {r['req_per_s']:g} | {100 * r['drift']:.0f} % | "
              f"{_pct(r['all'])} | {r['not_judged']} | {_pct(r) if r['n'] else '-'} |" for r in res["steady"]]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------
# bench.precision: sequential stopping on points of mixed noise (`--precision`)
# ---------------------------------------------------------------------------------------------------

PRECISION_CVS = (0.005, 0.01, 0.02, 0.03, 0.04)  # run-to-run spreads of the simulated points, one in five each


def fixed_runs_for(cv: float, width: float, confidence: float = 0.95) -> int:
    """Runs a fixed `runs:` needs so that a point of this true spread gets a t-interval this narrow (the
    spread known: what running every point to the noisiest one's need costs)."""
    from scipy import stats

    n = 2
    while stats.t.ppf(0.5 + confidence / 2, n - 1) * cv / math.sqrt(n) > width:
        n += 1
    return n


def sequential_point(rng: np.random.Generator, cv: float, spec: Any) -> list[float]:
    """One simulated point under bench.precision: its runs' output throughput until `decide` stops it."""
    from raysweep.maths.precision import decide

    values = [float(v) for v in rng.normal(THROUGHPUT, cv * THROUGHPUT, spec.min_runs)]
    while decide(values, len(values), spec).wants_more:
        values.append(float(rng.normal(THROUGHPUT, cv * THROUGHPUT)))
    return values


def measure_precision(reps: int, seed: int) -> dict[str, Any]:
    """Per stopping rule (stop at the first narrow interval, or at two successive ones as raysweep does) and
    noise level: mean runs, share that reached the width, coverage of the 95 % interval and of the interval
    the summary reports for the precision metric (`precision.reported_confidence`, raised for the looks)."""
    from raysweep.maths import precision
    from raysweep.maths.verdicts import mean_interval

    spec = precision.PrecisionSpec(metric="output_throughput", rel_half_width=0.03, min_runs=3, max_runs=12)
    fixed = fixed_runs_for(max(PRECISION_CVS), spec.rel_half_width)
    rows, keep = [], precision.CONFIRM_LOOKS
    try:
        for looks in (1, 2):
            precision.CONFIRM_LOOKS = looks
            rng = np.random.default_rng(seed)
            for cv in PRECISION_CVS:
                runs, covered, reported, reached = 0, 0, 0, 0
                for _ in range(reps):
                    values = sequential_point(rng, cv, spec)
                    _, low, high = mean_interval(values, spec.confidence)
                    runs += len(values)
                    covered += low <= THROUGHPUT <= high
                    reached += (high - low) / 2 / abs(float(np.mean(values))) <= spec.rel_half_width
                    _, low, high = mean_interval(values, precision.reported_confidence(spec))
                    reported += low <= THROUGHPUT <= high
                rows.append({"looks": looks, "cv": cv, "runs": runs / reps, "coverage": rate(covered, reps),
                             "reported": rate(reported, reps), "reached": reached / reps})
    finally:
        precision.CONFIRM_LOOKS = keep
    return {"spec": spec.model_dump(), "fixed_runs": fixed, "rows": rows, "reps": reps}


def precision_markdown(res: dict[str, Any], seconds: float) -> str:
    s, fixed = res["spec"], res["fixed_runs"]
    lines = [(f"bench.precision {{metric: output_throughput, rel_half_width: {s['rel_half_width']}, min_runs: "
              f"{s['min_runs']}, max_runs: {s['max_runs']}}}; {res['reps']} simulated points per row, run values "
              f"normal around their mean; `runs: {fixed}` is what the noisiest point "
              f"({100 * max(PRECISION_CVS):g} %) needs for the same width; {seconds:.0f} s on one core."), "",
             ("| stop after | run-to-run spread | runs (mean) | reached the width | coverage of the 95 % interval | "
              "coverage of the reported (97.5 %) interval |"), "|---|---|---|---|---|---|"]
    for r in res["rows"]:
        lines.append(f"| {r['looks']} narrow look(s) | {100 * r['cv']:g} % | {r['runs']:.2f} | "
                     f"{100 * r['reached']:.1f} % | {_pct(r['coverage'])} | {_pct(r['reported'])} |")
    lines += ["", (f"| stop after | runs, mixed points (mean) | saved against `runs: {fixed}` | interval | coverage, "
                   "mixed points | worst spread's coverage |"), "|---|---|---|---|---|---|"]
    for looks in (1, 2):
        rows = [r for r in res["rows"] if r["looks"] == looks]
        mean_runs = sum(r["runs"] for r in rows) / len(rows)
        for key, name in (("coverage", "95 %"), ("reported", "reported (97.5 %)")):
            hits = sum(r[key]["hits"] for r in rows)
            n = sum(r[key]["n"] for r in rows)
            worst = min(rows, key=lambda r: r[key]["rate"])
            lines.append(f"| {looks} narrow look(s) | {mean_runs:.2f} | {100 * (1 - mean_runs / fixed):.0f} % | "
                         f"{name} | {_pct(rate(hits, n))} | {100 * worst[key]['rate']:.1f} % at "
                         f"{100 * worst['cv']:g} % |")
    return "\n".join(lines) + "\n"


def report(stem: str, text: str, res: Any, dest: Path | None) -> int:
    """Print a simulation's table, and write it (`stem`.md) with its figures (`stem`.json) into `dest`."""
    print(text)
    if dest is not None:
        from raysweep.record.files import write_json_atomic, write_text_atomic

        write_text_atomic(dest / f"{stem}.md", text)
        write_json_atomic(dest / f"{stem}.json", res)
    return 0


def precision_main(reps: int, seed: int, dest: Path | None) -> int:
    start = time.monotonic()
    res = measure_precision(reps, seed)
    return report("precision", precision_markdown(res, time.monotonic() - start), res, dest)


def time_main(reps: int, seed: int, dest: Path | None) -> int:
    import verdicts_time

    start = time.monotonic()
    rows = verdicts_time.measure_time(reps, seed)
    text = verdicts_time.time_markdown(rows, reps, time.monotonic() - start)
    return report("verdicts_time", text, {"reps": reps, "seed": seed, "rows": rows}, dest)


def model_main(reps: int, seed: int, dest: Path | None) -> int:
    import os
    import subprocess

    import verdicts_model

    start = time.monotonic()
    rows = verdicts_model.measure(reps, seed)
    took = time.monotonic() - start
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT,
                            check=False).stdout.strip()
    note = (f", {time.strftime('%Y-%m-%d', time.gmtime())}, commit {commit or '?'}, load average "
            f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    text = verdicts_model.markdown(rows, reps, seed, took, note)
    return report("verdicts-model", text, {"reps": reps, "seed": seed, "commit": commit, "rows": rows}, dest)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--steady-reps", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="a few repetitions: checks that it runs")
    ap.add_argument("--out", type=Path, default=None, help="directory for verdicts.md and verdicts.json "
                    "(default: benchmarks/results, or nothing with --quick)")
    ap.add_argument("--precision", action="store_true", help="bench.precision's sequential stopping instead "
                    "(runs saved, coverage): writes precision.md and precision.json")
    ap.add_argument("--time", action="store_true", help="verdicts with time in the model instead (drift, order, "
                    "steps, instances, outliers, few runs, families, the slo, selection): writes verdicts_time.md "
                    "and verdicts_time.json")
    ap.add_argument("--model", action="store_true", help="the one model of a measurement (the server start as the "
                    "replicate) on whole simulated campaigns: writes verdicts-model.md and verdicts-model.json")
    args = ap.parse_args(argv)
    if args.model:
        return model_main(20 if args.quick else args.reps, args.seed if args.seed else 51,
                          args.out if args.out is not None else (None if args.quick else ROOT / "benchmarks"
                                                                 / "results"))
    if args.time:
        return time_main(40 if args.quick else 5 * args.reps, args.seed,
                         args.out if args.out is not None else (None if args.quick else ROOT / "benchmarks"
                                                                / "results"))
    if args.precision:
        return precision_main(20 if args.quick else 5 * args.reps, args.seed,
                              args.out if args.out is not None else (None if args.quick else ROOT / "benchmarks"
                                                                     / "results"))
    reps, steady_reps = (6, 4) if args.quick else (args.reps, args.steady_reps)
    start = time.monotonic()
    res = measure(reps, steady_reps, args.seed, None if args.quick else 3 * reps)
    dest = args.out if args.out is not None else (None if args.quick else ROOT / "benchmarks" / "results")
    return report("verdicts", markdown(res, reps, time.monotonic() - start), res, dest)


if __name__ == "__main__":
    raise SystemExit(main())

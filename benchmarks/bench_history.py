"""How often `raysweep history` flags a regression that is not there, and how often it finds one that is.

Simulated catalogues go through the real judging code: `catalog.history.history`, with the per-series,
per-campaign rows that its DuckDB query returns given directly (a stand-in `Catalog` whose `query` hands
them back; the query itself is tested in tests/test_catalog.py). Each series is one configuration measured
by two campaigns (the older one and the newest), R runs each; a run's throughput is
true_value x ratio x (1 + s x noise), with s the run-to-run spread and noise standard normal (or Student's t
with 3 degrees of freedom, scaled to unit variance: the outlier runs of a shared machine).

Measured, with `--margin` as a user gives it:
- at the margin: the newest campaign truly worse by exactly the margin (ratio 1 - margin), one series: how
  often it is called `worse`. This is the test's size: target at most 5 %.
- a family of unchanged series: 20 series, none changed, margin 0 (the strictest gate): how often
  `--fail-on-regression` exits 1 (any series `worse`). Target at most 5 % (the level is divided among the
  judged series).
- power: one series truly worse by 15 % (margin 5 %), alone and among 20 unchanged series.
- inside the margin: truly worse by 3 % with a 5 % margin: how often it is called `worse` (it must not be).

    .venv/bin/python benchmarks/bench_history.py [--reps 1000] [--seed 0] [--quick] [--out DIR]

Writes benchmarks/results/history.md and history.json (`--quick`: a few repetitions, nothing written unless
--out is given).
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

from bench_verdicts import report

from raysweep.catalog.history import KEY, history

TRUE = 1000.0  # output tokens/s of the older campaign


class FrameCatalog:
    """A stand-in for `Catalog`: `query` returns the rows `history`'s query would."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self.frame = frame

    def query(self, sql: str, params: list[Any] | None = None, only: Any = None) -> pd.DataFrame:
        return self.frame

    def select(self, **_: Any) -> None:
        return None


def _noise(rng: np.random.Generator, n: int, tails: str) -> np.ndarray:
    if tails == "t3":
        return rng.standard_t(3, n) / math.sqrt(3.0)  # unit variance
    return rng.standard_normal(n)


def catalogue(rng: np.random.Generator, ratios: list[float], runs: int, spread: float, tails: str) -> FrameCatalog:
    """One row per series and campaign: the older campaign at TRUE, the newest at TRUE x ratio."""
    rows = []
    for i, ratio in enumerate(ratios):
        key = {"model": "m", "server_settings": f"--max-num-seqs {i}", "workload": "w", "load_variable":
               "max_concurrency", "load_value": 8.0, "hardware": "h"}
        for c, (name, level) in enumerate((("older", TRUE), ("newest", TRUE * ratio))):
            vals = level * (1.0 + spread * _noise(rng, runs, tails))
            rows.append({**key, "campaign_id": name, "campaign": name, "date": 1.7e9 + c, "config": f"cfg{i}",
                         "dataset": "random", "input_len": "1024", "output_len": "128", "vllm": f"0.3{c}.0",
                         "raysweep": "1", "vals": list(np.maximum(vals, 1e-6))})
    return FrameCatalog(pd.DataFrame(rows, columns=[*KEY, "campaign_id", "campaign", "date", "config", "dataset",
                                                    "input_len", "output_len", "vllm", "raysweep", "vals"]))


def words(rng: np.random.Generator, ratios: list[float], runs: int, spread: float, margin: float,
          tails: str) -> list[str]:
    """The newest campaign's verdict in each series."""
    series = history(catalogue(rng, ratios, runs, spread, tails), "output_throughput", margin)  # type: ignore[arg-type]
    return [s.points[-1].word for s in series]


def rate(hits: int, n: int) -> dict[str, Any]:
    from scipy import stats

    ci = stats.binomtest(hits, n).proportion_ci(0.95, method="wilson")
    return {"hits": hits, "n": n, "rate": hits / n, "low": float(ci.low), "high": float(ci.high)}


SCENARIOS = (
    # name, ratios of the series, margin, what is counted, target
    ("at the margin (ratio 0.95, margin 5 %), one series", [0.95], 0.05, "worse", "at most 5 %"),
    ("20 unchanged series, margin 0: --fail-on-regression exits 1", [1.0] * 20, 0.0, "any worse", "at most 5 %"),
    ("20 unchanged series, margin 5 %: --fail-on-regression exits 1", [1.0] * 20, 0.05, "any worse", "at most 5 %"),
    ("inside the margin (ratio 0.97, margin 5 %), one series", [0.97], 0.05, "worse", "at most 5 %"),
    ("15 % worse (margin 5 %), one series", [0.85], 0.05, "worse", "power"),
    ("15 % worse (margin 5 %) among 19 unchanged series", [0.85] + [1.0] * 19, 0.05, "first worse", "power"),
    ("10 % worse (margin 5 %), one series", [0.90], 0.05, "worse", "power"),
)


def measure(reps: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {"reps": reps, "seed": seed, "rows": []}
    for tails in ("normal", "t3"):
        for runs, spread in ((5, 0.03), (10, 0.03), (5, 0.01)):
            for name, ratios, margin, counted, target in SCENARIOS:
                hits = 0
                for _ in range(reps):
                    w = words(rng, ratios, runs, spread, margin, tails)
                    if counted == "worse" or counted == "first worse":
                        hits += w[0] == "worse"
                    else:
                        hits += any(x == "worse" for x in w)
                out["rows"].append({"scenario": name, "tails": tails, "runs": runs, "spread": spread,
                                    "target": target, **rate(hits, reps)})
    return out


def markdown(res: dict[str, Any], seconds: float) -> str:
    lines = [f"# `raysweep history`: error rates and power, simulated ({res['reps']} repetitions per row, "
             f"seed {res['seed']}, {seconds:.0f} s)", "",
             "| scenario | run noise | runs a side | spread | called worse | 95 % interval | target |",
             "|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        lines.append(f"| {r['scenario']} | {r['tails']} | {r['runs']} | {r['spread']:.0%} | {r['rate']:.1%} | "
                     f"[{r['low']:.1%}, {r['high']:.1%}] | {r['target']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="a few repetitions: checks that it runs")
    ap.add_argument("--out", type=Path, default=None,
                    help="directory for history.md and history.json (default: benchmarks/results, or nothing "
                         "with --quick)")
    args = ap.parse_args(argv)
    reps = 5 if args.quick else args.reps
    start = time.monotonic()
    res = measure(reps, args.seed)
    dest = args.out if args.out is not None else (None if args.quick else ROOT / "benchmarks" / "results")
    return report("history", markdown(res, time.monotonic() - start), res, dest)


if __name__ == "__main__":
    raise SystemExit(main())

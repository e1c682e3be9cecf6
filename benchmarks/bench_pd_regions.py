"""How often the conclusions' P/D load regions name a leader wrongly, on simulated campaigns run through the
real code (`conclusions.conclude` and `conclusions.headlines`, whose line `Deployments by ...` comes from
`raysweep.results.pd_regions`).

Each simulated run of a point draws its output throughput as the point's true value times 1 + s * N(0, 1)
(the run-to-run spread s). Measured:
- false leaders: D deployments identical at every one of L loads; how often the line names a leader at any
  load (the whole line, all loads together: the family Holm controls). Target at most 5 %.
- wrong leaders and power: two deployments whose curves cross (the first 5 % ahead at the lower loads, the
  second 5 % ahead at the higher ones, equal at the middle load); per load where one is truly ahead, how
  often the line names it (power), and how often it names the other (wrong: target at most 5 %); at the
  middle load, how often it names either (false: at most 5 %).

    .venv/bin/python benchmarks/bench_pd_regions.py [--reps 400] [--quick] [--out benchmarks/results/pd_regions.md]
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from raysweep.results import conclusions  # noqa: E402

LOADS = (1, 2, 4, 8, 16)


def campaign(curves: dict[str, list[float]], runs: int, spread: float, rng: np.random.Generator) -> pd.DataFrame:
    """A results table: every deployment at every load of LOADS, `runs` runs each."""
    rows = []
    for cfg, curve in curves.items():
        for conc, true in zip(LOADS, curve, strict=True):
            for r in range(runs):
                rows.append({"serve_id": cfg, "bench_id": f"c{conc}", "point_id": f"{cfg}-{conc}-{r}",
                             "run_number": r, "serve_label": cfg, "bench_label": f"c={conc}",
                             "max_concurrency": conc, "gpu_count": 2,
                             "output_throughput": true * (1 + spread * rng.standard_normal()),
                             "completed": 100, "failed": 0, "client_limited": False, "validity_ok": True,
                             "validity_issues": "", "pd_ratio": cfg, "pd_connector": "NixlConnector"})
    return pd.DataFrame(rows)


def leaders(df: pd.DataFrame) -> dict[int, str]:
    """The leader the line names per load (loads where it names none are absent)."""
    c = conclusions.conclude(df, ["max_concurrency"], objective="output_throughput")
    line = next(ln for ln in conclusions.headlines(c) if ln.startswith("Deployments by"))
    body = line.split(": ", 1)[1].rsplit(" (Welch", 1)[0]
    out: dict[int, str] = {}
    for part in body.split("; "):
        m = re.fullmatch(r"(\d+)(?: to (\d+))?: (\S+) \(.*\) leads", part)
        if m:
            lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
            out.update({conc: m.group(3) for conc in LOADS if lo <= conc <= hi})
    return out


def null_rate(deployments: int, runs: int, spread: float, reps: int, rng: np.random.Generator) -> float:
    named = 0
    for _ in range(reps):
        curves = {f"{k + 1}P1D": [1000.0] * len(LOADS) for k in range(deployments)}
        named += bool(leaders(campaign(curves, runs, spread, rng)))
    return named / reps


def crossing(runs: int, spread: float, lead: float, reps: int, rng: np.random.Generator) -> dict[str, float]:
    a = [1000.0 * (1 + lead), 1000.0 * (1 + lead), 1000.0, 1000.0, 1000.0]
    b = [1000.0, 1000.0, 1000.0, 1000.0 * (1 + lead), 1000.0 * (1 + lead)]
    truth = {1: "1P1D", 2: "1P1D", 8: "2P1D", 16: "2P1D"}
    right = wrong = middle = 0
    for _ in range(reps):
        named = leaders(campaign({"1P1D": a, "2P1D": b}, runs, spread, rng))
        right += sum(named.get(conc) == who for conc, who in truth.items())
        wrong += sum(conc in named and named[conc] != who for conc, who in truth.items())
        middle += 4 in named
    n = reps * len(truth)
    return {"power": right / n, "wrong": wrong / n, "middle_named": middle / reps}


def _markdown(rows: list[dict[str, Any]]) -> str:
    cols = list(dict.fromkeys(k for r in rows for k in r))
    cell = [[f"{r[c]:.3f}" if isinstance(r.get(c), float) and c != "spread" else str(r.get(c, "")) for c in cols]
            for r in rows]
    return "\n".join(["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
                     + ["| " + " | ".join(c) + " |" for c in cell]) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--quick", action="store_true", help="a few repetitions, nothing written unless --out")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    reps = 5 if args.quick else args.reps
    rng = np.random.default_rng(20261129)
    t0 = time.monotonic()
    rows: list[dict[str, Any]] = []
    for deployments in (2, 3):
        for runs in (3, 5):
            rows.append({"case": f"null: {deployments} identical deployments x {len(LOADS)} loads",
                         "runs": runs, "spread": 0.02,
                         "false_leader_rate": null_rate(deployments, runs, 0.02, reps, rng)})
    for runs in (3, 5, 10):
        rows.append({"case": "crossing curves, 5 % leads", "runs": runs, "spread": 0.02,
                     **crossing(runs, 0.02, 0.05, reps, rng)})
    text = f"{reps} repetitions per row, {time.monotonic() - t0:.0f} s\n\n" + _markdown(rows)
    print(text)
    out = args.out or (None if args.quick else str(ROOT / "benchmarks" / "results" / "pd_regions.md"))
    if out:
        Path(out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

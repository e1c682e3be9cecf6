"""The one model of a measurement (`raysweep.maths.hierarchy`) proven on simulated campaigns, through the project's
own code path: each campaign is a results table (one row per run, with its server start and its place in the
machine's time) that `raysweep.results.conclusions.conclude` judges as a real campaign's (its summary by
`raysweep.results.aggregate.summarize`; the verdict is `ShapeVerdict.clear`, the green card; the interval is the
leader's, as the summary, the card and the answer show it).

The design under test: two configurations, `starts` server starts each in interleaved blocks (A B, B A, A B, ...),
`runs` runs per start one after another; run values are a level x the start's effect (lognormal, `between`) x
the machine's state at the run's slot x (1 + 2 % noise). Conditions (issue 51): start effects of 5 and 10 %,
machine drift of -0.5 and -1 % per slot, a -10 % step at a random moment, one server drifting -1 % per run, a
warm-up on every server (its first run 10 % slow), heavy-tailed run noise (Student's t on 3 degrees of freedom).
Measured per condition: false green between identical configurations, coverage of each configuration's steady
mean (its level times the machine's mean state over the campaign) by the leader's interval, and power for a
+15 % lead. The rule before (the runs as replicates, one start each) is measured beside it by the same code
(each configuration on one start).

    .venv/bin/python benchmarks/bench_verdicts.py --model [--reps 1000] [--seed 51]
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from raysweep.maths import hierarchy, over_time
from raysweep.results import aggregate, conclusions

LEVEL = 1000.0
AGREE = 20   # campaigns per row judged both by `conclude` and by the model's functions: they must agree
NOISE = 0.02


@dataclass(frozen=True)
class Condition:
    name: str
    between: float = 0.0          # start effects (sd of the log of a start's effect)
    drift: float = 0.0            # machine drift per slot (fraction)
    step: float = 0.0             # a step of the machine at a random slot
    server_drift: float = 0.0     # one server start (chosen at random) drifting per run
    warmup: float = 0.0           # the first run of every start this much slow
    heavy: bool = False           # run noise Student's t (3 df), scaled to the same sd


CONDITIONS = (
    Condition("start effects 5 %", between=0.05),
    Condition("start effects 10 %", between=0.10),
    Condition("machine drift -0.5 %/slot, start effects 5 %", between=0.05, drift=-0.005),
    Condition("machine drift -1 %/slot, start effects 5 %", between=0.05, drift=-0.01),
    Condition("-10 % step at a random moment, start effects 5 %", between=0.05, step=-0.10),
    Condition("one server drifting -1 %/run, start effects 5 %", between=0.05, server_drift=-0.01),
    Condition("a warm-up on every server (first run 10 % slow), start effects 5 %", between=0.05, warmup=0.10),
    Condition("heavy-tailed run noise (t, 3 df), start effects 5 %", between=0.05, heavy=True),
    Condition("no start effect (i.i.d. runs)"),
)


def campaign(rng: np.random.Generator, c: Condition, starts: int, runs: int, lead: float = 0.0,
             ) -> tuple[pd.DataFrame, dict[str, float]]:
    """One campaign's results table and each configuration's steady mean (its level x the machine's mean state
    over the campaign's slots, without warm-up)."""
    order = [("A", "B") if b % 2 == 0 else ("B", "A") for b in range(starts)]
    slots = 2 * starts * runs
    machine = 1.0 + c.drift * np.arange(slots)
    if c.step:
        machine = machine * np.where(np.arange(slots) >= rng.integers(1, slots), 1.0 + c.step, 1.0)
    drifting = rng.integers(0, 2 * starts) if c.server_drift else -1
    rows, t, start_no = [], 0, 0
    for b, pair in enumerate(order):
        for cfg in pair:
            effect = math.exp(c.between * rng.standard_normal())
            level = LEVEL * (1.0 + lead if cfg == "B" else 1.0)
            for j in range(runs):
                noise = (rng.standard_t(3) / math.sqrt(3.0) if c.heavy else rng.standard_normal()) * NOISE
                v = level * effect * machine[t] * (1.0 + noise)
                if start_no == drifting:
                    v *= 1.0 + c.server_drift * j
                if j == 0 and c.warmup:
                    v *= 1.0 - c.warmup
                rows.append({"serve_id": cfg, "bench_id": "c8", "point_id": f"{cfg}-{b}-{j}",
                             "run_number": b * runs + j, "serve_label": f"cfg={cfg}", "bench_label": "c=8",
                             "max_concurrency": 8, "gpu_count": 1,
                             "server_id": f"{cfg}-start{b}", "started_at": float(t), "output_throughput": v,
                             "validity_ok": True, "client_limited": False})
                t += 1
            start_no += 1
    mean_machine = float(machine.mean())
    return pd.DataFrame(rows), {"A": LEVEL * mean_machine, "B": LEVEL * (1.0 + lead) * mean_machine}


def judge_model(df: pd.DataFrame, truth: dict[str, float], warmup_alpha: float | None = None,
                ) -> tuple[bool, bool, str]:
    """`judge` by the model's own functions without the tables around them, in the summary's and the conclusions'
    order: the runs' trend and Grubbs' outlier run (`over_time`; a run left out is never green), the warm-up cut
    (`hierarchy.warmup`), the value and its interval (`hierarchy.estimates`, `interval`), the verdict
    (`hierarchy.compare`) and the difference of the sides' drifts that could have made it (`hierarchy.drift_apart`,
    `drift_could_decide`). The same answer
    (`measure` checks it on the first campaigns of every row), 100 times faster; `warmup_alpha`: the warm-up test's
    level (default: the model's)."""
    est, drift, left_out = {}, {}, False
    for cfg in ("A", "B"):
        mine = df[df["serve_id"] == cfg].sort_values("started_at", kind="stable")
        values = mine["output_throughput"].to_numpy(dtype=float)
        codes = pd.factorize(mine["server_id"])[0]
        ranks = np.arange(values.size, dtype=float)
        keep = np.ones(values.size, dtype=bool)
        if len(set(codes)) == 1 and not over_time.trend(values).drifts:   # Grubbs' rule: one server start's runs
            marks = over_time.outliers(values)
            if marks.count and values.size - marks.count >= 2:
                keep[marks.mask.index(True)] = False   # the outlier run, left out of the point whole
                left_out = True                         # a run left out: never green
        values, codes, ranks = values[keep], codes[keep], ranks[keep]
        runs = values.size
        warm = hierarchy.warmup(values, np.zeros(values.size), codes, np.zeros(values.size), ranks, 1,
                                hierarchy.WARMUP_ALPHA if warmup_alpha is None else warmup_alpha)
        values, codes, ranks = values[~warm.cut], codes[~warm.cut], ranks[~warm.cut]   # its warm-up, where shown
        m, se, dof, k, _ = hierarchy.estimates(values, np.zeros(values.size, dtype=int), codes, 1)
        est[cfg] = hierarchy.Estimate(float(m[0]), float(se[0]), float(dof[0]), int(k[0]), runs)
        trend: dict[str, np.ndarray] = {}
        aggregate._drift_per_metric(trend, values[:, None], np.zeros(values.size, dtype=int), ranks, 1, codes)
        drift[cfg] = (float(trend["drift_pct_per_run"][0, 0]), float(trend["drift_se"][0, 0]),
                      float(trend["drift_df"][0, 0]), runs)
    lead = "A" if est["A"].mean >= est["B"].mean else "B"
    other = "B" if lead == "A" else "A"
    v = hierarchy.compare(est[other], est[lead])
    (pa, sa, da, ra), (pb, sb, db, rb) = drift[lead], drift[other]
    apart = hierarchy.drift_apart(pa, sa, da, pb, sb, db, max(ra, rb))
    green = v.word == "better" and not left_out and not hierarchy.drift_could_decide(v, apart)
    low, high = est[lead].interval(conclusions.CONFIDENCE)
    return green, bool(max(low, 0.0) <= truth[lead] <= high), lead


def judge(df: pd.DataFrame, truth: dict[str, float]) -> tuple[bool, bool, str]:
    """Through the project's code: the green card (`ShapeVerdict.clear`), whether the leader's interval holds its
    configuration's steady mean, and the leader."""
    c = conclusions.conclude(df, [], objective="output_throughput")
    (v,) = c.verdicts
    low, high = float(v.leader["objective_ci_low"]), float(v.leader["objective_ci_high"])
    lead = str(v.leader["serve_id"])
    return bool(v.clear), bool(low <= truth[lead] <= high), lead


def _rate(hits: int, n: int) -> dict[str, Any]:
    p = hits / n if n else math.nan
    return {"hits": hits, "n": n, "rate": p, "half": 1.96 * math.sqrt(p * (1 - p) / n) if n else math.nan}


def measure(reps: int, seed: int, starts: int = 8, runs: int = 2, conditions: tuple[Condition, ...] = CONDITIONS,
            power_starts: tuple[int, ...] = (4, 6, 8, 10, 12), before: bool = True,
            agree: int = AGREE, power_design: int = 12) -> list[dict[str, Any]]:
    """Rows of (condition, measure, design, target, rate): false green and coverage per condition at the design
    (`starts` x `runs`), the rule before beside them, and power for +15 % with 10 % start effects per number of
    starts (the target at `power_design` starts: the fewest that reach it, at 2 runs per start)."""
    rng = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []
    design = f"{starts} starts x {runs} runs per configuration"

    def add(condition: str, what: str, how: str, target: str, r: dict[str, Any]) -> None:
        rows.append({"condition": condition, "measure": what, "design": how, "target": target, **r})

    for c in conditions:
        green = covered = 0
        old_green = 0
        for i in range(reps):
            df, truth = campaign(rng, c, starts, runs)
            g, k, _ = judge_model(df, truth)
            if i < agree:   # the fast path is the project's path: checked on the first campaigns of every row
                assert judge(df, truth) == (g, k, judge_model(df, truth)[2]), (c.name, i)
            green += g
            covered += k
            if before:
                old_green += _welch_green(df)
        add(c.name, "false green (identical configurations)", design, "<= 0.05", _rate(green, reps))
        add(c.name, "coverage of the leader's steady mean", design, ">= 0.93", _rate(covered, reps))
        if before:
            add(c.name, "false green (identical configurations)", "the rule before: runs as replicates (Welch)", "",
                _rate(old_green, reps))
    # what held before must still hold: i.i.d. runs, each on a start of its own, 5 a side
    iid = Condition("i.i.d. runs at 2 %, 5 starts x 1 run a side")
    for lead, what, target in ((0.0, "false green (identical configurations)", "<= 0.05"),
                               (0.05, "power, B 5 % ahead (green for B)", ">= 0.80")):
        hits = 0
        for _ in range(reps):
            df, truth = campaign(rng, iid, 5, 1, lead=lead)
            g, _, leader = judge_model(df, truth)
            hits += g and (lead == 0.0 or leader == "B")
        add(iid.name, what, "5 starts x 1 run per configuration", target, _rate(hits, reps))
    # the warm-up test's level: a cut chosen by the data moves the value away from the first runs it cut
    warm = next((x for x in conditions if x.warmup), None)
    for c in (warm, Condition("no start effect (i.i.d. runs)")) if warm else ():
        for alpha in (0.05, hierarchy.WARMUP_ALPHA):
            green = covered = 0
            for _ in range(reps):
                df, truth = campaign(rng, c, starts, runs)
                g, k, _ = judge_model(df, truth, alpha)
                green += g
                covered += k
            how = f"{design}, the warm-up test at {alpha:.1%}"
            add(c.name, "false green (identical configurations)", how, "", _rate(green, reps))
            add(c.name, "coverage of the leader's steady mean", how, "", _rate(covered, reps))
    ten = Condition("start effects 10 %", between=0.10)
    for k in power_starts:
        hits = 0
        for _ in range(reps):
            df, truth = campaign(rng, ten, k, runs, lead=0.15)
            g, _, lead = judge_model(df, truth)
            hits += g and lead == "B"
        add("start effects 10 %, B 15 % ahead", "power (green for B)", f"{k} starts x {runs} runs per configuration",
            ">= 0.80" if k == power_design else "", _rate(hits, reps))
    return rows


def _welch_green(df: pd.DataFrame) -> bool:
    """The rule before on the same runs: Welch's t over the runs of each configuration (the runs as replicates),
    the higher mean shown better at 5 %."""
    from raysweep.maths import verdicts

    a = df.loc[df["serve_id"] == "A", "output_throughput"].to_numpy()
    b = df.loc[df["serve_id"] == "B", "output_throughput"].to_numpy()
    return verdicts.compare_values(a, b).decided


def meets(row: dict[str, Any]) -> bool | None:
    """Whether a row meets its target with its simulation's own 95 % interval (None: no target)."""
    t = row["target"]
    if not t:
        return None
    op, bound = t.split()
    return row["rate"] - row["half"] <= float(bound) if op == "<=" else row["rate"] + row["half"] >= float(bound)


def markdown(rows: list[dict[str, Any]], reps: int, seed: int, seconds: float, note: str = "") -> str:
    head = (f"{reps} simulated campaigns per row, seed {seed}, {seconds:.0f} s{note}. Each campaign judged by "
            "`conclusions.conclude` (the summary, the verdict and the interval a real campaign gets); a target is "
            "met when the rate's 95 % interval reaches it.\n\n"
            "| condition | measure | design | rate | target | met |\n|---|---|---|---|---|---|\n")
    body = ""
    for r in rows:
        m = meets(r)
        said = "-" if m is None else "yes" if m else "no"
        body += (f"| {r['condition']} | {r['measure']} | {r['design']} | {100 * r['rate']:.1f} % "
                 f"± {100 * r['half']:.1f} ({r['hits']}/{r['n']}) | {r['target'] or '-'} | {said} |\n")
    return head + body


def run(reps: int, seed: int) -> tuple[list[dict[str, Any]], float]:
    t0 = time.perf_counter()
    rows = measure(reps, seed)
    return rows, time.perf_counter() - t0


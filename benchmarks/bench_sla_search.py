"""Probes of raysweep's SLA search (`sla.search`) against vLLM's historical rule (doubling + binary search).

Two parts. Each writes its own section of benchmarks/results/sla_search.md and keeps the other section.

- synthetic (default; pure Python, no server): monotone p99 latency curves of a closed-loop server with C
  slots. The latency grows gently up to C, then steeply: p99(c) = base * (1 + 0.5 min(x, 1) + k max(0, x-1)^a),
  x = min(c, N) / C, with N prompts per probe (a concurrency above N is unbounded load). The unbounded-load
  probe's capacity estimate comes from a burst of N prompts served in waves of C (Little's law: throughput x
  mean latency, which overestimates C when N > C, as with real servers that queue). Optional multiplicative
  log-normal noise has a fixed seed per (value, run), so a value run twice gives the same figure, and a re-check
  draws new runs. Each curve has three targets p99 <= p99(f C), with f drawn (per seed) in 0.3-0.7, 0.8-1.2 and
  1.25-1.8; they share probes. Curves: C = 2..20000, N/C = 2, 4, 10, a = 1, 2, noiseless and 5 % noise.
  Compared, per curve: raysweep's `search` with integer precision (hi - lo <= 1, the precision of vLLM's
  rule), raysweep's default 5 % relative precision, and vLLM's Generation A (reimplemented below from
  `serve_sla.py`). raysweep shares probes as its driver does (one run per distinct value; `known` gives the
  other targets' verdicts; `recheck` draws new runs); vLLM shares only identical values (its run files).
  A probe is one distinct value run (the unbounded probe included); "alone" is one target searched on its own.
- real (`--real`): one `vllm serve` on the CPU with the tiny dummy-weight model, driven by raysweep's native
  client without a campaign: concurrency 1..32 and the unbounded probe (no --max-concurrency), 16 prompts each,
  random 32 in / 16 out, temperature 0, prefix cache reset before each probe, `--reps` passes (the second one
  serves raysweep's re-checks). Both searches then replay on the measured table: a looked-up value is a probe,
  a client-limited run is unresolved for raysweep (as in its driver). Each `--targets` set (default: p90 TTFT
  <= 40, 80, 160 ms and p99 E2EL <= 120, 200, 300 ms) is replayed with its targets sharing probes.

    .venv/bin/python benchmarks/bench_sla_search.py [--seeds 10] [--json FILE]
    .venv/bin/python benchmarks/bench_sla_search.py --real [--reps 2] [--save FILE] [--targets "p90_ttft_ms<=40,..."]
    .venv/bin/python benchmarks/bench_sla_search.py --replay FILE [--targets ...]   # a table saved with --save
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servers import ENV, start_server, stop_server  # benchmarks/servers.py

from raysweep.sla import search as sla
from raysweep.sla.search import INFINITE, Verdict

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "results" / "sla_search.md"
VLLM_INF = 65536                 # vLLM's "infinite" value of the load variable
RS_PRECISION = {"rs-exact": 0.0, "rs-5%": 0.05}  # raysweep: integer bisection to hi - lo <= 1; the default 5 %
FRACTIONS = ((0.3, 0.7), (0.8, 1.2), (1.25, 1.8))  # the targets' boundaries, drawn in these ranges of C
RATIOS = (2, 4, 10)              # prompts per probe / C
CAPACITIES = (2, 3, 5, 8, 13, 32, 100, 300, 1000, 4000, 20000)
MAX_PROMPTS = 60000              # below VLLM_INF, so vLLM's 65536 is unbounded load as well


# ---------------------------------------------------------------------------------------------------
# The two search rules, on any `measure(value, rep) -> result` and per-target `meets(result) -> bool`
# ---------------------------------------------------------------------------------------------------

Measure = Callable[[float, int], Any]
Meets = Callable[[Any], bool]


@dataclass
class Answer:
    """One target's search: the answer, raysweep's state, and the values this target asked for."""

    value: float | None         # None: no value meets the target; inf: unbounded load meets it
    state: str
    asked: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class Probes:
    """Runs shared the way each tool shares them: one run per distinct (value, rep); counted."""

    def __init__(self, measure: Measure, unbounded_from: float | None = None) -> None:
        self.measure, self.unbounded_from = measure, unbounded_from
        self.runs: dict[tuple[float, int], Any] = {}

    def get(self, value: float, rep: int = 0) -> Any:
        if self.unbounded_from is not None and value >= self.unbounded_from:
            value = INFINITE  # a concurrency >= the prompts of a probe is the unbounded probe: no new run
        if (value, rep) not in self.runs:
            self.runs[(value, rep)] = self.measure(value, rep)
        return self.runs[(value, rep)]

    @property
    def count(self) -> int:
        return len(self.runs)


def raysweep_search(probes: Probes, meets: Meets, estimate: Callable[[], float], precision: float) -> Answer:
    """raysweep's `sla.search`, wired as its driver wires it (shared runs, `known`, re-check with new runs)."""

    def verdict(value: float, rep: int = 0) -> Verdict:
        result = probes.get(value, rep)
        if isinstance(result, dict) and result.get("client_limited"):
            return Verdict.UNRESOLVED  # the driver's rule: a probe the client limited decides nothing
        return Verdict.PASS if meets(result) else Verdict.FAIL

    out = sla.search(verdict, start=1.0, max_value=float(VLLM_INF), precision=precision, integer=True,
                     estimate=estimate, recheck=lambda v: verdict(v, 1),
                     known=lambda: {v: verdict(v) for (v, rep) in list(probes.runs) if rep == 0})
    value = out.largest_pass if out.state in ("found", "above max", "unresolved") else None
    return Answer(value, out.state, list(out.probes), list(out.notes))


def vllm_search(probes: Probes, meets: Meets, estimate: Callable[[], float]) -> Answer:
    """vLLM's Generation A (`serve_sla.py` @ 79bf4ccf): probe 65536, init = ceil(estimate), double from init
    while passing (stop at >= 65536), then `val = (left + right) // 2` until right - left <= 1 and left was
    measured by the binary search. The answer is `left`; 0 when no value passed."""
    asked: list[float] = []

    def passes(value: int) -> bool:
        asked.append(value)
        return meets(probes.get(value))   # the run file of that value, whichever target ran it

    passes(VLLM_INF)
    history: dict[int, bool] = {}
    val = math.ceil(estimate())
    while True:
        history[val] = passes(val)
        if not history[val]:
            break
        val *= 2
        if val >= VLLM_INF:
            break
    left = max((v for v, ok in history.items() if ok), default=0)
    right = min((v for v, ok in history.items() if not ok), default=VLLM_INF)
    seen: dict[int, bool] = {}
    for _ in range(200):
        val = (left + right) // 2
        seen[val] = passes(val)
        left, right = (val, right) if seen[val] else (left, val)
        if right - left <= 1 and left in seen:
            break
    else:
        raise RuntimeError("vLLM's binary search did not end")
    return Answer(float(left) if left > 0 else None, "found", asked)


TOOLS = ("rs-exact", "rs-5%", "vllm")
# a variant of rs-exact, not a tool: the driver reading any concurrency >= the probe's prompt count from the
# unbounded probe (the same load) instead of running it again
VARIANT = "rs-exact, >=N from unbounded"


def run_tool(tool: str, measure: Measure, targets: list[Meets], estimate: Callable[[Probes], float],
             prompts: float | None = None) -> dict[str, Any]:
    """Every target alone (fresh runs) and all together, in order (runs shared); answers and probe counts."""

    def one(probes: Probes, meets: Meets) -> Answer:
        def est() -> float:  # from the unbounded probe's run, as the tools do
            return estimate(probes)

        if tool == "vllm":
            return vllm_search(probes, meets, est)
        return raysweep_search(probes, meets, est, RS_PRECISION.get(tool, 0.0))

    def fresh() -> Probes:
        return Probes(measure, prompts if tool == VARIANT else None)

    alone = []
    for t in targets:
        p = fresh()
        one(p, t)
        alone.append(p.count)
    shared = fresh()
    answers = [one(shared, t) for t in targets]
    return {"answers": answers, "alone": alone, "together": shared.count, "runs": shared.runs}


# ---------------------------------------------------------------------------------------------------
# Synthetic curves
# ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Curve:
    capacity: int        # C: slots of the closed-loop server; the knee of the curve
    prompts: int         # N per probe: a concurrency above N is unbounded load
    shape: float         # a: exponent of the rise above C
    noise: float = 0.0   # sigma of the multiplicative log-normal noise
    seed: int = 1
    steep: float = 4.0   # k
    base_ms: float = 100.0

    @property
    def name(self) -> str:
        return (f"C={self.capacity} N/C={self.prompts / self.capacity:g} a={self.shape:g}"
                + (f" noise={self.noise:.0%}" if self.noise else "") + f" s{self.seed}")

    def load(self, value: float) -> float:
        """The requests in flight: unbounded load (inf, 65536, vLLM's 0) is all N prompts."""
        return float(self.prompts) if value <= 0 or value >= self.prompts else value

    def p99(self, value: float) -> float:
        x = self.load(value) / self.capacity
        return self.base_ms * (1 + 0.5 * min(x, 1.0) + self.steep * max(0.0, x - 1) ** self.shape)

    def measure(self, value: float, rep: int) -> float:
        if not self.noise:
            return self.p99(value)
        z = random.Random(f"{self.seed}/{self.capacity}/{self.prompts}/{self.shape}/{value}/{rep}").gauss(0, 1)
        return self.p99(value) * math.exp(self.noise * z)

    def fractions(self) -> list[float]:
        """Where the three targets' boundaries lie, as fractions of C (drawn with the curve's seed)."""
        rng = random.Random(f"targets/{self.seed}/{self.capacity}/{self.prompts}/{self.shape}")
        return [rng.uniform(lo, hi) for lo, hi in FRACTIONS]

    def estimate(self) -> float:
        """Little's law on the unbounded probe: N prompts at once, served in waves of C of equal length T;
        throughput N / (W T), mean latency T sum(j n_j) / N, so the product is sum(j n_j) / W."""
        waves = math.ceil(self.prompts / self.capacity)
        sizes = [min(self.capacity, self.prompts - j * self.capacity) for j in range(waves)]
        return sum((j + 1) * n for j, n in enumerate(sizes)) / waves

    def boundary(self, bound: float) -> float | None:
        """The true answer on the noiseless curve: the largest concurrency meeting `bound`."""
        if self.p99(self.prompts) <= bound:
            return INFINITE
        if self.p99(1) > bound:
            return None
        lo, hi = 1, self.prompts  # p99(lo) meets it, p99(hi) does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.p99(mid) <= bound else (lo, mid)
        return float(lo)


def curves(seeds: int) -> list[Curve]:
    return [Curve(cap, min(ratio * cap, MAX_PROMPTS), shape, noise, seed)
            for noise in (0.0, 0.05) for cap in CAPACITIES for ratio in RATIOS for shape in (1.0, 2.0)
            for seed in range(1, seeds + 1)]


def same(answer: float | None, truth: float | None, prompts: float) -> bool:
    """Equal answers; any value at or above N is unbounded load."""
    norm = [None if v is None else (INFINITE if v >= prompts else v) for v in (answer, truth)]
    return norm[0] == norm[1]


def synthetic_case(curve: Curve, bounds: list[float] | None = None) -> dict[str, Any]:
    bounds = bounds or [curve.p99(f * curve.capacity) for f in curve.fractions()]
    truth = [curve.boundary(b) for b in bounds]
    row: dict[str, Any] = {"curve": curve.name, "capacity": curve.capacity, "prompts": curve.prompts,
                           "noise": curve.noise, "seed": curve.seed, "estimate": curve.estimate(),
                           "bounds": bounds, "truth": truth}
    for tool in (*TOOLS, VARIANT):
        got = run_tool(tool, curve.measure, [lambda m, b=b: m <= b for b in bounds], lambda p: curve.estimate(),
                       curve.prompts)
        ans = []
        for a, b, t in zip(got["answers"], bounds, truth):
            v = a.value
            measured = v is None or got["runs"].get((v, 0), curve.measure(v, 0)) <= b  # the tool's own view
            finite = not (v is None or t is None or math.isinf(v) or math.isinf(t))
            ans.append({"value": v, "state": a.state, "exact": same(v, t, curve.prompts),
                        "true_pass": v is None or curve.p99(v) <= b,        # None: claims nothing passes
                        "measured_pass": measured,
                        "error": abs(v - t) / t if finite else (0.0 if same(v, t, curve.prompts) else 1.0)})
        row[tool] = {"answers": ans, "alone": got["alone"], "together": got["together"]}
    return row


def fmt_value(v: float | None) -> str:
    return "none" if v is None else ("unbounded" if math.isinf(v) else f"{v:g}")


def ranges(values: list[int]) -> str:
    """1, 2, 3, 5 -> '1-3, 5'."""
    out: list[str] = []
    for v in values:
        if out and v == int(out[-1].split("-")[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{v}"
        else:
            out.append(str(v))
    return ", ".join(out)


def short_list(values: list[float], keep: int = 10) -> str:
    shown = ", ".join(fmt_value(v) for v in values[:keep])
    return shown + (f", ... ({len(values)} in all)" if len(values) > keep else "")


def fmt_answer(a: dict[str, Any]) -> str:
    s = fmt_value(a["value"])
    if a["value"] is not None and not a["true_pass"]:
        s += " ✗"       # fails the target on the noiseless curve
    elif not a["exact"]:
        s += " ≠"       # passes, but is not the true boundary
    if a["state"] not in ("found", "above max", "never met"):
        s += f" ({a['state']})"
    return s


def synthetic_table(rows: list[dict[str, Any]]) -> str:
    head = ("| curve | est. | true boundary | rs-exact | rs-5% | vLLM | probes alone rs-exact / rs-5% / vLLM "
            "| probes together rs-exact / rs-5% / vLLM |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        answers = [" / ".join(fmt_answer(a) for a in r[t]["answers"]) for t in TOOLS]
        alone = " / ".join("+".join(str(n) for n in r[t]["alone"]) for t in TOOLS)
        together = " / ".join(str(r[t]["together"]) for t in TOOLS)
        lines.append(f"| {r['curve']} | {r['estimate']:.4g} | {' / '.join(fmt_value(t) for t in r['truth'])} "
                     f"| {' | '.join(answers)} | {alone} | {together} |")
    return "\n".join(lines)


def spread(values: list[float], digits: int = 2) -> str:
    return (f"{statistics.median(values):.{digits}f} [{min(values):.{digits}f}, {max(values):.{digits}f}]"
            if values else "-")


def summary(rows: list[dict[str, Any]]) -> str:
    """Per tool: probes per target alone and all targets together, ratios to vLLM, answers' quality."""
    head = ("| tool | probes per target alone, median | 3 targets together, median | together / vLLM, median "
            "[min, max] | alone / vLLM (sum of 3) | together / sum alone | curves with no more probes than vLLM "
            "(every target alone; together) | exact answers | above the true boundary | own probe fails (oob) "
            "| mean abs. error | unresolved |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for tool in (*TOOLS, VARIANT):
        per_target = [n for r in rows for n in r[tool]["alone"]]
        together = [r[tool]["together"] for r in rows]
        ratio_t = [r[tool]["together"] / r["vllm"]["together"] for r in rows]
        ratio_a = [sum(r[tool]["alone"]) / sum(r["vllm"]["alone"]) for r in rows]
        share = [r[tool]["together"] / sum(r[tool]["alone"]) for r in rows]
        le_a = sum(all(a <= v for a, v in zip(r[tool]["alone"], r["vllm"]["alone"])) for r in rows)
        le_t = sum(r[tool]["together"] <= r["vllm"]["together"] for r in rows)
        ans = [a for r in rows for a in r[tool]["answers"]]
        lines.append(
            f"| {tool} | {statistics.median(per_target):g} | {statistics.median(together):g} | {spread(ratio_t)} "
            f"| {spread(ratio_a)} | {spread(share)} | {le_a}/{len(rows)}; {le_t}/{len(rows)} "
            f"| {sum(a['exact'] for a in ans)}/{len(ans)} | {sum(not a['true_pass'] for a in ans)} "
            f"| {sum(not a['measured_pass'] for a in ans)} | {statistics.mean(a['error'] for a in ans):.2%} "
            f"| {sum(a['state'] == 'unresolved' for a in ans)} |")
    return "\n".join(lines)


def edge_rows() -> list[dict[str, Any]]:
    """A curve with a target no load meets, one in the middle, one that unbounded load meets."""
    c = Curve(8, 32, 1.0)
    return [synthetic_case(c, [0.9 * c.p99(1), c.p99(8), 1.01 * c.p99(c.prompts)])]


def synthetic(seeds: int) -> tuple[str, dict[str, Any]]:
    t0 = time.perf_counter()
    rows = [synthetic_case(c) for c in curves(seeds)]
    edge = edge_rows()
    elapsed = time.perf_counter() - t0
    clean = [r for r in rows if not r["noise"]]
    noisy = [r for r in rows if r["noise"]]
    shown = [r for r in rows if r["seed"] == 1]
    text = "\n\n".join([
        (f"### Synthetic curves ({len(clean) // seeds} curves x {seeds} seeds, noiseless and with 5 % noise; "
         f"{elapsed:.1f} s)"),
        ("Targets: three per curve, boundaries drawn in 0.3-0.7, 0.8-1.2 and 1.25-1.8 of C. A probe is a distinct "
         "value run (the unbounded probe and re-checks included). \"above the true boundary\": the answer fails "
         "the target on the noiseless curve; \"own probe fails\": the tool's own measurement at its answer fails "
         f"(vLLM's \"oob\"). `{VARIANT}`: rs-exact with every concurrency at or above the probe's prompt count "
         "read from the unbounded probe (the same load), which the driver does not do today."),
        "#### Summary, noiseless curves", summary(clean),
        "#### Summary, 5 % noise", summary(noisy),
        "#### Edge: targets never met / met in the middle / met at unbounded load (C=8, N=32)",
        synthetic_table(edge),
        "#### Every curve, seed 1",
        ("Answers per target. ✗: fails the target on the noiseless curve; ≠: passes but is not the true boundary. "
         "Probes alone: each target searched on its own (a+b+c)."), synthetic_table(shown),
    ])
    return text, {"rows": rows, "edge": edge}


# ---------------------------------------------------------------------------------------------------
# The real CPU server
# ---------------------------------------------------------------------------------------------------

PORT = 18731
MODEL = Path("/tmp/rsb-sla-model")
KEYS = ("p90_ttft_ms", "p99_e2el_ms", "mean_e2el_ms", "request_throughput", "completed")


def start_vllm(url: str, log: Path, timeout: float = 400) -> subprocess.Popen:
    return start_server([str(REPO / ".venv" / "bin" / "vllm"), "serve", str(MODEL), "--load-format", "dummy",
                         "--max-model-len", "512", "--dtype", "bfloat16", "--max-num-seqs", "8", "--host",
                         "127.0.0.1", "--port", str(PORT)], url, timeout, log)


def reset_cache(url: str) -> None:
    body = urllib.request.urlopen(urllib.request.Request(url + "/reset_prefix_cache", method="POST"), timeout=30).read()
    if b"false" in body:
        print(f"prefix cache reset refused: {body!r}", file=sys.stderr)


def measure_real(reps: int) -> dict[str, Any]:
    """The measured table: {"inf" | "1".."32": [result of each rep]}."""
    import ray

    from raysweep.bench.native import NativeBench

    url = f"http://127.0.0.1:{PORT}"
    ray_tmp = Path(f"/tmp/rs-sla{os.getpid()}")
    made_model = not MODEL.exists()
    if made_model:
        subprocess.run([str(REPO / ".venv" / "bin" / "raysweep"), "tiny-model", str(MODEL)], env=ENV, check=True,
                       stdout=subprocess.DEVNULL)
    log = Path(f"/tmp/rsb-sla-vllm{os.getpid()}.log")
    t0 = time.monotonic()
    server = start_vllm(url, log)
    ready_s = time.monotonic() - t0
    table: dict[str, list[dict[str, Any]]] = {}
    try:
        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, _temp_dir=str(ray_tmp))
        nb = NativeBench(cpus=0.5)
        try:
            def run(conc: int | None) -> dict[str, Any]:
                argv = ["vllm", "bench", "serve", "--model", str(MODEL), "--dataset-name", "random", "--num-prompts",
                        "16", "--random-input-len", "32", "--random-output-len", "16", "--temperature", "0"]
                if conc is not None:
                    argv += ["--max-concurrency", str(conc)]
                reset_cache(url)
                job = nb.submit(argv, url, str(MODEL))
                res = nb.finish(job, ray.get(job.refs))["result"]
                return {k: res.get(k) for k in (*KEYS, "client_limited")}

            run(None)  # warm the server and the client actor; not recorded
            for _ in range(reps):
                for conc in (None, *range(1, 33)):
                    table.setdefault("inf" if conc is None else str(conc), []).append(run(conc))
        finally:
            nb.close()
            ray.shutdown()
    finally:
        stop_server(server)
        shutil.rmtree(ray_tmp, ignore_errors=True)
        log.unlink(missing_ok=True)
        if made_model:
            shutil.rmtree(MODEL, ignore_errors=True)
    return {"date": time.strftime("%Y-%m-%d"), "server_ready_s": ready_s, "reps": reps, "table": table}


DEFAULT_TARGETS = ("p90_ttft_ms<=40,p90_ttft_ms<=80,p90_ttft_ms<=160",
                   "p99_e2el_ms<=120,p99_e2el_ms<=200,p99_e2el_ms<=300")
_TARGET = re.compile(r"^\s*([a-z0-9_]+)\s*<=\s*([0-9.]+)\s*$")


def parse_target_list(text: str) -> list[tuple[str, float]]:
    out = []
    for part in text.split(","):
        m = _TARGET.match(part)
        if not m:
            raise SystemExit(f"target {part!r} is not METRIC<=NUMBER")
        out.append((m.group(1), float(m.group(2))))
    return out


def measured_table(data: dict[str, Any]) -> str:
    """The measured table (first pass; the second pass's latencies beside it) and the capacity estimate."""
    table = data["table"]
    inf_row = table["inf"][0]
    capacity = float(inf_row["request_throughput"]) * float(inf_row["mean_e2el_ms"]) / 1000.0
    head = ["concurrency", *KEYS]
    lines = ["| " + " | ".join(head) + (" | rep 2 p90_ttft_ms | rep 2 p99_e2el_ms |" if data["reps"] > 1 else " |"),
             "|" + "---|" * (len(head) + (2 if data["reps"] > 1 else 0))]
    for key in ["inf", *sorted((k for k in table if k != "inf"), key=int)]:
        r = table[key][0]
        cells = [f"{float(r[k]):.1f}" if isinstance(r[k], float) else str(r[k]) for k in KEYS]
        extra = ([f"{float(table[key][1]['p90_ttft_ms']):.1f}", f"{float(table[key][1]['p99_e2el_ms']):.1f}"]
                 if data["reps"] > 1 else [])
        limited = " (client-limited)" if r.get("client_limited") else ""
        lines.append("| " + " | ".join(["unbounded" if key == "inf" else key + limited, *cells, *extra]) + " |")
    limited = [f"{k} (pass {i + 1})" for k, runs in table.items() for i, r in enumerate(runs)
               if r.get("client_limited")]
    return ("\n".join(lines) + f"\n\nUnbounded probe: Little's-law capacity {capacity:.2f} (throughput x mean e2el); "
            f"server ready in {data['server_ready_s']:.0f} s; client-limited runs (raysweep judges them unresolved): "
            f"{', '.join(limited) or 'none'}.")


def replay(data: dict[str, Any], targets: list[tuple[str, float]]) -> str:
    """Both searches on the measured table; every target shares the probes (runs do not depend on the metric)."""
    table = data["table"]
    top = max(int(k) for k in table if k != "inf")

    def row(value: float, rep: int) -> dict[str, Any]:
        key = "inf" if (value <= 0 or value > top) else str(int(value))  # 0: vLLM's old unbounded; > 32: unbounded
        runs = table[key]
        return runs[min(rep, len(runs) - 1)]

    inf_row = table["inf"][0]
    capacity = float(inf_row["request_throughput"]) * float(inf_row["mean_e2el_ms"]) / 1000.0
    parts = []
    res_head = ("| target | concurrencies meeting it (pass 1) | rs-exact answer (state) | rs-5% answer (state) "
                f"| vLLM answer | probes alone rs-exact / rs-5% / vLLM / {VARIANT} | values asked (rs-exact; vLLM) |")
    res = [res_head, "|" + "---|" * (res_head.count("|") - 1)]
    tools = (*TOOLS, VARIANT)
    checks: list[Meets] = [lambda r, m=m, b=b: float(r[m]) <= b for m, b in targets]
    prompts = float(inf_row["completed"])
    got = {t: run_tool(t, row, checks, lambda p: capacity, prompts) for t in tools}
    for i, (metric, b) in enumerate(targets):
        answers = []
        for tool in TOOLS:
            a = got[tool]["answers"][i]
            ok = a.value is None or checks[i](row(a.value, 0))
            answers.append(fmt_value(a.value) + ("" if ok else " ✗") + (f" ({a.state})" if tool != "vllm" else ""))
        asked = "; ".join(short_list(got[t]["answers"][i].asked) for t in ("rs-exact", "vllm"))
        meeting = ranges([c for c in range(1, top + 1) if checks[i](row(c, 0))]) + (
            ", unbounded" if checks[i](row(INFINITE, 0)) else "")
        res.append(f"| {metric}<={b:g} | {meeting or 'none'} | {' | '.join(answers)} "
                   f"| {' / '.join(str(got[t]['alone'][i]) for t in tools)} | {asked} |")
    res.append(f"| all {len(targets)} together | | | | | "
               f"{' / '.join(str(got[t]['together']) for t in tools)} | |")
    parts.append("\n".join(res))
    notes = sorted({f"{metric}<={b:g}: {n}" for t in TOOLS if t != "vllm"
                    for (metric, b), a in zip(targets, got[t]["answers"]) for n in a.notes})
    if notes:
        parts.append("raysweep's notes (targets together): " + "; ".join(notes) + ".")
    parts.append("A probe is a distinct value looked up (the unbounded probe and re-checks included); the targets "
                 "share probes as each tool shares them. ✗: the answer's own measurement fails the target. "
                 f"`{VARIANT}`: values at or above the prompt count ({prompts:g}) read from the unbounded probe.")
    return "\n\n".join(parts)


# ---------------------------------------------------------------------------------------------------

def write_section(name: str, text: str) -> None:
    """Replace this part's section of the report, keeping the other part's."""
    begin, end = f"<!-- {name} -->", f"<!-- /{name} -->"
    old = OUT.read_text() if OUT.exists() else "# SLA search: raysweep vs vLLM's doubling + binary search\n"
    block = f"{begin}\n{text}\n{end}"
    if begin in old and end in old:
        new = old[:old.index(begin)] + block + old[old.index(end) + len(end):]
    else:
        new = old.rstrip("\n") + "\n\n" + block + "\n"
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(new)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=10, help="seeds per synthetic curve (target positions and noise)")
    ap.add_argument("--real", action="store_true", help="measure the real CPU server (minutes), then replay")
    ap.add_argument("--reps", type=int, default=2, help="--real: passes over the concurrency values")
    ap.add_argument("--save", type=Path, metavar="FILE", help="--real: also write the measured table to FILE")
    ap.add_argument("--replay", type=Path, metavar="FILE", help="replay a table saved with --save")
    ap.add_argument("--targets", action="append", metavar="LIST",
                    help="a set of the real part's targets, comma-separated METRIC<=NUMBER; repeat for more sets "
                         f"(default: {' and '.join(DEFAULT_TARGETS)})")
    ap.add_argument("--json", type=Path, metavar="FILE", help="synthetic: also write every figure to FILE")
    args = ap.parse_args()
    if args.real or args.replay:
        data = json.loads(args.replay.read_text()) if args.replay else measure_real(args.reps)
        if args.save:
            args.save.write_text(json.dumps(data, indent=1) + "\n")
        text = (f"## Real CPU server ({data['date']})\n\nOne `vllm serve` (tiny dummy-weight Llama, CPU, "
                f"--max-num-seqs 8), raysweep's native client, 16 prompts per probe, random 32 in / 16 out, "
                f"temperature 0, prefix cache reset before each probe; {data['reps']} pass(es) over unbounded, "
                f"1..32. Concurrency above 32 (and vLLM's 0) is looked up as the unbounded probe.\n\n"
                + measured_table(data) + "".join(f"\n\n### Targets {t}\n\n" + replay(data, parse_target_list(t))
                                                 for t in (args.targets or DEFAULT_TARGETS)))
        write_section("real", text)
    else:
        body, figures = synthetic(args.seeds)
        text = f"## Synthetic ({time.strftime('%Y-%m-%d')})\n\n{body}"
        write_section("synthetic", text)
        if args.json:
            args.json.write_text(json.dumps(figures, indent=1, default=lambda o: o.__dict__) + "\n")
    print(text)


if __name__ == "__main__":
    main()

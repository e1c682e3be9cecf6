"""`raysweep crosscheck`: the native client and `vllm bench serve` on the same running server.

One server configuration of a campaign is started the way a campaign starts it (placement group, host
actor(s), `vllm serve`, readiness), or an already running server is given by URL. Then, for each chosen
bench point, the two clients take turns N times each, the first of a round alternating (native, vllm, then
vllm, native, ...: a drift of the server's pace, or a cost of going first after the reset, falls on both
alike), with the caches reset before every run, both in Ray actors and with the campaign's own bench
command and parameters.
Each judged metric is an equivalence test on the runs, in pairs: the two clients' runs of one round were
measured one after the other, so the ratio native / vllm is the geometric mean of the rounds' ratios with
its 90 % interval from the t on their logarithms (`over_time.paired_equivalence`: the two one-sided tests
at 5 %; a drift of the server's pace falls out of every round), or with fewer than 3 complete rounds the
ratio of the clients' geometric means over their runs unpaired (`verdicts.equivalence`, Welch),
`equivalent` only when the whole interval lies within the tolerance
(throughputs 5 %, median TTFT and TPOT 10 % by default), `different` when it lies wholly outside, `not shown`
otherwise, with the runs per client that would settle it at the spread seen. One slow run no longer decides:
it widens the interval.

The comparison itself (`compare`, `verdict`, `markdown`) is plain Python; `run_crosscheck` needs Ray.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from raysweep.errors import UserError
from raysweep.maths import verdicts

if TYPE_CHECKING:
    from raysweep.bench.backend import BenchBackend
    from raysweep.campaign import CampaignSpec
    from raysweep.drive.config_life import ConfigLife
    from raysweep.place.placement import NodeInfo
    from raysweep.plan.plan import BenchPoint, Plan, PointRun, ServeConfig
    from raysweep.serve.live_server import ConfigRun, Server

__all__ = ["CompareRow", "JUDGED", "METRICS", "Tolerances", "compare", "markdown", "round_order", "run_crosscheck",
           "select", "verdict"]

log = logging.getLogger(__name__)

THROUGHPUTS = ("output_throughput", "request_throughput")
LATENCIES = ("median_ttft_ms", "median_tpot_ms")
JUDGED = THROUGHPUTS + LATENCIES
# client_cpu_s: CPU seconds the client took over the load (its cores are the server's on a shared machine);
# mean TTFT as the client and as the server timed it: their difference is the wire and the client
METRICS = JUDGED + ("median_itl_ms", "median_e2el_ms", "total_input_tokens", "total_output_tokens", "client_cpu_s",
                    "mean_ttft_ms", "server_mean_ttft_ms")
# the server's counters over each run's bracket (a command: from the scrape before its launch to the one after
# its exit), to check that both tools' server-side figures cover exactly the requests each sent
RUN_FIELDS = METRICS + ("completed", "failed", "duration", "client_limited", "client_nice", "client_cpu_affinity",
                        "server_metrics_complete", "server_request_success", "server_generation_tokens")
TOOLS = ("native", "vllm")


@dataclass(frozen=True)
class Tolerances:
    """Largest accepted |native / vllm - 1| for the throughputs and the median TTFT and TPOT."""

    throughput: float = 0.05
    latency: float = 0.10

    def for_metric(self, metric: str) -> float | None:
        if metric in THROUGHPUTS:
            return self.throughput
        if metric in LATENCIES:
            return self.latency
        return None  # shown, not judged


@dataclass
class CompareRow:
    """One metric of one bench point: the mean of each client's runs, the ratio of their geometric means
    (native / vllm) with its interval, and the equivalence verdict (judged metrics only)."""

    bench_id: str
    metric: str
    native: float | None
    vllm: float | None
    ratio: float | None
    tolerance: float | None
    within: bool | None          # True: equivalent; False: different or missing; None: not shown or not judged
    runs: dict[str, int] = field(default_factory=dict)
    low: float | None = None
    high: float | None = None
    word: str = ""               # equivalent, different, not shown, not judged, missing ("" when only shown)
    runs_needed: int | None = None
    text: str = ""


def _values(runs: list[dict[str, Any]], metric: str) -> list[float]:
    return [float(r[metric]) for r in runs if isinstance(r.get(metric), (int, float))
            and math.isfinite(float(r[metric]))]


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def compare(runs: list[dict[str, Any]], tol: Tolerances) -> list[CompareRow]:
    """Rows per bench point and metric from the runs (dicts with `tool`, `bench_id`, `ok` and the metrics).
    Only runs that succeeded count; a judged metric that one side lacks (or where vllm's is 0) is missing."""
    rows = []
    benches = list(dict.fromkeys(r["bench_id"] for r in runs))
    for bench_id in benches:
        mine = {t: [r for r in runs if r["bench_id"] == bench_id and r["tool"] == t and r.get("ok")] for t in TOOLS}
        counts = {t: len(mine[t]) for t in TOOLS}
        for metric in METRICS:
            nv, vv = _values(mine["native"], metric), _values(mine["vllm"], metric)
            n, v = _mean(nv), _mean(vv)
            t = tol.for_metric(metric)
            if t is None or n is None or not v:
                ratio = n / v if n is not None and v else None
                rows.append(CompareRow(bench_id, metric, n, v, ratio, t, None if t is None else False, counts,
                                       word="" if t is None else "missing",
                                       text="" if t is None else "missing on a side"))
                continue
            eq = _equivalence(mine, metric, t)
            within = True if eq.word == "equivalent" else False if eq.word == "different" else None
            rows.append(CompareRow(bench_id, metric, n, v, eq.ratio if math.isfinite(eq.ratio) else n / v, t, within,
                                   counts, _finite_or_none(eq.low), _finite_or_none(eq.high), eq.word,
                                   eq.runs_needed, eq.text))
    return rows


def _equivalence(mine: dict[str, list[dict[str, Any]]], metric: str, tol: float) -> verdicts.Equivalence:
    """native / vllm: in pairs (the two clients' runs of one round, measured one after the other) where at
    least 3 rounds have both (`over_time.paired_equivalence`), else over the runs unpaired
    (`verdicts.equivalence`)."""
    from raysweep.maths.over_time import paired_equivalence

    def side(tool: str) -> tuple[list[Any], list[float]]:
        rows = [r for r in mine[tool] if isinstance(r.get(metric), (int, float)) and math.isfinite(float(r[metric]))]
        return [r.get("round") for r in rows], [float(r[metric]) for r in rows]

    (kv, vv), (kn, nv) = side("vllm"), side("native")
    if len({k for k in kv if k is not None} & {k for k in kn if k is not None}) >= 3:
        return paired_equivalence(kv, vv, kn, nv, tol)
    return verdicts.equivalence(vv, nv, tol)


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def verdict(rows: list[CompareRow], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """`equivalent within tolerance` when every judged metric is and every run succeeded; `different` when a
    metric is shown different (or missing) or a run failed; `not shown` otherwise, with what would settle it."""
    def where(r: CompareRow) -> str:
        ci = f", 90 % CI {r.low:.3f} to {r.high:.3f}" if r.low is not None and r.high is not None else ""
        return f"{r.bench_id} {r.metric} (ratio {r.ratio:.3f}{ci}, tolerance {r.tolerance:.0%})" \
            if r.ratio is not None else f"{r.bench_id} {r.metric} (missing)"

    outside = [where(r) for r in rows if r.within is False]
    open_ = [f"{where(r)}: {r.text}" for r in rows if r.tolerance is not None and r.within is None]
    failed = [f"{r['bench_id']} {r['tool']} run {r['round']}: {r.get('error') or 'failed'}" for r in runs
              if not r.get("ok")]
    limited = [f"{r['bench_id']} native run {r['round']}" for r in runs if r.get("ok") and r.get("client_limited")]
    # a client-limited native run measured its client, not the server: the comparison cannot pass on it
    ok = not outside and not failed and not open_ and not limited and bool(rows)
    word = "equivalent within tolerance" if ok else "different" if outside or failed or not rows else "not shown"
    needed = [r.runs_needed for r in rows if r.tolerance is not None and r.within is None and r.runs_needed]
    return {"within_tolerance": ok, "verdict": word, "outside": outside, "not_shown": open_,
            "runs_to_settle": max(needed) if needed else None, "failed_runs": failed,
            "client_limited_runs": limited}


def _fmt(v: float | None, metric: str = "") -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if metric.startswith("total_") else f"{v:,.2f}"


def markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: what ran, the side-by-side table, the verdict."""
    rows = [CompareRow(**r) for r in report["comparison"]]
    n = report["n"]
    lines = [f"# raysweep crosscheck: {report['campaign']}, server config {report['serve_id']} "
             f"({report['serve_label'] or 'base command'})", "",
             f"- server: {report['server']}",
             f"- {n} runs of each client per bench point, in turns (native first in even rounds, vllm first in "
             "odd ones), caches reset before each run",
             f"- tolerances: throughput {report['tolerances']['throughput']:.0%}, median TTFT/TPOT "
             f"{report['tolerances']['latency']:.0%}; a metric is equivalent only when the 90 % interval of the "
             "ratio of the clients' geometric means lies within its tolerance, different when it lies outside",
             f"- native client: {report['bench']['native']}",
             f"- vllm bench serve: {report['bench']['vllm']}", ""]
    for bench_id in dict.fromkeys(r.bench_id for r in rows):
        label = report["bench_labels"].get(bench_id) or "base command"
        lines += [f"## bench point {bench_id} ({label})", "",
                  "| mean of runs | native | vllm bench serve | native / vllm | 90 % CI | tolerance | verdict |",
                  "|---|---|---|---|---|---|---|"]
        for r in (r for r in rows if r.bench_id == bench_id):
            ci = f"{r.low:.3f} to {r.high:.3f}" if r.low is not None and r.high is not None else "-"
            lines.append(f"| {r.metric} | {_fmt(r.native, r.metric)} | {_fmt(r.vllm, r.metric)} | "
                         f"{'-' if r.ratio is None else f'{r.ratio:.3f}'} | {ci} | "
                         f"{'-' if r.tolerance is None else f'{r.tolerance:.0%}'} | "
                         f"{'-' if not r.word else f'**{r.word}**' if r.word in ('different', 'missing') else r.word}"
                         " |")
        lines.append("")
    v = report["verdict"]
    lines.append(f"**Verdict: {v['verdict']}.**")
    for key, title in (("outside", "different"), ("not_shown", "not shown"), ("failed_runs", "failed runs"),
                       ("client_limited_runs", "client-limited native runs")):
        if v.get(key):
            lines.append(f"- {title}: " + "; ".join(v[key]))
    lines += ["", "Runs in order:", "", "| # | bench point | client | output tok/s | req/s | median TTFT ms | "
              "median TPOT ms | reset before |", "|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(report["runs"]):
        lines.append(f"| {i} | {r['bench_id']} | {r['tool']} | {_fmt(r.get('output_throughput'))} | "
                     f"{_fmt(r.get('request_throughput'))} | {_fmt(r.get('median_ttft_ms'))} | "
                     f"{_fmt(r.get('median_tpot_ms'))} | {r.get('reset')} |"
                     + ("" if r.get("ok") else f" failed: {r.get('error')}"))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------
# Choosing what to run
# ---------------------------------------------------------------------------------------------------

_Item = TypeVar("_Item", "ServeConfig", "BenchPoint")


def _pick(items: list[_Item], key: str, what: str, option: str) -> _Item:
    """An item by 0-based index or by (a unique prefix of) its id."""
    if key.isdigit() and int(key) < len(items):
        return items[int(key)]
    found = [i for i in items if i.id.startswith(key)]
    if len(found) == 1:
        return found[0]
    known = ", ".join(f"{n} = {i.id} ({i.label or 'base command'})" for n, i in enumerate(items))
    why = "matches several" if found else "is neither an index nor an id"
    raise UserError(f"{option} {key!r} {why} of the campaign's {what}; accepted: {known}")


def select(plan: Plan, serve_index: int | None, serve_id: str | None,
           points: tuple[str, ...]) -> tuple[ServeConfig, list[BenchPoint]]:
    """The server config (by index or id; default the first) and bench points (index or id; default the first)."""
    if plan.spec.offline:
        raise UserError("crosscheck compares two serving clients; this campaign is mode: offline (no server)")
    if plan.spec.campaign.serve is not None and plan.spec.campaign.serve.pd is not None:
        raise UserError("crosscheck starts one server, not a P/D deployment (serve.pd): run the campaign, or start "
                        "the deployment and cross-check its router with --url")
    if serve_index is not None and serve_id is not None:
        raise UserError("give --serve-index or --serve-id, not both")
    if serve_index is not None:
        s = _pick(plan.serves, str(serve_index), "server configs", "--serve-index")
    else:
        s = _pick(plan.serves, serve_id, "server configs", "--serve-id") if serve_id else plan.serves[0]
    benches = [_pick(plan.benches, p, "bench points", "--point") for p in points] or [plan.benches[0]]
    return s, list({b.id: b for b in benches}.values())


# ---------------------------------------------------------------------------------------------------
# Running it (Ray)
# ---------------------------------------------------------------------------------------------------

@dataclass
class _Target:
    """Where the runs go: a server started here (`server`: a `raysweep.serve.live_server.Server`) or a given URL."""

    url: str
    server: Server
    reset: Callable[[], str]
    describe: str


def _check_served(url: str, expected: str | None) -> None:
    """A server given by URL must serve the model of the chosen server config."""
    try:
        with urllib.request.urlopen(url + "/v1/models", timeout=10) as resp:
            ids = [m.get("id") for m in json.loads(resp.read()).get("data", [])]
    except (OSError, ValueError) as exc:
        raise UserError(f"--url {url}: no answer from /v1/models ({exc})") from None
    if expected is not None and expected not in ids:
        raise UserError(f"--url {url}: the server serves {', '.join(map(str, ids)) or 'no model'}, not the "
                        f"server config's model {expected!r}")


NATIVE_ONLY_FLAGS = ("clients", "vocab_size", "prompt_format",  # options raysweep's client adds to `vllm bench serve`'s
                     "duration", "duration_limit", "trace_format", "trace_speedup", "multi_turn_turns",
                     "multi_turn_think_time", "timeseries_interval")


def _trace_units(argv: list[str]) -> dict[str, Any]:
    """raysweep's `--trace-format` and `--trace-speedup` as vLLM's own timed_trace units: the format's preset
    block size and seconds per time unit (where vLLM's options do not set them), the multiplier divided by the
    speed-up, so that `vllm bench serve` replays the same timeline."""
    from raysweep import grid
    from raysweep.bench.options import TRACE_FORMATS

    def value(name: str) -> str | None:
        return grid.find_flag_value(argv, f"--{name.replace('_', '-')}", f"--{name}")

    fmt, speedup = value("trace_format"), value("trace_speedup")
    if fmt is None and speedup is None:
        return {}
    size, mult = TRACE_FORMATS.get(fmt or "", (None, 1.0))
    given_size, given_mult = value("timed_trace_chunk_hash_size"), value("timed_trace_sec_multiplier")
    out: dict[str, Any] = {}
    if size is not None and given_size is None:
        out["timed_trace_chunk_hash_size"] = size
    mult = float(given_mult) if given_mult is not None else mult
    try:
        mult /= float(speedup) if speedup is not None else 1.0
    except (ValueError, ZeroDivisionError):
        raise UserError(f"--trace-speedup {speedup!r}: must be a positive number") from None
    if speedup is not None or given_mult is None:
        out["timed_trace_sec_multiplier"] = format(mult, ".15g")
    return out


def vllm_point(point: PointRun) -> PointRun:
    """The point as `vllm bench serve` runs it: the campaign's bench command (`vllm bench serve` put in front
    of options given alone), without the options only the native client knows; a trace's `--trace-format` and
    `--trace-speedup` become vLLM's `--timed-trace-chunk-hash-size` and `--timed-trace-sec-multiplier`."""
    from dataclasses import replace

    from raysweep import grid

    argv = list(point.bench.argv)
    if not argv or argv[0].startswith("-"):
        argv = ["vllm", "bench", "serve", *argv]
    units = _trace_units(argv)
    argv = grid.apply_to_cmd(argv, {**{k: None for k in NATIVE_ONLY_FLAGS}, **units})
    return replace(point, bench=replace(point.bench, argv=argv))


def round_order(rnd: int) -> tuple[str, ...]:
    """Which client goes first in round `rnd`: native in even rounds, vllm in odd ones."""
    return TOOLS if rnd % 2 == 0 else TOOLS[::-1]


def _one_run(life: ConfigLife, run: ConfigRun, target: _Target, point: PointRun, tool: str, rnd: int,
             backends: dict[str, BenchBackend]) -> dict[str, Any]:
    reset = target.reset()
    if tool == "vllm":
        point = vllm_point(point)
    run.bench = backends[tool]
    t0 = time.monotonic()
    # one run per turn, as `vllm bench serve` gets: a client-limited native run is named, never re-run with
    # more actors (that would change the load between the two tools' turns)
    status, out = life.points.bench(run, target.server, point)
    res = out.get("result") if status == "ok" and out.get("ok") else None
    error = None if res is not None else (f"server down: {out}" if status != "ok" else out.get("error") or "no result")
    if res is not None and not res.get("completed"):
        error, res = f"no request completed ({res.get('failed', '?')} failed)", None
    rec: dict[str, Any] = {"bench_id": point.bench.id, "tool": tool, "round": rnd, "ok": res is not None,
                           "error": error, "reset": reset, "wall_s": time.monotonic() - t0,
                           "command": out.get("command") if isinstance(out, dict) else None}
    if res is not None:
        rec.update({k: res.get(k) for k in RUN_FIELDS})
    log.info("%s %s run %d: %s", point.bench.id, tool, rnd, error or f"{rec.get('output_throughput'):.1f} tok/s")
    return rec


def _start(life: ConfigLife, serve: ServeConfig, nodes: list[NodeInfo],
           native: BenchBackend) -> tuple[ConfigRun, Server]:
    """Place and start one server config as a campaign does; (the config run, the ready server)."""
    from raysweep.place import placement
    from raysweep.serve.live_server import ConfigRun

    layout = placement.layout_for(serve.shape, serve.rule, nodes)
    if isinstance(layout, str):
        raise UserError(f"server config {serve.id} ({serve.label}) can never be placed on this cluster: {layout}")
    eligible = [n.node_id for n in placement.eligible_nodes(serve.rule, nodes)]
    node_ids = placement.fit_nodes(layout, eligible, {n.node_id: n.gpus for n in nodes})
    if node_ids is None:
        raise RuntimeError(f"server config {serve.id}: not enough free GPUs for {layout.describe()} now")
    run = ConfigRun(serve, layout, node_ids)
    run.bench = native
    run.res = placement.reserve(serve, layout, node_ids)
    try:
        server = life.servers.start(run, [])
    except BaseException:
        placement.release(run.res)
        raise
    if server is None:
        placement.release(run.res)
        rows = life.work.ledger.servers()
        why = f"{rows[-1].error}\n{rows[-1].log_tail or ''}" if rows else "unknown"
        raise RuntimeError(f"server config {serve.id} did not start: {why}")
    return run, server


def run_crosscheck(spec: CampaignSpec, serve: ServeConfig, benches: list[BenchPoint], n: int, tol: Tolerances,
                   work_dir: Path, url: str | None = None, warmup: int | None = None,
                   on_run: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Alternate the two clients `n` times each on every bench point against one server (started here as a
    campaign starts one, through `raysweep.drive.config_life`, or the one at `url`); needs a Ray session. Returns the
    report dict."""
    from raysweep.bench import backend_for
    from raysweep.bench.command import CommandBench
    from raysweep.drive.config_life import ConfigLife
    from raysweep.drive.state import RunState
    from raysweep.ledger import LEDGER_FILE, Ledger
    from raysweep.place import placement
    from raysweep.plan.plan import PointRun, build_plan, point_id
    from raysweep.record.directory import CampaignDir
    from raysweep.serve.live_server import ConfigRun, Server
    from raysweep.serve.server import expected_model

    c = spec.campaign
    assert c.bench is not None  # a serving campaign: select() refuses offline ones
    model = expected_model(serve.argv)
    if url:
        url = url.rstrip("/")
        _check_served(url, model)
    work_dir.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(work_dir / LEDGER_FILE)  # this check's own server rows, apart from the campaign's
    nodes = placement.cluster_nodes()
    work = RunState(build_plan(spec), CampaignDir.around(work_dir, ledger),
                    lambda kind, **data: log.debug("%s %s", kind, data), with_gpus=placement.has_gpus(nodes))
    life = ConfigLife(work)
    backends = {"native": backend_for(c.bench.model_copy(update={"backend": "native"}), spec.bench_env),
                "vllm": CommandBench(spec.bench_env, c.bench.timeout_s)}
    run: ConfigRun | None = None
    runs: list[dict[str, Any]] = []
    try:
        if url:
            run = mine = ConfigRun(serve, None, [])  # type: ignore[arg-type]  # no placement: the server is not ours
            given = Server("given", [], url=url)
            target = _Target(url, given, lambda: life.points.reset(mine, given), f"{url} (given)")
        else:
            run, server = _start(life, serve, nodes, backends["native"])
            target = _Target(server.url, server, lambda: life.points.reset(run, server),
                             f"{server.url}, started here: {server.infos[0]['command']}")
        for b in backends.values():
            b.warm()
        warm = c.warmup if warmup is None else warmup
        if warm:
            run.bench = backends["native"]
            target.reset()
            life.points.bench(run, target.server, PointRun("warmup", serve, benches[0], 0), num_prompts=warm)
        for bench in benches:
            point = PointRun(point_id(serve.id, bench.id, 0), serve, bench, 0)
            for rnd in range(n):
                for tool in round_order(rnd):
                    rec = _one_run(life, run, target, point, tool, rnd, backends)
                    runs.append(rec)
                    if on_run is not None:
                        on_run(rec)
    finally:
        for b in backends.values():
            b.close()
        if run is not None and run.res is not None:
            life.servers.stop(target.server)
            placement.release(run.res)
        ledger.close()
    rows = compare(runs, tol)
    return {"campaign": c.name, "serve_id": serve.id, "serve_label": serve.label, "serve_params": serve.params,
            "server": target.describe, "model": model, "n": n, "tolerances": asdict(tol),
            "bench_labels": {b.id: b.label for b in benches}, "bench_params": {b.id: b.params for b in benches},
            "bench": {"native": " ".join(benches[0].argv) + "  (options read by the native client)",
                      "vllm": next((r["command"] for r in runs if r["tool"] == "vllm" and r.get("command")),
                                   " ".join(benches[0].argv))},
            "runs": runs, "comparison": [asdict(r) for r in rows], "verdict": verdict(rows, runs),
            "finished_at": time.time()}

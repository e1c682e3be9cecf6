"""No statistic can stop a campaign: every statistic of a point (raysweep.bench.stats, the time series and
the steady-state window) and of the results (the aggregates, the verdicts, the trend and outlier rules) answers
degenerate inputs with a value or "not judged" with a reason, never an exception: no requests, one, all
failed, identical timestamps, zero-length windows, NaN and infinite values, one bin. Property-based
(hypothesis), seeded by hypothesis's own database-free profile so that a run is repeatable."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raysweep.bench import stats as bench_stats
from raysweep.bench import timeseries
from raysweep.bench.options import parse_load_options

ODD = st.sampled_from([0.0, 0.0, 1.0, 1.0, -1.0, math.nan, math.inf, -math.inf, 1e-12, 1e9])
TIME = st.one_of(st.floats(0.0, 50.0), ODD)
PROFILE = settings(max_examples=60, deadline=None, derandomize=True,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def samples(draw):
    """Pooled raw samples of a point, anything from none to a few dozen requests, with timestamps that may
    coincide, be NaN or infinite, outputs of no or one token, and failures."""
    n = draw(st.integers(0, 25))
    same = draw(st.booleans())  # every timestamp identical
    t0 = draw(TIME)
    begin = [t0 if same else draw(TIME) for _ in range(n)]
    first = [b if same else b + draw(st.one_of(st.floats(0.0, 2.0), ODD)) for b in begin]
    end = [f if same else f + draw(st.one_of(st.floats(0.0, 5.0), ODD)) for f in first]
    ok = [draw(st.booleans()) for _ in range(n)] if draw(st.booleans()) else [draw(st.just(False))] * n \
        if draw(st.booleans()) else [True] * n
    chunks = [sorted(draw(st.lists(st.one_of(st.floats(0.0, 5.0), ODD), max_size=4))) if not same else [0.0] * 2
              for _ in range(n)]
    out = bench_stats.empty_samples()
    out.update(index=list(range(n)), actor=[i % 2 for i in range(n)], due=list(begin), ready=list(begin),
               sent=list(begin), first=first, end=end, done=[e if draw(st.booleans()) else math.nan for e in end],
               in_tok=[draw(st.sampled_from([-1, 0, 1, 5])) for _ in range(n)],
               out_tok=[draw(st.sampled_from([0, 1, 2, 64])) for _ in range(n)], ok=ok,
               error=[None if g else "boom" for g in ok], chunks=chunks, begin=list(begin),
               text=[None] * n, first_out=[math.nan] * n, reasoning=[False] * n,
               session=[-1] * n, turn=[-1] * n,
               loop_lag=[draw(st.one_of(st.floats(0.0, 0.1), ODD)) for _ in range(draw(st.integers(0, 3)))])
    return out


OPEN = parse_load_options(["--request-rate", "5", "--num-prompts", "10"])
CLOSED = parse_load_options(["--max-concurrency", "4", "--num-prompts", "10"])


def _values(d):
    return d if isinstance(d, dict) else {}


@PROFILE
@given(s=samples(), closed=st.booleans())
def test_a_points_metrics_are_values_never_an_exception(s, closed):
    opts = CLOSED if closed else OPEN
    out = bench_stats.point_metrics(s, opts)
    assert "duration" in out and "completed" in out
    guard = bench_stats.client_check(s, opts, math.inf if closed else 5.0)
    assert guard["client_limited"] in (True, False)
    steady = bench_stats.steady_state(s)
    assert steady["steady_state"] in (True, False, None)
    if steady["steady_state"] is None and any(s["ok"]):
        assert steady["steady_state_note"] is None or steady["steady_state_note"].startswith("not ")
    for key in ("requests", "tokens"):
        assert isinstance(bench_stats.per_second_throughput(s)[key], np.ndarray)
    bench_stats.per_request(s)


def test_per_second_buckets_of_requests_that_ended_before_the_start_are_none():
    """Every request ended before the common start (a clock that stepped back): no bucket, not numpy's
    "`bins` must be positive" (found by the property test above in a full run of the suite)."""
    s = bench_stats.empty_samples()
    s.update(index=[0, 1], actor=[0, 0], due=[-3.0, -2.5], ready=[-3.0, -2.5], sent=[-3.0, -2.5],
             first=[-2.0, -2.0], end=[-1.0, -1.5], done=[-1.0, -1.5], in_tok=[5, 5], out_tok=[2, 2],
             ok=[True, True], error=[None, None], chunks=[[0.5, 1.0], [0.5, 1.0]], begin=[-3.0, -2.5],
             text=[None] * 2, first_out=[math.nan] * 2, reasoning=[False] * 2, session=[-1] * 2, turn=[-1] * 2,
             loop_lag=[])
    out = bench_stats.per_second_throughput(s)
    assert out["requests"].size == 0 and out["tokens"].size == 0


@PROFILE
@given(s=samples(), interval=st.sampled_from([1.0, 0.5, 5.0]))
def test_a_points_time_series_and_steady_window_never_raise(s, interval):
    ts = timeseries.series(s, [], interval, None)
    assert len(ts["t_s"]) >= 1
    fields = timeseries.steady_fields(s, ts, interval)
    assert "steady_window_start_s" in fields
    out = {"result": {"timeseries_interval_s": interval}, "samples": s}
    timeseries.attach(out, [])


def test_the_steady_state_of_a_point_with_failed_requests_whose_end_is_unknown_is_judged():
    # the crash of 2026-11-28: a loaded machine's point with failed requests (no end time) made the
    # steady-state test compute int(math.ceil(nan)) and stop the whole server configuration
    rng = np.random.default_rng(3)
    n = 400
    begin = np.sort(rng.uniform(0, 30, n))
    ok = rng.uniform(0, 1, n) > 0.1
    chunks = [list(0.05 + np.cumsum(np.full(8, 0.02))) for _ in range(n)]
    end = np.where(ok, begin + 0.25, np.nan)
    s = bench_stats.empty_samples()
    s.update(index=list(range(n)), ok=list(ok), begin=list(begin), sent=list(begin), due=list(begin),
             ready=list(begin), first=list(np.where(ok, begin + 0.05, np.nan)), end=list(end),
             done=list(np.where(ok, end, np.nan)), out_tok=[8] * n, in_tok=[4] * n, chunks=chunks,
             error=[None if g else "timeout" for g in ok], actor=[0] * n, text=[None] * n)
    out = bench_stats.steady_state(s)
    assert out["steady_state"] in (True, False, None)
    assert math.isfinite(out["steady_state_drift_pct"]), out


# -- the results' statistics ----------------------------------------------------------------------------

NUM = st.one_of(st.floats(-1e6, 1e6, allow_nan=False), ODD, st.none())


@PROFILE
@given(a=st.lists(NUM, max_size=6), b=st.lists(NUM, max_size=6), tol=st.sampled_from([0.05, 0.5]))
def test_verdicts_answer_degenerate_runs_with_a_word(a, b, tol):
    from raysweep.maths import verdicts

    v = verdicts.compare_values(a, b)
    assert v.word in ("better", "worse", "not shown", "not judged") and v.text
    eq = verdicts.equivalence(a, b, tol)
    assert eq.word in ("equivalent", "different", "not shown", "not judged") and eq.text
    verdicts.mean_interval(a)
    verdicts.relative_half_width(a)
    verdicts.slope_test(a, 10.0)
    lead = verdicts.tied_with_leader([verdicts._summary(verdicts._finite(x)) for x in (a, b, a + b)])
    assert lead.leader in (0, 1, 2)


@PROFILE
@given(values=st.lists(NUM, max_size=12))
def test_the_trend_and_outlier_rules_answer_degenerate_runs(values):
    from raysweep.maths import over_time

    t = over_time.trend(values)
    assert t.word in ("drifts", "no drift shown", "not judged") and t.text
    marks = over_time.outliers(values)
    assert len(marks.mask) == len(values) and marks.text is not None


@PROFILE
@given(data=st.data(), runs=st.integers(0, 4), points=st.integers(1, 3))
def test_the_summary_of_degenerate_runs_is_a_table(data, runs, points):
    from raysweep.results import aggregate

    rows = []
    for p in range(points):
        for r in range(runs):
            rows.append({"serve_id": "s", "bench_id": f"b{p}", "point_id": f"s-b{p}-{r}", "run_number": r,
                         "max_concurrency": 2 ** p, "output_throughput": data.draw(NUM),
                         "p99_ttft_ms": data.draw(NUM), "completed": data.draw(st.sampled_from([0, 1, 10])),
                         "failed": 0, "validity_ok": data.draw(st.sampled_from([True, False, None])),
                         "started_at": data.draw(st.one_of(st.floats(0, 100), ODD))})
    df = pd.DataFrame(rows)
    out = aggregate.summarize(df)
    assert len(out) == (points if runs else 0)


# -- the driver: a point whose analysis raises is recorded failed, with its traceback ----------------------

def test_a_point_whose_analysis_raises_fails_with_its_traceback_and_nothing_else_stops():
    from types import SimpleNamespace

    from raysweep.drive.point import PointRunner

    class Bench:
        def submit(self, argv, url, model, num_prompts=None, clients=None):
            return SimpleNamespace(refs=[], clients=1)

        def finish(self, job, answers):
            raise ValueError("cannot convert float NaN to integer")

    bench_spec = SimpleNamespace(metrics_interval_s=60.0, timeout_s=5.0)
    work = SimpleNamespace(c=SimpleNamespace(bench=bench_spec), plan=None)
    run = SimpleNamespace(bench=Bench(), serve=SimpleNamespace(argv=["vllm", "serve", "m"]),
                          wait=lambda refs, timeout, server: ("ok", []))
    server = SimpleNamespace(url="http://127.0.0.1:9", metrics_url="http://127.0.0.1:9")
    point = SimpleNamespace(id="p1", bench=SimpleNamespace(argv=["--num-prompts", "1"]))
    status, out = PointRunner(work).bench(run, server, point)
    assert status == "ok" and out["ok"] is False
    assert out["error"] == "the point's analysis failed: ValueError: cannot convert float NaN to integer"
    assert "Traceback" in out["output_tail"] and "finish" in out["output_tail"]


def test_an_analysis_that_raises_marks_its_own_fields_not_computed(monkeypatch):
    def boom(s):
        raise ValueError("cannot convert float NaN to integer")

    monkeypatch.setattr(bench_stats, "steady_state", boom)
    rng = np.random.default_rng(0)
    from raysweep.bench import sane

    s = bench_stats.empty_samples()
    n = 30
    begin = np.sort(rng.uniform(0, 10, n))
    s.update(index=list(range(n)), ok=[True] * n, begin=list(begin), sent=list(begin), due=list(begin),
             ready=list(begin), first=list(begin + 0.1), end=list(begin + 0.5), done=list(begin + 0.5),
             out_tok=[4] * n, in_tok=[4] * n, chunks=[[0.1, 0.2, 0.3, 0.5]] * n, error=[None] * n,
             actor=[0] * n, text=[None] * n)
    out = bench_stats.point_metrics(s, OPEN)
    assert out["completed"] == n and out["output_throughput"] > 0
    assert out["steady_state_not_computed"] == "ValueError: cannot convert float NaN to integer"
    assert out["analysis_errors"] == ["steady_state"]
    assert sane.finite_samples(s) is s  # nothing to mend: no copy


@PROFILE
@given(s=samples())
def test_the_buckets_the_peak_and_the_turns_answer_degenerate_samples(s):
    from raysweep.bench.sane import finite_samples

    clean = finite_samples(s)
    ok = np.asarray(clean["ok"], dtype=bool)
    begin, end = np.asarray(clean["begin"], dtype=float), np.asarray(clean["end"], dtype=float)
    chunks = [np.asarray(c, dtype=float) for c, g in zip(clean["chunks"], ok) if g]
    tokens, requests = bench_stats.vllm_buckets(begin[ok], end[ok], chunks)
    assert tokens >= 0 and requests >= 0
    assert bench_stats.peak_in_flight(begin, np.maximum(begin, end)) >= 0
    turned = dict(clean, session=[i % 3 for i in range(len(ok))], turn=[i % 2 for i in range(len(ok))])
    out = bench_stats.turn_metrics(turned)
    assert out["num_sessions"] == (min(3, len(ok)))

"""bench.workload: load levels found from the server, as `vllm bench sweep serve_workload` finds them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from helpers import standin_campaign

from raysweep.campaign import load_campaign
from raysweep.cli import main
from raysweep.drive.state import RunState
from raysweep.errors import CampaignError
from raysweep.ledger import LEDGER_FILE, Ledger
from raysweep.levels import search as wl
from raysweep.plan.plan import build_plan, dry_run_text, point_id
from raysweep.record.directory import CampaignDir


def test_levels_are_computed_as_vllm_computes_them():
    # ceil of the serial mean, floor of the batch mean, the inner points of linspace, rounded half to even
    assert wl.levels_between([1.2, 1.4], [10.9, 11.0], 10) == (2, 10, [3, 4, 5, 6, 7, 8, 9])
    assert wl.levels_between([0.4], [9.0], 4) == (1, 9, [4, 6])  # linspace 1, 3.67, 6.33, 9
    assert wl.levels_between([1.0], [5.0], 5) == (1, 5, [2, 3, 4])
    assert wl.levels_between([1.0], [6.0], 3) == (1, 6, [4])  # 3.5 rounds half to even: 4
    assert wl.levels_between([1.0], [3.0], 10) == (1, 3, [1, 2, 3])  # a narrow range: fewer levels, none twice
    assert wl.levels_between([1.0], [20.0], 2) == (1, 20, [])  # two levels: the endpoints only


def test_achieved_value_is_throughput_or_littles_law():
    run = {"request_throughput": 4.0, "mean_e2el_ms": 2500.0}
    assert wl.achieved(run, "request_rate") == 4.0
    assert wl.achieved(run, "max_concurrency") == 10.0


def test_dataset_size_reads_params_then_command_then_vllms_default():
    assert wl.dataset_size({"num_prompts": 7}, ["vllm", "bench", "serve", "--num-prompts", "50"]) == 7
    assert wl.dataset_size({}, ["vllm", "bench", "serve", "--num-prompts=50"]) == 50
    assert wl.dataset_size({}, ["vllm", "bench", "serve"]) == 1000


def _campaign(tmp_path: Path, workload: dict | None = None, **fields) -> Path:
    fields.setdefault("bench_params", {"grid": {"random_input_len": [16]}})
    f = standin_campaign(tmp_path, bench_args="--percentile-metrics ttft,tpot,itl,e2el", **fields)
    data = yaml.safe_load(f.read_text())
    data["bench"]["workload"] = workload if workload is not None else {"variable": "max_concurrency", "levels": 6}
    f.write_text(yaml.safe_dump(data))
    return f


@pytest.mark.parametrize("workload, bench_params, field, says", [
    ({"variable": "max_concurrency", "levels": 1}, None, "bench.workload.levels", "greater than or equal to 2"),
    ({"variable": "num_prompts"}, None, "bench.workload.variable", "'max_concurrency' or 'request_rate'"),
    ({"variable": "max_concurrency", "level": 4}, None, "bench.workload", "level"),
    ({"variable": "max_concurrency"}, {"grid": {"max_concurrency": [1, 2]}}, "bench.params[0].max_concurrency",
     "is set by bench.workload"),
    ({"variable": "request_rate"}, [{"request_rate": 2}], "bench.params[0].request_rate", "is set by bench.workload"),
])
def test_bad_workload_is_refused_naming_the_field(tmp_path, workload, bench_params, field, says):
    f = _campaign(tmp_path, workload, **({"bench_params": bench_params} if bench_params else {}))
    with pytest.raises(CampaignError) as err:
        load_campaign(f)
    assert err.value.field.startswith(field) and says in str(err.value)
    res = CliRunner().invoke(main, ["run", str(f)])
    assert res.exit_code == 2 and field in res.output
    assert not (tmp_path / "out").exists()  # nothing started, nothing written


def _with_sla(f: Path, **sla) -> Path:
    data = yaml.safe_load(f.read_text())
    data["bench"].update(backend="native", cmd="vllm bench serve --model m --num-prompts 10")
    f.write_text(yaml.safe_dump({**data, "sla": {"targets": [{"p99_ttft_ms": "<=100"}], **sla}}))
    return f


def test_workload_refuses_an_sla_search_of_another_variable_and_tuning(tmp_path):
    f = _with_sla(_campaign(tmp_path), variable="request_rate")  # the workload sets max_concurrency
    with pytest.raises(CampaignError, match="^sla.variable: is request_rate, but bench.workload.variable is "
                                            "max_concurrency"):
        load_campaign(f)
    res = CliRunner().invoke(main, ["run", str(f)])
    assert res.exit_code == 2 and "sla.variable" in res.output and not (tmp_path / "out").exists()
    data = yaml.safe_load(_campaign(tmp_path).read_text())
    data["tune"] = {"space": {"max_num_seqs": {"choices": [8, 16]}}, "budget": {"candidates": 2},
                    "objective": {"metric": "output_throughput"}}
    f.write_text(yaml.safe_dump(data))
    with pytest.raises(CampaignError, match="^bench.workload: cannot be used with `tune:` .*differ between "
                                            "candidates"):
        load_campaign(f)
    res = CliRunner().invoke(main, ["validate", str(f)])
    assert res.exit_code == 2 and "bench.workload" in res.output


def _work(tmp_path: Path, workload: dict | None = None, precision: dict | None = None, sla: dict | None = None
          ) -> RunState:
    f = _campaign(tmp_path, workload)
    if sla is not None:
        _with_sla(f, **sla)
    if precision is not None:
        data = yaml.safe_load(f.read_text())
        data.pop("runs")
        data["bench"]["precision"] = precision
        f.write_text(yaml.safe_dump(data))
    plan = build_plan(load_campaign(f))
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    ledger = Ledger(out / LEDGER_FILE)
    wl.restore_plan(plan, ledger)
    from raysweep.drive import sequential

    sequential.restore_plan(plan, ledger)
    ledger.sync(name="t", fingerprint=plan.fingerprint, meaning={}, campaign={}, campaign_file="",
                points=[(p.id, p.serve.id, p.bench.id, p.run, p.serve.params, p.bench.params) for p in plan.points])
    events: list[tuple[str, dict]] = []
    run_dir = CampaignDir.around(out, ledger)
    work = RunState(plan, run_dir, lambda kind, **data: events.append((kind, data)), with_gpus=False)
    work.events = events  # type: ignore[attr-defined]
    return work


def _finish(work: RunState, run_id: str, rps: float | None, e2el_ms: float = 1000.0) -> None:
    assert work.ledger.claim(run_id, "s", work.c.max_attempts) is not None
    if rps is None:
        work.ledger.give_up(run_id, "broken", work.c.max_attempts)
        return
    path = work.output_dir / f"{run_id}.json"
    path.write_text(json.dumps({"request_throughput": rps, "mean_e2el_ms": e2el_ms, "output_throughput": rps * 8}))
    work.ledger.mark_done(run_id, path.name)


def test_plan_holds_serial_and_batch_points_and_the_dry_run_says_levels_come_later(tmp_path):
    work = _work(tmp_path)
    pts = work.plan.points
    assert [(p.bench.workload_role, p.bench.params.get("max_concurrency")) for p in pts] == [("serial", 1),
                                                                                            ("batch", 10)]
    assert all(p.bench.workload_of == work.plan.benches[0].id for p in pts)
    text = dry_run_text(work.plan)
    assert "x 2 (serial, batch) x 1 run(s) = 2 run(s) to start with" in text
    assert "4 level(s) of max_concurrency between what they achieve" in text
    assert "decided after the serial and batch points" in text and "at most 4 more run(s)" in text
    assert "--max-concurrency 1" in text and "--max-concurrency 10" in text


def test_a_level_equal_to_the_serial_value_is_a_point_of_its_own(tmp_path):
    # On a narrow range (serial 1, batch 2, 5 levels) vLLM's spacing gives the levels [1, 2]: both run again
    # as levels, as vLLM's sweep runs them, and neither takes the id of the serial or batch point.
    from raysweep.plan.plan import level_bench

    work = _work(tmp_path)
    base = work.plan.benches[0]
    assert wl.levels_between([0.9, 0.95], [2.1, 2.2], 5) == (1, 2, [1, 2])
    ends = {p.bench.id for p in work.plan.points}
    levels = [level_bench(work.plan.spec, base, v) for v in (1, 2)]
    assert levels[0].params["max_concurrency"] == 1 and not ends & {b.id for b in levels}
    assert len({b.id for b in levels}) == 2


def test_levels_are_decided_once_after_both_endpoints_and_kept_on_resume(tmp_path):
    work = _work(tmp_path)
    serial, batch = work.plan.points
    serve = serial.serve
    _finish(work, serial.id, 0.8, 1250.0)  # 1 request in flight
    assert wl.settle(work, serve, serial.bench) == []  # the batch point has not run: nothing decided
    _finish(work, batch.id, 2.0, 4600.0)  # 9.2 in flight: floor 9
    levels = wl.settle(work, serve, batch.bench)
    assert [p.bench.workload_value for p in levels] == [3, 4, 6, 7]  # linspace(1, 9, 6)[1:-1] = 2.6 4.2 5.8 7.4
    assert [p.bench.params["max_concurrency"] for p in levels] == [3, 4, 6, 7]
    assert all(p.id == point_id(serve.id, p.bench.id, 0) for p in levels)
    row = work.ledger.workload_levels(serve.id, work.plan.benches[0].id)
    assert row is not None and (row["serial"], row["batch"], row["levels"], row["state"]) == (1, 9, [3, 4, 6, 7],
                                                                                               "decided")
    assert wl.settle(work, serve, batch.bench) == []  # another server deciding too adds nothing more
    assert len(work.plan.points) == 6 and len(work.ledger.points()) == 6
    assert work.events[-1][0] == "workload_levels"  # type: ignore[attr-defined]
    _finish(work, levels[0].id, 1.5, 2000.0)
    work.ledger.close()
    again = _work(tmp_path)  # a new driver: the same levels from the ledger, whatever the endpoints say now
    assert sorted(p.bench.workload_value for p in again.plan.points if p.bench.workload_role == "level") == [3, 4, 6, 7]
    assert {p.point_id for p in again.ledger.points()} == {p.id for p in again.plan.points}
    runnable = again.ledger.runnable(serve.id, again.c.max_attempts)
    assert sorted(json.loads(json.dumps(r.bench_params))["max_concurrency"] for r in runnable) == [4, 6, 7]
    assert wl.settle_all(again) == 0


def test_a_driver_that_died_before_deciding_is_decided_at_start(tmp_path):
    work = _work(tmp_path, {"variable": "request_rate", "levels": 4})
    serial, batch = work.plan.points
    assert serial.bench.params == {"random_input_len": 16, "max_concurrency": 1, "request_rate": 1}
    assert batch.bench.params == {"random_input_len": 16, "max_concurrency": 10, "request_rate": 10}
    _finish(work, serial.id, 0.9)
    _finish(work, batch.id, 9.5)
    work.ledger.close()
    again = _work(tmp_path, {"variable": "request_rate", "levels": 4})
    assert wl.settle_all(again) == 2  # levels 4 and 6 of request_rate (linspace(1, 9, 4) = 1 3.67 6.33 9)
    levels = [p for p in again.plan.points if p.bench.workload_role == "level"]
    assert [p.bench.params for p in levels] == [{"random_input_len": 16, "request_rate": 4},
                                                {"random_input_len": 16, "request_rate": 6}]


def test_endpoints_that_failed_decide_no_level(tmp_path):
    work = _work(tmp_path)
    serial, batch = work.plan.points
    _finish(work, serial.id, 1.0)
    _finish(work, batch.id, None)
    assert wl.settle(work, serial.serve, batch.bench) == []
    row = work.ledger.workload_levels(serial.serve.id, work.plan.benches[0].id)
    assert row is not None and row["state"] == "endpoints failed" and row["levels"] == []
    assert work.ledger.retry_failed() == 1  # `--retry-failed`: the batch point runs again and succeeds
    _finish(work, batch.id, 5.0, 1000.0)
    levels = wl.settle(work, serial.serve, batch.bench)
    row = work.ledger.workload_levels(serial.serve.id, work.plan.benches[0].id)
    assert row is not None and row["state"] == "decided" and row["batch"] == 5 and len(levels) == len(row["levels"]) > 0


def test_with_precision_the_levels_wait_for_the_endpoints_to_be_decided(tmp_path):
    from raysweep.drive import sequential

    work = _work(tmp_path, precision={"metric": "request_throughput", "rel_half_width": 0.5, "min_runs": 2,
                                      "max_runs": 4})
    pts = work.plan.points
    assert [(p.bench.workload_role, p.run) for p in pts] == [("serial", 0), ("serial", 1), ("batch", 0), ("batch", 1)]
    serve = pts[0].serve
    for p, rps in zip(pts, (1.0, 1.0, 9.0, 3.0)):  # the batch point is noisy
        _finish(work, p.id, rps, 1000.0)
    assert sequential.settle(work, serve, pts[0].bench.id) is not None  # two values: one more run each
    added = sequential.settle(work, serve, pts[2].bench.id)
    assert added is not None
    assert wl.settle(work, serve, pts[2].bench) == []  # the batch point is still measuring
    _finish(work, added.id, 6.0, 1000.0)
    serial_more = next(p for p in work.plan.points if p.bench.workload_role == "serial" and p.run == 2)
    _finish(work, serial_more.id, 1.0, 1000.0)
    for b in (pts[0].bench, pts[2].bench):
        while (more := sequential.settle(work, serve, b.id)) is not None:
            _finish(work, more.id, 6.0 if b is pts[2].bench else 1.0, 1000.0)
    levels = wl.settle(work, serve, pts[2].bench)
    row = work.ledger.workload_levels(serve.id, work.plan.benches[0].id)
    assert row is not None and row["state"] == "decided"
    assert len(levels) == 2 * len(row["levels"])  # every level starts with min_runs runs


def _finish_samples(work: RunState, run_id: str, ttft_ms: float, rps: float, e2el_ms: float) -> None:
    """A done native run of 10 requests, all with the same TTFT, with its raw samples (an SLA probe pools them)."""
    from raysweep.bench import stats
    from raysweep.record.runs import write_samples

    assert work.ledger.claim(run_id, "s", work.c.max_attempts) is not None
    s = stats.empty_samples()
    ttft, e2el = ttft_ms / 1000, max(e2el_ms / 1000, ttft_ms / 1000 + 0.03)
    for i in range(10):
        t = i / rps
        row = {"index": i, "actor": 0, "due": t, "ready": t, "begin": t, "sent": t, "first": t + ttft,
               "end": t + e2el, "done": t + e2el, "in_tok": 16, "out_tok": 4, "ok": True, "error": None,
               "chunks": [ttft, ttft + 0.01, ttft + 0.02, e2el], "text": None}
        for col in s:
            if col != "loop_lag":
                s[col].append(row.get(col))
    write_samples(work.output_dir / f"{run_id}.samples.parquet", s)
    record = {"request_throughput": rps, "mean_e2el_ms": e2el_ms, "samples_path": f"{run_id}.samples.parquet"}
    (work.output_dir / f"{run_id}.json").write_text(json.dumps(record))
    work.ledger.mark_done(run_id, f"{run_id}.json")


@pytest.mark.parametrize("variable, probes", [("max_concurrency", [1.0, 3.0, 4.0, 6.0, 7.0, float("inf")]),
                                              ("request_rate", [3.0, 4.0, 6.0, 7.0])])
def test_an_sla_search_runs_after_the_levels_and_starts_from_them(tmp_path, variable, probes):
    """With `sla:`, the plan holds the serial and batch points (no unbounded probe of its own); the search's
    work counts the levels still to run; once they are done, every level, and with max_concurrency the serial
    and batch points, is a probe of the search, pooled from its runs' samples and judged as any probe."""
    from raysweep.sla import probe as sla_probe
    from raysweep.sla.search import Verdict, parse_targets

    work = _work(tmp_path, {"variable": variable, "levels": 6}, sla={"variable": variable})
    assert [p.bench.workload_role for p in work.plan.points] == ["serial", "batch"]
    serve, base = work.plan.serves[0], work.plan.benches[0]
    assert work.plan.searches == [(serve.id, base.id)]
    assert "The search runs after the workload levels and starts from them" in dry_run_text(work.plan)
    assert work.work_left(serve.id) == 1 + 2  # one probe run of the open search, the two endpoints
    serial, batch = work.plan.points
    _finish_samples(work, serial.id, 20.0, 0.8, 1250.0)  # max_concurrency 1; rate 0.8
    _finish_samples(work, batch.id, 500.0, 9.5, 990.0)  # 9.4 in flight; rate 9.5: serial 1, batch 9 either way
    levels = wl.settle(work, serve, batch.bench)
    assert [p.bench.workload_value for p in levels] == [3, 4, 6, 7]
    assert work.work_left(serve.id) == 1 + 4 and wl.search_probes(work, serve.id, base.id) == (
        {1.0: [f"{serial.id}.json"], float("inf"): [f"{batch.id}.json"]} if variable == "max_concurrency" else {})
    for p, ttft in zip(levels, (40.0, 80.0, 150.0, 300.0)):
        _finish_samples(work, p.id, ttft, 2.0, 1000.0)
    assert work.work_left(serve.id) == 1  # only the search is left
    shared = wl.search_probes(work, serve.id, base.id)
    assert sorted(shared) == probes
    probe_data: dict = {}
    searches = sla_probe.SlaSearches(work, points=None)  # type: ignore[arg-type]
    searches._workload_probes(serve.id, base, probe_data)
    target = parse_targets([{"p99_ttft_ms": "<=100"}])[0]
    verdicts = {v: sla_probe.judge(d, target, work.c.sla) for (v, _), d in probe_data.items()}
    assert verdicts[3.0] == verdicts[4.0] == Verdict.PASS and verdicts[6.0] == verdicts[7.0] == Verdict.FAIL


def _vllm_run(**fields) -> dict:
    return {"request_throughput": 2.0, "mean_e2el_ms": 900.0, "completed": 10, **fields}


def test_import_reads_a_serve_workload_directory(tmp_path):
    """Every level of a `vllm bench sweep serve_workload` dir is a bench point of its own, with its variable,
    value and role, as vLLM names the combo directories (`<serve/bench>-WL--<var>=<value>`)."""
    from raysweep.results.importer import import_vllm_sweep, read_table, workload_part

    exp = tmp_path / "vllm" / "exp"
    dirs = {"SERVE--max_num_seqs=8-WL--max_concurrency=1": _vllm_run(max_concurrency=1, num_prompts=10),
            "SERVE--max_num_seqs=8-WL--max_concurrency=4": _vllm_run(max_concurrency=4, num_prompts=10),
            "SERVE--max_num_seqs=8-WL--max_concurrency=10": _vllm_run(max_concurrency=10, num_prompts=10),
            "WL--request_rate=3": _vllm_run(request_rate=3, num_prompts=10)}
    for name, run in dirs.items():
        (exp / name).mkdir(parents=True)
        (exp / name / "summary.json").write_text(json.dumps([{**run, "run_number": 0}]))
    (exp / "summary.csv").write_text("unused\n")
    assert workload_part("SERVE--a=1-BENCH--b=2-WL--request_rate=4") == ("SERVE--a=1-BENCH--b=2", "request_rate", 4.0)
    assert workload_part("SERVE--a=1-BENCH--b=2") == ("SERVE--a=1-BENCH--b=2", None, None)
    table = read_table(tmp_path / "vllm").df.sort_values("combo_dir")
    assert table["bench_id"].nunique() == 4  # each level its own point
    by_dir = {d: r for d, r in zip(table["combo_dir"], table.to_dict("records"), strict=True)}
    row = by_dir["exp/SERVE--max_num_seqs=8-WL--max_concurrency=4"]
    assert (row["workload_variable"], row["workload_value"], row["workload_role"]) == ("max_concurrency", 4, "level")
    assert row["serve_label"] == "max_num_seqs=8" and row["bench_label"] == "default-max_concurrency=4"
    assert by_dir["exp/SERVE--max_num_seqs=8-WL--max_concurrency=1"]["workload_role"] == "serial"
    assert by_dir["exp/SERVE--max_num_seqs=8-WL--max_concurrency=10"]["workload_role"] == "batch"
    assert by_dir["exp/WL--request_rate=3"]["serve_label"] == "default"
    paths, _ = import_vllm_sweep(tmp_path / "vllm", tmp_path / "imported")
    assert sorted(p.name for p in paths) == ["results.csv", "results.parquet"]


# ---------------------------------------------------------------------------------------------------
# On the session cluster: the stand-in server, then the real vLLM CPU server beside vLLM's own sweep
# ---------------------------------------------------------------------------------------------------

def _achieved_levels(records: list[dict], role: str, variable: str) -> list[float]:
    return [wl.achieved(r, variable) for r in records if r.get("workload_role") == role]


def test_campaign_runs_the_levels_it_decides_and_a_resume_runs_nothing_again(gpu_cluster, tmp_path):
    from helpers import run_file

    from raysweep.results.table import results_table

    f = _campaign(tmp_path, {"variable": "max_concurrency", "levels": 5}, runs=2)
    summary, out = run_file(f)
    led = Ledger.open_existing(out)
    rows = led.all_workload_levels()
    assert len(rows) == 1 and rows[0]["state"] == "decided"
    df = results_table(CampaignDir(out))
    records = df.to_dict("records")
    serial = _achieved_levels(records, "serial", "max_concurrency")
    batch = _achieved_levels(records, "batch", "max_concurrency")
    assert len(serial) == len(batch) == 2
    lo, hi, levels = wl.levels_between(serial, batch, 5)  # what the ledger says is what the runs say
    assert (rows[0]["serial"], rows[0]["batch"], rows[0]["levels"]) == (lo, hi, levels)
    ran = sorted({int(r["max_concurrency"]) for r in records if r["workload_role"] == "level"})
    assert ran == levels and len(df) == 2 * (2 + len(levels))
    assert summary.counts == {"pending": 0, "running": 0, "done": len(df), "failed": 0}
    attempts = {p.point_id: p.attempts for p in led.points()}
    led.close()
    summary, _ = run_file(f)  # resumed: the same levels, nothing runs again
    led = Ledger.open_existing(out)
    assert {p.point_id: p.attempts for p in led.points()} == attempts
    led.close()
    res = CliRunner().invoke(main, ["status", str(out)])
    assert res.exit_code == 0, res.output
    assert f"levels {', '.join(str(v) for v in levels) or 'none between'}" in res.output
    res = CliRunner().invoke(main, ["report", str(out), "--out", str(tmp_path / "report.html")])
    assert res.exit_code == 0, res.output
    page = (tmp_path / "report.html").read_text()
    assert "Load levels" in page and "1 decided" in page


@pytest.mark.timing
def test_an_sla_campaign_with_workload_levels_searches_from_them_on_the_standin(gpu_cluster, tmp_path):
    """On the streaming stand-in: the serial, batch and level points run first, then the search; none of its
    own probes repeats a value the workload ran (the levels, 1 and the unbounded batch point), and it ends
    with an answer recorded."""
    from helpers import native_campaign, run_file

    from raysweep.results.table import sla_table

    f = native_campaign(tmp_path, server_args="--ttft-delay 0.01 --itl-delay 0.005 --slots 4",
                        bench_args="--random-output-len 4 --random-input-len 8 --num-prompts 16",
                        bench_params=[{"random_input_len": 8}], bench={"client_cpus": 0.5},
                        sla={"targets": [{"p90_ttft_ms": "<=40"}], "max_value": 64})
    data = yaml.safe_load(f.read_text())
    data["bench"]["workload"] = {"variable": "max_concurrency", "levels": 4}
    f.write_text(yaml.safe_dump(data))
    summary, out = run_file(f)
    led = Ledger.open_existing(out)
    decided = led.all_workload_levels()
    rows = led.points()
    led.close()
    assert len(decided) == 1 and decided[0]["state"] == "decided"
    ran = {r.bench_params.get("max_concurrency") for r in rows if r.probe_of is None}
    assert ran == {1, 16, *decided[0]["levels"]}
    assert all(r.state == "done" for r in rows if r.probe_of is None)
    own = {r.bench_params.get("max_concurrency") for r in rows if r.probe_of is not None}
    assert not own & ran and None not in own  # no level, no serial and no unbounded probe run again
    df = sla_table(CampaignDir(out))
    assert len(df) == 1 and df.iloc[0]["state"] in ("found", "above max", "never met", "unresolved"), df
    assert summary.counts["failed"] == 0


def test_levels_match_vllms_serve_workload_on_the_real_server(vllm_server, gpu_cluster, tmp_path):
    """vLLM's `vllm bench sweep serve_workload` and raysweep's bench.workload, one after the other against the
    same real vLLM CPU server with the same bench command: the same number of levels spanning the same range,
    each level within what the endpoints' achieved values, over the runs of both tools, allow.

    raysweep reads the same bench command with its native client (`bench.backend: native`, the default), which
    sends the requests `vllm bench serve` sends; vLLM's sweep runs `vllm bench serve` itself for each of its 8
    runs. (With `backend: command` raysweep would start 8 more processes that each import vLLM, about half of
    this test's time; the command backend's levels are run on the stand-in above.)"""
    import subprocess
    import sys

    from conftest import _vllm_cli
    from helpers import run_file

    from raysweep.results.importer import read_table
    from raysweep.results.table import results_table

    url, model = vllm_server["url"], vllm_server["model"]
    port = url.rsplit(":", 1)[1]
    options = (f"--model {model} --base-url {url} --dataset-name random --random-input-len 32 "
               "--random-output-len 16 --ignore-eos --num-prompts 16")
    bench_cmd = f"{_vllm_cli()} bench serve {options}"
    variable, levels, runs = "max_concurrency", 4, 2
    # vLLM's sweep starts its own server; a placeholder process "serves" at the running server's address
    # (vLLM reads --host/--port from the serve command and checks /health there), and the cache reset
    # raysweep does through serve.url's reset_url is vLLM's --after-bench-cmd
    placeholder = f"{sys.executable} -c 'import time; time.sleep(3600)' --host 127.0.0.1 --port {port}"
    reset = (f"{sys.executable} -c \"import urllib.request as u; u.urlopen(u.Request('{url}/reset_prefix_cache', "
             "method='POST'))\"")
    vllm_out = tmp_path / "vllm"
    proc = subprocess.run([_vllm_cli(), "bench", "sweep", "serve_workload", "--serve-cmd", placeholder,
                           "--bench-cmd", bench_cmd, "--after-bench-cmd", reset, "--workload-var", variable,
                           "--workload-iters", str(levels), "--num-runs", str(runs), "-o", str(vllm_out),
                           "--experiment-name", "exp"], capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    theirs = read_table(vllm_out).df.to_dict("records")

    f = tmp_path / "campaign.yaml"
    f.write_text(yaml.safe_dump({
        "name": "wl", "output_dir": str(tmp_path / "out"), "runs": runs,
        "serve": {"url": {"url": url, "reset_url": f"{url}/reset_prefix_cache"}},
        # the client shares 2 cores with vLLM here, as in the other real-server tests: the guard flags only a
        # client that stalls, rather than running a point again with more actors
        "bench": {"backend": "native", "cmd": f"vllm bench serve {options}", "client_guard": {"max_send_lag_ms": 500},
                  "workload": {"variable": variable, "levels": levels}}}))
    summary, out = run_file(f)
    ours = results_table(CampaignDir(out)).to_dict("records")
    assert summary.counts["failed"] == 0

    def values(records: list[dict], role: str) -> list[int]:
        return sorted({int(r[variable]) for r in records if r.get("workload_role") == role})

    serial = {t: _achieved_levels(recs, "serial", variable) for t, recs in (("vllm", theirs), ("raysweep", ours))}
    batch = {t: _achieved_levels(recs, "batch", variable) for t, recs in (("vllm", theirs), ("raysweep", ours))}
    assert all(len(v) == runs for v in (*serial.values(), *batch.values()))
    # what each tool decided is what its own endpoint runs give by vLLM's rule
    for tool, recs in (("vllm", theirs), ("raysweep", ours)):
        lo, hi, inner = wl.levels_between(serial[tool], batch[tool], levels)
        assert values(recs, "level") == inner, (tool, serial[tool], batch[tool])
    # the same range and number of levels, within the run-to-run spread of the endpoints of both tools:
    # the levels from the lowest and from the highest achieved endpoint runs bound every level either found
    every_serial = [v for vs in serial.values() for v in vs]
    every_batch = [v for vs in batch.values() for v in vs]
    low = wl.levels_between([min(every_serial)], [min(every_batch)], levels)
    high = wl.levels_between([max(every_serial)], [max(every_batch)], levels)
    ours_levels, their_levels = values(ours, "level"), values(theirs, "level")
    assert len(ours_levels) == len(their_levels) == levels - 2
    for mine, theirs_v, lo_v, hi_v in zip(ours_levels, their_levels, low[2], high[2], strict=True):
        assert lo_v <= mine <= hi_v and lo_v <= theirs_v <= hi_v
    assert low[0] <= min(ours_levels[0], their_levels[0]) and max(ours_levels[-1], their_levels[-1]) <= high[1]
    # the endpoints ran at the same settings: max_concurrency 1, and every prompt at once
    assert values(ours, "serial") == values(theirs, "serial") == [1]
    assert values(ours, "batch") == values(theirs, "batch") == [16]

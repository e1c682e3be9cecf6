"""Faults: a refused command writes nothing, settings drift caught on resume, what a dead driver left stopped
at once, ports without a race, a full disk that loses no finished result, and a short chaos run."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from click.testing import CliRunner
from helpers import PY, STANDIN, run_file, standin_campaign

from raysweep import procs
from raysweep.campaign import load_campaign
from raysweep.cli import main
from raysweep.drive.driver import driver_alive, open_campaign
from raysweep.ledger import CampaignHeld, Ledger
from raysweep.record import drift


def _tree(path: Path) -> dict[str, str]:
    """Every file under `path` with its sha256 (the output dir byte for byte)."""
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture
def campaign_dir(tmp_path):
    """A campaign with a ledger, one point done and results files, as a driver leaves them."""
    f = standin_campaign(tmp_path)
    spec = load_campaign(f)
    out = Path(spec.campaign.output_dir or "")
    plan, ledger = open_campaign(spec, out)
    first = plan.points[0].id
    ledger.mark_running(first, "srv-1")
    (out / "points").mkdir()
    (out / "points" / f"{first}.json").write_text('{"ok": 1}')
    ledger.mark_done(first, str(out / "points" / f"{first}.json"))
    drift.record(ledger, drift.measured_with(spec), [])
    ledger.close()
    for name in ("results.parquet", "results.csv", "raysweep.log"):
        (out / name).write_bytes(b"as the running driver wrote it\n")
    return f, out


@pytest.fixture
def live_driver(campaign_dir):
    """A driver that still runs holds the campaign (a process of ours stands in for it)."""
    _, out = campaign_dir
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        me = psutil.Process(proc.pid)
        ledger = Ledger.open_existing(out)
        ledger.acquire_driver(proc.pid, me.create_time(), driver_alive)
        ledger.close()
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _cli(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(main, list(args))
    return res.exit_code, res.output


def test_second_driver_on_a_live_campaign_is_refused_and_writes_nothing(campaign_dir, live_driver):
    f, out = campaign_dir
    before = _tree(out)
    for args in (("run", str(f)), ("resume", str(out))):
        code, text = _cli(*args)
        assert code == 2, text
        assert f"being run by pid {live_driver.pid}" in text and "nothing was changed" in text
        assert _tree(out) == before, f"{args[0]} changed the output dir"


def test_changed_campaign_is_refused_and_writes_nothing(campaign_dir):
    f, out = campaign_dir
    data = yaml.safe_load(f.read_text())
    data["bench"]["cmd"] += " --seed 7"  # changes what the finished point means
    f.write_text(yaml.safe_dump(data))
    before = _tree(out)
    code, text = _cli("run", str(f))
    assert code == 2 and "bench_cmd" in text, text
    assert _tree(out) == before


@pytest.mark.parametrize("field, value, named", [
    ("runs", 0, "runs"),
    ("warmup", "many", "warmup"),
    ("bench", {"backend": "telepathy"}, "bench.backend"),
])
def test_bad_input_is_refused_and_writes_nothing(campaign_dir, field, value, named):
    f, out = campaign_dir
    data = yaml.safe_load(f.read_text())
    if isinstance(value, dict):
        data[field].update(value)
    else:
        data[field] = value
    f.write_text(yaml.safe_dump(data))
    before = _tree(out)
    code, text = _cli("run", str(f))
    assert code == 2 and named in text, text
    assert _tree(out) == before


def test_changed_settings_are_refused_with_their_differences_and_write_nothing(campaign_dir):
    f, out = campaign_dir
    data = yaml.safe_load(f.read_text())
    data["warmup"] = 5
    data["transport"] = {"wait_s": 3}
    f.write_text(yaml.safe_dump(data))
    before = _tree(out)
    code, text = _cli("run", str(f))
    assert code == 2, text
    assert "warmup: 0 -> 5" in text and "transport.wait_s: 30.0 -> 3.0" in text and "--accept-changes" in text
    assert _tree(out) == before


def test_changed_versions_are_refused_on_resume(campaign_dir):
    _, out = campaign_dir
    ledger = Ledger.open_existing(out)
    old = drift.recorded(ledger) or {}
    ledger.set_meta(drift.SETTINGS_KEY, json.dumps({**old, "vllm": "0.0.1", "nodes_ray": ["1.0.0"]}))
    ledger.close()
    before = _tree(out)
    code, text = _cli("resume", str(out))
    assert code == 2 and "vllm: '0.0.1' -> " in text, text
    assert _tree(out) == before


def test_accepted_changes_are_recorded_as_an_event_that_status_shows(campaign_dir):
    f, out = campaign_dir
    data = yaml.safe_load(f.read_text())
    data["warmup"] = 5
    f.write_text(yaml.safe_dump(data))
    spec = load_campaign(f)
    with pytest.raises(drift.SettingsChanged):
        open_campaign(spec, out)
    _, ledger = open_campaign(spec, out, accept_changes=True)
    accepted = drift.check(ledger, drift.measured_with(spec), accept=True)
    drift.record(ledger, drift.measured_with(spec), accepted)
    assert drift.check(ledger, drift.measured_with(spec), accept=False) == []  # the new settings are kept
    [event] = [e for e in ledger.events() if e["kind"] == drift.EVENT]
    assert "warmup: 0 -> 5" in event["detail"]
    ledger.close()
    code, text = _cli("status", str(out))
    assert code == 0 and "settings changed" in text and "warmup: 0 -> 5" in text, text


def test_settings_before_any_point_is_done_are_no_drift(tmp_path):
    f = standin_campaign(tmp_path)
    spec = load_campaign(f)
    _, ledger = open_campaign(spec, Path(spec.campaign.output_dir or ""))
    drift.record(ledger, {**drift.measured_with(spec), "warmup": 9}, [])
    assert drift.check(ledger, drift.measured_with(spec), accept=False) == []
    ledger.close()


def test_differences_flatten_nested_settings_and_ignore_unknown_keys():
    old = {"warmup": 0, "transport": {"wait_s": 30.0, "require": "any"}, "nodes_vllm": ["0.11"]}
    new = {"warmup": 0, "transport": {"wait_s": 30.0, "require": "ib"}, "vllm": "0.12"}
    assert drift.differences(old, new) == ["transport.require: 'any' -> 'ib'"]


def test_open_campaign_refuses_a_held_campaign_unless_forced(campaign_dir, live_driver):
    f, out = campaign_dir
    spec = load_campaign(f)
    with pytest.raises(CampaignHeld):
        open_campaign(spec, out)
    _, ledger = open_campaign(spec, out, force=True)
    ledger.close()


def test_report_events_section_shows_accepted_changes_and_lost_drivers(campaign_dir):
    from raysweep.report.page import build_report
    from raysweep.report.run_sections import events_section
    from raysweep.results.data import read_data

    _, out = campaign_dir
    data = read_data(out)
    assert events_section(data.events, data.drivers) is None
    ledger = Ledger.open_existing(out)
    ledger.add_event(drift.EVENT, [], [], "accepted: warmup: 0 -> 5")
    ledger.acquire_driver(999999, 1.0, lambda *a: False)
    ledger.acquire_driver(999998, 2.0, lambda *a: False)  # finds the first one dead: lost
    ledger.close()
    data = read_data(out)
    html = events_section(data.events, data.drivers) or ""
    assert "settings_changed" in html and "warmup: 0 -&gt; 5" in html
    assert "driver_lost" in html and "driver pid 999999" in html and "999998" not in html
    assert html in build_report(out)  # the page shows the section as read once with the rest of its data


def _sleeper(ignore_term: bool = False, child: bool = False) -> subprocess.Popen:
    code = "import signal, subprocess, sys, time\n"
    if ignore_term:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    if child:
        code += "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
    code += "print('up', flush=True)\ntime.sleep(120)\n"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
    return proc


def test_what_dead_drivers_left_is_killed_at_once_and_a_live_drivers_helpers_are_left_alone(tmp_path):
    """Helpers that ignore SIGTERM (as Ray's agents waiting on a dead GCS do) and their children go with
    one SIGKILL each; the helpers of a driver that still runs stay."""
    from raysweep.drive import recovery

    ledger = Ledger(tmp_path / "ledger.sqlite")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stubborn = [_sleeper(ignore_term=True, child=True) for _ in range(4)]
    live_driver = _sleeper()
    kept = _sleeper()
    try:
        d1 = ledger.acquire_driver(dead.pid, psutil.Process().create_time(), lambda *a: False)
        ledger.record_driver_helpers(d1, [(p.pid, psutil.Process(p.pid).create_time()) for p in stubborn])
        ledger.release_driver(d1, "lost")
        d2 = ledger.acquire_driver(live_driver.pid, psutil.Process(live_driver.pid).create_time(), driver_alive)
        ledger.record_driver_helpers(d2, [(kept.pid, psutil.Process(kept.pid).create_time())])
        children = [c for p in stubborn for c in psutil.Process(p.pid).children()]
        assert len(children) == 4
        stopped = recovery.reap_lost_drivers(recovery.dead_drivers(ledger))
        assert sorted(stopped) == sorted([p.pid for p in stubborn] + [c.pid for c in children])
        assert all(p.wait(timeout=10) is not None for p in stubborn)
        assert not any(procs.is_alive(c.pid, c.create_time()) for c in children)
        assert kept.poll() is None and live_driver.poll() is None
    finally:
        for p in [*stubborn, live_driver, kept]:
            p.kill()
            p.wait()
        ledger.close()


# -- ports without a race -----------------------------------------------------------------------------------

_THIEF = '''
import os, subprocess, sys, time
args = sys.argv[1:]
host, port = args[args.index("--host") + 1], args[args.index("--port") + 1]
marker = os.environ["THIEF_MARKER"]
if not os.path.exists(marker):  # the first start: another server binds our port first (with SO_REUSEADDR, as
    open(marker, "w").close()   # vLLM and uvicorn do) and listens on it
    code = ("import socket, time\\ns = socket.socket()\\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\\n"
            f"s.bind(({host!r}, {port}))\\ns.listen()\\n"
            f"open({marker!r} + '.pid', 'w').write(str(__import__('os').getpid()))\\n"
            "time.sleep(120)")
    subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    while not os.path.exists(marker + ".pid") or not open(marker + ".pid").read():
        time.sleep(0.02)
os.execv(sys.executable, [sys.executable, os.environ["STANDIN_SERVER"], *args])
'''


@pytest.mark.ray
def test_many_servers_started_at_once_on_one_node_each_get_their_own_port(gpu_cluster, tmp_path):
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from raysweep.serve.server import ServerHost

    node = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU"))
    hosts = [ServerHost.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
             .remote(f"many-{i}", str(tmp_path)) for i in range(12)]
    try:
        infos = ray.get([h.start.remote([PY, str(STANDIN / "server.py"), "--model", "m"], {}, True, False, 3)
                         for h in hosts], timeout=180)
        ready = ray.get([h.wait_ready.remote(60, "m") for h in hosts], timeout=240)
        assert all(r["ok"] for r in ready), ready
        ports = [r["port"] for r in ready]
        assert len(set(ports)) == 12 and ports == [i["port"] for i in infos]
        assert all(r["port_retries"] == 0 for r in ready)
    finally:
        ray.get([h.stop.remote(5) for h in hosts], timeout=120)
        for h in hosts:
            ray.kill(h)


@pytest.mark.ray
def test_a_server_that_lost_its_port_starts_again_on_another_without_a_failed_attempt(gpu_cluster, tmp_path,
                                                                                      monkeypatch):
    import os
    import signal


    wrapper = tmp_path / "thief.py"
    wrapper.write_text(_THIEF)
    marker = tmp_path / "taken"
    monkeypatch.setenv("THIEF_MARKER", str(marker))
    monkeypatch.setenv("STANDIN_SERVER", str(STANDIN / "server.py"))
    f = standin_campaign(tmp_path)
    data = yaml.safe_load(f.read_text())
    data["serve"]["cmd"] = f"{PY} {wrapper} --model m"
    data["serve"]["env"] = {"THIEF_MARKER": str(marker), "STANDIN_SERVER": str(STANDIN / "server.py")}
    f.write_text(yaml.safe_dump(data))
    try:
        summary, out = run_file(f)
    finally:
        pid_file = Path(str(marker) + ".pid")
        if pid_file.exists():  # the server's guard may have ended it with the first server's tree
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert summary.counts["done"] == 2 and not summary.failures
    ledger = Ledger.open_existing(out)
    try:
        assert all(p.attempts == 1 for p in ledger.points())
        [event] = [e for e in ledger.events() if e["kind"] == "port_retry"]
        assert "started again on port" in event["detail"]
        [server] = ledger.servers()
        assert server.state != "failed" and str(server.port) in event["detail"]
    finally:
        ledger.close()


# -- a full disk, an unreachable mirror ---------------------------------------------------------------------

def test_an_injected_full_disk_fails_writes_with_enospc_naming_the_path_until_it_is_freed(tmp_path, monkeypatch):
    import errno

    from raysweep.record import files

    flag = tmp_path / "full"
    monkeypatch.setenv(files.DISK_FULL_ENV, str(flag))
    target = tmp_path / "out" / "r.json"
    files.write_json_atomic(target, {"a": 1})
    flag.touch()
    with pytest.raises(OSError) as caught:
        files.write_json_atomic(target, {"a": 2})
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(target)
    assert files.no_space(caught.value) and json.loads(target.read_text()) == {"a": 1}
    assert not [p for p in target.parent.iterdir() if ".tmp" in p.name]
    assert "MiB free on the filesystem of" in files.free_space(tmp_path / "not" / "there")
    flag.unlink()
    files.write_json_atomic(target, {"a": 3})
    assert json.loads(target.read_text()) == {"a": 3}


def test_an_unreachable_mirror_loses_nothing_and_catches_up_when_it_is_back(tmp_path):
    from raysweep.record import storage

    out = tmp_path / "out"
    out.mkdir()
    Ledger(out / "ledger.sqlite").close()
    blocked = tmp_path / "mirror"
    blocked.write_text("a file where the mirror's directory should be: every copy fails")
    mirror = storage.Mirror(f"file://{blocked}/camp", out)
    for i in range(3):
        (out / "points").mkdir(exist_ok=True)
        (out / "points" / f"run={i}.json").write_text(str(i))
        assert mirror.sync() is False
    blocked.unlink()
    assert mirror.sync() is True
    copied = blocked / "camp"
    assert sorted(p.name for p in (copied / "points").iterdir()) == ["run=0.json", "run=1.json", "run=2.json"]
    assert (copied / "ledger.sqlite").is_file()


@pytest.mark.ray
def test_a_full_disk_at_a_result_write_waits_and_loses_nothing(gpu_cluster, tmp_path, monkeypatch):
    """The disk is full when the first result is written: the driver waits with the result in memory,
    saying which path and how much space is free, and finishes once space is freed; no attempt is lost."""
    import threading

    from raysweep.drive import point
    from raysweep.record import files

    flag = tmp_path / "full"
    flag.touch()
    monkeypatch.setenv(files.DISK_FULL_ENV, str(flag))
    monkeypatch.setattr(point, "DISK_RETRY_S", 0.2)
    f = standin_campaign(tmp_path)
    out = tmp_path / "out"
    seen: list[str] = []

    def free_when_told() -> None:
        while flag.exists():
            if (out / "ledger.sqlite").is_file():
                led = Ledger.open_existing(out)
                seen.extend(e["detail"] for e in led.events() if e["kind"] == "disk_full")
                led.close()
                if seen:
                    flag.unlink()
            time.sleep(0.2)

    watcher = threading.Thread(target=free_when_told, daemon=True)
    watcher.start()
    summary, out = run_file(f)
    watcher.join(timeout=5)
    assert summary.counts["done"] == 2 and not summary.failures, summary
    assert seen and "No space left on device" in seen[0] and "MiB free on the filesystem of" in seen[0]
    assert "run=" in seen[0] and "waiting for space" in seen[0]
    led = Ledger.open_existing(out)
    assert all(p.attempts == 1 for p in led.points())
    led.close()
    assert len(list((out / "points").rglob("run=*.json"))) == 2


@pytest.mark.ray
def test_a_record_that_cannot_be_written_fails_its_point_once_naming_the_path_and_the_cause(gpu_cluster, tmp_path,
                                                                                            monkeypatch):
    """Not a full disk: a write refused for another cause (here EXDEV, as a driver whose working directory came
    from another mount namespace met). Each point fails once with the path and the cause; the server is not
    blamed: no point runs again, no server starts again."""
    import errno

    from raysweep.drive import point

    tried: list[str] = []

    def refused(path, obj):
        tried.append(str(path))
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), str(path))

    monkeypatch.setattr(point, "write_json_atomic", refused)
    f = standin_campaign(tmp_path, max_attempts=3)
    summary, out = run_file(f)
    assert summary.counts["failed"] == 2 and summary.counts["done"] == 0, summary
    assert len(tried) == 2 and len(set(tried)) == 2          # each point's record tried once
    led = Ledger.open_existing(out)
    try:
        points = led.points()
        servers = led.servers()
        errors = led.attempt_errors()
    finally:
        led.close()
    assert len(servers) == 1                                 # the server was not replaced
    assert len(errors) == 2 and sorted(e["point_id"] for e in errors) == sorted(p.point_id for p in points)
    for p in points:
        assert p.state == "failed" and p.attempts == 3, p     # no attempt left: resuming does not run it again
        assert "Invalid cross-device link" in p.error and f"{out}/points/" in p.error and "run=" in p.error
        assert "not run again" in p.error
    summary, _ = run_file(f)                                 # resumed: nothing runs again
    assert len(tried) == 2 and summary.counts["failed"] == 2


# -- the short chaos run ------------------------------------------------------------------------------------------

def test_the_chaos_watch_compares_snapshots_in_the_order_they_were_read(tmp_path, monkeypatch):
    """The chaos run's watcher thread and its fault injector both read the ledger. A snapshot read before a point
    was done and compared after a later one saw it done would count that point as run twice."""
    import threading
    from types import SimpleNamespace

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import bench_chaos

    out = tmp_path / "out"
    (out / "points").mkdir(parents=True)
    (out / "points" / "r.json").write_text(json.dumps({"standin_call": "c1"}))
    (out / bench_chaos.LEDGER_FILE).write_text("")
    reads = iter(["running", "done"])

    class Snapshot:
        def __init__(self) -> None:
            self.state = next(reads)

        def points(self):
            if self.state == "running":
                time.sleep(0.5)   # the first reader is slow: the second reads (done) meanwhile
            return [SimpleNamespace(point_id="p", state=self.state, result_path="points/r.json")]

        def events(self):
            return []

        def servers(self, active_only=False):
            return []

        def close(self) -> None:
            pass

    monkeypatch.setattr(bench_chaos.Ledger, "open_existing", staticmethod(lambda _out: Snapshot()))
    watch = bench_chaos.Watch(out)
    first = threading.Thread(target=watch.poll)
    first.start()
    time.sleep(0.1)
    watch.poll()
    first.join()
    assert watch.first == {"p": (hashlib.sha256((out / "points" / "r.json").read_bytes()).hexdigest(), "c1")}
    assert watch.regressed == set() and watch.rewritten == set()


@pytest.mark.ray
def test_one_fault_of_each_kind_loses_nothing_runs_nothing_twice_and_leaves_nothing(tmp_path):
    """benchmarks/bench_chaos.py in short: a driver SIGKILL, a server killed, a client actor killed, a node
    removed, a server stopped (SIGSTOP) and a full disk, at random moments of one campaign."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import bench_chaos

    r = bench_chaos.run_chaos(1, seed=3, work=tmp_path, configs=2, inputs=4, runs=4, sleep_s=1.0, gap_s=(0.5, 1.5))
    assert r["injected"] == {k: 1 for k in bench_chaos.KINDS}, r
    assert (r["results_lost"], r["run_twice"], r["unfinished"], r["processes_left"]) == (0, 0, 0, []), r
    assert r["done"] == r["points"] == 32
    assert {"server_unresponsive", "disk_full"} <= set(r["events"]), r
    # the server stopped while its bench call slept before its requests was replaced as unresponsive
    assert [s["replaced"] for s in r["server_stops"]] == [True], r

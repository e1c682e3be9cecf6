"""Chaos: one campaign on the stand-in server under faults of six kinds injected at random times from a seed.

    python benchmarks/bench_chaos.py --per-kind 10 --seed 1 --json chaos.json   # the recorded run (minutes)
    python benchmarks/bench_chaos.py --per-kind 1 --seed 1 --runs 4 --no-resume-timing   # one fault of each kind

The campaign runs on a local multi-node Ray cluster (`ray.cluster_utils.Cluster`: a head and two nodes with
simulated GPUs) that `raysweep run --address` joins, so that a node can be removed and another added. Kinds:
`driver_kill` (SIGKILL to `raysweep run`, then `raysweep resume`), `server_kill` (SIGKILL to a server process
mid-point), `client_kill` (SIGKILL to the client actor running a point's benchmark), `node_removed` (the node
under a running point removed, a fresh one added), `server_stop` (SIGSTOP to a server while a bench call
against it still sleeps before its requests: the point fails at its timeout and the server is replaced; no
other fault comes until it was, so that each stop is told apart and counted) and `disk_full` (every write
of the driver fails with ENOSPC, through `raysweep.record.files.DISK_FULL_ENV`, from a random moment until the
driver has said so in the ledger, then space is "freed").

It counts, from the ledger, the result files and the stand-in bench's own journal (each call logs its id at
start and end; a point's result carries the id of the call that measured it): finished results lost (a point
once done that is no longer done, or whose result file changed), points run twice (a done point that ran
again: its state went back, or its result came from another call), points left unfinished, processes left
behind (stand-in servers and benches of this run, killed drivers' embedded Ray), and the longest time without
a new finished point. Then, unless --no-resume-timing, the resume time on an embedded Ray (`raysweep run` with
no --address): from `raysweep resume` to its first new finished point, after one SIGKILL and after ten in a
row (each 5 to 17 s after the resume before it), beside the time Ray's own start takes here.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
STANDIN = ROOT / "tests" / "standin"
sys.path.insert(0, str(ROOT))

from raysweep import procs
from raysweep.ledger import LEDGER_FILE, Ledger
from raysweep.record import files

KINDS = ("driver_kill", "server_kill", "client_kill", "node_removed", "server_stop", "disk_full")
POINT_TIMEOUT_S = 20.0
HEALTH = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 1000, "health_check_failure_threshold": 5,
          "health_check_timeout_ms": 2000}
# in the environment of this run's stand-in servers and benches: faults go to them, and only they are counted
# as left behind, whatever else runs on the machine
RUN_MARK = "RAYSWEEP_CHAOS_RUN"
ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
       "VLLM_HOST_IP": "127.0.0.1"}


def campaign_file(work: Path, configs: int, inputs: int, runs: int, sleep_s: float) -> Path:
    """The campaign: `configs` server configs x `inputs` bench points x `runs`, on the stand-in server."""
    data = {
        "name": "chaos", "output_dir": str(work / "out"), "runs": runs, "max_attempts": 100,
        "serve": {"cmd": f"{sys.executable} {STANDIN / 'server.py'} --model m", "ready_timeout_s": 60,
                  "env": {RUN_MARK: str(work)},
                  "params": {"grid": {"max_num_seqs": [4 * 2**i for i in range(configs)]}}},
        "bench": {"backend": "command", "timeout_s": POINT_TIMEOUT_S, "env": {RUN_MARK: str(work)},
                  "cmd": f"{sys.executable} {STANDIN / 'bench.py'} --model m --num-prompts 6 --sleep {sleep_s} "
                         f"--journal {work / 'journal.jsonl'}",
                  "params": {"grid": {"random_input_len": [16 * (i + 1) for i in range(inputs)]}}},
    }
    f = work / "campaign.yaml"
    f.write_text(yaml.safe_dump(data))
    return f


# -- watching the ledger ---------------------------------------------------------------------------------------

@dataclass
class Watch:
    """What the ledger and result files said over time (polled every 0.25 s)."""

    out: Path
    done_times: list[float] = field(default_factory=list)   # when each new done point was first seen
    first: dict[str, tuple[str, str]] = field(default_factory=dict)  # point -> (result sha256, call id)
    regressed: set[str] = field(default_factory=set)   # done points seen not done later
    rewritten: set[str] = field(default_factory=set)   # done points whose result file changed
    events: list[dict[str, Any]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def poll(self) -> dict[str, Any]:
        """Read the ledger and compare it with what was seen. The watcher's thread and the fault injector both
        poll: one at a time, so that a snapshot read earlier is never compared after one read later (a point
        seen running, then done by the other thread, would read as done and then no longer done)."""
        with self.lock:
            return self._poll()

    def _poll(self) -> dict[str, Any]:
        if not (self.out / LEDGER_FILE).is_file():
            return {}
        try:
            led = Ledger.open_existing(self.out)
        except Exception:
            return {}
        try:
            points, self.events = led.points(), led.events()
            servers = led.servers(active_only=True)
        except Exception:
            return {}
        finally:
            led.close()
        now = time.time()
        for p in points:
            if p.state == "done":
                digest = _digest(self.out / (p.result_path or ""))
                if p.point_id not in self.first:
                    self.first[p.point_id] = digest
                    self.done_times.append(now)
                elif digest != self.first[p.point_id] and digest[0]:
                    self.rewritten.add(p.point_id)
            elif p.point_id in self.first:
                self.regressed.add(p.point_id)
        return {"points": points, "servers": servers}

    def run(self) -> None:
        while not self.stop.is_set():
            self.poll()
            time.sleep(0.25)


def _digest(path: Path) -> tuple[str, str]:
    try:
        data = path.read_bytes()
    except OSError:
        return "", ""
    try:
        call = json.loads(data).get("standin_call", "")
    except ValueError:
        call = ""
    return hashlib.sha256(data).hexdigest(), call


# -- faults ----------------------------------------------------------------------------------------------------

class Chaos:
    """The driver under faults: starts it, injects, resumes it, and keeps what happened."""

    def __init__(self, work: Path, cluster: Any, address: str | None, rng: random.Random) -> None:
        self.work, self.cluster, self.address, self.rng = work, cluster, address, rng
        self.out = work / "out"
        self.flag = work / "disk-full"
        self.watch = Watch(self.out)
        self.driver: subprocess.Popen | None = None
        self.drivers: list[int] = []
        self.resumes: list[float] = []   # resume start -> first new finished point, per driver kill
        self.injected: dict[str, int] = {k: 0 for k in KINDS}
        self.missed: dict[str, int] = {k: 0 for k in KINDS}
        self.sleep_s = 1.0   # what each stand-in bench call sleeps before its requests
        self.stops: list[dict[str, Any]] = []   # per server_stop: replaced (an unresponsive event), or how not
        self.faults: list[tuple[float, str]] = []   # (time, kind) of each fault injected

    def env(self) -> dict[str, str]:
        return {**os.environ, **ENV, files.DISK_FULL_ENV: str(self.flag)}

    def start_driver(self, resume: bool) -> None:
        cli = [sys.executable, "-m", "raysweep"]
        args = ["resume", str(self.out)] if resume else ["run", str(self.work / "campaign.yaml")]
        if self.address:
            args += ["--address", self.address]
        log = open(self.work / "driver.log", "ab")
        self.driver = subprocess.Popen([*cli, *args], env=self.env(), stdout=log, stderr=log, cwd=self.work)
        self.drivers.append(self.driver.pid)

    def resume_timed(self) -> float | None:
        """`raysweep resume` now; seconds until its first new finished point (None: none within 180 s)."""
        seen = len(self.watch.done_times)
        t0 = time.time()
        self.start_driver(resume=True)
        if not procs.wait_for(lambda: len(self.watch.done_times) > seen or self.finished(), 180, 0.1):
            return None
        return time.time() - t0 if len(self.watch.done_times) > seen else None

    def finished(self) -> bool:
        return self.driver is not None and self.driver.poll() is not None

    def running_point(self, min_age_s: float = 0.5, timeout_s: float = 60) -> dict[str, Any] | None:
        """A point running for at least `min_age_s` on a server whose process we know: its server row."""
        found: list[Any] = []

        def look() -> bool:
            state = self.watch.poll()
            busy = {p.server_id for p in state.get("points", []) if p.state == "running" and p.started_at
                    and time.time() - p.started_at > min_age_s}
            found[:] = [s for s in state.get("servers", []) if s.server_id in busy and s.pid]
            return bool(found) or self.finished()
        procs.wait_for(look, timeout_s, 0.2)
        return {"server": self.rng.choice(found)} if found else None

    def inject(self, kind: str) -> bool:
        """One fault of `kind`; False when there was no moment for it (nothing running)."""
        if kind == "driver_kill":
            assert self.driver is not None
            self.driver.send_signal(signal.SIGKILL)
            self.driver.wait()
            took = self.resume_timed()
            if took is not None:
                self.resumes.append(took)
            return True
        if kind == "disk_full":
            return self.disk_full()
        if kind == "server_stop":
            return self.stop_server()
        hit = self.running_point()
        if hit is None:
            return False
        srv = hit["server"]
        if kind == "server_kill":
            pid = _server_process(srv.pid)
            if pid is None:
                return False
            os.kill(pid, signal.SIGKILL)
            return True
        if kind == "client_kill":  # a bench call lives a second or two: look for one for up to 30 s
            actor, deadline = _client_actor(self.work), time.time() + 30
            while actor is None and time.time() < deadline and not self.finished():
                time.sleep(0.05)
                actor = _client_actor(self.work)
            if actor is None:
                return False
            os.kill(actor, signal.SIGKILL)
            return True
        if kind == "node_removed":
            return self.remove_node(srv)
        raise ValueError(kind)

    def stop_server(self) -> bool:
        """SIGSTOP to the server a stand-in bench call is about to load (the call still sleeping before its
        requests, so the point cannot finish before its timeout), then no other fault until the driver has
        replaced it (a `server_unresponsive` event) or the stopped process is gone another way; each stop's
        outcome is kept in `self.stops`."""
        deadline = time.time() + 30
        target = _bench_before_requests(self.work, self.sleep_s)
        while target is None and time.time() < deadline and not self.finished():
            time.sleep(0.05)
            target = _bench_before_requests(self.work, self.sleep_s)
        pid = None if target is None else _server_on_port(self.work, target)
        if pid is None:
            return False
        before = sum(1 for e in self.watch.events if e["kind"] == "server_unresponsive")
        os.kill(pid, signal.SIGSTOP)
        t0 = time.time()

        def settled() -> bool:
            self.watch.poll()
            return sum(1 for e in self.watch.events if e["kind"] == "server_unresponsive") > before \
                or not procs.is_alive(pid, None) or self.finished()
        procs.wait_for(settled, POINT_TIMEOUT_S + 90, 0.25)
        replaced = sum(1 for e in self.watch.events if e["kind"] == "server_unresponsive") > before
        self.stops.append({"replaced": replaced, "gone": not procs.is_alive(pid, None),
                           "driver_ended": self.finished(), "seconds": round(time.time() - t0, 1)})
        if not replaced and procs.is_alive(pid, None):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)
        return True

    def disk_full(self) -> bool:
        """The disk is full from now until the driver has recorded that it waits for space (or 30 s)."""
        if self.running_point() is None:
            return False
        before = sum(1 for e in self.watch.events if e["kind"] == "disk_full")
        self.flag.touch()
        try:
            procs.wait_for(lambda: sum(1 for e in self.watch.events if e["kind"] == "disk_full") > before
                           or self.finished(), 30, 0.2)
        finally:
            self.flag.unlink(missing_ok=True)
        return True

    def remove_node(self, srv: Any) -> bool:
        node_id = next((r.get("node_id") for r in srv.rank_list()), None)
        node = next((n for n in self.cluster.worker_nodes if n.node_id == node_id), None)
        if node is None:
            return False
        self.cluster.remove_node(node, allow_graceful=False)
        self.cluster.add_node(num_cpus=2, num_gpus=2, resources={"chaos_node": 1},
                              runtime_env_dir_name=f"rr_chaos_{self.rng.randrange(10**9)}")
        return True


def _server_process(guard_pid: int) -> int | None:
    """The stand-in server under a guard (its direct child)."""
    try:
        kids = psutil.Process(guard_pid).children()
    except psutil.Error:
        return None
    return next((k.pid for k in kids if "server.py" in " ".join(k.cmdline())), None)


def _of_run(p: psutil.Process, work: Path) -> bool:
    """Whether `p` was started for the run in `work` (its environment carries the run's mark)."""
    try:
        return p.environ().get(RUN_MARK) == str(work)
    except psutil.Error:
        return False


def _uptime_s() -> float:
    """Seconds since the machine booted (`/proc/uptime`)."""
    with open("/proc/uptime") as f:
        return float(f.read().split()[0])


def _age_s(create_time: float, uptime_s: float) -> float:
    """How long ago a process started, on the kernel's boot clock. psutil's `create_time` is the boot time plus
    the process's start since boot, and Linux gives the boot time to the whole second (`btime` in /proc/stat):
    against `time.time()` a process just started can read up to a second old (0.78 s on one boot), more than
    the half second a stand-in bench call sleeps before its requests. The start since boot is exact."""
    return uptime_s - (create_time - psutil.boot_time())


def _bench_before_requests(work: Path, sleep_s: float) -> int | None:
    """The port a stand-in bench call of this run will load, for a call still in its opening sleep (younger
    than `sleep_s` less a margin), or None when no call is."""
    now = _uptime_s()
    for p in psutil.process_iter(["cmdline", "create_time"]):
        cmd = p.info["cmdline"] or []
        if str(STANDIN / "bench.py") not in cmd or "--base-url" not in cmd or not _of_run(p, work):
            continue
        if _age_s(p.info["create_time"] or 0.0, now) < max(sleep_s - 0.5, 0.1):
            url = cmd[cmd.index("--base-url") + 1]
            with contextlib.suppress(ValueError):
                return int(url.rstrip("/").rsplit(":", 1)[1].split("/")[0])
    return None


def _server_on_port(work: Path, port: int) -> int | None:
    """This run's stand-in server started with `--port port` (not its guard, whose command holds it too)."""
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if len(cmd) > 1 and cmd[1] == str(STANDIN / "server.py") and "--port" in cmd \
                and cmd[cmd.index("--port") + 1] == str(port) and _of_run(p, work):
            return p.pid
    return None


def _client_actor(work: Path) -> int | None:
    """The Ray worker (a command client actor) whose child runs a stand-in bench of this run right now."""
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if str(STANDIN / "bench.py") in cmd and _of_run(p, work):
            try:
                return p.parent().pid
            except (psutil.Error, AttributeError):
                continue
    return None


# -- counting ----------------------------------------------------------------------------------------------------

def leftovers(work: Path, drivers: list[int]) -> list[str]:
    """Processes of this run still alive: stand-in servers and benches, guards, killed drivers' embedded Ray."""
    left = []
    for p in psutil.process_iter(["cmdline", "pid"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if (str(STANDIN) in cmd and ("server.py" in cmd or "bench.py" in cmd) and _of_run(p, work)) or \
                any(f"/tmp/rs-{d}" in cmd for d in drivers):
            with contextlib.suppress(psutil.Error):
                if p.status() != psutil.STATUS_ZOMBIE:
                    left.append(f"{p.pid} {cmd[:100]}")
    return left


def count(chaos: Chaos, total: int) -> dict[str, Any]:
    w = chaos.watch
    w.poll()
    led = Ledger.open_existing(chaos.out)
    try:
        points = {p.point_id: p for p in led.points()}
    finally:
        led.close()
    lost = sorted(pid for pid in w.first if points.get(pid) is None or points[pid].state != "done"
                  or _digest(chaos.out / (points[pid].result_path or "")) != w.first[pid])
    journal = [json.loads(line) for line in (chaos.work / "journal.jsonl").read_text().splitlines() if line.strip()]
    finished_calls = {j["call"] for j in journal if j["event"] == "done"}
    recorded = [w.first[p][1] for p in w.first]
    same_call = sorted(c for c in set(recorded) if recorded.count(c) > 1)
    twice = sorted(w.regressed | w.rewritten) + same_call
    gaps = [b - a for a, b in zip(w.done_times, w.done_times[1:])]
    return {"points": total, "done": sum(1 for p in points.values() if p.state == "done"), "results_lost": len(lost),
            "run_twice": len(twice), "unfinished": total - sum(1 for p in points.values() if p.state == "done"),
            "bench_calls": len({j["call"] for j in journal}), "calls_finished_not_recorded":
                len(finished_calls - set(recorded)), "longest_no_progress_s": round(max(gaps, default=0.0), 1),
            "attempts": sum(p.attempts for p in points.values()),
            "twice_detail": {"regressed": sorted(w.regressed), "rewritten": sorted(w.rewritten),
                             "same_call": [[p for p in w.first if w.first[p][1] == c] for c in same_call]}}


# -- the two parts -------------------------------------------------------------------------------------------------

def run_chaos(per_kind: int, seed: int, work: Path, configs: int = 3, inputs: int = 6, runs: int = 4,
              sleep_s: float = 1.0, gap_s: tuple[float, float] = (1.0, 4.0)) -> dict[str, Any]:
    """The campaign under `per_kind` faults of each kind, in a random order and at random gaps."""
    from ray.cluster_utils import Cluster

    rng = random.Random(seed)
    work.mkdir(parents=True, exist_ok=True)
    campaign_file(work, configs, inputs, runs, sleep_s)
    os.environ.update(ENV)
    temp_dir = f"/tmp/rs-c{os.getpid()}"  # the cluster's session files: removed with it
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 0, "include_dashboard": False,
                                                           "temp_dir": temp_dir, "_system_config": HEALTH})
    for i in range(2):
        cluster.add_node(num_cpus=2, num_gpus=2, runtime_env_dir_name=f"rr_chaos{i}")
    cluster.wait_for_nodes()
    chaos = Chaos(work, cluster, cluster.address, rng)
    chaos.sleep_s = sleep_s
    watcher = threading.Thread(target=chaos.watch.run, daemon=True)
    watcher.start()
    plan = [k for k in KINDS for _ in range(per_kind)]
    rng.shuffle(plan)
    t0 = time.time()
    try:
        chaos.start_driver(resume=False)
        procs.wait_for(lambda: len(chaos.watch.done_times) > 0, 180, 0.2)
        for kind in plan:
            time.sleep(rng.uniform(*gap_s))
            for _ in range(3):  # no moment for it (no server process or node to hit just then): again, twice
                if chaos.finished():
                    chaos.start_driver(resume=True)  # it ended (finished or stopped): more work for the faults
                at = time.time()
                if chaos.inject(kind):
                    chaos.injected[kind] += 1
                    chaos.faults.append((at, kind))
                    break
                chaos.missed[kind] += 1
        while True:  # to the end, resumed if it stopped early
            assert chaos.driver is not None
            chaos.driver.wait()
            state = chaos.watch.poll()
            if not any(p.state in ("pending", "running") for p in state.get("points", [])) \
                    or time.time() - t0 > 3600:  # every point done, or failed for good
                break
            chaos.start_driver(resume=True)
        time.sleep(3)
        result = count(chaos, len(state.get("points", [])))
        result.update(seconds=round(time.time() - t0), injected=chaos.injected, missed=chaos.missed,
                      resumes_s=[round(x, 1) for x in chaos.resumes],
                      no_progress_limit_s=POINT_TIMEOUT_S + 30, events=_event_counts(chaos.watch.events),
                      server_stops=chaos.stops, longest_gap=_longest_gap(chaos, t0))
        result["processes_left"] = leftovers(work, chaos.drivers)
        return result
    finally:
        chaos.watch.stop.set()
        if chaos.driver is not None and chaos.driver.poll() is None:
            chaos.driver.kill()
        cluster.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


def _longest_gap(chaos: Chaos, t0: float) -> dict[str, Any]:
    """The longest time without a new finished point: when it began (seconds into the run), and the faults
    injected from 60 s before it to its end, with the ledger's events in it (what held the campaign)."""
    times = chaos.watch.done_times
    if len(times) < 2:
        return {}
    a, b = max(zip(times, times[1:]), key=lambda ab: ab[1] - ab[0])
    return {"start_s": round(a - t0, 1), "seconds": round(b - a, 1),
            "faults": [(round(at - a, 1), kind) for at, kind in chaos.faults if a - 60 <= at <= b],
            "events": [(round(e["at"] - a, 1), e["kind"], (e["detail"] or "")[:120]) for e in chaos.watch.events
                       if a - 5 <= e["at"] <= b]}


def _event_counts(events: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in events:
        out[e["kind"]] = out.get(e["kind"], 0) + 1
    return out


def ray_start_s() -> float:
    """Seconds an embedded Ray takes to start here (`ray.init(address="local")`, as the driver does)."""
    code = ("import time, ray; t = time.time(); ray.init(address='local', include_dashboard=False, "
            f"_temp_dir='/tmp/rs-r{os.getpid()}', num_cpus=4); print(time.time() - t); ray.shutdown()")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, **ENV}, capture_output=True, text=True,
                          timeout=300)
    return float(done.stdout.strip().splitlines()[-1])


def resume_timing(seed: int, work: Path, kills: int = 10, samples: int = 5) -> dict[str, Any]:
    """Resume on an embedded Ray: `samples` times after one SIGKILL (each kill after the resume before it
    finished two points), and after `kills` in a row 5 to 17 s after each resume; medians of the samples, and
    of three measures of Ray's own start, since the machine is shared."""
    rng = random.Random(seed)
    starts = [ray_start_s() for _ in range(3)]
    out: dict[str, Any] = {"ray_start_s": round(statistics.median(starts), 1),
                           "ray_start_samples_s": [round(x, 1) for x in starts]}
    for label, n in (("one_kill", 1), ("ten_kills", kills)):
        w = work / label
        w.mkdir(parents=True, exist_ok=True)
        runs = 4 if n == 1 else 16  # ten resumes in a row may finish many points: work is left for the last
        campaign_file(w, 1, 8, runs, 0.5)
        chaos = Chaos(w, None, None, rng)
        watcher = threading.Thread(target=chaos.watch.run, daemon=True)
        watcher.start()
        try:
            chaos.start_driver(resume=False)
            procs.wait_for(lambda c=chaos: len(c.watch.done_times) >= 2, 240, 0.1)
            timed = _single_kills(chaos, samples) if n == 1 else _kills_in_a_row(chaos, n, rng)
            assert chaos.driver is not None
            chaos.driver.wait(timeout=600)
            time.sleep(2)
            counted = count(chaos, 8 * runs)
            out[label] = {"kills": n, **timed, "done": counted["done"], "results_lost": counted["results_lost"],
                          "run_twice": counted["run_twice"], "processes_left": leftovers(w, chaos.drivers)}
        finally:
            chaos.watch.stop.set()
            if chaos.driver is not None and chaos.driver.poll() is None:
                chaos.driver.kill()
    return out


def _single_kills(chaos: Chaos, samples: int) -> dict[str, Any]:
    """`samples` rounds of: SIGKILL, `raysweep resume` timed to its first new point, two more points."""
    took = []
    for _ in range(samples):
        assert chaos.driver is not None
        chaos.driver.send_signal(signal.SIGKILL)
        chaos.driver.wait()
        seen = len(chaos.watch.done_times)
        t = chaos.resume_timed()
        if t is not None:
            took.append(round(t, 1))
        procs.wait_for(lambda s=seen: len(chaos.watch.done_times) >= s + 2 or chaos.finished(), 120, 0.1)
    return {"resume_to_first_point_s": statistics.median(took) if took else None, "samples_s": took}


def _kills_in_a_row(chaos: Chaos, n: int, rng: random.Random) -> dict[str, Any]:
    """`n` SIGKILLs, each 5 to 17 s after the resume before it, then `raysweep resume` timed; also the time to
    the first new point of each resume in the row that made one before its kill."""
    rounds, within = [], []
    for i in range(n):
        assert chaos.driver is not None
        chaos.driver.send_signal(signal.SIGKILL)
        chaos.driver.wait()
        if i < n - 1:
            before, t0 = len(chaos.watch.done_times), time.time()
            chaos.start_driver(resume=True)
            time.sleep(rng.uniform(5, 17))
            rounds.append(len(chaos.watch.done_times) - before)
            if rounds[-1] > 0:
                within.append(round(chaos.watch.done_times[before] - t0, 1))
    took = chaos.resume_timed()
    return {"resume_to_first_point_s": None if took is None else round(took, 1), "in_the_row_s": within,
            "rounds_with_progress": sum(1 for r in rounds if r > 0), "rounds": len(rounds)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--per-kind", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--work", default=None, help="working directory (default: a new temporary one)")
    ap.add_argument("--configs", type=int, default=3, help="server configurations")
    ap.add_argument("--inputs", type=int, default=8, help="bench points per configuration")
    ap.add_argument("--runs", type=int, default=16)
    ap.add_argument("--sleep", type=float, default=1.5, help="seconds each stand-in bench call sleeps")
    ap.add_argument("--no-resume-timing", action="store_true")
    ap.add_argument("--resume-timing-only", action="store_true")
    ap.add_argument("--json", default=None, help="also write the result here")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="rs-chaos-"))
    result: dict[str, Any] = {"seed": args.seed, "per_kind": args.per_kind}
    if not args.resume_timing_only:
        result["chaos"] = run_chaos(args.per_kind, args.seed, work / "chaos", args.configs, args.inputs, args.runs,
                                    args.sleep)
        print(json.dumps(result["chaos"], indent=1), flush=True)
    if not args.no_resume_timing:
        result["resume"] = resume_timing(args.seed, work / "resume")
        print(json.dumps(result["resume"], indent=1), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

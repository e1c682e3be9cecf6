"""The `command` bench backend: `vllm bench serve` run by a Ray client actor, its JSON read back.

The client actor runs on CPU resources (never a GPU), on any node. One Ray call per point: the actor runs
the command to completion in a temporary directory and returns the parsed result JSON with the tail of
the command's output; the driver writes the result file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import resource
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import ray

from raysweep import grid, procs
from raysweep.procs import cpu_text

__all__ = ["METRIC_PERCENTILES", "NOT_JUDGED", "PERCENTILE_METRICS", "CommandBench", "CommandClient", "bench_argv",
           "client_judgement", "result_record"]

log = logging.getLogger(__name__)

PERCENTILE_METRICS = "ttft,tpot,itl,e2el"
METRIC_PERCENTILES = ("50", "90", "95", "99")
RESULT_FILE = "result.json"
_TMP_PREFIX = "raysweep-bench-"  # + the client's pid: the directories of a killed client can be found
_ADDRESS_FLAGS = {"host": None, "port": None, "base_url": None}


def _remove_stale_dirs() -> None:
    """Remove the working directories that client actors killed mid-point (a stopped or lost server)
    left on this node: those whose owner pid no longer runs."""
    for d in Path(tempfile.gettempdir()).glob(f"{_TMP_PREFIX}*-*"):
        owner = d.name[len(_TMP_PREFIX):].split("-", 1)[0]
        if owner.isdigit() and not procs.is_alive(int(owner), None):
            shutil.rmtree(d, ignore_errors=True)


def bench_argv(argv: list[str], base_url: str, result_dir: str, *, num_prompts: int | None = None) -> list[str]:
    """The benchmark command pointed at `base_url`, saving its JSON, with all the percentiles we report."""
    user = grid.find_flag_value(argv, "--metric-percentiles", "--metric_percentiles") or ""
    wanted = list(dict.fromkeys([*METRIC_PERCENTILES, *(p.strip() for p in user.split(",") if p.strip())]))
    wanted.sort(key=float)
    out = grid.apply_to_cmd(argv, _ADDRESS_FLAGS)
    overrides: dict[str, Any] = {"base_url": base_url, "save_result": True, "result_dir": result_dir,
                                 "result_filename": RESULT_FILE, "percentile_metrics": PERCENTILE_METRICS,
                                 "metric_percentiles": ",".join(wanted)}
    if num_prompts is not None:
        overrides["num_prompts"] = num_prompts
    return grid.apply_to_cmd(out, overrides)


def result_record(result: dict[str, Any], serve_params: dict[str, Any], bench_params: dict[str, Any],
                  run: int, extra: dict[str, Any]) -> dict[str, Any]:
    """One result record as vLLM's sweep writes it (result + overrides + run_number), plus our fields."""
    record = dict(result)
    record.update(serve_params)
    record.update(bench_params)
    record["run_number"] = run
    record.update(extra)
    return record


NOT_JUDGED = ("not judged: the benchmark command's JSON holds no send times (vllm bench serve records when "
              "requests finished, not when each could and did begin); run backend: native to judge the client")


def client_judgement(result: dict[str, Any]) -> dict[str, Any]:
    """The client-bottleneck judgement a command's JSON allows: none (`client_limited` stays unknown, and
    the validity record lists the check as not judged), said in `client_limited_reason`."""
    if result.get("client_limited") is not None:
        return {}
    return {"client_limited": None, "client_limited_reason": NOT_JUDGED}


@ray.remote(num_cpus=0.1, max_restarts=0)
class CommandClient:
    """Runs benchmark commands (and `after_bench_cmd`) as child processes on its node, at niceness 0 where
    the OS allows (Ray starts workers niced, and a child starts at its parent's niceness), on the CPUs of
    `bench.cpu_affinity` when given (children inherit them)."""

    def __init__(self, cpu_ids: list[int] | None = None) -> None:
        if cpu_ids and (failure := procs.pin_cpus(set(cpu_ids))):
            log.warning("command client: %s; it runs on CPUs %s", failure, sorted(os.sched_getaffinity(0)))

    def run(self, argv: list[str], base_url: str, env: dict[str, str], timeout_s: float,
            num_prompts: int | None = None) -> dict[str, Any]:
        _remove_stale_dirs()
        nice_failure = procs.niceness_zero()
        with tempfile.TemporaryDirectory(prefix=f"{_TMP_PREFIX}{os.getpid()}-") as tmp:
            full = procs.resolve_executable(bench_argv(argv, base_url, tmp, num_prompts=num_prompts))
            out = _run(full, env, timeout_s, cwd=tmp)
            samples = out.pop("cpu_samples", [])
            client = out.pop("client", {})
            path = Path(tmp) / RESULT_FILE
            if out["ok"]:
                try:
                    out["result"] = json.loads(path.read_text())
                    out["result"]["client_cpu_s"] = load_window_cpu(samples,
                                                                    float(out["result"].get("duration") or 0))
                    out["result"].update(client, client_nice_lowering_failed=nice_failure is not None,
                                         client_node_ips=ray.util.get_node_ip_address())
                    out["result"].update(client_judgement(out["result"]))
                except (OSError, ValueError) as exc:
                    out.update(ok=False, error=f"no readable result JSON from the benchmark command: {exc}")
        out["command"] = grid.shell_join(grid.mask_argv(full))
        return out

    def run_plain(self, argv: list[str], env: dict[str, str], timeout_s: float) -> dict[str, Any]:
        procs.niceness_zero()
        out = _run(procs.resolve_executable(argv), env, timeout_s, cwd=None)
        out.pop("cpu_samples", None)
        return out


@dataclass
class _Job:
    refs: list[Any]
    clients: int = 1


class CommandBench:
    """The driver's side of the command backend: one client actor per server configuration."""

    def __init__(self, env: dict[str, str], timeout_s: float, cpu_ids: list[int] | None = None) -> None:
        self.env, self.timeout_s, self.cpu_ids = env, timeout_s, cpu_ids
        self.actor: Any = None

    def warm(self) -> None:
        if self.actor is None:
            self.actor = CommandClient.remote(self.cpu_ids)  # type: ignore[attr-defined]  # a Ray actor class

    def submit(self, argv: list[str], base_url: str, model: str | None, num_prompts: int | None = None,
               clients: int | None = None) -> _Job:
        self.warm()
        return _Job([self.actor.run.remote(argv, base_url, self.env, self.timeout_s, num_prompts)])

    def finish(self, job: _Job, answers: list[dict[str, Any]]) -> dict[str, Any]:
        return answers[0]

    def run_plain(self, argv: list[str], env: dict[str, str], timeout_s: float) -> Any:
        self.warm()
        return self.actor.run_plain.remote(argv, env, timeout_s)

    def close(self) -> None:
        if self.actor is not None:
            with contextlib.suppress(Exception):
                ray.kill(self.actor)
        self.actor = None


def _run(argv: list[str], env: dict[str, str], timeout_s: float, cwd: str | None) -> dict[str, Any]:
    t0 = time.monotonic()
    with tempfile.TemporaryFile() as logf:
        try:
            proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=procs.child_env(env), cwd=cwd)
        except OSError as exc:
            return {"ok": False, "error": f"cannot start {argv[0]!r}: {exc}", "output_tail": "", "duration_s": 0.0}
        client = _process_fields(proc.pid)
        try:
            code, cpu = _wait_sampling_cpu(proc, timeout_s)
            error = None if code == 0 else f"benchmark command exited with code {code}"
        except subprocess.TimeoutExpired:
            procs.kill_tree(proc.pid, grace_s=5)
            proc.wait()
            code, error = None, f"benchmark command ran past its {timeout_s:.0f} s timeout and was killed"
        logf.seek(0)
        text = logf.read().decode(errors="replace")
    tail = grid.mask_text("\n".join(text.splitlines()[-40:]), grid.secret_values(argv, procs.child_env(env)))
    out: dict[str, Any] = {"ok": error is None, "error": error, "returncode": code, "output_tail": tail,
                           "duration_s": time.monotonic() - t0}
    if error is None:
        out.update(cpu_samples=cpu, client=client)
    return out


def _process_fields(pid: int) -> dict[str, Any]:
    """`client_nice` and `client_cpu_affinity` of the benchmark process, read as it starts."""
    try:
        p = psutil.Process(pid)
        return {"client_nice": p.nice(), "client_cpu_affinity": cpu_text(p.cpu_affinity() or [])}
    except (psutil.Error, AttributeError):  # gone already, or no affinity on this OS
        return {}


_CPU_SAMPLE_S = 0.25


def _wait_sampling_cpu(proc: subprocess.Popen, timeout_s: float) -> tuple[int, list[tuple[float, float]]]:
    """Wait for the command, sampling its CPU time (user + system, children included) every 0.25 s:
    (monotonic time, CPU seconds) pairs, the last one at its exit from the kernel's exact count."""
    before = _children_cpu()
    deadline, samples = time.monotonic() + timeout_s, []
    ps = psutil.Process(proc.pid)
    while True:
        try:
            code = proc.wait(timeout=min(_CPU_SAMPLE_S, max(deadline - time.monotonic(), 0.0)))
            break
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                raise
            with contextlib.suppress(psutil.Error):
                t = ps.cpu_times()
                samples.append((time.monotonic(), t.user + t.system + t.children_user + t.children_system))
    samples.append((time.monotonic(), _children_cpu() - before))
    return code, samples


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def load_window_cpu(samples: list[tuple[float, float]], duration_s: float) -> float | None:
    """The command's CPU seconds over the last `duration_s` before it exited (its benchmark's load window;
    the import and data-set work before it excluded), interpolated between samples."""
    if not samples or not duration_s > 0:
        return None
    end_t, end_cpu = samples[-1]
    start = end_t - duration_s
    earlier = [(t, c) for t, c in samples if t <= start]
    later = [(t, c) for t, c in samples if t > start]
    if not earlier:
        return end_cpu
    (t0, c0), (t1, c1) = earlier[-1], later[0]
    return end_cpu - (c0 + (c1 - c0) * (start - t0) / (t1 - t0))

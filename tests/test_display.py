"""The progress display of `raysweep run`: every driver event handled, one line each, nothing twice; Ray's
notices and the log records an event line repeats kept off the terminal (they go to the log file)."""

from __future__ import annotations

import io
import logging
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from raysweep.cli import display, logs

PACKAGE = Path(__file__).resolve().parent.parent / "raysweep"


def emitted_kinds() -> set[str]:
    kinds = set()
    for f in PACKAGE.rglob("*.py"):
        kinds |= set(re.findall(r"""emit\(\s*["'](\w+)["']""", f.read_text()))
    return kinds


def test_every_event_the_driver_emits_is_handled():
    kinds = emitted_kinds()
    assert {"campaign_start", "point_done", "server_ready"} <= kinds  # the scan finds the driver's events
    assert not display.SHOWN & display.SILENT
    assert kinds <= display.SHOWN | display.SILENT, f"unhandled: {kinds - display.SHOWN - display.SILENT}"


@pytest.fixture
def shown(monkeypatch):
    buf = io.StringIO()
    monkeypatch.setattr(display, "console", Console(file=buf, width=400, force_terminal=False))
    return buf


def _events():
    serve = SimpleNamespace(id="cfg1", label="max_num_seqs=8")
    layout = SimpleNamespace(describe=lambda: "1 node x 1 GPU(s)")
    point = SimpleNamespace(serve=serve, bench=SimpleNamespace(label="rate=4"), run=0)
    one_node = {"nnodes": 1, "intra": "none", "channels": 0}
    two_nodes = {"nnodes": 2, "inter": "IB", "intra": "P2P", "channels": 4, "versions": ["2.21.5"]}
    outcome = SimpleNamespace(state="bracketed", largest_pass=4.0, smallest_fail=8.0, probes=[1, 2, 3])
    return [
        ("campaign_start", {"total": 3, "counts": {"done": 0}}),
        ("server_starting", {"serve": serve, "server_id": "cfg1-a", "layout": layout}),
        ("server_ready", {"serve": serve, "server_id": "cfg1-a", "elapsed": 12.0}),
        ("transport", {"serve": serve, "server_id": "cfg1-a", "verdict": one_node, "refused": None}),
        ("transport", {"serve": serve, "server_id": "cfg1-b", "verdict": two_nodes, "refused": None}),
        ("warmup_done", {"server_id": "cfg1-a", "ok": True}),
        ("point_start", {"point": point, "attempt": 1, "server_id": "cfg1-a"}),
        ("client_limited", {"point": point, "clients": 1, "reruns": 1}),
        ("point_done", {"point": point, "result": {"request_throughput": 4.0, "median_ttft_ms": 20.0,
                                                   "client_limited": True, "client_limited_reason": "send lag"}}),
        ("point_failed", {"point": point, "error": "server died", "attempt": 1}),
        ("sla_done", {"serve": serve, "bench_id": "b1", "target": "p99_ttft_ms<=200", "outcome": outcome}),
        ("precision", {"serve": serve, "bench_id": "b1", "state": "max_runs", "runs_done": 10, "rel_half_width": 0.041,
                       "target": 0.03, "metric": "output_throughput"}),
        ("precision", {"serve": serve, "bench_id": "b2", "state": "max_runs", "runs_done": 4, "rel_half_width": 0.16,
                       "target": 0.05, "metric": "output_throughput",
                       "text": "the rule needs 2 successive runs within +-5.0 %; stopped at max_runs"}),
        ("workload_levels", {"serve": serve, "bench_id": "b1", "variable": "max_concurrency", "serial": 1,
                             "batch": 15, "levels": [6, 10], "state": "decided"}),
        ("disk_full", {"point": point, "error": "cannot write the result of point p1: [Errno 28] No space left"}),
        ("node_lost", {"serve": serve, "nodes": ["n1"], "reason": "node n1 was lost"}),
        ("replica", {"serve": serve, "nodes": ["n2"], "replica": 1, "points_left": 9}),
        ("node_lost", {"serve": serve, "nodes": ["n2"], "reason": "node n2 was lost", "replica": 1}),
        ("server_failed", {"serve": serve, "server_id": "cfg1-c", "error": "exit code 1", "log_tail": ""}),
        ("config_failed", {"serve": serve, "error": "gave up"}),
        ("server_stopped", {"server_id": "cfg1-a", "left": 0}),
        ("campaign_end", {"counts": {"done": 1}, "stopped": None}),
    ]


def test_one_line_per_shown_event_and_none_twice(shown):
    events = _events()
    with display._ProgressDisplay() as d:
        for kind, data in events:
            d.event(kind, **data)
    lines = [line for line in shown.getvalue().splitlines() if line.strip() and "━" not in line]  # not the bar
    said = [k for k, _ in events if k in display.SHOWN]
    assert len(lines) == len(said) - 1, "\n".join(lines)  # all but the one-node transport verdict
    assert len(set(lines)) == len(lines)
    assert not any("intra-node none" in line for line in lines)  # one node, no NCCL: nothing to report
    assert any("inter-node IB" in line for line in lines)
    assert sum("client-limited" in line for line in lines) == 1  # on the point's line, not a line of its own
    assert any("one more server (replica 1) to share its 9 points left" in line for line in lines)
    assert any("load levels max_num_seqs=8 / b1: max_concurrency serial 1, batch 15; levels 6, 10" in line
               for line in lines)
    assert any(line.startswith("disk full cannot write the result of point p1") for line in lines)
    assert any("precision max_num_seqs=8 / b1: stopped at max_runs without +-3 % of output_throughput after 10 "
               "run(s) (+-4.1 %)" in line for line in lines)
    assert any(line.startswith("precision max_num_seqs=8 / b2: not reached after 4 run(s): the rule needs 2 "
                               "successive runs within +-5.0 %; stopped at max_runs") for line in lines), lines
    assert any("replica 1 of server config cfg1 is torn down (its other servers go on)" in line for line in lines)


def test_nothing_is_drawn_before_the_campaign_starts(shown):
    with display._ProgressDisplay():
        pass
    assert shown.getvalue() == ""


def test_log_records_an_event_already_tells_are_dropped():
    def record(name: str, msg: str) -> logging.LogRecord:
        return logging.LogRecord(name, logging.ERROR, __file__, 1, msg, ("cfg1", "why"), None)

    assert display.told_by_event(record("raysweep.place.scheduler", "server config %s: %s; tearing its server down"))
    assert display.told_by_event(record("raysweep.drive.state", "server config %s: %s"))
    assert not display.told_by_event(record("raysweep.drive.driver", "warmup against server %s failed: %s"))
    assert not display.told_by_event(record("other", "server config %s: %s"))


def test_ray_notices_go_to_the_log_file_not_the_terminal(tmp_path):
    import ray  # noqa: F401  (gives the "ray" logger its terminal handler)

    ray_log = logging.getLogger("ray")
    terminal = [h for h in ray_log.handlers if logs._is_terminal(h)]
    assert terminal, "Ray's logger has no terminal handler to quiet"
    before = [h.level for h in terminal]
    root_term = logging.StreamHandler(io.StringIO())
    logging.getLogger().addHandler(root_term)
    log_file = tmp_path / "logs" / "raysweep.log"
    try:
        with logs.routed(log_file, drop=display.told_by_event):
            assert all(h.level >= logging.ERROR for h in terminal)
            logging.getLogger("ray._private.worker").info("Started a local Ray instance.")
            logging.getLogger("ray.auth").warning("Token authentication is enabled for this Ray cluster.")
            logging.getLogger("raysweep.drive.state").error("server config %s: %s", "cfg1", "gave up")
            logging.getLogger("raysweep.drive.driver").warning("servers run at niceness %s", 5)
        assert [h.level for h in terminal] == before
        text = log_file.read_text()
        assert "Started a local Ray instance." in text and "Token authentication" in text
        assert "server config cfg1: gave up" in text and "niceness 5" in text
        on_terminal = root_term.stream.getvalue()
        assert "niceness 5" in on_terminal and "gave up" not in on_terminal
    finally:
        logging.getLogger().removeHandler(root_term)

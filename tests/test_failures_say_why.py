"""Failures that say why: a server that exits before it is ready is reported with the first error line of its
own log (terminal, `status`, ledger, report), a start that fails the same way twice (or on an argument) is
not tried again, and Ray failing to start is one message with what to try, without a traceback."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from helpers import run_file, standin_campaign

from raysweep.cli import main
from raysweep.drive.driver import ray_start_error
from raysweep.errors import RayStartError


def test_ray_start_timeout_message_says_what_to_try():
    exc = ray_start_error(None, Exception("The current node timed out during startup. This could happen because "
                                          "some of the raylet failed to startup or the GCS has become overloaded."))
    text = str(exc)
    assert isinstance(exc, RayStartError) and exc.exit_code == 3
    assert "the embedded local Ray did not start (The current node timed out during startup." in text
    assert "raysweep resume OUTPUT_DIR" in text and "--address auto" in text and "Nothing was run" in text
    port = str(ray_start_error(None, OSError("[Errno 98] Address already in use")))
    assert "A port Ray needs is taken" in port
    joined = str(ray_start_error("10.0.0.9:6379", ConnectionError("could not connect")))
    assert "could not join the Ray cluster at --address 10.0.0.9:6379" in joined and "ray status" in joined


def test_run_when_ray_does_not_start_exits_3_without_a_traceback(tmp_path, monkeypatch):
    import ray

    def timed_out(*args, **kwargs):
        raise Exception("The current node timed out during startup. This could happen because some of the raylet "
                        "failed to startup or the GCS has become overloaded.")

    monkeypatch.setattr(ray, "init", timed_out)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    f = standin_campaign(tmp_path)
    res = CliRunner().invoke(main, ["run", str(f)])
    assert res.exit_code == 3, res.output
    assert "Traceback" not in res.output
    assert "timed out during startup" in res.output and "raysweep resume" in res.output


@pytest.mark.ray
def test_failed_starts_say_their_root_cause_and_are_not_retried_in_vain(gpu_cluster, tmp_path):
    f = standin_campaign(tmp_path, serve_params=[
        {"fail_with": "ValueError: No available memory for the cache blocks."},
        {"fail_usage": "unrecognized arguments: --max-num-seqz 4"},
        {"fail_with": "ValueError: max_model_len 4096 is larger than the model's 2048"},
        {"fail_start": False}], max_attempts=3)
    summary, out = run_file(f)
    assert summary.counts["done"] == 2 and summary.counts["failed"] == 6
    from raysweep.ledger import Ledger

    led = Ledger.open_existing(out)
    servers = led.servers()
    points = {p.point_id: p for p in led.points()}
    led.close()
    failed = [s for s in servers if s.state == "failed"]
    # the memory ValueError twice (then not again, though max_attempts is 3), the argument error and the
    # ValueError of the start's own arguments once each
    assert len(failed) == 4, [(s.serve_id, s.error) for s in servers]
    own = [s for s in failed if "max_model_len 4096" in (s.error or "")]
    assert len(own) == 1
    by_serve = {p.serve_id: p for p in points.values() if p.state == "failed"}
    assert sorted(p.attempts_made for p in by_serve.values()) == [1, 1, 2]  # the starts each really had
    value = [s for s in failed if "ValueError: No available memory" in (s.error or "")]
    usage = [s for s in failed if "unrecognized arguments" in (s.error or "")]
    assert len(value) == 2 and len(usage) == 1
    assert all(s.error.endswith(": ValueError: No available memory for the cache blocks.") for s in value)
    assert usage[0].error.endswith("server.py: error: unrecognized arguments: --max-num-seqz 4")
    errors = [p.error or "" for p in points.values() if p.state == "failed"]
    assert sum("not started again: it failed twice with the same root cause" in e for e in errors) == 2
    assert sum("not started again: an argument error fails the same way every time" in e for e in errors) == 2
    assert sum("not started again: ValueError at start fails the same way every time" in e for e in errors) == 2
    assert not any("See root cause above" in e for e in errors)

    res = CliRunner().invoke(main, ["status", str(out)])
    assert "ValueError: No available memory for the cache blocks." in res.output
    assert "server.py: error: unrecognized arguments: --max-num-seqz 4" in res.output
    res = CliRunner().invoke(main, ["report", str(out)])
    assert res.exit_code == 0, res.output
    html = (out / "report.html").read_text()
    assert "ValueError: No available memory for the cache blocks." in html
    assert "unrecognized arguments: --max-num-seqz 4" in html


@pytest.mark.ray
@pytest.mark.vllm
def test_a_real_vllm_serve_refusing_an_argument_is_recorded_with_its_root_cause_and_started_once(
        gpu_cluster, tiny_model, tmp_path):
    """The option's name is vLLM's (the parser check passes it), its value is not: vLLM's own argparse refuses
    it, and that line is the recorded cause, once, though max_attempts allows three starts."""
    import yaml

    from raysweep.ledger import Ledger

    data = {"name": "bad-arg", "output_dir": str(tmp_path / "out"), "max_attempts": 3,
            "serve": {"cmd": f"vllm serve {tiny_model} --load-format dummy --dtype bfloat16 "
                             "--gpu-memory-utilization 0.2 --enforce-eager --max-model-len 1024",
                      "env": {"VLLM_CPU_KVCACHE_SPACE": 1, "VLLM_HOST_IP": "127.0.0.1"}, "ready_timeout_s": 300,
                      "params": [{"max_model_len": "not-a-length"}]},
            "bench": {"backend": "native", "cmd": f"vllm bench serve --model {tiny_model} --num-prompts 4 "
                                                  "--random-input-len 16 --random-output-len 4"}}
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(data))
    summary, out = run_file(f)
    assert summary.counts["failed"] == 3 and summary.counts["done"] == 0  # its one bench point's 3 runs
    led = Ledger.open_existing(out)
    servers, points = led.servers(), led.points()
    led.close()
    assert len(servers) == 1 and servers[0].state == "failed"  # started once
    error = servers[0].error or ""
    assert "argument --max-model-len" in error and "not-a-length" in error, error
    assert "See root cause above" not in error
    assert all("not started again: an argument error fails the same way every time" in (p.error or "")
               for p in points)

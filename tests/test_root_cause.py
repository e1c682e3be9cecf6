"""The root cause of a server that exited before it was ready: the first error line of its own log."""

from __future__ import annotations

from raysweep.serve.root_cause import root_cause, same_cause

# The shape of a vLLM 0.32 log whose engine refused its configuration: the exception 30 lines above the
# traceback's last line, each line behind the engine process's prefix and the logger's.
ENGINE = "(EngineCore_DP0 pid=4242) "
VALUE_ERROR_LOG = "\n".join([
    "INFO 11-28 14:00:01 [api_server.py:1900] vLLM API server version 0.32.0",
    "WARNING 11-28 14:00:02 [config.py:100] ValueError: recovered from a probe of the platform",
    ENGINE + "INFO 11-28 14:00:05 [core.py:90] Initializing a V1 LLM engine",
    ENGINE + "ERROR 11-28 14:00:06 [core.py:700] EngineCore failed to start.",
    ENGINE + "ERROR 11-28 14:00:06 [core.py:700] Traceback (most recent call last):",
    ENGINE + 'ERROR 11-28 14:00:06 [core.py:700]   File "/v/engine/core.py", line 690, in run_engine_core',
    ENGINE + "ERROR 11-28 14:00:06 [core.py:700]     raise ValueError(msg)",
    ENGINE + "ERROR 11-28 14:00:06 [core.py:700] ValueError: No available memory for the cache blocks. "
             "Try increasing `VLLM_CPU_KVCACHE_SPACE`.",
    *[f"noise line {i}" for i in range(30)],
    "Traceback (most recent call last):",
    '  File "/v/entrypoints/cli/main.py", line 73, in main',
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
])


def test_the_first_exception_line_not_the_last_traceback_line():
    cause = root_cause(VALUE_ERROR_LOG)
    assert cause is not None
    assert cause.line == ("ValueError: No available memory for the cache blocks. Try increasing "
                          "`VLLM_CPU_KVCACHE_SPACE`.")
    assert cause.kind == "exception" and not cause.deterministic
    assert cause.lineno == 8


def test_argparse_message_is_an_argument_error():
    log = "\n".join(["Triton is installed, but doesn't include CPU backend. Disabling Triton.",
                     "usage: vllm [-h] [-v]", "            {chat,complete,serve}", "            ...",
                     "vllm: error: unrecognized arguments: --max-num-seqz 4"])
    cause = root_cause(log)
    assert cause is not None and cause.kind == "argument" and cause.deterministic
    assert cause.line == "vllm: error: unrecognized arguments: --max-num-seqz 4"


def test_a_refused_configuration_value_is_an_argument_error_with_its_detail():
    log = "\n".join([
        "Traceback (most recent call last):",
        '  File "/v/engine/arg_utils.py", line 1, in create_engine_config',
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for SchedulerConfig",
        "  Value error, max_num_batched_tokens (16) is smaller than max_model_len (1024). [type=value_error]",
        "    For further information visit https://errors.pydantic.dev/2.11/v/value_error",
    ])
    cause = root_cause(log)
    assert cause is not None and cause.kind == "argument"
    assert "1 validation error for SchedulerConfig" in cause.line
    assert "max_num_batched_tokens (16) is smaller than max_model_len (1024)" in cause.line
    assert "further information" not in cause.line


def test_out_of_memory_line():
    log = "\n".join(["INFO 11-28 14:00:01 [worker.py:1] Loading weights",
                     ENGINE + "ERROR 11-28 14:00:06 [core.py:700] torch.OutOfMemoryError: CUDA out of memory. "
                              "Tried to allocate 2.00 GiB",
                     "RuntimeError: Engine core initialization failed. See root cause above."])
    cause = root_cause(log)
    assert cause is not None and cause.kind == "oom"
    assert cause.line.startswith("torch.OutOfMemoryError: CUDA out of memory")


def test_the_command_raysweep_writes_atop_the_log_is_not_the_cause():
    # its arguments may say anything, out-of-memory words included: the cause is what the server said
    log = "\n".join(["# raysweep: vllm serve m --served-model-name oom-kill-drill --port 8000",
                     "vllm: error: argument --port: invalid int value: 'x'"])
    cause = root_cause(log)
    assert cause is not None and cause.kind == "argument" and cause.lineno == 2
    assert cause.line == "vllm: error: argument --port: invalid int value: 'x'"
    assert root_cause("# raysweep: vllm serve m --served-model-name out-of-memory-drill") is None


def test_nothing_to_say():
    assert root_cause("INFO 11-28 14:00:01 [api_server.py:1] starting\nWARNING 11-28 [x] RuntimeError: no") is None
    assert root_cause("") is None
    # only a pointer upwards: no root cause rather than the pointer
    assert root_cause("RuntimeError: Engine core initialization failed. See root cause above.") is None


def test_long_line_is_cut():
    cause = root_cause("ValueError: " + "x" * 1000)
    assert cause is not None and len(cause.line) == 400 and cause.line.endswith("...")


def test_same_cause_ignores_numbers():
    assert same_cause("OSError: [Errno 98] address 127.0.0.1:8001 in use", "OSError: [Errno 98] address 127.0.0.1:9"
                      " in use")
    assert not same_cause("ValueError: a", "ValueError: b")
    assert not same_cause(None, "ValueError: a")


def test_an_exception_of_the_starts_own_making_is_deterministic_one_about_memory_is_not():
    """A ValueError or an AssertionError at start fails the same command again: not started again (the memory
    shortage of VALUE_ERROR_LOG may depend on what else runs: tried once more)."""
    from raysweep.serve.root_cause import deterministic

    for line in ("ValueError: max_model_len 4096 is larger than the model's 2048",
                 "AssertionError: pipeline stage 1 got no layers", "FileNotFoundError: /models/x/config.json"):
        cause = root_cause(f"Traceback (most recent call last):\n  File \"x.py\", line 1\n{line}")
        assert cause is not None and cause.kind == "exception" and cause.deterministic, line
    assert not deterministic("exception", "RuntimeError: NCCL error: unhandled system error")
    assert not deterministic("exception", "ValueError: No available memory for the cache blocks.")
    assert not deterministic("oom", "torch.OutOfMemoryError: CUDA out of memory")


def test_the_cause_is_taken_from_every_ranks_log_not_the_rank_that_exited():
    """Pipeline parallel across two nodes: rank 1 failed on an AssertionError; rank 0 then lost its peer and
    exited with code 0. The cause is rank 1's, not rank 0's connection error."""
    from raysweep.serve.root_cause import pick_cause

    rank0 = {"line": "ConnectionResetError: [Errno 104] Connection reset by peer", "kind": "exception", "rank": 0}
    rank1 = {"line": "AssertionError: pipeline stage 1 got no layers", "kind": "exception", "rank": 1}
    assert pick_cause([rank0, rank1], exited=0) == rank1
    assert pick_cause([rank0], exited=0) == rank0
    assert pick_cause([], exited=0) is None
    oom = {"line": "torch.OutOfMemoryError: CUDA out of memory", "kind": "oom", "rank": 2}
    assert pick_cause([rank0, rank1, oom], exited=1) == oom
    two = {**rank1, "rank": 0}
    assert pick_cause([two, rank1], exited=1) == rank1  # among equals, the rank that exited


def test_a_configuration_given_up_counts_the_attempts_it_really_had(tmp_path):
    """A server that failed to start twice: its points say 2 attempts, not the 3 the budget holds."""
    from raysweep.ledger import Ledger

    led = Ledger(tmp_path / "ledger.sqlite")
    led.sync(name="c", fingerprint="fp", meaning={}, campaign={"name": "c"}, campaign_file="c.yaml",
             points=[("p1", "s", "b", 0, {}, {})])
    for _ in range(2):
        led.mark_failed("p1", "server failed to start", started=False)
    led.give_up("p1", "not started again", 3)
    (p,) = led.points()
    assert p.attempts == 3 and p.attempts_made == 2 and not led.runnable("s", 3)
    assert led.retry_failed() == 1 and led.points()[0].attempts_made == 0
    led.close()

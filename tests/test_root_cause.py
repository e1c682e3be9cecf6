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

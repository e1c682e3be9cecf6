"""Server starts as data: the phases of a start read from the server's own log (raysweep.startup)."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

from raysweep import startup


def _at(t: float) -> str:
    return time.strftime("%m-%d %H:%M:%S", time.localtime(t))


def _gpu_log(t0: float) -> str:
    """The lines a GPU start of vLLM 0.32 logs, at offsets from the launch `t0`."""
    return "\n".join([
        "# raysweep: vllm serve m --port 1",
        f"(APIServer pid=1) INFO {_at(t0 + 9)} [api_utils.py:347] version 0.32.0",
        f"(EngineCore pid=2) INFO {_at(t0 + 15)} [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: x",
        f"(Worker pid=3) INFO {_at(t0 + 21)} [gpu_model_runner.py:5040] Starting to load model m...",
        f"(Worker pid=3) INFO {_at(t0 + 30)} [default_loader.py:502] Loading weights took 7.52 seconds",
        f"(Worker pid=3) INFO {_at(t0 + 31)} [gpu_model_runner.py:5150] Model loading took 15.2 GiB memory and "
        "8.914203 seconds",
        f"(Worker pid=3) INFO {_at(t0 + 45)} [monitor.py:20] torch.compile took 12.40 s in total",
        f"(Worker pid=3) INFO {_at(t0 + 47)} [mem_utils.py:218] Memory profiling takes 14.02 seconds. Total ...",
        f"(EngineCore pid=2) INFO {_at(t0 + 47)} [kv_cache_utils.py:2328] GPU KV cache size: 100,000 tokens",
        f"(Worker pid=3) INFO {_at(t0 + 52)} [gpu_model_runner.py:6582] Graph capturing finished in 5 secs, took "
        "0.50 GiB",
        f"(EngineCore pid=2) INFO {_at(t0 + 53)} [core.py:396] init engine (profile, create kv cache, warmup model) "
        "took 21.30 s (compilation: 12.40 s)",
        f"(APIServer pid=1) INFO {_at(t0 + 55)} [entry.py:140] Starting vLLM server on http://127.0.0.1:1",
        "INFO:     Application startup complete.",
    ])


def test_phases_of_a_gpu_start_from_its_log():
    t0 = float(int(time.time()) - 100)
    p = startup.phases(_gpu_log(t0), t0, t0 + 56.5)
    assert p["startup_s"] == 56.5
    assert p["startup_imports_s"] == 9 and p["startup_process_s"] == 6 and p["startup_engine_s"] == 6
    assert p["startup_weights_s"] == 8.914203  # vLLM's own figure, the whole model load
    assert p["startup_kv_cache_s"] == 21.3 and p["startup_compile_s"] == 12.4
    assert p["startup_graph_capture_s"] == 5 and p["startup_memory_profiling_s"] == 14.02
    assert p["startup_api_s"] == 56.5 - 53


def test_phases_of_an_eager_cpu_start_leave_out_what_it_does_not_do():
    t0 = float(int(time.time()) - 100)
    log = "\n".join([
        f"(APIServer pid=1) INFO {_at(t0 + 8)} [api_utils.py:347] version 0.32.0",
        f"(EngineCore pid=2) INFO {_at(t0 + 15)} [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: x",
        f"(Worker pid=3) INFO {_at(t0 + 22)} [cpu_model_runner.py:68] Starting to load model m...",
        f"(Worker pid=3) INFO {_at(t0 + 22)} [base_loader.py:82] Initializing model took 0.062479 seconds",
        f"(EngineCore pid=2) INFO {_at(t0 + 23)} [core.py:402] init engine (profile, create kv cache, warmup model) "
        "took 0.39 s",
    ])
    p = startup.phases(log, t0, t0 + 25.0)
    assert p["startup_weights_s"] == 0.062479 and p["startup_kv_cache_s"] == 0.39
    assert "startup_compile_s" not in p and "startup_graph_capture_s" not in p
    assert (p["startup_imports_s"], p["startup_process_s"], p["startup_engine_s"]) == (8, 7, 7)


def test_stamps_of_another_start_or_zone_are_left_out_and_no_log_gives_the_total_only():
    t0 = float(int(time.time()) - 100)
    p = startup.phases(_gpu_log(t0 - 7200), t0, t0 + 56.5)  # two hours off: another zone, another start
    assert "startup_imports_s" not in p and "startup_api_s" not in p and p["startup_compile_s"] == 12.4
    assert startup.phases("", t0, t0 + 3.0) == {"startup_s": 3.0}


def test_medians_per_configuration_and_the_table():
    rows = [SimpleNamespace(serve_id="a", startup=json.dumps({"startup_s": s, "startup_compile_s": c}))
            for s, c in ((40.0, 12.0), (30.0, 2.0), (32.0, 3.0))]
    rows.append(SimpleNamespace(serve_id="b", startup=None))
    assert startup.by_config(rows) == {"a": (3, {"startup_s": 32.0, "startup_compile_s": 3.0})}
    header, table = startup.table_rows(rows)
    assert header == ["server config", "starts", "ready (s)", "compile (s)"]
    assert table == [["a", "3", "32.0", "3.0"]]

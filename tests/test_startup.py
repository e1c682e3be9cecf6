"""Server starts as data: the phases of a start read from the server's own log (raysweep.serve.startup)."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

from raysweep.record.directory import CampaignDir
from raysweep.serve import startup


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
    compiled = log + "\n" + "\n".join([  # the CPU build with compilation on: it compiles while warming up
        f"(Worker pid=3) INFO {_at(t0 + 22)} [cpu_model_runner.py:87] Warming up model for the compilation...",
        f"(Worker pid=3) INFO {_at(t0 + 31)} [cpu_model_runner.py:91] Warming up done."])
    assert startup.phases(compiled, t0, t0 + 34.0)["startup_compile_s"] == 9
    assert "startup_compile_s" not in p and "startup_graph_capture_s" not in p
    assert (p["startup_imports_s"], p["startup_process_s"], p["startup_engine_s"]) == (8, 7, 7)


def test_stamps_of_another_start_or_zone_are_left_out_and_no_log_gives_the_total_only():
    t0 = float(int(time.time()) - 100)
    p = startup.phases(_gpu_log(t0 - 7200), t0, t0 + 56.5)  # two hours off: another zone, another start
    assert "startup_imports_s" not in p and "startup_api_s" not in p and p["startup_compile_s"] == 12.4
    assert startup.phases("", t0, t0 + 3.0) == {"startup_s": 3.0}


def test_medians_per_configuration_and_the_table():
    rows = [SimpleNamespace(server_id=f"s{i}", serve_id="a", started_at=float(i), startup=json.dumps(
        {"startup_s": s, "startup_compile_s": c, "compile_cache": state, "startup_cache_mb": 1.5, "cache_dir": "/c"}))
        for i, (s, c, state) in enumerate(((40.0, 12.0, "cold"), (30.0, 2.0, "warm"), (32.0, 3.0, "warm")))]
    rows.append(SimpleNamespace(server_id="t", serve_id="b", started_at=9.0, startup=None))
    assert startup.by_config(rows) == {"a": (3, {"startup_s": 32.0, "startup_compile_s": 3.0,
                                                 "startup_cache_mb": 1.5}, "1 cold, 2 warm")}
    header, table = startup.table_rows(rows)
    assert header == ["server config", "starts", "compilation", "ready (s)", "compile (s)", "cache MB"]
    assert table == [["a", "3", "1 cold, 2 warm", "32.0", "3.0", "1.5"]]
    assert [r[:4] for r in startup.start_rows(rows)] == [["s0", "a", "cold", "40.0"], ["s1", "a", "warm", "30.0"],
                                                         ["s2", "a", "warm", "32.0"]]
    # the report's section, from the server rows the report read once with the rest of its data
    section = startup.report_section(rows) or ""
    assert "<td>1 cold, 2 warm</td><td>32.0</td>" in section and "3 start(s), 2 warm" in section
    assert startup.report_section(rows[-1:]) is None  # no start recorded its phases


def test_compilation_caches_shared_per_campaign_fresh_per_server_or_the_users(tmp_path, monkeypatch):
    from raysweep.serve import caches

    monkeypatch.setenv("HOME", str(tmp_path))
    camp = SimpleNamespace(name="my campaign/1", serve=SimpleNamespace(share_caches=True))
    assert caches.cache_request(camp, {}) == {caches.CACHE_ENV: "shared:my_campaign_1"}
    assert caches.cache_request(camp, {"VLLM_CACHE_ROOT": "/mine"}) == {}  # the user's choice stays
    env, root, remove = caches.node_dirs("shared:my_campaign_1", "srv")
    assert root == tmp_path / ".cache" / "raysweep" / "my_campaign_1" and remove is None
    assert env == {"VLLM_CACHE_ROOT": str(root / "vllm"), "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
                   "TRITON_CACHE_DIR": str(root / "triton"), "RAYSWEEP_AOT_LOAD": "1"}  # raysweep.vllm_plugin
    assert caches.node_dirs("shared:my_campaign_1", "other")[0] == env  # every server of the campaign: the same
    (root / "vllm" / "graph.bin").write_bytes(b"x" * 1000)
    assert caches.dir_bytes(root) == 1000
    camp.serve.share_caches = False
    assert caches.cache_request(camp, {}) == {caches.CACHE_ENV: "fresh"}
    env1, root1, remove1 = caches.node_dirs("fresh", "a")
    env2, root2, _ = caches.node_dirs("fresh", "b")
    assert root1 == remove1 and root1 != root2 and caches.dir_bytes(root1) == 0  # empty, its own
    assert "RAYSWEEP_AOT_LOAD" not in env1  # a clean cold start: nothing of raysweep's inside vLLM
    caches.remove(remove1)
    assert not root1.exists() and root2.exists()
    caches.remove(root2)
    assert caches.node_dirs(None, "x") == ({}, None, None)


def test_a_start_says_whether_it_found_compiled_graphs():
    from raysweep.serve import caches

    assert caches.compile_cache_state("INFO [backends.py:296] Directly load the compiled graph(s) for compile "
                                      "range (1, 2048) from the cache, took 0.52 s") == "warm"
    assert caches.compile_cache_state("INFO [backends.py:399] Compiling a graph for compile range (1, 2048) "
                                      "takes 9.10 s") == "cold"
    assert caches.compile_cache_state("init engine (profile, create kv cache, warmup model) took 0.39 s") == "none"
    assert caches.compile_cache_state("[decorators.py:319] Directly load AOT compilation from path /c/x") == "warm"
    assert caches.compile_cache_state("[backends.py:1166] Dynamo bytecode transform time: 3.10 s") == "cold"
    # the CPU build of vLLM 0.32 finds the graph a configuration with the same compilation hash saved, fails to
    # load it and compiles again (6 s instead of 15 with Inductor's cached kernels: bench_warm_start, 2026-11-26)
    failed = ("WARNING 11-26 00:54:33 [decorators.py:333] [backbone] Compiling model again due to a load failure "
              "from /c/torch_aot_compile/a597/rank_0_0/model, reason: 'function' object has no attribute "
              "'finalize_loading'\nINFO 11-26 00:54:37 [decorators.py:743] [backbone] saved AOT compiled function "
              "to /c/torch_aot_compile/a597/rank_0_0/model")
    assert caches.compile_cache_state(failed) == "recompiled"
    assert caches.compile_cache_state(failed.split("\n")[1]) == "cold"


def test_the_vllm_plugin_lets_the_cpu_build_load_its_compiled_graph(monkeypatch):
    """vLLM 0.32 calls `finalize_loading` on the function torch loaded from the cache; on the CPU build (Inductor
    backend) that is torch's BundledAOTAutogradSerializableCallable, which hands the call to the plain function
    inside it and fails: the start compiles again. The plugin gives the class a `finalize_loading` that does
    nothing, only for servers raysweep started with shared caches."""
    import importlib.metadata

    from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable as loaded

    from raysweep import vllm_plugin

    plugins = {e.name: e.value for e in importlib.metadata.entry_points(group="vllm.general_plugins")}
    assert plugins.get("raysweep_aot_load") == "raysweep.vllm_plugin:register"  # vLLM calls it in each process

    def inner() -> None:  # what torch's deserialisation holds: a plain function, which has a `serialize`
        return None

    inner.serialize = lambda: b""  # type: ignore[attr-defined]
    fn = loaded(inner)
    assert "finalize_loading" not in vars(loaded)
    monkeypatch.delenv(vllm_plugin.ENV, raising=False)
    vllm_plugin.register()  # not a server of raysweep's shared caches: left as it is
    try:
        fn.finalize_loading(None)
        raise AssertionError("torch's class gained finalize_loading without the plugin")
    except AttributeError as exc:
        assert "'function' object has no attribute 'finalize_loading'" in str(exc)  # what vLLM logs
    monkeypatch.setenv(vllm_plugin.ENV, "1")
    try:
        vllm_plugin.register()
        vllm_plugin.register()  # vLLM loads plugins once per process, but may import them more than once
        assert fn.finalize_loading(None) is None and loaded.finalize_loading is vllm_plugin._nothing_to_finalize
    finally:
        delattr(loaded, "finalize_loading")


@pytest.mark.vllm
def test_vllms_own_loader_loads_an_inductor_graph_with_the_plugin_and_compiles_again_without(tmp_path, monkeypatch):
    """The real code path of a warm start on the CPU build, without a server: torch compiles a function with
    the Inductor backend as vLLM's CPU build does and saves it; vLLM 0.32's loader
    (`vllm.compilation.decorators._try_load_aot_compiled_fn`) fails on it without the plugin, as the servers'
    logs said, and loads it with the plugin, giving the compiled function's results."""
    import importlib.util
    import os

    if importlib.util.find_spec("vllm") is None:
        if os.environ.get("RAYSWEEP_REQUIRE_VLLM"):
            pytest.fail("the vLLM CPU build is required here (RAYSWEEP_REQUIRE_VLLM is set)")
        pytest.skip("the vLLM CPU build is not installed")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    import torch
    from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable as loaded
    from vllm.compilation import decorators
    from vllm.config import VllmConfig

    from raysweep import vllm_plugin

    def forward(x):
        return torch.relu(x * 2.0 + 1.0)

    x = torch.randn(4, 8)
    with torch._dynamo.config.patch(enable_aot_compile=True):
        compiled = torch.compile(forward, fullgraph=True, backend="inductor").aot_compile(((x,), {}))
    path = str(tmp_path / "model")
    compiled.save_compiled_function(path)
    config = VllmConfig()
    model = SimpleNamespace(vllm_config=config, compilation_config=config.compilation_config, _is_encoder=False,
                            forward=forward)
    assert "finalize_loading" not in vars(loaded)
    assert decorators._try_load_aot_compiled_fn(model, path) is None  # "Compiling model again due to a load failure"
    monkeypatch.setenv(vllm_plugin.ENV, "1")
    try:
        vllm_plugin.register()
        fn = decorators._try_load_aot_compiled_fn(model, path)
        assert fn is not None and isinstance(fn._artifacts.compiled_fn, loaded)
        assert torch.equal(fn(x), forward(x))
    finally:
        delattr(loaded, "finalize_loading")


def test_weights_are_read_once_into_the_page_cache(tmp_path):
    from raysweep.serve import caches

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.safetensors").write_bytes(b"w" * 3000)
    (tmp_path / "m" / "config.json").write_text("{}")
    done = caches.warm_files(str(tmp_path / "m"))
    assert done["bytes"] == 3002 and done["seconds"] >= 0
    assert caches.warm_files("org/model")["bytes"] == 0  # a hub name: left to the server


# ---------------------------------------------------------------------------------------------------
# mode: startup, a sweep of `vllm bench startup` over engine parameters
# ---------------------------------------------------------------------------------------------------

def _startup_campaign(tmp_path, **extra) -> object:
    import yaml

    f = tmp_path / "startup.yaml"
    f.write_text(yaml.safe_dump({
        "name": "st", "output_dir": str(tmp_path / "out"), "mode": "startup", "runs": 2,
        "offline": {"cmd": "vllm bench startup --model m --num-iters-cold 2 --num-iters-warmup 1 --num-iters-warm 2",
                    "params": {"grid": {"max_num_seqs": [8, 16]}}}, **extra}))
    return f


def test_a_startup_campaign_is_a_plan_of_startup_runs_and_refuses_bench_parameters(tmp_path):
    import pytest
    from click.testing import CliRunner

    from raysweep.campaign import load_campaign
    from raysweep.cli import main
    from raysweep.errors import CampaignError
    from raysweep.plan.plan import build_plan

    spec = load_campaign(_startup_campaign(tmp_path))
    plan = build_plan(spec)
    assert spec.offline and len(plan.serves) == 2 and len(plan.points) == 4
    assert all("--max-num-seqs" in s.argv and s.argv[:3] == ["vllm", "bench", "startup"] for s in plan.serves)
    f = _startup_campaign(tmp_path, bench={"params": {"grid": {"max_concurrency": [1, 2]}}})
    with pytest.raises(CampaignError) as err:
        load_campaign(f)
    assert err.value.field == "bench" and "mode startup" in str(err.value)
    res = CliRunner().invoke(main, ["run", str(f)])
    assert res.exit_code == 2 and "bench" in res.output and not (tmp_path / "out").exists()
    import yaml

    data = yaml.safe_load(f.read_text())
    data.pop("bench")
    data["offline"]["cmd"] = "vllm bench latency --model m"
    f.write_text(yaml.safe_dump(data))
    with pytest.raises(CampaignError, match="^offline.cmd: mode startup runs `vllm bench startup"):
        load_campaign(f)


def test_startup_results_are_read_from_vllms_json():
    from raysweep.bench.offline import parse_result

    data = {"avg_cold_startup_time": 30.0, "cold_startup_times": [29.0, 31.0],
            "cold_startup_percentiles": {"50": 30.0}, "avg_cold_compilation_time": 10.0,
            "cold_compilation_times": [10.0, 10.0], "avg_warm_startup_time": 20.0, "warm_startup_times": [20.0, 20.0],
            "avg_warm_compilation_time": 1.0, "warm_compilation_times": [1.5, 0.5]}
    res = parse_result("startup", json.dumps(data))
    assert res["offline_kind"] == "startup"
    assert (res["cold_startup_s"], res["cold_startup_iters"], res["warm_startup_s"]) == (30.0, 2, 20.0)
    assert abs(res["cold_startup_std_s"] - 2 ** 0.5) < 1e-9 and res["warm_compilation_max_s"] == 1.5
    assert not any(isinstance(v, (list, dict)) for v in res.values())


def test_a_startup_sweep_of_the_real_vllm_and_the_phases_of_real_server_starts(tiny_model, gpu_cluster, tmp_path):
    """`mode: startup` runs the real `vllm bench startup` (one cold and one warm start each) for two
    max_num_seqs on the session cluster; the results hold both, the summary aggregates them."""
    import yaml
    from helpers import run_file

    from raysweep.results.table import results_table

    f = tmp_path / "startup.yaml"
    f.write_text(yaml.safe_dump({
        "name": "st", "output_dir": str(tmp_path / "out"), "mode": "startup", "runs": 1,
        "offline": {"cmd": f"vllm bench startup --model {tiny_model} --load-format dummy --max-model-len 512 "
                           "--dtype bfloat16 --enforce-eager --num-iters-cold 1 --num-iters-warmup 0 "
                           "--num-iters-warm 1",
                    "env": {"VLLM_CPU_KVCACHE_SPACE": 1, "VLLM_HOST_IP": "127.0.0.1"},
                    "timeout_s": 900, "params": {"grid": {"max_num_seqs": [8, 16]}}}}))
    summary, out = run_file(f)
    assert summary.counts["done"] == 2, summary.counts
    df = results_table(CampaignDir(out))
    assert sorted(df["max_num_seqs"]) == [8, 16] and set(df["offline_kind"]) == {"startup"}
    assert (df["cold_startup_s"] > 0).all() and (df["warm_startup_s"] > 0).all()
    assert (df["cold_startup_iters"] == 1).all() and (df["warm_startup_iters"] == 1).all()


def test_the_summary_aggregates_startup_runs():
    import pandas as pd

    from raysweep.results.aggregate import summarize

    df = pd.DataFrame({"serve_id": ["a"] * 3 + ["b"] * 3, "bench_id": ["o"] * 6, "max_num_seqs": [8] * 3 + [16] * 3,
                       "run": [0, 1, 2] * 2, "cold_startup_s": [30.0, 32.0, 34.0, 40.0, 41.0, 42.0],
                       "warm_startup_s": [20.0, 21.0, 22.0, 25.0, 25.0, 25.0]})
    s = summarize(df).set_index("serve_id")
    assert s.loc["a", "cold_startup_s_mean"] == 32.0 and s.loc["b", "warm_startup_s_std"] == 0.0
    assert s.loc["a", "cold_startup_s_ci_low"] < 32.0 < s.loc["a", "cold_startup_s_ci_high"]


def test_provenance_reads_a_cpu_torch_without_importing_it_beside_a_starting_server(tmp_path, monkeypatch):
    """The host gathers provenance while its server starts: a CPU build of torch is read from its version.py
    (no NCCL to ask for), so no subprocess imports torch beside the server's own imports; a CUDA build is still
    asked in a subprocess for its NCCL."""
    import importlib.util

    from raysweep.place import preflight

    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "version.py").write_text("from typing import Optional\n__version__ = '2.13.0+cpu'\n"
                                                 "debug = False\ncuda: Optional[str] = None\n"
                                                 "hip: Optional[str] = None\n")
    (tmp_path / "cuda").mkdir()
    (tmp_path / "cuda" / "version.py").write_text("__version__ = '2.13.0+cu128'\ncuda = '12.8'\nhip = None\n")
    assert preflight.torch_build([str(tmp_path / "cpu")]) == {"torch": "2.13.0+cpu", "torch_cuda": None,
                                                                 "torch_nccl": None, "hip": None}
    assert preflight.torch_build([str(tmp_path / "nowhere")]) is None
    probes: list[list[str]] = []

    def probe(argv, timeout_s):
        probes.append(argv)
        return {"rc": 0, "stdout": '{"torch": "2.13.0+cu128", "torch_cuda": "12.8", "torch_nccl": "2.27.3"}\n'}

    monkeypatch.setattr(preflight, "run_command", probe)
    for build, expected in (("cpu", ("2.13.0+cpu", None, None, 0)), ("cuda", ("2.13.0+cu128", "12.8", "2.27.3", 1))):
        spec = SimpleNamespace(submodule_search_locations=[str(tmp_path / build)])
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, spec=spec: spec)
        got = preflight.node_versions(5)
        assert (got["torch"], got["torch_cuda"], got["torch_nccl"], len(probes)) == expected, got
        assert "hip" not in got

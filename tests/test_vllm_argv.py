"""Every rank's command, checked by the installed vLLM: for each example campaign in configs/ and a table of
shapes (TP, PP, DP, prefill and decode context parallelism, pack or spread, P/D roles), the argv raysweep
generates for each rank goes through vLLM's own `serve` parser, its dispatch (`ServeSubcommand.cmd`, which
picks one API server, several, or headless ranks) and `create_engine_config`. Nothing is started: the
dispatch's launchers are replaced by a recorder. The engine config must give the world size, the headless
ranks, the API servers and the GPUs on each node that raysweep placed. A vLLM upgrade that renames a flag or
counts GPUs differently fails here at once, without a GPU.

Two things of this CPU build differ from a GPU build and are set as the GPU build has them: Triton (this
build's has no CPU backend, so vLLM would fall back to its V1 model runner, which refuses prefill context
parallelism) and the model (a local config wide enough for TP=8; nothing is downloaded)."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from raysweep.campaign import load_campaign
from raysweep.place.placement import Layout, NodeInfo, layout_for
from raysweep.plan.plan import make_serve
from raysweep.serve.server import expected_model, rank_argv, server_argv

pytestmark = pytest.mark.xdist_group("vllm_argv")  # one worker imports vLLM once for the module

CONFIGS = Path(__file__).parent.parent / "configs"
MASTER, PORT = "10.0.0.1", 29501
NODES = [NodeInfo(node_id=f"n{i}", ip=f"10.0.0.{i + 1}", gpus=8, cpus=64.0, resources={"GPU": 8.0, "CPU": 64.0},
                  labels={"ray.io/accelerator-type": "H100"})
         for i in range(4)]  # four nodes of eight GPUs


@dataclass(frozen=True)
class Engine:
    """What vLLM would run for one rank's command."""

    launch: str           # single (one API server here), multi (several), headless, supervisor
    api_servers: int
    world_size: int       # TP x PP x PCP of one replica
    dp: int
    dp_local: int
    nnodes: int
    node_rank: int
    local_gpus: int       # the GPUs this rank's node runs


@pytest.fixture(scope="module")
def vllm_engine(tmp_path_factory):
    """vLLM imported once for the module, and `engine(argv)`: the engine config of one `vllm serve ...` command."""
    pytest.importorskip("vllm")
    import vllm
    import vllm.config.vllm as vllm_config_module
    from vllm.entrypoints.cli import serve as vserve
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from raysweep.lab.tiny_model import make_tiny_model

    model = tmp_path_factory.mktemp("vllm-argv") / "wide"
    shutil.copytree(make_tiny_model(model.parent / "tiny"), model)
    cfg = json.loads((model / "config.json").read_text())
    cfg.update(num_attention_heads=16, num_key_value_heads=2, head_dim=64, hidden_size=1024, num_hidden_layers=8,
               max_position_embeddings=32768)  # TP up to 16, PP up to 8, DCP 2 at TP 4, the campaigns' lengths
    (model / "config.json").write_text(json.dumps(cfg))

    parser = FlexibleArgumentParser(prog="vllm")
    subcommand = vserve.ServeSubcommand()
    subcommand.subparser_init(parser.add_subparsers(dest="subparser"))

    def engine(argv: list[str]) -> Engine:
        argv = _local_model(argv, str(model))
        assert argv[:2] == ["vllm", "serve"], argv
        args = parser.parse_args(argv[1:])
        subcommand.validate(args)
        seen: dict[str, Any] = {}

        def recorder(kind: str):
            def record(a: Any, *rest: Any, **kw: Any) -> None:
                seen.update(kind=kind, args=a, api=a.api_server_count)
            return record

        async def no_server() -> None:
            return None

        with mock.patch.multiple(vserve, run_headless=recorder("headless"), run_multi_api_server=recorder("multi"),
                                 run_dp_supervisor=recorder("supervisor"),
                                 run_server=lambda a: seen.update(kind="single", args=a, api=1) or no_server(),
                                 uvloop=mock.Mock(run=lambda coro: coro.close())), \
                mock.patch.object(vllm_config_module, "HAS_TRITON", True):
            subcommand.cmd(args)
            config = vllm.AsyncEngineArgs.from_cli_args(seen["args"]).create_engine_config(
                usage_context=UsageContext.OPENAI_API_SERVER, headless=seen["kind"] == "headless")
        p = config.parallel_config
        local = p.world_size // p.nnodes if p.nnodes > 1 else p.world_size * p.data_parallel_size_local
        return Engine(seen["kind"], int(seen["api"] or 0), p.world_size, p.data_parallel_size,
                      p.data_parallel_size_local, p.nnodes, p.node_rank, local)

    return engine


def _local_model(argv: list[str], path: str) -> list[str]:
    """The command with the local model in place of the campaign's (`serve MODEL` or `--model`)."""
    name = expected_model(argv)
    out = [path if a == name else (f"--model={path}" if a == f"--model={name}" else a) for a in argv]
    return [a for a in out if not a.startswith("--served-model-name")]


def _ranks(serve: Any, layout: Layout) -> list[list[str]]:
    """Every rank's command as the driver starts it (rank 0 with raysweep's --host and --port)."""
    ranks = [rank_argv(serve.argv, layout, r, MASTER, PORT) for r in range(layout.nnodes)]
    ranks[0] = server_argv(ranks[0], MASTER, 8000)
    return ranks


def check_server(engine, serve: Any) -> list[Engine]:
    """Every rank of one server configuration through vLLM, against raysweep's shape and layout."""
    shape = serve.shape
    layout = layout_for(shape, serve.rule, NODES, gpus=True)
    assert isinstance(layout, Layout), layout
    got = [engine(argv) for argv in _ranks(serve, layout)]
    head = got[0]
    where = f"{serve.label}: {shape.describe()} on {layout.describe()}"
    assert head.world_size * head.dp == shape.gpu_count == layout.gpu_count, (where, head)
    assert [e.local_gpus for e in got] == layout.node_gpus(), (where, got)
    assert head.launch != "headless" and head.api_servers >= 1, (where, head)
    assert all(e.launch == "headless" and e.api_servers == 0 for e in got[1:]), (where, got)
    assert all(e.world_size == head.world_size and e.dp == head.dp for e in got), (where, got)
    if layout.mode == "nnodes":
        assert [e.node_rank for e in got] == list(range(layout.nnodes)) and head.nnodes == layout.nnodes, where
    if layout.mode == "dp":
        assert all(e.dp_local == layout.dp_local for e in got), (where, got)
        assert head.api_servers == shape.dp, (where, head)  # vLLM's default: one per DP rank, on the head
    return got


EXAMPLES = sorted(p.name for p in CONFIGS.glob("*.yaml"))


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_rank_of_every_example_campaign_is_what_vllm_runs(vllm_engine, name, monkeypatch):
    monkeypatch.setenv("RAYSWEEP_DEMO_MODEL", "demo-model")
    spec = load_campaign(CONFIGS / name)
    if spec.campaign.serve is None or not spec.serve_argv[:2] == ["vllm", "serve"]:
        pytest.skip(f"{name} starts no `vllm serve`")
    checked = 0
    for combo in spec.serve_combos or [{}]:
        serve = make_serve(spec, combo)
        if serve.deployment is None:
            check_server(vllm_engine, serve)
            checked += 1
            continue
        for inst in serve.deployment.instances(serve.argv, {}, serve.env):  # each P/D role server
            e = vllm_engine(server_argv(inst.argv, MASTER, 8000))
            assert e.world_size * e.dp == inst.gpus, (serve.label, inst.name, e)
            assert e.launch != "headless" and e.api_servers >= 1, (serve.label, inst.name, e)
            checked += 1
    assert checked


# (params, extra flags in serve.cmd): the shapes of the first day on 8-GPU nodes
SHAPES = [
    ({"tensor_parallel_size": 8}, []),                                          # TP=8 on a node
    ({"tensor_parallel_size": 8, "pipeline_parallel_size": 2}, []),             # TP=8 PP=2 across two nodes
    ({"tensor_parallel_size": 4, "data_parallel_size": 2}, []),                 # TP=4 DP=2 on one node
    ({"tensor_parallel_size": 4, "data_parallel_size": 2, "placement_layout": "spread"}, []),  # ... one per node
    ({"tensor_parallel_size": 4, "data_parallel_size": 4}, []),                 # TP=4 DP=4 across two nodes
    ({"tensor_parallel_size": 2, "data_parallel_size": 8}, []),                 # DP=8 across two nodes
    ({"tensor_parallel_size": 2, "pipeline_parallel_size": 2, "placement_layout": "spread"}, []),
    ({"tensor_parallel_size": 8, "pipeline_parallel_size": 4}, []),             # across four nodes
    ({}, ["-tp", "4", "-pp", "2"]),                                             # short flags in serve.cmd
    ({}, ["-tp", "4", "-dp", "4"]),
    ({"tensor_parallel_size": 4, "prefill_context_parallel_size": 2}, []),      # PCP on one node: 8 GPUs
    ({"tensor_parallel_size": 8, "prefill_context_parallel_size": 2}, []),      # PCP across two nodes
    ({"tensor_parallel_size": 4, "pipeline_parallel_size": 2, "prefill_context_parallel_size": 2}, []),
    ({"tensor_parallel_size": 4, "data_parallel_size": 2, "prefill_context_parallel_size": 2}, []),
    ({"tensor_parallel_size": 2, "prefill_context_parallel_size": 2, "placement_layout": "spread"}, []),
    ({}, ["-tp", "2", "-pcp", "2"]),
    ({"tensor_parallel_size": 4, "decode_context_parallel_size": 2}, []),       # DCP reuses the TP ranks
]


def _spec(tmp_path: Path, params: list[dict[str, Any]], flags: list[str], pd: dict | None = None):
    cmd = " ".join(["vllm serve meta-llama/Llama-3.1-8B-Instruct --max-model-len 8192", *flags])
    serve: dict[str, Any] = {"cmd": cmd, "params": params}
    if pd:
        serve["pd"] = pd
    doc = {"name": "shapes", "output_dir": str(tmp_path / "out"), "serve": serve,
           "bench": {"cmd": "vllm bench serve --model m --dataset-name random --num-prompts 10"}}
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(doc))
    return load_campaign(path)


@pytest.mark.parametrize("params, flags", SHAPES, ids=[str(i) for i in range(len(SHAPES))])
def test_every_rank_of_each_shape_is_what_vllm_runs(vllm_engine, tmp_path, params, flags):
    spec = _spec(tmp_path, [params], flags)
    serve = make_serve(spec, spec.serve_combos[0])
    got = check_server(vllm_engine, serve)
    if "decode_context_parallel_size" in params:
        assert serve.shape.gpu_count == got[0].world_size == 4  # DCP takes no GPU of its own


def test_each_role_of_a_pd_deployment_is_what_vllm_runs(vllm_engine, tmp_path):
    pd = {"kv_transfer_config": {"kv_connector": "NixlConnector", "kv_buffer_device": "cuda"},
          "prefill": {"count": 2, "tensor_parallel_size": 2, "settings": {"prefill_context_parallel_size": 2}},
          "decode": {"count": 1, "tensor_parallel_size": 4, "data_parallel_size": 2,
                     "settings": {"pipeline_parallel_size": 2}}}
    spec = _spec(tmp_path, [{}], [], pd)
    serve = make_serve(spec, spec.serve_combos[0])
    assert serve.deployment is not None
    total = 0
    for inst in serve.deployment.instances(serve.argv, {}, serve.env):
        e = vllm_engine(server_argv(inst.argv, MASTER, 8000))
        assert e.world_size * e.dp == inst.gpus, (inst.name, e)
        total += inst.gpus
    assert total == serve.shape.gpu_count == 2 * 4 + 16

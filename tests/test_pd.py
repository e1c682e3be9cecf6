"""Disaggregated prefill/decode deployments (`serve.pd`, docs/pd.md): the schema and its refusals, the sweep of
a deployment's shape, its bundles and GPU count, raysweep's router in front of stand-in servers; a 2P1D
deployment placed on the simulated GPU nodes; and one real 1P1D pair of the vLLM CPU build with the
shared-storage connector behind the router."""

from __future__ import annotations

import copy
import itertools
import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml
from click.testing import CliRunner

from raysweep import grid
from raysweep.campaign import campaign_from_dict
from raysweep.campaign.pd import deployment_of, installed_connectors
from raysweep.cli import main
from raysweep.errors import CampaignError
from raysweep.plan.plan import build_plan
from raysweep.procs import free_port, wait_for
from raysweep.record.directory import CampaignDir

PY = sys.executable
STANDIN = Path(__file__).parent / "standin"

BASE: dict[str, Any] = {
    "name": "pd",
    "runs": 1,
    "serve": {
        "cmd": "vllm serve /models/m --max-model-len 4096",
        "pd": {"kv_transfer_config": {"kv_connector": "ExampleConnector",
                                      "kv_connector_extra_config": {"shared_storage_path": "/tmp/kv"}},
               "prefill": {"settings": {"max_num_batched_tokens": 8192}},
               "decode": {"tensor_parallel_size": 2}},
        "params": {"grid": {"prefill.count": [1, 2], "decode.max_num_seqs": [64]}},
    },
    "bench": {"params": [{"max_concurrency": 4}]},
}


def _with(**serve: Any) -> dict[str, Any]:
    d = copy.deepcopy(BASE)
    for path, value in serve.items():
        *parents, last = path.split("__")
        node = d["serve"]
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return d


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    f = tmp_path / "campaign.yaml"
    f.write_text(yaml.safe_dump({**data, "output_dir": str(tmp_path / "out")}))
    return f


# ---------------------------------------------------------------------------------------------------
# Refusals: exit 2 naming the field, nothing started or written
# ---------------------------------------------------------------------------------------------------

REFUSED = [
    ("zero-prefill", _with(pd__prefill__count=0), ["serve.pd.prefill.count", "greater than or equal to 1"]),
    ("zero-decode-swept", _with(params={"grid": {"decode.count": [1, 0]}}),
     ["serve.params (decode.count=0)", "decode.count must be a positive integer"]),
    ("prefill-tp-above-decode", _with(pd__prefill__tensor_parallel_size=4),
     ["serve.pd.prefill.tensor_parallel_size", "prefill tensor_parallel_size 4 is above decode's 2",
      "which ExampleConnector does not support"]),
    ("prefill-tp-above-decode-swept", _with(params={"grid": {"prefill.tensor_parallel_size": [1, 2, 4]}}),
     ["serve.params (prefill.tensor_parallel_size=4)", "above decode's 2"]),
    ("no-connector", _with(pd__kv_transfer_config={"kv_buffer_device": "cuda"}),
     ["serve.pd.kv_transfer_config", "must name the connector as kv_connector"]),
    ("kv-role-shared", _with(pd__kv_transfer_config={"kv_connector": "NixlConnector", "kv_role": "kv_both"}),
     ["serve.pd.kv_transfer_config", "kv_role is set per role"]),
    ("role-setting-owned", _with(pd__decode__settings={"tensor_parallel_size": 4}),
     ["serve.pd.decode.settings", "set by raysweep for each role"]),
    ("pd-key-without-pd", (lambda d: (d["serve"].pop("pd"), d)[1])(_with()),
     ["serve.params[0].decode.max_num_seqs", "describe the deployment in serve.pd"]),
    ("pd-with-url", (lambda d: (d["serve"].pop("cmd"), d["serve"].pop("params"),
                                d["serve"].update(url="http://127.0.0.1:1"), d)[3])(_with()),
     ["serve.pd", "needs serve.cmd"]),
]


@pytest.mark.parametrize(("data", "expected"), [(d, e) for _, d, e in REFUSED], ids=[i for i, _, _ in REFUSED])
def test_a_deployment_that_cannot_work_exits_2_naming_the_field(tmp_path, data, expected):
    res = CliRunner().invoke(main, ["validate", str(_write(tmp_path, data))])
    assert res.exit_code == 2, res.output
    for text in expected:
        assert text in res.output, (text, res.output)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["pd", "params"])
def test_a_connector_the_installed_vllm_lacks_exits_2(tmp_path, where):
    known = installed_connectors()
    if known is None:
        pytest.skip("no vLLM installed here: its connectors cannot be read")
    assert "ExampleConnector" in known and "NixlConnector" in known
    data = (_with(pd__kv_transfer_config={"kv_connector": "NoSuchConnector"}) if where == "pd"
            else _with(params={"grid": {"kv_connector": ["ExampleConnector", "NoSuchConnector"]}}))
    res = CliRunner().invoke(main, ["validate", str(_write(tmp_path, data))])
    assert res.exit_code == 2, res.output
    field = ("serve.pd.kv_transfer_config.kv_connector" if where == "pd"
             else "serve.params (kv_connector=NoSuchConnector)")
    assert field in res.output and "'NoSuchConnector' is not in the installed vLLM" in res.output, res.output
    assert "NixlConnector" in res.output  # what is accepted
    # the cluster's vLLM may differ from this one: the check can be turned off
    data["serve"]["pd"]["check_connector"] = False
    assert CliRunner().invoke(main, ["validate", str(_write(tmp_path, data))]).exit_code == 0


def test_an_endpoints_labels_are_recorded_as_its_serve_parameters(tmp_path):
    """A deployment started outside the driver and swept as an endpoint carries its identity as labels."""
    data = {"name": "ep", "serve": {"url": [{"url": "http://127.0.0.1:1", "labels": {"pd_ratio": "2P1D",
                                                                                      "pd_gpus": 4}},
                                            "http://127.0.0.1:2"]},
            "bench": {"params": [{"max_concurrency": 2}]}}
    plan = build_plan(campaign_from_dict(data, tmp_path))
    assert [s.params for s in plan.serves] == [{"endpoint": "http://127.0.0.1:1", "pd_ratio": "2P1D", "pd_gpus": 4},
                                               {"endpoint": "http://127.0.0.1:2"}]
    data["serve"]["url"][0]["labels"] = {"endpoint": "x"}
    with pytest.raises(CampaignError, match="endpoint"):
        campaign_from_dict(data, tmp_path)


def test_running_a_deployment_with_bad_input_is_refused_before_anything_starts(tmp_path):
    """`raysweep run` refuses a deployment that cannot work (here a swept ratio with no decode server) before Ray
    starts, naming the field, writing nothing."""
    res = CliRunner().invoke(main, ["run", str(_write(tmp_path, _with(params={"grid": {"decode.count": [0]}})))])
    assert res.exit_code == 2, res.output
    assert "serve.params (decode.count=0)" in res.output and "decode.count must be a positive integer" in res.output
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------------
# The deployment swept like any serve parameter
# ---------------------------------------------------------------------------------------------------

def test_the_ratio_and_role_settings_are_swept_and_never_flags_of_the_base_command(tmp_path):
    data = _with(params={"grid": {"prefill.count": [1, 4], "decode.tensor_parallel_size": [2, 4],
                                  "prefill.max_num_batched_tokens": [4096], "max_num_seqs": [32]}})
    plan = build_plan(campaign_from_dict(data, tmp_path))
    assert len(plan.serves) == 4
    by = {(s.deployment.prefill.count, s.deployment.decode.tp): s for s in plan.serves if s.deployment}
    s = by[(4, 4)]
    assert s.deployment.ratio == "4P1D" and s.deployment.gpus == 4 * 1 + 1 * 4 == s.shape.gpu_count
    assert s.deployment.identity() == {"pd_ratio": "4P1D", "pd_connector": "ExampleConnector", "pd_gpus": 8,
                                       "pd_prefill_count": 4, "pd_prefill_tp": 1, "pd_prefill_dp": 1,
                                       "pd_decode_count": 1, "pd_decode_tp": 4, "pd_decode_dp": 1}
    assert not any("prefill" in t or "decode" in t for t in s.argv)  # the shared command: no role key is a flag
    assert s.argv[-2:] == ["--max-num-seqs", "32"]
    servers = s.deployment.instances(s.argv, {}, s.env)
    assert [i.name for i in servers] == ["prefill-0", "prefill-1", "prefill-2", "prefill-3", "decode-0"]
    pre, dec = servers[0].argv, servers[-1].argv
    assert grid.find_flag_value(pre, "--max-num-batched-tokens") == "4096"  # swept over serve.pd's 8192
    assert grid.find_flag_value(dec, "--max-num-batched-tokens") is None
    assert grid.find_flag_value(pre, "--tensor-parallel-size") == "1"
    assert grid.find_flag_value(dec, "--tensor-parallel-size") == "4"
    assert grid.find_flag_value(dec, "--max-num-seqs") == "32"
    kv_pre = json.loads(grid.find_flag_value(pre, "--kv-transfer-config") or "{}")
    kv_dec = json.loads(grid.find_flag_value(dec, "--kv-transfer-config") or "{}")
    assert kv_pre == {"kv_connector": "ExampleConnector", "kv_role": "kv_producer",
                      "kv_connector_extra_config": {"shared_storage_path": "/tmp/kv"}}
    assert kv_dec["kv_role"] == "kv_consumer"
    # the ids differ per deployment shape, as for any serve parameter
    assert len({s.id for s in plan.serves}) == 4


def test_the_connector_is_a_sweep_axis():
    spec = campaign_from_dict(_with(pd__check_connector=False), Path.cwd()).campaign.serve.pd
    assert deployment_of(spec, {"kv_connector": "NixlConnector"}).connector == "NixlConnector"
    assert deployment_of(spec, {}).connector == "ExampleConnector"
    with pytest.raises(CampaignError, match="kv_connector must be a connector's name"):
        deployment_of(spec, {"kv_connector": 3})


def test_bundles_and_gpus_of_a_deployment():
    from raysweep.campaign import NodeRule
    from raysweep.place.pd import deployment_bundles, deployment_refusal
    from raysweep.place.placement import NodeInfo

    spec = campaign_from_dict(_with(), Path.cwd()).campaign.serve.pd
    dep = deployment_of(spec, {"prefill.count": 2})
    b = deployment_bundles(dep, NodeRule(resources={"pool": 1}))
    assert b.owners == [("prefill", 0), ("prefill", 1), ("decode", 0), ("router", 0)]
    assert b.bundles == [{"CPU": 0.5, "pool": 1, "GPU": 1.0}, {"CPU": 0.5, "pool": 1, "GPU": 1.0},
                         {"CPU": 0.5, "pool": 1, "GPU": 2.0}, {"CPU": 0.5}]
    assert b.gpus == dep.gpus == 4 and b.strategy == "PACK"
    nodes = [NodeInfo(f"n{i}", f"10.0.0.{i}", 2, 8.0) for i in range(2)]
    assert deployment_refusal(dep, NodeRule(), nodes) is None  # 1 + 1 on one node, 2 on the other
    assert "cannot hold at once" in (deployment_refusal(deployment_of(spec, {"prefill.count": 3}), NodeRule(), nodes)
                                     or "")
    big = deployment_of(spec, {"decode.tensor_parallel_size": 4})
    assert "a decode server needs 4 GPUs" in (deployment_refusal(big, NodeRule(), nodes) or "")


def test_the_dry_run_shows_each_deployments_bundles_and_gpus(tmp_path):
    res = CliRunner().invoke(main, ["run", "--dry-run", str(_write(tmp_path, _with()))])
    assert res.exit_code == 0, res.output
    assert "deployment: P/D 2P1D via ExampleConnector" in res.output
    assert ("one placement group (PACK) of 4 bundle(s): prefill-0: {CPU: 0.5}, prefill-1: {CPU: 0.5}, "
            "decode-0: {CPU: 0.5}, router-0: {CPU: 0.5}") in res.output  # this machine has no GPUs
    assert "gpus=4" in res.output and "GPUs: 4 (prefill 2 + decode 2)" in res.output
    assert re.search(r"command \(decode\): vllm serve /models/m .*--tensor-parallel-size 2 --kv-transfer-config",
                     res.output), res.output
    assert not (tmp_path / "out").exists()


def test_pareto_counts_all_roles_gpus():
    from raysweep.results.front import pareto

    df = pd.DataFrame({"max_concurrency": [8, 8], "output_throughput": [800.0, 800.0], "gpu_count": [1, 0],
                       "pd_gpus": [None, 5], "tensor_parallel_size": [1, None]})
    res = pareto(df)
    assert list(res.points["gpus"]) == [1, 5]
    assert list(res.points["tokens_per_gpu"]) == [800.0, 160.0]
    assert res.points["gpus_from"][1].startswith("pd_gpus")


# ---------------------------------------------------------------------------------------------------
# The router, in front of stand-in servers (no Ray)
# ---------------------------------------------------------------------------------------------------

def _standin(extra: list[str] | None = None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([PY, str(STANDIN / "stream_server.py"), "--model", "m", "--port", str(port),
                             *(extra or [])], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, f"http://127.0.0.1:{port}"


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


def _post(url: str, body: dict[str, Any]) -> tuple[int, str]:
    """The status and body of a POST. The wait is long: what the tests check is the answer, and a request
    to a real CPU server on a machine busy with two other servers once took more than 30 s."""
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=180) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _counter(metrics: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} ([0-9.]+)$", metrics, re.M)
    assert m, (name, metrics)
    return float(m.group(1))


def test_the_router_sends_each_request_to_a_prefill_server_for_one_token_then_streams_the_decode_answer():
    from raysweep.serve.pd_router import PDRouter, RouterThread

    servers = [_standin() for _ in range(3)]
    (p0, u0), (p1, u1), (pd_, ud) = servers
    try:
        assert all(wait_for(lambda u=u: _get(u + "/health")[0] == 200, 30, 0.05) for _, u in servers)
        with RouterThread(PDRouter.of([u0, u1], [ud])) as router:
            assert _get(router.url + "/health")[0] == 200
            assert json.loads(_get(router.url + "/v1/models")[1])["data"][0]["id"] == "m"
            for i in range(6):
                code, text = _post(router.url + "/v1/completions", {
                    "model": "m", "prompt": f"p{i} a b c", "max_tokens": 5, "stream": True,
                    "stream_options": {"include_usage": True}})
                assert code == 200
                chunks = [json.loads(ln[6:]) for ln in text.splitlines() if ln.startswith("data: {")]
                assert sum(1 for c in chunks if c.get("choices")) == 5  # the decode server's whole stream
                assert text.rstrip().endswith("data: [DONE]")
            # each prefill server generated one token per request it had; the decode server all of them
            gen = [_counter(_get(u + "/metrics")[1], "vllm:generation_tokens_total") for u in (u0, u1, ud)]
            assert gen == [3, 3, 30]
            assert _post(router.url + "/reset_prefix_cache", {})[0] == 200
            stats = router.router.stats()
            assert stats["prefill"]["requests"] == 6 and stats["decode"]["requests"] == 6
            assert stats["prefill"]["failures"] == stats["decode"]["failures"] == 0
            # a prefill server that died: its requests fail naming the role, counted as the role's failures
            p1.kill()
            p1.wait(10)
            codes = [_post(router.url + "/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 2})
                     for _ in range(4)]
            failed = [t for c, t in codes if c == 502]
            assert len(failed) == 2 and all(json.loads(t)["error"]["role"] == "prefill" for t in failed)
            assert router.router.stats()["prefill"]["failures"] == 2
            assert router.router.stats()["decode"]["failures"] == 0
            code, text = _get(router.url + "/health")
            assert code == 503 and f"prefill {u1}" in text
    finally:
        for proc, _ in servers:
            proc.kill()
            proc.wait(10)


# ---------------------------------------------------------------------------------------------------
# A deployment placed and started on the simulated GPU nodes
# ---------------------------------------------------------------------------------------------------

def _deployment_config(tmp_path: Path, cmd: str, **pd_: Any) -> Any:
    data = {"name": "pd", "runs": 1, "serve": {"cmd": cmd, "pd": {
        "kv_transfer_config": {"kv_connector": "ExampleConnector",
                               "kv_connector_extra_config": {"shared_storage_path": str(tmp_path / "kv")}},
        **pd_}}, "bench": {"params": [{"max_concurrency": 2}]}}
    plan = build_plan(campaign_from_dict(data, tmp_path))
    return plan.serves[0]


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.ray
def test_a_2p1d_deployment_is_one_placement_group_its_roles_in_their_bundles(gpu_cluster, tmp_path):
    """Stand-in servers as roles: two prefill servers of 1 GPU and a decode server of 2 in one placement group
    on the simulated GPU nodes, the router in its own bundle in front; a decode server that dies is the decode
    role's failure; everything stopped by PID, the GPUs free again."""
    import psutil
    import ray

    from raysweep.place.pd import release_deployment, reserve_deployment
    from raysweep.serve.pd import RoleFailure, start_deployment

    serve = _deployment_config(tmp_path, f"{PY} {STANDIN / 'stream_server.py'} --model m",
                               prefill={"count": 2}, decode={"tensor_parallel_size": 2})
    dep = serve.deployment
    assert dep.ratio == "2P1D" and dep.gpus == 4
    res = reserve_deployment(dep, serve.rule, f"raysweep-pd-{serve.id}")
    started = None
    try:
        gpu_nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU")}
        assert [b.get("GPU", 0) for b in res.layout.bundles] == [1, 1, 2, 0]
        assert set(res.node_ids[:3]) <= gpu_nodes  # every role server on a GPU node
        started = start_deployment(dep, serve.argv, serve.env, res, "pdt", ready_timeout_s=120,
                                   log_dir=str(tmp_path))
        assert not isinstance(started, RoleFailure), started
        infos = [ray.get(h.node_info.remote()) for h in started.hosts]
        assert [len(i["gpu_ids"].split(",")) for i in infos] == [1, 1, 2]  # each its own bundle's GPUs
        assert [i.role for i in started.instances] == ["prefill", "prefill", "decode"]
        for i in range(4):
            code, text = _post(started.url + "/v1/completions", {"model": "m", "prompt": f"q{i}", "max_tokens": 3,
                                                                 "stream": True})
            assert code == 200 and text.count('"text"') == 3
        stats = started.role_stats()
        assert stats["prefill"]["requests"] == 4 and len(stats["prefill"]["servers"]) == 2
        assert stats["decode"]["requests"] == 4
        assert all(v["requests"] == 2 for v in stats["prefill"]["servers"].values())
        # the bench grid through the router, the deployment's identity recorded with every point
        out = tmp_path / "out"
        f = tmp_path / "endpoint.yaml"
        f.write_text(yaml.safe_dump({
            "name": "pd-2p1d", "output_dir": str(out), "runs": 1,
            "serve": {"url": {"url": started.url, "gpus": dep.gpus, "labels": dep.identity()}},
            "bench": {"backend": "native", "client_cpus": 0.5,
                      "cmd": "vllm bench serve --model m --dataset-name random --random-input-len 8 "
                             "--random-output-len 4 --num-prompts 12",
                      "params": [{"max_concurrency": 2}]}}))
        ran = CliRunner().invoke(main, ["run", str(f)])
        assert ran.exit_code == 0, ran.output
        from raysweep.results.front import pareto
        from raysweep.results.records import results_table

        table = results_table(CampaignDir(out))
        assert len(table) == 1 and (table["completed"] == 12).all()
        assert (table["pd_ratio"] == "2P1D").all() and (table["pd_decode_tp"] == 2).all()
        assert (table["gpu_count"] == 4).all() and (pareto(table).points["gpus"] == 4).all()
        assert started.role_stats()["decode"]["requests"] >= 4 + 12
        assert started.down() is None
        # the decode server dies: the deployment's failure is the decode role's
        guard = psutil.Process(started.infos[2]["pid"])
        server = guard.children()[0]
        server.kill()
        assert wait_for(lambda: started.down() is not None, 60, 0.2)
        failure = started.down()
        assert failure is not None and failure.role == "decode" and failure.server == "decode-0", failure
    finally:
        pids = [i["pid"] for i in started.infos] if started is not None else []
        if started is not None:
            started.stop()
        release_deployment(res)
    assert not any(_alive(p) for p in pids)


@pytest.mark.ray
def test_raysweep_run_sweeps_deployments_each_role_in_its_bundle_a_failed_role_recorded(gpu_cluster, tmp_path):
    """`raysweep run` of a P/D campaign on the simulated GPU nodes, stand-in servers as roles: a 1P2D and two
    1P1D deployments (prefill TP 1, decode TP 2). The good one (1P2D): each role server in its own bundle with
    its own GPUs, the bench through the router, every point's result carrying the deployment's shape (ratio,
    per-role parallelism, connector, all 5 GPUs), the requests each role served, each role server's effective
    settings as it reported them at its start (also in the deployment's ledger row), and the /metrics of
    every role server: the decode servers' joined as the point's `server_*` fields, each server's apart, and
    each server's prompt tokens. One whose decode server cannot
    start, and one whose prefill server dies during a point: each point failed naming the role server and
    the root cause from its log, the dying deployment started again whole for the next point, the campaign
    going on. Every role server's process is gone afterwards, every GPU free."""
    from raysweep.ledger import Ledger
    from raysweep.results.records import results_table

    out = tmp_path / "out"
    f = tmp_path / "campaign.yaml"
    f.write_text(yaml.safe_dump({
        "name": "pd-run", "output_dir": str(out), "runs": 1, "warmup": 0, "max_attempts": 1,
        "serve": {"cmd": f"{PY} {STANDIN / 'stream_server.py'} --model m", "ready_timeout_s": 120,
                  "pd": {"kv_transfer_config": {"kv_connector": "ExampleConnector",
                                                "kv_connector_extra_config": {"shared_storage_path": str(tmp_path)}},
                         "check_connector": False, "decode": {"tensor_parallel_size": 2}},
                  "params": [{"decode.ttft_delay": 0.001, "decode.count": 2}, {"decode.ttft_delay": "soon"},
                             {"prefill.exit_after": 3}]},
        "bench": {"backend": "native", "client_cpus": 0.5,
                  "cmd": "vllm bench serve --model m --dataset-name random --random-input-len 8 "
                         "--random-output-len 4 --num-prompts 6",
                  "params": [{"max_concurrency": 1}, {"max_concurrency": 2}]}}))
    ran = CliRunner().invoke(main, ["run", str(f)])
    assert ran.exit_code in (0, 1), ran.output
    table = results_table(CampaignDir(out))
    assert len(table) == 2 and (table["completed"] == 6).all(), table.to_dict("records")
    assert (table["pd_ratio"] == "1P2D").all() and (table["pd_connector"] == "ExampleConnector").all()
    assert (table["pd_prefill_tp"] == 1).all() and (table["pd_decode_tp"] == 2).all()
    assert (table["gpu_count"] == 5).all() and (table["pd_gpus"] == 5).all()
    # the router sent each request of the point to a prefill server, then to a decode server
    assert (table["pd_prefill_requests"] == 6).all() and (table["pd_decode_requests"] == 6).all()
    assert (table["pd_decode_failures"] == 0).all()
    # each role server in its own bundle: 1 GPU for prefill, 2 others for each decode server
    servers: dict[str, tuple[str, list[str]]] = {}
    for part in str(table["pd_servers"].iloc[0]).split(";"):
        name, gpus = part.split("=")
        servers[name.split("@")[0]] = (name.split("@")[1], gpus.split(","))
    assert set(servers) == {"prefill-0", "decode-0", "decode-1"} and len(servers["prefill-0"][1]) == 1
    assert len(servers["decode-0"][1]) == len(servers["decode-1"][1]) == 2
    for a, b in itertools.combinations(servers.values(), 2):
        if a[0] == b[0]:  # on one node: no GPU of one server is another's
            assert not set(a[1]) & set(b[1])
    # each role server's effective settings, as it reported them at its start
    for row in table.to_dict("records"):
        settings = json.loads(row["pd_role_settings"])
        assert set(settings) == {"prefill-0", "decode-0", "decode-1"}, settings
        assert settings["prefill-0"]["kv_transfer_config"]["kv_role"] == "kv_producer"
        assert settings["decode-1"]["kv_transfer_config"]["kv_role"] == "kv_consumer"
        assert settings["decode-0"]["ttft_delay"] == settings["decode-1"]["ttft_delay"] == 0.001
        assert "ttft_delay" not in settings["prefill-0"] and settings["decode-0"]["tensor_parallel_size"] == 2
        # every role server's /metrics: each apart, the decode servers' joined in the point's server_* fields
        each = json.loads(row["pd_server_metrics"])
        assert set(each) == {"prefill-0", "decode-0", "decode-1"} and all(
            m["server_metrics_complete"] for m in each.values()), each
        decode_tokens = [each[n]["server_generation_tokens"] for n in ("decode-0", "decode-1")]
        assert sum(decode_tokens) == row["server_generation_tokens"] == 6 * 4, (decode_tokens, row)
        assert each["prefill-0"]["server_generation_tokens"] == 6  # one token per request, for its KV
        tokens = json.loads(row["pd_server_tokens"])
        assert row["pd_decode_prefilled_tokens"] == sum(tokens[n]["local_compute"] for n in ("decode-0", "decode-1"))
        assert row["pd_prefill_computed_tokens"] == tokens["prefill-0"]["local_compute"] > 0
    ledger = Ledger.open_existing(out)
    try:
        rows = ledger.servers()
        failed = [p for p in ledger.points() if p.state == "failed"]
    finally:
        ledger.close()
    # the deployment whose decode server could not start: its points failed with the role and root cause
    not_started = [p for p in failed if "invalid float value" in (p.error or "")]
    assert len(not_started) == 2 and all("decode server decode-0" in (p.error or "") for p in not_started), failed
    assert any(r.state == "failed" and "decode server decode-0" in (r.error or "") for r in rows)
    good = [r for r in rows if r.serve_id == table["serve_id"].iloc[0]]
    assert [r.role_settings_record() for r in good] == [json.loads(table["pd_role_settings"].iloc[0])]
    # the deployment whose prefill server died during a point: each point failed naming it and its root
    # cause, and the deployment was started again whole (both roles) for the other point
    died = [p for p in failed if "prefill server prefill-0 exited with code 3" in (p.error or "")]
    assert len(died) == 2 and len(failed) == 4, [p.error for p in failed]
    assert all("RuntimeError: exiting at request 4, on purpose" in (p.error or "") for p in died)
    starts = [r for r in rows if r.serve_id == died[0].serve_id]
    assert len(starts) == 2 and all(sorted(k.get("role") for k in json.loads(r.ranks or "[]")) == ["decode", "prefill"]
                                    for r in starts)
    # every role server of every start was stopped by its PID: none left
    pids = [rank["pid"] for r in rows for rank in json.loads(r.ranks or "[]")]
    assert len(pids) >= 8 and not any(_alive(p) for p in pids)


@pytest.mark.ray
def test_each_nixl_server_gets_a_side_channel_of_its_own(gpu_cluster, tmp_path):
    """NIXL: two prefill servers and a decode server of two data-parallel ranks, stand-ins, on the simulated GPU
    nodes. Each server's process sees its node's address as VLLM_NIXL_SIDE_CHANNEL_HOST (vLLM's default,
    localhost, is unreachable from another node) and its own VLLM_NIXL_SIDE_CHANNEL_PORT, with the decode
    server's two ports (vLLM adds the rank) shared with no other server on the node; a role's env that
    sets one keeps it."""
    import psutil
    import ray

    from raysweep.place.pd import release_deployment, reserve_deployment
    from raysweep.serve.pd import NIXL_HOST, NIXL_PORT, RoleFailure, start_deployment

    data = {"name": "pd", "runs": 1, "serve": {
        "cmd": f"{PY} {STANDIN / 'stream_server.py'} --model m",
        "pd": {"kv_transfer_config": {"kv_connector": "NixlConnector"},
               "prefill": {"count": 2, "env": {NIXL_HOST: "127.0.0.9"}}, "decode": {"data_parallel_size": 2}}},
        "bench": {"params": [{"max_concurrency": 2}]}}
    serve = build_plan(campaign_from_dict(data, tmp_path)).serves[0]
    dep = serve.deployment
    res = reserve_deployment(dep, serve.rule, f"raysweep-pd-{serve.id}")
    started = None
    try:
        started = start_deployment(dep, serve.argv, serve.env, res, "pdn", ready_timeout_s=120,
                                   log_dir=str(tmp_path))
        assert not isinstance(started, RoleFailure), started
        envs = [psutil.Process(i["pid"]).children()[0].environ() for i in started.infos]
        ips = [ray.get(h.node_info.remote())["node_ip"] for h in started.hosts]
        assert [e[NIXL_HOST] for e in envs] == ["127.0.0.9", "127.0.0.9", ips[2]]  # the role's env kept
        used: dict[str, list[int]] = {}
        for e, ip, ranks in zip(envs, ips, (1, 1, 2), strict=True):
            used.setdefault(ip, []).extend(range(int(e[NIXL_PORT]), int(e[NIXL_PORT]) + ranks))
        assert all(len(set(ports)) == len(ports) for ports in used.values()), used
        assert sum(len(p) for p in used.values()) == 4
    finally:
        pids = [i["pid"] for i in started.infos] if started is not None and not isinstance(started, RoleFailure) \
            else []
        if started is not None and not isinstance(started, RoleFailure):
            started.stop()
        release_deployment(res)
    assert not any(_alive(p) for p in pids)


@pytest.mark.vllm
@pytest.mark.ray
def test_a_real_1p1d_pair_behind_the_router(gpu_cluster, tiny_model, tmp_path):
    """The real vLLM CPU build as a 1P1D pair with the shared-storage connector, behind raysweep's router: the
    bench grid through the router (a serve.url campaign, the deployment's 2 GPUs declared), every request the
    decode server answered found its KV in the store (`External Cache Hit!` counted equal to its requests),
    and the greedy answer through the pair equals the producer's own, token for token, with the same
    log-probabilities."""
    import ray

    from raysweep.place.pd import release_deployment, reserve_deployment
    from raysweep.results.records import results_table
    from raysweep.serve.pd import PrefilledRequests, RoleFailure, prefilled_requests, role_settings, start_deployment
    from raysweep.serve.pd_settings import settings_differences

    # each role server with the model's worker in its engine process, as configs/demo-cpu.yaml starts it (two Python
    # processes importing torch and vLLM per server instead of three)
    serve = _deployment_config(
        tmp_path, f"vllm serve {tiny_model} --load-format dummy --max-model-len 1024 --dtype bfloat16 "
                  "--gpu-memory-utilization 0.2 --enforce-eager --distributed-executor-backend uni")
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_HOST_IP": "127.0.0.1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    res = reserve_deployment(serve.deployment, serve.rule, f"raysweep-pd-{serve.id}")
    started = None
    try:
        started = start_deployment(serve.deployment, serve.argv, {**serve.env, **env}, res, "pdv",
                                   ready_timeout_s=900, log_dir=str(tmp_path))
        assert not isinstance(started, RoleFailure), started.text()
        out = tmp_path / "out"
        campaign = {"name": "pd-real", "output_dir": str(out), "runs": 1,
                    "serve": {"url": {"url": started.url, "gpus": serve.deployment.gpus}},
                    "bench": {"backend": "native", "client_cpus": 0.5,
                              "cmd": f"vllm bench serve --model {tiny_model} --dataset-name random --num-prompts 8 "
                                     "--random-input-len 300 --random-output-len 8 --temperature 0",
                              "params": [{"max_concurrency": 2}]}}
        f = tmp_path / "campaign.yaml"
        f.write_text(yaml.safe_dump(campaign))
        before = started.decode_prompt_sources()
        decode_url = next(u for i, u in zip(started.instances, started.urls, strict=True) if i.role == "decode")

        def counted() -> PrefilledRequests:
            with urllib.request.urlopen(decode_url + "/metrics", timeout=30) as resp:
                found = prefilled_requests(resp.read().decode())
            assert found is not None
            return found

        counted_before = counted()
        ran = CliRunner().invoke(main, ["run", str(f)])
        assert ran.exit_code == 0, ran.output
        row = results_table(CampaignDir(out)).iloc[0]
        assert row["completed"] == 8 and row["failed"] == 0 and row["gpu_count"] == 2, row.to_dict()
        stats = started.role_stats()
        asked = stats["decode"]["requests"]
        assert stats["prefill"]["requests"] == asked >= 8 and stats["prefill"]["failures"] == 0
        assert stats["decode"]["failures"] == 0
        decode_log = started.logs("decode")[0]
        assert decode_log.count("External Cache Hit!") == asked, decode_log[-3000:]
        assert "Inject KV cache of" in decode_log
        after = started.decode_prompt_sources()
        # every routed request found its KV: none computed more than the 200-token bound above one 128-token block
        counted_after = counted()
        assert counted_after.bound == 200 and counted_after.over == counted_before.over, counted_after
        assert counted_after.finished - counted_before.finished == asked
        moved = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
        # the decode server received most of each prompt through the connector and prefilled only the rest
        assert moved["external_kv_transfer"] > moved["local_compute"] > 0, moved
        settings = role_settings(started)
        assert settings["prefill-0"]["kv_transfer_config"]["kv_role"] == "kv_producer"
        assert settings["decode-0"]["kv_transfer_config"]["kv_role"] == "kv_consumer"
        assert settings_differences({"decode-0": settings["prefill-0"]}, {"decode-0": settings["decode-0"]}) == [
            "decode-0: kv_transfer_config " + repr(settings["prefill-0"]["kv_transfer_config"]) + " != "
            + repr(settings["decode-0"]["kv_transfer_config"])]  # the two roles differ in their kv_role alone
        assert any((tmp_path / "kv").rglob("*.safetensors")) or any(p.is_file() for p in (tmp_path / "kv").rglob("*"))
        # greedy: the pair's answer equals the producer's own (a whole server, prefill and decode in one), for a
        # prompt of more than one KV block: the same tokens, and their log-probabilities within bfloat16's
        # rounding (the decode server's logits come from the KV it received, the producer's from its own)
        prompt = [(7 * i) % 500 + 3 for i in range(300)]
        body = {"model": str(tiny_model), "prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True,
                "logprobs": 1}
        code, via = _post(started.url + "/v1/completions", body)
        assert code == 200, via
        producer = ray.get(started.hosts[0].url.remote())
        code, own = _post(producer + "/v1/completions", body)
        assert code == 200, own
        pair, alone = json.loads(via)["choices"][0], json.loads(own)["choices"][0]
        assert pair["text"] == alone["text"] and pair["logprobs"]["tokens"] == alone["logprobs"]["tokens"]
        assert pair["logprobs"]["token_logprobs"] == pytest.approx(alone["logprobs"]["token_logprobs"], abs=1e-2)
        assert started.logs("decode")[0].count("External Cache Hit!") == asked + 1
        # a prompt sent to the decode server itself, its KV in no store: prefilled again, and counted as such
        last = counted()
        code, text = _post(decode_url + "/v1/completions", {**body, "prompt": [(11 * i) % 500 + 5 for i in range(300)],
                                                             "max_tokens": 2})
        assert code == 200, text
        now = counted()
        assert (now.over - last.over, now.finished - last.finished) == (1, 1), (last, now)
    finally:
        if started is not None and not isinstance(started, RoleFailure):
            started.stop()
        release_deployment(res)


@pytest.mark.vllm
@pytest.mark.ray
def test_raysweep_run_of_a_real_1p1d_pair(gpu_cluster, tiny_model, tmp_path):
    """`raysweep run` of a serve.pd campaign with the real vLLM CPU build: a 1P1D pair with the shared-storage
    connector started, benched through raysweep's router and stopped by the driver. The point records the
    requests each role served, equal to the decode server's `External Cache Hit!` lines, and the decode
    server's prompt tokens: most received through the connector, the rest prefilled itself. Each role
    server's effective settings are recorded (in the point and the deployment's ledger row), differing in
    the connector's role alone, and each server's own /metrics over the point."""
    from raysweep.ledger import Ledger
    from raysweep.results.records import results_table
    from raysweep.serve.pd_settings import settings_differences

    out = tmp_path / "out"
    f = tmp_path / "campaign.yaml"
    f.write_text(yaml.safe_dump({
        "name": "pd-real-run", "output_dir": str(out), "runs": 1, "warmup": 0,
        # each role server with the model's worker in its engine process, as configs/demo-cpu.yaml starts it (two
        # Python processes importing torch and vLLM per server instead of three)
        "serve": {"cmd": f"vllm serve {tiny_model} --load-format dummy --max-model-len 1024 --dtype bfloat16 "
                         "--gpu-memory-utilization 0.2 --enforce-eager --distributed-executor-backend uni",
                  "ready_timeout_s": 900,
                  "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_HOST_IP": "127.0.0.1",
                          "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
                  "pd": {"kv_transfer_config": {"kv_connector": "ExampleConnector",
                                                "kv_connector_extra_config": {"shared_storage_path":
                                                                              str(tmp_path / "kv")}}}},
        "bench": {"backend": "native", "client_cpus": 0.5, "rerun_client_limited": False,
                  "cmd": f"vllm bench serve --model {tiny_model} --dataset-name random --num-prompts 4 "
                         "--random-input-len 300 --random-output-len 4 --temperature 0",
                  "params": [{"max_concurrency": 2}]}}))
    ran = CliRunner().invoke(main, ["run", str(f)])
    assert ran.exit_code == 0, ran.output
    row = results_table(CampaignDir(out)).iloc[0]
    assert row["completed"] == 4 and row["failed"] == 0, row.to_dict()
    assert row["pd_ratio"] == "1P1D" and row["gpu_count"] == 2 and row["placement_mode"] == "pd"
    assert row["pd_prefill_requests"] == row["pd_decode_requests"] >= 4 and row["pd_decode_failures"] == 0
    # the decode server received most of each prompt through the connector and prefilled only the rest
    assert row["pd_kv_received_tokens"] > row["pd_decode_prefilled_tokens"] > 0, row.to_dict()
    # no request prefilled again: none computed more than the 200-token bound above one 128-token KV block
    assert (row["pd_decode_prefilled_requests"], row["pd_decode_prefilled_bound_tokens"]) == (0, 200), row.to_dict()
    assert row["pd_decode_finished_requests"] == row["pd_decode_requests"]
    # each server's prompt tokens apart: the decode server's are the point's, the prefill server computed
    tokens = json.loads(row["pd_server_tokens"])
    assert tokens["decode-0"]["external_kv_transfer"] == row["pd_kv_received_tokens"], tokens
    assert row["pd_prefill_computed_tokens"] == tokens["prefill-0"]["local_compute"] > 0
    each = json.loads(row["pd_server_metrics"])
    assert each["decode-0"]["server_generation_tokens"] == row["server_generation_tokens"], each
    assert each["prefill-0"]["server_prompt_tokens"] > 0 and each["prefill-0"]["server_metrics_complete"]
    # each role server's effective settings as vLLM reported them at its start: alike but for the connector role
    settings = json.loads(row["pd_role_settings"])
    assert set(settings) == {"prefill-0", "decode-0"}, settings
    for name, role in (("prefill-0", "kv_producer"), ("decode-0", "kv_consumer")):
        assert settings[name]["kv_transfer_config"]["kv_role"] == role
        assert settings[name]["kv_transfer_config"]["kv_connector"] == "ExampleConnector"
        assert settings[name]["max_model_len"] == 1024 and settings[name]["enforce_eager"] is True
    assert settings_differences({"x": settings["prefill-0"]}, {"x": settings["decode-0"]}) == [
        f"x: kv_transfer_config {settings['prefill-0']['kv_transfer_config']!r} != "
        f"{settings['decode-0']['kv_transfer_config']!r}"]
    ledger = Ledger.open_existing(out)
    try:
        ranks = [rank for r in ledger.servers() for rank in json.loads(r.ranks or "[]")]
        assert [r.role_settings_record() for r in ledger.servers()] == [settings]
    finally:
        ledger.close()
    decode_log = Path(next(r["log_path"] for r in ranks if r.get("role") == "decode")).read_text()
    assert decode_log.count("External Cache Hit!") == row["pd_decode_requests"], decode_log[-3000:]
    assert not any(_alive(r["pid"]) for r in ranks)


# ---------------------------------------------------------------------------------------------------
# Effective settings per role, and what differs between two deployments beyond the declared axes
# ---------------------------------------------------------------------------------------------------

def _args_line(**args: Any) -> str:
    kv = ("KVTransferConfig(kv_connector='ExampleConnector', engine_id='ENGINE', kv_buffer_device='cpu', "
          "kv_role='kv_consumer', kv_port=14579, kv_connector_extra_config={'shared_storage_path': '/tmp/kv'})")
    shown = ", ".join(f"'{k}': {v!r}" for k, v in args.items())
    return (f"(APIServer pid=51) INFO 11-28 17:57:28 [api_utils.py:286] non-default args: {{'host': '10.0.0.1', "
            f"'port': 8000, {shown}, 'kv_transfer_config': {kv}}}\n").replace("ENGINE", str(id(args)))


def test_the_settings_each_role_started_with_and_the_differences_beyond_the_declared_axes():
    from raysweep.serve.pd_settings import declared_axes, effective_settings, settings_differences

    s = effective_settings("noise\n" + _args_line(max_num_seqs=64, enforce_eager=True))
    assert s["max_num_seqs"] == 64 and s["enforce_eager"] is True
    assert s["kv_transfer_config"]["kv_role"] == "kv_consumer" and "engine_id" not in s["kv_transfer_config"]
    assert s["kv_transfer_config"]["kv_connector_extra_config"] == {"shared_storage_path": "/tmp/kv"}
    assert effective_settings("no such line") == {}
    a = {"prefill-0": effective_settings(_args_line(max_num_batched_tokens=4096)),
         "decode-0": effective_settings(_args_line(max_num_seqs=64, enforce_eager=True))}
    b = {"prefill-0": effective_settings(_args_line(max_num_batched_tokens=8192)),
         "decode-0": effective_settings(_args_line(max_num_seqs=64)),
         "prefill-1": effective_settings(_args_line(max_num_batched_tokens=8192))}
    declared = declared_axes([{"prefill.max_num_batched_tokens": 4096, "prefill.count": 1}])
    assert declared == {"prefill.max_num_batched_tokens"}
    # the swept axis and the host/port are no difference; an undeclared one-sided setting and a server are
    assert settings_differences(a, b, declared) == ["decode-0: enforce_eager True != (default)",
                                                    "prefill-1: only in the second deployment"]
    assert "prefill-0: max_num_batched_tokens 4096 != 8192" in settings_differences(a, b)
    # a role's axis reaches that role's servers alone; a shared one (no role) every server
    a["decode-0"]["max_num_batched_tokens"], b["decode-0"]["max_num_batched_tokens"] = 2048, 1024
    assert "decode-0: max_num_batched_tokens 2048 != 1024" in settings_differences(a, b, declared)
    shared = declared_axes([{"max_num_batched_tokens": 4096, "kv_connector": "NixlConnector"}])
    assert shared == {"max_num_batched_tokens", "kv_transfer_config"}
    assert not any("max_num_batched_tokens" in d for d in settings_differences(a, b, shared))


def test_prompt_tokens_by_source_are_read_from_a_vllm_metrics_page():
    from raysweep.serve.pd import prompt_sources

    text = ('# TYPE vllm:prompt_tokens_by_source_total counter\n'
            'vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 44.0\n'
            'vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_cache_hit"} 0.0\n'
            'vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="external_kv_transfer"} 2048.0\n'
            'vllm:prompt_tokens_by_source_total{engine="1",model_name="m",source="local_compute"} 6.0\n'
            'vllm:prompt_tokens_total{engine="0",model_name="m"} 2092.0\n')
    assert prompt_sources(text) == {"local_compute": 50.0, "local_cache_hit": 0.0, "external_kv_transfer": 2048.0}
    assert prompt_sources("") == {}


def test_a_points_pd_fields_are_the_counters_over_its_load():
    """The router's requests and failures per role, and the decode servers' prompt tokens received against
    prefilled again, as differences over the point; no token fields where the decode servers report none."""
    from raysweep.serve.pd import point_fields

    before = {"stats": {"prefill": {"requests": 10, "failures": 1}, "decode": {"requests": 9, "failures": 0}},
              "sources": {"external_kv_transfer": 512.0, "local_compute": 100.0}}
    after = {"stats": {"prefill": {"requests": 16, "failures": 1}, "decode": {"requests": 14, "failures": 1}},
             "sources": {"external_kv_transfer": 1024.0, "local_compute": 400.0, "local_cache_hit": 3.0}}
    assert point_fields(before, after) == {
        "pd_prefill_requests": 6, "pd_prefill_failures": 0, "pd_decode_requests": 5, "pd_decode_failures": 1,
        "pd_kv_received_tokens": 512.0, "pd_decode_prefilled_tokens": 300.0}
    stand_in = point_fields({**before, "sources": {}}, {**after, "sources": {}})
    assert "pd_kv_received_tokens" not in stand_in and stand_in["pd_prefill_requests"] == 6
    assert "pd_kv_received_tokens" not in point_fields({**before, "sources": None}, after)



def _computed_histogram(engines: dict[str, dict[float, float]], block: int | None = 128) -> str:
    """A /metrics body with `vllm:request_prefill_kv_computed_tokens` per engine (cumulative counts by bound)."""
    lines = ["# TYPE vllm:cache_config_info gauge"]
    if block is not None:
        lines.append(f'vllm:cache_config_info{{block_size="{block}",engine="0",enable_prefix_caching="True"}} 1.0')
    lines.append("# TYPE vllm:request_prefill_kv_computed_tokens histogram")
    for engine, counts in engines.items():
        for le, n in counts.items():
            bound = "+Inf" if le == float("inf") else repr(float(le))
            lines.append(f'vllm:request_prefill_kv_computed_tokens_bucket{{engine="{engine}",le="{bound}",'
                         f'model_name="m"}} {n}')
        lines.append(f'vllm:request_prefill_kv_computed_tokens_count{{engine="{engine}",model_name="m"}} '
                     f'{counts[float("inf")]}')
        lines.append(f'vllm:request_prefill_kv_computed_tokens_sum{{engine="{engine}",model_name="m"}} 0.0')
    return "\n".join(lines) + "\n"


def test_the_requests_a_decode_server_prefilled_again_are_counted_above_one_kv_block():
    """From the histogram of the prompt tokens each request computed itself: the requests above the first
    bucket bound at or above one KV block (200 for 128-token blocks) are the ones prefilled again, summed over
    engines and decode servers and taken as differences over the point; none where the block size or a
    decode server's histogram is missing."""
    from raysweep.serve.pd import PrefilledRequests, point_fields, prefilled_requests

    inf = float("inf")
    quiet = {1.0: 0, 2.0: 0, 5.0: 0, 10.0: 0, 20.0: 0, 50.0: 3, 100.0: 4, 200.0: 4, 500.0: 4, inf: 4}
    busy = {1.0: 0, 2.0: 0, 5.0: 0, 10.0: 0, 20.0: 0, 50.0: 9, 100.0: 10, 200.0: 11, 500.0: 14, inf: 15}
    assert prefilled_requests(_computed_histogram({"0": quiet, "1": busy})) == PrefilledRequests(19.0, 4.0, 200.0)
    assert prefilled_requests(_computed_histogram({"0": quiet}, block=16)) == PrefilledRequests(4.0, 4.0, 20.0)
    assert prefilled_requests(_computed_histogram({"0": busy}, block=None)) is None
    assert prefilled_requests(_computed_histogram({"0": busy}, block=2048)) is None  # no bound covers a block
    assert prefilled_requests("") is None

    stats = {"prefill": {"requests": 0, "failures": 0}, "decode": {"requests": 0, "failures": 0}}
    before = {"stats": stats, "requests": {"prefill-0": None, "decode-0": PrefilledRequests(4, 0, 200),
                                          "decode-1": PrefilledRequests(10, 1, 200)}}
    after = {"stats": stats, "requests": {"prefill-0": None, "decode-0": PrefilledRequests(12, 0, 200),
                                         "decode-1": PrefilledRequests(19, 4, 200)}}
    out = point_fields(before, after)
    assert (out["pd_decode_prefilled_requests"], out["pd_decode_finished_requests"],
            out["pd_decode_prefilled_bound_tokens"]) == (3, 17, 200)
    lost = {**after, "requests": {**after["requests"], "decode-1": None}}
    assert "pd_decode_prefilled_requests" not in point_fields(before, lost)
    assert "pd_decode_prefilled_requests" not in point_fields({"stats": stats}, after)

# ---------------------------------------------------------------------------------------------------
# Every role server's /metrics over a point, and what differs between two campaigns' deployments
# ---------------------------------------------------------------------------------------------------

def test_every_role_servers_metrics_are_scraped_the_decode_servers_joined_each_kept_apart():
    """A 1P2D deployment of stand-ins behind the router: the decode servers' /metrics joined as one server's
    engines (generation tokens summed), each server's summary apart; a decode server that dies leaves the
    joined samples incomplete, the others' own summaries whole."""
    from raysweep.serve.metrics import ServersScraper
    from raysweep.serve.pd_router import PDRouter, RouterThread

    servers = [_standin() for _ in range(3)]
    (_, up), (_, ud0), (pd1, ud1) = servers
    names = {"prefill-0": up, "decode-0": ud0, "decode-1": ud1}
    try:
        assert all(wait_for(lambda u=u: _get(u + "/health")[0] == 200, 30, 0.05) for _, u in servers)
        scraper = ServersScraper(ud0, 0.05, servers=names, pooled=("decode-0", "decode-1")).start()
        with RouterThread(PDRouter.of([up], [ud0, ud1])) as router:
            for i in range(4):
                code, _ = _post(router.url + "/v1/completions", {"model": "m", "prompt": f"p{i} a b", "max_tokens": 5})
                assert code == 200
        scraper.stop()
        joined, each = scraper.summary(), scraper.summaries()
        assert joined["server_metrics_complete"] and joined["server_generation_tokens"] == 4 * 5, joined
        assert each["decode-0"]["server_generation_tokens"] + each["decode-1"]["server_generation_tokens"] == 20
        assert each["decode-0"]["server_generation_tokens"] > 0 and each["decode-1"]["server_generation_tokens"] > 0
        assert each["prefill-0"]["server_generation_tokens"] == 4  # one token per request, for its KV
        pd1.kill()
        pd1.wait(10)
        assert not scraper.scrape() and scraper.errors[-1].startswith("decode-1: ")
        assert scraper.scrape() is False and len(scraper.each["decode-0"]) == len(scraper.each["prefill-0"])
    finally:
        for proc, _ in servers:
            proc.kill()
            proc.wait(10)


def test_the_prompt_tokens_of_every_role_server_and_their_sums():
    from raysweep.serve.pd import point_fields

    stats = {"prefill": {"requests": 0, "failures": 0}, "decode": {"requests": 0, "failures": 0}}
    before = {"stats": stats, "sources": {"external_kv_transfer": 0.0, "local_compute": 10.0},
              "by_server": {"prefill-0": {"local_compute": 100.0}, "prefill-1": {"local_compute": 0.0},
                            "decode-0": {"external_kv_transfer": 0.0, "local_compute": 10.0},
                            "decode-1": {"external_kv_transfer": 0.0, "local_compute": 0.0}}}
    after = {"stats": stats, "sources": {"external_kv_transfer": 768.0, "local_compute": 60.0},
             "by_server": {"prefill-0": {"local_compute": 612.0}, "prefill-1": {"local_compute": 300.0},
                           "decode-0": {"external_kv_transfer": 512.0, "local_compute": 40.0},
                           "decode-1": {"external_kv_transfer": 256.0, "local_compute": 20.0}}}
    out = point_fields(before, after)
    assert out["pd_kv_received_tokens"] == 768.0 and out["pd_decode_prefilled_tokens"] == 50.0
    assert out["pd_prefill_computed_tokens"] == 812.0
    assert json.loads(out["pd_server_tokens"]) == {
        "prefill-0": {"local_compute": 512.0}, "prefill-1": {"local_compute": 300.0},
        "decode-0": {"external_kv_transfer": 512.0, "local_compute": 30.0},
        "decode-1": {"external_kv_transfer": 256.0, "local_compute": 20.0}}
    # a prefill server whose /metrics did not answer: no prefill sum, the others' own tokens all the same
    gone = point_fields(before, {**after, "by_server": {**after["by_server"], "prefill-1": None}})
    assert "pd_prefill_computed_tokens" not in gone and "prefill-1" not in json.loads(gone["pd_server_tokens"])


def _pd_results(path: Path, ratio: str, decode: dict[str, Any], connector: str = "ExampleConnector") -> Path:
    """A results table of a P/D campaign: one deployment at two loads, three runs each."""
    settings = {"prefill-0": {"port": 8001,
                              "kv_transfer_config": {"kv_connector": connector, "kv_role": "kv_producer"}},
                "decode-0": {"port": 8002, **decode,
                             "kv_transfer_config": {"kv_connector": connector, "kv_role": "kv_consumer"}}}
    if ratio == "1P2D":
        settings["decode-1"] = settings["decode-0"]
    rows = [{"campaign": path.stem, "serve_id": "s0", "bench_id": f"b{c}", "run_number": r, "max_concurrency": c,
             "output_throughput": 100.0 * c + r, "median_ttft_ms": 10.0 + r, "completed": 10, "failed": 0,
             "pd_ratio": ratio, "pd_connector": connector, "pd_gpus": 1 + int(ratio[2]),
             "pd_decode_count": int(ratio[2]), "pd_decode_tp": 1,
             "pd_role_settings": json.dumps(settings, sort_keys=True)}
            for c in (1, 4) for r in range(3)]
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_compare_lists_what_differs_between_two_campaigns_deployments(tmp_path):
    """`raysweep compare` of two P/D campaigns: beside the verdicts, per matched deployment every difference
    of shape (ratio, GPUs, decode count) and of each role server's effective settings (a decode setting, a
    server one side lacks), the ports aside; two deployments alike say so."""
    a = _pd_results(tmp_path / "a.csv", "1P1D", {"max_num_seqs": 64})
    b = _pd_results(tmp_path / "b.csv", "1P2D", {"max_num_seqs": 128})
    ran = CliRunner().invoke(main, ["compare", str(a), str(b), "--json"])
    assert ran.exit_code == 0, ran.output
    [cmp] = json.loads(ran.output)["comparisons"]
    assert cmp["match_on"] == ["max_concurrency"]
    assert cmp["deployments"] == [{
        "baseline_serve_id": "s0", "other_serve_id": "s0", "settings_recorded": True,
        "differences": ["pd_decode_count 1 != 2", "pd_gpus 2 != 3", "pd_ratio 1P1D != 1P2D",
                        "decode-0: max_num_seqs 64 != 128", "decode-1: only in the second deployment"]}]
    shown = CliRunner().invoke(main, ["compare", str(a), str(b), "--out", str(tmp_path / "cmp")])
    assert shown.exit_code == 0 and "deployment s0 against s0: pd_decode_count 1 != 2" in shown.output
    written = pd.read_csv(tmp_path / "cmp" / "deployments.csv")
    assert list(written["difference"]) == cmp["deployments"][0]["differences"]
    from raysweep.report.comparison import deployments_html
    from raysweep.results import compare

    page = deployments_html(compare.compare(compare.load_side(a), compare.load_side(b)))
    assert "<li>deployment s0 against s0: pd_decode_count 1 != 2; " in page and "max_num_seqs 64 != 128" in page
    c = _pd_results(tmp_path / "c.csv", "1P1D", {"max_num_seqs": 64}, connector="NixlConnector")
    [cmp] = json.loads(CliRunner().invoke(main, ["compare", str(a), str(c), "--json"]).output)["comparisons"]
    assert cmp["deployments"][0]["differences"] == [
        "pd_connector ExampleConnector != NixlConnector",
        "decode-0: kv_transfer_config {'kv_connector': 'ExampleConnector', 'kv_role': 'kv_consumer'} != "
        "{'kv_connector': 'NixlConnector', 'kv_role': 'kv_consumer'}",
        "prefill-0: kv_transfer_config {'kv_connector': 'ExampleConnector', 'kv_role': 'kv_producer'} != "
        "{'kv_connector': 'NixlConnector', 'kv_role': 'kv_producer'}"]
    same = json.loads(CliRunner().invoke(main, ["compare", str(a), str(a), "--json"]).output)["comparisons"][0]
    assert same["deployments"][0]["differences"] == []
    assert "no difference in shape or in any role server's settings" in CliRunner().invoke(
        main, ["compare", str(a), str(a)]).output


# ---------------------------------------------------------------------------------------------------
# Which deployment leads in which load region
# ---------------------------------------------------------------------------------------------------

def _region_runs(curves: dict[str, dict[int, float]], n: int = 4, spread: float = 0.01) -> pd.DataFrame:
    """Runs of each configuration at each concurrency (output throughput, n runs with a relative spread); a
    name with a P:D ratio (`1P1D`) is a deployment, any other a colocated server."""
    rng = np.random.default_rng(7)
    rows = []
    for cfg, curve in curves.items():
        ratio = cfg if re.fullmatch(r"\dP\dD", cfg) else None
        for conc, thr in curve.items():
            for r in range(n):
                w = 1 + spread * rng.standard_normal()
                rows.append({"serve_id": cfg, "bench_id": f"c{conc}", "point_id": f"{cfg}-{conc}-{r}",
                             "run_number": r, "serve_label": f"cfg={cfg}", "bench_label": f"c={conc}",
                             "max_concurrency": conc, "gpu_count": 2, "output_throughput": thr * w,
                             "median_ttft_ms": 10.0 * w, "median_e2el_ms": 100.0 * w, "completed": 100, "failed": 0,
                             "client_limited": False, "validity_ok": True, "validity_issues": "",
                             "pd_ratio": ratio, "pd_connector": "NixlConnector" if ratio else None})
    return pd.DataFrame(rows)


def test_the_conclusions_say_which_deployment_leads_in_which_load_region():
    """Two deployments whose curves cross (1P1D ahead at low concurrency, 2P1D at high, equal between) and a
    colocated server that is no deployment: one line per shape naming each region's leader, `not shown`
    where the runs cannot tell them apart or are too few; none for a campaign without deployments."""
    from raysweep.results import conclusions

    curves = {"1P1D": {1: 100.0, 2: 200.0, 4: 400.0, 8: 500.0, 16: 500.0},
              "2P1D": {1: 50.0, 2: 150.0, 4: 400.0, 8: 700.0, 16: 900.0},
              "colocated": {1: 1000.0, 2: 1000.0, 4: 1000.0, 8: 1000.0, 16: 1000.0}}
    c = conclusions.conclude(_region_runs(curves), ["max_concurrency"], objective="output_throughput")
    assert c.deployments == {"1P1D": "cfg=1P1D (1P1D via NixlConnector)",
                             "2P1D": "cfg=2P1D (2P1D via NixlConnector)"}
    [line] = [ln for ln in conclusions.headlines(c) if ln.startswith("Deployments by")]
    assert line == ("Deployments by max_concurrency for all bench points: 1 to 2: cfg=1P1D (1P1D via NixlConnector) "
                    "leads; 4: not shown; 8 to 16: cfg=2P1D (2P1D via NixlConnector) leads (Welch's t over runs, "
                    "Holm over the 5 test(s) of the shape at 5%)"), line
    few = conclusions.conclude(_region_runs(curves, n=2), ["max_concurrency"], objective="output_throughput")
    [line] = [ln for ln in conclusions.headlines(few) if ln.startswith("Deployments by")]
    assert ": 1 to 16: not shown (fewer than 3 runs on a side) (" in line and "leads" not in line
    plain = conclusions.conclude(_region_runs({"a": curves["1P1D"], "b": curves["2P1D"]}), ["max_concurrency"],
                                 objective="output_throughput")
    assert not any(ln.startswith("Deployments by") for ln in conclusions.headlines(plain))


def test_the_conclusions_flag_deployments_that_differ_beyond_the_declared_axes():
    """Three deployments of one campaign that sweeps the ratio and decode.max_num_seqs: one whose decode server
    alone runs without CUDA graphs is flagged next to the load-region line, once, naming the server and the
    setting; the swept setting, the ports and a second prefill server of the same settings are no difference;
    alike arms say so; a deployment whose runs carry no settings says `not recorded`, never `no difference`."""
    from raysweep.results import conclusions

    curves = {"1P1D": {1: 100.0, 4: 400.0}, "2P1D": {1: 50.0, 4: 800.0}, "1P2D": {1: 90.0, 4: 390.0}}
    runs = _region_runs(curves)
    kv = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    prefill = {"port": 8001, "kv_transfer_config": kv}
    settings = {"1P1D": {"prefill-0": prefill,
                         "decode-0": {"port": 8002, "max_num_seqs": 64, "kv_transfer_config": kv}},
                "2P1D": {"prefill-0": prefill, "prefill-1": {**prefill, "port": 8003},
                         "decode-0": {"port": 8004, "max_num_seqs": 128, "kv_transfer_config": kv}},
                "1P2D": {"prefill-0": prefill,
                         "decode-0": {"port": 8005, "enforce_eager": True, "kv_transfer_config": kv},
                         "decode-1": {"port": 8006, "enforce_eager": True, "kv_transfer_config": kv}}}
    runs["pd_role_settings"] = [json.dumps(settings[s]) for s in runs["serve_id"]]
    params = [{"prefill.count": 1, "decode.max_num_seqs": 64}, {"prefill.count": 2, "decode.max_num_seqs": 128},
              {"decode.count": 2}]
    c = conclusions.conclude(runs, ["max_concurrency"], objective="output_throughput", serve_params=params)
    lines = conclusions.headlines(c)
    at = next(i for i, ln in enumerate(lines) if ln.startswith("Deployments by"))
    flagged = [ln for ln in lines if "beyond the declared" in ln]
    assert flagged == lines[at + 1:at + 3] and len(flagged) == 2, lines
    assert flagged[0] == ("Deployments cfg=1P1D (1P1D via NixlConnector) and cfg=1P2D (1P2D via NixlConnector) "
                          "differ beyond the declared sweep axes (decode.max_num_seqs): decode-0: enforce_eager "
                          "(default) != True; decode-1: enforce_eager (default) != True; their comparison is not like "
                          "for like")
    assert "cfg=2P1D (2P1D via NixlConnector) differ" in flagged[1] and "decode-0: enforce_eager True != (default)" \
        in flagged[1] and "prefill-1" not in flagged[1]
    # no arm line anywhere else: said once, in the conclusions and in the report's Conclusions section
    assert sum("declared sweep axes" in ln for ln in lines) == 2
    from types import SimpleNamespace

    from raysweep.report.cards import conclusions_section
    from raysweep.report.markup import esc

    page = conclusions_section(SimpleNamespace(df=runs, answer=c, campaign={}), lambda *_: "")  # type: ignore[arg-type]
    assert page.count(esc(flagged[0])) == 1 and page.count(esc(flagged[1])) == 1
    # without the declared axes, the swept max_num_seqs is a difference too
    bare = conclusions.conclude(runs, ["max_concurrency"], objective="output_throughput")
    assert any("decode-0: max_num_seqs 64 != 128" in ln for ln in bare.arms)
    alike = runs[runs["serve_id"] != "1P2D"]
    c = conclusions.conclude(alike, ["max_concurrency"], objective="output_throughput", serve_params=params)
    assert c.arms == ["The 2 deployments' role servers differ only in the declared sweep axes (decode.max_num_seqs), "
                      "as their settings were recorded at their start"]
    unrecorded = alike.assign(pd_role_settings=[None if s == "2P1D" else t
                                                for s, t in zip(alike["serve_id"], alike["pd_role_settings"])])
    c = conclusions.conclude(unrecorded, ["max_concurrency"], objective="output_throughput", serve_params=params)
    assert c.arms == ["Role servers' settings not recorded for cfg=2P1D (2P1D via NixlConnector): whether the "
                      "deployments differ beyond the declared sweep axes is not known"]
    assert not any("only in the declared" in ln or "no difference" in ln for ln in conclusions.headlines(c))


def test_the_conclusions_name_a_deployment_whose_decode_servers_prefilled_requests_again():
    """A deployment whose decode servers prefilled some requests again gets one line, with the count and the
    loads where it happened, in the headlines and the report's card; one without any, or a campaign that
    did not count them, gets none; one deployment swept over loads gets it after its load lines."""
    from types import SimpleNamespace

    from raysweep.report.cards import conclusions_section
    from raysweep.report.markup import esc
    from raysweep.results import conclusions

    curves = {"1P1D": {1: 100.0, 4: 400.0}, "2P1D": {1: 50.0, 4: 800.0}}
    runs = _region_runs(curves)
    broken = (runs["serve_id"] == "2P1D") & (runs["max_concurrency"] == 4)
    runs["pd_decode_prefilled_requests"] = np.where(broken, 3, 0)
    runs["pd_decode_finished_requests"] = 100
    said = ("Deployment cfg=2P1D (2P1D via NixlConnector): its decode servers prefilled 12 of 800 requests again "
            "at max_concurrency 4 (their KV did not arrive through the connector): its latencies include prefills "
            "a working transfer does not do")
    c = conclusions.conclude(runs, ["max_concurrency"], objective="output_throughput")
    lines = conclusions.headlines(c)
    assert [ln for ln in lines if "prefilled" in ln] == [said], lines
    page = conclusions_section(SimpleNamespace(df=runs, answer=c, campaign={}), lambda *_: "")  # type: ignore[arg-type]
    assert page.count(esc(said)) == 1
    fine = conclusions.conclude(runs.assign(pd_decode_prefilled_requests=0), ["max_concurrency"],
                                objective="output_throughput")
    assert not any("prefilled" in ln for ln in conclusions.headlines(fine))
    uncounted = runs.drop(columns=["pd_decode_prefilled_requests", "pd_decode_finished_requests"])
    assert not any("prefilled" in ln
                   for ln in conclusions.headlines(conclusions.conclude(uncounted, ["max_concurrency"])))
    alone = conclusions.conclude(runs[runs["serve_id"] == "2P1D"], ["max_concurrency"], objective="output_throughput")
    assert alone.single_config and conclusions.headlines(alone)[-1] == said

"""A P/D deployment in the scheduler, without Ray: its bundles' GPUs counted per bundle (several to a node, each
role server on one node), the router beside a decode server, deployments packed beside other configurations,
and a deployment placed again only where all of its bundles fit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from test_scheduler import FakeCluster, FakeWork, finish, make, serve

from raysweep.campaign import campaign_from_dict
from raysweep.place.pd import deployment_layout, layout_of
from raysweep.place.placement import Demand, Layout, NodeInfo, choose_starts, fit_bundles, layout_fits
from raysweep.plan.plan import ServeConfig, build_plan


def _pd_serves(tmp_path: Path, grid: dict[str, list[Any]], **pd_: Any) -> list[ServeConfig]:
    data = {"name": "pd", "runs": 1, "serve": {
        "cmd": "vllm serve m", "params": {"grid": grid},
        "pd": {"kv_transfer_config": {"kv_connector": "ExampleConnector"}, "check_connector": False, **pd_}},
        "bench": {"params": [{"max_concurrency": 2}]}}
    return build_plan(campaign_from_dict(data, tmp_path)).serves


def test_bundles_go_largest_first_each_on_the_node_it_fills_most_tightly_the_router_beside_decode():
    # decode (2 GPUs) first on the tightest node that holds it (b: 3 free), then the prefill servers
    assert fit_bundles((1, 1, 2, 0), ["a", "b"], {"a": 4, "b": 3}) == ["b", "a", "b", "b"]
    # one server of 4 GPUs per node: the two roles on two nodes, the router with the decode server
    assert fit_bundles((4, 4, 0), ["a", "b", "c"], {"a": 4, "b": 4, "c": 4}) == ["a", "b", "b"]
    # a server never splits over nodes: 2 + 2 free is no room for a 3-GPU server
    assert fit_bundles((3, 1, 0), ["a", "b"], {"a": 2, "b": 2}) is None
    # a cluster without GPUs: every bundle on the first eligible node
    assert fit_bundles((0, 0, 0), ["h", "a"], {"h": 0, "a": 0}) == ["h", "h", "h"]
    assert fit_bundles((1, 0), [], {}) is None


def test_a_deployments_layout_is_its_bundles_and_its_gpus_all_its_roles(tmp_path):
    nodes = [NodeInfo("head", "10.0.0.1", 0, 2.0), NodeInfo("a", "10.0.0.2", 4, 8.0),
             NodeInfo("b", "10.0.0.3", 4, 8.0)]
    two_one, = _pd_serves(tmp_path, {"prefill.count": [2]}, decode={"tensor_parallel_size": 2})
    lay = layout_of(two_one, nodes, True)
    assert isinstance(lay, Layout) and lay.mode == "pd"
    assert lay.bundle_gpus == (1, 1, 2, 0) and lay.gpu_count == 4 == two_one.deployment.gpus
    assert layout_of(two_one, nodes, False) == Layout(1, 0, "pd", bundle_gpus=(0, 0, 0, 0))
    # a role's server larger than any node, or GPU nodes gone from a GPU campaign: why, never a CPU fallback
    big, = _pd_serves(tmp_path, {"decode.tensor_parallel_size": [8]})
    assert "a decode server needs 8 GPUs" in str(deployment_layout(big.deployment, big.rule, nodes, True))
    gone = str(layout_of(two_one, nodes[:1], True))
    assert "no alive node has GPUs" in gone and "never runs on a CPU" in gone
    # an ordinary configuration keeps its layout
    assert layout_of(serve("x", 2), nodes, True) == Layout(1, 2)


def test_deployments_and_colocated_configs_share_the_nodes_by_their_bundles(tmp_path):
    a_1p1d, b_2p1d = _pd_serves(tmp_path, {"prefill.count": [1, 2]}, prefill={"tensor_parallel_size": 2},
                                decode={"tensor_parallel_size": 2})
    cluster = FakeCluster(head=0, a=4, b=4, c=4)
    work = FakeWork(b_2p1d, a_1p1d, serve("solo", 4), work={b_2p1d.id: 3, a_1p1d.id: 2, "solo": 1})
    sched, _, _ = make(cluster, work)
    sched.step()
    started = dict(cluster.started)
    # the 2P1D (6 GPUs) first: both prefill servers fill node a, the decode server and the router go to b
    assert started[b_2p1d.id] == ("a", "a", "b", "b")  # bundles: prefill-0, prefill-1, decode-0, router
    # the 1P1D (4 GPUs): its prefill server fills the gap on b, its decode server goes to c; the 4-GPU
    # colocated one waits, no node has 4 GPUs free
    assert started[a_1p1d.id] == ("b", "c", "c")
    assert "solo" not in started
    assert sched._free_gpus(cluster.nodes()) == {"head": 0, "a": 0, "b": 0, "c": 2}
    finish(cluster, work, a_1p1d.id)  # its GPUs on b and c are free again, all of them
    sched.step()
    assert dict(cluster.started)["solo"] == ("c",)
    assert sched._free_gpus(cluster.nodes()) == {"head": 0, "a": 0, "b": 2, "c": 0}


def test_a_deployment_is_placed_again_only_where_all_its_bundles_fit(tmp_path):
    dep, = _pd_serves(tmp_path, {"prefill.count": [1]}, prefill={"tensor_parallel_size": 4},
                      decode={"tensor_parallel_size": 4})
    cluster = FakeCluster(a=4, b=4, c=4)
    work = FakeWork(dep, work={dep.id: 2})
    sched, events, _ = make(cluster, work)
    sched.step()
    assert dict(cluster.started)[dep.id] == ("a", "b", "b")
    cluster.lose("b")
    sched.step()
    assert dep.id in cluster.aborted
    finish(cluster, work, dep.id, "aborted")
    sched.step()  # a and c hold it again: one server each
    assert cluster.started[-1] == (dep.id, ("a", "c", "c"))
    lay = cluster.layouts[-1]
    assert layout_fits(lay, dep.rule, cluster.nodes())
    assert not layout_fits(lay, dep.rule, [n for n in cluster.nodes() if n.node_id != "c"])
    assert [k for k, _ in events].count("replaced") == 1


def test_the_packer_counts_a_deployments_gpus_per_bundle_when_it_holds_nodes_for_a_later_one():
    free = {"a": 4, "b": 4}
    pd = Layout(1, 0, "pd", bundle_gpus=(2, 2, 0))
    chosen = choose_starts([Demand("pd", pd, ("a", "b"), 5.0), Demand("x", Layout(1, 4), ("a", "b"), 1.0)], free)
    assert [(d.key, n) for d, n in chosen] == [("pd", ["a", "a", "a"]), ("x", ["b"])]
    assert free == {"a": 0, "b": 0}

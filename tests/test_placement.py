"""Placement without a cluster: layouts of GPU shapes on node sets, the packer, multi-node commands,
node rules and pins."""

from __future__ import annotations

import pytest
from helpers import standin_campaign

from raysweep.campaign import NodeRule, load_campaign
from raysweep.errors import CampaignError
from raysweep.place.placement import (
    Demand,
    Layout,
    NodeInfo,
    bundles_for,
    choose_starts,
    eligible_nodes,
    fit_nodes,
    layout_for,
)
from raysweep.plan.plan import Shape, build_plan
from raysweep.serve.server import rank_argv

ANY = NodeRule()


def nodes(*gpus: int, labels: list[dict[str, str]] | None = None) -> list[NodeInfo]:
    return [NodeInfo(node_id=f"n{i}", ip=f"10.0.0.{i}", gpus=g, cpus=8, labels=(labels or [{}] * len(gpus))[i],
                     resources={"GPU": g, "CPU": 8, **({"fast_disk": 1} if i == 0 else {})})
            for i, g in enumerate(gpus)]


@pytest.mark.parametrize("shape, expect", [
    (Shape(1), Layout(1, 1)),
    (Shape(2), Layout(1, 2)),
    (Shape(4), Layout(1, 4)),
    (Shape(2, 2), Layout(1, 4)),
    (Shape(4, 2), Layout(2, 4, "nnodes")),          # PP crosses nodes, TP=4 stays inside one
    (Shape(2, 4), Layout(2, 4, "nnodes")),          # 4 stages over 2 nodes, 2 per node
    (Shape(1, 1, 8), Layout(2, 4, "dp", 4)),        # 8 DP replicas, 4 per node
    (Shape(2, 1, 4), Layout(2, 4, "dp", 2)),
    (Shape(4, 3), Layout(3, 4, "nnodes")),
    (Shape(tp=1, per_replica=8), Layout(2, 4, "nnodes")),
])
def test_layouts_on_three_nodes_of_four(shape, expect):
    assert layout_for(shape, ANY, nodes(4, 4, 4)) == expect


@pytest.mark.parametrize("shape, gpus, words", [
    (Shape(8), (4, 4, 4), "tensor_parallel_size=8 is larger than any node (the largest has 4 GPUs)"),
    (Shape(4, 4), (4, 4, 4), "needs 16 GPUs (tp=4 pp=4 dp=1), but the 3 node(s) have 12 in all"),
    (Shape(2, 3), (4, 4), "tp=2 x pp=3 = 6 GPUs cannot be split evenly"),
    (Shape(4, 2, 2), (4, 4, 4, 4), "data parallelism over replicas that themselves span nodes is not supported"),
    (Shape(2, 1, 3), (4, 2), "3 data-parallel replicas of 2 GPUs cannot be spread evenly"),
])
def test_shapes_that_can_never_fit_say_why(shape, gpus, words):
    reason = layout_for(shape, ANY, nodes(*gpus))
    assert isinstance(reason, str) and words in reason


def test_uneven_pipeline_fits_three_nodes_but_not_two():
    assert layout_for(Shape(2, 3), ANY, nodes(2, 2, 2)) == Layout(3, 2, "nnodes")
    assert isinstance(layout_for(Shape(2, 3), ANY, nodes(4, 4)), str)


def test_cluster_without_gpus_takes_one_node_and_no_gpu():
    assert layout_for(Shape(4, 2), ANY, nodes(0, 0)) == Layout(1, 0)
    bundles, strategy = bundles_for(Layout(1, 0), ANY)
    assert bundles == [{"CPU": 0.5}] and strategy == "STRICT_PACK"


def test_bundles_one_per_node_strict_spread_with_the_rule_resources():
    bundles, strategy = bundles_for(Layout(2, 4, "nnodes"), NodeRule(resources={"fast_disk": 1}))
    assert strategy == "STRICT_SPREAD"
    assert bundles == [{"CPU": 0.5, "GPU": 4.0, "fast_disk": 1}] * 2


def test_node_rules_filter_by_labels_and_resources():
    ns = nodes(8, 8, 4, labels=[{"gpu": "H100"}, {"gpu": "A100"}, {"gpu": "H100"}])
    assert [n.node_id for n in eligible_nodes(NodeRule(node_labels={"gpu": "H100"}), ns)] == ["n0", "n2"]
    assert [n.node_id for n in eligible_nodes(NodeRule(node_labels={"gpu": ["A100", "B200"]}), ns)] == ["n1"]
    assert [n.node_id for n in eligible_nodes(NodeRule(resources={"fast_disk": 1}), ns)] == ["n0"]
    # an 8-GPU config pinned to H100 nodes: only n0 holds it whole
    assert layout_for(Shape(8), NodeRule(node_labels={"gpu": "H100"}), ns) == Layout(1, 8)
    reason = layout_for(Shape(8), NodeRule(node_labels={"gpu": "B200"}), ns)
    assert isinstance(reason, str) and "no alive node matches the placement rule gpu=B200" in reason
    reason = layout_for(Shape(4, 4), NodeRule(node_labels={"gpu": "H100"}), ns)
    assert isinstance(reason, str) and "matching gpu=H100 have 12 in all" in reason


def test_fit_is_best_fit_and_needs_distinct_nodes():
    free = {"a": 8, "b": 3, "c": 5}
    assert fit_nodes(Layout(1, 3), "abc", free) == ["b"]            # the tightest hole
    assert fit_nodes(Layout(1, 4), "abc", free) == ["c"]
    assert fit_nodes(Layout(2, 5), "abc", free) == ["c", "a"]
    assert fit_nodes(Layout(2, 6), "abc", free) is None
    assert fit_nodes(Layout(1, 3), "ac", free) == ["c"]             # only eligible nodes


def test_choose_starts_packs_largest_first_then_fills_gaps():
    free = {"n0": 8, "n1": 8}
    ds = [Demand("small", Layout(1, 1), ("n0", "n1")), Demand("big", Layout(2, 6, "nnodes"), ("n0", "n1")),
          Demand("mid", Layout(1, 2), ("n0", "n1")), Demand("mid2", Layout(1, 2), ("n0", "n1")),
          Demand("too-big", Layout(1, 4), ("n0", "n1"))]
    chosen = choose_starts(ds, free)
    assert [(d.key, n) for d, n in chosen] == [("big", ["n0", "n1"]), ("mid", ["n0"]), ("mid2", ["n1"])]
    assert free == {"n0": 0, "n1": 0}
    # the 1-GPU config waits: nothing is left; with room it fills the gap
    free = {"n0": 1, "n1": 0}
    assert [d.key for d, _ in choose_starts([ds[0], ds[4]], free)] == ["small"]


def test_choose_starts_puts_more_work_first_and_respects_slots():
    free = {"n0": 4}
    ds = [Demand("few", Layout(1, 2), ("n0",), work=2), Demand("many", Layout(1, 2), ("n0",), work=9),
          Demand("mid", Layout(1, 2), ("n0",), work=5)]
    assert [d.key for d, _ in choose_starts(ds, dict(free))] == ["many", "mid"]
    assert [d.key for d, _ in choose_starts(ds, dict(free), slots=1)] == ["many"]
    assert choose_starts(ds, dict(free), slots=0) == []
    # a long small configuration starts before a short large one, which then fills what is left
    ds = [Demand("short-big", Layout(1, 3), ("n0",), work=1), Demand("long-small", Layout(1, 1), ("n0",), work=6)]
    assert [d.key for d, _ in choose_starts(ds, dict(free))] == ["long-small", "short-big"]


def test_rank_commands_follow_vllm_multinode_rules():
    argv = ["vllm", "serve", "m", "--tensor-parallel-size", "4", "--pipeline-parallel-size", "2"]
    lay = Layout(2, 4, "nnodes")
    assert rank_argv(argv, Layout(1, 4), 0, "10.0.0.1", 29500) == argv
    r0 = rank_argv(argv, lay, 0, "10.0.0.1", 29500)
    r1 = rank_argv(argv, lay, 1, "10.0.0.1", 29500)
    assert r0[len(argv):] == ["--nnodes", "2", "--node-rank", "0", "--master-addr", "10.0.0.1", "--master-port",
                              "29500"]
    assert r1[len(argv):] == ["--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1", "--master-port",
                              "29500", "--headless"]
    dp = Layout(2, 4, "dp", 2)
    d1 = rank_argv(["vllm", "serve", "m", "-dp", "4"], dp, 1, "10.0.0.1", 29550)
    assert d1[5:] == ["--data-parallel-size-local", "2", "--data-parallel-address", "10.0.0.1",
                      "--data-parallel-rpc-port", "29550", "--data-parallel-start-rank", "2", "--headless"]


def test_placement_section_pins_and_caps(tmp_path):
    f = standin_campaign(tmp_path, serve_params={"grid": {"tensor_parallel_size": [1, 8]}},
                         placement={"node_labels": {"zone": "a"}, "max_servers": 3,
                                    "pins": [{"when": {"tensor_parallel_size": 8}, "node_labels": {"gpu": "H100"},
                                              "resources": {"big_node": 1}}]})
    plan = build_plan(load_campaign(f))
    rules = {s.shape.tp: s.rule for s in plan.serves}
    assert rules[1] == NodeRule(node_labels={"zone": "a"})
    assert rules[8] == NodeRule(node_labels={"zone": "a", "gpu": "H100"}, resources={"big_node": 1})
    assert plan.spec.campaign.placement.max_servers == 3


@pytest.mark.parametrize("placement, where, words", [
    ({"max_servers": 0}, "placement.max_servers", "greater than or equal to 1"),
    ({"node_lables": {}}, "placement.node_lables", "node_labels"),
    ({"resources": {"GPU": 1}}, "placement.resources", "sized by raysweep itself"),
    ({"resources": {"disk": -1}}, "placement.resources", "positive amount"),
    ({"pins": [{"when": {}}]}, "placement.pins[0].when", "at least one serve parameter"),
    ({"pins": [{"when": {"tensor_parallel_size": 16}}]}, "placement.pins[0].when", "matches no server configuration"),
])
def test_bad_placement_is_refused_naming_the_field(tmp_path, placement, where, words):
    f = standin_campaign(tmp_path, serve_params={"grid": {"tensor_parallel_size": [1, 2]}}, placement=placement)
    with pytest.raises(CampaignError) as exc:
        build_plan(load_campaign(f))
    assert where in str(exc.value) and words in str(exc.value)


def test_gpus_per_replica_sizes_commands_that_are_not_vllm(tmp_path):
    f = standin_campaign(tmp_path, serve={"gpus_per_replica": 3}, serve_params={"grid": {"data_parallel_size": [1, 2]}})
    plan = build_plan(load_campaign(f))
    assert sorted(s.shape.gpu_count for s in plan.serves) == [3, 6]
    with pytest.raises(CampaignError, match="serve.gpus_per_replica"):
        load_campaign(standin_campaign(tmp_path, serve={"gpus_per_replica": 0}))


@pytest.mark.parametrize("shape, expect", [
    (Shape(2, 2, spread=True), Layout(2, 2, "nnodes")),      # fits one node packed; spread: a stage per node
    (Shape(1, dp=2, spread=True), Layout(2, 1, "dp", 1)),    # one replica per node
    (Shape(2, 4, spread=True), Layout(2, 4, "nnodes")),      # 4 stages: as many nodes as there are (3 < 4)
    (Shape(4, spread=True), "has nothing to spread"),        # TP never crosses nodes
    (Shape(1, dp=4, spread=True), "need 4 nodes"),
])
def test_spread_places_the_same_shape_across_nodes(shape, expect):
    got = layout_for(shape, ANY, nodes(4, 4, 4))
    assert got == expect if isinstance(expect, Layout) else (isinstance(got, str) and expect in got)


def test_placement_layout_list_sweeps_every_config_packed_and_spread(tmp_path):
    f = standin_campaign(tmp_path, serve_params=[{"tensor_parallel_size": 2, "pipeline_parallel_size": 2}],
                         placement={"layout": ["pack", "spread"]})
    plan = build_plan(load_campaign(f))
    assert [(s.params["placement_layout"], s.shape.spread) for s in plan.serves] == [("pack", False), ("spread", True)]
    assert len({s.id for s in plan.serves}) == 2
    assert all("placement" not in " ".join(s.argv) for s in plan.serves)  # raysweep's own, never a flag
    assert [layout_for(s.shape, ANY, nodes(4, 4)) for s in plan.serves] == [Layout(1, 4), Layout(2, 2, "nnodes")]
    default = build_plan(load_campaign(standin_campaign(tmp_path, serve_params=[{"tensor_parallel_size": 2}])))
    assert "placement_layout" not in default.serves[0].params  # pack alone keeps the ids of existing campaigns


def test_a_bad_layout_names_the_field(tmp_path):
    with pytest.raises(CampaignError, match="placement.layout"):
        load_campaign(standin_campaign(tmp_path, placement={"layout": "scatter"}))
    f = standin_campaign(tmp_path, serve_params=[{"tensor_parallel_size": 2, "placement_layout": "wide"}])
    with pytest.raises(CampaignError, match="placement_layout must be pack or spread"):
        build_plan(load_campaign(f))

"""The fabric bandwidth probe: its arithmetic and gate (pure), and a real gloo all-reduce across exactly the
placement group's bundles on two simulated nodes of the session cluster."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from raysweep.place.fabric import bus_bandwidth, gate


def test_bus_bandwidth_is_nccl_tests_arithmetic():
    algbw, busbw = bus_bandwidth(10**9, 0.5, 8)
    assert algbw == pytest.approx(2.0) and busbw == pytest.approx(2.0 * 2 * 7 / 8)
    assert bus_bandwidth(10**9, 1.0, 1) == (1.0, 1.0)


BASE = {"per_node": {"a": 40.0, "b": 50.0}}


@pytest.mark.parametrize("bw, min_gbps, fraction, refused", [
    (30.0, None, None, None), (30.0, 20.0, None, None), (10.0, 20.0, None, "min_busbw_gbps 20"),
    (30.0, None, 0.7, None),                                   # 30 >= 0.7 x 40 (the slower node's baseline)
    (25.0, None, 0.7, "62% of the 40.00 GB/s baseline"),
    (None, 20.0, None, "the fabric probe failed"),
])
def test_gate(bw, min_gbps, fraction, refused):
    result = {"busbw_gbps": bw, "node_ids": ["a", "b"], "error": None if bw else "RuntimeError: timeout"}
    why = gate(result, min_gbps, fraction, BASE)
    assert (why is None) if refused is None else (refused in why)


def test_a_fraction_of_a_baseline_that_never_saw_these_nodes_is_refused_with_the_fix():
    why = gate({"busbw_gbps": 30.0, "node_ids": ["c", "d"]}, None, 0.5, BASE)
    assert "no measurement for the nodes" in why and "raysweep preflight --bandwidth" in why


@pytest.mark.ray
def test_gloo_probe_runs_across_exactly_the_placement_groups_two_nodes(gpu_cluster):
    import ray
    from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

    from raysweep.place import fabric
    from raysweep.place.placement import Layout

    pg = placement_group([{"CPU": 0.5, "GPU": 1}, {"CPU": 0.5, "GPU": 1}], strategy="STRICT_SPREAD")
    assert pg.wait(60)
    try:
        placed = placement_group_table(pg)["bundles_to_node_id"]
        res = SimpleNamespace(pg=pg, bundles=[{}, {}], layout=Layout(2, 1, "nnodes"), node_ids=[placed[0], placed[1]])
        out = fabric.probe(res, mib=1, iters=2, timeout_s=120)
        assert out["error"] is None, out
        assert out["backend"] == "gloo" and out["world"] == 2 and out["nnodes"] == 2
        assert out["busbw_gbps"] > 0 and out["algbw_gbps"] == pytest.approx(out["busbw_gbps"])  # 2 ranks: x 1
        assert sorted(out["node_ids"]) == sorted({placed[0], placed[1]}) and placed[0] != placed[1]
    finally:
        remove_placement_group(pg)
    assert ray.is_initialized()


@pytest.mark.ray
def test_bandwidth_baseline_measures_node_pairs_and_feeds_the_fraction_gate(gpu_cluster, tmp_path):
    import json

    from helpers import add_nodes, remove_nodes

    from raysweep.place import fabric, placement

    pool = add_nodes(gpu_cluster, "bw", num_gpus=1)
    try:
        nodes = [n for n in placement.cluster_nodes() if n.labels.get("pool") == "bw"]
        base = fabric.bandwidth_baseline(nodes, mib=1, iters=2, timeout_s=120)
        assert len(base["pairs"]) == 1 and base["pairs"][0]["error"] is None, base
        assert set(base["per_node"]) == {n.node_id for n in nodes} and min(base["per_node"].values()) > 0
        f = tmp_path / "preflight.json"
        f.write_text(json.dumps({"nodes": [], "bandwidth": base}))
        loaded = fabric.load_baseline(str(f))
        slow = {"busbw_gbps": min(base["per_node"].values()) / 10, "node_ids": [n.node_id for n in nodes]}
        assert "10% of the" in fabric.gate(slow, None, 0.5, loaded)
        assert fabric.gate({**slow, "busbw_gbps": slow["busbw_gbps"] * 10}, None, 0.5, loaded) is None
    finally:
        remove_nodes(gpu_cluster, pool)

"""The hardware a run was measured on (raysweep.serve.hardware): its signature, configurations whose runs span
hardware flagged in the results table, left out of the aggregates with the reason, named by status and the
report."""

from __future__ import annotations

import json

from click.testing import CliRunner
from test_plots import build_output_dir

from raysweep.cli import main
from raysweep.record.directory import CampaignDir
from raysweep.record.files import write_json_atomic
from raysweep.report import page as report
from raysweep.results import aggregate
from raysweep.results.table import load_records, results_table
from raysweep.serve import hardware

GPU_HOST = {"num_nodes": 1, "gpus_per_node": 1, "gpu_count": 1, "provenance_gpu": "none", "node_types": "1 GPU, 1 CPU"}
HEAD = {"num_nodes": 1, "gpus_per_node": 0, "gpu_count": 0, "provenance_gpu": "none", "node_types": "0 GPU, 1 CPU"}


def test_the_signature_names_layout_gpu_model_and_node_types_not_the_nodes():
    assert hardware.signature(GPU_HOST) == "1 node(s) x 1 GPU(s) / nodes 1 GPU, 1 CPU"
    assert hardware.signature(HEAD) == "1 node(s), no GPU / nodes 0 GPU, 1 CPU"
    h100 = {"num_nodes": 2, "gpus_per_node": 8, "provenance_gpu": "NVIDIA H100 80GB HBM3 x 8",
            "node_types": "H100, 8 GPU, 96 CPU", "node_ids": "a,b"}
    assert hardware.signature(h100) == ("2 node(s) x 8 GPU(s) / GPU NVIDIA H100 80GB HBM3 x 8 / nodes H100, 8 GPU, "
                                        "96 CPU")
    assert hardware.signature({**h100, "node_ids": "c,d"}) == hardware.signature(h100)  # other nodes, same type
    assert hardware.signature({"num_nodes": 1}) == "1 node(s), no GPU"  # an old record: what it has


def test_the_labs_finding_one_configuration_on_two_machines_is_flagged_and_the_other_is_not():
    """5 runs on the GPU host, then 7 on the head without GPUs; a second configuration entirely on the head."""
    recs = ([{"serve_id": "a", "started_at": float(i), "validity_ok": True, "validity_issues": "", **GPU_HOST}
             for i in range(5)]
            + [{"serve_id": "a", "started_at": 10.0 + i, "validity_ok": True, "validity_issues": "", **HEAD}
               for i in range(7)]
            + [{"serve_id": "b", "started_at": 20.0 + i, "validity_ok": True, "validity_issues": "", **HEAD}
               for i in range(3)])
    hardware.mark(recs)
    a, b = recs[:12], recs[12:]
    assert all(r["hardware_mixed"] for r in a) and not any(r["hardware_mixed"] for r in b)
    # the main hardware is the one it first ran on, though most of its runs were elsewhere
    assert [r["validity_ok"] for r in a] == [True] * 5 + [False] * 7 and all(r["validity_ok"] for r in b)
    assert a[5]["validity_issues"] == ("other hardware (1 node(s), no GPU / nodes 0 GPU, 1 CPU, where its "
                                       "configuration first ran on 1 node(s) x 1 GPU(s) / nodes 1 GPU, 1 CPU)")
    assert aggregate.check_names(a[5]["validity_issues"]) == ["other hardware"]
    assert hardware.mixed(recs) == {"a": {"1 node(s), no GPU / nodes 0 GPU, 1 CPU": 7,
                                          "1 node(s) x 1 GPU(s) / nodes 1 GPU, 1 CPU": 5}}
    hardware.mark(recs)  # marking twice adds nothing
    assert a[5]["validity_issues"].count("other hardware") == 1


def _two_machines(out) -> None:
    """Every s8 run 1 measured on the head without GPUs, its run 0 (earlier) on the GPU host."""
    for path in (out / "points").rglob("run=*.json"):
        rec = json.loads(path.read_text())
        rec.update(client_limited=False, validity_ok=True, validity_issues="", **GPU_HOST,
                   started_at=100.0 + rec["run_number"])
        if rec["serve_id"] == "s8" and rec["run_number"] == 1:
            rec.update(HEAD)
        rec["hardware"] = hardware.signature(rec)
        write_json_atomic(path, rec)


def test_results_summary_status_and_report_say_so_and_never_pool_the_two(tmp_path, monkeypatch):
    out = build_output_dir(tmp_path / "out")
    _two_machines(out)
    df = results_table(CampaignDir(out))
    s8, s16 = df[df["serve_id"] == "s8"], df[df["serve_id"] == "s16"]
    assert s8["hardware_mixed"].all() and not s16["hardware_mixed"].any()
    assert set(s8[s8["run_number"] == 1]["validity_ok"]) == {False} and s8[s8["run_number"] == 0]["validity_ok"].all()
    summary = aggregate.summary_table(CampaignDir(out))
    one = summary[summary["serve_id"] == "s8"]
    both = one[one["runs_total"] == 2]  # 7 points with both runs (one run of the 8th failed)
    assert len(both) == 7 and (one["runs"] == 1).all() and (both["runs_left_out"] == 1).all()
    assert both["left_out_reasons"].eq("other hardware 1").all()
    assert set(one["hardware"]) == {"1 node(s) x 1 GPU(s) / nodes 1 GPU, 1 CPU"} and one["hardware_mixed"].all()
    assert not summary[summary["serve_id"] == "s16"]["hardware_mixed"].any()
    # status names the configuration and counts its runs per hardware
    text = CliRunner().invoke(main, ["status", str(out)]).output
    assert "hardware: server config s8 ran on 2 kinds of hardware" in " ".join(text.split()), text
    doc = json.loads(CliRunner().invoke(main, ["status", str(out), "--json"]).output)
    assert doc["validity"]["hardware_mixed"] == {"s8": {"1 node(s) x 1 GPU(s) / nodes 1 GPU, 1 CPU": 8,
                                                        "1 node(s), no GPU / nodes 0 GPU, 1 CPU": 7}}
    # the report: a table of the configurations that span hardware, the hardware column in the results
    monkeypatch.setattr(report, "_figure_list", lambda data: [])
    monkeypatch.setattr(report, "_card_figure", lambda data, c, v: "")
    html = report.build_report(CampaignDir(out))
    assert "ran on more than one hardware" in html and "other hardware" in html
    assert "<th>hardware</th>" in html or ">hardware<" in html
    recs = load_records(CampaignDir(out))
    assert sum(1 for r in recs if r["validity_ok"] is False) == 7  # s8's run 1 of its 7 finished points


def test_the_machine_the_driver_runs_on_says_its_own_cpus_not_the_embedded_rays(monkeypatch):
    """An embedded Ray declares at least 4 CPUs; the hardware of its node is the machine's cores (2 here)."""
    import os

    from raysweep.serve.hardware import _node_type

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    node = {"NodeID": "n1", "Resources": {"CPU": 4.0, "GPU": 0.0}, "Labels": {}}
    assert _node_type(node, local="n1") == "0 GPU, 2 CPU"
    assert _node_type(node, local="other") == "0 GPU, 4 CPU"  # a remote node: what it declared
    assert _node_type({**node, "Labels": {"ray.io/accelerator-type": "H100"}}) == "H100, 0 GPU, 4 CPU"

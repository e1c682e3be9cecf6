"""Cluster operations: `preflight` (every node checked before a sweep) and `tiny-model` (a demo model)."""

from __future__ import annotations

import sys

import click
from rich.markup import escape
from rich.table import Table

from raysweep.cli import logs
from raysweep.cli._common import _say, console, main, out


@main.command()
@click.option("--address", default=None, help="Ray cluster to join (`auto`, or HOST:PORT). Default: an embedded "
                                              "local Ray (this machine only).")
@click.option("--json", "as_json", is_flag=True, help="Print the whole report as JSON instead of tables.")
@click.option("--out", "out_path", default=None, type=click.Path(dir_okay=False),
              help="Also write the whole report as JSON to this file.")
@click.option("--strict", is_flag=True, help="Exit 1 when nodes differ or a node has a warning (default: exit 0).")
@click.option("--bandwidth", is_flag=True, help="Also measure the all-reduce bus bandwidth between neighbouring "
              "pairs of GPU nodes (NCCL; gloo without GPUs): the baseline of `transport.min_busbw_fraction`.")
@click.option("--bandwidth-mib", default=64.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="MiB all-reduced per iteration of the bandwidth probe.")
def preflight(address: str | None, as_json: bool, out_path: str | None, strict: bool, bandwidth: bool,
              bandwidth_mib: float) -> None:
    """Check every node before a sweep: GPUs and driver, InfiniBand ports, NCCL environment, Python, Ray and
    vLLM versions; flag the nodes that differ from the others, interface and address variables a host lacks
    (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME, VLLM_HOST_IP), raysweep or vLLM versions that differ from the
    driver's, and hosts that cannot reach each other over TCP."""
    import json

    from raysweep.drive.driver import ray_session
    from raysweep.place.preflight import describe_node, finding_text, node_label, run_preflight
    from raysweep.record.files import write_json_atomic

    with logs.routed(), ray_session(address):
        pre = run_preflight()
        if bandwidth:
            from raysweep.place import fabric, placement

            base = fabric.bandwidth_baseline(placement.cluster_nodes(), bandwidth_mib)
    data = pre.to_dict()
    if bandwidth:
        data["bandwidth"] = base
    if out_path:
        write_json_atomic(out_path, data)
    if as_json:
        _say(json.dumps(data, indent=2, default=str))
    else:
        for node in pre.nodes:
            table = Table("", "", title=f"node {escape(node_label(node))}" + (" (head)" if node["is_head"] else ""),
                          show_header=False)
            for what, value in describe_node(node):
                table.add_row(what, escape(value))
            out.print(table)
        if pre.findings:
            table = Table("node", "field", "value", "most common", title="nodes that differ")
            for f in pre.findings:
                table.add_row(escape(f.node), f.field, escape(finding_text(f.value, f.field)),
                              "no majority (tie)" if f.tie else escape(finding_text(f.majority, f.field)))
            out.print(table)
        for w in pre.warnings:
            out.print(f"[yellow]warning[/] {escape(w.node)}: {escape(w.message)}", highlight=False)
        if pre.reachability:
            bad = [r for r in pre.reachability if not r["ok"]]
            _say(f"TCP reachability between hosts: {len(pre.reachability) - len(bad)} of {len(pre.reachability)} "
                 "connection(s) made")
        if bandwidth:
            table = Table("nodes", "backend", "ranks", "bus bandwidth", title="fabric bandwidth (all-reduce)")
            for row in base["pairs"]:
                bw = f"{row['busbw_gbps']:.2f} GB/s" if row["busbw_gbps"] is not None else f"failed: {row['error']}"
                table.add_row(" <-> ".join(row["ips"]) + "\n" + " ".join(n[:8] for n in row["nodes"]),
                              str(row["backend"]), str(row["world"]), escape(bw))
            out.print(table)
        _say(f"{len(pre.nodes)} node(s), {len(pre.findings)} finding(s), {len(pre.warnings)} warning(s)")
    if out_path:
        console.print(f"report: {out_path}", highlight=False)
    if strict and (pre.findings or pre.warnings):
        sys.exit(1)


@main.command("tiny-model")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--overwrite", is_flag=True)
def tiny_model(directory: str, overwrite: bool) -> None:
    """Write a tiny dummy-weight Llama (config + tokenizer) that the vLLM CPU build can serve."""
    from raysweep.lab.tiny_model import make_tiny_model

    out.print(str(make_tiny_model(directory, overwrite=overwrite)))

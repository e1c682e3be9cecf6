"""`raysweep slurm CAMPAIGN`: the sbatch script of a campaign, sized from its plan (raysweep.place.slurm)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from raysweep.cli._common import _output_dir, _say, main
from raysweep.errors import UserError


@main.command("slurm")
@click.argument("campaign_file", type=click.Path(dir_okay=False))
@click.option("--gpus-per-node", default=8, show_default=True, type=int, help="GPUs of one node of your cluster: "
              "the largest configuration is laid out on such nodes.")
@click.option("--cpus-per-node", default=None, type=int, help="CPUs Ray may use on each GPU node (--cpus-per-task; "
              "default: the whole node, with --exclusive).")
@click.option("--client-nodes", default=0, show_default=True, type=int,
              help="CPU-only nodes for Ray's head, the campaign's driver and its clients (a heterogeneous job: "
                   "these, then the GPU nodes); 0: the head is on the first GPU node.")
@click.option("--client-cpus", default=None, type=int, help="CPUs of each client node (default: the whole node).")
@click.option("--time", "time_limit", default=None, help="The job's time limit (Slurm's formats: minutes, HH:MM:SS, "
              "D-HH:MM:SS); default: the plan's estimate x 1.5, plus Ray's start and the grace period.")
@click.option("--grace", default=120, show_default=True, type=click.IntRange(min=30),
              help="Seconds before the time limit at which the campaign is told to stop (--signal=B:TERM@GRACE).")
@click.option("--partition", default=None, help="Slurm partition.")
@click.option("--account", default=None, help="Slurm account.")
@click.option("--python", "python", default=None, help="The Python with raysweep, Ray and vLLM, at a path every "
              "node sees (default: this one).")
@click.option("--output-dir", default=None, help="Override the campaign's output_dir (a path every node sees).")
@click.option("--exclusive/--no-exclusive", default=True, show_default=True, help="Whole nodes for the job.")
@click.option("--requeue/--no-requeue", default=True, show_default=True,
              help="Let Slurm requeue the job (preemption, a node failure); it resumes the campaign.")
@click.option("-o", "--out", "out", default=None, help="Where to write the script (default: CAMPAIGN's name with "
              ".sbatch, in this directory; `-`: standard output).")
def slurm(campaign_file: str, gpus_per_node: int, cpus_per_node: int | None, client_nodes: int,
          client_cpus: int | None, time_limit: str | None, grace: int, partition: str | None, account: str | None,
          python: str | None, output_dir: str | None, exclusive: bool, requeue: bool, out: str | None) -> None:
    """Write the sbatch script that runs CAMPAIGN on a Slurm allocation: nodes and GPUs per node from its
    largest placement, the time limit from its estimate, Ray started on every node with srun, stopped cleanly
    (nothing left on any node) on the time limit or scancel; submitted again, it resumes the campaign."""
    from raysweep.campaign import load_campaign
    from raysweep.place import sizing
    from raysweep.place import slurm as slurmmod
    from raysweep.plan.estimate import estimate, format_duration
    from raysweep.plan.plan import build_plan

    for opt, value, least in (("--gpus-per-node", gpus_per_node, 1), ("--cpus-per-node", cpus_per_node, 1),
                              ("--client-nodes", client_nodes, 0), ("--client-cpus", client_cpus, 1)):
        if value is not None and value < least:
            raise UserError(f"{opt}: {value} is not accepted: a whole number, {least} or more")
    spec = load_campaign(campaign_file)
    from raysweep.drive.endpoint import endpoints_of

    if endpoints_of(spec):
        raise UserError("serve.url: the campaign measures endpoints that run already; there is no server to place "
                        "on a Slurm allocation (run it with `raysweep run` where the endpoints are reachable)")
    plan = build_plan(spec)
    sized = sizing.size(plan, gpus_per_node, cpus_per_node)
    nodes, gpn, which = sized.nodes, sized.gpus, sized.which
    py = Path(python or sys.executable)
    if not (py.is_file() and os.access(py, os.X_OK)):
        raise UserError(f"--python: {str(py)!r} is not an executable file; give the Python that has raysweep, Ray and "
                        "vLLM, at a path every node sees")
    est = estimate(plan)
    if time_limit is not None:
        secs = slurmmod.parse_time(time_limit)
        limit_from = f"--time {time_limit}"
    else:
        secs = slurmmod.time_limit(est.wall_s, grace)
        limit_from = (f"the estimate ({format_duration(est.wall_s)}, {est.basis}) x {slurmmod.MARGIN}, "
                      f"+ {slurmmod.START_S:.0f} s for Ray's start, + the {grace} s grace")
    if secs <= grace + 60:
        raise UserError(f"--grace: {grace} s leaves the campaign {secs - grace} s of a {secs} s time limit; "
                        "give a longer --time or a shorter --grace")
    outdir = Path(output_dir) if output_dir else _output_dir(spec, None)
    target = Path(out) if out not in (None, "-") else None
    if out is None:
        target = Path(f"{Path(campaign_file).stem}.sbatch")
    if target is not None and target.exists() and target.is_dir():
        raise UserError(f"--out: {str(target)!r} is a directory; give a file name")
    job = slurmmod.SlurmJob(
        name=f"raysweep-{spec.campaign.name}", campaign=str(Path(campaign_file).resolve()),
        output_dir=str(outdir.resolve()), chdir=os.getcwd(), python=str(py.absolute()), nodes=nodes,
        gpus_per_node=gpn, cpus_per_node=cpus_per_node, client_nodes=client_nodes, client_cpus=client_cpus,
        time_s=secs, grace_s=grace, partition=partition, account=account, exclusive=exclusive, requeue=requeue,
        why=[f"nodes: {nodes} x {gpn} GPU(s): the largest placement, {which}, on nodes of {gpus_per_node} GPU(s)",
             *([f"client nodes: {client_nodes} (Ray's head, the driver and the clients; no GPU)"] * bool(client_nodes)),
             f"time limit {slurmmod.slurm_time(secs)}: {limit_from}",
             f"plan: {len(plan.serves)} server configuration(s), {est.points} run(s), {est.server_starts} server "
             "start(s)"])
    text = slurmmod.render(job)
    if target is None:
        click.echo(text, nl=False)
        return
    tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.chmod(tmp, 0o755)
    os.replace(tmp, target)
    _say(f"wrote {target}: {nodes} node(s) x {gpn} GPU(s)" + (f" + {client_nodes} client node(s)" * bool(client_nodes))
         + f", time limit {slurmmod.slurm_time(secs)}, TERM {grace} s before it\nsubmit: sbatch {target}   "
         f"(again to resume; results in {outdir})")

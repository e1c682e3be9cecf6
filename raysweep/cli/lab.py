"""`raysweep lab up|status|down|exec`: a cluster of real hosts on one machine (raysweep.lab.hosts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import click

from raysweep.cli._common import _say, main


def _ints(text: str, opt: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"{text!r}: comma-separated whole numbers, one per host (e.g. 0,1,1)",
                                 param_hint=opt) from None


def _fail(exc: Exception) -> None:
    _say(f"error: {exc}", err=True, style="red")
    sys.exit(getattr(exc, "code", 1))


@main.group()
def lab() -> None:
    """A cluster of real hosts on this machine: each its own network, UTS, IPC and mount namespaces on a
    private bridge, with Ray in each (root only)."""


@lab.command("up")
@click.option("--name", default="lab", show_default=True, help="The lab's name (1-6 lower-case letters/digits); "
              "every namespace, link and bridge it makes starts with rs<NAME>.")
@click.option("--hosts", default=3, show_default=True, type=int, help="How many hosts (the Ray head is the first).")
@click.option("--subnet", default="10.77.0.0/24", show_default=True,
              help="A private subnet this machine routes nowhere else (checked; refused otherwise).")
@click.option("--gpus", default="0,1,1", show_default=True, help="Simulated GPUs per host (the last repeats).")
@click.option("--cpus", default="2,1,1", show_default=True, help="Ray CPUs per host (the last repeats).")
@click.option("--pin/--no-pin", default=None, help="Pin each host to its own cores (default: when every host "
              "gets two cores at least).")
@click.option("--slurm", is_flag=True, help="A real Slurm on the hosts instead of Ray (slurmctld on the first, a "
              "slurmd on each, munge; the hosts' GPUs as generic resources): jobs start Ray themselves. Needs "
              "scripts/install-slurm.sh.")
@click.option("--json", "as_json", is_flag=True, help="Print the lab's state as JSON.")
def lab_up(name: str, hosts: int, subnet: str, gpus: str, cpus: str, pin: bool | None, slurm: bool,
           as_json: bool) -> None:
    """Make the lab and start Ray on every host (or Slurm, with --slurm); print how to reach it."""
    from raysweep.lab import hosts as labmod

    spec = labmod.LabSpec(name=name, hosts=hosts, subnet=subnet, gpus=_ints(gpus, "--gpus"),
                          cpus=_ints(cpus, "--cpus"), pin=pin, persistent=True, ray=not slurm)
    try:
        if slurm:
            from raysweep.lab import slurm as lab_slurm

            if missing := lab_slurm.missing_tools():
                raise labmod.LabError(f"--slurm: {', '.join(missing)} not installed: run scripts/install-slurm.sh "
                                      "as root; nothing was created", 2)
        state = labmod.up(spec)
        if slurm:
            try:
                lab_slurm.up(state)
            except BaseException:
                labmod.down(name, quiet=True)
                raise
    except labmod.LabError as exc:
        _fail(exc)
        return
    if as_json:
        _say(json.dumps(state, indent=2))
        return
    for h in state["hosts"]:
        _say(f"host {h['hostname']}: {h['ip']} on {h['dev']}, {h['gpus']} GPU(s), {h['cpus']} CPU(s)"
             + (f", cores {h['cpus_pinned']}" if h.get("cpus_pinned") else ""))
    if slurm:
        _say(f"Slurm up in {state['slurm']['up_s']:.1f} s: export SLURM_CONF={state['slurm']['conf']}, then sbatch, "
             f"squeue, scancel as usual (`raysweep slurm CAMPAIGN` writes a campaign's sbatch); `raysweep lab down "
             f"--name {name}` clears it")
        return
    _say(f"Ray address: {state['address']}\ndashboard: {state['dashboard']}\nup in {state['up_s']:.1f} s; "
         f"run a driver on the head with `raysweep lab exec --name {name} 1 -- raysweep run FILE`; "
         f"`raysweep lab down --name {name}` clears it")


@lab.command("status")
@click.option("--name", default="lab", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def lab_status(name: str, as_json: bool) -> None:
    """Each host's namespace, processes and Ray node; exit 1 when the lab is not (wholly) up."""
    from raysweep.lab import hosts as labmod

    st = labmod.status(name)
    if as_json:
        _say(json.dumps(st, indent=2))
    elif not st["hosts"]:
        left = st.get("leftovers") or {}
        _say(f"lab {name}: not up" + (f"; left behind: {left} (`raysweep lab down --name {name}` clears it)"
                                     if any(left.values()) else ""))
    else:
        for h in st["hosts"]:
            _say(f"host {h['hostname']}: {h['ip']} on {h['dev']}, namespace {'present' if h['netns'] else 'MISSING'}, "
                 f"{h['processes']} process(es), Ray node {h['ray']}")
        _say(f"Ray address: {st['address']}\ndashboard: {st['dashboard']}")
    sys.exit(0 if st["up"] else 1)


@lab.command("down")
@click.option("--name", default="lab", show_default=True)
@click.option("--stale", is_flag=True, help="Also clear every lab whose owner process is gone.")
@click.option("--json", "as_json", is_flag=True, help="Print what was removed as JSON.")
def lab_down(name: str, stale: bool, as_json: bool) -> None:
    """Stop every process of the lab's hosts by PID; delete its namespaces, veths and bridge."""
    from raysweep.lab import hosts as labmod

    try:
        state = labmod.load_state(name)
        if state is not None and state.get("slurm"):   # its Slurm daemons first, each by its pid file
            from raysweep.lab import slurm as lab_slurm

            labmod.check_root()
            lab_slurm.down(state)
        done = [labmod.down(name)] + (labmod.down_stale() if stale else [])
    except labmod.LabError as exc:
        _fail(exc)
        return
    if as_json:
        _say(json.dumps(done, indent=2))
    for d in done if not as_json else []:
        _say(f"lab {d['name']} down in {d['down_s']:.1f} s: {d['processes_stopped']} process(es) stopped, "
             f"{len(d['netns_removed'])} namespace(s) removed" + (f"; LEFT: {d['processes_left']} {d['left']}"
                                                                   if d['processes_left'] or any(d['left'].values())
                                                                   else ""))
    sys.exit(0 if all(not d["processes_left"] and not any(d["left"].values()) for d in done) else 1)


@lab.command("exec", context_settings={"ignore_unknown_options": True})
@click.option("--name", default="lab", show_default=True)
@click.argument("host", type=click.IntRange(min=1))
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
def lab_exec(name: str, host: int, argv: tuple[str, ...]) -> None:
    """Run a command inside lab host HOST (1 is the head), with the host's environment."""
    from raysweep.lab import hosts as labmod

    state = labmod.load_state(name)
    if state is None:
        _fail(labmod.LabError(f"no lab named {name!r} is up", 2))
        return
    if host > len(state["hosts"]):
        _fail(labmod.LabError(f"HOST: {host} is not accepted: the lab has hosts 1 to {len(state['hosts'])}", 2))
        return
    env = labmod.host_env(state, host)
    env["RAY_ADDRESS"] = state["address"]
    sys.exit(subprocess.call(labmod.exec_argv(state, host, list(argv)), env=env, cwd=os.getcwd()))

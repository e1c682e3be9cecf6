"""The sbatch script of a campaign, sized from its plan (`raysweep slurm CAMPAIGN`).

Nodes and GPUs per node come from the largest placement of the plan on nodes of the given size (the layout
raysweep's scheduler would choose: one node when it fits, pipeline stages or data-parallel replicas across
nodes otherwise), the time limit from the plan's estimate. The script starts Ray's head on the batch host and a
Ray worker on every other node with `srun`, each under `raysweep.place.slurm_node` (the child subreaper that
leaves nothing behind), runs `raysweep run` on the head with the ledger and the results in the campaign's output
dir (a path every node sees), and stops on `--signal=B:TERM@GRACE` (the time limit near) and on `scancel`: the
campaign first (its finished points are in the ledger), then Ray on every node, by pid. Submitted again (or
requeued by Slurm), it resumes the campaign: done points are never run again.

`ray symmetric-run` (Ray 2.60) is not used: it ends with `ray stop`, which kills every Ray process of the
machine by name, another job's included.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from raysweep.place import sizing

__all__ = ["SlurmJob", "parse_time", "render", "time_limit"]

START_S = 300.0        # Ray on every node, and the driver's own start, on top of the campaign's estimate
MARGIN = sizing.MARGIN # the estimate is a guess: this much more time, then the grace period


@dataclass
class SlurmJob:
    name: str
    campaign: str                   # absolute
    output_dir: str                 # absolute
    chdir: str                      # absolute: where relative paths of the campaign are read from
    python: str                     # the interpreter with raysweep, Ray and vLLM, on every node
    nodes: int
    gpus_per_node: int
    cpus_per_node: int | None = None
    client_nodes: int = 0           # CPU-only nodes for the driver and the clients (a heterogeneous job)
    client_cpus: int | None = None
    time_s: int = 3600
    grace_s: int = 120
    partition: str | None = None
    account: str | None = None
    exclusive: bool = True
    requeue: bool = True
    ray_port: int = 6379
    sbatch_extra: list[str] = field(default_factory=list)
    why: list[str] = field(default_factory=list)   # how the sizes were chosen, for the script's header


def time_limit(estimate_s: float, grace_s: int) -> int:
    """Seconds: the estimate with a margin, Ray's start, and the grace period; whole minutes."""
    return sizing.time_s(estimate_s, START_S, grace_s)


def parse_time(text: str) -> int:
    """Slurm's time formats (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, and 2h, 45m) to seconds; UserError
    otherwise."""
    return sizing.parse_duration(text, "--time", "Slurm's smallest limit")


def slurm_time(seconds: int) -> str:
    d, rest = divmod(int(seconds), 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    return f"{d}-{h:02d}:{m:02d}:{s:02d}" if d else f"{h:02d}:{m:02d}:{s:02d}"


def _sbatch_lines(job: SlurmJob) -> list[str]:
    common = [f"--job-name={job.name}", f"--time={slurm_time(job.time_s)}", f"--signal=B:TERM@{job.grace_s}",
              f"--chdir={job.chdir}", "--output=slurm-raysweep-%j.out", "--open-mode=append",
              "--requeue" if job.requeue else "--no-requeue"]
    common += [f"--partition={job.partition}"] * bool(job.partition) + [f"--account={job.account}"] * bool(job.account)
    gpu = [f"--nodes={job.nodes}", "--ntasks-per-node=1", f"--gpus-per-node={job.gpus_per_node}"]
    gpu += [f"--cpus-per-task={job.cpus_per_node}"] * bool(job.cpus_per_node) + ["--exclusive"] * job.exclusive
    if not job.client_nodes:
        return [*common, *gpu, *job.sbatch_extra]
    client = [f"--nodes={job.client_nodes}", "--ntasks-per-node=1"]
    client += [f"--cpus-per-task={job.client_cpus}"] * bool(job.client_cpus) + ["--exclusive"] * job.exclusive
    return [*common, *client, *job.sbatch_extra, "hetjob", *gpu]


def render(job: SlurmJob) -> str:
    """The sbatch script of `job`."""
    head = "\n".join(f"#SBATCH {x}" for x in _sbatch_lines(job))
    about = "\n".join(f"#   {w}" for w in job.why)
    q = shlex.quote
    values = {
        "@NAME@": job.name, "@CAMPAIGN@": q(job.campaign), "@OUTPUT_DIR@": q(job.output_dir),
        "@PYTHON@": q(job.python), "@GRACE@": str(job.grace_s), "@RAY_PORT@": str(job.ray_port),
        "@HET@": "1" if job.client_nodes else "0", "@NODES@": str(job.nodes + job.client_nodes),
    }
    body = _BODY
    for k, v in values.items():
        body = body.replace(k, v)
    name = job.name.removeprefix("raysweep-")
    return (f"#!/bin/bash\n# raysweep campaign {name}: {job.campaign}\n# written by `raysweep slurm` from the "
            f"campaign's plan:\n{about}\n#\n# Submit with `sbatch THIS_FILE` (again to "
            "resume: finished points are never run twice).\n"
            f"{head}\n{body}")


_BODY = r"""
set -uo pipefail
PYTHON=@PYTHON@
CAMPAIGN=@CAMPAIGN@
OUTPUT_DIR=@OUTPUT_DIR@
GRACE=@GRACE@                      # seconds between the TERM and the end of the job
RAY_PORT=${RAY_PORT:-@RAY_PORT@}
export PATH="$(dirname "$PYTHON"):$PATH" RAY_USAGE_STATS_ENABLED=0 RAY_worker_niceness=0
# loopback-only settings a login shell may carry do not belong on the nodes (raysweep gives each rank its own)
unset RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER RAY_ADDRESS VLLM_HOST_IP
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"
if [[ $RAY_AUTH_MODE == token && -z ${RAY_AUTH_TOKEN:-} ]]; then    # one token for this job's Ray
    RAY_AUTH_TOKEN=$("$PYTHON" -c 'import secrets; print(secrets.token_hex(32))'); export RAY_AUTH_TOKEN
fi
say() { echo "raysweep-slurm $(date -u +%H:%M:%S): $*" >&2; }

if (( @HET@ )); then
    mapfile -t GPU_NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST_HET_GROUP_1")
    HEAD_STEP=(--het-group=0); WORKER_STEP=(--het-group=1 --nodes=${#GPU_NODES[@]})
else
    mapfile -t ALL_NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
    GPU_NODES=("${ALL_NODES[@]:1}")
    HEAD_STEP=(--nodes=1 --nodelist="$SLURMD_NODENAME")
    WORKER_STEP=(--nodes=${#GPU_NODES[@]} --exclude="$SLURMD_NODENAME")
fi
HEAD_IP=${RAY_HEAD_IP:-$(hostname -I | awk '{print $1}')}
TMP_BASE=${RAYSWEEP_RAY_TMP:-/tmp}          # node-local and short: Ray's socket paths must fit 107 bytes
NODE_RAY=("$PYTHON" -m raysweep.place.slurm_node --grace "$(( GRACE > 60 ? 20 : GRACE / 3 ))"
          --clean "$TMP_BASE/rs-$SLURM_JOB_ID-@NODE@" --
          ray start --block --disable-usage-stats --num-cpus=@CPUS@ --num-gpus=@GPUS@
          --temp-dir="$TMP_BASE/rs-$SLURM_JOB_ID-@NODE@" --labels="slurm-node=@NODE@")
STEPS=()        # the srun of Ray's head and the one of its workers
DRIVER=""
RC=1
STOPPING=0

stop_all() {    # the campaign first (it keeps every finished point), then Ray on every node; by pid
    local why=$1
    trap '' TERM INT HUP
    STOPPING=1
    if [[ -n $DRIVER ]] && kill -0 "$DRIVER" 2>/dev/null; then
        say "$why: stopping the campaign (finished points are kept)"
        kill -TERM "$DRIVER" 2>/dev/null
        local deadline=$(( SECONDS + GRACE * 2 / 3 ))
        while kill -0 "$DRIVER" 2>/dev/null && (( SECONDS < deadline )); do sleep 0.5; done
        kill -0 "$DRIVER" 2>/dev/null && { say "the campaign did not stop in time: killed"; kill -KILL "$DRIVER"; }
        wait "$DRIVER" 2>/dev/null; RC=$?
    fi
    if (( ${#STEPS[@]} )); then
        say "stopping Ray on @NODES@ node(s)"
        # SIGTERM to the Ray steps' tasks (each node's slurm_node stops its Ray, then whatever is left, by
        # pid); a TERM to srun itself would make it kill the step at once
        local step jobs="$SLURM_JOB_ID${SLURM_JOB_ID_HET_GROUP_1:+,$SLURM_JOB_ID_HET_GROUP_1}"
        for step in $(squeue -h -s -j "$jobs" -o %i 2>/dev/null); do
            [[ $step == *.batch || $step == *.extern ]] || scancel --signal=TERM "$step" 2>/dev/null
        done
        local deadline=$(( SECONDS + 40 )) pid
        for pid in "${STEPS[@]}"; do
            while kill -0 "$pid" 2>/dev/null && (( SECONDS < deadline )); do sleep 0.5; done
        done
        kill -TERM "${STEPS[@]}" 2>/dev/null   # what did not stop: srun ends its step
        STEPS=()
    fi
}
on_signal() { stop_all "signal"; say "exit $RC"; exit "$RC"; }
trap on_signal TERM INT HUP
trap '(( STOPPING )) || stop_all "exit"' EXIT

say "job $SLURM_JOB_ID: Ray head on $SLURMD_NODENAME ($HEAD_IP:$RAY_PORT), workers on ${GPU_NODES[*]:-none}"
srun "${HEAD_STEP[@]}" --ntasks=1 --overlap "${NODE_RAY[@]}" --head --node-ip-address="$HEAD_IP" \
    --port="$RAY_PORT" --dashboard-host="$HEAD_IP" &
STEPS+=("$!")
if (( ${#GPU_NODES[@]} )); then
    sleep 5
    srun "${WORKER_STEP[@]}" --ntasks-per-node=1 --overlap "${NODE_RAY[@]}" --address="$HEAD_IP:$RAY_PORT" &
    STEPS+=("$!")
fi
# every node in Ray before the campaign starts
want=@NODES@
for _ in $(seq 120); do
    got=$("$PYTHON" - "$HEAD_IP:$RAY_PORT" 2>/dev/null <<'PY'
import sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
print(sum(1 for n in ray.nodes() if n["Alive"]))
PY
    ) || got=0
    (( ${got:-0} >= want )) && break
    for pid in "${STEPS[@]}"; do kill -0 "$pid" 2>/dev/null || { say "a Ray step ended while starting"; exit 1; }; done
    sleep 2
done
(( ${got:-0} >= want )) || { say "only ${got:-0} of $want nodes joined Ray"; exit 1; }
say "$want node(s) in Ray; the campaign starts (output: $OUTPUT_DIR)"
"$PYTHON" -m raysweep run "$CAMPAIGN" --address "$HEAD_IP:$RAY_PORT" --output-dir "$OUTPUT_DIR" &
DRIVER=$!
wait "$DRIVER"; RC=$?
while kill -0 "$DRIVER" 2>/dev/null; do wait "$DRIVER"; RC=$?; done   # a trap interrupted the wait
DRIVER=""
say "the campaign ended with exit code $RC"
stop_all "done"
say "exit $RC"
exit "$RC"
"""

#!/usr/bin/env bash
# `make demo-slurm`: the multi-node demo campaign (configs/demo-cluster.yaml: a real `vllm serve`
# pipeline-parallel across two hosts, one on a single host, the clients on a third) submitted with `sbatch` to a
# real Slurm on a lab of 3 hosts on this machine (root; Slurm and munge from Debian: scripts/install-slurm.sh).
# `raysweep slurm` writes the sbatch from the campaign's plan; the job starts Ray on its nodes, runs the campaign
# and stops Ray again. Then its status, and the lab down, whatever happened.
set -euo pipefail
BIN=${BIN:-.venv/bin}
MODEL=${MODEL:-$PWD/.cache/tiny-llama}
OUT=${OUT:-results/demo-slurm}
NAME=${LAB_NAME:-sdemo}
SUBNET=${LAB_SUBNET:-10.77.1.0/24}
unset RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER VLLM_HOST_IP
export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled} RAYSWEEP_DEMO_MODEL=$MODEL
start=$(date +%s)
bash scripts/install-slurm.sh
"$BIN/raysweep" tiny-model "$MODEL"
"$BIN/raysweep" lab up --name "$NAME" --subnet "$SUBNET" --slurm
trap '"$BIN/raysweep" lab down --name "$NAME"' EXIT
export SLURM_CONF=/tmp/rs$NAME/slurm/slurm.conf
mkdir -p "$OUT"
"$BIN/raysweep" slurm configs/demo-cluster.yaml --gpus-per-node 1 --client-nodes 1 --output-dir "$OUT" \
    -o "$OUT/demo-cluster.sbatch"
job=$(sbatch --parsable "$OUT/demo-cluster.sbatch" | cut -d';' -f1)
echo "demo-slurm: job $job submitted; sinfo:"; sinfo -N -o "%N %T %c %G"
while [ -n "$(squeue -h -j "$job" 2>/dev/null)" ]; do sleep 5; done
state=$(scontrol -o show job "$job" | tr ' ' '\n' | sed -n 's/^JobState=//p' | head -1)
rc=0; [ "$state" = COMPLETED ] || rc=1
mv "slurm-raysweep-$job.out" "$OUT/" 2>/dev/null || true
echo "demo-slurm: job $job $state; its output: $OUT/slurm-raysweep-$job.out"
"$BIN/raysweep" status "$OUT" || true
echo "demo-slurm: $(( $(date +%s) - start )) s from the start to the lab down (exit code $rc)"
exit $rc

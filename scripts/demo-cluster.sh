#!/usr/bin/env bash
# `make demo-cluster`: a lab of 3 real hosts on this machine (root), the multi-node demo campaign with its
# driver on the head, its status (the answer, the transport and the links measured), then the lab down,
# whatever happened (a lab left by a killed run is cleared by the next `up` or `down`).
set -euo pipefail
BIN=${BIN:-.venv/bin}
MODEL=${MODEL:-$PWD/.cache/tiny-llama}
OUT=${OUT:-results/demo-cluster}
NAME=${LAB_NAME:-demo}
SUBNET=${LAB_SUBNET:-10.77.0.0/24}
# the loopback-only settings of the CPU demo do not belong on lab hosts (`raysweep lab` drops them there)
unset RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER VLLM_HOST_IP
export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled}
start=$(date +%s)
"$BIN/raysweep" tiny-model "$MODEL"
"$BIN/raysweep" lab up --name "$NAME" --subnet "$SUBNET"
trap '"$BIN/raysweep" lab down --name "$NAME"' EXIT
rc=0
"$BIN/raysweep" lab exec --name "$NAME" 1 -- env RAYSWEEP_DEMO_MODEL="$MODEL" \
  "$BIN/raysweep" run configs/demo-cluster.yaml --output-dir "$OUT" --address auto || rc=$?
"$BIN/raysweep" status "$OUT" || true
echo "demo-cluster: $(( $(date +%s) - start )) s from the start to the lab down (exit code $rc)"
exit $rc

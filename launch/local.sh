#!/usr/bin/env bash
# Runs N processes of vit_jax.main on this machine, joined through jax.distributed on
# 127.0.0.1, as a pod or a cluster would run them: for trying multi-host code on one box.
# On CPU each process gets DEVICES_PER_PROCESS simulated devices and the processes talk
# through gloo; process 0 prints the progress, the others only errors (prefixed with their id).
#
# Usage, from the repository root:
#   bash launch/local.sh [--dry-run] [--mesh SPEC] [--sharding RULE] NUM_PROCESSES [vit_jax.main flags...]
#   bash launch/local.sh 2 --config=configs/digits.py --workdir=runs/digits_2x4
#   bash launch/local.sh --mesh data:-1,model:2 --sharding tp 2 --config=configs/digits.py \
#     --workdir=runs/digits_tp
# Options, before the other arguments (docs/multihost.md):
#   --mesh SPEC      --config.mesh=SPEC for every process: the device mesh as axis:size pairs of
#                    data, fsdp and model, one size -1 (the rest); 'model' stays within a process
#   --sharding RULE  --config.sharding=RULE for every process: replicate, fsdp, tp or tp+fsdp
# Environment:
#   PYTHON               interpreter (default: .venv/bin/python if present, else python3)
#   DEVICES_PER_PROCESS  simulated CPU devices per process (default 4)
#   JAX_PLATFORMS        default cpu (JAX_PLATFORMS= uses this machine's accelerators)
#   PORT                 coordinator port (default: a free one)
#   TIMEOUT              seconds to wait for all processes to join (default 120)
#   DRY_RUN=1            print the commands instead of running them (same as --dry-run)
set -euo pipefail

# shellcheck source=launch/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

launch_options "$@"
set -- "${ARGS[@]}"
mesh_flags --config.
if [[ $# -lt 1 || ! "$1" =~ ^[1-9][0-9]*$ ]]; then
  options_error "the first argument after the options must be the number of processes, e.g. 2"
fi
NUM_PROCESSES="$1"
shift

if [[ -n "${PYTHON:-}" ]]; then
  PY="$PYTHON"
elif [[ -x .venv/bin/python ]]; then
  PY=.venv/bin/python
else
  PY=python3
fi
DEVICES="${DEVICES_PER_PROCESS:-4}"
TIMEOUT="${TIMEOUT:-120}"
if [[ -n "${PORT:-}" ]]; then
  port="$PORT"
elif [[ "$DRY_RUN" == 1 ]]; then
  port=PORT
else
  port="$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
fi

process_command() {  # the command line of process $1, into the array `cmd`
  local i="$1"
  shift
  cmd=(env "JAX_PLATFORMS=${JAX_PLATFORMS-cpu}" "XLA_FLAGS=--xla_force_host_platform_device_count=$DEVICES"
    PYTHONUNBUFFERED=1 "$PY" -m vit_jax.main "--coordinator_address=127.0.0.1:$port"
    "--num_processes=$NUM_PROCESSES" "--process_id=$i" "--distributed_timeout=$TIMEOUT" "$@"
    "${MESH_FLAGS[@]}")
}

if [[ "$DRY_RUN" == 1 ]]; then
  for ((i = 0; i < NUM_PROCESSES; i++)); do
    process_command "$i" "$@"
    echo "$(quoted "${cmd[@]}") &"
  done
  echo wait
  exit 0
fi

pids=()
cleanup() {
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
}
trap cleanup INT TERM

for ((i = 0; i < NUM_PROCESSES; i++)); do
  process_command "$i" "$@"
  if [[ $i -eq 0 ]]; then
    "${cmd[@]}" &
  else
    "${cmd[@]}" > >(sed "s/^/[process $i] /") 2> >(sed "s/^/[process $i] /" >&2) &
  fi
  pids+=("$!")
done

status=0
for pid in "${pids[@]}"; do
  if ! wait "$pid"; then
    status=1
    cleanup  # one process failed: the others would wait for it until their timeout
  fi
done
exit "$status"

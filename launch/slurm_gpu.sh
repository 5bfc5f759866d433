#!/usr/bin/env bash
# Trains on a SLURM GPU cluster: one process per GPU (per node with --mesh's model axis),
# started by srun; jax.distributed reads SLURM's variables (coordinator on the first node,
# process id, local GPU) by itself.
#
# Usage, from the repository root (edit the #SBATCH lines to your cluster first):
#   sbatch launch/slurm_gpu.sh [--mesh SPEC] [--sharding RULE] [vit_jax.main flags...]
#   sbatch --nodes=4 launch/slurm_gpu.sh --config=configs/vit_h14_fsdp.py:imagenet2012 \
#     --workdir=/shared/runs/h14
#   sbatch --nodes=4 launch/slurm_gpu.sh --mesh data:-1,model:8 --sharding tp \
#     --config=configs/vit.py:b16,imagenet2012 --workdir=/shared/runs/b16_tp
#   DRY_RUN=1 bash launch/slurm_gpu.sh --config=configs/digits.py --workdir=runs/d   # print only
# Options, before the other arguments (docs/multihost.md):
#   --mesh SPEC      --config.mesh=SPEC for every process: the device mesh as axis:size pairs of
#                    data, fsdp and model, one size -1 (the rest); with a model axis (at most
#                    the GPUs of a node), one process per node instead of one per GPU
#   --sharding RULE  --config.sharding=RULE for every process: replicate, fsdp, tp or tp+fsdp
# The workdir must be on a file system every node sees (each process writes its share of
# every checkpoint there). The venv (VENV, default .venv) is created on first use with the
# lock of PYTHON's end (requirements/oldest.txt for Python 3.11, newest.txt for 3.12 and 3.13)
# and the CUDA jax extra at its jax; the repository must be on a shared file system.
# Environment:
#   PYTHON      interpreter that creates the venv: 3.11, 3.12 or 3.13 (default python3)
#   VENV        the venv folder (default .venv)
#   CUDA_EXTRA  jax extra for the GPUs' CUDA (default cuda13; cuda12 for older drivers)
#   DRY_RUN=1   print the commands instead of running them (same as --dry-run)
#
#SBATCH --job-name=vit_jax
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=12
#SBATCH --mem=0
#SBATCH --time=24:00:00
#SBATCH --output=vit_jax-%j.out
set -euo pipefail

if [[ -n "${SLURM_SUBMIT_DIR:-}" ]]; then
  cd "$SLURM_SUBMIT_DIR"
fi
if [[ ! -f launch/lib.sh || ! -d requirements ]]; then
  echo "error: submit from the repository root (launch/lib.sh and requirements/ not found)" >&2
  exit 2
fi
# shellcheck source=launch/lib.sh
source launch/lib.sh

launch_options "$@"
set -- "${ARGS[@]}"
mesh_flags --config.
if [[ "$DRY_RUN" != 1 && -z "${SLURM_JOB_ID:-}" ]]; then
  usage >&2
  echo "error: not inside a SLURM job: submit with sbatch (or DRY_RUN=1 to print the commands)" >&2
  exit 2
fi

PY="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
CUDA_EXTRA="${CUDA_EXTRA:-cuda13}"
END="$(lock_end "$PY" PYTHON)"
JAX_VERSION="$(pinned_jax_version "$END")"

# 1. The venv with the end's lock and CUDA jax, once, on the shared file system.
if [[ ! -x "$VENV/bin/python" || "$DRY_RUN" == 1 ]]; then
  run "$PY" -m venv "$VENV"
  run "$VENV/bin/pip" install -q -r "requirements/$END.txt" "jax[$CUDA_EXTRA]==$JAX_VERSION"
fi

# 2. The processes: one per GPU on every node. No --gpus-per-task: every task sees the node's
# GPUs and JAX picks GPU SLURM_LOCALID (binding one GPU per task would renumber it to 0). A mesh
# with a model axis keeps that axis within a process (vit_jax/parallel.py): then one process
# per node, with all the node's CPUs, that sees all its GPUs (JAX_LOCAL_DEVICE_IDS: else JAX
# gives a node's one task GPU 0 alone).
export PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}"
per_node=()
if [[ "$MESH" == *model:* && ! "$MESH" =~ model:\ *1\ *(,|$) ]]; then
  gpus="${SLURM_GPUS_ON_NODE:-$(sed -n 's/^#SBATCH --gpus-per-node=//p' "$0")}"
  per_node=("--ntasks=${SLURM_JOB_NUM_NODES:-NODES}" --ntasks-per-node=1
    "--cpus-per-task=${SLURM_CPUS_ON_NODE:-CPUS}" env "JAX_LOCAL_DEVICE_IDS=$(seq -s, 0 $((gpus - 1)))")
fi
run srun --kill-on-bad-exit=1 --cpu-bind=none "${per_node[@]}" "$VENV/bin/python" -m vit_jax.main \
  --distributed=on "$@" "${MESH_FLAGS[@]}"

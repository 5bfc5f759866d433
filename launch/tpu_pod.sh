#!/usr/bin/env bash
# Trains on a Cloud TPU VM (one host or a pod slice) with gcloud: creates the TPU VM or
# reuses it, puts this code on every worker (a copy of the working tree, or a git clone),
# installs on every worker the lock of its Python's end (requirements/oldest.txt for Python
# 3.11, newest.txt for 3.12 and 3.13) with the TPU jax extra at its jax, then runs
# `python -m vit_jax.main` on all workers at once (--worker=all). jax.distributed starts by
# itself on a TPU VM: no coordinator flags are needed.
#
# Usage, from the repository root:
#   TPU_NAME=vit-pod ZONE=us-central2-b bash launch/tpu_pod.sh [--dry-run] [--mesh SPEC] \
#     [--sharding RULE] [vit_jax.main flags...]
#   TPU_NAME=vit-pod ZONE=us-central2-b ACCELERATOR_TYPE=v4-32 bash launch/tpu_pod.sh \
#     --config=configs/vit.py:b16,cifar10 --workdir=/mnt/shared/runs/b16_cifar10
#   TPU_NAME=vit-pod ZONE=us-central2-b ACCELERATOR_TYPE=v4-32 bash launch/tpu_pod.sh \
#     --mesh data:-1,model:4 --sharding tp --config=configs/vit.py:l16,cifar10 --workdir=...
# Options, before the other arguments (docs/multihost.md):
#   --mesh SPEC      --config.mesh=SPEC on every worker: the device mesh as axis:size pairs of
#                    data, fsdp and model, one size -1 (the rest); 'model' stays within a worker
#   --sharding RULE  --config.sharding=RULE on every worker: replicate, fsdp, tp or tp+fsdp
# The workdir must be a folder every worker sees (an NFS/Filestore or gcsfuse mount): each
# worker writes its share of every checkpoint there. tfds data can live in a gs:// bucket
# (--config.tfds_data_dir=gs://BUCKET/tensorflow_datasets).
# Environment:
#   TPU_NAME, ZONE       required
#   PROJECT              gcloud project (default: gcloud's configured one)
#   ACCELERATOR_TYPE     for creation (default v4-8); RUNTIME_VERSION (default tpu-ubuntu2204-base)
#   SPOT=1               create a Spot TPU VM
#   REPO_URL             clone this git URL on the workers (REPO_REF: branch or tag, default main)
#                        instead of copying the local working tree
#   CODE_DIR             folder on the workers (default vit_jax)
#   WORKER_PYTHON        the workers' interpreter that creates the venv: 3.11, 3.12 or 3.13
#                        (default python3)
#   SKIP_SETUP=1         skip copying and installing (rerun a job on prepared workers)
#   DRY_RUN=1            print the gcloud commands instead of running them (same as --dry-run)
set -euo pipefail

if [[ ! -f launch/lib.sh || ! -d requirements ]]; then
  echo "error: run from the repository root (launch/lib.sh and requirements/ not found)" >&2
  exit 2
fi
# shellcheck source=launch/lib.sh
source launch/lib.sh

launch_options "$@"
set -- "${ARGS[@]}"
mesh_flags --config.
if [[ -z "${TPU_NAME:-}" || -z "${ZONE:-}" ]]; then
  usage >&2
  echo "error: set TPU_NAME and ZONE, e.g. TPU_NAME=vit-pod ZONE=us-central2-b" >&2
  exit 2
fi

ACCELERATOR_TYPE="${ACCELERATOR_TYPE:-v4-8}"
RUNTIME_VERSION="${RUNTIME_VERSION:-tpu-ubuntu2204-base}"
CODE_DIR="${CODE_DIR:-vit_jax}"

tpu=(gcloud compute tpus tpu-vm)
location=("--zone=$ZONE")
if [[ -n "${PROJECT:-}" ]]; then
  location+=("--project=$PROJECT")
fi
where=("$TPU_NAME" "${location[@]}")

on_all_workers() {  # runs a shell command line on every worker
  run "${tpu[@]}" ssh "${where[@]}" --worker=all "--command=$1"
}

# 1. The TPU VM: reuse it if it exists, else create it.
if [[ "$DRY_RUN" != 1 ]] && "${tpu[@]}" describe "${where[@]}" --format='value(state)' >/dev/null 2>&1; then
  echo "Reusing TPU VM $TPU_NAME in $ZONE."
else
  create=("${tpu[@]}" create "${where[@]}" "--accelerator-type=$ACCELERATOR_TYPE"
    "--version=$RUNTIME_VERSION")
  if [[ "${SPOT:-0}" == 1 ]]; then
    create+=(--spot)
  fi
  if [[ "$DRY_RUN" == 1 ]]; then
    echo "# if \`${tpu[*]} describe ${where[*]}\` fails:"
  fi
  run "${create[@]}"
fi

if [[ "${SKIP_SETUP:-0}" != 1 ]]; then
  # 2. The code on every worker.
  q_dir="$(quoted "$CODE_DIR")"
  if [[ -n "${REPO_URL:-}" ]]; then
    q_url="$(quoted "$REPO_URL")"
    q_ref="$(quoted "${REPO_REF:-main}")"
    on_all_workers "if [ -d $q_dir/.git ]; then git -C $q_dir fetch -q origin $q_ref && git -C $q_dir checkout -q FETCH_HEAD; else git clone -q --branch $q_ref $q_url $q_dir; fi"
  else
    if [[ "$DRY_RUN" == 1 ]]; then
      tmp=TMPDIR
    else
      tmp="$(mktemp -d)"
      trap 'rm -rf "$tmp"' EXIT
    fi
    archive="$tmp/vit_jax_code.tar.gz"
    run tar '--exclude=.venv*' --exclude=.git --exclude=runs --exclude=__pycache__ -czf "$archive" .
    run "${tpu[@]}" scp "$archive" "$TPU_NAME:vit_jax_code.tar.gz" "${location[@]}" --worker=all
    on_all_workers "mkdir -p $q_dir && tar -xzf vit_jax_code.tar.gz -C $q_dir && rm vit_jax_code.tar.gz"
  fi
  # 3. A venv on every worker: the lock of the end of the workers' Python, known only there (so
  # launch/lib.sh picks it there), with the TPU jax extra (libtpu) at the lock's jax.
  q_py="$(quoted "${WORKER_PYTHON:-python3}")"
  on_all_workers "cd $q_dir && . launch/lib.sh && end=\"\$(lock_end $q_py WORKER_PYTHON)\" && $q_py -m venv .venv && .venv/bin/pip install -q --upgrade pip && .venv/bin/pip install -q -r \"requirements/\$end.txt\" \"jax[tpu]==\$(pinned_jax_version \"\$end\")\""
fi

# 4. The job, on all workers at once; jax.distributed finds the pod through the metadata server.
on_all_workers "cd $(quoted "$CODE_DIR") && PYTHONUNBUFFERED=1 $(quoted .venv/bin/python -m vit_jax.main "$@" "${MESH_FLAGS[@]}")"

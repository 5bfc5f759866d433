#!/usr/bin/env bash
# ViT-B/16 on one NVIDIA GPU (sized for an H200; about 5 minutes):
#   1. training at 224 px in bfloat16 (forward, backward, SGD momentum) at the largest batch
#      whose step fits in memory, images/s and MFU against the bf16 dense peak;
#   2. inference at batch 1024, XLA attention and jax.nn.dot_product_attention (cuDNN).
#
# Usage, from the repository root:
#   bash launch/gpu_benchmark.sh [OUT_DIR]        # default OUT_DIR: gpu_benchmark/
# Environment: PYTHON (default python3), PEAK_TFLOPS (default 989, the H200's bf16 dense
# peak; H100 SXM: 989, A100: 312), ROUNDS, STEPS.
# Needs jax with CUDA (pip install "jax[cuda13]"), flax, optax, ml-collections and absl-py.
set -euo pipefail

OUT="${1:-gpu_benchmark}"
PY="${PYTHON:-python3}"
PEAK="${PEAK_TFLOPS:-989}"
ROUNDS="${ROUNDS:-3}"
STEPS="${STEPS:-10}"
export PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.95}"
mkdir -p "$OUT"

"$PY" - <<'EOF'
import importlib.util
import sys

needed = ('jax', 'flax', 'optax', 'ml_collections', 'absl')
missing = [m for m in needed if importlib.util.find_spec(m) is None]
if missing:
  sys.exit(f'missing Python packages {missing}: pip install them (see requirements.txt)')
import jax

if jax.default_backend() != 'gpu':
  sys.exit(f'jax sees no GPU (backend {jax.default_backend()!r}): pip install "jax[cuda13]"')
print('jax', jax.__version__, jax.devices())
EOF
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
date -u +'%Y-%m-%dT%H:%M:%SZ' | tee "$OUT/date.txt"

common=(--model=ViT-B_16 --resolution=224 --dtype=bfloat16 "--peak_tflops=$PEAK"
        "--rounds=$ROUNDS" "--steps=$STEPS")

# 1. Training at the largest batch that fits (XLA memory analysis, a multiple of 32).
"$PY" -m vit_jax.benchmark "${common[@]}" --attention=fused --train --noinference --max_batch \
  "--json=$OUT/train.json" 2>&1 | tee "$OUT/train.txt"

# 2. Inference at batch 1024.
"$PY" -m vit_jax.benchmark "${common[@]}" --attention=xla,fused --batch=1024 \
  "--json=$OUT/inference.json" 2>&1 | tee "$OUT/inference.txt"

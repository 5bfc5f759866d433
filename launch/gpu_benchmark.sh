#!/usr/bin/env bash
# ViT-B/16 at 224 px in bfloat16 on one NVIDIA GPU (sized for an H200: 3 minutes there):
#   1. training (the trainer's step: clipping, SGD momentum) with fused attention at the
#      largest batch whose step fits in memory: images/s, MFU against the bf16 dense peak, memory;
#   2. training at batch 256, XLA attention against `fused` (cuDNN where it applies);
#   3. inference at batch 1024, both attention paths.
# Every phase also measures the best square bf16 matmul (the chip's practical ceiling).
# A phase that fails is reported and the next one runs; the exit status says whether all ran.
#
# Usage, from the repository root:
#   bash launch/gpu_benchmark.sh [OUT_DIR]        # default OUT_DIR: gpu_benchmark/
# Environment: PYTHON (default python3), PEAK_TFLOPS (default 989, the H200's bf16 dense
# peak; H100 SXM: 989, A100: 312), ROUNDS, STEPS, PHASE_TIMEOUT (seconds a phase may run; 0:
# no limit).
# Needs jax with CUDA (pip install "jax[cuda13]"), flax, optax, ml-collections and absl-py.
set -uo pipefail

OUT="${1:-gpu_benchmark}"
PY="${PYTHON:-python3}"
PEAK="${PEAK_TFLOPS:-989}"
ROUNDS="${ROUNDS:-3}"
STEPS="${STEPS:-10}"
PHASE_TIMEOUT="${PHASE_TIMEOUT:-0}"
export PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.95}"
mkdir -p "$OUT"

"$PY" - <<'EOF' 2>&1 | tee "$OUT/env.txt" || exit 1
import importlib.metadata
import importlib.util
import sys

needed = ('jax', 'flax', 'optax', 'ml_collections', 'absl')
missing = [m for m in needed if importlib.util.find_spec(m) is None]
if missing:
  sys.exit(f'missing Python packages {missing}: pip install them (see requirements.txt)')
import jax

if jax.default_backend() != 'gpu':
  sys.exit(f'jax sees no GPU (backend {jax.default_backend()!r}): pip install "jax[cuda13]"')
print('python', sys.version.split()[0], jax.devices())
for name in ('jax', 'jaxlib', 'flax', 'optax', 'ml-collections', 'numpy'):
  print(name, importlib.metadata.version(name))
EOF
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit \
    --format=csv,noheader
  date -u +'%Y-%m-%dT%H:%M:%SZ'
} 2>&1 | tee -a "$OUT/env.txt"

common=(--model=ViT-B_16 --resolution=224 --dtype=bfloat16 "--peak_tflops=$PEAK"
        "--rounds=$ROUNDS" "--steps=$STEPS")
failed=()

phase() {  # phase NAME ARGS...: one benchmark process, its table and JSON under OUT
  local name="$1"
  shift
  echo "== $name: python -m vit_jax.benchmark ${common[*]} $*"
  if ! timeout "$PHASE_TIMEOUT" "$PY" -m vit_jax.benchmark "${common[@]}" "$@" "--json=$OUT/$name.json" 2>&1 \
      | tee "$OUT/$name.txt"; then
    failed+=("$name")
  fi
}

phase train_max_batch --attention=fused --train --noinference --max_batch
phase train_b256 --attention=xla,fused --train --noinference --batch=256
phase inference_b1024 --attention=xla,fused --batch=1024

if ((${#failed[@]})); then
  echo "failed phases: ${failed[*]} (see $OUT/<phase>.txt)"
  exit 1
fi
echo "all phases ran; results in $OUT"

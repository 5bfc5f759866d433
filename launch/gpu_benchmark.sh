#!/usr/bin/env bash
# ViT training and inference at 224 px in bfloat16 on one NVIDIA GPU (training on a mesh of
# several with --mesh): one prepared call of at most ~7 minutes on an H200 (TOTAL_BUDGET), in
# phases of priority order, so that a run cut short still answers the first questions:
#   1. policies   ViT-B/16 training, the two precision policies (matmul, activations) with the
#                 fused attention call (cuDNN, padded to 64-token blocks) at batch $BATCH
#   2. attention  the same with XLA's attention under the activations policy
#   3. profile    20 steps of the activations/fused training step under jax.profiler, summarised
#                 on the machine (vit_jax.profiling: top ops, matmul/attention/other shares)
#   4. lhs        XLA flag --xla_gpu_enable_latency_hiding_scheduler=true, one round
#   5. triton     XLA flag --xla_gpu_enable_triton_gemm=true, one round
#   6. inference  ViT-B/16 inference at batch 1024, both policies, fused attention
#   7. vit_l      ViT-L/16 training at batch 256, activations, fused
#   8. vit_h      ViT-H/14 training (nn.scan + full remat) at batch 64, activations, fused
# Every phase prints bytes accessed and temporary memory per image, MFU against PEAK_TFLOPS
# and against the best square bf16 matmul it measures, and whether cuDNN's kernel ran.
# A phase that fails or times out is reported and the next one runs; a phase that would start
# past TOTAL_BUDGET seconds is skipped; the exit status says whether all ran.
#
# Usage, from the repository root:
#   bash launch/gpu_benchmark.sh [--dry-run] [--mesh SPEC] [--sharding RULE] [OUT_DIR]
#   bash launch/gpu_benchmark.sh                  # default OUT_DIR: gpu_benchmark/
#   bash launch/gpu_benchmark.sh --mesh data:-1,model:2 --sharding tp gpu_benchmark_tp
# Options, before OUT_DIR:
#   --mesh SPEC      every training phase on this mesh of the machine's GPUs (vit_jax.benchmark
#                    --mesh, as config.mesh; default one GPU): img/s and TFLOP/s are then the
#                    whole mesh's, MFU is against GPUs x PEAK_TFLOPS; inference stays on one GPU
#   --sharding RULE  how the training state is placed on --mesh: replicate (default), fsdp, tp,
#                    tp+fsdp
#   --dry-run        print the phases' commands instead of installing and running them
# Environment: PYTHON (default python3), PEAK_TFLOPS (default 989, the H200's bf16 dense peak;
# H100 SXM: 989, A100: 312), BATCH (ViT-B/16 training batch, default 512), ROUNDS, STEPS,
# PHASE_TIMEOUT (seconds per phase, default 100; 0: no limit), TOTAL_BUDGET (default 420),
# WHEELS (a directory of wheels for what the image lacks: ml-collections, simplejpeg, vit_jax's own
# wheel if the image cannot build it; *.whl files are git-ignored).
# The project is installed first as a wheel into a venv that sees the image's packages:
# pip resolves its ranges against the image's own jax, jaxlib and
# flax, which it must not change (the script stops if it would), and adds only the missing
# packages, from WHEELS alone (no index). The phases then run the installed copy. Needs jax
# with CUDA (pip install "jax[cuda13]") in the image; no TensorFlow (the core install, no
# input pipeline run here).
set -uo pipefail

# shellcheck source=launch/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
launch_options "$@"
set -- "${ARGS[@]}"
mesh_flags --

OUT="${1:-gpu_benchmark}"
PY="${PYTHON:-python3}"
PEAK="${PEAK_TFLOPS:-989}"
BATCH="${BATCH:-512}"
ROUNDS="${ROUNDS:-3}"
STEPS="${STEPS:-10}"
PHASE_TIMEOUT="${PHASE_TIMEOUT:-100}"
TOTAL_BUDGET="${TOTAL_BUDGET:-420}"
export PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.95}"
OUT="$(realpath -m "$OUT")"

install_project() {  # the core wheel into $work/venv, on the image's own jax and flax
  local pip=("$work/venv/bin/python" -m pip) wheel before after
  # A venv of its own that sees the image's packages after its own (a .pth file: the image's
  # python3 is itself a venv, which --system-site-packages would skip).
  "$PY" -m venv "$work/venv" || return 1
  "$PY" -c 'import site; print("\n".join(site.getsitepackages()))' \
    > "$("${pip[0]}" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/image.pth"
  wheel="$(find "${WHEELS:-/nonexistent}" -maxdepth 1 -name 'vit_jax-*.whl' 2>/dev/null | head -n 1)"
  if [[ -z "$wheel" ]]; then  # built here with the image's setuptools (no index to fetch one)
    "${pip[@]}" wheel -q --no-deps --no-build-isolation -w "$work/dist" . || return 1
    wheel="$(find "$work/dist" -name 'vit_jax-*.whl')"
  fi
  before="$("${pip[@]}" freeze --all | grep -iE '^(jax|jaxlib|flax)==')"
  "${pip[@]}" install -q --no-index ${WHEELS:+--find-links "$WHEELS"} "$wheel" || return 1
  after="$("${pip[@]}" freeze --all | grep -iE '^(jax|jaxlib|flax)==')"
  if [[ "$before" != "$after" ]]; then
    echo "installing vit_jax changed the image's jax or flax: $before -> $after" >&2
    return 1
  fi
  echo "installed $(basename "$wheel") on the image's ${before//$'\n'/, }"
}
prepare() {  # the installed copy, its environment and the GPU; then cd to it (not the checkout)
  mkdir -p "$OUT"
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  if ! install_project 2>&1 | tee "$OUT/install.txt"; then
    echo "vit_jax does not install on this image (above, $OUT/install.txt): carry the missing" \
      "wheels in WHEELS=dir (pip download --no-deps NAME==VERSION -d dir)"
    exit 1
  fi
  PY="$work/venv/bin/python"
  cd "$work" || exit 1
  "$PY" - <<'PYEOF' 2>&1 | tee "$OUT/env.txt" || exit 1
import importlib.metadata
import importlib.util
import sys

needed = ('jax', 'flax', 'optax', 'ml_collections', 'absl')
missing = [m for m in needed if importlib.util.find_spec(m) is None]
if missing:
  sys.exit(f'missing Python packages {missing}: pip install them, or carry their wheels (WHEELS=dir)')
import jax

if jax.default_backend() != 'gpu':
  sys.exit(f'jax sees no GPU (backend {jax.default_backend()!r}): pip install "jax[cuda13]"')
print('python', sys.version.split()[0], jax.devices())
for name in ('jax', 'jaxlib', 'flax', 'optax', 'ml-collections', 'numpy'):
  print(name, importlib.metadata.version(name))
PYEOF
  {
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit \
      --format=csv,noheader
    date -u +'%Y-%m-%dT%H:%M:%SZ'
  } 2>&1 | tee -a "$OUT/env.txt"
}
if [[ "$DRY_RUN" != 1 ]]; then
  prepare
fi

common=(--resolution=224 --dtype=bfloat16 "--peak_tflops=$PEAK" "--steps=$STEPS")
train=(--train --noinference "${MESH_FLAGS[@]}")  # every training phase
b16=(--model=ViT-B_16 "${train[@]}" "--batch=$BATCH")
failed=()
skipped=()
start=$SECONDS

phase() {  # phase NAME [VAR=VALUE ...] -- ARGS...: one benchmark process, its table and JSON
  local name="$1"
  shift
  local env=()
  while [[ "$1" != -- ]]; do
    env+=("$1")
    shift
  done
  shift
  if ((SECONDS - start >= TOTAL_BUDGET)); then
    echo "== $name: skipped (${TOTAL_BUDGET}s budget spent)"
    skipped+=("$name")
    return
  fi
  echo "== $name: ${env[*]} python -m vit_jax.benchmark ${common[*]} $*"
  if [[ "$DRY_RUN" == 1 ]]; then
    return
  fi
  if ! env "${env[@]}" timeout "$PHASE_TIMEOUT" "$PY" -m vit_jax.benchmark "${common[@]}" "$@" \
      "--json=$OUT/$name.json" 2>&1 | tee "$OUT/$name.txt"; then
    failed+=("$name")
  fi
}

act=(--precision=activations --attention=fused)
phase policies -- "${b16[@]}" --precision=matmul,activations --attention=fused "--rounds=$ROUNDS"
phase attention -- "${b16[@]}" --precision=activations --attention=xla "--rounds=$ROUNDS"
phase profile -- "${b16[@]}" "${act[@]}" --rounds=1 --profile_steps=20 \
  "--profile_dir=$OUT/profile"
phase lhs "XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true" -- "${b16[@]}" "${act[@]}" \
  --rounds=1
phase triton "XLA_FLAGS=--xla_gpu_enable_triton_gemm=true" -- "${b16[@]}" "${act[@]}" --rounds=1
phase inference -- --model=ViT-B_16 --batch=1024 --precision=matmul,activations --attention=fused \
  "--rounds=$ROUNDS"
phase vit_l -- --model=ViT-L_16 "${train[@]}" --batch=256 "${act[@]}" --rounds=2
phase vit_h -- --model=ViT-H_14 "${train[@]}" --batch=64 "${act[@]}" --layers=scan --remat=full \
  --rounds=2

if [[ "$DRY_RUN" == 1 ]]; then
  exit 0
fi
echo "$((SECONDS - start)) s for the phases"
if ((${#failed[@]} + ${#skipped[@]})); then
  echo "failed phases: ${failed[*]:-none}; skipped: ${skipped[*]:-none} (see $OUT/<phase>.txt)"
  exit 1
fi
echo "all phases ran; results in $OUT"

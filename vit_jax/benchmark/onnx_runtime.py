"""`--onnx=DIR`: the ONNX files `vit-export` wrote (float32 model.onnx; int8 model.int8.onnx
where it wrote `onnx_int8`) under onnxruntime, as programs timed beside ours, and their logits
against ours. DIR must hold the benchmark's own weights (`--save_params=FILE.npz`, exported),
else the differences measure two models.

onnxruntime is imported on first use: the benchmark runs where it is not installed.
"""

import json
import os
from typing import Any

import numpy as np

from vit_jax.benchmark.programs import Job, Timed
from vit_jax.benchmark.variants import Variant
from vit_jax.export.artifact import METADATA

MISSING = (
  "--onnx needs onnxruntime: pip install onnxruntime==1.32.0 (vit_jax's `onnxruntime` extra;"
  ' docs/benchmarks.md)'
)
FRAMEWORK = 'onnxruntime'  # its programs' framework
# Below this cosine the float32 file is not this run's model: weights of another seed, say.
SAME_MODEL_COSINE = 0.999


def model_entry(directory: str, job: Job) -> dict[str, Any]:
  """export.json's classifier function, checked against the benchmark's batch, where
  onnxruntime is installed; one-line ValueErrors, before anything is compiled."""
  try:
    import onnxruntime  # noqa: F401
  except ImportError:
    raise ValueError(MISSING) from None
  path = os.path.join(directory, METADATA)
  if not os.path.exists(path):
    raise ValueError(f'--onnx={directory}: no {METADATA} (a directory vit-export wrote)')
  with open(path) as f:
    entry = json.load(f)['functions'].get('model')
  if entry is None or not entry.get('onnx'):
    raise ValueError(f'--onnx={directory}: no ONNX classifier (vit-export --formats=onnx)')
  want = [*job.images.shape[1:]], [job.num_classes]
  have = entry['input']['shape'][1:], entry['output']['shape'][1:]
  if have != want:
    raise ValueError(
      f'--onnx={directory}: takes {have[0]} and gives {have[1]}, the benchmark {want[0]} and'
      f' {want[1]}: export the weights of --save_params at this --resolution'
    )
  return entry


def _session(path: str) -> Any:
  """An onnxruntime CPU session on every core, its operators one after another (the
  parallelism is within each)."""
  import onnxruntime as ort

  options = ort.SessionOptions()
  options.intra_op_num_threads = os.cpu_count() or 1
  options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
  return ort.InferenceSession(path, options, providers=['CPUExecutionProvider'])


def programs(directory: str, entry: dict[str, Any], job: Job, jax_programs: list) -> list[Timed]:
  """The float32 file's program, and the int8 file's where there is one (`entry`: of
  `model_entry`); the float32 one does the FLOPs of our float32 inference, where it runs."""
  x = np.asarray(job.images)
  files = {'float32': entry['onnx'], 'int8': entry.get('onnx_int8')}
  timed = []
  for dtype, name in files.items():
    if name:
      session = _session(os.path.join(directory, name))
      run = lambda s=session: s.run(None, {entry['input']['name']: x})[0]
      label = f'ORT {dtype}'  # int8: no matmul probe of its own, so no MFU
      timed.append(Timed(label, Variant(dtype), 'inference', run, framework=FRAMEWORK))
  for p in jax_programs:
    if p.mode == 'inference' and p.variant.dtype == 'float32':
      timed[0].model_flops_per_image = p.model_flops_per_image
  return timed


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def agreement(ort_programs: list[Timed], ours: np.ndarray | None, log) -> dict[str, dict]:
  """Each ONNX Runtime program's logits on the benchmark batch against our float32 ones."""
  if ours is None:
    return {}
  out = {}
  for p in ort_programs:
    theirs = p.run()
    cosine = _cosines(theirs.astype(np.float64), ours.astype(np.float64))
    out[p.label] = {
      'reference': 'ours float32',
      'images': int(ours.shape[0]),
      'max_abs_logit_error': float(np.abs(theirs - ours).max()),
      'min_cosine': float(cosine.min()),
      'top1_agreement': float(np.mean(theirs.argmax(-1) == ours.argmax(-1))),
    }
  first = ort_programs[0].label if ort_programs else None
  if first and out[first]['min_cosine'] < SAME_MODEL_COSINE:
    log(
      f"  warning: {first} is not this run's model (cosine {out[first]['min_cosine']:.3f}):"
      ' export the weights --save_params writes'
    )
  return out


def agreement_lines(agreement: dict[str, dict]) -> list[str]:
  """`agreement` in the table's words, a line per program."""
  return [
    f'{name} vs {a["reference"]}: cosine >= {a["min_cosine"]:.5f}, top-1 agreement'
    f' {a["top1_agreement"]:.1%}, max |logit error| {a["max_abs_logit_error"]:.2e} on'
    f' {a["images"]} images'
    for name, a in agreement.items()
  ]

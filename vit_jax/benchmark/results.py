"""The benchmark's result, JSON-ready: a row per program (speed, compile time, FLOPs, MFU,
memory), ours over Hugging Face's and training over inference, and the conditions of the
measurement.

A program on a mesh of N devices (`--mesh`) counts as one: img/s, TFLOP/s and the per-image
figures (bytes accessed, temporaries) are the whole mesh's, MFU is against N x the peak, and
`img_per_s_per_device` is img/s / N; XLA's memory is one device's (the measured peak: the
first device's on an accelerator, the process's on CPU). On one device (the default) these
are the same numbers."""

import datetime
import os
import statistics

import jax

from vit_jax import hugepages
from vit_jax.benchmark.programs import Job, Timed


def _finite(x: float) -> float | None:
  return x if x == x else None  # NaN (not measured) -> null in JSON


def _per(value: float | None, batch: int) -> float | None:
  return None if value is None else value / batch


def mesh_spec(mesh) -> str:
  """The mesh's axes and sizes in the form of config.mesh: 'data:4,model:2'."""
  return ','.join(f'{axis}:{size}' for axis, size in mesh.shape.items())


def _row(p: Timed, batch: int, peak: float | None, probe_best: dict, on_cpu: bool, n: int) -> dict:
  """The row of `p`, which ran on `n` devices."""
  timed = bool(p.wall)
  best = min(p.wall) if timed else None
  other = p.framework != 'jax'
  model_flops = p.model_flops_per_image
  achieved = model_flops * batch / best / 1e12 if timed and model_flops == model_flops else None
  probe = probe_best.get(p.variant.dtype)  # one device's, as the peak
  of_mesh = lambda x: None if x is None else x * n  # one device's figure, for all n
  return {
    'program': p.label,
    'framework': p.framework,
    'mode': p.mode,
    'dtype': p.variant.dtype,
    'attention': None if other else p.variant.attention,
    'remat': None if other else p.variant.remat,
    'layers': None if other else p.variant.layers,
    'img_per_s': batch / best if timed else None,
    'img_per_s_median': batch / statistics.median(p.wall) if timed else None,
    'img_per_s_per_device': batch / best / n if timed else None,
    'step_s': best,
    'step_s_all': p.wall,
    'cpu_per_wall': sum(p.cpu) / sum(p.wall) if on_cpu and timed else None,
    'page_faults_per_step': statistics.median(p.faults) if timed else None,
    'compile_s': _finite(p.compile_s),
    'flops_per_image': _finite(p.flops_per_image),
    'model_flops_per_image': _finite(model_flops),
    'achieved_tflops': achieved,
    'peak_tflops': peak,
    'mfu': achieved / (peak * n) if achieved is not None and peak else None,
    'of_matmul_probe': achieved / (probe * n) if achieved is not None and probe else None,
    'xla_memory_bytes': p.facts.get('xla_memory_bytes'),
    'bytes_accessed_per_image': _per(of_mesh(p.facts.get('bytes_accessed')), batch),
    'temp_bytes_per_image': _per(of_mesh(p.facts.get('temp_bytes')), batch),
    'precision': None if other else p.variant.precision,
    'cudnn_attention': p.facts.get('cudnn_attention'),
    'peak_memory_bytes': p.peak_bytes,
    'peak_memory_kind': ('process peak RSS' if on_cpu else 'device peak_bytes_in_use')
    if p.peak_bytes is not None
    else None,
  }


def _add_ratios(rows: list[dict]) -> None:
  """Ours over Hugging Face (same dtype and mode), and training over inference time."""
  for row in rows:
    if row['framework'] != 'jax':
      continue
    theirs = [
      r
      for r in rows
      if r['framework'] == 'hf-pytorch' and r['mode'] == row['mode'] and r['dtype'] == row['dtype']
    ]
    row['vs_hf'] = (
      row['img_per_s'] / theirs[0]['img_per_s'] if theirs and row['img_per_s'] else None
    )
  inference_rows = {r['program']: r for r in rows if r['mode'] == 'inference'}
  for row in rows:
    if row['mode'] == 'train' and row['img_per_s'] and row['program'] in inference_rows:
      row['train_over_inference_time'] = (
        inference_rows[row['program']]['img_per_s'] / (row['img_per_s'])
      )


def result(job: Job, programs: list[Timed], probe: dict, sizes, facts: dict) -> dict:
  """The JSON-ready result: the rows, the probe, and the conditions of the measurement."""
  on_cpu = jax.default_backend() == 'cpu'
  probe_best = {d: max(v) for d, v in probe.items() if v}
  given = facts['peak_tflops_given']
  peak = lambda p: given if given is not None else probe_best.get(p.variant.dtype)
  n = job.mesh.size  # every program's devices: a mesh runs training programs alone
  rows = [_row(p, job.batch, peak(p), probe_best, on_cpu, n) for p in programs]
  _add_ratios(rows)
  return {
    'model': facts['model'],
    'model_overrides': facts['model_overrides'],
    'batch': job.batch,
    'resolution': facts['resolution'],
    'num_classes': job.num_classes,
    'accum_steps': job.accum_steps,
    'analytic_forward_flops_per_image': job.analytic,
    'platform': jax.default_backend(),
    'device': jax.devices()[0].device_kind,
    'device_count': jax.device_count(),
    'mesh': mesh_spec(job.mesh),
    'mesh_devices': n,
    'sharding': job.sharding,
    'cpu_count': os.cpu_count(),
    'jax': jax.__version__,
    'huge_pages': hugepages.describe() if on_cpu else None,
    'omp_wait_policy': facts['omp_wait_policy'],
    'date': datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds'),
    'load_average_start': facts['load_average_start'],
    'load_average_end': list(os.getloadavg()),
    'rounds': facts['rounds'],
    'compile_only': job.compile_only,
    'steps_per_round': facts['steps_per_round'],
    'matmul_probe_tflops': {d: v for d, v in probe.items() if v},
    'matmul_probe_sizes': list(sizes) if probe_best else None,
    'peak_tflops_given': given,
    'rows': rows,
    'agreement': facts['agreement'],
    'hf_max_abs_logit_error': facts['hf_max_abs_logit_error'],
    'onnx': facts['onnx'],
    'onnx_agreement': facts['onnx_agreement'],
    'profile': facts['profile'],
  }

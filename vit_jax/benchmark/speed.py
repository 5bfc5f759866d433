"""`run_benchmark`: every variant's inference and training programs compiled, timed in
interleaved rounds beside Hugging Face's where asked, their logits compared, and profiled;
the result of `results.result`."""

import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import families, parallel, profiling
from vit_jax.benchmark import hugging_face, onnx_runtime, results, timing
from vit_jax.benchmark import programs as programs_lib
from vit_jax.benchmark.programs import Job, Timed
from vit_jax.benchmark.variants import (
  LAYERS,
  Variant,
  build_model,
  init_params,
  model_config,
  variants_from,
)
from vit_jax.models import blocks, precision


def _check(model, config, batch, rounds, steps, accum_steps, modes, profile, mesh):
  inference, train, compare, compile_only, onnx = modes
  if mesh is not None and (inference or compare or onnx):
    raise ValueError(
      '--mesh places the training step alone: pass --noinference (inference, --compare and'
      ' --onnx run on one device)'
    )
  if onnx and (compile_only or not inference):
    raise ValueError('--onnx times inference: leave --inference on, no --compile_only')
  if profile[0] and (compile_only or not profile[1]):
    raise ValueError('--profile_steps runs the programs: give a --profile_dir, no --compile_only')
  if compare:
    hugging_face.check_comparable(model, config)
    if compile_only:
      raise ValueError('--compare times Hugging Face: it cannot run with --compile_only')
  if not (inference or train):
    raise ValueError('nothing to measure: pass --train, or leave --inference on')
  if batch < 1 or rounds < 1 or steps < 1:
    raise ValueError(f'batch={batch}, rounds={rounds}, steps={steps}: each must be >= 1')
  if accum_steps < 1 or batch % accum_steps:
    raise ValueError(f'--accum_steps={accum_steps} does not divide --batch={batch}')


def _check_batch(batch: int, accum_steps: int, mesh) -> None:
  """The trainer's check that the batch splits over the mesh's batch shards and micro-batches
  (`parallel.check_batch`), its keys named as this benchmark's flags."""
  try:
    parallel.check_batch(batch, mesh, accum_steps)
  except ValueError as e:
    message = str(e).replace('config.batch', '--batch').replace('accum_steps', '--accum_steps')
    raise ValueError(message) from None


def _inputs(rng, batch: int, resolution: int, num_classes: int, abstract: bool):
  """Random images in [-1, 1] and labels (only their shapes when `abstract`)."""
  images = jnp.asarray(rng.uniform(-1, 1, (batch, resolution, resolution, 3)), jnp.float32)
  labels = jnp.asarray(rng.integers(0, max(num_classes, 1), batch), jnp.int32)
  if abstract:
    return programs_lib.abstract(images), programs_lib.abstract(labels)
  return images, labels


def _initial_params(job: Job, resolution: int, seed: int) -> Any:
  if not job.compile_only:
    return init_params(job.config, job.num_classes, resolution, seed)
  model = build_model(job.config, job.num_classes, Variant())
  images = job.images
  return jax.eval_shape(lambda x: model.init(jax.random.key(0), x, train=False), images)['params']


def _make_job(config, variants, rng, batch, resolution, num_classes, modes, log, placement) -> Job:
  """The job: random inputs (shapes only under compile_only), the analytic FLOPs, and where
  the training programs run (`placement`: the mesh, and the rule that places their state)."""
  inference, train, compile_only, accum_steps = modes
  images, labels = _inputs(rng, batch, resolution, num_classes, compile_only)
  analytic = families.forward_flops(config, resolution, num_classes)
  return Job(
    config, variants, num_classes, images, labels, inference, train, compile_only, accum_steps,
    analytic, log, *placement,
  )  # fmt: skip


def _program(job: Job, variant: Variant, mode: str, params_v: Any, params: Any, state: dict):
  """(one timed program of `variant` in `mode`, (its compiled inference, the parameters it
  takes) or None); training programs share `state`."""
  net = build_model(job.config, job.num_classes, variant)
  run = compiled = hlo = None
  if mode == 'inference':
    # As every inference path: the kernels a 16-bit model casts anyway are cast once.
    cast = lambda p: precision.cast_matmul_params(programs_lib.applied(net), p, job.images)
    params_v = jax.eval_shape(cast, params_v) if job.compile_only else cast(params_v)
    compiled, compile_s, flops, facts = programs_lib.compile_inference(net, params_v, job.images)
    run = lambda c=compiled, p=params_v: c(p, job.images)
  elif job.compile_only:
    _, compile_s, flops, facts = programs_lib.compile_train(
      net, params_v, job.images, job.labels, job.accum_steps, job.mesh, job.sharding
    )
  else:
    run, compile_s, flops, facts, hlo = programs_lib.train_program(
      net, params_v, job.images, job.labels, state, job.accum_steps, job.mesh, job.sharding
    )
  model_flops = flops
  if variant != programs_lib.flops_reference(variant):
    model_flops = programs_lib.model_flops(job, variant, mode, params)
  if model_flops != model_flops:  # XLA gave no count: the analytic one (a step is 3x)
    model_flops = job.analytic * (3 if mode == 'train' else 1)
  if variant.layers == 'scan':
    flops = float('nan')  # XLA counts the scanned body once
  job.log(f'  compiled {mode} {variant.name} in {compile_s:.1f}s')
  timed = Timed(variant.name, variant, mode, run, compile_s, flops, model_flops, facts)
  timed.hlo = compiled.as_text if compiled is not None else hlo
  return timed, None if compiled is None else (compiled, params_v)


def _programs(job: Job, params: Any) -> tuple[list[Timed], dict]:
  """Every variant's programs, and {variant: (compiled inference, its params)}."""
  programs, compiled_inference = [], {}
  train_state = {layout: {} for layout in LAYERS}  # shared by the training programs
  params_by_layout = {'unrolled': params}
  for variant in job.variants:
    if variant.layers == 'scan' and 'scan' not in params_by_layout:
      stack = jax.eval_shape if job.compile_only else lambda f, x: f(x)
      params_by_layout['scan'] = stack(blocks.stack_encoder_blocks, params)
    params_v = params_by_layout[variant.layers]
    for mode in job.modes(variant):
      p, inference = _program(job, variant, mode, params_v, params, train_state[variant.layers])
      programs.append(p)
      if inference is not None:
        compiled_inference[variant] = inference
  return programs, compiled_inference


def _agreement(job: Job, compiled_inference: dict, check: list) -> dict[str, dict]:
  """Each variant's logits on the `check` batches against the first variant's."""
  reference = job.variants[0]
  if reference not in compiled_inference or not check:
    return {}
  logits = lambda v: np.concatenate(
    [np.asarray(compiled_inference[v][0](compiled_inference[v][1], x)) for x in check]
  )
  ref = logits(reference)
  agreement = {}
  for v in [v for v in job.variants[1:] if v in compiled_inference]:
    out = logits(v)
    agreement[v.name] = {
      'reference': reference.name,
      'images': int(ref.shape[0]),
      'top1_agreement': float(np.mean(out.argmax(-1) == ref.argmax(-1))),
      'max_abs_logit_error': float(np.abs(out - ref).max()),
      'max_abs_logit': float(np.abs(ref).max()),
      'distinct_reference_top1': len(np.unique(ref.argmax(-1))),
    }
  return agreement


def _check_batches(job: Job, rng, count: int) -> list[jax.Array]:
  """Random image batches for the agreement of the variants' logits (none when nothing to
  compare)."""
  if not (job.inference and len(job.variants) > 1 and not job.compile_only):
    return []
  return [jnp.asarray(rng.uniform(-1, 1, job.images.shape), jnp.float32) for _ in range(count)]


def _float32_logits(job: Job, compiled_inference: dict) -> np.ndarray | None:
  """Our float32 logits on the benchmark batch, the other frameworks' reference."""
  variant = next((v for v in compiled_inference if v.dtype == 'float32'), None)
  if variant is None or job.compile_only:
    return None
  compiled, params_v = compiled_inference[variant]
  return np.asarray(compiled(params_v, job.images))


def _profile(programs: list[Timed], steps: int, directory: str, log) -> dict[str, Any]:
  """`steps` steps of the first training program (else the first) under `jax.profiler`,
  written to `directory`, and their top ops (`vit_jax.profiling.summarise`)."""
  ours = [p for p in programs if p.framework == 'jax']
  chosen = next((p for p in ours if p.mode == 'train'), ours[0])
  log(f'  profiling {steps} steps of {chosen.mode} {chosen.label} into {directory}')
  jax.block_until_ready(chosen.run())
  with jax.profiler.trace(directory):
    for _ in range(steps):
      jax.block_until_ready(chosen.run())
  summary = profiling.summarise(directory, hlo_text=chosen.hlo())
  return {'program': chosen.label, 'mode': chosen.mode, 'steps': steps, **summary}


def _conditions(model, resolution, rounds, steps, peak_tflops, compare) -> dict[str, Any]:
  return {
    'model': model,
    'resolution': resolution,
    'rounds': rounds,
    'steps_per_round': steps,
    'peak_tflops_given': peak_tflops,
    'omp_wait_policy': os.environ.get('OMP_WAIT_POLICY') if compare else None,
  }


def run_benchmark(
  model: str = 'ViT-B_16',
  batch: int = 8,
  resolution: int = 224,
  dtypes: Sequence[str] = ('float32',),
  attentions: Sequence[str] = ('xla',),
  remats: Sequence[str] = ('none',),
  layers: Sequence[str] = ('unrolled',),
  *,
  precisions: Sequence[str] = ('matmul',),
  inference: bool = True,
  train: bool = False,
  compare: bool = False,
  onnx: str | None = None,
  num_classes: int = 1000,
  peak_tflops: float | None = None,
  rounds: int = 2,
  steps: int = 3,
  check_batches: int = 2,
  probe_sizes: Sequence[int] | None = None,
  seed: int = 0,
  model_overrides: dict[str, Any] | None = None,
  compile_only: bool = False,
  accum_steps: int = 1,
  profile_steps: int = 0,
  profile_dir: str = '',
  mesh: str | None = None,
  sharding: str = 'replicate',
  log: Callable[[str], None] = lambda s: None,
) -> dict[str, Any]:
  """Measures every variant; returns a JSON-ready dict (its figures: `vit-benchmark --help`).

  `model_overrides` changes the registered config, e.g. `{'transformer': {'num_layers': 2}}`.
  `compile_only` compiles every program on abstract arrays (nothing is allocated or timed):
  compile time, FLOPs and XLA's memory of models that would not fit. `accum_steps` splits
  the batch into micro-batches (`--config.accum_steps`); `profile_steps`: see `_profile`.
  `onnx`, a directory `vit-export` wrote of these weights (`save_params`), adds its ONNX files
  under onnxruntime (`onnx_runtime`). `mesh` (the form of config.mesh, e.g. 'data:-1,model:2')
  runs the training programs on a mesh of this process's devices, their state placed by the
  rule `sharding` (config.sharding's); by default they run on one device.
  """
  variants = variants_from(dtypes, attentions, remats, layers, precisions)
  config = model_config(model, model_overrides)
  modes = (inference, train, compare, compile_only, onnx)
  profile = (profile_steps, profile_dir)
  _check(model, config, batch, rounds, steps, accum_steps, modes, profile, mesh)
  parallel.parse_rules(sharding)  # a bad rule fails here, not at the first compile
  train_mesh = programs_lib.train_mesh(mesh)
  _check_batch(batch, accum_steps, train_mesh)
  load_start = os.getloadavg()
  rng = np.random.default_rng(seed)
  job_modes = (inference, train, compile_only, accum_steps)
  placement = (train_mesh, sharding)
  job = _make_job(config, variants, rng, batch, resolution, num_classes, job_modes, log, placement)
  onnx_entry = onnx_runtime.model_entry(onnx, job) if onnx else None
  where = f'mesh {results.mesh_spec(train_mesh)} ({sharding}) of ' if mesh else ''
  log(
    f'{model} {resolution}px batch {batch} on {where}{jax.devices()[0].device_kind}; initialising'
  )
  params = _initial_params(job, resolution, seed)
  programs, compiled_inference = _programs(job, params)
  hf_programs, hf_logits = (
    hugging_face.compare(job, params, resolution, programs) if compare else ([], None)
  )
  programs += hf_programs
  ort_programs = onnx_runtime.programs(onnx, onnx_entry, job, programs) if onnx else []
  programs += ort_programs
  if train and not (inference or compare or compile_only):
    params = None  # training programs hold their own (shared) state: free the initial copy
  probe, sizes = timing.measure(job, programs, peak_tflops, rounds, steps, probe_sizes)
  ours = _float32_logits(job, compiled_inference) if compare or onnx else None
  facts = {
    'agreement': _agreement(job, compiled_inference, _check_batches(job, rng, check_batches)),
    'hf_max_abs_logit_error': hugging_face.hf_logit_error(ours, hf_logits),
    'onnx': onnx,
    'onnx_agreement': onnx_runtime.agreement(ort_programs, ours, log),
    'model_overrides': model_overrides,
    'load_average_start': list(load_start),
    'profile': _profile(programs, profile_steps, profile_dir, log) if profile_steps else None,
  }
  conditions = (model, resolution, 0 if compile_only else rounds, steps, peak_tflops, compare)
  return results.result(job, programs, probe, sizes, {**facts, **_conditions(*conditions)})

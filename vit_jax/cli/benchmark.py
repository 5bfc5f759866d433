"""Throughput, memory, compile time and MFU of the model zoo, side by side in one process.

  python -m vit_jax.benchmark --model ViT-B_16 --batch 8 --resolution 224 \\
      --dtype float32,bfloat16 --train --compare --json bench.json

Every combination of `--dtype`, `--attention`, `--remat` and `--layers` (unrolled or one
`nn.scan`) is one variant. All variants share one set of weights and one batch of random
images, and are timed in interleaved rounds (variant A, B, ..., then A, B, ... again), so that
a change in machine load hits them alike; the table shows the best step and the median. Each
round times `--steps` consecutive steps per program: the later ones show the steady state of a
training loop, which reuses the memory of the step before.
Per variant and mode:

  img/s         images per second (inference: `apply(train=False)`; training: the trainer's
                own compiled step, `vit_jax.train.steps.make_train_step` with the default
                recipe of the run spec: softmax cross-entropy, clipping at global norm 1,
                SGD with momentum 0.9, `--accum_steps` micro-batches, per-example dropout
                where the model drops out; the train state is donated)
  compile       seconds to lower and compile the program
  GFLOP/img     XLA's cost analysis of the program, per image (a training step with
                rematerialisation counts its recomputation; XLA counts a scanned body once,
                so scanned programs show none)
  TFLOP/s, MFU  model FLOPs (the unrolled program without rematerialisation, with explicit
                attention: XLA counts a cuDNN kernel as 0 FLOPs; where XLA analyses no
                lowered program, as on GPUs, the analytic count of `models.stats`, a
                training step 3 forward passes) x img/s, and that as a
                fraction of the peak: `--peak_tflops`, or else the best square matmul this
                process measures in the same dtype (bfloat16 operands with float32
                accumulation for the 16-bit dtypes), once per round; on an accelerator the
                probe is measured in any case (JSON `of_matmul_probe`)
  XLA mem       arguments + outputs - donated + temporaries of the compiled program
                (`compiled.memory_analysis()`): the memory the program needs
  MB acc/img    XLA's `bytes accessed` of the compiled program (after fusion; its cost
                analysis), per image (JSON `bytes_accessed_per_image`): the memory traffic
                that halving activation bytes halves, visible on a CPU too
  temp MB/img   the compiled program's temporaries (`temp_size_in_bytes`: activations kept
                for the backward pass, workspace), per image (JSON `temp_bytes_per_image`)
  peak mem      measured: the accelerator's `peak_bytes_in_use` (the process's peak so far),
                or on CPU the process's peak resident set during the timed steps (VmHWM,
                reset before them; it includes everything the process holds)
  cpu/wall      process CPU seconds per wall second while timing (CPU only): well below the
                number of cores means that other processes had the machine
  cuDNN attn    (JSON `cudnn_attention`) whether the compiled program calls cuDNN's fused
                attention: `--attention=fused` falls back to XLA where cuDNN does not apply
  faults/step   minor page faults of the process per step (median): on CPU, XLA's fresh
                temporaries at every step; the entry point turns on transparent huge pages
                for them where it can (`vit_jax.hugepages`), and the report says whether

`--pipeline` measures the input pipeline instead (`vit_jax.cli.benchmark_pipeline`, TensorFlow):
images/s and images/s per core of training and evaluation input, beside accelerators'
training images/s.

`--precision=matmul,activations` compares the precision policies of the 16-bit dtypes
(`vit_jax.models.precision`); a variant's name ends in `/activations` under the second.
`--profile_steps N` traces N more steps of the first training program (else the first
program) with `jax.profiler` into `--profile_dir` and prints the top ops by time, with the
matmul / attention / other shares (`vit_jax.profiling`).

`--compare` runs Hugging Face `ViTForImageClassification` (PyTorch eager) on the same weights
(through `vit_jax.checkpoint.export_hf`) in the same rounds, and reports our speed over theirs
and the largest logit difference; 16-bit variants compare against `torch.autocast`.
`--max_batch` picks the largest batch whose training step fits in memory.

`--memory_batches 8,16,32` instead compiles each variant's training step at these batches
(nothing allocated or timed) and prints its memory as a line in the batch (`memory_table`):
the fixed part of XLA's memory and its bytes per image, the fixed part's state (arguments +
outputs - donated), the temporaries per image, how far the batches between the first and
last lie from the line through them, and the largest batch that fits in each of
`--memory_gib` GiB: (G GiB - fixed) / per image, rounded down. `--model` may then be a
comma list.
"""

import dataclasses
import datetime
import importlib
import itertools
import json
import os
import re
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import flags

from vit_jax import cli, families, files, hugepages, optim, parallel, profiling, torch_compat
from vit_jax.models import blocks, get_config, model_from_config, precision
from vit_jax.train import spec as spec_lib
from vit_jax.train import steps as train_steps

DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16, 'float16': jnp.float16}
ATTENTION = ('xla', 'fused')
REMAT = ('none', 'full', 'dots', 'dots_saveable')
LAYERS = ('unrolled', 'scan')


@dataclasses.dataclass(frozen=True)
class Variant:
  """One model variant: compute dtype, attention, rematerialisation, unrolled or scanned,
  precision policy."""

  dtype: str = 'float32'
  attention: str = 'xla'
  remat: str = 'none'
  layers: str = 'unrolled'
  precision: str = 'matmul'

  @property
  def name(self) -> str:
    scan = '/scan' if self.layers == 'scan' else ''
    policy = '' if self.precision == 'matmul' else f'/{self.precision}'
    return f'{self.dtype}/{self.attention}/remat={self.remat}{scan}{policy}'


@dataclasses.dataclass
class _Timed:
  """A program under test: `run()` does one step and blocks until it is done."""

  label: str
  variant: Variant | None
  mode: str
  run: Callable[[], Any]
  compile_s: float = float('nan')
  flops_per_image: float = float('nan')
  model_flops_per_image: float = float('nan')
  facts: dict[str, Any] = dataclasses.field(default_factory=dict)  # of the compiled program
  wall: list[float] = dataclasses.field(default_factory=list)
  cpu: list[float] = dataclasses.field(default_factory=list)
  faults: list[int] = dataclasses.field(default_factory=list)
  peak_bytes: int | None = None
  hlo: Callable[[], str] | None = None  # the compiled program's text, for --profile_steps


def variants_from(
  dtypes: Sequence[str],
  attentions: Sequence[str],
  remats: Sequence[str],
  layers: Sequence[str] = ('unrolled',),
  precisions: Sequence[str] = ('matmul',),
) -> list[Variant]:
  """The cartesian product, checked; the first one is the reference for agreement. The
  precision policy applies to 16-bit dtypes only: float32 is measured once."""
  for flag, values, allowed in (
    ('--dtype', dtypes, DTYPES),
    ('--attention', attentions, ATTENTION),
    ('--remat', remats, REMAT),
    ('--layers', layers, LAYERS),
    ('--precision', precisions, precision.POLICIES),
  ):
    bad = [v for v in values if v not in allowed]
    if bad or not values:
      raise ValueError(f'{flag}={",".join(values)}: expected a comma list of {", ".join(allowed)}')
  product = itertools.product(dtypes, precisions, attentions, layers, remats)
  variants = [Variant(d, a, r, n, p) for d, p, a, n, r in product]
  policy = lambda v: v.precision if precision.is_mixed(DTYPES[v.dtype]) else precisions[0]
  return [v for v in variants if v.precision == policy(v)]


# ----------------------------------------------------------------------------- measurements


def _time(fn: Callable[[], Any]) -> tuple[float, float, int]:
  """(wall seconds, process CPU seconds, minor page faults) of one call."""
  faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  wall, cpu = time.perf_counter(), time.process_time()
  jax.block_until_ready(fn())
  wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
  return wall, cpu, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults


def matmul_probe(dtype: str, size: int, repeats: int = 3) -> float:
  """TFLOP/s of the best of `repeats` jitted (size x size) @ (size x size) matmuls.

  16-bit dtypes multiply 16-bit operands with float32 accumulation and output, as the model
  does; that is the fast path on CPUs with bfloat16 dot products and on GPU tensor cores.
  """
  keys = jax.random.split(jax.random.key(0))
  a, b = (jax.random.normal(k, (size, size), jnp.float32).astype(DTYPES[dtype]) for k in keys)
  f = jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32))
  jax.block_until_ready(f(a, b))
  best = min(_time(lambda: f(a, b))[0] for _ in range(repeats))
  return 2 * size**3 / best / 1e12


def _default_probe_sizes() -> tuple[int, ...]:
  return (2048, 4096) if jax.default_backend() == 'cpu' else (8192, 16384)


def _peak_rss_reset() -> bool:
  """Resets the process's peak resident set (Linux); False where that is not possible."""
  try:
    with open('/proc/self/clear_refs', 'w') as f:
      f.write('5')
    return True
  except OSError:
    return False


def _peak_rss() -> int | None:
  try:
    with open('/proc/self/status') as f:
      match = re.search(r'VmHWM:\s+(\d+) kB', f.read())
  except OSError:
    return None
  return int(match.group(1)) * 1024 if match else None


def _device_peak_bytes() -> int | None:
  stats_ = jax.local_devices()[0].memory_stats() or {}
  return stats_.get('peak_bytes_in_use')


def _xla_bytes(compiled: Any) -> int | None:
  """arguments + outputs - aliased (donated) + temporaries, from the compiled program."""
  try:
    m = compiled.memory_analysis()
  except Exception:  # not every backend implements it
    return None
  if m is None:
    return None
  return int(
    m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
  )


def _compiled_cost(compiled: Any) -> tuple[float | None, int | None]:
  """(XLA's bytes accessed, temporary bytes) of the compiled program; None where the backend
  does not say."""
  try:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost  # a list in older jax
    accessed = float(cost['bytes accessed']) if cost and 'bytes accessed' in cost else None
  except Exception:  # not every backend implements it
    accessed = None
  try:
    temp = int(compiled.memory_analysis().temp_size_in_bytes)
  except Exception:
    temp = None
  return accessed, temp


def _compiled_facts(compiled: Any) -> dict[str, Any]:
  """XLA's memory and memory traffic for the program, and whether it calls cuDNN's fused
  attention kernel (`jax.nn.dot_product_attention` falls back to XLA where cuDNN does not
  apply)."""
  accessed, temp = _compiled_cost(compiled)
  return {
    'xla_memory_bytes': _xla_bytes(compiled),
    'bytes_accessed': accessed,
    'temp_bytes': temp,
    'cudnn_attention': 'cudnn$fmha' in compiled.as_text(),
  }


def _finite(x: float) -> float | None:
  return x if x == x else None  # NaN (not measured) -> null in JSON


def _flops(lowered: Any) -> float:
  """XLA's FLOP count of the program as lowered; NaN where the backend does not analyse
  lowered programs (GPUs under jax 0.11). A compiled GPU program is no substitute: its
  matmuls are cuBLAS custom calls, which the analysis counts as 0 FLOPs."""
  cost = lowered.cost_analysis()
  return float('nan') if cost is None else float(cost['flops'])


# ----------------------------------------------------------------------------- programs


def model_config(name: str, overrides: dict[str, Any] | None = None) -> ml_collections.ConfigDict:
  """The registered config with `overrides` (a dict value updates only the keys it names)."""
  config = get_config(name).to_dict()
  for key, value in (overrides or {}).items():
    if isinstance(value, dict) and isinstance(config.get(key), dict):
      config[key] = {**config[key], **value}
    else:
      config[key] = value
  return ml_collections.ConfigDict(config)


def _model(config: ml_collections.ConfigDict, num_classes: int, variant: Variant):
  """The model of `variant`; fields at their defaults are left out, so that a model without
  them (MLP-Mixer: no attention, remat or scan) runs the default variant of each."""
  fields = {
    'attention_impl': (variant.attention, 'xla'),
    'remat_policy': (variant.remat, 'none'),
    'scan_layers': (variant.layers == 'scan', False),
    'precision_policy': (variant.precision, 'matmul'),
  }
  chosen = {k: value for k, (value, default) in fields.items() if value != default}
  return model_from_config(config, num_classes=num_classes, dtype=DTYPES[variant.dtype], **chosen)


def init_params(
  config: ml_collections.ConfigDict, num_classes: int, resolution: int, seed: int = 0
) -> Any:
  """float32 weights from the model's initialisers; the zero-initialised head gets
  N(0, 1/width) noise so that the logits differ between classes (and top-1 means something).
  """
  model = _model(config, num_classes, Variant())
  params = jax.jit(lambda: families.init_params(model, jax.random.key(seed), resolution))()
  params = jax.tree.map(np.asarray, params)
  if 'head' in params:
    kernel = params['head']['kernel']
    rng = np.random.default_rng(seed)
    noise = rng.standard_normal(kernel.shape) / np.sqrt(kernel.shape[0])
    params['head'] = {**params['head'], 'kernel': noise.astype(np.float32)}
  return params


def _applied(model: Any) -> Callable:
  return lambda p, x: model.apply({'params': p}, x, train=False)


def _inference(model: Any, params: Any, images: jax.Array) -> tuple[Callable, float, float, Any]:
  """(compiled apply, compile seconds, flops per image, `_compiled_facts`)."""
  f = jax.jit(_applied(model))
  start = time.perf_counter()
  lowered = f.lower(params, images)
  compiled = lowered.compile()
  compile_s = time.perf_counter() - start
  return compiled, compile_s, _flops(lowered) / images.shape[0], _compiled_facts(compiled)


# The training step timed is the trainer's own (vit_jax.train.steps) with the run spec's
# default recipe: softmax cross-entropy, clipping at global norm 1, SGD with momentum 0.9, the
# warmup-cosine schedule of this many steps, per-example dropout keys where the model drops out.
SCHEDULE_STEPS = 10_000


def _trainer(model: Any, batch: int, accum_steps: int = 1):
  """(optimizer, step fn): `vit_jax.train.steps.make_train_step` of the default run spec's
  classification, with `accum_steps` micro-batches; step(state, {'image', 'label'}) ->
  (state, metrics)."""
  from vit_jax.tasks import classification

  data = spec_lib.Data(batch=batch, num_classes=model.num_classes)
  run = spec_lib.RunSpec(data=data, step=spec_lib.Step(accum_steps=accum_steps))
  tx, schedule = optim.for_training(run.optim, SCHEDULE_STEPS)
  task = classification.Task(run, model)
  return tx, train_steps.make_train_step(task, tx, schedule, run)


def _train_state(params: Any, tx: Any) -> dict[str, Any]:
  return {
    'params': params,
    'opt_state': tx.init(params),
    'step': jnp.zeros((), jnp.int32),
    'rng': jax.random.key_data(jax.random.key(1)),
  }


def _abstract(tree: Any) -> Any:
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def _compiled_step(model: Any, images: Any, accum_steps: int):
  """(optimizer, the step compiled as the trainer compiles it, on a one-device mesh)."""
  tx, step = _trainer(model, images.shape[0], accum_steps)
  mesh = parallel.create_mesh(jax.local_devices()[:1])
  replicated = parallel.replicated(mesh)  # the whole state: a prefix of its tree
  return tx, train_steps.compile_train_step(step, replicated, parallel.batch_sharding(mesh), mesh)


def _lower_train(model: Any, params: Any, images: Any, labels: Any, accum_steps: int):
  """(optimizer, the lowered training step); arrays may be abstract."""
  tx, f = _compiled_step(model, images, accum_steps)
  state = jax.eval_shape(lambda p: _train_state(p, tx), _abstract(params))
  return tx, f.lower(state, {'image': _abstract(images), 'label': _abstract(labels)})


def _compile_train(model: Any, params: Any, images: Any, labels: Any, accum_steps: int = 1):
  """(compiled step, compile seconds, flops per image, `_compiled_facts`); arrays may be
  abstract."""
  start = time.perf_counter()
  _, lowered = _lower_train(model, params, images, labels, accum_steps)
  compiled = lowered.compile()
  compile_s = time.perf_counter() - start
  return compiled, compile_s, _flops(lowered) / images.shape[0], _compiled_facts(compiled)


def _train(
  model: Any,
  params: Any,
  images: jax.Array,
  labels: jax.Array,
  state: dict | None = None,
  accum_steps: int = 1,
):
  """(run, compile seconds, flops per image, `_compiled_facts`, the compiled program's text);
  `run` steps `state` in place.

  Programs may share one `state` (the train state, donated and replaced at every step):
  they run one after another, and a large model is then held once, not once per variant.
  """
  compiled, compile_s, flops, facts = _compile_train(model, params, images, labels, accum_steps)
  state = {} if state is None else state
  if not state:
    tx, _ = _trainer(model, images.shape[0], accum_steps)
    state['train'] = _train_state(jax.tree.map(jnp.array, params), tx)  # a copy: donated
  batch = {'image': images, 'label': labels}

  def run():
    state['train'], metrics = compiled(state['train'], batch)
    return metrics['loss']

  return run, compile_s, flops, facts, compiled.as_text


def _flops_reference(variant: Variant) -> Variant:
  """The variant whose program XLA's cost analysis counts in full: unrolled (a scanned body
  is counted once), no rematerialisation (recomputation is no useful work) and explicit
  attention (a cuDNN attention kernel is a custom call that the analysis counts as 0 FLOPs).
  """
  return dataclasses.replace(variant, remat='none', layers='unrolled', attention='xla')


def _model_flops(config, num_classes, variant, mode, images, labels, params, accum_steps) -> float:
  """FLOPs per image of `_flops_reference(variant)`'s program: the model FLOPs."""
  model = _model(config, num_classes, _flops_reference(variant))
  shapes = _abstract(params)
  if mode == 'inference':
    lowered = jax.jit(lambda p, x: model.apply({'params': p}, x, train=False)).lower(shapes, images)
  else:
    lowered = _lower_train(model, shapes, images, labels, accum_steps)[1]
  return _flops(lowered) / images.shape[0]


def train_memory(
  config: ml_collections.ConfigDict,
  num_classes: int,
  variant: Variant,
  resolution: int,
  batch: int,
  accum_steps: int = 1,
) -> dict[str, Any]:
  """`_compiled_facts` of one training step at `batch` in `accum_steps` micro-batches
  (compiled, nothing allocated), and its `compile_s`."""
  model = _model(config, num_classes, variant)
  images = jax.ShapeDtypeStruct((batch, resolution, resolution, 3), jnp.float32)
  labels = jax.ShapeDtypeStruct((batch,), jnp.int32)
  params = jax.eval_shape(lambda x: model.init(jax.random.key(0), x[:1], train=False), images)
  _, compile_s, _, facts = _compile_train(model, params['params'], images, labels, accum_steps)
  return {**facts, 'compile_s': compile_s}


def train_memory_bytes(
  config: ml_collections.ConfigDict,
  num_classes: int,
  variant: Variant,
  resolution: int,
  batch: int,
  accum_steps: int = 1,
) -> int | None:
  """XLA's memory for one training step at `batch` in `accum_steps` micro-batches (compiled,
  nothing allocated)."""
  return train_memory(config, num_classes, variant, resolution, batch, accum_steps)[
    'xla_memory_bytes'
  ]


def memory_limit_bytes() -> int:
  """The first device's memory (`bytes_limit`), or on CPU the memory available now."""
  limit = (jax.local_devices()[0].memory_stats() or {}).get('bytes_limit')
  if limit:
    return int(limit)
  with open('/proc/meminfo') as f:
    return int(re.search(r'MemAvailable:\s+(\d+) kB', f.read()).group(1)) * 1024


def largest_batch(
  config: ml_collections.ConfigDict,
  num_classes: int,
  variant: Variant,
  resolution: int,
  limit_bytes: int,
  multiple: int = 32,
) -> tuple[int, int]:
  """(batch, bytes): the largest multiple of `multiple` whose training step XLA fits in
  `limit_bytes`. Memory is linear in the batch: two compiles give the line, a third checks.
  """
  mem = lambda b: train_memory_bytes(config, num_classes, variant, resolution, b)
  b1, b2 = multiple, 2 * multiple
  m1, m2 = mem(b1), mem(b2)
  if m1 is None or m2 is None:
    raise ValueError('this backend reports no memory analysis; pass --batch instead of --max_batch')
  if m1 > limit_bytes:
    raise ValueError(f'batch {b1} needs {m1 / 1e9:.2f} GB > {limit_bytes / 1e9:.2f} GB available')
  per_image = max((m2 - m1) / (b2 - b1), 1.0)
  batch = max(multiple, int((limit_bytes - m1) / per_image + b1) // multiple * multiple)
  need = {b1: m1, b2: m2}.get(batch) or mem(batch)
  while need > limit_bytes and batch > multiple:
    batch -= multiple
    need = {b1: m1, b2: m2}.get(batch) or mem(batch)
  return batch, need


GIB = 2**30


def _line(xs: Sequence[int], ys: Sequence[float]) -> tuple[float, float, float | None]:
  """(intercept, slope) of the line through the first and last points, and the largest
  distance of the points between them from it (None where there are none)."""
  slope = (ys[-1] - ys[0]) / (xs[-1] - xs[0])
  intercept = ys[0] - slope * xs[0]
  inner = [abs(y - intercept - slope * x) for x, y in zip(xs[1:-1], ys[1:-1], strict=True)]
  return intercept, slope, max(inner) if inner else None


def memory_line(
  config: ml_collections.ConfigDict,
  num_classes: int,
  variant: Variant,
  resolution: int,
  accum_steps: int = 1,
) -> tuple[float, float]:
  """(fixed bytes, bytes per image of a micro-batch) of one training step on one device:
  XLA's memory at micro-batches of 1 and 2 images. The fixed part is the state (weights, SGD
  momentum), the gradient, and with `accum_steps` > 1 the gradients' running sum."""
  m1, m2 = (
    train_memory_bytes(config, num_classes, variant, resolution, b * accum_steps, accum_steps)
    for b in (1, 2)
  )
  if m1 is None or m2 is None:
    raise ValueError('this backend reports no memory analysis')
  fixed, per_image, _ = _line((1, 2), (m1, m2))
  return fixed, per_image


def accum_steps_to_fit(
  fixed: float,
  per_image: float,
  device_bytes: float,
  batch: int,
  devices: int,
  fraction: float = 0.9,
) -> int | None:
  """The fewest micro-batches (`accum_steps`) of a global `batch` on `devices` whose
  per-device pass fits in `fraction` of `device_bytes`; None when one image does not."""
  rows = batch // devices
  for accum_steps in range(1, rows + 1):
    images = rows // accum_steps
    if rows % accum_steps == 0 and fixed + per_image * images <= fraction * device_bytes:
      return accum_steps
  return None


def memory_row(
  config: ml_collections.ConfigDict,
  num_classes: int,
  variant: Variant,
  resolution: int,
  batches: Sequence[int],
  devices_gib: Sequence[float],
) -> dict[str, Any]:
  """The training step's memory on one device as a line in the batch, from XLA's memory of
  the step compiled at each of `batches` (nothing allocated): the fixed part and the bytes
  per image, of the whole (arguments + outputs - donated + temporaries) and of the
  temporaries; how far the batches between the first and last lie from the line; and the
  largest batch whose step fits in each of `devices_gib` (GiB for XLA's program)."""
  facts = [train_memory(config, num_classes, variant, resolution, b) for b in batches]
  total, temp = ([f[k] for f in facts] for k in ('xla_memory_bytes', 'temp_bytes'))
  if None in total or None in temp:
    raise ValueError('this backend reports no memory analysis')
  fixed, per_image, off_line = _line(batches, total)
  temp_fixed, temp_per_image, _ = _line(batches, temp)
  fits = lambda gib: max(int((gib * GIB - fixed) // max(per_image, 1.0)), 0)
  return {
    'program': variant.name,
    **dataclasses.asdict(variant),
    'batches': list(batches),
    'xla_memory_bytes': total,
    'temp_bytes': temp,
    'compile_s': [f['compile_s'] for f in facts],
    'fixed_bytes': fixed,
    'per_image_bytes': per_image,
    'state_bytes': fixed - temp_fixed,  # arguments + outputs - donated, less the batch
    'temp_fixed_bytes': temp_fixed,
    'temp_per_image_bytes': temp_per_image,
    'off_line_bytes': off_line,
    'largest_batch': {f'{g:g}': fits(g) for g in devices_gib},
  }


def memory_table(
  models: Sequence[str],
  variants: Sequence[Variant],
  resolution: int,
  batches: Sequence[int],
  devices_gib: Sequence[float] = (16, 40, 80),
  num_classes: int = 1000,
  log: Callable[[str], None] = lambda s: None,
) -> dict[str, Any]:
  """`memory_row` of every model and variant, compiled one after another, and the conditions;
  JSON-ready."""
  if len(batches) < 2 or sorted(set(batches)) != list(batches) or batches[0] < 1:
    raise ValueError(f'--memory_batches={batches}: two or more increasing batches')
  rows = []
  for model, variant in itertools.product(models, variants):
    row = memory_row(model_config(model), num_classes, variant, resolution, batches, devices_gib)
    rows.append({'model': model, **row})
    log(f'  {model} {variant.name}: compiled in {", ".join(f"{s:.0f}" for s in row["compile_s"])}s')
  return {
    'resolution': resolution,
    'num_classes': num_classes,
    'devices_gib': list(devices_gib),
    'platform': jax.default_backend(),
    'device': jax.devices()[0].device_kind,
    'jax': jax.__version__,
    'date': datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds'),
    'rows': rows,
  }


# ----------------------------------------------------------------------------- Hugging Face


def _check_comparable(name: str, config: Any) -> None:
  what = families.of_config(config).unlike_hugging_face(config)
  if what is None:
    return
  raise ValueError(
    f'--compare needs a plain ViT with the token classifier and no pre_logits (Hugging Face'
    f' ViTForImageClassification); {name} {what}'
  )


def _hugging_face(params: Any, config: Any, resolution: int, tmp: str):
  """Hugging Face ViTForImageClassification on our weights, via the exporter."""
  # Idle OpenMP threads of PyTorch spin by default; on a machine shared with other work
  # that spinning takes the cores from the threads with work (measured: 50x slower).
  os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')
  from vit_jax.checkpoint import export_hf

  torch_compat.allow_torchvision_import()
  import torch
  import transformers

  path = export_hf(params, config, os.path.join(tmp, 'hf'), image_size=resolution)
  return torch, transformers.ViTForImageClassification.from_pretrained(path).eval()


def _hf_programs(hf, torch, variants, images, labels, train: bool, inference: bool) -> list:
  """One inference and one training program per distinct dtype."""
  x = torch.from_numpy(np.asarray(images).transpose(0, 3, 1, 2).copy())
  y = torch.from_numpy(np.asarray(labels).astype(np.int64))
  programs = []
  for dtype in dict.fromkeys(v.dtype for v in variants):
    autocast = dtype != 'float32'
    ctx = lambda a=autocast, d=dtype: torch.autocast('cpu', dtype=getattr(torch, d), enabled=a)

    def infer(ctx=ctx):
      hf.eval()
      with torch.inference_mode(), ctx():
        return hf(pixel_values=x).logits.float().numpy()

    if inference:
      programs.append(_Timed(f'HF PyTorch {dtype}', Variant(dtype), 'inference', infer))
    if train:
      opt = torch.optim.SGD(hf.parameters(), lr=1e-4, momentum=0.9)

      def step(ctx=ctx, opt=opt):
        hf.train()  # dropout as configured, like our training step
        opt.zero_grad(set_to_none=True)
        with ctx():
          loss = torch.nn.functional.cross_entropy(hf(pixel_values=x).logits.float(), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)  # as our step clips
        opt.step()
        return loss.detach().numpy()

      programs.append(_Timed(f'HF PyTorch {dtype}', Variant(dtype), 'train', step))
  return programs


# ----------------------------------------------------------------------------- the run


@dataclasses.dataclass
class _Job:
  """One benchmark run's checked arguments and inputs, shared by its stages."""

  config: ml_collections.ConfigDict
  variants: list[Variant]
  num_classes: int
  images: Any  # arrays, or ShapeDtypeStructs under compile_only
  labels: Any
  inference: bool
  train: bool
  compile_only: bool
  accum_steps: int
  analytic: float  # forward FLOPs per image of `models.stats`
  log: Callable[[str], None]

  @property
  def batch(self) -> int:
    return self.images.shape[0]

  def modes(self, variant: Variant) -> list[str]:
    """remat changes no inference program: inference is measured once per layout."""
    infer = self.inference and variant.remat == self.variants[0].remat
    return (['inference'] if infer else []) + (['train'] if self.train else [])


def _check(model, config, batch, rounds, steps, accum_steps, modes, profile):
  inference, train, compare, compile_only = modes
  if profile[0] and (compile_only or not profile[1]):
    raise ValueError('--profile_steps runs the programs: give a --profile_dir, no --compile_only')
  if compare:
    _check_comparable(model, config)
    if compile_only:
      raise ValueError('--compare times Hugging Face: it cannot run with --compile_only')
  if not (inference or train):
    raise ValueError('nothing to measure: pass --train, or leave --inference on')
  if batch < 1 or rounds < 1 or steps < 1:
    raise ValueError(f'batch={batch}, rounds={rounds}, steps={steps}: each must be >= 1')
  if accum_steps < 1 or batch % accum_steps:
    raise ValueError(f'--accum_steps={accum_steps} does not divide --batch={batch}')


def _inputs(rng, batch: int, resolution: int, num_classes: int, abstract: bool):
  """Random images in [-1, 1] and labels (only their shapes when `abstract`)."""
  images = jnp.asarray(rng.uniform(-1, 1, (batch, resolution, resolution, 3)), jnp.float32)
  labels = jnp.asarray(rng.integers(0, max(num_classes, 1), batch), jnp.int32)
  return (_abstract(images), _abstract(labels)) if abstract else (images, labels)


def _initial_params(job: _Job, resolution: int, seed: int) -> Any:
  if not job.compile_only:
    return init_params(job.config, job.num_classes, resolution, seed)
  model = _model(job.config, job.num_classes, Variant())
  images = job.images
  return jax.eval_shape(lambda x: model.init(jax.random.key(0), x, train=False), images)['params']


def _program(job: _Job, variant: Variant, mode: str, params_v: Any, params: Any, state: dict):
  """(one timed program of `variant` in `mode`, (its compiled inference, the parameters it
  takes) or None); training programs share `state`."""
  net = _model(job.config, job.num_classes, variant)
  run = compiled = hlo = None
  if mode == 'inference':
    # As every inference path: the kernels a 16-bit model casts anyway are cast once.
    cast = lambda p: precision.cast_matmul_params(_applied(net), p, job.images)
    params_v = jax.eval_shape(cast, params_v) if job.compile_only else cast(params_v)
    compiled, compile_s, flops, facts = _inference(net, params_v, job.images)
    run = lambda c=compiled, p=params_v: c(p, job.images)
  elif job.compile_only:
    _, compile_s, flops, facts = _compile_train(
      net, params_v, job.images, job.labels, job.accum_steps
    )
  else:
    run, compile_s, flops, facts, hlo = _train(
      net, params_v, job.images, job.labels, state, job.accum_steps
    )
  model_flops = flops
  if variant != _flops_reference(variant):
    model_flops = _model_flops(
      job.config, job.num_classes, variant, mode, job.images, job.labels, params, job.accum_steps
    )
  if model_flops != model_flops:  # XLA gave no count: the analytic one (a step is 3x)
    model_flops = job.analytic * (3 if mode == 'train' else 1)
  if variant.layers == 'scan':
    flops = float('nan')  # XLA counts the scanned body once
  job.log(f'  compiled {mode} {variant.name} in {compile_s:.1f}s')
  timed = _Timed(variant.name, variant, mode, run, compile_s, flops, model_flops, facts)
  timed.hlo = compiled.as_text if compiled is not None else hlo
  return timed, None if compiled is None else (compiled, params_v)


def _programs(job: _Job, params: Any) -> tuple[list[_Timed], dict]:
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


def _measure(job: _Job, programs, rounds, steps, probe_sizes, measure_probe) -> dict:
  """Warm-up, then interleaved rounds of `steps` timed steps per program; the matmul probe
  (TFLOP/s per dtype, once per round) if `measure_probe`."""
  on_cpu = jax.default_backend() == 'cpu'
  for p in programs:
    jax.block_until_ready(p.run())  # the first runs allocate
  probe: dict[str, list[float]] = {d: [] for d in dict.fromkeys(v.dtype for v in job.variants)}
  for r in range(rounds):
    if measure_probe:
      for d in probe:
        probe[d].append(max(matmul_probe(d, s) for s in probe_sizes))
    for p in programs:
      reset = on_cpu and _peak_rss_reset()
      for _ in range(steps):
        wall, cpu, faults = _time(p.run)
        p.wall.append(wall)
        p.cpu.append(cpu)
        p.faults.append(faults)
      peak = (_peak_rss() if reset else None) if on_cpu else _device_peak_bytes()
      if peak is not None:
        p.peak_bytes = max(p.peak_bytes or 0, peak)
    speeds = [f'{p.label} {p.mode} {job.batch / min(p.wall[-steps:]):.2f}' for p in programs]
    job.log(f'  round {r + 1}/{rounds} (img/s): {", ".join(speeds)}')
  return probe


def _agreement(job: _Job, compiled_inference: dict, check: list) -> dict[str, dict]:
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


def _hf_logit_error(job: _Job, compiled_inference: dict, hf_logits) -> float | None:
  """Our float32 logits against Hugging Face's on the benchmark batch."""
  ref_variant = next((v for v in compiled_inference if v.dtype == 'float32'), None)
  if hf_logits is None or ref_variant is None or not job.inference:
    return None
  compiled, params_v = compiled_inference[ref_variant]
  return float(np.abs(np.asarray(compiled(params_v, job.images)) - hf_logits).max())


def _per(value: float | None, batch: int) -> float | None:
  return None if value is None else value / batch


def _row(p: _Timed, batch: int, peak: float | None, probe_best: dict, on_cpu: bool) -> dict:
  timed = bool(p.wall)
  best = min(p.wall) if timed else None
  hf = p.label.startswith('HF')
  model_flops = p.model_flops_per_image
  achieved = model_flops * batch / best / 1e12 if timed and model_flops == model_flops else None
  probe = probe_best.get(p.variant.dtype)
  return {
    'program': p.label,
    'framework': 'hf-pytorch' if hf else 'jax',
    'mode': p.mode,
    'dtype': p.variant.dtype,
    'attention': None if hf else p.variant.attention,
    'remat': None if hf else p.variant.remat,
    'layers': None if hf else p.variant.layers,
    'img_per_s': batch / best if timed else None,
    'img_per_s_median': batch / statistics.median(p.wall) if timed else None,
    'step_s': best,
    'step_s_all': p.wall,
    'cpu_per_wall': sum(p.cpu) / sum(p.wall) if on_cpu and timed else None,
    'page_faults_per_step': statistics.median(p.faults) if timed else None,
    'compile_s': _finite(p.compile_s),
    'flops_per_image': _finite(p.flops_per_image),
    'model_flops_per_image': _finite(model_flops),
    'achieved_tflops': achieved,
    'peak_tflops': peak,
    'mfu': achieved / peak if achieved is not None and peak else None,
    'of_matmul_probe': achieved / probe if achieved is not None and probe else None,
    'xla_memory_bytes': p.facts.get('xla_memory_bytes'),
    'bytes_accessed_per_image': _per(p.facts.get('bytes_accessed'), batch),
    'temp_bytes_per_image': _per(p.facts.get('temp_bytes'), batch),
    'precision': None if hf else p.variant.precision,
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


def _compare(job: _Job, params: Any, resolution: int, programs: list[_Timed]):
  """Hugging Face's programs on the same weights (timed beside ours), and its logits."""
  with tempfile.TemporaryDirectory(prefix='vit_benchmark_') as tmp:  # Hugging Face's files
    torch, hf = _hugging_face(params, job.config, resolution, tmp)
  hf_programs = _hf_programs(
    hf, torch, job.variants, job.images, job.labels, job.train, job.inference
  )
  with torch.inference_mode():
    x = torch.from_numpy(np.asarray(job.images).transpose(0, 3, 1, 2).copy())
    hf_logits = hf(pixel_values=x).logits.numpy()
  for p in hf_programs:  # the same model: our count of its FLOPs
    ours = next(q for q in programs if q.mode == p.mode)
    p.model_flops_per_image = ours.model_flops_per_image
  return hf_programs, hf_logits


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
  log: Callable[[str], None] = lambda s: None,
) -> dict[str, Any]:
  """Measures every variant; returns a JSON-ready dict (see the module docstring).

  `model_overrides` changes the registered config, e.g. `{'transformer': {'num_layers': 2}}`.
  `compile_only` compiles every program on abstract arrays (nothing is allocated or timed):
  compile time, FLOPs and XLA's memory of models that would not fit. `accum_steps` splits
  the batch into micro-batches (`--config.accum_steps`); `profile_steps`: see `_profile`.
  """
  variants = variants_from(dtypes, attentions, remats, layers, precisions)
  config = model_config(model, model_overrides)
  modes = (inference, train, compare, compile_only)
  _check(model, config, batch, rounds, steps, accum_steps, modes, (profile_steps, profile_dir))
  load_start = os.getloadavg()
  rng = np.random.default_rng(seed)
  job_modes = (inference, train, compile_only, accum_steps)
  job = _make_job(config, variants, rng, batch, resolution, num_classes, job_modes, log)
  log(f'{model} {resolution}px batch {batch} on {jax.devices()[0].device_kind}; initialising')
  params = _initial_params(job, resolution, seed)
  programs, compiled_inference = _programs(job, params)
  hf_programs, hf_logits = _compare(job, params, resolution, programs) if compare else ([], None)
  programs += hf_programs
  if train and not (inference or compare or compile_only):
    params = None  # training programs hold their own (shared) state: free the initial copy
  probe, sizes = _timing(job, programs, peak_tflops, rounds, steps, probe_sizes)
  facts = {
    'agreement': _agreement(job, compiled_inference, _check_batches(job, rng, check_batches)),
    'hf_max_abs_logit_error': _hf_logit_error(job, compiled_inference, hf_logits),
    'model_overrides': model_overrides,
    'load_average_start': list(load_start),
    'profile': _profile(programs, profile_steps, profile_dir, log) if profile_steps else None,
  }
  conditions = (model, resolution, 0 if compile_only else rounds, steps, peak_tflops, compare)
  return _result(job, programs, probe, sizes, {**facts, **_conditions(*conditions)})


def _make_job(config, variants, rng, batch, resolution, num_classes, modes, log) -> _Job:
  """The job: random inputs (shapes only under compile_only) and the analytic FLOPs."""
  inference, train, compile_only, accum_steps = modes
  images, labels = _inputs(rng, batch, resolution, num_classes, compile_only)
  analytic = families.forward_flops(config, resolution, num_classes)
  return _Job(
    config, variants, num_classes, images, labels, inference, train, compile_only, accum_steps,
    analytic, log,
  )  # fmt: skip


def _conditions(model, resolution, rounds, steps, peak_tflops, compare) -> dict[str, Any]:
  return {
    'model': model,
    'resolution': resolution,
    'rounds': rounds,
    'steps_per_round': steps,
    'peak_tflops_given': peak_tflops,
    'omp_wait_policy': os.environ.get('OMP_WAIT_POLICY') if compare else None,
  }


def _timing(job: _Job, programs, peak_tflops, rounds: int, steps: int, probe_sizes) -> tuple:
  """(the matmul probe by dtype, its sizes) after timing the programs (`_measure`)."""
  # The probe is the MFU denominator unless a peak is given; on an accelerator, where it
  # costs milliseconds, it is measured anyway: the ceiling this chip reaches beside its datasheet.
  sizes = tuple(probe_sizes or _default_probe_sizes())
  measure_probe = peak_tflops is None or jax.default_backend() != 'cpu'
  if job.compile_only or not rounds:
    return {}, sizes
  return _measure(job, programs, rounds, steps, sizes, measure_probe), sizes


def _check_batches(job: _Job, rng, count: int) -> list[jax.Array]:
  """Random image batches for the agreement of the variants' logits (none when nothing to
  compare)."""
  if not (job.inference and len(job.variants) > 1 and not job.compile_only):
    return []
  return [jnp.asarray(rng.uniform(-1, 1, job.images.shape), jnp.float32) for _ in range(count)]


def _profile(programs: list[_Timed], steps: int, directory: str, log) -> dict[str, Any]:
  """`steps` steps of the first training program (else the first) under `jax.profiler`,
  written to `directory`, and their top ops (`vit_jax.profiling.summarise`)."""
  ours = [p for p in programs if p.variant is not None and not p.label.startswith('HF')]
  chosen = next((p for p in ours if p.mode == 'train'), ours[0])
  log(f'  profiling {steps} steps of {chosen.mode} {chosen.label} into {directory}')
  jax.block_until_ready(chosen.run())
  with jax.profiler.trace(directory):
    for _ in range(steps):
      jax.block_until_ready(chosen.run())
  summary = profiling.summarise(directory, hlo_text=chosen.hlo())
  return {'program': chosen.label, 'mode': chosen.mode, 'steps': steps, **summary}


def _result(job: _Job, programs: list[_Timed], probe: dict, sizes, facts: dict) -> dict:
  """The JSON-ready result: the rows, the probe, and the conditions of the measurement."""
  on_cpu = jax.default_backend() == 'cpu'
  probe_best = {d: max(v) for d, v in probe.items() if v}
  given = facts['peak_tflops_given']
  peak = lambda p: given if given is not None else probe_best.get(p.variant.dtype)
  rows = [_row(p, job.batch, peak(p), probe_best, on_cpu) for p in programs]
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
    'profile': facts['profile'],
  }


# ----------------------------------------------------------------------------- output


def _fmt(value: Any, spec: str, scale: float = 1.0) -> str:
  if value is None or (isinstance(value, float) and value != value):
    return '-'
  return format(value / scale, spec)


def _markdown_rows(result: dict[str, Any]) -> str:
  """The rows as a Markdown table, one column per measured figure."""
  head = (
    '| program | mode | img/s | median | compile s | GFLOP/img | TFLOP/s | MFU | XLA mem GB'
    ' | MB acc/img | temp MB/img | peak mem GB | cpu/wall | faults/step | vs HF |'
  )
  lines = [head, '|' + '---|' * 15]
  for r in result['rows']:
    cells = [
      r['program'],
      r['mode'],
      _fmt(r['img_per_s'], '.2f'),
      _fmt(r['img_per_s_median'], '.2f'),
      _fmt(r['compile_s'], '.1f'),
      _fmt(r['flops_per_image'], '.2f', 1e9),
      _fmt(r['achieved_tflops'], '.3f'),
      _fmt(r['mfu'], '.0%'),
      _fmt(r['xla_memory_bytes'], '.2f', 1e9),
      _fmt(r.get('bytes_accessed_per_image'), '.1f', 1e6),
      _fmt(r.get('temp_bytes_per_image'), '.1f', 1e6),
      _fmt(r['peak_memory_bytes'], '.2f', 1e9),
      _fmt(r['cpu_per_wall'], '.2f'),
      _fmt(r.get('page_faults_per_step'), '.0f'),
      _fmt(r.get('vs_hf'), '.2f'),
    ]
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def format_table(result: dict[str, Any]) -> str:
  """A Markdown table of the rows, then the probe, agreement and load lines."""
  out = [_markdown_rows(result), '']
  if result['matmul_probe_tflops']:
    probes = ', '.join(
      f'{d} {max(v) * 1e3:.0f} GFLOP/s' for d, v in result['matmul_probe_tflops'].items()
    )
    out.append(f'matmul probe (best square {result["matmul_probe_sizes"]}): {probes}')
  if result['peak_tflops_given']:
    out.append(f'peak: {result["peak_tflops_given"]} TFLOP/s (given)')
  for name, a in result['agreement'].items():
    out.append(
      f'{name} vs {a["reference"]}: top-1 agreement {a["top1_agreement"]:.1%} on {a["images"]}'
      f' random images ({a["distinct_reference_top1"]} distinct classes), max |logit error|'
      f' {a["max_abs_logit_error"]:.2e} (max |logit| {a["max_abs_logit"]:.2f})'
    )
  if result['hf_max_abs_logit_error'] is not None:
    out.append(
      f'Hugging Face vs ours (float32): max |logit error| {result["hf_max_abs_logit_error"]:.2e}'
    )
  for r in result['rows']:
    if r['attention'] == 'fused' and r['cudnn_attention'] is not None:
      kernel = 'cuDNN fused attention' if r['cudnn_attention'] else 'no cuDNN kernel (XLA)'
      out.append(f'{r["program"]} {r["mode"]}: {kernel}')
  for r in result['rows']:
    if r.get('train_over_inference_time'):
      out.append(
        f'{r["program"]}: training step per image = {r["train_over_inference_time"]:.2f} x'
        ' inference per image'
      )
  if result.get('profile'):
    profile = result['profile']
    out.append(f'{profile["program"]} {profile["mode"]}, {profile["steps"]} steps profiled:')
    out.append(profiling.format_summary(profile))
  if result.get('huge_pages'):
    out.append(result['huge_pages'])
  out.append(
    f'load average {result["load_average_start"][0]:.2f} at start, '
    f'{result["load_average_end"][0]:.2f} at end ({result["cpu_count"]} CPUs); {result["date"]}'
  )
  return '\n'.join(out)


def format_memory_table(result: dict[str, Any]) -> str:
  """A Markdown table of `memory_table`'s rows: GiB, and MiB per image."""
  devices = result['devices_gib']
  head = '| model | program | fixed GiB | of it state | MiB/img | of it temp | off line MiB | '
  lines = [head + ' | '.join(f'{g:g} GiB' for g in devices) + ' |']
  lines.append('|' + '---|' * (7 + len(devices)))
  for r in result['rows']:
    cells = [
      r['model'],
      r['program'],
      _fmt(r['fixed_bytes'], '.2f', GIB),
      _fmt(r['state_bytes'], '.2f', GIB),
      _fmt(r['per_image_bytes'], '.1f', 2**20),
      _fmt(r['temp_per_image_bytes'], '.1f', 2**20),
      _fmt(r['off_line_bytes'], '.2f', 2**20),
      *(str(r['largest_batch'][f'{g:g}']) for g in devices),
    ]
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def write_json(result: dict[str, Any], path: str) -> None:
  """Writes atomically (`vit_jax.files`): a failed write leaves an earlier file as it was."""
  files.atomic_write_text(path, json.dumps(result, indent=2) + '\n')


def main(argv: Sequence[str]) -> None:
  try:
    _main(argv)
  except ValueError as e:  # bad flags or a batch that cannot fit: one line, no traceback
    sys.exit(f'error: {e}')


def _main(argv: Sequence[str]) -> None:
  del argv
  f = flags.FLAGS
  log = lambda s: print(s, file=sys.stderr, flush=True)
  if f.memory_batches:
    _memory_main(f, log)
    return
  batch = f.batch
  if f.max_batch:
    variants = variants_from(f.dtype, f.attention, f.remat, f.layers, f.precision)
    config = model_config(f.model)
    limit = int(f.memory_fraction * memory_limit_bytes())
    batch, need = largest_batch(config, f.num_classes, variants[0], f.resolution, limit)
    log(f'largest batch for {variants[0].name}: {batch} ({need / 1e9:.1f} of {limit / 1e9:.1f} GB)')
  result = run_benchmark(
    f.model,
    batch,
    f.resolution,
    f.dtype,
    f.attention,
    f.remat,
    f.layers,
    precisions=f.precision,
    inference=f.inference,
    train=f.train,
    compare=f.compare,
    num_classes=f.num_classes,
    peak_tflops=f.peak_tflops,
    rounds=f.rounds,
    steps=f.steps,
    check_batches=f.check_batches,
    probe_sizes=[int(s) for s in f.probe_sizes] or None,
    seed=f.seed,
    compile_only=f.compile_only,
    accum_steps=f.accum_steps,
    profile_steps=f.profile_steps,
    profile_dir=f.profile_dir,
    log=log,
  )
  print(format_table(result))
  if f.json:
    write_json(result, f.json)
    print(f'wrote {f.json}')


def _memory_main(f: flags.FlagValues, log: Callable[[str], None]) -> None:
  """`--memory_batches`: the memory table of the training steps of every `--model` (a comma
  list here) and variant."""
  variants = variants_from(f.dtype, f.attention, f.remat, f.layers, f.precision)
  models = f.model.split(',')
  log(f'{", ".join(models)} {f.resolution}px on {jax.devices()[0].device_kind}: memory only')
  batches = [int(b) for b in f.memory_batches]
  devices = [float(g) for g in f.memory_gib]
  result = memory_table(models, variants, f.resolution, batches, devices, f.num_classes, log)
  print(format_memory_table(result))
  if f.json:
    write_json(result, f.json)
    print(f'wrote {f.json}')


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """The command line's flags, on `flag_values` (defined at program start, not at import)."""
  _define_program_flags(flag_values)
  _define_run_flags(flag_values)


def _define_program_flags(fv: flags.FlagValues) -> None:
  """What is compiled: the model, its batch and the variants measured side by side."""
  flags.DEFINE_string(
    'model', 'ViT-B_16', 'registered model name (vit_jax.models.MODEL_CONFIGS)', flag_values=fv
  )
  flags.DEFINE_integer('batch', 8, 'images per step', flag_values=fv)
  flags.DEFINE_bool(
    'max_batch',
    False,
    'instead of --batch: the largest multiple of 32 whose training step fits',
    flag_values=fv,
  )
  flags.DEFINE_float(
    'memory_fraction', 0.9, 'of the device memory, for --max_batch', flag_values=fv
  )
  flags.DEFINE_list(
    'memory_batches',
    [],
    "instead of timing: compile each variant's training step at these batches (nothing"
    ' allocated) and print its memory as a line in the batch; --model may be a comma list',
    flag_values=fv,
  )
  flags.DEFINE_list(
    'memory_gib',
    ['16', '40', '80'],
    'with --memory_batches: the largest batch for these GiB',
    flag_values=fv,
  )
  flags.DEFINE_integer('resolution', 224, 'image side in pixels', flag_values=fv)
  flags.DEFINE_integer('num_classes', 1000, 'head width', flag_values=fv)
  flags.DEFINE_list(
    'dtype', ['float32'], f'compute dtypes, comma list of {list(DTYPES)}', flag_values=fv
  )
  flags.DEFINE_list(
    'attention', ['xla'], f'attention implementations, of {list(ATTENTION)}', flag_values=fv
  )
  flags.DEFINE_list(
    'remat', ['none'], f'rematerialisation policies, of {list(REMAT)}', flag_values=fv
  )
  flags.DEFINE_list(
    'layers', ['unrolled'], f'encoder blocks unrolled or as one nn.scan: {LAYERS}', flag_values=fv
  )
  flags.DEFINE_list(
    'precision',
    ['matmul'],
    f'precision policies of the 16-bit dtypes, of {list(precision.POLICIES)}',
    flag_values=fv,
  )
  flags.DEFINE_integer(
    'profile_steps', 0, 'trace this many more steps with jax.profiler (0: none)', flag_values=fv
  )
  flags.DEFINE_string(
    'profile_dir', '/tmp/vit_benchmark_profile', 'where --profile_steps writes', flag_values=fv
  )


def _define_run_flags(fv: flags.FlagValues) -> None:
  """What is measured and how: the modes, the comparison, the peak, timing and output."""
  flags.DEFINE_bool(
    'inference', True, 'time inference (--noinference: training only)', flag_values=fv
  )
  flags.DEFINE_bool(
    'train', False, "time the trainer's training step (vit_jax.train.steps)", flag_values=fv
  )
  flags.DEFINE_integer(
    'accum_steps', 1, 'micro-batches per training step (config.accum_steps)', flag_values=fv
  )
  flags.DEFINE_bool(
    'compare', False, 'also run Hugging Face PyTorch ViT on the same weights', flag_values=fv
  )
  flags.DEFINE_float(
    'peak_tflops', None, 'device peak for MFU; default: a matmul probe', flag_values=fv
  )
  flags.DEFINE_list(
    'probe_sizes', [], 'square matmul sizes of the probe (default by platform)', flag_values=fv
  )
  flags.DEFINE_integer('rounds', 2, 'interleaved rounds over all programs', flag_values=fv)
  flags.DEFINE_integer('steps', 3, 'timed steps per program per round', flag_values=fv)
  flags.DEFINE_integer(
    'check_batches', 2, 'batches of random images for top-1 agreement', flag_values=fv
  )
  flags.DEFINE_integer('seed', 0, 'weights and images', flag_values=fv)
  flags.DEFINE_bool(
    'compile_only', False, 'compile on abstract arrays: no allocation, no timing', flag_values=fv
  )
  flags.DEFINE_string('json', None, 'write the results here (JSON)', flag_values=fv)


def run_cli() -> None:
  """The `vit-benchmark` console script (and `python -m vit_jax.benchmark`); with `--pipeline`
  the input pipeline's benchmark (`benchmark_pipeline`, which imports TensorFlow)."""
  hugepages.reexec_with_huge_pages()
  mode = importlib.import_module(cli.entry_point('vit-benchmark', sys.argv[1:]).cli)
  cli.start(mode.define_flags, mode.main)

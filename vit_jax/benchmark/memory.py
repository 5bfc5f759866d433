"""The training step's memory, compiled and nothing allocated: at one batch, as a line in the
batch (`memory_line`, `memory_row`, the table of models and variants `memory_table`), the
largest batch that fits a device, and the fewest micro-batches whose pass fits."""

import dataclasses
import datetime
import itertools
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from vit_jax.benchmark import programs
from vit_jax.benchmark.variants import Variant, build_model, model_config


def train_memory(
  config: ml_collections.ConfigDict,
  num_classes: int,
  variant: Variant,
  resolution: int,
  batch: int,
  accum_steps: int = 1,
) -> dict[str, Any]:
  """`analysis.compiled_facts` of one training step at `batch` in `accum_steps` micro-batches
  (compiled, nothing allocated), and its `compile_s`."""
  model = build_model(config, num_classes, variant)
  images = jax.ShapeDtypeStruct((batch, resolution, resolution, 3), jnp.float32)
  labels = jax.ShapeDtypeStruct((batch,), jnp.int32)
  params = jax.eval_shape(lambda x: model.init(jax.random.key(0), x[:1], train=False), images)
  _, compile_s, _, facts = programs.compile_train(
    model, params['params'], images, labels, accum_steps
  )
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

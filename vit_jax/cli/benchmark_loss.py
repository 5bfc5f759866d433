"""The sigmoid loss's memory per device, gathered against chunked:
`python -m vit_jax.benchmark --contrastive_loss`.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu \\
      python -m vit_jax.benchmark --contrastive_loss --batches 4096,16384,32768 --dim 768

Compiles, on abstract arrays (nothing is allocated or run), SigLIP's loss alone
(vit_jax/tasks/contrastive_losses.py) on (B, dim) embeddings with its gradient w.r.t. both
embeddings, t and b (`jax.value_and_grad`, what training compiles), under `jax.jit` on the
global batch (rows split over the mesh, as the jit step has them) and inside `jax.shard_map`
(each device's rows, as the shard_map step), both forms of `config.contrastive.logits`, on
every device JAX sees; prints the compiled programs' temporaries of one device
(`compiled.memory_analysis().temp_size_in_bytes`) in MiB, a markdown table.
"""

import functools
import sys
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from absl import flags
from jax.sharding import PartitionSpec as P

from vit_jax import parallel
from vit_jax.tasks import contrastive_losses

STEPS = ('jit', 'shard_map')


def loss_fn(logits: str, step: str, mesh: jax.sharding.Mesh, chunk: int) -> Callable:
  """(zimg, ztxt, t, b) -> the sigmoid loss, in the form `logits` of the step `step`."""
  loss = contrastive_losses.sigmoid_loss
  if logits == 'chunked':
    loss = functools.partial(contrastive_losses.chunked_sigmoid_loss, chunk=chunk)
  if step == 'jit':
    return lambda *a: loss(*a)[0]
  axis = parallel.DATA_AXIS
  specs = (P(axis), P(axis), P(), P())
  return jax.shard_map(lambda *a: loss(*a, axis=axis)[0], mesh=mesh, in_specs=specs, out_specs=P())


def temp_bytes(
  batch: int, dim: int, logits: str, step: str, mesh: jax.sharding.Mesh,
  chunk: int = contrastive_losses.CHUNK,
) -> int:  # fmt: skip
  """One device's temporaries of the loss and its gradient on a global batch of `batch`."""
  rows, replicated = parallel.batch_sharding(mesh), parallel.replicated(mesh)
  z = jax.ShapeDtypeStruct((batch, dim), jnp.float32, sharding=rows)
  scalar = jax.ShapeDtypeStruct((), jnp.float32, sharding=replicated)
  grad = jax.value_and_grad(loss_fn(logits, step, mesh, chunk), argnums=(0, 1, 2, 3))
  compiled = jax.jit(grad).lower(z, z, scalar, scalar).compile()
  return int(compiled.memory_analysis().temp_size_in_bytes)


def measure(
  batches: Sequence[int], dim: int, mesh: jax.sharding.Mesh, chunk: int = contrastive_losses.CHUNK
) -> dict[str, list[int]]:
  """`temp_bytes` at each global batch, by 'STEP LOGITS' ('jit gathered', ...)."""
  columns = [(step, logits) for step in STEPS for logits in contrastive_losses.LOGITS]
  return {
    f'{step} {logits}': [temp_bytes(b, dim, logits, step, mesh, chunk) for b in batches]
    for step, logits in columns
  }


def table(batches: Sequence[int], dim: int, mesh: jax.sharding.Mesh) -> str:
  """The markdown table: a row per global batch, a column per step and form, in MiB."""
  measured = measure(batches, dim, mesh)
  head = ['global batch', 'per device', *measured]
  lines = ['| ' + ' | '.join(head) + ' |', '|' + '---:|' * len(head)]
  for i, batch in enumerate(batches):
    mib = [f'{values[i] / 2**20:,.1f}' for values in measured.values()]
    lines.append('| ' + ' | '.join([f'{batch:,}', f'{batch // mesh.size:,}', *mib]) + ' |')
  return '\n'.join(lines)


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """The `--contrastive_loss` mode's flags, on `flag_values` (defined at program start)."""
  fv = flag_values
  flags.DEFINE_bool(
    'contrastive_loss', True, "the sigmoid loss's memory per device (this mode)", flag_values=fv
  )
  flags.DEFINE_list('batches', ['4096', '16384', '32768'], 'global batch sizes', flag_values=fv)
  flags.DEFINE_integer('dim', 768, 'embedding width (SigLIP B: 768)', flag_values=fv)


def main(argv: Sequence[str]) -> None:
  del argv
  f = flags.FLAGS
  mesh = parallel.create_mesh()
  device = jax.devices()[0]
  print(
    f'{mesh.size} x {device.platform} ({device.device_kind}), jax {jax.__version__}, '
    f'd={f.dim}, chunk={contrastive_losses.CHUNK}; temporaries per device, MiB',
    file=sys.stderr,
  )
  print(table([int(b) for b in f.batches], f.dim, mesh))

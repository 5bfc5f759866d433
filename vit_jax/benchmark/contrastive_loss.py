"""`--contrastive_loss`: the sigmoid loss's memory per device, its logits gathered or chunked.
SigLIP's loss (vit_jax/tasks/contrastive_losses.py) and its gradient compiled on abstract
(B, dim) embeddings, under `jax.jit` and inside `jax.shard_map`; one device's temporaries."""

import functools
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
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

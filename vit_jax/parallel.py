"""The device mesh, sharding rules and global batches.

One mesh axis, `data`, spans every device of every host. Batches are split over it;
parameters and optimizer state are replicated or FSDP-sharded over the same axis by a
list of `(regex, rule)` pairs matched against each leaf's '/'-joined path. The train step
is compiled once with `jax.jit` and these NamedShardings, and XLA's GSPMD partitioner
inserts the collectives, so the gradient of a replicated parameter is the true global
gradient. The per-device alternative (`config.step='shard_map'`, vit_jax/train/steps.py)
writes that reduction out as a `lax.pmean` of per-device gradients.
"""

import re
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DATA_AXIS = 'data'
RULES = ('replicate', 'fsdp')
# Leaves smaller than this stay replicated under 'fsdp': sharding them saves nothing.
FSDP_MIN_SIZE = 2**14


def create_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A 1-D mesh with axis 'data' over `devices` (default: all devices of all hosts)."""
  devices = jax.devices() if devices is None else list(devices)
  return Mesh(np.asarray(devices), (DATA_AXIS,))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) dimension split over the data axis."""
  return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def parse_rules(rules: Any) -> list[tuple[str, str]]:
  """`[(regex, 'replicate'|'fsdp'), ...]`, or one rule name for every leaf ('fsdp')."""
  if isinstance(rules, str):
    rules = [('.*', rules)]
  parsed = []
  for item in rules:
    if len(item) != 2 or item[1] not in RULES:
      raise ValueError(f'Sharding rule {item!r}: expected (regex, rule) with rule in {RULES}.')
    parsed.append((str(item[0]), str(item[1])))
  return parsed


def _fsdp_spec(shape: tuple[int, ...], axis_size: int) -> PartitionSpec:
  """Shard the largest dimension that the axis divides; replicate if none does."""
  if int(np.prod(shape, dtype=np.int64)) < FSDP_MIN_SIZE:
    return PartitionSpec()
  for dim in sorted(range(len(shape)), key=lambda d: -shape[d]):
    if shape[dim] % axis_size == 0:
      spec = [None] * len(shape)
      spec[dim] = DATA_AXIS
      return PartitionSpec(*spec)
  return PartitionSpec()


def tree_shardings(tree: Any, mesh: Mesh, rules: Any = 'replicate') -> Any:
  """NamedShardings for a tree of arrays (params, optimizer state) by the first matching rule.

  Paths are '/'-joined keys, e.g. 'Transformer/encoderblock_0/MlpBlock_0/Dense_0/kernel';
  optimizer-state leaves end with the path of their parameter, so the same rules apply.
  Leaves no rule matches are replicated.
  """
  parsed = [(re.compile(pattern), rule) for pattern, rule in parse_rules(rules)]
  axis_size = mesh.shape[DATA_AXIS]

  def leaf(path, x):
    name = '/'.join(str(getattr(k, 'key', getattr(k, 'name', getattr(k, 'idx', k)))) for k in path)
    for regex, rule in parsed:
      if regex.search(name):
        if rule == 'fsdp':
          return NamedSharding(mesh, _fsdp_spec(tuple(np.shape(x)), axis_size))
        break
    return replicated(mesh)

  return jax.tree_util.tree_map_with_path(leaf, tree)


def check_batch(batch: int, mesh: Mesh, accum_steps: int = 1, name: str = 'batch') -> None:
  """A clear error when the global batch does not split over hosts, devices and micro-batches."""
  devices = mesh.size
  processes = jax.process_count()
  need = devices * max(1, accum_steps)
  if batch <= 0 or batch % need or batch % processes:
    what = f'{devices} devices' + (f' x accum_steps={accum_steps}' if accum_steps > 1 else '')
    raise ValueError(
      f'config.{name}={batch} does not divide over {what}: use a multiple of {need} '
      f'(e.g. {max(need, batch // need * need) or need}).'
    )


def local_batch_size(batch: int) -> int:
  """This host's share of a global batch."""
  return batch // jax.process_count()


def global_batch(local: dict[str, np.ndarray], sharding: NamedSharding) -> dict[str, jax.Array]:
  """Global arrays over the mesh from this host's rows (hosts hold consecutive blocks)."""
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in local.items()}


def place(tree: Any, shardings: Any) -> Any:
  """Global arrays from a host tree that every process holds whole (a checkpoint read on
  each host): each device takes its slice of each leaf."""
  return jax.tree.map(
    lambda x, s: jax.make_array_from_callback(np.shape(x), s, lambda idx, x=x: x[idx]),
    tree,
    shardings,
  )

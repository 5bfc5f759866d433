"""The encoder blocks seen from outside: named by index (`intermediate_blocks`), and stacked
on a leading layer axis for `scan_layers=True` (`Transformer/encoderblock`) and back."""

import re
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def block_indices(blocks: Sequence[int], num_layers: int) -> tuple[int, ...]:
  """Block indices (negative ones count from the end) as sorted, distinct, non-negative ones."""
  if isinstance(blocks, (int, str)) or not blocks:
    raise ValueError(f'intermediate_blocks={blocks!r}: give a non-empty sequence of block indices')
  out = set()
  for i in blocks:
    if (
      isinstance(i, bool)
      or not isinstance(i, (int, np.integer))
      or not -num_layers <= i < num_layers
    ):
      raise ValueError(
        f'intermediate_blocks: {i!r} is not a block index of a model with {num_layers} blocks'
        f' (0..{num_layers - 1}, or negative from the end)'
      )
    out.add(int(i) % num_layers)
  return tuple(sorted(out))


def _blocks_of(transformer: Mapping[str, Any]) -> list[str]:
  names = [k for k in transformer if re.fullmatch(r'encoderblock_\d+', k)]
  return sorted(names, key=lambda k: int(k.rsplit('_', 1)[1]))


def stack_encoder_blocks(params: Mapping[str, Any]) -> dict[str, Any]:
  """Released layout -> `scan_layers=True` layout: `encoderblock_{i}` stacked on axis 0."""
  transformer = dict(params['Transformer'])
  if 'encoderblock' in transformer:
    raise ValueError('params are already stacked (Transformer/encoderblock exists)')
  names = _blocks_of(transformer)
  if [int(n.rsplit('_', 1)[1]) for n in names] != list(range(len(names))) or not names:
    raise ValueError(f'expected Transformer/encoderblock_0..N-1; found {names}')
  blocks = [transformer.pop(n) for n in names]
  transformer['encoderblock'] = jax.tree.map(lambda *xs: jnp.stack(xs), *blocks)
  return {**params, 'Transformer': transformer}


def unstack_encoder_blocks(params: Mapping[str, Any]) -> dict[str, Any]:
  """`scan_layers=True` layout -> the released layout with `encoderblock_{i}`."""
  transformer = dict(params['Transformer'])
  if 'encoderblock' not in transformer:
    raise ValueError('params are not stacked (no Transformer/encoderblock)')
  stacked = transformer.pop('encoderblock')
  num_layers = jax.tree.leaves(stacked)[0].shape[0]
  for i in range(num_layers):
    transformer[f'encoderblock_{i}'] = jax.tree.map(lambda x, i=i: x[i], stacked)
  return {**params, 'Transformer': transformer}

"""NaFlex image towers (SigLIP 2's `NaFlexViT`, vit_jax/models/naflex.py): the image tower of
an image-text model with `image_model='naflex'`, the functions the image-text family asks of
its image tower under the ViT family's names.

Its tree is big_vision's NaFlex layout: a 2-D patch embedding `embedding/kernel` (p * p * 3,
D) over flattened patches, a top-level (G, G, D) `pos_embedding` grid, this project's encoder
and MAP head. It has no image size of its own: images come as sequences of at most
`pp.max_patches` patches, each at its own aspect ratio.
"""

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from vit_jax.families import vit
from vit_jax.flat import CheckpointError, get, shape_str
from vit_jax.models import stats

PATCH_KERNEL = 'embedding/kernel'
POSEMB = 'pos_embedding'

Config = Mapping[str, Any] | ml_collections.ConfigDict


def owns_config(config: Config) -> bool:
  """A `NaFlexViT`'s fields (a `patch_size` and a `posemb_grid`, where a ViT has `patches`)."""
  return 'patch_size' in config and 'posemb_grid' in config


def owns_tree(flat: Mapping[str, Any]) -> bool:
  """A NaFlex tower's flat tree: a Dense patch embedding and a (G, G, D) position grid."""
  kernel, posemb = flat.get(PATCH_KERNEL), flat.get(POSEMB)
  return kernel is not None and len(kernel.shape) == 2 and posemb is not None


def infer_config(flat: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """The `NaFlexViT` fields a flat NaFlex tree implies, read off its shapes."""
  inputs, width = (int(d) for d in get(flat, PATCH_KERNEL).shape)
  patch = math.isqrt(inputs // 3)
  grid = get(flat, POSEMB).shape
  if patch * patch * 3 != inputs or len(grid) != 3 or grid[0] != grid[1]:
    raise CheckpointError(
      f'{PATCH_KERNEL} {shape_str((inputs, width))} and {POSEMB} {shape_str(grid)}: expected'
      ' (p * p * 3, D) and (G, G, D) of a NaFlex tower'
    )
  config = ml_collections.ConfigDict()
  config.patch_size = patch
  config.hidden_size = width
  config.transformer = vit.infer_transformer(flat)
  config.classifier = 'map' if 'MAPHead_0/probe' in flat else 'gap'
  config.posemb_grid = int(grid[0])
  config.num_classes = int(flat['head/kernel'].shape[-1]) if 'head/kernel' in flat else None
  return config


def architecture(config: Config) -> tuple:
  """The fields that decide the parameter shapes."""
  t = config['transformer']
  return (
    'naflex',
    config['patch_size'],
    config['hidden_size'],
    (t['num_layers'], t['mlp_dim'], t['num_heads']),
    config['classifier'],
    config['posemb_grid'],
  )


def describe(config: Config) -> str:
  """The architecture in one phrase."""
  t = config['transformer']
  return (
    f'NaFlex, hidden_size {config["hidden_size"]}, {t["num_layers"]} layers, {t["num_heads"]}'
    f' heads, mlp_dim {t["mlp_dim"]}, patch {config["patch_size"]}, position grid'
    f' {config["posemb_grid"]}x{config["posemb_grid"]}, classifier {config["classifier"]}'
  )


def table_columns(config: Config) -> dict[str, Any]:
  """The model table's shape columns (`vit-models`)."""
  t = config['transformer']
  arch = (t['num_layers'], config['hidden_size'], t['mlp_dim'], t['num_heads'])
  columns = dict(zip(('layers', 'hidden', 'mlp', 'heads'), arch, strict=True))
  return {**columns, 'patch': config['patch_size'], 'note': ''}


def image_input(config: Config, max_patches: int) -> dict[str, jax.ShapeDtypeStruct]:
  """One image as `max_patches` patch slots: the tower's call's arrays."""
  p = config['patch_size']
  slots = jax.ShapeDtypeStruct((1, max_patches), jnp.int32)
  patches = jax.ShapeDtypeStruct((1, max_patches, p * p * 3), jnp.float32)
  return {'patches': patches, 'ptype': slots, 'yidx': slots, 'xidx': slots}


def forward_flops(config: Config, patches: int, num_classes: int) -> int:
  """Analytic forward FLOPs of one image of `patches` patches (the paper's count, as a
  ViT's: the patch embedding, the encoder, the pooling, the head)."""
  p, d = config['patch_size'], config['hidden_size']
  flops = 2 * patches * p * p * 3 * d
  flops += stats.encoder_flops(d, config['transformer'], patches, config['classifier'] == 'map')
  return flops + 2 * d * num_classes

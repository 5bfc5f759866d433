"""The NaFlex family: SigLIP 2's native-aspect tower (`NaFlexViT`, vit_jax/models/naflex.py),
as a classifier of its own (a head of `num_classes`) and as the image tower of an image-text
model with `image_model='naflex'` (families/two_towers.py asks it for that tower's shapes,
FLOPs and inputs).

Its tree is big_vision's NaFlex layout (`naflex_vit.Model`): a 2-D patch embedding
`embedding/kernel` (p * p * 3, D) over flattened patches, a top-level (G, G, D)
`pos_embedding` grid, this project's encoder and MAP head, an optional `head`. It has no
image size of its own: images come as sequences of at most `max_patches` patches, each at
its own aspect ratio (`preprocessing`), one image a row, or packed several a row (`NaFlexViT`'s
`images_per_row`; `image_features` takes it too).
"""

import math
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from vit_jax.families import vit
from vit_jax.families.preprocessing import Preprocessing, patches
from vit_jax.flat import CheckpointError, as_flat, get, shape_str
from vit_jax.models import model_from_config, stats
from vit_jax.models.naflex import NaFlexViT, is_naflex

PATCH_KERNEL = 'embedding/kernel'
POSEMB = 'pos_embedding'
# The patches an image is given where no run or model says otherwise: SigLIP 2's evaluation
# sequence.
PATCHES = 256

Config = Mapping[str, Any] | ml_collections.ConfigDict


def owns_config(config: Config) -> bool:
  """A `NaFlexViT`'s fields (a `patch_size` and a `posemb_grid`, where a ViT has `patches`)."""
  return is_naflex(config)


def owns_tree(flat: Mapping[str, Any]) -> bool:
  """A NaFlex tower's flat tree: a Dense patch embedding and a (G, G, D) position grid."""
  kernel, posemb = flat.get(PATCH_KERNEL), flat.get(POSEMB)
  return kernel is not None and len(kernel.shape) == 2 and posemb is not None


def infer_config(params: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """The `NaFlexViT` fields a NaFlex tree (nested or flat) implies, read off its shapes."""
  flat = as_flat(params)
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


def match_registry(config: Config) -> str | None:
  """The registered NaFlex classifier with the architecture of `config`, or None."""
  return vit.first_registered(config, owns_config, architecture)


def describe(config: Config) -> str:
  """The architecture in one phrase."""
  t = config['transformer']
  return (
    f'NaFlex, hidden_size {config["hidden_size"]}, {t["num_layers"]} layers, {t["num_heads"]}'
    f' heads, mlp_dim {t["mlp_dim"]}, patch {config["patch_size"]}, position grid'
    f' {config["posemb_grid"]}x{config["posemb_grid"]}, classifier {config["classifier"]}'
  )


stated_fields = vit.stated_fields  # the same encoder and MAP head: GELU, LayerNorm epsilon


def label(config: Config) -> str:
  """An unregistered model's name in the commands' output."""
  return describe(config)


def model_kind(config: Config) -> str:
  del config
  return 'NaFlex ViT'


def table_columns(config: Config) -> dict[str, Any]:
  """The model table's shape columns (`vit-models`)."""
  t = config['transformer']
  arch = (t['num_layers'], config['hidden_size'], t['mlp_dim'], t['num_heads'])
  columns = dict(zip(('layers', 'hidden', 'mlp', 'heads'), arch, strict=True))
  return {**columns, 'patch': config['patch_size'], 'note': ''}


def is_plain(config: Config) -> bool:
  del config
  return False


def unlike_hugging_face(config: Config) -> str | None:
  del config
  return 'is a NaFlex model (images as patch sequences)'


def patch_pixels(config: Config) -> int:
  """The side in input pixels of one token's patch."""
  return int(config['patch_size'])


def sequence_patch(config: Config) -> int:
  """The patch side: the model takes images as sequences of such patches."""
  return int(config['patch_size'])


def native_resolution(flat: Mapping[str, Any], config: Config) -> None:
  """None: a NaFlex model takes images at their own size."""
  del flat, config
  return None


def token_grid(config: Config, image_size: int | tuple[int, int]) -> tuple[int, int]:
  """(rows, cols) of patches of an image of `image_size` pixels, cut as it is."""
  h, w = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
  p = patch_pixels(config)
  return h // p, w // p


def build(fields: Config, *, num_classes: int | None, dtype: Any, precision: str) -> nn.Module:
  """The classifier of a run's model fields: a head of `num_classes` (0 or None: the pooled
  features), computing in `dtype` under the precision policy `precision`."""
  return model_from_config(fields, num_classes=num_classes, dtype=dtype, precision_policy=precision)


def image_features(model: nn.Module) -> Callable[..., jax.Array]:
  """(params, images, images_per_row=0) -> the pooled features: the model without its head,
  in inference mode; `images_per_row` K > 0: packed rows of up to K images, (B, K, D)."""
  headless = model.clone(num_classes=0)

  def features(params: Any, images: Any, images_per_row: int = 0) -> jax.Array:
    return headless.apply({'params': params}, images, train=False, images_per_row=images_per_row)

  return features


def image_input(config: Config, max_patches: int) -> dict[str, jax.ShapeDtypeStruct]:
  """One image as `max_patches` patch slots: the tower's call's arrays."""
  p = config['patch_size']
  slots = jax.ShapeDtypeStruct((1, max_patches), jnp.int32)
  patch_values = jax.ShapeDtypeStruct((1, max_patches, p * p * 3), jnp.float32)
  return {'patches': patch_values, 'ptype': slots, 'yidx': slots, 'xidx': slots}


def init_inputs(model: nn.Module, resolution: int | tuple[int, int], max_len: int | None) -> dict:
  """One image as `PATCHES` patch slots (the parameters do not depend on their number)."""
  del resolution, max_len  # any size; no text
  return image_input({'patch_size': model.patch_size}, PATCHES)


def sequence_flops(config: Config, patches: int, num_classes: int) -> int:
  """Analytic forward FLOPs of one image of `patches` patches (the paper's count, as a
  ViT's: the patch embedding, the encoder, the pooling, the head)."""
  p, d = config['patch_size'], config['hidden_size']
  flops = 2 * patches * p * p * 3 * d
  flops += stats.encoder_flops(d, config['transformer'], patches, config['classifier'] == 'map')
  return flops + 2 * d * num_classes


def forward_flops(config: Config, resolution: int, num_classes: int) -> int:
  """The forward FLOPs of one image of `PATCHES` patches (its size is its own, not
  `resolution`)."""
  del resolution
  return sequence_flops(config, PATCHES, num_classes)


def preprocessing(
  config: Config, resolution: int | tuple[int, int] | None = None, max_patches: int = 0
) -> Preprocessing:
  """THE preprocessing of a NaFlex model: each image at its own aspect ratio as at most
  `max_patches` (0: `PATCHES`) patches of its patch size, antialiased bilinear, [-1, 1]."""
  if resolution is not None:
    raise ValueError(
      'a NaFlex model takes images at their own size as patch sequences: no resolution;'
      ' give its patches an image (max_patches)'
    )
  return patches(sequence_patch(config), max_patches or PATCHES)


MODULE = NaFlexViT

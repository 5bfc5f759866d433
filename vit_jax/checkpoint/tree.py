"""The flat dicts of the checkpoint formats, and the model a tree describes, by its family.

The flat-dict helpers are `vit_jax.flat`'s; the architecture of a tree (`infer_config`,
`architecture`, `match_registry`, `describe`, resolutions and grids) is its model family's
(`vit_jax.families`), asked here for the format modules.
"""

from collections.abc import Iterable, Mapping
from typing import Any

import ml_collections

from vit_jax import families
from vit_jax.families.mixer import STEM as MIXER_STEM
from vit_jax.families.mixer import TOKENS as MIXER_TOKENS
from vit_jax.families.vit import POSEMB, block_numbers, block_options, num_prefix_tokens
from vit_jax.flat import (
  SEP,
  CheckpointError,
  as_flat,
  count_params,
  flatten,
  natural_key,
  shape_str,
  square_side,
  unflatten,
)
from vit_jax.models.precision import LAYER_NORM_EPSILON

__all__ = [
  'MIXER_STEM',
  'MIXER_TOKENS',
  'POSEMB',
  'SEP',
  'CheckpointError',
  'block_numbers',
  'block_options',
  'count_params',
  'flatten',
  'natural_key',
  'num_prefix_tokens',
  'shape_str',
  'square_side',
  'unflatten',
]

Config = Mapping[str, Any] | ml_collections.ConfigDict


def config_field(config: Any, name: str, default: Any = None) -> Any:
  """`config[name]` of a model config (ConfigDict, dict or None), else `default`."""
  if isinstance(config, (Mapping, ml_collections.ConfigDict)):
    return config.get(name, default)
  return default


def check_complete(
  flat: Mapping[str, Any],
  required: Iterable[str],
  pairs: Iterable[tuple[str, str]],
  source: str,
  what: str,
) -> None:
  """Every `required` key is in `flat`, and of each optional (kernel, bias) pair both or none."""
  expected = list(required)
  for pair in pairs:
    if (pair[0] in flat) != (pair[1] in flat):
      expected += list(pair)
  missing = [k for k in expected if k not in flat]
  if missing:
    raise CheckpointError(
      f'{source}: missing {len(missing)} ViT weights, e.g. {missing[0]!r}; the file is incomplete'
      f' or not {what}'
    )


def gelu_fields(approximate: bool) -> dict[str, Any]:
  """The model fields of a GELU a file names: none for the tanh approximation (the default)."""
  return {} if approximate else {'gelu_approximate': False}


def layer_norm_fields(epsilon: float) -> dict[str, Any]:
  """The model fields of a LayerNorm epsilon a file states: none for our default 1e-6."""
  return {} if epsilon == LAYER_NORM_EPSILON else {'layer_norm_epsilon': float(epsilon)}


def infer_config(params: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """The model fields a classifier's parameter tree implies, read off its shapes by its
  family (`vit_jax.families.vit` and `.mixer` say what is and is not stored)."""
  return families.infer_config(params)


def architecture(config: Config) -> tuple:
  """The fields that decide the parameter shapes (not dropout, not the head, not pre_logits)."""
  return families.of_config(config).architecture(config)


def match_registry(config: Config) -> str | None:
  """The registered model with the architecture of `config`, or None."""
  return families.of_config(config).match_registry(config)


def describe(config: Config) -> str:
  """The architecture in one phrase, e.g. 'hidden_size 768, 12 layers, 12 heads, mlp_dim 3072,
  patch 16x16, classifier token'."""
  return families.of_config(config).describe(config)


def patch_pixels(config: Config) -> int:
  """The side in input pixels of the patch one token sees (patch size x the stem's stride)."""
  return families.of_config(config).patch_pixels(config)


def native_resolution(params: Mapping[str, Any], config: Config) -> int | None:
  """The square image size a checkpoint was trained at, when its shapes tell (None for
  sincos2d position embeddings, which fit any size)."""
  return families.of_config(config).native_resolution(as_flat(params), config)


def token_grid(config: Config, image_size: int | tuple[int, int]) -> tuple[int, int]:
  """(rows, cols) of patch tokens for an image of `image_size` pixels."""
  return families.of_config(config).token_grid(config, image_size)

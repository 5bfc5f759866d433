"""Sizes of a model: parameter counts and the analytic forward FLOPs of each layer type.

The parameter shapes of a built model (its family knows its inputs) and the FLOPs of a
config by its family are `vit_jax.families.param_shapes` and `.forward_flops`.
"""

import math
from typing import Any

import jax
import ml_collections


def count_params(tree: Any) -> int:
  """Total number of scalars in a tree of arrays or ShapeDtypeStructs."""
  return sum(math.prod(x.shape) for x in jax.tree.leaves(tree))


def _conv_out(size: int, stride: int) -> int:
  return -(-size // stride)  # SAME padding


def _resnet_flops(config: ml_collections.ConfigDict, size: int) -> tuple[int, int, int]:
  """(FLOPs, feature-map side, channels) of a hybrid's ResNet stem on a `size` px image."""
  width = int(64 * config.resnet.width_factor)
  size = _conv_out(size, 2)
  flops = 2 * size * size * 7 * 7 * 3 * width  # conv_root
  size, channels = _conv_out(size, 2), width  # max-pool
  for stage, units in enumerate(config.resnet.num_layers):
    w = width * 2**stage
    for unit in range(units):
      stride = 2 if stage > 0 and unit == 0 else 1
      out = _conv_out(size, stride)
      flops += 2 * size * size * channels * w  # conv1, 1x1
      flops += 2 * out * out * 9 * w * w  # conv2, 3x3 strided
      flops += 2 * out * out * w * 4 * w  # conv3, 1x1
      if channels != 4 * w or stride != 1:
        flops += 2 * out * out * channels * 4 * w  # conv_proj
      size, channels = out, 4 * w
  return flops, size, channels


def mixer_forward_flops(
  config: ml_collections.ConfigDict, resolution: int = 224, num_classes: int = 1000
) -> int:
  """Stem, per block the token-mixing MLP (S -> D_S -> S for each of C channels) and the
  channel-mixing MLP (C -> D_C -> C for each of S patches), head."""
  ph, pw = config.patches.size
  s = _conv_out(resolution, ph) * _conv_out(resolution, pw)
  c = config.hidden_dim
  flops = 2 * s * ph * pw * 3 * c
  flops += config.num_blocks * 2 * 2 * s * c * (config.tokens_mlp_dim + config.channels_mlp_dim)
  return flops + 2 * c * num_classes


def encoder_flops(d: int, transformer: Any, tokens: int, map_head: bool) -> int:
  """The transformer encoder's forward FLOPs over `tokens` tokens of width `d` (and a MAP
  head's: one probe query's q and out, k and v of every token, its MLP)."""
  t, m = tokens, transformer['mlp_dim']
  per_block = 2 * t * d * 4 * d + 2 * 2 * t * t * d + 2 * 2 * t * d * m
  flops = transformer['num_layers'] * per_block
  if map_head:
    flops += 2 * 2 * d * d + 2 * 2 * t * d * d + 2 * 2 * t * d + 2 * 2 * d * m
  return flops


def vit_forward_flops(
  config: ml_collections.ConfigDict, resolution: int = 224, num_classes: int = 1000
) -> int:
  """A ViT's (or hybrid's) analytic forward FLOPs per image: 2 per multiply-add of every
  matmul and conv.

  Elementwise work (norms, softmax, GELU, residuals) is left out, as in the paper's
  compute figures; XLA's cost analysis counts it too and lands ~0.4% higher for B/16.
  """
  d = config.hidden_size
  flops, size, channels = 0, resolution, 3
  if config.resnet is not None:
    flops, size, channels = _resnet_flops(config, resolution)

  ph, pw = config.patches.size
  patches = (size // ph) * (size // pw)
  flops += 2 * patches * ph * pw * channels * d
  distilled = config.get('distilled', False)
  if config.transformer is not None:
    t = patches + int(config.classifier in ('token', 'token_unpooled')) + int(distilled)
    flops += encoder_flops(d, config.transformer, t, config.classifier == 'map')
  width = d
  if config.representation_size is not None:
    flops += 2 * d * config.representation_size
    width = config.representation_size
  tokens = 1 if config.classifier in ('token', 'gap', 'map') else patches
  return flops + (2 if distilled else 1) * 2 * tokens * width * num_classes

"""MLP-Mixer (Tolstikhin et al., arXiv:2105.01601) in Flax linen.

The module names are those of the released checkpoints (`gs://mixer_models/...`, the original
vit_jax `models_mixer.py`), so the parameter tree is the checkpoint interface:

  stem/{kernel,bias}                     conv patch embedding, HWIO
  MixerBlock_{i}/LayerNorm_0             before the token-mixing MLP
  MixerBlock_{i}/token_mixing/Dense_{0,1}    across the S patches: S -> tokens_mlp_dim -> S
  MixerBlock_{i}/LayerNorm_1             before the channel-mixing MLP
  MixerBlock_{i}/channel_mixing/Dense_{0,1}  per patch: C -> channels_mlp_dim -> C
  pre_head_layer_norm
  head                                   zero-initialised classifier on the mean of the patches

The token-mixing kernels are (S, tokens_mlp_dim): a checkpoint fixes the number of patches,
hence the resolution. The released models have no dropout and no stochastic depth.
"""

from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from vit_jax.models.precision import Precision, elementwise_dtype, matmul_kwargs


def is_mixer(config: Mapping[str, Any]) -> bool:
  """True for the config (ConfigDict or dict) of an `MlpMixer`."""
  return 'num_blocks' in config


class MlpBlock(Precision):
  """Dense, GELU (tanh approximation), Dense back to the input width; flax's default inits."""

  mlp_dim: int

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    layer = self.dense_layers(nn.Dense)
    y = nn.gelu(layer(self.mlp_dim, name='Dense_0')(x), approximate=True)
    return layer(x.shape[-1], name='Dense_1')(y)


class MixerBlock(Precision):
  """x + token_mixing(LN(x)) over the patch axis, then x + channel_mixing(LN(x))."""

  tokens_mlp_dim: int
  channels_mlp_dim: int

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    mlp = lambda dim, name: MlpBlock(dim, **self.precision_fields(), name=name)
    y = jnp.swapaxes(self.norm('LayerNorm_0')(x), 1, 2)  # (batch, channels, patches)
    x = x + jnp.swapaxes(mlp(self.tokens_mlp_dim, 'token_mixing')(y), 1, 2)
    return x + mlp(self.channels_mlp_dim, 'channel_mixing')(self.norm('LayerNorm_1')(x))


class MlpMixer(Precision):
  """MLP-Mixer; the fields are the registry's config fields (the original's names).

  Attributes:
    num_classes: head width; 0 or None leaves the head out (the mean-pooled features).
    patches: {'size': (ph, pw)}.
    num_blocks, hidden_dim, tokens_mlp_dim, channels_mlp_dim: depth, C, and the two MLP widths.
    head_bias_init: constant initial bias of the head.
    dtype: compute dtype; 16-bit dtypes take the mixed-precision path of `precision.py` (16-bit
      matmul operands, float32 sums, norms and residuals); parameters stay in `param_dtype`.
    precision_policy: 'matmul' or 'activations' (activations and residuals in `dtype` too), as
      `VisionTransformer`'s.
  """

  num_classes: int | None
  patches: Mapping[str, Any]
  num_blocks: int
  hidden_dim: int
  tokens_mlp_dim: int
  channels_mlp_dim: int
  head_bias_init: float = 0.0

  @nn.compact
  def __call__(self, inputs: jnp.ndarray, *, train: bool) -> jnp.ndarray:
    """Maps NHWC images in [-1, 1] to logits (float32), or to features without a head."""
    del train  # nothing differs between training and inference
    patch = tuple(self.patches['size'])
    x = nn.Conv(
      self.hidden_dim,
      patch,
      strides=patch,
      padding='SAME',  # flax's default, as the original; no padding when the patch divides
      dtype=elementwise_dtype(self.dtype),
      param_dtype=self.param_dtype,
      name='stem',
    )(inputs.astype(elementwise_dtype(self.dtype)))
    x = x.astype(self.activation_dtype())
    n, h, w, c = x.shape
    x = jnp.reshape(x, (n, h * w, c))
    for i in range(self.num_blocks):
      x = MixerBlock(
        self.tokens_mlp_dim,
        self.channels_mlp_dim,
        **self.precision_fields(),
        name=f'MixerBlock_{i}',
      )(x)
    x = self.norm('pre_head_layer_norm')(x)
    x = jnp.mean(x, axis=1)
    if self.num_classes:
      x = nn.Dense(
        self.num_classes,
        **matmul_kwargs(self.dtype, self.param_dtype),
        kernel_init=nn.initializers.zeros,
        bias_init=nn.initializers.constant(self.head_bias_init),
        name='head',
      )(x)
    return x.astype(jnp.float32)

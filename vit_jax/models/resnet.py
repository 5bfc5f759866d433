"""The ResNet stem of the hybrid ViTs: weight-standardised convs and GroupNorm.

Module names equal the released checkpoints' (`conv_root`, `gn_root`,
`block{s}/unit{u}/{conv,gn}{1,2,3,_proj}`), so a released file loads by name.
"""

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

Dtype = Any


def weight_standardize(w: jnp.ndarray, axis: Sequence[int], eps: float) -> jnp.ndarray:
  """Subtracts the mean and divides by the standard deviation over `axis`."""
  w = w - jnp.mean(w, axis=axis)
  return w / (jnp.std(w, axis=axis) + eps)


class StdConv(nn.Module):
  """A bias-free convolution (NHWC, 'SAME' padding, parameter `kernel` (kh, kw, in, out)),
  its kernel weight-standardised before every use.

  Written on `lax.conv_general_dilated` rather than as an `nn.Conv` whose `param` standardises:
  jax2onnx replaces `nn.Conv.__call__` with one that reads the raw kernel, so that override
  would be lost from the ONNX export (vit_jax/export/onnx.py).
  """

  features: int
  kernel_size: tuple[int, int]
  strides: tuple[int, int] = (1, 1)
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    shape = (*self.kernel_size, x.shape[-1], self.features)
    kernel = self.param('kernel', nn.initializers.lecun_normal(), shape, self.param_dtype)
    kernel = weight_standardize(kernel, axis=[0, 1, 2], eps=1e-5)
    x, kernel = jnp.asarray(x, self.dtype), jnp.asarray(kernel, self.dtype)
    return jax.lax.conv_general_dilated(
      x, kernel, self.strides, 'SAME', dimension_numbers=('NHWC', 'HWIO', 'NHWC')
    )


class ResidualUnit(nn.Module):
  """A bottleneck unit; the stride sits on the 3x3 conv as in BiT."""

  features: int
  strides: tuple[int, int] = (1, 1)
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    conv = lambda f, k, s, name: StdConv(
      features=f,
      kernel_size=k,
      strides=s,
      name=name,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
    )
    norm = lambda name, **kw: nn.GroupNorm(
      name=name, dtype=self.dtype, param_dtype=self.param_dtype, **kw
    )

    residual = x
    if x.shape[-1] != self.features * 4 or tuple(self.strides) != (1, 1):
      residual = conv(self.features * 4, (1, 1), self.strides, 'conv_proj')(residual)
      residual = norm('gn_proj')(residual)

    y = nn.relu(norm('gn1')(conv(self.features, (1, 1), (1, 1), 'conv1')(x)))
    y = nn.relu(norm('gn2')(conv(self.features, (3, 3), self.strides, 'conv2')(y)))
    y = conv(self.features * 4, (1, 1), (1, 1), 'conv3')(y)
    # Zero-initialised last norm: each unit starts as the identity.
    y = norm('gn3', scale_init=nn.initializers.zeros)(y)
    return nn.relu(residual + y)


class ResNetStage(nn.Module):
  """`block_size` residual units; only the first one strides."""

  block_size: int
  nout: int
  first_stride: tuple[int, int]
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    for i in range(self.block_size):
      x = ResidualUnit(
        self.nout,
        strides=self.first_stride if i == 0 else (1, 1),
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        name=f'unit{i + 1}',
      )(x)
    return x


def resnet_stem(
  x: jnp.ndarray, num_layers: Sequence[int], width_factor: float, dtype: Dtype, param_dtype: Dtype
) -> jnp.ndarray:
  """Root conv, GroupNorm, max-pool (/4), then the stages (/2 each after the first).

  A function, not a Module: called inside the ViT's compact `__call__`, its layers
  land at the top level of the tree (`conv_root`, `block1`, ...) as in the released files.
  """
  width = int(64 * width_factor)
  x = StdConv(
    features=width,
    kernel_size=(7, 7),
    strides=(2, 2),
    dtype=dtype,
    param_dtype=param_dtype,
    name='conv_root',
  )(x)
  x = nn.GroupNorm(dtype=dtype, param_dtype=param_dtype, name='gn_root')(x)
  x = nn.relu(x)
  x = nn.max_pool(x, window_shape=(3, 3), strides=(2, 2), padding='SAME')
  for i, block_size in enumerate(num_layers):
    x = ResNetStage(
      block_size=block_size,
      nout=width * 2**i,
      first_stride=(1, 1) if i == 0 else (2, 2),
      dtype=dtype,
      param_dtype=param_dtype,
      name=f'block{i + 1}',
    )(x)
  return x

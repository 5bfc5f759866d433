"""mixup (Zhang et al., 2018) and CutMix (Yun et al., 2019) of a global batch, in the step.

Every example is mixed with its predecessor in the global batch (`roll` by one, as
big_vision's `get_mixup`), with one draw per batch from a key of the step number, so a
resumed run and any number of devices mix alike:

  mixup   a ~ Beta(p, p), a = max(a, 1 - a) (big_vision): x = a x + (1 - a) x_prev.
  CutMix  lam ~ Beta(alpha, alpha); a box of sides H sqrt(1 - lam), W sqrt(1 - lam) around a
          uniform centre, clipped to the image (timm), is pasted from x_prev; the label
          weight is the area left, 1 - box / (H W).
  both    CutMix or mixup with probability 1/2 each (timm's `switch_prob`).

Both are a per-pixel weight m (a constant for mixup, 0 in the box for CutMix): images
m x + (1 - m) x_prev, targets mean(m) y + (1 - mean(m)) y_prev (one-hot y).
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp

# fold_in data of the mixing key: example ids (the dropout keys) are int32, below 2^31.
KEY_DATA = 2**32 - 1

Mix = Callable[[jax.Array, jax.Array, jax.Array, str | None], tuple[jax.Array, jax.Array]]


def mixup_weights(key: jax.Array, p: float, height: int, width: int) -> jax.Array:
  """(H, W) constant max(a, 1 - a), a ~ Beta(p, p)."""
  a = jax.random.beta(key, p, p)
  return jnp.full((height, width), jnp.maximum(a, 1.0 - a), jnp.float32)


def cutmix_weights(key: jax.Array, alpha: float, height: int, width: int) -> jax.Array:
  """(H, W) ones with a zero box of area (1 - lam) H W (before clipping), lam ~ Beta."""
  k_lam, k_y, k_x = jax.random.split(key, 3)
  cut = jnp.sqrt(1.0 - jax.random.beta(k_lam, alpha, alpha))
  half_h = (height * cut).astype(jnp.int32) // 2
  half_w = (width * cut).astype(jnp.int32) // 2
  cy = jax.random.randint(k_y, (), 0, height)
  cx = jax.random.randint(k_x, (), 0, width)
  rows = jnp.arange(height)[:, None]
  cols = jnp.arange(width)[None, :]
  inside_y = (rows >= jnp.clip(cy - half_h, 0, height)) & (rows < jnp.clip(cy + half_h, 0, height))
  inside_x = (cols >= jnp.clip(cx - half_w, 0, width)) & (cols < jnp.clip(cx + half_w, 0, width))
  return jnp.where(inside_y & inside_x, 0.0, 1.0).astype(jnp.float32)


def previous(x: jax.Array, axis: str | None = None) -> jax.Array:
  """`roll(x, 1, axis=0)` of the global batch; inside `shard_map` over `axis` this device's
  rows, the first taking the previous device's last row."""
  if axis is None:
    return jnp.roll(x, 1, axis=0)
  n = jax.lax.axis_size(axis)
  last = jax.lax.ppermute(x[-1:], axis, [(i, (i + 1) % n) for i in range(n)])
  return jnp.concatenate([last, x[:-1]], axis=0)


def make_mix(mixup: float, cutmix: float, num_classes: int) -> Mix | None:
  """mix(images, labels, key, axis) -> (mixed images, soft targets (B, K)); None when both
  concentrations are 0."""
  if not (mixup or cutmix):
    return None

  def weights(key, height, width):
    k_switch, k_mix, k_cut = jax.random.split(key, 3)
    if not cutmix:
      return mixup_weights(k_mix, mixup, height, width)
    if not mixup:
      return cutmix_weights(k_cut, cutmix, height, width)
    return jnp.where(
      jax.random.bernoulli(k_switch),
      cutmix_weights(k_cut, cutmix, height, width),
      mixup_weights(k_mix, mixup, height, width),
    )

  def mix(images, labels, key, axis=None):
    m = weights(key, images.shape[1], images.shape[2])
    images = m[None, :, :, None] * images + (1.0 - m[None, :, :, None]) * previous(images, axis)
    targets = jax.nn.one_hot(labels, num_classes)
    lam = jnp.mean(m)
    return images.astype(jnp.float32), lam * targets + (1.0 - lam) * previous(targets, axis)

  return mix

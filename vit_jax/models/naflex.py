"""NaFlex ViT (SigLIP 2's native-aspect image tower): NaViT's patch sequences with FlexiViT's
resizable position embedding, as big_vision's `models/proj/image_text/naflex_vit.py`.

An image comes as a sequence of `max_len` patch slots (vit_jax/data/naflex.py): `patches`
(B, N, p * p * 3, pixels in [-1, 1], (row, column, channel) order), `ptype` (B, N; 1 a patch,
0 padding), `yidx`, `xidx` (B, N; each patch's row and column in its image's grid). So images
of any aspect ratio and size batch together without distortion. The input pipeline packs the
four into one float32 array (B, N, p * p * 3 + 3): the patch, then its ptype, yidx and xidx,
so a batch stays one array per key (`inputs` unpacks it; the tower takes it as its one input).

Packed rows (NaViT's Patch n' Pack, `images_per_row=K`): a row holds up to K images, `ptype`
each token's segment (0 padding, k the image in slot k of its row), `yidx`, `xidx` its place
in its own image's grid; each token attends only to its own image's tokens, each image's
position embedding is resized to its own extents (the grid resized once per slot, as one image
a row resizes it once per row), and each slot pools its own image: (B, K, D). One image a row
as slot 1 of 1 gives the unpacked output bit for bit (float32).

  embedding      a Dense over the flattened patch (kernel (p * p * 3, D))
  pos_embedding  a learned (G, G, D) grid (G = `posemb_grid`, 16), resized per image to its
                 own patch grid (antialiased bilinear, `jax.image.scale_and_translate` onto a
                 static `posemb_canvas` x `posemb_canvas` canvas, 64: at most 64 patches a
                 side) and taken at each patch's (row, column)
  Transformer    this project's ViT encoder, padding masked in every attention layer
  MAPHead_0      attention pooling over the patches alone (or 'gap': their mean)
  head           of width `num_classes`: a NaFlex classifier's (SigLIP 2's image tower has
                 none, or its `out_dim[0]`)

The parameter names are big_vision's, so its files (`siglip2_*_naflex.npz`) read by name.
"""

from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.models import precision
from vit_jax.models.vit import Encoder, map_head

CLASSIFIERS = ('map', 'gap')


def is_naflex(config: Mapping[str, Any]) -> bool:
  """A `NaFlexViT`'s fields (a `patch_size` and a `posemb_grid`, where a ViT has `patches`)."""
  return 'patch_size' in config and 'posemb_grid' in config


def inputs(images: jnp.ndarray | Mapping[str, jnp.ndarray]) -> dict[str, jnp.ndarray]:
  """The tower's call's arrays, from their dict or from one packed array (B, N, P + 3): each
  slot's P patch values, then its ptype, yidx and xidx (small integers, exact in float32)."""
  if isinstance(images, Mapping):
    return dict(images)
  index = jnp.asarray(images[..., -3:]).astype(jnp.int32)
  return {'patches': images[..., :-3], 'ptype': index[..., 0], 'yidx': index[..., 1],
          'xidx': index[..., 2]}  # fmt: skip


def _resized_grid(grid: jnp.ndarray, rows: jnp.ndarray, cols: jnp.ndarray, canvas: int):
  """The (G, G, D) grid resized to (rows, cols) patches, on a (canvas, canvas, D) canvas."""
  size = jnp.stack([rows, cols]).astype(jnp.float32)
  return jax.image.scale_and_translate(
    grid,
    shape=(canvas, canvas, grid.shape[-1]),
    spatial_dims=(0, 1),
    scale=size / jnp.asarray(grid.shape[:2], jnp.float32),
    translation=jnp.zeros(2, jnp.float32),
    method='bilinear',
    antialias=True,
  )


def resized_posemb(
  grid: jnp.ndarray, rows: jnp.ndarray, cols: jnp.ndarray, yidx, xidx, canvas: int
) -> jnp.ndarray:
  """The (G, G, D) grid resized to each image's (rows, cols) patches, at its patches' (y, x):
  (B, N, D)."""

  def one(r, c, y, x):
    return _resized_grid(grid, r, c, canvas)[y, x]

  return jax.vmap(one)(rows, cols, yidx, xidx)


def segment_posemb(
  grid: jnp.ndarray, rows: jnp.ndarray, cols: jnp.ndarray, segment, yidx, xidx, canvas: int
) -> jnp.ndarray:
  """Packed rows: the grid resized to each slot's image, (rows, cols) of (B, K) patches (at
  least 1), taken at each token's (y, x) in its own image (`segment` k: slot k; padding
  reads slot 1's): (B, N, D)."""

  def row(r, c, s, y, x):
    grids = jax.vmap(lambda r, c: _resized_grid(grid, r, c, canvas))(r, c)
    return grids[jnp.maximum(s - 1, 0), y, x]

  return jax.vmap(row)(rows, cols, segment, yidx, xidx)


def slot_masks(segment: jnp.ndarray, images_per_row: int) -> jnp.ndarray:
  """(B, N) segment ids -> (B, K, N) bool: which tokens are slot k's image (ids 1..K)."""
  slots = jnp.arange(1, images_per_row + 1, dtype=segment.dtype)
  return segment[:, None, :] == slots[None, :, None]


def segment_attention_mask(segment: jnp.ndarray) -> jnp.ndarray:
  """(B, N) segment ids -> (B, N, N) bool: a query attends to the keys of its own segment,
  never to padding (id 0); block-diagonal over a row's images."""
  return (segment[:, :, None] == segment[:, None, :]) & (segment[:, None, :] > 0)


class NaFlexViT(precision.Precision):
  """The NaFlex image tower; the fields as the registry's (see the module docstring).

  Attributes:
    num_classes: head width; 0 or None: none (the pooled features are the output).
    patch_size: the side of a patch (its inputs come flattened: p * p * 3 values).
    hidden_size: D.
    transformer: {'num_layers', 'mlp_dim', 'num_heads', 'dropout_rate',
      'attention_dropout_rate'}.
    classifier: 'map' (big_vision's attention pooling) or 'gap', over the patches alone.
    posemb_grid: G, the learned position embedding's side.
    posemb_canvas: the most patches a side (the resize's static canvas).
  """

  num_classes: int | None
  patch_size: int
  hidden_size: int
  transformer: Mapping[str, Any]
  classifier: str = 'map'
  posemb_grid: int = 16
  posemb_canvas: int = 64
  head_zeroinit: bool = True
  attention_impl: str = 'xla'
  remat_policy: str = 'none'
  scan_layers: bool = False
  gelu_approximate: bool = True
  layer_norm_epsilon: float = precision.LAYER_NORM_EPSILON

  @nn.compact
  def __call__(
    self,
    patches,
    ptype=None,
    yidx=None,
    xidx=None,
    *,
    train: bool = False,
    images_per_row: int = 0,
  ) -> jnp.ndarray:
    """(B, N, p * p * 3) patches with their type and grid positions -> logits, or the pooled
    features without a head (float32). `patches` alone: the packed sequences (B, N,
    p * p * 3 + 3) of the input pipeline (`inputs`), as a classifier's batch holds them.

    `images_per_row=K` > 0: packed rows of up to K images each, `ptype` the segment id of
    each token (0 padding, k the image in slot k) and `yidx`, `xidx` its place in its own
    image's grid: each token attends only to its own image's tokens, the position grid is
    resized to each image, and each slot pools its own image -> (B, K, classes) or (B, K, D).
    An empty slot's output is finite (the caller masks it out)."""
    if ptype is None:
      unpacked = inputs(patches)
      patches, ptype, yidx, xidx = (unpacked[k] for k in ('patches', 'ptype', 'yidx', 'xidx'))
    if self.classifier not in CLASSIFIERS:
      raise ValueError(f'classifier={self.classifier!r}; NaFlex pools with one of {CLASSIFIERS}')
    if images_per_row < 0:
      raise ValueError(f'images_per_row={images_per_row}; give 0 (one image a row) or K > 0')
    dense = self.dense_layers(nn.Dense)
    x = dense(self.hidden_size, name='embedding')(jnp.asarray(patches, self.activation_dtype()))
    x = x + self._posemb(ptype, yidx, xidx, images_per_row).astype(x.dtype)
    if images_per_row:
      attention_mask, pool_mask = segment_attention_mask(ptype), slot_masks(ptype, images_per_row)
    else:
      attention_mask = pool_mask = ptype == 1
    encoded, _ = Encoder(
      **self.transformer,
      attention_impl=self.attention_impl,
      remat_policy=self.remat_policy,
      scan_layers=self.scan_layers,
      learned_posemb=False,
      gelu_approximate=self.gelu_approximate,
      layer_norm_epsilon=self.layer_norm_epsilon,
      **self.precision_fields(),
      name='Transformer',
    )(x, train=train, mask=attention_mask)
    x = self._pool(encoded, pool_mask)
    if self.num_classes:
      init = nn.initializers.zeros if self.head_zeroinit else nn.initializers.lecun_normal()
      x = nn.Dense(
        self.num_classes,
        **precision.matmul_kwargs(self.dtype, self.param_dtype),
        kernel_init=init,
        name='head',
      )(x)
    return x.astype(jnp.float32)

  def _posemb(self, ptype, yidx, xidx, images_per_row: int) -> jnp.ndarray:
    """The learned grid resized to each image's extents, at each patch: (B, N, D)."""
    grid = self.param(
      'pos_embedding',
      nn.initializers.normal(stddev=1 / np.sqrt(self.hidden_size)),
      (self.posemb_grid, self.posemb_grid, self.hidden_size),
      self.param_dtype,
    )
    if not images_per_row:
      rows, cols = jnp.max(yidx, axis=1) + 1, jnp.max(xidx, axis=1) + 1
      return resized_posemb(grid, rows, cols, yidx, xidx, self.posemb_canvas)
    slots = slot_masks(ptype, images_per_row)
    # Each slot's extents (an empty slot's 1 x 1: its grid is resized, never read).
    rows, cols = (jnp.max(jnp.where(slots, i[:, None], 0), axis=2) + 1 for i in (yidx, xidx))
    return segment_posemb(grid, rows, cols, ptype, yidx, xidx, self.posemb_canvas)

  def _pool(self, x: jnp.ndarray, mask: jnp.ndarray) -> jnp.ndarray:
    """Each image's tokens -> its pooled features: `mask` (B, N), the image's tokens of each
    row -> (B, D); (B, K, N), slot k's tokens -> (B, K, D) (an empty slot's finite)."""
    if self.classifier == 'gap':
      weights = mask[..., None].astype(x.dtype)
      if mask.ndim == 3:  # each slot's mean; an empty slot's is 0
        return jnp.sum(x[:, None] * weights, axis=2) / jnp.maximum(jnp.sum(weights, axis=2), 1)
      return jnp.sum(x * weights, axis=1) / jnp.sum(weights, axis=1)
    return map_head(self)(x, mask)

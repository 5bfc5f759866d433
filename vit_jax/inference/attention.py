"""Inside a model: what its patch and position embeddings learnt, and where it attends (the
paper's Figure 7 left, center and right, and Figure 6).

  pcs = patch_filter_pcs(kernel)                 # the patch-embedding filters' components
  similarity = posemb_similarity(posemb, grid)   # each position embedding against the others
  weights = attention_weights(model, images)     # per layer, (batch, heads, T, T)
  mean_attention_distance(weights[i], grid, patch_pixels), rollout(weights)

The computations are pure numpy functions, so they can be checked on hand-built inputs.
"""

import functools
from collections.abc import Sequence

import jax
import numpy as np

from vit_jax.inference.model import Model, run_padded

NUM_FILTER_PCS = 28  # as in the paper's Figure 7 (left)


def patch_filter_pcs(kernel: np.ndarray, num_components: int = NUM_FILTER_PCS) -> np.ndarray:
  """Principal components of the patch-embedding filters, as (n, ph, pw, channels) images.

  `kernel` is the conv kernel in HWIO layout (ph, pw, channels, D): D filters, each a
  (ph, pw, channels) patch. The filters are centred and the leading right singular
  vectors returned, largest variance first; each sign is fixed so that the component's
  largest-magnitude entry is positive.
  """
  kernel = np.asarray(kernel, np.float64)
  if kernel.ndim != 4:
    raise ValueError(f'expected an HWIO conv kernel (ph, pw, channels, D), got {kernel.shape}')
  ph, pw, c, d = kernel.shape
  filters = kernel.reshape(ph * pw * c, d).T  # (D, ph*pw*c)
  filters = filters - filters.mean(axis=0)
  _, _, vt = np.linalg.svd(filters, full_matrices=False)
  n = min(num_components, vt.shape[0])
  pcs = vt[:n]
  signs = np.sign(pcs[np.arange(n), np.argmax(np.abs(pcs), axis=1)])
  return (pcs * signs[:, None]).reshape(n, ph, pw, c)


def _grid_tokens(tokens: int, grid: tuple[int, int], what: str) -> int:
  """How many leading non-patch tokens (a class token) precede the grid: 0 or 1."""
  patches = grid[0] * grid[1]
  if tokens not in (patches, patches + 1):
    raise ValueError(
      f'{what} has {tokens} tokens; a {grid[0]}x{grid[1]} grid needs {patches} '
      f'(or {patches + 1} with a class token).'
    )
  return tokens - patches


def posemb_similarity(posemb: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
  """Cosine similarity of every patch's position embedding with every other one.

  `posemb` is (tokens, D) or (1, tokens, D); a leading class-token row is dropped.
  Returns (rows, cols, rows, cols): [i, j] is the map of patch (i, j) against the grid.
  """
  posemb = np.asarray(posemb, np.float64)
  posemb = posemb.reshape(posemb.shape[-2], posemb.shape[-1])
  skip = _grid_tokens(posemb.shape[0], grid, 'the position embedding')
  pe = posemb[skip:]
  pe = pe / np.maximum(np.linalg.norm(pe, axis=-1, keepdims=True), 1e-12)
  return (pe @ pe.T).reshape(*grid, *grid)


def patch_distances(grid: tuple[int, int], patch_size: float) -> np.ndarray:
  """(T, T) Euclidean distances in pixels between the centres of the grid's patches."""
  rows, cols = np.meshgrid(np.arange(grid[0]), np.arange(grid[1]), indexing='ij')
  centres = np.stack([rows.ravel(), cols.ravel()], axis=-1) * float(patch_size)
  return np.linalg.norm(centres[:, None] - centres[None], axis=-1)


def mean_attention_distance(
  attn: np.ndarray, grid: tuple[int, int], patch_size: float
) -> np.ndarray:
  """Mean attention distance in pixels of each head: the paper's Figure 7 (right).

  For every query patch, the distance to every key patch weighted by the attention, then
  averaged over query patches (and over leading batch axes). `attn` is (..., heads, q, k)
  softmax weights; a class token (if q = k = rows*cols + 1) is left out as query and as
  key, and each query's weights over the patches are renormalised to sum to one, so the
  result is the expected distance to the patches it attends to. Returns (heads,).
  """
  attn = np.asarray(attn, np.float64)
  if attn.ndim < 3 or attn.shape[-1] != attn.shape[-2]:
    raise ValueError(f'expected attention weights (..., heads, q, k), got {attn.shape}')
  skip = _grid_tokens(attn.shape[-1], grid, 'the attention')
  weights = attn[..., skip:, skip:]
  weights = weights / weights.sum(axis=-1, keepdims=True)
  per_query = np.einsum('...qk,qk->...q', weights, patch_distances(grid, patch_size))
  per_head = per_query.mean(axis=-1)
  return per_head.reshape(-1, per_head.shape[-1]).mean(axis=0)


def rollout(attn_list: Sequence[np.ndarray]) -> np.ndarray:
  """Attention rollout (Abnar & Zuidema, 2020) through all layers.

  Each layer's weights (..., heads, T, T) are averaged over heads, the identity is added
  for the residual connection, rows are renormalised, and the layers are multiplied in
  order: R = A_L ... A_2 A_1. Returns (..., T, T); row t is how much each input token
  flows into output token t.
  """
  joint = None
  for attn in attn_list:
    a = np.asarray(attn, np.float64).mean(axis=-3)
    a = a + np.eye(a.shape[-1])
    a = a / a.sum(axis=-1, keepdims=True)
    joint = a if joint is None else a @ joint
  if joint is None:
    raise ValueError('rollout needs the attention weights of at least one layer')
  return joint


def rollout_map(joint: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
  """The rollout as a (rows, cols) map in [0, 1]: the class token's row, or for models
  without one the mean over all output tokens; scaled by its maximum."""
  skip = _grid_tokens(joint.shape[-1], grid, 'the rollout')
  relevance = joint[0, skip:] if skip else joint.mean(axis=0)
  relevance = relevance.reshape(grid)
  return relevance / max(float(relevance.max()), 1e-12)


@functools.partial(jax.jit, static_argnums=0)
def _sown_attention(model, params, images):
  _, state = model.apply({'params': params}, images, train=False, mutable=['intermediates'])
  if 'intermediates' not in state:
    raise RuntimeError(
      'the model sowed no attention weights: MultiHeadDotProductAttention must '
      "`self.sow('intermediates', 'attention_weights', weights)` (attention_impl='xla')"
    )
  return state['intermediates']['Transformer']


def attention_weights(
  model: Model, images: np.ndarray, batch_size: int | None = None
) -> list[np.ndarray]:
  """Per layer, in depth order, the softmax weights (batch, heads, T, T) on `images`.

  They are the weights the model sows into 'intermediates' (`attention_impl='xla'`); a
  `batch_size` pads the batch to that size so that every batch reuses one compilation.
  """
  sown = run_padded(
    lambda x: _sown_attention(model.module, model.params, x),
    model.inputs(images),
    batch_size or len(images),
  )
  layers = sorted(sown, key=lambda name: int(name.rsplit('_', 1)[-1]))
  return [sown[name]['MultiHeadDotProductAttention_0']['attention_weights'][0] for name in layers]

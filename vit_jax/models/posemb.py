"""Position embeddings: big_vision's fixed 2-D sin-cos, the learned `AddPositionEmbs`, and the
corner-aligned resize that moves a learned grid to another resolution."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.models.precision import Dtype


def posemb_sincos_2d(
  h: int, w: int, width: int, temperature: float = 10_000.0, dtype: Dtype = jnp.float32
) -> jnp.ndarray:
  """big_vision's fixed 2-D position embedding (1, h*w, width) for a row-major token grid.

  Per token at (row y, column x): [sin(x w), cos(x w), sin(y w), cos(y w)] with frequencies
  w_i = temperature^(-i / (width/4 - 1)), i < width/4 (MoCo v3's layout); computed in float32.
  """
  if width % 4 or width < 8:
    raise ValueError(f'sincos2d position embeddings need a width divisible by 4, >= 8: {width}')
  y, x = jnp.mgrid[:h, :w]
  quarter = width // 4
  omega = 1.0 / temperature ** (jnp.arange(quarter, dtype=jnp.float32) / (quarter - 1))
  y = jnp.einsum('m,d->md', y.reshape(-1).astype(jnp.float32), omega)
  x = jnp.einsum('m,d->md', x.reshape(-1).astype(jnp.float32), omega)
  pe = jnp.concatenate([jnp.sin(x), jnp.cos(x), jnp.sin(y), jnp.cos(y)], axis=1)
  return pe[None].astype(dtype)


def corner_aligned_resize_matrix(size_in: int, size_out: int) -> np.ndarray:
  """(size_out, size_in) matrix of 1-D linear resizing with the end points aligned.

  Output `i` samples input position `i * (size_in - 1) / (size_out - 1)`: the resize of
  `scipy.ndimage.zoom(order=1)` (`grid_mode=False`), with which the original vit_jax resizes
  position embeddings when it loads a checkpoint at another resolution.
  """
  matrix = np.zeros((size_out, size_in))
  steps = np.arange(size_out, dtype=np.float64)
  src = steps * (size_in - 1) / (size_out - 1) if size_out > 1 else steps
  lo = np.minimum(np.floor(src).astype(int), size_in - 1)
  hi = np.minimum(lo + 1, size_in - 1)
  np.add.at(matrix, (np.arange(size_out), lo), 1.0 - (src - lo))
  np.add.at(matrix, (np.arange(size_out), hi), src - lo)
  return matrix


def resize_posemb_grid(
  posemb: jnp.ndarray, old_grid: tuple[int, int], new_grid: tuple[int, int], num_prefix: int
) -> jnp.ndarray:
  """(1, prefix + old rows*cols, D) -> (1, prefix + new rows*cols, D), prefix rows kept.

  The grid is resized as `checkpoint.resize_posemb` (`scipy.ndimage.zoom(order=1)`) does, but
  as two small matmuls in float32 at full precision, so it runs under `jax.jit` on any backend.
  """
  (gh, gw), (nh, nw) = old_grid, new_grid
  prefix, grid = posemb[:, :num_prefix], posemb[:, num_prefix:].astype(jnp.float32)
  grid = grid.reshape(1, gh, gw, grid.shape[-1])
  rows = jnp.asarray(corner_aligned_resize_matrix(gh, nh), jnp.float32)
  cols = jnp.asarray(corner_aligned_resize_matrix(gw, nw), jnp.float32)
  grid = jnp.einsum('oh,bhwd,pw->bopd', rows, grid, cols, precision=jax.lax.Precision.HIGHEST)
  grid = grid.reshape(1, nh * nw, grid.shape[-1]).astype(posemb.dtype)
  return jnp.concatenate([prefix, grid], axis=1)


class AddPositionEmbs(nn.Module):
  """Adds a learned position embedding of shape (1, tokens, D) to the inputs.

  By default the embedding has one row per input token (another input size is an error).
  With `posemb_grid=(rows, cols)` it is stored for that patch grid and resized on the fly to
  the input's `grid` (`resize_posemb_grid`); the leading prefix (class) rows are kept.
  """

  param_dtype: Dtype = jnp.float32
  posemb_grid: tuple[int, int] | None = None

  @nn.compact
  def __call__(self, x: jnp.ndarray, grid: tuple[int, int] | None = None) -> jnp.ndarray:
    init = nn.initializers.normal(stddev=0.02)
    if self.posemb_grid is None:
      pe = self.param('pos_embedding', init, (1, x.shape[1], x.shape[2]), self.param_dtype)
      return x + pe.astype(x.dtype)
    if grid is None:
      raise ValueError('posemb_grid is set: pass the input token grid (rows, cols)')
    stored, grid = tuple(self.posemb_grid), tuple(grid)
    num_prefix = x.shape[1] - grid[0] * grid[1]
    shape = (1, num_prefix + stored[0] * stored[1], x.shape[2])
    pe = self.param('pos_embedding', init, shape, self.param_dtype)
    if grid != stored:
      pe = resize_posemb_grid(pe, stored, grid, num_prefix)
    return x + pe.astype(x.dtype)

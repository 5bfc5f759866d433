"""Looks inside a checkpoint: the paper's Figure 7 (left, center, right) and Figure 6.

  python -m vit_jax.visualize --checkpoint PATH [--model NAME] [--resolution R] \
      [--image IMG ...] --out DIR

writes PNGs to DIR:
  patch_filters.png       the first 28 principal components of the patch-embedding filters
  posemb_similarity.png   cosine similarity of each patch's position embedding with all others
  attention_distance.png  mean attention distance of every head against depth (needs --image)
  attention_rollout_<image>.png  attention rollout (Abnar & Zuidema 2020) over each --image

The computations are pure numpy functions (`patch_filter_pcs`, `posemb_similarity`,
`mean_attention_distance`, `rollout`) so they can be checked on hand-built inputs.
"""

import functools
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import jax
import matplotlib
import numpy as np
from absl import app, flags, logging
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from vit_jax import cli, data, files
from vit_jax.cli import predict

DPI = 100
# Pixel size (width, height) of every PNG.
SIZES = {
  'patch_filters': (1000, 640),
  'posemb_similarity': (900, 800),
  'attention_distance': (900, 600),
  'attention_rollout': (1200, 440),
}
NUM_FILTER_PCS = 28  # as in the paper's Figure 7 (left)


# ---------------------------------------------------------------------------------------
# The computations.


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


# ---------------------------------------------------------------------------------------
# The model side.


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
  loaded: predict.LoadedModel, images: np.ndarray, batch_size: int | None = None
) -> list[np.ndarray]:
  """Per layer, in depth order, the softmax weights (batch, heads, T, T) on `images`.

  They are the weights the model sows into 'intermediates' (`attention_impl='xla'`); a
  `batch_size` pads the batch to that size so that every batch reuses one compilation.
  """
  sown = predict.run_padded(
    _sown_attention, loaded.model, loaded.params, images, batch_size or len(images)
  )
  layers = sorted(sown, key=lambda name: int(name.rsplit('_', 1)[-1]))
  return [sown[name]['MultiHeadDotProductAttention_0']['attention_weights'][0] for name in layers]


# ---------------------------------------------------------------------------------------
# Drawing. Every figure is a fixed pixel size (SIZES), written atomically.


def _figure(kind: str) -> Figure:
  w, h = SIZES[kind]
  return Figure(figsize=(w / DPI, h / DPI), dpi=DPI)


def _save(fig: Figure, path: Path) -> Path:
  files.atomic_write(path, lambda f: fig.savefig(f, format='png', dpi=DPI))
  return path


def _mosaic(tiles: np.ndarray, cols: int, pad: int, fill: float) -> np.ndarray:
  """(n, h, w, ...) tiles -> one image, `cols` tiles a row, `pad` pixels of `fill` between."""
  n, h, w = tiles.shape[:3]
  rows = -(-n // cols)
  out = np.full((rows * (h + pad) - pad, cols * (w + pad) - pad, *tiles.shape[3:]), fill)
  for i, tile in enumerate(tiles):
    r, c = divmod(i, cols)
    out[r * (h + pad) : r * (h + pad) + h, c * (w + pad) : c * (w + pad) + w] = tile
  return out


def _tile_ticks(ax, n_rows: int, n_cols: int, h: int, w: int, pad: int) -> None:
  """Ticks at the tile centres, numbered from 1 (at most ~12 labels per axis)."""
  for n, size, set_ticks, set_labels in (
    (n_cols, w, ax.set_xticks, ax.set_xticklabels),
    (n_rows, h, ax.set_yticks, ax.set_yticklabels),
  ):
    step = max(1, -(-n // 12))
    idx = np.arange(0, n, step)
    set_ticks(idx * (size + pad) + (size - 1) / 2)
    set_labels([str(i + 1) for i in idx])


def draw_patch_filters(pcs: np.ndarray, path: Path, title: str) -> Path:
  """Figure 7 (left): each principal component shown as an RGB tile, min-max scaled."""
  n, h = pcs.shape[:2]
  lo = pcs.min(axis=(1, 2, 3), keepdims=True)
  hi = pcs.max(axis=(1, 2, 3), keepdims=True)
  tiles = (pcs - lo) / np.maximum(hi - lo, 1e-12)
  cols = 7
  pad = max(1, h // 8)
  fig = _figure('patch_filters')
  ax = fig.add_axes((0.06, 0.08, 0.9, 0.8))
  ax.imshow(_mosaic(tiles, cols, pad, 1.0), interpolation='nearest')
  ax.set_xticks([])
  ax.set_yticks([])
  ax.set_xlabel(f'principal components 1 to {n}, row by row (each min-max scaled to RGB)')
  ax.set_title(title)
  return _save(fig, path)


def draw_posemb_similarity(similarity: np.ndarray, path: Path, title: str) -> Path:
  """Figure 7 (center): one small map per patch of its similarity with every patch."""
  gh, gw = similarity.shape[:2]
  tiles = similarity.reshape(gh * gw, gh, gw)
  pad = 1
  fig = _figure('posemb_similarity')
  ax = fig.add_axes((0.08, 0.08, 0.74, 0.84))
  image = ax.imshow(
    _mosaic(tiles, gw, pad, np.nan), cmap='viridis', vmin=-1, vmax=1, interpolation='nearest'
  )
  _tile_ticks(ax, gh, gw, gh, gw, pad)
  ax.set_xlabel('Input patch column')
  ax.set_ylabel('Input patch row')
  fig.suptitle(title, wrap=True)  # wider than the square axes
  cax = fig.add_axes((0.85, 0.08, 0.03, 0.84))
  fig.colorbar(image, cax=cax, label='Cosine similarity')
  return _save(fig, path)


def draw_attention_distance(distances: np.ndarray, path: Path, title: str) -> Path:
  """Figure 7 (right): (layers, heads) mean attention distances, one dot per head."""
  layers, heads = distances.shape
  fig = _figure('attention_distance')
  ax = fig.add_axes((0.09, 0.1, 0.72, 0.8))
  cmap = matplotlib.colormaps['tab20' if heads <= 20 else 'viridis']
  colors = cmap(np.arange(heads) if heads <= 20 else np.linspace(0, 1, heads))
  for h in range(heads):
    ax.scatter(np.arange(layers), distances[:, h], s=18, color=colors[h], label=f'Head {h + 1}')
  ax.set_xlabel('Network depth (layer)')
  ax.set_ylabel('Mean attention distance (pixels)')
  ax.set_xlim(-0.5, layers - 0.5)
  ax.xaxis.set_major_locator(MaxNLocator(integer=True))
  ax.set_ylim(0, 1.05 * float(distances.max()) + 1e-9)
  ax.set_title(title)
  ax.legend(loc='upper left', bbox_to_anchor=(1.01, 1.0), fontsize='small', frameon=False)
  return _save(fig, path)


def draw_rollout(image: np.ndarray, mask: np.ndarray, path: Path, title: str) -> Path:
  """Figure 6: the input, the rollout map over it (colour bar), and the input times the map."""
  h, w = image.shape[:2]
  upsampled = np.clip(np.asarray(jax.image.resize(mask, (h, w), 'linear')), 0, 1)
  fig = _figure('attention_rollout')
  panels = [fig.add_axes((0.05 + 0.3 * i, 0.1, 0.24, 0.74)) for i in range(3)]
  panels[0].imshow(image)
  panels[0].set_title('Input')
  panels[1].imshow(image)
  heat = panels[1].imshow(upsampled, cmap='jet', alpha=0.5, vmin=0, vmax=1)
  panels[1].set_title('Rollout over the input')
  panels[2].imshow(image * upsampled[..., None])
  panels[2].set_title('Input weighted by the rollout')
  for ax in panels:
    ax.set_xlabel('x (pixels)')
  panels[0].set_ylabel('y (pixels)')
  cax = fig.add_axes((0.92, 0.1, 0.015, 0.74))
  fig.colorbar(heat, cax=cax, label='Attention (relative to max)')
  fig.suptitle(title)
  return _save(fig, path)


# ---------------------------------------------------------------------------------------
# The command line.


def _weight_figures(loaded: predict.LoadedModel, out: Path) -> list[Path]:
  """Figure 7 left and center: what the patch and position embeddings learnt."""
  name, written = loaded.model_name, []
  kernel = loaded.params['embedding']['kernel']
  if kernel.shape[2] == 3:
    pcs = patch_filter_pcs(kernel)
    written.append(
      draw_patch_filters(
        pcs,
        out / 'patch_filters.png',
        f'{name}: first {len(pcs)} principal components of the patch-embedding filters',
      )
    )
  else:
    print(
      f'note: {name} embeds {kernel.shape[2]}-channel ResNet features, not RGB pixels; '
      'patch_filters.png is not drawn.',
      file=sys.stderr,
    )
  posemb = loaded.params['Transformer']['posembed_input']['pos_embedding']
  written.append(
    draw_posemb_similarity(
      posemb_similarity(posemb, loaded.grid),
      out / 'posemb_similarity.png',
      f'{name}: position embedding similarity ({loaded.grid[0]}x{loaded.grid[1]} patches)',
    )
  )
  return written


def _attention_figures(
  loaded: predict.LoadedModel, out: Path, images: Sequence[str], batch_size: int, errors: list
) -> list[Path]:
  """Figure 6 for every readable image, and Figure 7 right averaged over them."""
  name, written = loaded.model_name, []
  batch_size = max(1, min(batch_size, len(images)))
  distances, weights, stems = [], [], set()
  for paths, batch in predict.batches(images, loaded.resolution, batch_size, errors):
    attn = attention_weights(loaded, batch, batch_size)
    distances.append([mean_attention_distance(a, loaded.grid, loaded.patch_pixels) for a in attn])
    weights.append(len(paths))
    joint = rollout(attn)
    for i, path in enumerate(paths):
      stem = Path(path).stem
      if stem in stems:
        stem = f'{stem}_{len(stems)}'
      stems.add(stem)
      written.append(
        draw_rollout(
          np.clip((batch[i] + 1) / 2, 0, 1),
          rollout_map(joint[i], loaded.grid),
          out / f'attention_rollout_{stem}.png',
          f'{name}: attention rollout, {Path(path).name}',
        )
      )
  if weights:
    count = sum(weights)
    written.append(
      draw_attention_distance(
        np.average(np.array(distances), axis=0, weights=weights),
        out / 'attention_distance.png',
        f'{name}: mean attention distance ({count} image{"s" * (count > 1)})',
      )
    )
  return written


def visualize(
  loaded: predict.LoadedModel,
  out_dir: str | os.PathLike,
  images: Sequence[str] = (),
  batch_size: int = 8,
) -> tuple[list[Path], list[str]]:
  """Draws every figure the checkpoint allows; returns the PNGs and one error per bad image."""
  out = files.path(out_dir)
  written, errors = _weight_figures(loaded, out), []
  if not images:
    print('note: no --image given; attention figures are not drawn.', file=sys.stderr)
    return written, errors
  written += _attention_figures(loaded, out, images, batch_size, errors)
  return written, errors


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """The command line's flags, on `flag_values` (defined at program start, not at import)."""
  fv = flag_values
  predict.define_checkpoint_flags(fv)
  flags.DEFINE_multi_string(
    'image',
    [],
    'Image for the attention figures; repeat for several (distances are averaged).',
    flag_values=fv,
  )
  flags.DEFINE_string('out', None, 'Directory for the PNGs.', required=True, flag_values=fv)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}; give images with --image.')
  f = flags.FLAGS
  if not f['verbosity'].present:  # orbax and JAX log at INFO on every restore
    logging.set_verbosity(logging.WARNING)
  data.hide_accelerators_from_tensorflow()
  try:
    loaded = predict.load(f.checkpoint, f.model, f.resolution)
  except (OSError, ValueError, KeyError) as e:
    print(f'error: {f.checkpoint}: {e}'.replace('\n', ' '), file=sys.stderr)
    sys.exit(2)
  written, errors = visualize(loaded, f.out, f.image)
  for path in written:
    print(f'wrote {path}')
  sys.exit(1 if errors else 0)


def run_cli() -> None:
  """The `vit-visualize` console script (and `python -m vit_jax.visualize`)."""
  cli.start(define_flags, main)

"""The pictures `vit-visualize` draws: Figure 7 (left, center, right) and Figure 6 of the
paper, each a PNG of a fixed pixel size (SIZES), written atomically.

  written, errors = figures.visualize(vit_jax.load(CKPT), OUT, images)
"""

import os
import sys
from collections.abc import Sequence
from pathlib import Path

import jax
import matplotlib
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from vit_jax import files
from vit_jax.inference.attention import (
  attention_weights,
  mean_attention_distance,
  patch_filter_pcs,
  posemb_similarity,
  rollout,
  rollout_map,
)
from vit_jax.inference.model import Model, image_batches

DPI = 100
# Pixel size (width, height) of every PNG.
SIZES = {
  'patch_filters': (1000, 640),
  'posemb_similarity': (900, 800),
  'attention_distance': (900, 600),
  'attention_rollout': (1200, 440),
}


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


def _weight_figures(model: Model, out: Path) -> list[Path]:
  """Figure 7 left and center: what the patch and position embeddings learnt."""
  name, written = model.name, []
  kernel = model.params['embedding']['kernel']
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
  posemb = model.params['Transformer']['posembed_input']['pos_embedding']
  written.append(
    draw_posemb_similarity(
      posemb_similarity(posemb, model.grid),
      out / 'posemb_similarity.png',
      f'{name}: position embedding similarity ({model.grid[0]}x{model.grid[1]} patches)',
    )
  )
  return written


def _attention_figures(
  model: Model, out: Path, images: Sequence[str], batch_size: int, errors: list
) -> list[Path]:
  """Figure 6 for every readable image, and Figure 7 right averaged over them."""
  name, written = model.name, []
  batch_size = max(1, min(batch_size, len(images)))
  distances, weights, stems = [], [], set()
  for paths, batch in image_batches(model, images, batch_size, errors):
    attn = attention_weights(model, batch, batch_size)
    distances.append([mean_attention_distance(a, model.grid, model.patch_pixels) for a in attn])
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
          rollout_map(joint[i], model.grid),
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
  model: Model,
  out_dir: str | os.PathLike,
  images: Sequence[str] = (),
  batch_size: int = 8,
) -> tuple[list[Path], list[str]]:
  """Draws every figure the checkpoint allows; returns the PNGs and one error per bad image."""
  out = files.path(out_dir)
  written, errors = _weight_figures(model, out), []
  if not images:
    print('note: no --image given; attention figures are not drawn.', file=sys.stderr)
    return written, errors
  written += _attention_figures(model, out, images, batch_size, errors)
  return written, errors

"""A classifier's top-k predictions with class names, pre-logits features and patch tokens for
image files: what `vit-predict` prints and writes.

  predictions, errors = predict_files(vit_jax.load(CKPT), paths, k=5, batch_size=32)
  save_features('out.npy', predictions, {'checkpoint': CKPT})

A distilled model (DeiT) predicts with the mean of its two heads, as DeiT does; its features
are the class and distillation tokens side by side (2 x hidden), of which that mean is one
linear map.
"""

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath

from vit_jax import families, files
from vit_jax.inference.model import (
  Model,
  head_map,
  image_batches,
  run_padded,
  softmax,
  top_k_of,
)
from vit_jax.models import blocks


@dataclasses.dataclass
class Prediction:
  """The top-k of one image; `features` is its pre-logits representation, `block_features`
  the (h, w, D) patch tokens after the block asked for, if any."""

  image: str
  indices: np.ndarray
  probabilities: np.ndarray
  features: np.ndarray
  names: list[str] | None = None
  block_features: np.ndarray | None = None


def feature_block(model: Model, block: int) -> int:
  """`block` (negative from the end) as the index of one of the model's encoder blocks."""
  transformer = getattr(model.module, 'transformer', None)
  if transformer is None:  # a Mixer, or a ViT of the patch embedding alone
    raise ValueError(f'--features_block: {model.name} has no transformer encoder blocks')
  return blocks.block_indices((block,), transformer['num_layers'])[0]


def block_program(model: Model, block: int):
  """images -> (the pre-logits features, the patch tokens (B, h, w, D) after encoder block
  `block` (>= 0), before the final LayerNorm), from one forward pass."""
  headless = model.module.clone(num_classes=None)
  options = families.of_module(model.module).feature_kwargs(model.module)
  params = {k: v for k, v in model.params.items() if k not in ('head', 'head_dist')}

  @jax.jit
  def features_and_tokens(x):
    out = headless.apply(
      {'params': params}, x, train=False, intermediate_blocks=(block, -1), **options
    )
    pooled = out['output']
    pooled = jnp.concatenate(pooled, axis=-1) if isinstance(pooled, tuple) else pooled
    return pooled.astype(jnp.float32), out[f'encoderblock_{block}'].astype(jnp.float32)

  return features_and_tokens


def _head_logits(model: Model, features: np.ndarray) -> np.ndarray | None:
  """The logits of `features` through the head (a distilled model's: its two heads' mean)."""
  head = head_map(model.params.get('head'), model.params.get('head_dist'))
  return None if head is None else features @ np.asarray(head[0]) + np.asarray(head[1])


def predict_files(
  model: Model, paths: Sequence[str], k: int = 5, batch_size: int = 32, block: int | None = None
) -> tuple[list[Prediction], list[str]]:
  """Predicts every readable image; returns the predictions and one error line per bad file.
  With `block` (see `feature_block`), each prediction also holds that block's patch tokens."""
  errors: list[str] = []
  batch_size = max(1, min(batch_size, len(paths)))
  program = None if block is None else block_program(model, feature_block(model, block))
  predictions = []
  for names, images in image_batches(model, paths, batch_size, errors):
    if program is None:
      pooled, logits = run_padded(model.features_and_logits, images, batch_size)
      grids = None
    else:
      pooled, grids = run_padded(program, images, batch_size)
      logits = _head_logits(model, pooled)
    if logits is None:
      indices, probs = np.zeros((len(names), 0), np.int64), np.zeros((len(names), 0))
    else:
      indices, probs = top_k_of(softmax(logits), k)
    for i, name in enumerate(names):
      labels = [model.class_names[j] for j in indices[i]] if model.class_names else None
      grid = None if grids is None else grids[i]
      predictions.append(Prediction(name, indices[i], probs[i], pooled[i], labels, grid))
  return predictions, errors


def features_path(out: str | os.PathLike) -> epath.Path:
  """`out` as the .npy file the features go to; a ValueError for anything else."""
  out = files.path(out)
  if out.suffix != '.npy' or out.is_dir():
    raise ValueError(f'--features {out}: expected a file path ending in .npy')
  return out


def save_features(
  out: str | os.PathLike, predictions: Sequence[Prediction], metadata: dict[str, Any]
) -> tuple[epath.Path, epath.Path, tuple[int, ...]]:
  """Writes the features to `out` (.npy, float32) and the file list to `out` .json: the
  pre-logits (N, D), or the block's patch tokens (N, h, w, D) where predictions hold them.
  Returns the two paths and the array's shape."""
  out = features_path(out)
  grids = [p.block_features for p in predictions]
  stack = grids if all(g is not None for g in grids) else [p.features for p in predictions]
  array = np.stack(stack).astype(np.float32)
  sidecar = out.with_suffix('.json')
  meta = {**metadata, 'shape': list(array.shape), 'files': [p.image for p in predictions]}
  files.atomic_write(out, lambda f: np.save(f, array, allow_pickle=False))
  files.atomic_write_text(sidecar, json.dumps(meta, indent=1) + '\n')
  return out, sidecar, array.shape

"""Fitting a pretrained tree to a model: head, pre_logits, position and patch embeddings.

`merge_pretrained` follows the original vit_jax `load_pretrained`: every backbone weight comes
from the checkpoint; the head is the freshly initialised one (kept from the checkpoint only when
asked and the class count matches); `pre_logits` is dropped when the model has no representation
layer; the position embeddings are resized to the model's token grid with
`scipy.ndimage.zoom(order=1)`, the class row kept. Beyond the original: non-square grids, an
optional FlexiViT patch-embedding resize, and a strict check that reports every missing,
unexpected or misshapen key in one line with both shapes and the likely fix.
"""

import dataclasses
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import ml_collections
import numpy as np
import scipy.ndimage
from absl import logging

from vit_jax.checkpoint.tree import (
  POSEMB,
  CheckpointError,
  flatten,
  infer_config,
  shape_str,
  square_side,
  token_grid,
  unflatten,
)

HEAD = ('head/kernel', 'head/bias')
PRE_LOGITS = ('pre_logits/kernel', 'pre_logits/bias')
PATCH_KERNEL = 'embedding/kernel'
# The tokens prepended to the patches, in the model's order (DeiT adds `dist_token` after `cls`).
PREFIX_TOKENS = ('cls', 'dist_token')


@dataclasses.dataclass
class LoadReport:
  """What `merge_pretrained` did with each key (flat `/`-joined names)."""

  source: str = 'checkpoint'
  loaded: list[str] = dataclasses.field(default_factory=list)
  fresh: list[str] = dataclasses.field(default_factory=list)  # model keys kept at init
  dropped: list[str] = dataclasses.field(
    default_factory=list
  )  # checkpoint keys not used, by design
  missing: list[str] = dataclasses.field(default_factory=list)  # model keys absent (strict=False)
  unexpected: list[str] = dataclasses.field(default_factory=list)  # extra keys (strict=False)
  resized: list[tuple[str, tuple, tuple]] = dataclasses.field(default_factory=list)

  def lines(self) -> list[str]:
    """A human-readable summary, one line per category that is not empty."""
    out = [f'{self.source}: loaded {len(self.loaded)} arrays']
    for name in ('fresh', 'dropped', 'missing', 'unexpected'):
      keys = getattr(self, name)
      if keys:
        out.append(f'  {name} ({len(keys)}): {", ".join(keys)}')
    for key, old, new in self.resized:
      out.append(f'  resized {key}: {shape_str(old)} -> {shape_str(new)}')
    return out

  def __str__(self) -> str:
    return '\n'.join(self.lines())


def _get(config: Any, name: str, default: Any = None) -> Any:
  if config is None:
    return default
  if isinstance(config, ml_collections.ConfigDict):
    return config.get(name, default)
  return config.get(name, default) if isinstance(config, Mapping) else default


def resize_posemb(
  posemb: np.ndarray,
  new_grid: tuple[int, int],
  old_grid: tuple[int, int] | None = None,
  num_prefix: int = 1,
) -> np.ndarray:
  """Resizes a (1, prefix + rows*cols, D) position embedding to `new_grid`, as the original.

  The prefix (class) rows are kept; the grid is zoomed with `scipy.ndimage.zoom(order=1)`
  (bilinear with corners aligned), zoom factors new/old per axis, exactly as vit_jax's
  `load_pretrained` and big_vision's `resample_posemb` do for square grids.
  """
  posemb = np.asarray(posemb)
  if posemb.ndim != 3 or posemb.shape[0] != 1:
    raise CheckpointError(f'position embedding {shape_str(posemb.shape)}; expected (1, tokens, D)')
  tok, grid = posemb[:, :num_prefix], posemb[0, num_prefix:]
  if old_grid is None:
    side = square_side(len(grid))
    if side is None:
      raise CheckpointError(
        f'position embedding {shape_str(posemb.shape)} with {num_prefix} class row(s) has'
        f' {len(grid)} grid rows, not a square: pass pretrained_grid=(rows, cols)'
      )
    old_grid = (side, side)
  (gh, gw), (nh, nw) = old_grid, new_grid
  if gh * gw != len(grid):
    raise CheckpointError(
      f'pretrained grid {gh}x{gw} does not match {len(grid)} position-embedding rows'
    )
  grid = grid.reshape(gh, gw, -1)
  grid = scipy.ndimage.zoom(grid, (nh / gh, nw / gw, 1), order=1)
  if grid.shape[:2] != (nh, nw):
    raise AssertionError(f'zoom gave {grid.shape}, expected {(nh, nw)}')
  return np.concatenate([tok, grid.reshape(1, nh * nw, -1)], axis=1)


def linear_resize_matrix(size_in: int, size_out: int) -> np.ndarray:
  """(size_out, size_in) matrix of 1-D linear resizing with half-pixel centres, no antialias.

  The resize of `tf.image.resize(..., 'bilinear')` and `jax.image.resize(..., 'linear',
  antialias=False)`, which big_vision's FlexiViT `resample_patchemb` inverts.
  """
  matrix = np.zeros((size_out, size_in))
  scale = size_in / size_out
  for i in range(size_out):
    src = min(max((i + 0.5) * scale - 0.5, 0.0), size_in - 1.0)
    lo = int(np.floor(src))
    hi = min(lo + 1, size_in - 1)
    matrix[i, lo] += 1.0 - (src - lo)
    matrix[i, hi] += src - lo
  return matrix


def resample_patch_embedding(kernel: np.ndarray, new_hw: tuple[int, int]) -> np.ndarray:
  """FlexiViT's patch-embedding resize (big_vision `resample_patchemb`): pinv of the resize.

  For a patch `x` resized to `new_hw` by bilinear resizing `R`, the new kernel `w'` solves
  `<R x, w'> = <x, w>`: `w' = pinv(R^T) w`. Exact when upsampling; least squares otherwise.
  """
  kernel = np.asarray(kernel)
  if kernel.ndim != 4:
    raise CheckpointError(f'patch kernel {shape_str(kernel.shape)}; expected (h, w, in, out)')
  (h, w), (nh, nw) = kernel.shape[:2], new_hw
  if (h, w) == (nh, nw):
    return kernel
  resize = np.kron(linear_resize_matrix(h, nh), linear_resize_matrix(w, nw))  # (nh*nw, h*w)
  flat = kernel.reshape(h * w, -1).astype(np.float64)
  new = np.linalg.pinv(resize.T) @ flat
  return new.reshape(nh, nw, *kernel.shape[2:]).astype(kernel.dtype)


def _prefix_tokens(flat: Mapping[str, Any]) -> tuple[str, ...]:
  """The tokens a tree prepends to the patches, in order; each has a position-embedding row."""
  return tuple(token for token in PREFIX_TOKENS if token in flat)


def _match_prefix_rows(
  posemb: np.ndarray,
  old_tokens: tuple[str, ...],
  new_tokens: tuple[str, ...],
  init_posemb: np.ndarray | None,
) -> np.ndarray:
  """A (1, old prefix + grid, D) embedding with the prefix rows of `new_tokens`: the
  checkpoint's row of each token it has, else the initial row (zeros when init is abstract)."""
  rows = []
  for i, token in enumerate(new_tokens):
    if token in old_tokens:
      j = old_tokens.index(token)
      rows.append(posemb[:, j : j + 1])
    elif init_posemb is not None:
      rows.append(init_posemb[:, i : i + 1].astype(posemb.dtype))
    else:
      rows.append(np.zeros((1, 1, posemb.shape[2]), posemb.dtype))
  return np.concatenate([*rows, posemb[:, len(old_tokens) :]], axis=1)


def _is_abstract(x: Any) -> bool:
  return isinstance(x, jax.ShapeDtypeStruct)


class _Hints:
  """Lazily names what the checkpoint is, for error messages."""

  def __init__(self, restored: Mapping[str, Any], model_config: Any):
    self._restored = restored
    self._model = _get(model_config, 'model_name')
    self._text: str | None = None

  def __str__(self) -> str:
    if self._text is None:
      try:
        config = infer_config(self._restored)
      except CheckpointError:
        config = None
      if config is None:
        self._text = ''
      elif config.model_name and config.model_name != self._model:
        self._text = f'; the checkpoint is a {config.model_name}: choose that model (--model)'
      else:
        t = config.transformer
        layers = f', {t.num_layers} layers, {t.num_heads} heads' if t else ''
        patch = 'x'.join(map(str, config.patches.size))
        self._text = f'; the checkpoint has hidden_size {config.hidden_size}{layers}, patch {patch}'
    return self._text


def merge_pretrained(
  restored: Mapping[str, Any],
  init_params: Mapping[str, Any],
  model_config: Any,
  keep_head: bool = False,
  *,
  dont_load: Sequence[str] = (),
  strict: bool = True,
  image_size: int | tuple[int, int] | None = None,
  pretrained_grid: tuple[int, int] | None = None,
  resize_patch_embedding: bool = False,
  source: str = 'checkpoint',
) -> tuple[dict, LoadReport]:
  """Fits `restored` (our names) into the structure of `init_params`; returns (params, report).

  Args:
    restored: the checkpoint's tree, e.g. from `vit_jax.checkpoint.load`.
    init_params: the model's initialised tree; its leaves may be `jax.ShapeDtypeStruct`s
      (from `jax.eval_shape`) where no initial value is needed (a fresh head is zeros with
      bias `head_bias_init`, as the model initialises it).
    model_config: the model's ConfigDict (read: `classifier`, `head_bias_init`, `model_name`,
      and `patches`/`resnet` when `image_size` is given).
    keep_head: keep the checkpoint's head; its class count must equal the model's.
    dont_load: regexes of flat keys that keep their initial values (big_vision's `dont_load`).
    strict: missing or unexpected keys are errors; with False they are reported, missing ones
      keep their initial values and unexpected ones are dropped.
    image_size: the model's input size, to place the position embeddings on a non-square grid;
      by default the model's grid is the square its embedding length implies.
    pretrained_grid: (rows, cols) of the checkpoint's grid when it is not square.
    resize_patch_embedding: resample a patch kernel of another size (FlexiViT) instead of
      failing on its shape.
    source: the checkpoint's name for messages.

  Returns:
    (params, report): `params` is a nested dict with the keys of `init_params`; loaded leaves
    are numpy arrays in the dtype of the initial leaf, leaves kept at init are the init's.
  """
  ckpt = dict(flatten(restored))
  init = flatten(init_params)
  report = LoadReport(source=source)
  hints = _Hints(ckpt, model_config)
  keep = [re.compile(p) for p in dont_load]
  out: dict[str, Any] = {}

  def init_value(key: str) -> Any:
    spec = init[key]
    if not _is_abstract(spec):
      return spec
    if key == 'head/kernel':
      return np.zeros(spec.shape, spec.dtype)
    if key == 'head/bias':
      return np.full(spec.shape, _get(model_config, 'head_bias_init', 0.0), spec.dtype)
    raise CheckpointError(
      f'{key} must keep its initial value but init_params holds only its shape'
      f' {shape_str(spec.shape)}: pass concretely initialised params'
    )

  # Names and shapes must match, but for the head (below), keys kept at init, and the
  # embeddings resized below; the patch embedding comes first, as the most telling.
  for key in sorted(ckpt, key=lambda k: k != PATCH_KERNEL):
    if key not in init or key in HEAD or any(p.search(key) for p in keep):
      continue
    old, new = tuple(ckpt[key].shape), tuple(init[key].shape)
    resizable = (key == POSEMB and len(old) == len(new) == 3 and old[::2] == new[::2]) or (
      key == PATCH_KERNEL and len(old) == len(new) == 4 and old[2:] == new[2:]
    )
    if old != new and not resizable:
      raise CheckpointError(
        f'{source}: {key} has shape {shape_str(old)} in the checkpoint but {shape_str(new)} in'
        f' the model{hints}'
      )

  # The head: fresh unless asked to keep it; a headless model drops the checkpoint's.
  for key in HEAD:
    if key in init:
      if keep_head:
        if key not in ckpt:
          raise CheckpointError(
            f'{source}: keep_head=True but the checkpoint has no {key}: use keep_head=False'
          )
        if tuple(ckpt[key].shape) != tuple(init[key].shape):
          raise CheckpointError(
            f'{source}: keep_head=True but checkpoint {key} {shape_str(ckpt[key].shape)} does'
            f" not fit the model's {shape_str(init[key].shape)}: set num_classes to the"
            " checkpoint's or use keep_head=False for a fresh head"
          )
      else:
        out[key] = init_value(key)
        report.fresh.append(key)
        if key in ckpt:
          report.dropped.append(key)
          del ckpt[key]
    elif key in ckpt:
      report.dropped.append(key)
      del ckpt[key]

  # The drop-head variant: a model without a representation layer drops `pre_logits`.
  for key in PRE_LOGITS:
    if key in ckpt and key not in init:
      report.dropped.append(key)
      del ckpt[key]

  # Keys the caller keeps at init.
  for key in init:
    if key not in out and any(p.search(key) for p in keep):
      out[key] = init_value(key)
      report.fresh.append(key)
      if key in ckpt:
        report.dropped.append(key)
        del ckpt[key]

  if strict and 'dist_token' in ckpt and 'dist_token' not in init:
    raise CheckpointError(
      f'{source}: a distilled (DeiT) checkpoint: its dist_token'
      f' {shape_str(ckpt["dist_token"].shape)} and head_dist have no place in this model, which'
      ' has no distillation token; or pass strict=False to drop them'
    )

  # Position embeddings on another grid.
  if POSEMB in ckpt and POSEMB in init:
    old, new = ckpt[POSEMB], init[POSEMB]
    old_tokens, new_tokens = _prefix_tokens(ckpt), _prefix_tokens(init)
    old_prefix, new_prefix = len(old_tokens), len(new_tokens)
    if tuple(old.shape) != tuple(new.shape) or old_tokens != new_tokens:
      if image_size is not None:
        grid = token_grid(model_config, image_size)
      else:
        side = square_side(new.shape[1] - new_prefix)
        if side is None:
          raise CheckpointError(
            f"{source}: the model's {POSEMB} {shape_str(new.shape)} is not a square grid:"
            ' pass image_size=(height, width)'
          )
        grid = (side, side)
      if grid[0] * grid[1] + new_prefix != new.shape[1]:
        raise CheckpointError(
          f'{source}: image_size {image_size} gives a {grid[0]}x{grid[1]} grid, but the model'
          f' has {new.shape[1] - new_prefix} position embeddings: pass the size the model was'
          ' initialised at'
        )
      resized = resize_posemb(old, grid, pretrained_grid, old_prefix)
      init_rows = None if _is_abstract(new) else np.asarray(init_value(POSEMB))
      resized = _match_prefix_rows(resized, old_tokens, new_tokens, init_rows)
      if tuple(old.shape) != tuple(resized.shape):
        report.resized.append((POSEMB, tuple(old.shape), tuple(resized.shape)))
      ckpt[POSEMB] = resized

  # The patch embedding of another patch size (FlexiViT).
  if PATCH_KERNEL in ckpt and PATCH_KERNEL in init:
    old, new = ckpt[PATCH_KERNEL], init[PATCH_KERNEL]
    if tuple(old.shape) != tuple(new.shape):
      if resize_patch_embedding:
        ckpt[PATCH_KERNEL] = resample_patch_embedding(old, tuple(new.shape[:2]))
        report.resized.append((PATCH_KERNEL, tuple(old.shape), tuple(new.shape)))
      else:
        raise CheckpointError(
          f'{source}: {PATCH_KERNEL} has shape {shape_str(old.shape)} in the checkpoint but'
          f' {shape_str(new.shape)} in the model: another patch size{hints}; or pass'
          ' resize_patch_embedding=True to resample it (FlexiViT)'
        )

  missing = [k for k in init if k not in out and k not in ckpt]
  unexpected = [k for k in ckpt if k not in init]
  if missing and strict:
    key = missing[0]
    fix = (
      'set representation_size=None (drop-head variant)'
      if key.startswith('pre_logits/')
      else 'pass strict=False or dont_load to keep initial values'
    )
    raise CheckpointError(
      f'{source}: the checkpoint lacks {len(missing)} model parameter(s), e.g. {key}'
      f' {shape_str(init[key].shape)}{hints}; or {fix}'
    )
  if unexpected and strict:
    key = unexpected[0]
    raise CheckpointError(
      f'{source}: {len(unexpected)} checkpoint parameter(s) have no place in the model, e.g.'
      f' {key} {shape_str(ckpt[key].shape)}{hints}; or pass strict=False to drop them'
    )
  for key in missing:
    out[key] = init_value(key)
  report.missing, report.unexpected = missing, unexpected

  for key, spec in init.items():
    if key in out:
      continue
    value = np.asarray(ckpt[key])
    out[key] = value.astype(spec.dtype, copy=False) if value.dtype != spec.dtype else value
    report.loaded.append(key)
  return unflatten({k: out[k] for k in init}), report


def load_pretrained(
  path: str | Path,
  init_params: Mapping[str, Any],
  model_config: Any,
  keep_head: bool = False,
  **kwargs: Any,
) -> dict:
  """Reads the checkpoint at `path` (any supported format) and fits it to the model.

  The original vit_jax `load_pretrained` semantics (see `merge_pretrained` for the options);
  the report of fresh, dropped, missing, unexpected and resized keys is logged.
  """
  from vit_jax.checkpoint import read

  transformer = _get(model_config, 'transformer') or {}
  restored, description = read(path, num_heads=_get(transformer, 'num_heads'))
  params, report = merge_pretrained(
    restored, init_params, model_config, keep_head, source=str(path), **kwargs
  )
  logging.info('load_pretrained: %s', description)
  for line in report.lines():
    logging.info('load_pretrained: %s', line)
  return params

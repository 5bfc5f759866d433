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
from typing import Any

import chex
import jax
import numpy as np
import scipy.ndimage

from vit_jax.checkpoint.tree import (
  POSEMB,
  CheckpointError,
  config_field,
  describe,
  flatten,
  infer_config,
  match_registry,
  num_prefix_tokens,
  shape_str,
  square_side,
  token_grid,
  unflatten,
)

# The classifier, and DeiT's second one on the distillation token: fresh unless kept.
HEAD = ('head/kernel', 'head/bias', 'head_dist/kernel', 'head_dist/bias')
PRE_LOGITS = ('pre_logits/kernel', 'pre_logits/bias')
PATCH_KERNEL = 'embedding/kernel'


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


def _is_abstract(x: Any) -> bool:
  return isinstance(x, jax.ShapeDtypeStruct)


def heads_note(config: Any, inferred: bool) -> str:
  """What a description of a checkpoint's architecture adds where its heads are a guess."""
  if not inferred or config.get('transformer') is None:
    return ''
  return f' (its {config["transformer"]["num_heads"]} heads inferred: the file states none)'


class _Hints:
  """Lazily names what the checkpoint is, for error messages."""

  def __init__(self, restored: Mapping[str, Any], init: Mapping[str, Any], heads_inferred: bool):
    self._restored, self._init = restored, init
    self._heads_inferred = heads_inferred
    self._text: str | None = None

  def __str__(self) -> str:
    if self._text is None:
      self._text = self._hint()
    return self._text

  def _hint(self) -> str:
    try:
      config = infer_config(self._restored)
    except CheckpointError:
      return ''
    name = match_registry(config)
    try:
      model = match_registry(infer_config(self._init))
    except CheckpointError:
      model = None
    guess = heads_note(config, self._heads_inferred)
    if name and name != model:
      return f'; the checkpoint is a {name}{guess}: choose that model (--model)'
    return f'; the checkpoint has {describe(config)}{guess}'


class _Merge:
  """The state of one `merge_pretrained`: checkpoint keys still to place, and the output."""

  def __init__(self, restored, init_params, model_config, dont_load, source, heads_inferred):
    self.ckpt = dict(flatten(restored))
    self.init = flatten(init_params)
    self.config = model_config
    self.source = source
    self.keep = [re.compile(p) for p in dont_load]
    self.report = LoadReport(source=source)
    self.hints = _Hints(self.ckpt, self.init, heads_inferred)
    self.out: dict[str, Any] = {}

  def kept(self, key: str) -> bool:
    return any(p.search(key) for p in self.keep)

  def init_value(self, key: str) -> Any:
    """The model's initial value of `key`; for an abstract leaf only the head has one."""
    spec = self.init[key]
    if not _is_abstract(spec):
      return spec
    if key in HEAD and key.endswith('/kernel'):
      return np.zeros(spec.shape, spec.dtype)
    if key in HEAD:
      return np.full(spec.shape, config_field(self.config, 'head_bias_init', 0.0), spec.dtype)
    raise CheckpointError(
      f'{key} must keep its initial value but init_params holds only its shape'
      f' {shape_str(spec.shape)}: pass concretely initialised params'
    )

  def fresh(self, key: str) -> None:
    """`key` keeps its initial value; the checkpoint's, if any, is dropped."""
    self.out[key] = self.init_value(key)
    self.report.fresh.append(key)
    self.drop(key)

  def drop(self, key: str) -> None:
    if key in self.ckpt:
      self.report.dropped.append(key)
      del self.ckpt[key]

  def check_shapes(self) -> None:
    """Names and shapes match, but for the head, keys kept at init and the resizable
    embeddings; the patch embedding comes first, as the most telling."""
    for key in sorted(self.ckpt, key=lambda k: k != PATCH_KERNEL):
      if key not in self.init or key in HEAD or self.kept(key):
        continue
      old, new = tuple(self.ckpt[key].shape), tuple(self.init[key].shape)
      resizable = (key == POSEMB and len(old) == len(new) == 3 and old[::2] == new[::2]) or (
        key == PATCH_KERNEL and len(old) == len(new) == 4 and old[2:] == new[2:]
      )
      if old != new and not resizable:
        why = str(self.hints)
        if '/token_mixing/Dense_0/' in key:  # Mixer: S patches in, S patches out
          why = f"; a Mixer's token-mixing MLP is sized for the {old[0]} patches it was trained on"
          why += ': use the resolution of the checkpoint'
        raise CheckpointError(
          f'{self.source}: {key} has shape {shape_str(old)} in the checkpoint but'
          f' {shape_str(new)} in the model{why}'
        )

  def place_head(self, keep_head: bool) -> None:
    """The head: fresh unless asked to keep it; a headless model drops the checkpoint's. The
    drop-head variant: a model without a representation layer drops `pre_logits`."""
    for key in HEAD:
      if key not in self.init:
        self.drop(key)
      elif not keep_head:
        self.fresh(key)
      elif key not in self.ckpt:
        raise CheckpointError(
          f'{self.source}: keep_head=True but the checkpoint has no {key}: use keep_head=False'
        )
      elif tuple(self.ckpt[key].shape) != tuple(self.init[key].shape):
        raise CheckpointError(
          f'{self.source}: keep_head=True but checkpoint {key}'
          f" {shape_str(self.ckpt[key].shape)} does not fit the model's"
          f" {shape_str(self.init[key].shape)}: set num_classes to the checkpoint's or use"
          ' keep_head=False for a fresh head'
        )
    for key in PRE_LOGITS:
      if key not in self.init:
        self.drop(key)
    for key in self.init:
      if key not in self.out and self.kept(key):
        self.fresh(key)

  def resize_posemb(self, image_size, pretrained_grid) -> None:
    """Position embeddings of another grid, or with other prefix rows (`cls`, `dist_token`)."""
    if POSEMB not in self.ckpt or POSEMB not in self.init:
      return
    old, new = self.ckpt[POSEMB], self.init[POSEMB]
    old_prefix, new_prefix = num_prefix_tokens(self.ckpt), num_prefix_tokens(self.init)
    if tuple(old.shape) == tuple(new.shape) and old_prefix == new_prefix:
      return
    grid = self._grid(new, new_prefix, image_size)
    resized = resize_posemb(old, grid, pretrained_grid, old_prefix)
    if new_prefix != old_prefix:  # prefix rows the checkpoint lacks keep their init (or 0)
      keep = min(old_prefix, new_prefix)
      extra = np.zeros((1, new_prefix - keep, new.shape[2]), resized.dtype)
      if not _is_abstract(new):
        extra = np.asarray(self.init_value(POSEMB))[:, keep:new_prefix]
      resized = np.concatenate([resized[:, :keep], extra, resized[:, old_prefix:]], axis=1)
    if tuple(old.shape) != tuple(resized.shape):
      self.report.resized.append((POSEMB, tuple(old.shape), tuple(resized.shape)))
    self.ckpt[POSEMB] = resized

  def _grid(self, posemb: Any, prefix: int, image_size) -> tuple[int, int]:
    """The model's token grid: from `image_size`, else the square its embedding implies."""
    if image_size is not None:
      grid = token_grid(self.config, image_size)
    else:
      side = square_side(posemb.shape[1] - prefix)
      if side is None:
        raise CheckpointError(
          f"{self.source}: the model's {POSEMB} {shape_str(posemb.shape)} is not a square"
          ' grid: pass image_size=(height, width)'
        )
      grid = (side, side)
    if grid[0] * grid[1] + prefix != posemb.shape[1]:
      raise CheckpointError(
        f'{self.source}: image_size {image_size} gives a {grid[0]}x{grid[1]} grid, but the'
        f' model has {posemb.shape[1] - prefix} position embeddings: pass the size the model'
        ' was initialised at'
      )
    return grid

  def resize_patch_embedding(self, resize: bool) -> None:
    """The patch embedding of another patch size: resampled (FlexiViT) or an error."""
    if PATCH_KERNEL not in self.ckpt or PATCH_KERNEL not in self.init:
      return
    old, new = self.ckpt[PATCH_KERNEL], self.init[PATCH_KERNEL]
    if tuple(old.shape) == tuple(new.shape):
      return
    if not resize:
      raise CheckpointError(
        f'{self.source}: {PATCH_KERNEL} has shape {shape_str(old.shape)} in the checkpoint but'
        f' {shape_str(new.shape)} in the model: another patch size{self.hints}; or resample it'
        ' (FlexiViT): resize_patch_embedding=True, in a fine-tune'
        ' --config.resize_patch_embedding=True'
      )
    self.ckpt[PATCH_KERNEL] = resample_patch_embedding(old, tuple(new.shape[:2]))
    self.report.resized.append((PATCH_KERNEL, tuple(old.shape), tuple(new.shape)))

  def check_complete(self, strict: bool) -> None:
    """Missing and unexpected keys: errors when `strict`, else reported (missing keep init)."""
    missing = [k for k in self.init if k not in self.out and k not in self.ckpt]
    unexpected = [k for k in self.ckpt if k not in self.init]
    if missing and strict:
      key = missing[0]
      fix = (
        'set representation_size=None (drop-head variant)'
        if key.startswith('pre_logits/')
        else 'pass strict=False or dont_load to keep initial values'
      )
      raise CheckpointError(
        f'{self.source}: the checkpoint lacks {len(missing)} model parameter(s), e.g. {key}'
        f' {shape_str(self.init[key].shape)}{self.hints}; or {fix}'
      )
    if unexpected and strict:
      key = unexpected[0]
      raise CheckpointError(
        f'{self.source}: {len(unexpected)} checkpoint parameter(s) have no place in the model,'
        f' e.g. {key} {shape_str(self.ckpt[key].shape)}{self.hints}; or pass strict=False to'
        ' drop them'
      )
    for key in missing:
      self.out[key] = self.init_value(key)
    self.report.missing, self.report.unexpected = missing, unexpected

  def params(self) -> dict:
    """The model's tree: every key not placed yet from the checkpoint, in the init's dtype."""
    for key, spec in self.init.items():
      if key not in self.out:
        value = np.asarray(self.ckpt[key])
        self.out[key] = value.astype(spec.dtype, copy=False) if value.dtype != spec.dtype else value
        self.report.loaded.append(key)
    return unflatten({k: self.out[k] for k in self.init})


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
  heads_inferred: bool = False,
) -> tuple[dict, LoadReport]:
  """Fits `restored` (our names) into the structure of `init_params`; returns (params, report).

  Args:
    restored: the checkpoint's tree, e.g. from `vit_jax.checkpoint.load`.
    init_params: the model's initialised tree; its leaves may be `jax.ShapeDtypeStruct`s
      (from `jax.eval_shape`) where no initial value is needed (a fresh head is zeros with
      bias `head_bias_init`, as the model initialises it).
    model_config: the model's ConfigDict (read: `head_bias_init`, and `patches`/`resnet`
      when `image_size` is given).
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
    heads_inferred: the checkpoint's attention heads are a guess (a file that states none
      read with the model's), which its messages say.

  Returns:
    (params, report): `params` is a nested dict with the keys of `init_params`; loaded leaves
    are numpy arrays in the dtype of the initial leaf, leaves kept at init are the init's.
  """
  merge = _Merge(restored, init_params, model_config, dont_load, source, heads_inferred)
  merge.check_shapes()
  merge.place_head(keep_head)
  merge.resize_posemb(image_size, pretrained_grid)
  merge.resize_patch_embedding(resize_patch_embedding)
  merge.check_complete(strict)
  params = merge.params()
  # Leaf for leaf the model's tree (compared as plain dicts: init_params may be a FrozenDict).
  chex.assert_trees_all_equal_shapes_and_dtypes(params, unflatten(merge.init))
  return params, merge.report

"""Top-k predictions with class names, and pre-logits embeddings, for image files.

  python -m vit_jax.predict --checkpoint PATH [--model NAME] [--resolution R] [--top_k 5] \
      [--json] [--features OUT.npy [--features_block K]] [--batch_size 32] IMAGE...
  python -m vit_jax.predict --checkpoint LIT --classes=cat,dog [--templates=...] IMAGE...

Images get the evaluation preprocessing of the input pipeline (`vit_jax.data.preprocess`):
decode to RGB, resize to the crop size (`tf.image.resize`: bilinear, half-pixel centres, no
antialiasing, aspect ratio not kept), then `(im - 127.5) / 127.5`, i.e. [-1, 1], as every
released family expects: an image file becomes the tensor a run's evaluation feeds the model.
The model is inferred from the parameter shapes unless `--model` is given.

Class names: a training run's own (`vit_jax.rundir`); a `config.json`'s `class_names` (or
the label names of the tensorflow_datasets `dataset` it names) or a Hugging Face `id2label`;
the ImageNet-1k names (package data, vit_jax/data/imagenet_classes.py) for 1000-class heads;
indices otherwise.

A distilled model (DeiT) predicts with the mean of its two heads, as DeiT does; its features
are the class and distillation tokens side by side (2 x hidden), of which that mean is one
linear map.

An image-text model (LiT, SigLIP: a file or a training run) has no head: with
`--classes=a,b,c` (and `--templates`, `--max_patches` for a NaFlex model) it classifies the
images zero-shot, as `vit-zeroshot` does with the same flags.

A head that is all zeros (the released imagenet21k files, whose heads Google zeroed on
purpose) gives a warning instead of meaningless predictions.
Unreadable images are named in a one-line error, the others are still predicted, and the
exit status is non-zero.
"""

import contextlib
import dataclasses
import functools
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl import flags, logging
from etils import epath

from vit_jax import checkpoint as ckpt
from vit_jax import cli, data, families, files, rundir
from vit_jax.data.preprocess import ImageError, eval_image, read_image
from vit_jax.models import blocks

IMAGENET_NUM_CLASSES = 1000


@dataclasses.dataclass
class LoadedModel:
  """A checkpoint ready to apply: the headless model, its parameters and what was inferred.

  Attributes:
    model: the model without its head (`num_classes=None`): `_features` maps images to the
      pre-logits representation; logits are `features @ head_kernel + head_bias`.
    params: the parameter tree without `head`.
    head_kernel, head_bias: the classifier, or None if the checkpoint has no head. A
      distilled model's features are its two tokens side by side, and its classifier the
      mean of its two heads on them: `[head; head_dist] / 2`, bias `(b + b_dist) / 2`.
    model_name: the registry name.
    resolution: input size in pixels (square).
    grid: the patch grid (rows, cols) at `resolution`.
    patch_pixels: the side of one token's patch in input pixels (patch size times the
      ResNet stem's stride for hybrids).
    class_names: one name per class, or None (indices are shown).
    class_names_source: where the names came from, for the report.
  """

  model: nn.Module
  params: dict[str, Any]
  head_kernel: np.ndarray | None
  head_bias: np.ndarray | None
  model_name: str
  resolution: int
  grid: tuple[int, int]
  patch_pixels: int
  class_names: list[str] | None = None
  class_names_source: str = 'indices'

  @property
  def num_classes(self) -> int | None:
    return None if self.head_kernel is None else int(self.head_kernel.shape[-1])

  def head_is_zero(self) -> bool:
    """True for a head whose weights and bias are all zero (e.g. the released in21k files)."""
    if self.head_kernel is None:
      return False
    return not np.any(self.head_kernel) and not np.any(self.head_bias)


# ---------------------------------------------------------------------------------------
# Preprocessing.


def preprocess(image: np.ndarray, resolution: int) -> np.ndarray:
  """uint8 (H, W, 3) -> float32 (resolution, resolution, 3) in [-1, 1]: the input pipeline's
  evaluation preprocessing (`vit_jax.data.preprocess.eval_image`)."""
  if image.ndim != 3 or image.shape[-1] != 3:
    raise ValueError(f'expected an RGB image of shape (H, W, 3), got {image.shape}')
  return eval_image(image, resolution).numpy()


# ---------------------------------------------------------------------------------------
# Class names.


def imagenet_class_names() -> tuple[list[str], str]:
  """The 1000 ImageNet-1k class names in label order (package data: data/imagenet_classes.py)."""
  from vit_jax.data import imagenet_classes

  return imagenet_classes.read()[1], 'ImageNet-1k (vit_jax package data)'


def _names_from_config_json(path: epath.Path, num_classes: int) -> list[str] | None:
  """Class names from a run's config.json or a Hugging Face config.json, if it has them."""
  try:
    config = json.loads(path.read_text())
  except (OSError, ValueError):
    return None
  if not isinstance(config, dict):
    return None
  candidates = []
  for holder in (config, config.get('dataset'), config.get('data')):
    if isinstance(holder, dict):
      candidates += [holder.get('class_names'), holder.get('classes'), holder.get('labels')]
  id2label = config.get('id2label')
  if isinstance(id2label, dict):
    with contextlib.suppress(KeyError, ValueError):
      candidates.append([id2label[k] for k in sorted(id2label, key=int)])
  for names in candidates:
    placeholders = [f'LABEL_{i}' for i in range(num_classes)]  # Hugging Face's default
    if isinstance(names, list) and len(names) == num_classes and names != placeholders:
      return [str(n) for n in names]
  dataset = config.get('dataset')
  if isinstance(dataset, str) and num_classes != IMAGENET_NUM_CLASSES:
    return tfds_class_names(dataset, num_classes)
  return None


def tfds_class_names(dataset: str, num_classes: int) -> list[str] | None:
  """The label names a tensorflow_datasets builder declares (no data is read or fetched),
  if it declares `num_classes` of them and they are more than the indices."""
  try:
    import tensorflow_datasets as tfds  # imported only for runs that name a tfds dataset

    names = list(tfds.builder(dataset).info.features['label'].names)
  except Exception:  # unknown dataset, no 'label' feature, no tfds: fall back to indices
    return None
  if len(names) != num_classes or names == [str(i) for i in range(num_classes)]:
    return None
  return names


def class_names_for(
  checkpoint: str | os.PathLike, num_classes: int
) -> tuple[list[str] | None, str]:
  """Names for a head of `num_classes`: the run's own, ImageNet-1k's, or none (indices).

  A training run's own names come first (`vit_jax.rundir`: the run directory the checkpoint
  is in); then a `config.json` next to the checkpoint or up to three directories above it.
  """
  run = rundir.find_run(checkpoint)
  names = rundir.class_names(run) if run is not None else None
  if names is not None and len(names) == num_classes:
    return names, str(run / rundir.CONFIG_FILE)
  path = files.path(files.absolute(checkpoint))
  start = path if path.is_dir() else path.parent
  for directory in [start, *list(start.parents)[:3]]:
    config = directory / 'config.json'
    if config.is_file():
      names = _names_from_config_json(config, num_classes)
      if names is not None:
        return names, str(config)
  if num_classes == IMAGENET_NUM_CLASSES:
    return imagenet_class_names()
  return None, 'indices'


# ---------------------------------------------------------------------------------------
# The model a checkpoint holds.


def _classifier(head: Any, head_dist: Any) -> tuple[np.ndarray | None, np.ndarray | None]:
  """(kernel, bias) of the linear map from the features to the logits: the head, or for a
  distilled model the mean of its two heads on the two tokens side by side."""
  if head is None:
    return None, None
  as_array = lambda x: np.asarray(x, np.float32)
  if head_dist is None:
    return as_array(head['kernel']), as_array(head['bias'])
  kernel = np.concatenate([as_array(head['kernel']), as_array(head_dist['kernel'])]) / 2
  return kernel, (as_array(head['bias']) + as_array(head_dist['bias'])) / 2


def load(
  checkpoint: str | os.PathLike, model_name: str | None = None, resolution: int | None = None
) -> LoadedModel:
  """Any checkpoint `vit_jax.checkpoint` reads, as a LoadedModel (`checkpoint.fit`).

  The architecture is read off the shapes unless `model_name` is given; the resolution
  defaults to the one the position embeddings were trained at (another one resizes them, as
  fine-tuning does). The checkpoint's head is kept; class names are looked up next to it.
  """
  fitted = ckpt.fit(checkpoint, model_name, resolution=resolution)
  config = fitted.config
  family = families.of_config(config)
  if family.image_text:
    raise ckpt.CheckpointError(
      f'{checkpoint}: an image-text model (LiT, SigLIP) has no head: give its classes '
      f"(--classes=a,b,c) to classify zero-shot, or take its image tower's features from "
      f'{checkpoint}:img'
    )
  name = fitted.name or family.label(config)
  family.check_pooled(config, name)
  params = dict(fitted.params)
  kernel, bias = _classifier(params.pop('head', None), params.pop('head_dist', None))
  loaded = LoadedModel(
    model=fitted.model(num_classes=None),
    params=params,
    head_kernel=kernel,
    head_bias=bias,
    model_name=name,
    resolution=fitted.resolution,
    grid=fitted.grid,
    patch_pixels=fitted.patch_pixels,
  )
  if loaded.num_classes:
    loaded.class_names, loaded.class_names_source = class_names_for(checkpoint, loaded.num_classes)
  return loaded


# ---------------------------------------------------------------------------------------
# Running the model.


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


def _apply(model: nn.Module, params: dict[str, Any], images: jax.Array, **kwargs: Any) -> Any:
  """`model.apply`; a distilled model gives its two tokens' features (`both_heads`)."""
  kwargs.update(families.of_module(model).feature_kwargs(model))
  return model.apply({'params': params}, images, train=False, **kwargs)


def _side_by_side(output: Any) -> jax.Array:
  """The headless model's output as one array: a distilled model's two tokens side by side."""
  return jnp.concatenate(output, axis=-1) if isinstance(output, tuple) else output


@functools.partial(jax.jit, static_argnums=0)
def _features(model: nn.Module, params: dict[str, Any], images: jax.Array) -> jax.Array:
  """The headless model's output; a distilled model's two tokens side by side."""
  return _side_by_side(_apply(model, params, images))


@functools.partial(jax.jit, static_argnums=(0, 3))
def _features_and_block(
  model: nn.Module, params: dict[str, Any], images: jax.Array, block: int
) -> tuple[jax.Array, jax.Array]:
  """`_features` and the patch tokens (B, h, w, D) after block `block` (>= 0, before the final
  LayerNorm), from one forward pass."""
  out = _apply(model, params, images, intermediate_blocks=(block, -1))
  return _side_by_side(out['output']), out[f'encoderblock_{block}']


def feature_block(loaded: LoadedModel, block: int) -> int:
  """`block` (negative from the end) as the index of one of the model's encoder blocks."""
  transformer = getattr(loaded.model, 'transformer', None)
  if transformer is None:  # a Mixer, or a ViT of the patch embedding alone
    raise ValueError(f'--features_block: {loaded.model_name} has no transformer encoder blocks')
  return blocks.block_indices((block,), transformer['num_layers'])[0]


def batches(
  paths: Sequence[str], resolution: int, batch_size: int, errors: list[str]
) -> Iterator[tuple[list[str], np.ndarray]]:
  """Readable images in order, `batch_size` at a time; unreadable ones go to `errors`."""
  names, images = [], []
  for path in paths:
    try:
      images.append(preprocess(read_image(path), resolution))
      names.append(str(path))
    except ImageError as e:
      errors.append(str(e))
      print(f'error: {e}', file=sys.stderr)
    if len(images) == batch_size:
      yield names, np.stack(images)
      names, images = [], []
  if images:
    yield names, np.stack(images)


def run_padded(
  fn: Callable[..., Any],
  model: nn.Module,
  params: dict[str, Any],
  batch: np.ndarray,
  batch_size: int,
) -> Any:
  """`fn(model, params, batch)` with the batch padded to `batch_size` (one compiled shape for
  every batch) and the padding cut off every output leaf."""
  n = len(batch)
  if n < batch_size:
    batch = np.concatenate([batch, np.zeros((batch_size - n, *batch.shape[1:]), batch.dtype)])
  return jax.tree.map(lambda y: np.asarray(y)[:n], fn(model, params, batch))


def features(loaded: LoadedModel, images: np.ndarray, batch_size: int) -> np.ndarray:
  """The pre-logits features (N, D) of preprocessed images, N <= `batch_size` (padded to it):
  what `--features` writes, and `vit-embed` for a classifier."""
  return run_padded(_features, loaded.model, loaded.params, images, batch_size)


def _logits(loaded: LoadedModel, features: np.ndarray) -> np.ndarray | None:
  if loaded.head_kernel is None:
    return None
  return features @ loaded.head_kernel + loaded.head_bias


def softmax(logits: np.ndarray) -> np.ndarray:
  """Softmax over the last axis, in float64."""
  z = logits.astype(np.float64)
  z = np.exp(z - z.max(axis=-1, keepdims=True))
  return z / z.sum(axis=-1, keepdims=True)


def top_k(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
  """The k most probable classes (N, k), best first (ties: lower index), and their probabilities."""
  probs = softmax(logits)
  k = min(k, logits.shape[-1])
  indices = np.argsort(-probs, axis=-1, kind='stable')[:, :k]
  return indices, np.take_along_axis(probs, indices, axis=-1)


def predict_files(
  loaded: LoadedModel,
  paths: Sequence[str],
  k: int = 5,
  batch_size: int = 32,
  block: int | None = None,
) -> tuple[list[Prediction], list[str]]:
  """Predicts every readable image; returns the predictions and one error line per bad file.

  With `block` (see `feature_block`), each prediction also holds that block's patch tokens.
  """
  errors: list[str] = []
  batch_size = max(1, min(batch_size, len(paths)))
  predictions = []
  for names, images in batches(paths, loaded.resolution, batch_size, errors):
    if block is None:
      pooled, grids = features(loaded, images, batch_size), None
    else:
      fn = functools.partial(_features_and_block, block=feature_block(loaded, block))
      pooled, grids = run_padded(fn, loaded.model, loaded.params, images, batch_size)
    logits = _logits(loaded, pooled)
    if logits is None:
      indices, probs = np.zeros((len(names), 0), np.int64), np.zeros((len(names), 0))
    else:
      indices, probs = top_k(logits, k)
    for i, name in enumerate(names):
      labels = None
      if loaded.class_names is not None:
        labels = [loaded.class_names[j] for j in indices[i]]
      grid = None if grids is None else grids[i]
      predictions.append(Prediction(name, indices[i], probs[i], pooled[i], labels, grid))
  return predictions, errors


# ---------------------------------------------------------------------------------------
# Output.


def _features_path(out: str | os.PathLike) -> epath.Path:
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
  out = _features_path(out)
  grids = [p.block_features for p in predictions]
  stack = grids if all(g is not None for g in grids) else [p.features for p in predictions]
  array = np.stack(stack).astype(np.float32)
  sidecar = out.with_suffix('.json')
  meta = {**metadata, 'shape': list(array.shape), 'files': [p.image for p in predictions]}
  files.atomic_write(out, lambda f: np.save(f, array, allow_pickle=False))
  files.atomic_write_text(sidecar, json.dumps(meta, indent=1) + '\n')
  return out, sidecar, array.shape


def _as_json(loaded: LoadedModel, predictions, errors, warning, checkpoint) -> dict[str, Any]:
  results = []
  for p in predictions:
    top = [
      {
        'rank': r + 1,
        'class': int(j),
        'name': p.names[r] if p.names else None,
        'probability': float(q),
      }
      for r, (j, q) in enumerate(zip(p.indices, p.probabilities, strict=True))
    ]
    results.append({'image': p.image, 'predictions': None if warning else top})
  return {
    'checkpoint': str(checkpoint),
    'model': loaded.model_name,
    'resolution': loaded.resolution,
    'num_classes': loaded.num_classes,
    'class_names': loaded.class_names_source,
    'warning': warning,
    'results': results,
    'errors': errors,
  }


def format_table(predictions: Sequence[Prediction]) -> str:
  """One block per image: rank, probability, class index and name."""
  lines = []
  for p in predictions:
    lines.append(p.image)
    for r, (j, q) in enumerate(zip(p.indices, p.probabilities, strict=True)):
      name = f'  {p.names[r]}' if p.names else ''
      lines.append(f'  {r + 1}. {100 * q:6.2f}%  {int(j):>5d}{name}')
  return '\n'.join(lines)


def _head_warning(loaded: LoadedModel, checkpoint) -> str | None:
  if loaded.head_kernel is None:
    return (
      f'{checkpoint} has no classification head, so there are no predictions; '
      'use --features for its embeddings.'
    )
  if loaded.head_is_zero():
    return (
      f'the head of {checkpoint} ({loaded.num_classes} classes) is all zeros, as Google '
      'released the imagenet21k files on purpose: every class would get probability '
      f'1/{loaded.num_classes}, so no predictions are shown. Use --features for embeddings, '
      'or fine-tune the model first.'
    )
  return None


def _write_features(
  out: str,
  predictions: Sequence[Prediction],
  loaded: LoadedModel,
  checkpoint: str,
  block: int | None,
) -> None:
  meta = {
    'checkpoint': str(checkpoint),
    'model': loaded.model_name,
    'resolution': loaded.resolution,
  }
  if block is not None:
    meta['block'] = block  # patch tokens after it, before the final LayerNorm
  npy, sidecar, shape = save_features(out, predictions, meta)
  print(f'wrote features {shape} to {npy}, file list to {sidecar}', file=sys.stderr)


def _check_usage(images, features, features_block, classes: str, max_patches: int) -> None:
  """Flags that do not go together: a one-line ValueError."""
  if not images:
    raise ValueError('no images given; usage: python -m vit_jax.predict --checkpoint PATH IMAGE...')
  if classes and (features or features_block is not None):
    raise ValueError('--classes classifies zero-shot; it writes no --features')
  if max_patches and not classes:
    raise ValueError('--max_patches is for a NaFlex image-text model, with --classes')
  if features:
    _features_path(features)
  if features_block is not None and not features:
    raise ValueError('--features_block: give --features OUT.npy to write the block features to')


def run(
  checkpoint: str,
  images: Sequence[str],
  model_name: str | None = None,
  resolution: int | None = None,
  k: int = 5,
  as_json: bool = False,
  features: str | None = None,
  batch_size: int = 32,
  features_block: int | None = None,
  classes: str = '',
  templates: str | None = None,
  max_patches: int = 0,
) -> int:
  """The command line's work; returns the exit status: 2 for a usage error (flags that do not
  go together, or a value the model cannot take), 1 for anything else that failed. With
  `classes`, an image-text model classifies the images zero-shot (`vit-zeroshot`: the names
  in `templates`, default the checkpoint's own, else clip_best; a NaFlex model's images as at
  most `max_patches` patches, 0: its own count)."""
  try:
    _check_usage(images, features, features_block, classes, max_patches)
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  if classes:
    from vit_jax.cli import zeroshot  # the image-text model's zero-shot classification

    options = {'json': as_json, 'top_k': k, 'batch_size': batch_size, 'max_patches': max_patches}
    return zeroshot.run(checkpoint, images, classes, templates, options=options)
  try:
    loaded = load(checkpoint, model_name, resolution)
  except (OSError, ValueError, KeyError) as e:
    message = str(e) if str(checkpoint) in str(e) else f'{checkpoint}: {e}'  # the path once
    print(f'error: {message}'.replace('\n', ' '), file=sys.stderr)
    return 1
  try:
    if features_block is not None:
      features_block = feature_block(loaded, features_block)
  except ValueError as e:  # a flag value this model cannot take
    print(f'error: {e}', file=sys.stderr)
    return 2
  warning = _head_warning(loaded, checkpoint)
  if warning:
    print(f'warning: {warning}', file=sys.stderr)
  if warning and not features:
    _report(loaded, [], [], warning, checkpoint, as_json)
    return 1

  predictions, errors = predict_files(loaded, images, k, batch_size, features_block)
  if features and predictions:
    _write_features(features, predictions, loaded, checkpoint, features_block)
  _report(loaded, predictions, errors, warning, checkpoint, as_json)
  return 1 if errors else 0


def _report(loaded, predictions, errors, warning, checkpoint, as_json: bool) -> None:
  """The predictions as JSON, or as a table unless the head was not trusted (`warning`)."""
  if as_json:
    print(json.dumps(_as_json(loaded, predictions, errors, warning, checkpoint), indent=1))
  elif not warning:
    source = loaded.class_names_source
    print(
      f'{loaded.model_name} at {loaded.resolution} px, {loaded.num_classes} classes '
      f'(names: {source})'
    )
    print(format_table(predictions))


def define_checkpoint_flags(flag_values: flags.FlagValues) -> None:
  """--checkpoint, --model, --resolution: what `load` takes (the visualiser's too)."""
  fv = flag_values
  flags.DEFINE_string(
    'checkpoint', None, 'Checkpoint file or directory.', required=True, flag_values=fv
  )
  flags.DEFINE_string(
    'model', None, 'Registered model name; inferred from the shapes if unset.', flag_values=fv
  )
  flags.DEFINE_integer(
    'resolution',
    None,
    'Input size in pixels; default: the one the checkpoint was trained at.',
    flag_values=fv,
  )


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """The command line's flags, on `flag_values`; defined at program start, so that importing
  this module (the visualiser does) registers none."""
  fv = flag_values
  define_checkpoint_flags(fv)
  flags.DEFINE_integer('top_k', 5, 'How many classes to show per image.', flag_values=fv)
  flags.DEFINE_bool('json', False, 'Print one JSON object instead of a table.', flag_values=fv)
  flags.DEFINE_string(
    'features',
    None,
    'Write the pre-logits features to this .npy (file list beside it: .json).',
    flag_values=fv,
  )
  flags.DEFINE_integer(
    'features_block',
    None,
    'With --features: write the patch tokens (N, h, w, D) after this encoder block instead'
    ' (0-based; -1 is the last), before the final LayerNorm.',
    flag_values=fv,
  )
  flags.DEFINE_integer('batch_size', 32, 'Images per forward pass.', flag_values=fv)
  flags.DEFINE_string(
    'classes',
    '',
    'An image-text model: class names a,b,c (or a file) to classify zero-shot.',
    flag_values=fv,
  )
  flags.DEFINE_string(
    'templates', None, 'With --classes: templates as vit-zeroshot takes them.', flag_values=fv
  )
  flags.DEFINE_integer(
    'max_patches',
    0,
    "With --classes: a NaFlex model's patches an image (0: its own).",
    flag_values=fv,
  )


def main(argv: Sequence[str]) -> None:
  f = flags.FLAGS
  if not f['verbosity'].present:  # orbax and JAX log at INFO on every restore
    logging.set_verbosity(logging.WARNING)
  data.hide_accelerators_from_tensorflow()
  sys.exit(
    run(
      f.checkpoint,
      argv[1:],
      f.model,
      f.resolution,
      f.top_k,
      f.json,
      f.features,
      f.batch_size,
      f.features_block,
      f.classes,
      f.templates,
      f.max_patches,
    )
  )


def run_cli() -> None:
  """The `vit-predict` console script (and `python -m vit_jax.predict`)."""
  cli.start(define_flags, main)

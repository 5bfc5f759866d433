"""Top-k predictions with class names, and pre-logits embeddings, for image files.

  python -m vit_jax.predict --checkpoint PATH [--model NAME] [--resolution R] [--top_k 5] \
      [--json] [--features OUT.npy [--features_block K]] [--batch_size 32] IMAGE...

Images get the evaluation preprocessing of the original input pipeline: decode to RGB,
resize to the crop size (bilinear, half-pixel centres, no antialiasing, aspect ratio not
kept: `tf.image.resize`), then `(im - 127.5) / 127.5`, i.e. [-1, 1], as every released
family expects. The model is inferred from the parameter shapes unless `--model` is given.

Class names: a run directory's `config.json` (its `class_names`, or the label names of the
tensorflow_datasets `dataset` it names) or a Hugging Face `id2label`; the ImageNet-1k
names that tensorflow_datasets ships for 1000-class heads; class indices otherwise.

A head that is all zeros (the released imagenet21k files, whose heads Google zeroed on
purpose) gives a warning instead of meaningless predictions.
Unreadable images are named in a one-line error, the others are still predicted, and the
exit status is non-zero.
"""

import ast
import contextlib
import dataclasses
import functools
import importlib.util
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from absl import app, flags
from PIL import Image

from vit_jax import checkpoint as ckpt
from vit_jax import files
from vit_jax.models import VisionTransformer, get_config, model_from_config, stats, vit

IMAGENET_NUM_CLASSES = 1000
CLASSIFIERS_WITH_POOLING = ('token', 'gap')


class ImageError(ValueError):
  """An image file that cannot be read or decoded."""


@dataclasses.dataclass
class LoadedModel:
  """A checkpoint ready to apply: the headless model, its parameters and what was inferred.

  Attributes:
    model: the model without its head (`num_classes=None`): it maps images to the pre-logits
      representation; logits are `features @ head_kernel + head_bias`.
    params: the parameter tree without `head`.
    head_kernel, head_bias: the classifier, or None if the checkpoint has no head.
    model_name: the registry name.
    resolution: input size in pixels (square).
    grid: the patch grid (rows, cols) at `resolution`.
    patch_pixels: the side of one token's patch in input pixels (patch size times the
      ResNet stem's stride for hybrids).
    class_names: one name per class, or None (indices are shown).
    class_names_source: where the names came from, for the report.
  """

  model: VisionTransformer
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


def resize_bilinear(image: np.ndarray, height: int, width: int) -> np.ndarray:
  """(H, W, C) -> float32 (height, width, C), as `tf.image.resize(..., 'bilinear')`: half-pixel
  centres, no antialiasing (within 0.02 of TensorFlow's float32 arithmetic on 0..255)."""
  h, w = image.shape[:2]
  rows = ckpt.surgery.linear_resize_matrix(h, height).astype(np.float32)
  cols = ckpt.surgery.linear_resize_matrix(w, width).astype(np.float32)
  x = np.einsum('oh,hw...->ow...', rows, image.astype(np.float32))
  return np.einsum('ow...,pw->op...', x, cols)


def preprocess(image: np.ndarray, resolution: int) -> np.ndarray:
  """uint8 (H, W, 3) -> float32 (resolution, resolution, 3) in [-1, 1], the eval pipeline's."""
  if image.ndim != 3 or image.shape[-1] != 3:
    raise ValueError(f'expected an RGB image of shape (H, W, 3), got {image.shape}')
  return (resize_bilinear(image, resolution, resolution) - 127.5) / 127.5


def read_image(path: str | os.PathLike) -> np.ndarray:
  """Decodes an image file to uint8 RGB (H, W, 3); raises ImageError with a one-line reason."""
  try:
    with Image.open(path) as im:
      rgb = im.convert('RGB')
      return np.asarray(rgb, dtype=np.uint8)
  except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
    reason = ' '.join(str(e).split()) or type(e).__name__
    raise ImageError(f'{path}: cannot read image ({reason})') from None


# ---------------------------------------------------------------------------------------
# Class names.


def _tfds_dir() -> Path | None:
  spec = importlib.util.find_spec('tensorflow_datasets')  # locates it without importing it
  if spec is None or not spec.submodule_search_locations:
    return None
  return Path(next(iter(spec.submodule_search_locations)))


def imagenet_class_names() -> tuple[list[str], str] | None:
  """The 1000 ImageNet-1k class names in label order, from files tensorflow_datasets ships.

  Human-readable names come from the `IMAGENET_LABELS_LIST` literal in tfds'
  `datasets/siscore/labels.py` (read with `ast.literal_eval`, never imported or executed);
  the WordNet ids of `datasets/imagenet2012/labels.txt` are the fallback. Returns
  (names, source) or None when neither file is there.
  """
  root = _tfds_dir()
  if root is None:
    return None
  readable = root / 'datasets' / 'siscore' / 'labels.py'
  if readable.is_file():
    tree = ast.parse(readable.read_text())
    for node in tree.body:
      if (
        isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and getattr(node.targets[0], 'id', None) == 'IMAGENET_LABELS_LIST'
      ):
        names = ast.literal_eval(node.value)
        if len(names) == IMAGENET_NUM_CLASSES:
          return [str(n) for n in names], 'ImageNet-1k (tensorflow_datasets)'
  wnids = root / 'datasets' / 'imagenet2012' / 'labels.txt'
  if wnids.is_file():
    names = wnids.read_text().split()
    if len(names) == IMAGENET_NUM_CLASSES:
      return names, 'ImageNet-1k WordNet ids (tensorflow_datasets)'
  return None


def _names_from_config_json(path: Path, num_classes: int) -> list[str] | None:
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

  A `config.json` next to the checkpoint or up to three directories above it is searched
  first: a run directory holds `config.json` and `checkpoints/<step>/<item>/` below it.
  """
  path = Path(checkpoint).absolute()
  start = path if path.is_dir() else path.parent
  for directory in [start, *list(start.parents)[:3]]:
    config = directory / 'config.json'
    if config.is_file():
      names = _names_from_config_json(config, num_classes)
      if names is not None:
        return names, str(config)
  if num_classes == IMAGENET_NUM_CLASSES:
    found = imagenet_class_names()
    if found is not None:
      return found
  return None, 'indices'


# ---------------------------------------------------------------------------------------
# The model a checkpoint holds.


def build(
  params: dict[str, Any],
  model_name: str | None = None,
  resolution: int | None = None,
  checkpoint: str | os.PathLike | None = None,
) -> LoadedModel:
  """A LoadedModel from a parameter tree in our names (as `vit_jax.checkpoint.load` gives).

  The architecture is read off the shapes (`checkpoint.infer_config`) unless `model_name`
  is given; the resolution defaults to the one the position embeddings were trained at
  (another one resizes them, as fine-tuning does). The tree is fitted and checked by
  `checkpoint.merge_pretrained`, keeping the checkpoint's head; class names are looked up
  next to `checkpoint`.
  """
  source = str(checkpoint or 'checkpoint')
  inferred = ckpt.infer_config(params)
  t = inferred.transformer
  layers = f'{t.num_layers} layers, {t.num_heads} heads, ' if t else ''
  found = f'hidden_size {inferred.hidden_size}, {layers}patch {inferred.patches.size}'
  if model_name and ckpt.tree.match_registry(get_config(model_name)) != inferred.model_name:
    holds = inferred.model_name or 'an unregistered architecture'
    raise ValueError(
      f'--model {model_name} does not fit the checkpoint, which holds {holds} ({found}); '
      'leave --model out to use that.'
    )
  name = model_name or inferred.model_name
  if name:
    config = get_config(name)
  else:  # an architecture outside the registry: the inferred fields are the model
    config = inferred
    name = f'ViT ({found})'
  config.representation_size = inferred.representation_size
  if config.transformer is None or config.classifier not in CLASSIFIERS_WITH_POOLING:
    raise ValueError(
      f'{name} has classifier={config.classifier!r} and transformer={config.transformer}: '
      f'predictions and embeddings need a pooled encoder output ({CLASSIFIERS_WITH_POOLING}).'
    )

  stride = config.patches.size[0] * ckpt.tree.feature_stride(config)
  if resolution is None:
    posemb = ckpt.flatten(params).get(ckpt.tree.POSEMB)
    side = None if posemb is None else ckpt.tree.square_side(posemb.shape[1] - ('cls' in params))
    if side is None:
      raise ValueError(
        f'{source}: cannot tell the trained resolution from {ckpt.tree.POSEMB} '
        f'{None if posemb is None else posemb.shape}; pass --resolution.'
      )
    resolution = side * stride
  if resolution % stride:
    raise ValueError(f"--resolution {resolution} is not a multiple of {name}'s stride {stride}.")

  model = model_from_config(config, num_classes=inferred.num_classes)
  fitted, _ = ckpt.merge_pretrained(
    params,
    stats.param_shapes(model, resolution),
    config,
    keep_head=inferred.num_classes is not None,
    source=source,
  )
  head = fitted.pop('head', None)
  loaded = LoadedModel(
    model=model.clone(num_classes=None),
    params=fitted,
    head_kernel=None if head is None else np.asarray(head['kernel'], np.float32),
    head_bias=None if head is None else np.asarray(head['bias'], np.float32),
    model_name=name,
    resolution=resolution,
    grid=(resolution // stride, resolution // stride),
    patch_pixels=stride,
  )
  if loaded.num_classes and checkpoint is not None:
    loaded.class_names, loaded.class_names_source = class_names_for(checkpoint, loaded.num_classes)
  return loaded


def load(
  checkpoint: str | os.PathLike, model_name: str | None = None, resolution: int | None = None
) -> LoadedModel:
  """Reads any checkpoint `vit_jax.checkpoint` knows (format detected) and builds it."""
  num_heads = get_config(model_name).transformer.num_heads if model_name else None
  params, _ = ckpt.read(checkpoint, num_heads=num_heads)
  return build(params, model_name, resolution, checkpoint)


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


@functools.partial(jax.jit, static_argnums=0)
def _features(model: VisionTransformer, params: dict[str, Any], images: jax.Array) -> jax.Array:
  return model.apply({'params': params}, images, train=False)


@functools.partial(jax.jit, static_argnums=(0, 3))
def _block_features(
  model: VisionTransformer, params: dict[str, Any], images: jax.Array, block: int
) -> jax.Array:
  """The patch tokens (B, h, w, D) after block `block` (>= 0), in a pass that stops there."""
  features = model.apply({'params': params}, images, train=False, intermediate_blocks=(block,))
  return features[f'encoderblock_{block}']


def feature_block(loaded: LoadedModel, block: int) -> int:
  """`block` (negative from the end) as the index of one of the model's encoder blocks."""
  return vit.block_indices((block,), loaded.model.transformer['num_layers'])[0]


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
  model: VisionTransformer,
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
  block_fn = None
  if block is not None:
    block_fn = functools.partial(_block_features, block=feature_block(loaded, block))
  for names, images in batches(paths, loaded.resolution, batch_size, errors):
    features = run_padded(_features, loaded.model, loaded.params, images, batch_size)
    grids = None
    if block_fn is not None:
      grids = run_padded(block_fn, loaded.model, loaded.params, images, batch_size)
    logits = _logits(loaded, features)
    if logits is None:
      indices, probs = np.zeros((len(names), 0), np.int64), np.zeros((len(names), 0))
    else:
      indices, probs = top_k(logits, k)
    for i, name in enumerate(names):
      labels = None
      if loaded.class_names is not None:
        labels = [loaded.class_names[j] for j in indices[i]]
      grid = None if grids is None else grids[i]
      predictions.append(Prediction(name, indices[i], probs[i], features[i], labels, grid))
  return predictions, errors


# ---------------------------------------------------------------------------------------
# Output.


def _features_path(out: str | os.PathLike) -> Path:
  out = Path(out)
  if out.suffix != '.npy' or out.is_dir():
    raise ValueError(f'--features {out}: expected a file path ending in .npy')
  return out


def save_features(
  out: str | os.PathLike, predictions: Sequence[Prediction], metadata: dict[str, Any]
) -> tuple[Path, Path]:
  """Writes the features to `out` (.npy, float32) and the file list to `out` .json: the
  pre-logits (N, D), or the block's patch tokens (N, h, w, D) where predictions hold them."""
  out = _features_path(out)
  grids = [p.block_features for p in predictions]
  stack = grids if all(g is not None for g in grids) else [p.features for p in predictions]
  array = np.stack(stack).astype(np.float32)
  sidecar = out.with_suffix('.json')
  meta = {**metadata, 'shape': list(array.shape), 'files': [p.image for p in predictions]}
  files.atomic_write(out, lambda f: np.save(f, array, allow_pickle=False))
  files.atomic_write_text(sidecar, json.dumps(meta, indent=1) + '\n')
  return out, sidecar


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
) -> int:
  """The command line's work; returns the exit status (1 if anything failed)."""
  if not images:
    print(
      'error: no images given; usage: python -m vit_jax.predict --checkpoint PATH IMAGE...',
      file=sys.stderr,
    )
    return 2
  try:
    if features:
      _features_path(features)
    if features_block is not None and not features:
      raise ValueError('--features_block: give --features OUT.npy to write the block features to')
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  try:
    loaded = load(checkpoint, model_name, resolution)
    if features_block is not None:
      features_block = feature_block(loaded, features_block)
  except (OSError, ValueError, KeyError) as e:
    print(f'error: {checkpoint}: {e}'.replace('\n', ' '), file=sys.stderr)
    return 2
  warning = _head_warning(loaded, checkpoint)
  if warning:
    print(f'warning: {warning}', file=sys.stderr)
  if warning and not features:
    if as_json:
      print(json.dumps(_as_json(loaded, [], [], warning, checkpoint), indent=1))
    return 1

  predictions, errors = predict_files(loaded, images, k, batch_size, features_block)
  if features and predictions:
    meta = {
      'checkpoint': str(checkpoint),
      'model': loaded.model_name,
      'resolution': loaded.resolution,
    }
    if features_block is not None:
      meta['block'] = features_block  # patch tokens after it, before the final LayerNorm
    npy, sidecar = save_features(features, predictions, meta)
    first = predictions[0]
    shape = (
      len(predictions),
      *np.shape(first.features if features_block is None else first.block_features),
    )
    print(f'wrote features {shape} to {npy}, file list to {sidecar}', file=sys.stderr)
  if as_json:
    print(json.dumps(_as_json(loaded, predictions, errors, warning, checkpoint), indent=1))
  elif not warning:
    source = loaded.class_names_source
    print(
      f'{loaded.model_name} at {loaded.resolution} px, {loaded.num_classes} classes '
      f'(names: {source})'
    )
    print(format_table(predictions))
  return 1 if errors else 0


def define_flags() -> None:
  """The command line's flags; defined only when run as a program, so that importing this
  module (the visualiser does) registers none."""
  flags.DEFINE_string('checkpoint', None, 'Checkpoint file or directory.', required=True)
  flags.DEFINE_string('model', None, 'Registered model name; inferred from the shapes if unset.')
  flags.DEFINE_integer(
    'resolution', None, 'Input size in pixels; default: the one the checkpoint was trained at.'
  )
  flags.DEFINE_integer('top_k', 5, 'How many classes to show per image.')
  flags.DEFINE_bool('json', False, 'Print one JSON object instead of a table.')
  flags.DEFINE_string(
    'features', None, 'Write the pre-logits features to this .npy (file list beside it: .json).'
  )
  flags.DEFINE_integer(
    'features_block',
    None,
    'With --features: write the patch tokens (N, h, w, D) after this encoder block instead'
    ' (0-based; -1 is the last), before the final LayerNorm.',
  )
  flags.DEFINE_integer('batch_size', 32, 'Images per forward pass.')


def main(argv: Sequence[str]) -> None:
  f = flags.FLAGS
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
    )
  )


if __name__ == '__main__':
  define_flags()
  app.run(main)

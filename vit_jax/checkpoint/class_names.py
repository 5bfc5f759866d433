"""Class names for a classifier's head, found beside its checkpoint.

  names, source = class_names.beside(checkpoint, num_classes)

A training run's own (`vit_jax.rundir`); an .npz's FILE.json's `class_names`; a
`config.json`'s `class_names` (or the label names of the tensorflow_datasets `dataset` it
names), a Hugging Face `id2label` or timm's `label_names`; the ImageNet-1k names (package data,
vit_jax/data/imagenet_classes.py) for 1000-class heads; none otherwise (the callers show
indices).
"""

import contextlib
import json
import os

from etils import epath

from vit_jax import files, rundir
from vit_jax.checkpoint import npz

IMAGENET_NUM_CLASSES = 1000


def imagenet_class_names() -> tuple[list[str], str]:
  """The 1000 ImageNet-1k class names in label order (package data: data/imagenet_classes.py)."""
  from vit_jax.data import imagenet_classes  # floor 2, beside checkpoint/: read on demand

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
  for holder in (config, config.get('dataset'), config.get('data'), config.get('pretrained_cfg')):
    if isinstance(holder, dict):
      keys = ('class_names', 'classes', 'labels', 'label_names')  # label_names: timm's
      candidates += [holder.get(key) for key in keys]
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


def beside(
  checkpoint: str | os.PathLike, num_classes: int, imagenet: bool = True
) -> tuple[list[str] | None, str]:
  """Names for a head of `num_classes`: the run's own, the file's, ImageNet-1k's (unless
  `imagenet=False`), or none (indices).

  A training run's own names come first (`vit_jax.rundir`: the run directory the checkpoint
  is in); then an .npz's FILE.json; then a `config.json` next to the checkpoint or up to three
  directories above it.
  """
  run = rundir.find_run(checkpoint)
  names = rundir.class_names(run) if run is not None else None
  if names is not None and len(names) == num_classes:
    return names, str(run / rundir.CONFIG_FILE)
  path = files.path(files.absolute(checkpoint))
  start = path if path.is_dir() else path.parent
  candidates = [start / 'config.json', *[d / 'config.json' for d in list(start.parents)[:3]]]
  if str(path).endswith('.npz'):
    candidates.insert(0, files.path(npz.sidecar_path(path)))
  for config in candidates:
    if config.is_file():
      names = _names_from_config_json(config, num_classes)
      if names is not None:
        return names, str(config)
  if imagenet and num_classes == IMAGENET_NUM_CLASSES:
    return imagenet_class_names()
  return None, 'indices'

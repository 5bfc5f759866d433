"""VTAB-1k's 19 tasks as data: each task's tfds dataset, label and standard splits.

Each task is a tfds dataset, a label (some tasks derive it from annotations: object counts,
distances, positions binned into classes) and the standard splits of the benchmark's
reference code (google-research/task_adaptation): `train800` (800 training examples),
`val200` (200 development examples), `train800val200` (their union, the final training set)
and `test`. A task is read as the dataset `vtab/<task>` (`get_source('vtab/clevr_count')`);
`vit_jax.reproduce.vtab` runs the benchmark and reports it.
"""

import dataclasses
from collections.abc import Callable, Mapping

import tensorflow as tf
import tensorflow_datasets as tfds

from vit_jax.data import preprocess
from vit_jax.data.sources import TfdsSource

GROUPS = ('natural', 'specialized', 'structured')
SPLIT_ALIASES = ('train800', 'val200', 'train800val200', 'test')
DEV_EXAMPLES = 200
# Every task trains on the first 800 examples of tfds 'train'.
TRAIN800 = 'train[:800]'


def _label(record):
  return record['label']


def _clevr_count(record):
  # 3 to 10 objects -> classes 0..7.
  return tf.cast(tf.size(record['objects']['size']) - 3, tf.int64)


def _thresholded(value, thresholds) -> tf.Tensor:
  """Index of the last threshold below `value` (the bins of the reference code)."""
  below = tf.where(tf.constant(thresholds, tf.float32) - tf.cast(value, tf.float32) < 0)
  return tf.cast(tf.reduce_max(below), tf.int64)


def _clevr_distance(record):
  # Depth of the closest object, in 6 bins.
  depth = tf.reduce_min(record['objects']['pixel_coords'][:, 2])
  return _thresholded(depth, (0.0, 8.0, 8.5, 9.0, 9.5, 10.0, 100.0))


def _kitti_distance(record):
  # Depth of the closest car, van or truck (types 0-2): < 8 m, < 20 m, farther, or none.
  objects = record['objects']
  vehicles = tf.where(objects['type'] < 3)[:, 0]
  depths = tf.gather(objects['location'][:, 2], vehicles)
  depth = tf.reduce_min(tf.concat([depths, tf.constant([1000.0], depths.dtype)], 0))
  return _thresholded(depth, (-100.0, 8.0, 20.0, 999.0))


def _binned(key: str, original: int, classes: int):
  """dSprites: `original` integer values grouped into `classes` equal bins."""

  def label(record):
    value = tf.cast(record[key], tf.float32)
    return tf.cast(tf.math.floordiv(value, original / classes), tf.int64)

  return label


def _feature(key: str):
  return lambda record: tf.cast(record[key], tf.int64)


@dataclasses.dataclass(frozen=True)
class Task:
  """One VTAB-1k task: tfds name, label, class count and the tfds splits behind each alias."""

  name: str
  group: str
  tfds_name: str
  num_classes: int
  val200: str
  test: str
  label_fn: Callable = _label
  # The features `label_fn` reads (tfds.decode.PartialDecoding spec); None: {'label': True}.
  # Nothing else is decoded (e.g. Pets' segmentation masks).
  features: Mapping | None = None
  # dSprites stores pixels as 0/1: scaled to 0/255.
  pixel_scale: int = 1

  @property
  def decoders(self) -> tfds.decode.PartialDecoding:
    """Decode only the label's features; the image stays encoded until the pipeline decodes it."""
    features = {'image': True, **(self.features or {'label': True})}
    return tfds.decode.PartialDecoding(features, decoders={'image': tfds.decode.SkipDecoding()})

  @property
  def splits(self) -> dict[str, str]:
    """Alias -> tfds split string."""
    return {
      'train800': TRAIN800,
      'val200': self.val200,
      'train800val200': f'{TRAIN800}+{self.val200}',
      'test': self.test,
    }


def _from_train(train_count: int) -> str:
  """val200 of a dataset whose development split is cut from tfds 'train' at `train_count`."""
  return f'train[{train_count}:{train_count + DEV_EXAMPLES}]'


# Boundaries are the reference code's, computed from the tfds split sizes: e.g. CIFAR-100's
# train is the first 90% of tfds 'train' (45,000), so val200 starts at 45,000.
TASKS: dict[str, Task] = {
  t.name: t
  for t in (
    Task('caltech101', 'natural', 'caltech101', 102, _from_train(2754), 'test'),
    Task('cifar100', 'natural', 'cifar100', 100, _from_train(45000), 'test'),
    Task('dtd', 'natural', 'dtd', 47, 'validation[:200]', 'test'),
    Task('oxford_flowers102', 'natural', 'oxford_flowers102', 102, 'validation[:200]', 'test'),
    Task('oxford_iiit_pet', 'natural', 'oxford_iiit_pet', 37, _from_train(2944), 'test'),
    Task('sun397', 'natural', 'sun397/tfds', 397, 'validation[:200]', 'test'),
    Task('svhn', 'natural', 'svhn_cropped', 10, _from_train(65931), 'test'),
    Task('patch_camelyon', 'specialized', 'patch_camelyon', 2, 'validation[:200]', 'test'),
    Task('eurosat', 'specialized', 'eurosat/rgb', 10, _from_train(16200), 'train[21600:]'),
    Task('resisc45', 'specialized', 'resisc45', 45, _from_train(18900), 'train[25200:]'),
    Task(
      'diabetic_retinopathy',
      'specialized',
      'diabetic_retinopathy_detection/btgraham-300',
      5,
      'validation[:200]',
      'test',
    ),
    Task(
      'clevr_count',
      'structured',
      'clevr',
      8,
      _from_train(63000),
      'validation',
      label_fn=_clevr_count,
      features={'objects': {'size': True}},
    ),
    Task(
      'clevr_distance',
      'structured',
      'clevr',
      6,
      _from_train(63000),
      'validation',
      label_fn=_clevr_distance,
      features={'objects': {'pixel_coords': True}},
    ),
    Task('dmlab', 'structured', 'dmlab', 6, 'validation[:200]', 'test'),
    Task(
      'kitti_distance',
      'structured',
      'kitti',
      4,
      'validation[:200]',
      'test',
      label_fn=_kitti_distance,
      features={'objects': {'type': True, 'location': True}},
    ),
    Task(
      'dsprites_location',
      'structured',
      'dsprites',
      16,
      _from_train(589824),
      'train[663552:]',
      label_fn=_binned('label_x_position', 32, 16),
      features={'label_x_position': True},
      pixel_scale=255,
    ),
    Task(
      'dsprites_orientation',
      'structured',
      'dsprites',
      16,
      _from_train(589824),
      'train[663552:]',
      label_fn=_binned('label_orientation', 40, 16),
      features={'label_orientation': True},
      pixel_scale=255,
    ),
    Task(
      'smallnorb_azimuth',
      'structured',
      'smallnorb',
      18,
      'test[:200]',
      'test[50%:]',
      label_fn=_feature('label_azimuth'),
      features={'label_azimuth': True},
    ),
    Task(
      'smallnorb_elevation',
      'structured',
      'smallnorb',
      9,
      'test[:200]',
      'test[50%:]',
      label_fn=_feature('label_elevation'),
      features={'label_elevation': True},
    ),
  )
}


class VtabSource(TfdsSource):
  """A VTAB-1k task as a data source: its label, and split aliases (train800, val200, ...).

  Any other split string is passed to tfds unchanged (e.g. 'train' for full-data runs).
  """

  def __init__(self, task: str, data_dir: str | None = None):
    if task not in TASKS:
      raise ValueError(f'Unknown VTAB task {task!r}; expected one of {", ".join(TASKS)}.')
    self.task = TASKS[task]
    self.name = f'vtab/{task}'
    self.builder = tfds.builder(self.task.tfds_name, data_dir=data_dir)
    self.num_classes = self.task.num_classes
    self._counts: dict[tuple[str, int, int], int] = {}

  def tfds_split(self, split: str) -> str:
    """The tfds split string behind an alias ('val200' -> 'train[2754:2954]' for caltech101)."""
    return self.task.splits.get(split, split)

  def records(self, split: str, process_index: int = 0, process_count: int = 1) -> tf.data.Dataset:
    ds = self.builder.as_dataset(
      split=self._split(self.tfds_split(split), process_index, process_count),
      shuffle_files=False,
      decoders=self.task.decoders,
    )
    label_fn = self.task.label_fn
    return ds.map(lambda r: {'image': r['image'], 'label': label_fn(r)})

  def num_examples(self, split: str, process_index: int = 0, process_count: int = 1) -> int:
    return super().num_examples(self.tfds_split(split), process_index, process_count)

  def decode(self, image: tf.Tensor) -> tf.Tensor:
    image = preprocess.decode(image)
    if self.task.pixel_scale != 1:
      image = image * tf.constant(self.task.pixel_scale, tf.uint8)
    return image

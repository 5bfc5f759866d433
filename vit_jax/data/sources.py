"""Where examples come from: a tfds dataset, a folder of images per class, or the bundled digits.

A source yields raw records `{'image': encoded bytes or uint8 HxWxC, 'label': int64}` in a
fixed order, restricted to this host's share of a split (hosts read disjoint shares), and
decodes an image to uint8 HxWx3. Nothing here is random.
"""

import abc
import difflib
import math
import os
import re

import tensorflow as tf
import tensorflow_datasets as tfds

from vit_jax.data import digits, preprocess

IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.bmp', '.gif')
# A digits split, optionally sliced like tfds: 'train', 'train[:90%]', 'train[1000:]'.
_DIGITS_SPLIT = re.compile(r'^(\w+)(?:\[(-?\d+%?)?:(-?\d+%?)?\])?$')


def _bound(bound: str | None, n: int) -> int | None:
  if not bound:
    return None
  return round(int(bound[:-1]) * n / 100) if bound.endswith('%') else int(bound)


@tf.autograph.experimental.do_not_convert
def _image_and_label(record):
  return {'image': record['image'], 'label': record['label']}


@tf.autograph.experimental.do_not_convert
def _count(n, _):
  return n + 1


class Source(abc.ABC):
  """A dataset with named splits; each host reads its own share of a split."""

  name: str
  num_classes: int

  @abc.abstractmethod
  def records(self, split: str, process_index: int = 0, process_count: int = 1) -> tf.data.Dataset:
    """This host's share of `split` as raw records, always in the same order."""

  @abc.abstractmethod
  def num_examples(self, split: str, process_index: int = 0, process_count: int = 1) -> int:
    """How many examples this host's share of `split` holds."""

  def decode(self, image: tf.Tensor) -> tf.Tensor:
    """A raw record's image as uint8 (H, W, 3)."""
    return preprocess.decode(image)

  def class_names(self) -> list[str]:
    """The name of each label, in label order (the label itself where none is known)."""
    return [str(i) for i in range(self.num_classes)]


class DigitsSource(Source):
  """scikit-learn's handwritten digits: 1,437 train / 360 test 8x8 images, bundled."""

  name = 'digits'
  num_classes = digits.NUM_CLASSES

  def _share(self, split: str, process_index: int, process_count: int):
    match = _DIGITS_SPLIT.match(split.replace(' ', ''))
    if not match:
      raise ValueError(
        f'Bad digits split {split!r}; expected train or test, optionally sliced like tfds: '
        'train[:90%], train[90%:], train[:1000].'
      )
    images, labels = digits.load(match[1])
    part = slice(_bound(match[2], len(labels)), _bound(match[3], len(labels)))
    images, labels = images[part], labels[part]
    return images[process_index::process_count], labels[process_index::process_count]

  def records(self, split: str, process_index: int = 0, process_count: int = 1) -> tf.data.Dataset:
    images, labels = self._share(split, process_index, process_count)
    return tf.data.Dataset.from_tensor_slices({'image': images, 'label': labels})

  def num_examples(self, split: str, process_index: int = 0, process_count: int = 1) -> int:
    return len(self._share(split, process_index, process_count)[1])

  def decode(self, image: tf.Tensor) -> tf.Tensor:
    return image


class FolderSource(Source):
  """Images in `root/<split>/<class>/*.jpg`; classes: the sorted folder names of the first split."""

  def __init__(self, root: str):
    self.root = root
    self.name = root
    splits = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    if not splits:
      raise ValueError(
        f'Image folder {root!r} has no split folders; expected {root}/train/<class>/*.jpg.'
      )
    first = 'train' if 'train' in splits else splits[0]
    self.classes = sorted(
      d
      for d in os.listdir(os.path.join(root, first))
      if os.path.isdir(os.path.join(root, first, d))
    )
    if not self.classes:
      raise ValueError(
        f'{root}/{first} has no class folders; expected {root}/{first}/<class>/*.jpg.'
      )
    self.num_classes = len(self.classes)
    self._listing: dict[str, tuple[tuple[str, ...], tuple[int, ...]]] = {}

  def _files(self, split: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    if split in self._listing:
      return self._listing[split]
    folder = os.path.join(self.root, split)
    if not os.path.isdir(folder):
      raise ValueError(
        f'Image folder split {folder!r} does not exist; expected {folder}/<class>/*.jpg.'
      )
    paths, labels = [], []
    for label, name in enumerate(self.classes):
      class_dir = os.path.join(folder, name)
      if not os.path.isdir(class_dir):
        continue
      for file in sorted(os.listdir(class_dir)):
        if file.lower().endswith(IMAGE_EXTENSIONS):
          paths.append(os.path.join(class_dir, file))
          labels.append(label)
    if not paths:
      raise ValueError(f'No images ({", ".join(IMAGE_EXTENSIONS)}) under {folder}/<class>/.')
    self._listing[split] = (tuple(paths), tuple(labels))
    return self._listing[split]

  def records(self, split: str, process_index: int = 0, process_count: int = 1) -> tf.data.Dataset:
    paths, labels = self._files(split)
    return tf.data.Dataset.from_tensor_slices(
      {
        'image': list(paths[process_index::process_count]),
        'label': tf.constant(labels[process_index::process_count], tf.int64),
      }
    )

  def num_examples(self, split: str, process_index: int = 0, process_count: int = 1) -> int:
    return len(self._files(split)[1][process_index::process_count])

  def class_names(self) -> list[str]:
    return list(self.classes)

  def decode(self, image: tf.Tensor) -> tf.Tensor:
    return preprocess.decode(tf.io.read_file(image))


class TfdsSource(Source):
  """A tensorflow_datasets dataset by name; hosts read `tfds.even_splits` shares."""

  label_key = 'label'  # the builder's class-label feature

  def __init__(self, name: str, data_dir: str | None = None):
    self.name = name
    self.builder = tfds.builder(name, data_dir=data_dir)
    label = self.builder.info.features[self.label_key]
    self.num_classes = label.num_classes
    self._counts: dict[tuple[str, int, int], int] = {}

  def class_names(self) -> list[str]:
    """The label names the builder declares, if it declares one per class."""
    try:
      names = list(self.builder.info.features[self.label_key].names)
    except (KeyError, AttributeError):  # no 'label' feature, or not a ClassLabel
      names = []
    return names if len(names) == self.num_classes else super().class_names()

  def _split(self, split: str, process_index: int, process_count: int):
    if process_count == 1:
      return split
    return tfds.even_splits(split, n=process_count)[process_index]

  def records(self, split: str, process_index: int = 0, process_count: int = 1) -> tf.data.Dataset:
    ds = self.builder.as_dataset(
      split=self._split(split, process_index, process_count),
      shuffle_files=False,
      decoders={'image': tfds.decode.SkipDecoding()},
    )
    return ds.map(_image_and_label)

  def num_examples(self, split: str, process_index: int = 0, process_count: int = 1) -> int:
    key = (split, process_index, process_count)
    if key not in self._counts:
      host_split = self._split(split, process_index, process_count)
      try:
        count = self.builder.info.splits[host_split].num_examples
      except (KeyError, ValueError, TypeError):
        count = 0
      if not count:  # no split metadata (e.g. under tfds.testing.mock_data): count the records
        try:
          records = self.records(split, process_index, process_count)
        except AssertionError as e:  # tfds's "could not find data"
          raise ValueError(
            f'tfds dataset {self.name!r} is not prepared in {self.builder.data_dir!r}: run '
            f'`tfds build {self.name}` first (or set --config.tfds_data_dir).'
          ) from e
        count = int(records.reduce(0, _count))
      self._counts[key] = count
    return self._counts[key]


class Subset(Source):
  """Chosen examples of one split of `base` (positions in the split's full order), each
  record with its position as `index` (int32); hosts read every `process_count`-th one."""

  def __init__(self, base: Source, split: str, indices):
    self.base, self.split = base, split
    self.name, self.num_classes = base.name, base.num_classes
    self.indices = sorted({int(i) for i in indices})

  def _check(self, split: str) -> None:
    if split != self.split:
      raise ValueError(f'This subset holds split {self.split!r} of {self.name!r}, not {split!r}.')

  def records(self, split: str, process_index: int = 0, process_count: int = 1) -> tf.data.Dataset:
    self._check(split)
    keep = [False] * (self.indices[-1] + 1 if self.indices else 0)
    for i in self.indices:
      keep[i] = True
    table = tf.constant(keep, tf.bool)

    @tf.autograph.experimental.do_not_convert
    def chosen(i, _):
      return tf.gather(table, i)

    @tf.autograph.experimental.do_not_convert
    def with_index(i, record):
      return {**record, 'index': tf.cast(i, tf.int32)}

    ds = self.base.records(split).enumerate().take(len(keep)).filter(chosen).map(with_index)
    return ds.shard(process_count, process_index)

  def num_examples(self, split: str, process_index: int = 0, process_count: int = 1) -> int:
    self._check(split)
    return len(self.indices[process_index::process_count])

  def decode(self, image: tf.Tensor) -> tf.Tensor:
    return self.base.decode(image)

  def class_names(self) -> list[str]:
    return self.base.class_names()


def get_source(dataset: str, data_dir: str | None = None) -> Source:
  """'digits', a folder `root/<split>/<class>/*.jpg`, a VTAB-1k task ('vtab/dtd'), or a tfds
  name ('cifar10', 'imagenet2012')."""
  if not dataset:
    raise ValueError('No dataset: set --config.dataset (digits, a tfds name, or an image folder).')
  if dataset == 'digits':
    return DigitsSource()
  if dataset.startswith('vtab/'):  # the VTAB-1k tasks: labels and splits of their own
    from vit_jax.data import vtab  # it builds on this module's TfdsSource

    return vtab.VtabSource(dataset.removeprefix('vtab/'), data_dir)
  if os.path.isdir(dataset):
    return FolderSource(dataset)
  if '/' in dataset or dataset.startswith('.'):
    raise ValueError(
      f'Image folder {dataset!r} does not exist; expected {dataset}/train/<class>/*.jpg.'
    )
  builders = tfds.list_builders()
  if dataset.split(':')[0] not in builders:
    close = difflib.get_close_matches(dataset, [*builders, 'digits'], n=3, cutoff=0.6)
    hint = f' Did you mean: {", ".join(close)}?' if close else ''
    if dataset == 'imagenet21k':
      hint = ' ImageNet-21k is not in public tfds: give your tfds build or an image folder.'
    raise ValueError(
      f'Unknown dataset {dataset!r}: not "digits", an existing image folder, or a tfds name.{hint}'
    )
  try:
    return TfdsSource(dataset, data_dir)
  except Exception as e:  # tfds raises many kinds here
    raise ValueError(f'Cannot open tfds dataset {dataset!r}: {str(e).splitlines()[0]}') from e


def per_host_max(total: int, process_count: int) -> int:
  """The largest host share when `total` examples are split evenly over `process_count` hosts."""
  return math.ceil(total / process_count)

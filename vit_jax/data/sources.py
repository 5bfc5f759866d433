"""Where examples come from: a tfds dataset, a folder of images per class, or the bundled digits.

A source reads this host's share of a split (hosts read disjoint shares) as raw records:
dicts holding at least `name` (a string that identifies the example to a person: a file
path, or the dataset, split and index), which `example(raw)` turns into `{'image': encoded
bytes or uint8 HxWxC, 'label': int64}`. Nothing here is random.

Most sources can be read by index: `reader()` returns a `Reader` (the share's size and a
function from record indices to records), which lets the training stream start at any
position at no cost. A tfds dataset stored as TFRecord can only be read in order (its
`reader()` is None); `records()` gives any source's share in order.
"""

import abc
import dataclasses
import math
import re
from collections.abc import Callable

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from vit_jax import files
from vit_jax.data import digits, preprocess

IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.bmp', '.gif')
# A digits split, optionally sliced like tfds: 'train', 'train[:90%]', 'train[1000:]'; parts
# joined by '+' ('train+test': all 1,797) are concatenated.
_DIGITS_SPLIT = re.compile(r'^(\w+)(?:\[(-?\d+%?)?:(-?\d+%?)?\])?$')
# Records a reader fetches at a time when a split is read in order.
_IN_ORDER_CHUNK = 256

Records = dict[str, tf.Tensor]


@dataclasses.dataclass(frozen=True)
class Reader:
  """Random access to one host's share of a split.

  `fetch(indices)` maps int64 indices in [0, size) (a vector) to raw records, each field
  holding one row per index.
  """

  size: int
  fetch: Callable[[tf.Tensor], Records]


def _bound(bound: str | None, n: int) -> int | None:
  if not bound:
    return None
  return round(int(bound[:-1]) * n / 100) if bound.endswith('%') else int(bound)


def _names(prefix: str, indices: tf.Tensor) -> tf.Tensor:
  """'PREFIX[i]' for each index: which example of which split a record is."""
  return tf.strings.join([prefix, '[', tf.strings.as_string(indices), ']'])


@tf.autograph.experimental.do_not_convert
def _count(n, _):
  return n + 1


class Source(abc.ABC):
  """A dataset with named splits; each host reads its own share of a split."""

  name: str
  num_classes: int
  # True where records hold decoded pixels rather than encoded image bytes.
  holds_pixels: bool = False

  def reader(self, split: str, process_index: int = 0, process_count: int = 1) -> Reader | None:
    """Random access to this host's share of `split`; None where it can only be read in order."""
    return None

  def records(self, split: str, process_index: int = 0, process_count: int = 1) -> tf.data.Dataset:
    """This host's share of `split` as raw records, always in the same order."""
    return self.chunks(split, _IN_ORDER_CHUNK, process_index, process_count).unbatch()

  def chunks(
    self, split: str, size: int, process_index: int = 0, process_count: int = 1
  ) -> tf.data.Dataset:
    """`records` in batches of `size` (the last one may be smaller)."""
    reader = self.reader(split, process_index, process_count)
    if reader is None:
      return self.records(split, process_index, process_count).batch(size)
    return tf.data.Dataset.range(reader.size).batch(size).map(reader.fetch)

  def num_examples(self, split: str, process_index: int = 0, process_count: int = 1) -> int:
    """How many examples this host's share of `split` holds."""
    return self.reader(split, process_index, process_count).size

  def in_order_cost(self, split: str) -> str:
    """What resuming costs where the split can only be read in order (for a warning)."""
    return f'{self.name!r} split {split!r} can only be read in order'

  def example(self, raw: Records) -> Records:
    """`{'image', 'label'}` of a raw record, and its further fields but `name` (e.g. ImageNet
    ReaL's label sets), which evaluation batches carry along."""
    return {k: v for k, v in raw.items() if k != 'name'}

  def encoded(self, image: tf.Tensor) -> tf.Tensor:
    """A record's image as encoded bytes (sources of encoded images)."""
    return image

  def adjust(self, pixels: tf.Tensor) -> tf.Tensor:
    """Pixels as the source means them, after decoding (e.g. 0/1 masks scaled to 0/255)."""
    return pixels

  def decode(self, image: tf.Tensor) -> tf.Tensor:
    """A record's image as uint8 (H, W, 3)."""
    return self.adjust(preprocess.decode(self.encoded(image)))

  def class_names(self) -> list[str]:
    """The name of each label, in label order (the label itself where none is known)."""
    return [str(i) for i in range(self.num_classes)]


def _digits_part(part: str, split: str) -> tuple[np.ndarray, np.ndarray]:
  """One '+'-joined part of a digits split: a split, optionally sliced like tfds."""
  match = _DIGITS_SPLIT.match(part)
  if not match:
    raise ValueError(
      f'Bad digits split {split!r}; expected train or test, optionally sliced and joined like '
      'tfds: train[:90%], train[90%:], train[:1000], train+test.'
    )
  images, labels = digits.load(match[1])
  rows = slice(_bound(match[2], len(labels)), _bound(match[3], len(labels)))
  return images[rows], labels[rows]


class DigitsSource(Source):
  """scikit-learn's handwritten digits: 1,437 train / 360 test 8x8 images, bundled; 'train+test'
  is all 1,797."""

  name = 'digits'
  num_classes = digits.NUM_CLASSES
  holds_pixels = True

  def _share(self, split: str, process_index: int, process_count: int):
    parts = [_digits_part(part, split) for part in split.replace(' ', '').split('+')]
    images = np.concatenate([images for images, _ in parts])
    labels = np.concatenate([labels for _, labels in parts])
    return images[process_index::process_count], labels[process_index::process_count]

  def reader(self, split: str, process_index: int = 0, process_count: int = 1) -> Reader:
    images, labels = self._share(split, process_index, process_count)
    images, labels = tf.constant(images), tf.constant(labels)

    def fetch(indices):
      return {
        'image': tf.gather(images, indices),
        'label': tf.gather(labels, indices),
        'name': _names(f'digits {split}', indices * process_count + process_index),
      }

    return Reader(len(labels), fetch)

  def num_examples(self, split: str, process_index: int = 0, process_count: int = 1) -> int:
    return len(self._share(split, process_index, process_count)[1])

  def decode(self, image: tf.Tensor) -> tf.Tensor:
    return image


class FolderSource(Source):
  """Images in `root/<split>/<class>/*.jpg`; classes: the sorted folder names of the first split.

  Any path `vit_jax.files` opens works (a local folder, a bucket).
  """

  def __init__(self, root: str):
    self.root = root
    self.name = root
    path = files.path(root)
    splits = sorted(d.name for d in path.iterdir() if d.is_dir())
    if not splits:
      raise ValueError(
        f'Image folder {root!r} has no split folders; expected {root}/train/<class>/*.jpg.'
      )
    first = 'train' if 'train' in splits else splits[0]
    self.classes = sorted(d.name for d in (path / first).iterdir() if d.is_dir())
    if not self.classes:
      raise ValueError(
        f'{root}/{first} has no class folders; expected {root}/{first}/<class>/*.jpg.'
      )
    self.num_classes = len(self.classes)
    self._listing: dict[str, tuple[tuple[str, ...], tuple[int, ...]]] = {}

  def _files(self, split: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    if split in self._listing:
      return self._listing[split]
    folder = files.path(self.root) / split
    if not folder.is_dir():
      raise ValueError(
        f'Image folder split {folder}/ does not exist; expected {folder}/<class>/*.jpg.'
      )
    paths, labels = [], []
    for label, name in enumerate(self.classes):
      class_dir = folder / name
      if not class_dir.is_dir():
        continue
      for file in sorted(f.name for f in class_dir.iterdir()):
        if file.lower().endswith(IMAGE_EXTENSIONS):
          paths.append(str(class_dir / file))
          labels.append(label)
    if not paths:
      raise ValueError(f'No images ({", ".join(IMAGE_EXTENSIONS)}) under {folder}/<class>/.')
    self._listing[split] = (tuple(paths), tuple(labels))
    return self._listing[split]

  def reader(self, split: str, process_index: int = 0, process_count: int = 1) -> Reader:
    paths, labels = self._files(split)
    paths = tf.constant(paths[process_index::process_count])
    labels = tf.constant(labels[process_index::process_count], tf.int64)

    def fetch(indices):
      path = tf.gather(paths, indices)
      return {'image': path, 'label': tf.gather(labels, indices), 'name': path}

    return Reader(int(labels.shape[0]), fetch)

  def num_examples(self, split: str, process_index: int = 0, process_count: int = 1) -> int:
    return len(self._files(split)[1][process_index::process_count])

  def class_names(self) -> list[str]:
    return list(self.classes)

  def encoded(self, image: tf.Tensor) -> tf.Tensor:
    return _read_file(image, files.is_local(self.root))


def _read_file(path: tf.Tensor, local: bool) -> tf.Tensor:
  """A file's bytes: TensorFlow reads local files; bucket objects come through the path layer."""
  if local:
    return tf.io.read_file(path)
  data = tf.py_function(lambda p: files.path(p.numpy().decode()).read_bytes(), [path], tf.string)
  return tf.ensure_shape(data, [])


class TfdsSource(Source):
  """A tensorflow_datasets dataset by name.

  Stored as ArrayRecord (`tfds build --file_format=array_record`) it is read by index
  (`tfds.data_source`), hosts taking every `process_count`-th record; stored as TFRecord
  (tfds' default) it is read in order, hosts reading `tfds.even_splits` shares.
  """

  label_key = 'label'  # the builder's class-label feature

  def __init__(self, name: str, data_dir: str | None = None):
    self.name = name
    self.builder = tfds.builder(name, data_dir=data_dir)
    self.num_classes = self.declared_classes()
    self._counts: dict[tuple[str, int, int], int] = {}
    self._data_sources: dict[str, object] = {}

  def class_names(self) -> list[str]:
    """The label names the builder declares, if it declares one per class."""
    try:
      names = list(self.builder.info.features[self.label_key].names)
    except (KeyError, AttributeError):  # no 'label' feature, or not a ClassLabel
      names = []
    return names if len(names) == self.num_classes else super().class_names()

  # Hooks for datasets whose label is derived from other features (vtab.VtabSource).
  def declared_classes(self) -> int:
    """The number of classes."""
    return self.builder.info.features[self.label_key].num_classes

  def tfds_split(self, split: str) -> str:
    """The tfds split string behind `split`."""
    return split

  def decoders(self):
    """tfds decoders: the image stays encoded until the pipeline decodes it."""
    return {'image': tfds.decode.SkipDecoding()}

  def from_features(self, features: Records) -> Records:
    """`{'image', 'label'}` (and any further fields of the example) from the decoded tfds
    features."""
    return {'image': features['image'], 'label': features[self.label_key]}

  @property
  def file_format(self) -> str:
    file_format = self.builder.info.file_format
    return file_format.value if file_format is not None else 'tfrecord'

  def _random_access(self) -> bool:
    return self.file_format == 'array_record'

  def _data_source(self, split: str):
    if split not in self._data_sources:
      self._data_sources[split] = self.builder.as_data_source(
        split=split, deserialize_method=tfds.decode.DeserializeMethod.RAW_BYTES
      )
    return self._data_sources[split]

  def reader(self, split: str, process_index: int = 0, process_count: int = 1) -> Reader | None:
    if not self._random_access():
      return None
    tfds_split = self.tfds_split(split)
    data_source = self._data_source(tfds_split)

    def read(indices: np.ndarray) -> np.ndarray:
      return np.array(data_source.__getitems__(indices.tolist()), dtype=object)

    def fetch(indices):
      indices = indices * process_count + process_index
      serialized = tf.numpy_function(read, [indices], tf.string, stateful=False)
      serialized.set_shape(indices.shape)
      return {'serialized': serialized, 'name': _names(f'{self.name} {tfds_split}', indices)}

    size = len(range(process_index, len(data_source), process_count))
    return Reader(size, fetch)

  def example(self, raw: Records) -> Records:
    if 'serialized' not in raw:  # read in order: already decoded by tfds
      return super().example(raw)
    features = self.builder.info.features.deserialize_example(
      raw['serialized'], decoders=self.decoders()
    )
    return self.from_features(features)

  def _split(self, split: str, process_index: int, process_count: int):
    split = self.tfds_split(split)
    if process_count == 1:
      return split
    return tfds.even_splits(split, n=process_count)[process_index]

  def records(self, split: str, process_index: int = 0, process_count: int = 1) -> tf.data.Dataset:
    if self._random_access():
      return super().records(split, process_index, process_count)
    ds = self.builder.as_dataset(
      split=self._split(split, process_index, process_count),
      shuffle_files=False,
      decoders=self.decoders(),
      read_config=tfds.ReadConfig(add_tfds_id=True),
    )
    unnamed = tf.constant(f'{self.name} {split}')
    # tfds_id: the TFRecord file and the index in it.
    return ds.map(lambda r: {**self.from_features(r), 'name': r.get('tfds_id', unnamed)})

  def num_examples(self, split: str, process_index: int = 0, process_count: int = 1) -> int:
    if self._random_access():
      return super().num_examples(split, process_index, process_count)
    key = (split, process_index, process_count)
    if key not in self._counts:
      self._counts[key] = self._count(split, process_index, process_count)
    return self._counts[key]

  def _count(self, split: str, process_index: int, process_count: int) -> int:
    host_split = self._split(split, process_index, process_count)
    try:
      count = self.builder.info.splits[host_split].num_examples
    except (KeyError, ValueError, TypeError):
      count = 0
    if count:
      return count
    # No split metadata (e.g. under tfds.testing.mock_data): count the records.
    try:
      records = self.records(split, process_index, process_count)
    except AssertionError as e:  # tfds's "could not find data"
      raise ValueError(
        f'tfds dataset {self.name!r} is not prepared in {self.builder.data_dir!r}: run '
        f'`tfds build {self.name}` first (or set --config.tfds_data_dir).'
      ) from e
    return int(records.reduce(0, _count))

  def in_order_cost(self, split: str) -> str:
    return (
      f'tfds {self.name!r} is stored as {self.file_format}, which is read in order: a run '
      f'resumed inside an epoch of {split!r} first re-reads the records of that epoch before '
      f'its position; `tfds build {self.builder.name} --file_format=array_record` makes '
      'resuming free'
    )


class Derived(Source):
  """A source made from `base`: its name, classes and kind of records, and every read
  forwarded to it but those a subclass changes."""

  def __init__(self, base: Source):
    self.base = base
    self.name, self.num_classes, self.holds_pixels = base.name, base.num_classes, base.holds_pixels

  def reader(self, split: str, process_index: int = 0, process_count: int = 1) -> Reader | None:
    return self.base.reader(split, process_index, process_count)

  def records(self, split: str, process_index: int = 0, process_count: int = 1) -> tf.data.Dataset:
    return self.base.records(split, process_index, process_count)

  def num_examples(self, split: str, process_index: int = 0, process_count: int = 1) -> int:
    return self.base.num_examples(split, process_index, process_count)

  def in_order_cost(self, split: str) -> str:
    return self.base.in_order_cost(split)

  def example(self, raw: Records) -> Records:
    return self.base.example(raw)

  def encoded(self, image: tf.Tensor) -> tf.Tensor:
    return self.base.encoded(image)

  def adjust(self, pixels: tf.Tensor) -> tf.Tensor:
    return self.base.adjust(pixels)

  def decode(self, image: tf.Tensor) -> tf.Tensor:
    return self.base.decode(image)

  def class_names(self) -> list[str]:
    return self.base.class_names()


class Subset(Derived):
  """Chosen examples of one split of `base` (positions in the split's full order), each
  record with its position as `index` (int32); hosts read every `process_count`-th one.
  Read by index where `base` is."""

  def __init__(self, base: Source, split: str, indices):
    super().__init__(base)
    self.split = split
    self.indices = sorted({int(i) for i in indices})

  def _check(self, split: str) -> None:
    if split != self.split:
      raise ValueError(f'This subset holds split {self.split!r} of {self.name!r}, not {split!r}.')

  def reader(self, split: str, process_index: int = 0, process_count: int = 1) -> Reader | None:
    self._check(split)
    base = self.base.reader(split)
    if base is None:
      return None
    if self.indices and self.indices[-1] >= base.size:
      raise ValueError(f'Subset position {self.indices[-1]} is past {split!r} of {self.name}.')
    positions = tf.constant(self.indices[process_index::process_count], tf.int64)

    def fetch(indices):
      chosen = tf.gather(positions, indices)
      return {**base.fetch(chosen), 'index': tf.cast(chosen, tf.int32)}

    return Reader(int(positions.shape[0]), fetch)

  def records(self, split: str, process_index: int = 0, process_count: int = 1) -> tf.data.Dataset:
    if self.reader(split) is not None:  # by index, through this subset's reader
      return Source.records(self, split, process_index, process_count)
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

  def example(self, raw: Records) -> Records:
    rest = {k: v for k, v in raw.items() if k != 'index'}
    return {**self.base.example(rest), 'index': raw['index']}


def per_host_max(total: int, process_count: int) -> int:
  """The largest host share when `total` examples are split evenly over `process_count` hosts."""
  return math.ceil(total / process_count)

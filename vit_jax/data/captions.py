"""Image-text pairs: a folder of images with a captions file, tfds captions datasets, and a
labelled dataset captioned from its class names.

Every captions source gives records whose `example(raw)` holds `image`, `label` (0 where the
data has none) and `texts`: the example's captions as one string, joined by newlines (an
image may have several). The training pipeline draws one of them per example with `draw`,
keyed by the example's position in the stream (itself a function of the seed, the epoch and
the record's index), so a resumed run draws the same captions; it then tokenizes the drawn
caption with the tokenizer it is given: the run's task resolves it once, from the model's
family (`vit_jax.families.two_towers.tokenizer`), the same the zero-shot evaluator and
`vit-zeroshot` use.

  folder   ROOT/<split>/captions.tsv, lines `path<TAB>caption`; a path relative to the split
           folder or absolute; an image's lines (in any order) are its captions, kept in the
           file's order. `config.dataset=ROOT`.
  tfds     `coco_captions` (images, captions/text) and any tfds dataset with a `captions`
           sequence of texts. `config.dataset=coco_captions`.
  classes  a labelled dataset (the digits, an image folder, a tfds classification dataset)
           with `config.caption_templates` ('a photo of the digit {}.', ...): the captions of
           an example are the templates filled with its class name.
"""

from collections.abc import Sequence

import tensorflow as tf

from vit_jax import files
from vit_jax.data.sources import Derived, Reader, Records, Source, TfdsSource, _read_file

CAPTIONS_FILE = 'captions.tsv'
SEPARATOR = '\n'
# Folded into an example's seed for its caption draw, apart from its augmentation's.
_DRAW_KEY = 0x7E47


def draw(texts: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
  """One of the newline-joined captions `texts`, uniformly, as a pure function of `seed`."""
  parts = tf.strings.split(texts, SEPARATOR)
  n = tf.shape(parts, out_type=tf.int64)[0]
  key = tf.random.experimental.stateless_fold_in(seed, _DRAW_KEY)
  i = tf.random.stateless_uniform([], key, minval=0, maxval=n, dtype=tf.int64)
  return parts[i]


def has_captions(root: str) -> bool:
  """Whether the folder `root` is a captions folder (a split with a captions file)."""
  path = files.path(root)
  return any((d / CAPTIONS_FILE).exists() for d in path.iterdir() if d.is_dir())


class FolderCaptions(Source):
  """Images with captions: ROOT/<split>/captions.tsv (see the module docstring)."""

  num_classes = 0

  def __init__(self, root: str):
    self.root = root
    self.name = root
    self._listing: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}

  def _pairs(self, split: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(image paths, their newline-joined captions), sorted by path."""
    if split in self._listing:
      return self._listing[split]
    folder = files.path(self.root) / split
    listing = folder / CAPTIONS_FILE
    if not listing.exists():
      raise ValueError(f'{listing} not found; expected lines `path<TAB>caption`.')
    captions: dict[str, list[str]] = {}
    for n, line in enumerate(listing.read_text().splitlines(), 1):
      if not line.strip():
        continue
      path, tab, caption = line.partition('\t')
      if not tab or not caption.strip():
        raise ValueError(f'{listing}:{n}: expected `path<TAB>caption`, got {line[:80]!r}.')
      full = path if files.path(path).is_absolute() else str(folder / path)
      captions.setdefault(full, []).append(caption.strip())
    paths = tuple(sorted(captions))
    self._listing[split] = (paths, tuple(SEPARATOR.join(captions[p]) for p in paths))
    return self._listing[split]

  def reader(self, split: str, process_index: int = 0, process_count: int = 1) -> Reader:
    paths, texts = self._pairs(split)
    paths = tf.constant(paths[process_index::process_count], tf.string)
    texts = tf.constant(texts[process_index::process_count], tf.string)

    def fetch(indices):
      path = tf.gather(paths, indices)
      label = tf.zeros_like(indices, tf.int64)
      return {'image': path, 'label': label, 'texts': tf.gather(texts, indices), 'name': path}

    return Reader(int(paths.shape[0]), fetch)

  def num_examples(self, split: str, process_index: int = 0, process_count: int = 1) -> int:
    return len(self._pairs(split)[0][process_index::process_count])

  def encoded(self, image: tf.Tensor) -> tf.Tensor:
    return _read_file(image, files.is_local(self.root))


class TfdsCaptions(TfdsSource):
  """A tfds dataset of images with a `captions` sequence of texts (coco_captions)."""

  def declared_classes(self) -> int:
    return 0

  def from_features(self, features: Records) -> Records:
    captions = tf.strings.regex_replace(features['captions']['text'], '\\s+', ' ')
    texts = tf.strings.reduce_join(captions, separator=SEPARATOR)
    return {'image': features['image'], 'label': tf.constant(0, tf.int64), 'texts': texts}


def is_tfds_captions(builder) -> bool:
  features = builder.info.features
  return 'captions' in features and 'text' in getattr(features['captions'], 'feature', {})


class ClassCaptions(Derived):
  """A labelled source whose examples' captions are `templates` filled with the class name."""

  def __init__(self, base: Source, templates: Sequence[str]):
    super().__init__(base)
    self.templates = tuple(templates)
    rows = [SEPARATOR.join(t.format(c) for t in self.templates) for c in base.class_names()]
    self._table = tf.constant(rows, tf.string)

  def example(self, raw: Records) -> Records:
    example = self.base.example(raw)
    return {**example, 'texts': tf.gather(self._table, example['label'])}


# The sources whose examples carry `texts`.
CAPTIONED = (FolderCaptions, TfdsCaptions, ClassCaptions)


def check_captioned(source: Source) -> None:
  """A one-line ValueError, naming the fixes, for a source whose examples have no texts."""
  if not isinstance(source, CAPTIONED):
    raise ValueError(
      f'Dataset {source.name!r} has no captions, which image-text training reads: give a '
      'folder with train/captions.tsv or a tfds dataset with captions (--config.dataset), or '
      'make captions of the class names (--config.caption_templates=\'("a photo of a {}.",)\').'
    )

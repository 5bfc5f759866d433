"""Embeddings of large collections, in resumable shards: images of a folder or a dataset, texts
(what `vit-embed` runs).

  embedder = embed.embedder(vit_jax.load(CKPT), texts=False)
  embed.run(embedder, embed.folder_inputs(DIR), OUT, CKPT, shard_size=10_000)

The inputs are numbered: a folder's image files (recursively, by sorted relative path), a
split's examples by index, a file's non-empty lines. Shard i holds inputs
[i * shard_size, (i + 1) * shard_size) of them, less the images that cannot be read, in the
shard folder of `vit_jax.data.embeddings` (each shard's two files written atomically, the ids
last, so a shard with its ids file is finished and never redone). Several processes split
the shards (process p embeds those with i % count == p); process 0 waits for every shard and
writes the manifest, last.
"""

import dataclasses
import math
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from vit_jax import files
from vit_jax.data import embeddings as store
from vit_jax.inference.model import Model, run_padded

# Image files of a folder: the input pipeline's formats, and those Pillow reads besides.
EXTENSIONS = ('.jpg', '.jpeg', '.png', '.bmp', '.gif', '.webp', '.tif', '.tiff')


@dataclasses.dataclass
class Embedder:
  """A model as a function of inputs: `prepare` one input (decoded uint8 pixels, or a text)
  into the model's input row, `apply` a batch of at most `batch_size` rows -> (n, D)."""

  model: str
  kind: str  # 'pre-logits', 'image' or 'text' (an exported classifier: 'logits', 'features')
  preprocessing: str
  prepare: Callable[[Any], np.ndarray]
  apply: Callable[[np.ndarray], np.ndarray]


def embedder(model: Model, texts: bool = False) -> Embedder:
  """What `model` embeds: with `texts` an image-text model's text embeddings, else its
  normalised image embeddings, a classifier's pre-logits features (an exported classifier's
  outputs: its logits, or its features where it was exported without a head); each batch
  padded to the model's `batch_size`, one compiled shape."""
  size = model.batch_size
  padded = lambda fn: lambda batch: run_padded(fn, batch, size)
  if texts:
    return Embedder(
      model.name,
      'text',
      f'tokenizer {model.vocab}',
      lambda text: model.tokenize([text])[0],
      padded(model.embed_texts),
    )
  from vit_jax.data import images

  if model.image_text:
    kind, fn = 'image', model.embed_images
  elif model.module is None:  # exported: its one function's output
    kind, fn = ('logits', model.logits) if model.num_classes else ('features', model.features)
  else:
    kind, fn = 'pre-logits', model.features
  prepare = lambda image: images.host_input(model.preprocessing, image)
  return Embedder(model.name, kind, model.preprocessing.describe(), prepare, padded(fn))


@dataclasses.dataclass
class Inputs:
  """Numbered inputs: `read(start, end)` gives (id, value or the reason it is unreadable) for
  each of [start, end); `describe` is the manifest's `input`."""

  size: int
  read: Callable[[int, int], Iterator[tuple[Any, Any]]]
  describe: dict[str, Any]


def _image_files(folder) -> Iterator[Any]:
  """The image files under `folder`, recursively (by `iterdir`: bucket paths take no `**`)."""
  for entry in folder.iterdir():
    if entry.is_dir():
      yield from _image_files(entry)
    elif entry.suffix.lower() in EXTENSIONS:
      yield entry


def folder_inputs(root: str) -> Inputs:
  """A folder's image files, recursively, by sorted relative path (the ids)."""
  from vit_jax.data.images import ImageError, read_image

  base = files.path(root)
  if not base.is_dir():
    raise ValueError(f'--folder {root}: not a folder')
  names = sorted(p.relative_to(base).as_posix() for p in _image_files(base))

  def read(start, end):
    for name in names[start:end]:
      try:
        yield name, read_image(base / name)
      except ImageError as e:
        yield name, ImageError(str(e).removeprefix(f'{base / name}: '))

  return Inputs(len(names), read, {'folder': str(root)})


def dataset_inputs(dataset: str, split: str, data_dir: str | None) -> Inputs:
  """A split of a dataset `vit_jax.data.get_source` opens, by example index (the ids)."""
  import tensorflow as tf

  from vit_jax import data
  from vit_jax.data.images import ImageError

  source = data.get_source(dataset, data_dir)

  def read(start, end):
    reader = source.reader(split)
    if reader is not None:  # random access: read only [start, end)
      indices = tf.data.Dataset.range(start, end).batch(256)
      records = indices.map(reader.fetch).unbatch()
    else:
      records = source.records(split).skip(start).take(end - start)
    for index, raw in enumerate(records, start):
      try:
        yield index, source.decode(source.example(raw)['image']).numpy()
      except tf.errors.OpError as e:
        yield index, ImageError(' '.join(e.message.split()))

  size = source.num_examples(split)
  return Inputs(size, read, {'dataset': dataset, 'split': split})


def text_inputs(path: str, captions: bool) -> Inputs:
  """A file's non-empty lines, by 1-based line number (the ids): each a text, or with
  `captions` an `IMAGE<TAB>CAPTION` line's caption."""
  lines = []
  for n, line in enumerate(files.path(path).read_text().splitlines(), 1):
    text = line.partition('\t')[2] if captions else line
    if captions and line.strip() and not text.strip():
      raise ValueError(f'{path}:{n}: expected IMAGE<TAB>CAPTION')
    if text.strip():
      lines.append((n, text.strip()))
  describe = {'captions' if captions else 'texts': path}
  return Inputs(len(lines), lambda start, end: iter(lines[start:end]), describe)


# ---------------------------------------------------------------------------------------
# The shards.


def _dimension(embedder: Embedder) -> int:
  """The embedding width, from one blank input (for a shard of unreadable images only)."""
  blank = '' if embedder.kind == 'text' else np.zeros((8, 8, 3), np.uint8)
  return int(embedder.apply(embedder.prepare(blank)[None]).shape[-1])


def embed_shard(
  embedder: Embedder, inputs: Inputs, start: int, end: int, batch_size: int
) -> tuple[np.ndarray, list[Any], list[dict[str, Any]]]:
  """Inputs [start, end): (embeddings (n, D) float32, their n ids, the unreadable ones)."""
  ids, rows, bad = [], [], []
  for key, value in inputs.read(start, end):
    try:
      if isinstance(value, Exception):
        raise value
      rows.append(embedder.prepare(value))
      ids.append(key)
    except ValueError as e:  # ImageError, or pixels of a shape no image has
      bad.append({'id': key, 'reason': ' '.join(str(e).split())})
  parts = [
    embedder.apply(np.stack(rows[i : i + batch_size])) for i in range(0, len(rows), batch_size)
  ]
  if not parts:
    return np.zeros((0, _dimension(embedder)), np.float32), ids, bad
  return np.concatenate(parts).astype(np.float32), ids, bad


class Progress:
  """One line on stderr, rewritten in place: inputs done, rate and time left."""

  def __init__(self, total: int, enabled: bool):
    self.total, self.enabled, self.done = total, enabled, 0
    self.start = time.monotonic()

  def update(self, n: int) -> None:
    self.done += n
    if not self.enabled:
      return
    rate = self.done / max(time.monotonic() - self.start, 1e-9)
    left = (self.total - self.done) / rate if rate else 0
    line = f'embedded {self.done:,}/{self.total:,}, {rate:,.1f}/s, {left / 60:.1f} min left'
    print(f'\r{line}', end='' if self.done < self.total else '\n', file=sys.stderr, flush=True)


def run(
  embedder: Embedder,
  inputs: Inputs,
  out: str,
  checkpoint: str,
  shard_size: int = 10_000,
  batch_size: int = 32,
  process: tuple[int, int] = (0, 1),
  progress: bool = False,
  wait_s: float = 3600.0,
) -> dict[str, Any] | None:
  """Embeds this process's unfinished shards (`process`: (index, count)); process 0 then waits
  for the others' and writes the manifest, which it returns (the others return None)."""
  if not inputs.size:
    raise ValueError(f'nothing to embed in {inputs.describe}')
  num_shards = math.ceil(inputs.size / shard_size)
  settings = {'model': embedder.model, 'checkpoint': files.absolute(checkpoint)}
  settings |= {'kind': embedder.kind, 'preprocessing': embedder.preprocessing}
  settings |= {'input': inputs.describe, 'examples': inputs.size, 'shard_size': shard_size}
  settings |= {'batch_size': batch_size}  # another one may change the last bits
  files.makedirs(out)
  store.check_settings(out, settings)
  index, count = process
  mine = range(index, num_shards, count)
  store.remove_partial(out, mine, num_shards)
  todo = [i for i in mine if not store.finished(out, i, num_shards)]
  meter = Progress(sum(min(shard_size, inputs.size - i * shard_size) for i in todo), progress)
  for i in todo:
    start, end = i * shard_size, min((i + 1) * shard_size, inputs.size)
    array, ids, bad = embed_shard(embedder, inputs, start, end, batch_size)
    store.write_shard(out, i, num_shards, array, ids, bad)
    meter.update(end - start)
  if index != 0:
    return None
  store.wait_for_shards(out, num_shards, wait_s)
  return store.write_manifest(out, num_shards, settings)

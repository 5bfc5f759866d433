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

import collections
import dataclasses
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent import futures
from typing import Any

import numpy as np

from vit_jax import data, files
from vit_jax.data import embeddings as store
from vit_jax.inference import model as inference_model
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


def embedder(model: Model, texts: bool = False, pack: tuple[int, int] = (0, 0)) -> Embedder:
  """What `model` embeds: with `texts` an image-text model's text embeddings, else its
  normalised image embeddings, a classifier's pre-logits features (an exported classifier's
  outputs: its logits, or its features where it was exported without a head); each batch
  padded to the model's `batch_size`, one compiled shape. `pack`: (tokens, images) of a
  NaFlex model's rows packed with up to `images` patch sequences (`packed`); (0, 0): one
  image a row."""
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
  from vit_jax.data import images as images_lib

  if model.image_text:
    kind, fn = 'image', model.embed_images
  elif model.module is None:  # exported: its one function's output
    kind, fn = ('logits', model.logits) if model.num_classes else ('features', model.features)
  else:
    kind, fn = 'pre-logits', model.features
  describe, apply = model.preprocessing.describe(), padded(fn)
  if pack[0]:  # the same embeddings, computed on rows of several images
    describe, apply = f'{describe}, packed {pack[1]} a row of {pack[0]}', packed(model, *pack)
  prepare = lambda image: images_lib.host_input(model.preprocessing, image)
  return Embedder(model.name, kind, describe, prepare, apply)


def packed(model: Model, tokens: int, images: int) -> Callable[[np.ndarray], np.ndarray]:
  """A NaFlex model's `embed_images` of a batch of patch sequences (n, N, P + 3), computed
  on rows of `tokens` slots holding up to `images` of them each (`packing.pack_rows`, every
  image placed): each image attends to itself alone and is pooled alone, so its embedding
  is the one it has alone in a row, to float rounding; one compiled shape, `batch_size`
  rows."""
  from vit_jax.data import packing

  rows_of = inference_model.packed_image_program(model, images)

  def apply(batch: np.ndarray) -> np.ndarray:
    order = np.arange(len(batch), dtype=np.int32)
    rows = packing.pack_rows(batch, tokens, images, index=order)
    out = run_padded(rows_of, rows['image'], model.batch_size)  # (R, K, D)
    held = rows['slots'] > 0
    result = np.empty((len(batch), out.shape[-1]), np.float32)
    result[rows['index'][held]] = out[held]
    return result

  return apply


@dataclasses.dataclass
class Inputs:
  """Numbered inputs: `read(start, end)` gives (id, raw) for each of [start, end), and
  `load(raw)` the value (decoded pixels, a text) or the reason it is unreadable, an exception
  returned or raised; `load` runs in worker threads. `describe` is the manifest's `input`."""

  size: int
  read: Callable[[int, int], Iterator[tuple[Any, Any]]]
  describe: dict[str, Any]
  load: Callable[[Any], Any] = lambda raw: raw


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
    return ((name, base / name) for name in names[start:end])

  def load(path):
    try:
      return read_image(path)
    except ImageError as e:  # the manifest names the file by its id
      return ImageError(str(e).removeprefix(f'{path}: '))

  return Inputs(len(names), read, {'folder': str(root)}, load)


def dataset_inputs(dataset: str, split: str, data_dir: str | None) -> Inputs:
  """A split of a dataset `vit_jax.data.get_source` opens, by example index (the ids)."""
  import tensorflow as tf

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


# Threads that decode and prepare inputs ahead of the model (simplejpeg, Pillow and numpy let
# go of the GIL, as XLA does while the model runs), and how many batches they may run ahead.
WORKERS = data.default_threads()
BATCHES_AHEAD = 2


def _prepared(
  embedder: Embedder, inputs: Inputs, items: Iterable[tuple[Any, Any]], ahead: int
) -> Iterator[tuple[Any, np.ndarray | None, str]]:
  """(id, the model's input row, '') of each item in order, or (id, None, why unreadable);
  loaded and prepared by `WORKERS` threads at most `ahead` items ahead of the caller."""

  def prepare(item):
    key, raw = item
    try:
      value = inputs.load(raw)
      if isinstance(value, Exception):
        raise value
      return key, embedder.prepare(value), ''
    except ValueError as e:  # ImageError, or pixels of a shape no image has
      return key, None, ' '.join(str(e).split())

  with futures.ThreadPoolExecutor(WORKERS) as pool:
    pending = collections.deque()
    for item in items:
      pending.append(pool.submit(prepare, item))
      if len(pending) >= ahead:
        yield pending.popleft().result()
    while pending:
      yield pending.popleft().result()


def embed_shard(
  embedder: Embedder,
  inputs: Inputs,
  start: int,
  end: int,
  batch_size: int,
  meter: 'Progress | None' = None,
) -> tuple[np.ndarray, list[Any], list[dict[str, Any]]]:
  """Inputs [start, end): (embeddings (n, D) float32, their n ids, the unreadable ones); the
  next batch is prepared while the model runs on this one, and `meter` moves each batch."""
  ids, rows, bad, parts = [], [], [], []
  counted = start  # inputs the meter has been told of

  def apply(done: int) -> None:
    nonlocal counted
    if rows:
      parts.append(embedder.apply(np.stack(rows)))
      rows.clear()
    if meter:
      meter.update(done - counted)
    counted = done

  items = _prepared(embedder, inputs, inputs.read(start, end), BATCHES_AHEAD * batch_size)
  for done, (key, row, reason) in enumerate(items, start + 1):
    if row is None:
      bad.append({'id': key, 'reason': reason})
      continue
    rows.append(row)
    ids.append(key)
    if len(rows) == batch_size:
      apply(done)
  apply(end)
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
    array, ids, bad = embed_shard(embedder, inputs, start, end, batch_size, meter)
    store.write_shard(out, i, num_shards, array, ids, bad)
  if index != 0:
    return None
  store.wait_for_shards(out, num_shards, wait_s)
  return store.write_manifest(out, num_shards, settings)

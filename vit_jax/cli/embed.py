"""Embeddings of large collections, in resumable shards: images of a folder or a dataset, texts.

  python -m vit_jax.embed --checkpoint=CKPT --out=OUT --folder=DIR [--shard_size=10000]
  python -m vit_jax.embed --checkpoint=CKPT --out=OUT --dataset=digits [--split=test]
  python -m vit_jax.embed --checkpoint=LIT --out=OUT --texts=FILE  (or --captions=FILE)

The model is any checkpoint `vit-predict` or `vit-zeroshot` reads: a classifier gives its
pre-logits features (as `vit-predict --features`, the same preprocessing and function), an
image-text model (LiT, SigLIP) its normalised image embeddings (preprocessed as
`vit-zeroshot` does), or with `--texts` (one text a line) or `--captions` (`IMAGE<TAB>CAPTION`
lines: the captions) its normalised text embeddings. A directory `vit-export` wrote (with
export.json) is run from its StableHLO, preprocessed as export.json states
(`vit_jax.export.load_artifact`).

The inputs are numbered: a folder's image files (recursively, by sorted relative path), a
split's examples by index, a file's non-empty lines. Shard i holds inputs
[i * shard_size, (i + 1) * shard_size) of them, less the images that cannot be read:

  OUT/embeddings-00000-of-00004.npy   float32 (n, D)
  OUT/ids-00000-of-00004.json         {"ids": [...], "bad": [...], "key": ...}: the n ids
                                      (relative paths, example indices or line numbers)
  OUT/manifest.json                   model, checkpoint, preprocessing, dimension, count,
                                      shards, and `bad`: each unreadable image and why

Each shard's two files are written atomically (a temporary file renamed into place), the ids
last, so a shard with its ids file is finished and never redone; anything else is removed
and redone. Rerunning the same command after any stop continues, and gives the files an
uninterrupted run gives, bit for bit. A folder holding another command's shards is an error.

Several processes (`jax.process_count()`, or `--process_index`/`--process_count` for plain
processes) split the shards: process p embeds those with i % count == p; process 0 waits for
every shard (at most `--wait_s`) and writes the manifest, last. Unreadable images are listed,
not fatal: the exit status is 0 with them, 1 for any other error, 2 for a usage error.
"""

import dataclasses
import math
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from absl import flags, logging

from vit_jax import cli, files
from vit_jax.data import embeddings as store

# Image files of a folder: the input pipeline's formats, and those Pillow reads besides.
EXTENSIONS = ('.jpg', '.jpeg', '.png', '.bmp', '.gif', '.webp', '.tif', '.tiff')


# ---------------------------------------------------------------------------------------
# What to embed with: the model's preprocessing and batch function.


@dataclasses.dataclass
class Embedder:
  """A model as a function of inputs: `prepare` one input (decoded uint8 pixels, or a text)
  into the model's input row, `apply` a batch of `batch_size` rows -> (batch_size, D)."""

  model: str
  kind: str  # 'pre-logits', 'image' or 'text'
  preprocessing: str
  prepare: Callable[[Any], np.ndarray]
  apply: Callable[[np.ndarray], np.ndarray]


def classifier_embedder(checkpoint, model_name, resolution, batch_size: int) -> Embedder:
  """A classifier's pre-logits features: `vit-predict --features`' preprocessing and function."""
  from vit_jax.cli import predict

  loaded = predict.load(checkpoint, model_name, resolution)
  r = loaded.resolution
  return Embedder(
    loaded.model_name,
    'pre-logits',
    f'resize to {r}x{r} (tf.image.resize, bilinear), (x - 127.5) / 127.5',
    lambda image: predict.preprocess(image, r),
    lambda batch: predict.features(loaded, batch, batch_size),
  )


def image_text_embedder(checkpoint, vocab, max_patches, texts: bool, batch_size: int) -> Embedder:
  """An image-text model's normalised image embeddings, or with `texts` its text embeddings,
  as `vit-zeroshot` computes them."""
  from vit_jax.cli import predict, zeroshot
  from vit_jax.evals import zeroshot as zeroshot_eval

  loaded = zeroshot.load(checkpoint, vocab, max_patches)
  if texts:
    embed = zeroshot_eval.text_embedder(loaded.model)
    return Embedder(
      loaded.name,
      'text',
      f'tokenizer {loaded.vocab}',
      lambda text: np.asarray(loaded.tokenizer([text]), np.int32)[0],
      lambda tokens: zeroshot_eval.embed_tokens(embed, loaded.params, tokens, batch_size),
    )
  if loaded.sequence is None:
    how = f'resize to {loaded.size}x{loaded.size} (bilinear), uint8, [-1, 1] (LiT)'
  else:
    how = 'NaFlex: at most {1} patches of {0} px at the aspect ratio'.format(*loaded.sequence)

  def images(model, params, batch):
    return loaded.apply({'params': params}, images=batch)[0]

  return Embedder(
    loaded.name,
    'image',
    how,
    lambda image: loaded.preprocess(image).numpy(),
    lambda batch: predict.run_padded(images, loaded.model, loaded.params, batch, batch_size),
  )


def _padded(fn: Callable[[np.ndarray], np.ndarray], batch_size: int):
  """`fn` on batches padded to `batch_size` (one compiled shape), the padding cut off: as
  `predict.run_padded` pads a model's batches."""
  from vit_jax.cli import predict

  return lambda batch: predict.run_padded(lambda _, __, x: fn(x), None, None, batch, batch_size)


def artifact_embedder(directory: str, texts: bool, batch_size: int) -> Embedder:
  """What `vit-export` wrote, run from its StableHLO (no flax model): a classifier's outputs
  (its logits, or its features where it was exported without a head), an image-text model's
  image embeddings, or with `texts` its text embeddings; preprocessed as export.json states."""
  from vit_jax.export import load_artifact

  artifact = load_artifact(directory)
  if texts:
    tokenize = artifact.tokenizer
    settings = artifact.meta['text']['tokenizer']
    return Embedder(
      artifact.model,
      'text',
      f'tokenizer {settings["name"]} ({settings["vocab"]}), max_len {settings["max_len"]}',
      lambda text: np.asarray(tokenize([text]), np.int32)[0],
      _padded(artifact.function('text'), batch_size),
    )
  name = 'image' if artifact.image_text else 'model'
  kind = 'image' if artifact.image_text else artifact.output_name(name)
  return Embedder(
    artifact.model,
    kind,
    artifact.meta['preprocessing']['text'],
    artifact.preprocess,
    _padded(artifact.function(name), batch_size),
  )


# ---------------------------------------------------------------------------------------
# What to embed: numbered inputs, read a range at a time.


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
  from vit_jax.data.preprocess import ImageError, read_image

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
  from vit_jax.data.preprocess import ImageError

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


def embed(
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


# ---------------------------------------------------------------------------------------
# The command line.


def _inputs(o: dict[str, Any]) -> Inputs:
  if o['folder']:
    return folder_inputs(o['folder'])
  if o['dataset']:
    return dataset_inputs(o['dataset'], o['split'], o['tfds_data_dir'])
  return text_inputs(o['texts'] or o['captions'], captions=bool(o['captions']))


def _usage(o: dict[str, Any], image_text: bool, exported: bool = False) -> str | None:
  """What is wrong with the flags, or None."""
  given = [k for k in ('folder', 'dataset', 'texts', 'captions') if o[k]]
  index, count = o['process_index'], o['process_count']
  if len(given) != 1:
    return 'give one of --folder, --dataset, --texts, --captions'
  if o['shard_size'] < 1 or o['batch_size'] < 1:
    return '--shard_size and --batch_size must be positive'
  if not 0 <= index < count:
    return f'--process_index={index} is not one of the {count} processes'
  if given[0] in ('texts', 'captions') and not image_text:
    return f'--{given[0]}: texts need an image-text model (LiT, SigLIP); this one is a classifier'
  if not image_text and (o['vocab'] or o['max_patches']):
    return '--vocab and --max_patches are for an image-text model'
  if exported and (o['vocab'] or o['max_patches'] or o['model'] or o['resolution']):
    return 'an exported model (export.json) takes no --model, --resolution, --vocab, --max_patches'
  return None


def run(checkpoint: str, out: str, options: dict[str, Any]) -> int:
  """The command line's work; the exit status: 0 (also with unreadable images, which the
  manifest lists), 1 for an error, 2 for a usage error; one line on stderr for each."""
  from vit_jax import checkpoint as ckpt
  from vit_jax import export

  o = {'folder': '', 'dataset': '', 'split': 'test', 'texts': '', 'captions': ''}
  o |= {'model': None, 'resolution': None, 'vocab': None, 'max_patches': 0, 'wait_s': 3600.0}
  o |= {'shard_size': 10_000, 'batch_size': 32, 'tfds_data_dir': None, 'progress': False}
  o |= {'process_index': None, 'process_count': None} | options
  if o['process_count'] is None or o['process_index'] is None:
    import jax  # several processes of one jax.distributed program

    o['process_count'] = o['process_count'] or jax.process_count()
    o['process_index'] = (
      o['process_index'] if o['process_index'] is not None else jax.process_index()
    )
  try:
    exported = export.is_export_dir(checkpoint)
    if exported:
      image_text = export.load_artifact(checkpoint).image_text
    else:
      image_text = ckpt.holds_image_text(checkpoint)
    usage = _usage(o, image_text, exported)
    if usage:
      print(f'error: {usage}', file=sys.stderr)
      return 2
    texts = bool(o['texts'] or o['captions'])
    if exported:
      embedder = artifact_embedder(checkpoint, texts, o['batch_size'])
    elif image_text:
      embedder = image_text_embedder(
        checkpoint, o['vocab'], o['max_patches'], texts, o['batch_size']
      )
    else:
      embedder = classifier_embedder(checkpoint, o['model'], o['resolution'], o['batch_size'])
    inputs = _inputs(o)
    process = (o['process_index'], o['process_count'])
    manifest = embed(
      embedder, inputs, out, checkpoint, o['shard_size'], o['batch_size'], process,
      o['progress'], o['wait_s'],
    )  # fmt: skip
  except (OSError, ValueError, KeyError) as e:
    print(f'error: {e}'.replace('\n', ' '), file=sys.stderr)
    return 1
  if manifest is not None:
    bad = manifest['bad']
    print(
      f'{manifest["count"]:,} embeddings ({manifest["dimension"]} wide, {embedder.kind}) in '
      f'{len(manifest["shards"])} shards under {out}'
      + (f'; {len(bad)} unreadable, listed in {store.MANIFEST}' if bad else ''),
      file=sys.stderr,
    )
  return 0


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """The command line's flags, on `flag_values` (defined at program start)."""
  from vit_jax.cli import predict

  fv = flag_values
  predict.define_checkpoint_flags(fv)
  flags.DEFINE_string('out', None, 'The output folder.', required=True, flag_values=fv)
  flags.DEFINE_string('folder', '', 'Embed the images under this folder.', flag_values=fv)
  flags.DEFINE_string('dataset', '', 'Embed a split of: digits, a tfds name.', flag_values=fv)
  flags.DEFINE_string('split', 'test', 'The split of --dataset.', flag_values=fv)
  flags.DEFINE_string('tfds_data_dir', None, 'tensorflow_datasets directory.', flag_values=fv)
  flags.DEFINE_string('texts', '', 'Embed these texts, one a line.', flag_values=fv)
  flags.DEFINE_string('captions', '', 'Embed the captions of IMAGE<TAB>CAPTION.', flag_values=fv)
  flags.DEFINE_string('vocab', None, 'An image-text model: its vocabulary.', flag_values=fv)
  flags.DEFINE_integer('max_patches', 0, "A NaFlex model's patches (0: its own).", flag_values=fv)
  flags.DEFINE_integer('shard_size', 10_000, 'Inputs a shard.', flag_values=fv)
  flags.DEFINE_integer('batch_size', 32, 'Inputs per forward pass.', flag_values=fv)
  flags.DEFINE_integer(
    'process_index', None, 'This process (default: jax.process_index()).', flag_values=fv
  )
  flags.DEFINE_integer(
    'process_count', None, 'Processes (default: jax.process_count()).', flag_values=fv
  )
  flags.DEFINE_float('wait_s', 3600.0, "Process 0's wait for the others' shards.", flag_values=fv)
  flags.DEFINE_bool('progress', None, 'A progress line (default: at a terminal).', flag_values=fv)


def _stop(signum, frame) -> None:
  """SIGTERM as an exit, so that a write in flight removes its temporary file."""
  sys.exit(128 + signum)


def main(argv: Sequence[str]) -> None:
  f = flags.FLAGS
  if len(argv) > 1:
    print(f'error: unexpected arguments {argv[1:]}; give --folder=DIR', file=sys.stderr)
    sys.exit(2)
  if not f['verbosity'].present:
    logging.set_verbosity(logging.WARNING)
  signal.signal(signal.SIGTERM, _stop)
  from vit_jax import data

  data.hide_accelerators_from_tensorflow()
  keys = ('folder', 'dataset', 'split', 'tfds_data_dir', 'texts', 'captions', 'vocab')
  keys += ('max_patches', 'shard_size', 'batch_size', 'process_index', 'process_count', 'wait_s')
  options = {k: f[k].value for k in keys} | {'model': f.model, 'resolution': f.resolution}
  options['progress'] = sys.stderr.isatty() if f.progress is None else f.progress
  sys.exit(run(f.checkpoint, f.out, options))


def run_cli() -> None:
  """The `vit-embed` console script (and `python -m vit_jax.embed`)."""
  cli.start(define_flags, main)

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
(`vit_jax.export.load_artifact`). A NaFlex model (SigLIP 2's) with `--pack=T` runs its
images packed several to a row of T patch slots (at most `--images_per_row`; NaViT's Patch
n' Pack, vit_jax/data/packing.py): each image attends to and is pooled over its own patches
alone, so its embedding is its unpacked one to float rounding, and the rows carry less
padding.

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

import signal
import sys
from collections.abc import Sequence
from typing import Any

from absl import flags
from etils import epy

from vit_jax import cli

with epy.lazy_imports():  # jax loads on first use, once the arguments are checked
  from vit_jax import inference
  from vit_jax.data import embeddings
  from vit_jax.inference import embed


def _inputs(o: dict[str, Any]) -> Any:
  if o['folder']:
    return embed.folder_inputs(o['folder'])
  if o['dataset']:
    return embed.dataset_inputs(o['dataset'], o['split'], o['tfds_data_dir'])
  return embed.text_inputs(o['texts'] or o['captions'], captions=bool(o['captions']))


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
  if o['pack'] and (exported or given[0] in ('texts', 'captions') or o['images_per_row'] < 1):
    return '--pack packs the images of a NaFlex model, --images_per_row >= 1 of them a row'
  return None


def run(checkpoint: str, out: str, options: dict[str, Any]) -> int:
  """The command line's work; the exit status: 0 (also with unreadable images, which the
  manifest lists), 1 for an error, 2 for a usage error; one line on stderr for each."""
  o = {'folder': '', 'dataset': '', 'split': 'test', 'texts': '', 'captions': ''}
  o |= {'model': None, 'resolution': None, 'vocab': None, 'max_patches': 0, 'wait_s': 3600.0}
  o |= {'shard_size': 10_000, 'batch_size': 32, 'tfds_data_dir': None, 'progress': False}
  o |= {'dtype': 'float32', 'pack': 0, 'images_per_row': 8}
  o |= {'process_index': None, 'process_count': None} | options
  paths = [checkpoint, *(o[k] for k in ('folder', 'texts', 'captions') if o[k])]
  if cli.said_missing(paths):  # before jax loads
    return 1
  if o['process_count'] is None or o['process_index'] is None:
    import jax  # several processes of one jax.distributed program

    o['process_count'] = o['process_count'] or jax.process_count()
    o['process_index'] = (
      o['process_index'] if o['process_index'] is not None else jax.process_index()
    )
  try:
    image_text, exported = inference.holds(checkpoint)
    usage = _usage(o, image_text, exported)
    if usage:
      print(f'error: {usage}', file=sys.stderr)
      return 2
    model = inference.load(
      checkpoint, model=o['model'], resolution=o['resolution'], vocab=o['vocab'],
      max_patches=o['max_patches'], batch_size=o['batch_size'], dtype=o['dtype'],
    )  # fmt: skip
    pack = (o['pack'], o['images_per_row']) if o['pack'] else (0, 0)
    embedder = embed.embedder(model, texts=bool(o['texts'] or o['captions']), pack=pack)
    process = (o['process_index'], o['process_count'])
    manifest = embed.run(
      embedder, _inputs(o), out, checkpoint, o['shard_size'], o['batch_size'], process,
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
      + (f'; {len(bad)} unreadable, listed in {embeddings.MANIFEST}' if bad else ''),
      file=sys.stderr,
    )
  return 0


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """The command line's flags, on `flag_values` (defined at program start)."""
  fv = flag_values
  cli.define_checkpoint_flags(fv)
  cli.define_dtype_flag(fv)
  flags.DEFINE_string('out', None, 'The output folder.', required=True, flag_values=fv)
  flags.DEFINE_string('folder', '', 'Embed the images under this folder.', flag_values=fv)
  flags.DEFINE_string('dataset', '', 'Embed a split of: digits, a tfds name.', flag_values=fv)
  flags.DEFINE_string('split', 'test', 'The split of --dataset.', flag_values=fv)
  flags.DEFINE_string('tfds_data_dir', None, 'tensorflow_datasets directory.', flag_values=fv)
  flags.DEFINE_string('texts', '', 'Embed these texts, one a line.', flag_values=fv)
  flags.DEFINE_string('captions', '', 'Embed the captions of IMAGE<TAB>CAPTION.', flag_values=fv)
  flags.DEFINE_string('vocab', None, 'An image-text model: its vocabulary.', flag_values=fv)
  flags.DEFINE_integer(
    'max_patches', 0, 'Patches an image of a patch-sequence model (0: its own).', flag_values=fv
  )
  flags.DEFINE_integer(
    'pack',
    0,
    'A NaFlex model: patch slots a row packed with several images (0: one a row).',
    flag_values=fv,
  )
  flags.DEFINE_integer('images_per_row', 8, 'With --pack: the most images a row.', flag_values=fv)
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
  cli.quiet_logs()
  signal.signal(signal.SIGTERM, _stop)
  keys = ('folder', 'dataset', 'split', 'tfds_data_dir', 'texts', 'captions', 'vocab')
  keys += ('max_patches', 'shard_size', 'batch_size', 'process_index', 'process_count', 'wait_s')
  keys += ('dtype', 'pack', 'images_per_row')
  options = {k: f[k].value for k in keys} | {'model': f.model, 'resolution': f.resolution}
  options['progress'] = sys.stderr.isatty() if f.progress is None else f.progress
  sys.exit(run(f.checkpoint, f.out, options))


def run_cli() -> None:
  """The `vit-embed` console script (and `python -m vit_jax.embed`)."""
  cli.start(define_flags, main)

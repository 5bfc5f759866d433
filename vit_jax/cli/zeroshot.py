r"""Zero-shot classification with an image-text model (LiT, SigLIP): classes named in words.

  python -m vit_jax.zeroshot --checkpoint=LiT-B16B_2.npz --classes=cat,dog,boat [--top_k 3] \
      [--templates=clip_best] [--json] IMAGE...
  python -m vit_jax.zeroshot --checkpoint=LiT-B16B_2.npz --dataset=cifar100 [--split=test] \
      [--limit=N] [--json] [--out=RUN_DIR]
  python -m vit_jax.zeroshot --checkpoint=LiT-B16B_2.npz --captions=captions.tsv [--json]
  python -m vit_jax.zeroshot --checkpoint=LiT-B16B_2.npz --dataset=digits --embeddings=OUT

The first prints each image's top-k classes with probabilities: LiT's softmax over the classes
of exp(t) times the cosine similarities, SigLIP's sigmoid(exp(t) * similarity + b) of each
class alone (they need not sum to 1). The second prints the top-1 accuracy over a split of a
tfds dataset, an image folder (`root/<split>/<class>/*.jpg`) or 'digits'; with `--out` it
also writes a run folder that `python -m vit_jax.reproduce report` puts beside the LiT model
card's number; with `--embeddings=OUT`, the image embeddings that `vit-embed` wrote of
that split (`vit_jax.data.embeddings`), labels read from the dataset by index. The third prints
image-to-text and text-to-image recall@1/5/10 (`vit_jax.evals.retrieval`, big_vision's metric
names) over `IMAGE<TAB>CAPTION` lines (an image may have several). A `--dataset` with captions
(`coco_captions`, a captions folder) is retrieval too: COCO's protocol by default, the 5,000
images of Karpathy's test split and the first 5 captions of each (`--max_texts`); with
`--embeddings=OUT` its image embeddings are vit-embed's too.

The tokenizer's vocabulary is read beside the checkpoint by the released naming (`NAME.txt`
for a BERT tower, `NAME.model` for a sentencepiece one), a training run's from its
config.json (its zero-shot evaluator's `vocab`, else `config.pp.vocab`), or from `--vocab`
(a SigLIP file's is not beside it). Class names come from `--classes` (a comma-separated list, or a
file with one name a line), else from `--dataset` (ImageNet: CLIP's curated names);
templates from `--templates` (set names of vit_jax/evals/prompts.py, or templates with '{}',
separated by ';'), by default the ones a training run evaluated zero-shot with (its
zero-shot evaluator's `templates`, also kept in NAME.json beside a file `vit-convert` wrote
from it), else `clip_best`. Names and templates are canonicalised as big_vision does unless
`--nocanonicalize` (a run's: as it did). So on a run directory, or on its converted file,
the command prints the run's own zero-shot numbers.
Each class embedding is the mean of its prompts' normalised embeddings, renormalised
(`vit_jax.evals.zeroshot`); the class embeddings are cached in `--cache_dir` by checkpoint
(path, size, time), vocabulary, names and templates, since 1,000 classes and 80 templates are
80,000 text passes.

Images are preprocessed as the model states (`vit_jax.load`: its family's spec): a released
LiT or SigLIP file's as the original code does (resized to the model's size without a crop,
bilinear, cast to uint8, then to [-1, 1]), a training run's as its own evaluation does, a
patch-sequence model's (SigLIP 2's of any aspect ratio) at their own aspect ratio as at most
`--max_patches` patches (default: its own, 256). A file that is not an image-text model, a
missing vocabulary, a vocabulary of the wrong kind or size for the text tower, an unknown
dataset and an unreadable image are errors of one line; the other images are still classified.
"""

import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from absl import flags
from etils import epy

from vit_jax import cli

with epy.lazy_imports():  # jax (TensorFlow for a dataset) loads on first use, once checked
  from vit_jax import data as data_lib
  from vit_jax import inference
  from vit_jax.data import captions as captions_lib
  from vit_jax.inference import zeroshot


def _print_recalls(info: dict[str, Any], recalls: dict[str, float], as_json: bool) -> int:
  if as_json:
    print(json.dumps({**info, **recalls}))
  else:
    print(', '.join(f'{k} {v:.4f}' for k, v in recalls.items()))
  return 0


def _dataset_retrieval(model, source, dataset: str, o: dict[str, Any], say) -> int:
  """Retrieval over a captions dataset's split, printed; COCO's protocol by default; the
  image embeddings `vit-embed` stored where `--embeddings` names them."""
  max_texts = o['max_texts']
  max_texts = zeroshot.PROTOCOL_CAPTIONS.get(dataset, 0) if max_texts is None else max_texts
  say(f'Embedding the captions (and images) of split {o["split"]!r} of {dataset} ...')
  stored = (o['embeddings'], dataset) if o['embeddings'] else None
  recalls, images, texts = zeroshot.dataset_recalls(
    model, source, o['split'], o['batch_size'], o['limit'], max_texts, stored
  )
  info = {'model': model.name, 'dataset': dataset, 'split': o['split']}
  info |= {'num_images': images, 'num_texts': texts}
  if not o['json']:
    print(f'{model.name}: {images} images, {texts} captions of split {o["split"]!r} of {dataset}')
  return _print_recalls(info, recalls, o['json'])


# `run`'s options where the caller gives none (the flags' defaults, but for templates).
OPTIONS = {
  'vocab': None, 'split': 'test', 'limit': 0, 'top_k': 5, 'json': False, 'batch_size': 32,
  'canonicalize': None, 'cache_dir': '', 'tfds_data_dir': None, 'out': '', 'captions': '',
  'max_texts': None, 'max_patches': 0, 'progress': False, 'embeddings': '', 'dtype': 'float32',
}  # fmt: skip


def _usage(images, classes: str, dataset: str, o: dict[str, Any]) -> str | None:
  """What is wrong with what the command is asked to classify, or None."""
  if [bool(images), bool(dataset), bool(o['captions'])].count(True) != 1:
    return 'give one of: image files (with --classes), --dataset, --captions'
  if images and not classes:
    return 'no class names for the images: give --classes=a,b,c (or a file of names)'
  if o['embeddings'] and (not dataset or o['limit']):
    return '--embeddings (of vit-embed) go with --dataset, without --limit'
  return None


def _split_accuracy(model, zcls, source, dataset: str, o: dict[str, Any], say):
  """(top-1 accuracy, count) over `o['split']`: of `o['embeddings']` where vit-embed stored
  the split's image embeddings, else of the images embedded now."""
  if o['embeddings']:
    return zeroshot.stored_accuracy(o['embeddings'], zcls, source, dataset, o['split'])
  say(f'Classifying split {o["split"]!r} of {dataset} ...')
  return zeroshot.dataset_accuracy(model, zcls, source, o['split'], o['batch_size'], o['limit'])


def _classes(model, source, dataset: str, classes: str, templates, o: dict[str, Any]):
  """(class names, filled templates), with a warning where two classes tokenize alike."""
  names, filled, alike = zeroshot.classes_and_templates(
    model, source, dataset, classes, templates, o['canonicalize']
  )
  for a, b in alike[:1]:
    print(
      f'warning: classes {a!r} and {b!r} tokenize alike with {model.vocab} (words it does '
      'not know?): their probabilities are equal',
      file=sys.stderr,
    )
  return names, filled


def run(
  checkpoint: str,
  images: Sequence[str],
  classes: str = '',
  templates: str | None = None,
  dataset: str = '',
  options: dict[str, Any] | None = None,
) -> int:
  """The command line's work; returns the exit status: 2 for a usage error, 1 for any other
  error, one line on stderr. `options`: the flags (vocab, split, limit, top_k, json,
  batch_size, canonicalize, cache_dir, tfds_data_dir, out, captions, embeddings: a
  `vit-embed` folder of the split's image embeddings, max_texts: None for the dataset's
  protocol, max_patches) and `progress`: say on stderr what it is doing before each slow part
  (at a terminal). `templates` and `canonicalize` None: the checkpoint's, else 'clip_best'
  and True."""
  o = {**OPTIONS, **(options or {})}
  say = (lambda line: print(line, file=sys.stderr, flush=True)) if o['progress'] else len
  usage = _usage(images, classes, dataset, o)
  if usage:
    print(f'error: {usage}', file=sys.stderr)
    return 2
  if cli.said_missing([checkpoint, o['captions'] or ''], images):  # before jax loads
    return 1
  try:
    say(f'Reading {checkpoint} ...')
    model = _load(checkpoint, o)
    if o['captions']:
      say(f'Embedding the images and captions of {o["captions"]} ...')
      recalls = zeroshot.retrieval_recalls(model, o['captions'], o['batch_size'])
      return _print_recalls({'model': model.name, 'captions': o['captions']}, recalls, o['json'])
    source = data_lib.get_source(dataset, o['tfds_data_dir']) if dataset else None
    if source is not None and isinstance(source, captions_lib.CAPTIONED):
      return _dataset_retrieval(model, source, dataset, o, say)
    names, filled = _classes(model, source, dataset, classes, templates, o)
    say(f'Embedding {len(names)} classes x {len(filled)} templates (or reading the cache) ...')
    zcls, cached = zeroshot.class_embeddings(model, names, filled, o['cache_dir'])
    if source:
      accuracy, count = _split_accuracy(model, zcls, source, dataset, o, say)
    else:
      say(f'Classifying {len(images)} image files ...')
      good, probs, errors = zeroshot.classify_files(model, zcls, images, o['batch_size'])
  except (OSError, ValueError, KeyError) as e:
    print(f'error: {e}'.replace('\n', ' '), file=sys.stderr)
    return 1
  if not o['json']:
    print(
      f'{model.name}: {len(names)} classes x {len(filled)} templates'
      f'{" (class embeddings from the cache)" if cached else ""}'
    )
  if source:
    result = {'model': model.name, 'dataset': dataset, 'split': o['split'], 'count': count}
    result['accuracy'] = accuracy
    if o['out']:
      zeroshot.write_run(o['out'], model, result)
    print(json.dumps(result) if o['json'] else f'zero-shot top-1 {accuracy:.4f} on {count} images')
    return 0
  shown = zeroshot.predictions(model, good, probs, names, o['top_k'], errors)
  cli.print_zero_shot(shown, o['json'])
  return 1 if errors else 0


def _load(checkpoint: str, o: dict[str, Any]):
  """The image-text model of `checkpoint`, with its tokenizer; one-line ValueErrors."""
  try:
    model = inference.load(
      checkpoint, vocab=o['vocab'], max_patches=o['max_patches'], dtype=o['dtype'],
      batch_size=o['batch_size'],
    )  # fmt: skip
  except ValueError as e:  # the library names its argument; the command line, its flag
    if str(e).startswith('max_patches='):
      raise ValueError(f'--{e}') from None
    raise
  if not model.image_text:
    raise ValueError(
      'not an image-text (LiT, SigLIP) checkpoint: it holds no text tower; classify with '
      'python -m vit_jax.predict'
    )
  if model.tokenizer is None:
    raise ValueError(model.vocab_error)
  return model


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """The command line's flags, on `flag_values` (defined at program start)."""
  fv = flag_values
  flags.DEFINE_string('checkpoint', None, 'A LiT or SigLIP .npz.', required=True, flag_values=fv)
  cli.define_dtype_flag(fv)
  flags.DEFINE_string('vocab', None, 'Tokenizer vocabulary; default: beside it.', flag_values=fv)
  flags.DEFINE_string('classes', '', 'Class names: a,b,c or a file of one a line.', flag_values=fv)
  flags.DEFINE_string(
    'templates',
    'clip_best',
    "Template sets or templates with '{}', ';'-separated (default: a run's own, else these).",
    flag_values=fv,
  )
  flags.DEFINE_string('dataset', '', 'A tfds name, an image folder or digits.', flag_values=fv)
  flags.DEFINE_string(
    'captions', '', 'Retrieval recall@1/5/10 over IMAGE<TAB>CAPTION lines.', flag_values=fv
  )
  flags.DEFINE_string('split', 'test', 'The split of --dataset.', flag_values=fv)
  flags.DEFINE_integer(
    'max_texts',
    None,
    "A captions --dataset: each image's first N captions (default: coco_captions 5, else all).",
    flag_values=fv,
  )
  flags.DEFINE_integer(
    'max_patches', 0, 'Patches an image of a patch-sequence model (0: its own).', flag_values=fv
  )
  flags.DEFINE_integer('limit', 0, 'Only the first N examples (0: all).', flag_values=fv)
  flags.DEFINE_string(
    'embeddings', '', "With --dataset: vit-embed's folder of its image embeddings.", flag_values=fv
  )
  flags.DEFINE_string('tfds_data_dir', None, 'tensorflow_datasets directory.', flag_values=fv)
  flags.DEFINE_string(
    'out', '', 'With --dataset: write the result as a run folder for the report.', flag_values=fv
  )
  flags.DEFINE_integer('top_k', 5, 'How many classes to show per image.', flag_values=fv)
  flags.DEFINE_bool('json', False, 'Print JSON instead of text.', flag_values=fv)
  flags.DEFINE_integer('batch_size', 32, 'Images per forward pass.', flag_values=fv)
  flags.DEFINE_bool('canonicalize', True, 'Canonicalise names and templates.', flag_values=fv)
  default_cache = os.path.join(os.path.expanduser('~'), '.cache', 'vit_jax', 'zeroshot')
  flags.DEFINE_string(
    'cache_dir', default_cache, "Class embeddings cache ('': none).", flag_values=fv
  )


def main(argv: Sequence[str]) -> None:
  f = flags.FLAGS
  cli.quiet_logs()
  progress = sys.stderr.isatty()
  if progress:  # JAX (and for a dataset TensorFlow) take seconds to load
    print('vit-zeroshot: loading JAX ...', file=sys.stderr, flush=True)
  keys = ('vocab', 'split', 'limit', 'top_k', 'json', 'batch_size', 'cache_dir')
  keys += ('tfds_data_dir', 'out', 'captions', 'max_texts', 'max_patches', 'embeddings', 'dtype')
  options = {k: f[k].value for k in keys}
  options['progress'] = progress
  # Unless given, a run's own (or its converted file's): what it evaluated zero-shot with.
  options['canonicalize'] = f.canonicalize if f['canonicalize'].present else None
  templates = f.templates if f['templates'].present else None
  sys.exit(run(f.checkpoint, argv[1:], f.classes, templates, f.dataset, options))


def run_cli() -> None:
  """The `vit-zeroshot` console script (and `python -m vit_jax.zeroshot`)."""
  cli.start(define_flags, main)

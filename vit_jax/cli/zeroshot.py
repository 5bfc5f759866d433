"""Zero-shot classification with an image-text model (LiT, SigLIP): classes named in words.

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

Images are preprocessed as the original LiT code does: resized to the model's size without a
crop (bilinear), cast to uint8, then to [-1, 1]; a NaFlex model's (SigLIP 2's `*-naflex`) at
their own aspect ratio as at most `--max_patches` patches (default: its own, 256), as a run
evaluates it. A file that is not an image-text model, a
missing vocabulary, a vocabulary of the wrong kind or size for the text tower, an unknown
dataset and an unreadable image are errors of one line; the other images are still classified.
"""

import dataclasses
import functools
import hashlib
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from absl import flags, logging

from vit_jax import checkpoint as ckpt
from vit_jax import cli, families, files


@dataclasses.dataclass
class Loaded:
  """An image-text checkpoint ready to embed: model, parameters, tokenizer, t and b."""

  model: Any
  params: Any
  tokenizer: Any
  name: str
  size: int
  vocab: str
  t: float  # exp of the checkpoint's t
  b: float | None  # SigLIP's logit bias
  # How it is used beyond its weights: a run's zero-shot templates, or its converted file's.
  uses: ckpt.two_towers.Uses
  # A NaFlex image tower's (patch side, patches an image); None: `size` x `size` images.
  sequence: tuple[int, int] | None = None

  def preprocess(self, image):
    """Decoded pixels -> the image tower's input: the original LiT's resize to `size`, or a
    NaFlex tower's patch sequence (`vit_jax.data.preprocess.patch_sequence`)."""
    if self.sequence is None:
      return lit_preprocess(image, self.size)
    from vit_jax.data.preprocess import patch_sequence

    return patch_sequence(image, *self.sequence)

  @functools.cached_property
  def apply(self):
    """The model's apply, compiled (images alone: the normalised image embeddings)."""
    return jax.jit(self.model.apply)


def load(checkpoint: str, vocab: str | None = None, max_patches: int = 0) -> Loaded:
  """The image-text model of `checkpoint` and its tokenizer; one-line ValueErrors.
  `max_patches`: a NaFlex image tower's patches an image (0: its `pp.max_patches`)."""
  fitted = ckpt.fit(checkpoint)
  config = fitted.config
  family = families.of_config(config)
  if not family.image_text:
    raise ValueError(
      'not an image-text (LiT, SigLIP) checkpoint: it holds no text tower; classify with '
      'python -m vit_jax.predict'
    )
  pp = dict(config.get('pp') or {})
  name = pp.get('tokenizer_name', 'bert')
  uses = ckpt.two_towers.uses(checkpoint, name)
  path = vocab or uses.vocab
  if path is None:
    beside = str(checkpoint).removesuffix('.npz') + ckpt.two_towers.VOCAB_SUFFIX[name]
    raise ValueError(
      f'no tokenizer vocabulary beside the checkpoint: expected {beside} (a {name} vocabulary); '
      'give it with --vocab'
    )
  tokenizer = family.tokenizer(pp, path)
  rows = dict(config.text)['vocab_size']
  if tokenizer.vocab_size > rows:
    raise ValueError(
      f'{path}: {tokenizer.vocab_size} pieces, but the text tower embeds {rows}: not this '
      "checkpoint's vocabulary"
    )
  params = fitted.params
  t = float(np.exp(np.asarray(params['t']).reshape(())))
  b = float(np.asarray(params['b']).reshape(())) if 'b' in params else None
  label = fitted.name or family.describe(config)
  size = int(pp.get('size', 224))
  patch, sequence = family.sequence_patch(config), None
  if patch is not None:
    sequence = (patch, max_patches or int(pp['max_patches']))
  elif max_patches:
    raise ValueError(f'--max_patches={max_patches}: {label} takes {size} px images, not patches')
  return Loaded(fitted.model(), params, tokenizer, label, size, path, t, b, uses, sequence)


def read_classes(classes: str) -> list[str]:
  """A comma-separated list, or a file of one name a line."""
  if files.path(classes).is_file():
    lines = files.path(classes).read_text().splitlines()
    return [line.strip() for line in lines if line.strip()]
  return [name.strip() for name in classes.split(',') if name.strip()]


def _cache_key(loaded: Loaded, checkpoint: str, names, templates) -> str:
  stat = os.stat(checkpoint) if files.is_local(checkpoint) else None
  where = [os.path.abspath(checkpoint), stat and stat.st_size, stat and stat.st_mtime_ns]
  text = json.dumps([where, os.path.abspath(loaded.vocab), names, templates])
  return hashlib.sha256(text.encode()).hexdigest()[:32]


def class_embeddings(loaded: Loaded, checkpoint: str, names, templates, cache_dir: str):
  """(C, D) class embeddings, read from or written to `cache_dir` ('' = no cache)."""
  from vit_jax.evals import zeroshot

  path = os.path.join(cache_dir, _cache_key(loaded, checkpoint, names, templates) + '.npy')
  if cache_dir and os.path.exists(path):
    return np.load(path, allow_pickle=False), True
  args = (loaded.model, loaded.params, loaded.tokenizer, names, templates)
  zcls = zeroshot.class_embeddings(*args)
  if cache_dir:
    os.makedirs(cache_dir, exist_ok=True)
    np.save(path + '.tmp.npy', zcls)
    os.replace(path + '.tmp.npy', path)
  return zcls, False


def lit_preprocess(image, size: int):
  """The original's `PreprocessImages` (crop=False): bilinear resize, uint8, [-1, 1]."""
  import tensorflow as tf

  image = tf.cast(tf.image.resize(image, [size, size], method='bilinear'), tf.uint8)
  return -1 + tf.cast(image, tf.float32) / 255 * 2


def tokenized_alike(loaded: Loaded, names: Sequence[str], templates: Sequence[str]) -> list:
  """The class names whose prompts the tokenizer cannot tell apart (words it does not know
  become one unknown id): their embeddings, and so their probabilities, are equal."""
  tokens = np.asarray(loaded.tokenizer([t.format(n) for n in names for t in templates]))
  seen: dict[bytes, str] = {}
  pairs = []
  for name, row in zip(names, tokens.reshape(len(names), -1), strict=True):
    first = seen.setdefault(row.tobytes(), name)
    if first != name:
      pairs.append((first, name))
  return pairs


def _embed_images(loaded: Loaded, images: np.ndarray) -> np.ndarray:
  return np.asarray(loaded.apply({'params': loaded.params}, images=images)[0])


def classify_files(loaded: Loaded, zcls, paths, batch_size: int):
  """(names of the readable images, their probabilities (n, C)), and one error per other."""
  from vit_jax.data.preprocess import ImageError, read_image
  from vit_jax.evals import zeroshot

  good, pixels, errors = [], [], []
  for path in paths:
    try:
      pixels.append(loaded.preprocess(read_image(path)).numpy())
      good.append(path)
    except ImageError as e:
      errors.append(str(e))
  probs = []
  for start in range(0, len(pixels), batch_size):
    zimg = _embed_images(loaded, np.stack(pixels[start : start + batch_size]))
    probs.append(np.asarray(zeroshot.probabilities(zimg, zcls, loaded.t, loaded.b)))
  return good, (np.concatenate(probs) if probs else np.zeros((0, len(zcls)))), errors


def _embed_split(loaded: Loaded, source, split: str, batch_size: int, limit: int, field: str):
  """The image embeddings of `split` (its first `limit` examples if set) and each example's
  `field` ('label', 'texts'): (zimg (N, D), values (N,))."""
  import tensorflow as tf

  from vit_jax import data as data_lib

  @tf.autograph.experimental.do_not_convert
  def prepare(raw):
    example = source.example(raw)
    return loaded.preprocess(source.decode(example['image'])), example[field]

  records = source.records(split)
  if limit:
    records = records.take(limit)
  zimg, values = [], []
  for images, value in data_lib.host_batches(records.map(prepare).batch(batch_size)):
    zimg.append(_embed_images(loaded, images))
    values.append(value)
  if not zimg:
    raise ValueError(f'split {split!r} is empty')
  return np.concatenate(zimg), np.concatenate(values)


def dataset_accuracy(loaded: Loaded, zcls, source, split: str, batch_size: int, limit: int):
  """Top-1 accuracy over `split` (its first `limit` examples if set): (accuracy, count)."""
  from vit_jax.evals import zeroshot

  zimg, labels = _embed_split(loaded, source, split, batch_size, limit, 'label')
  return zeroshot.accuracy(zimg, labels, zcls), len(labels)


def split_field(source, split: str, field: str) -> np.ndarray:
  """The `field` ('label', 'texts') of each example of `split`, by index; no image decoded."""
  import tensorflow as tf

  @tf.autograph.experimental.do_not_convert
  def value(raw):
    return source.example(raw)[field]

  batches = list(source.records(split).map(value).batch(4096).as_numpy_iterator())
  return np.concatenate(batches) if batches else np.zeros((0,), np.int64)


def stored_images(out: str, dataset: str, split: str) -> tuple[np.ndarray, np.ndarray]:
  """The image embeddings `vit-embed` wrote of `split` of `dataset` into `out`, checked to
  be those: (zimg (N, D), their example indices)."""
  from vit_jax.data import embeddings

  manifest, zimg, ids = embeddings.read(out)
  if manifest['kind'] != 'image' or manifest['input'] != {'dataset': dataset, 'split': split}:
    raise ValueError(
      f'--embeddings {out}: {manifest["kind"]} embeddings of {manifest["input"]}, not the '
      f'image embeddings of split {split!r} of {dataset}'
    )
  return zimg, np.asarray(ids, np.int64)


def _check_width(zimg: np.ndarray, ztxt: np.ndarray) -> None:
  """Image embeddings (stored by vit-embed) as wide as this model's text embeddings."""
  if zimg.shape[1] != ztxt.shape[1]:
    raise ValueError(
      f"image embeddings {zimg.shape[1]} wide, the text tower's {ztxt.shape[1]}: not this "
      "model's (--embeddings of another checkpoint?)"
    )


def stored_accuracy(out: str, zcls, source, dataset: str, split: str) -> tuple[float, int]:
  """Top-1 accuracy over the image embeddings `vit-embed` wrote of `split` into `out` (the
  labels read from the dataset by index): (accuracy, count)."""
  from vit_jax.evals import zeroshot

  zimg, ids = stored_images(out, dataset, split)
  _check_width(zimg, zcls)
  labels = split_field(source, split, 'label')[ids]
  return zeroshot.accuracy(zimg, labels, zcls), len(ids)


def read_captions(path: str) -> tuple[list[str], list[str], np.ndarray]:
  """A captions file, `IMAGE<TAB>CAPTION` a line (an image on several lines has several
  captions; relative image paths are beside the file): (images, captions, each caption's
  image index)."""
  images, captions, owners = [], [], []
  index: dict[str, int] = {}
  for n, line in enumerate(files.path(path).read_text().splitlines(), 1):
    if not line.strip():
      continue
    image, tab, caption = line.partition('\t')
    if not tab or not image.strip() or not caption.strip():
      raise ValueError(f'{path}:{n}: expected IMAGE<TAB>CAPTION')
    image = files.join(os.path.dirname(str(path)), image.strip())
    if image not in index:
      index[image] = len(images)
      images.append(image)
    captions.append(caption.strip())
    owners.append(index[image])
  if not captions:
    raise ValueError(f'{path}: no captions')
  return images, captions, np.asarray(owners)


def _recalls(loaded: Loaded, zimg: np.ndarray, captions: list[str], owners) -> dict[str, float]:
  """Recall@1/5/10 both ways of the image embeddings `zimg` and the captions (`owners`: the
  image of each)."""
  from vit_jax.evals import retrieval, zeroshot

  tokens = np.asarray(loaded.tokenizer(captions), np.int32)
  embed = zeroshot.text_embedder(loaded.model)
  ztxt = zeroshot.embed_tokens(embed, loaded.params, tokens, min(256, len(tokens)))
  _check_width(zimg, ztxt)
  return retrieval.recalls(zimg, ztxt, owners)


def retrieval_recalls(loaded: Loaded, captions_file: str, batch_size: int) -> dict[str, float]:
  """Image-to-text and text-to-image recall@1/5/10 over a captions file."""
  from vit_jax.data.preprocess import read_image

  images, captions, owners = read_captions(captions_file)
  pixels = [loaded.preprocess(read_image(p)).numpy() for p in images]
  zimg = np.concatenate(
    [
      _embed_images(loaded, np.stack(pixels[i : i + batch_size]))
      for i in range(0, len(pixels), batch_size)
    ]
  )
  return _recalls(loaded, zimg, captions, owners)


# COCO's retrieval protocol keeps each image's first 5 captions (a few have 6 or 7).
PROTOCOL_CAPTIONS = {'coco_captions': 5}


def dataset_recalls(
  loaded: Loaded, source, split: str, batch_size: int, limit: int, max_texts: int,
  stored: tuple[str, str] | None = None,
) -> tuple[dict[str, float], int, int]:  # fmt: skip
  """Recall@1/5/10 over a captions dataset's split (its first `limit` images if set, each
  image's first `max_texts` captions; 0: all): (recalls, images, captions). `stored`:
  (a vit-embed folder of the split's image embeddings, the dataset's name), used instead of
  embedding the images."""
  from vit_jax.evals import retrieval

  if stored is None:
    zimg, joined = _embed_split(loaded, source, split, batch_size, limit, 'texts')
  else:
    zimg, ids = stored_images(stored[0], stored[1], split)
    joined = split_field(source, split, 'texts')[ids]
  captions, owners = retrieval.image_captions([t.decode() for t in joined], max_texts)
  return _recalls(loaded, zimg, captions, owners), len(joined), len(captions)


def write_run(out: str, checkpoint: str, loaded: Loaded, result: dict[str, Any]) -> None:
  """A run directory for `python -m vit_jax.reproduce report`: config.json (the model, the
  dataset, the checkpoint, no training steps) and one metrics line `zeroshot/<dataset>`."""
  from vit_jax import rundir

  name = os.path.basename(str(checkpoint)).removesuffix('.npz')
  config = {
    'model_name': name,
    'dataset': result['dataset'],
    'pretrained_path': str(checkpoint),
    'pp': {'crop': loaded.size, 'test': result['split'], 'train': ''},
    'total_steps': 0,
  }
  files.path(out).mkdir(parents=True, exist_ok=True)
  rundir.write_config(out, config, {})
  line = {'step': 0, f'zeroshot/{result["dataset"]}': result['accuracy'], 'count': result['count']}
  files.atomic_write_text(files.join(out, rundir.METRICS_FILE), json.dumps(line) + '\n')


def _print_predictions(good, probs, names, k, loaded, as_json, errors) -> None:
  k = min(k, len(names))
  top = np.argsort(-probs, axis=1, kind='stable')[:, :k]
  rows = [
    {'image': path, 'top_k': [{'class': names[c], 'probability': float(p[c])} for c in order]}
    for path, p, order in zip(good, probs, top, strict=True)
  ]
  if as_json:
    kind = 'sigmoid' if loaded.b is not None else 'softmax'
    info = {'model': loaded.name, 'classes': len(names), 'probabilities': kind}
    print(json.dumps({**info, 'predictions': rows, 'errors': errors}, indent=1))
    return
  for row in rows:
    shown = ', '.join(f'{c["class"]} {c["probability"]:.4f}' for c in row['top_k'])
    print(f'{row["image"]}: {shown}')


def _print_recalls(info: dict[str, Any], recalls: dict[str, float], as_json: bool) -> int:
  if as_json:
    print(json.dumps({**info, **recalls}))
  else:
    print(', '.join(f'{k} {v:.4f}' for k, v in recalls.items()))
  return 0


def _dataset_retrieval(loaded: Loaded, source, dataset: str, o: dict[str, Any], say) -> int:
  """Retrieval over a captions dataset's split, printed; COCO's protocol by default; the
  image embeddings `vit-embed` stored where `--embeddings` names them."""
  max_texts = o['max_texts']
  max_texts = PROTOCOL_CAPTIONS.get(dataset, 0) if max_texts is None else max_texts
  say(f'Embedding the captions (and images) of split {o["split"]!r} of {dataset} ...')
  stored = (o['embeddings'], dataset) if o['embeddings'] else None
  recalls, images, texts = dataset_recalls(
    loaded, source, o['split'], o['batch_size'], o['limit'], max_texts, stored
  )
  info = {'model': loaded.name, 'dataset': dataset, 'split': o['split']}
  info |= {'num_images': images, 'num_texts': texts}
  if not o['json']:
    print(f'{loaded.name}: {images} images, {texts} captions of split {o["split"]!r} of {dataset}')
  return _print_recalls(info, recalls, o['json'])


# `run`'s options where the caller gives none (the flags' defaults, but for templates).
OPTIONS = {
  'vocab': None, 'split': 'test', 'limit': 0, 'top_k': 5, 'json': False, 'batch_size': 32,
  'canonicalize': None, 'cache_dir': '', 'tfds_data_dir': None, 'out': '', 'captions': '',
  'max_texts': None, 'max_patches': 0, 'progress': False, 'embeddings': '',
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


def _classes_and_templates(
  loaded: Loaded, source, dataset: str, classes: str, templates: str | None, o: dict[str, Any]
) -> tuple[list[str], list[str]]:
  """(class names, filled templates): `--classes` or the dataset's names, canonicalised as the
  checkpoint was evaluated unless told; a warning where two classes tokenize alike."""
  from vit_jax.evals import prompts

  names = read_classes(classes) if classes else source.class_names() if source else []
  if not names:
    raise ValueError(f'{dataset} names no classes: give them with --classes=a,b,c (or a file)')
  if source and len(names) != source.num_classes:
    raise ValueError(f'{len(names)} class names for a dataset of {source.num_classes} classes')
  used = loaded.uses
  canonical = used.canonicalize if o['canonicalize'] is None else o['canonicalize']
  names = prompts.class_names(dataset, names, canonical) if not classes else names
  chosen = templates.split(';') if templates is not None else used.templates or ['clip_best']
  filled = prompts.templates(chosen, canonical)
  for a, b in tokenized_alike(loaded, names, filled)[:1]:
    print(
      f'warning: classes {a!r} and {b!r} tokenize alike with {loaded.vocab} (words it does '
      'not know?): their probabilities are equal',
      file=sys.stderr,
    )
  return names, filled


def _split_accuracy(loaded: Loaded, zcls, source, dataset: str, o: dict[str, Any], say):
  """(top-1 accuracy, count) over `o['split']`: of `o['embeddings']` where vit-embed stored
  the split's image embeddings, else of the images embedded now."""
  if o['embeddings']:
    return stored_accuracy(o['embeddings'], zcls, source, dataset, o['split'])
  say(f'Classifying split {o["split"]!r} of {dataset} ...')
  return dataset_accuracy(loaded, zcls, source, o['split'], o['batch_size'], o['limit'])


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
  from vit_jax import data as data_lib
  from vit_jax.data import captions as captions_lib

  o = {**OPTIONS, **(options or {})}
  say = (lambda line: print(line, file=sys.stderr, flush=True)) if o['progress'] else len
  usage = _usage(images, classes, dataset, o)
  if usage:
    print(f'error: {usage}', file=sys.stderr)
    return 2
  try:
    say(f'Reading {checkpoint} ...')
    loaded = load(checkpoint, o['vocab'], o['max_patches'])
    if o['captions']:
      say(f'Embedding the images and captions of {o["captions"]} ...')
      recalls = retrieval_recalls(loaded, o['captions'], o['batch_size'])
      return _print_recalls({'model': loaded.name, 'captions': o['captions']}, recalls, o['json'])
    source = data_lib.get_source(dataset, o['tfds_data_dir']) if dataset else None
    if source is not None and isinstance(source, captions_lib.CAPTIONED):
      return _dataset_retrieval(loaded, source, dataset, o, say)
    names, filled = _classes_and_templates(loaded, source, dataset, classes, templates, o)
    say(f'Embedding {len(names)} classes x {len(filled)} templates (or reading the cache) ...')
    zcls, cached = class_embeddings(loaded, checkpoint, names, filled, o['cache_dir'])
    if source:
      accuracy, count = _split_accuracy(loaded, zcls, source, dataset, o, say)
  except (OSError, ValueError, KeyError) as e:
    print(f'error: {e}'.replace('\n', ' '), file=sys.stderr)
    return 1
  if not o['json']:
    print(
      f'{loaded.name}: {len(names)} classes x {len(filled)} templates'
      f'{" (class embeddings from the cache)" if cached else ""}'
    )
  if source:
    result = {'model': loaded.name, 'dataset': dataset, 'split': o['split'], 'count': count}
    result['accuracy'] = accuracy
    if o['out']:
      write_run(o['out'], checkpoint, loaded, result)
    print(json.dumps(result) if o['json'] else f'zero-shot top-1 {accuracy:.4f} on {count} images')
    return 0
  say(f'Classifying {len(images)} image files ...')
  good, probs, errors = classify_files(loaded, zcls, images, o['batch_size'])
  _print_predictions(good, probs, names, o['top_k'], loaded, o['json'], errors)
  for error in errors:
    print(f'error: {error}', file=sys.stderr)
  return 1 if errors else 0


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """The command line's flags, on `flag_values` (defined at program start)."""
  fv = flag_values
  flags.DEFINE_string('checkpoint', None, 'A LiT or SigLIP .npz.', required=True, flag_values=fv)
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
    'max_patches', 0, "A NaFlex model's patches an image (0: the model's).", flag_values=fv
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
  if not f['verbosity'].present:
    logging.set_verbosity(logging.WARNING)
  progress = sys.stderr.isatty()
  if progress:  # TensorFlow and JAX take seconds to load
    print('vit-zeroshot: loading TensorFlow and JAX ...', file=sys.stderr, flush=True)
  from vit_jax import data

  data.hide_accelerators_from_tensorflow()
  keys = ('vocab', 'split', 'limit', 'top_k', 'json', 'batch_size', 'cache_dir')
  keys += ('tfds_data_dir', 'out', 'captions', 'max_texts', 'max_patches', 'embeddings')
  options = {k: f[k].value for k in keys}
  options['progress'] = progress
  # Unless given, a run's own (or its converted file's): what it evaluated zero-shot with.
  options['canonicalize'] = f.canonicalize if f['canonicalize'].present else None
  templates = f.templates if f['templates'].present else None
  sys.exit(run(f.checkpoint, argv[1:], f.classes, templates, f.dataset, options))


def run_cli() -> None:
  """The `vit-zeroshot` console script (and `python -m vit_jax.zeroshot`)."""
  cli.start(define_flags, main)

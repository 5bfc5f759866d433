"""Zero-shot classification and retrieval with an image-text model (LiT, SigLIP), over files,
datasets, captions and the embeddings `vit-embed` stored: what `vit-zeroshot` and
`vit-predict --classes` run on a `vit_jax.load` model.

  zcls, cached = class_embeddings(model, names, model.prompt_templates(), cache_dir)
  good, probs, errors = classify_files(model, zcls, paths, batch_size)
  accuracy, count = dataset_accuracy(model, zcls, source, 'test', batch_size, limit=0)
  recalls = retrieval_recalls(model, 'captions.tsv', batch_size)

The class embeddings are cached by checkpoint (path, size, time), vocabulary, names and
templates, since 1,000 classes and 80 templates are 80,000 text passes.
"""

import hashlib
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from vit_jax import files
from vit_jax.inference.model import Model, image_batches, run_padded


def read_classes(classes: str) -> list[str]:
  """A comma-separated list, or a file of one name a line."""
  if files.path(classes).is_file():
    lines = files.path(classes).read_text().splitlines()
    return [line.strip() for line in lines if line.strip()]
  return [name.strip() for name in classes.split(',') if name.strip()]


def _cache_key(model: Model, names, templates) -> str:
  checkpoint = model.source
  stat = os.stat(checkpoint) if files.is_local(checkpoint) else None
  where = [os.path.abspath(checkpoint), stat and stat.st_size, stat and stat.st_mtime_ns]
  text = json.dumps([where, os.path.abspath(model.vocab), names, templates])
  return hashlib.sha256(text.encode()).hexdigest()[:32]


def class_embeddings(model: Model, names, templates: Sequence[str], cache_dir: str = ''):
  """((C, D) class embeddings of `names` in the filled `templates`, whether they came from
  the cache): read from or written to `cache_dir` ('' = no cache)."""
  path = os.path.join(cache_dir, _cache_key(model, names, templates) + '.npy')
  if cache_dir and os.path.exists(path):
    return np.load(path, allow_pickle=False), True
  zcls = model.class_embeddings(names, templates)
  if cache_dir:
    os.makedirs(cache_dir, exist_ok=True)
    np.save(path + '.tmp.npy', zcls)
    os.replace(path + '.tmp.npy', path)
  return zcls, False


def tokenized_alike(model: Model, names: Sequence[str], templates: Sequence[str]) -> list:
  """The class names whose prompts the tokenizer cannot tell apart (words it does not know
  become one unknown id): their embeddings, and so their probabilities, are equal."""
  tokens = model.tokenize([t.format(n) for n in names for t in templates])
  seen: dict[bytes, str] = {}
  pairs = []
  for name, row in zip(names, tokens.reshape(len(names), -1), strict=True):
    first = seen.setdefault(row.tobytes(), name)
    if first != name:
      pairs.append((first, name))
  return pairs


def _embed_images(model: Model, images: np.ndarray) -> np.ndarray:
  """The images' embeddings, the batch padded to the model's batch size (one compilation)."""
  return run_padded(model.embed_images, images, model.batch_size)


def embed_files(model: Model, paths, batch_size: int):
  """(names of the readable images, their image embeddings (n, D), one error per other): each
  batch padded to the model's batch size, as the in-run evaluator's are to its own."""
  good, zimg, errors = [], [], []
  for names, images in image_batches(model, paths, batch_size, errors):
    good += names
    zimg.append(_embed_images(model, images))
  return good, (np.concatenate(zimg) if zimg else None), errors


def classify_files(model: Model, zcls, paths, batch_size: int):
  """(names of the readable images, their probabilities (n, C)), and one error per other."""
  from vit_jax.evals import zeroshot

  good, zimg, errors = embed_files(model, paths, batch_size)
  if zimg is None:
    return good, np.zeros((0, len(zcls))), errors
  return good, np.asarray(zeroshot.probabilities(zimg, zcls, model.t, model.b)), errors


def _embed_split(model: Model, source, split: str, batch_size: int, limit: int, field: str):
  """The image embeddings of `split` (its first `limit` examples if set) and each example's
  `field` ('label', 'texts'): (zimg (N, D), values (N,))."""
  import tensorflow as tf

  from vit_jax import data as data_lib
  from vit_jax.data import preprocess

  @tf.autograph.experimental.do_not_convert
  def prepare(raw):
    example = source.example(raw)
    image = preprocess.input_op(model.preprocessing, source.decode(example['image']))
    return image, example[field]

  records = source.records(split)
  if limit:
    records = records.take(limit)
  zimg, values = [], []
  for images, value in data_lib.host_batches(records.map(prepare).batch(batch_size)):
    zimg.append(_embed_images(model, images))
    values.append(value)
  if not zimg:
    raise ValueError(f'split {split!r} is empty')
  return np.concatenate(zimg), np.concatenate(values)


def dataset_accuracy(model: Model, zcls, source, split: str, batch_size: int, limit: int):
  """Top-1 accuracy over `split` (its first `limit` examples if set): (accuracy, count)."""
  from vit_jax.evals import zeroshot

  zimg, labels = _embed_split(model, source, split, batch_size, limit, 'label')
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


def _recalls(model: Model, zimg: np.ndarray, captions: list[str], owners) -> dict[str, float]:
  """Recall@1/5/10 both ways of the image embeddings `zimg` and the captions (`owners`: the
  image of each)."""
  from vit_jax.evals import retrieval

  ztxt = model.embed_texts(captions)
  _check_width(zimg, ztxt)
  return retrieval.recalls(zimg, ztxt, owners)


def retrieval_recalls(model: Model, captions_file: str, batch_size: int) -> dict[str, float]:
  """Image-to-text and text-to-image recall@1/5/10 over a captions file."""
  images, captions, owners = read_captions(captions_file)
  errors: list[str] = []
  batches = list(image_batches(model, images, batch_size, errors))
  if errors:  # every image has its captions: none may be left out
    raise ValueError(errors[0])
  zimg = np.concatenate([_embed_images(model, x) for _, x in batches])
  return _recalls(model, zimg, captions, owners)


# COCO's retrieval protocol keeps each image's first 5 captions (a few have 6 or 7).
PROTOCOL_CAPTIONS = {'coco_captions': 5}


def dataset_recalls(
  model: Model, source, split: str, batch_size: int, limit: int, max_texts: int,
  stored: tuple[str, str] | None = None,
) -> tuple[dict[str, float], int, int]:  # fmt: skip
  """Recall@1/5/10 over a captions dataset's split (its first `limit` images if set, each
  image's first `max_texts` captions; 0: all): (recalls, images, captions). `stored`:
  (a vit-embed folder of the split's image embeddings, the dataset's name), used instead of
  embedding the images."""
  from vit_jax.evals import retrieval

  if stored is None:
    zimg, joined = _embed_split(model, source, split, batch_size, limit, 'texts')
  else:
    zimg, ids = stored_images(stored[0], stored[1], split)
    joined = split_field(source, split, 'texts')[ids]
  captions, owners = retrieval.image_captions([t.decode() for t in joined], max_texts)
  return _recalls(model, zimg, captions, owners), len(joined), len(captions)


def write_run(out: str, model: Model, result: dict[str, Any]) -> None:
  """A run directory for `python -m vit_jax.reproduce report`: config.json (the model, the
  dataset, the checkpoint, no training steps) and one metrics line `zeroshot/<dataset>`."""
  from vit_jax import rundir

  checkpoint = model.source
  name = os.path.basename(str(checkpoint)).removesuffix('.npz')
  config = {
    'model_name': name,
    'dataset': result['dataset'],
    'pretrained_path': str(checkpoint),
    'pp': {'crop': model.resolution, 'test': result['split'], 'train': ''},
    'total_steps': 0,
  }
  files.path(out).mkdir(parents=True, exist_ok=True)
  rundir.write_config(out, config, {})
  line = {'step': 0, f'zeroshot/{result["dataset"]}': result['accuracy'], 'count': result['count']}
  files.atomic_write_text(files.join(out, rundir.METRICS_FILE), json.dumps(line) + '\n')


def predictions(model: Model, good, probs: np.ndarray, names, k: int, errors) -> dict[str, Any]:
  """Each image's top-k classes of zero-shot `probs` (what both commands print, as JSON)."""
  k = min(k, len(names))
  top = np.argsort(-probs, axis=1, kind='stable')[:, :k]
  rows = [
    {'image': path, 'top_k': [{'class': names[c], 'probability': float(p[c])} for c in order]}
    for path, p, order in zip(good, probs, top, strict=True)
  ]
  kind = 'sigmoid' if model.b is not None else 'softmax'
  info = {'model': model.name, 'classes': len(names), 'probabilities': kind}
  return {**info, 'predictions': rows, 'errors': list(errors)}


def classes_and_templates(
  model: Model, source, dataset: str, classes: str, templates: str | None, canonical
) -> tuple[list[str], list[str], list[tuple[str, str]]]:
  """(class names, filled templates, pairs of names that tokenize alike): `classes` (names
  or a file) or the dataset's names, canonicalised as the model was evaluated unless
  `canonical` says; `templates` ';'-separated, default the model's."""
  from vit_jax.evals import prompts

  names = read_classes(classes) if classes else source.class_names() if source else []
  if not names:
    raise ValueError(f'{dataset} names no classes: give them with --classes=a,b,c (or a file)')
  if source and len(names) != source.num_classes:
    raise ValueError(f'{len(names)} class names for a dataset of {source.num_classes} classes')
  canonical = model.canonicalize if canonical is None else canonical
  names = prompts.class_names(dataset, names, canonical) if not classes else names
  chosen = templates.split(';') if templates is not None else model.templates or ['clip_best']
  filled = prompts.templates(chosen, canonical)
  return names, filled, tokenized_alike(model, names, filled)

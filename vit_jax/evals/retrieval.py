"""Image-text retrieval: image-to-text and text-to-image recall@k (big_vision's
`image_text_retrieval`, the R@1 of the LiT model card).

  recalls(zimg, ztxt, text_image, ks=(1, 5, 10), image_labels=None)
    -> {'img2txt_recall@1': ..., 'txt2img_recall@1': ..., ...}   (big_vision's names)

`zimg` (N, D) and `ztxt` (M, D) are the normalised embeddings (any scale works: only the
order of the similarities zimg . ztxt counts); `text_image` (M,) the image each caption
belongs to, so an image may have several captions. Image to text: an image is a hit at k when
any of its captions is among the k most similar texts. Text to image: a caption is a hit when
its image is among the k most similar images. With `image_labels` (N,) the captions are shared
by class (class names as captions, or any dataset whose captions describe the class): a
caption matches every image of its image's class, both ways. A tie counts for the match (its
rank is the number of strictly more similar candidates). The similarities are computed in
blocks of `block` rows, so 5,000 images x 25,000 captions (COCO) need no 500 MB matrix.

The `Evaluator` (type 'retrieval' of `config.evals`, settings `spec.Retrieval`) measures
`<name>/<dataset>/img2txt_recall@k` and `.../txt2img_recall@k` in training, on any dataset
with captions (`coco_captions`: its 'test' split is Karpathy's 5,000 images; COCO's protocol
keeps each image's first 5 captions, `max_texts=5`), or on a labelled dataset captioned from
its class names (`caption_templates`: a caption matches every image of its class). The
captions are read and tokenized once; their embeddings and the images' are computed at each
run (either tower may be training).
"""

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from vit_jax import data as data_lib
from vit_jax import files, parallel
from vit_jax.evals import common, zeroshot
from vit_jax.evals import spec as evals_spec

KS = (1, 5, 10)


def _ranks(queries: np.ndarray, keys: np.ndarray, matches, block: int) -> np.ndarray:
  """For each query row, how many keys are strictly more similar than its best match;
  `matches(rows)` gives the (len(rows), len(keys)) boolean matrix of a block of queries."""
  ranks = np.empty(len(queries), np.int64)
  for start in range(0, len(queries), block):
    rows = np.arange(start, min(start + block, len(queries)))
    sims = queries[rows] @ keys.T
    match = matches(rows)
    if not match.any(axis=1).all():
      raise ValueError(f'query {rows[~match.any(axis=1)][0]} has no matching item to retrieve.')
    best = np.where(match, sims, -np.inf).max(axis=1, keepdims=True)
    ranks[rows] = np.sum(sims > best, axis=1)
  return ranks


def recalls(
  zimg: np.ndarray,
  ztxt: np.ndarray,
  text_image: Sequence[int] | np.ndarray,
  ks: Sequence[int] = KS,
  image_labels: Sequence[int] | np.ndarray | None = None,
  block: int = 1024,
) -> dict[str, float]:
  """Recall@k both ways: {'img2txt_recall@k', 'txt2img_recall@k'} for each k, as fractions."""
  zimg, ztxt = np.asarray(zimg, np.float32), np.asarray(ztxt, np.float32)
  text_image = np.asarray(text_image, np.int64)
  if len(text_image) != len(ztxt) or not len(zimg) or not len(ztxt):
    raise ValueError(
      f'{len(ztxt)} caption embeddings, {len(text_image)} caption owners, {len(zimg)} images: '
      'expected one owner per caption and at least one of each.'
    )
  if text_image.min() < 0 or text_image.max() >= len(zimg):
    raise ValueError(f'a caption belongs to image {text_image.max()}; there are {len(zimg)}.')
  # What each image and each caption is matched by: the image itself, or its class.
  if image_labels is None:
    image_key, text_key = np.arange(len(zimg)), text_image
  else:
    image_key = np.asarray(image_labels, np.int64)
    text_key = image_key[text_image]
  i2t = _ranks(zimg, ztxt, lambda rows: image_key[rows, None] == text_key[None], block)
  t2i = _ranks(ztxt, zimg, lambda rows: text_key[rows, None] == image_key[None], block)
  results = {}
  for k in ks:
    results[f'img2txt_recall@{k}'] = float(np.mean(i2t < k))
    results[f'txt2img_recall@{k}'] = float(np.mean(t2i < k))
  return results


# ----------------------------------------------------------------------------------------
# The evaluator of a training run.
# ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Task:
  """One retrieval dataset: its metric name, its images (every position of the split, each
  example with its `index`), and its captions' tokens with their images' positions."""

  name: str
  images: Any  # data_lib.Subset
  split: str
  tokens: np.ndarray  # (M, L)
  owners: np.ndarray  # (M,): the split position of each caption's image
  by_class: bool  # captions of class names: a caption matches every image of its class


def _texts_and_labels(source, split: str) -> tuple[list[str], np.ndarray]:
  """Each example's newline-joined captions and its label, in the split's order."""
  import tensorflow as tf

  @tf.autograph.experimental.do_not_convert
  def fields(raw):
    example = source.example(raw)
    return example['texts'], example['label']

  texts, labels = [], []
  for t, y in source.records(split).map(fields).batch(4096).as_numpy_iterator():
    texts.extend(x.decode() for x in t)
    labels.append(y)
  return texts, np.concatenate(labels) if labels else np.zeros(0, np.int64)


def _captions(source, split: str, settings, key: str) -> tuple[list[str], np.ndarray, bool]:
  """(captions, the split position of each one's image, matched by class)."""
  from vit_jax.data import captions as captions_lib

  if settings.caption_templates:
    base = captions_lib.ClassCaptions(source, settings.caption_templates)
    _, labels = _texts_and_labels(base, split)
    names = source.class_names()
    texts, owners = [], []
    for c, name in enumerate(names):
      present = np.flatnonzero(labels == c)
      if len(present):  # an image of the class owns its captions
        texts += [t.format(name) for t in settings.caption_templates]
        owners += [int(present[0])] * len(settings.caption_templates)
    return texts, np.asarray(owners, np.int64), True
  if not isinstance(source, captions_lib.CAPTIONED):
    raise ValueError(
      f'config.{key}.datasets: {source.name!r} has no captions: name a captions dataset '
      f"(coco_captions, a captions folder) or set config.{key}.caption_templates=('{{}}',)."
    )
  joined, _ = _texts_and_labels(source, split)
  texts, owners = image_captions(joined, settings.max_texts)
  return texts, owners, False


def image_captions(joined: Sequence[str], max_texts: int = 0) -> tuple[list[str], np.ndarray]:
  """Each image's newline-joined captions (its first `max_texts`; 0: all) as one list, and
  the image each caption belongs to."""
  from vit_jax.data.captions import SEPARATOR

  texts, owners = [], []
  for image, text in enumerate(joined):
    kept = text.split(SEPARATOR)[: max_texts or None]
    texts += kept
    owners += [image] * len(kept)
  return texts, np.asarray(owners, np.int64)


def open_tasks(settings, data_dir: str | None, tokenizer: Callable, key: str) -> tuple[Task, ...]:
  """The `config.<key>.datasets` entries opened, their captions tokenized; one-line errors."""
  tasks = []
  for entry in settings.datasets:
    dataset, split = (entry, 'test') if isinstance(entry, str) else tuple(entry)
    source = data_lib.get_source(dataset, data_dir)
    n = source.num_examples(split)
    if n == 0:
      raise ValueError(f'config.{key}.datasets: split {split!r} of {dataset!r} is empty.')
    texts, owners, by_class = _captions(source, split, settings, key)
    tokens = np.asarray(tokenizer(texts), np.int32)
    name = files.path(dataset).name if files.path(dataset).is_dir() else dataset
    images = data_lib.Subset(source, split, range(n))
    tasks.append(Task(name, images, split, tokens, owners, by_class))
  return tuple(tasks)


class Evaluator(common.Evaluator):
  """`run(params)` -> {'<dataset>/img2txt_recall@k': ..., ...}, named `<name>/...`."""

  def __init__(self, context: common.Context, name: str, instance, tasks: Sequence[Task]):
    super().__init__(instance.every)
    self.prefix = f'{name}/'
    self.fixed = frozenset(f'{t.name}/{n}' for t in tasks for n in ('num_images', 'num_texts'))
    self._data, self._tasks = context.data, tuple(tasks)
    self._context = context
    self._batch_texts = instance.settings.batch_texts
    self._embed_texts = zeroshot.text_embedder(context.model, context.mesh)
    self._embed_images = zeroshot.compile_images(context.model, context.mesh)
    self._sharding = parallel.batch_sharding(context.mesh)

  def _images(self, params, task: Task) -> dict[str, np.ndarray]:
    """The readable images' embeddings, split positions and labels."""
    ds = common.host_dataset(task.images, task.split, self._context)
    parts, bad = [], data_lib.BadExamples('retrieval')
    for local in data_lib.host_batches(ds):
      local.pop('texts', None)  # strings: the captions come tokenized
      out = jax.device_get(
        self._embed_images(params, parallel.global_batch(bad.take(local), self._sharding))
      )
      keep = out['mask'] > 0
      parts.append({k: out[k][keep] for k in ('z', 'index', 'label')})
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

  def run(self, params: Any) -> dict[str, float]:
    results = {}
    for task in self._tasks:
      images = self._images(params, task)
      order = np.argsort(images['index'])
      positions = images['index'][order]
      rows = np.searchsorted(positions, task.owners).clip(0, max(len(positions) - 1, 0))
      readable = positions[rows] == task.owners  # captions of unreadable images left out
      ztxt = zeroshot.embed_tokens(
        self._embed_texts, params, task.tokens[readable], self._batch_texts
      )
      labels = images['label'][order] if task.by_class else None
      recalled = recalls(images['z'][order], ztxt, rows[readable], image_labels=labels)
      results.update({f'{task.name}/{k}': v for k, v in recalled.items()})
      results[f'{task.name}/num_images'] = len(positions)
      results[f'{task.name}/num_texts'] = int(readable.sum())
    return results

  def describe(self, metrics) -> str:
    return ', '.join(f'{k} {v:.4f}' for k, v in metrics.items() if 'recall@1' in k)


def build(context: common.Context, name: str, instance) -> Evaluator:
  """The retrieval evaluator `name` (a `spec.Instance` of `Retrieval`), its datasets opened
  and captions tokenized."""
  key = evals_spec.config_key(context.evals, name)
  zeroshot.check_image_text(context, key)
  tokenizer = zeroshot.prompt_tokenizer(context, instance.settings, key)
  tasks = open_tasks(instance.settings, context.data.tfds_data_dir or None, tokenizer, key)
  return Evaluator(context, name, instance, tasks)

"""Zero-shot classification with an image-text model (LiT, SigLIP): classes as texts.

The API (big_vision's `discriminative_classifier`, the original LiT colab):

  zcls = class_embeddings(model, params, tokenizer, class_names, templates, batch_size)
  logits(zimg, zcls, t, b)            # exp(t)-scaled cosine similarities (+ SigLIP's bias b)
  probabilities(zimg, zcls, t, b)     # LiT: softmax over the classes; SigLIP (b given): sigmoid
  accuracy(zimg, labels, zcls)        # top-1: the class of the most similar embedding

`class_embeddings` fills each template ('a photo of a {}.') with each class name, tokenizes
the texts, embeds them with the text tower in batches of `batch_size` (the last one padded,
so one compilation serves all), and returns (C, D): per class the mean of its prompts'
L2-normalised embeddings, normalised again (divided by norm + 1e-8, as big_vision). `zimg` are
the model's normalised image embeddings (B, D). The `Evaluator` ('zeroshot' in the registry,
`config.evals.<name>` of type 'zeroshot') measures `<name>/<dataset>` top-1 on any dataset
the trainer reads (tfds, an image folder, 'digits'), with class names from the dataset (for
ImageNet CLIP's curated ones, vit_jax/evals/prompts.py) and the templates it names; the class
embeddings are recomputed at each run (the text tower may be training), the prompts' tokens
once.
"""

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import data as data_lib
from vit_jax import families, files, parallel
from vit_jax.evals import common, prompts
from vit_jax.evals import spec as evals_spec

NORM_EPSILON = 1e-8  # the original's: z / (|z| + 1e-8)


def text_embedder(model, mesh: jax.sharding.Mesh | None = None) -> Callable:
  """(params, tokens (N, L)) -> the normalised text embeddings (N, D), compiled once; with a
  mesh the tokens are split over its devices (every process passes the same tokens) and the
  embeddings come back replicated, so every process can read them all."""

  def embed(params, tokens):
    return model.apply({'params': params}, tokens=tokens)[1]

  if mesh is None:
    return jax.jit(embed)
  fn = jax.jit(embed, out_shardings=parallel.replicated(mesh))
  sharding = parallel.batch_sharding(mesh)
  return lambda params, tokens: fn(params, parallel.place(tokens, sharding))


def prompt_texts(class_names: Sequence[str], templates: Sequence[str]) -> list[str]:
  """Each template filled with each class name, class-major: C * T texts."""
  return [template.format(name) for name in class_names for template in templates]


def embed_tokens(embed: Callable, params: Any, tokens: np.ndarray, batch_size: int) -> np.ndarray:
  """`embed(params, batch)` over `tokens` in batches of `batch_size` (the last padded with
  copies of the first row, which are dropped): (N, D) float32 on the host."""
  n = len(tokens)
  parts = []
  for start in range(0, n, batch_size):
    batch = tokens[start : start + batch_size]
    pad = batch_size - len(batch)
    if pad:
      batch = np.concatenate([batch, np.repeat(tokens[:1], pad, axis=0)])
    parts.append(np.asarray(jax.device_get(embed(params, batch)), np.float32)[: len(batch) - pad])
  return np.concatenate(parts)


def average(embeddings: np.ndarray, num_classes: int) -> np.ndarray:
  """(C * T, D) class-major prompt embeddings -> (C, D): the mean per class, renormalised."""
  z = embeddings.reshape(num_classes, -1, embeddings.shape[-1]).mean(axis=1)
  return z / (np.linalg.norm(z, axis=1, keepdims=True) + NORM_EPSILON)


def class_embeddings(
  model,
  params: Any,
  tokenizer: Callable[[list[str]], np.ndarray],
  class_names: Sequence[str],
  templates: Sequence[str],
  batch_size: int = 256,
  embed: Callable | None = None,
) -> np.ndarray:
  """(C, D): each class's prompts embedded by the text tower, averaged, renormalised;
  `embed` a `text_embedder(model)` to reuse (its compilation), else one is made."""
  if not class_names:
    raise ValueError('zero-shot needs at least one class name.')
  tokens = np.asarray(tokenizer(prompt_texts(class_names, templates)), np.int32)
  embed = embed or text_embedder(model)
  return average(embed_tokens(embed, params, tokens, batch_size), len(class_names))


def logits(zimg, zcls, t=1.0, b=None) -> jnp.ndarray:
  """exp(t) * zimg . zcls (+ b): `t` the model's `out['t']` (already exp'd), `b` SigLIP's."""
  scores = jnp.asarray(t).reshape(()) * (jnp.asarray(zimg) @ jnp.asarray(zcls).T)
  return scores if b is None else scores + jnp.asarray(b).reshape(())


def probabilities(zimg, zcls, t=1.0, b=None) -> jnp.ndarray:
  """LiT (no `b`): a softmax over the classes; SigLIP: each class's sigmoid."""
  scores = logits(zimg, zcls, t, b)
  return jax.nn.softmax(scores, axis=-1) if b is None else jax.nn.sigmoid(scores)


def accuracy(zimg, labels, zcls) -> float:
  """Top-1 accuracy: the most similar class embedding (neither t nor b changes the order)."""
  predicted = np.argmax(np.asarray(zimg) @ np.asarray(zcls).T, axis=-1)
  return float(np.mean(predicted == np.asarray(labels)))


# ----------------------------------------------------------------------------------------
# The evaluator of a training run.
# ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Task:
  """One zero-shot dataset: its metric name, source, split, and the prompts' tokens."""

  name: str
  source: data_lib.Source
  split: str
  tokens: np.ndarray  # (C * T, L), class-major
  num_classes: int


def open_tasks(
  zeroshot, data_dir: str | None, tokenizer: Callable, key: str = 'zeroshot'
) -> tuple[Task, ...]:
  """The `config.<key>.datasets` entries opened, their prompts tokenized; one-line errors."""
  templates = prompts.templates(zeroshot.templates, zeroshot.canonicalize)
  tasks = []
  for entry in zeroshot.datasets:
    dataset, split = (entry, 'test') if isinstance(entry, str) else tuple(entry)
    source = data_lib.get_source(dataset, data_dir)
    if source.num_examples(split) == 0:
      raise ValueError(f'config.{key}.datasets: split {split!r} of {dataset!r} is empty.')
    names = prompts.class_names(dataset, source.class_names(), zeroshot.canonicalize)
    tokens = np.asarray(tokenizer(prompt_texts(names, templates)), np.int32)
    name = files.path(dataset).name if files.path(dataset).is_dir() else dataset
    tasks.append(Task(name, source, split, tokens, len(names)))
  return tuple(tasks)


def compile_images(model, mesh: jax.sharding.Mesh) -> Callable:
  """(params, batch) -> the batch's fields but the image, and `z`, the normalised image
  embeddings, replicated, so every process holds the whole global batch (the parameters keep
  their shardings)."""

  def images(params, batch):
    out = {k: v for k, v in batch.items() if k != 'image'}
    out['z'] = model.apply({'params': params}, images=batch['image'])[0]
    return out

  return jax.jit(images, out_shardings=parallel.replicated(mesh))


class Evaluator(common.Evaluator):
  """`run(params)` -> {'<dataset>': top-1}, named `<name>/...`."""

  def __init__(self, context: common.Context, name: str, instance, tasks: Sequence[Task]):
    super().__init__(instance.every)
    self.prefix = f'{name}/'
    self._data, self._tasks = context.data, tuple(tasks)
    self._context = context
    self._batch_texts = instance.settings.batch_texts
    self._embed_texts = text_embedder(context.model, context.mesh)
    self._embed_images = compile_images(context.model, context.mesh)
    self._sharding = parallel.batch_sharding(context.mesh)

  def _images(self, params, task: Task) -> tuple[np.ndarray, np.ndarray]:
    """The image embeddings and labels of the task's split (padding, unreadable images out)."""
    ds = common.host_dataset(task.source, task.split, self._context)
    parts, bad = [], data_lib.BadExamples('zero-shot')
    for local in data_lib.host_batches(ds):
      batch = parallel.global_batch(bad.take(local), self._sharding)
      out = jax.device_get(self._embed_images(params, batch))
      parts.append((out['z'][out['mask'] > 0], out['label'][out['mask'] > 0]))
    return np.concatenate([z for z, _ in parts]), np.concatenate([y for _, y in parts])

  def run(self, params: Any) -> dict[str, float]:
    results = {}
    for task in self._tasks:
      embedded = embed_tokens(self._embed_texts, params, task.tokens, self._batch_texts)
      zimg, labels = self._images(params, task)
      results[task.name] = accuracy(zimg, labels, average(embedded, task.num_classes))
    return results


def check_image_text(context: common.Context, key: str) -> None:
  """A one-line error where the run's model has no text tower to evaluate."""
  if not families.of_module(context.model).image_text:
    raise ValueError(
      f'config.{key} evaluates an image-text model (LiT, SigLIP); this run trains a classifier: '
      "use type='fewshot', or train with config.task='contrastive'."
    )


def prompt_tokenizer(context: common.Context, settings, key: str = 'zeroshot') -> Any:
  """The tokenizer of the prompts: the run's (`context.tokenizer`, its captions'), unless
  `settings.vocab` names another vocabulary: then the model family's tokenizer on it
  (`settings.tokenizer` and `max_len`, where set, must be the model's). One-line errors."""
  overridden = getattr(settings, 'vocab', '') not in ('', context.data.pp.vocab)
  if context.tokenizer is not None and not overridden:
    return context.tokenizer
  vocab = getattr(settings, 'vocab', '') or context.data.pp.vocab
  if not vocab:
    raise ValueError(
      f'config.{key}.vocab is empty, and so is config.pp.vocab: name the vocabulary.'
    )
  family = families.of_module(context.model)
  name, max_len = getattr(settings, 'tokenizer', ''), getattr(settings, 'max_len', 0)
  try:
    return family.tokenizer(context.model.pp, vocab, name=name, max_len=max_len)
  except (AttributeError, ValueError, FileNotFoundError) as e:
    raise ValueError(f'config.{key}: {e}') from None


def build(context: common.Context, name: str, instance) -> Evaluator:
  """The zero-shot evaluator `name` (a `spec.Instance` of `Zeroshot`), its datasets opened and
  prompts tokenized."""
  key = evals_spec.config_key(context.evals, name)
  check_image_text(context, key)
  tokenizer = prompt_tokenizer(context, instance.settings, key)
  tasks = open_tasks(instance.settings, context.data.tfds_data_dir or None, tokenizer, key)
  return Evaluator(context, name, instance, tasks)

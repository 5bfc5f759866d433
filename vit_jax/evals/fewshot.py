"""Few-shot linear evaluation: closed-form ridge regression on frozen pre-logits features.

The paper's few-shot accuracy (ViT §4.1, Figure 4, Table 8) and big_vision's `fewshot_lsr`
evaluator, which judges a pretraining run long before it ends: for each dataset, seed and
number of shots, draw `shots` training images per class, fit a linear map from their
features to {-1, +1} targets in closed form, and count the test images whose largest output
is their class. As in big_vision:

  features   the model's pre-logits (the head's input), at the evaluation preprocessing;
  draw       per seed, `numpy.random.default_rng(seed)` permutes each class's training
             positions and keeps the first `shots` (so the 5-shot set is in the 10-shot one);
  inputs     standardised with the few-shot set's mean and std (+ 1e-5), then a constant
             feature of 100 appended: a bias whose weight the L2 term barely touches;
  targets    2 * onehot - 1;
  solution   W = (X^T X + l2 I)^-1 X^T Y, or X^T (X X^T + l2 I)^-1 Y when there are fewer
             examples than features, both from one eigendecomposition (one per draw, then
             one matmul per l2), in float64 on the host.

Each metric `fewshot/<dataset>/<shots>shot` is the mean accuracy over the seeds, for the
first l2 (with several l2, each also as `.../<shots>shot/l2_<l2>`). Only the drawn training
images are read and passed through the model (their union over seeds, chosen once per run
from the training split's labels), and the whole test split. The features are gathered to
every process, so every process computes the same numbers; the first one writes them. With
a Polyak average the run evaluates it too, as `polyak/fewshot/...` (on the same draws).
"""

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import tensorflow as tf
from jax.sharding import Mesh

from vit_jax import data as data_lib
from vit_jax import families, files, parallel
from vit_jax.evals import common
from vit_jax.evals import spec as evals_spec

BIAS_CONSTANT = 100.0
STD_EPSILON = 1e-5


# ----------------------------------------------------------------------------------------
# The solver: pure numpy, float64.
# ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Ridge:
  """One few-shot set, ready to solve for any l2: W(l2) = lhs diag(1 / (eigs + l2)) rhs."""

  mean: np.ndarray
  std: np.ndarray
  lhs: np.ndarray
  eigs: np.ndarray
  rhs: np.ndarray

  def inputs(self, x: np.ndarray) -> np.ndarray:
    """Features standardised by the few-shot set's statistics, the bias feature appended."""
    x = (np.asarray(x, np.float64) - self.mean) / self.std
    return np.pad(x, ((0, 0), (0, 1)), constant_values=BIAS_CONSTANT)

  def weights(self, l2: float) -> np.ndarray:
    """(features + 1, classes): the ridge solution at `l2`."""
    return (self.lhs / (self.eigs + l2)) @ self.rhs

  def predict(self, x: np.ndarray, l2: float) -> np.ndarray:
    return np.argmax(self.inputs(x) @ self.weights(l2), axis=1)


def fit(x: np.ndarray, labels: np.ndarray, num_classes: int) -> Ridge:
  """The few-shot set (features `x`, integer `labels`) as a Ridge."""
  x = np.asarray(x, np.float64)
  mean = x.mean(axis=0, keepdims=True)
  std = x.std(axis=0, keepdims=True) + STD_EPSILON
  ridge = Ridge(mean, std, np.empty(0), np.empty(0), np.empty(0))
  a = ridge.inputs(x)
  y = 2.0 * np.eye(num_classes)[labels] - 1.0
  if a.shape[0] >= a.shape[1]:  # (A^T A + l2 I)^-1 A^T Y
    eigs, q = np.linalg.eigh(a.T @ a)
    lhs, rhs = q, q.T @ (a.T @ y)
  else:  # A^T (A A^T + l2 I)^-1 Y
    eigs, q = np.linalg.eigh(a @ a.T)
    lhs, rhs = a.T @ q, q.T @ y
  return dataclasses.replace(ridge, lhs=lhs, eigs=eigs, rhs=rhs)


def draw(labels: np.ndarray, num_classes: int, shots: int, seed: int) -> np.ndarray:
  """Positions of `shots` examples of each class (all of a class that has fewer)."""
  rng = np.random.default_rng(seed)
  per_class = [rng.permutation(np.flatnonzero(labels == c)) for c in range(num_classes)]
  return np.concatenate([p[:shots] for p in per_class])


def accuracies(
  train: tuple[np.ndarray, np.ndarray],
  test: tuple[np.ndarray, np.ndarray],
  num_classes: int,
  shots: Sequence[int],
  l2_regs: Sequence[float],
  seeds: int,
  unreadable: np.ndarray | None = None,
) -> dict[tuple[int, float], float]:
  """{(shots, l2): test accuracy averaged over seeds 0 .. seeds-1}; `train` and `test` are
  (features, labels), `train` the whole pool the draws come from (its features may be any
  array-like indexed by positions, holding only the rows that are drawn). Drawn positions in
  `unreadable` (images that could not be read) are left out of the draw they are in."""
  (x_train, y_train), (x_test, y_test) = train, test
  results: dict[tuple[int, float], list[float]] = {}
  for seed in range(seeds):
    for n in shots:
      chosen = draw(y_train, num_classes, n, seed)
      if unreadable is not None and len(unreadable):
        chosen = chosen[~np.isin(chosen, unreadable)]
      ridge = fit(x_train[chosen], y_train[chosen], num_classes)
      for l2 in l2_regs:
        hits = ridge.predict(x_test, l2) == y_test
        results.setdefault((n, l2), []).append(float(np.mean(hits)))
  return {key: float(np.mean(values)) for key, values in results.items()}


# ----------------------------------------------------------------------------------------
# The evaluator of a training run.
# ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Task:
  """One configured few-shot dataset: its name in the metrics, the source and its splits."""

  name: str
  source: data_lib.Source
  train_split: str
  test_split: str


def open_tasks(
  datasets: Sequence[Any], data_dir: str | None, key: str = 'fewshot'
) -> tuple[Task, ...]:
  """The `config.<key>.datasets` entries opened; one-line ValueErrors."""
  tasks = []
  for entry in datasets:
    dataset, train_split, test_split = (entry, 'train', 'test') if isinstance(entry, str) else entry
    source = data_lib.get_source(dataset, data_dir)
    name = files.path(dataset).name if files.path(dataset).is_dir() else dataset
    for split in (train_split, test_split):
      if source.num_examples(split) == 0:
        raise ValueError(f'config.{key}.datasets: split {split!r} of {dataset!r} is empty.')
    tasks.append(Task(name, source, train_split, test_split))
  names = [t.name for t in tasks]
  if len(set(names)) < len(names):
    raise ValueError(f'config.{key}.datasets names a dataset twice: {names}.')
  return tuple(tasks)


def compile_features(model, mesh: Mesh) -> Callable:
  """(params, batch) -> the batch's fields without the image, and `features` (the image
  tower's pre-logits, `families.image_features`), replicated on every device, so every process
  holds the whole global batch (the parameters keep their shardings)."""
  image_features = families.of_module(model).image_features(model)

  def features(params, batch):
    out = {k: v for k, v in batch.items() if k != 'image'}
    out['features'] = image_features(params, batch['image'])
    return out

  return jax.jit(features, out_shardings=parallel.replicated(mesh))


def _labels(source: data_lib.Source, split: str) -> np.ndarray:
  """The labels of a whole split, in its order (no image is decoded)."""

  @tf.autograph.experimental.do_not_convert
  def label(raw):
    return source.example(raw)['label']

  labels = source.records(split).map(label).batch(4096)
  return np.concatenate([np.asarray(b) for b in labels.as_numpy_iterator()] or [np.zeros(0)])


class _Drawn:
  """The features of the drawn examples of a split, indexed by their positions in it."""

  def __init__(self, positions: np.ndarray, features: np.ndarray):
    order = np.argsort(positions)
    self._positions, self._features = positions[order], features[order]

  def __getitem__(self, positions: np.ndarray) -> np.ndarray:
    rows = np.searchsorted(self._positions, positions)
    found = rows < len(self._positions)
    if not (found.all() and np.array_equal(self._positions[rows], positions)):
      raise ValueError('A few-shot draw asked for an example whose features were not computed.')
    return self._features[rows]


class Evaluator(common.Evaluator):
  """`run(params)` -> {'<dataset>/<shots>shot': accuracy, ...}, named `<name>/...`."""

  def __init__(self, context: common.Context, name: str, instance, tasks: Sequence[Task]):
    super().__init__(instance.every)
    self.prefix = f'{name}/'
    self._fewshot, self._data, self._tasks = instance.settings, context.data, tuple(tasks)
    self._context = context
    self._features_fn = compile_features(context.model, context.mesh)
    self._sharding = parallel.batch_sharding(context.mesh)

  @functools.cached_property
  def _draws(self) -> list[tuple[Task, np.ndarray, data_lib.Subset]]:
    """(task, training labels, the subset drawn): the union of every seed's draw of the
    most shots, read once (on the first run)."""
    fewshot, draws = self._fewshot, []
    for task in self._tasks:
      labels = _labels(task.source, task.train_split)
      most, n = max(fewshot.shots), task.source.num_classes
      chosen = np.unique(np.concatenate([draw(labels, n, most, s) for s in range(fewshot.seeds)]))
      draws.append((task, labels, data_lib.Subset(task.source, task.train_split, chosen)))
    return draws

  def _features(self, params, source, split) -> tuple[dict[str, np.ndarray], int]:
    """The features of the readable examples, and how many could not be read (counted as
    training counts them, and left out)."""
    ds = common.host_dataset(source, split, self._context)
    parts, bad = [], data_lib.BadExamples('few-shot')  # unreadable images: masked out
    unreadable = 0
    for local in data_lib.host_batches(ds):
      batch = parallel.global_batch(bad.take(local), self._sharding)
      out = jax.device_get(self._features_fn(params, batch))
      unreadable += int(np.sum(out['bad'] > 0))  # over every process's examples
      parts.append({k: v[out['mask'] > 0] for k, v in out.items()})
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}, unreadable

  def run(self, params: Any) -> dict[str, float]:
    fewshot, results = self._fewshot, {}
    for task, labels, subset in self._draws:
      drawn, bad_shots = self._features(params, subset, task.train_split)
      unreadable = np.setdiff1d(subset.indices, drawn['index'])
      pool = _Drawn(drawn['index'], drawn['features'])
      test, bad_test = self._features(params, task.source, task.test_split)
      if bad_shots or bad_test:
        results[f'{task.name}/bad_images'] = bad_shots + bad_test
      scores = accuracies(
        (pool, labels),
        (test['features'], test['label']),
        task.source.num_classes,
        fewshot.shots,
        fewshot.l2_reg,
        fewshot.seeds,
        unreadable,
      )
      for (shots, l2), accuracy in scores.items():
        name = f'{task.name}/{shots}shot'
        if l2 == fewshot.l2_reg[0]:
          results[name] = accuracy
        if len(fewshot.l2_reg) > 1:
          results[f'{name}/l2_{l2:g}'] = accuracy
    return results

  def describe(self, metrics: Mapping[str, float]) -> str:
    """The headline numbers (the first l2's) in one line."""
    return ', '.join(
      f'{k} {v:.4f}' if not k.endswith('/bad_images') else f'{k} {v:g}'
      for k, v in metrics.items()
      if '/l2_' not in k
    )


def build(context: common.Context, name: str, instance) -> Evaluator:
  """The few-shot evaluator `name` (a `spec.Instance` of `Fewshot`), its datasets opened and
  checked."""
  key = evals_spec.config_key(context.evals, name)
  tasks = open_tasks(instance.settings.datasets, context.data.tfds_data_dir or None, key)
  return Evaluator(context, name, instance, tasks)

"""The test split's evaluation: one exact pass, every example counted once.

`accuracy_test`, `accuracy_test_top5` and `loss_test` are sums over the examples of the
split divided by their number `num_test`: the padding that fills the last batch is masked
out, and so is an unreadable image, which is an error naming it unless
`skip_bad_test_images` (then left out of the count, and counted as `bad_test_images`).
`ExactPass` is that pass over any split of any source (ImageNet ReaL uses it too).
"""

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from vit_jax import data as data_lib
from vit_jax import parallel
from vit_jax.evals import common


def make_eval_step(model, num_classes: int) -> Callable:
  """Masked sums over one batch: top-1 and top-5 hits, loss, the number of real examples, and
  of unreadable ones (the input pipeline's `bad` flags, if the batch has them); with ImageNet
  ReaL label sets (`real`, multi-hot), the hits in them and the labelled count."""
  k = min(5, num_classes)

  def eval_step(params, batch):
    logits = model.apply({'params': params}, batch['image'], train=False)
    labels, mask = batch['label'], batch['mask']
    predicted = jnp.argmax(logits, -1)
    topk = jnp.any(jax.lax.top_k(logits, k)[1] == labels[:, None], axis=-1)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    sums = {
      'correct': jnp.sum((predicted == labels) * mask),
      'correct_top5': jnp.sum(topk * mask),
      'loss': jnp.sum(jnp.where(mask > 0, loss, 0.0)),
      'count': jnp.sum(mask),
    }
    if 'bad' in batch:
      sums['bad'] = jnp.sum(batch['bad'])
    if 'real' in batch:  # images with an empty set count nowhere
      labelled = jnp.any(batch['real'] > 0, axis=-1) * mask
      in_set = jnp.take_along_axis(batch['real'], predicted[:, None], axis=-1)[:, 0] > 0
      sums['real_correct'] = jnp.sum(in_set * labelled)
      sums['real_count'] = jnp.sum(labelled)
    return sums

  return eval_step


class ExactPass:
  """`pass_(params)`: the eval step's sums over one exact pass of a split, on the mesh (the
  parameters keep their shardings; the sums come back replicated)."""

  def __init__(self, context: common.Context, source: data_lib.Source, split: str, what: str):
    self._data, self._source, self._split, self._what = context.data, source, split, what
    self._context = context
    self._step = jax.jit(
      make_eval_step(context.model, context.data.num_classes),
      out_shardings=parallel.replicated(context.mesh),
    )
    self._sharding = parallel.batch_sharding(context.mesh)

  def __call__(self, params: Any) -> dict[str, np.ndarray]:
    ds = common.host_dataset(self._source, self._split, self._context)
    bad = data_lib.BadExamples(self._what)
    totals = None
    for local in data_lib.host_batches(ds):
      sums = self._step(params, parallel.global_batch(bad.take(local), self._sharding))
      totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
    totals = jax.device_get(totals)
    unreadable = int(totals['bad'])
    if unreadable and not self._data.skip_bad_test_images:
      raise ValueError(
        f'Unreadable {self._what} image {bad.first()} ({unreadable} in all): evaluation counts '
        f'every {self._what} image; fix or remove it (or set --config.skip_bad_test_images=True '
        'to leave it out).'
      )
    return totals


class Evaluator(common.Evaluator):
  """Top-1, top-5 and loss over the test split (`pp.test`), every `eval_every` steps."""

  fixed = frozenset({'num_test', 'bad_test_images'})

  def __init__(self, context: common.Context):
    super().__init__(context.evals.eval_every)
    self._pass = ExactPass(context, context.source, context.data.pp.test, 'test')

  def run(self, params: Any) -> dict[str, float]:
    totals = self._pass(params)
    count = int(totals['count'])
    results = {
      'accuracy_test': float(totals['correct']) / count,
      'accuracy_test_top5': float(totals['correct_top5']) / count,
      'loss_test': float(totals['loss']) / count,
      'num_test': count,
    }
    if totals['bad']:
      results['bad_test_images'] = int(totals['bad'])
    return results

  def describe(self, metrics: Mapping[str, float]) -> str:
    text = (
      f'accuracy_test {metrics["accuracy_test"]:.4f} (top-5 '
      f'{metrics["accuracy_test_top5"]:.4f}, {metrics["num_test"]} examples)'
    )
    if 'polyak/accuracy_test' in metrics:
      text += f', Polyak {metrics["polyak/accuracy_test"]:.4f}'
    return text


def build(context: common.Context) -> Evaluator:
  """Every run evaluates its test split."""
  return Evaluator(context)

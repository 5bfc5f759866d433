"""ImageNet ReaL accuracy (`real_split`): a prediction is right if it is in the image's set of
reassessed labels, and the images with an empty set are left out (vit_jax/data/real.py).

It runs with the test split's evaluation (every `eval_every` steps), over tfds
`imagenet2012_real`, as one exact pass (`classification.ExactPass`): `accuracy_real`, and
`num_real` the labelled images counted.
"""

from collections.abc import Mapping
from typing import Any

from vit_jax.data import real
from vit_jax.evals import classification, common


class Evaluator(common.Evaluator):
  """ImageNet ReaL accuracy over `real_split` of tfds imagenet2012_real."""

  fixed = frozenset({'num_real'})

  def __init__(self, context: common.Context, source: real.RealSource):
    super().__init__(context.evals.eval_every)
    self._pass = classification.ExactPass(context, source, context.evals.real_split, 'ReaL')

  def run(self, params: Any) -> dict[str, float]:
    sums = self._pass(params)
    count = int(sums['real_count'])
    return {'accuracy_real': float(sums['real_correct']) / max(1, count), 'num_real': count}

  def describe(self, metrics: Mapping[str, float]) -> str:
    text = f'accuracy_real {metrics["accuracy_real"]:.4f} ({metrics["num_real"]} labelled images)'
    if 'polyak/accuracy_real' in metrics:
      text += f', Polyak {metrics["polyak/accuracy_real"]:.4f}'
    return text


def build(context: common.Context) -> Evaluator | None:
  """The evaluator of `real_split`, its dataset opened and checked; None without one."""
  split = context.evals.real_split
  if not split:
    return None
  try:
    source = real.RealSource(context.data.tfds_data_dir or None)
    source.num_examples(split)
  except Exception as e:  # tfds raises many kinds for a dataset that is not prepared
    raise ValueError(
      f'ImageNet ReaL (config.real_split={split!r}): {str(e).splitlines()[0]}'
    ) from e
  if context.data.num_classes != source.num_classes:
    raise ValueError(
      f'config.real_split needs a {source.num_classes}-class ImageNet model; this one has '
      f'{context.data.num_classes} classes.'
    )
  return Evaluator(context, source)

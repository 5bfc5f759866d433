"""The evaluators' interface, and what they are built from.

An evaluator measures the model on data the run names (big_vision's evaluators are the
model): the test split's accuracy, ImageNet ReaL's, the few-shot linear accuracy. Each is
built from the run spec's sections and the objects resolved from them (`Context`) by the
`build` function its module lists in vit_jax/evals/registry.py, and has

  prefix       the start of its metrics' names ('fewshot/'; '' for the test split's own
               names, `accuracy_test`, ...)
  every        the steps between its runs (0: at the last step only; it always runs there)
  fixed        the metrics that do not depend on the parameters (counts): written once
  run(params)  its metrics for one set of parameters, without the prefix

The loop runs each evaluator due at a step over every parameter set the run keeps (the
parameters, and their Polyak average, whose metrics start with `polyak/`): `evaluate`.
"""

import abc
import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
from jax.sharding import Mesh

from vit_jax import parallel
from vit_jax.data import pipeline, sources
from vit_jax.data import spec as data_spec
from vit_jax.evals import spec as evals_spec


@dataclasses.dataclass(frozen=True)
class Context:
  """What an evaluator is built from: the run's sections (resolved) and its objects."""

  # Which evaluations, how often, on what (spec.evals).
  evals: evals_spec.Evals
  # The data section (spec.data): the evaluation batch, preprocessing, input pipeline;
  # `num_classes` resolved.
  data: data_spec.Data
  # The model (a flax module); its parameters come to `run`.
  model: Any
  mesh: Mesh
  # The training dataset (its test split, its class names).
  source: sources.Source
  # The run's tokenizer (its task's, for the batch's texts), or None.
  tokenizer: Any = None
  # How the model's images are prepared (its family's spec at the run's crop or patch
  # budget: `families.run_preprocessing`); None: as `data.pp` alone implies.
  preprocessing: Any = None


class Evaluator(abc.ABC):
  """Measures one set of parameters: `run(params) -> {metric: value}`."""

  prefix: str = ''
  fixed: frozenset[str] = frozenset()

  def __init__(self, every: int):
    self.every = every

  def due(self, step: int, total_steps: int) -> bool:
    """Whether it runs after `step`: every `every` steps, and at the last step."""
    return step == total_steps or (self.every > 0 and step % self.every == 0)

  @abc.abstractmethod
  def run(self, params: Any) -> dict[str, float]:
    """The metrics of `params` (on the mesh), named without `prefix`."""

  def describe(self, metrics: Mapping[str, float]) -> str:
    """One line of progress output for `evaluate`'s result."""
    return ', '.join(f'{k} {v:.4f}' for k, v in metrics.items())


def evaluate(evaluator: Evaluator, parameter_sets: Mapping[str, Any]) -> dict[str, float]:
  """`evaluator.run` over each parameter set, named `{set}{prefix}{metric}`; the sets are
  keyed by their prefix ('' for the parameters, 'polyak/' for their average), the first one
  also gives the `fixed` metrics, which the others leave out."""
  results = {}
  for i, (name, params) in enumerate(parameter_sets.items()):
    for key, value in evaluator.run(params).items():
      if i == 0 or key not in evaluator.fixed:
        results[f'{name}{evaluator.prefix}{key}'] = value
  return results


def host_dataset(source: sources.Source, split: str, context: Context):
  """This process's share of one evaluation pass over `split` (the context's test batch,
  preprocessing and pipeline), batched so the processes together make `data.batch_eval`."""
  data = context.data
  return pipeline.eval_dataset(
    source,
    split,
    data,
    preprocessing=context.preprocessing,
    local_batch=parallel.local_batch_size(data.batch_eval),
    process_index=jax.process_index(),
    process_count=jax.process_count(),
  )

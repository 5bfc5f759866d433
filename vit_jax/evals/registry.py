"""The evaluators a run can have, in the order they run at a step.

The classification task's own (the test split's pass, ImageNet ReaL's) first, then those of
`config.evals` by name (or the flat keys' 'fewshot' and 'zeroshot', vit_jax/evals/spec.py),
each built by its type's `build(context, name, instance)` in `TYPES`, which opens and checks
the data it reads (one-line ValueErrors, before any compute). A new evaluator type is a
module with a `common.Evaluator` subclass and its `build`, its settings in spec.py's `TYPES`,
and an entry here.
"""

from collections.abc import Callable

from vit_jax.evals import classification, common, fewshot, real, retrieval, zeroshot
from vit_jax.evals import spec as evals_spec

TYPES: dict[str, Callable[..., common.Evaluator]] = {
  'fewshot': fewshot.build,
  'zeroshot': zeroshot.build,
  'retrieval': retrieval.build,
}


def build(context: common.Context, class_logits: bool = True) -> dict[str, common.Evaluator]:
  """The evaluators the run spec asks for, by name. A model without class logits (an
  image-text run) has no test-split pass; ImageNet ReaL asked of it is a one-line error."""
  evals = context.evals
  built: dict[str, common.Evaluator] = {}
  if class_logits:
    built['test'] = classification.build(context)
    if evals.real_split:
      built['real'] = real.build(context)
  elif evals.real_split:
    raise ValueError(
      f'config.real_split={evals.real_split!r} measures class logits, which an image-text '
      "model has none of: set it to '' (zero-shot ImageNet: config.evals.<name> = "
      "dict(type='zeroshot', datasets=('imagenet2012',)))."
    )
  for name, instance in evals_spec.instances(evals).items():
    built[name] = TYPES[instance.type](context, name, instance)
  return built

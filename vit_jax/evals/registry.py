"""The evaluators a run can have, by name, in the order they run at a step.

Each entry builds its evaluator from the run (`common.Context`), opening and checking the
data it reads (one-line ValueErrors, before any compute), or returns None when the run spec
does not ask for it. A new evaluator is a module with a `common.Evaluator` subclass and its
`build`, and an entry here; its config keys are fields of `Evals` (vit_jax/evals/spec.py).
"""

from collections.abc import Callable

from vit_jax.evals import classification, common, fewshot, real, zeroshot

REGISTRY: dict[str, Callable[[common.Context], common.Evaluator | None]] = {
  'test': classification.build,
  'real': real.build,
  'fewshot': fewshot.build,
  'zeroshot': zeroshot.build,
}


def build(
  context: common.Context, names: tuple[str, ...] | None = None
) -> dict[str, common.Evaluator]:
  """The evaluators the run spec asks for, by name, in the registry's order; `names`: only
  those (an image-text run has no class logits for the classification evaluators)."""
  makers = {n: make for n, make in REGISTRY.items() if names is None or n in names}
  built = {name: make(context) for name, make in makers.items()}
  return {name: evaluator for name, evaluator in built.items() if evaluator is not None}

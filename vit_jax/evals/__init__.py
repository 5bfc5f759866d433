"""Evaluators behind one interface (big_vision's `evaluators/` are the model).

  common.py          the interface: `Evaluator` (`prefix`, `every`, `fixed`, `run(params)`),
                     the `Context` it is built from, and `evaluate` (over every parameter set)
  registry.py        the evaluators by name, and `build(context)`: those the spec asks for
  spec.py            their section of the run spec (`Evals`, `Fewshot`): keys and defaults
  classification.py  the test split: accuracy, top-5, loss (`accuracy_test`, ...)
  real.py            ImageNet ReaL (`accuracy_real`)
  fewshot.py         few-shot linear accuracy on frozen features (`fewshot/<dataset>/<n>shot`)
  zeroshot.py        zero-shot top-1 of an image-text model (`zeroshot/<dataset>`)
  retrieval.py       image-text retrieval recall@k (`retrieval/<dataset>/...`)
  prompts.py         prompt templates and ImageNet's class names (prompts.json)

Nothing is imported here, so that the run spec can hold `Evals` without TensorFlow.
"""

"""The trainer in parts, each testable alone.

  spec.py     the run spec: every config key's type, default and meaning; `from_config`
  setup.py    the spec resolved against the data, the devices and the files, and the run's
              task (vit_jax/tasks) built once (`prepare`)
  state.py    the train state: shapes, shardings, init (scratch or pretrained), checkpoints
  steps.py    the compiled training steps around the task's loss: `make_train_step` (jit),
              `make_shard_map_train_step`
  actions.py  the loop's periodic actions: progress and metrics, the evaluators
              (vit_jax/evals), checkpoints, profiling, the non-finite guard, preemption
  loop.py     `train_and_evaluate(config, workdir)`

`vit_jax.train.train_and_evaluate` is loaded on first use, so that importing `steps` or
`spec` (as the benchmark does) imports neither TensorFlow nor the input pipeline.
"""

from typing import Any

__all__ = ['train_and_evaluate']


def __getattr__(name: str) -> Any:
  if name == 'train_and_evaluate':
    from vit_jax.train.loop import train_and_evaluate

    return train_and_evaluate
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')

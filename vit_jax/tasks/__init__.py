"""The tasks a run can train, by name; the only reader of `config.task`.

  classification.py       images and labels (the default)
  distillation.py         classification with DeiT's teacher (`config.distill`); its losses in
                          distillation_losses.py
  contrastive.py          image-text pairs on a two-tower model, LiT's locked tower
                          (`config.contrastive`); its losses in contrastive_losses.py
  common.py               the interface, `common.Task`: what the trainer asks of a task

`get_task(spec)` says which a run spec trains: `config.task`, and a classification with a
teacher (`distill.teacher_checkpoint`) distils; `build` makes it for the run's model. A new
task is a module with a `common.Task` subclass and an entry in `TASKS`.
"""

from typing import Any

from vit_jax.tasks import classification, common, contrastive, distillation

TASKS: dict[str, type[common.Task]] = {
  'classification': classification.Task,
  'distillation': distillation.Task,
  'contrastive': contrastive.Task,
}
# The values of `config.task`: distillation is asked for by its teacher.
CONFIG_TASKS = ('classification', 'contrastive')


def name(spec: Any) -> str:
  """The task the run spec trains (a key of `TASKS`)."""
  if spec.step.task == 'classification' and spec.step.distill.enabled:
    return 'distillation'
  return spec.step.task


def get_task(spec: Any) -> type[common.Task]:
  """The task the run spec trains, to `build` in setup."""
  return TASKS[name(spec)]


def build(
  spec: Any, model: Any, pretrained_path: str | None = None, resuming: bool = False
) -> common.Task:
  """The task of the resolved run `spec` on `model` (`common.Task.build`)."""
  return get_task(spec).build(spec, model, pretrained_path, resuming)


def check(spec: Any) -> None:
  """`config.task`, the `distill` section, and the checks of the run's task: one-line
  ValueErrors."""
  common.one_of('task', spec.step.task, CONFIG_TASKS)
  distillation.check(spec.step)
  common.check_image_inputs(spec)
  if spec.init.text_pretrained_path and spec.step.task != 'contrastive':
    raise ValueError(
      'config.text_pretrained_path starts the text tower of an image-text model: set '
      "--config.task=contrastive, or leave it ''."
    )
  get_task(spec).check(spec)

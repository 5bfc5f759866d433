"""The distillation task: DeiT's knowledge distillation (Touvron et al., arXiv:2012.12877).

A classification run with a teacher (`config.distill.teacher_checkpoint`) distils: the
classification task (vit_jax/tasks/classification.py) whose softmax loss is DeiT's, on the
student's two heads (one head for a student without a distillation token) and the teacher's
logits on the same (augmented) batch.

`load` fits the teacher's checkpoint (`vit_jax.checkpoint.fit`: any format, any registered
architecture, or the one its shapes describe) and checks it against the run;
`teacher_logits` runs it in inference mode on the student's batch, resized to the teacher's
resolution where it differs; `loss` is vit_jax/tasks/distillation_losses.py's hard or soft
loss per example. The teacher's parameters are an input of the compiled step
(`Task.inputs`), placed on the mesh by the student's sharding rules: they are not trained,
not in the optimizer state and not in checkpoints (a resumed run reads them again from the
same file). Nothing here imports TensorFlow.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import parallel
from vit_jax.tasks import classification, common, distillation_losses

KINDS = ('hard', 'soft')


@dataclasses.dataclass(frozen=True)
class Distill:
  """`config.distill`: the teacher and DeiT's loss.

  The teacher runs in inference mode inside the training step, on the same augmented batch;
  its parameters are an input of the step (sharded like the student's), never trained nor
  saved: a resumed run reads them again from `teacher_checkpoint`. A distilled student
  (`distilled=True`) learns the labels through its class head and the teacher through its
  distillation head; any other student takes both terms on its one head. Defaults: DeiT's.
  """

  # The teacher's checkpoint, any format vit_jax.checkpoint reads (.npz, a Hugging Face or timm
  # file or folder, an orbax run directory). Empty: no distillation.
  teacher_checkpoint: str = ''
  # The teacher's registry name (checked against the checkpoint), or '' for the architecture
  # the checkpoint holds (read off its shapes).
  teacher: str = ''
  # Or its constructor fields (a dict, as config.model), used as given; None: as `teacher`.
  teacher_model: Mapping[str, Any] | None = None
  # 'hard': (1 - alpha) CE(class head, labels) + alpha CE(distillation head, teacher's argmax),
  # the paper's eq. 3 at alpha 1/2. 'soft': (1 - alpha) CE + alpha tau^2 KL(teacher || student)
  # at temperature tau, eq. 2 (alpha is the paper's lambda).
  kind: str = 'hard'
  alpha: float = 0.5
  temperature: float = 1.0
  # The teacher's input size in pixels; 0: the resolution its checkpoint was trained at. The
  # batch's images are resized to it (bilinear, antialiased) inside the step where it differs
  # from pp.crop.
  teacher_resolution: int = 0

  @property
  def enabled(self) -> bool:
    return bool(self.teacher_checkpoint)


def check(step: Any) -> None:
  """The `distill` section of the run spec's `step`, whichever the task: one-line ValueErrors."""
  d = step.distill
  common.one_of('distill.kind', d.kind, KINDS)
  if not d.enabled:
    if d.teacher or d.teacher_model is not None:
      raise ValueError(
        'config.distill names a teacher but not its weights: set '
        '--config.distill.teacher_checkpoint=PATH.'
      )
    return
  if step.loss != 'softmax_xent':
    raise ValueError(
      f"config.loss={step.loss!r}: distillation trains softmax heads; use 'softmax_xent'."
    )
  if not 0.0 <= d.alpha <= 1.0:
    raise ValueError(f'config.distill.alpha={d.alpha}; expected a weight in [0, 1].')
  if d.temperature <= 0:
    raise ValueError(f'config.distill.temperature={d.temperature}; expected > 0.')
  if d.teacher_resolution < 0:
    raise ValueError(f'config.distill.teacher_resolution={d.teacher_resolution}; expected >= 0.')


@dataclasses.dataclass(frozen=True)
class Teacher:
  """The static part of a teacher: its module and the (height, width) it sees."""

  model: nn.Module
  resolution: tuple[int, int]
  description: str


def _fit(distill: Distill, crop: int):
  """The checkpoint fitted at the teacher's resolution: `teacher_resolution`, else the
  checkpoint's own, else (sincos2d position embeddings fit any size) the student's crop."""
  from vit_jax import checkpoint

  path = distill.teacher_checkpoint
  model = distill.teacher_model if distill.teacher_model is not None else distill.teacher or None
  try:
    try:
      return checkpoint.fit(path, model, resolution=distill.teacher_resolution or None)
    except checkpoint.CheckpointError:
      if distill.teacher_resolution:
        raise
      return checkpoint.fit(path, model, resolution=crop)  # the same error if not the size
  except checkpoint.CheckpointError as e:
    reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
    for flag, key in (
      ('--model', 'config.distill.teacher'),
      ('--resolution', 'config.distill.teacher_resolution'),
    ):
      reason = reason.replace(flag, key)  # the loader's words for predict's flags
    raise ValueError(f'Teacher config.distill.teacher_checkpoint={path}: {reason}') from None


def load(distill: Distill, num_classes: int, crop: int, dtype: str) -> tuple[Teacher, Any]:
  """(the teacher, its float32 parameters on the host); one-line ValueErrors for a file that
  cannot be read or fitted, or a teacher without a head for the run's `num_classes`."""
  from vit_jax.checkpoint import tree

  fitted = _fit(distill, crop)
  path = distill.teacher_checkpoint
  classes = fitted.config.num_classes
  if classes != num_classes:
    held = f'a head of {classes} classes' if classes else 'no head'
    raise ValueError(
      f'Teacher {path} has {held}; the run trains {num_classes}: a teacher must be trained '
      'on the same classes (config.distill.teacher_checkpoint).'
    )
  res = fitted.resolution
  resolution = (res, res) if isinstance(res, int) else tuple(res)
  name = fitted.name or tree.describe(fitted.config)
  teacher = Teacher(
    model=fitted.model(dtype=jnp.dtype(dtype)),
    resolution=resolution,
    description=f'{name} at {"x".join(map(str, resolution))} px from {path}',
  )
  return teacher, jax.tree.map(lambda x: np.asarray(x, np.float32), fitted.params)


def place(params: Any, mesh: jax.sharding.Mesh, rules: Any) -> Any:
  """The teacher's host parameters on the mesh, sharded by the student's rules."""
  return parallel.place(params, parallel.tree_shardings(params, mesh, rules))


def teacher_logits(teacher: Teacher, params: Any, images: jax.Array) -> jax.Array:
  """The teacher's float32 logits in inference mode (no dropout), without gradient."""
  h, w = teacher.resolution
  if images.shape[1:3] != (h, w):
    images = jax.image.resize(images, (images.shape[0], h, w, images.shape[3]), 'bilinear')
  out = teacher.model.apply({'params': params}, images, train=False)
  return jax.lax.stop_gradient(out.astype(jnp.float32))


def loss(
  distill: Distill, student: Any, targets: jax.Array, teacher_logits: jax.Array
) -> jax.Array:
  """The per-example distillation loss of the student's logits: the pair (class head,
  distillation head) of a distilled student, or one array, which then takes both terms."""
  cls, dist = student if isinstance(student, tuple) else (student, student)
  if distill.kind == 'hard':
    return distillation_losses.hard_distillation_loss(
      cls, dist, targets, teacher_logits, distill.alpha
    )
  return distillation_losses.soft_distillation_loss(
    cls, dist, targets, teacher_logits, temperature=distill.temperature, weight=distill.alpha
  )


class Task(classification.Task):
  """Classification with a teacher: `teacher` (its module and resolution) and its float32
  host parameters `teacher_params`, the step's one input."""

  def __init__(self, spec: Any, model: Any, teacher: Teacher, teacher_params: Any):
    super().__init__(spec, model)
    self.teacher = teacher
    self.teacher_params = teacher_params

  @classmethod
  def build(cls, spec, model, pretrained_path=None, resuming=False) -> 'Task':
    """The run's teacher read and checked against it (the resolved `num_classes`)."""
    del pretrained_path, resuming
    d, data = spec.step.distill, spec.data
    teacher, params = load(d, data.num_classes, data.pp.crop, spec.model.dtype)
    return cls(spec, model, teacher, params)

  def inputs(self, mesh: jax.sharding.Mesh) -> tuple[Any]:
    return (place(self.teacher_params, mesh, self.spec.step.sharding),)

  def resolved(self) -> dict[str, Any]:
    return {'teacher': self.teacher.description}

  def describe(self) -> str:
    return f'Distilling from {self.teacher.description}.'

  def heads(self) -> dict[str, bool]:
    """A distilled student's two heads: (class head, distillation head)."""
    return self.family.feature_kwargs(self.model)

  def softmax_loss(self, logits, targets, images, *inputs) -> jax.Array:
    """DeiT's loss against the teacher's logits of `images` (`inputs`: its parameters)."""
    (teacher_params,) = inputs
    of_teacher = teacher_logits(self.teacher, teacher_params, images)
    return loss(self.spec.step.distill, logits, targets, of_teacher).mean()

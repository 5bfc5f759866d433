"""DeiT's knowledge distillation in the trainer: the teacher, read once, and the step's loss.

`load` fits the teacher's checkpoint (`vit_jax.checkpoint.fit`: any format, any registered
architecture, or the one its shapes describe) and checks it against the run; `logits` runs it in
inference mode on the student's batch, resized to the teacher's resolution where it differs;
`loss` is `vit_jax.train.losses`' hard or soft distillation loss per example. The teacher's
parameters are an input of the compiled step, placed on the mesh by the student's sharding
rules: they are not trained, not in the optimizer state and not in checkpoints (a resumed run
reads them again from the same file). Nothing here imports TensorFlow.
"""

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import parallel
from vit_jax.train import losses
from vit_jax.train import spec as spec_lib


@dataclasses.dataclass(frozen=True)
class Teacher:
  """The static part of a teacher: its module and the (height, width) it sees."""

  model: nn.Module
  resolution: tuple[int, int]
  description: str


def _fit(distill: spec_lib.Distill, crop: int):
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


def load(distill: spec_lib.Distill, num_classes: int, crop: int, dtype: str) -> tuple[Teacher, Any]:
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


def logits(teacher: Teacher, params: Any, images: jax.Array) -> jax.Array:
  """The teacher's float32 logits in inference mode (no dropout), without gradient."""
  h, w = teacher.resolution
  if images.shape[1:3] != (h, w):
    images = jax.image.resize(images, (images.shape[0], h, w, images.shape[3]), 'bilinear')
  out = teacher.model.apply({'params': params}, images, train=False)
  return jax.lax.stop_gradient(out.astype(jnp.float32))


def loss(
  distill: spec_lib.Distill, student: Any, targets: jax.Array, teacher_logits: jax.Array
) -> jax.Array:
  """The per-example distillation loss of the student's logits: the pair (class head,
  distillation head) of a distilled student, or one array, which then takes both terms."""
  cls, dist = student if isinstance(student, tuple) else (student, student)
  if distill.kind == 'hard':
    return losses.hard_distillation_loss(cls, dist, targets, teacher_logits, distill.alpha)
  return losses.soft_distillation_loss(
    cls, dist, targets, teacher_logits, temperature=distill.temperature, weight=distill.alpha
  )

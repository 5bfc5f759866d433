"""Optimizers, learning-rate schedules and gradient accumulation.

Fine-tuning (the paper's Table 4): SGD with momentum 0.9, global-norm clipping at 1, no
weight decay, warmup then cosine or linear decay. Pretraining (Table 3): Adam (0.9, 0.999)
with decoupled weight decay on the kernels, warmup then linear (or cosine) decay.

Weight decay follows AdamW (Loshchilov & Hutter; optax.adamw; PyTorch AdamW): each step
shrinks the decayed parameters by `lr_t * weight_decay`, where `lr_t` is the scheduled
learning rate. big_vision's `wd` (not multiplied by the learning rate) is `lr * weight_decay`
in this convention: its wd=1e-4 at lr=1e-3 is weight_decay=0.1 here.
"""

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

DECAY_TYPES = ('cosine', 'linear', 'constant')
OPTIMIZERS = ('sgd', 'adam')


@dataclasses.dataclass(frozen=True)
class Optim:
  """The run spec's optimizer section (`RunSpec.optim`): the optimizer and its schedule."""

  # 'sgd' (momentum) for fine-tuning, 'adam' for pretraining.
  optimizer: str = 'sgd'
  momentum: float = 0.9
  b1: float = 0.9
  b2: float = 0.999
  # Decoupled weight decay (AdamW convention, see the module docstring) on `weight_decay_pattern`.
  weight_decay: float = 0.0
  weight_decay_pattern: str = r'.*/kernel'
  # Clip gradients to this global norm (0 = no clipping).
  grad_norm_clip: float = 1.0
  # dtype of the first moment (SGD momentum, Adam mu): 'float32' or 'bfloat16'.
  optim_dtype: str = 'float32'
  base_lr: float = 0.03
  # 'cosine', 'linear' (to `linear_end`) or 'constant', after `warmup_steps` of linear warmup.
  decay_type: str = 'cosine'
  warmup_steps: int = 500
  linear_end: float = 1e-5


def create_learning_rate_schedule(
  total_steps: int,
  base_lr: float,
  decay_type: str = 'cosine',
  warmup_steps: int = 0,
  linear_end: float = 1e-5,
) -> optax.Schedule:
  """The original vit_jax schedule: linear warmup, then cosine, linear or constant.

  lr(step) = base * min(1, step / warmup) * decay(progress), with
  progress = clip((step - warmup) / (total - warmup), 0, 1).
  """
  if decay_type not in DECAY_TYPES:
    raise ValueError(f'decay_type={decay_type!r}; expected one of {DECAY_TYPES}.')

  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    progress = jnp.clip((step - warmup_steps) / max(1.0, total_steps - warmup_steps), 0.0, 1.0)
    if decay_type == 'cosine':
      lr = base_lr * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
    elif decay_type == 'linear':
      lr = linear_end + (base_lr - linear_end) * (1.0 - progress)
    else:
      lr = jnp.full_like(progress, base_lr)
    if warmup_steps:
      lr = lr * jnp.minimum(1.0, step / warmup_steps)
    return lr

  return schedule


def path_mask(params: Any, pattern: str) -> Any:
  """A tree of bools: True where the '/'-joined parameter path fully matches `pattern`."""
  regex = re.compile(pattern)

  def match(path, _):
    return bool(regex.fullmatch('/'.join(str(getattr(k, 'key', k)) for k in path)))

  return jax.tree_util.tree_map_with_path(match, params)


def make_optimizer(spec: Optim, schedule: optax.Schedule) -> optax.GradientTransformation:
  """The optax chain of the run spec's optimizer section (`optimizer`, `grad_norm_clip`, ...).

  `optim_dtype` is the dtype of the first moment (SGD momentum, Adam's mu); Adam's second
  moment always stays float32 (in bfloat16 it loses the small values that matter).
  """
  if spec.optimizer not in OPTIMIZERS:
    raise ValueError(f'optimizer={spec.optimizer!r}; expected one of {OPTIMIZERS}.')
  dtype = jnp.dtype(spec.optim_dtype)
  parts = []
  if spec.grad_norm_clip:
    parts.append(optax.clip_by_global_norm(spec.grad_norm_clip))
  if spec.optimizer == 'sgd':
    parts.append(optax.trace(decay=spec.momentum, accumulator_dtype=dtype))
  else:
    parts.append(optax.scale_by_adam(b1=spec.b1, b2=spec.b2, mu_dtype=dtype))
  if spec.weight_decay:
    pattern = spec.weight_decay_pattern
    parts.append(optax.add_decayed_weights(spec.weight_decay, mask=lambda p: path_mask(p, pattern)))
  parts.append(optax.scale_by_learning_rate(schedule))
  return optax.chain(*parts)


def for_training(
  spec: Optim, total_steps: int
) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """(optimizer, schedule) of a run: the update after step s uses lr(s + 1).

  The first update uses lr(1), not lr(0) (which is 0 with warmup); the schedule is what a
  step's metrics report as its learning rate.
  """
  schedule = create_learning_rate_schedule(
    total_steps, spec.base_lr, spec.decay_type, spec.warmup_steps, spec.linear_end
  )
  return make_optimizer(spec, lambda count: schedule(count + 1)), schedule


def accumulate_gradient(
  loss_and_grad_fn: Callable[..., tuple[jax.Array, Any]],
  params: Any,
  batch: Any,
  accum_steps: int,
  varying_axis: str | None = None,
) -> tuple[jax.Array, Any]:
  """Mean loss and gradient over `accum_steps` micro-batches of `batch` (a tree of arrays).

  Micro-batch j takes examples j, j + accum_steps, j + 2 * accum_steps, ..., so with the
  batch sharded over devices in contiguous blocks every device holds its share of every
  micro-batch and no data moves. With equal micro-batches the mean of their means is the
  mean over the batch, so the result equals one pass over the whole batch.

  Inside `jax.shard_map`, `varying_axis` names the mesh axis the per-device results vary
  over (`params` are then device-varying too), so the sums start from zeros of that type.
  """
  if accum_steps <= 1:
    return loss_and_grad_fn(params, *batch)
  size = jax.tree.leaves(batch)[0].shape[0]
  if size % accum_steps:
    raise ValueError(
      f'batch of {size} does not split into accum_steps={accum_steps} micro-batches.'
    )

  def micro(x):
    x = x.reshape((size // accum_steps, accum_steps, *x.shape[1:]))
    return jnp.swapaxes(x, 0, 1)

  micro_batches = jax.tree.map(micro, batch)

  def body(carry, mb):
    loss, grads = loss_and_grad_fn(params, *mb)
    return jax.tree.map(jnp.add, carry, (loss, grads)), None

  zeros = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params))
  if varying_axis is not None:  # the gradient zeros are already: they follow the params
    zeros = (jax.lax.pcast(zeros[0], varying_axis, to='varying'), zeros[1])
  (loss, grads), _ = jax.lax.scan(body, zeros, micro_batches)
  return jax.tree.map(lambda x: x / accum_steps, (loss, grads))

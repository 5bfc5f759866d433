"""The compiled training step: jit, or per-device shard_map (evaluation: vit_jax/evals).

The train state is a dict `{'params', 'opt_state', 'step', 'rng'}` (and `'polyak'`, the
average of the parameters, with `polyak_decay`) and a batch
`{'image': f32 (B, H, W, 3), 'label': int32 (B,)}`. Both training steps compute the same
update: the mean loss over the global batch (mixed first with `mixup`/`cutmix`, see
`mixing`; in `accum_steps` micro-batches), its gradient, the optax update, and the metrics
`loss`, `grad_norm`, `learning_rate`, `params_finite`. With a distillation teacher
(vit_jax/train/distill.py) a step takes the teacher's parameters as a third argument,
`step(state, batch, teacher_params)`, and the loss is DeiT's.

  jit        one program for the global batch; GSPMD partitions it over the mesh from the
             state's shardings (replicated or FSDP), and inserts the gradient reduction.
  shard_map  the original vit_jax's pmapped `update_fn` in today's JAX: each device computes
             the loss and gradient of its own rows, an explicit `lax.pmean` averages the
             gradients, and every device applies the same update to its replica.

The contrastive task (`task='contrastive'`, vit_jax/train/image_text.py) has its two steps
here too: a batch `{'image', 'text'}` of pairs, the loss over every device's embeddings.

Nothing here imports TensorFlow: `vit_jax.benchmark` times this step on machines without it.
"""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from vit_jax import optim, parallel
from vit_jax.train import distill, image_text, mixing, polyak
from vit_jax.train import spec as spec_lib

State = dict[str, Any]
Batch = dict[str, jax.Array]
StepFn = Callable[[State, Batch], tuple[State, dict[str, jax.Array]]]


def uses_dropout(model) -> bool:
  """Whether the model drops out (or drops paths) in training: then each example gets its
  own key."""
  t = getattr(model, 'transformer', None) or {}
  rates = ('dropout_rate', 'attention_dropout_rate', 'drop_path_rate')
  return any(t.get(rate, 0.0) for rate in rates)


def make_loss_fn(model, step: spec_lib.Step, num_classes: int, teacher=None):
  """loss(params, images, labels, example_ids, rng, teacher_params=None) -> mean loss; `labels`
  are class indices (B,) or soft targets (B, num_classes) (mixup, CutMix).

  With dropout, each example gets its own key fold_in(rng, global example id), so the
  masks do not depend on how the batch is split over devices or micro-batches. With a
  `distill.Teacher`, the loss is `step.distill`'s on the student's two heads (one head for
  a student without a distillation token) and the teacher's logits on the same images.
  """
  dropout = uses_dropout(model)
  heads = {'both_heads': True} if teacher is not None and getattr(model, 'distilled', False) else {}

  def forward(params, images, ids, rng):
    variables = {'params': params}
    if not dropout:
      return model.apply(variables, images, train=True, **heads)

    def one(image, i):
      key = jax.random.fold_in(rng, i)
      out = model.apply(variables, image[None], train=True, rngs={'dropout': key}, **heads)
      return jax.tree.map(lambda x: x[0], out)

    return jax.vmap(one)(images, ids)

  def loss_fn(params, images, labels, ids, rng, teacher_params=None):
    logits = forward(params, images, ids, rng)
    targets = labels if labels.ndim == 2 else jax.nn.one_hot(labels, num_classes)
    if step.loss == 'sigmoid_xent':
      return optax.sigmoid_binary_cross_entropy(logits, targets).sum(-1).mean()
    if step.label_smoothing:
      targets = optax.smooth_labels(targets, step.label_smoothing)
    if teacher is None:
      return optax.softmax_cross_entropy(logits, targets).mean()
    teacher_logits = distill.logits(teacher, teacher_params, images)
    return distill.loss(step.distill, logits, targets, teacher_logits).mean()

  return loss_fn


def _loss_and_grad(
  loss_fn, mix, accum_steps: int, params, state: State, batch: Batch, first_id, teacher,
  axis=None,
):  # fmt: skip
  """Mean loss and gradient over `batch` (mixed first if the step mixes), whose first
  example has the global id `first_id`; `teacher`: the teacher's parameters (not
  differentiated) or None; `axis`: the mesh axis the per-device results vary over (in the
  shard_map step)."""
  rng = jax.random.fold_in(jax.random.wrap_key_data(state['rng']), state['step'])
  size = batch['label'].shape[0]
  ids = first_id + jnp.arange(size, dtype=jnp.int32)
  images, labels = batch['image'], batch['label']
  if mix is not None:
    images, labels = mix(images, labels, jax.random.fold_in(rng, mixing.KEY_DATA), axis)

  def loss_and_grad(params, images, labels, ids):
    return jax.value_and_grad(loss_fn)(params, images, labels, ids, rng, teacher)

  data = (images, labels, ids)
  return optim.accumulate_gradient(loss_and_grad, params, data, accum_steps, axis)


def _apply(
  tx, schedule, state: State, loss, grads, polyak_decay: float
) -> tuple[State, dict[str, jax.Array]]:
  """The optimizer update (and the Polyak average's), and the step's metrics."""
  step = state['step']
  updates, opt_state = tx.update(grads, state['opt_state'], state['params'])
  params = optax.apply_updates(state['params'], updates)
  new_state = {'params': params, 'opt_state': opt_state, 'step': step + 1, 'rng': state['rng']}
  if 'polyak' in state:
    new_state['polyak'] = polyak.update(state['polyak'], params, step + 1, polyak_decay)
  finite = jnp.stack([jnp.isfinite(x).all() for x in jax.tree.leaves(params)])
  metrics = {
    'loss': loss,
    'grad_norm': optax.tree.norm(grads),
    'learning_rate': schedule(step + 1),
    'params_finite': jnp.all(finite),
  }
  return new_state, metrics


def make_train_step(
  model, tx, schedule, step: spec_lib.Step, num_classes: int, batch_size: int, teacher=None
) -> StepFn:
  """The step on one global batch of `batch_size`, for `jax.jit` (GSPMD); with a
  `distill.Teacher`, `step(state, batch, teacher_params)`."""
  loss_fn = make_loss_fn(model, step, num_classes, teacher)
  mix = mixing.make_mix(step.mixup, step.cutmix, num_classes)

  def train_step(state, batch, teacher_params=None):
    first_id = state['step'].astype(jnp.int32) * batch_size
    args = (loss_fn, mix, step.accum_steps, state['params'], state, batch, first_id)
    loss, grads = _loss_and_grad(*args, teacher_params)
    return _apply(tx, schedule, state, loss, grads, step.polyak_decay)

  return train_step


def make_shard_map_train_step(
  model, tx, schedule, step: spec_lib.Step, num_classes: int, batch_size: int, mesh: Mesh,
  teacher=None,
) -> StepFn:  # fmt: skip
  """The same step written per device: `jax.shard_map` over the data axis.

  Each device sees its rows of the batch and a replica of the state (and of the teacher's
  parameters). The parameters are cast to device-varying before differentiating, so
  `grad` returns this device's gradient (differentiating the replicated parameters directly
  would already sum it over devices, and a pmean of that sum is N times the mean);
  `lax.pmean` then averages the gradients, as the original's `update_fn` did under pmap.
  Micro-batch j of a device takes its rows j, j + accum_steps, ...: over all devices
  exactly the jit step's micro-batch j.
  """
  loss_fn = make_loss_fn(model, step, num_classes, teacher)
  mix = mixing.make_mix(step.mixup, step.cutmix, num_classes)
  axis = parallel.DATA_AXIS

  def per_device(state, batch, teacher_params=None):
    local = batch['label'].shape[0]
    offset = jax.lax.axis_index(axis).astype(jnp.int32) * local
    first_id = state['step'].astype(jnp.int32) * batch_size + offset
    params = jax.lax.pcast(state['params'], axis, to='varying')
    args = (loss_fn, mix, step.accum_steps, params, state, batch, first_id)
    loss, grads = _loss_and_grad(*args, teacher_params, axis)
    loss, grads = jax.lax.pmean((loss, grads), axis)
    return _apply(tx, schedule, state, loss, grads, step.polyak_decay)

  in_specs = (P(), P(axis)) + ((P(),) if teacher is not None else ())
  return jax.shard_map(per_device, mesh=mesh, in_specs=in_specs, out_specs=(P(), P()))


def make_contrastive_train_step(model, tx, schedule, step: spec_lib.Step) -> StepFn:
  """The contrastive task's step on one global batch `{'image', 'text'}` of pairs, for
  `jax.jit`: the loss over the global batch (vit_jax/train/image_text.py), its gradient,
  the update; the loss's metrics beside the step's."""
  loss_fn = image_text.loss_fn(model, step.contrastive)

  def train_step(state, batch):
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    (loss, metrics), grads = grad_fn(state['params'], batch)
    state, out = _apply(tx, schedule, state, loss, grads, step.polyak_decay)
    return state, {**metrics, **out}

  return train_step


def make_contrastive_shard_map_train_step(
  model, tx, schedule, step: spec_lib.Step, mesh: Mesh
) -> StepFn:
  """The same step per device: each device embeds its rows, the loss all-gathers the
  embeddings (every device's are negatives) and returns the global loss on every device.
  The parameters are cast to device-varying, so each device's gradient is its own terms'
  derivative; their `lax.psum` is the global gradient (vit_jax/train/contrastive.py)."""
  axis = parallel.DATA_AXIS
  loss_fn = image_text.loss_fn(model, step.contrastive, axis)

  def per_device(state, batch):
    params = jax.lax.pcast(state['params'], axis, to='varying')
    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
    grads = jax.lax.psum(grads, axis)
    # The metrics of the parameters alone (the temperature, the bias) are the same on every
    # device but typed device-varying: their mean is the value, typed replicated (the mean
    # of the others, already replicated, is themselves).
    metrics = jax.lax.pmean(metrics, axis)
    state, out = _apply(tx, schedule, state, loss, grads, step.polyak_decay)
    return state, {**metrics, **out}

  return jax.shard_map(per_device, mesh=mesh, in_specs=(P(), P(axis)), out_specs=(P(), P()))


def counting_bad_examples(fn: StepFn) -> StepFn:
  """`fn` on the batch's images and labels (and texts), with the metric `bad_images`: how
  many of its rows replace an unreadable example (the input pipeline's `bad` flags), if it
  has them."""

  def train_step(state, batch, *teacher_params):
    inputs = {k: v for k, v in batch.items() if k in ('image', 'label', 'text')}
    state, metrics = fn(state, inputs, *teacher_params)
    if 'bad' in batch:
      metrics = {**metrics, 'bad_images': jnp.sum(batch['bad'])}
    return state, metrics

  return train_step


def compile_train_step(
  fn: StepFn, shardings: Any, batch_sharding: NamedSharding, mesh: Mesh, teacher_shardings=None
) -> Callable:
  """`fn` under jax.jit with the state's shardings (and the teacher parameters', when it
  takes them); the old state is donated."""
  in_shardings = (shardings, batch_sharding)
  if teacher_shardings is not None:
    in_shardings += (teacher_shardings,)
  return jax.jit(
    fn,
    in_shardings=in_shardings,
    out_shardings=(shardings, parallel.replicated(mesh)),
    donate_argnums=(0,),
  )


def train_step_for(
  spec: spec_lib.RunSpec, model, tx, schedule, num_classes: int, mesh: Mesh, shardings: Any,
  teacher=None, teacher_params=None,
) -> Callable[[State, Batch], tuple[State, dict[str, jax.Array]]]:  # fmt: skip
  """The compiled training step that `spec.step.step` selects ('jit' or 'shard_map'), as
  `step(state, batch)`: a teacher's parameters (on the mesh) are bound as its third input."""
  args = (model, tx, schedule, spec.step, num_classes, spec.data.batch)
  if spec.step.task == 'contrastive':
    if spec.step.step == 'shard_map':
      fn = make_contrastive_shard_map_train_step(*args[:4], mesh)
    else:
      fn = make_contrastive_train_step(*args[:4])
  elif spec.step.step == 'shard_map':
    fn = make_shard_map_train_step(*args, mesh, teacher=teacher)
  else:
    fn = make_train_step(*args, teacher=teacher)
  fn = counting_bad_examples(fn)
  batch_sharding = parallel.batch_sharding(mesh)
  if teacher is None:
    return compile_train_step(fn, shardings, batch_sharding, mesh)
  teacher_shardings = jax.tree.map(lambda x: x.sharding, teacher_params)
  compiled = compile_train_step(fn, shardings, batch_sharding, mesh, teacher_shardings)
  return lambda state, batch: compiled(state, batch, teacher_params)

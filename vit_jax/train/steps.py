"""The compiled training step: jit, or per-device shard_map (evaluation: vit_jax/evals).

The train state is a dict `{'params', 'opt_state', 'step', 'rng'}` (and `'polyak'`, the
average of the parameters, with `polyak_decay`) and a batch holds the task's arrays
(vit_jax/tasks: `{'image', 'label'}` of a classification, `{'image', 'text'}` of image-text
pairs). Both steps compute the same update around the run's task, which they never name:
the batch mixed first where the spec asks (`mixup`/`cutmix`, see `mixing`), the task's loss
and gradient (`task.loss_and_grad`), the optax update, and the metrics `loss`, `grad_norm`,
`learning_rate`, `params_finite` (and the task's own). A step takes the task's inputs (a
distillation teacher's parameters; none for the others) as a third argument,
`step(state, batch, inputs)`.

  jit        one program for the global batch; GSPMD partitions it over the mesh from the
             state's shardings (replicated or FSDP), and inserts the gradient reduction.
  shard_map  the original vit_jax's pmapped `update_fn` in today's JAX: each device computes
             the loss and gradient of its own rows, the task's explicit collective
             (`task.reduce`: a classification's `lax.pmean`, a contrastive loss's `lax.psum`)
             makes them the global batch's, and every device applies the same update to its
             replica.

Nothing here imports TensorFlow: `vit_jax.benchmark` times this step on machines without it.
"""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from vit_jax import parallel
from vit_jax.tasks import common as tasks_common
from vit_jax.train import mixing, polyak
from vit_jax.train import spec as spec_lib

State = dict[str, Any]
Batch = dict[str, jax.Array]
StepFn = Callable[..., tuple[State, dict[str, jax.Array]]]


def _loss_and_grad(
  task: tasks_common.Task, mix, params, state: State, batch: Batch, first_id, inputs, axis=None
):
  """The task's (loss, gradient, metrics) of `batch` (mixed first if the step mixes), whose
  first example has the global id `first_id`; `axis`: the mesh axis the per-device results
  vary over (in the shard_map step)."""
  rng = jax.random.fold_in(jax.random.wrap_key_data(state['rng']), state['step'])
  if mix is not None:
    key = jax.random.fold_in(rng, mixing.KEY_DATA)
    images, labels = mix(batch['image'], batch['label'], key, axis)
    batch = {**batch, 'image': images, 'label': labels}
  return task.loss_and_grad(params, batch, rng, first_id, inputs, axis)


def _apply(
  tx, schedule, state: State, loss, grads, metrics, polyak_decay: float
) -> tuple[State, dict[str, jax.Array]]:
  """The optimizer update (and the Polyak average's), and the step's metrics beside the
  task's."""
  step = state['step']
  updates, opt_state = tx.update(grads, state['opt_state'], state['params'])
  params = optax.apply_updates(state['params'], updates)
  new_state = {'params': params, 'opt_state': opt_state, 'step': step + 1, 'rng': state['rng']}
  if 'polyak' in state:
    new_state['polyak'] = polyak.update(state['polyak'], params, step + 1, polyak_decay)
  finite = jnp.stack([jnp.isfinite(x).all() for x in jax.tree.leaves(params)])
  return new_state, {
    **metrics,
    'loss': loss,
    'grad_norm': optax.tree.norm(grads),
    'learning_rate': schedule(step + 1),
    'params_finite': jnp.all(finite),
  }


def make_train_step(task: tasks_common.Task, tx, schedule, spec: spec_lib.RunSpec) -> StepFn:
  """The step on one global batch (of `spec.data.batch`), for `jax.jit` (GSPMD):
  `step(state, batch, inputs=())`, `inputs` the task's (`task.inputs`)."""
  mix = mixing.make_mix(spec.step.mixup, spec.step.cutmix, spec.data.num_classes)

  def train_step(state, batch, inputs=()):
    first_id = state['step'].astype(jnp.int32) * spec.data.batch
    args = (task, mix, state['params'], state, batch, first_id, inputs)
    loss, grads, metrics = _loss_and_grad(*args)
    return _apply(tx, schedule, state, loss, grads, metrics, spec.step.polyak_decay)

  return train_step


def make_shard_map_train_step(
  task: tasks_common.Task, tx, schedule, spec: spec_lib.RunSpec, mesh: Mesh
) -> StepFn:
  """The same step written per device: `jax.shard_map` over the data axis,
  `step(state, batch, inputs)`.

  Each device sees its rows of the batch and a replica of the state (and of the task's
  inputs). The parameters are cast to device-varying before differentiating, so `grad`
  returns this device's gradient (differentiating the replicated parameters directly would
  already sum it over devices, and a pmean of that sum is N times the mean); the task's
  `reduce` then makes it the global batch's: a classification's `lax.pmean` of each
  device's mean loss and gradient (as the original's `update_fn` did under pmap), a
  contrastive loss's `lax.psum` of each device's terms' gradients. Micro-batch j of a device
  takes its rows j, j + accum_steps, ...: over all devices exactly the jit step's
  micro-batch j.
  """
  mix = mixing.make_mix(spec.step.mixup, spec.step.cutmix, spec.data.num_classes)
  axis = parallel.DATA_AXIS

  def per_device(state, batch, inputs):
    local = batch['image'].shape[0]
    offset = jax.lax.axis_index(axis).astype(jnp.int32) * local
    first_id = state['step'].astype(jnp.int32) * spec.data.batch + offset
    params = jax.lax.pcast(state['params'], axis, to='varying')
    args = (task, mix, params, state, batch, first_id, inputs, axis)
    loss, grads, metrics = task.reduce(*_loss_and_grad(*args), axis)
    return _apply(tx, schedule, state, loss, grads, metrics, spec.step.polyak_decay)

  in_specs = (P(), P(axis), P())
  return jax.shard_map(per_device, mesh=mesh, in_specs=in_specs, out_specs=(P(), P()))


def counting_bad_examples(fn: StepFn, keys: tuple[str, ...]) -> StepFn:
  """`fn` on the batch's arrays of `keys` (the task's), with the metric `bad_images`: how
  many of its rows replace an unreadable example (the input pipeline's `bad` flags), if it
  has them."""

  def train_step(state, batch, *inputs):
    state, metrics = fn(state, {k: v for k, v in batch.items() if k in keys}, *inputs)
    if 'bad' in batch:
      metrics = {**metrics, 'bad_images': jnp.sum(batch['bad'])}
    return state, metrics

  return train_step


def compile_train_step(
  fn: StepFn, shardings: Any, batch_sharding: NamedSharding, mesh: Mesh, *input_shardings: Any
) -> Callable:
  """`fn` under jax.jit with the state's shardings (and its further inputs', when it takes
  them); the old state is donated."""
  return jax.jit(
    fn,
    in_shardings=(shardings, batch_sharding, *input_shardings),
    out_shardings=(shardings, parallel.replicated(mesh)),
    donate_argnums=(0,),
  )


def train_step_for(
  spec: spec_lib.RunSpec, task: tasks_common.Task, tx, schedule, mesh: Mesh, shardings: Any
) -> Callable[[State, Batch], tuple[State, dict[str, jax.Array]]]:
  """The compiled training step of the task that `spec.step.step` selects ('jit' or
  'shard_map'), as `step(state, batch)`: the task's inputs, placed on the mesh once, are
  bound as its third."""
  if spec.step.step == 'shard_map':
    fn = make_shard_map_train_step(task, tx, schedule, spec, mesh)
  else:
    fn = make_train_step(task, tx, schedule, spec)
  fn = counting_bad_examples(fn, task.batch_keys)
  inputs = task.inputs(mesh)
  input_shardings = jax.tree.map(lambda x: x.sharding, inputs)
  batch_sharding = parallel.batch_sharding(mesh)
  compiled = compile_train_step(fn, shardings, batch_sharding, mesh, input_shardings)
  return lambda state, batch: compiled(state, batch, inputs)

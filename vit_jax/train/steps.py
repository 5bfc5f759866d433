"""The compiled training step: jit, or per-device shard_map (evaluation: vit_jax/evals).

The train state is a dict `{'params', 'opt_state', 'step', 'rng'}` (and `'polyak'`, the average
of the parameters, with `polyak_decay`) and a batch holds the task's arrays (vit_jax/tasks:
`{'image', 'label'}` of a classification, `{'image', 'text'}` of image-text pairs). Both steps
compute the same update around the run's task, which they never name: the task's loss and
gradient (`task.loss_and_grad`; a classification mixes its batch first where the spec asks), the
optax update, and the metrics `loss`, `grad_norm`, `learning_rate`, `params_finite` (and the
task's own). A step takes the task's inputs (a distillation teacher's parameters; none for the
others) as a third argument, `step(state, batch, inputs)`.

  jit        one program for the global batch; GSPMD partitions it over the mesh from the
             state's shardings (replicated or FSDP), and inserts the gradient reduction.
  shard_map  the original vit_jax's pmapped `update_fn` in today's JAX: each device computes
             the loss and gradient of its own rows, the task's explicit collective
             (`task.reduce`: a classification's `lax.pmean`, a contrastive loss's `lax.psum`)
             makes them the global batch's, and every device applies the same update to its
             replica.

Nothing here imports TensorFlow: `vit_jax.benchmark` times this step on machines without it.
"""

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from vit_jax import parallel
from vit_jax.tasks import common as tasks_common
from vit_jax.train import spec as spec_lib

State = dict[str, Any]
Batch = dict[str, jax.Array]
StepFn = Callable[..., tuple[State, dict[str, jax.Array]]]


# Polyak averaging of the parameters (`polyak_decay`): an exponential moving average,
# debiased. After training step t (t = 1, 2, ...) with parameters p_t, the average with decay
# d is
#
#   avg_t = sum_{s=1..t} (1 - d) d^(t-s) p_s / (1 - d^t),
#
# whose weights sum to one (the bias correction of Adam's moments and of
# `optax.ema(debias=True)`): the starting parameters carry no weight, so a fine-tuned head that
# starts at zero is not pulled back towards zero, and after a few thousand steps at d = 0.9999
# the average is the plain moving average of the paper. It is kept recursively,
#
#   avg_t = avg_{t-1} + (p_t - avg_{t-1}) (1 - d) / (1 - d^t),    (avg_1 = p_1),
#
# as `optax.incremental_update`, inside the compiled step, sharded like the parameters.


def polyak_step_size(step: jax.Array, decay: float) -> jax.Array:
  """(1 - d) / (1 - d^t): the weight of step t's parameters in the average."""
  bias = -jnp.expm1(step.astype(jnp.float32) * math.log(decay))  # 1 - d^t, exact at small t
  return (1.0 - decay) / bias


def polyak_update(average: Any, params: Any, step: jax.Array, decay: float) -> Any:
  """The average after step `step` (counted from 1), whose parameters are `params`."""
  return optax.incremental_update(params, average, polyak_step_size(step, decay))


def _loss_and_grad(
  task: tasks_common.Task, params, state: State, batch: Batch, first_id, inputs, axis=None
):
  """The task's (loss, gradient, metrics) of `batch`, whose first example has the global id
  `first_id`, with the step's key; `axis`: the mesh axis the per-device results vary over
  (in the shard_map step)."""
  rng = jax.random.fold_in(jax.random.wrap_key_data(state['rng']), state['step'])
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
    new_state['polyak'] = polyak_update(state['polyak'], params, step + 1, polyak_decay)
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

  def train_step(state, batch, inputs=()):
    first_id = state['step'].astype(jnp.int32) * spec.data.batch
    args = (task, state['params'], state, batch, first_id, inputs)
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
  axis = parallel.DATA_AXIS

  def per_device(state, batch, inputs):
    local = batch['image'].shape[0]
    offset = jax.lax.axis_index(axis).astype(jnp.int32) * local
    first_id = state['step'].astype(jnp.int32) * spec.data.batch + offset
    params = jax.lax.pcast(state['params'], axis, to='varying')
    args = (task, params, state, batch, first_id, inputs, axis)
    loss, grads, metrics = task.reduce(*_loss_and_grad(*args), axis)
    return _apply(tx, schedule, state, loss, grads, metrics, spec.step.polyak_decay)

  in_specs = (P(), P(axis), P())
  return jax.shard_map(per_device, mesh=mesh, in_specs=in_specs, out_specs=(P(), P()))


def counting_bad_examples(fn: StepFn, keys: tuple[str, ...]) -> StepFn:
  """`fn` on the batch's arrays of `keys` (the task's), with the metric `bad_images`: how
  many of its rows replace an unreadable example (the input pipeline's `bad` flags), if it
  has them; and of a packed batch `dropped_images`: the images read that no row holds."""

  def train_step(state, batch, *inputs):
    state, metrics = fn(state, {k: v for k, v in batch.items() if k in keys}, *inputs)
    if 'bad' in batch:
      metrics = {**metrics, 'bad_images': jnp.sum(batch['bad'])}
    if 'dropped' in batch:
      metrics = {**metrics, 'dropped_images': jnp.sum(batch['dropped'])}
    return state, metrics

  return train_step


def compile_train_step(
  fn: StepFn, shardings: Any, batch_sharding: NamedSharding, mesh: Mesh, *input_shardings: Any
) -> Callable:
  """`fn` under jax.jit with the state's shardings (and its further inputs', when it takes
  them); the old state is donated. Traced under the mesh (`parallel.traced_on`), so the
  model's activation constraints (`parallel.constrain`) apply."""
  jitted = jax.jit(
    fn,
    in_shardings=(shardings, batch_sharding, *input_shardings),
    out_shardings=(shardings, parallel.replicated(mesh)),
    donate_argnums=(0,),
  )
  return parallel.traced_on(mesh, jitted, shardings)


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

"""The compiled training steps: one step against a hand-computed optax update, and the
per-device shard_map step against the jit step on 1 and 8 devices."""

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from conftest import TINY, write_teacher

from configs import digits as digits_config
from vit_jax import families, optim, parallel, tasks
from vit_jax.tasks import distillation
from vit_jax.train import setup, spec, steps

pytestmark = pytest.mark.slow


def _spec(model_fields=None, **overrides) -> spec.RunSpec:
  config = ml_collections.ConfigDict(digits_config.get_config().to_dict())
  config.model.update(model_fields or {})
  dotted = {**TINY, 'num_classes': 10, **{k.replace('__', '.'): v for k, v in overrides.items()}}
  return spec.from_config(spec.with_overrides(config, dotted))


def _batches(n: int, batch: int = 32, seed: int = 0) -> list[dict[str, np.ndarray]]:
  rng = np.random.default_rng(seed)
  return [
    {
      'image': rng.uniform(-1, 1, (batch, 8, 8, 3)).astype(np.float32),
      'label': rng.integers(0, 10, batch).astype(np.int32),
    }
    for _ in range(n)
  ]


def _state(run: spec.RunSpec, model, tx, seed: int = 0) -> dict:
  # The shapes only (nothing compiled): random weights everywhere (the head starts at zero).
  rng = np.random.default_rng(seed)
  params = jax.tree.map(
    lambda x: jnp.asarray(0.3 * rng.standard_normal(x.shape), x.dtype),
    families.param_shapes(model, 8),
  )
  state = {
    'params': params,
    'opt_state': tx.init(params),
    'step': jnp.zeros((), jnp.int32),
    'rng': jax.random.key_data(jax.random.key(run.init.seed + 1)),
  }
  if run.step.polyak_decay:
    state['polyak'] = jax.tree.map(jnp.zeros_like, params)  # its start carries no weight
  return state


def test_one_step_equals_a_hand_computed_sgd_update_with_clipping_and_accumulation():
  """Two steps of the trainer's step (4 micro-batches) against the update written out here:
  full-batch cross-entropy gradient, clipped to global norm 0.05, momentum 0.9, and the
  warmup-cosine learning rate at steps 1 and 2."""
  run = _spec(
    optimizer='sgd', momentum=0.9, grad_norm_clip=0.05, base_lr=0.1, warmup_steps=2,
    total_steps=10, weight_decay=0.0, accum_steps=4,
  )  # fmt: skip
  model = setup.build_model(run.model, num_classes=10)
  tx, schedule = optim.for_training(run.optim, run.loop.total_steps)
  step_fn = jax.jit(steps.make_train_step(tasks.build(run, model), tx, schedule, run))
  state = _state(run, model, tx)
  params = jax.tree.map(np.asarray, state['params'])
  momentum = jax.tree.map(np.zeros_like, params)

  def loss(p, batch):
    logits = model.apply({'params': p}, batch['image'], train=True)
    log_p = jax.nn.log_softmax(logits)
    return -jnp.mean(log_p[jnp.arange(len(batch['label'])), batch['label']])

  # lr(s) = 0.1 * min(1, s / 2) * (1 + cos(pi * (s - 2) / 8)) / 2 for s >= 2, warmup before.
  for s, batch, lr in zip((1, 2), _batches(2), (0.05, 0.1), strict=True):
    value, grads = jax.jit(jax.value_and_grad(loss))(params, batch)
    grads = jax.tree.map(np.asarray, grads)
    norm = np.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in jax.tree.leaves(grads)))
    assert norm > 0.05  # the clipping does something
    clipped = jax.tree.map(lambda g, n=norm: g * (0.05 / n), grads)
    momentum = jax.tree.map(lambda m, g: g + 0.9 * m, momentum, clipped)
    params = jax.tree.map(lambda p, m, lr=lr: p - lr * m, params, momentum)

    state, metrics = step_fn(state, batch)
    assert int(state['step']) == s
    np.testing.assert_allclose(metrics['loss'], value, rtol=1e-6)
    np.testing.assert_allclose(metrics['grad_norm'], norm, rtol=1e-5)  # before clipping
    np.testing.assert_allclose(metrics['learning_rate'], lr, rtol=1e-6)
    assert bool(metrics['params_finite'])
    for a, b in zip(jax.tree.leaves(state['params']), jax.tree.leaves(params), strict=True):
      np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)


def _flat(tree) -> dict[str, np.ndarray]:
  flat = jax.tree_util.tree_flatten_with_path(jax.device_get(tree))[0]
  return {'/'.join(str(k.key) for k in path): np.asarray(x) for path, x in flat}


def _train(run: spec.RunSpec, devices, batches) -> tuple[dict, list[float]]:
  """The spec's compiled step (jit or shard_map) on a mesh of `devices`, over `batches`:
  the final parameters (and Polyak average, as `polyak/...`) flat, and the losses."""
  mesh = parallel.create_mesh(devices)
  model = setup.build_model(run.model, num_classes=10)
  tx, schedule = optim.for_training(run.optim, run.loop.total_steps)
  state = _state(run, model, tx)
  shardings = parallel.tree_shardings(state, mesh, run.step.sharding)
  step_fn = steps.train_step_for(run, tasks.build(run, model), tx, schedule, mesh, shardings)
  state = jax.device_put(state, shardings)
  losses = []
  for batch in batches:
    state, metrics = step_fn(state, parallel.global_batch(batch, parallel.batch_sharding(mesh)))
    losses.append(float(metrics['loss']))
  averaged = {f'polyak/{k}': v for k, v in _flat(state.get('polyak', {})).items()}
  return _flat(state['params']) | averaged, losses


# Stochastic depth (two blocks: the first never drops), mixup or CutMix per batch, label
# smoothing on the mixed targets.
REGULARISED = dict(
  model__transformer__num_layers=2, model__transformer__drop_path_rate=0.3, mixup=0.2,
  cutmix=1.0, label_smoothing=0.1,
)  # fmt: skip


@pytest.mark.parametrize('regularised', [False, True])
@pytest.mark.parametrize('devices', [1, 8])
def test_shard_map_step_equals_the_jit_step(devices, regularised):
  """Per-device loss and gradient, explicit pmean: the jit step's parameters after 4 steps
  of SGD with momentum and clipping, with dropout (per-example keys), 2 micro-batches per
  device and the Polyak average; and with stochastic depth, mixup/CutMix (the predecessor of
  a device's first row is on the previous device) and label smoothing. (SGD: Adam would scale
  the rounding noise of the attention key bias, whose gradient is zero, up to a full step;
  see conftest.ZERO_GRADIENT.)"""
  overrides = dict(
    model__transformer__dropout_rate=0.1, accum_steps=2, total_steps=10, warmup_steps=1,
    optimizer='sgd', base_lr=0.1, weight_decay=0.0, polyak_decay=0.5,
    **(REGULARISED if regularised else {}),
  )  # fmt: skip
  batches = _batches(4)
  mesh_devices = jax.devices()[:devices]
  jit_params, jit_losses = _train(_spec(**overrides), mesh_devices, batches)
  sm_params, sm_losses = _train(_spec(step='shard_map', **overrides), mesh_devices, batches)
  np.testing.assert_allclose(sm_losses, jit_losses, atol=1e-6, rtol=0)
  assert len(set(np.round(jit_losses, 4))) == 4  # the steps trained
  assert sm_params.keys() == jit_params.keys()
  assert sum(k.startswith('polyak/') for k in jit_params) == len(jit_params) // 2
  for k in jit_params:
    np.testing.assert_allclose(sm_params[k], jit_params[k], atol=1e-6, rtol=0, err_msg=k)


def test_shard_map_step_equals_the_jit_step_with_a_teacher(tmp_path):
  """DeiT distillation (a distilled student, soft targets of a teacher at another resolution)
  on 8 devices: shard_map == jit to 1e-6; jit with the student and the teacher FSDP-sharded
  == jit replicated to 1e-5."""
  overrides = dict(
    model__transformer__dropout_rate=0.1, accum_steps=2, total_steps=10, warmup_steps=1,
    optimizer='sgd', base_lr=0.1, weight_decay=0.0, distill__kind='soft',
    distill__temperature=2.0, distill__teacher_checkpoint=write_teacher(tmp_path / 't.npz'),
  )  # fmt: skip
  deit = {'classifier': 'token', 'distilled': True}
  batches = _batches(4)
  jit_params, jit_losses = _train(_spec(deit, **overrides), jax.devices(), batches)
  sm_params, sm_losses = _train(_spec(deit, step='shard_map', **overrides), jax.devices(), batches)
  np.testing.assert_allclose(sm_losses, jit_losses, atol=1e-6, rtol=0)
  assert len(set(np.round(jit_losses, 4))) == 4 and 'head_dist/kernel' in jit_params
  for k in jit_params:
    np.testing.assert_allclose(sm_params[k], jit_params[k], atol=1e-6, rtol=0, err_msg=k)

  old = parallel.FSDP_MIN_SIZE
  parallel.FSDP_MIN_SIZE = 0  # shard even the tiny models' leaves
  try:
    run = _spec(deit, sharding='fsdp', **overrides)
    _, host = distillation.load(run.step.distill, 10, 8, 'float32')
    placed = distillation.place(host, parallel.create_mesh(), run.step.sharding)
    assert any('data' in x.sharding.spec for x in jax.tree.leaves(placed))
    fsdp_params, fsdp_losses = _train(run, jax.devices(), batches)
  finally:
    parallel.FSDP_MIN_SIZE = old
  np.testing.assert_allclose(fsdp_losses, jit_losses, atol=1e-5, rtol=0)
  for k in jit_params:
    np.testing.assert_allclose(fsdp_params[k], jit_params[k], atol=1e-5, rtol=0, err_msg=k)


@functools.cache  # each decay's run once for this module
def _record_polyak(decay: float, n: int = 5) -> tuple[list[dict], dict, list[float]]:
  """The raw parameters after each of `n` jit steps, the final state's average, the losses."""
  run = _spec(optimizer='sgd', base_lr=0.3, total_steps=10, warmup_steps=1, polyak_decay=decay)
  model = setup.build_model(run.model, num_classes=10)
  tx, schedule = optim.for_training(run.optim, run.loop.total_steps)
  step_fn = jax.jit(steps.make_train_step(tasks.build(run, model), tx, schedule, run))
  state, raw, losses = _state(run, model, tx), [], []
  for batch in _batches(n):
    state, metrics = step_fn(state, batch)
    raw.append(_flat(state['params']))
    losses.append(float(metrics['loss']))
  return raw, _flat(state.get('polyak', {})), losses


def test_polyak_average_equals_its_closed_form():
  """After k steps: sum_s (1 - d) d^(k-s) p_s / (1 - d^k), from each step's raw parameters
  (float64 here); the starting parameters carry no weight."""
  decay, k = 0.9, 5
  raw, averaged, _ = _record_polyak(decay, k)
  weights = np.array([(1 - decay) * decay ** (k - s) for s in range(1, k + 1)]) / (1 - decay**k)
  assert averaged.keys() == raw[0].keys()
  apart = 0.0  # how far the average is from the last step's parameters
  for key in averaged:
    expected = sum(w * p[key].astype(np.float64) for w, p in zip(weights, raw, strict=True))
    np.testing.assert_allclose(averaged[key], expected, atol=2e-6, rtol=0, err_msg=key)
    apart = max(apart, np.abs(expected - raw[-1][key]).max())
  assert apart > 0.01


def test_polyak_decay_zero_keeps_the_state_and_the_training_as_before():
  """decay 0: no average in the state; with an average, the raw parameters train identically."""
  plain_raw, plain_average, plain_losses = _record_polyak(0.0)
  raw, _, losses = _record_polyak(0.9)
  assert plain_average == {}
  assert losses == plain_losses
  for before, after in zip(plain_raw, raw, strict=True):
    for key in before:
      np.testing.assert_array_equal(before[key], after[key], err_msg=key)


def test_shard_map_step_equals_the_jit_step_with_bfloat16_activations():
  """The 'activations' precision policy with the fused attention call: the same per-example
  bfloat16 program on every device, float32 gradients summed across them, so shard_map on 8
  devices gives the jit step's losses and parameters to float32 rounding of the sums (measured
  1.8e-6 after two steps; a third step's loss moves 3e-5 once bfloat16 rounds the difference)."""
  overrides = dict(
    dtype='bfloat16', precision='activations', total_steps=10, warmup_steps=1, optimizer='sgd',
    base_lr=0.1, weight_decay=0.0,
  )  # fmt: skip
  fused = {'attention_impl': 'fused'}
  batches = _batches(2)
  jit_params, jit_losses = _train(_spec(fused, **overrides), jax.devices(), batches)
  sm_params, sm_losses = _train(_spec(fused, step='shard_map', **overrides), jax.devices(), batches)
  assert len(set(np.round(jit_losses, 3))) == 2  # the steps trained
  np.testing.assert_allclose(sm_losses, jit_losses, atol=1e-5, rtol=0)
  for k in jit_params:
    np.testing.assert_allclose(sm_params[k], jit_params[k], atol=1e-5, rtol=0, err_msg=k)

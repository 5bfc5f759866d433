"""Learning-rate schedules, the SGD and Adam chains, weight-decay masks, gradient accumulation."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from vit_jax import optim
from vit_jax.train import spec


def _config(**kw):
  """The run spec's optimizer section, no clipping unless asked."""
  return spec.Optim(**{'grad_norm_clip': 0.0, **kw})


def test_cosine_schedule_matches_the_original_formula():
  lr = optim.create_learning_rate_schedule(1000, 0.03, 'cosine', warmup_steps=100)
  assert float(lr(0)) == 0.0
  np.testing.assert_allclose(float(lr(50)), 0.015, rtol=1e-6)  # half-way through warmup
  np.testing.assert_allclose(float(lr(100)), 0.03, rtol=1e-6)
  np.testing.assert_allclose(float(lr(550)), 0.015, rtol=1e-5)  # cos(pi/2): half the peak
  np.testing.assert_allclose(float(lr(1000)), 0.0, atol=1e-9)
  np.testing.assert_allclose(float(lr(2000)), 0.0, atol=1e-9)  # clipped past the end


def test_linear_schedule_ends_at_linear_end():
  lr = optim.create_learning_rate_schedule(110, 1e-3, 'linear', warmup_steps=10, linear_end=1e-5)
  np.testing.assert_allclose(float(lr(10)), 1e-3, rtol=1e-6)
  np.testing.assert_allclose(float(lr(60)), 1e-5 + (1e-3 - 1e-5) * 0.5, rtol=1e-5)
  np.testing.assert_allclose(float(lr(110)), 1e-5, rtol=1e-5)


def test_unknown_decay_type_is_rejected():
  with pytest.raises(ValueError, match="decay_type='step'"):
    optim.create_learning_rate_schedule(10, 0.1, 'step')


def test_sgd_momentum_with_clipping_by_hand():
  # Two steps of clip(1) + momentum 0.9 at lr 0.1 on p = [3, 4] with gradient = p.
  tx = optim.make_optimizer(_config(grad_norm_clip=1.0, momentum=0.9), lambda _: 0.1)
  params = {'w': jnp.array([3.0, 4.0])}
  state = tx.init(params)
  updates, state = tx.update(params, state, params)
  np.testing.assert_allclose(updates['w'], [-0.06, -0.08], rtol=1e-6)  # grad clipped to norm 1
  params = optax.apply_updates(params, updates)  # [2.94, 3.92], norm 4.9
  updates, state = tx.update(params, state, params)
  clipped = np.array([2.94, 3.92]) / 4.9
  np.testing.assert_allclose(updates['w'], -0.1 * (clipped + 0.9 * np.array([0.6, 0.8])), rtol=1e-6)


def test_optim_dtype_sets_the_first_moment_only():
  params = {'w': jnp.ones((3,))}
  sgd = optim.make_optimizer(_config(optim_dtype='bfloat16'), lambda _: 0.1).init(params)
  assert jax.tree.leaves(sgd)[0].dtype == jnp.bfloat16
  adam = optim.make_optimizer(_config(optimizer='adam', optim_dtype='bfloat16'), lambda _: 0.1)
  adam_state = adam.init(params)[0]
  assert adam_state.mu['w'].dtype == jnp.bfloat16
  assert adam_state.nu['w'].dtype == jnp.float32


def test_adam_weight_decay_is_decoupled_and_on_kernels_only():
  # A zero gradient leaves Adam's direction at 0: what moves is the decay, lr * wd * kernel.
  params = {'Dense_0': {'kernel': jnp.full((2, 2), 2.0), 'bias': jnp.full((2,), 2.0)}}
  tx = optim.make_optimizer(_config(optimizer='adam', weight_decay=0.1), lambda _: 0.01)
  state = tx.init(params)
  zeros = jax.tree.map(jnp.zeros_like, params)
  updates, _ = tx.update(zeros, state, params)
  np.testing.assert_allclose(updates['Dense_0']['kernel'], -0.01 * 0.1 * 2.0, rtol=1e-6)
  np.testing.assert_array_equal(updates['Dense_0']['bias'], 0.0)


def test_path_mask_matches_full_paths():
  tree = {'head': {'kernel': 1, 'bias': 2}, 'cls': 3}
  assert optim.path_mask(tree, r'.*/kernel') == {
    'head': {'kernel': True, 'bias': False},
    'cls': False,
  }


@pytest.mark.parametrize('accum_steps', [2, 4])
def test_accumulated_gradient_equals_the_full_batch_gradient(accum_steps):
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((8, 3)), jnp.float32)
  y = jnp.asarray(rng.standard_normal((8,)), jnp.float32)
  params = {'w': jnp.asarray(rng.standard_normal((3,)), jnp.float32)}

  def loss(p, x, y):
    return jnp.mean((jnp.tanh(x @ p['w']) - y) ** 2)

  grad_fn = jax.value_and_grad(loss)
  full_loss, full_grad = grad_fn(params, x, y)
  acc_loss, acc_grad = optim.accumulate_gradient(grad_fn, params, (x, y), accum_steps)
  np.testing.assert_allclose(acc_loss, full_loss, rtol=1e-6)
  np.testing.assert_allclose(acc_grad['w'], full_grad['w'], rtol=1e-5)


def test_accumulation_needs_equal_micro_batches():
  grad_fn = jax.value_and_grad(lambda p, x: jnp.sum(p * x))
  with pytest.raises(ValueError, match='batch of 6 does not split into accum_steps=4'):
    optim.accumulate_gradient(grad_fn, jnp.ones(()), (jnp.ones((6,)),), 4)


def test_unknown_optimizer_is_rejected():
  with pytest.raises(ValueError, match="optimizer='lamb'"):
    optim.make_optimizer(_config(optimizer='lamb'), lambda _: 0.1)


def test_schedule_is_jittable_and_monotone_in_warmup():
  lr = jax.jit(optim.create_learning_rate_schedule(100, 1.0, 'cosine', warmup_steps=10))
  values = [float(lr(s)) for s in range(11)]
  assert values == sorted(values)
  assert math.isclose(values[-1], 1.0, rel_tol=1e-6)

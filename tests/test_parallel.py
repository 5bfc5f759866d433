"""The mesh, sharding rules, batch checks, global batches from host-local rows, and where the
compiled step leaves the state."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from vit_jax import parallel


def test_mesh_is_one_data_axis_over_the_given_devices_in_order():
  devices = jax.devices()[::-1][:4]
  mesh = parallel.create_mesh(devices)
  assert mesh.axis_names == (parallel.DATA_AXIS,)
  assert list(mesh.devices) == devices  # the caller's order: batch blocks follow it


def test_replicate_and_fsdp_rules():
  mesh = parallel.create_mesh()
  tree = {
    'embedding': {'kernel': jnp.zeros((4, 4, 3, 1024)), 'bias': jnp.zeros((1024,))},
    'head': {'kernel': jnp.zeros((1024, 100)), 'bias': jnp.zeros((100,))},
    'odd': jnp.zeros((129, 131)),
  }
  specs = jax.tree.map(lambda s: s.spec, parallel.tree_shardings(tree, mesh, 'fsdp'))
  assert specs['embedding']['kernel'] == P(None, None, None, 'data')  # largest dividing dim
  assert specs['embedding']['bias'] == P()  # too small to be worth sharding
  assert specs['head']['kernel'] == P('data', None)  # 1024 divides, 100 does not
  assert specs['odd'] == P()  # no dimension divides over 8 devices
  rules = [('head/.*', 'replicate'), ('.*', 'fsdp')]
  specs = jax.tree.map(lambda s: s.spec, parallel.tree_shardings(tree, mesh, rules))
  assert specs['head']['kernel'] == P()
  assert specs['embedding']['kernel'] == P(None, None, None, 'data')
  replicated = parallel.tree_shardings(tree, mesh, 'replicate')
  assert all(s.spec == P() for s in jax.tree.leaves(replicated))


def test_bad_rule_is_rejected():
  with pytest.raises(ValueError, match="rule in \\('replicate', 'fsdp'\\)"):
    parallel.parse_rules([('.*', 'tensor')])


@pytest.mark.parametrize(
  ('batch', 'accum', 'message'),
  [
    (100, 1, 'config.batch=100 does not divide over 8 devices: use a multiple of 8'),
    (
      64,
      16,
      'config.batch=64 does not divide over 8 devices x accum_steps=16: use a multiple of 128',
    ),
  ],
)
def test_batch_that_does_not_divide(batch, accum, message):
  with pytest.raises(ValueError, match=message):
    parallel.check_batch(batch, parallel.create_mesh(), accum)


def test_batch_that_divides_passes():
  parallel.check_batch(512, parallel.create_mesh(), 8)
  parallel.check_batch(3, parallel.create_mesh(jax.devices()[:1]), 3)


def test_global_batch_puts_consecutive_row_blocks_on_the_devices_in_mesh_order():
  """What gradient accumulation relies on: device d holds rows [d*B/8, (d+1)*B/8)."""
  mesh = parallel.create_mesh()
  local = {'image': np.arange(16 * 2, dtype=np.float32).reshape(16, 2), 'label': np.arange(16)}
  batch = parallel.global_batch(local, parallel.batch_sharding(mesh))
  assert batch['image'].shape == (16, 2)
  for d, device in enumerate(mesh.devices):
    (shard,) = [s for s in batch['label'].addressable_shards if s.device == device]
    np.testing.assert_array_equal(shard.data, [2 * d, 2 * d + 1])
  np.testing.assert_array_equal(np.asarray(batch['label']), np.arange(16))


def test_the_compiled_step_keeps_the_state_where_the_rules_put_it():
  """After an FSDP step, parameters and optimizer state are still split as the rules say
  (the step's output shardings are the state's): nothing is gathered onto every device."""
  from vit_jax import optim
  from vit_jax.train import spec, steps

  mesh = parallel.create_mesh()
  params = {'w': jnp.ones((64, 256)), 'b': jnp.zeros((256,))}
  rules = [('b', 'replicate'), ('.*', 'fsdp')]
  old, parallel.FSDP_MIN_SIZE = parallel.FSDP_MIN_SIZE, 0
  try:
    tx, _ = optim.for_training(spec.Optim(optimizer='adam'), 10)
    state = {'params': params, 'opt_state': tx.init(params)}
    shardings = parallel.tree_shardings(state, mesh, rules)
  finally:
    parallel.FSDP_MIN_SIZE = old

  def step(state, batch):
    grads = jax.grad(lambda p: jnp.mean((batch['x'] @ p['w'] + p['b']) ** 2))(state['params'])
    updates, opt_state = tx.update(grads, state['opt_state'], state['params'])
    return {'params': optax.apply_updates(state['params'], updates), 'opt_state': opt_state}, {}

  compiled = steps.compile_train_step(step, shardings, parallel.batch_sharding(mesh), mesh)
  x = parallel.global_batch({'x': np.ones((16, 64), np.float32)}, parallel.batch_sharding(mesh))
  out, _ = compiled(jax.device_put(state, shardings), x)
  specs = jax.tree.map(lambda a: a.sharding.spec, out)
  assert specs['params'] == {'w': P(None, 'data'), 'b': P()}
  mu = specs['opt_state'][1].mu  # Adam's moments (after clipping) follow their parameter
  assert mu == {'w': P(None, 'data'), 'b': P()}
  assert out['params']['w'].addressable_shards[0].data.shape == (64, 32)

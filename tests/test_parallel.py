"""The mesh, sharding rules, batch checks and global batches from host-local rows."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from vit_jax import parallel


def test_mesh_spans_all_devices():
  mesh = parallel.create_mesh()
  assert mesh.axis_names == ('data',)
  assert mesh.size == len(jax.devices()) == 8


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


def test_global_batch_from_host_rows():
  mesh = parallel.create_mesh()
  local = {'image': np.arange(16 * 2, dtype=np.float32).reshape(16, 2), 'label': np.arange(16)}
  batch = parallel.global_batch(local, parallel.batch_sharding(mesh))
  assert batch['image'].shape == (16, 2)
  assert batch['image'].sharding.spec == P('data')
  assert len(batch['image'].addressable_shards) == 8
  assert batch['image'].addressable_shards[3].data.shape == (2, 2)
  np.testing.assert_array_equal(np.asarray(batch['label']), np.arange(16))


def test_jit_gradient_of_replicated_params_is_the_global_gradient():
  # The shard_map trap does not apply to jit + NamedSharding: same gradient on 1 and 8 devices.
  x = np.linspace(-1, 1, 32 * 3, dtype=np.float32).reshape(32, 3)
  w = jnp.array([0.5, -1.0, 2.0])

  def grad(devices):
    mesh = parallel.create_mesh(devices)
    xs = parallel.global_batch({'x': x}, parallel.batch_sharding(mesh))['x']
    ws = jax.device_put(w, parallel.replicated(mesh))
    return jax.jit(jax.grad(lambda w, x: jnp.mean(jnp.sin(x @ w))))(ws, xs)

  np.testing.assert_allclose(grad(jax.devices()[:1]), grad(jax.devices()), rtol=1e-6, atol=1e-7)

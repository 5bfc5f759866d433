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
  with pytest.raises(ValueError, match="rule in \\('replicate', 'fsdp', 'tp', 'tp\\+fsdp'\\)"):
    parallel.parse_rules([('.*', 'tensor')])
  with pytest.raises(ValueError, match='a tuple of mesh axes'):
    parallel.parse_rules([('.*', (None, 'heads'))])


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


@pytest.mark.parametrize(
  ('spec', 'shape'),
  [
    ('data:-1', {'data': 8}),
    ('data:-1,model:2', {'data': 4, 'model': 2}),
    ('model:4,data:2', {'data': 2, 'model': 4}),  # laid out batch axes first
    ([('fsdp', -1), ('model', 2)], {'fsdp': 4, 'model': 2}),
    ('data:2,fsdp:2,model:2', {'data': 2, 'fsdp': 2, 'model': 2}),
  ],
)
def test_mesh_axes_and_sizes_from_the_config(spec, shape):
  mesh = parallel.create_mesh(spec=spec)
  assert dict(mesh.shape) == shape and mesh.axis_names == tuple(shape)
  assert sorted(d.id for d in mesh.devices.flat) == sorted(d.id for d in jax.devices())


@pytest.mark.parametrize(
  ('spec', 'message'),
  [
    ('data:-1,tensor:2', "axes are \\('data', 'fsdp', 'model'\\), each at most once"),
    ('data:-1,model:-1', 'one of them may be -1'),
    ('data:3', 'has 3 devices, not the 8 of this run: make one size -1'),
    ('data:-1,model:3', '8 devices do not split into axes of 3'),
    ('data=4', 'expected axis:size pairs'),
  ],
)
def test_bad_mesh_is_one_line(spec, message):
  with pytest.raises(ValueError, match=message):
    parallel.create_mesh(spec=spec)


class _FakeDevice:
  """What mesh_utils reads of a device of a multi-host CPU run."""

  platform = device_kind = 'cpu'

  def __init__(self, id, process_index):
    self.id, self.process_index = id, process_index

  def __repr__(self):
    return f'd{self.id}@p{self.process_index}'


def test_multi_host_layout_keeps_model_within_a_host_and_data_across():
  """4 hosts x 4 devices on 'data:-1,model:4' and 'data:4,fsdp:2,model:2': each model group is
  one host's devices, and the hosts follow each other on the outermost batch axis."""
  devices = [_FakeDevice(8 * p + i, p) for p in range(4) for i in range(4)]
  grid = parallel.device_grid(devices, {'data': 4, 'model': 4})
  assert grid.shape == (4, 4)
  assert [{d.process_index for d in row} for row in grid] == [{0}, {1}, {2}, {3}]
  grid = parallel.device_grid(devices, {'data': 4, 'fsdp': 2, 'model': 2})
  assert [{d.process_index for d in grid[i].flat} for i in range(4)] == [{0}, {1}, {2}, {3}]
  with pytest.raises(ValueError, match="the 'model' axis stays within a process"):
    parallel.device_grid(devices, {'data': 2, 'model': 8})


def _tiny_vit_params(**fields):
  from vit_jax.models import configs, model_from_config

  small = {
    'hidden_size': 32,
    'patches': {'size': (8, 8)},
    'transformer': {'num_layers': 2, 'num_heads': 4, 'mlp_dim': 64},
  }
  model = model_from_config(configs.MODEL_CONFIGS['ViT-B_16'], num_classes=10, **small, **fields)
  return jax.eval_shape(
    lambda: model.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)), train=False)['params']
  )


def test_tensor_parallel_rules_split_blocks_megatron_style():
  """'tp': q/k/v and the MLP's first layer by their outputs, the attention's output and the
  MLP's second layer by their inputs, over 'model'; the rest replicated. 'tp+fsdp' adds
  FSDP on 'fsdp' to the largest dimension left whole. Scanned blocks keep their layer axis."""
  mesh = parallel.create_mesh(spec='fsdp:4,model:2')
  old, parallel.FSDP_MIN_SIZE = parallel.FSDP_MIN_SIZE, 0
  try:
    for scan in (False, True):
      params = _tiny_vit_params(scan_layers=scan) if scan else _tiny_vit_params()
      block = 'encoderblock' if scan else 'encoderblock_0'
      lead = (None,) if scan else ()
      tp = parallel.tree_shardings(params, mesh, 'tp')['Transformer'][block]
      both = parallel.tree_shardings(params, mesh, 'tp+fsdp')['Transformer'][block]
      attention, mlp = 'MultiHeadDotProductAttention_0', 'MlpBlock_0'
      assert tp[attention]['query']['kernel'].spec == P(*lead, None, 'model', None)
      assert tp[attention]['value']['bias'].spec == P(*lead, 'model', None)
      assert tp[attention]['out']['kernel'].spec == P(*lead, 'model', None, None)
      assert tp[attention]['out']['bias'].spec == P()
      assert tp[mlp]['Dense_0']['kernel'].spec == P(*lead, None, 'model')
      assert tp[mlp]['Dense_0']['bias'].spec == P(*lead, 'model')
      assert tp[mlp]['Dense_1']['kernel'].spec == P(*lead, 'model', None)
      assert tp['LayerNorm_0']['scale'].spec == P()
      want = P(*((None,) if scan else ()), 'fsdp', 'model', None)  # D=32 over fsdp
      assert both[attention]['key']['kernel'].spec == want
      assert both[mlp]['Dense_1']['kernel'].spec == P(*lead, 'model', 'fsdp')
  finally:
    parallel.FSDP_MIN_SIZE = old


def test_fsdp_uses_the_fsdp_axis_and_the_batch_splits_over_data_and_fsdp():
  mesh = parallel.create_mesh(spec='data:2,fsdp:2,model:2')
  spec = parallel.tree_shardings({'w': jnp.zeros((256, 128))}, mesh, 'fsdp')['w'].spec
  assert spec == P('fsdp', None)
  assert parallel.batch_sharding(mesh).spec == P(('data', 'fsdp'))
  assert parallel.batch_sharding(parallel.create_mesh()).spec == P('data')
  parallel.check_batch(4, mesh)  # 4 rows over 2 x 2 batch shards; model holds them whole
  with pytest.raises(ValueError, match=r'over 4 batch shards \(data x fsdp\): use a multiple of 4'):
    parallel.check_batch(6, mesh)


def test_activation_constraints_follow_the_traced_mesh():
  """'batch' over the batch axes, 'model' over model, where the mesh has them and they divide;
  nothing outside a mesh or inside shard_map (manual axes)."""
  x = jnp.zeros((8, 6, 16))

  def f(x):
    return parallel.constrain(x * 2, 'batch', None, 'model')

  assert parallel.constrain(x, 'batch', None, 'model') is x  # no mesh: untouched
  with jax.set_mesh(parallel.create_mesh(spec='data:-1,model:2')):
    assert jax.jit(f)(x).sharding.spec == P('data', None, 'model')
  with jax.set_mesh(parallel.create_mesh(spec='data:2,fsdp:2,model:2')):
    assert jax.jit(f)(x).sharding.spec == P(('data', 'fsdp'), None, 'model')
  mesh = parallel.create_mesh()
  with jax.set_mesh(mesh):
    assert jax.jit(f)(x).sharding.spec == P('data')  # no model axis: the features whole
    per_device = jax.shard_map(f, mesh=mesh, in_specs=P('data'), out_specs=P('data'))
    np.testing.assert_array_equal(jax.jit(per_device)(x + 1), 2 * (x + 1))

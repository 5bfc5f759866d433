"""The model's fast paths keep the numbers: rematerialisation, fused attention, bfloat16 with
float32 sums, and the encoder as one `nn.scan`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import dot_types

from vit_jax import families
from vit_jax.models import attention, blocks, get_model, precision


def _tiny_model(**overrides):
  return get_model(
    'ViT-Ti_16',
    num_classes=10,
    patches={'size': (8, 8)},
    transformer={'num_layers': 2},
    **overrides,
  )


def _grads(model, params, images, labels):
  def loss(p):
    logits = model.apply({'params': p}, images, train=False)
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(len(labels)), labels])

  return jax.jit(jax.grad(loss))(params)


@pytest.fixture(scope='module')
def tiny_batch():
  images = jax.random.uniform(jax.random.key(1), (2, 32, 32, 3), minval=-1, maxval=1)
  labels = jnp.array([3, 7])
  params = families.param_shapes(_tiny_model(), 32)
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda x: jnp.asarray(0.05 * rng.standard_normal(x.shape), x.dtype), params)
  return params, images, labels


@pytest.mark.slow
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize('policy', ['full', 'dots', 'dots_saveable'])
def test_remat_leaves_gradients_equal(policy, dtype, tiny_batch):
  params, images, labels = tiny_batch
  ref = _grads(_tiny_model(dtype=dtype), params, images, labels)
  out = _grads(_tiny_model(dtype=dtype, remat_policy=policy), params, images, labels)
  scale = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(ref))
  assert scale > 1e-3
  for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref), strict=True):
    np.testing.assert_allclose(a, b, atol=1e-6 * scale, rtol=1e-5)


def test_fused_attention_leaves_gradients_equal(tiny_batch):
  params, images, labels = tiny_batch
  ref = _grads(_tiny_model(), params, images, labels)
  out = _grads(_tiny_model(attention_impl='fused'), params, images, labels)
  for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref), strict=True):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize('attention', ['xla', 'fused'])
def test_bfloat16_gradients_are_float32_and_close(attention, tiny_batch):
  params, images, labels = tiny_batch
  ref = _grads(_tiny_model(), params, images, labels)
  out = _grads(_tiny_model(dtype=jnp.bfloat16, attention_impl=attention), params, images, labels)
  for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref), strict=True):
    assert a.dtype == jnp.float32
    scale = float(jnp.abs(b).max())
    assert float(jnp.abs(a - b).max()) <= 0.05 * scale + 1e-6


def test_bfloat16_matmuls_take_bfloat16_and_sum_in_float32(tiny_batch):
  params, images, _ = tiny_batch

  def hlo(dtype):
    model = _tiny_model(dtype=dtype)
    loss = lambda p: model.apply({'params': p}, images, train=False).sum()
    return jax.jit(jax.value_and_grad(loss)).lower(params).as_text()

  dots = dot_types(hlo(jnp.bfloat16))
  # Per block q, k, v, scores, values, out and 2 MLP matmuls, then the head; the backward
  # pass has two matmuls for each (the patch embedding is a float32 convolution).
  assert len(dots) == 3 * (2 * 8 + 1)
  assert set(dots) == {('bf16', 'bf16', 'f32')}
  assert set(dot_types(hlo(jnp.float32))) == {('f32', 'f32', 'f32')}


@pytest.mark.slow
def test_mixed_einsum_gradients_are_not_rounded():
  kx, ky = jax.random.split(jax.random.key(0))
  x = jax.random.normal(kx, (4, 5, 32))
  y = jax.random.normal(ky, (32, 3, 6))
  spec = 'btd,dhk->bthk'
  mixed = lambda x, y: (precision.mixed_einsum(spec, x, y, jnp.bfloat16) ** 2).sum()
  exact = lambda x, y: (jnp.einsum(spec, x, y) ** 2).sum()
  (dx, dy), (ex, ey) = jax.grad(mixed, (0, 1))(x, y), jax.grad(exact, (0, 1))(x, y)
  for got, want in ((dx, ex), (dy, ey)):
    assert got.dtype == jnp.float32
    assert float(jnp.abs(got - want).max()) < 0.02 * float(jnp.abs(want).max())
    # float32 sums come back unrounded: most entries are not bfloat16 numbers.
    assert float(jnp.mean(got != got.astype(jnp.bfloat16).astype(jnp.float32))) > 0.9


@pytest.mark.slow
@pytest.mark.parametrize(
  'lhs_shape, rhs_shape, dims',
  [
    ((2, 5, 8), (8, 3, 4), (((2,), (0,)), ((), ()))),  # DenseGeneral to heads
    ((2, 5, 3, 4), (3, 4, 8), (((2, 3), (0, 1)), ((), ()))),  # out projection
    ((2, 3, 5, 4), (2, 3, 6, 4), (((3,), (3,)), ((0, 1), (0, 1)))),  # batched scores
    ((5, 8), (8, 7), (((1,), (0,)), ((), ()))),  # Dense
  ],
)
def test_dot_general_to_einsum(lhs_shape, rhs_shape, dims):
  kx, ky = jax.random.split(jax.random.key(0))
  lhs, rhs = jax.random.normal(kx, lhs_shape), jax.random.normal(ky, rhs_shape)
  spec = precision.dot_general_as_einsum(lhs.ndim, rhs.ndim, dims)
  np.testing.assert_allclose(
    jnp.einsum(spec, lhs, rhs), jax.lax.dot_general(lhs, rhs, dims), rtol=1e-5, atol=1e-5
  )


@pytest.mark.slow
@pytest.mark.parametrize('remat', ['none', 'full'])
def test_scanned_layers_equal_the_unrolled_model(remat, tiny_batch):
  params, images, labels = tiny_batch
  stacked = blocks.stack_encoder_blocks(params)
  assert stacked['Transformer']['encoderblock']['MlpBlock_0']['Dense_0']['kernel'].shape == (
    2,
    192,
    768,
  )
  scanned = _tiny_model(scan_layers=True, remat_policy=remat)
  init = families.param_shapes(scanned, 32)
  assert jax.tree.map(jnp.shape, init) == jax.tree.map(jnp.shape, stacked)
  np.testing.assert_allclose(
    scanned.apply({'params': stacked}, images, train=False),
    _tiny_model().apply({'params': params}, images, train=False),
    atol=1e-5,
  )
  grads = blocks.unstack_encoder_blocks(_grads(scanned, stacked, images, labels))
  ref = _grads(_tiny_model(), params, images, labels)
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref), strict=True):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-4)


def test_stacking_round_trips_and_checks_the_layout(tiny_batch):
  params, *_ = tiny_batch
  back = blocks.unstack_encoder_blocks(blocks.stack_encoder_blocks(params))
  assert jax.tree.structure(back) == jax.tree.structure(params)
  for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params), strict=True):
    np.testing.assert_array_equal(a, b)
  with pytest.raises(ValueError, match='already stacked'):
    blocks.stack_encoder_blocks(blocks.stack_encoder_blocks(params))
  with pytest.raises(ValueError, match='not stacked'):
    blocks.unstack_encoder_blocks(params)
  gap = dict(params['Transformer'])
  del gap['encoderblock_0']
  with pytest.raises(ValueError, match=r'expected Transformer/encoderblock_0..N-1'):
    blocks.stack_encoder_blocks({**params, 'Transformer': gap})


@pytest.mark.slow
def test_scanned_dropout_depends_on_the_key(random_params):
  model = get_model('testing', num_classes=5, scan_layers=True, transformer={'num_layers': 3})
  images = jax.random.uniform(jax.random.key(1), (2, 32, 32, 3), minval=-1, maxval=1)
  params = random_params(families.param_shapes(model, 32))
  train = lambda seed: model.apply(
    {'params': params}, images, train=True, rngs={'dropout': jax.random.key(seed)}
  )
  assert float(jnp.abs(train(0) - train(1)).max()) > 1e-3
  np.testing.assert_array_equal(train(0), train(0))


@pytest.mark.slow
def test_fused_attention_asks_cudnn_on_gpus_and_falls_back(monkeypatch):
  """The choice logic, with the GPU and cuDNN's refusal stood in (no GPU here): jax would pick
  XLA unless asked for cuDNN by name, and cuDNN refuses unsupported shapes while tracing.
  Self-attention at a token count off cuDNN's 64-token blocks asks for it padded (to 64, with
  the sequence lengths)."""
  q, k, v = (
    jax.random.normal(key, (2, 5, 3, 8), jnp.bfloat16)
    for key in jax.random.split(jax.random.key(0), 3)
  )
  asked = []
  original = jax.nn.dot_product_attention

  def refusing(q, k, v, implementation=None, **lengths):
    asked.append((implementation, q.shape[1], sorted(lengths)))
    if implementation == 'cudnn':
      raise NotImplementedError('Unsupported sequence length Q 5, KV 5.')
    return original(q, k, v, implementation=implementation, **lengths)

  padded = ('cudnn', 64, ['key_value_seq_lengths', 'query_seq_lengths'])
  monkeypatch.setattr(jax.nn, 'dot_product_attention', refusing)
  monkeypatch.setattr(jax, 'default_backend', lambda: 'gpu')
  out = attention.fused_attention(q, k, v)
  assert asked == [padded, (None, 5, [])]
  np.testing.assert_array_equal(out, original(q, k, v))
  asked.clear()
  attention.fused_attention(q[:, :1], k, v)  # cross-attention (the MAP head's probe): unpadded
  assert asked == [('cudnn', 1, []), (None, 1, [])]
  asked.clear()
  attention.fused_attention(*(t.astype(jnp.float32) for t in (q, k, v)))  # cuDNN's takes 16-bit
  assert asked == [(None, 5, [])]
  monkeypatch.setattr(jax, 'default_backend', lambda: 'cpu')
  attention.fused_attention(q, k, v)
  assert asked == [(None, 5, [])] * 2

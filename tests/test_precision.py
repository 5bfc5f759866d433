"""The precision policies (models/precision.py): what is 16-bit under each, gradients against
float32, and the padded attention that lets cuDNN's fused kernels train at 197 tokens."""

import inspect
import re

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax.models import attention, get_model, precision

IMAGES = jax.random.uniform(jax.random.key(1), (4, 32, 32, 3), minval=-1, maxval=1)
LABELS = jax.nn.one_hot(jnp.arange(4) % 10, 10)
# A small ViT with 8-px patches (17 tokens) and a Mixer of the same shape, 2 blocks each.
MODELS = {
  'ViT': (
    'ViT-Ti_16',
    {
      'patches': {'size': (8, 8)},
      'hidden_size': 64,
      'transformer': {'num_layers': 2, 'mlp_dim': 128, 'num_heads': 2},
    },
  ),
  'Mixer': (
    'Mixer-B_16',
    {
      'patches': {'size': (8, 8)},
      'num_blocks': 2,
      'hidden_dim': 64,
      'tokens_mlp_dim': 32,
      'channels_mlp_dim': 128,
    },
  ),
}
# The modules whose outputs are activations or the residual stream (not the Dense layers
# inside them, whose float32 sums are rounded by their caller).
ACTIVATIONS = re.compile(
  r'(encoderblock_\d+|MixerBlock_\d+|LayerNorm_\d+|encoder_norm|pre_head_layer_norm|MlpBlock_0'
  r'|token_mixing|channel_mixing|MultiHeadDotProductAttention_0)/__call__/'
)


def _model(kind, **overrides):
  name, fields = MODELS[kind]
  return get_model(name, num_classes=10, **fields, **overrides)


def _params(model):
  params = jax.eval_shape(lambda: model.init(jax.random.key(0), IMAGES, train=False))['params']
  leaves, tree = jax.tree.flatten(params)
  rng = np.random.default_rng(0)  # every weight random (the head starts at zero)
  return tree.unflatten([jnp.asarray(0.05 * rng.standard_normal(x.shape), x.dtype) for x in leaves])


def _grads(model, params):
  def loss(p):
    logits = model.apply({'params': p}, IMAGES, train=False)
    assert logits.dtype == jnp.float32
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * LABELS, axis=-1))

  return jax.jit(jax.grad(loss))(params)


def _relative_error(got, want) -> float:
  """|got - want| / |want| over the whole tree (global norms, in float64)."""
  diff = sum(np.sum((np.float64(a) - np.float64(b)) ** 2) for a, b in zip(got, want, strict=True))
  norm = sum(np.sum(np.float64(b) ** 2) for b in want)
  return float(np.sqrt(diff / norm))


@pytest.mark.slow
def test_gradients_of_both_policies_are_close_to_float32(kind='ViT'):
  """bfloat16 keeps 8 bits of mantissa (relative rounding 2^-9 = 2e-3 per value); through two
  blocks the gradient's global relative error stays within 8e-3 under both policies
  (measured: 1.4e-3 matmul, 2.5e-3 activations; the Mixer: 1.2e-3, 1.5e-3). Gradients come
  back in float32."""
  f32 = _model(kind)
  params = _params(f32)
  want = jax.tree.leaves(_grads(f32, params))
  errors = {}
  for policy in precision.POLICIES:
    got = jax.tree.leaves(_grads(_model(kind, dtype=jnp.bfloat16, precision_policy=policy), params))
    assert {g.dtype for g in got} == {jnp.dtype(jnp.float32)}
    errors[policy] = _relative_error(got, want)
  assert all(0 < e < 8e-3 for e in errors.values()), errors


def _activation_dtypes(model, params) -> set:
  """The dtypes of the outputs of every encoder/mixer block, norm and MLP."""
  _, state = model.apply(
    {'params': params}, IMAGES, train=False, capture_intermediates=True, mutable=['intermediates']
  )
  found = set()
  for path, x in jax.tree_util.tree_flatten_with_path(state['intermediates'])[0]:
    names = '/'.join(str(getattr(k, 'key', k)) for k in path)
    if ACTIVATIONS.search(names):
      found.add(jnp.dtype(x.dtype).name)
  assert found  # the modules were found
  return found


@pytest.mark.slow
@pytest.mark.parametrize('kind', ['ViT', 'Mixer'])
def test_the_policy_sets_the_dtype_of_activations_and_residuals(kind):
  model = _model(kind)
  params = _params(model)
  assert _activation_dtypes(_model(kind, dtype=jnp.bfloat16), params) == {'float32'}
  activations = _model(kind, dtype=jnp.bfloat16, precision_policy='activations')
  assert _activation_dtypes(activations, params) == {'bfloat16'}
  # float32 compute ignores the policy: the same program.
  same = _model(kind, precision_policy='activations').apply({'params': params}, IMAGES, train=False)
  np.testing.assert_array_equal(same, model.apply({'params': params}, IMAGES, train=False))
  with pytest.raises(
    ValueError, match=r"precision='half'; expected one of \('matmul', 'activations'\)"
  ):
    _model(kind, dtype=jnp.bfloat16, precision_policy='half').init(
      jax.random.key(0), IMAGES, train=False
    )


@pytest.mark.parametrize('tokens', [197, 64])
def test_padded_attention_equals_xla_attention_outputs_and_gradients(tokens):
  """Padded to a multiple of 64 with sequence-length masks (the call cuDNN trains with),
  `jax.nn.dot_product_attention` gives the unpadded attention's output and q/k/v gradients:
  checked with XLA's implementation of the same padding semantics, against `attention.attend`
  (the model's explicit attention, heads-major with pre-scaled queries)."""
  keys = jax.random.split(jax.random.key(3), 4)
  q, k, v, dy = (jax.random.normal(key, (2, tokens, 2, 16)) for key in keys)

  def padded(q, k, v):
    return attention.padded_attention(q, k, v, attention.CUDNN_BLOCK, 'xla')

  def explicit(q, k, v):
    q, k, v = (jnp.swapaxes(t, 1, 2) for t in (q, k, v))
    return jnp.swapaxes(attention.attend(q / 4.0, k, v, jnp.float32), 1, 2)

  @jax.jit
  def outputs_and_grads(q, k, v, dy):
    (y, pullback), (y_ref, pullback_ref) = jax.vjp(padded, q, k, v), jax.vjp(explicit, q, k, v)
    return y, y_ref, pullback(dy), pullback_ref(dy)

  y, y_ref, grads, grads_ref = outputs_and_grads(q, k, v, dy)
  assert y.shape == q.shape
  np.testing.assert_allclose(y, y_ref, atol=2e-6)
  for name, got, want in zip('qkv', grads, grads_ref, strict=True):
    assert float(np.abs(want).max()) > 0.1, name  # a gradient worth comparing
    np.testing.assert_allclose(got, want, atol=1e-5, err_msg=name)
  # The kernel sees whole blocks of 64 tokens.
  shapes = {v.aval.shape for eqn in jax.make_jaxpr(padded)(q, k, v).eqns for v in eqn.outvars}
  assert (2, -(-tokens // 64) * 64, 2, 16) in shapes


def _residual_bytes(model, params) -> int:
  """Bytes per image of what the backward pass keeps: the residuals of the training loss's
  VJP that have a batch axis (not the parameters)."""
  rngs = {'dropout': jax.random.key(0)}
  loss = lambda p: model.apply({'params': p}, IMAGES, train=True, rngs=rngs).sum()
  kept = jax.eval_shape(lambda p: jax.vjp(loss, p)[1], params)
  batched = [x for x in jax.tree.leaves(kept) if x.ndim and x.shape[0] == IMAGES.shape[0]]
  return sum(x.size * x.dtype.itemsize for x in batched) // IMAGES.shape[0]


def test_bfloat16_activations_keep_fewer_bytes_for_the_backward_pass():
  """The residuals in bfloat16 instead of float32 (GELU, LayerNorm inputs, the residual
  stream): at most 80% of the 'matmul' policy's bytes per image on this ViT."""
  matmul = _model('ViT', dtype=jnp.bfloat16)
  params = _params(matmul)
  activations = _model('ViT', dtype=jnp.bfloat16, precision_policy='activations')
  ratio = _residual_bytes(activations, params) / _residual_bytes(matmul, params)
  assert 0.3 < ratio < 0.8, ratio


@pytest.mark.parametrize('kind', ['ViT', 'Mixer'])
def test_kernels_cast_once_give_the_same_outputs_bit_for_bit(kind):
  """`cast_matmul_params` stores in bfloat16 exactly the leaves the bfloat16 model casts at
  every call (every Dense kernel; not the patch embedding, biases or norms), and the outputs
  are those of the float32 parameters bit for bit."""
  name, overrides = MODELS[kind]
  model = get_model(name, num_classes=10, dtype=jnp.bfloat16, **overrides)
  params = jax.jit(lambda: model.init(jax.random.key(0), IMAGES, train=False))()
  params = jax.tree.map(lambda x: x + np.random.default_rng(2).normal(size=x.shape) / 8, params)
  apply = jax.jit(lambda p, x: model.apply(p, x, train=False))
  cast = precision.cast_matmul_params(apply, params, IMAGES)
  paths = {
    jax.tree_util.keystr(path, simple=True, separator='/'): leaf.dtype
    for path, leaf in jax.tree_util.tree_leaves_with_path(cast)
  }
  stems = ('params/embedding/', 'params/stem/')  # the patch embeddings stay float32
  dense = {p for p in paths if p.endswith('kernel') and not p.startswith(stems)}
  assert dense and {p for p, dtype in paths.items() if dtype == jnp.bfloat16} == dense
  np.testing.assert_array_equal(apply(cast, IMAGES), apply(params, IMAGES))


def test_the_primitive_api_of_mixed_einsum_is_where_precision_reads_it():
  """precision.py defines `mixed_einsum`'s primitive and reads jaxprs through jax.extend.core and
  jax.interpreters (no public API defines a primitive or its rules; jax 0.10-0.12): a jax
  release that moves or reshapes one of them fails here by name, not as a wrong gradient."""
  from jax.interpreters import ad, batching, mlir

  def params(fn):
    return list(inspect.signature(fn).parameters)

  assert params(ad.defbilinear) == ['prim', 'lhs_rule', 'rhs_rule']
  assert params(mlir.register_lowering)[:2] == ['prim', 'rule']
  assert params(mlir.lower_fun)[:2] == ['fun', 'multiple_results']
  assert params(jax.extend.core.jaxprs_in_params) == ['params']
  primitive = precision._mixed_einsum_p
  assert isinstance(primitive, jax.extend.core.Primitive)
  assert primitive in ad.primitive_jvps and primitive in ad.primitive_transposes
  assert primitive in batching.fancy_primitive_batchers  # where primitive_batchers[...] stores
  x, y = jnp.ones((2, 3)), jnp.ones((3, 4))
  lowered = jax.jit(lambda x, y: primitive.bind(x, y, spec='ij,jk->ik', dtype=jnp.bfloat16))
  assert 'dot_general' in lowered.lower(x, y).as_text()
  closed = jax.make_jaxpr(lambda x: jnp.sin(x) * 2)(1.0)
  assert all(isinstance(v, jax.extend.core.Var) for v in (*closed.invars, *closed.outvars))

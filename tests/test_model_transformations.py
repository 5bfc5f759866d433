"""The default model under every JAX transformation, in float32 and bfloat16.

Its fast paths carry written-out derivatives (`attention.attend`: FlashAttention's backward
pass derived from a JVP; `precision.mixed_einsum`: bfloat16 operands, float32 sums, forward and
backward), so forward mode, reverse mode, their compositions and vmap are each checked against
something computed another way: float64 finite differences of the model itself, the other mode of
differentiation, or a loop.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import dot_types, randomize
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from vit_jax import families
from vit_jax.models import attention, blocks, get_model, precision

DTYPES = [jnp.float32, jnp.bfloat16]
# Agreement with float64 differences: float32 rounding, or bfloat16 operands (8-bit mantissas).
TOLERANCE = {jnp.float32: 3e-5, jnp.bfloat16: 2e-2}
NUM_CLASSES = 10


def _model(dtype, **overrides):
  return get_model('testing', num_classes=NUM_CLASSES, dtype=dtype, **overrides)


@pytest.fixture(scope='module')
def point():
  """Random weights, images and labels, and a random direction in weights and images."""
  images = jax.random.uniform(jax.random.key(1), (2, 32, 32, 3), minval=-1, maxval=1)
  params = randomize(families.param_shapes(_model(jnp.float32), 32))
  direction = (
    randomize(params, seed=1),
    np.asarray(jax.random.normal(jax.random.key(2), images.shape)),
  )
  return params, np.asarray(images), np.array([3, 7]), direction


def _logits(model, params, images):
  return model.apply({'params': params}, images, train=False)


def _cross_entropy(logits, labels):
  return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=-1))


def _loss(model, params, images, labels):
  return _cross_entropy(_logits(model, params, images), labels)


def _float64(tree):
  return jax.tree.map(lambda x: np.asarray(x, np.float64), tree)


def _finite_difference(f, x, v, h=1e-2):
  """The derivative of `f` at `x` along `v`: the five-point stencil, O(h^4), in float64 (the
  model rounds its output to float32, which a smaller step would amplify)."""
  with jax.enable_x64(True):
    x, v = _float64(x), _float64(v)
    at = lambda s: f(jax.tree.map(lambda a, b: a + s * h * b, x, v))
    stencil = lambda f2, f1, b1, b2: (8 * (f1 - b1) - (f2 - b2)) / (12 * h)
    return jax.tree.map(stencil, at(2), at(1), at(-1), at(-2))


@pytest.fixture(scope='module')
def reference_tangent(point):
  """Finite differences of the logits along the direction, the model computed in float64 (it
  rounds the logits to float32 at the end)."""
  params, images, _, direction = point
  logits = lambda x: _logits(_model(jnp.float64, param_dtype=jnp.float64), *x)
  return _finite_difference(jax.jit(logits), (params, images), direction)


@pytest.fixture(scope='module')
def reference_hvp(point):
  """Finite differences of float64 gradients along the direction in the weights: XLA's own
  gradients of the plain formula (kept attention weights take it), so no written-out derivative
  enters the reference."""
  params, images, labels, (direction, _) = point
  model = _model(jnp.float64, param_dtype=jnp.float64)
  plain = lambda p: model.apply({'params': p}, images, train=False, mutable=['intermediates'])[0]
  gradient = jax.grad(lambda p: _cross_entropy(plain(p), labels))
  return _finite_difference(jax.jit(gradient), params, direction)


def _assert_close(got, want, tolerance):
  got, want = jax.tree.leaves(got), jax.tree.leaves(want)
  assert len(got) == len(want)
  scale = max(float(np.abs(w).max()) for w in want)
  assert scale > 1e-2  # a derivative worth comparing
  for g, w in zip(got, want, strict=True):
    np.testing.assert_allclose(np.asarray(g, np.float64), w, atol=tolerance * scale, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize('dtype', DTYPES)
def test_jvp_and_linearize_agree_with_finite_differences(dtype, point, reference_tangent):
  params, images, _, direction = point
  f = functools.partial(_logits, _model(dtype))
  _, tangent = jax.jit(lambda x, v: jax.jvp(f, x, v))((params, images), direction)
  _, linearized = jax.linearize(f, params, images)
  _assert_close(tangent, reference_tangent, TOLERANCE[dtype])
  _assert_close(linearized(*direction), tangent, 1e-6)


@pytest.mark.slow
@pytest.mark.parametrize('dtype', DTYPES)
def test_scanned_rematerialised_layers_give_the_same_jvp(dtype, point):
  params, images, _, (direction, _) = point
  scanned = _model(dtype, scan_layers=True, remat_policy='dots')
  got = jax.jvp(
    lambda p: _logits(scanned, blocks.stack_encoder_blocks(p), images), (params,), (direction,)
  )[1]
  want = jax.jvp(lambda p: _logits(_model(dtype), p, images), (params,), (direction,))[1]
  _assert_close(got, want, 1e-5)


@pytest.mark.slow
@pytest.mark.parametrize('dtype', DTYPES)
def test_jacfwd_equals_jacrev(dtype, point):
  params, images, *_ = point
  f = functools.partial(_logits, _model(dtype))
  forward = jax.jit(jax.jacfwd(f, argnums=(0, 1)))(params, images)
  reverse = jax.jit(jax.jacrev(f, argnums=(0, 1)))(params, images)
  # Both modes round their 16-bit operands at different places, each within bfloat16's error.
  _assert_close(forward, reverse, 1e-5 if dtype == jnp.float32 else 1e-2)


@pytest.mark.slow
@pytest.mark.parametrize('dtype', DTYPES)
def test_hessian_vector_products_agree_with_differences_of_gradients(dtype, point, reference_hvp):
  """Forward over reverse and reverse over reverse."""
  params, images, labels, (direction, _) = point
  grad = jax.grad(lambda p: _loss(_model(dtype), p, images, labels))
  inner = lambda a, b: sum(jax.tree.leaves(jax.tree.map(jnp.vdot, a, b)))
  forward_over_reverse = lambda p, v: jax.jvp(grad, (p,), (v,))[1]
  reverse_over_reverse = lambda p, v: jax.grad(lambda p: inner(grad(p), v))(p)
  for hvp in (forward_over_reverse, reverse_over_reverse):
    _assert_close(jax.jit(hvp)(params, direction), reference_hvp, TOLERANCE[dtype])


@pytest.mark.slow
@pytest.mark.parametrize('dtype', DTYPES)
def test_vmap_of_per_example_gradients_equals_a_loop(dtype, point):
  params, images, labels, _ = point
  grad = jax.jit(jax.grad(functools.partial(_loss, _model(dtype))))
  per_example = jax.jit(jax.vmap(grad, in_axes=(None, 0, 0)))(
    params, images[:, None], labels[:, None]
  )
  for i in range(len(images)):
    one = jax.tree.map(lambda g, i=i: g[i], per_example)
    _assert_close(one, _float64(grad(params, images[i : i + 1], labels[i : i + 1])), 1e-5)


def test_bfloat16_forward_mode_and_per_example_matmuls_keep_bfloat16_operands(point):
  params, images, labels, direction = point
  model = _model(jnp.bfloat16)
  jvp = jax.jit(lambda x, v: jax.jvp(functools.partial(_logits, model), x, v))
  per_example = jax.jit(jax.vmap(jax.grad(functools.partial(_loss, model)), in_axes=(None, 0, 0)))
  for lowered in (
    jvp.lower((params, images), direction),
    per_example.lower(params, images[:, None], labels[:, None]),
  ):
    dots = dot_types(lowered.as_text())
    assert len(dots) > 10 and set(dots) == {('bf16', 'bf16', 'f32')}


@pytest.mark.parametrize(
  'axes', [(0, None, 0, None), (None, 0, None, 0), (0, None, None, 0), (2, 1, 2, 1)]
)
def test_mixed_einsum_jvp_under_vmap_equals_its_definition(axes):
  """jvp: bfloat16-rounded operands, float32 sums; vmapped over either operand of the tangent
  products or both (axes of x, y, dx, dy)."""
  spec, shapes = 'bhqk,bhkd->bhqd', ((2, 3, 5, 7), (2, 3, 7, 8)) * 2
  rng = np.random.default_rng(4)
  args = [
    rng.standard_normal(shape if axis is None else (*shape[:axis], 3, *shape[axis:]), np.float32)
    for shape, axis in zip(shapes, axes, strict=True)
  ]
  mixed = lambda x, y: precision.mixed_einsum(spec, x, y, jnp.bfloat16)
  jvp = lambda x, y, dx, dy: jax.jvp(mixed, (x, y), (dx, dy))[1]
  got = jax.jit(jax.vmap(jvp, in_axes=axes))(*args)
  assert got.dtype == jnp.float32
  rounded = [a.astype(jnp.bfloat16).astype(np.float64) for a in args]  # numpy (ml_dtypes)
  for i in range(3):
    one = [a if m is None else np.take(a, i, axis=m) for a, m in zip(rounded, axes, strict=True)]
    x, y, dx, dy = one
    np.testing.assert_allclose(
      got[i], np.einsum(spec, dx, y) + np.einsum(spec, x, dy), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize('dtype', DTYPES)
def test_attend_jvp_equals_autodiff_of_the_plain_formula(dtype):
  keys = jax.random.split(jax.random.key(5), 6)
  q, k, v, dq, dk, dv = (jax.random.normal(key, (2, 3, 17, 8)) for key in keys)

  def plain(q, k, v):  # the same mixed-precision matmuls, differentiated by JAX
    weights = jax.nn.softmax(precision.einsum('bhqd,bhkd->bhqk', q, k, dtype).astype(jnp.float32))
    return precision.einsum('bhqk,bhkd->bhqd', weights, v, dtype)

  got = jax.jit(jax.jvp, static_argnums=0)(
    lambda *a: attention.attend(*a, dtype), (q, k, v), (dq, dk, dv)
  )
  want = jax.jit(jax.jvp, static_argnums=0)(plain, (q, k, v), (dq, dk, dv))
  tolerance = 1e-5 if dtype == jnp.float32 else 3e-2
  for g, w in zip(got, want, strict=True):
    assert g.dtype == jnp.float32
    np.testing.assert_allclose(g, w, atol=tolerance * float(np.abs(w).max()))


@pytest.mark.slow
def test_bfloat16_gradients_under_shard_map_equal_jit():
  """Per-device code (shard_map, check_vma) sums the replicated weights' gradients, as jit."""
  mesh = Mesh(np.array(jax.devices()[:4]), ('data',))
  model = _model(jnp.bfloat16)
  images = jax.random.uniform(jax.random.key(1), (4, 32, 32, 3), minval=-1, maxval=1)
  labels = jnp.arange(4)
  params = randomize(families.param_shapes(model, 32))
  loss = functools.partial(_loss, model)

  def per_device(p, x, y):
    return jax.grad(lambda p: jax.lax.pmean(loss(p, x, y), 'data'))(p)

  spec = PartitionSpec('data')
  sharded = [jax.device_put(a, NamedSharding(mesh, spec)) for a in (images, labels)]
  step = jax.shard_map(
    per_device, mesh=mesh, in_specs=(PartitionSpec(), spec, spec), out_specs=PartitionSpec()
  )
  got = jax.jit(step)(params, *sharded)
  _assert_close(got, _float64(jax.jit(jax.grad(loss))(params, images, labels)), 1e-5)

"""Mixed precision: 16-bit matmul operands with float32 sums, forward and backward.

`mixed_einsum` is a custom primitive with its own transpose, batching and JVP rules, so that
every JAX transformation keeps the float32 accumulation (a plain cast-then-einsum would round
the gradients to 16 bits). The helpers around it give each layer its dtypes: `matmul_kwargs`
and `dense` for Dense layers, `elementwise_dtype` for norms, residuals and activations,
`layer_norm`; `Precision`, the base of the zoo's modules, holds the three fields they read.

With a 16-bit compute dtype, the precision policy says what else is 16-bit (POLICIES):

  'matmul'       matmul operands only; activations, norms, GELU, softmax and the residual
                 stream in float32 (the default).
  'activations'  activations and the residual stream in the compute dtype too: each matmul
                 (float32 sums, plus its bias in float32) rounds its output once; LayerNorm
                 statistics (flax reduces in float32), the softmax and the loss stay float32
                 inside their ops, and gradients of the float32 parameters are accumulated in
                 float32. Half the bytes of every elementwise op and of the saved activations.

Parameters stay in `param_dtype` under both; a float32 compute dtype ignores the policy.
"""

import dataclasses
import functools
import string
from typing import Any

import flax.linen as nn
import jax
import jax.extend  # a primitive, jaxprs' variables: no public API has them (jax 0.10-0.12)
import jax.numpy as jnp
from jax import lax
from jax.interpreters import ad, batching, mlir  # a primitive's rules: no public API either

Dtype = Any
POLICIES = ('matmul', 'activations')


def check_policy(policy: str) -> None:
  if policy not in POLICIES:
    raise ValueError(f'precision={policy!r}; expected one of {POLICIES}')


def is_mixed(dtype: Dtype) -> bool:
  """16-bit compute dtypes take the mixed-precision path (16-bit operands, float32 sums)."""
  return jnp.dtype(dtype).itemsize == 2 and jnp.issubdtype(dtype, jnp.floating)


def _einsum_operands(spec: str) -> tuple[str, str, str]:
  inputs, out = spec.split('->')
  lhs, rhs = inputs.split(',')
  return lhs, rhs, out


def _mixed_einsum_impl(x, y, *, spec: str, dtype: Dtype) -> jnp.ndarray:
  return jnp.einsum(spec, x.astype(dtype), y.astype(dtype), preferred_element_type=jnp.float32)


# The product of `mixed_einsum` as a bilinear primitive, for its tangents. JAX transposes it by
# the rules below, so the backward matmuls too take `dtype` operands and return float32; JAX
# transposing the casts and the einsum would multiply the float32 cotangent in float32 and
# round the gradient to `dtype`.
_mixed_einsum_p = jax.extend.core.Primitive('mixed_einsum')
_mixed_einsum_p.def_impl(_mixed_einsum_impl)
mlir.register_lowering(_mixed_einsum_p, mlir.lower_fun(_mixed_einsum_impl, multiple_results=False))


@_mixed_einsum_p.def_abstract_eval
def _mixed_einsum_abstract_eval(x, y, *, spec, dtype):
  # The einsum's own result type: shape, and under shard_map the axes it varies over.
  out = jax.eval_shape(functools.partial(_mixed_einsum_impl, spec=spec, dtype=dtype), x, y)
  return x.update(shape=out.shape, dtype=out.dtype, weak_type=False, sharding=out.sharding)


def _mixed_einsum_transpose_lhs(ct, x, y, *, spec, dtype):
  lhs, rhs, out = _einsum_operands(spec)
  dx = _mixed_einsum_p.bind(ct, y, spec=f'{out},{rhs}->{lhs}', dtype=dtype)
  return dx.astype(x.aval.dtype)


def _mixed_einsum_transpose_rhs(ct, x, y, *, spec, dtype):
  lhs, rhs, out = _einsum_operands(spec)
  dy = _mixed_einsum_p.bind(x, ct, spec=f'{lhs},{out}->{rhs}', dtype=dtype)
  return dy.astype(y.aval.dtype)


ad.defbilinear(_mixed_einsum_p, _mixed_einsum_transpose_lhs, _mixed_einsum_transpose_rhs)


def _mixed_einsum_batch(args, dims, *, spec, dtype):
  """vmap: the mapped axis becomes one more letter of the spec, placed after an operand's
  leading batch letters (XLA's CPU backend fails on bfloat16 x bfloat16 = float32 batched
  matmuls with a free axis ahead of the batch axes)."""
  lhs, rhs, out = _einsum_operands(spec)
  axis = next(c for c in string.ascii_letters if c not in spec)
  if None not in dims:  # both mapped (None: not mapped): one more batch axis, in front
    x, y = (jnp.moveaxis(arg, dim, 0) for arg, dim in zip(args, dims, strict=True))
    spec = f'{axis}{lhs},{axis}{rhs}->{axis}{out}'
    return _mixed_einsum_p.bind(x, y, spec=spec, dtype=dtype), 0

  def insert(letters: str) -> tuple[str, int]:
    at = len(letters) - len(letters.lstrip(''.join(set(lhs) & set(rhs) & set(out))))
    return letters[:at] + axis + letters[at:], at

  (x, y), (bx, by) = args, dims
  if bx is not None:
    lhs, at = insert(lhs)
    x = jnp.moveaxis(x, bx, at)
  else:
    rhs, at = insert(rhs)
    y = jnp.moveaxis(y, by, at)
  out, at = insert(out)
  return _mixed_einsum_p.bind(x, y, spec=f'{lhs},{rhs}->{out}', dtype=dtype), at


batching.primitive_batchers[_mixed_einsum_p] = _mixed_einsum_batch


def _mixed_product(spec: str, x: jnp.ndarray, y: jnp.ndarray, dtype: Dtype) -> jnp.ndarray:
  """`mixed_einsum` where an operand is a tangent. JAX would transpose a custom-JVP function
  there through its plain definition (float32 matmuls, rounded gradients); the primitive is
  transposed by its own rules."""
  # Under shard_map, an operand that is the same on every device is marked as varying where
  # the other one varies, as JAX marks the operands of its own ops (its gradient is then
  # summed over the devices); elsewhere adding a zero scalar is a no-op that XLA removes.
  x = x + lax.full_like(y, 0, x.dtype, shape=())
  y = y + lax.full_like(x, 0, y.dtype, shape=())
  return _mixed_einsum_p.bind(x, y, spec=spec, dtype=jnp.dtype(dtype))


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 3))
def mixed_einsum(spec: str, x: jnp.ndarray, y: jnp.ndarray, dtype: Dtype) -> jnp.ndarray:
  """Two-operand einsum with operands cast to `dtype`, float32 accumulation and output.

  Differentiable by every JAX transformation (jvp, vjp, vmap, higher orders). The matmuls of
  the backward pass also take `dtype` operands (the float32 cotangent is cast down) and
  accumulate in float32, and gradients come back in the operands' own dtypes without a detour
  through `dtype`; only the cast operands are kept for the backward pass. The forward matmul
  is a plain `dot_general`, which rematerialisation policies recognise. On CPUs with bfloat16
  dot products (avx512_bf16) this runs ~2x faster than float32; a bfloat16 *output* would not
  (the kernels then round every sum).
  """
  return _mixed_einsum_impl(x, y, spec=spec, dtype=dtype)


@mixed_einsum.defjvp
def _mixed_einsum_jvp(spec, dtype, primals, tangents):
  (x, y), (dx, dy) = primals, tangents
  xc, yc = x.astype(dtype), y.astype(dtype)
  out = jnp.einsum(spec, xc, yc, preferred_element_type=jnp.float32)
  return out, _mixed_product(spec, dx, yc, dtype) + _mixed_product(spec, xc, dy, dtype)


def einsum(spec: str, x: jnp.ndarray, y: jnp.ndarray, dtype: Dtype) -> jnp.ndarray:
  """`mixed_einsum` for 16-bit compute dtypes, else a plain einsum in the operands' dtype."""
  if is_mixed(dtype):
    return mixed_einsum(spec, x, y, dtype)
  return jnp.einsum(spec, x, y)


def tangent_einsum(spec: str, x: jnp.ndarray, y: jnp.ndarray, dtype: Dtype) -> jnp.ndarray:
  """`einsum` inside a JVP rule, where one operand is a tangent."""
  if is_mixed(dtype):
    return _mixed_product(spec, x, y, dtype)
  return jnp.einsum(spec, x, y)


def dot_general_as_einsum(lhs_ndim: int, rhs_ndim: int, dimension_numbers: Any) -> str:
  """The einsum spec of a `lax.dot_general` (output: batch, lhs free, rhs free dims)."""
  (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
  lhs_contract = [d % lhs_ndim for d in lhs_contract]
  rhs_contract = [d % rhs_ndim for d in rhs_contract]
  lhs_batch = [d % lhs_ndim for d in lhs_batch]
  rhs_batch = [d % rhs_ndim for d in rhs_batch]
  letters = iter('abcdefghijklmnopqrstuvwxyz')
  lhs = [next(letters) for _ in range(lhs_ndim)]
  rhs = [''] * rhs_ndim
  for i, j in zip(lhs_contract, rhs_contract, strict=True):
    rhs[j] = lhs[i]
  for i, j in zip(lhs_batch, rhs_batch, strict=True):
    rhs[j] = lhs[i]
  rhs = [c or next(letters) for c in rhs]
  out = [lhs[i] for i in lhs_batch]
  out += [c for i, c in enumerate(lhs) if i not in lhs_contract and i not in lhs_batch]
  out += [c for j, c in enumerate(rhs) if j not in rhs_contract and j not in rhs_batch]
  return f'{"".join(lhs)},{"".join(rhs)}->{"".join(out)}'


def matmul_kwargs(dtype: Dtype, param_dtype: Dtype) -> dict[str, Any]:
  """Dense/DenseGeneral arguments: a mixed-precision dot for 16-bit dtypes, else flax's."""
  if not is_mixed(dtype):
    return {'dtype': dtype, 'param_dtype': param_dtype}

  def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
    del precision, preferred_element_type  # float32 accumulation is the point
    spec = dot_general_as_einsum(lhs.ndim, rhs.ndim, dimension_numbers)
    return mixed_einsum(spec, lhs, rhs, dtype)

  # The module itself works in float32 (bias, output); only the dot sees `dtype`.
  return {'dtype': jnp.float32, 'param_dtype': param_dtype, 'dot_general': dot_general}


def elementwise_dtype(dtype: Dtype, policy: str = 'matmul') -> Dtype:
  """The dtype of norms, residuals and activations: float32 on the mixed-precision path under
  the 'matmul' policy, the compute dtype under 'activations' (and for non-16-bit dtypes)."""
  check_policy(policy)
  return jnp.float32 if is_mixed(dtype) and policy == 'matmul' else dtype


def dense(cls: type[nn.Module], dtype: Dtype, param_dtype: Dtype, policy: str, **fixed: Any):
  """A factory of `cls` (nn.Dense, nn.DenseGeneral) layers, called like `cls`, whose outputs
  come in the policy's activation dtype: the matmul sums and the bias add run in float32
  (`matmul_kwargs`), then one rounding; the bias gradient is summed in float32."""
  out_dtype = elementwise_dtype(dtype, policy)
  kwargs = {**matmul_kwargs(dtype, param_dtype), **fixed}

  def make(*args: Any, **kw: Any):
    layer = cls(*args, **kwargs, **kw)
    return lambda x: layer(x).astype(out_dtype)

  return make


# flax's default, as the released models were trained (Hugging Face's ViT configs say 1e-12).
LAYER_NORM_EPSILON = 1e-6


def layer_norm(
  name: str,
  dtype: Dtype,
  param_dtype: Dtype,
  policy: str = 'matmul',
  epsilon: float = LAYER_NORM_EPSILON,
  bias: bool = True,
) -> nn.LayerNorm | nn.RMSNorm:
  """LayerNorm with `epsilon` (1e-6 by default); its statistics are reduced in float32
  whatever its dtype (flax's force_float32_reductions). `bias=False`: without bias and
  without centering, x / sqrt(mean(x^2) + epsilon) * scale (RMSNorm, Zhang & Sennrich 2019,
  as ViT-22B applies its LayerNorms), its one parameter still named `scale`."""
  kwargs = {'epsilon': epsilon, 'dtype': elementwise_dtype(dtype, policy), 'name': name}
  if not bias:
    return nn.RMSNorm(param_dtype=param_dtype, **kwargs)
  return nn.LayerNorm(param_dtype=param_dtype, **kwargs)


class Precision(nn.Module):
  """The base of the zoo's modules: the compute dtype, the parameter dtype and the precision
  policy (keyword-only fields, so that each module's own fields keep their positions), and the
  layers built from them."""

  dtype: Dtype = dataclasses.field(default=jnp.float32, kw_only=True)
  param_dtype: Dtype = dataclasses.field(default=jnp.float32, kw_only=True)
  precision_policy: str = dataclasses.field(default='matmul', kw_only=True)

  def precision_fields(self) -> dict[str, Any]:
    """The three fields, for a submodule that is a `Precision` too."""
    return {
      'dtype': self.dtype,
      'param_dtype': self.param_dtype,
      'precision_policy': self.precision_policy,
    }

  def activation_dtype(self) -> Dtype:
    """The dtype of this module's norms, residuals and activations (`elementwise_dtype`)."""
    return elementwise_dtype(self.dtype, self.precision_policy)

  def dense_layers(self, cls: type[nn.Module], **fixed: Any):
    """`dense` with this module's fields."""
    return dense(cls, self.dtype, self.param_dtype, self.precision_policy, **fixed)

  def norm(
    self, name: str, epsilon: float = LAYER_NORM_EPSILON, bias: bool = True
  ) -> nn.LayerNorm | nn.RMSNorm:
    """`layer_norm` with this module's fields."""
    return layer_norm(name, self.dtype, self.param_dtype, self.precision_policy, epsilon, bias)


# Primitives that move a leaf's elements without changing them: a cast commutes with them.
_SHAPE_ONLY = frozenset({'reshape', 'transpose', 'squeeze', 'expand_dims', 'broadcast_in_dim'})


def _casts(jaxpr: Any, tracked: dict[Any, int], found: dict[int, Any]) -> None:
  """Per tracked leaf (variable -> leaf index), the 16-bit dtype every use casts it to, or
  None where some use reads it otherwise; follows shape-only ops and nested jaxprs."""
  for eqn in jaxpr.eqns:
    inner = list(jax.extend.core.jaxprs_in_params(eqn.params))
    for position, var in enumerate(eqn.invars):
      leaf = tracked.get(var) if isinstance(var, jax.extend.core.Var) else None
      if leaf is None:
        continue
      name, to = eqn.primitive.name, eqn.params.get('new_dtype')
      if name == 'convert_element_type' and to is not None and is_mixed(to):
        found[leaf] = to if found.get(leaf, to) == to else None
      elif name in _SHAPE_ONLY:
        tracked[eqn.outvars[0]] = leaf
      elif len(inner) == 1 and len(inner[0].invars) == len(eqn.invars):  # a call, a custom rule
        _casts(inner[0], {inner[0].invars[position]: leaf}, found)
      else:
        found[leaf] = None
  for var in jaxpr.outvars:
    if isinstance(var, jax.extend.core.Var) and var in tracked:
      found[tracked[var]] = None


def cast_matmul_params(fn: Any, params: Any, *args: Any) -> Any:
  """`params` with each leaf that `fn(params, *args)` only reads as a 16-bit matmul operand
  (its kernels under a 16-bit dtype) stored in that dtype already: the same outputs bit for
  bit, without casting ~all the weights at every call (a quarter of ViT-B/16's bfloat16
  inference on an Intel Xeon). `args` may be arrays or `jax.ShapeDtypeStruct`s. For inference:
  training keeps float32 parameters."""
  leaves, treedef = jax.tree.flatten(params)
  # make_jaxpr's result, read as a jaxpr (jax 0.12's Jaxpr; 0.10's ClosedJaxpr delegates).
  jaxpr = jax.make_jaxpr(lambda flat, a: fn(jax.tree.unflatten(treedef, flat), *a))(leaves, args)
  found: dict[int, Any] = {}
  tracked = {var: i for i, var in enumerate(jaxpr.invars[: len(leaves)])}
  _casts(jaxpr, tracked, found)
  cast = [x.astype(found[i]) if found.get(i) is not None else x for i, x in enumerate(leaves)]
  return jax.tree.unflatten(treedef, cast)

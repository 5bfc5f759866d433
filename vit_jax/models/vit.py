"""The Vision Transformer (Dosovitskiy et al., arXiv:2010.11929) in Flax linen.

Every module carries the name it has in the released checkpoints after the Linen
renumbering (reference: the original vit_jax `models_vit.py`), so the parameter tree
is the checkpoint interface:

  embedding/{kernel,bias}                conv patch embedding, HWIO
  cls                                    (1, 1, D) class token
  Transformer/posembed_input/pos_embedding   (1, N+1, D)
  Transformer/encoderblock_{i}/LayerNorm_0, MultiHeadDotProductAttention_0/{query,key,value,out},
                               LayerNorm_1, MlpBlock_0/{Dense_0,Dense_1}
  Transformer/encoder_norm
  pre_logits                             optional Dense + tanh (the representation layer)
  head                                   zero-initialised classifier

Options beyond the original, with the names of the checkpoints that use them:

  dist_token, head_dist                  DeiT's distillation token and its head
                                         (`distilled=True`; Touvron et al., arXiv:2012.12877)
  MAPHead_0/{probe, MultiHeadDotProductAttention_0, LayerNorm_0, MlpBlock_0}
                                         big_vision's attention pooling (`classifier='map'`)
  (no position-embedding parameter)      big_vision's fixed 2-D sin-cos (`posemb='sincos2d'`)
"""

import functools
import re
import string
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.extend
import jax.numpy as jnp
from jax import lax
from jax.interpreters import ad, batching, mlir

from vit_jax.models import resnet

Dtype = Any

CLASSIFIERS = ('token', 'gap', 'map', 'unpooled', 'token_unpooled')
POSEMBS = ('learn', 'sincos2d')
ATTENTION_IMPLS = ('xla', 'fused')
# Which activations a rematerialised encoder block keeps for the backward pass.
REMAT_POLICIES = {
  'none': None,  # no rematerialisation
  'full': jax.checkpoint_policies.nothing_saveable,
  'dots': jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
  'dots_saveable': jax.checkpoint_policies.dots_saveable,
}


def _is_mixed(dtype: Dtype) -> bool:
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


def _einsum(spec: str, x: jnp.ndarray, y: jnp.ndarray, dtype: Dtype) -> jnp.ndarray:
  """`mixed_einsum` for 16-bit compute dtypes, else a plain einsum in the operands' dtype."""
  if _is_mixed(dtype):
    return mixed_einsum(spec, x, y, dtype)
  return jnp.einsum(spec, x, y)


def _tangent_einsum(spec: str, x: jnp.ndarray, y: jnp.ndarray, dtype: Dtype) -> jnp.ndarray:
  """`_einsum` inside a JVP rule, where one operand is a tangent."""
  if _is_mixed(dtype):
    return _mixed_product(spec, x, y, dtype)
  return jnp.einsum(spec, x, y)


@functools.partial(jax.custom_jvp, nondiff_argnums=(3,))
def attend(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, dtype: Dtype) -> jnp.ndarray:
  """softmax(q k^T) v on heads-major (batch, heads, tokens, head_dim) arrays; q is pre-scaled.

  Its JVP is written so that JAX, transposing it, derives the backward pass of
  FlashAttention (Dao et al., 2022, without the tiling): with W the weights, Y the output
  and dL = dq k^T + q dk^T the tangent of the logits, dY = (W * dL) v - Y rowsum(W * dL) + W dv,
  whose transpose takes the softmax gradient's row sums of dY_bar * Y, head_dim wide, instead
  of dW_bar * W, tokens wide, and keeps no logits. XLA differentiating the forward pass itself
  would reduce the (batch, heads, tokens, tokens) product; on a CPU this makes the ViT-B/16
  training step ~4% faster. Every JAX transformation applies (jvp, vjp, vmap, higher orders).
  """
  weights = _attention_weights(q, k, dtype).astype(v.dtype)
  return _einsum('bhqk,bhkd->bhqd', weights, v, dtype)


def _attention_weights(q: jnp.ndarray, k: jnp.ndarray, dtype: Dtype) -> jnp.ndarray:
  """softmax(q k^T) over the keys, in float32, heads-major (batch, heads, queries, keys)."""
  return jax.nn.softmax(_einsum('bhqd,bhkd->bhqk', q, k, dtype).astype(jnp.float32))


@attend.defjvp
def _attend_jvp(dtype, primals, tangents):
  (q, k, v), (dq, dk, dv) = primals, tangents
  weights = _attention_weights(q, k, dtype)
  y = _einsum('bhqk,bhkd->bhqd', weights.astype(v.dtype), v, dtype)
  dlogits = _tangent_einsum('bhqd,bhkd->bhqk', dq, k, dtype)
  dlogits += _tangent_einsum('bhqd,bhkd->bhqk', q, dk, dtype)
  scaled = weights * dlogits.astype(jnp.float32)  # W * dL, the tangent of W before the centring
  dy = _tangent_einsum('bhqk,bhkd->bhqd', scaled.astype(v.dtype), v, dtype)
  dy -= y * jnp.sum(scaled, axis=-1, keepdims=True).astype(y.dtype)
  dy += _tangent_einsum('bhqk,bhkd->bhqd', weights.astype(v.dtype), dv, dtype)
  return y, dy.astype(y.dtype)


def fused_attention(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray) -> jnp.ndarray:
  """`jax.nn.dot_product_attention` on (batch, tokens, heads, head_dim) arrays: cuDNN's flash
  attention on GPUs where it applies (16-bit inputs, a recent cuDNN), else XLA's.

  jax picks XLA unless asked for cuDNN by name, and cuDNN refuses what it cannot do while
  the call is traced, so asking first and falling back costs nothing at run time.
  """
  if jax.default_backend() == 'gpu' and _is_mixed(q.dtype):
    try:
      return jax.nn.dot_product_attention(q, k, v, implementation='cudnn')
    except (ValueError, NotImplementedError, RuntimeError):
      pass
  return jax.nn.dot_product_attention(q, k, v)


def _dot_general_as_einsum(lhs_ndim: int, rhs_ndim: int, dimension_numbers: Any) -> str:
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


def _matmul_kwargs(dtype: Dtype, param_dtype: Dtype) -> dict[str, Any]:
  """Dense/DenseGeneral arguments: a mixed-precision dot for 16-bit dtypes, else flax's."""
  if not _is_mixed(dtype):
    return {'dtype': dtype, 'param_dtype': param_dtype}

  def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
    del precision, preferred_element_type  # float32 accumulation is the point
    spec = _dot_general_as_einsum(lhs.ndim, rhs.ndim, dimension_numbers)
    return mixed_einsum(spec, lhs, rhs, dtype)

  # The module itself works in float32 (bias, output); only the dot sees `dtype`.
  return {'dtype': jnp.float32, 'param_dtype': param_dtype, 'dot_general': dot_general}


def _elementwise_dtype(dtype: Dtype) -> Dtype:
  """Norms, residuals and activations stay float32 on the mixed-precision path."""
  return jnp.float32 if _is_mixed(dtype) else dtype


def layer_norm(name: str, dtype: Dtype, param_dtype: Dtype) -> nn.LayerNorm:
  """LayerNorm with eps 1e-6 (flax's default, as the released models were trained)."""
  return nn.LayerNorm(
    epsilon=1e-6, dtype=_elementwise_dtype(dtype), param_dtype=param_dtype, name=name
  )


def posemb_sincos_2d(
  h: int, w: int, width: int, temperature: float = 10_000.0, dtype: Dtype = jnp.float32
) -> jnp.ndarray:
  """big_vision's fixed 2-D position embedding (1, h*w, width) for a row-major token grid.

  Per token at (row y, column x): [sin(x w), cos(x w), sin(y w), cos(y w)] with frequencies
  w_i = temperature^(-i / (width/4 - 1)), i < width/4 (MoCo v3's layout); computed in float32.
  """
  if width % 4 or width < 8:
    raise ValueError(f'sincos2d position embeddings need a width divisible by 4, >= 8: {width}')
  y, x = jnp.mgrid[:h, :w]
  quarter = width // 4
  omega = 1.0 / temperature ** (jnp.arange(quarter, dtype=jnp.float32) / (quarter - 1))
  y = jnp.einsum('m,d->md', y.reshape(-1).astype(jnp.float32), omega)
  x = jnp.einsum('m,d->md', x.reshape(-1).astype(jnp.float32), omega)
  pe = jnp.concatenate([jnp.sin(x), jnp.cos(x), jnp.sin(y), jnp.cos(y)], axis=1)
  return pe[None].astype(dtype)


class AddPositionEmbs(nn.Module):
  """Adds a learned position embedding of shape (1, tokens, D) to the inputs."""

  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    shape = (1, x.shape[1], x.shape[2])
    pe = self.param('pos_embedding', nn.initializers.normal(stddev=0.02), shape, self.param_dtype)
    return x + pe.astype(x.dtype)


class MlpBlock(nn.Module):
  """Dense, GELU (tanh approximation, as the released weights were trained), Dense."""

  mlp_dim: int
  dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jnp.ndarray, deterministic: bool) -> jnp.ndarray:
    dense = functools.partial(
      nn.Dense,
      **_matmul_kwargs(self.dtype, self.param_dtype),
      kernel_init=nn.initializers.xavier_uniform(),
      bias_init=nn.initializers.normal(stddev=1e-6),
    )
    out_dim = x.shape[-1]
    x = nn.gelu(dense(self.mlp_dim, name='Dense_0')(x), approximate=True)
    x = nn.Dropout(rate=self.dropout_rate)(x, deterministic=deterministic)
    x = dense(out_dim, name='Dense_1')(x)
    return nn.Dropout(rate=self.dropout_rate)(x, deterministic=deterministic)


class MultiHeadDotProductAttention(nn.Module):
  """Self-attention in the released layout: q/k/v (D, heads, head_dim), out (heads, head_dim, D).

  `attention_impl='xla'` spells out softmax(q k^T / sqrt(d)) v; `'fused'` calls
  `fused_attention` (cuDNN flash attention on GPUs where it applies). The
  fused path has no attention dropout, so training with attention dropout takes the
  explicit path.
  """

  num_heads: int
  dropout_rate: float = 0.0
  attention_impl: str = 'xla'
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(
    self, x: jnp.ndarray, deterministic: bool, kv: jnp.ndarray | None = None
  ) -> jnp.ndarray:
    """Attention of the queries from `x` over the keys and values from `kv` (default: `x`)."""
    width = x.shape[-1]
    if width % self.num_heads:
      raise ValueError(f'hidden size {width} is not divisible by num_heads={self.num_heads}')
    head_dim = width // self.num_heads
    dense = functools.partial(
      nn.DenseGeneral,
      **_matmul_kwargs(self.dtype, self.param_dtype),
      kernel_init=nn.initializers.xavier_uniform(),
    )
    kv = x if kv is None else kv
    q, k, v = (
      dense(features=(self.num_heads, head_dim), name=n)(y)
      for n, y in (('query', x), ('key', kv), ('value', kv))
    )  # each (batch, tokens, heads, head_dim)

    use_dropout = not deterministic and self.dropout_rate > 0
    if self.attention_impl == 'fused' and not use_dropout:
      if _is_mixed(self.dtype):
        q, k, v = (t.astype(self.dtype) for t in (q, k, v))
      y = fused_attention(q, k, v)
    elif self.attention_impl in ATTENTION_IMPLS:
      # Heads-major (batch, heads, tokens, head_dim): XLA's batched matmuls run ~2x faster
      # on CPU with the batch dimensions leading than with heads between the tokens.
      q, k, v = (jnp.swapaxes(t, 1, 2) for t in (q, k, v))
      q = q / jnp.sqrt(head_dim).astype(q.dtype)
      # Applied with mutable=['intermediates'] (attention maps, rollout), the weights are kept.
      if use_dropout or self.is_mutable_collection('intermediates'):
        weights = _attention_weights(q, k, self.dtype).astype(v.dtype)
        self.sow('intermediates', 'attention_weights', weights)
        weights = nn.Dropout(rate=self.dropout_rate)(weights, deterministic=not use_dropout)
        y = _einsum('bhqk,bhkd->bhqd', weights, v, self.dtype)
      else:
        y = attend(q, k, v, self.dtype)
      y = jnp.swapaxes(y, 1, 2)
    else:
      raise ValueError(f'attention_impl={self.attention_impl!r}; expected one of {ATTENTION_IMPLS}')
    return dense(features=width, axis=(-2, -1), name='out')(y)


class Encoder1DBlock(nn.Module):
  """Pre-norm transformer block: x + attn(LN(x)), then x + mlp(LN(x))."""

  mlp_dim: int
  num_heads: int
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  attention_impl: str = 'xla'
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jnp.ndarray, deterministic: bool) -> jnp.ndarray:
    norm = functools.partial(
      nn.LayerNorm,
      epsilon=1e-6,
      dtype=_elementwise_dtype(self.dtype),
      param_dtype=self.param_dtype,
    )
    y = norm(name='LayerNorm_0')(x)
    y = MultiHeadDotProductAttention(
      num_heads=self.num_heads,
      dropout_rate=self.attention_dropout_rate,
      attention_impl=self.attention_impl,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      name='MultiHeadDotProductAttention_0',
    )(y, deterministic)
    x = x + nn.Dropout(rate=self.dropout_rate)(y, deterministic=deterministic)
    y = norm(name='LayerNorm_1')(x)
    y = MlpBlock(
      mlp_dim=self.mlp_dim,
      dropout_rate=self.dropout_rate,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      name='MlpBlock_0',
    )(y, deterministic)
    return x + y


class _ScanBlock(Encoder1DBlock):
  """An encoder block as the body of `nn.scan`: (x, None) -> (block(x), None)."""

  deterministic: bool = True

  def __call__(self, x: jnp.ndarray, _: Any) -> tuple[jnp.ndarray, None]:
    return super().__call__(x, self.deterministic), None


class Encoder(nn.Module):
  """Position embedding, `num_layers` blocks, final LayerNorm (`Transformer` in the tree).

  `scan_layers=True` runs the blocks as one `nn.scan` over stacked parameters
  (`encoderblock/...` with a leading layer axis; convert with `stack_encoder_blocks` and
  `unstack_encoder_blocks`): deep models compile faster, and rematerialisation inside the
  scan frees each block's activations on every backend. Unrolled, XLA on CPU schedules the
  recomputation so that it saves no memory (ViT-L/16: the same compiled memory with and
  without remat).
  """

  num_layers: int
  mlp_dim: int
  num_heads: int
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  attention_impl: str = 'xla'
  remat_policy: str = 'none'
  scan_layers: bool = False
  learned_posemb: bool = True  # False: the caller added a fixed one (sincos2d)
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jnp.ndarray, *, train: bool) -> jnp.ndarray:
    if self.remat_policy not in REMAT_POLICIES:
      raise ValueError(
        f'remat_policy={self.remat_policy!r}; expected one of {list(REMAT_POLICIES)}'
      )
    block_args = {
      'mlp_dim': self.mlp_dim,
      'num_heads': self.num_heads,
      'dropout_rate': self.dropout_rate,
      'attention_dropout_rate': self.attention_dropout_rate,
      'attention_impl': self.attention_impl,
      'dtype': self.dtype,
      'param_dtype': self.param_dtype,
    }
    policy = REMAT_POLICIES[self.remat_policy]
    if self.learned_posemb:
      x = AddPositionEmbs(param_dtype=self.param_dtype, name='posembed_input')(x)
    x = nn.Dropout(rate=self.dropout_rate)(x, deterministic=not train)
    if self.scan_layers:
      body = _ScanBlock
      if self.remat_policy != 'none':
        body = nn.remat(_ScanBlock, policy=policy, prevent_cse=False)
      x, _ = nn.scan(
        body,
        variable_axes={'params': 0, 'intermediates': 0},
        split_rngs={'params': True, 'dropout': True},
        length=self.num_layers,
      )(**block_args, deterministic=not train, name='encoderblock')(x, None)
    else:
      block = Encoder1DBlock
      if self.remat_policy != 'none':
        # Argument 2 (counting self) is `deterministic`, a Python bool.
        block = nn.remat(Encoder1DBlock, policy=policy, static_argnums=(2,))
      for i in range(self.num_layers):
        x = block(**block_args, name=f'encoderblock_{i}')(x, not train)
    return nn.LayerNorm(
      epsilon=1e-6,
      dtype=_elementwise_dtype(self.dtype),
      param_dtype=self.param_dtype,
      name='encoder_norm',
    )(x)


class MAPHead(nn.Module):
  """Multihead attention pooling (big_vision `MAPHead`): a learned probe token attends over
  the encoder's tokens (no LayerNorm first), then y + MLP(LN(y)); returns the probe (batch, D).
  """

  num_heads: int
  mlp_dim: int
  attention_impl: str = 'xla'
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    n, _, d = x.shape
    probe = self.param('probe', nn.initializers.xavier_uniform(), (1, 1, d), self.param_dtype)
    probe = jnp.tile(probe.astype(x.dtype), (n, 1, 1))
    y = MultiHeadDotProductAttention(
      num_heads=self.num_heads,
      attention_impl=self.attention_impl,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      name='MultiHeadDotProductAttention_0',
    )(probe, True, kv=x)
    z = layer_norm('LayerNorm_0', self.dtype, self.param_dtype)(y)
    mlp = MlpBlock(self.mlp_dim, dtype=self.dtype, param_dtype=self.param_dtype, name='MlpBlock_0')
    return (y + mlp(z, deterministic=True))[:, 0]


class VisionTransformer(nn.Module):
  """ViT and the ResNet+ViT hybrids; the fields are the registry's config fields.

  Attributes:
    num_classes: head width; 0 or None leaves the head out (features only).
    patches: {'size': (ph, pw)}, the patch size on the image, or on the ResNet feature map.
    transformer: {'num_layers', 'mlp_dim', 'num_heads', 'dropout_rate',
      'attention_dropout_rate'}; None gives the patch embedding alone.
    hidden_size: D, the token width.
    resnet: {'num_layers': units per stage, 'width_factor'} for hybrids, else None.
    representation_size: width of the `pre_logits` Dense + tanh layer, or None.
    classifier: 'token' (class token), 'gap' (mean of tokens), 'map' (big_vision's
      attention pooling, `MAPHead_0`), 'unpooled' or 'token_unpooled' (return every token,
      with or without a class token). Only 'token' and 'token_unpooled' add a class token.
    posemb: 'learn' (the learned `Transformer/posembed_input`) or 'sincos2d' (big_vision's
      fixed 2-D sin-cos embedding, no parameter, added to the patch tokens before any class
      token is prepended, as big_vision does).
    distilled: DeiT's distillation token `dist_token` after `cls` (the position embedding
      covers both) and a second head `head_dist` on it; needs classifier='token'. The output
      is the mean of the two heads' logits, as DeiT predicts; `both_heads=True` at call time
      returns the pair (class head, distillation head) for a distillation loss
      (`vit_jax.losses`). Without a head: the mean of the two tokens' features (with
      `both_heads=True` the pair, the inputs of the two heads).
    head_bias_init: constant initial bias of the head (the paper's -10 for pretraining).
    dtype: compute dtype. 16-bit dtypes (bfloat16) multiply 16-bit operands with float32
      accumulation (forward and backward, `mixed_einsum`); norms, softmax, GELU, residuals
      and the patch embedding stay float32, parameters stay in `param_dtype`.
    attention_impl: 'xla' (explicit einsum softmax) or 'fused' (jax.nn.dot_product_attention).
    remat_policy: rematerialise each encoder block: 'none', 'full', 'dots', 'dots_saveable'.
    scan_layers: run the encoder blocks as one `nn.scan` over stacked parameters
      (`Transformer/encoderblock/...`, leading axis = layer). Convert the released layout
      with `stack_encoder_blocks` (and back with `unstack_encoder_blocks`).
  """

  num_classes: int | None
  patches: Mapping[str, Any]
  transformer: Mapping[str, Any] | None
  hidden_size: int
  resnet: Mapping[str, Any] | None = None
  representation_size: int | None = None
  classifier: str = 'token'
  head_bias_init: float = 0.0
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  attention_impl: str = 'xla'
  remat_policy: str = 'none'
  scan_layers: bool = False
  posemb: str = 'learn'
  distilled: bool = False

  def _check_options(self, both_heads: bool) -> None:
    if self.classifier not in CLASSIFIERS:
      raise ValueError(f'classifier={self.classifier!r}; expected one of {CLASSIFIERS}')
    if self.posemb not in POSEMBS:
      raise ValueError(f'posemb={self.posemb!r}; expected one of {POSEMBS}')
    if self.distilled and (self.classifier != 'token' or self.representation_size is not None):
      raise ValueError(
        f"distilled=True needs classifier='token' and no representation_size; got"
        f' classifier={self.classifier!r}, representation_size={self.representation_size}'
      )
    if self.transformer is None and (self.distilled or self.classifier == 'map'):
      raise ValueError("distilled=True and classifier='map' need a transformer (it is None)")
    if both_heads and not self.distilled:
      raise ValueError('both_heads=True needs a distilled model (distilled=True)')

  def _prepend_tokens(self, x: jnp.ndarray) -> jnp.ndarray:
    """[cls, dist_token, patches], as many of the first two as the options ask for."""
    n, _, c = x.shape
    inits = {'cls': nn.initializers.zeros} if self.classifier in ('token', 'token_unpooled') else {}
    if self.distilled:
      inits['dist_token'] = nn.initializers.normal(stddev=0.02)  # DeiT: truncated normal 0.02
    tokens = [self.param(k, init, (1, 1, c), self.param_dtype) for k, init in inits.items()]
    tokens = [jnp.tile(t.astype(x.dtype), (n, 1, 1)) for t in tokens]
    return jnp.concatenate([*tokens, x], axis=1)

  def _pool(self, x: jnp.ndarray) -> jnp.ndarray:
    """The encoder's tokens -> the head's input, per `classifier` ('unpooled': unchanged)."""
    if self.classifier == 'token':
      return x[:, 0]
    if self.classifier == 'gap':
      return jnp.mean(x, axis=tuple(range(1, x.ndim - 1)))
    if self.classifier == 'map':
      return MAPHead(
        num_heads=self.transformer['num_heads'],
        mlp_dim=self.transformer['mlp_dim'],
        attention_impl=self.attention_impl,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        name='MAPHead_0',
      )(x)
    return x

  def _head(self, x: jnp.ndarray, name: str = 'head') -> jnp.ndarray:
    return nn.Dense(
      self.num_classes,
      **_matmul_kwargs(self.dtype, self.param_dtype),
      kernel_init=nn.initializers.zeros,
      bias_init=nn.initializers.constant(self.head_bias_init),
      name=name,
    )(x)

  def _distilled_output(self, x: jnp.ndarray, both_heads: bool) -> Any:
    """DeiT: the class token's head and the distillation token's head (or their mean)."""
    x_cls, x_dist = x[:, 0], x[:, 1]
    if not self.num_classes:  # the features each head reads, or their mean
      pair = (x_cls.astype(jnp.float32), x_dist.astype(jnp.float32))
      return pair if both_heads else (pair[0] + pair[1]) / 2
    logits = self._head(x_cls).astype(jnp.float32)
    logits_dist = self._head(x_dist, 'head_dist').astype(jnp.float32)
    return (logits, logits_dist) if both_heads else (logits + logits_dist) / 2

  @nn.compact
  def __call__(self, inputs: jnp.ndarray, *, train: bool, both_heads: bool = False) -> Any:
    """Maps NHWC images in [-1, 1] to logits (float32), or to features without a head.

    `both_heads=True` (distilled models only): the pair (class-head, distillation-head) logits,
    or without a head the pair of features they read.
    """
    self._check_options(both_heads)
    # On the mixed-precision path the patch embedding (0.3% of the FLOPs) runs in float32.
    x = inputs.astype(self.dtype if self.resnet is not None else _elementwise_dtype(self.dtype))
    if self.resnet is not None:
      x = resnet.resnet_stem(
        x, self.resnet['num_layers'], self.resnet['width_factor'], self.dtype, self.param_dtype
      )

    patch = tuple(self.patches['size'])
    x = nn.Conv(
      features=self.hidden_size,
      kernel_size=patch,
      strides=patch,
      padding='VALID',
      dtype=_elementwise_dtype(self.dtype),
      param_dtype=self.param_dtype,
      name='embedding',
    )(x)

    if self.transformer is not None:
      n, h, w, c = x.shape
      x = jnp.reshape(x, (n, h * w, c))
      if self.posemb == 'sincos2d':
        x = x + posemb_sincos_2d(h, w, c, dtype=x.dtype)
      x = self._prepend_tokens(x)
      x = Encoder(
        **self.transformer,
        attention_impl=self.attention_impl,
        remat_policy=self.remat_policy,
        scan_layers=self.scan_layers,
        learned_posemb=self.posemb == 'learn',
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        name='Transformer',
      )(x, train=train)

    if self.distilled:
      return self._distilled_output(x, both_heads)
    x = self._pool(x)
    if self.representation_size is not None:
      x = nn.Dense(
        self.representation_size,
        **_matmul_kwargs(self.dtype, self.param_dtype),
        name='pre_logits',
      )(x)
      x = jnp.tanh(x)

    if self.num_classes:
      x = self._head(x)
    return x.astype(jnp.float32)


def _blocks_of(transformer: Mapping[str, Any]) -> list[str]:
  names = [k for k in transformer if re.fullmatch(r'encoderblock_\d+', k)]
  return sorted(names, key=lambda k: int(k.rsplit('_', 1)[1]))


def stack_encoder_blocks(params: Mapping[str, Any]) -> dict[str, Any]:
  """Released layout -> `scan_layers=True` layout: `encoderblock_{i}` stacked on axis 0."""
  transformer = dict(params['Transformer'])
  if 'encoderblock' in transformer:
    raise ValueError('params are already stacked (Transformer/encoderblock exists)')
  names = _blocks_of(transformer)
  if [int(n.rsplit('_', 1)[1]) for n in names] != list(range(len(names))) or not names:
    raise ValueError(f'expected Transformer/encoderblock_0..N-1; found {names}')
  blocks = [transformer.pop(n) for n in names]
  transformer['encoderblock'] = jax.tree.map(lambda *xs: jnp.stack(xs), *blocks)
  return {**params, 'Transformer': transformer}


def unstack_encoder_blocks(params: Mapping[str, Any]) -> dict[str, Any]:
  """`scan_layers=True` layout -> the released layout with `encoderblock_{i}`."""
  transformer = dict(params['Transformer'])
  if 'encoderblock' not in transformer:
    raise ValueError('params are not stacked (no Transformer/encoderblock)')
  stacked = transformer.pop('encoderblock')
  num_layers = jax.tree.leaves(stacked)[0].shape[0]
  for i in range(num_layers):
    transformer[f'encoderblock_{i}'] = jax.tree.map(lambda x, i=i: x[i], stacked)
  return {**params, 'Transformer': transformer}

"""Multi-head dot-product attention: the explicit softmax with a FlashAttention-style
backward pass (`attend`), the fused kernel (`fused_attention`), and the released module."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax import parallel
from vit_jax.models import precision
from vit_jax.models.precision import Dtype

ATTENTION_IMPLS = ('xla', 'fused')


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
  return precision.einsum('bhqk,bhkd->bhqd', weights, v, dtype)


def _attention_weights(
  q: jnp.ndarray, k: jnp.ndarray, dtype: Dtype, mask: jnp.ndarray | None = None
) -> jnp.ndarray:
  """softmax(q k^T) over the keys, in float32, heads-major (batch, heads, queries, keys);
  `mask` (batch, keys): the keys to attend to (False: padding, no weight); (batch, queries,
  keys): each query's own keys (packed NaFlex rows: its image's). A query with no key to
  attend to weighs every key alike: finite, never NaN."""
  logits = precision.einsum('bhqd,bhkd->bhqk', q, k, dtype).astype(jnp.float32)
  if mask is not None:
    mask = mask[:, None, None, :] if mask.ndim == 2 else mask[:, None]
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  return jax.nn.softmax(logits)


@attend.defjvp
def _attend_jvp(dtype, primals, tangents):
  (q, k, v), (dq, dk, dv) = primals, tangents
  weights = _attention_weights(q, k, dtype)
  y = precision.einsum('bhqk,bhkd->bhqd', weights.astype(v.dtype), v, dtype)
  dlogits = precision.tangent_einsum('bhqd,bhkd->bhqk', dq, k, dtype)
  dlogits += precision.tangent_einsum('bhqd,bhkd->bhqk', q, dk, dtype)
  scaled = weights * dlogits.astype(jnp.float32)  # W * dL, the tangent of W before the centring
  dy = precision.tangent_einsum('bhqk,bhkd->bhqd', scaled.astype(v.dtype), v, dtype)
  dy -= y * jnp.sum(scaled, axis=-1, keepdims=True).astype(y.dtype)
  dy += precision.tangent_einsum('bhqk,bhkd->bhqd', weights.astype(v.dtype), dv, dtype)
  return y, dy.astype(y.dtype)


# cuDNN's flash attention (fused forward and backward) takes sequence lengths that are
# multiples of 64 in training; other lengths are padded to one inside the attention call.
CUDNN_BLOCK = 64


def padded_attention(
  q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, multiple: int, implementation: str | None
) -> jnp.ndarray:
  """`jax.nn.dot_product_attention` with the tokens zero-padded to a multiple of `multiple`
  and the padding masked by sequence lengths (cuDNN's padding mask, no bias tensor): the
  padded keys get no weight, the padded queries are sliced off, so the output and the
  gradients are those of the unpadded call."""
  batch, tokens = q.shape[:2]
  padded = -(-tokens // multiple) * multiple
  widths = ((0, 0), (0, padded - tokens), (0, 0), (0, 0))
  q, k, v = (jnp.pad(t, widths) for t in (q, k, v))
  lengths = jnp.full((batch,), tokens, jnp.int32)
  y = jax.nn.dot_product_attention(
    q,
    k,
    v,
    query_seq_lengths=lengths,
    key_value_seq_lengths=lengths,
    implementation=implementation,
  )
  return y[:, :tokens]


def fused_attention(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray) -> jnp.ndarray:
  """`jax.nn.dot_product_attention` on (batch, tokens, heads, head_dim) arrays: cuDNN's flash
  attention on GPUs where it applies (16-bit inputs, a recent cuDNN), else XLA's. Token
  counts that are not a multiple of `CUDNN_BLOCK` (197 = 14 * 14 + 1) are padded inside the
  call (`padded_attention`), so that training too runs cuDNN's kernels; the MLPs stay at the
  model's own token count.

  jax picks XLA unless asked for cuDNN by name, and cuDNN refuses what it cannot do while
  the call is traced, so asking first and falling back costs nothing at run time.
  """
  if jax.default_backend() == 'gpu' and precision.is_mixed(q.dtype):
    try:
      if q.shape[1] == k.shape[1] and q.shape[1] % CUDNN_BLOCK:  # self-attention
        return padded_attention(q, k, v, CUDNN_BLOCK, 'cudnn')
      return jax.nn.dot_product_attention(q, k, v, implementation='cudnn')
    except (ValueError, NotImplementedError, RuntimeError):
      pass
  return jax.nn.dot_product_attention(q, k, v)


class MultiHeadDotProductAttention(precision.Precision):
  """Self-attention in the released layout: q/k/v (D, heads, head_dim), out (heads, head_dim, D).

  `attention_impl='xla'` spells out softmax(q k^T / sqrt(d)) v; `'fused'` calls
  `fused_attention` (cuDNN flash attention on GPUs where it applies). The
  fused path has no attention dropout, so training with attention dropout takes the
  explicit path.

  ViT-22B's options (Dehghani et al., arXiv:2302.05442, section 2), off by default:
  `qk_norm=True` computes softmax(LN(X W_Q) LN(X W_K)^T / sqrt(d)) (the paper's "QK
  normalization"): `query_norm` and `key_norm`, each of (head_dim,), normalise every head's
  query and key after the projection, before the scaling, on every path (explicit, fused,
  masked). `qkv_bias=False` leaves out the biases of query, key and value, as the paper removes
  them from its QKV projections; `out` keeps its own. `norm_bias=False`: the q/k norms
  "without bias and centering" (`precision.layer_norm`).
  """

  num_heads: int
  dropout_rate: float = 0.0
  attention_impl: str = 'xla'
  qk_norm: bool = False
  qkv_bias: bool = True
  norm_bias: bool = True
  layer_norm_epsilon: float = precision.LAYER_NORM_EPSILON

  @nn.compact
  def __call__(
    self,
    x: jnp.ndarray,
    deterministic: bool,
    kv: jnp.ndarray | None = None,
    mask: jnp.ndarray | None = None,
  ) -> jnp.ndarray:
    """Attention of the queries from `x` over the keys and values from `kv` (default: `x`);
    `mask` (batch, keys): False for padding keys (NaFlex), which get no weight; or (batch,
    queries, keys): False where a query does not attend to a key (packed NaFlex rows, each
    token its own image's). Masked attention takes the explicit softmax under every
    `attention_impl` ('fused' too)."""
    width = x.shape[-1]
    if width % self.num_heads:
      raise ValueError(f'hidden size {width} is not divisible by num_heads={self.num_heads}')
    head_dim = width // self.num_heads
    if self.qk_norm and head_dim < 2:
      raise ValueError(
        f'qk_norm=True normalises each head over its head_dim, here {head_dim}: use fewer heads'
      )
    dense = self.dense_layers(
      nn.DenseGeneral,
      kernel_init=nn.initializers.xavier_uniform(),
    )
    kv = x if kv is None else kv
    q, k, v = (
      dense(features=(self.num_heads, head_dim), use_bias=self.qkv_bias, name=n)(y)
      for n, y in (('query', x), ('key', kv), ('value', kv))
    )  # each (batch, tokens, heads, head_dim)
    q, k, v = (parallel.constrain(t, 'batch', None, 'model', None) for t in (q, k, v))  # heads
    if self.qk_norm:
      q = self.norm('query_norm', self.layer_norm_epsilon, self.norm_bias)(q)
      k = self.norm('key_norm', self.layer_norm_epsilon, self.norm_bias)(k)

    use_dropout = not deterministic and self.dropout_rate > 0
    if self.attention_impl == 'fused' and not use_dropout and mask is None:
      if precision.is_mixed(self.dtype):
        q, k, v = (t.astype(self.dtype) for t in (q, k, v))
      y = fused_attention(q, k, v)
    elif self.attention_impl in ATTENTION_IMPLS:
      # Heads-major (batch, heads, tokens, head_dim): XLA's batched matmuls run ~2x faster
      # on CPU with the batch dimensions leading than with heads between the tokens.
      q, k, v = (jnp.swapaxes(t, 1, 2) for t in (q, k, v))
      q = q / jnp.sqrt(head_dim).astype(q.dtype)
      # Applied with mutable=['intermediates'] (attention maps, rollout), the weights are kept.
      if use_dropout or mask is not None or self.is_mutable_collection('intermediates'):
        weights = _attention_weights(q, k, self.dtype, mask).astype(v.dtype)
        self.sow('intermediates', 'attention_weights', weights)
        weights = nn.Dropout(rate=self.dropout_rate)(weights, deterministic=not use_dropout)
        y = precision.einsum('bhqk,bhkd->bhqd', weights, v, self.dtype)
      else:
        y = attend(q, k, v, self.dtype)
      y = jnp.swapaxes(y, 1, 2).astype(q.dtype)
    else:
      raise ValueError(f'attention_impl={self.attention_impl!r}; expected one of {ATTENTION_IMPLS}')
    return dense(features=width, axis=(-2, -1), name='out')(y)

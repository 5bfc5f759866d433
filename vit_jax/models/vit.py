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
"""

import functools
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.models import resnet

Dtype = Any

CLASSIFIERS = ('token', 'gap', 'unpooled', 'token_unpooled')
ATTENTION_IMPLS = ('xla', 'fused')
# Which activations a rematerialised encoder block keeps for the backward pass.
REMAT_POLICIES = {
  'none': None,  # no rematerialisation
  'full': jax.checkpoint_policies.nothing_saveable,
  'dots': jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
  'dots_saveable': jax.checkpoint_policies.dots_saveable,
}


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
      dtype=self.dtype,
      param_dtype=self.param_dtype,
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
  `jax.nn.dot_product_attention` (cuDNN flash attention on GPUs where it applies). The
  fused path has no attention dropout, so training with attention dropout takes the
  explicit path.
  """

  num_heads: int
  dropout_rate: float = 0.0
  attention_impl: str = 'xla'
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jnp.ndarray, deterministic: bool) -> jnp.ndarray:
    width = x.shape[-1]
    if width % self.num_heads:
      raise ValueError(f'hidden size {width} is not divisible by num_heads={self.num_heads}')
    head_dim = width // self.num_heads
    dense = functools.partial(
      nn.DenseGeneral,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      kernel_init=nn.initializers.xavier_uniform(),
    )
    q, k, v = (
      dense(features=(self.num_heads, head_dim), name=n)(x) for n in ('query', 'key', 'value')
    )  # each (batch, tokens, heads, head_dim)

    use_dropout = not deterministic and self.dropout_rate > 0
    if self.attention_impl == 'fused' and not use_dropout:
      y = jax.nn.dot_product_attention(q, k, v)
    elif self.attention_impl in ATTENTION_IMPLS:
      q = q / jnp.sqrt(head_dim).astype(q.dtype)
      logits = jnp.einsum('bqhd,bkhd->bhqk', q, k, preferred_element_type=jnp.float32)
      weights = jax.nn.softmax(logits).astype(self.dtype)
      # Kept only when applied with mutable=['intermediates'] (attention maps, rollout).
      self.sow('intermediates', 'attention_weights', weights)
      weights = nn.Dropout(rate=self.dropout_rate)(weights, deterministic=not use_dropout)
      y = jnp.einsum('bhqk,bkhd->bqhd', weights, v)
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
      nn.LayerNorm, epsilon=1e-6, dtype=self.dtype, param_dtype=self.param_dtype
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


class Encoder(nn.Module):
  """Position embedding, `num_layers` blocks, final LayerNorm (`Transformer` in the tree)."""

  num_layers: int
  mlp_dim: int
  num_heads: int
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  attention_impl: str = 'xla'
  remat_policy: str = 'none'
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jnp.ndarray, *, train: bool) -> jnp.ndarray:
    if self.remat_policy not in REMAT_POLICIES:
      raise ValueError(
        f'remat_policy={self.remat_policy!r}; expected one of {list(REMAT_POLICIES)}'
      )
    block = Encoder1DBlock
    if self.remat_policy != 'none':
      # Argument 2 (counting self) is `deterministic`, a Python bool.
      block = nn.remat(
        Encoder1DBlock, policy=REMAT_POLICIES[self.remat_policy], static_argnums=(2,)
      )
    x = AddPositionEmbs(param_dtype=self.param_dtype, name='posembed_input')(x)
    x = nn.Dropout(rate=self.dropout_rate)(x, deterministic=not train)
    for i in range(self.num_layers):
      x = block(
        mlp_dim=self.mlp_dim,
        num_heads=self.num_heads,
        dropout_rate=self.dropout_rate,
        attention_dropout_rate=self.attention_dropout_rate,
        attention_impl=self.attention_impl,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        name=f'encoderblock_{i}',
      )(x, not train)
    return nn.LayerNorm(
      epsilon=1e-6, dtype=self.dtype, param_dtype=self.param_dtype, name='encoder_norm'
    )(x)


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
    classifier: 'token' (class token), 'gap' (mean of tokens), 'unpooled' or
      'token_unpooled' (return every token, with or without a class token).
    head_bias_init: constant initial bias of the head (the paper's -10 for pretraining).
    dtype: compute dtype (e.g. bfloat16); parameters stay in `param_dtype`.
    attention_impl: 'xla' (explicit einsum softmax) or 'fused' (jax.nn.dot_product_attention).
    remat_policy: rematerialise each encoder block: 'none', 'full', 'dots', 'dots_saveable'.
  """

  num_classes: int | None
  patches: Mapping[str, Any]
  transformer: Mapping[str, Any] | None
  hidden_size: int
  resnet: Mapping[str, Any] | None = None
  representation_size: int | None = None
  classifier: str = 'token'
  head_bias_init: float = 0.0
  model_name: str | None = None
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  attention_impl: str = 'xla'
  remat_policy: str = 'none'

  @nn.compact
  def __call__(self, inputs: jnp.ndarray, *, train: bool) -> jnp.ndarray:
    """Maps NHWC images in [-1, 1] to logits (float32), or to features without a head."""
    if self.classifier not in CLASSIFIERS:
      raise ValueError(f'classifier={self.classifier!r}; expected one of {CLASSIFIERS}')
    x = inputs.astype(self.dtype)
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
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      name='embedding',
    )(x)

    if self.transformer is not None:
      n, h, w, c = x.shape
      x = jnp.reshape(x, (n, h * w, c))
      if self.classifier in ('token', 'token_unpooled'):
        cls = self.param('cls', nn.initializers.zeros, (1, 1, c), self.param_dtype)
        x = jnp.concatenate([jnp.tile(cls.astype(x.dtype), (n, 1, 1)), x], axis=1)
      x = Encoder(
        **self.transformer,
        attention_impl=self.attention_impl,
        remat_policy=self.remat_policy,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        name='Transformer',
      )(x, train=train)

    if self.classifier == 'token':
      x = x[:, 0]
    elif self.classifier == 'gap':
      x = jnp.mean(x, axis=tuple(range(1, x.ndim - 1)))

    if self.representation_size is not None:
      x = nn.Dense(
        self.representation_size, dtype=self.dtype, param_dtype=self.param_dtype, name='pre_logits'
      )(x)
      x = jnp.tanh(x)

    if self.num_classes:
      x = nn.Dense(
        self.num_classes,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        kernel_init=nn.initializers.zeros,
        bias_init=nn.initializers.constant(self.head_bias_init),
        name='head',
      )(x)
    return x.astype(jnp.float32)

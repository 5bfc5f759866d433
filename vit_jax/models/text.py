"""The text towers of the image-text models: BERT and the simple text transformer.

Both map int32 token ids (batch, length) to `(features, out)`: the pooled features, through a
`head` Dense when `num_classes` is set, and a dict of intermediate values (`transformed`, the
encoder's tokens; `pre_logits`, the pooled ones), as the original LiT towers return them.

`BertTower` is flaxformer's `BertEncoder` (Devlin et al., arXiv:1810.04805) in its parameter
names, the LiT text tower `txt/BertEncoder_0/...` of the original vit_jax `models_lit.py`:

  BertEncoder_0/embedder/embedders_{token_ids,position_ids,segment_ids}/embedding
  BertEncoder_0/layer_norm                     after the summed embeddings
  BertEncoder_0/encoder_block/layer_sequence/layers_{i}/
    attention_block/attention_layer/{query,key,value}   (D, D) kernels, (D,) biases
    attention_block/{dense_layer, layer_norm}            output projection, post-norm
    mlp_block/mlp/dense_layer, mlp_block/{dense_layer, layer_norm}
  head                                         Dense on the first ([CLS]) token

Post-norm blocks: x = LN(x + attn(x)), x = LN(x + mlp(x)); LayerNorm eps 1e-12; the MLP's GELU
is flax's default, the tanh approximation (transformers' `hidden_act='gelu_new'`, the original
BERT code's), or with `gelu_approximate=False` the exact one (transformers' 'gelu'); token id 0
is padding, masked out of every attention (queries and keys, flaxformer's
`make_attention_mask(mask, mask)`).

`TextTransformer` is the original's simple text transformer (and big_vision's
`text_transformer`, the SigLIP text tower): `Embed_0`, a learned `pos_embedding` (1, L, width),
the ViT encoder `Encoder_0/encoderblock_{i}` (pre-norm, no padding mask) with its final
`encoder_norm`, the last token's features (sticky end-of-sequence tokenisation puts `</s>`
there), `head`.
"""

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.models import precision
from vit_jax.models.vit import Encoder

POOL_TYPES = ('last', 'first', 'gap', 'max')
# Flaxformer's masked attention logit (`-1e10` added where the mask is 0).
_MASKED = -1e10


_BERT_INIT = nn.initializers.truncated_normal(stddev=0.02)  # flaxformer's kernels


class _Bert(precision.Precision):
  """A BERT layer's precision: its Dense layers (BERT's truncated-normal(0.02) kernel init,
  zero bias), LayerNorms (BERT's epsilon) and activations follow the precision policy, as a
  ViT's do (`vit_jax.models.precision`)."""

  def bert_dense(self, features: int, name: str) -> Any:
    return self.dense_layers(nn.Dense, kernel_init=_BERT_INIT)(features, name=name)

  def bert_norm(self, epsilon: float, name: str) -> nn.LayerNorm:
    return nn.LayerNorm(epsilon=epsilon, dtype=self.activation_dtype(), name=name)


class _Embedder(nn.Module):
  """The sum of the token, position and segment embeddings (flaxformer's `MultiEmbed`)."""

  vocab_size: int
  max_length: int
  num_segments: int
  hidden_size: int

  @nn.compact
  def __call__(self, tokens: jnp.ndarray) -> jnp.ndarray:
    n, length = tokens.shape
    if length > self.max_length:
      raise ValueError(f'{length} tokens; this BERT has {self.max_length} positions')
    embed = functools.partial(nn.Embed, features=self.hidden_size, embedding_init=_BERT_INIT)
    positions = jnp.tile(jnp.arange(length, dtype=jnp.int32), (n, 1))
    segments = jnp.zeros_like(tokens)
    x = embed(self.vocab_size, name='embedders_token_ids')(tokens)
    x += embed(self.max_length, name='embedders_position_ids')(positions)
    return x + embed(self.num_segments, name='embedders_segment_ids')(segments)


class _SelfAttention(_Bert):
  """q, k, v as (D, D) Dense layers split into heads; softmax(q k^T / sqrt(d) + mask) v."""

  num_heads: int
  dropout_rate: float

  @nn.compact
  def __call__(self, x: jnp.ndarray, bias: jnp.ndarray, deterministic: bool) -> jnp.ndarray:
    n, length, width = x.shape
    if width % self.num_heads:
      raise ValueError(f'hidden size {width} is not divisible by num_heads={self.num_heads}')
    head_dim = width // self.num_heads
    q, k, v = (
      self.bert_dense(width, name)(x).reshape(n, length, self.num_heads, head_dim)
      for name in ('query', 'key', 'value')
    )
    q = q / jnp.sqrt(head_dim).astype(q.dtype)
    scores = precision.einsum('bqhd,bkhd->bhqk', q, k, self.dtype)
    weights = jax.nn.softmax(scores.astype(jnp.float32) + bias).astype(self.activation_dtype())
    weights = nn.Dropout(self.dropout_rate)(weights, deterministic=deterministic)
    out = precision.einsum('bhqk,bkhd->bqhd', weights, v, self.dtype)
    return out.astype(self.activation_dtype()).reshape(n, length, width)


class _AttentionBlock(_Bert):
  """LN(x + dense(attention(x)))."""

  num_heads: int
  dropout_rate: float
  layer_norm_epsilon: float

  @nn.compact
  def __call__(self, x: jnp.ndarray, bias: jnp.ndarray, deterministic: bool) -> jnp.ndarray:
    attention = _SelfAttention(
      self.num_heads, self.dropout_rate, **self.precision_fields(), name='attention_layer'
    )
    y = self.bert_dense(x.shape[-1], 'dense_layer')(attention(x, bias, deterministic))
    y = nn.Dropout(self.dropout_rate)(y, deterministic=deterministic)
    return self.bert_norm(self.layer_norm_epsilon, 'layer_norm')(x + y)


class _MlpBlock(_Bert):
  """LN(x + dense(gelu(mlp(x)))), the tanh GELU unless `gelu_approximate=False`."""

  mlp_dim: int
  dropout_rate: float
  layer_norm_epsilon: float
  gelu_approximate: bool

  @nn.compact
  def __call__(self, x: jnp.ndarray, deterministic: bool) -> jnp.ndarray:
    mlp = _Mlp(self.mlp_dim, self.gelu_approximate, **self.precision_fields(), name='mlp')
    y = mlp(x)
    y = self.bert_dense(x.shape[-1], 'dense_layer')(y)
    # flaxformer drops whole feature vectors here (broadcast over the sequence).
    y = nn.Dropout(self.dropout_rate, broadcast_dims=(-2,))(y, deterministic=deterministic)
    return self.bert_norm(self.layer_norm_epsilon, 'layer_norm')(x + y)


class _Mlp(_Bert):
  mlp_dim: int
  gelu_approximate: bool

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    y = self.bert_dense(self.mlp_dim, 'dense_layer')(x)
    return nn.gelu(y, approximate=self.gelu_approximate)


class _Layer(_Bert):
  """One BERT layer: the attention block, then the MLP block."""

  mlp_dim: int
  num_heads: int
  dropout_rate: float
  layer_norm_epsilon: float
  gelu_approximate: bool

  @nn.compact
  def __call__(self, x: jnp.ndarray, bias: jnp.ndarray, deterministic: bool) -> jnp.ndarray:
    common = {'dropout_rate': self.dropout_rate, 'layer_norm_epsilon': self.layer_norm_epsilon}
    common |= self.precision_fields()
    x = _AttentionBlock(self.num_heads, **common, name='attention_block')(x, bias, deterministic)
    mlp = _MlpBlock(
      self.mlp_dim, **common, gelu_approximate=self.gelu_approximate, name='mlp_block'
    )
    return mlp(x, deterministic)


class _LayerSequence(nn.Module):
  layers: Mapping[str, Any]
  num_layers: int

  @nn.compact
  def __call__(self, x: jnp.ndarray, bias: jnp.ndarray, deterministic: bool) -> jnp.ndarray:
    for i in range(self.num_layers):
      x = _Layer(**self.layers, name=f'layers_{i}')(x, bias, deterministic)
    return x


class _EncoderBlock(nn.Module):
  layers: Mapping[str, Any]
  num_layers: int

  @nn.compact
  def __call__(self, x: jnp.ndarray, bias: jnp.ndarray, deterministic: bool) -> jnp.ndarray:
    return _LayerSequence(self.layers, self.num_layers, name='layer_sequence')(
      x, bias, deterministic
    )


class BertEncoder(_Bert):
  """flaxformer's `BertEncoder`: embeddings, LayerNorm, post-norm layers; (B, L) -> (B, L, D)."""

  hidden_size: int
  num_layers: int
  num_heads: int
  mlp_dim: int
  vocab_size: int
  max_length: int
  num_segments: int
  dropout_rate: float
  layer_norm_epsilon: float
  gelu_approximate: bool

  @nn.compact
  def __call__(self, tokens: jnp.ndarray, *, train: bool) -> jnp.ndarray:
    sizes = (self.vocab_size, self.max_length, self.num_segments, self.hidden_size)
    x = _Embedder(*sizes, name='embedder')(tokens)
    x = self.bert_norm(self.layer_norm_epsilon, 'layer_norm')(x)
    x = nn.Dropout(self.dropout_rate)(x, deterministic=not train)
    mask = tokens != 0
    bias = jnp.where(mask[:, None, :, None] & mask[:, None, None, :], 0.0, _MASKED)
    layers = {
      'mlp_dim': self.mlp_dim,
      'num_heads': self.num_heads,
      'dropout_rate': self.dropout_rate,
      'layer_norm_epsilon': self.layer_norm_epsilon,
      'gelu_approximate': self.gelu_approximate,
      **self.precision_fields(),
    }
    block = _EncoderBlock(layers, self.num_layers, name='encoder_block')
    return block(x, bias.astype(jnp.float32), not train)


class BertTower(precision.Precision):
  """The LiT BERT text tower: `BertEncoder_0`, the [CLS] (first) token, an optional `head`.

  Attributes:
    num_classes: width of the `head` Dense on the pooled token; None leaves it out.
    hidden_size, num_layers, num_heads, mlp_dim: the encoder (BERT-base: 768, 12, 12, 3072;
      BERT-large: 1024, 24, 16, 4096).
    vocab_size, max_length, num_segments: the rows of the token, position and segment
      (token type) embeddings (BERT's 30,522, 512 and 2).
    dropout_rate: dropout after the embeddings, on the attention weights and after each
      block's projection, in training (the released towers: 0.1 while trained; LiT's call
      runs without).
    layer_norm_epsilon: 1e-12, BERT's.
    gelu_approximate: True (default): the tanh approximation of the GELU, flaxformer's and
      the original BERT code's (LiT's towers); False: the exact one, which transformers'
      `hidden_act='gelu'` computes (bert-base-uncased's config.json).
    dtype, param_dtype, precision_policy: as a ViT's (`vit_jax.models.precision`): a 16-bit
      dtype multiplies 16-bit operands with float32 sums; under 'matmul' norms, GELU and
      the residual stream stay float32, under 'activations' they are 16-bit too; the
      softmax and LayerNorm statistics are float32 under both.
  """

  num_classes: int | None = None
  hidden_size: int = 768
  num_layers: int = 12
  num_heads: int = 12
  mlp_dim: int = 3072
  vocab_size: int = 30_522
  max_length: int = 512
  num_segments: int = 2
  dropout_rate: float = 0.0
  layer_norm_epsilon: float = 1e-12
  gelu_approximate: bool = True

  @nn.compact
  def __call__(self, tokens: jnp.ndarray, *, train: bool = False) -> tuple[jnp.ndarray, dict]:
    # The encoder's fields are this tower's, but for the head.
    fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(BertEncoder) if f.init}
    del fields['parent'], fields['name']
    x = BertEncoder(**fields, name='BertEncoder_0')(tokens, train=train)
    out = {'transformed': x}
    x = out['pre_logits'] = x[:, 0]
    if self.num_classes:
      x = out['logits'] = nn.Dense(self.num_classes, name='head')(x)
    return x.astype(jnp.float32), out


class TextTransformer(precision.Precision):
  """The simple text transformer: token and learned position embeddings, the ViT encoder, a
  pooled token, an optional `head`.

  Attributes:
    num_classes: width of the `head` Dense; None leaves it out.
    width, num_layers, mlp_dim, num_heads: the encoder (LiT-L16S: 384, 12, 1536, 6).
    vocab_size: rows of `Embed_0` (LiT: 16,000; SigLIP: 32,000).
    dropout_rate: dropout in the encoder, in training.
    pool_type: 'last' (the token the sticky `</s>` tokenisation puts last; LiT, SigLIP),
      'first', 'gap' (mean) or 'max'.
    dtype, param_dtype, precision_policy, attention_impl, remat_policy, scan_layers: the ViT
      encoder's options (`vit_jax.models.vit.Encoder`); `scan_layers=True` stacks the
      blocks as `Encoder_0/encoderblock/...`, big_vision's scanned layout.
    layer_norm_epsilon: its LayerNorms' (1e-6, big_vision's; a Hugging Face SigLIP file's
      `text_config.layer_norm_eps`).
  """

  num_classes: int | None = None
  width: int = 512
  num_layers: int = 12
  mlp_dim: int = 2048
  num_heads: int = 8
  vocab_size: int = 32_000
  dropout_rate: float = 0.0
  pool_type: str = 'last'
  attention_impl: str = 'xla'
  remat_policy: str = 'none'
  scan_layers: bool = False
  layer_norm_epsilon: float = precision.LAYER_NORM_EPSILON

  @nn.compact
  def __call__(self, tokens: jnp.ndarray, *, train: bool = False) -> tuple[jnp.ndarray, dict]:
    if self.pool_type not in POOL_TYPES:
      raise ValueError(f'pool_type={self.pool_type!r}; expected one of {POOL_TYPES}')
    x = nn.Embed(self.vocab_size, self.width, name='Embed_0')(tokens)
    _, length, d = x.shape
    init = nn.initializers.normal(stddev=1 / jnp.sqrt(d))
    x = x + self.param('pos_embedding', init, (1, length, d), jnp.float32)
    x, _ = Encoder(
      num_layers=self.num_layers,
      mlp_dim=self.mlp_dim,
      num_heads=self.num_heads,
      dropout_rate=self.dropout_rate,
      attention_dropout_rate=0.0,
      attention_impl=self.attention_impl,
      remat_policy=self.remat_policy,
      scan_layers=self.scan_layers,
      learned_posemb=False,
      layer_norm_epsilon=self.layer_norm_epsilon,
      **self.precision_fields(),
      name='Encoder_0',
    )(x, train=train)
    out = {'transformed': x}
    x = out['pre_logits'] = pool(x, self.pool_type)
    if self.num_classes:
      x = out['logits'] = nn.Dense(self.num_classes, name='head')(x)
    return x.astype(jnp.float32), out


def pool(x: jnp.ndarray, pool_type: str) -> jnp.ndarray:
  """(batch, length, D) -> (batch, D) by `pool_type` (`POOL_TYPES`)."""
  if pool_type == 'last':
    return x[:, -1]
  if pool_type == 'first':
    return x[:, 0]
  return x.mean(axis=1) if pool_type == 'gap' else x.max(axis=1)


TEXT_MODELS: dict[str, type[nn.Module]] = {'bert': BertTower, 'text_transformer': TextTransformer}

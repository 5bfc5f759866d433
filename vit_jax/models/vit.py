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
  head                                   zero-initialised classifier (`head_zeroinit`)

Options beyond the original, with the names of the checkpoints that use them:

  dist_token, head_dist                  DeiT's distillation token and its head
                                         (`distilled=True`; Touvron et al., arXiv:2012.12877)
  MAPHead_0/{probe, MultiHeadDotProductAttention_0, LayerNorm_0, MlpBlock_0}
                                         big_vision's attention pooling (`classifier='map'`)
  (no position-embedding parameter)      big_vision's fixed 2-D sin-cos (`posemb='sincos2d'`)

ViT-22B's block (Dehghani et al., arXiv:2302.05442, section 2), fields of `transformer`, all
off by default (`BLOCK_OPTIONS`; off, the tree and the computation are the released ones):

  parallel_block=True   "Parallel layers": y' = LayerNorm(x), y = x + MLP(y') + Attention(y'),
                        one LayerNorm_0 per block, no LayerNorm_1
  qk_norm=True          "QK normalization", LayerNorm on the queries and keys before the dot
                        product, softmax(LN(X W_Q) LN(X W_K)^T / sqrt(d)):
                        MultiHeadDotProductAttention_0/{query_norm, key_norm}, (head_dim,) each
  qkv_bias=False        no query/key/value biases (removed from the QKV projections, following
                        PaLM); out and the MLP keep theirs (unlike PaLM, the paper keeps the
                        MLP's, having "observed improved quality and no speed reduction")
  norm_bias=False       every LayerNorm of the encoder (blocks, q/k norms, encoder_norm)
                        "without bias and centering" (Zhang & Sennrich's RMSNorm), `scale` only

The paper fuses the parallel block's matmuls (query/key/value with the MLP's first layer, the
attention out-projection with its second); the tree keeps them apart, in the released names.
A file with a fused in-projection of (D, mlp_dim + 3D) (timm's ParallelScalingBlock
`in_proj`: MLP, q, k, v in that order) maps by splitting it along its output dimension into
MlpBlock_0/Dense_0 and query, key, value (each reshaped to (D, heads, head_dim)); a fused
out-projection of (D + mlp_dim, D) (attention first) splits along its input into out
((heads, head_dim, D)) and MlpBlock_0/Dense_1, and its one bias is the sum of theirs (put it
in one, zeros in the other). `tests/test_vit22b.py` maps timm's blocks so.
"""

from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax import parallel
from vit_jax.models import precision, resnet
from vit_jax.models.attention import MultiHeadDotProductAttention
from vit_jax.models.blocks import block_indices
from vit_jax.models.posemb import AddPositionEmbs, posemb_sincos_2d

CLASSIFIERS = ('token', 'gap', 'map', 'unpooled', 'token_unpooled')
# ViT-22B's options of the encoder blocks (see the module docstring), at their defaults: the
# original ViT's block.
BLOCK_OPTIONS = {'parallel_block': False, 'qk_norm': False, 'qkv_bias': True, 'norm_bias': True}
POSEMBS = ('learn', 'sincos2d')
# Which activations a rematerialised encoder block keeps for the backward pass.
REMAT_POLICIES = {
  'none': None,  # no rematerialisation
  'full': jax.checkpoint_policies.nothing_saveable,
  'dots': jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
  'dots_saveable': jax.checkpoint_policies.dots_saveable,
}


class MlpBlock(precision.Precision):
  """Dense, GELU, Dense. The GELU is the tanh approximation the released weights were trained
  with, or with `gelu_approximate=False` the exact one (PyTorch's, timm's default)."""

  mlp_dim: int
  dropout_rate: float = 0.0
  gelu_approximate: bool = True

  @nn.compact
  def __call__(self, x: jnp.ndarray, deterministic: bool) -> jnp.ndarray:
    dense = self.dense_layers(
      nn.Dense,
      kernel_init=nn.initializers.xavier_uniform(),
      bias_init=nn.initializers.normal(stddev=1e-6),
    )
    out_dim = x.shape[-1]
    x = nn.gelu(dense(self.mlp_dim, name='Dense_0')(x), approximate=self.gelu_approximate)
    x = parallel.constrain(x, 'batch', None, 'model')  # hidden units: tensor-parallel
    x = nn.Dropout(rate=self.dropout_rate)(x, deterministic=deterministic)
    x = dense(out_dim, name='Dense_1')(x)
    return nn.Dropout(rate=self.dropout_rate)(x, deterministic=deterministic)


class DropPath(nn.Module):
  """Stochastic depth (Huang et al., 2016): each example's residual branch is dropped with
  probability `rate` and scaled by 1 / (1 - rate) when kept, as in DeiT and timm. One draw
  per example from the 'dropout' rng. A module (without parameters) so that
  `capture_intermediates` shows each branch after the drop."""

  @nn.compact
  def __call__(self, y: jnp.ndarray, rate: jnp.ndarray) -> jnp.ndarray:
    keep = 1.0 - rate
    shape = (y.shape[0],) + (1,) * (y.ndim - 1)
    mask = jax.random.bernoulli(self.make_rng('dropout'), keep, shape)
    return jnp.where(mask, y / keep, jnp.zeros_like(y))


def _drop_path(y: jnp.ndarray, rate: float | jnp.ndarray, deterministic: bool) -> jnp.ndarray:
  """`DropPath` in training with a rate that may be non-zero (a traced rate may be)."""
  if deterministic or (isinstance(rate, float) and rate == 0.0):
    return y
  return DropPath()(y, rate)


def drop_path_rates(rate: float, num_layers: int) -> list[float]:
  """The linear rule of DeiT and timm: block i of L drops with rate * i / (L - 1)."""
  return [rate * i / max(num_layers - 1, 1) for i in range(num_layers)]


class Encoder1DBlock(precision.Precision):
  """Pre-norm transformer block: x + attn(LN(x)), then x + mlp(LN(x)); with `drop_path_rate`
  each branch is dropped per example (stochastic depth) in training. `parallel_block=True`:
  x + attn(LN(x)) + mlp(LN(x)), each branch dropped alike; `qk_norm`, `qkv_bias`, `norm_bias`:
  ViT-22B's options (module docstring)."""

  mlp_dim: int
  num_heads: int
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  drop_path_rate: float = 0.0
  attention_impl: str = 'xla'
  gelu_approximate: bool = True
  layer_norm_epsilon: float = precision.LAYER_NORM_EPSILON
  parallel_block: bool = False
  qk_norm: bool = False
  qkv_bias: bool = True
  norm_bias: bool = True

  @nn.compact
  def __call__(
    self,
    x: jnp.ndarray,
    deterministic: bool,
    drop_path_rate: jnp.ndarray | None = None,
    mask: jnp.ndarray | None = None,
    queries: int | None = None,
  ) -> jnp.ndarray:
    # `drop_path_rate` as an argument: the rate of this layer inside `nn.scan` (traced).
    # `mask` (batch, tokens): False for padding tokens, which no token attends to.
    # `queries`: only the first this many tokens come out, attending over all of them.
    rate = self.drop_path_rate if drop_path_rate is None else drop_path_rate
    x = parallel.constrain(x, 'batch', None, None)  # the residual stream: whole on each model group
    y = self.norm('LayerNorm_0', self.layer_norm_epsilon, self.norm_bias)(x)
    kv = None if queries is None else y
    x, y = (x, y) if queries is None else (x[:, :queries], y[:, :queries])
    attended = MultiHeadDotProductAttention(
      num_heads=self.num_heads,
      dropout_rate=self.attention_dropout_rate,
      attention_impl=self.attention_impl,
      qk_norm=self.qk_norm,
      qkv_bias=self.qkv_bias,
      norm_bias=self.norm_bias,
      layer_norm_epsilon=self.layer_norm_epsilon,
      **self.precision_fields(),
      name='MultiHeadDotProductAttention_0',
    )(y, deterministic, kv=kv, mask=mask)
    attended = nn.Dropout(rate=self.dropout_rate)(attended, deterministic=deterministic)
    x = x + _drop_path(attended, rate, deterministic)
    if not self.parallel_block:  # parallel: the MLP too reads LN_0 of the block's input
      y = self.norm('LayerNorm_1', self.layer_norm_epsilon, self.norm_bias)(x)
    y = MlpBlock(
      mlp_dim=self.mlp_dim,
      dropout_rate=self.dropout_rate,
      gelu_approximate=self.gelu_approximate,
      **self.precision_fields(),
      name='MlpBlock_0',
    )(y, deterministic)
    return x + _drop_path(y, rate, deterministic)


class _ScanBlock(Encoder1DBlock):
  """An encoder block as the body of `nn.scan`: (x, this layer's drop-path rate or None) ->
  (block(x), None), or with `emit=True` (block(x), block(x)), so that the scan stacks every
  block's output."""

  deterministic: bool = True
  emit: bool = False

  def __call__(
    self, x: jnp.ndarray, rate: jnp.ndarray | None, mask: jnp.ndarray | None = None
  ) -> tuple[jnp.ndarray, jnp.ndarray | None]:
    x = super().__call__(x, self.deterministic, rate, mask)
    return x, (x if self.emit else None)


class Encoder(precision.Precision):
  """Position embedding, `num_layers` blocks, final LayerNorm (`Transformer` in the tree).

  `scan_layers=True` runs the blocks as one `nn.scan` over stacked parameters
  (`encoderblock/...` with a leading layer axis; convert with `blocks.stack_encoder_blocks`
  and `blocks.unstack_encoder_blocks`): deep models compile faster, and rematerialisation inside the
  scan frees each block's activations on every backend. Unrolled, XLA on CPU schedules the
  recomputation so that it saves no memory (ViT-L/16: the same compiled memory with and
  without remat).

  Returns `(encoded, {i: output of block i})` for the blocks `capture` names (see
  `block_indices`; their raw outputs, before the final LayerNorm). Unrolled blocks stop after
  the last one captured, and `encoded` is then None unless it is the last block.

  `output_tokens=n` (unrolled, not training, the last block not captured): `encoded` holds
  only the first n tokens. The last block then computes queries, MLP and norm for those
  alone, its keys and values for all: the same numbers for a class-token readout, ~7% fewer
  FLOPs of ViT-B/16's inference.
  """

  num_layers: int
  mlp_dim: int
  num_heads: int
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  # Stochastic depth of the last block; block i of L drops with rate * i / (L - 1).
  drop_path_rate: float = 0.0
  attention_impl: str = 'xla'
  remat_policy: str = 'none'
  scan_layers: bool = False
  learned_posemb: bool = True  # False: the caller added a fixed one (sincos2d)
  posemb_grid: tuple[int, int] | None = None
  gelu_approximate: bool = True
  layer_norm_epsilon: float = precision.LAYER_NORM_EPSILON
  # ViT-22B's block (`BLOCK_OPTIONS`, module docstring); `norm_bias` is encoder_norm's too.
  parallel_block: bool = False
  qk_norm: bool = False
  qkv_bias: bool = True
  norm_bias: bool = True

  @nn.compact
  def __call__(
    self,
    x: jnp.ndarray,
    *,
    train: bool,
    grid: tuple[int, int] | None = None,
    capture: Sequence[int] | None = None,
    mask: jnp.ndarray | None = None,
    output_tokens: int | None = None,
  ) -> tuple[jnp.ndarray | None, dict[int, jnp.ndarray]]:
    if self.remat_policy not in REMAT_POLICIES:
      raise ValueError(
        f'remat_policy={self.remat_policy!r}; expected one of {list(REMAT_POLICIES)}'
      )
    for option in BLOCK_OPTIONS:
      if not isinstance(getattr(self, option), bool):  # 'False', a string, would be true
        raise ValueError(f'transformer.{option}={getattr(self, option)!r}; give True or False')
    if self.learned_posemb:
      x = AddPositionEmbs(
        param_dtype=self.param_dtype, posemb_grid=self.posemb_grid, name='posembed_input'
      )(x, grid)
    x = nn.Dropout(rate=self.dropout_rate)(x, deterministic=not train)
    capture = () if capture is None else block_indices(capture, self.num_layers)
    prunable = not (train or self.scan_layers or self.num_layers - 1 in capture)
    queries = output_tokens if prunable else None
    x, captured = self._blocks(x, train, capture, mask, queries)
    if capture and max(capture) < self.num_layers - 1:
      return None, captured
    return self.norm('encoder_norm', self.layer_norm_epsilon, self.norm_bias)(x), captured

  def _blocks(
    self,
    x: jnp.ndarray,
    train: bool,
    capture: tuple[int, ...],
    mask: jnp.ndarray | None,
    queries: int | None,
  ) -> tuple[jnp.ndarray, dict[int, jnp.ndarray]]:
    """The encoder blocks (all of them, or up to the last captured), and the captured outputs;
    the last block's output only `queries` tokens long where that is not None."""
    block_args = {
      'mlp_dim': self.mlp_dim,
      'num_heads': self.num_heads,
      'dropout_rate': self.dropout_rate,
      'attention_dropout_rate': self.attention_dropout_rate,
      'attention_impl': self.attention_impl,
      'gelu_approximate': self.gelu_approximate,
      'layer_norm_epsilon': self.layer_norm_epsilon,
      **{option: getattr(self, option) for option in BLOCK_OPTIONS},
      **self.precision_fields(),
    }
    policy = REMAT_POLICIES[self.remat_policy]
    rates = drop_path_rates(self.drop_path_rate, self.num_layers)
    if self.scan_layers:
      body = _ScanBlock
      if self.remat_policy != 'none':
        body = nn.remat(_ScanBlock, policy=policy, prevent_cse=False)
      scanned_rates = jnp.asarray(rates, jnp.float32) if self.drop_path_rate else None
      x, outputs = nn.scan(
        body,
        variable_axes={'params': 0, 'intermediates': 0},
        split_rngs={'params': True, 'dropout': True},
        in_axes=(0, nn.broadcast),
        length=self.num_layers,
      )(
        **block_args, deterministic=not train, emit=bool(capture), name='encoderblock'
      )(x, scanned_rates, mask)
      return x, {i: outputs[i] for i in capture}
    block = Encoder1DBlock
    if self.remat_policy != 'none':
      # Arguments 2 and 5 (counting self): `deterministic` and `queries`, Python values.
      block = nn.remat(Encoder1DBlock, policy=policy, static_argnums=(2, 5))
    captured = {}
    for i in range(max(capture, default=self.num_layers - 1) + 1):
      x = block(**block_args, drop_path_rate=rates[i], name=f'encoderblock_{i}')(
        x, not train, None, mask, queries if i == self.num_layers - 1 else None
      )
      if i in capture:
        captured[i] = x
    return x, captured


class MAPHead(precision.Precision):
  """Multihead attention pooling (big_vision `MAPHead`): a learned probe token attends over
  the encoder's tokens (no LayerNorm first), then y + MLP(LN(y)); returns the probe (batch, D).
  With a mask of (batch, probes, tokens) the one probe reads each row's tokens `probes` times,
  each time those of its mask row (packed NaFlex rows: one image's), and returns (batch,
  probes, D).
  """

  num_heads: int
  mlp_dim: int
  attention_impl: str = 'xla'
  gelu_approximate: bool = True
  layer_norm_epsilon: float = precision.LAYER_NORM_EPSILON

  @nn.compact
  def __call__(self, x: jnp.ndarray, mask: jnp.ndarray | None = None) -> jnp.ndarray:
    """`mask` (batch, tokens): False for padding tokens, which the probe does not read;
    (batch, probes, tokens): which tokens each probe reads."""
    n, _, d = x.shape
    per_slot = mask is not None and mask.ndim == 3
    probes = mask.shape[1] if per_slot else 1
    probe = self.param('probe', nn.initializers.xavier_uniform(), (1, 1, d), self.param_dtype)
    probe = jnp.tile(probe.astype(x.dtype), (n, probes, 1))
    y = MultiHeadDotProductAttention(
      num_heads=self.num_heads,
      attention_impl=self.attention_impl,
      **self.precision_fields(),
      name='MultiHeadDotProductAttention_0',
    )(probe, True, kv=x, mask=mask)
    z = self.norm('LayerNorm_0', self.layer_norm_epsilon)(y)
    mlp = MlpBlock(
      self.mlp_dim,
      gelu_approximate=self.gelu_approximate,
      **self.precision_fields(),
      name='MlpBlock_0',
    )
    y = y + mlp(z, deterministic=True)
    return y if per_slot else y[:, 0]


def map_head(tower: Any) -> MAPHead:
  """`MAPHead_0` of an image tower (a ViT, a NaFlex ViT): its encoder's heads and MLP width,
  attention, GELU, LayerNorm epsilon and precision; built inside the tower's compact method,
  as its child."""
  return MAPHead(
    num_heads=tower.transformer['num_heads'],
    mlp_dim=tower.transformer['mlp_dim'],
    attention_impl=tower.attention_impl,
    gelu_approximate=tower.gelu_approximate,
    layer_norm_epsilon=tower.layer_norm_epsilon,
    **tower.precision_fields(),
    name='MAPHead_0',
  )


class VisionTransformer(precision.Precision):
  """ViT and the ResNet+ViT hybrids; the fields are the registry's config fields.

  Attributes:
    num_classes: head width; 0 or None leaves the head out (features only).
    patches: {'size': (ph, pw)}, the patch size on the image, or on the ResNet feature map.
    transformer: {'num_layers', 'mlp_dim', 'num_heads', 'dropout_rate',
      'attention_dropout_rate', optional 'drop_path_rate' (stochastic depth of the last
      block, linear in depth) and ViT-22B's block options 'parallel_block', 'qk_norm',
      'qkv_bias', 'norm_bias' (`BLOCK_OPTIONS`, module docstring)}; None gives the patch
      embedding alone.
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
      (`vit_jax.tasks.distillation_losses`). Without a head: the mean of the two tokens'
      features (with `both_heads=True` the pair, the inputs of the two heads).
    head_bias_init: constant initial bias of the head (the paper's -10 for pretraining).
    head_zeroinit: True (the original's): the head's kernel starts at zero, so a fine-tuned
      classifier starts from uniform predictions; False: LeCun-normal, as big_vision
      initialises an image-text model's image head (a zero head embeds every image at zero).
    dtype: compute dtype. 16-bit dtypes (bfloat16) multiply 16-bit operands with float32
      accumulation (forward and backward, `precision.mixed_einsum`); norms, softmax, GELU, residuals
      and the patch embedding stay float32, parameters stay in `param_dtype`.
    precision_policy: with a 16-bit dtype, 'matmul' (the above) or 'activations' (activations,
      norms' outputs, GELU and the residual stream in `dtype` too; softmax, LayerNorm
      statistics and the logits in float32); see `precision.POLICIES`.
    attention_impl: 'xla' (explicit einsum softmax) or 'fused' (jax.nn.dot_product_attention).
    remat_policy: rematerialise each encoder block: 'none', 'full', 'dots', 'dots_saveable'.
    scan_layers: run the encoder blocks as one `nn.scan` over stacked parameters
      (`Transformer/encoderblock/...`, leading axis = layer). Convert the released layout
      with `blocks.stack_encoder_blocks` (and back with `blocks.unstack_encoder_blocks`).
    posemb_grid: None (default): learned position embeddings have one row per input token, so
      the model runs at the size it was initialised at. (rows, cols): they are stored for
      that patch grid and resized on the fly (`posemb.resize_posemb_grid`, the resize that
      `checkpoint.load_pretrained` applies) to the grid of each input, whose sides must be
      multiples of the patch: a model trained at 224 px with 16-px patches, built with
      `posemb_grid=(14, 14)`, applies to 384x384 or 224x320 images unchanged. (sincos2d
      embeddings are computed for each input's grid anyway.)
    gelu_approximate: True (default): the tanh approximation of the GELU, as the released
      weights were trained (flax's `nn.gelu` default); False: the exact GELU, the default of
      PyTorch, timm and Hugging Face (`hidden_act='gelu'`), for weights trained with it.
    layer_norm_epsilon: the epsilon of every LayerNorm: 1e-6 (default), flax's, as the
      released weights were trained; a Hugging Face file's `layer_norm_eps` (1e-12 in the
      hub's google/vit-* configs) computes as transformers does.

  Called with `intermediate_blocks=(i, j, ...)` (block indices, negative from the end), the
  model returns a dict of features instead of its output, from one forward pass that stops
  after the last block asked for: `embedding` (B, h, w, D), the patch embedding;
  `encoderblock_{i}` (B, h, w, D), the patch tokens after block i, before the final
  LayerNorm (timm's `forward_intermediates`, big_vision's `out['block{i}']`), with
  `encoderblock_{i}/prefix` (B, P, D) holding the P prefix tokens (class, distillation) where
  the model has them. When the last block is asked for, the whole encoder runs, and the dict
  also holds `encoded` (B, h, w, D) (and `encoded/prefix`), the normalised encoder output,
  and `output`, what the call returns without `intermediate_blocks` (the head's logits, or
  the pooled features of a model without a head).
  """

  num_classes: int | None
  patches: Mapping[str, Any]
  transformer: Mapping[str, Any] | None
  hidden_size: int
  resnet: Mapping[str, Any] | None = None
  representation_size: int | None = None
  classifier: str = 'token'
  head_bias_init: float = 0.0
  head_zeroinit: bool = True
  attention_impl: str = 'xla'
  remat_policy: str = 'none'
  scan_layers: bool = False
  posemb: str = 'learn'
  distilled: bool = False
  posemb_grid: tuple[int, int] | None = None
  gelu_approximate: bool = True
  layer_norm_epsilon: float = precision.LAYER_NORM_EPSILON

  def _check_options(self, both_heads: bool, intermediate_blocks: Any) -> None:
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
    if intermediate_blocks is not None and self.transformer is None:
      raise ValueError('intermediate_blocks: this model has no encoder blocks (transformer=None)')

  def _prepend_tokens(self, x: jnp.ndarray) -> jnp.ndarray:
    """[cls, dist_token, patches], as many of the first two as the options ask for."""
    n, _, c = x.shape
    inits = {'cls': nn.initializers.zeros} if self.classifier in ('token', 'token_unpooled') else {}
    if self.distilled:
      inits['dist_token'] = nn.initializers.normal(stddev=0.02)  # DeiT: truncated normal 0.02
    tokens = [self.param(k, init, (1, 1, c), self.param_dtype) for k, init in inits.items()]
    tokens = [jnp.tile(t.astype(x.dtype), (n, 1, 1)) for t in tokens]
    return jnp.concatenate([*tokens, x], axis=1)

  def _read_tokens(self) -> int | None:
    """How many leading tokens the output reads (the class and distillation tokens), or None:
    every token (pooling over all, returned tokens, attention maps being recorded)."""
    if self.classifier != 'token' or self.is_mutable_collection('intermediates'):
      return None
    return 2 if self.distilled else 1

  def _pool(self, x: jnp.ndarray) -> jnp.ndarray:
    """The encoder's tokens -> the head's input, per `classifier` ('unpooled': unchanged)."""
    if self.classifier == 'token':
      return x[:, 0]
    if self.classifier == 'gap':
      return jnp.mean(x, axis=tuple(range(1, x.ndim - 1)))
    if self.classifier == 'map':
      return map_head(self)(x)
    return x

  def _head(self, x: jnp.ndarray, name: str = 'head') -> jnp.ndarray:
    return nn.Dense(
      self.num_classes,
      **precision.matmul_kwargs(self.dtype, self.param_dtype),
      kernel_init=nn.initializers.zeros if self.head_zeroinit else nn.initializers.lecun_normal(),
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

  def _embed_patches(self, inputs: jnp.ndarray) -> jnp.ndarray:
    """NHWC images -> (B, h, w, D) patch embeddings (after the ResNet stem of hybrids)."""
    # On the mixed-precision path the patch embedding (0.3% of the FLOPs) runs in float32;
    # its output takes the policy's activation dtype.
    elementwise = precision.elementwise_dtype(self.dtype)
    x = inputs.astype(self.dtype if self.resnet is not None else elementwise)
    if self.resnet is not None:
      x = resnet.resnet_stem(
        x, self.resnet['num_layers'], self.resnet['width_factor'], self.dtype, self.param_dtype
      )
    patch = tuple(self.patches['size'])
    return nn.Conv(
      features=self.hidden_size,
      kernel_size=patch,
      strides=patch,
      padding='VALID',
      dtype=elementwise,
      param_dtype=self.param_dtype,
      name='embedding',
    )(x).astype(self.activation_dtype())

  def _output(self, x: jnp.ndarray, both_heads: bool) -> Any:
    """The encoder's tokens (or the patch embedding without a transformer) -> the output:
    pooled, through `pre_logits` and the head where the model has them."""
    if self.distilled:
      return self._distilled_output(x, both_heads)
    x = self._pool(x)
    if self.representation_size is not None:
      x = nn.Dense(
        self.representation_size,
        **precision.matmul_kwargs(self.dtype, self.param_dtype),
        name='pre_logits',
      )(x)
      x = jnp.tanh(x)
    if self.num_classes:
      x = self._head(x)
    return x.astype(jnp.float32)

  @nn.compact
  def __call__(
    self,
    inputs: jnp.ndarray,
    *,
    train: bool,
    both_heads: bool = False,
    intermediate_blocks: Sequence[int] | None = None,
  ) -> Any:
    """Maps NHWC images in [-1, 1] to logits (float32), or to features without a head.

    `both_heads=True` (distilled models only): the pair (class-head, distillation-head) logits,
    or without a head the pair of features they read. `intermediate_blocks`: the dict of
    features described in the class docstring.
    """
    self._check_options(both_heads, intermediate_blocks)
    embedding = self._embed_patches(inputs)
    if self.transformer is None:
      return self._output(embedding, both_heads)
    n, h, w, c = embedding.shape
    x = jnp.reshape(embedding, (n, h * w, c))
    if self.posemb == 'sincos2d':
      x = x + posemb_sincos_2d(h, w, c, dtype=x.dtype)
    x = self._prepend_tokens(x)
    encoded, blocks = Encoder(
      **self.transformer,
      attention_impl=self.attention_impl,
      remat_policy=self.remat_policy,
      scan_layers=self.scan_layers,
      learned_posemb=self.posemb == 'learn',
      posemb_grid=self.posemb_grid,
      gelu_approximate=self.gelu_approximate,
      layer_norm_epsilon=self.layer_norm_epsilon,
      **self.precision_fields(),
      name='Transformer',
    )(
      x,
      train=train,
      grid=(h, w),
      capture=intermediate_blocks,
      output_tokens=self._read_tokens(),
    )
    if intermediate_blocks is None:
      return self._output(encoded, both_heads)
    features = _feature_dict(embedding, encoded, blocks)
    if encoded is not None:
      features['output'] = self._output(encoded, both_heads)
    return features


def _feature_dict(
  embedding: jnp.ndarray, encoded: jnp.ndarray | None, blocks: Mapping[int, jnp.ndarray]
) -> dict[str, jnp.ndarray]:
  """The features of `intermediate_blocks`: token sequences split into prefix and (B, h, w, D)."""
  n, h, w, d = embedding.shape
  outputs = {f'encoderblock_{i}': tokens for i, tokens in blocks.items()}
  if encoded is not None:
    outputs['encoded'] = encoded
  features = {'embedding': embedding.astype(jnp.float32)}
  for name, tokens in outputs.items():
    num_prefix = tokens.shape[1] - h * w
    features[name] = tokens[:, num_prefix:].reshape(n, h, w, d).astype(jnp.float32)
    if num_prefix:
      features[f'{name}/prefix'] = tokens[:, :num_prefix].astype(jnp.float32)
  return features

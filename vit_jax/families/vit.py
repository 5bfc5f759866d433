"""The ViT family: `VisionTransformer` with its hybrids (a ResNet stem) and DeiT's distilled
models, as the original vit_jax registry, AugReg, big_vision and DeiT name them.

Its parameter tree has the patch embedding `embedding/kernel`; the architecture is read off
the shapes (`infer_config`): dropout rates are not stored in weights and come back as 0; a tree
without `cls` is taken as `classifier='gap'` ('unpooled' has the same parameters), or 'map' with
a `MAPHead_0`; `dist_token` gives `distilled=True`, and an encoder without a position embedding
`posemb='sincos2d'` (these two fields only appear when set), and ViT-22B's block options
(`BLOCK_OPTIONS`) those that differ from their defaults: no `LayerNorm_1` (parallel blocks),
`query_norm` (QK norm), no `query/bias`, no `LayerNorm_0/bias` (norms without bias and
centering).
"""

import re
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from vit_jax.families.preprocessing import Preprocessing, square
from vit_jax.flat import (
  SEP,
  CheckpointError,
  as_flat,
  get,
  numbered,
  patch_embedding,
  shape_str,
  square_side,
)
from vit_jax.models import model_from_config, stats
from vit_jax.models.configs import MODEL_CONFIGS
from vit_jax.models.precision import LAYER_NORM_EPSILON
from vit_jax.models.vit import BLOCK_OPTIONS, VisionTransformer

POSEMB = 'Transformer/posembed_input/pos_embedding'
PATCH_KERNEL = 'embedding/kernel'
# How the model computes that its parameter shapes cannot tell, at the defaults the released
# weights were trained with: a file may state others (a Hugging Face ViT's exact GELU, 1e-12).
COMPUTED_AS = {'gelu_approximate': True, 'layer_norm_epsilon': LAYER_NORM_EPSILON}
_BLOCK_RE = re.compile(r'encoderblock_(\d+)$')
_UNIT_RE = re.compile(r'unit(\d+)$')
_STAGE_RE = re.compile(r'block(\d+)$')

Config = Mapping[str, Any] | ml_collections.ConfigDict


def owns_config(config: Config) -> bool:
  """A `VisionTransformer`'s fields (it has `hidden_size` and `transformer`)."""
  return 'hidden_size' in config and 'transformer' in config


def owns_tree(flat: Mapping[str, Any]) -> bool:
  return PATCH_KERNEL in flat


def num_prefix_tokens(flat: Mapping[str, Any]) -> int:
  """Tokens before the patches, each with a position-embedding row: `cls`, DeiT's `dist_token`."""
  return int('cls' in flat) + int('dist_token' in flat)


def block_numbers(flat: Mapping[str, Any]) -> list[int]:
  """The numbers i of the `Transformer/encoderblock_{i}` groups of a flat dict, checked 0..N-1."""
  return numbered(flat, _BLOCK_RE, 'Transformer')


def infer_config(params: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """The `VisionTransformer` fields a ViT tree (nested or flat) implies, read off its shapes."""
  flat = as_flat(params)
  patch, width = patch_embedding(flat, PATCH_KERNEL)
  config = ml_collections.ConfigDict()
  config.patches = ml_collections.ConfigDict({'size': patch})
  config.hidden_size = width
  config.transformer = infer_transformer(flat)
  config.resnet = _infer_resnet(flat)
  config.classifier = 'token' if 'cls' in flat else 'map' if 'MAPHead_0/probe' in flat else 'gap'
  if 'dist_token' in flat:
    config.distilled = True
  if config.transformer is not None and POSEMB not in flat:
    config.posemb = 'sincos2d'
  config.representation_size = (
    int(flat['pre_logits/kernel'].shape[-1]) if 'pre_logits/kernel' in flat else None
  )
  config.num_classes = int(flat['head/kernel'].shape[-1]) if 'head/kernel' in flat else None
  return config


def infer_transformer(flat: Mapping[str, Any]) -> ml_collections.ConfigDict | None:
  """The encoder's fields from `Transformer/encoderblock_{i}`; None without encoder blocks."""
  blocks = block_numbers(flat)
  if not blocks:
    return None
  block = 'Transformer/encoderblock_0'
  query = get(flat, f'{block}/MultiHeadDotProductAttention_0/query/kernel')
  if len(query.shape) != 3:
    raise CheckpointError(
      f'{block}/MultiHeadDotProductAttention_0/query/kernel has shape {shape_str(query.shape)};'
      ' expected (hidden, heads, head_dim)'
    )
  return ml_collections.ConfigDict(
    {
      'num_layers': len(blocks),
      'mlp_dim': int(get(flat, f'{block}/MlpBlock_0/Dense_0/kernel').shape[-1]),
      'num_heads': int(query.shape[1]),
      'dropout_rate': 0.0,
      'attention_dropout_rate': 0.0,
      'drop_path_rate': 0.0,
      **block_options(flat),
    }
  )


def block_options(flat: Mapping[str, Any]) -> dict[str, bool]:
  """ViT-22B's block options that the first encoder block's parameters show, those not at
  their defaults (`BLOCK_OPTIONS`); {} for the original ViT's blocks and for a tree without
  `Transformer/encoderblock_0`."""
  block = 'Transformer/encoderblock_0'
  attention = f'{block}/MultiHeadDotProductAttention_0'
  if f'{block}/LayerNorm_0/scale' not in flat:
    return {}
  shown = {
    'parallel_block': f'{block}/LayerNorm_1/scale' not in flat,
    'qk_norm': f'{attention}/query_norm/scale' in flat,
    'qkv_bias': f'{attention}/query/bias' in flat,
    'norm_bias': f'{block}/LayerNorm_0/bias' in flat,
  }
  return {k: v for k, v in shown.items() if v != BLOCK_OPTIONS[k]}


def _infer_resnet(flat: Mapping[str, Any]) -> ml_collections.ConfigDict | None:
  """The hybrid stem's units per stage and width; None for a plain ViT."""
  if 'conv_root/kernel' not in flat:
    return None
  stages = sorted({int(m.group(1)) for k in flat if (m := _STAGE_RE.match(k.split(SEP)[0]))})
  if stages != list(range(1, len(stages) + 1)):
    raise CheckpointError(f'ResNet stages {stages} are not numbered block1..block{len(stages)}')
  units = []
  for s in stages:
    names = {k.split(SEP)[1] for k in flat if k.startswith(f'block{s}/')}
    units.append(sum(bool(_UNIT_RE.match(n)) for n in names))
  width = int(flat['conv_root/kernel'].shape[-1])
  return ml_collections.ConfigDict(
    {'num_layers': tuple(units), 'width_factor': width // 64 if width % 64 == 0 else width / 64}
  )


def architecture(config: Config) -> tuple:
  """The fields that decide the parameter shapes (not dropout, not the head, not pre_logits)."""
  t = config['transformer']
  r = config['resnet']
  return (
    tuple(config['patches']['size']),
    config['hidden_size'],
    None if t is None else (t['num_layers'], t['mlp_dim'], t['num_heads'], *_options(t)),
    None if r is None else (tuple(r['num_layers']), r['width_factor']),
    config['classifier'] in ('token', 'token_unpooled'),
    config['classifier'] == 'map',
    bool(config.get('distilled', False)),
    config.get('posemb', 'learn'),
  )


def _options(transformer: Config) -> tuple[bool, ...]:
  """The encoder's ViT-22B block options, defaults where it does not say."""
  return tuple(transformer.get(k, default) for k, default in BLOCK_OPTIONS.items())


# The phrase of each ViT-22B block option that is not at its default.
_OPTION_PHRASES = {
  'parallel_block': 'parallel blocks',
  'qk_norm': 'QK norm',
  'qkv_bias': 'no QKV bias',
  'norm_bias': 'norms without bias and centering',
}


def block_phrases(transformer: Config | None) -> list[str]:
  """The encoder's ViT-22B block options in words, those not at their defaults."""
  if transformer is None:
    return []
  options = dict(zip(BLOCK_OPTIONS, _options(transformer), strict=True))
  return [_OPTION_PHRASES[k] for k, v in options.items() if v != BLOCK_OPTIONS[k]]


def first_registered(config: Config, owns: Callable, arch_of: Callable) -> str | None:
  """The first registered name that a family `owns` whose architecture (`arch_of`) is that of
  `config`, or None."""
  arch = arch_of(config)
  for name, registered in MODEL_CONFIGS.items():
    if owns(registered) and arch_of(registered) == arch:
      return name
  return None


def match_registry(config: Config) -> str | None:
  """The registered ViT with the architecture of `config`, or None."""
  return first_registered(config, owns_config, architecture)


def describe(config: Config) -> str:
  """The architecture in one phrase, e.g. 'hidden_size 768, 12 layers, 12 heads, mlp_dim 3072,
  patch 16x16, classifier token'."""
  t, r = config['transformer'], config['resnet']
  parts = [f'hidden_size {config["hidden_size"]}']
  if t is not None:
    parts.append(f'{t["num_layers"]} layers, {t["num_heads"]} heads, mlp_dim {t["mlp_dim"]}')
  parts.append('patch ' + 'x'.join(map(str, config['patches']['size'])))
  if r is not None:
    parts.append(f'resnet {tuple(r["num_layers"])}')
  parts.append(f'classifier {config["classifier"]}')
  parts += block_phrases(t)
  if config.get('distilled'):
    parts.append('distillation token')
  if config.get('posemb', 'learn') != 'learn':
    parts.append(f'posemb {config["posemb"]}')
  if not config.get('gelu_approximate', True):
    parts.append('exact GELU')
  epsilon = config.get('layer_norm_epsilon', LAYER_NORM_EPSILON)
  if epsilon != LAYER_NORM_EPSILON:
    parts.append(f'LayerNorm epsilon {epsilon:g}')
  return ', '.join(parts)


def stated_fields(config: Config) -> dict[str, Any]:
  """What a model config states that the shapes cannot: the fields of `COMPUTED_AS` it sets
  to other than their defaults (the exact GELU, another LayerNorm epsilon)."""
  return {k: config[k] for k, default in COMPUTED_AS.items() if config.get(k, default) != default}


def feature_stride(config: Config) -> int:
  """Downsampling of the ResNet stem before the patch embedding (1 for a plain ViT)."""
  if config.get('resnet') is None:
    return 1
  return 4 * 2 ** max(0, len(config['resnet']['num_layers']) - 1)


def patch_pixels(config: Config) -> int:
  """The side in input pixels of the patch one token sees (patch size x the stem's stride)."""
  return config['patches']['size'][0] * feature_stride(config)


def native_resolution(flat: Mapping[str, Any], config: Config) -> int | None:
  """The square image size of a square grid of learned position embeddings (after the
  `cls`/`dist_token` rows); None otherwise (sincos2d position embeddings fit any size)."""
  if POSEMB not in flat:
    return None
  side = square_side(flat[POSEMB].shape[1] - num_prefix_tokens(flat))
  return None if side is None else side * patch_pixels(config)


def token_grid(config: Config, image_size: int | tuple[int, int]) -> tuple[int, int]:
  """(rows, cols) of patch tokens for an image of `image_size` pixels."""
  h, w = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
  if config.get('resnet') is not None:
    steps = 2 + max(0, len(config['resnet']['num_layers']) - 1)  # root conv, max-pool, stages
    for _ in range(steps):
      h, w = -(-h // 2), -(-w // 2)
  ph, pw = config['patches']['size']
  return h // ph, w // pw


CLASSIFIERS_WITH_POOLING = ('token', 'gap', 'map')


def check_pooled(config: Config, name: str) -> None:
  """Predictions and embeddings need one pooled vector per image (a one-line ValueError)."""
  if config['transformer'] is None or config['classifier'] not in CLASSIFIERS_WITH_POOLING:
    raise ValueError(
      f'{name} has classifier={config["classifier"]!r} and transformer={config["transformer"]}: '
      f'predictions and embeddings need a pooled encoder output ({CLASSIFIERS_WITH_POOLING}).'
    )


def feature_kwargs(model: VisionTransformer) -> dict[str, Any]:
  """`apply` options for the features: a distilled model gives both tokens' (`both_heads`)."""
  return {'both_heads': True} if model.distilled else {}


def is_plain(config: Config) -> bool:
  """A ViT of the paper's Table 1: no ResNet stem, no distillation token."""
  return config['resnet'] is None and not config.get('distilled')


def table_columns(config: Config) -> dict[str, Any]:
  """The model table's shape columns (`vit-models`)."""
  t = config['transformer']
  arch = (t['num_layers'], config['hidden_size'], t['mlp_dim'], t['num_heads'])
  note = 'distillation token and head' if config.get('distilled') else ''
  note = note or ', '.join(block_phrases(t))
  return {**dict(zip(('layers', 'hidden', 'mlp', 'heads'), arch, strict=True)), 'note': note}


def unlike_hugging_face(config: Config) -> str | None:
  """Why Hugging Face's ViTForImageClassification cannot hold the model, or None."""
  if config.get('distilled'):
    return 'is distilled (DeiT: two heads)'
  if phrases := block_phrases(config['transformer']):
    return f'has ViT-22B block options ({", ".join(phrases)})'
  if (
    config['resnet'] is not None
    or config['classifier'] != 'token'
    or config.get('representation_size')
  ):
    return (
      f'has resnet={config["resnet"] is not None}, classifier={config["classifier"]!r},'
      f' representation_size={config.get("representation_size")}'
    )
  return None


def label(config: Config) -> str:
  """An unregistered model's name in the commands' output."""
  return f'ViT ({describe(config)})'


def build(fields: Config, *, num_classes: int | None, dtype: Any, precision: str) -> nn.Module:
  """The classifier of a run's model fields: a head of `num_classes`, computing in `dtype`
  under the precision policy `precision` (a ViT's and a Mixer's alike)."""
  return model_from_config(fields, num_classes=num_classes, dtype=dtype, precision_policy=precision)


def image_input(resolution: int | tuple[int, int]) -> jax.ShapeDtypeStruct:
  """One NHWC float32 image of `resolution` pixels."""
  h, w = (resolution, resolution) if isinstance(resolution, int) else tuple(resolution)
  return jax.ShapeDtypeStruct((1, h, w, 3), jnp.float32)


def init_inputs(model: nn.Module, resolution: int | tuple[int, int], max_len: int | None) -> dict:
  """The model's inputs for `init` (its call's keyword arguments but `train`): one image."""
  del model, max_len  # no text
  return {'inputs': image_input(resolution)}


def forward_flops(config: Config, resolution: int, num_classes: int) -> int:
  return stats.vit_forward_flops(config, resolution, num_classes)


def preprocessing(
  config: Config, resolution: int | tuple[int, int] | None = None, max_patches: int = 0
) -> Preprocessing:
  """THE preprocessing of a classifier at `resolution`: resize (bilinear, no antialiasing)
  to it, [-1, 1], as the input pipeline evaluates and every released file expects."""
  del config
  if max_patches:
    raise ValueError(f'max_patches={max_patches}: this model takes square images, not patches')
  if resolution is None:
    raise ValueError('the resolution of a square image input is unknown: give one')
  return square(resolution)


def model_kind(config: Config) -> str:
  """What the model is, for the commands' one-line summaries: a ResNet stem makes it the
  paper's hybrid."""
  if config.get('distilled'):
    return 'DeiT (distilled)'
  return 'ViT' if config.get('resnet') is None else 'ViT hybrid'


MODULE = VisionTransformer

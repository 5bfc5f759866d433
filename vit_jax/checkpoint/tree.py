"""Flat `{'a/b/c': array}` dicts, the nested trees they stand for, and the model a tree describes.

Every format module maps a file to a flat dict in our names and back; these helpers are shared:
flattening and `infer_config`, which reads the hyperparameters of a
parameter tree off its shapes (so a checkpoint can be checked against, and named by, the registry).
"""

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

import ml_collections

SEP = '/'
POSEMB = 'Transformer/posembed_input/pos_embedding'
MIXER_STEM = 'stem/kernel'
MIXER_TOKENS = 'MixerBlock_0/token_mixing/Dense_0/kernel'
_BLOCK_RE = re.compile(r'encoderblock_(\d+)$')
_MIXER_BLOCK_RE = re.compile(r'MixerBlock_(\d+)$')
_UNIT_RE = re.compile(r'unit(\d+)$')
_STAGE_RE = re.compile(r'block(\d+)$')


class CheckpointError(ValueError):
  """A checkpoint that cannot be read, converted or fitted; the message is one line with the fix."""


def flatten(tree: Mapping[str, Any], prefix: str = '') -> dict[str, Any]:
  """`{'a': {'b': x}}` -> `{'a/b': x}`; empty sub-dicts (layers without weights) vanish."""
  flat = {}
  for key, value in tree.items():
    path = f'{prefix}{SEP}{key}' if prefix else str(key)
    if isinstance(value, Mapping):
      flat.update(flatten(value, path))
    else:
      flat[path] = value
  return flat


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
  """`{'a/b': x}` -> `{'a': {'b': x}}`; a key that is both a leaf and a prefix is an error."""
  tree: dict[str, Any] = {}
  for key, value in flat.items():
    *parents, leaf = key.split(SEP)
    node = tree
    for i, part in enumerate(parents):
      node = node.setdefault(part, {})
      if not isinstance(node, dict):
        raise CheckpointError(f'key {key!r} nests under {SEP.join(parents[: i + 1])!r}, a leaf')
    if leaf in node:
      raise CheckpointError(f'key {key!r} is both a leaf and a group of parameters')
    node[leaf] = value
  return tree


def natural_key(name: str) -> list[Any]:
  """Sort key that orders `encoderblock_2` before `encoderblock_10`."""
  return [int(t) if t.isdigit() else t for t in re.split(r'(\d+)', name)]


def count_params(flat: Mapping[str, Any]) -> int:
  """Total number of scalars of a flat dict (or tree) of arrays or ShapeDtypeStructs."""
  if any(isinstance(v, Mapping) for v in flat.values()):
    flat = flatten(flat)
  return sum(math.prod(v.shape) for v in flat.values())


def shape_str(shape: Iterable[int]) -> str:
  """`(1, 197, 768)` as written in messages."""
  return '(' + ', '.join(str(int(d)) for d in shape) + (',)' if len(tuple(shape)) == 1 else ')')


def square_side(n: int) -> int | None:
  """`s` when `n == s * s`, else None."""
  s = math.isqrt(n)
  return s if s * s == n else None


def config_field(config: Any, name: str, default: Any = None) -> Any:
  """`config[name]` of a model config (ConfigDict, dict or None), else `default`."""
  if isinstance(config, (Mapping, ml_collections.ConfigDict)):
    return config.get(name, default)
  return default


def check_complete(
  flat: Mapping[str, Any],
  required: Iterable[str],
  pairs: Iterable[tuple[str, str]],
  source: str,
  what: str,
) -> None:
  """Every `required` key is in `flat`, and of each optional (kernel, bias) pair both or none."""
  expected = list(required)
  for pair in pairs:
    if (pair[0] in flat) != (pair[1] in flat):
      expected += list(pair)
  missing = [k for k in expected if k not in flat]
  if missing:
    raise CheckpointError(
      f'{source}: missing {len(missing)} ViT weights, e.g. {missing[0]!r}; the file is incomplete'
      f' or not {what}'
    )


def _get(flat: Mapping[str, Any], key: str) -> Any:
  if key not in flat:
    raise CheckpointError(f'the parameters lack {key!r}; this is not a ViT parameter tree')
  return flat[key]


def num_prefix_tokens(flat: Mapping[str, Any]) -> int:
  """Tokens before the patches, each with a position-embedding row: `cls`, DeiT's `dist_token`."""
  return int('cls' in flat) + int('dist_token' in flat)


def _numbered(flat: Mapping[str, Any], pattern: re.Pattern, where: str) -> list[int]:
  """The indices `i` of the `name_{i}` groups matching `pattern` in `where`, checked 0..N-1."""
  prefix = where + SEP if where else ''
  depth = prefix.count(SEP)
  names = {k.split(SEP)[depth] for k in flat if k.startswith(prefix) and k.count(SEP) > depth}
  found = sorted(int(m.group(1)) for name in names if (m := pattern.match(name)))
  if found != list(range(len(found))):
    raise CheckpointError(f'{where or "Mixer"} blocks {found} are not numbered 0..{len(found) - 1}')
  return found


def gelu_fields(approximate: bool) -> dict[str, Any]:
  """The model fields of a GELU a file names: none for the tanh approximation (the default)."""
  return {} if approximate else {'gelu_approximate': False}


def block_numbers(flat: Mapping[str, Any]) -> list[int]:
  """The numbers i of the `Transformer/encoderblock_{i}` groups of a flat dict, checked 0..N-1."""
  return _numbered(flat, _BLOCK_RE, 'Transformer')


def _patch_embedding(flat: Mapping[str, Any], key: str) -> tuple[tuple[int, int], int]:
  """(patch size, width) of the conv kernel `key` that cuts the image into patches."""
  kernel = _get(flat, key)
  if len(kernel.shape) != 4:
    raise CheckpointError(
      f'{key} has shape {shape_str(kernel.shape)}; expected a 4-D HWIO conv kernel'
    )
  return (int(kernel.shape[0]), int(kernel.shape[1])), int(kernel.shape[-1])


def _infer_mixer(flat: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """The `MlpMixer` fields of a Mixer tree (`stem`, `MixerBlock_{i}`, `head`)."""
  patch, width = _patch_embedding(flat, MIXER_STEM)
  config = ml_collections.ConfigDict()
  config.patches = ml_collections.ConfigDict({'size': patch})
  config.hidden_dim = width
  config.num_blocks = len(_numbered(flat, _MIXER_BLOCK_RE, ''))
  config.tokens_mlp_dim = int(_get(flat, MIXER_TOKENS).shape[-1])
  channels = _get(flat, 'MixerBlock_0/channel_mixing/Dense_0/kernel')
  config.channels_mlp_dim = int(channels.shape[-1])
  config.num_classes = int(flat['head/kernel'].shape[-1]) if 'head/kernel' in flat else None
  return config


def infer_config(params: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """The model fields a parameter tree implies, read off its shapes.

  A Mixer tree (`stem/kernel`) gives `MlpMixer`'s fields, any other `VisionTransformer`'s.
  Dropout rates are not stored in weights and come back as 0; a tree without `cls` is taken
  as `classifier='gap'` ('unpooled' has the same parameters), or 'map' with a `MAPHead_0`;
  `dist_token` gives `distilled=True`, and an encoder without a position embedding
  `posemb='sincos2d'` (these two fields only appear when set). `match_registry` names the
  registered model of this architecture, if there is one.
  """
  flat = flatten(params) if any(isinstance(v, Mapping) for v in params.values()) else params
  if MIXER_STEM in flat:
    return _infer_mixer(flat)
  patch, width = _patch_embedding(flat, 'embedding/kernel')
  config = ml_collections.ConfigDict()
  config.patches = ml_collections.ConfigDict({'size': patch})
  config.hidden_size = width
  config.transformer = _infer_transformer(flat)
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


def _infer_transformer(flat: Mapping[str, Any]) -> ml_collections.ConfigDict | None:
  """The encoder's fields from `Transformer/encoderblock_{i}`; None without encoder blocks."""
  blocks = block_numbers(flat)
  if not blocks:
    return None
  block = 'Transformer/encoderblock_0'
  query = _get(flat, f'{block}/MultiHeadDotProductAttention_0/query/kernel')
  if len(query.shape) != 3:
    raise CheckpointError(
      f'{block}/MultiHeadDotProductAttention_0/query/kernel has shape {shape_str(query.shape)};'
      ' expected (hidden, heads, head_dim)'
    )
  return ml_collections.ConfigDict(
    {
      'num_layers': len(blocks),
      'mlp_dim': int(_get(flat, f'{block}/MlpBlock_0/Dense_0/kernel').shape[-1]),
      'num_heads': int(query.shape[1]),
      'dropout_rate': 0.0,
      'attention_dropout_rate': 0.0,
      'drop_path_rate': 0.0,
    }
  )


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


def architecture(config: Mapping[str, Any] | ml_collections.ConfigDict) -> tuple:
  """The fields that decide the parameter shapes (not dropout, not the head, not pre_logits)."""
  if 'num_blocks' in config:  # MLP-Mixer; the patch first, as for a ViT
    fields = ('hidden_dim', 'num_blocks', 'tokens_mlp_dim', 'channels_mlp_dim')
    return (tuple(config['patches']['size']), 'mixer', *(config[f] for f in fields))
  t = config['transformer']
  r = config['resnet']
  return (
    tuple(config['patches']['size']),
    config['hidden_size'],
    None if t is None else (t['num_layers'], t['mlp_dim'], t['num_heads']),
    None if r is None else (tuple(r['num_layers']), r['width_factor']),
    config['classifier'] in ('token', 'token_unpooled'),
    config['classifier'] == 'map',
    bool(config.get('distilled', False)),
    config.get('posemb', 'learn'),
  )


def match_registry(config: Mapping[str, Any] | ml_collections.ConfigDict) -> str | None:
  """The registered model with the architecture of `config`, or None."""
  from vit_jax.models import MODEL_CONFIGS

  arch = architecture(config)
  for name, registered in MODEL_CONFIGS.items():
    if architecture(registered) == arch:
      return name
  return None


def describe(config: Mapping[str, Any] | ml_collections.ConfigDict) -> str:
  """The architecture in one phrase, e.g. 'hidden_size 768, 12 layers, 12 heads, mlp_dim 3072,
  patch 16x16, classifier token' (a Mixer: 'Mixer with hidden_dim 768, 12 blocks, ...')."""
  patch = 'patch ' + 'x'.join(map(str, config['patches']['size']))
  if 'num_blocks' in config:
    return (
      f'Mixer with hidden_dim {config["hidden_dim"]}, {config["num_blocks"]} blocks,'
      f' tokens MLP {config["tokens_mlp_dim"]}, channels MLP {config["channels_mlp_dim"]}, {patch}'
    )
  t, r = config['transformer'], config['resnet']
  parts = [f'hidden_size {config["hidden_size"]}']
  if t is not None:
    parts.append(f'{t["num_layers"]} layers, {t["num_heads"]} heads, mlp_dim {t["mlp_dim"]}')
  parts.append(patch)
  if r is not None:
    parts.append(f'resnet {tuple(r["num_layers"])}')
  parts.append(f'classifier {config["classifier"]}')
  if config.get('distilled'):
    parts.append('distillation token')
  if config.get('posemb', 'learn') != 'learn':
    parts.append(f'posemb {config["posemb"]}')
  if not config.get('gelu_approximate', True):
    parts.append('exact GELU')
  return ', '.join(parts)


def feature_stride(config: Mapping[str, Any] | ml_collections.ConfigDict) -> int:
  """Downsampling of the ResNet stem before the patch embedding (1 for a plain ViT)."""
  if config.get('resnet') is None:
    return 1
  return 4 * 2 ** max(0, len(config['resnet']['num_layers']) - 1)


def patch_pixels(config: Mapping[str, Any] | ml_collections.ConfigDict) -> int:
  """The side in input pixels of the patch one token sees (patch size x the stem's stride)."""
  return config['patches']['size'][0] * feature_stride(config)


def native_resolution(
  params: Mapping[str, Any], config: Mapping[str, Any] | ml_collections.ConfigDict
) -> int | None:
  """The square image size a checkpoint was trained at, when its shapes tell: a square grid of
  learned position embeddings (after the `cls`/`dist_token` rows), or a Mixer's token-mixing
  width (its number of patches). None otherwise (sincos2d position embeddings fit any size)."""
  flat = flatten(params) if any(isinstance(v, Mapping) for v in params.values()) else params
  if MIXER_TOKENS in flat:
    patches = flat[MIXER_TOKENS].shape[0]
  elif POSEMB in flat:
    patches = flat[POSEMB].shape[1] - num_prefix_tokens(flat)
  else:
    return None
  side = square_side(patches)
  return None if side is None else side * patch_pixels(config)


def token_grid(
  config: Mapping[str, Any] | ml_collections.ConfigDict, image_size: int | tuple[int, int]
) -> tuple[int, int]:
  """(rows, cols) of patch tokens for an image of `image_size` pixels."""
  h, w = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
  if config.get('resnet') is not None:
    steps = 2 + max(0, len(config['resnet']['num_layers']) - 1)  # root conv, max-pool, stages
    for _ in range(steps):
      h, w = -(-h // 2), -(-w // 2)
  ph, pw = config['patches']['size']
  return h // ph, w // pw

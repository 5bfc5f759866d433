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
_BLOCK_RE = re.compile(r'encoderblock_(\d+)$')
_BLOCK_KEY_RE = re.compile(r'^Transformer/encoderblock_(\d+)/')
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


def block_numbers(flat: Mapping[str, Any]) -> list[int]:
  """The sorted numbers i of the `Transformer/encoderblock_{i}/...` keys of a flat dict."""
  return sorted({int(m.group(1)) for k in flat if (m := _BLOCK_KEY_RE.match(k))})


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


def infer_config(params: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """The `VisionTransformer` fields a parameter tree implies, read off its shapes.

  Dropout rates are not stored in weights and come back as 0; a tree without `cls` is taken
  as `classifier='gap'` ('unpooled' has the same parameters). `model_name` is the matching
  registry entry, or None when no registered model has this architecture.
  """
  flat = flatten(params) if any(isinstance(v, Mapping) for v in params.values()) else params
  kernel = _get(flat, 'embedding/kernel')
  if len(kernel.shape) != 4:
    raise CheckpointError(
      f'embedding/kernel has shape {shape_str(kernel.shape)}; expected a 4-D HWIO conv kernel'
    )
  hidden = int(kernel.shape[-1])
  config = ml_collections.ConfigDict()
  config.model_name = None
  config.patches = ml_collections.ConfigDict({'size': tuple(int(d) for d in kernel.shape[:2])})
  config.hidden_size = hidden

  blocks = sorted(
    int(m.group(1))
    for name in {k.split(SEP)[1] for k in flat if k.startswith('Transformer/')}
    if (m := _BLOCK_RE.match(name))
  )
  if blocks != list(range(len(blocks))):
    raise CheckpointError(f'encoder blocks {blocks} are not numbered 0..{len(blocks) - 1}')
  if blocks:
    block = 'Transformer/encoderblock_0'
    query = _get(flat, f'{block}/MultiHeadDotProductAttention_0/query/kernel')
    if len(query.shape) != 3:
      raise CheckpointError(
        f'{block}/MultiHeadDotProductAttention_0/query/kernel has shape {shape_str(query.shape)};'
        ' expected (hidden, heads, head_dim)'
      )
    config.transformer = ml_collections.ConfigDict(
      {
        'num_layers': len(blocks),
        'mlp_dim': int(_get(flat, f'{block}/MlpBlock_0/Dense_0/kernel').shape[-1]),
        'num_heads': int(query.shape[1]),
        'dropout_rate': 0.0,
        'attention_dropout_rate': 0.0,
      }
    )
  else:
    config.transformer = None

  if 'conv_root/kernel' in flat:
    stages = sorted({int(m.group(1)) for k in flat if (m := _STAGE_RE.match(k.split(SEP)[0]))})
    if stages != list(range(1, len(stages) + 1)):
      raise CheckpointError(f'ResNet stages {stages} are not numbered block1..block{len(stages)}')
    units = []
    for s in stages:
      names = {k.split(SEP)[1] for k in flat if k.startswith(f'block{s}/')}
      units.append(sum(bool(_UNIT_RE.match(n)) for n in names))
    width = int(flat['conv_root/kernel'].shape[-1])
    config.resnet = ml_collections.ConfigDict(
      {'num_layers': tuple(units), 'width_factor': width // 64 if width % 64 == 0 else width / 64}
    )
  else:
    config.resnet = None

  config.classifier = 'token' if 'cls' in flat else 'gap'
  config.representation_size = (
    int(flat['pre_logits/kernel'].shape[-1]) if 'pre_logits/kernel' in flat else None
  )
  config.num_classes = int(flat['head/kernel'].shape[-1]) if 'head/kernel' in flat else None
  config.model_name = match_registry(config)
  return config


def _arch(config: Mapping[str, Any] | ml_collections.ConfigDict) -> tuple:
  """The fields that decide the parameter shapes (not dropout, not the head)."""
  t = config['transformer']
  r = config['resnet']
  return (
    tuple(config['patches']['size']),
    config['hidden_size'],
    None if t is None else (t['num_layers'], t['mlp_dim'], t['num_heads']),
    None if r is None else (tuple(r['num_layers']), r['width_factor']),
    config['classifier'] in ('token', 'token_unpooled'),
  )


def match_registry(config: Mapping[str, Any] | ml_collections.ConfigDict) -> str | None:
  """The registered model with the architecture of `config`, or None."""
  from vit_jax.models import MODEL_CONFIGS

  arch = _arch(config)
  for name, registered in MODEL_CONFIGS.items():
    if _arch(registered) == arch:
      return name
  return None


def feature_stride(config: Mapping[str, Any] | ml_collections.ConfigDict) -> int:
  """Downsampling of the ResNet stem before the patch embedding (1 for a plain ViT)."""
  if config.get('resnet') is None:
    return 1
  return 4 * 2 ** max(0, len(config['resnet']['num_layers']) - 1)


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

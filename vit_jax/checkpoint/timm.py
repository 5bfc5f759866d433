"""timm `VisionTransformer` state dicts: read them into our tree, export ours to them.

timm's names (`timm/models/vision_transformer.py`) for the ViTs our model computes:

  cls_token (1, 1, D), dist_token (DeiT)   cls, dist_token
  pos_embed (1, [prefix +] N, D)          Transformer/posembed_input/pos_embedding
  patch_embed.proj.{weight, bias}         embedding (OIHW -> HWIO)
  blocks.{i}.norm1, norm2                 Transformer/encoderblock_{i}/LayerNorm_0, LayerNorm_1
  blocks.{i}.attn.qkv (3D, D), fused      .../MultiHeadDotProductAttention_0/{query,key,value}
  blocks.{i}.attn.proj                    .../MultiHeadDotProductAttention_0/out
  blocks.{i}.mlp.fc1, fc2                 .../MlpBlock_0/Dense_0, Dense_1
  norm (fc_norm with token pooling)       Transformer/encoder_norm
  head, head_dist (DeiT)                  head, head_dist

`no_embed_class=True` (DeiT III, timm's big_vision exports) keeps no position rows for the
prefix (class, distillation) tokens: timm adds `pos_embed` to the patches, then prepends the
tokens. We prepend first and add one row per token, so the prefix rows are zeros: the same
network, bit for bit. Pooling: timm's `global_pool='token'` is our classifier 'token';
'avg' over a model without class token whose LayerNorm comes before pooling (`fc_norm=False`,
timm's `*_gap_*` models) is our 'gap'; '' is 'unpooled' / 'token_unpooled'. What our ViT does
not compute (a LayerNorm after average pooling, timm's `fc_norm` default for 'avg'; layer
scale, qk-norm, register tokens, pre-norm, attention pooling) is refused in one line.

The number of heads is not in the weights: it comes from the caller, else from the
`config.json` timm keeps beside its weights (`model_args.num_heads`, or the architecture name).
So does the GELU: `model_args.act_layer` ('gelu_tanh': our default tanh approximation; 'gelu',
timm's default when the config names none: `gelu_approximate=False`). A weights file without
config.json states no activation, and our default holds. A file without q/k/v biases
(`qkv_bias=False`) loads with zero biases, which compute the same.

Exports write `model.safetensors` and a `config.json` in timm's hub format whose `model_args`
are the `timm.create_model` arguments that reproduce our logits, among them the model's GELU
(`act_layer='gelu_tanh'`, that the released weights were trained with, unless
`gelu_approximate=False`: 'gelu') and timm's LayerNorm with epsilon 1e-6
(`norm_layer='layernorm'`): `timm.create_model('local-dir:DIR', pretrained=True)` loads the
folder. This module holds the key maps, the checks and the config writer; reading, walking and
writing are `pytorch`'s, shared with Hugging Face.
"""

import re
from collections.abc import Mapping
from typing import Any

import numpy as np
from absl import logging
from etils.epath import Path

from vit_jax import files
from vit_jax.checkpoint import pytorch
from vit_jax.checkpoint.pytorch import ATTN, BACKBONE, BLOCK, QKV
from vit_jax.checkpoint.tree import (
  POSEMB,
  CheckpointError,
  block_numbers,
  config_field,
  flatten,
  gelu_fields,
  shape_str,
  square_side,
)
from vit_jax.models.precision import LAYER_NORM_EPSILON

WEIGHT_FILES = ('model.safetensors', 'pytorch_model.bin')
# timm's `act_layer` -> our `gelu_approximate`; timm's ViT and DeiT default to 'gelu'.
ACT_LAYERS = {'gelu': False, 'gelu_tanh': True}
# Architectures whose default activation differs between names (SigLIP: 'gelu_tanh' for some,
# 'gelu' for others; CLIP: 'quick_gelu'): their GELU must be in `model_args`.
_ARCH_ACT_VARIES = re.compile(r'siglip|quickgelu')
NORM_LAYER = 'layernorm'  # timm.layers.LayerNorm, epsilon 1e-6 as flax's
# The heads of timm's ViT and DeiT architectures, by the size in their names.
HEADS_BY_SIZE = {
  'tiny': 3,
  'small': 6,
  'medium': 8,
  'base': 12,
  'large': 16,
  'huge': 16,
  'giant': 16,
  'gigantic': 16,
}
# Only these plain names: variants (`_gap_`, `_plus_`, `_clip_`...) differ (ViT-B/16 gap: 16 heads).
_ARCH_RE = re.compile(r'^(?:vit|deit3?)_([a-z]+)(?:_distilled)?_patch\d+_\d+$')
# (hidden, layers, heads) -> the size in timm's names; registered patch sizes at 224 px.
_SIZES = {(192, 12, 3): 'tiny', (384, 12, 6): 'small', (768, 12, 12): 'base'}
_SIZES |= {(1024, 24, 16): 'large', (1280, 32, 16): 'huge'}
_PATCHES = {'tiny': (16,), 'small': (8, 16, 32), 'base': (8, 16, 32), 'large': (14, 16, 32)}
_PATCHES |= {'huge': (14,)}
_LAYER_RE = re.compile(r'^blocks\.(\d+)\.(.+)$')
_QKV_RE = re.compile(r'^blocks\.(\d+)\.attn\.qkv\.(weight|bias)$')
# timm name inside a block -> (our key, kind of transform); attn.qkv is split separately.
_BLOCK_MAP = {
  'norm1.weight': (BLOCK + '/LayerNorm_0/scale', 'copy'),
  'norm1.bias': (BLOCK + '/LayerNorm_0/bias', 'copy'),
  'attn.proj.weight': (ATTN + '/out/kernel', 'out_kernel'),
  'attn.proj.bias': (ATTN + '/out/bias', 'copy'),
  'norm2.weight': (BLOCK + '/LayerNorm_1/scale', 'copy'),
  'norm2.bias': (BLOCK + '/LayerNorm_1/bias', 'copy'),
  'mlp.fc1.weight': (BLOCK + '/MlpBlock_0/Dense_0/kernel', 'linear'),
  'mlp.fc1.bias': (BLOCK + '/MlpBlock_0/Dense_0/bias', 'copy'),
  'mlp.fc2.weight': (BLOCK + '/MlpBlock_0/Dense_1/kernel', 'linear'),
  'mlp.fc2.bias': (BLOCK + '/MlpBlock_0/Dense_1/bias', 'copy'),
}
# timm name outside the blocks -> (our key, kind); reading handles pos_embed and fc_norm apart.
_TOP_MAP = {
  'cls_token': ('cls', 'copy'),
  'pos_embed': (POSEMB, 'copy'),
  'dist_token': ('dist_token', 'copy'),
  'patch_embed.proj.weight': ('embedding/kernel', 'conv'),
  'patch_embed.proj.bias': ('embedding/bias', 'copy'),
  'norm.weight': ('Transformer/encoder_norm/scale', 'copy'),
  'norm.bias': ('Transformer/encoder_norm/bias', 'copy'),
  'head.weight': ('head/kernel', 'linear'),
  'head.bias': ('head/bias', 'copy'),
  'head_dist.weight': ('head_dist/kernel', 'linear'),
  'head_dist.bias': ('head_dist/bias', 'copy'),
}
# Parameters of timm ViT options that our model does not compute.
_UNSUPPORTED = {
  re.compile(r'^reg_token$'): 'register tokens (reg_tokens)',
  re.compile(r'\.ls[12]\.'): 'layer scale (init_values)',
  re.compile(r'\.attn\.[qk]_norm\.'): 'qk-norm (qk_norm=True)',
  re.compile(r'^norm_pre\.'): 'a LayerNorm before the blocks (pre_norm=True)',
  re.compile(r'^attn_pool\.'): "attention pooling (global_pool='map')",
}


_WHAT = 'timm VisionTransformer'
_OUR_QKV_RE = re.compile(r'/MultiHeadDotProductAttention_0/(query|key|value)/')


# ---------------------------------------------------------------------------------------------
# Reading.


def _looks_like_timm(keys: list[str]) -> bool:
  return any(k.removeprefix('module.') in ('patch_embed.proj.weight', 'pos_embed') for k in keys)


def _read_config(path: Path) -> dict[str, Any] | None:
  """timm's hub `config.json` (it has an `architecture`) in or beside `path`, or None."""
  try:
    config = pytorch.read_config(path)
  except CheckpointError:  # not ours to judge: the format that claims the folder reports it
    return None
  return config if config is not None and 'architecture' in config else None


def detect(path: Path) -> bool:
  """A folder timm wrote (hub `config.json` + weights), or a weights file with timm's names."""
  if path.is_dir():
    weights = pytorch.weights_in(path, WEIGHT_FILES)
    if weights is None:
      return False
    return _read_config(path) is not None or _looks_like_timm(pytorch.state_keys(weights))
  suffixes = ('.safetensors', *pytorch.TORCH_SUFFIXES)
  return path.is_file() and path.suffix in suffixes and _looks_like_timm(pytorch.state_keys(path))


def heads_of_architecture(name: str) -> int | None:
  """The number of heads of a timm ViT or DeiT named `vit_base_patch16_224` and the like."""
  m = _ARCH_RE.match(name)
  return HEADS_BY_SIZE.get(m.group(1)) if m else None


def _heads_from_config(config: Mapping[str, Any] | None) -> int | None:
  if config is None:
    return None
  heads = (config.get('model_args') or {}).get('num_heads')
  return heads if heads is not None else heads_of_architecture(str(config.get('architecture')))


def states_heads(path: Path) -> bool:
  """Whether timm's `config.json` states the heads (`model_args`, or the architecture's)."""
  return _heads_from_config(_read_config(path)) is not None


def unlike(path: Path) -> list[str]:
  """What the project computes otherwise than timm's `config.json` states: its
  `pretrained_cfg`'s resize, values and central crop (the GELU the model takes)."""
  cfg = (_read_config(path) or {}).get('pretrained_cfg') or {}
  if not cfg:
    return []
  return pytorch.preprocessing_unlike(
    "config.json's pretrained_cfg",
    str(cfg.get('interpolation', 'bilinear')),
    cfg.get('mean', 0.5),
    cfg.get('std', 0.5),
    float(cfg.get('crop_pct', 1.0)),
  )


def _image_size_from_config(config: Mapping[str, Any] | None) -> tuple[int, int] | None:
  if config is None:
    return None
  size = (config.get('model_args') or {}).get('img_size')
  if size is None:
    input_size = (config.get('pretrained_cfg') or {}).get('input_size')
    size = tuple(input_size[1:]) if input_size else None
  if size is None:
    return None
  return (size, size) if isinstance(size, int) else tuple(size)


def _global_pool(config: Mapping[str, Any] | None) -> str | None:
  if config is None:
    return None
  return config.get('global_pool', (config.get('model_args') or {}).get('global_pool'))


def _gelu_approximate(config: Mapping[str, Any], source: Path) -> bool:
  """Our `gelu_approximate` for the activation timm computes the config's model with."""
  arch = str(config.get('architecture'))
  act = (config.get('model_args') or {}).get('act_layer')
  if act is None and _ARCH_ACT_VARIES.search(arch):
    raise CheckpointError(
      f"{source}: config.json names no act_layer, and {arch}'s depends on the variant: add"
      " model_args.act_layer ('gelu' or 'gelu_tanh') to it"
    )
  return pytorch.gelu_approximate('gelu' if act is None else act, ACT_LAYERS, 'act_layer', source)


def model_fields(path: Path) -> dict[str, Any]:
  """The model fields timm's `config.json` states beyond the shapes: the GELU it computes."""
  config = _read_config(path)
  return {} if config is None else gelu_fields(_gelu_approximate(config, path))


def _check_pooling(state: Mapping[str, Any], global_pool: str | None, source: str) -> None:
  """timm's `global_pool` (from its config, or implied by the tokens) is one of ours.

  A LayerNorm per token commutes with taking a token, so `fc_norm` with token (or no)
  pooling is our `encoder_norm`; after average pooling it is not.
  """
  has_cls, fc_norm = 'cls_token' in state, 'fc_norm.weight' in state
  if global_pool is None:
    global_pool = 'avg' if fc_norm or not has_cls else 'token'
  if global_pool in ('token', ''):
    return
  if global_pool != 'avg':
    raise CheckpointError(
      f'{source}: global_pool={global_pool!r}; only token, avg and no pooling map to our models'
    )
  if fc_norm:
    raise CheckpointError(
      f"{source}: fc_norm normalises the average-pooled tokens (global_pool='avg',"
      ' fc_norm=True, as MAE/BEiT fine-tuning); our gap models normalise the tokens before'
      ' pooling: no model of ours computes this one'
    )
  if has_cls:
    raise CheckpointError(
      f"{source}: global_pool='avg' with a class token averages the patch tokens only; our"
      ' gap models have no class token: no model of ours computes this one'
    )


def _prefix_rows(
  posemb: np.ndarray, num_prefix: int, grid: tuple[int, int] | None, source: str
) -> np.ndarray:
  """timm's `pos_embed` with one row per prefix token: zeros where `no_embed_class` (told by
  the length against `grid`, or against a square grid) left them out."""
  length = posemb.shape[1]
  if not num_prefix:
    return posemb
  if grid is not None:
    patches = grid[0] * grid[1]
    if length not in (patches, patches + num_prefix):
      raise CheckpointError(
        f'{source}: pos_embed {shape_str(posemb.shape)} does not fit a {grid[0]}x{grid[1]} grid'
        f' with {num_prefix} prefix token(s)'
      )
    no_embed_class = length == patches
  elif square_side(length - num_prefix) is not None:
    no_embed_class = False
  elif square_side(length) is not None:
    no_embed_class = True
  else:
    raise CheckpointError(
      f'{source}: pos_embed {shape_str(posemb.shape)} is not a square grid with or without'
      ' prefix rows: keep the config.json timm saved (img_size) beside the weights'
    )
  if no_embed_class:
    zeros = np.zeros((1, num_prefix, posemb.shape[2]), posemb.dtype)
    posemb = np.concatenate([zeros, posemb], axis=1)
  return posemb


def _unsupported(key: str, source: str) -> None:
  for pattern, what in _UNSUPPORTED.items():
    if pattern.search(key):
      raise CheckpointError(f'{source}: {key!r} is {what}, which our ViT does not compute')


def _map_key(key: str, value: np.ndarray, heads: int | None, source: str) -> dict[str, np.ndarray]:
  """One timm tensor (not pos_embed) as our key(s) and array(s)."""
  if m := _QKV_RE.match(key):
    leaf = 'kernel' if m.group(2) == 'weight' else 'bias'
    split = pytorch.split_qkv(f'qkv_{leaf}', value, heads, key, source)
    return {f'{ATTN.format(i=int(m.group(1)))}/{n}/{leaf}': v for n, v in split.items()}
  found = pytorch.lookup(key, _TOP_MAP, _LAYER_RE, _BLOCK_MAP)
  if found is None:
    raise CheckpointError(
      f'{source}: unexpected key {key!r} {shape_str(value.shape)}: not a parameter of a plain'
      ' timm VisionTransformer'
    )
  ours, kind = found
  return {ours: pytorch.torch_to_ours(kind, value, heads, key, source)}


def from_timm_state_dict(
  state: Mapping[str, np.ndarray],
  num_heads: int | None,
  *,
  global_pool: str | None = None,
  grid: tuple[int, int] | None = None,
  source: str = 'state dict',
) -> dict[str, Any]:
  """A timm VisionTransformer (or DeiT distilled) state dict -> our tree.

  `global_pool` is timm's (None: 'token' with a class token, else 'avg'); `grid` the patch
  grid the position embeddings were trained at, needed only for a non-square one.
  """
  if state and all(k.startswith('module.') for k in state):  # saved from DistributedDataParallel
    state = {k.removeprefix('module.'): v for k, v in state.items()}
  for key in state:
    _unsupported(key, source)
  _check_pooling(state, global_pool, source)
  num_prefix = int('cls_token' in state) + int('dist_token' in state)

  def map_key(key: str, value: np.ndarray) -> dict[str, np.ndarray]:
    if key == 'pos_embed':
      return {POSEMB: _prefix_rows(value, num_prefix, grid, source)}
    name = 'norm.' + key.removeprefix('fc_norm.') if key.startswith('fc_norm.') else key
    return _map_key(name, value, num_heads, source)

  flat = pytorch.walk(state, map_key, source)
  if not any(k.endswith('.attn.qkv.bias') for k in state):  # qkv_bias=False
    _zero_qkv_biases(flat)
  pairs = [('head/kernel', 'head/bias'), ('head_dist/kernel', 'head_dist/bias')]
  return pytorch.checked_tree(flat, BACKBONE, pairs, source, 'a timm VisionTransformer')


def _zero_qkv_biases(flat: dict[str, np.ndarray]) -> None:
  """Zero q/k/v biases (timm's `qkv_bias=False`) for every block with a query kernel."""
  for key in [k for k in flat if k.endswith('/query/kernel')]:
    kernel = flat[key]
    for name in QKV:
      flat[key.replace('/query/kernel', f'/{name}/bias')] = np.zeros(kernel.shape[1:], kernel.dtype)


def read(path: str | Path, *, num_heads: int | None = None, **unused: Any) -> tuple[dict, str]:
  """Reads a timm folder or weights file; returns (tree, description). The heads are
  config.json's (`model_args.num_heads`, or its architecture's), else `num_heads`."""
  del unused
  path = files.path(path)
  config = _read_config(path)
  weights = pytorch.weights_of(path, WEIGHT_FILES)
  num_heads = _heads_from_config(config) or num_heads
  state = pytorch.read_state_dict(weights)
  grid = None
  if (size := _image_size_from_config(config)) and 'patch_embed.proj.weight' in state:
    ph, pw = state['patch_embed.proj.weight'].shape[2:]
    grid = (size[0] // ph, size[1] // pw)
  tree = from_timm_state_dict(
    state, num_heads, global_pool=_global_pool(config), grid=grid, source=str(path)
  )

  notes = ['qkv split into query/key/value']
  if not any(k.endswith('.attn.qkv.bias') for k in state):
    notes.append('no qkv bias: zeros')
  if config is None:
    notes.append('no config.json: tanh GELU')
  else:
    gelu = 'tanh' if _gelu_approximate(config, path) else 'exact'
    notes.append(f'{config["architecture"]}, {gelu} GELU')
  return tree, pytorch.description('timm', weights, state, notes)


def load(path: str | Path, *, num_heads: int | None = None) -> dict:
  """Our parameter tree from a timm folder or weights file."""
  return read(path, num_heads=num_heads)[0]


# ---------------------------------------------------------------------------------------------
# Writing.

_GLOBAL_POOL = {'token': 'token', 'gap': 'avg', 'unpooled': '', 'token_unpooled': ''}


def _classifier(flat: Mapping[str, Any], model_config: Any) -> str:
  """Our classifier, checked to be exportable: a plain ViT timm computes the same way."""
  pytorch.check_exportable(flat, model_config, _WHAT)
  if 'pre_logits/kernel' in flat:
    raise CheckpointError(
      'pre_logits (the representation layer) has no counterpart in timm 1.x VisionTransformer:'
      ' export with --to=hf --num_classes=0, or --to=npz'
    )
  classifier = config_field(model_config, 'classifier', 'token' if 'cls' in flat else 'gap')
  if classifier not in _GLOBAL_POOL:
    raise CheckpointError(f'classifier={classifier!r} has no timm VisionTransformer equivalent')
  if (classifier in ('token', 'token_unpooled')) != ('cls' in flat):
    raise CheckpointError(
      f'classifier={classifier!r} but the parameters {"have" if "cls" in flat else "lack"} a'
      ' class token (cls): pass the model config the parameters were trained with'
    )
  return classifier


def to_timm_state_dict(
  params: Mapping[str, Any], model_config: Any = None
) -> dict[str, np.ndarray]:
  """Our tree -> a timm VisionTransformer state dict (numpy arrays), q/k/v fused into qkv.

  A tree with `dist_token` and `head_dist` gives the state dict of timm's
  `VisionTransformerDistilled` (DeiT).
  """
  flat = {k: np.asarray(v) for k, v in flatten(params).items()}
  _classifier(flat, model_config)
  state = pytorch.unwalk(flat, _TOP_MAP, ('blocks.{i}.', _BLOCK_MAP), _WHAT, skip=_OUR_QKV_RE)
  for i in block_numbers(flat):
    attn = ATTN.format(i=i)
    for leaf, kind, suffix in (('kernel', 'qkv_kernel', 'weight'), ('bias', 'qkv_bias', 'bias')):
      parts = [pytorch.ours_to_torch(kind, flat[f'{attn}/{n}/{leaf}']) for n in QKV]
      state[f'blocks.{i}.attn.qkv.{suffix}'] = np.concatenate(parts, axis=0)
  return state


def _architecture(size: str | None, patch: tuple[int, int], distilled: bool) -> str:
  """A registered timm architecture of this size; `model_args` override its every field."""
  if distilled:
    size = size if size in ('tiny', 'small', 'base') and patch == (16, 16) else 'base'
    return f'deit_{size}_distilled_patch16_224'
  if size in _PATCHES and patch[0] == patch[1] and patch[0] in _PATCHES[size]:
    return f'vit_{size}_patch{patch[0]}_224'
  return 'vit_base_patch16_224'


def _pretrained_cfg(image_size: list[int], num_classes: int, distilled: bool) -> dict[str, Any]:
  """timm's data config: our models take the whole image, resized, with pixels in [-1, 1]."""
  return {
    'input_size': [3, *image_size],
    'fixed_input_size': True,
    'interpolation': 'bilinear',
    'crop_pct': 1.0,
    'crop_mode': 'center',
    'mean': [0.5, 0.5, 0.5],
    'std': [0.5, 0.5, 0.5],
    'num_classes': num_classes,
    'first_conv': 'patch_embed.proj',
    'classifier': ['head', 'head_dist'] if distilled else 'head',
  }


def timm_config(model: pytorch.Export) -> dict[str, Any]:
  """The exported `config.json`: timm's hub format, `model_args` = create_model's arguments."""
  flat, arch = model.flat, model.arch
  classifier = _classifier(flat, model.model_config)
  t, d = arch.transformer, arch.hidden_size
  if int(d * (t.mlp_dim / d)) != t.mlp_dim:
    raise CheckpointError(f'mlp_dim {t.mlp_dim} is not int(hidden * mlp_ratio) for any float ratio')
  num_classes, distilled = arch.num_classes or 0, 'dist_token' in flat
  size = model.image_size
  if model.layer_norm_epsilon != LAYER_NORM_EPSILON:
    logging.warning(
      "timm's config.json has no place for the model's LayerNorm epsilon %g: timm computes"
      " the export with 1e-6, so its logits differ slightly from the model's",
      model.layer_norm_epsilon,
    )
  model_args = {
    'img_size': [size, size] if isinstance(size, int) else list(size),
    'patch_size': list(arch.patches.size),
    'embed_dim': d,
    'depth': t.num_layers,
    'num_heads': t.num_heads,
    'mlp_ratio': t.mlp_dim / d,
    'qkv_bias': True,
    'class_token': 'cls' in flat,
    'no_embed_class': False,
    'global_pool': _GLOBAL_POOL[classifier],
    'fc_norm': False,
    'num_classes': num_classes,
    'act_layer': 'gelu_tanh' if model.gelu_approximate else 'gelu',
    'norm_layer': NORM_LAYER,
  }
  config: dict[str, Any] = {
    'architecture': _architecture(
      _SIZES.get((d, t.num_layers, t.num_heads)), tuple(arch.patches.size), distilled
    ),
    'num_classes': num_classes,
    'num_features': d,
    'global_pool': model_args['global_pool'],
    'model_args': model_args,
    'pretrained_cfg': _pretrained_cfg(model_args['img_size'], num_classes, distilled),
  }
  if model.labels is not None:
    config['label_names'] = model.labels
  return config

"""Hugging Face `transformers` ViT checkpoints: read them into our tree, export ours to them.

On disk (and on the hub) a ViT state dict uses the 4.x key names, which transformers 5.x
still writes with `save_pretrained` and renames in memory on `from_pretrained`:

  [vit.]embeddings.{cls_token, position_embeddings, patch_embeddings.projection.*}
  [vit.]encoder.layer.{i}.{layernorm_before, attention.attention.{query,key,value},
                           attention.output.dense, layernorm_after, intermediate.dense,
                           output.dense}.*
  [vit.]layernorm.*, classifier.* (ViTForImageClassification), pooler.dense.* (ViTModel)

The 5.x in-memory names (`layers.{i}.attention.q_proj`, `mlp.fc1`, ...), as written by saving
a 5.x `state_dict()` directly, are read too. Kernels are transposed (PyTorch stores (out, in))
and the attention kernels reshaped to our (D, heads, head_dim) layout, so the number of heads
comes from `config.json` (else from the caller: a guess). `pooler.dense` is our `pre_logits`
(Dense + tanh on the class token). `config.json`'s `hidden_act` and `layer_norm_eps` are the
model's fields (`model_fields`): 'gelu' is the exact GELU (`gelu_approximate=False`),
'gelu_pytorch_tanh' (or 'gelu_new', 'gelu_fast') the tanh approximation of our default; an
epsilon other than our 1e-6 (transformers' default and the hub configs of Google's ViTs say
1e-12) is `layer_norm_epsilon`; without a config.json our defaults hold. What the project
computes otherwise than the directory states, its image processor's resize and value range,
`unlike` names. Exports write the 4.x names, `model.safetensors` and a `config.json` with
the model's GELU (`gelu_pytorch_tanh` unless `gelu_approximate=False`: the released weights
were trained with it, though the hub configs of Google's ViTs say 'gelu'), its epsilon
(1e-6 unless the model has another) and the head's class names (`id2label`). This module holds
the key maps, the checks and the config writer; reading, walking and writing are
`pytorch`'s, shared with timm.
"""

import re
from collections.abc import Mapping
from typing import Any

import numpy as np
from etils.epath import Path

from vit_jax import files
from vit_jax.checkpoint import pytorch
from vit_jax.checkpoint.pytorch import ATTN, BACKBONE, BLOCK, read_state_dict
from vit_jax.checkpoint.tree import (
  POSEMB,
  CheckpointError,
  config_field,
  flatten,
  gelu_fields,
  layer_norm_fields,
  shape_str,
)

WEIGHT_FILES = (
  'model.safetensors',
  'model.safetensors.index.json',
  'pytorch_model.bin',
  'pytorch_model.bin.index.json',
)
HIDDEN_ACT = 'gelu_pytorch_tanh'  # flax nn.gelu(approximate=True)
# `hidden_act` -> our `gelu_approximate` (transformers' ViTConfig default is 'gelu').
HIDDEN_ACTS = {'gelu': False, 'gelu_pytorch_tanh': True, 'gelu_new': True, 'gelu_fast': True}
LAYER_NORM_EPS = 1e-12  # transformers' ViTConfig default, where config.json states none

# transformers 5.x in-memory names -> the 4.x names on disk (after the `vit.` prefix).
_V5_RENAMES = (
  (
    re.compile(r'^layers\.(\d+)\.attention\.q_proj\.'),
    r'encoder.layer.\1.attention.attention.query.',
  ),
  (
    re.compile(r'^layers\.(\d+)\.attention\.k_proj\.'),
    r'encoder.layer.\1.attention.attention.key.',
  ),
  (
    re.compile(r'^layers\.(\d+)\.attention\.v_proj\.'),
    r'encoder.layer.\1.attention.attention.value.',
  ),
  (re.compile(r'^layers\.(\d+)\.attention\.o_proj\.'), r'encoder.layer.\1.attention.output.dense.'),
  (re.compile(r'^layers\.(\d+)\.mlp\.fc1\.'), r'encoder.layer.\1.intermediate.dense.'),
  (re.compile(r'^layers\.(\d+)\.mlp\.fc2\.'), r'encoder.layer.\1.output.dense.'),
  (re.compile(r'^layers\.(\d+)\.layernorm_'), r'encoder.layer.\1.layernorm_'),
)
_LAYER_RE = re.compile(r'^encoder\.layer\.(\d+)\.(.+)$')
# 4.x name inside a layer -> (our key, kind of transform).
_LAYER_MAP = {
  'layernorm_before.weight': (BLOCK + '/LayerNorm_0/scale', 'copy'),
  'layernorm_before.bias': (BLOCK + '/LayerNorm_0/bias', 'copy'),
  'attention.attention.query.weight': (ATTN + '/query/kernel', 'qkv_kernel'),
  'attention.attention.query.bias': (ATTN + '/query/bias', 'qkv_bias'),
  'attention.attention.key.weight': (ATTN + '/key/kernel', 'qkv_kernel'),
  'attention.attention.key.bias': (ATTN + '/key/bias', 'qkv_bias'),
  'attention.attention.value.weight': (ATTN + '/value/kernel', 'qkv_kernel'),
  'attention.attention.value.bias': (ATTN + '/value/bias', 'qkv_bias'),
  'attention.output.dense.weight': (ATTN + '/out/kernel', 'out_kernel'),
  'attention.output.dense.bias': (ATTN + '/out/bias', 'copy'),
  'layernorm_after.weight': (BLOCK + '/LayerNorm_1/scale', 'copy'),
  'layernorm_after.bias': (BLOCK + '/LayerNorm_1/bias', 'copy'),
  'intermediate.dense.weight': (BLOCK + '/MlpBlock_0/Dense_0/kernel', 'linear'),
  'intermediate.dense.bias': (BLOCK + '/MlpBlock_0/Dense_0/bias', 'copy'),
  'output.dense.weight': (BLOCK + '/MlpBlock_0/Dense_1/kernel', 'linear'),
  'output.dense.bias': (BLOCK + '/MlpBlock_0/Dense_1/bias', 'copy'),
}
# 4.x name outside the layers (after the `vit.` prefix) -> (our key, kind).
_TOP_MAP = {
  'embeddings.cls_token': ('cls', 'copy'),
  'embeddings.position_embeddings': (POSEMB, 'copy'),
  'embeddings.patch_embeddings.projection.weight': ('embedding/kernel', 'conv'),
  'embeddings.patch_embeddings.projection.bias': ('embedding/bias', 'copy'),
  'layernorm.weight': ('Transformer/encoder_norm/scale', 'copy'),
  'layernorm.bias': ('Transformer/encoder_norm/bias', 'copy'),
  'pooler.dense.weight': ('pre_logits/kernel', 'linear'),
  'pooler.dense.bias': ('pre_logits/bias', 'copy'),
}
# Outside the `vit.` prefix of ViTForImageClassification.
_HEAD_MAP = {
  'classifier.weight': ('head/kernel', 'linear'),
  'classifier.bias': ('head/bias', 'copy'),
}


_WHAT = 'Hugging Face ViT'


# ---------------------------------------------------------------------------------------------
# Reading.


def detect(path: Path) -> bool:
  """A Hugging Face model directory, or a .safetensors / PyTorch weights file."""
  if path.is_dir():
    return pytorch.weights_in(path, WEIGHT_FILES) is not None
  suffixes = ('.safetensors', *pytorch.TORCH_SUFFIXES)
  return path.is_file() and path.suffix in suffixes


def _gelu_approximate(config: Mapping[str, Any], source: Path) -> bool:
  """Our `gelu_approximate` for the config's `hidden_act`; another activation is an error."""
  return pytorch.gelu_approximate(
    config.get('hidden_act', 'gelu'), HIDDEN_ACTS, 'hidden_act', source
  )


def model_fields(path: Path) -> dict[str, Any]:
  """The model fields `config.json` states beyond the shapes: the GELU of its `hidden_act`,
  the epsilon of its `layer_norm_eps`."""
  config = pytorch.read_config(path)
  if config is None:
    return {}
  epsilon = float(config.get('layer_norm_eps', LAYER_NORM_EPS))
  return gelu_fields(_gelu_approximate(config, path)) | layer_norm_fields(epsilon)


def states_heads(path: Path) -> bool:
  """Whether `config.json` states the attention heads (else the caller's are a guess)."""
  return (pytorch.read_config(path) or {}).get('num_attention_heads') is not None


def processor_unlike(processor: Mapping[str, Any] | None) -> list[str]:
  """How an image processor's `preprocessor_config.json` prepares images otherwise than the
  project (`pytorch.preprocessing_unlike`); [] without one."""
  if processor is None:
    return []
  rescale = (
    float(processor.get('rescale_factor', 1 / 255)) if processor.get('do_rescale', True) else 1.0
  )
  normalize = processor.get('do_normalize', True)
  mean = np.asarray(processor.get('image_mean', 0.5) if normalize else 0.0, np.float64)
  std = np.asarray(processor.get('image_std', 0.5) if normalize else 1.0, np.float64)
  method = pytorch.PIL_RESAMPLE.get(processor.get('resample', 2), str(processor.get('resample')))
  crop = 1.0
  if processor.get('do_center_crop') and isinstance(processor.get('crop_size'), Mapping):
    size, cropped = processor.get('size') or {}, processor['crop_size']
    if size.get('height') and cropped.get('height'):
      crop = float(cropped['height']) / float(size['height'])
  # In units of x / 255: (x * rescale - mean) / std = (x / 255 - mean / (255 rescale)) / ...
  unit = 255 * rescale
  where = 'preprocessor_config.json'
  return pytorch.preprocessing_unlike(where, method, mean / unit, std / unit, crop)


def unlike(path: Path) -> list[str]:
  """What the project computes otherwise than the directory states: its image processor's
  resize and values (config.json's GELU and epsilon the model takes, `model_fields`)."""
  return processor_unlike(pytorch.read_config(path, 'preprocessor_config.json'))


def _map_key(key: str, value: np.ndarray, num_heads: int | None, source: str) -> dict:
  """One tensor (4.x or 5.x name, with or without `vit.`) as our key and array."""
  if key in _HEAD_MAP:  # outside the `vit.` prefix
    found = _HEAD_MAP[key]
  else:
    name = key.removeprefix('vit.')
    for pattern, replacement in _V5_RENAMES:
      name = pattern.sub(replacement, name)
    found = pytorch.lookup(name, _TOP_MAP, _LAYER_RE, _LAYER_MAP)
  if found is None:
    raise CheckpointError(
      f'{source}: unexpected key {key!r} {shape_str(value.shape)}: not a plain ViT'
      ' (ViTModel / ViTForImageClassification) parameter'
    )
  ours, kind = found
  return {ours: pytorch.torch_to_ours(kind, value, num_heads, key, source)}


def from_hf_state_dict(
  state: Mapping[str, np.ndarray], num_heads: int | None, source: str = 'state dict'
) -> dict[str, Any]:
  """A ViT state dict (4.x or 5.x names, with or without `vit.`) -> our tree.

  Every key must map; a key that does not (a DeiT distillation token, a mask token, a
  hybrid backbone) is an error, as is a missing one (heads and pre_logits are optional).
  """
  flat = pytorch.walk(state, lambda key, value: _map_key(key, value, num_heads, source), source)
  pairs = [('head/kernel', 'head/bias'), ('pre_logits/kernel', 'pre_logits/bias')]
  return pytorch.checked_tree(flat, (*BACKBONE, 'cls'), pairs, source, 'a ViT checkpoint')


def _notes(state: Mapping[str, Any], config: Mapping[str, Any] | None, path: Path) -> list[str]:
  """What `read` says of the names and of config.json's model."""
  v5 = any(k.startswith('layers.') or '.layers.' in k for k in state)
  notes = ['transformers 5.x names' if v5 else '4.x names']
  if config is not None:
    arch = (config.get('architectures') or ['?'])[0]
    exact = not _gelu_approximate(config, path)
    eps = config.get('layer_norm_eps', LAYER_NORM_EPS)
    notes.append(f'{arch}, {"exact" if exact else "tanh"} GELU, layer_norm_eps={eps:g}')
  return notes


def read(path: str | Path, *, num_heads: int | None = None, **unused: Any) -> tuple[dict, str]:
  """Reads a Hugging Face ViT directory or weights file; returns (tree, description). The
  heads are config.json's, else `num_heads`."""
  del unused
  path = files.path(path)
  config = pytorch.read_config(path)
  weights = pytorch.weights_of(path, WEIGHT_FILES)
  if config is not None and config.get('model_type', 'vit') != 'vit':
    raise CheckpointError(
      f'{path}: config.json says model_type={config.get("model_type")!r}; only plain ViT'
      " ('vit') checkpoints map to our models"
    )
  num_heads = (config or {}).get('num_attention_heads') or num_heads
  state = read_state_dict(weights)
  tree = from_hf_state_dict(state, num_heads, str(path))
  return tree, pytorch.description('hf', weights, state, _notes(state, config, path))


# ---------------------------------------------------------------------------------------------
# Writing.


def _check_exportable(flat: Mapping[str, Any], model_config: Any) -> None:
  """Our tree is a ViT that Hugging Face's ViT computes the same way: token pooling."""
  pytorch.check_exportable(flat, model_config, _WHAT)
  classifier = config_field(model_config, 'classifier', 'token')
  if classifier != 'token' or 'cls' not in flat:
    what = f'classifier={classifier!r}' if classifier != 'token' else 'a model without cls'
    raise CheckpointError(
      f"{what}: Hugging Face ViT pools the class token only (classifier='token');"
      ' export this model with --to=npz'
    )
  if 'head/kernel' in flat and 'pre_logits/kernel' in flat:
    raise CheckpointError(
      'the model has both pre_logits (representation layer) and a head, which Hugging Face'
      ' ViTForImageClassification cannot hold: drop the head (--num_classes=0) to export a'
      ' ViTModel with pooler, or fine-tune without representation_size'
    )
  kh, kw = flat['embedding/kernel'].shape[:2]
  if kh != kw:
    raise CheckpointError(
      f'patch size {kh}x{kw} is not square; Hugging Face ViT needs square patches'
    )


def to_hf_state_dict(params: Mapping[str, Any], model_config: Any = None) -> dict[str, np.ndarray]:
  """Our tree -> a Hugging Face ViT state dict with the 4.x key names (numpy arrays).

  With a `head`, the keys are `ViTForImageClassification`'s (`vit.` prefix, `classifier`);
  without one they are `ViTModel`'s (no prefix), with `pre_logits` as `pooler.dense`.
  `model_config` (optional) is only checked: hybrids and non-token classifiers cannot export.
  """
  flat = {k: np.asarray(v) for k, v in flatten(params).items()}
  _check_exportable(flat, model_config)
  prefix = 'vit.' if 'head/kernel' in flat else ''
  top = {prefix + name: mapped for name, mapped in _TOP_MAP.items()} | _HEAD_MAP
  return pytorch.unwalk(flat, top, (prefix + 'encoder.layer.{i}.', _LAYER_MAP), _WHAT)


def hf_config(model: pytorch.Export) -> dict[str, Any]:
  """The exported `config.json` (plain JSON: writing it does not need transformers)."""
  arch, flat = model.arch, model.flat
  d, patch = arch.hidden_size, arch.patches.size[0]
  transformer = config_field(model.model_config, 'transformer') or {}
  config: dict[str, Any] = {
    'architectures': ['ViTForImageClassification' if 'head/kernel' in flat else 'ViTModel'],
    'model_type': 'vit',
    'hidden_size': d,
    'num_hidden_layers': arch.transformer.num_layers,
    'num_attention_heads': arch.transformer.num_heads,
    'intermediate_size': arch.transformer.mlp_dim,
    'hidden_act': HIDDEN_ACT if model.gelu_approximate else 'gelu',
    'hidden_dropout_prob': float(transformer.get('dropout_rate', 0.0)),
    'attention_probs_dropout_prob': float(transformer.get('attention_dropout_rate', 0.0)),
    'initializer_range': 0.02,
    'layer_norm_eps': model.layer_norm_epsilon,
    'image_size': model.image_size if isinstance(model.image_size, int) else [*model.image_size],
    'patch_size': patch,
    'num_channels': int(flat['embedding/kernel'].shape[2]),
    'qkv_bias': True,
    'encoder_stride': patch,
    'pooler_output_size': arch.representation_size or d,
    'pooler_act': 'tanh',
    'dtype': str(flat['cls'].dtype),
  }
  if arch.num_classes:
    names = model.labels or [f'LABEL_{i}' for i in range(arch.num_classes)]
    config['id2label'] = {str(i): name for i, name in enumerate(names)}
    config['label2id'] = {name: i for i, name in enumerate(names)}
  return config

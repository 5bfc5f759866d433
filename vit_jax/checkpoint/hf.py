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
comes from `config.json` (or the caller). `pooler.dense` is our `pre_logits` (Dense + tanh on
the class token). `config.json`'s `hidden_act` sets the model's GELU: 'gelu' is the exact one
(`gelu_approximate=False`), 'gelu_pytorch_tanh' (or 'gelu_new', 'gelu_fast') the tanh
approximation of our default; without a config.json the default holds. Exports write the 4.x
names, `model.safetensors` and a `config.json` with the model's GELU (`gelu_pytorch_tanh`
unless `gelu_approximate=False`: the released weights were trained with it, though the hub
configs of Google's ViTs say 'gelu') and `layer_norm_eps=1e-6` (the hub configs say 1e-12,
which shifts logits slightly).
"""

import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

import numpy as np
from absl import logging
from etils.epath import Path

from vit_jax import files
from vit_jax.checkpoint.npz import check_arrays
from vit_jax.checkpoint.tree import (
  POSEMB,
  CheckpointError,
  block_numbers,
  check_complete,
  config_field,
  flatten,
  gelu_fields,
  infer_config,
  natural_key,
  shape_str,
  square_side,
  unflatten,
)

WEIGHT_FILES = (
  'model.safetensors',
  'model.safetensors.index.json',
  'pytorch_model.bin',
  'pytorch_model.bin.index.json',
)
TORCH_SUFFIXES = ('.bin', '.pth', '.pt')
HIDDEN_ACT = 'gelu_pytorch_tanh'  # flax nn.gelu(approximate=True)
# `hidden_act` -> our `gelu_approximate` (transformers' ViTConfig default is 'gelu').
HIDDEN_ACTS = {'gelu': False, 'gelu_pytorch_tanh': True, 'gelu_new': True, 'gelu_fast': True}
LAYER_NORM_EPS = 1e-6  # flax LayerNorm default

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
_BLOCK = 'Transformer/encoderblock_{i}'
_ATTN = _BLOCK + '/MultiHeadDotProductAttention_0'
# 4.x name inside a layer -> (our key, kind of transform).
_LAYER_MAP = {
  'layernorm_before.weight': (_BLOCK + '/LayerNorm_0/scale', 'copy'),
  'layernorm_before.bias': (_BLOCK + '/LayerNorm_0/bias', 'copy'),
  'attention.attention.query.weight': (_ATTN + '/query/kernel', 'qkv_kernel'),
  'attention.attention.query.bias': (_ATTN + '/query/bias', 'qkv_bias'),
  'attention.attention.key.weight': (_ATTN + '/key/kernel', 'qkv_kernel'),
  'attention.attention.key.bias': (_ATTN + '/key/bias', 'qkv_bias'),
  'attention.attention.value.weight': (_ATTN + '/value/kernel', 'qkv_kernel'),
  'attention.attention.value.bias': (_ATTN + '/value/bias', 'qkv_bias'),
  'attention.output.dense.weight': (_ATTN + '/out/kernel', 'out_kernel'),
  'attention.output.dense.bias': (_ATTN + '/out/bias', 'copy'),
  'layernorm_after.weight': (_BLOCK + '/LayerNorm_1/scale', 'copy'),
  'layernorm_after.bias': (_BLOCK + '/LayerNorm_1/bias', 'copy'),
  'intermediate.dense.weight': (_BLOCK + '/MlpBlock_0/Dense_0/kernel', 'linear'),
  'intermediate.dense.bias': (_BLOCK + '/MlpBlock_0/Dense_0/bias', 'copy'),
  'output.dense.weight': (_BLOCK + '/MlpBlock_0/Dense_1/kernel', 'linear'),
  'output.dense.bias': (_BLOCK + '/MlpBlock_0/Dense_1/bias', 'copy'),
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


# ---------------------------------------------------------------------------------------------
# Reading.


def detect(path: Path) -> bool:
  """A Hugging Face model directory, or a .safetensors / PyTorch weights file."""
  if path.is_dir():
    return any((path / name).is_file() for name in WEIGHT_FILES)
  return path.is_file() and (path.suffix == '.safetensors' or path.suffix in TORCH_SUFFIXES)


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
  from safetensors import SafetensorError
  from safetensors.numpy import load, load_file

  try:  # a local file is memory-mapped; a bucket object is read whole
    return load_file(os.fspath(path)) if files.is_local(path) else load(path.read_bytes())
  except (SafetensorError, OSError, ValueError, TypeError) as e:
    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
    raise CheckpointError(
      f'{path}: not a readable .safetensors file ({reason}); it is truncated or corrupt:'
      ' download it again'
    ) from None


def _torch_to_numpy(value: Any, key: str, path: Path) -> np.ndarray:
  import torch

  if not isinstance(value, torch.Tensor):
    raise CheckpointError(f'{path}: {key!r} is a {type(value).__name__}, not a tensor')
  value = value.detach().cpu().contiguous()
  if value.dtype == torch.bfloat16:
    import ml_dtypes

    return value.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
  return value.numpy()


def _read_torch(path: Path) -> dict[str, np.ndarray]:
  """A PyTorch state dict, through `torch.load(weights_only=True)` only: no pickle runs code."""
  try:
    import torch
  except ImportError:
    raise CheckpointError(
      f'{path}: PyTorch weights need torch to read (pip install torch); or use the'
      ' model.safetensors file of the same checkpoint'
    ) from None
  try:
    with path.open('rb') as f:
      state = torch.load(f, map_location='cpu', weights_only=True)
  except Exception as e:  # torch raises UnpicklingError, RuntimeError, EOFError, ...
    reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise CheckpointError(
      f'{path}: refused or unreadable PyTorch file ({reason}); only plain tensor state dicts'
      ' load (weights_only=True): use the .safetensors file instead'
    ) from None
  if isinstance(state, Mapping) and len(state) == 1:
    (only,) = state.values()
    state = only if isinstance(only, Mapping) else state  # {'state_dict': {...}} / {'model': ...}
  if not isinstance(state, Mapping):
    raise CheckpointError(f'{path}: holds a {type(state).__name__}, not a state dict')
  return {k: _torch_to_numpy(v, k, path) for k, v in state.items()}


def read_state_dict(path: Path) -> dict[str, np.ndarray]:
  """The tensors of one file or of a sharded checkpoint (its *.index.json)."""
  if path.name.endswith('.index.json'):
    try:
      shards = sorted(set(json.loads(path.read_text())['weight_map'].values()))
    except (OSError, ValueError, KeyError, AttributeError) as e:
      raise CheckpointError(f'{path}: not a valid shard index ({e})') from None
    state: dict[str, np.ndarray] = {}
    for shard in shards:
      state.update(read_state_dict(path.parent / shard))
    return state
  if not path.is_file():
    raise CheckpointError(f'{path}: missing weights file')
  return _read_safetensors(path) if path.suffix == '.safetensors' else _read_torch(path)


def _read_config(path: Path) -> dict[str, Any] | None:
  if not path.is_file():
    return None
  try:
    config = json.loads(path.read_text())
  except (OSError, ValueError) as e:
    raise CheckpointError(f'{path}: not valid JSON ({e}); fix or delete it') from None
  if not isinstance(config, dict):
    raise CheckpointError(f'{path}: expected a JSON object')
  return config


def _config_of(path: Path) -> dict[str, Any] | None:
  """The `config.json` of a model directory, or beside a weights file; None if there is none."""
  return _read_config((path if path.is_dir() else path.parent) / 'config.json')


def _gelu_approximate(config: Mapping[str, Any], source: Path) -> bool:
  """Our `gelu_approximate` for the config's `hidden_act`; another activation is an error."""
  act = config.get('hidden_act', 'gelu')
  if act not in HIDDEN_ACTS:
    raise CheckpointError(
      f'{source}: config.json says hidden_act={act!r}; our models compute the GELU only'
      f' ({", ".join(HIDDEN_ACTS)})'
    )
  return HIDDEN_ACTS[act]


def model_fields(path: Path) -> dict[str, Any]:
  """The model fields `config.json` states beyond the shapes: the GELU of its `hidden_act`."""
  config = _config_of(path)
  return {} if config is None else gelu_fields(_gelu_approximate(config, path))


def _num_heads(weight: np.ndarray, width: int, num_heads: int | None, key: str, source: str) -> int:
  if num_heads is None:
    raise CheckpointError(
      f'{source}: the number of attention heads is unknown (no config.json with'
      ' num_attention_heads): pass --model NAME (or num_heads=...)'
    )
  if width % num_heads:
    raise CheckpointError(
      f'{source}: {key} has shape {shape_str(weight.shape)}, not divisible into'
      f' num_heads={num_heads} heads: wrong --model or config.json'
    )
  return num_heads


def torch_to_ours(kind: str, w: np.ndarray, heads: int | None, key: str, source: str) -> np.ndarray:
  """A PyTorch weight in our layout: `kind` is 'copy', 'linear' ((out, in) -> (in, out)),
  'conv' (OIHW -> HWIO), or an attention kernel split into `heads`: 'qkv_kernel', 'qkv_bias',
  'out_kernel'."""
  if kind == 'copy':
    return w
  if kind == 'linear':
    return np.ascontiguousarray(w.T)
  if kind == 'conv':
    return np.ascontiguousarray(np.transpose(w, (2, 3, 1, 0)))  # OIHW -> HWIO
  d = w.shape[1] if kind == 'out_kernel' else w.shape[0]  # the width split into heads
  h = _num_heads(w, d, heads, key, source)
  if kind == 'qkv_kernel':
    return np.ascontiguousarray(w.T.reshape(w.shape[1], h, d // h))
  if kind == 'qkv_bias':
    return w.reshape(h, d // h)
  if kind == 'out_kernel':
    return np.ascontiguousarray(w.T.reshape(h, d // h, w.shape[0]))
  raise AssertionError(kind)


def _normalise_key(key: str) -> tuple[str, bool]:
  """(4.x name without the `vit.` prefix, whether it was outside the backbone)."""
  if key in _HEAD_MAP:
    return key, True
  name = key.removeprefix('vit.')
  for pattern, replacement in _V5_RENAMES:
    name = pattern.sub(replacement, name)
  return name, False


def from_hf_state_dict(
  state: Mapping[str, np.ndarray], num_heads: int | None, source: str = 'state dict'
) -> dict[str, Any]:
  """A ViT state dict (4.x or 5.x names, with or without `vit.`) -> our tree.

  Every key must map; a key that does not (a DeiT distillation token, a mask token, a
  hybrid backbone) is an error, as is a missing one.
  """
  flat: dict[str, np.ndarray] = {}
  for key in sorted(state, key=natural_key):
    value = np.asarray(state[key])
    name, is_head = _normalise_key(key)
    if is_head:
      ours, kind = _HEAD_MAP[name]
    elif name in _TOP_MAP:
      ours, kind = _TOP_MAP[name]
    elif (m := _LAYER_RE.match(name)) and m.group(2) in _LAYER_MAP:
      template, kind = _LAYER_MAP[m.group(2)]
      ours = template.format(i=int(m.group(1)))
    else:
      raise CheckpointError(
        f'{source}: unexpected key {key!r} {shape_str(value.shape)}: not a plain ViT'
        ' (ViTModel / ViTForImageClassification) parameter'
      )
    if ours in flat:
      raise CheckpointError(f'{source}: {key!r} maps to {ours!r}, which another key already set')
    flat[ours] = torch_to_ours(kind, value, num_heads, key, source)
  check_arrays(flat, source)
  _check_complete(flat, source)
  return unflatten(flat)


def _check_complete(flat: Mapping[str, np.ndarray], source: str) -> None:
  """Every backbone weight is present (heads and pre_logits are optional)."""
  required = ['embedding/kernel', 'embedding/bias', 'cls', POSEMB]
  required += ['Transformer/encoder_norm/scale', 'Transformer/encoder_norm/bias']
  for i in block_numbers(flat):
    required += [template.format(i=i) for template, _ in _LAYER_MAP.values()]
  pairs = [('head/kernel', 'head/bias'), ('pre_logits/kernel', 'pre_logits/bias')]
  check_complete(flat, required, pairs, source, 'a ViT checkpoint')


def read(path: str | Path, *, num_heads: int | None = None, **unused: Any) -> tuple[dict, str]:
  """Reads a Hugging Face ViT directory or weights file; returns (tree, description)."""
  del unused
  path = files.path(path)
  config = _config_of(path)
  if path.is_dir():
    weights = next((path / n for n in WEIGHT_FILES if (path / n).is_file()), None)
    if weights is None:
      raise CheckpointError(f'{path}: no {" / ".join(WEIGHT_FILES)} in this directory')
  else:
    weights = path
  if config is not None and config.get('model_type', 'vit') != 'vit':
    raise CheckpointError(
      f'{path}: config.json says model_type={config.get("model_type")!r}; only plain ViT'
      " ('vit') checkpoints map to our models"
    )
  if num_heads is None and config is not None:
    num_heads = config.get('num_attention_heads')
  state = read_state_dict(weights)
  tree = from_hf_state_dict(state, num_heads, str(path))

  parts = [weights.name, f'{len(state)} tensors']
  if any(k.startswith('layers.') or '.layers.' in k for k in state):
    parts.append('transformers 5.x names')
  else:
    parts.append('4.x names')
  if config is not None:
    arch = (config.get('architectures') or ['?'])[0]
    exact = not _gelu_approximate(config, path)
    eps = config.get('layer_norm_eps', 1e-12)
    parts.append(f'{arch}, {"exact" if exact else "tanh"} GELU, layer_norm_eps={eps:g}')
    if eps != LAYER_NORM_EPS:
      logging.info(
        '%s: config.json computes with layer_norm_eps=%g; our models use the eps 1e-6 that'
        ' the released weights were trained with.',
        path,
        eps,
      )
  return tree, 'hf (' + ', '.join(parts) + ')'


# ---------------------------------------------------------------------------------------------
# Writing.


def _check_exportable(flat: Mapping[str, Any], model_config: Any) -> None:
  if 'stem/kernel' in flat:
    raise CheckpointError(
      'MLP-Mixer models have no Hugging Face ViT equivalent; export them with --to=npz'
    )
  if 'embedding/kernel' in flat and POSEMB not in flat:
    raise CheckpointError(
      "a model without learned position embeddings (posemb='sincos2d') has no Hugging Face"
      ' ViT equivalent; export it with --to=npz'
    )
  if 'conv_root/kernel' in flat or config_field(model_config, 'resnet') is not None:
    raise CheckpointError(
      'hybrid (ResNet+ViT) models have no Hugging Face ViT equivalent; export them with --to=npz'
    )
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
  inverse: dict[str, tuple[str, str]] = {}
  for hf_key, (ours, kind) in _TOP_MAP.items():
    inverse[ours] = (prefix + hf_key, kind)
  for hf_key, (ours, kind) in _HEAD_MAP.items():
    inverse[ours] = (hf_key, kind)
  for i in block_numbers(flat):
    for hf_key, (template, kind) in _LAYER_MAP.items():
      inverse[template.format(i=i)] = (f'{prefix}encoder.layer.{i}.{hf_key}', kind)

  state = {}
  for key, value in flat.items():
    if key not in inverse:
      raise CheckpointError(f'{key!r} {shape_str(value.shape)} has no Hugging Face ViT equivalent')
    hf_key, kind = inverse[key]
    state[hf_key] = ours_to_torch(kind, value)
  return state


def ours_to_torch(kind: str, value: np.ndarray) -> np.ndarray:
  """The inverse of `torch_to_ours`: our weight in PyTorch's layout (contiguous)."""
  if kind == 'linear':
    value = value.T
  elif kind == 'conv':
    value = np.transpose(value, (3, 2, 0, 1))  # HWIO -> OIHW
  elif kind == 'qkv_kernel':
    value = value.reshape(value.shape[0], -1).T
  elif kind == 'qkv_bias':
    value = value.reshape(-1)
  elif kind == 'out_kernel':
    value = value.reshape(-1, value.shape[-1]).T
  return np.ascontiguousarray(value)


def hf_config(
  params: Mapping[str, Any],
  model_config: Any = None,
  image_size: int | tuple[int, int] | None = None,
  labels: list[str] | None = None,
) -> dict[str, Any]:
  """The exported `config.json` (plain JSON: writing it does not need transformers)."""
  flat = flatten(params)
  arch = infer_config(flat)
  d, layers = arch.hidden_size, arch.transformer.num_layers
  patch = arch.patches.size[0]
  if image_size is None:
    side = square_side(flat[POSEMB].shape[1] - 1)
    if side is None:
      raise CheckpointError(
        f'{POSEMB} {shape_str(flat[POSEMB].shape)} is not a square grid + class row: pass'
        ' image_size=(height, width)'
      )
    image_size = side * patch
  transformer = config_field(model_config, 'transformer') or {}
  config: dict[str, Any] = {
    'architectures': ['ViTForImageClassification' if 'head/kernel' in flat else 'ViTModel'],
    'model_type': 'vit',
    'hidden_size': d,
    'num_hidden_layers': layers,
    'num_attention_heads': arch.transformer.num_heads,
    'intermediate_size': arch.transformer.mlp_dim,
    'hidden_act': HIDDEN_ACT if config_field(model_config, 'gelu_approximate', True) else 'gelu',
    'hidden_dropout_prob': float(transformer.get('dropout_rate', 0.0)),
    'attention_probs_dropout_prob': float(transformer.get('attention_dropout_rate', 0.0)),
    'initializer_range': 0.02,
    'layer_norm_eps': LAYER_NORM_EPS,
    'image_size': image_size if isinstance(image_size, int) else list(image_size),
    'patch_size': patch,
    'num_channels': int(flat['embedding/kernel'].shape[2]),
    'qkv_bias': True,
    'encoder_stride': patch,
    'pooler_output_size': arch.representation_size or d,
    'pooler_act': 'tanh',
    'dtype': str(np.asarray(flat['cls']).dtype),
  }
  if arch.num_classes:
    if labels is not None and len(labels) != arch.num_classes:
      raise CheckpointError(f'{len(labels)} labels for a head of {arch.num_classes} classes')
    names = labels or [f'LABEL_{i}' for i in range(arch.num_classes)]
    config['id2label'] = {str(i): name for i, name in enumerate(names)}
    config['label2id'] = {name: i for i, name in enumerate(names)}
  return config


def export_hf(
  params: Mapping[str, Any],
  model_config: Any,
  out_dir: str | os.PathLike,
  *,
  image_size: int | tuple[int, int] | None = None,
  labels: list[str] | None = None,
) -> Path:
  """Writes `model.safetensors` + `config.json` that `from_pretrained` loads with our logits.

  Nothing partial is left (`write_model_dir`).
  """
  state = to_hf_state_dict(params, model_config)
  config = hf_config(params, model_config, image_size, labels)
  return write_model_dir(out_dir, state, config)


def write_model_dir(
  out_dir: str | os.PathLike, state: Mapping[str, np.ndarray], config: Mapping[str, Any]
) -> Path:
  """Writes `model.safetensors` (PyTorch metadata) and `config.json` into `out_dir`.

  Nothing partial is left: both files are written to a temporary folder first, then moved
  into `out_dir` (a new folder, or one holding at most these two files); in a bucket each
  file is an object written whole.
  """
  from safetensors.numpy import save, save_file

  out_dir = files.path(out_dir)
  names = ('model.safetensors', 'config.json')
  config_text = json.dumps(config, indent=2, sort_keys=True) + '\n'
  _check_out_dir(out_dir)
  if not files.is_local(out_dir):  # each object is written whole; weights first
    weights = save(dict(state), metadata={'format': 'pt'})
    files.atomic_write(out_dir / 'model.safetensors', lambda f: f.write(weights))
    files.atomic_write_text(out_dir / 'config.json', config_text)
    return out_dir
  out_dir.parent.mkdir(parents=True, exist_ok=True)
  tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f'.{out_dir.name}.', suffix='.tmp'))
  try:
    save_file(dict(state), str(tmp / 'model.safetensors'), metadata={'format': 'pt'})
    (tmp / 'config.json').write_text(config_text)
    if out_dir.exists():
      for name in names:
        os.replace(tmp / name, out_dir / name)
      tmp.rmdir()
    else:
      os.rename(tmp, out_dir)
      os.chmod(out_dir, 0o777 & ~_umask())
  finally:
    if tmp.exists():
      shutil.rmtree(tmp)
  return out_dir


def _check_out_dir(out_dir: Path) -> None:
  """A new directory, or one that holds at most the two files written."""
  if out_dir.exists():
    if not out_dir.is_dir():
      raise CheckpointError(f'{out_dir} exists and is not a directory; choose a directory name')
    others = sorted(
      p.name for p in out_dir.iterdir() if p.name not in ('model.safetensors', 'config.json')
    )
    if others:
      raise CheckpointError(
        f'{out_dir} already holds {others[:3]}: choose a new or empty directory'
      )


def _umask() -> int:
  mask = os.umask(0)
  os.umask(mask)
  return mask

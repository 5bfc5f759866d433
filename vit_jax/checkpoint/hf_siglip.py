"""Hugging Face `SiglipModel` checkpoints (SigLIP, and SigLIP 2 at a fixed resolution): read
them into our image-text tree, export ours to them.

transformers' names (`model_type='siglip'`, the same in 4.x and 5.x) and ours:

  vision_model.embeddings.patch_embedding       img/embedding (OIHW -> HWIO)
  vision_model.embeddings.position_embedding    img/Transformer/posembed_input/pos_embedding
                                                ((N, D) rows -> (1, N, D); no class token)
  {vision,text}_model.encoder.layers.{i}.       img/Transformer/encoderblock_{i}/,
                                                txt/Encoder_0/encoderblock_{i}/
    layer_norm1, self_attn.{q,k,v,out}_proj       LayerNorm_0, MultiHeadDotProductAttention_0
    layer_norm2, mlp.fc1, mlp.fc2                 LayerNorm_1, MlpBlock_0/Dense_{0,1}
  vision_model.post_layernorm                   img/Transformer/encoder_norm
  vision_model.head.                            img/MAPHead_0/
    probe, attention.in_proj_* (q, k, v fused)    probe, MultiHeadDotProductAttention_0
    attention.out_proj, layernorm, mlp            .../out, LayerNorm_0, MlpBlock_0
  text_model.embeddings.token_embedding         txt/Embed_0/embedding
  text_model.embeddings.position_embedding      txt/pos_embedding ((L, D) -> (1, L, D))
  text_model.final_layer_norm, text_model.head  txt/Encoder_0/encoder_norm, txt/head
  logit_scale, logit_bias                       t, b

Both compute the same: the image embedding is the MAP head's output (no image projection), the
text embedding the last token's features through `head`, each L2-normalised; logits are
exp(t) zimg ztxt^T + b. So only SigLIP models export (a logit bias, a text transformer pooled
at its last token with a head, a MAP-pooled image tower without one); LiT's do not.

The maps are data (`KeyMap`s built by `vision_encoder_map`, `encoder_map`, `key_map`) and
`to_flat` / `from_flat` walk a state dict through one either way; a reader of transformers'
`Siglip2Model` (the NaFlex tower: its own patch embedding and position grid) reuses the vision
encoder's map. An export writes `model.safetensors`, `config.json`, the image processor's
`preprocessor_config.json` (our preprocessing: resize to the model's size, [-1, 1]) and, given
the sentencepiece vocabulary, the tokenizer's files (`SiglipTokenizer` for SigLIP,
`GemmaTokenizer` for SigLIP 2), so that `AutoModel` and `AutoProcessor` load the directory.
"""

import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
from etils.epath import Path

from vit_jax import files
from vit_jax.checkpoint import hf, pytorch
from vit_jax.checkpoint.pytorch import QKV, KeyMap, read_state_dict
from vit_jax.checkpoint.tree import POSEMB, CheckpointError, config_field, flatten, shape_str
from vit_jax.families import two_towers
from vit_jax.flat import unflatten
from vit_jax.text import GEMMA_IDS

MODEL_TYPE = 'siglip'
_WHAT = 'Hugging Face SiglipModel'
# The tokenizers transformers reads, by our `pp.tokenizer_name`: class, vocabulary file.
TOKENIZERS = {
  'sentencepiece': ('SiglipTokenizer', 'spiece.model'),
  'gemma': ('GemmaTokenizer', 'tokenizer.model'),
}
VOCAB_FILES = tuple(name for _, name in TOKENIZERS.values())
# A fused in-projection (PyTorch's nn.MultiheadAttention): our key has a `{n}` for q, k, v.
_FUSED = {'in_proj_kernel': 'qkv_kernel', 'in_proj_bias': 'qkv_bias'}
_ATTN = 'MultiHeadDotProductAttention_0'
_NORM = {'weight': ('scale', 'copy'), 'bias': ('bias', 'copy')}
_MLP = {
  'fc1.weight': ('MlpBlock_0/Dense_0/kernel', 'linear'),
  'fc1.bias': ('MlpBlock_0/Dense_0/bias', 'copy'),
  'fc2.weight': ('MlpBlock_0/Dense_1/kernel', 'linear'),
  'fc2.bias': ('MlpBlock_0/Dense_1/bias', 'copy'),
}
_QKV_LEAVES = (('weight', 'kernel', 'qkv_kernel'), ('bias', 'bias', 'qkv_bias'))
# An encoder layer (after `encoder.layers.{i}.`) -> ours (after `encoderblock_{i}/`), kind.
LAYER_MAP: KeyMap = {
  **{f'layer_norm1.{k}': (f'LayerNorm_0/{v}', kind) for k, (v, kind) in _NORM.items()},
  **{
    f'self_attn.{h}_proj.{leaf}': (f'{_ATTN}/{n}/{ours}', kind)
    for h, n in zip('qkv', QKV, strict=True)
    for leaf, ours, kind in _QKV_LEAVES
  },
  'self_attn.out_proj.weight': (f'{_ATTN}/out/kernel', 'out_kernel'),
  'self_attn.out_proj.bias': (f'{_ATTN}/out/bias', 'copy'),
  **{f'layer_norm2.{k}': (f'LayerNorm_1/{v}', kind) for k, (v, kind) in _NORM.items()},
  **{f'mlp.{k}': v for k, v in _MLP.items()},
}
# The MAP head (after `head.`) -> big_vision's `MAPHead_0/`.
MAP_HEAD_MAP: KeyMap = {
  'probe': ('probe', 'copy'),
  'attention.in_proj_weight': (f'{_ATTN}/{{n}}/kernel', 'in_proj_kernel'),
  'attention.in_proj_bias': (f'{_ATTN}/{{n}}/bias', 'in_proj_bias'),
  'attention.out_proj.weight': (f'{_ATTN}/out/kernel', 'out_kernel'),
  'attention.out_proj.bias': (f'{_ATTN}/out/bias', 'copy'),
  **{f'layernorm.{k}': (f'LayerNorm_0/{v}', kind) for k, (v, kind) in _NORM.items()},
  **{f'mlp.{k}': v for k, v in _MLP.items()},
}


# ---------------------------------------------------------------------------------------------
# The maps.


def _prefixed(theirs: str, ours: str, key_map: KeyMap) -> dict[str, tuple[str, str]]:
  return {theirs + name: (ours + key, kind) for name, (key, kind) in key_map.items()}


def encoder_map(theirs: str, ours: str, layers: int) -> dict[str, tuple[str, str]]:
  """`{theirs}encoder.layers.{i}.` -> `{ours}encoderblock_{i}/` for `layers` layers."""
  out = {}
  for i in range(layers):
    out |= _prefixed(f'{theirs}encoder.layers.{i}.', f'{ours}encoderblock_{i}/', LAYER_MAP)
  return out


def vision_encoder_map(theirs: str, ours: str, layers: int) -> dict[str, tuple[str, str]]:
  """A SigLIP vision tower past its embeddings (`{theirs}` e.g. 'vision_model.', `{ours}`
  e.g. 'img/'): the encoder layers, `post_layernorm`, the MAP head. SigLIP 2's NaFlex tower
  (transformers' `Siglip2VisionModel`) has these as they are."""
  return {
    **encoder_map(theirs, f'{ours}Transformer/', layers),
    **_prefixed(f'{theirs}post_layernorm.', f'{ours}Transformer/encoder_norm/', _NORM),
    **_prefixed(f'{theirs}head.', f'{ours}MAPHead_0/', MAP_HEAD_MAP),
  }


def key_map(vision_layers: int, text_layers: int) -> dict[str, tuple[str, str]]:
  """Every `SiglipModel` tensor name -> (our flat key, kind of transform)."""
  v, t = 'vision_model.', 'text_model.'
  return {
    f'{v}embeddings.patch_embedding.weight': ('img/embedding/kernel', 'conv'),
    f'{v}embeddings.patch_embedding.bias': ('img/embedding/bias', 'copy'),
    f'{v}embeddings.position_embedding.weight': (f'img/{POSEMB}', 'posemb'),
    **vision_encoder_map(v, 'img/', vision_layers),
    f'{t}embeddings.token_embedding.weight': ('txt/Embed_0/embedding', 'copy'),
    f'{t}embeddings.position_embedding.weight': ('txt/pos_embedding', 'posemb'),
    **encoder_map(t, 'txt/Encoder_0/', text_layers),
    **_prefixed(f'{t}final_layer_norm.', 'txt/Encoder_0/encoder_norm/', _NORM),
    f'{t}head.weight': ('txt/head/kernel', 'linear'),
    f'{t}head.bias': ('txt/head/bias', 'copy'),
    'logit_scale': ('t', 'copy'),
    'logit_bias': ('b', 'copy'),
  }


def _count(names: Iterable[str], pattern: str) -> int:
  """1 + the largest layer number `(\\d+)` of `pattern` among `names` (0 for none)."""
  found = [int(m.group(1)) for n in names if (m := re.match(pattern, n))]
  return max(found, default=-1) + 1


def to_flat(
  state: Mapping[str, np.ndarray],
  keys: Mapping[str, tuple[str, str]],
  heads: Callable[[str], int | None],
  source: str,
) -> dict[str, np.ndarray]:
  """Their state dict -> our flat dict through `keys` (`heads(name)`: the heads of the
  attention a tensor belongs to). Every tensor must map and every name of `keys` be there."""

  def map_key(name: str, value: np.ndarray) -> dict[str, np.ndarray]:
    if name not in keys:
      raise CheckpointError(
        f'{source}: unexpected key {name!r} {shape_str(value.shape)}: not a {_WHAT} parameter'
      )
    ours, kind = keys[name]
    if kind in _FUSED:
      split = pytorch.split_qkv(_FUSED[kind], value, heads(name), name, source)
      return {ours.format(n=n): w for n, w in split.items()}
    return {ours: pytorch.torch_to_ours(kind, value, heads(name), name, source)}

  flat = pytorch.walk(state, map_key, source)
  missing = [name for name in keys if name not in state]
  if missing:
    raise CheckpointError(
      f'{source}: missing {len(missing)} tensors, e.g. {missing[0]!r}; the file is incomplete'
      f' or not a {_WHAT}'
    )
  pytorch.check_arrays(flat, source)
  return flat


def from_flat(
  flat: Mapping[str, np.ndarray], keys: Mapping[str, tuple[str, str]]
) -> dict[str, np.ndarray]:
  """The inverse of `to_flat`: our flat dict -> their state dict (contiguous arrays); a key
  of ours that `keys` does not hold has no equivalent: a one-line error."""
  state, used = {}, set()
  for name, (ours, kind) in keys.items():
    parts = [ours.format(n=n) for n in QKV] if kind in _FUSED else [ours]
    missing = [k for k in parts if k not in flat]
    if missing:
      raise CheckpointError(f'the model lacks {missing[0]!r}, which {_WHAT} needs')
    torch_kind = _FUSED.get(kind, kind)
    state[name] = np.concatenate([pytorch.ours_to_torch(torch_kind, flat[k]) for k in parts])
    used.update(parts)
  extra = sorted(set(flat) - used)
  if extra:
    key = extra[0]
    raise CheckpointError(f'{key!r} {shape_str(flat[key].shape)} has no {_WHAT} equivalent')
  return state


# ---------------------------------------------------------------------------------------------
# Reading.


def _model_type(path: Path) -> str | None:
  """config.json's `model_type` in or beside `path`; None without one (or unreadable: the
  format that claims the path reports it)."""
  try:
    config = pytorch.read_config(path)
  except CheckpointError:
    return None
  return None if config is None else config.get('model_type')


def detect(path: Path) -> bool:
  """A `SiglipModel` directory or weights file: config.json says model_type 'siglip', or (a
  file without one) its tensors have SiglipModel's names."""
  if path.is_dir():
    weights = pytorch.weights_in(path, hf.WEIGHT_FILES)
    return weights is not None and _model_type(path) == MODEL_TYPE
  if not path.is_file() or path.suffix not in ('.safetensors', *pytorch.TORCH_SUFFIXES):
    return False
  model_type = _model_type(path)
  if model_type is not None:
    return model_type == MODEL_TYPE
  names = set(pytorch.state_keys(path))
  return {'logit_bias', 'vision_model.embeddings.patch_embedding.weight'} <= names


def _towers(config: Mapping[str, Any] | None) -> tuple[dict, dict]:
  config = config or {}
  return dict(config.get('vision_config') or {}), dict(config.get('text_config') or {})


def _check_config(config: Mapping[str, Any] | None, source: Path) -> None:
  """config.json describes a model ours computes: SiglipModel's, tanh GELUs, a MAP head."""
  if config is None:
    return
  if config.get('model_type', MODEL_TYPE) != MODEL_TYPE:
    raise CheckpointError(
      f'{source}: config.json says model_type={config.get("model_type")!r}; this reader maps'
      f' {MODEL_TYPE!r} (SiglipModel) checkpoints'
    )
  for tower, sub in zip(('vision_config', 'text_config'), _towers(config), strict=True):
    act = sub.get('hidden_act', hf.HIDDEN_ACT)
    if not pytorch.gelu_approximate(act, hf.HIDDEN_ACTS, f'{tower}.hidden_act', source):
      raise CheckpointError(
        f"{source}: config.json says {tower}.hidden_act={act!r}, the exact GELU; SigLIP's"
        f' towers compute the tanh approximation ({hf.HIDDEN_ACT!r})'
      )
  if not _towers(config)[0].get('vision_use_head', True):
    raise CheckpointError(f'{source}: vision_use_head=false: SiglipModel pools with its MAP head')


def model_fields(path: Path) -> dict[str, Any]:
  """What config.json states beyond the shapes: `pp.size` (the vision tower's `image_size`:
  So400m/14 at 384 px has 27 x 27 patches, which the shapes read as 378) and `pp.max_len`."""
  vision, text = _towers(pytorch.read_config(path))
  pp = {}
  if 'image_size' in vision:
    size = vision['image_size']
    pp['size'] = int(size if isinstance(size, int) else size[0])
  if 'max_position_embeddings' in text:
    pp['max_len'] = int(text['max_position_embeddings'])
  return {'pp': pp} if pp else {}


def _heads(config: Mapping[str, Any] | None, num_heads: int | None) -> Callable[[str], int]:
  """The heads of the attention a tensor belongs to: its tower's in config.json (transformers'
  default 12 where a key is left out), else `num_heads` (the caller's)."""
  if config is None:
    return lambda name: num_heads
  vision, text = (sub.get('num_attention_heads', 12) for sub in _towers(config))
  return lambda name: vision if name.startswith('vision_model.') else text


def from_state_dict(
  state: Mapping[str, np.ndarray], heads: Callable[[str], int | None], source: str = 'state dict'
) -> dict[str, Any]:
  """A SiglipModel state dict -> our tree `{'img', 'txt', 't', 'b'}`."""
  vision = _count(state, r'^vision_model\.encoder\.layers\.(\d+)\.')
  text = _count(state, r'^text_model\.encoder\.layers\.(\d+)\.')
  return unflatten(to_flat(state, key_map(vision, text), heads, source))


def read(path: str | Path, *, num_heads: int | None = None, **unused: Any) -> tuple[dict, str]:
  """Reads a SiglipModel directory or weights file; returns (tree, description)."""
  del unused
  path = files.path(path)
  config = pytorch.read_config(path)
  _check_config(config, path)
  weights = pytorch.weights_of(path, hf.WEIGHT_FILES)
  state = read_state_dict(weights)
  tree = from_state_dict(state, _heads(config, num_heads), str(path))
  vocab = tree['txt']['Embed_0']['embedding'].shape[0]
  notes = ['SiglipModel', 'SigLIP 2 (Gemma vocabulary)' if vocab == two_towers.GEMMA_VOCAB else '']
  eps = {sub.get('layer_norm_eps', hf.LAYER_NORM_EPS) for sub in _towers(config)}
  if eps != {hf.LAYER_NORM_EPS}:
    notes.append(f'layer_norm_eps={",".join(f"{e:g}" for e in eps)} (ours: 1e-6)')
  return tree, pytorch.description('hf_siglip', weights, state, [n for n in notes if n])


# ---------------------------------------------------------------------------------------------
# Writing.


def _check_exportable(flat: Mapping[str, Any], config: Any) -> None:
  """Our image-text tree is a SigLIP model, which SiglipModel computes (module docstring)."""
  txt = {k.removeprefix('txt/'): v for k, v in flat.items() if k.startswith('txt/')}
  text_model = two_towers.text_model_of(txt)
  image = dict(config_field(config, 'image') or {})
  text = dict(config_field(config, 'text') or {})
  reasons = [
    ('b' not in flat, 'a LiT model (a softmax over t-scaled similarities, no logit bias b)'),
    (text_model != 'text_transformer', f'a {text_model or "missing"} text tower'),
    ('txt/head/kernel' not in flat, 'a text tower without a head (out_dim[1] None)'),
    (text.get('pool_type', 'last') != 'last', f'text pool_type={text.get("pool_type")!r}'),
    ('img/MAPHead_0/probe' not in flat, 'an image tower not pooled by a MAP head'),
    ('img/head/kernel' in flat, 'an image head (out_dim[0] set)'),
    (not image.get('gelu_approximate', True), 'the exact GELU (gelu_approximate=False)'),
  ]
  for failed, what in reasons:
    if failed:
      raise CheckpointError(
        f'{what} has no {_WHAT} equivalent (SigLIP models only); convert it with --to=npz'
      )
  img = {k.removeprefix('img/'): v for k, v in flat.items() if k.startswith('img/')}
  pytorch.check_exportable(img, image, _WHAT)
  kh, kw = img['embedding/kernel'].shape[:2]
  if kh != kw:
    raise CheckpointError(f'patch size {kh}x{kw} is not square; {_WHAT} needs square patches')


def to_state_dict(params: Mapping[str, Any], model_config: Any = None) -> dict[str, np.ndarray]:
  """Our SigLIP tree -> a SiglipModel state dict (numpy arrays); `model_config` (optional) is
  only checked."""
  flat = {k: np.asarray(v) for k, v in flatten(params).items()}
  _check_exportable(flat, model_config)
  vision = _count(flat, r'^img/Transformer/encoderblock_(\d+)/')
  text = _count(flat, r'^txt/Encoder_0/encoderblock_(\d+)/')
  return from_flat(flat, key_map(vision, text))


def _special_ids(tokenizer_name: str) -> dict[str, int | None]:
  """The text config's token ids: Gemma's (SigLIP 2), else SigLIP's sentencepiece, `</s>` 1
  and padding with it (big_vision's `pad_value=1`)."""
  if tokenizer_name == 'gemma':
    return {
      'pad_token_id': GEMMA_IDS['pad'],
      'bos_token_id': None,
      'eos_token_id': GEMMA_IDS['eos'],
    }
  pad = two_towers.LOWER_CASE_OPTIONS['pad_value']
  return {'pad_token_id': pad, 'bos_token_id': None, 'eos_token_id': pad}


def siglip_config(params: Mapping[str, Any], pp: Mapping[str, Any]) -> dict[str, Any]:
  """The exported `config.json` (plain JSON: writing it does not need transformers); `pp` the
  model's (its `size`, the image size written)."""
  arch = two_towers.infer_config(params)
  image, text = arch.image, arch.text
  towers = {'hidden_act': hf.HIDDEN_ACT, 'layer_norm_eps': hf.LAYER_NORM_EPS}
  towers['attention_dropout'] = 0.0
  vision_config = {
    'model_type': 'siglip_vision_model',
    'hidden_size': image.hidden_size,
    'intermediate_size': image.transformer.mlp_dim,
    'num_hidden_layers': image.transformer.num_layers,
    'num_attention_heads': image.transformer.num_heads,
    'num_channels': int(params['img']['embedding']['kernel'].shape[2]),
    'image_size': int(pp['size']),
    'patch_size': int(image.patches.size[0]),
    'vision_use_head': True,
    **towers,
  }
  text_config = {
    'model_type': 'siglip_text_model',
    'vocab_size': text.vocab_size,
    'hidden_size': text.width,
    'intermediate_size': text.mlp_dim,
    'num_hidden_layers': text.num_layers,
    'num_attention_heads': text.num_heads,
    'max_position_embeddings': arch.pp.max_len,
    'projection_size': arch.out_dim[1],
    **_special_ids(arch.pp.tokenizer_name),
    **towers,
  }
  return {
    'architectures': ['SiglipModel'],
    'model_type': MODEL_TYPE,
    'vision_config': vision_config,
    'text_config': text_config,
    'initializer_factor': 1.0,
    'dtype': str(np.asarray(params['t']).dtype),
  }


def _json(data: Mapping[str, Any]) -> bytes:
  return (json.dumps(data, indent=2, sort_keys=True) + '\n').encode()


def image_processor_config(size: int) -> dict[str, Any]:
  """`SiglipImageProcessor`'s settings for our preprocessing: resize to the model's square
  (bilinear: PIL's 2), then (x / 255 - 0.5) / 0.5, our (x - 127.5) / 127.5 in [-1, 1]."""
  return {
    'image_processor_type': 'SiglipImageProcessor',
    'processor_class': 'SiglipProcessor',
    'do_convert_rgb': True,
    'do_resize': True,
    'size': {'height': size, 'width': size},
    'resample': 2,
    'do_rescale': True,
    'rescale_factor': 1 / 255,
    'do_normalize': True,
    'image_mean': [0.5, 0.5, 0.5],
    'image_std': [0.5, 0.5, 0.5],
  }


def tokenizer_files(pp: Mapping[str, Any], vocab: str) -> dict[str, bytes]:
  """transformers' tokenizer files for the model's tokenizer (`pp`) on the sentencepiece file
  `vocab`: SigLIP's `SiglipTokenizer` (spiece.model; `</s>` appended and kept last, padded
  with big_vision's id 1) or SigLIP 2's `GemmaTokenizer` (tokenizer.model; no <bos>, <eos>
  appended, padding <pad> 0). Pad to `model_max_length` (`padding='max_length'`) for our ids."""
  import sentencepiece

  name = pp.get('tokenizer_name')
  if name not in TOKENIZERS:
    raise CheckpointError(f'tokenizer {name!r} has no transformers SigLIP tokenizer')
  try:
    two_towers.tokenizer(pp, vocab)  # the model's own checks of the file (Gemma's ids)
  except ValueError as e:
    raise CheckpointError(str(e)) from None
  data = files.path(vocab).read_bytes()
  piece = sentencepiece.SentencePieceProcessor(model_proto=data).id_to_piece
  cls, filename = TOKENIZERS[name]
  config = {'tokenizer_class': cls, 'processor_class': 'SiglipProcessor', 'padding_side': 'right'}
  config['model_max_length'] = int(pp['max_len'])
  ids = _special_ids(name)
  config |= {'eos_token': piece(ids['eos_token_id']), 'pad_token': piece(ids['pad_token_id'])}
  if name == 'gemma':
    config |= {'bos_token': piece(GEMMA_IDS['bos']), 'unk_token': piece(GEMMA_IDS['unk'])}
    config |= {'add_bos_token': False, 'add_eos_token': True}
  else:
    processor = sentencepiece.SentencePieceProcessor(model_proto=data)
    config |= {'unk_token': piece(processor.unk_id()), 'do_lower_case': bool(pp.get('lower_case'))}
  return {filename: data, 'tokenizer_config.json': _json(config)}


def export(
  params: Mapping[str, Any],
  model_config: Any,
  out_dir: Any,
  *,
  image_size: int | tuple[int, int] | None = None,
  vocab: str | None = None,
) -> Path:
  """Writes a SigLIP tree as a directory `transformers.AutoModel` loads as `SiglipModel`:
  model.safetensors, config.json, preprocessor_config.json and, with the sentencepiece
  `vocab`, the tokenizer's files (`AutoProcessor` then loads it); nothing partial.
  `image_size` defaults to the model's `pp.size` (else the position embeddings' square)."""
  state = to_state_dict(params, model_config)
  pp = config_field(model_config, 'pp') or two_towers.infer_config(params).pp
  pp = dict(pp.to_dict() if hasattr(pp, 'to_dict') else pp)
  if image_size is not None:
    height, width = (image_size, image_size) if isinstance(image_size, int) else image_size
    if height != width:
      raise CheckpointError(f'image size {height}x{width}: {_WHAT} takes square images')
    pp['size'] = int(height)
  extra = {'preprocessor_config.json': _json(image_processor_config(int(pp['size'])))}
  if vocab is not None:
    extra |= tokenizer_files(pp, vocab)
  return pytorch.write_model_dir(out_dir, state, siglip_config(params, pp), extra)

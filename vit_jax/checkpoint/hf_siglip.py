"""Hugging Face `SiglipModel` and `Siglip2Model` checkpoints (SigLIP; SigLIP 2 at a fixed
resolution; SigLIP 2's NaFlex): read them into our image-text tree, export ours to them.

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

`Siglip2Model` (`model_type='siglip2'`, our `image_model='naflex'`) has the same names and
differs in the vision embeddings alone (`VARIANTS`), which are big_vision's NaFlex tower's:

  vision_model.embeddings.patch_embedding       img/embedding (a Linear over flattened
                                                patches: (D, p * p * 3) -> (p * p * 3, D))
  vision_model.embeddings.position_embedding    img/pos_embedding ((G * G, D) -> (G, G, D))

A bare weights file (no config.json) is told apart by that patch embedding: 4-D, SiglipModel;
2-D, Siglip2Model. Both compute the same as ours: the image embedding is the MAP head's output
(no image projection; NaFlex: over the image's patches alone, the position grid resized to its
patch grid), the text embedding the last token's features through `head`, each L2-normalised;
logits are exp(t) zimg ztxt^T + b. So only SigLIP models export (a logit bias, a text
transformer pooled at its last token with a head, a MAP-pooled image tower without one); LiT's
do not.

The maps are data (`KeyMap`s built by `vision_encoder_map`, `encoder_map`, `key_map`) and
`to_flat` / `from_flat` walk a state dict through one either way. An export writes
`model.safetensors`, `config.json`, the image processor's `preprocessor_config.json` (our
preprocessing: resize to the model's size, or for NaFlex to at most `pp.max_patches` patches at
the image's aspect ratio; [-1, 1]) and, given the sentencepiece vocabulary, the tokenizer's
files (`SiglipTokenizer` for SigLIP, `GemmaTokenizer` for SigLIP 2), so that `AutoModel` and
`AutoProcessor` load the directory.
"""

import dataclasses
import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
from etils.epath import Path

from vit_jax import files
from vit_jax.checkpoint import hf, pytorch
from vit_jax.checkpoint.pytorch import QKV, KeyMap, read_state_dict
from vit_jax.checkpoint.tree import (
  POSEMB,
  CheckpointError,
  config_field,
  flatten,
  layer_norm_fields,
  shape_str,
)
from vit_jax.families import naflex, two_towers
from vit_jax.flat import unflatten
from vit_jax.models.precision import LAYER_NORM_EPSILON
from vit_jax.text import GEMMA_IDS

MODEL_TYPE = 'siglip'
LAYER_NORM_EPS = 1e-6  # transformers' SiglipVisionConfig and SiglipTextConfig default, ours
SIGLIP2 = 'siglip2'
_WHAT = 'Hugging Face SiglipModel'  # the default of the maps' errors
_PATCH = 'vision_model.embeddings.patch_embedding'
_POSITIONS = 'vision_model.embeddings.position_embedding'
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


@dataclasses.dataclass(frozen=True)
class Variant:
  """What differs between transformers' SiglipModel and Siglip2Model: the vision embeddings
  (a conv and position rows; a Linear over flattened patches and a position grid, NaFlex's),
  the class names written, and the image processor's settings beside the shared ones."""

  model_type: str
  architecture: str
  patch_ndim: int  # of `patch_embedding.weight`: tells the two apart in a bare weights file
  embeddings: KeyMap
  processor: str
  image_processor: str

  @property
  def what(self) -> str:
    return f'Hugging Face {self.architecture}'


VARIANTS = {
  MODEL_TYPE: Variant(
    MODEL_TYPE, 'SiglipModel', 4,
    {f'{_PATCH}.weight': ('img/embedding/kernel', 'conv'),
     f'{_PATCH}.bias': ('img/embedding/bias', 'copy'),
     f'{_POSITIONS}.weight': (f'img/{POSEMB}', 'posemb')},
    'SiglipProcessor', 'SiglipImageProcessor',
  ),
  SIGLIP2: Variant(
    SIGLIP2, 'Siglip2Model', 2,
    {f'{_PATCH}.weight': (f'img/{naflex.PATCH_KERNEL}', 'linear'),
     f'{_PATCH}.bias': ('img/embedding/bias', 'copy'),
     f'{_POSITIONS}.weight': (f'img/{naflex.POSEMB}', 'grid')},
    'Siglip2Processor', 'Siglip2ImageProcessor',
  ),
}  # fmt: skip


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


def key_map(
  vision_layers: int, text_layers: int, model_type: str = MODEL_TYPE
) -> dict[str, tuple[str, str]]:
  """Every `SiglipModel` (or with `model_type='siglip2'`, `Siglip2Model`) tensor name ->
  (our flat key, kind of transform): the same but for the vision embeddings."""
  v, t = 'vision_model.', 'text_model.'
  return {
    **VARIANTS[model_type].embeddings,
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
  what: str = _WHAT,
) -> dict[str, np.ndarray]:
  """Their state dict -> our flat dict through `keys` (`heads(name)`: the heads of the
  attention a tensor belongs to). Every tensor must map and every name of `keys` be there;
  an error says the file is not a `what`."""

  def map_key(name: str, value: np.ndarray) -> dict[str, np.ndarray]:
    if name not in keys:
      raise CheckpointError(
        f'{source}: unexpected key {name!r} {shape_str(value.shape)}: not a {what} parameter'
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
      f' or not a {what}'
    )
  pytorch.check_arrays(flat, source)
  return flat


def from_flat(
  flat: Mapping[str, np.ndarray], keys: Mapping[str, tuple[str, str]], what: str = _WHAT
) -> dict[str, np.ndarray]:
  """The inverse of `to_flat`: our flat dict -> their state dict (contiguous arrays); a key
  of ours that `keys` does not hold has no `what` equivalent: a one-line error."""
  state, used = {}, set()
  for name, (ours, kind) in keys.items():
    parts = [ours.format(n=n) for n in QKV] if kind in _FUSED else [ours]
    missing = [k for k in parts if k not in flat]
    if missing:
      raise CheckpointError(f'the model lacks {missing[0]!r}, which {what} needs')
    torch_kind = _FUSED.get(kind, kind)
    state[name] = np.concatenate([pytorch.ours_to_torch(torch_kind, flat[k]) for k in parts])
    used.update(parts)
  extra = sorted(set(flat) - used)
  if extra:
    key = extra[0]
    raise CheckpointError(f'{key!r} {shape_str(flat[key].shape)} has no {what} equivalent')
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


def _by_patch_ndim(ndim: int) -> str | None:
  """The variant whose patch embedding weight has `ndim` dimensions (4: a conv, 2: NaFlex's
  Linear), or None."""
  return next((v.model_type for v in VARIANTS.values() if v.patch_ndim == ndim), None)


def variant_of(path: Path) -> str | None:
  """'siglip' or 'siglip2' for a `SiglipModel` or `Siglip2Model` directory or weights file
  (config.json's model_type; a file without one: SiglipModel's tensor names, the patch
  embedding 4-D for SiglipModel, 2-D for Siglip2Model), else None."""
  if path.is_dir():
    weights = pytorch.weights_in(path, hf.WEIGHT_FILES)
    model_type = _model_type(path)
    return model_type if weights is not None and model_type in VARIANTS else None
  if not path.is_file() or path.suffix not in ('.safetensors', *pytorch.TORCH_SUFFIXES):
    return None
  model_type = _model_type(path)
  if model_type is not None:
    return model_type if model_type in VARIANTS else None
  shapes = pytorch.state_shapes(path)
  if 'logit_bias' not in shapes or f'{_PATCH}.weight' not in shapes:
    return None
  return _by_patch_ndim(len(shapes[f'{_PATCH}.weight']))


def detect(path: Path) -> bool:
  """A `SiglipModel` or `Siglip2Model` directory or weights file (`variant_of`)."""
  return variant_of(path) is not None


def _towers(config: Mapping[str, Any] | None) -> tuple[dict, dict]:
  config = config or {}
  return dict(config.get('vision_config') or {}), dict(config.get('text_config') or {})


def _check_config(config: Mapping[str, Any] | None, source: Path) -> None:
  """config.json describes a model ours computes: SiglipModel's or Siglip2Model's, tanh
  GELUs, a MAP head."""
  if config is None:
    return
  if config.get('model_type', MODEL_TYPE) not in VARIANTS:
    raise CheckpointError(
      f'{source}: config.json says model_type={config.get("model_type")!r}; this reader maps'
      f' {MODEL_TYPE!r} (SiglipModel) and {SIGLIP2!r} (Siglip2Model) checkpoints'
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


def _tower_fields(vision: Mapping[str, Any], text: Mapping[str, Any]) -> dict[str, Any]:
  """Each tower's LayerNorm epsilon where its config states one other than our 1e-6."""
  fields = {}
  for name, sub in (('image', vision), ('text', text)):
    stated = layer_norm_fields(float(sub.get('layer_norm_eps', LAYER_NORM_EPS)))
    if stated:
      fields[name] = stated
  return fields


def model_fields(path: Path) -> dict[str, Any]:
  """What the files state beyond the shapes: `pp.size` (the vision tower's `image_size`:
  So400m/14 at 384 px has 27 x 27 patches, which the shapes read as 378), `pp.max_len`
  (`max_position_embeddings`), a NaFlex model's `pp.max_patches` (its image processor's
  `max_num_patches` in preprocessor_config.json) and each tower's `layer_norm_epsilon`
  (`layer_norm_eps`) where it is not our 1e-6."""
  vision, text = _towers(pytorch.read_config(path))
  processor = pytorch.read_config(path, 'preprocessor_config.json') or {}
  pp = {}
  if 'image_size' in vision:
    size = vision['image_size']
    pp['size'] = int(size if isinstance(size, int) else size[0])
  if 'max_position_embeddings' in text:
    pp['max_len'] = int(text['max_position_embeddings'])
  if 'max_num_patches' in processor:
    pp['max_patches'] = int(processor['max_num_patches'])
  return ({'pp': pp} if pp else {}) | _tower_fields(vision, text)


def states_heads(path: Path) -> bool:
  """Whether a config.json states the towers' heads (else the caller's are a guess)."""
  return pytorch.read_config(path) is not None


def unlike(path: Path) -> list[str]:
  """What the project computes otherwise than the directory states: its image processor's
  resize (the hub's SigLIP processors: bicubic) and values."""
  return hf.processor_unlike(pytorch.read_config(path, 'preprocessor_config.json'))


def _heads(config: Mapping[str, Any] | None, num_heads: int | None) -> Callable[[str], int]:
  """The heads of the attention a tensor belongs to: its tower's in config.json (transformers'
  default 12 where a key is left out), else `num_heads` (the caller's)."""
  if config is None:
    return lambda name: num_heads
  vision, text = (sub.get('num_attention_heads', 12) for sub in _towers(config))
  return lambda name: vision if name.startswith('vision_model.') else text


def _state_model_type(config: Mapping[str, Any] | None, state: Mapping[str, Any]) -> str:
  """config.json's `model_type`, else the variant its patch embedding's dimensions tell
  (SiglipModel's where it has none: `to_flat` names it missing)."""
  if config is not None:
    return config.get('model_type', MODEL_TYPE)
  return _by_patch_ndim(np.ndim(state.get(f'{_PATCH}.weight'))) or MODEL_TYPE


def from_state_dict(
  state: Mapping[str, np.ndarray],
  heads: Callable[[str], int | None],
  source: str = 'state dict',
  model_type: str | None = None,
) -> dict[str, Any]:
  """A SiglipModel or Siglip2Model state dict (`model_type`; None: told by its patch
  embedding) -> our tree `{'img', 'txt', 't', 'b'}`."""
  variant = VARIANTS[model_type or _state_model_type(None, state)]
  patch = np.shape(state.get(f'{_PATCH}.weight'))
  if len(patch) not in (0, variant.patch_ndim):  # absent: to_flat names it missing
    raise CheckpointError(
      f'{source}: {_PATCH}.weight {shape_str(patch)} is not {variant.architecture}'
      f"'s ({variant.patch_ndim}-D): config.json's model_type does not match the weights"
    )
  vision = _count(state, r'^vision_model\.encoder\.layers\.(\d+)\.')
  text = _count(state, r'^text_model\.encoder\.layers\.(\d+)\.')
  keys = key_map(vision, text, variant.model_type)
  return unflatten(to_flat(state, keys, heads, source, variant.what))


def read(path: str | Path, *, num_heads: int | None = None, **unused: Any) -> tuple[dict, str]:
  """Reads a SiglipModel or Siglip2Model directory or weights file; returns (tree,
  description)."""
  del unused
  path = files.path(path)
  config = pytorch.read_config(path)
  _check_config(config, path)
  weights = pytorch.weights_of(path, hf.WEIGHT_FILES)
  state = read_state_dict(weights)
  model_type = _state_model_type(config, state)
  tree = from_state_dict(state, _heads(config, num_heads), str(path), model_type)
  vocab = tree['txt']['Embed_0']['embedding'].shape[0]
  notes = [VARIANTS[model_type].architecture]
  notes.append('SigLIP 2 (Gemma vocabulary)' if vocab == two_towers.GEMMA_VOCAB else '')
  eps = {sub.get('layer_norm_eps', LAYER_NORM_EPS) for sub in _towers(config)}
  if eps != {LAYER_NORM_EPS}:
    notes.append(f'layer_norm_eps={",".join(f"{e:g}" for e in sorted(eps))}')
  return tree, pytorch.description('hf_siglip', weights, state, [n for n in notes if n])


# ---------------------------------------------------------------------------------------------
# Writing.


def _image_flat(flat: Mapping[str, Any]) -> dict[str, Any]:
  return {k.removeprefix('img/'): v for k, v in flat.items() if k.startswith('img/')}


def variant_of_tree(flat: Mapping[str, Any]) -> Variant:
  """Siglip2Model's for a NaFlex image tower, else SiglipModel's."""
  return VARIANTS[SIGLIP2 if naflex.owns_tree(_image_flat(flat)) else MODEL_TYPE]


def _check_exportable(flat: Mapping[str, Any], config: Any) -> None:
  """Our image-text tree is a SigLIP model, which SiglipModel (Siglip2Model, a NaFlex image
  tower) computes (module docstring)."""
  txt = {k.removeprefix('txt/'): v for k, v in flat.items() if k.startswith('txt/')}
  text_model = two_towers.text_model_of(txt)
  image = dict(config_field(config, 'image') or {})
  text = dict(config_field(config, 'text') or {})
  what = variant_of_tree(flat).what
  reasons = [
    ('b' not in flat, 'a LiT model (a softmax over t-scaled similarities, no logit bias b)'),
    (text_model != 'text_transformer', f'a {text_model or "missing"} text tower'),
    ('txt/head/kernel' not in flat, 'a text tower without a head (out_dim[1] None)'),
    (text.get('pool_type', 'last') != 'last', f'text pool_type={text.get("pool_type")!r}'),
    ('img/MAPHead_0/probe' not in flat, 'an image tower not pooled by a MAP head'),
    ('img/head/kernel' in flat, 'an image head (out_dim[0] set)'),
    (not image.get('gelu_approximate', True), 'the exact GELU (gelu_approximate=False)'),
  ]
  for failed, reason in reasons:
    if failed:
      raise CheckpointError(
        f'{reason} has no {what} equivalent (SigLIP models only); convert it with --to=npz'
      )
  img = _image_flat(flat)
  if naflex.owns_tree(img):  # square patches and a position grid by construction
    return
  pytorch.check_exportable(img, image, what)
  kh, kw = img['embedding/kernel'].shape[:2]
  if kh != kw:
    raise CheckpointError(f'patch size {kh}x{kw} is not square; {what} needs square patches')


def to_state_dict(params: Mapping[str, Any], model_config: Any = None) -> dict[str, np.ndarray]:
  """Our SigLIP tree -> a SiglipModel (a NaFlex image tower: Siglip2Model) state dict (numpy
  arrays); `model_config` (optional) is only checked."""
  flat = {k: np.asarray(v) for k, v in flatten(params).items()}
  _check_exportable(flat, model_config)
  variant = variant_of_tree(flat)
  vision = _count(flat, r'^img/Transformer/encoderblock_(\d+)/')
  text = _count(flat, r'^txt/Encoder_0/encoderblock_(\d+)/')
  return from_flat(flat, key_map(vision, text, variant.model_type), variant.what)


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


def _vision_config(params: Mapping[str, Any], image: Any, pp: Mapping[str, Any]) -> dict:
  """The vision tower's config.json fields of its variant: SiglipModel's image size and
  patch; Siglip2Model's patch and position grid (`num_patches`, G * G), any image size."""
  if naflex.owns_tree(flatten(params['img'])):
    grid = int(params['img'][naflex.POSEMB].shape[0])
    return {'num_patches': grid * grid, 'patch_size': int(image.patch_size), 'num_channels': 3}
  return {
    'image_size': int(pp['size']),
    'patch_size': int(image.patches.size[0]),
    'num_channels': int(params['img']['embedding']['kernel'].shape[2]),
  }


def siglip_config(
  params: Mapping[str, Any], pp: Mapping[str, Any], model_config: Any = None
) -> dict[str, Any]:
  """The exported `config.json` (plain JSON: writing it does not need transformers) of
  SiglipModel, or of Siglip2Model for a NaFlex image tower; `pp` the model's (its `size`,
  the image size written); `model_config` gives each tower's LayerNorm epsilon (1e-6)."""
  arch = two_towers.infer_config(params)
  image, text = arch.image, arch.text
  variant = variant_of_tree(flatten(params))
  towers = {'hidden_act': hf.HIDDEN_ACT, 'attention_dropout': 0.0}
  eps = {
    name: float(
      dict(config_field(model_config, name) or {}).get('layer_norm_epsilon', LAYER_NORM_EPSILON)
    )
    for name in ('image', 'text')
  }
  vision_config = {
    'model_type': f'{variant.model_type}_vision_model',
    'hidden_size': image.hidden_size,
    'intermediate_size': image.transformer.mlp_dim,
    'num_hidden_layers': image.transformer.num_layers,
    'num_attention_heads': image.transformer.num_heads,
    **_vision_config(params, image, pp),
    'vision_use_head': True,
    'layer_norm_eps': eps['image'],
    **towers,
  }
  text_config = {
    'model_type': f'{variant.model_type}_text_model',
    'vocab_size': text.vocab_size,
    'hidden_size': text.width,
    'intermediate_size': text.mlp_dim,
    'num_hidden_layers': text.num_layers,
    'num_attention_heads': text.num_heads,
    'max_position_embeddings': arch.pp.max_len,
    'projection_size': arch.out_dim[1],
    **_special_ids(arch.pp.tokenizer_name),
    'layer_norm_eps': eps['text'],
    **towers,
  }
  return {
    'architectures': [variant.architecture],
    'model_type': variant.model_type,
    'vision_config': vision_config,
    'text_config': text_config,
    'initializer_factor': 1.0,
    'dtype': str(np.dtype(getattr(params['t'], 'dtype', np.float32))),  # arrays or shapes
  }


def _json(data: Mapping[str, Any]) -> bytes:
  return (json.dumps(data, indent=2, sort_keys=True) + '\n').encode()


# Our pixels: (x / 255 - 0.5) / 0.5, our (x - 127.5) / 127.5 in [-1, 1]; bilinear (PIL's 2).
_PIXELS = {
  'do_convert_rgb': True,
  'do_resize': True,
  'resample': 2,
  'do_rescale': True,
  'rescale_factor': 1 / 255,
  'do_normalize': True,
  'image_mean': [0.5, 0.5, 0.5],
  'image_std': [0.5, 0.5, 0.5],
}


def image_processor_config(size: int) -> dict[str, Any]:
  """`SiglipImageProcessor`'s settings for our preprocessing: resize to the model's square,
  then our [-1, 1]."""
  variant = VARIANTS[MODEL_TYPE]
  return {
    'image_processor_type': variant.image_processor,
    'processor_class': variant.processor,
    'size': {'height': size, 'width': size},
    **_PIXELS,
  }


def naflex_processor_config(patch: int, max_patches: int) -> dict[str, Any]:
  """`Siglip2ImageProcessor`'s settings for a NaFlex model's: at most `max_patches` (its
  `pp.max_patches`) patches of `patch` at the image's own aspect ratio, our [-1, 1]."""
  variant = VARIANTS[SIGLIP2]
  return {
    'image_processor_type': variant.image_processor,
    'processor_class': variant.processor,
    'patch_size': patch,
    'max_num_patches': max_patches,
    **_PIXELS,
  }


def tokenizer_files(
  pp: Mapping[str, Any],
  vocab: str,
  processor: str = 'SiglipProcessor',
  call_defaults: Mapping[str, Any] | None = None,
) -> dict[str, bytes]:
  """transformers' tokenizer files for the model's tokenizer (`pp`) on the sentencepiece file
  `vocab`, for the `processor` class: SigLIP's `SiglipTokenizer` (spiece.model; `</s>`
  appended and kept last, padded with big_vision's id 1) or SigLIP 2's `GemmaTokenizer`
  (tokenizer.model; no <bos>, <eos> appended, padding <pad> 0; transformers 5 loads it
  beside a Siglip2Model as `Siglip2Tokenizer`, which lower-cases). Pad to `model_max_length`
  (`padding='max_length'`) for our ids. `call_defaults` go into tokenizer_config.json: the
  processor's call takes them over its own class defaults (`ProcessorMixin._merge_kwargs`)."""
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
  config = {'tokenizer_class': cls, 'processor_class': processor, 'padding_side': 'right'}
  config['model_max_length'] = int(pp['max_len'])
  ids = _special_ids(name)
  config |= {'eos_token': piece(ids['eos_token_id']), 'pad_token': piece(ids['pad_token_id'])}
  if name == 'gemma':
    config |= {'bos_token': piece(GEMMA_IDS['bos']), 'unk_token': piece(GEMMA_IDS['unk'])}
    config |= {'add_bos_token': False, 'add_eos_token': True}
  else:
    processor = sentencepiece.SentencePieceProcessor(model_proto=data)
    config |= {'unk_token': piece(processor.unk_id()), 'do_lower_case': bool(pp.get('lower_case'))}
  config |= dict(call_defaults or {})
  return {filename: data, 'tokenizer_config.json': _json(config)}


def export(
  params: Mapping[str, Any],
  model_config: Any,
  out_dir: Any,
  *,
  image_size: int | tuple[int, int] | None = None,
  vocab: str | None = None,
) -> Path:
  """Writes a SigLIP tree as a directory `transformers.AutoModel` loads as `SiglipModel` (a
  NaFlex image tower: `Siglip2Model`): model.safetensors, config.json,
  preprocessor_config.json and, with the sentencepiece `vocab`, the tokenizer's files
  (`AutoProcessor` then loads it); nothing partial. `image_size` defaults to the model's
  `pp.size` (else the position embeddings' square); a NaFlex model has none (its
  `pp.max_patches` patches an image, 256 by default)."""
  state = to_state_dict(params, model_config)
  variant = variant_of_tree(flatten(params))
  pp = config_field(model_config, 'pp') or two_towers.infer_config(params).pp
  pp = dict(pp.to_dict() if hasattr(pp, 'to_dict') else pp)
  call_defaults = {}
  if variant.model_type == SIGLIP2:
    if image_size is not None:
      raise CheckpointError(f'image size {image_size}: a NaFlex model takes any size, none is set')
    patch = int(two_towers.infer_config(params).image.patch_size)
    max_patches = int(pp.get('max_patches', two_towers.NAFLEX_PATCHES))
    processor = naflex_processor_config(patch, max_patches)
    # Siglip2Processor's call defaults (patches of 16, 256 of them, 64 tokens) override the
    # image processor's and the tokenizer's settings, but not the tokenizer config's keys.
    call_defaults = {'patch_size': patch, 'max_num_patches': max_patches}
    call_defaults['max_length'] = int(pp['max_len'])
  else:
    if image_size is not None:
      height, width = (image_size, image_size) if isinstance(image_size, int) else image_size
      if height != width:
        raise CheckpointError(f'image size {height}x{width}: {variant.what} takes square images')
      pp['size'] = int(height)
    processor = image_processor_config(int(pp['size']))
  extra = {'preprocessor_config.json': _json(processor)}
  if vocab is not None:
    extra |= tokenizer_files(pp, vocab, variant.processor, call_defaults)
  config = siglip_config(params, pp, model_config)
  return pytorch.write_model_dir(out_dir, state, config, extra)

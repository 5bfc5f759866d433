"""BERT text towers from Hugging Face's `BertModel` files and the original BERT TF checkpoints.

The released LiT models started their BERT text towers from released BERT weights (big_vision's
`bert.load` reads the original TF checkpoint into flaxformer's `BertEncoder`). `read(path)`
reads either layout into our `BertTower` tree (`BertEncoder_0/...`, vit_jax/models/text.py):

* Hugging Face (`BertModel.save_pretrained`: a directory with model.safetensors (or
  pytorch_model.bin, read with `weights_only=True`) and config.json, or a weights file):
  `embeddings.{word,position,token_type}_embeddings.weight`, `embeddings.LayerNorm.*`,
  `encoder.layer.{i}.{attention.self.{query,key,value}, attention.output.dense,
  attention.output.LayerNorm, intermediate.dense, output.dense, output.LayerNorm}.*`,
  `pooler.dense.*`; LayerNorms as `weight`/`bias` or, in older files, `gamma`/`beta`.
  BertForPreTraining and BertForMaskedLM files hold these under `bert.`, beside heads
  (`cls.*`), which are ignored.
* The original BERT TF checkpoint (`bert_model.ckpt`: its prefix, or its directory; read with
  `tf.train.load_checkpoint`, never a pickle): `bert/embeddings/...`, `bert/encoder/layer_{i}/
  ...` (kernels (in, out), LayerNorm `gamma`/`beta`), `bert/pooler/dense/*`; what lies
  outside `bert/` (`cls/*`, `global_step`) and optimizer slots (`.../adam_m`, `adam_v`) are
  ignored. Its `bert_config.json` (or config.json) beside it is read as HF's config.json.

Hugging Face's names are rewritten into the TF names first (kernels transposed), so one map
takes both to ours. Our tower pools the final layer's [CLS] token, without BERT's pooler
(flaxformer's `BertEncoder`, as LiT): `pooler/dense` is left out, and said so. What the shapes
cannot say comes from the config: the heads (`num_attention_heads`, else hidden / 64, BERT's),
`layer_norm_eps`, and the GELU (`hidden_act`): Hugging Face's 'gelu' is the exact GELU
(`gelu_approximate=False`, bert-base-uncased's), its 'gelu_new' the tanh one; the original BERT
code's 'gelu' is the tanh approximation, so a TF checkpoint's GELU is `gelu_approximate=True`.

`fit_tower` fits what was read to a model's initialised text tower (the contrastive task's
`config.text_pretrained_path`).
"""

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
from etils.epath import Path

from vit_jax import files
from vit_jax.checkpoint import hf, pytorch
from vit_jax.checkpoint.npz import check_arrays
from vit_jax.checkpoint.surgery import LoadReport
from vit_jax.checkpoint.tree import CheckpointError, flatten, shape_str, unflatten
from vit_jax.families.two_towers import bert_config

ENCODER = 'BertEncoder_0'
# config.json's `hidden_act` -> our `gelu_approximate`: Hugging Face's names, and the original
# BERT code's (its `gelu` computes the tanh approximation).
HF_ACTS = {'gelu': False, 'gelu_new': True, 'gelu_pytorch_tanh': True, 'gelu_fast': True}
TF_ACTS = {'gelu': True}
TF_CONFIGS = ('bert_config.json', 'config.json')
_DENSES = {  # TF module inside a layer -> ours inside `layers_{i}`
  'attention/self/query': 'attention_block/attention_layer/query',
  'attention/self/key': 'attention_block/attention_layer/key',
  'attention/self/value': 'attention_block/attention_layer/value',
  'attention/output/dense': 'attention_block/dense_layer',
  'intermediate/dense': 'mlp_block/mlp/dense_layer',
  'output/dense': 'mlp_block/dense_layer',
}
_NORMS = {
  'attention/output/LayerNorm': 'attention_block/layer_norm',
  'output/LayerNorm': 'mlp_block/layer_norm',
}
_LEAVES = {'kernel': 'kernel', 'bias': 'bias', 'gamma': 'scale', 'beta': 'bias'}
# TF name (inside `bert/`) -> ours (inside BertEncoder_0).
TOP = {
  'embeddings/word_embeddings': 'embedder/embedders_token_ids/embedding',
  'embeddings/position_embeddings': 'embedder/embedders_position_ids/embedding',
  'embeddings/token_type_embeddings': 'embedder/embedders_segment_ids/embedding',
  'embeddings/LayerNorm/gamma': 'layer_norm/scale',
  'embeddings/LayerNorm/beta': 'layer_norm/bias',
}
LAYER = {
  f'{tf}/{leaf}': f'{ours}/{_LEAVES[leaf]}'
  for modules, leaves in ((_DENSES, ('kernel', 'bias')), (_NORMS, ('gamma', 'beta')))
  for tf, ours in modules.items()
  for leaf in leaves
}
POOLER = ('pooler/dense/kernel', 'pooler/dense/bias')  # not in our tower: left out
_LAYER_RE = re.compile(r'^encoder/layer_(\d+)/(.+)$')
_OUR_LAYER = 'encoder_block/layer_sequence/layers_{i}'
_HF_LAYER_RE = re.compile(r'^encoder\.layer\.(\d+)\.')
_OPTIMIZER_SLOTS = re.compile(r'/(adam_[mv]|Momentum|Adagrad)$')


@dataclasses.dataclass(frozen=True)
class BertFile:
  """A BERT file read: `tree`, our text tower's tree without its head (`{'BertEncoder_0':
  ...}`); `fields`, its `BertTower` fields (the shapes', and `num_heads`, `gelu_approximate`,
  `layer_norm_epsilon` from the config); `stated`, the names of the fields its config states
  beyond the shapes; `left_out`, the file's weights our tower has no place for (the pooler);
  `ignored`, how many arrays were not BERT's encoder (heads, optimizer slots);
  `description`, one line."""

  tree: dict[str, Any]
  fields: dict[str, Any]
  stated: tuple[str, ...]
  left_out: tuple[str, ...]
  ignored: int
  description: str


def _hf_to_tf(key: str, value: np.ndarray) -> tuple[str, np.ndarray]:
  """A Hugging Face name (without `bert.`) and weight -> the TF name and layout."""
  name = _HF_LAYER_RE.sub(r'encoder/layer_\1/', key).replace('.', '/')
  if '/' not in name:
    return name, value  # not BERT's: `_encoder` says so
  module, leaf = name.rsplit('/', 1)
  if module.endswith('LayerNorm'):
    leaf = {'weight': 'gamma', 'bias': 'beta'}.get(leaf, leaf)
  elif module.startswith('embeddings/') and leaf == 'weight':
    return module, value  # an nn.Embedding's (rows, D) table, as TF stores it
  elif leaf == 'weight':
    leaf, value = 'kernel', value.T  # nn.Linear's (out, in) -> TF's (in, out)
  return f'{module}/{leaf}', value


def _ours(name: str) -> str | None:
  """Our key (inside BertEncoder_0) of a TF name inside `bert/`, or None."""
  if name in TOP:
    return TOP[name]
  m = _LAYER_RE.match(name)
  if m and m.group(2) in LAYER:
    return f'{_OUR_LAYER.format(i=int(m.group(1)))}/{LAYER[m.group(2)]}'
  return None


def _encoder(tf_flat: Mapping[str, np.ndarray], source: str) -> tuple[dict, tuple[str, ...]]:
  """The TF-named weights inside `bert/` -> (our flat BertEncoder_0, the names left out)."""
  if 'embeddings/word_embeddings' not in tf_flat:
    raise CheckpointError(
      f'{source}: not a BERT checkpoint (no embeddings.word_embeddings); text_pretrained_path'
      ' takes a Hugging Face BertModel (model.safetensors) or an original BERT TF checkpoint'
    )
  flat, left_out = {}, []
  for name, value in tf_flat.items():
    ours = _ours(name)
    if ours is not None:
      flat[f'{ENCODER}/{ours}'] = np.ascontiguousarray(value)
    elif name in POOLER:
      left_out.append(name)
    else:
      raise CheckpointError(
        f'{source}: unexpected weight {name!r} {shape_str(np.shape(value))}: not a BERT'
        ' encoder parameter (a BertModel / BERT checkpoint of another architecture?)'
      )
  check_arrays(flat, source)
  layers = sorted({int(m.group(1)) for n in tf_flat if (m := _LAYER_RE.match(n))})
  required = [f'{ENCODER}/{v}' for v in TOP.values()]
  required += [f'{ENCODER}/{_OUR_LAYER.format(i=i)}/{v}' for i in layers for v in LAYER.values()]
  missing = [k for k in required if k not in flat]
  if missing or layers != list(range(len(layers))):
    what = f'{missing[0]!r}' if missing else f'layers {layers} (not 0..N-1)'
    raise CheckpointError(f'{source}: an incomplete BERT checkpoint: missing {what}')
  return flat, tuple(sorted(left_out))


def _stated(
  config: Mapping[str, Any] | None, acts: Mapping[str, bool], source: str
) -> dict[str, Any]:
  """The `BertTower` fields a config (Hugging Face's or `bert_config.json`; {}: none beside
  a TF checkpoint, whose code has one GELU) states; None: nothing stated."""
  if config is None:
    return {}
  act = config.get('hidden_act', 'gelu')  # both configs' default
  fields = {'gelu_approximate': pytorch.gelu_approximate(act, acts, 'hidden_act', source)}
  if 'num_attention_heads' in config:
    fields['num_heads'] = int(config['num_attention_heads'])
  if 'layer_norm_eps' in config:
    fields['layer_norm_epsilon'] = float(config['layer_norm_eps'])
  return fields


def _read_hf(path: Path) -> tuple[dict, dict | None, int, Path]:
  """(TF-named weights inside `bert/`, config.json or None, arrays ignored, the weights file)
  of a Hugging Face BERT directory or weights file."""
  config = pytorch.read_config(path)
  if config is not None and config.get('model_type', 'bert') != 'bert':
    raise CheckpointError(
      f'{path}: config.json says model_type={config.get("model_type")!r}; text_pretrained_path'
      " takes a BERT ('bert') checkpoint"
    )
  weights = pytorch.weights_of(path, hf.WEIGHT_FILES)
  state = pytorch.read_state_dict(weights)
  prefixed = any(k.startswith('bert.') for k in state)
  tf_flat, ignored = {}, 0
  for key, value in state.items():
    if (prefixed and not key.startswith('bert.')) or key.endswith('embeddings.position_ids'):
      ignored += 1  # a head of BertForPreTraining / MaskedLM (`cls.*`); an index buffer
      continue
    name, value = _hf_to_tf(key.removeprefix('bert.'), np.asarray(value))
    tf_flat[name] = value
  return tf_flat, config, ignored, weights


def tf_checkpoint(path: Path) -> str | None:
  """The TF checkpoint prefix `path` names (itself, with a `.index` beside it), or that of
  the directory `path` (its `checkpoint` file's, or its one `*.ckpt.index`); else None."""
  if files.path(f'{path}.index').exists():
    return str(path)
  if not path.is_dir():
    return None
  import tensorflow as tf  # here: reading Hugging Face files needs no TensorFlow

  latest = tf.train.latest_checkpoint(str(path))
  if latest:
    return latest
  indexes = sorted(path.glob('*.index'))
  return str(indexes[0]).removesuffix('.index') if len(indexes) == 1 else None


def _read_tf(prefix: str) -> tuple[dict, dict, int]:
  """(TF-named weights inside `bert/`, its bert_config.json or {}, arrays ignored)."""
  import tensorflow as tf

  try:
    reader = tf.train.load_checkpoint(prefix)
  except (tf.errors.OpError, ValueError) as e:
    raise CheckpointError(
      f'{prefix}: not a readable TF checkpoint ({e.__class__.__name__})'
    ) from None
  tf_flat, ignored = {}, 0
  for name in sorted(reader.get_variable_to_shape_map()):
    if not name.startswith('bert/') or _OPTIMIZER_SLOTS.search(name):
      ignored += 1  # `cls/*` heads, `global_step`, optimizer slots
      continue
    tf_flat[name.removeprefix('bert/')] = reader.get_tensor(name)
  folder = files.path(prefix).parent
  config = next((c for n in TF_CONFIGS if (c := pytorch.read_config(folder, n))), None)
  return tf_flat, config or {}, ignored


def read(path: str | Path) -> BertFile:
  """The BERT text tower of a Hugging Face BERT directory or weights file, or of an original
  BERT TF checkpoint (its prefix or directory); one-line CheckpointErrors."""
  path = files.path(path)
  prefix = tf_checkpoint(path)
  if prefix is not None:
    tf_flat, config, ignored = _read_tf(prefix)
    name, acts, source = 'BERT TF checkpoint', TF_ACTS, prefix
  elif hf.detect(path):
    tf_flat, config, ignored, weights = _read_hf(path)
    name, acts, source = f'Hugging Face BERT ({weights.name})', HF_ACTS, str(path)
  else:
    raise CheckpointError(
      f'{path}: not a BERT checkpoint; expected a Hugging Face BERT directory (config.json +'
      ' model.safetensors), a .safetensors file, or an original BERT TF checkpoint'
      ' (bert_model.ckpt, its prefix or directory)'
    )
  flat, left_out = _encoder(tf_flat, source)
  stated = _stated(config, acts, source)
  fields = {**bert_config(flat).to_dict(), **stated}
  _check_heads(fields['hidden_size'], fields['num_heads'], source)
  notes = [
    f'{len(flat)} arrays',
    f'{fields["num_layers"]} layers',
    f'hidden {fields["hidden_size"]}',
  ]
  if 'gelu_approximate' in stated:
    notes.append(f'{"tanh" if stated["gelu_approximate"] else "exact"} GELU')
  if left_out:
    notes.append(f'left out {", ".join(left_out)} (our tower pools [CLS] without a pooler)')
  if ignored:
    notes.append(f'ignored {ignored} arrays outside the encoder')
  description = f'{name}: ' + ', '.join(notes)
  return BertFile(unflatten(flat), fields, tuple(stated), left_out, ignored, description)


def _check_heads(hidden_size: int, num_heads: int, source: str) -> None:
  """The heads config.json states split the width (else hidden / 64 does, as read)."""
  if num_heads < 1 or hidden_size % num_heads:
    raise CheckpointError(
      f'{source}: hidden size {hidden_size} does not split into num_attention_heads={num_heads}'
    )


# The fields that decide the encoder's shapes (the positions may be fewer in the model).
SHAPE_FIELDS = ('hidden_size', 'num_layers', 'mlp_dim', 'vocab_size', 'num_segments')
_POSITIONS = f'{ENCODER}/{TOP["embeddings/position_embeddings"]}'


def _model_fields(text: Mapping[str, Any]) -> dict[str, Any]:
  """A model's text tower fields, `BertTower`'s defaults filled in."""
  from vit_jax.models.text import BertTower

  defaults = {f.name: f.default for f in dataclasses.fields(BertTower) if f.init}
  return {**defaults, **dict(text)}


def check_fits(bert: BertFile, text: Mapping[str, Any], source: str) -> list[str]:
  """That the file's encoder fits a model's text tower fields `text` (one-line
  CheckpointErrors naming the fix); the lines saying where what the file states differs from
  the model, which the model's fields then decide (the GELU, the LayerNorm epsilon)."""
  model, file = _model_fields(text), bert.fields
  wrong = [k for k in SHAPE_FIELDS if model[k] != file[k]]
  if 'num_heads' in bert.stated and model['num_heads'] != file['num_heads']:
    wrong.append('num_heads')
  if wrong:
    flags = ' '.join(f'--config.model.text.{k}={file[k]}' for k in wrong)
    theirs = ', '.join(f'{k} {file[k]} (the model: {model[k]})' for k in wrong)
    raise CheckpointError(f"{source}: the file's BERT has {theirs}: set {flags}")
  if model['max_length'] > file['max_length']:
    raise CheckpointError(
      f"{source}: the file's BERT has {file['max_length']} positions, the model"
      f' {model["max_length"]}: set --config.model.text.max_length={file["max_length"]}'
    )
  return [
    f'{source}: the file states {k}={file[k]}, the model has {model[k]}'
    f' (--config.model.text.{k}={file[k]} follows the file)'
    for k in ('gelu_approximate', 'layer_norm_epsilon')
    if k in bert.stated and model[k] != file[k]
  ]


def fit_tower(
  bert: BertFile, init: Mapping[str, Any], source: str = 'BERT'
) -> tuple[dict, LoadReport]:
  """`init`, a model's initialised BERT text tower (shapes checked by `check_fits` first),
  with the file's encoder in it: its position embeddings' first rows where the model has
  fewer (as big_vision's `bert.load`), each array in the init's dtype; what the file lacks (the
  `head`) keeps its initial value."""
  report = LoadReport(source=source, dropped=list(bert.left_out))
  restored, out = flatten(bert.tree), {}
  for key, value in flatten(init).items():
    if key not in restored:
      out[key] = value
      report.fresh.append(key)
      continue
    array = np.asarray(restored[key])
    if key == _POSITIONS and array.shape[0] > value.shape[0]:
      report.resized.append((key, array.shape, value.shape))
      array = array[: value.shape[0]]
    if array.shape != tuple(value.shape):
      raise CheckpointError(
        f'{source}: {key} has shape {shape_str(array.shape)}, the model {shape_str(value.shape)}'
      )
    out[key] = array.astype(value.dtype)
    report.loaded.append(key)
  unused = sorted(set(restored) - set(out))
  if unused:
    raise CheckpointError(f'{source}: the model has no place for {unused[0]!r}')
  return unflatten(out), report

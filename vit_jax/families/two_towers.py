"""The image-text family: `TwoTowerModel`, LiT's and SigLIP's two towers (an image ViT, a
BERT or text-transformer text tower, the temperature `t` and SigLIP's bias `b`).

Its parameter tree is `{'img': a ViT tree, 'txt': a text tower's tree, 't', 'b'}`. The
architecture is read off the shapes (`infer_config`), but for what they cannot say: BERT's head
count (its attention kernels are (D, D)), taken as D / 64, BERT's, unless the file states it
(a training run's config.json does); the init-only fields and `pp` are SigLIP's when the tree
has a bias `b`, else LiT's. `pp` holds the model's preprocessing and its tokenizer's settings
(`tokenizer_name`, `max_len`, SigLIP's `lower_case`): the one spelling of them. A text tower
of Gemma's 256,000 pieces is SigLIP 2's, and its tokenizer Gemma's (`tokenizer_name='gemma'`).
The image tower is a ViT (families/vit.py) or, with `image_model='naflex'`, SigLIP 2's NaFlex
tower (families/naflex.py: no image size, `pp.max_patches` patches an image).
"""

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from vit_jax import text
from vit_jax.families import naflex, vit
from vit_jax.families.preprocessing import Preprocessing, square
from vit_jax.flat import SEP, CheckpointError, flatten
from vit_jax.models import model_from_config
from vit_jax.models.configs import MODEL_CONFIGS
from vit_jax.models.text import TEXT_MODELS
from vit_jax.models.two_towers import TwoTowerModel, image_inputs, out_dims, tower_classes

TOWERS = ('img', 'txt')
_BERT = 'BertEncoder_0'
_LAYER_RE = re.compile(r'layers_(\d+)$')
_BERT_HEAD_DIM = 64  # BERT's head width; its (D, D) attention kernels do not store the heads
_TEXT_SHAPE_FIELDS = {
  'bert': ('hidden_size', 'num_layers', 'mlp_dim', 'vocab_size', 'max_length', 'num_segments'),
  'text_transformer': ('width', 'num_layers', 'mlp_dim', 'num_heads', 'vocab_size'),
}

# Gemma's vocabulary: SigLIP 2's text towers embed its 256,000 pieces.
GEMMA_VOCAB = 256_000
# The patches an image of a NaFlex tower is given where no run says otherwise: SigLIP 2's
# evaluation sequence (the NaFlex family's).
NAFLEX_PATCHES = naflex.PATCHES
# big_vision's tokenize options for a model whose `pp.lower_case` is set (SigLIP).
LOWER_CASE_OPTIONS = {'eos': 'sticky', 'pad_value': 1, 'lower': True}

Config = Mapping[str, Any] | ml_collections.ConfigDict


def owns_config(config: Config) -> bool:
  """An image-text model's config (it has an `image` and a `text` tower)."""
  return 'image' in config and 'text' in config


def owns_tree(flat: Mapping[str, Any]) -> bool:
  """The flat params of an image-text model: an `img` and a `txt` tower."""
  return all(any(k.startswith(f'{t}{SEP}') for k in flat) for t in TOWERS)


def image_family(config: Config) -> Any:
  """The module of the image tower's family: families/vit.py or families/naflex.py."""
  return naflex if config.get('image_model', 'vit') == 'naflex' else vit


def sequence_patch(config: Config) -> int | None:
  """A NaFlex image tower's patch side (it takes images as patch sequences), else None."""
  return naflex.sequence_patch(config['image']) if image_family(config) is naflex else None


def patch_pixels(config: Config) -> int:
  """The side in input pixels of one token's patch of the image tower."""
  return image_family(config).patch_pixels(config['image'])


def token_grid(config: Config, image_size: int | tuple[int, int]) -> tuple[int, int]:
  """(rows, cols) of the image tower's patch tokens for an image of `image_size` pixels."""
  return image_family(config).token_grid(config['image'], image_size)


def image_config(config: Config) -> dict[str, Any]:
  """The image tower's ViT config, its head (`num_classes`) the model's out_dim[0]."""
  image_dim, _ = out_dims(config.get('out_dim', (None, 768)))
  image = config['image']
  image = image.to_dict() if hasattr(image, 'to_dict') else dict(image)
  return {**image, 'num_classes': image_dim}


def text_model_of(flat: Mapping[str, Any], prefix: str = '') -> str | None:
  """'bert' or 'text_transformer' for the text tower under `prefix`, None if there is none."""
  if any(k.startswith(f'{prefix}{_BERT}/') for k in flat):
    return 'bert'
  blocks = f'{prefix}Encoder_0/encoderblock'
  if f'{prefix}Embed_0/embedding' in flat and any(k.startswith(blocks) for k in flat):
    return 'text_transformer'
  return None


def _shape(flat: Mapping[str, Any], key: str) -> tuple[int, ...]:
  if key not in flat:
    raise CheckpointError(f"the txt tower lacks {key!r}; the file is incomplete or not LiT's")
  return tuple(int(d) for d in flat[key].shape)


def bert_config(flat: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """The `BertTower` fields of a BERT tree (flat, `BertEncoder_0/...`), read off its shapes;
  the heads BERT's D / 64 (its (D, D) kernels do not store them)."""
  embedder = f'{_BERT}/embedder'
  vocab, hidden = _shape(flat, f'{embedder}/embedders_token_ids/embedding')
  layers = f'{_BERT}/encoder_block/layer_sequence'
  names = {k.split(SEP)[3] for k in flat if k.startswith(f'{layers}/')}
  numbers = sorted(int(m.group(1)) for n in names if (m := _LAYER_RE.match(n)))
  if not numbers or numbers != list(range(len(numbers))):
    raise CheckpointError(f'txt/{layers} layers {numbers} are not numbered 0..N-1')
  return ml_collections.ConfigDict(
    {
      'hidden_size': hidden,
      'num_layers': len(numbers),
      'num_heads': max(1, hidden // _BERT_HEAD_DIM),
      'mlp_dim': _shape(flat, f'{layers}/layers_0/mlp_block/mlp/dense_layer/kernel')[1],
      'vocab_size': vocab,
      'max_length': _shape(flat, f'{embedder}/embedders_position_ids/embedding')[0],
      'num_segments': _shape(flat, f'{embedder}/embedders_segment_ids/embedding')[0],
    }
  )


def _text_transformer_config(flat: Mapping[str, Any]) -> ml_collections.ConfigDict:
  vocab, width = _shape(flat, 'Embed_0/embedding')
  blocks = {k.split(SEP)[1] for k in flat if k.startswith('Encoder_0/encoderblock_')}
  block = 'Encoder_0/encoderblock_0'
  return ml_collections.ConfigDict(
    {
      'width': width,
      'num_layers': len(blocks),
      'mlp_dim': _shape(flat, f'{block}/MlpBlock_0/Dense_0/kernel')[-1],
      'num_heads': _shape(flat, f'{block}/MultiHeadDotProductAttention_0/query/kernel')[1],
      'vocab_size': vocab,
    }
  )


def native_resolution(flat: Mapping[str, Any], config: Config) -> int:
  """The image size the model was trained at: its `pp.size` (read off the image tower's
  position embeddings, or stated by the file); None for a NaFlex tower (any size)."""
  del flat
  size = config['pp'].get('size')
  return None if size is None else int(size)


def text_length(params: Mapping[str, Any]) -> int | None:
  """The token positions a text transformer was trained with (its `pos_embedding` rows)."""
  posemb = params['txt'].get('pos_embedding')
  return None if posemb is None else int(posemb.shape[1])


def _tokenizer_name(text_model: str, text: Config) -> str:
  """BERT's WordPiece; Gemma's sentencepiece for a tower of its 256,000 pieces (SigLIP 2);
  else a sentencepiece model of its own (LiT's small towers, SigLIP)."""
  if text_model == 'bert':
    return 'bert'
  return 'gemma' if text['vocab_size'] == GEMMA_VOCAB else 'sentencepiece'


def infer_config(params: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """The `TwoTowerModel` fields an image-text tree implies, read off its shapes; `pp.size` is
  the image tower's resolution and `pp.max_len` the text transformer's positions (BERT: 16)."""
  img = flatten(params['img'])
  image_model = 'naflex' if naflex.owns_tree(img) else 'vit'
  image = image_family({'image_model': image_model}).infer_config(img)
  text_flat = flatten(params['txt'])
  text_model = text_model_of(text_flat)
  if text_model is None:
    raise CheckpointError('the txt tower is neither a BERT nor a text transformer tree')
  text = bert_config(text_flat) if text_model == 'bert' else _text_transformer_config(text_flat)
  head = text_flat.get('head/kernel')
  out_dim = (image.num_classes, None if head is None else int(head.shape[-1]))
  del image['num_classes']  # the image head's width is out_dim[0]
  siglip = 'b' in params
  config = ml_collections.ConfigDict()
  config.image = image
  config.text_model = text_model
  config.text = text
  config.out_dim = out_dim
  config.temperature_init = 10.0 if siglip else 1.0
  config.bias_init = -10.0 if siglip else None
  pp = {'tokenizer_name': _tokenizer_name(text_model, text), 'max_len': text_length(params) or 16}
  if image_model == 'naflex':
    config.image_model = 'naflex'
    pp['max_patches'] = NAFLEX_PATCHES
  else:
    pp['size'] = vit.native_resolution(img, image)
  # A released file is fed as its code fed it: the resized image kept as uint8 (the original
  # LiT code's cast; big_vision's resize casts back to the input's dtype). A run's model
  # config states its own (`stated_fields`).
  if image_model != 'naflex':
    pp['round_to_uint8'] = True
  config.pp = ml_collections.ConfigDict(pp)
  if siglip and text_model != 'bert':  # BERT's WordPiece lower-cases by itself
    config.pp.lower_case = True
  return config


def architecture(config: Config) -> tuple:
  """The fields that decide an image-text model's parameter shapes, but for the image
  resolution and the text length: the towers (BERT's head count is not among them), their
  heads, the bias."""
  text_model = config['text_model']
  defaults = {f.name: f.default for f in dataclasses.fields(TEXT_MODELS[text_model])}
  text = {k: config['text'].get(k, defaults[k]) for k in _TEXT_SHAPE_FIELDS[text_model]}
  return (
    image_family(config).architecture(config['image']),
    text_model,
    tuple(text.items()),
    tuple(config['out_dim']),
    config.get('bias_init') is not None,
  )


def _grid(config: Config) -> int | None:
  """Patches per side of the image tower at the model's `pp.size` (NaFlex: None, any)."""
  if image_family(config) is naflex:
    return None
  return int(config['pp']['size']) // int(config['image']['patches']['size'][0])


def match_registry(config: Config) -> str | None:
  """The registered image-text model of this architecture, image size and text length."""
  if 'pp' not in config:
    return None
  arch, pp = architecture(config), config['pp']
  for name, registered in MODEL_CONFIGS.items():
    if not owns_config(registered):
      continue
    # The same patch grid: So400m/14 at 384 px reads as 378 (27 patches of 14) off the shapes.
    same_pp = _grid(registered) == _grid(config) and (
      config['text_model'] == 'bert' or registered.pp.max_len == pp['max_len']
    )
    if same_pp and architecture(registered) == arch:
      return name
  return None


def describe(config: Config) -> str:
  """An image-text model in one phrase: both towers, the heads, the bias."""
  text = config['text']
  if config['text_model'] == 'bert':
    txt = f'BERT hidden_size {text["hidden_size"]}, {text["num_layers"]} layers'
  else:
    txt = f'text transformer width {text["width"]}, {text["num_layers"]} layers'
  txt += f', {text["num_heads"]} heads, mlp_dim {text["mlp_dim"]}, vocab {text["vocab_size"]}'
  image_dim, text_dim = config['out_dim']
  bias = ', logit bias b' if config.get('bias_init') is not None else ''
  return (
    f'image tower ({image_family(config).describe(config["image"])}); text tower ({txt});'
    f' out_dim ({image_dim}, {text_dim}){bias}'
  )


def stated_fields(config: Config) -> dict[str, Any]:
  """What a run's model config states that the shapes cannot: BERT's head count, its exact
  GELU where it has one (a text tower started from bert-base-uncased's file), a LayerNorm
  epsilon either tower sets, the image tower's exact GELU, and the preprocessing and
  tokenizer settings (`pp`)."""
  text = config['text']
  stated: dict[str, Any] = {'text': {'num_heads': text['num_heads']}}
  if text.get('gelu_approximate') is False:
    stated['text']['gelu_approximate'] = False
  text_default = TEXT_MODELS[config['text_model']].layer_norm_epsilon
  if text.get('layer_norm_epsilon', text_default) != text_default:
    stated['text']['layer_norm_epsilon'] = text['layer_norm_epsilon']
  image = image_family(config).stated_fields(config.get('image') or {})
  if image:
    stated['image'] = image
  if config.get('pp'):
    pp = config['pp']
    # A run evaluates its images without the uint8 cast of the released files.
    stated['pp'] = {'round_to_uint8': False, **(pp.to_dict() if hasattr(pp, 'to_dict') else pp)}
  return stated


def label(config: Config) -> str:
  """An unregistered model's name in the commands' output."""
  return describe(config)


def is_plain(config: Config) -> bool:
  del config
  return False


def table_columns(config: Config) -> dict[str, Any]:
  """The model table's columns (`vit-models`): the image tower's shape, the text tower in
  the note, and the image size the row is counted at (`resolution`: the model's own)."""
  columns = image_family(config).table_columns(config['image'])
  text = config['text']
  width = text.get('hidden_size', text.get('width'))
  kind = 'BERT' if config['text_model'] == 'bert' else 'text transformer'
  pp = config['pp']
  size = f'{pp["size"]} px' if 'size' in pp else f'up to {pp["max_patches"]} patches (NaFlex)'
  columns['note'] = (
    f'{model_kind(config)} at {size}; {kind} text tower of {text["num_layers"]} layers,'
    f' width {width}'
  )
  columns['resolution'] = pp.get('size')
  return columns


def unlike_hugging_face(config: Config) -> str | None:
  del config
  return 'is an image-text model'


def model_kind(config: Config) -> str:
  return 'SigLIP' if config.get('bias_init') is not None else 'LiT'


def build(fields: Config, *, num_classes: int | None, dtype: Any, precision: str) -> nn.Module:
  """The module of a run's model fields: each tower computes in `dtype` under the precision
  policy `precision`, as a ViT does (the heads are the model's `out_dim`: `num_classes` is
  not used)."""
  del num_classes
  fields = ml_collections.ConfigDict(fields).to_dict()  # nested dicts: the towers' merge
  tower = {'dtype': dtype, 'precision_policy': precision}
  return model_from_config(fields, image=tower, text=tower)


def image_features(model: TwoTowerModel):
  """(params, images) -> the image tower's pre-logits (its head's input), as big_vision's
  few-shot evaluation of LiT and SigLIP reads them (`img/pre_logits`); a NaFlex tower's
  take `images_per_row` K > 0 too: packed rows of up to K images, (B, K, D)."""
  tower_class = tower_classes({'image_model': model.image_model})['image']
  tower = tower_class(**{**model.image, 'num_classes': 0})

  def features(params, images, images_per_row: int = 0):
    inputs = image_inputs(model.image_model, images, images_per_row)
    return tower.apply({'params': params['img']}, **inputs, train=False)

  return features


def init_inputs(model: nn.Module, resolution: int | tuple[int, int], max_len: int | None) -> dict:
  """The model's inputs for `init`: one image and one text of `max_len` tokens (default: its
  `pp.max_len`)."""
  max_len = max_len or (model.pp or {}).get('max_len')
  if not max_len:
    raise ValueError('the text length of this image-text model: pass max_len (no pp.max_len)')
  tokens = jax.ShapeDtypeStruct((1, int(max_len)), jnp.int32)
  if model.image_model == 'naflex':
    patches = (model.pp or {}).get('max_patches', NAFLEX_PATCHES)
    return {'images': naflex.image_input(model.image, patches), 'tokens': tokens}
  return {'images': vit.image_input(resolution), 'tokens': tokens}


def preprocessing(
  config: Config, resolution: int | tuple[int, int] | None = None, max_patches: int = 0
) -> Preprocessing:
  """THE preprocessing of an image-text model's images: a NaFlex tower's patch sequences of
  at most `max_patches` (0: its `pp.max_patches`), or a resize to `resolution` (None: its
  `pp.size`), cast to uint8 first where its `pp.round_to_uint8` says (released LiT and
  SigLIP files: the original code's and big_vision's resize keep uint8 pixels; a run: its own
  evaluation, without)."""
  pp = dict(config.get('pp') or {})
  if image_family(config) is naflex:  # its own budget where the run gives none
    budget = max_patches or int(pp.get('max_patches') or 0)
    return naflex.preprocessing(config['image'], resolution, budget)
  if max_patches:
    raise ValueError(f'max_patches={max_patches}: this model takes square images, not patches')
  resolution = resolution or pp.get('size')
  if not resolution:
    raise ValueError('the image size of this image-text model is unknown (no pp.size): give one')
  return square(resolution, round_to_uint8=bool(pp.get('round_to_uint8', False)))


def adopt_file_preprocessing(config: ml_collections.ConfigDict, found: Config) -> None:
  """A registered `config` fitted to a file takes the preprocessing the file's code used
  (the released files' uint8 cast), where the registry says nothing of it."""
  if 'round_to_uint8' in found['pp'] and 'round_to_uint8' not in config.pp:
    config.pp.round_to_uint8 = found['pp']['round_to_uint8']


def forward_flops(config: Config, resolution: int, num_classes: int) -> int:
  """The image tower's forward FLOPs per image (what `vit-models` and the benchmark count); a
  NaFlex tower's at its `pp.max_patches` patches."""
  del num_classes  # the image head's width is out_dim[0]
  image_dim = config['out_dim'][0]
  if image_family(config) is naflex:
    patches = config['pp'].get('max_patches', NAFLEX_PATCHES)
    return naflex.sequence_flops(config['image'], patches, image_dim or 0)
  return vit.forward_flops(config['image'], resolution, image_dim or 0)


def tokenizer_settings(
  pp: Mapping[str, Any] | None, *, name: str = '', max_len: int = 0
) -> tuple[str, int, dict[str, Any]]:
  """(name, max_len, options) of the tokenizer of a two-tower model whose config's `pp` is
  `pp`: `tokenizer_name`, `max_len`, and with `lower_case` SigLIP's options (big_vision's
  sticky `</s>`, padding 1, lower case). `name` and `max_len` are what a run's config says
  besides (`config.pp.tokenizer`, `config.pp.max_len`, a zero-shot evaluator's; '' and 0: none):
  they stand in where the model's pp is silent and must equal it where it speaks. Reads no
  file; one-line ValueErrors."""
  pp = dict(pp or {})
  model_name, model_len = pp.get('tokenizer_name') or '', int(pp.get('max_len') or 0)
  if name and model_name and name != model_name:
    raise ValueError(
      f"tokenizer {name!r}, but the model's is {model_name!r} (its pp.tokenizer_name): "
      'leave it unset or give the same'
    )
  if max_len and model_len and int(max_len) != model_len:
    raise ValueError(
      f"max_len={max_len}, but the model's is {model_len} (its pp.max_len): leave it unset "
      'or give the same'
    )
  name, max_len = model_name or name, model_len or int(max_len or 0)
  if not name or not max_len:
    raise ValueError(
      'the model names no tokenizer (its pp.tokenizer_name, pp.max_len): give the tokenizer '
      "('bert', 'sentencepiece' or 'gemma') and max_len"
    )
  if name not in text.TOKENIZERS:
    raise ValueError(f'unknown tokenizer {name!r}; choose one of {", ".join(text.TOKENIZERS)}')
  # big_vision's options are sentencepiece's; BERT's WordPiece folds case itself; Gemma's
  # sticky <eos> and padding 0 are its tokenizer's own.
  if not pp.get('lower_case') or name == 'bert':
    return name, max_len, {}
  return name, max_len, dict(LOWER_CASE_OPTIONS) if name == 'sentencepiece' else {'lower': True}


def tokenizer(
  pp: Mapping[str, Any] | None, vocab: Any, *, name: str = '', max_len: int = 0
) -> text.Tokenizer:
  """THE tokenizer of a two-tower model (its config's `pp`, see `tokenizer_settings`) on the
  vocabulary file `vocab` (a local or a gs:// path); one-line errors. Training's captions,
  the in-run zero-shot evaluator, `vit-zeroshot` and the LiT reproduction all take it."""
  name, max_len, options = tokenizer_settings(pp, name=name, max_len=max_len)
  return text.get_tokenizer(name, vocab, max_len, **options)


MODULE = TwoTowerModel

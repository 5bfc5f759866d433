"""The one registry of model names: the original vit_jax registry (`configs/models.py`), and
relatives.

Each entry is an `ml_collections.ConfigDict` whose fields are the constructor arguments of its
module: `VisionTransformer`, `MlpMixer` (the Mixer-* entries) or `TwoTowerModel` (LiT's and
SigLIP's image-text models); which family a config is, and so which module, is
`vit_jax.families.of_config`'s to say. Values follow the original code exactly, including its
quirks (R+ViT-Ti_16 is /32 overall; R26+ViT-S_32 takes its widths from S/16). Beyond the
original registry: Mixer-S (for the released GSAM files), the distilled DeiT models, the
giant ViTs of later papers (no released weights here; the architectures, for their counts,
FLOPs and training from scratch) and the English SigLIP models.
"""

import ml_collections

MODEL_CONFIGS: dict[str, ml_collections.ConfigDict] = {}


def _register(name: str, config: ml_collections.ConfigDict) -> None:
  """Adds a config to the registry; the name is its key, not a field of the model."""
  MODEL_CONFIGS[name] = config.lock()


def _vit(
  patch: int,
  hidden: int,
  mlp: int,
  heads: int,
  layers: int,
  dropout: float,
  classifier: str = 'token',
) -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.patches = ml_collections.ConfigDict({'size': (patch, patch)})
  config.hidden_size = hidden
  config.transformer = ml_collections.ConfigDict(
    {
      'mlp_dim': mlp,
      'num_heads': heads,
      'num_layers': layers,
      'attention_dropout_rate': 0.0,
      'dropout_rate': dropout,
      'drop_path_rate': 0.0,  # stochastic depth (linear in depth), for training
    }
  )
  config.classifier = classifier
  config.representation_size = None
  config.resnet = None
  return config


# (patch, hidden, mlp_dim, heads, layers, dropout) of the plain ViTs.
_SIZES = {
  'Ti_16': (16, 192, 768, 3, 12, 0.0),
  'S_16': (16, 384, 1536, 6, 12, 0.0),
  'S_32': (32, 384, 1536, 6, 12, 0.0),
  'B_8': (8, 768, 3072, 12, 12, 0.0),
  'B_16': (16, 768, 3072, 12, 12, 0.0),
  'B_32': (32, 768, 3072, 12, 12, 0.0),
  'L_16': (16, 1024, 4096, 16, 24, 0.1),
  'L_32': (32, 1024, 4096, 16, 24, 0.0),  # the original overrides L/16's dropout
  'H_14': (14, 1280, 5120, 16, 32, 0.1),
  # ViT-g/14 and ViT-G/14 (Zhai et al., "Scaling Vision Transformers", arXiv:2106.04560,
  # Table 2), spelled out: the two names differ only by case, and the short names of configs/
  # (lower case) and files named after a model on case-insensitive file systems would clash.
  'giant_14': (14, 1408, 6144, 16, 40, 0.0),
  'gigantic_14': (14, 1664, 8192, 16, 48, 0.0),
  'e_14': (14, 1792, 15360, 16, 56, 0.0),  # PaLI's ViT-e (Chen et al., arXiv:2209.06794)
}

_register('testing', _vit(16, 10, 10, 2, 1, 0.1))
_register('testing-unpooled', _vit(16, 10, 10, 2, 1, 0.1, classifier='unpooled'))
for _size, _args in _SIZES.items():
  _register(f'ViT-{_size}', _vit(*_args))


def _vit22b() -> ml_collections.ConfigDict:
  """ViT-22B (Dehghani et al., arXiv:2302.05442, Table 1): width 6144, depth 48, MLP 24576, 48
  heads, patches of 14, with its parallel blocks, QK norm, no QKV biases and norms without
  bias and centering (`vit_jax.models.vit.BLOCK_OPTIONS`)."""
  config = _vit(14, 6144, 24576, 48, 48, 0.0)
  config.transformer.update(parallel_block=True, qk_norm=True, qkv_bias=False, norm_bias=False)
  return config


_register('ViT-22B_14', _vit22b())
for _size in ('S_16', 'S_32', 'B_16', 'B_32'):
  _register(f'ViT-{_size}-gap-norep', _vit(*_SIZES[_size], classifier='gap'))


def _hybrid(
  vit_size: str, patch: int, stages: tuple[int, ...], dropout: float
) -> ml_collections.ConfigDict:
  config = _vit(patch, *_SIZES[vit_size][1:5], dropout)
  config.resnet = ml_collections.ConfigDict({'num_layers': stages, 'width_factor': 1})
  return config


# The stem alone is /4, each stage after the first /2; `patch` applies to the feature map.
_register('R+ViT-Ti_16', _hybrid('Ti_16', 8, (), 0.0))
_register('R26+ViT-S_32', _hybrid('S_16', 1, (2, 2, 2, 2), 0.0))
_register('R26+ViT-B_32', _hybrid('B_32', 1, (2, 2, 2, 2), 0.0))
_register('R50+ViT-B_16', _hybrid('B_16', 1, (3, 4, 9), 0.1))
_register('R50+ViT-L_32', _hybrid('L_16', 1, (3, 4, 6, 3), 0.1))


def _mixer(
  patch: int, hidden: int, blocks: int, tokens_mlp: int, channels_mlp: int
) -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.patches = ml_collections.ConfigDict({'size': (patch, patch)})
  config.hidden_dim = hidden
  config.num_blocks = blocks
  config.tokens_mlp_dim = tokens_mlp
  config.channels_mlp_dim = channels_mlp
  return config


# MLP-Mixer paper Table 1: (hidden C, blocks, tokens MLP D_S, channels MLP D_C). The original
# registry has B_16, B_32 and L_16; the S sizes are the released GSAM files'.
_MIXER_SIZES = {'S': (512, 8, 256, 2048), 'B': (768, 12, 384, 3072), 'L': (1024, 24, 512, 4096)}
for _size, _patch in (('B', 16), ('B', 32), ('L', 16), ('S', 8), ('S', 16), ('S', 32)):
  _register(f'Mixer-{_size}_{_patch}', _mixer(_patch, *_MIXER_SIZES[_size]))


def _deit(size: str) -> ml_collections.ConfigDict:
  """DeiT with the distillation token (Touvron et al.): the ViT of `size` plus `dist_token`
  and `head_dist`, as timm's `deit_*_distilled_patch16_224`. (DeiT without it is ViT-*_16.)"""
  config = _vit(*_SIZES[size])
  config.distilled = True
  return config


for _size in ('Ti_16', 'S_16', 'B_16'):
  _register(f'DeiT-{_size}-distilled', _deit(_size))


# Image-text two-tower models (`vit_jax.models.two_towers`); the code that walks the
# classifiers alone (Table 1's counts, the short names of configs/models.py) takes
# `vit_jax.families.classifiers()`.

# BERT (Devlin et al.) as flaxformer's `BertBaseConfig` / `BertLargeConfig`:
# (hidden_size, num_layers, num_heads, mlp_dim); vocab 30,522, 512 positions, 2 segments.
_BERT_SIZES = {'base': (768, 12, 12, 3072), 'large': (1024, 24, 16, 4096)}


def _bert(size: str) -> ml_collections.ConfigDict:
  hidden, layers, heads, mlp = _BERT_SIZES[size]
  return ml_collections.ConfigDict(
    {
      'hidden_size': hidden,
      'num_layers': layers,
      'num_heads': heads,
      'mlp_dim': mlp,
      'vocab_size': 30_522,
      'max_length': 512,
      'num_segments': 2,
    }
  )


def _text_transformer(
  width: int, layers: int, mlp: int, heads: int, vocab: int
) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(
    {'width': width, 'num_layers': layers, 'mlp_dim': mlp, 'num_heads': heads, 'vocab_size': vocab}
  )


def _two_towers(
  image: ml_collections.ConfigDict,
  text_model: str,
  text: ml_collections.ConfigDict,
  out_dim: tuple[int | None, int | None],
  pp: dict,
  temperature_init: float = 1.0,
  bias_init: float | None = None,
) -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.image = image
  config.text_model = text_model
  config.text = text
  config.out_dim = out_dim
  config.temperature_init = temperature_init
  config.bias_init = bias_init
  config.pp = ml_collections.ConfigDict(pp)
  return config


# The original vit_jax `configs/models.py` LiT entries (files in gs://vit_models/lit/, the
# vocabulary beside each: `{name}.txt` for BERT, `{name}.model` for sentencepiece).
_LIT_BERT_PP = {'tokenizer_name': 'bert', 'size': 224, 'max_len': 16}
_LIT_SP_PP = {'tokenizer_name': 'sentencepiece', 'size': 224, 'max_len': 16}
for _name, _image, _text, _out in (
  ('LiT-B16B', 'B_16', 'base', (768, 768)),
  ('LiT-B16B_2', 'B_16', 'base', (None, 768)),
  ('LiT-L16L', 'L_16', 'large', (None, 1024)),
):
  _register(_name, _two_towers(_vit(*_SIZES[_image]), 'bert', _bert(_text), _out, _LIT_BERT_PP))
for _name, _text_args in (
  ('LiT-L16S', (384, 12, 1536, 6, 16_000)),
  ('LiT-L16Ti', (192, 12, 768, 3, 16_000)),
):
  _register(
    _name,
    _two_towers(
      _vit(*_SIZES['L_16']),
      'text_transformer',
      _text_transformer(*_text_args),
      (None, 1024),
      _LIT_SP_PP,
    ),
  )

# The English SigLIP models (big_vision `VANITY_NAMES`, `SigLIP_demo.ipynb`: `webli_en_*.npz`):
# image ViT with MAP pooling and no class token, text transformer pooled at its last token,
# vocabulary 32,000 (the c4_en sentencepiece, not beside the file; texts lower-cased), t and b.
# (width, layers, mlp_dim, heads) of big_vision's variants, both towers alike.
_BV_VARIANTS = {
  'B': (768, 12, 3072, 12),
  'L': (1024, 24, 4096, 16),
  'So400m': (1152, 27, 4304, 16),
  'g-opt': (1536, 40, 6144, 16),  # SigLIP 2's
}
for _variant, _patch, _size, _max_len in (
  ('B', 16, 224, 64),
  ('B', 16, 256, 64),
  ('B', 16, 384, 64),
  ('B', 16, 512, 64),
  ('L', 16, 256, 64),
  ('L', 16, 384, 64),
  ('So400m', 14, 224, 16),
  ('So400m', 14, 384, 64),
):
  _width, _layers, _mlp, _heads = _BV_VARIANTS[_variant]
  _siglip = _two_towers(
    _vit(_patch, _width, _mlp, _heads, _layers, 0.0, classifier='map'),
    'text_transformer',
    _text_transformer(_width, _layers, _mlp, _heads, 32_000),
    (None, _width),
    {'tokenizer_name': 'sentencepiece', 'size': _size, 'max_len': _max_len, 'lower_case': True},
    temperature_init=10.0,
    bias_init=-10.0,
  )
  _register(f'SigLIP-{_variant}{_patch}-{_size}', _siglip)

# SigLIP 2 (big_vision `README_siglip2.md`, `SigLIP2_demo.ipynb`: `siglip2_*.npz`): SigLIP's
# layout and towers, Gemma's vocabulary of 256,000 pieces and its tokenizer (texts
# lower-cased, 64 ids, sticky <eos>, padding 0). g-opt/16 (width 1536, 40 layers, MLP 6144, 16
# heads) pairs with the So400m text tower, whose head maps to 1536.
_SIGLIP2_PP = {'tokenizer_name': 'gemma', 'max_len': 64, 'lower_case': True}
for _variant, _patch, _size in (
  ('B', 32, 256),
  ('B', 16, 224),
  ('B', 16, 256),
  ('B', 16, 384),
  ('B', 16, 512),
  ('L', 16, 256),
  ('L', 16, 384),
  ('L', 16, 512),
  ('So400m', 14, 224),
  ('So400m', 14, 384),
  ('So400m', 16, 256),
  ('So400m', 16, 384),
  ('So400m', 16, 512),
  ('g-opt', 16, 256),
  ('g-opt', 16, 384),
):
  _width, _layers, _mlp, _heads = _BV_VARIANTS[_variant]
  _text = _BV_VARIANTS['So400m' if _variant == 'g-opt' else _variant]
  _siglip2 = _two_towers(
    _vit(_patch, _width, _mlp, _heads, _layers, 0.0, classifier='map'),
    'text_transformer',
    _text_transformer(_text[0], _text[1], _text[2], _text[3], 256_000),
    (None, _width),
    {**_SIGLIP2_PP, 'size': _size},
    temperature_init=10.0,
    bias_init=-10.0,
  )
  _register(f'SigLIP2-{_variant}{_patch}-{_size}', _siglip2)

# SigLIP 2's NaFlex models (`siglip2_{b16,so400m16}_naflex.npz`): the image tower takes each
# image at its own aspect ratio as a sequence of at most `pp.max_patches` patches of 16
# (evaluated at 256), its learned position embedding a 16 x 16 grid resized to each image's.
for _variant in ('B', 'So400m'):
  _width, _layers, _mlp, _heads = _BV_VARIANTS[_variant]
  _naflex = _two_towers(
    ml_collections.ConfigDict(
      {
        'patch_size': 16,
        'hidden_size': _width,
        'transformer': _vit(16, _width, _mlp, _heads, _layers, 0.0).transformer,
        'classifier': 'map',
        'posemb_grid': 16,
      }
    ),
    'text_transformer',
    _text_transformer(_width, _layers, _mlp, _heads, 256_000),
    (None, _width),
    {**_SIGLIP2_PP, 'max_patches': 256},
    temperature_init=10.0,
    bias_init=-10.0,
  )
  _naflex.image_model = 'naflex'
  _register(f'SigLIP2-{_variant}16-naflex', _naflex)

"""Model hyperparameters of the original vit_jax registry (`configs/models.py`), and relatives.

Each entry is an `ml_collections.ConfigDict` whose fields are the constructor arguments of
`VisionTransformer` (or of `MlpMixer` for the Mixer-* entries). Values follow the original
code exactly, including its quirks (R+ViT-Ti_16 is /32 overall; R26+ViT-S_32 takes its widths
from S/16). Beyond the original registry: Mixer-S (for the released GSAM files) and the
distilled DeiT models.
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
}

_register('testing', _vit(16, 10, 10, 2, 1, 0.1))
_register('testing-unpooled', _vit(16, 10, 10, 2, 1, 0.1, classifier='unpooled'))
for _size, _args in _SIZES.items():
  _register(f'ViT-{_size}', _vit(*_args))
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

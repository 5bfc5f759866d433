"""Model hyperparameters of the original vit_jax registry (`configs/models.py`).

Each entry is an `ml_collections.ConfigDict` whose fields are `VisionTransformer`'s
constructor arguments. Values follow the original code exactly, including its quirks
(R+ViT-Ti_16 is /32 overall; R26+ViT-S_32 takes its widths from S/16).
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

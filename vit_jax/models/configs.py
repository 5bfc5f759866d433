"""Model hyperparameters of the original vit_jax registry (`configs/models.py`).

Each entry is an `ml_collections.ConfigDict` whose fields are `VisionTransformer`'s
constructor arguments. Values follow the original code exactly, including its quirks
(R+ViT-Ti_16 is /32 overall; R26+ViT-S_32 takes its widths from S/16).
"""

from collections.abc import Callable

import ml_collections

MODEL_CONFIGS: dict[str, ml_collections.ConfigDict] = {}


def _register(get_config: Callable[[], ml_collections.ConfigDict]):
  """Adds a config to the registry under its `model_name`."""
  config = get_config().lock()
  MODEL_CONFIGS[config.model_name] = config
  return get_config


def _vit(
  name: str,
  patch: int,
  hidden: int,
  mlp: int,
  heads: int,
  layers: int,
  dropout: float,
  classifier: str = 'token',
) -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.model_name = name
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

_register(lambda: _vit('testing', 16, 10, 10, 2, 1, 0.1))
_register(lambda: _vit('testing-unpooled', 16, 10, 10, 2, 1, 0.1, classifier='unpooled'))
for _size, _args in _SIZES.items():
  _register(lambda s=_size, a=_args: _vit(f'ViT-{s}', *a))
for _size in ('S_16', 'S_32', 'B_16', 'B_32'):
  _register(lambda s=_size: _vit(f'ViT-{s}-gap-norep', *_SIZES[s], classifier='gap'))


def _hybrid(
  name: str, vit_size: str, patch: int, stages: tuple[int, ...], dropout: float
) -> ml_collections.ConfigDict:
  config = _vit(name, patch, *_SIZES[vit_size][1:5], dropout)
  config.resnet = ml_collections.ConfigDict({'num_layers': stages, 'width_factor': 1})
  return config


# The stem alone is /4, each stage after the first /2; `patch` applies to the feature map.
_register(lambda: _hybrid('R+ViT-Ti_16', 'Ti_16', 8, (), 0.0))
_register(lambda: _hybrid('R26+ViT-S_32', 'S_16', 1, (2, 2, 2, 2), 0.0))
_register(lambda: _hybrid('R26+ViT-B_32', 'B_32', 1, (2, 2, 2, 2), 0.0))
_register(lambda: _hybrid('R50+ViT-B_16', 'B_16', 1, (3, 4, 9), 0.1))
_register(lambda: _hybrid('R50+ViT-L_32', 'L_16', 1, (3, 4, 6, 3), 0.1))

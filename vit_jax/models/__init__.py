"""The model zoo: `MODEL_CONFIGS` (name -> ConfigDict) and `get_model`."""

import dataclasses
import difflib
from typing import Any

import flax.linen as nn
import ml_collections

from vit_jax.models.configs import MODEL_CONFIGS
from vit_jax.models.mixer import MlpMixer, is_mixer
from vit_jax.models.vit import VisionTransformer

__all__ = [
  'MODEL_CONFIGS',
  'MlpMixer',
  'VisionTransformer',
  'get_config',
  'get_model',
  'is_mixer',
  'model_class',
]


def get_config(name: str) -> ml_collections.ConfigDict:
  """An unlocked copy of the registered config `name`; unknown names list close matches."""
  if name not in MODEL_CONFIGS:
    close = difflib.get_close_matches(name, MODEL_CONFIGS, n=5, cutoff=0.4)
    hint = f' Did you mean: {", ".join(close)}?' if close else ''
    raise KeyError(f'Unknown model {name!r}.{hint} Registered: {", ".join(MODEL_CONFIGS)}.')
  config = ml_collections.ConfigDict(MODEL_CONFIGS[name].to_dict())
  return config


def _frozen(value: Any) -> Any:
  """Nested ConfigDicts become hashable FrozenConfigDicts (module fields must be hashable)."""
  if isinstance(value, (dict, ml_collections.ConfigDict)):
    return ml_collections.FrozenConfigDict(value)
  return value


def model_class(config: ml_collections.ConfigDict | dict) -> type[nn.Module]:
  """`MlpMixer` for a Mixer config (it has `num_blocks`), else `VisionTransformer`."""
  return MlpMixer if is_mixer(config) else VisionTransformer


def model_from_config(config: ml_collections.ConfigDict | dict, **overrides: Any) -> nn.Module:
  """Builds the module from a config whose fields are constructor arguments.

  Overrides replace fields; a dict override of a nested field (e.g.
  `transformer={'dropout_rate': 0.0}`) updates only the keys it names. A field the model
  class does not have is a TypeError that lists the fields it has.
  """
  kwargs = dict(config.to_dict() if isinstance(config, ml_collections.ConfigDict) else config)
  for key, value in overrides.items():
    if isinstance(value, dict) and isinstance(kwargs.get(key), dict):
      unknown = set(value) - set(kwargs[key])
      if unknown:
        raise KeyError(f'Unknown {key} fields {sorted(unknown)}; known: {sorted(kwargs[key])}.')
      kwargs[key] = {**kwargs[key], **value}
    else:
      kwargs[key] = value
  kwargs.setdefault('num_classes', None)
  cls = model_class(kwargs)
  fields = {f.name for f in dataclasses.fields(cls) if f.init} - {'parent', 'name'}
  unknown = sorted(set(kwargs) - fields)
  if unknown:
    raise TypeError(
      f'{cls.__name__} has no field {", ".join(unknown)}; its fields: {sorted(fields)}'
    )
  return cls(**{k: _frozen(v) for k, v in kwargs.items()})


def get_model(name: str, **overrides: Any) -> nn.Module:
  """The registered model `name`, e.g. `get_model('ViT-B_16', num_classes=1000)`."""
  return model_from_config(get_config(name), **overrides)

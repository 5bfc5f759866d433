"""The model zoo: `MODEL_CONFIGS` (every registered name -> ConfigDict: classifiers and the
image-text models), `get_config` and `get_model`."""

import dataclasses
import difflib
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import ml_collections

from vit_jax.models import two_towers
from vit_jax.models.configs import MODEL_CONFIGS
from vit_jax.models.mixer import MlpMixer, is_mixer
from vit_jax.models.naflex import NaFlexViT, is_naflex
from vit_jax.models.two_towers import TwoTowerModel
from vit_jax.models.vit import BLOCK_OPTIONS, VisionTransformer

__all__ = [
  'MODEL_CONFIGS',
  'MlpMixer',
  'NaFlexViT',
  'TwoTowerModel',
  'VisionTransformer',
  'get_config',
  'get_model',
  'is_mixer',
  'is_two_tower',
  'model_class',
  'unknown_model',
]


def get_config(name: str) -> ml_collections.ConfigDict:
  """An unlocked copy of the registered config `name` (a classifier or an image-text model);
  unknown names list close matches."""
  registered = MODEL_CONFIGS.get(name)
  if registered is None:
    raise KeyError(f'{unknown_model(name)} Registered: {", ".join(MODEL_CONFIGS)}.')
  return ml_collections.ConfigDict(registered.to_dict())


def unknown_model(name: str) -> str:
  """'Unknown model NAME.' and the registered names closest to it."""
  close = difflib.get_close_matches(name, list(MODEL_CONFIGS), n=5, cutoff=0.4)
  hint = f' Did you mean: {", ".join(close)}?' if close else ''
  return f'Unknown model {name!r}.{hint}'


def is_two_tower(config: ml_collections.ConfigDict | Mapping[str, Any]) -> bool:
  """An image-text model's config (it has an `image` and a `text` tower)."""
  return 'image' in config and 'text' in config


def _frozen(value: Any) -> Any:
  """Nested ConfigDicts become hashable FrozenConfigDicts (module fields must be hashable)."""
  if isinstance(value, (dict, ml_collections.ConfigDict)):
    return ml_collections.FrozenConfigDict(value)
  return value


def model_class(config: ml_collections.ConfigDict | Mapping[str, Any]) -> type[nn.Module]:
  """`TwoTowerModel` for an image-text config, `MlpMixer` for a Mixer config (it has
  `num_blocks`), `NaFlexViT` for a NaFlex config (`patch_size` and `posemb_grid`), else
  `VisionTransformer`."""
  if is_two_tower(config):
    return TwoTowerModel
  if is_naflex(config):
    return NaFlexViT
  return MlpMixer if is_mixer(config) else VisionTransformer


def _fields(cls: type[nn.Module]) -> set[str]:
  return {f.name for f in dataclasses.fields(cls) if f.init} - {'parent', 'name'}


def _check_fields(
  cls: type[nn.Module], kwargs: Mapping[str, Any], where: str = '', exclude: frozenset = frozenset()
) -> None:
  """Every key is a constructor field of `cls` but `exclude` (a TypeError listing them)."""
  fields = _fields(cls) - exclude
  unknown = sorted(set(kwargs) - fields)
  if unknown:
    raise TypeError(
      f'{cls.__name__}{where} has no field {", ".join(unknown)}; its fields: {sorted(fields)}'
    )


def _merged(base: dict, override: Mapping[str, Any], where: str, open_keys: bool) -> dict:
  """`base` updated by `override`, dicts merged recursively (nested keys must exist in
  `base` unless `open_keys`: a module's fields, checked by the caller; an encoder's
  `transformer` may also take ViT-22B's block options, which configs leave out at their
  defaults)."""
  optional = BLOCK_OPTIONS if where.rsplit('.', 1)[-1] == 'transformer' else {}
  unknown = set(override) - set(base) - set(optional)
  if unknown and not open_keys:
    known = sorted(set(base) | set(optional))
    raise KeyError(f'Unknown {where} fields {sorted(unknown)}; known: {known}.')
  out = dict(base)
  for key, value in override.items():
    if isinstance(value, Mapping) and isinstance(base.get(key), Mapping):
      out[key] = _merged(dict(base[key]), value, f'{where}.{key}' if where else key, False)
    else:
      out[key] = value
  return out


def model_from_config(
  config: ml_collections.ConfigDict | Mapping[str, Any], **overrides: Any
) -> nn.Module:
  """Builds the module from a config whose fields are constructor arguments.

  Overrides replace fields; a dict override of a nested field updates only the keys it
  names, at any depth (`transformer={'dropout_rate': 0.0}`, `transformer={'qk_norm': True}`;
  of an image-text model `image={'transformer': {'num_layers': 2}}`, `text={'num_layers': 2}`,
  where a tower's override may also set any field of the tower's module, e.g.
  `image={'dtype': 'bfloat16'}`). A nested key the config lacks is a KeyError (but ViT-22B's
  block options in a `transformer`); a field the model (or tower) class does not have is a
  TypeError that lists the fields it has.
  """
  kwargs = dict(config.to_dict() if isinstance(config, ml_collections.ConfigDict) else config)
  towers = two_towers.tower_classes(kwargs) if is_two_tower(kwargs) else {}
  for key, value in overrides.items():
    if isinstance(value, Mapping) and isinstance(kwargs.get(key), Mapping):
      kwargs[key] = _merged(dict(kwargs[key]), value, key, open_keys=key in towers)
    else:
      kwargs[key] = value
  if not towers:
    kwargs.setdefault('num_classes', None)
  cls = model_class(kwargs)
  _check_fields(cls, kwargs)
  for key, tower in (two_towers.tower_classes(kwargs) if towers else {}).items():
    # A tower's head width is the model's out_dim, not a field of the tower.
    _check_fields(tower, kwargs[key], f' ({key} tower)', frozenset({'num_classes'}))
  return cls(**{k: _frozen(v) for k, v in kwargs.items()})


def get_model(name: str, **overrides: Any) -> nn.Module:
  """The registered model `name`, e.g. `get_model('ViT-B_16', num_classes=1000)`."""
  return model_from_config(get_config(name), **overrides)

"""Short model names for config strings ('b16' -> 'ViT-B_16', 'r50_b16' -> 'R50+ViT-B_16')."""

import difflib

import ml_collections

from vit_jax import families
from vit_jax.families.vit import COMPUTED_AS
from vit_jax.models import get_config


def short_name(name: str) -> str:
  """'ViT-B_16' -> 'b16', 'R50+ViT-B_16' -> 'r50_b16', 'ViT-S_16-gap-norep' -> 's16_gap_norep'."""
  short = name.replace('ViT-', '').replace('+', '_').replace('-', '_').lower()
  return short.replace('_16', '16').replace('_32', '32').replace('_14', '14').replace('_8', '8')


# The classifiers: an image-text model is fine-tuned through configs of its own.
CLASSIFIERS = families.classifiers()
SHORT_NAMES = {short_name(name): name for name in CLASSIFIERS}


def registry_name(model: str) -> str:
  """The registry name of `model`, a short name ('b16') or a registry name ('ViT-B_16')."""
  name = SHORT_NAMES.get(model, model)
  if name not in CLASSIFIERS:
    options = sorted(SHORT_NAMES) + sorted(CLASSIFIERS)
    close = difflib.get_close_matches(model, options, n=4, cutoff=0.5)
    hint = f' Did you mean: {", ".join(close)}?' if close else ''
    raise ValueError(f'Unknown model {model!r}.{hint} Known: {", ".join(sorted(SHORT_NAMES))}.')
  return name


def with_computed_as(model: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`model`, a ViT's (or NaFlex ViT's) fields, with how it computes beyond its shapes at the
  defaults where it does not say (`COMPUTED_AS`: the tanh GELU, LayerNorm epsilon 1e-6), so
  that a fine-tune takes the values a file states: --config.model.gelu_approximate=False
  --config.model.layer_norm_epsilon=1e-12 for a Hugging Face ViT of the hub."""
  for key, default in COMPUTED_AS.items():
    if key not in model:
      model[key] = default
  return model


def model_config(model: str) -> ml_collections.ConfigDict:
  """The registry config (the model's constructor fields) of `model`, short or registry name;
  a ViT's with `with_computed_as`."""
  config = get_config(registry_name(model))
  return with_computed_as(config) if families.vit.owns_config(config) else config

"""Model families: each one module that says everything the rest of the code asks of a model
beyond its layers, and one registry of them.

  family = families.of_config(config)     # from a model config (its constructor fields)
  family = families.of_tree(params)       # from a parameter tree or flat dict, or None
  family.infer_config(flat), family.describe(config), family.match_registry(config), ...

A family owns: recognising its configs (`owns_config`) and parameter trees (`owns_tree`), the
architecture read off a tree's shapes (`infer_config`, `architecture`, `native_resolution`),
the registered model of an architecture (`match_registry`), one-line descriptions
(`describe`, `kind`), its image tower's config (`image_config`), what a run's config states
beyond the shapes (`stated_fields`), and the formats it converts to (`writes`). Nothing outside
a family module sniffs config or tree keys to tell families apart: it asks here.

A new family is one module beside these and one line of `FAMILIES`.
"""

import dataclasses
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

import ml_collections

from vit_jax.families import mixer, two_towers, vit
from vit_jax.flat import CheckpointError, as_flat

Config = Mapping[str, Any] | ml_collections.ConfigDict


def _same(config: Config) -> Config:
  return config


def _nothing(config: Config) -> dict[str, Any]:
  del config
  return {}


@dataclasses.dataclass(frozen=True)
class Family:
  """One model family: the functions of its module, under the names the callers use.

  Attributes:
    name: 'vit', 'mixer' or 'two_towers'.
    image_text: an image-text model (two towers, `t`, embeddings) rather than a classifier.
    writes: the checkpoint formats `convert` writes it to.
    pre_logits: the model has a `representation_size` (pre_logits) layer.
    npz_layout: the layout `save_npz` writes it in, for the commands' summaries.
  """

  name: str
  module: ModuleType
  image_text: bool = False
  writes: tuple[str, ...] = ('npz', 'hf', 'timm')
  pre_logits: bool = True
  npz_layout: str = 'vit_jax layout, pre-Linen names'

  def __getattr__(self, attr: str) -> Any:
    # The family's functions are its module's (owns_config, infer_config, describe, ...).
    return getattr(object.__getattribute__(self, 'module'), attr)

  @property
  def image_config(self) -> Callable[[Config], Config]:
    return getattr(self.module, 'image_config', _same)

  @property
  def check_pooled(self) -> Callable[[Config, str], None]:
    """Raises where the model's output is not one pooled vector (a Mixer's always is)."""
    return getattr(self.module, 'check_pooled', lambda config, name: None)

  @property
  def feature_kwargs(self) -> Callable[[Any], dict[str, Any]]:
    """`apply` options for the model's features (a DeiT: both tokens')."""
    return getattr(self.module, 'feature_kwargs', lambda model: {})

  @property
  def stated_fields(self) -> Callable[[Config], dict[str, Any]]:
    return getattr(self.module, 'stated_fields', _nothing)

  def kind(self, config: Config) -> str:
    """'ViT', 'DeiT (distilled)', 'MLP-Mixer', 'LiT' or 'SigLIP'."""
    return self.module.model_kind(config)


# Tried in order: the first family that owns a config or a tree is its family.
FAMILIES: tuple[Family, ...] = (
  Family(
    'two_towers',
    two_towers,
    image_text=True,
    writes=('npz',),
    pre_logits=False,
    npz_layout='LiT layout: img/, txt/',
  ),
  Family('mixer', mixer, writes=('npz',), pre_logits=False, npz_layout='Mixer layout'),
  Family('vit', vit),
)


def of_config(config: Config) -> Family:
  """The family of a model config (its constructor fields)."""
  for family in FAMILIES:
    if family.owns_config(config):
      return family
  raise ValueError(f'no model family has the fields {sorted(config)}')


def of_module(model: Any) -> Family:
  """The family of a built module (its class is the family's `MODULE`)."""
  for family in FAMILIES:
    if isinstance(model, family.MODULE):
      return family
  raise ValueError(f'no model family builds {type(model).__name__}')


def of_tree(params: Mapping[str, Any]) -> Family | None:
  """The family of a parameter tree (nested or flat), or None for a tree of none."""
  flat = as_flat(params)
  for family in FAMILIES:
    if family.owns_tree(flat):
      return family
  return None


def infer_config(params: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """The model fields a classifier's parameter tree implies, read off its shapes, by its
  family; an image-text tree: `two_towers.infer_config` (it needs the nested towers)."""
  family = of_tree(params)
  if family is None:
    raise CheckpointError(
      "the parameters lack 'embedding/kernel'; this is not a ViT parameter tree"
    )
  return family.infer_config(params if family.image_text else as_flat(params))

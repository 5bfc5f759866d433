"""Model families: each one module that says everything the rest of the code asks of a model
beyond its layers, and one registry of them.

  family = families.of_config(config)     # from a model config (its constructor fields)
  family = families.of_tree(params)       # from a parameter tree or flat dict, or None
  family.infer_config(flat), family.describe(config), family.match_registry(config), ...

A family owns: recognising its configs (`owns_config`) and parameter trees (`owns_tree`),
building the module of a run's fields (`build`), the model's inputs (`init_inputs`: their
names, shapes and dtypes, so `param_shapes` and `init_params` need no pixel array), its
forward FLOPs (`forward_flops`), the architecture read off a tree's shapes (`infer_config`,
`architecture`, `native_resolution`), the registered model of an architecture
(`match_registry`), one-line descriptions (`describe`, `kind`), its image tower's config
(`image_config`), pre-logits (`image_features`) and, for a tower that takes images as patch
sequences, its patch (`sequence_patch`), what a run's config states beyond the
shapes (`stated_fields`), its tokenizer (`tokenizer`, image-text families), and the formats
it converts to (`writes`).
Nothing outside a family module sniffs config or tree keys to tell families apart: it asks
here.

A new family is one module beside these and one line of `FAMILIES`.
"""

import dataclasses
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from vit_jax.families import mixer, naflex, two_towers, vit
from vit_jax.families.preprocessing import Preprocessing
from vit_jax.flat import CheckpointError, as_flat
from vit_jax.models import MODEL_CONFIGS

Config = Mapping[str, Any] | ml_collections.ConfigDict


def _same(config: Config) -> Config:
  return config


def _nothing(config: Config) -> dict[str, Any]:
  del config
  return {}


def _headless(model: nn.Module) -> Callable[[Any, jax.Array], jax.Array]:
  """A classifier's pre-logits: the model without its head, in inference mode."""
  headless = model.clone(num_classes=0)
  return lambda params, images: headless.apply({'params': params}, images, train=False)


@dataclasses.dataclass(frozen=True)
class Family:
  """One model family: the functions of its module, under the names the callers use.

  Attributes:
    name: 'two_towers', 'mixer', 'naflex' or 'vit'.
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
  def image_features(self) -> Callable[[nn.Module], Callable[[Any, jax.Array], jax.Array]]:
    """model -> (params, images) -> its image tower's pre-logits (what a linear probe reads)."""
    return getattr(self.module, 'image_features', _headless)

  @property
  def sequence_patch(self) -> Callable[[Config], int | None]:
    """The patch side of an image tower that takes images as patch sequences (NaFlex), or
    None: the model takes square images."""
    return getattr(self.module, 'sequence_patch', lambda config: None)

  @property
  def stated_fields(self) -> Callable[[Config], dict[str, Any]]:
    return getattr(self.module, 'stated_fields', _nothing)

  def kind(self, config: Config) -> str:
    """'ViT', 'DeiT (distilled)', 'MLP-Mixer', 'LiT' or 'SigLIP'."""
    return self.module.model_kind(config)


# Tried in order: the first family that owns a config or a tree is its family (NaFlex before
# the ViT, whose `embedding/kernel` it shares).
FAMILIES: tuple[Family, ...] = (
  Family(
    'two_towers',
    two_towers,
    image_text=True,
    writes=('npz', 'hf'),  # hf: SigLIP models only (SiglipModel; NaFlex: Siglip2Model)
    pre_logits=False,
    npz_layout='LiT layout: img/, txt/',
  ),
  Family('mixer', mixer, writes=('npz',), pre_logits=False, npz_layout='Mixer layout'),
  Family(
    'naflex',
    naflex,
    writes=('npz',),
    pre_logits=False,
    npz_layout='NaFlex layout: pos_embedding grid, pre-Linen names',
  ),
  Family('vit', vit),
)


def of_config(config: Config) -> Family:
  """The family of a model config (its constructor fields)."""
  for family in FAMILIES:
    if family.owns_config(config):
      return family
  raise ValueError(f'no model family has the fields {sorted(config)}')


def run_preprocessing(config: Config, crop: int, max_patches: int) -> Preprocessing:
  """A training run's preprocessing of its model's images (its evaluations' and every
  command's on its directory): the family's, at the run's `crop` or, for patch sequences,
  its `max_patches`."""
  family = of_config(config)
  if max_patches:
    return family.preprocessing(config, None, max_patches)
  return family.preprocessing(config, crop)


def classifiers() -> dict[str, ml_collections.ConfigDict]:
  """The registered models that classify images (every family's but the image-text ones)."""
  return {n: c for n, c in MODEL_CONFIGS.items() if not of_config(c).image_text}


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


def param_shapes(
  model: nn.Module, resolution: int | tuple[int, int] = 224, max_len: int | None = None
) -> Any:
  """The parameter tree as ShapeDtypeStructs (`jax.eval_shape`: nothing is allocated), of
  the family's inputs at `resolution` (an image-text model's texts of `max_len` tokens,
  default its `pp.max_len`)."""
  inputs = of_module(model).init_inputs(model, resolution, max_len)
  init = lambda x: model.init(jax.random.key(0), **x, train=False)
  return jax.eval_shape(init, inputs)['params']


def init_params(
  model: nn.Module, rng: jax.Array, resolution: int | tuple[int, int], max_len: int | None = None
) -> Any:
  """The model's initial parameters (`model.init` on zeros of the family's inputs)."""
  inputs = of_module(model).init_inputs(model, resolution, max_len)
  zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), inputs)
  return model.init(rng, **zeros, train=False)['params']


def forward_flops(config: Config, resolution: int = 224, num_classes: int = 1000) -> int:
  """Analytic forward FLOPs per image: 2 per multiply-add of every matmul and conv (the
  paper's count: elementwise work left out; XLA's cost analysis lands ~0.4% higher for
  B/16). An image-text model's: its image tower's."""
  config = ml_collections.ConfigDict(dict(config))
  return of_config(config).forward_flops(config, resolution, num_classes)


def xla_forward_flops(model: nn.Module, resolution: int = 224) -> float:
  """Forward FLOPs per image from XLA's cost analysis of the lowered (uncompiled) program:
  every token through every block, as the model is trained and its FLOPs are counted (applied
  with its intermediates recorded, a ViT's class-token readout keeps every token)."""
  params = param_shapes(model, resolution)
  inputs = of_module(model).init_inputs(model, resolution, None)
  apply = lambda p, x: model.apply({'params': p}, **x, train=False, mutable=['intermediates'])
  return float(jax.jit(apply).lower(params, inputs).cost_analysis()['flops'])

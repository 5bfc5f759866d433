"""Model families: each one module that says everything the rest of the code asks of a model
beyond its layers, one declared interface (`Interface`), and one registry of them (`FAMILIES`).

  family = families.of_config(config)     # from a model config (its constructor fields)
  family = families.of_tree(params)       # from a parameter tree or flat dict, or None
  family = families.of_module(model)      # from a built module
  family.infer_config(params), family.describe(config), family.preprocessing(config, 224), ...

`Interface` lists every member the code asks of a family, with its parameters: recognising
its configs and trees, building the module of a run's fields and its inputs, FLOPs, the
architecture read off a tree's shapes, what the commands print, THE preprocessing spec of its
models, and for image-text families THE tokenizer. A family module defines the required
members itself; `Family` gives the optional ones (`OPTIONAL`) their defaults, in one place,
and refuses a module that lacks a required one. tests/test_families.py checks every family of
`FAMILIES` against `Interface`, member by member and signature by signature.
Nothing outside a family module sniffs config or tree keys to tell families apart: it asks
here.

A new family is one module beside these and one line of `FAMILIES`.
"""

import dataclasses
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from vit_jax.families import mixer, naflex, two_towers, vit
from vit_jax.families.preprocessing import Preprocessing
from vit_jax.flat import CheckpointError, as_flat
from vit_jax.models import MODEL_CONFIGS

Config = Mapping[str, Any] | ml_collections.ConfigDict
Features = Callable[[Any, jax.Array], jax.Array]


@runtime_checkable
class Interface(Protocol):
  """What the rest of the code asks of a model family: a family module's functions under
  these names and parameters, and its flags.

  Attributes:
    name: 'two_towers', 'mixer', 'naflex' or 'vit'.
    image_text: an image-text model (two towers, `t`, embeddings) rather than a classifier.
    writes: the checkpoint formats `vit-convert` writes it to.
    pre_logits: the model has a `representation_size` (pre_logits) layer.
    npz_layout: the layout `save_npz` writes it in, for the commands' summaries.
    MODULE: the Flax module it builds (`of_module` finds the family of a module).
  """

  name: str
  image_text: bool
  writes: tuple[str, ...]
  pre_logits: bool
  npz_layout: str
  MODULE: type[nn.Module]

  def owns_config(self, config: Config) -> bool:
    """Whether a model config (its constructor fields) is the family's."""

  def owns_tree(self, flat: Mapping[str, Any]) -> bool:
    """Whether a flat parameter dict is the family's."""

  def build(
    self, fields: Config, *, num_classes: int | None, dtype: Any, precision: str
  ) -> nn.Module:
    """The module of a run's model fields."""

  def init_inputs(
    self, model: nn.Module, resolution: int | tuple[int, int] | None, max_len: int | None
  ) -> dict[str, Any]:
    """The keyword inputs of the module's call (`jax.ShapeDtypeStruct`s) to initialise it on."""

  def forward_flops(self, config: Config, resolution: int, num_classes: int) -> int:
    """The analytic forward FLOPs of one image."""

  def infer_config(self, params: Mapping[str, Any]) -> ml_collections.ConfigDict:
    """The model fields a parameter tree (nested or flat) implies, read off its shapes."""

  def architecture(self, config: Config) -> tuple:
    """The fields that decide the parameter shapes."""

  def match_registry(self, config: Config) -> str | None:
    """The registered model of this architecture, or None."""

  def describe(self, config: Config) -> str:
    """The architecture in one phrase."""

  def label(self, config: Config) -> str:
    """An unregistered model's name in the commands' output."""

  def model_kind(self, config: Config) -> str:
    """What the model is, for one-line summaries ('ViT', 'DeiT (distilled)', 'SigLIP', ...)."""

  def kind(self, config: Config) -> str:
    """`model_kind`."""

  def table_columns(self, config: Config) -> dict[str, Any]:
    """The `vit-models` table's columns."""

  def is_plain(self, config: Config) -> bool:
    """A ViT of the paper's Table 1."""

  def unlike_hugging_face(self, config: Config) -> str | None:
    """Why transformers' ViTForImageClassification cannot hold the model, or None."""

  def native_resolution(self, flat: Mapping[str, Any], config: Config) -> int | None:
    """The image size a tree was trained at, where its shapes tell."""

  def patch_pixels(self, config: Config) -> int:
    """The side in input pixels of one token's patch (of the image tower)."""

  def token_grid(self, config: Config, image_size: int | tuple[int, int]) -> tuple[int, int]:
    """(rows, cols) of patch tokens for an image of `image_size` pixels."""

  def preprocessing(
    self, config: Config, resolution: int | tuple[int, int] | None = None, max_patches: int = 0
  ) -> Preprocessing:
    """THE preprocessing of the model's images: a resize to `resolution`, or patch
    sequences of at most `max_patches` (one-line ValueErrors for the other)."""

  # Optional: `Family` gives these defaults where a family module defines none.

  def image_config(self, config: Config) -> Config:
    """The image tower's config (an image-text model's); a classifier's own."""

  def stated_fields(self, config: Config) -> dict[str, Any]:
    """What a run's model config states that the shapes cannot."""

  def feature_kwargs(self, model: nn.Module) -> dict[str, Any]:
    """`apply` options for the model's features (a DeiT: both tokens')."""

  def check_pooled(self, config: Config, name: str) -> None:
    """Raises where the model's output is not one pooled vector."""

  def image_features(self, model: nn.Module) -> Callable[[Any, jax.Array], jax.Array]:
    """model -> (params, images) -> its image tower's pre-logits (a linear probe's input)."""

  def sequence_patch(self, config: Config) -> int | None:
    """The patch side of a model that takes images as patch sequences, or None."""

  def tokenizer_settings(
    self, pp: Mapping[str, Any] | None, *, name: str = '', max_len: int = 0
  ) -> tuple[str, int, dict[str, Any]]:
    """(name, max_len, options) of an image-text model's tokenizer."""

  def tokenizer(
    self, pp: Mapping[str, Any] | None, vocab: Any, *, name: str = '', max_len: int = 0
  ) -> Any:
    """THE tokenizer of an image-text model, on the vocabulary file `vocab`."""


# The members a family module must define itself; the others are `OPTIONAL`.
REQUIRED = (
  'owns_config',
  'owns_tree',
  'build',
  'init_inputs',
  'forward_flops',
  'infer_config',
  'architecture',
  'match_registry',
  'describe',
  'label',
  'model_kind',
  'table_columns',
  'is_plain',
  'unlike_hugging_face',
  'native_resolution',
  'patch_pixels',
  'token_grid',
  'preprocessing',
  'MODULE',
)
OPTIONAL = (
  'image_config',
  'stated_fields',
  'feature_kwargs',
  'check_pooled',
  'image_features',
  'sequence_patch',
  'tokenizer_settings',
  'tokenizer',
)


@dataclasses.dataclass(frozen=True, eq=False)
class Family:
  """A family module under `Interface`'s names: its own functions, and the defaults below
  of the optional members it leaves out. A module without a required member is a TypeError.
  The attributes are `Interface`'s flags; `module` is the family's module."""

  name: str
  module: ModuleType
  image_text: bool = False
  writes: tuple[str, ...] = ('npz', 'hf', 'timm')
  pre_logits: bool = True
  npz_layout: str = 'vit_jax layout, pre-Linen names'

  def __post_init__(self):
    missing = [m for m in REQUIRED if not hasattr(self.module, m)]
    if missing:
      raise TypeError(f'family {self.name!r}: {self.module.__name__} lacks {", ".join(missing)}')
    for member in (*REQUIRED, *OPTIONAL):  # the module's own, over the defaults below
      if hasattr(self.module, member):
        object.__setattr__(self, member, getattr(self.module, member))

  def kind(self, config: Config) -> str:
    return self.model_kind(config)

  # The optional members' defaults: a classifier of one pooled vector, with no tokenizer.

  def image_config(self, config: Config) -> Config:
    return config

  def stated_fields(self, config: Config) -> dict[str, Any]:
    del config
    return {}

  def feature_kwargs(self, model: nn.Module) -> dict[str, Any]:
    del model
    return {}

  def check_pooled(self, config: Config, name: str) -> None:
    del config, name

  def image_features(self, model: nn.Module) -> Features:
    """A classifier's pre-logits: the model without its head, in inference mode."""
    headless = model.clone(num_classes=0)
    return lambda params, images: headless.apply({'params': params}, images, train=False)

  def sequence_patch(self, config: Config) -> int | None:
    del config
    return None

  def tokenizer_settings(
    self, pp: Mapping[str, Any] | None, *, name: str = '', max_len: int = 0
  ) -> tuple[str, int, dict[str, Any]]:
    del pp, name, max_len
    raise ValueError(f'a {self.name} model reads no texts: it has no tokenizer')

  def tokenizer(
    self, pp: Mapping[str, Any] | None, vocab: Any, *, name: str = '', max_len: int = 0
  ) -> Any:
    del pp, vocab, name, max_len
    raise ValueError(f'a {self.name} model reads no texts: it has no tokenizer')


# Tried in order: the first family that owns a config or a tree is its family (NaFlex before
# the ViT, whose `embedding/kernel` it shares).
FAMILIES: tuple[Interface, ...] = (
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


def of_config(config: Config) -> Interface:
  """The family of a model config (its constructor fields)."""
  for family in FAMILIES:
    if family.owns_config(config):
      return family
  raise ValueError(f'no model family has the fields {sorted(config)}')


def takes_patch_sequences(config: Config) -> bool:
  """Whether the model (an image-text model: its image tower) takes images as patch
  sequences at their own size (NaFlex) rather than as pixel images of one resolution."""
  return of_config(config).sequence_patch(config) is not None


def run_preprocessing(config: Config, crop: int, max_patches: int) -> Preprocessing:
  """A training run's preprocessing of its model's images (its training examples', its
  evaluations' and every command's on its directory): the family's, at the run's `crop`
  or, for a model of patch sequences, at most `max_patches` patches (0: the model's own
  number); `max_patches` for a model of square images is a ValueError."""
  family = of_config(config)
  if family.sequence_patch(config) is not None:  # its images' own sizes: no crop
    return family.preprocessing(config, None, max_patches)
  return family.preprocessing(config, crop, max_patches)


def classifiers() -> dict[str, ml_collections.ConfigDict]:
  """The registered models that classify images (every family's but the image-text ones)."""
  return {n: c for n, c in MODEL_CONFIGS.items() if not of_config(c).image_text}


def of_module(model: Any) -> Interface:
  """The family of a built module (its class is the family's `MODULE`)."""
  for family in FAMILIES:
    if isinstance(model, family.MODULE):
      return family
  raise ValueError(f'no model family builds {type(model).__name__}')


def of_tree(params: Mapping[str, Any]) -> Interface | None:
  """The family of a parameter tree (nested or flat), or None for a tree of none."""
  flat = as_flat(params)
  for family in FAMILIES:
    if family.owns_tree(flat):
      return family
  return None


def infer_config(params: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """The model fields a parameter tree implies, read off its shapes, by its family (an
  image-text tree: nested, for its towers)."""
  family = of_tree(params)
  if family is None:
    raise CheckpointError(
      "the parameters lack 'embedding/kernel'; this is not a ViT parameter tree"
    )
  return family.infer_config(params)


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

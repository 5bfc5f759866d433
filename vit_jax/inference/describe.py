"""`describe`: one checkpoint as `vit_jax.load` computes it, read but not run: its kind and
architecture, counts, resolution or patch budget, preprocessing, tokenizer, class names, and
what the project computes otherwise than the file states. `vit-models --describe` prints it.

  d = describe('LiT-B16B.npz')
  d.kind, d.model, d.architecture, d.parameters, d.preprocessing, d.tokenizer, d.unlike
"""

import dataclasses
import os
from typing import Any

from vit_jax import families
from vit_jax.flat import count_params, flatten
from vit_jax.inference.loader import load
from vit_jax.inference.model import Model


@dataclasses.dataclass(frozen=True)
class Tokenizer:
  """An image-text model's tokenizer, as `load` builds it.

  Attributes:
    name: 'bert', 'sentencepiece' or 'gemma' (an exported model's: the tokenizer's class).
    max_len: tokens a text.
    vocab: the vocabulary file, or None where none was found.
    pieces: how many pieces the vocabulary holds.
    missing: without a vocabulary, the line that says where `load` looked; else ''.
  """

  name: str | None
  max_len: int | None
  vocab: str | None
  pieces: int | None
  missing: str = ''


@dataclasses.dataclass(frozen=True)
class Description:
  """One checkpoint, as `vit_jax.load` computes it.

  Attributes:
    source: what was described (a path, or a registered name).
    format: the file's format in one line (`checkpoint.Found.description`).
    kind: what the model is (`Model.kind`: 'ViT', 'ViT hybrid', 'DeiT (distilled)',
      'MLP-Mixer', 'NaFlex ViT', 'LiT', 'SigLIP').
    image_tower: an image-text model's image tower's kind ('ViT', 'NaFlex ViT'), else None.
    model: the registered model of its architecture; None: unregistered (an exported
      model's: export.json's `model`).
    architecture: the architecture in one phrase (its family's `describe`); None for an
      exported model, which keeps no architecture.
    arrays, parameters: the arrays and scalars the file holds (a registered name's: its
      initialised tree); None for an exported model.
    resolution: the image size the model computes at, or None (patch sequences).
    max_patches: a patch-sequence model's patches an image, or None.
    preprocessing: how an image becomes its input, in words (`Preprocessing.describe`).
    tokenizer: an image-text model's, else None.
    num_classes: a classifier's head classes; None without a head or for image-text models.
    class_names, class_names_source: the head's names (None: indices) and where they are from.
    unlike: a line for each setting the project computes otherwise than the file states
      (`checkpoint.Found.unlike`).
  """

  source: str
  format: str
  kind: str
  image_tower: str | None
  model: str | None
  architecture: str | None
  arrays: int | None
  parameters: int | None
  resolution: int | tuple[int, int] | None
  max_patches: int | None
  preprocessing: str
  tokenizer: Tokenizer | None
  num_classes: int | None
  class_names: tuple[str, ...] | None
  class_names_source: str
  unlike: tuple[str, ...]

  def to_json(self) -> dict[str, Any]:
    """The description as plain JSON values."""
    return dataclasses.asdict(self)


def describe(source: str | os.PathLike, **options: Any) -> Description:
  """The description of `source` (anything `vit_jax.load` takes, with `load`'s `options`):
  the file is read once, as `load` reads it; the model is not run.

  Raises:
    ValueError, OSError: `load`'s one-line errors.
  """
  return of_model(load(source, **options))


def of_model(model: Model) -> Description:
  """The description of a model `vit_jax.load` gave."""
  found, config = model.found, model.config
  family = None if config is None else families.of_config(config)
  arrays, parameters = _counts(model)
  spec = model.preprocessing
  return Description(
    source=model.source,
    format=_format(model),
    kind=model.kind,
    image_tower=_image_tower(family, config),
    model=_registered_name(model),
    architecture=None if family is None else family.describe(config),
    arrays=arrays,
    parameters=parameters,
    resolution=_resolution(model),
    max_patches=spec.max_patches if spec.kind == 'patches' else None,
    preprocessing=spec.describe(),
    tokenizer=_tokenizer(model, family),
    num_classes=None if model.image_text else model.num_classes,
    class_names=None if model.class_names is None else tuple(model.class_names),
    class_names_source=model.class_names_source,
    unlike=() if found is None else tuple(found.unlike),
  )


def _format(model: Model) -> str:
  if model.found is not None:
    return model.found.description
  if model.config is None:
    return 'a vit-export directory (StableHLO programs and export.json)'
  return 'a registered model, randomly initialised'


def _registered_name(model: Model) -> str | None:
  """The registered name: a file's (`Found.name`), or the name given; None: unregistered."""
  if model.found is not None:
    return model.found.name
  return model.name  # a registered name's, or export.json's (the name, or the words)


def _counts(model: Model) -> tuple[int | None, int | None]:
  """(arrays, parameters) of the file, else of the model's tree; (None, None) without one."""
  if model.found is not None:
    return model.found.arrays, model.found.parameters
  if model.params is None:
    return None, None
  flat = flatten(model.params)
  return len(flat), count_params(flat)


def _resolution(model: Model) -> int | tuple[int, int] | None:
  """The image size: the one fitted (an exported model's: its preprocessing's resize)."""
  size = model.preprocessing.size
  if model.resolution is not None or size is None:
    return model.resolution
  return size[0] if size[0] == size[1] else size


def _image_tower(family: Any, config: Any) -> str | None:
  """The kind of an image-text model's image tower."""
  if family is None or not family.image_text:
    return None
  image = family.image_config(config)
  return families.of_config(image).kind(image)


def _tokenizer(model: Model, family: Any) -> Tokenizer | None:
  """The tokenizer `load` built (or, without a vocabulary, would have built)."""
  if not model.image_text:
    return None
  tokenizer = model.tokenizer
  if family is not None:
    name, max_len, _ = family.tokenizer_settings(dict(model.config.get('pp') or {}))
  elif tokenizer is not None:  # an exported model: the tokenizer export.json rebuilt
    name, max_len = type(tokenizer).__name__, tokenizer.max_len
  else:
    name = max_len = None
  pieces = None if tokenizer is None else tokenizer.vocab_size
  missing = model.vocab_error if tokenizer is None else ''
  return Tokenizer(name, max_len, model.vocab, pieces, missing)

"""Any checkpoint into a runnable model: `fit`, the one loader behind predict, visualize, convert
and fine-tuning.

  fitted = fit('ViT-B_16.npz')                          # the model the weights describe
  fitted = fit('ViT-B_16.npz', 'ViT-B_16', num_classes=10, resolution=384)
  logits = fitted.model().apply({'params': fitted.params}, images, train=False)

The checkpoint is read in any format `formats.read` knows; the model is a registry name, a
model config (the constructor fields), or by default the architecture read off the shapes;
the parameters are fitted to it by `surgery.merge_pretrained` (head, pre_logits, position
embeddings on another grid), every mismatch a one-line error. What the file states beyond its
shapes (the GELU and LayerNorm epsilon of a Hugging Face or timm config.json, `Format.fields`)
is set on the model.
"""

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import ml_collections
from absl import logging

from vit_jax import families, files, rundir
from vit_jax.checkpoint import class_names, formats, tree, two_towers
from vit_jax.checkpoint.surgery import LoadReport, heads_note, merge_pretrained
from vit_jax.checkpoint.tree import CheckpointError
from vit_jax.families import two_towers as two_towers_family
from vit_jax.models import get_config, model_from_config


@dataclasses.dataclass(frozen=True)
class Found:
  """What a checkpoint holds, read off its shapes.

  Attributes:
    config: the architecture (`tree.infer_config`: model fields, `num_classes` and
      `representation_size` included), and the fields the file states beyond its shapes
      (`gelu_approximate=False` where its config names the exact GELU, `layer_norm_epsilon`
      where it states another than 1e-6).
    name: the registered model of this architecture, or None.
    resolution: the square image size its position embeddings are laid out for, or None.
    arrays, parameters: how many arrays and scalars it holds.
    description: its format, in one line.
    unlike: every setting the file states that the project computes otherwise, a line each
      (`Format.unlike`); `fit` logs each as a warning.
    heads_inferred: the file states no attention heads (a PyTorch file without config.json):
      those of `config` are the model's given to `fit`, a guess its errors say.
  """

  config: ml_collections.ConfigDict
  name: str | None
  resolution: int | None
  arrays: int
  parameters: int
  description: str
  unlike: tuple[str, ...] = ()
  heads_inferred: bool = False


@dataclasses.dataclass(frozen=True)
class Fitted:
  """A checkpoint fitted to a model, ready to apply.

  Attributes:
    params: the model's parameter tree (numpy), head included when the model has one.
    config: the model's constructor fields, `num_classes` included: `model()` builds it.
    name: the registered model name, or None for an architecture outside the registry.
    resolution: the input size in pixels the parameters are fitted to (None: `init_params`
      was given without it and its grid is not square).
    found: what the checkpoint holds.
    report: what the surgery did with every key.
  """

  params: dict[str, Any]
  config: ml_collections.ConfigDict
  name: str | None
  resolution: int | tuple[int, int] | None
  found: Found
  report: LoadReport

  def model(self, **overrides: Any) -> nn.Module:
    """The module, e.g. `model(num_classes=None)` for the pre-logits features."""
    return model_from_config(self.config, **overrides)

  def class_names(self) -> list[str] | None:
    """The names of the head's classes found beside the checkpoint (an .npz's FILE.json, a
    config.json's, a run's), where the head is the checkpoint's; None otherwise (a fresh
    head's classes are new ones)."""
    classes = self.config.get('num_classes')
    if not classes or 'head/kernel' in self.report.fresh:
      return None
    return class_names.beside(self.report.source, classes, imagenet=False)[0]

  @property
  def patch_pixels(self) -> int:
    """The side in input pixels of one token's patch (of the image tower)."""
    return tree.patch_pixels(_image_config(self.config))

  @property
  def grid(self) -> tuple[int, int]:
    """(rows, cols) of patch tokens at `resolution`."""
    return tree.token_grid(_image_config(self.config), self.resolution)


def _image_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A ViT's config, or an image-text model's image tower."""
  return families.of_config(config).image_config(config)


def _model_config(model: Any) -> tuple[ml_collections.ConfigDict | None, str | None]:
  """(an unlocked copy of the config, its registry name) of a name, a config or None."""
  if model is None:
    return None, None
  if isinstance(model, str):
    try:
      return get_config(model), model
    except KeyError as e:
      raise CheckpointError(e.args[0]) from None
  fields = model.to_dict() if isinstance(model, ml_collections.ConfigDict) else dict(model)
  config = ml_collections.ConfigDict(fields)
  return config, families.of_config(config).match_registry(config)


@dataclasses.dataclass(frozen=True)
class _File:
  """What `_read` takes from a checkpoint file, before its shapes are read (`_found`)."""

  restored: dict  # the tree
  description: str  # its format, in one line
  fields: dict[str, Any]  # the model fields the file states beyond its shapes
  unlike: tuple[str, ...]  # what the project computes otherwise (`Format.unlike`)
  heads_inferred: bool  # read with the model's heads: the file states none


def _read(
  path: str | os.PathLike, tower: str | None, heads: int | None, params_entry: str = 'params'
) -> _File:
  """The file at `path`, read once in its format, each line of `Format.unlike` logged as a
  warning; `tower='img'`: an image-text file's image tower (a run's whole tree: `fit` takes
  the tower); `params_entry='polyak'`: a training run's Polyak average instead of its
  parameters."""
  source = os.fspath(path)
  fmt = formats.detect_format(path)
  if params_entry != 'params' and fmt.name != 'orbax':
    raise CheckpointError(f'{path}: only a training run (orbax) holds {params_entry!r} parameters')
  if tower is not None and fmt.name not in ('npz', 'orbax'):
    raise CheckpointError(f'{path}:{tower}: only image-text .npz files and runs have towers')
  path = files.path(path)
  kwargs = {'tower': tower} if tower and fmt.name == 'npz' else {}
  restored, description = fmt.read(path, num_heads=heads, params_entry=params_entry, **kwargs)
  fields = fmt.fields(path)
  if tower is not None:  # the image tower's own, not the image-text model's (text, pp)
    fields = dict(fields.get('image') or {})
  unlike = tuple(fmt.unlike(path))
  for line in unlike:
    logging.warning('%s%s: %s', source, f':{tower}' if tower else '', line)
  heads_inferred = heads is not None and not fmt.states_heads(path)
  return _File(restored, description, fields, unlike, heads_inferred)


def _found(file: _File) -> Found:
  """What a file's tree holds, read off its shapes by its family, and the file's stated
  `fields` (a training run's: an image-text model's text heads, preprocessing and
  tokenizer)."""
  flat = tree.flatten(file.restored)
  config = families.infer_config(file.restored)
  config.update(file.fields)
  family = families.of_config(config)
  return Found(
    config=config,
    name=family.match_registry(config),
    resolution=family.native_resolution(flat, config),
    arrays=len(flat),
    parameters=tree.count_params(flat),
    description=file.description,
    unlike=file.unlike,
    heads_inferred=file.heads_inferred,
  )


def _check_fits(name: str, config: Any, found: Found, any_patch: bool) -> None:
  """A registered model given by name must have the checkpoint's architecture."""
  mine, theirs = tree.architecture(config), tree.architecture(found.config)
  if any_patch:  # FlexiViT: the patch embedding is resampled to the model's
    mine, theirs = mine[1:], theirs[1:]
  if mine != theirs:
    holds = found.name or 'an unregistered architecture'
    raise CheckpointError(
      f'--model {name} does not fit the checkpoint, which holds {holds}'
      f' ({tree.describe(found.config)}{heads_note(found.config, found.heads_inferred)});'
      ' leave --model out to use that.'
    )


def _warn_unlike(config: Any, fields: Mapping[str, Any], source: str, prefix: str = '') -> None:
  """A model config given as is keeps its fields; each one the file states otherwise is a
  warning line that names the config key to follow the file (a tower's: `prefix`)."""
  for key, value in fields.items():
    name, given = f'{prefix}{key}', config.get(key)
    if isinstance(value, Mapping):  # an image-text model's tower
      _warn_unlike(given or {}, value, source, f'{name}.')
    elif given != value:
      has = f'sets no {name}, and the model computes with its default'
      if given is not None:
        has = f'has {name}={given}, and the model computes with that'
      logging.warning(
        '%s: the file states %s=%s; the model config given %s: to compute as the file does,'
        ' set %s=%s in it (a fine-tune: --config.model.%s=%s)',
        *(source, name, value, has, name, value, name, value),
      )


def _take_stated(
  model: Any, config: ml_collections.ConfigDict, fields: Mapping[str, Any], source: str
) -> None:
  """The fields the file states beyond its shapes: a registered model takes them (its
  architecture, computed as the file says); a model config given as is keeps its own."""
  if isinstance(model, str):
    config.update(fields)
  else:
    _warn_unlike(config, fields, source)


def _resolution(
  resolution: int | tuple[int, int] | None, config: Any, native: int | None, source: str
) -> int | tuple[int, int] | None:
  """The requested size, else the checkpoint's; a multiple of the model's patch pixels.
  None for a model of patch sequences, which takes none."""
  if families.takes_patch_sequences(config):
    if resolution is not None:
      raise CheckpointError(
        f'{source}: a NaFlex model takes images at their own size: no --resolution'
      )
    return None
  if resolution is None:
    if native is None:
      raise CheckpointError(
        f'{source}: cannot tell the trained resolution (the position embeddings are sincos2d'
        ' or not a square grid): pass --resolution'
      )
    resolution = native
  stride = tree.patch_pixels(config)
  sides = (resolution,) if isinstance(resolution, int) else tuple(resolution)
  if any(side <= 0 or side % stride for side in sides):
    raise CheckpointError(
      f'--resolution {resolution} is not a positive multiple of the patch stride {stride}'
      ' of this model'
    )
  return resolution


def _fitted_config(
  model: Any,
  config: ml_collections.ConfigDict | None,
  name: str | None,
  found: Found,
  fields: Mapping[str, Any],
  resize_patch_embedding: bool,
  source: str,
) -> tuple[ml_collections.ConfigDict, str | None]:
  """(config, registry name) of the model `fit` builds for the checkpoint `found`: `config`
  as `model` gave it (checked against the file, with the fields the file states), or the
  architecture read off the shapes."""
  if config is None:
    config, name = ml_collections.ConfigDict(found.config.to_dict()), found.name
  else:
    if isinstance(model, str):
      _check_fits(name, config, found, resize_patch_embedding)
    _take_stated(model, config, fields, source)
  given_config = isinstance(model, Mapping | ml_collections.ConfigDict)
  if not given_config and families.of_config(config).pre_logits:
    config.representation_size = found.config.representation_size
  return config, name


def _requested_model(model, source: str, tower: str | None):
  """`fit`'s `model` as (config, name, whether it is image-text, its ViT's attention heads or
  None); an image-text model asked of one tower (`PATH:img`) is a one-line CheckpointError."""
  config, name = _model_config(model)
  image_text = config is not None and families.of_config(config).image_text
  if image_text and tower is not None:
    raise CheckpointError(
      f'{source}: the image-text model {name or "given"} takes the whole file; drop ":img"'
    )
  transformer = None if config is None or image_text else config.get('transformer')
  return config, name, image_text, transformer.num_heads if transformer else None


def fit(
  path: str | os.PathLike,
  model: str | Mapping[str, Any] | ml_collections.ConfigDict | None = None,
  num_classes: int | None = None,
  resolution: int | tuple[int, int] | None = None,
  *,
  keep_head: bool | None = None,
  init_params: Mapping[str, Any] | None = None,
  params_entry: str = 'params',
  **surgery: Any,
) -> Fitted:
  """Reads the checkpoint at `path` and fits it to a runnable model.

  Args:
    path: a checkpoint in any format `vit_jax.checkpoint.read` knows; `PATH:img` is the
      image tower of an image-text .npz alone, as a ViT.
    model: a registry name (checked against the checkpoint's architecture), a model config
      (its constructor fields, used as given: fine-tuning drops a `pre_logits` its model has
      no place for), or None: the architecture read off the shapes. A name or None keeps the
      checkpoint's `pre_logits`. An image-text file (LiT, SigLIP) gives an image-text model
      unless `model` is a ViT, which takes its image tower.
    num_classes: head classes; None: the checkpoint's; 0: no head (with `init_params`: its
      head's). Not for an image-text model, whose heads are its out_dim.
    resolution: input pixels (an int, or (height, width)); None: the checkpoint's, or with
      `init_params` the square its position embeddings imply. Another size resizes the
      checkpoint's position embeddings.
    keep_head: keep the checkpoint's head; None: when its class count is the model's (an
      image-text model keeps both its heads).
    init_params: the model's initialised tree (concrete leaves are the initial values of
      keys the checkpoint does not give), whose head sets the class count; None: the
      model's shapes at `resolution` (`jax.eval_shape`, nothing allocated).
    params_entry: 'polyak' reads a training run's Polyak average (orbax checkpoints only).
    **surgery: `merge_pretrained` options: `dont_load`, `strict`, `pretrained_grid`,
      `resize_patch_embedding`.

  Raises:
    CheckpointError: an unreadable file, or a checkpoint that does not fit; one line.
  """
  source = str(path)
  path, tower = two_towers.split_tower(path)
  config, name, image_text, heads = _requested_model(model, source, tower)
  file = _read(path, tower, heads, params_entry)
  request = _Request(model, num_classes, resolution, keep_head, init_params, surgery, source)
  holds = families.of_tree(file.restored)
  if holds is not None and holds.image_text:
    if (config is None or image_text) and tower is None:
      return _fit_two_towers(file, _found(file), config, name, request)
    restored, description = two_towers.image_tower(file.restored, file.description)
    fields = dict(file.fields.get('image') or {})  # the image tower's own
    file = dataclasses.replace(file, restored=restored, description=description, fields=fields)
  elif image_text:
    raise CheckpointError(
      f'{source} holds no image-text model, which the model {name or "given"} needs'
    )
  return _fit_vit(file, _found(file), config, name, request)


@dataclasses.dataclass(frozen=True)
class _Request:
  """What `fit` was asked for, beyond the file."""

  model: Any
  num_classes: int | None
  resolution: int | tuple[int, int] | None
  keep_head: bool | None
  init_params: Mapping[str, Any] | None
  surgery: dict[str, Any]
  source: str


def _fit_vit(
  file: _File,
  found: Found,
  config: ml_collections.ConfigDict | None,
  name: str | None,
  request: _Request,
) -> Fitted:
  """A ViT or Mixer tree fitted to the model asked for (`fit`)."""
  source, surgery = request.source, request.surgery
  resize = surgery.get('resize_patch_embedding', False)
  config, name = _fitted_config(request.model, config, name, found, file.fields, resize, source)
  resolution = image_size = request.resolution
  init_params, num_classes = request.init_params, request.num_classes
  if init_params is None:
    config.num_classes = found.config.num_classes if num_classes is None else num_classes or None
    resolution = image_size = _resolution(resolution, config, found.resolution, source)
    init_params = families.param_shapes(model_from_config(config), resolution)
  else:  # the tree is the model: its head and its grid
    head = tree.flatten(init_params).get('head/kernel')
    config.num_classes = None if head is None else int(head.shape[-1])
    resolution = resolution or tree.native_resolution(init_params, config)
  keep_head = request.keep_head
  if keep_head is None:
    keep_head = bool(found.config.num_classes) and config.num_classes == found.config.num_classes
  params, report = merge_pretrained(
    file.restored,
    init_params,
    config,
    keep_head,
    image_size=image_size,
    source=source,
    heads_inferred=found.heads_inferred,
    **surgery,
  )
  return Fitted(params, config, name, resolution, found, report)


def _fit_two_towers(
  file: _File,
  found: Found,
  config: Any,
  name: str | None,
  request: _Request,
) -> Fitted:
  """An image-text tree fitted to its model (`fit`): both towers, heads and scalars kept."""
  source, found_config = request.source, found.config
  if request.num_classes is not None or request.surgery:
    raise CheckpointError(
      f'{source}: an image-text model is fitted whole (no num_classes or surgery options; its'
      f' heads are out_dim); for a classifier on its image tower read {source}:img'
    )
  if config is None:
    config, name = ml_collections.ConfigDict(found_config.to_dict()), found.name
  elif two_towers_family.architecture(config) != two_towers_family.architecture(found_config):
    raise CheckpointError(
      f'--model {name or "(the config given)"} does not fit the checkpoint, which holds'
      f' {found.name or "an unregistered image-text model"}'
      f' ({two_towers_family.describe(found_config)}); leave --model out to use that.'
    )
  else:
    two_towers_family.adopt_file_preprocessing(config, found_config)
    towers = {k: v for k, v in file.fields.items() if k in ('image', 'text')}
    _take_stated(request.model, config, towers, source)
  init, resolution = request.init_params, request.resolution
  if init is not None and not families.takes_patch_sequences(
    config
  ):  # the tree is the model: its grid
    resolution = resolution or tree.native_resolution(init['img'], config.image)
  resolution = _resolution(resolution, config.image, found.resolution, source)
  params, report = two_towers.fit_params(file.restored, config, resolution, source, init)
  return Fitted(params, config, name, resolution, found, report)


def holds_image_text(path: str | os.PathLike) -> bool:
  """Whether `path` is a whole image-text model (not `FILE:img`): an .npz in a LiT or
  big_vision layout (its keys read, not its arrays), a Hugging Face SiglipModel or
  Siglip2Model, or a training run of one (its config.json)."""
  path, tower = two_towers.split_tower(path)
  if tower is not None or not files.path(path).exists():
    return False
  fmt = formats.detect_format(path)
  if fmt.name == 'hf_siglip':
    return True
  if fmt.name == 'npz':
    return two_towers.holds_towers(path)
  if fmt.name == 'orbax':
    run = rundir.find_run(path)
    model = rundir.read_config(run).get('model') if run is not None else None
    return isinstance(model, Mapping) and families.of_config(model).image_text
  return False


def load_pretrained(
  path: str | os.PathLike,
  init_params: Mapping[str, Any],
  model_config: Any,
  keep_head: bool = False,
  **kwargs: Any,
) -> dict:
  """The original vit_jax `load_pretrained`: the checkpoint at `path` fitted to an initialised
  tree of `model_config` (fresh head by default); the surgery's report is logged.

  `image_size` places the position embeddings on a non-square grid; the other options are
  `merge_pretrained`'s.
  """
  fitted = fit(
    path,
    model_config,
    resolution=kwargs.pop('image_size', None),
    keep_head=keep_head,
    init_params=init_params,
    **kwargs,
  )
  logging.info('load_pretrained: %s', fitted.found.description)
  for line in fitted.report.lines():
    logging.info('load_pretrained: %s', line)
  return fitted.params

"""`load`: any checkpoint, export directory or registered model name as a `Model`."""

import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import checkpoint as ckpt
from vit_jax import families, files
from vit_jax.checkpoint import class_names as class_names_lib
from vit_jax.export import artifact
from vit_jax.families.preprocessing import Preprocessing
from vit_jax.inference.model import Model, Programs, classifier_programs, image_text_programs
from vit_jax.models import MODEL_CONFIGS, get_config

DTYPES = ('float32', 'bfloat16')
DEFAULT_RESOLUTION = 224  # a registered classifier's, where none is given


@dataclasses.dataclass(frozen=True)
class _Weights:
  """A model's fields and parameters, wherever they came from."""

  config: Any
  params: Any
  name: str | None
  resolution: Any
  source: str
  from_file: bool
  found: Any = None  # a file's `checkpoint.Found`


def load(
  source: str | os.PathLike,
  *,
  model: Any = None,
  resolution: int | tuple[int, int] | None = None,
  num_classes: int | None = None,
  dtype: str = 'float32',
  max_patches: int = 0,
  vocab: str | None = None,
  seed: int = 0,
  batch_size: int = 32,
  params_entry: str = 'params',
) -> Model:
  """The model at `source`, ready to use: its module, parameters, preprocessing, tokenizer
  (image-text models) and class names (classifiers).

  Args:
    source: a checkpoint `vit_jax.checkpoint.fit` reads (a training run directory, a released
      .npz in any layout, Hugging Face and timm files, LiT/SigLIP/SigLIP 2), a directory
      `vit-export` wrote (run from its StableHLO), or a registered model name (initialised
      from `seed`).
    model: a registry name the checkpoint must fit (None: read off its shapes).
    resolution: the image size (None: the checkpoint's; a registered classifier's: 224);
      another size resizes the position embeddings.
    num_classes: a registered classifier's head (None: its own); not for checkpoints.
    dtype: 'float32' or 'bfloat16' (the matmul kernels cast once).
    max_patches: the patches an image of a patch-sequence model (0: its own).
    vocab: an image-text model's vocabulary file (None: found beside the checkpoint).
    seed: a registered model's initialisation.
    batch_size: images or texts per compiled call.
    params_entry: 'polyak' for a training run's Polyak average.

  Raises:
    ValueError (a `CheckpointError` for files), OSError: one line naming the problem.
  """
  if dtype not in DTYPES:
    raise ValueError(f'dtype={dtype!r}: choose one of {", ".join(DTYPES)}')
  if artifact.is_export_dir(str(source)):
    return _exported(str(source), batch_size)
  if isinstance(source, str) and source in MODEL_CONFIGS and not files.path(source).exists():
    weights = _registered(source, resolution, num_classes, seed)
  else:
    if num_classes is not None:
      raise ValueError('num_classes is for a registered model; a checkpoint keeps its head')
    fitted = ckpt.fit(source, model, resolution=resolution, params_entry=params_entry)
    weights = _Weights(
      fitted.config, fitted.params, fitted.name, fitted.resolution, str(source), True, fitted.found
    )
  return _model(weights, dtype, max_patches, vocab, batch_size)


def holds(source: str | os.PathLike) -> tuple[bool, bool]:
  """(whether `source` holds an image-text model, whether it is an export directory), read
  without loading it: the commands' usage checks."""
  if artifact.is_export_dir(str(source)):
    return 'text' in artifact.read_metadata(str(source)), True
  if isinstance(source, str) and source in MODEL_CONFIGS and not files.path(source).exists():
    return families.of_config(MODEL_CONFIGS[source]).image_text, False
  return ckpt.holds_image_text(source), False


def _registered(name: str, resolution: Any, num_classes: int | None, seed: int) -> _Weights:
  """A registered model initialised from `seed` at `resolution` (None: its own)."""
  config = get_config(name)
  family = families.of_config(config)
  if num_classes is not None:
    if family.image_text:
      raise ValueError(f'{name} is an image-text model: its heads are its out_dim')
    config.num_classes = num_classes or None
  resolution = resolution or _own_resolution(config)
  module = family.build(
    config, num_classes=config.get('num_classes'), dtype=jnp.float32, precision='matmul'
  )
  params = families.init_params(module, jax.random.key(seed), resolution or DEFAULT_RESOLUTION)
  return _Weights(config, jax.device_get(params), name, resolution, name, False)


def _own_resolution(config: Any) -> int | None:
  """A registered model's image size: an image-text model's own (`pp.size`), a classifier's
  the paper's 224; None where it takes patch sequences."""
  try:
    spec = families.of_config(config).preprocessing(config, None, 0)
  except ValueError:  # a classifier states no size
    return DEFAULT_RESOLUTION
  return None if spec.size is None else spec.size[0]


def _model(weights: _Weights, dtype: str, max_patches: int, vocab: str | None, batch_size: int):
  """The `Model` of fitted weights: its family's preprocessing, programs and extras."""
  config = weights.config
  family = families.of_config(config)
  spec = family.preprocessing(config, weights.resolution, max_patches)
  module = family.build(
    config, num_classes=config.get('num_classes'), dtype=jnp.dtype(dtype), precision='matmul'
  )
  name = weights.name or family.label(config)
  common = dict(
    name=name,
    kind=family.kind(config),
    image_text=family.image_text,
    preprocessing=spec,
    dtype=dtype,
    source=weights.source,
    config=config,
    module=module,
    resolution=weights.resolution,
    batch_size=batch_size,
    found=weights.found,
  )
  if family.image_text:
    return _image_text(weights, module, spec, vocab, common)
  family.check_pooled(config, name)
  programs, params = classifier_programs(module, weights.params, spec, dtype)
  num_classes = config.get('num_classes') or None
  head = weights.params.get('head')
  zero = head is not None and not np.any(head['kernel']) and not np.any(head['bias'])
  names, names_source = None, 'indices'
  if num_classes and weights.from_file:
    names, names_source = class_names_lib.beside(weights.source, num_classes)
  elif num_classes == class_names_lib.IMAGENET_NUM_CLASSES:
    names, names_source = class_names_lib.imagenet_class_names()
  return Model(
    programs=programs, params=params, num_classes=num_classes, class_names=names,
    class_names_source=names_source, head_is_zero=zero, patch_pixels=family.patch_pixels(config),
    grid=_grid(family, config, weights.resolution), **common,
  )  # fmt: skip


def _grid(family: Any, config: Any, resolution: Any) -> tuple[int, int] | None:
  """The patch tokens (rows, cols) at `resolution`; None for images at their own size."""
  return None if resolution is None else family.token_grid(config, resolution)


def _image_text(weights: _Weights, module: Any, spec: Any, vocab: str | None, common: dict):
  """An image-text model: its towers' programs, tokenizer, t and b, zero-shot templates."""
  config, params = weights.config, weights.params
  pp = dict(config.get('pp') or {})
  family = families.of_config(config)
  name, max_len, _ = family.tokenizer_settings(pp)
  uses = ckpt.two_towers.uses(weights.source, name, vocab) if weights.from_file else None
  path = uses.vocab if uses else vocab
  tokenizer, error = None, ''
  if path is None:
    error = _no_vocab(weights, name)
  else:
    tokenizer = ckpt.two_towers.vocab_tokenizer(config, path)
  programs, cast = image_text_programs(module, params, spec, max_len, common['dtype'])
  scalar = lambda key: float(np.asarray(params[key]).reshape(())) if key in params else None
  return Model(
    programs=programs, params=cast, tokenizer=tokenizer, vocab=path, vocab_error=error,
    t=float(np.exp(scalar('t'))), b=scalar('b'), templates=uses.templates if uses else None,
    canonicalize=uses.canonicalize if uses else True, **common,
  )  # fmt: skip


def _no_vocab(weights: _Weights, tokenizer_name: str) -> str:
  """The one line that says where the vocabulary was looked for."""
  if not weights.from_file:
    return f'{weights.source} was initialised without a vocabulary: give vocab=FILE (--vocab)'
  return ckpt.two_towers.missing_vocab(weights.source, tokenizer_name)


def _exported(directory: str, batch_size: int) -> Model:
  """The exported model in `directory` as a `Model` of its StableHLO functions."""
  meta = artifact.read_metadata(directory)
  common = dict(
    name=meta['model'],
    kind=meta['kind'],
    preprocessing=Preprocessing.from_json(meta['preprocessing']),
    dtype=meta['dtype'],
    source=str(directory),
    batch_size=batch_size,
  )
  if 'text' not in meta:
    fn = artifact.function(directory, meta, 'model')
    output = meta['functions']['model']['output']
    logits = output['name'] == 'logits'
    classifier = (lambda x: (None, fn(x))) if logits else (lambda x: (fn(x), None))
    classes = output['shape'][-1] if logits else None
    return Model(image_text=False, programs=Programs(classifier=classifier),
                 num_classes=classes, **common)  # fmt: skip
  text = meta['text']
  programs = Programs(
    image=artifact.function(directory, meta, 'image'),
    text=artifact.function(directory, meta, 'text'),
  )
  vocab_error = f'{directory}: export.json names no vocabulary (vit-export --vocab); no texts'
  return Model(
    image_text=True, programs=programs, tokenizer=artifact.tokenizer(directory, meta),
    vocab=text['tokenizer'].get('vocab'), vocab_error=vocab_error, t=text['t'], b=text['b'],
    **common,
  )  # fmt: skip

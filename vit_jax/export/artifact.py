"""Reading back what `vit-export` wrote (`vit_jax.export`): the directory's export.json, its
StableHLO artifacts as functions of numpy batches, and the tokenizer export.json states. The
writer and this reader are the one place for the format; `vit_jax.load(OUT)` makes a model of
them.

  meta = read_metadata('out/')                 # a directory holding export.json
  y = function('out/', meta, 'model')(images)  # 'image' and 'text' for an image-text model

The artifacts run through `jax.export.deserialize`: no flax model, no checkpoint.
"""

import json
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.interpreters import mlir

from vit_jax import families, files

METADATA = 'export.json'  # as the writer names it (vit_jax/export/__init__.py)


def is_export_dir(path: str) -> bool:
  """Whether `path` is a directory `vit-export` wrote (it holds export.json)."""
  return files.path(path).is_dir() and files.path(files.join(path, METADATA)).exists()


def read_metadata(directory: str) -> dict[str, Any]:
  """The export.json of `directory`, which must hold StableHLO; one-line ValueErrors."""
  path = files.path(files.join(directory, METADATA))
  if not path.exists():
    raise ValueError(f'{directory}: no {METADATA} (not written by vit-export)')
  meta = json.loads(path.read_text())
  if 'stablehlo' not in meta.get('formats', ()):
    raise ValueError(f'{directory}: holds no StableHLO artifact (formats {meta.get("formats")})')
  return meta


def _check_readable(exported: jax.export.Exported, path: str, writer: str | None) -> None:
  """A one-line ValueError where this jax's StableHLO cannot read the module of `exported`,
  written by jax `writer` (None: export.json predates recording it). jax reads what an older
  jax wrote (6 months back), what a newer one wrote only where it uses no op newer than
  this jax's StableHLO: jax 0.12 writes a shape check that jax 0.10 cannot read."""
  try:
    with mlir.make_ir_context():
      exported.mlir_module(serialized=False)
  except jax.errors.JaxRuntimeError:
    here = jax.__version__
    written, newer = (
      (f'jax {writer}', f'jax {writer} or newer')
      if writer
      else ('another jax (export.json names none)', 'the jax that wrote it')
    )
    raise ValueError(
      f'{path}: written by {written}, whose StableHLO jax {here} cannot read: export it'
      f' again with jax {here}, or load it with {newer} (docs/export.md, Across jax versions)'
    ) from None


def function(directory: str, meta: dict[str, Any], name: str) -> Callable[[np.ndarray], Any]:
  """The StableHLO artifact of function `name` ('model', 'image', 'text'): batch -> outputs.
  Written by another jax (export.json's `jax`), its module is read once here first, so that
  one this jax cannot read is a one-line ValueError now, not a runtime error at the first
  call."""
  entry = meta['functions'].get(name)
  if entry is None or not entry.get('stablehlo'):
    raise ValueError(f'{directory}: no StableHLO artifact of {name!r} (export.json)')
  path = files.join(directory, entry['stablehlo'])
  exported = jax.export.deserialize(bytearray(files.path(path).read_bytes()))
  if meta.get('jax') != jax.__version__:
    _check_readable(exported, path, meta.get('jax'))
  return lambda x: np.asarray(exported.call(x))


def tokenizer(directory: str, meta: dict[str, Any]) -> Any:
  """An image-text model's tokenizer: its family's, of the model's tokenizer settings that
  export.json keeps and the vocabulary copied beside it; None without a vocabulary."""
  settings = meta['text']['tokenizer']
  if not settings.get('vocab'):
    return None
  # An export.json written before it kept the model's `pp`: its settings say the same.
  pp = settings.get('pp') or {
    'tokenizer_name': settings['name'],
    'max_len': settings['max_len'],
    'lower_case': bool(settings.get('options')),
  }
  family = next(f for f in families.FAMILIES if f.name == meta['family'])
  return family.tokenizer(pp, files.join(directory, settings['vocab']))

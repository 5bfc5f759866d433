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


def function(directory: str, meta: dict[str, Any], name: str) -> Callable[[np.ndarray], Any]:
  """The StableHLO artifact of function `name` ('model', 'image', 'text'): batch -> outputs."""
  entry = meta['functions'].get(name)
  if entry is None or not entry.get('stablehlo'):
    raise ValueError(f'{directory}: no StableHLO artifact of {name!r} (export.json)')
  blob = files.path(files.join(directory, entry['stablehlo'])).read_bytes()
  exported = jax.export.deserialize(bytearray(blob))
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

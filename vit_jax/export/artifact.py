"""Reading back what `vit-export` wrote (`vit_jax.export`): the directory's export.json and its
StableHLO artifacts, as functions of numpy batches, with the preprocessing and tokenizer that
export.json states. The writer and this reader are the one place for the format.

  artifact = load_artifact('out/')                   # a directory holding export.json
  images = np.stack([artifact.preprocess(x) for x in pixels])   # uint8 (H, W, 3) each
  y = artifact.function('model')(images)             # 'image' and 'text' for an image-text model

The artifacts run through `jax.export.deserialize`: no flax model, no checkpoint.
"""

import dataclasses
import functools
import json
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from vit_jax import files

METADATA = 'export.json'  # as the writer names it (vit_jax/export/__init__.py)


def is_export_dir(path: str) -> bool:
  """Whether `path` is a directory `vit-export` wrote (it holds export.json)."""
  return files.path(path).is_dir() and files.path(files.join(path, METADATA)).exists()


@dataclasses.dataclass(frozen=True, eq=False)
class Artifact:
  """An exported model: `meta` is its export.json; `directory` holds the artifacts."""

  directory: str
  meta: dict[str, Any]

  @property
  def image_text(self) -> bool:
    return 'text' in self.meta

  @property
  def model(self) -> str:
    return self.meta['model']

  def output_name(self, name: str) -> str:
    """What function `name` gives: 'logits', 'features' or 'embeddings'."""
    return self.meta['functions'][name]['output']['name']

  def function(self, name: str) -> Callable[[np.ndarray], np.ndarray]:
    """The StableHLO artifact of function `name` ('model', 'image', 'text'): batch -> outputs."""
    entry = self.meta['functions'].get(name)
    if entry is None or not entry.get('stablehlo'):
      raise ValueError(f'{self.directory}: no StableHLO artifact of {name!r} (export.json)')
    blob = files.path(files.join(self.directory, entry['stablehlo'])).read_bytes()
    exported = jax.export.deserialize(bytearray(blob))
    return lambda x: np.asarray(exported.call(x))

  def preprocess(self, image: np.ndarray) -> np.ndarray:
    """Decoded uint8 pixels (H, W, 3) -> the image input, as export.json's `preprocessing`
    states it (vit_jax/data/preprocess.py computes each kind)."""
    from vit_jax.data import preprocess

    if image.ndim != 3 or image.shape[-1] != 3:
      raise ValueError(f'expected an RGB image of shape (H, W, 3), got {image.shape}')
    pp = self.meta['preprocessing']
    if pp['kind'] == 'naflex_patch_sequence':
      return preprocess.patch_sequence(image, pp['patch_size'], pp['max_patches']).numpy()
    if pp['kind'] != 'resize':
      raise ValueError(f'{self.directory}: unknown preprocessing {pp["kind"]!r} (export.json)')
    import tensorflow as tf

    resized = tf.image.resize(image, pp['size'], method=pp['method'])
    if pp.get('round_to_uint8'):  # the original LiT's: the resized image cast to uint8
      resized = tf.cast(resized, tf.uint8)
    return preprocess.value_range(resized).numpy()

  @functools.cached_property
  def tokenizer(self):
    """An image-text model's tokenizer, from export.json's settings and the vocabulary copied
    beside it."""
    from vit_jax import text

    settings = self.meta['text']['tokenizer']
    if not settings.get('vocab'):
      raise ValueError(f'{self.directory}: export.json names no vocabulary; no text tower input')
    vocab = files.join(self.directory, settings['vocab'])
    return text.get_tokenizer(
      settings['name'], vocab, settings['max_len'], **(settings['options'] or {})
    )


def load_artifact(directory: str) -> Artifact:
  """The exported model in `directory`; one-line ValueErrors."""
  path = files.path(files.join(directory, METADATA))
  if not path.exists():
    raise ValueError(f'{directory}: no {METADATA} (not written by vit-export)')
  meta = json.loads(path.read_text())
  if 'stablehlo' not in meta.get('formats', ()):
    raise ValueError(f'{directory}: holds no StableHLO artifact (formats {meta.get("formats")})')
  return Artifact(str(directory), meta)

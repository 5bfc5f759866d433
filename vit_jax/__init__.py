"""Vision Transformers in JAX/Flax: models, checkpoints, data, training, benchmarks, the paper.

  import vit_jax
  model = vit_jax.load('ViT-B_16.npz')         # any checkpoint, export or registered name
  model.classify(['cat.jpg'])[0]               # the top-5 classes with their probabilities

`load` and `Model` are loaded on first use, so `import vit_jax` imports nothing heavy.
"""

import importlib
from typing import Any

__all__ = ['Model', 'load']


def __getattr__(name: str) -> Any:
  if name in __all__:
    return getattr(importlib.import_module('vit_jax.inference'), name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')

"""A fitted model shipped outside JAX: a `jax.export` StableHLO artifact, a TensorFlow
SavedModel and ONNX files, with an `export.json` that says how to feed them.

  written = export_model('ViT-B_16.npz', 'out/', formats=('stablehlo', 'saved_model'))
  exp = jax.export.deserialize(open('out/model.stablehlo', 'rb').read())
  logits = exp.call(images)                      # any batch: the batch dimension is 'b'

Each function of the model (`functions`: a classifier's `model`; an image-text model's `image`
and `text` towers) closes over its parameters, so the artifacts hold them as constants and
need neither this project nor flax to run. The batch dimension is symbolic ('b'); a patch-sequence
tower's sequence length too ('n'). The StableHLO is lowered for CPU, CUDA and TPU at once.
The SavedModel (`vit_jax/export/saved_model.py`) is the same functions through `jax2tf`,
the ONNX files (`vit_jax/export/onnx.py`) through `jax2onnx`, which needs an environment of
its own, and their int8 quantization (`vit_jax/export/onnx_int8.py`, `onnx_int8`: asked for
alone, it writes the float32 ONNX file it quantizes too); unless told, the formats this
environment writes are written (`default_formats`), which leave int8 out.
The directory is written beside OUT and renamed into place: a failure leaves OUT untouched.
"""

import importlib
from typing import Any

FORMATS = ('stablehlo', 'saved_model', 'onnx', 'onnx_int8')
# Written where asked for only: its outputs are not the model's to 1e-5.
OPT_IN = ('onnx_int8',)
DTYPES = ('float32', 'bfloat16')
PLATFORMS = ('cpu', 'cuda', 'tpu')
SAVED_MODEL = 'saved_model'

# The names loaded on first use (`vit_jax/export/exporter.py` and the submodules import jax),
# so that `vit-export` checks its arguments against the constants above before jax loads.
_NAMES = {
  'ExportError': 'exporter',
  'Function': 'exporter',
  'default_formats': 'exporter',
  'export_model': 'exporter',
  'functions': 'exporter',
  'image_preprocessing': 'exporter',
  'metadata': 'exporter',
  'write_stablehlo': 'exporter',
  'is_export_dir': 'artifact',
}
_SUBMODULES = ('artifact', 'exporter', 'onnx', 'onnx_int8', 'saved_model')

__all__ = ['export_model', 'functions', 'is_export_dir']


def __getattr__(name: str) -> Any:
  if name in _NAMES:
    return getattr(importlib.import_module(f'{__name__}.{_NAMES[name]}'), name)
  if name in _SUBMODULES:
    return importlib.import_module(f'{__name__}.{name}')
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')

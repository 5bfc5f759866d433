"""The exported functions as a TensorFlow SavedModel (`jax2tf`): loads and runs in TensorFlow
alone, any batch size.

Each function is one signature of its name (`model`; an image-text model's `image` and
`text`), the first also `serving_default`; inputs and outputs are named as export.json says.
The StableHLO inside is lowered for CPU, CUDA and TPU, as the `jax.export` artifact is.
TensorFlow is imported here alone. Where TensorFlow is missing, or cannot run what this jax
writes, `unavailable` says why in one line and no SavedModel is written.
"""

import importlib.util
import os
from collections.abc import Sequence
from typing import Any

import jax

SERVING = 'serving_default'
# ONNX's environment (requirements/oldest-onnx.txt, newest-onnx.txt) leaves TensorFlow out.
UNAVAILABLE = (
  'saved_model: not written; it needs TensorFlow, which this environment lacks: the extra'
  ' `vit_jax[train]` has it, as the main environment does (requirements/oldest.txt, newest.txt)'
)


# The first jax whose SavedModels TensorFlow cannot run: TensorFlow 2.21's XlaCallModule reads
# StableHLO 1.13.7, and jax 0.12 writes the symbolic batch's shape check as
# `vhlo.custom_call_v2` (StableHLO 1.18); jax 0.10.2's run (docs/export.md, Across jax
# versions). jax 0.11 is untested: counted as working.
FIRST_JAX_TENSORFLOW_CANNOT_RUN = (0, 12)


def available() -> bool:
  """Whether TensorFlow is installed here."""
  return importlib.util.find_spec('tensorflow') is not None


def tensorflow_runs_this_jax() -> bool:
  """Whether TensorFlow can run the StableHLO this jax writes (TensorFlow not imported)."""
  return jax.__version_info__[:2] < FIRST_JAX_TENSORFLOW_CANNOT_RUN


def unavailable() -> str | None:
  """Why no SavedModel is written here, in one line; None where one is."""
  if not available():
    return UNAVAILABLE
  if not tensorflow_runs_this_jax():
    return (
      f'saved_model: not written: TensorFlow cannot run the StableHLO that jax {jax.__version__}'
      ' writes (docs/export.md, Across jax versions): write SavedModels with jax 0.10'
      ' (Python 3.11, the oldest end)'
    )
  return None


def _signature(function: Any, platforms: Sequence[str]) -> Any:
  """A `tf.function` of one exported function, its batch (and sequence length) dimension None."""
  import tensorflow as tf
  from jax.experimental import jax2tf

  converted = jax2tf.convert(
    function.fn,
    polymorphic_shapes=[function.polymorphic_shape],
    native_serialization_platforms=tuple(platforms),
    with_gradient=False,
  )
  shape = [d if isinstance(d, int) else None for d in function.shape]
  spec = tf.TensorSpec(shape, tf.as_dtype(function.dtype), name=function.input_name)

  @tf.function(autograph=False, input_signature=[spec])
  def serve(x):
    return {function.output_name: converted(x)}

  return serve


def write(functions: Sequence[Any], path: str | os.PathLike, platforms: Sequence[str]) -> None:
  """`functions` (`vit_jax.export.Function`s) as one SavedModel at `path`, lowered for
  `platforms`."""
  import tensorflow as tf

  module = tf.Module()
  signatures = {}
  for function in functions:
    serve = _signature(function, platforms)
    setattr(module, function.name, serve)  # tracked, so it is saved
    signatures[function.name] = serve
  signatures[SERVING] = signatures[functions[0].name]
  tf.saved_model.save(module, os.fspath(path), signatures=signatures)

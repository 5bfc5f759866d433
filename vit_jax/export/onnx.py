"""The exported functions as ONNX files (`jax2onnx`), for onnxruntime: NAME.onnx per function,
its batch dimension symbolic ('b'; a patch sequence's length 'n' too), inputs and outputs
named as export.json says. Tensors over 1 MB go to NAME.onnx.data beside it, which the .onnx
names.

jax2onnx declares orbax-checkpoint<0.11.37 while the main environment's locks pin 0.12.8 (it
imports no orbax), so it lives in an environment of its own: `make onnx-env` builds it beside the
main venv, VENV-onnx, from the end's requirements/oldest-onnx.txt or newest-onnx.txt
(docs/export.md). It is imported here alone.
"""

import importlib.util
import os
from typing import Any

from vit_jax import logs

# What this environment lacks, and how to get it, in one line.
UNAVAILABLE = (
  'onnx: not written; it needs jax2onnx, which has an environment of its own: `make onnx-env`,'
  ' then .venv-onnx/bin/python -m vit_jax.export (.venv-3.13-onnx after'
  ' `make PYTHON=python3.13 onnx-env`; docs/export.md)'
)
# jax2onnx writes the model's matmuls as ONNX Einsum, which has no bfloat16 type: onnxruntime
# refuses such a file.
NO_BFLOAT16 = (
  "onnx: not written for --dtype=bfloat16: ONNX's Einsum takes no bfloat16 (float32 converts)"
)


def available() -> bool:
  """Whether jax2onnx is installed here."""
  return importlib.util.find_spec('jax2onnx') is not None


def write(function: Any, path: str | os.PathLike) -> None:
  """`function` (a `vit_jax.export.Function`) as the ONNX file `path`."""
  from jax2onnx import to_onnx

  with logs.errors_only('onnx_ir'):  # each intermediate shape left untyped (a NaFlex tower's)
    to_onnx(
      function.fn,
      [function.spec()],
      model_name=function.name,
      return_mode='file',
      output_path=os.fspath(path),
      input_names=[function.input_name],
      output_names=[function.output_name],
    )

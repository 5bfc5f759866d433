"""An exported ONNX file with int8 weights (`onnxruntime.quantization.quantize_dynamic`):
NAME.int8.onnx from the float32 NAME.onnx beside it, for onnxruntime on CPUs.

The weights of the matmuls, the patch embedding's convolution and a text tower's embedding
table become int8, per output channel; activations are quantized to uint8 at run time, per
tensor, from each batch's own range (no calibration). jax2onnx writes every dense layer as ONNX
`Gemm`, which `quantize_dynamic` leaves in float32, so each plain Gemm (no transposes, alpha
and beta 1: all that jax2onnx writes) is rewritten as `MatMul` then `Add` first. Signed int8
weights against unsigned activations is the pairing onnxruntime's x86 kernels are fastest at
(VNNI's `vpdpbusd` multiplies u8 by s8): on an AMD EPYC with avx512_vnni, ViT-B/16 ran 2.7x as
fast as float32 where uint8 weights ran 1.5x (docs/export.md).

onnx and onnxruntime, which this needs, are in ONNX's own environment; it is imported there
alone.
"""

import importlib.util
import os
from typing import Any

from vit_jax import logs

# How the int8 files are made: export.json's `onnx_int8`.
WEIGHT_TYPE = 'QInt8'
PER_CHANNEL = True
SETTINGS = {
  'tool': 'onnxruntime.quantization.quantize_dynamic',
  'from': 'the float32 ONNX file, its Gemm layers rewritten as MatMul + Add',
  'weights': 'int8 (QInt8), symmetric, per output channel',
  'activations': 'uint8, dynamic: per tensor, from each batch at run time',
  'ops': ['MatMul', 'Conv', 'Gather'],
}
UNAVAILABLE = (
  'onnx_int8: not written; it quantizes the ONNX file, which needs jax2onnx (`make onnx-env`,'
  ' docs/export.md)'
)
NO_BFLOAT16 = (
  'onnx_int8: not written for --dtype=bfloat16: it quantizes the float32 ONNX file (export'
  ' with --dtype=float32)'
)


def available() -> bool:
  """Whether onnx and onnxruntime's quantization tools are installed here."""
  return all(importlib.util.find_spec(name) is not None for name in ('onnx', 'onnxruntime'))


def settings() -> dict[str, Any]:
  """How the int8 files are made, with the onnxruntime that made them: export.json's
  `onnx_int8`."""
  import onnxruntime

  return {**SETTINGS, 'onnxruntime': onnxruntime.__version__}


def gemm_as_matmul(model: Any) -> Any:
  """`model` (an onnx ModelProto) with each plain Gemm as MatMul then Add, in place."""
  from onnx import helper

  plain = {'alpha': 1.0, 'beta': 1.0, 'transA': 0, 'transB': 0}
  nodes = []
  for node in model.graph.node:
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if (
      node.op_type != 'Gemm'
      or len(node.input) != 3
      or any(attributes.get(k, v) != v for k, v in plain.items())
    ):
      nodes.append(node)
      continue
    a, b, c = node.input
    product = f'{node.output[0]}_matmul'
    nodes.append(helper.make_node('MatMul', [a, b], [product], name=f'{node.name}_matmul'))
    nodes.append(helper.make_node('Add', [product, c], list(node.output), name=node.name))
  del model.graph.node[:]
  model.graph.node.extend(nodes)
  return model


def write(source: str | os.PathLike, path: str | os.PathLike) -> None:
  """The float32 ONNX file `source` (its .data beside it) quantized as the file `path`."""
  import onnx
  from onnxruntime.quantization import QuantType, quantize_dynamic

  model = gemm_as_matmul(onnx.load(os.fspath(source)))
  # quantize_dynamic warns on the root logger at each call (to pre-process shapes first, which
  # changes nothing it quantizes here).
  with logs.errors_only():
    quantize_dynamic(
      model,
      os.fspath(path),
      weight_type=getattr(QuantType, WEIGHT_TYPE),
      per_channel=PER_CHANNEL,
      op_types_to_quantize=SETTINGS['ops'],
    )

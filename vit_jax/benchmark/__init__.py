"""The benchmark harness of `vit-benchmark` (vit_jax/cli/benchmark.py: its flags and tables).

  variants.py          what is compiled: `Variant` (dtype, attention, remat, layers, precision
                       policy), the model of each, and the weights they share
  analysis.py          what XLA says of a program: FLOPs, memory, memory traffic, cuDNN
  programs.py          the programs under test: compiled inference and the trainer's own step
  timing.py            interleaved rounds of timed steps, peak memory, the matmul probe
  hugging_face.py      `--compare`: Hugging Face's PyTorch ViT on the same weights
  onnx_runtime.py      `--onnx`: the ONNX files vit-export wrote, under onnxruntime
  results.py           the JSON-ready rows, ratios and conditions of a run
  speed.py             `run_benchmark`: all of the above, for every variant
  memory.py            the training step's memory as a line in the batch: `memory_table`,
                       `largest_batch`, `memory_line`, `accum_steps_to_fit`
  input_pipeline.py    `--pipeline`: the input pipeline's speed (imports TensorFlow)
  contrastive_loss.py  `--contrastive_loss`: the sigmoid loss's memory per device
  mesh_table.py        `--mesh_table`: the training step per mesh on N simulated devices, one
                       child process per device count: memory per device, collectives per step
  packing.py           `--packing`: the training step on packed NaFlex rows against one image
                       a row (imports TensorFlow: the pipeline's packing)

The names below are loaded on first use, so that importing the package imports no TensorFlow:
the benchmark runs on accelerator machines that have JAX but no TensorFlow.
"""

import importlib
from typing import Any

# Each public name, and the module that defines it.
_MODULES = {
  'ATTENTION': 'variants',
  'DTYPES': 'variants',
  'LAYERS': 'variants',
  'REMAT': 'variants',
  'Variant': 'variants',
  'init_params': 'variants',
  'model_config': 'variants',
  'save_params': 'variants',
  'variants_from': 'variants',
  'matmul_probe': 'timing',
  'run_benchmark': 'speed',
  'accum_steps_to_fit': 'memory',
  'largest_batch': 'memory',
  'memory_limit_bytes': 'memory',
  'memory_line': 'memory',
  'memory_row': 'memory',
  'memory_table': 'memory',
  'train_memory': 'memory',
  'train_memory_bytes': 'memory',
  'run_pipeline_benchmark': 'input_pipeline',
}

__all__ = sorted(_MODULES)


def __getattr__(name: str) -> Any:
  if name in _MODULES:
    return getattr(importlib.import_module(f'{__name__}.{_MODULES[name]}'), name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')

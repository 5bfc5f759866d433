"""PyPI's torchvision and torch builds beside ours: `allow_torchvision_import`.

PyPI ships torchvision for Linux only as CUDA builds (the CPU ones are on PyTorch's own index),
so an environment pinned to the CPU torch from PyPI gets a torchvision whose C++ part does not
load; and the CUDA torch (what Python 3.12 and 3.13 get) brings triton, whose library crashes
the process when loaded after TensorFlow. Nothing here imports torch until it is called.
"""

import importlib
import importlib.util
import sys


def allow_torchvision_import() -> None:
  """Lets `import torchvision` succeed beside the CPU build of torch; a no-op where it works.

  transformers' model modules import torchvision whenever it is installed
  (`transformers.image_utils`; no setting turns that off), and timm always does. PyPI's Linux
  torchvision wheels are CUDA builds: beside the CPU torch their C++ extension does not load,
  and `import torchvision` fails registering fake kernels for two of its ops ('operator
  torchvision::nms does not exist'). Declaring those two op schemas first lets its Python part
  import; only a call of a torchvision C++ op (detection boxes, used by no ViT) would fail.
  The benchmark's `--compare` (the one place of the package that imports transformers), the
  tests' Hugging Face and timm oracles (tests/conftest.py) and the walkthrough notebook call it.

  Where TensorFlow is already loaded, it also keeps torch from importing triton: torchvision's
  import reaches `torch._dynamo`, which imports triton when installed, and loading triton's
  library after TensorFlow's kills the process (a segmentation fault; torch 2.13.0+cu130,
  triton 3.7.1, tensorflow-cpu 2.21 on Python 3.13). torch uses triton only to compile GPU
  kernels (`torch.compile`), which none of these callers does; loaded before TensorFlow (as
  tests/conftest.py does), triton works and is left alone.
  """
  triton_after_tensorflow = 'tensorflow' in sys.modules and 'triton' not in sys.modules
  if triton_after_tensorflow and importlib.util.find_spec('triton') is not None:
    sys.modules['triton'] = None  # `import triton` raises ImportError: torch goes without
  if importlib.util.find_spec('torchvision') is None:
    return
  import torch

  try:
    importlib.import_module('torchvision')
  except RuntimeError as e:
    if 'torchvision::nms' not in str(e):
      raise
    for op in ('nms', 'qnms'):
      torch.library.define(
        f'torchvision::{op}', '(Tensor dets, Tensor scores, float iou_threshold) -> Tensor'
      )
    importlib.import_module('torchvision')

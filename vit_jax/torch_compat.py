"""PyPI's torchvision beside the CPU build of torch: `allow_torchvision_import`.

PyPI ships torchvision for Linux only as CUDA builds (the CPU ones are on PyTorch's own index),
so an environment pinned to the CPU torch from PyPI gets a torchvision whose C++ part does not
load. Nothing here imports torch until it is called.
"""

import importlib
import importlib.util


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
  """
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

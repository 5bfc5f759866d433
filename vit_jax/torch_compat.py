"""Importing torchvision, which transformers and timm import, beside the CPU build of torch."""

import importlib
import importlib.util


def allow_torchvision_import() -> None:
  """Lets `import torchvision` succeed where its C++ ops cannot load; a no-op elsewhere.

  PyPI's Linux torchvision wheels are built against the CUDA build of torch. Beside the CPU
  build their C++ extension does not load, and `import torchvision` then fails registering
  fake kernels for two of its ops ('operator torchvision::nms does not exist'): transformers,
  which imports torchvision whenever it is installed, and timm, which always does, fail with
  it. Declaring those two op schemas first lets torchvision's Python part import; only a call
  of a torchvision C++ op (detection boxes, not used by any ViT) would still fail.
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

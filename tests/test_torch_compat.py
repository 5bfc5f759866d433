"""`vit_jax.torch_compat`: PyPI's torch builds beside TensorFlow, as the walkthrough meets them
(TensorFlow loaded by training, then torchvision, timm and transformers for the export)."""

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# A fresh process: this one imported torchvision (tests/conftest.py) before TensorFlow.
_AFTER_TENSORFLOW = textwrap.dedent(
  """
  import tensorflow as tf
  from vit_jax.torch_compat import allow_torchvision_import

  allow_torchvision_import()
  import timm
  import torch
  import transformers
  from torch.utils._triton import has_triton_package

  model = timm.create_model('vit_tiny_patch16_224', num_classes=3, img_size=32).eval()
  with torch.no_grad():
    print(tuple(model(torch.zeros(2, 3, 32, 32)).shape), transformers.ViTModel.__name__)
  print('triton used', has_triton_package())
  """
)


def test_torch_timm_and_transformers_run_after_tensorflow():
  """The CUDA torch of Python 3.12+ brings triton, whose library segfaults loaded after
  TensorFlow's: `allow_torchvision_import` keeps torch from importing it there (where no
  triton is installed, as beside the CPU torch of Python 3.11, the imports alone are tried)."""
  run = subprocess.run(
    [sys.executable, '-c', _AFTER_TENSORFLOW], cwd=REPO, capture_output=True, text=True,
    timeout=300,
  )  # fmt: skip
  assert run.returncode == 0, f'exit {run.returncode}: {run.stderr[-2000:]}'
  lines = run.stdout.splitlines()
  assert lines[0] == '(2, 3) ViTModel'
  assert lines[1] == 'triton used False'

"""`--compare`: Hugging Face `ViTForImageClassification` (PyTorch eager) on the same weights,
through the exporter, as programs timed beside ours, and its logits against ours."""

import os
import tempfile
from typing import Any

import numpy as np

from vit_jax import families, torch_compat
from vit_jax.benchmark.programs import Job, Timed
from vit_jax.benchmark.variants import Variant

HF = 'hf-pytorch'  # its programs' framework


def check_comparable(name: str, config: Any) -> None:
  what = families.of_config(config).unlike_hugging_face(config)
  if what is None:
    return
  raise ValueError(
    f'--compare needs a plain ViT with the token classifier and no pre_logits (Hugging Face'
    f' ViTForImageClassification); {name} {what}'
  )


def _hugging_face(params: Any, config: Any, resolution: int, tmp: str):
  """Hugging Face ViTForImageClassification on our weights, via the exporter."""
  # Idle OpenMP threads of PyTorch spin by default; on a machine shared with other work
  # that spinning takes the cores from the threads with work (measured: 50x slower).
  os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')
  from vit_jax.checkpoint import export_hf

  torch_compat.allow_torchvision_import()
  import torch
  import transformers

  path = export_hf(params, config, os.path.join(tmp, 'hf'), image_size=resolution)
  return torch, transformers.ViTForImageClassification.from_pretrained(path).eval()


def _hf_programs(hf, torch, variants, images, labels, train: bool, inference: bool) -> list:
  """One inference and one training program per distinct dtype."""
  x = torch.from_numpy(np.asarray(images).transpose(0, 3, 1, 2).copy())
  y = torch.from_numpy(np.asarray(labels).astype(np.int64))
  programs = []
  for dtype in dict.fromkeys(v.dtype for v in variants):
    autocast = dtype != 'float32'
    ctx = lambda a=autocast, d=dtype: torch.autocast('cpu', dtype=getattr(torch, d), enabled=a)
    label = f'HF PyTorch {dtype}'

    def infer(ctx=ctx):
      hf.eval()
      with torch.inference_mode(), ctx():
        return hf(pixel_values=x).logits.float().numpy()

    if inference:
      programs.append(Timed(label, Variant(dtype), 'inference', infer, framework=HF))
    if train:
      opt = torch.optim.SGD(hf.parameters(), lr=1e-4, momentum=0.9)

      def step(ctx=ctx, opt=opt):
        hf.train()  # dropout as configured, like our training step
        opt.zero_grad(set_to_none=True)
        with ctx():
          loss = torch.nn.functional.cross_entropy(hf(pixel_values=x).logits.float(), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)  # as our step clips
        opt.step()
        return loss.detach().numpy()

      programs.append(Timed(label, Variant(dtype), 'train', step, framework=HF))
  return programs


def compare(job: Job, params: Any, resolution: int, programs: list[Timed]):
  """Hugging Face's programs on the same weights (timed beside ours), and its logits."""
  with tempfile.TemporaryDirectory(prefix='vit_benchmark_') as tmp:  # Hugging Face's files
    torch, hf = _hugging_face(params, job.config, resolution, tmp)
  hf_programs = _hf_programs(
    hf, torch, job.variants, job.images, job.labels, job.train, job.inference
  )
  with torch.inference_mode():
    x = torch.from_numpy(np.asarray(job.images).transpose(0, 3, 1, 2).copy())
    hf_logits = hf(pixel_values=x).logits.numpy()
  for p in hf_programs:  # the same model: our count of its FLOPs
    ours = next(q for q in programs if q.mode == p.mode)
    p.model_flops_per_image = ours.model_flops_per_image
  return hf_programs, hf_logits


def hf_logit_error(ours: np.ndarray | None, hf_logits) -> float | None:
  """Our float32 logits against Hugging Face's on the benchmark batch."""
  if hf_logits is None or ours is None:
    return None
  return float(np.abs(ours - hf_logits).max())

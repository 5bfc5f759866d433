"""Checkpoints: read every released ViT format into our tree, fit it to a model, write it out.

  params = load(path)                        # our names, numpy arrays, format detected
  params = load_pretrained(path, init_params, model_config)   # fine-tuning surgery
  save_npz(params, 'out.npz')                # the released Google layout
  export_hf(params, model_config, 'out_dir') # model.safetensors + config.json for transformers
  export_timm(params, model_config, 'out_dir')  # model.safetensors + config.json for timm

Formats are detected by `FORMATS`, a list of (name, detect, read) tried in order; another
format plugs in with `register_format`.
"""

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vit_jax.checkpoint import catalog, hf, npz, orbax, surgery, timm, tree
from vit_jax.checkpoint.hf import export_hf, from_hf_state_dict, to_hf_state_dict
from vit_jax.checkpoint.npz import save_npz
from vit_jax.checkpoint.surgery import (
  LoadReport,
  load_pretrained,
  merge_pretrained,
  resample_patch_embedding,
  resize_posemb,
)
from vit_jax.checkpoint.timm import export_timm, from_timm_state_dict, to_timm_state_dict
from vit_jax.checkpoint.tree import CheckpointError, flatten, infer_config, unflatten

__all__ = [
  'FORMATS',
  'CheckpointError',
  'Format',
  'LoadReport',
  'catalog',
  'detect_format',
  'export_hf',
  'export_timm',
  'flatten',
  'from_hf_state_dict',
  'from_timm_state_dict',
  'hf',
  'infer_config',
  'load',
  'load_pretrained',
  'merge_pretrained',
  'npz',
  'orbax',
  'read',
  'register_format',
  'resample_patch_embedding',
  'resize_posemb',
  'save_npz',
  'surgery',
  'timm',
  'to_hf_state_dict',
  'to_timm_state_dict',
  'tree',
  'unflatten',
]


@dataclasses.dataclass(frozen=True)
class Format:
  """A checkpoint format: `detect(path) -> bool`, `read(path, **kw) -> (tree, description)`.

  `read` takes keyword options it may ignore (`num_heads`, which Hugging Face files need
  when they have no config.json) and returns our tree of numpy arrays.
  """

  name: str
  detect: Callable[[Path], bool]
  read: Callable[..., tuple[dict, str]]


FORMATS: list[Format] = [
  Format('timm', timm.detect, timm.read),  # before hf: both are .safetensors/.bin folders
  Format('hf', hf.detect, hf.read),
  Format('npz', npz.detect, npz.read),
  Format('orbax', orbax.detect, orbax.read),
]


def register_format(fmt: Format, first: bool = True) -> None:
  """Adds a format, tried before the built-in ones unless `first=False`."""
  FORMATS.insert(0, fmt) if first else FORMATS.append(fmt)


def detect_format(path: str | Path) -> Format:
  """The first format of `FORMATS` that recognises `path`."""
  path = Path(path)
  if not path.exists():
    raise CheckpointError(f'{path}: no such file or directory')
  for fmt in FORMATS:
    if fmt.detect(path):
      return fmt
  raise CheckpointError(
    f'{path}: unknown checkpoint layout; expected a Google .npz (original, AugReg, big_vision),'
    ' a .safetensors/.bin file, or a Hugging Face or timm directory (config.json +'
    ' model.safetensors)'
  )


def read(path: str | Path, **kwargs: Any) -> tuple[dict, str]:
  """(our tree, a one-line description of the format) of the checkpoint at `path`."""
  return detect_format(path).read(Path(path), **kwargs)


def load(path: str | Path, **kwargs: Any) -> dict:
  """The checkpoint at `path` as a nested dict of numpy arrays in our names.

  Formats: Google .npz (original and AugReg with pre-Linen names and (1,1,1,C) GroupNorm;
  big_vision with a `params/` prefix, scan-stacked blocks and a top-level `pos_embedding`),
  Hugging Face directories and .safetensors files (4.x and 5.x key names; `num_heads=` is
  needed when there is no config.json), timm VisionTransformer and DeiT state dicts (fused
  qkv; `num_heads=` is needed without timm's config.json), PyTorch .bin/.pth via
  `torch.load(weights_only=True)`, and
  orbax training checkpoints (a run, `checkpoints/`, step or item directory; params only).
  """
  return read(path, **kwargs)[0]

"""Which format a checkpoint file is, and reading it into our tree.

Formats are detected by `FORMATS`, a list of (name, detect, read, fields) tried in order.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

from etils.epath import Path

from vit_jax import files
from vit_jax.checkpoint import hf, npz, orbax, timm, two_towers
from vit_jax.checkpoint.tree import CheckpointError


def _no_fields(path: Path) -> dict[str, Any]:
  del path
  return {}


@dataclasses.dataclass(frozen=True)
class Format:
  """A checkpoint format: `detect(path) -> bool`, `read(path, **kw) -> (tree, description)`,
  `fields(path) -> {model field: value}`.

  `read` takes keyword options it may ignore (`num_heads`, which Hugging Face and timm files
  need when they have no config.json) and returns our tree of numpy arrays. `fields` gives
  the model fields the file states that its shapes cannot tell (the GELU its config names:
  `gelu_approximate=False` for the exact one), only those that differ from the defaults.
  """

  name: str
  detect: Callable[[Path], bool]
  read: Callable[..., tuple[dict, str]]
  fields: Callable[[Path], dict[str, Any]] = _no_fields


FORMATS: list[Format] = [
  # Before hf: both are .safetensors/.bin files or folders of them with a config.json.
  Format('timm', timm.detect, timm.read, timm.model_fields),
  Format('hf', hf.detect, hf.read, hf.model_fields),
  # Google .npz files: one ViT or Mixer, or an image-text model's towers (LiT, big_vision).
  Format('npz', npz.detect, two_towers.read),
  Format('orbax', orbax.detect, orbax.read),
]


def detect_format(path: str | Path) -> Format:
  """The first format of `FORMATS` that recognises `path`."""
  path = files.path(path)
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
  """(our tree, a one-line description of the format) of the checkpoint at `path`;
  `PATH:img` reads the image tower of an image-text .npz alone."""
  path, tower = two_towers.split_tower(path)
  fmt = detect_format(path)
  if tower is not None:
    if fmt.name != 'npz':
      raise CheckpointError(f'{path}:{tower}: only image-text .npz files have towers')
    kwargs['tower'] = tower
  return fmt.read(files.path(path), **kwargs)


def load(path: str | Path, **kwargs: Any) -> dict:
  """The checkpoint at `path` as a nested dict of numpy arrays in our names.

  Formats: Google .npz (original and AugReg with pre-Linen names and (1,1,1,C) GroupNorm;
  big_vision with a `params/` prefix, scan-stacked blocks and a top-level `pos_embedding`;
  image-text models, LiT's and big_vision's, as `{'img', 'txt', 't'[, 'b']}`, or with
  `PATH:img` the image tower alone),
  Hugging Face directories and .safetensors files (4.x and 5.x key names; `num_heads=` is
  needed when there is no config.json), timm VisionTransformer and DeiT state dicts (fused
  qkv; `num_heads=` is needed without timm's config.json), PyTorch .bin/.pth via
  `torch.load(weights_only=True)`, and orbax training checkpoints (a run, `checkpoints/`,
  step or item directory; params only).
  """
  return read(path, **kwargs)[0]

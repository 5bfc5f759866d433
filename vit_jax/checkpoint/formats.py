"""Which format a checkpoint file is, reading it into our tree, and exporting our tree to it.

`FORMATS` is the table of formats, tried in order to detect a file: each one module that reads
(detect, read, fields) and, for a format of PyTorch model directories, writes (to_state_dict,
config), on the skeleton of `pytorch`. A new format is its module and one entry here.
"""

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from etils.epath import Path

from vit_jax import families, files
from vit_jax.checkpoint import hf, hf_siglip, npz, orbax, pytorch, timm, two_towers
from vit_jax.checkpoint.tree import CheckpointError


def _no_fields(path: Path) -> dict[str, Any]:
  del path
  return {}


def _computed_as_stated(path: Path) -> list[str]:
  del path
  return []


def _shapes_carry_heads(path: Path) -> bool:
  del path
  return True


@dataclasses.dataclass(frozen=True)
class Format:
  """A checkpoint format: `detect(path) -> bool`, `read(path, **kw) -> (tree, description)`,
  `fields(path) -> {model field: value}`; to export to it, `to_state_dict(params,
  model_config) -> {name: array}` and `config(pytorch.Export) -> config.json`.

  `read` takes keyword options it may ignore (`num_heads`, which Hugging Face and timm files
  need when they have no config.json) and returns our tree of numpy arrays. `fields` gives
  the model fields the file states that its shapes cannot tell (the GELU its config names:
  `gelu_approximate=False` for the exact one; its LayerNorm epsilon: `layer_norm_epsilon`),
  only those that differ from the defaults.
  `unlike` gives, one line each, every setting the file states that the project computes
  otherwise (what `fields` cannot carry onto the model). `states_heads` says whether the
  file tells the attention heads (its shapes, its config.json); where it does not, `read`
  takes `num_heads` as given, a guess. `to_state_dict` refuses, in one line, a model the
  format cannot hold.
  """

  name: str
  detect: Callable[[Path], bool]
  read: Callable[..., tuple[dict, str]]
  fields: Callable[[Path], dict[str, Any]] = _no_fields
  unlike: Callable[[Path], list[str]] = _computed_as_stated
  states_heads: Callable[[Path], bool] = _shapes_carry_heads
  to_state_dict: Callable[[Mapping[str, Any], Any], dict[str, np.ndarray]] | None = None
  config: Callable[[pytorch.Export], dict[str, Any]] | None = None


FORMATS: list[Format] = [
  # transformers' SiglipModel (SigLIP, SigLIP 2) and Siglip2Model (NaFlex): an image-text tree;
  # its config.json says so.
  # It writes through `export_hf` (a directory with its processor's files).
  Format(
    'hf_siglip',
    hf_siglip.detect,
    hf_siglip.read,
    fields=hf_siglip.model_fields,
    unlike=hf_siglip.unlike,
    states_heads=hf_siglip.states_heads,
  ),
  # Before hf: both are .safetensors/.bin files or folders of them with a config.json.
  Format(
    'timm',
    timm.detect,
    timm.read,
    fields=timm.model_fields,
    unlike=timm.unlike,
    states_heads=timm.states_heads,
    to_state_dict=timm.to_timm_state_dict,
    config=timm.timm_config,
  ),
  Format(
    'hf',
    hf.detect,
    hf.read,
    fields=hf.model_fields,
    unlike=hf.unlike,
    states_heads=hf.states_heads,
    to_state_dict=hf.to_hf_state_dict,
    config=hf.hf_config,
  ),
  # Google .npz files: one ViT or Mixer, or an image-text model's towers (LiT, big_vision).
  Format('npz', npz.detect, two_towers.read, fields=npz.stated_fields),
  Format('orbax', orbax.detect, orbax.read, fields=orbax.fields),
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


def export(
  params: Mapping[str, Any],
  model_config: Any,
  out_dir: str | os.PathLike,
  *,
  to: str,
  image_size: pytorch.ImageSize | None = None,
  labels: list[str] | None = None,
) -> Path:
  """Writes our tree as format `to`: `model.safetensors` + `config.json`, nothing partial.

  `model_config` gives what the shapes cannot tell (the classifier, the GELU; None: the
  defaults); `image_size` defaults to the square the position embeddings are laid out for;
  `labels` names the head's classes.
  """
  fmt = next((f for f in FORMATS if f.name == to and f.to_state_dict and f.config), None)
  if fmt is None:
    writable = [f.name for f in FORMATS if f.to_state_dict and f.config]
    raise CheckpointError(
      f'{to!r}: not a format to export a model directory to; choose {" or ".join(writable)}'
    )
  state = fmt.to_state_dict(params, model_config)
  config = fmt.config(pytorch.Export.of(params, model_config, image_size, labels))
  return pytorch.write_model_dir(out_dir, state, config)


def export_hf(
  params: Mapping[str, Any], model_config: Any, out_dir: str | os.PathLike, **kw: Any
) -> Path:
  """`export(..., to='hf')`: a directory that transformers' `from_pretrained` loads with our
  logits (`ViTForImageClassification` with a head, else `ViTModel`); a SigLIP model's:
  `hf_siglip.export` (`SiglipModel`, a NaFlex one's `Siglip2Model`, its processor's files;
  `vocab=` the sentencepiece file for its tokenizer's)."""
  family = families.of_tree(params)
  if family is not None and family.image_text:
    kw.pop('labels', None)  # an image-text model has no classes
    return hf_siglip.export(params, model_config, out_dir, **kw)
  return export(params, model_config, out_dir, to='hf', **kw)


def export_timm(
  params: Mapping[str, Any], model_config: Any, out_dir: str | os.PathLike, **kw: Any
) -> Path:
  """`export(..., to='timm')`: a directory that timm loads with our logits:

    model = timm.create_model('local-dir:OUT_DIR', pretrained=True)
    # or: timm.create_model(config['architecture'], **config['model_args']) and
    #     model.load_state_dict(safetensors.torch.load_file('OUT_DIR/model.safetensors'))

  `model_config` gives the classifier (default: 'token' with a class token, else 'gap').
  """
  return export(params, model_config, out_dir, to='timm', **kw)

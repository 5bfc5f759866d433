"""How an image becomes a model's image input: one declared spec per model, given by its family.

  spec = families.of_config(config).preprocessing(config, resolution)   # the family decides
  x = data.images.host_input(spec, pixels)        # one image, on the host (numpy out)
  x = data.preprocess.input_op(spec, image)       # the same, as tf.data ops (the pipeline)

A spec is data: a square (or rectangular) resize, or a NaFlex patch sequence; the resize
method; the uint8 rounding of the original LiT code; the value range as one offset/scale
pair; a central crop. vit_jax/data/preprocess.py computes it in tf.data, vit_jax/data/images.py
on the host (the same numbers), and export.json states it (`to_json`, with the prose of
`describe`). Nothing else decides how a model's images are prepared.
"""

import dataclasses
from typing import Any

RESIZE, PATCHES = 'resize', 'patches'


@dataclasses.dataclass(frozen=True)
class Preprocessing:
  """How decoded uint8 RGB pixels (H, W, 3) become one image input of a model.

  Attributes:
    size: (height, width) of a resized image (kind 'resize'); None for patch sequences.
    patch_size, max_patches: a NaFlex tower's patches (kind 'patches'): the image at its own
      aspect ratio as at most `max_patches` patches of `patch_size` pixels, packed one slot a
      patch (`vit_jax.data.naflex.pack`).
    method, antialias: `tf.image.resize`'s.
    round_to_uint8: the resized image cast to uint8 (truncating) before the value range, as
      the original LiT code feeds its models.
    offset, scale: the value range, `(x - offset) / scale` of pixels x in [0, 255].
    crop: the central fraction of each side kept before the resize (1.0: the whole image).
  """

  size: tuple[int, int] | None = None
  patch_size: int = 0
  max_patches: int = 0
  method: str = 'bilinear'
  antialias: bool = False
  round_to_uint8: bool = False
  offset: float = 127.5
  scale: float = 127.5
  crop: float = 1.0

  def __post_init__(self):
    if (self.size is None) == (not self.patch_size):
      raise ValueError(f'a preprocessing spec has a size or patches, not both: {self}')
    if self.patch_size and self.max_patches < 1:
      raise ValueError(f'a patch sequence needs max_patches >= 1: {self}')
    if self.size is not None:
      object.__setattr__(self, 'size', tuple(int(s) for s in self.size))
    if not 0 < self.crop <= 1:
      raise ValueError(f'crop={self.crop}: the central fraction kept is in (0, 1]')

  @property
  def kind(self) -> str:
    return PATCHES if self.patch_size else RESIZE

  def input_shape(self) -> tuple[int, ...]:
    """The shape of one image's input: (H, W, 3), or (max_patches, p * p * 3 + 3)."""
    if self.kind == PATCHES:
      return (self.max_patches, self.patch_size**2 * 3 + 3)
    return (*self.size, 3)

  def symbolic_shape(self) -> tuple[str | int, ...]:
    """One image's input with a free sequence length 'n' for patch sequences (what an
    exported function takes: `jax.export` shapes)."""
    if self.kind == PATCHES:
      return ('n', self.input_shape()[1])
    return self.input_shape()

  def describe(self) -> str:
    """The spec in words (export.json's `text`, the commands' summaries)."""
    resize = f'{self.method}{", antialiased" if self.antialias else ", no antialiasing"}'
    crop = f'keep the central {self.crop:g} of each side; ' if self.crop < 1 else ''
    values = f'values (x - {self.offset:g}) / {self.scale:g}'
    if self.kind == PATCHES:
      p = self.patch_size
      return (
        f'decode to RGB; {crop}resize at its own aspect ratio to the largest size of at most'
        f' {self.max_patches} patches of {p} x {p} pixels ({resize}); {values}; cut into'
        f' {p} x {p} patches in row-major order, each flattened (row, column, channel); each'
        f" of n slots holds a patch's {p * p * 3} values, then ptype (1 a patch, 0 padding),"
        " yidx, xidx (the patch's row and column in its image's grid); unused slots all zeros"
      )
    height, width = self.size
    rounding = 'cast to uint8 (truncating); ' if self.round_to_uint8 else ''
    return (
      f'decode to RGB; {crop}resize to {height} x {width} ({resize}, half-pixel centres,'
      f' aspect ratio not kept); {rounding}{values}; NHWC'
    )

  def to_json(self) -> dict[str, Any]:
    """The spec as export.json's `preprocessing` (`from_json` reads it back)."""
    fields = dataclasses.asdict(self)
    fields['size'] = None if self.size is None else list(self.size)
    return {'kind': self.kind, 'text': self.describe(), **fields}

  @classmethod
  def from_json(cls, entry: dict[str, Any]) -> 'Preprocessing':
    """The spec of `to_json` (or of an export.json written before the spec: its kind
    'naflex_patch_sequence' was antialiased, its value range (x - 127.5) / 127.5)."""
    names = {f.name for f in dataclasses.fields(cls)}
    fields = {k: v for k, v in entry.items() if k in names}
    if entry.get('kind') == 'naflex_patch_sequence':
      fields['antialias'] = True
    return cls(**fields)


def square(resolution: int | tuple[int, int], **options: Any) -> Preprocessing:
  """A resize to `resolution` (an int: a square), the other fields `options`."""
  size = (resolution, resolution) if isinstance(resolution, int) else tuple(resolution)
  return Preprocessing(size=size, **options)


def patches(patch_size: int, max_patches: int, **options: Any) -> Preprocessing:
  """A NaFlex patch sequence: antialiased bilinear resize, as big_vision's NaFlex ops."""
  return Preprocessing(patch_size=patch_size, max_patches=max_patches, antialias=True, **options)

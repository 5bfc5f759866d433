"""Image files to a model's inputs on the host, without TensorFlow where its result is known.

The input pipeline decodes and resizes with TensorFlow (vit_jax/data/preprocess.py, THE
implementation); here the common cases compute the same numbers without importing it, which
saves a command seconds of start-up and lets threads decode in parallel (neither decoder holds
the GIL):
  - JPEG: simplejpeg (libjpeg-turbo) with TensorFlow's settings: the fast integer DCT and
    fancy (smooth) chroma upsampling; pixel for pixel `tf.io.decode_jpeg`'s.
  - PNG of at most 8 bits a channel: Pillow, lossless, as TensorFlow (alpha dropped, grey
    repeated).
  - A square resize, bilinear without antialiasing (every classifier's and LiT's): numpy with
    `tf.image.resize`'s arithmetic (half-pixel centres, float32, the same order of operations).
Anything else (GIF, BMP, 16-bit PNG, a patch sequence, an antialiased resize, a file either
decoder refuses) goes to TensorFlow as before; a file TensorFlow cannot read goes to Pillow,
which reads more formats and names what is wrong. tests/test_images.py pins the equality.
"""

import io
import os
from typing import Any

import numpy as np
from PIL import Image

from vit_jax import files
from vit_jax.families import preprocessing
from vit_jax.families.preprocessing import Preprocessing

_JPEG = b'\xff\xd8\xff'
_PNG = b'\x89PNG\r\n\x1a\n'
# The first bytes of the formats TensorFlow's `decode_image` reads (JPEG, PNG, GIF, BMP).
TF_SIGNATURES = (_JPEG, _PNG, b'GIF87a', b'GIF89a', b'BM')
# A PNG's bit depth: the IHDR chunk's ninth byte, after the signature, length and type.
_PNG_BIT_DEPTH = 24


class ImageError(ValueError):
  """An image file that cannot be read or decoded."""


def read_image(path: str | os.PathLike) -> np.ndarray:
  """Decodes an image file to uint8 RGB (H, W, 3); raises ImageError with a one-line reason
  (`decode_image`)."""
  try:
    raw = files.path(path).read_bytes()
  except OSError as e:
    raise ImageError(f'{path}: cannot read image ({e.strerror or e})') from None
  return decode_image(raw, path)


def decode_image(raw: bytes, name: str | os.PathLike) -> np.ndarray:
  """Encoded image bytes to uint8 RGB (H, W, 3), as the input pipeline decodes them; raises
  ImageError naming `name`."""
  image = _decode_known(raw)
  if image is None and _tensorflow_installed():
    image = decode_tensorflow(raw)
  return image if image is not None else _decode_pillow(raw, name)


def _decode_known(raw: bytes) -> np.ndarray | None:
  """A JPEG or 8-bit PNG decoded as TensorFlow decodes it, or None (another format, or one
  its decoder refuses: TensorFlow then has the last word)."""
  if raw.startswith(_JPEG):
    import simplejpeg

    try:
      return simplejpeg.decode_jpeg(raw, colorspace='RGB', fastdct=True, fastupsample=False)
    except ValueError:
      return None
  if raw.startswith(_PNG) and len(raw) > _PNG_BIT_DEPTH and raw[_PNG_BIT_DEPTH] <= 8:
    try:
      return _pillow_rgb(io.BytesIO(raw))
    except _PILLOW_ERRORS:
      return None
  return None


def decode_tensorflow(raw: bytes) -> np.ndarray | None:
  """Encoded image bytes decoded by the input pipeline (`preprocess.decode`, eagerly), or
  None when TensorFlow cannot decode them. Bytes of no format it reads are not given to it:
  its failed op logs two lines to stderr, past TF_CPP_MIN_LOG_LEVEL."""
  if not raw.startswith(TF_SIGNATURES):
    return None
  from vit_jax.data import preprocess

  try:
    return preprocess.decode(preprocess.tf.constant(raw)).numpy()
  except preprocess.tf.errors.OpError:
    return None


def _tensorflow_installed() -> bool:
  import importlib.util

  return importlib.util.find_spec('tensorflow') is not None


# What Pillow raises for bytes it cannot decode.
_PILLOW_ERRORS = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)


def _pillow_rgb(buffer: io.BytesIO) -> np.ndarray:
  with Image.open(buffer) as im:
    return np.asarray(im.convert('RGB'), dtype=np.uint8)


def _decode_pillow(raw: bytes, name: str | os.PathLike) -> np.ndarray:
  buffer = io.BytesIO(raw)
  try:
    return _pillow_rgb(buffer)
  except _PILLOW_ERRORS as e:
    message = str(e).replace(repr(buffer), repr(str(name)))  # Pillow names the file it read
    reason = ' '.join(message.split()) or type(e).__name__
    raise ImageError(f'{name}: cannot read image ({reason})') from None


def _weights(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(lower, upper, lerp) source indices and weights of each output row or column, as
  TensorFlow's bilinear kernel computes them: source (i + 0.5) * scale - 0.5, float32."""
  scale = np.float32(in_size) / np.float32(out_size)
  x = (np.arange(out_size, dtype=np.float32) + np.float32(0.5)) * scale - np.float32(0.5)
  floor = np.floor(x)
  lower = np.maximum(floor.astype(np.int64), 0)
  upper = np.minimum(np.ceil(x).astype(np.int64), in_size - 1)
  return lower, upper, (x - floor).astype(np.float32)


def resize_bilinear(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
  """`tf.image.resize(image, size)` (bilinear, half-pixel centres, no antialiasing) of
  (H, W, C) pixels, float32, without TensorFlow."""
  top, bottom, y = _weights(image.shape[0], size[0])
  left, right, x = _weights(image.shape[1], size[1])
  x = x[None, :, None]

  def across(rows: np.ndarray) -> np.ndarray:
    rows = rows.astype(np.float32)
    return rows[:, left] + (rows[:, right] - rows[:, left]) * x

  upper, lower = across(image[top]), across(image[bottom])
  return upper + (lower - upper) * y[:, None, None]


def _central_crop(image: np.ndarray, fraction: float) -> np.ndarray:
  """`preprocess._central_crop`: the central `fraction` of each side (float32 product, ties
  to even, at least one pixel)."""
  sides = np.asarray(image.shape[:2], np.float32)
  keep = np.maximum(np.round(sides * np.float32(fraction)).astype(np.int64), 1)
  begin = (np.asarray(image.shape[:2]) - keep) // 2
  return image[begin[0] : begin[0] + keep[0], begin[1] : begin[1] + keep[1]]


def computed_here(spec: Preprocessing) -> bool:
  """Whether `host_input` computes `spec` without TensorFlow: a bilinear resize without
  antialiasing."""
  return spec.kind == preprocessing.RESIZE and spec.method == 'bilinear' and not spec.antialias


def host_input(spec: Preprocessing, image: Any) -> np.ndarray:
  """`preprocess.input_op` of one decoded uint8 image (H, W, 3), computed eagerly: a numpy
  array; without TensorFlow where `computed_here`."""
  image = np.asarray(image)
  if image.ndim != 3 or image.shape[-1] != 3:
    raise ValueError(f'expected an RGB image of shape (H, W, 3), got {image.shape}')
  if not computed_here(spec):
    from vit_jax.data import preprocess

    return preprocess.input_op(spec, preprocess.tf.constant(image)).numpy()
  if spec.crop < 1:
    image = _central_crop(image, spec.crop)
  resized = resize_bilinear(image, spec.size)
  if spec.round_to_uint8:  # the original LiT code's: the resized image cast to uint8
    resized = resized.astype(np.uint8).astype(np.float32)
  return (resized - np.float32(spec.offset)) / np.float32(spec.scale)

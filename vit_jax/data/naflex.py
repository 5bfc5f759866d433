"""NaFlex preprocessing (SigLIP 2's native-aspect inputs): an image as a sequence of patches.

big_vision's `resize_to_sequence(patch, max_len)|patchify(patch)|pad_to_shape(...)`
(`pp/proj/image_text/ops_naflex.py`), written here:

  sequence_size(h, w, patch, max_len)   the size an (h, w) image is resized to
  resize_to_sequence(image, patch, max_len)
  patchify(image, patch, max_len)       {'patches', 'ptype', 'yidx', 'xidx'}, padded to max_len
  pack(patchified)                      the four as one float32 array (max_len, p * p * 3 + 3)
  packed_sequence(image, patch, max_len, offset, scale)   all of them, the values scaled

The size keeps the aspect ratio up to rounding each side up to whole patches (at least one),
as large as fits `max_len` patches: big_vision finds the scale by a binary search on float32
ratios (from 1e-6 to 100, until the bounds are 1e-5 apart), and so does `sequence_size`, so
the sizes are the same to the pixel: (63, 241) with patches of 16 and at most 16 of them
gives (32, 128), not the 4 x 4 of a square. The resize is TensorFlow's antialiased bilinear.
A patch is flattened in (row, column, channel) order; `ptype` is 1 for an image patch and 0
for padding, `yidx` and `xidx` its row and column in the image's patch grid (0 for padding).
"""

import numpy as np
import tensorflow as tf

_LOW, _HIGH, _EPS = np.float32(1e-6), np.float32(100.0), np.float32(1e-5)


def sequence_size(height: int, width: int, patch: int, max_len: int) -> tuple[int, int]:
  """(height, width) to resize an image to: sides multiples of `patch`, at most `max_len`
  patches, the aspect ratio kept up to that rounding (big_vision's binary search, in float32)."""
  hw = np.array([height, width], np.float32)

  def size(ratio: np.float32) -> np.ndarray:
    sides = np.float32(patch) * np.ceil(hw * ratio / np.float32(patch))
    return np.maximum(sides, np.float32(patch)).astype(np.int32)

  low, high = _LOW, _HIGH
  while high - low >= _EPS:
    mid = (low + high) / np.float32(2)
    rows, cols = size(mid) // patch
    low, high = (mid, high) if rows * cols <= max_len else (low, mid)
  if not _EPS < low < _HIGH:
    raise ValueError(f'no size of ({height}, {width}) fits {max_len} patches of {patch}')
  h, w = size(low)
  return int(h), int(w)


def resize_to_sequence(image: tf.Tensor, patch: int, max_len: int | tf.Tensor) -> tf.Tensor:
  """`image` (H, W, C) resized (antialiased bilinear, float32) to `sequence_size`; `max_len`
  may be a tensor (an image's own budget: resolution sampling)."""

  def target(shape: np.ndarray, max_len: np.ndarray) -> np.ndarray:
    size = sequence_size(int(shape[0]), int(shape[1]), patch, int(max_len))
    return np.array(size, np.int32)

  args = [tf.shape(image)[:2], tf.cast(max_len, tf.int32)]
  size = tf.numpy_function(target, args, tf.int32, stateful=False)
  size.set_shape([2])
  resized = tf.image.resize(image, size, method='bilinear', antialias=True)
  return tf.ensure_shape(resized, [None, None, image.shape[-1]])


def patchify(image: tf.Tensor, patch: int, max_len: int) -> dict[str, tf.Tensor]:
  """An (h, w, C) image whose sides are multiples of `patch` as `max_len` patch slots:
  'patches' (max_len, patch * patch * C), 'ptype' (1: a patch, 0: padding), 'yidx', 'xidx'."""
  channels = image.shape[-1]
  rows, cols = tf.shape(image)[0] // patch, tf.shape(image)[1] // patch
  grid = tf.reshape(image[: rows * patch, : cols * patch], [rows, patch, cols, patch, channels])
  patches = tf.reshape(tf.transpose(grid, [0, 2, 1, 3, 4]), [rows * cols, -1])
  n = rows * cols
  tf.debugging.assert_less_equal(n, max_len, message=f'more than {max_len} patches')
  yidx, xidx = tf.meshgrid(tf.range(rows), tf.range(cols), indexing='ij')
  pad = max_len - n
  out = {
    'patches': tf.pad(patches, [[0, pad], [0, 0]]),
    'ptype': tf.pad(tf.ones([n], tf.int32), [[0, pad]]),
    'yidx': tf.pad(tf.reshape(yidx, [-1]), [[0, pad]]),
    'xidx': tf.pad(tf.reshape(xidx, [-1]), [[0, pad]]),
  }
  out['patches'] = tf.ensure_shape(out['patches'], [max_len, patch * patch * channels])
  return {k: tf.ensure_shape(v, [max_len, *v.shape[1:]]) for k, v in out.items()}


def pack(patchified: dict[str, tf.Tensor]) -> tf.Tensor:
  """`patchify`'s arrays as one float32 array (..., max_len, P + 3): each slot's patch, then
  its ptype, yidx and xidx (integers below 2**24: exact). A batch of them is one array, as
  every other image batch; `vit_jax.models.naflex.inputs` unpacks it."""
  index = tf.stack([patchified[k] for k in ('ptype', 'yidx', 'xidx')], axis=-1)
  return tf.concat([tf.cast(patchified['patches'], tf.float32), tf.cast(index, tf.float32)], -1)


def packed_sequence(
  image: tf.Tensor,
  patch: int,
  max_len: int,
  offset: float = 127.5,
  scale: float = 127.5,
  budget: tf.Tensor | None = None,
) -> tf.Tensor:
  """Decoded pixels (H, W, C) -> the packed sequence (max_len, patch * patch * C + 3): resized
  at their aspect ratio (`resize_to_sequence`) to at most `budget` patches (a tensor at most
  `max_len`; None: `max_len`), values (x - offset) / scale, `patchify`, `pack`."""
  size = max_len if budget is None else budget
  resized = resize_to_sequence(tf.cast(image, tf.float32), patch, size)
  return pack(patchify((resized - offset) / scale, patch, max_len))

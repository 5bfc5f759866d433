"""vit_jax/data/images.py computes without TensorFlow what the input pipeline computes with it:
decoded pixels equal `tf.io.decode_image`'s, resized ones `tf.image.resize`'s, inputs
`preprocess.input_op`'s; and a command that reads JPEGs and PNGs imports no TensorFlow."""

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from vit_jax.data import images, preprocess
from vit_jax.families import preprocessing

REPO = Path(__file__).parent.parent


def _smooth(shape, seed=0) -> np.ndarray:
  """Pixels with photographic structure (random walks along rows), which JPEG keeps detailed:
  rounding differences between decoders show."""
  rng = np.random.default_rng(seed)
  walk = np.cumsum(rng.normal(0, 8, shape), axis=1) + 128
  return np.clip(walk, 0, 255).astype(np.uint8)


def _encoded(pixels: np.ndarray, fmt: str, **options) -> bytes:
  buffer = io.BytesIO()
  Image.fromarray(pixels).save(buffer, fmt, **options)
  return buffer.getvalue()


def _tf_decoded(raw: bytes) -> np.ndarray:
  return preprocess.decode(tf.constant(raw)).numpy()


JPEGS = {
  f'{name} q{quality}': (shape, {'quality': quality, 'subsampling': sub, **more})
  for name, shape, sub, more in [
    ('4:4:4', (37, 53, 3), 0, {}),
    ('4:2:2', (64, 91, 3), 1, {}),
    ('4:2:0', (333, 517, 3), 2, {}),
    ('4:2:0 odd', (17, 9, 3), 2, {}),
    ('progressive', (120, 77, 3), 2, {'progressive': True}),
    ('grey', (45, 61), 0, {}),
  ]
  for quality in (50, 95)
}


@pytest.mark.parametrize('name', sorted(JPEGS))
def test_a_jpeg_decodes_to_tensorflows_pixels(name):
  shape, options = JPEGS[name]
  raw = _encoded(_smooth(shape), 'JPEG', **options)
  np.testing.assert_array_equal(images.decode_image(raw, name), _tf_decoded(raw))


def test_pngs_of_every_8_bit_mode_decode_to_tensorflows_pixels():
  rgb = _smooth((23, 31, 3), seed=1)
  rgba = np.concatenate([rgb, _smooth((23, 31, 1), seed=2)], axis=-1)
  pictures = {
    'RGB': Image.fromarray(rgb),
    'RGBA': Image.fromarray(rgba),
    'L': Image.fromarray(rgb[..., 0]),
    'LA': Image.fromarray(rgba[..., [0, 3]], 'LA'),
    'P': Image.fromarray(rgb).quantize(17),
    '1': Image.fromarray(rgb[..., 0] > 128),
  }
  transparent = Image.fromarray(rgb).quantize(9)
  transparent.info['transparency'] = 3
  pictures['P with transparency'] = transparent
  for mode, picture in pictures.items():
    buffer = io.BytesIO()
    picture.save(buffer, 'PNG')
    raw = buffer.getvalue()
    assert raw[24] <= 8, mode  # the PNG's own bit depth
    np.testing.assert_array_equal(images.decode_image(raw, mode), _tf_decoded(raw), mode)


def test_what_the_fast_path_refuses_still_decodes_as_tensorflow_does():
  """A 16-bit PNG, a GIF and a BMP go to TensorFlow; a truncated JPEG, which libjpeg-turbo
  refuses, too (TensorFlow refuses it as well: Pillow names the fault)."""
  deep = io.BytesIO()
  Image.fromarray(_smooth((9, 11), seed=3).astype(np.uint16) * 257).save(deep, 'PNG')
  rgb = _smooth((12, 14, 3), seed=4)
  for raw in (deep.getvalue(), _encoded(rgb, 'GIF'), _encoded(rgb, 'BMP')):
    np.testing.assert_array_equal(images.decode_image(raw, 'x'), _tf_decoded(raw))
  truncated = _encoded(_smooth((50, 50, 3)), 'JPEG')[:300]
  with pytest.raises(images.ImageError, match=r'^cut\.jpg: cannot read image'):
    images.decode_image(truncated, 'cut.jpg')


@pytest.mark.parametrize(
  'shape, size',
  [((17, 23), (224, 224)), ((333, 517), (224, 224)), ((224, 224), (224, 224)), ((5, 300), (7, 11))],
)
def test_the_bilinear_resize_equals_tensorflows(shape, size):
  """Up, down, the identity, and both at once: the same float32 numbers to the last bit but
  one (TensorFlow's compiled kernel may fuse a multiply-add)."""
  pixels = np.random.default_rng(5).integers(0, 256, (*shape, 3), dtype=np.uint8)
  expected = tf.image.resize(pixels, size).numpy()
  got = images.resize_bilinear(pixels, size)
  assert got.dtype == np.float32 and got.shape == (*size, 3)
  np.testing.assert_allclose(got, expected, rtol=0, atol=256 * np.finfo(np.float32).eps)


SPECS = {
  'square': preprocessing.square(32),
  'rectangle': preprocessing.square((24, 40)),
  'uint8': preprocessing.square(31, round_to_uint8=True),
  'crop': preprocessing.square(16, crop=0.875),
  'unit': preprocessing.square(20, offset=0.0, scale=255.0),
}


@pytest.mark.parametrize('name', sorted(SPECS))
def test_host_input_equals_the_pipelines_input_op(name):
  spec = SPECS[name]
  assert images.computed_here(spec)
  for shape in [(45, 67, 3), (13, 10, 3)]:
    pixels = np.random.default_rng(6).integers(0, 256, shape, dtype=np.uint8)
    expected = preprocess.input_op(spec, tf.constant(pixels)).numpy()
    np.testing.assert_allclose(images.host_input(spec, pixels), expected, rtol=0, atol=1e-6)


def test_a_patch_sequence_is_tensorflows_own():
  spec = preprocessing.patches(4, 16)
  assert not images.computed_here(spec)
  pixels = np.random.default_rng(7).integers(0, 256, (30, 50, 3), dtype=np.uint8)
  expected = preprocess.input_op(spec, tf.constant(pixels)).numpy()
  np.testing.assert_array_equal(images.host_input(spec, pixels), expected)


@pytest.mark.slow
def test_reading_jpegs_and_pngs_imports_no_tensorflow(tmp_path):
  """What vit-predict does to a JPEG and a PNG, in a fresh interpreter: TensorFlow's import
  alone costs a command seconds."""
  Image.fromarray(_smooth((40, 50, 3))).save(tmp_path / 'a.jpg')
  Image.fromarray(_smooth((30, 20, 3))).save(tmp_path / 'b.png')
  code = (
    'import sys\nfrom vit_jax.data import images\nfrom vit_jax.families import preprocessing\n'
    f'for name in ("a.jpg", "b.png"):\n'
    f'  pixels = images.read_image({str(tmp_path)!r} + "/" + name)\n'
    '  images.host_input(preprocessing.square(24), pixels)\n'
    'print(sorted(m for m in ("tensorflow", "keras") if m in sys.modules))'
  )
  proc = subprocess.run(
    [sys.executable, '-c', code], cwd=REPO, capture_output=True, text=True, timeout=300
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.strip() == '[]'

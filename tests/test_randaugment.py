"""RandAugment's operations against PIL (the library the policy was defined with) and numpy
written here; uint8 in range and shape kept at every magnitude; which operations are the
identity at magnitude 0; determinism by seed."""

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image, ImageEnhance, ImageOps

from vit_jax.data import randaugment as ra

SEED = tf.constant([1, 2], tf.int64)
# The operations that are the identity at magnitude 0, and the magnitude where the others
# are (None: never, they take no magnitude).
IDENTITY_AT_0 = {'Rotate', 'ShearX', 'ShearY', 'TranslateX', 'TranslateY', 'Cutout', 'SolarizeAdd'}
IDENTITY_AT = {
  'Color': 5, 'Contrast': 5, 'Brightness': 5, 'Sharpness': 5, 'Solarize': 10, 'Posterize': 20,
  'AutoContrast': None, 'Equalize': None, 'Invert': None,
}  # fmt: skip


def _image(h: int = 37, w: int = 29, seed: int = 0, lo: int = 0, hi: int = 256) -> np.ndarray:
  return np.random.default_rng(seed).integers(lo, hi, (h, w, 3)).astype(np.uint8)


def _op(name: str, image: np.ndarray, magnitude: float, seed=SEED) -> np.ndarray:
  return ra.apply_op(name, tf.constant(image), magnitude, seed).numpy()


def test_the_operation_set_is_big_visions_sixteen():
  assert set(ra.OPS) == IDENTITY_AT_0 | set(IDENTITY_AT)
  assert len(ra.OPS) == 16


@pytest.mark.parametrize('name', list(ra.OPS))
def test_every_operation_gives_a_uint8_image_of_the_same_shape(name):
  image = _image()
  for magnitude in (0, 3, 10, 17, 30):
    out = ra.apply_op(name, tf.constant(image), magnitude, SEED)
    assert out.dtype == tf.uint8 and out.shape == image.shape, (name, magnitude)


@pytest.mark.parametrize('name', list(ra.OPS))
def test_magnitude_0_is_the_identity_exactly_for_the_operations_that_scale_to_nothing(name):
  image = _image(lo=20, hi=230)  # not full range: AutoContrast and Equalize change it
  same = np.array_equal(_op(name, image, 0), image)
  assert same == (name in IDENTITY_AT_0)
  if IDENTITY_AT.get(name) is not None:
    np.testing.assert_array_equal(_op(name, image, IDENTITY_AT[name]), image)


@pytest.mark.parametrize(
  ('name', 'pil'),
  [
    ('AutoContrast', ImageOps.autocontrast),
    ('Equalize', ImageOps.equalize),
    ('Invert', ImageOps.invert),
    ('Posterize', lambda im: ImageOps.posterize(im, 2)),  # M = 5: int(4 * 0.5) bits
    ('Solarize', lambda im: ImageOps.solarize(im, 128)),  # M = 5: int(256 * 0.5)
  ],
)
def test_pixel_operations_equal_pil(name, pil):
  image = _image(lo=30, hi=200, seed=3)
  expected = np.asarray(pil(Image.fromarray(image)))
  np.testing.assert_array_equal(_op(name, image, 5), expected)


@pytest.mark.parametrize('name', ['Color', 'Contrast', 'Brightness', 'Sharpness'])
@pytest.mark.parametrize('magnitude', [0, 3, 10])
def test_enhancements_equal_pil_image_enhance_to_one_grey_level(name, magnitude):
  """PIL's luma and smoothing round where TensorFlow's truncate: one grey level apart."""
  image = _image(seed=4)
  factor = 1.8 * magnitude / 10 + 0.1
  expected = np.asarray(getattr(ImageEnhance, name)(Image.fromarray(image)).enhance(factor))
  out = _op(name, image, magnitude)
  assert np.abs(out.astype(int) - expected).max() <= 1


def _nearest_transform(image: np.ndarray, matrix: np.ndarray) -> np.ndarray:
  """Output (x, y) <- input at round(matrix @ (x, y, 1)) (float32, halves away from 0)."""
  h, w, _ = image.shape
  y, x = np.mgrid[:h, :w].astype(np.float32)
  a = matrix.astype(np.float32)
  xin = a[0, 0] * x + a[0, 1] * y + a[0, 2]
  yin = a[1, 0] * x + a[1, 1] * y + a[1, 2]
  xi = (np.sign(xin) * np.floor(np.abs(xin) + 0.5)).astype(int)
  yi = (np.sign(yin) * np.floor(np.abs(yin) + 0.5)).astype(int)
  inside = (xi >= 0) & (xi < w) & (yi >= 0) & (yi < h)
  out = np.full_like(image, 128)
  out[inside] = image[yi[inside], xi[inside]]
  return out


@pytest.mark.parametrize('name', ['ShearX', 'ShearY', 'TranslateX', 'TranslateY'])
def test_shear_and_translate_sample_the_nearest_pixel_and_fill_grey(name):
  image = _image(seed=5)
  magnitude = 7 if name.startswith('Shear') else 1.3  # shear 0.21, translate 13 px
  arg = {'ShearX': 0.21, 'ShearY': 0.21, 'TranslateX': 13.0, 'TranslateY': 13.0}[name]
  out = _op(name, image, magnitude)
  candidates = []
  for sign in (1, -1):
    m = np.eye(3)
    position = {'ShearX': (0, 1), 'ShearY': (1, 0), 'TranslateX': (0, 2), 'TranslateY': (1, 2)}
    m[position[name]] = sign * arg
    candidates.append(_nearest_transform(image, m))
  assert any(np.array_equal(out, c) for c in candidates)
  assert (out == 128).all(-1).sum() > 0  # some pixels came from outside


def test_rotate_by_90_degrees_is_rot90_of_a_square_image():
  image = _image(h=17, w=17, seed=6)
  np.testing.assert_array_equal(ra.rotate(tf.constant(image), 90.0).numpy(), np.rot90(image, 1))
  out = _op('Rotate', image, 30)  # magnitude 30: +-90 degrees
  assert any(np.array_equal(out, np.rot90(image, k)) for k in (1, 3))


def test_cutout_greys_one_square_of_side_2_pad_clipped_to_the_image():
  image = _image(h=64, w=48, lo=0, hi=100, seed=7)  # no grey pixel of its own
  for s in range(20):
    out = _op('Cutout', image, 2.5, tf.constant([s, 0], tf.int64))  # pad int(40 / 4) = 10
    grey = (out != image).any(-1)
    rows, cols = np.nonzero(grey)
    np.testing.assert_array_equal(out[grey], 128)
    box = np.zeros_like(grey)
    box[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1] = True
    np.testing.assert_array_equal(grey, box)
    for lo, hi, size in ((rows.min(), rows.max(), 64), (cols.min(), cols.max(), 48)):
      assert hi - lo + 1 == 20 or ((lo == 0 or hi == size - 1) and hi - lo + 1 < 20)


@pytest.mark.slow
def test_randaugment_is_a_function_of_the_seed():
  image = tf.constant(_image(seed=8))
  run = tf.function(lambda s: ra.randaugment(image, s, 2, 10))
  outs = [run(tf.constant([s, 9], tf.int64)).numpy() for s in range(12)]
  np.testing.assert_array_equal(run(tf.constant([0, 9], tf.int64)).numpy(), outs[0])
  assert len({o.tobytes() for o in outs}) >= 10  # 256 op pairs, some the identity here
  np.testing.assert_array_equal(ra.randaugment(image, SEED, 0, 10).numpy(), image.numpy())


def test_each_layer_picks_the_sixteen_operations_uniformly():
  """One layer on an 8x8 image, 1,600 seeds: each output is matched to the operations that
  give it at magnitude 10 (ties shared: TranslateX/Y and Cutout all give a grey image).
  Each operation is picked 100 times +- 5 std (9.7); the ones with a random sign (Rotate,
  Shear) match their output of one sign, half of their picks."""
  image = tf.constant(_image(h=8, w=8, seed=9))
  outputs = {name: _op(name, image.numpy(), 10).tobytes() for name in ra.OPS}
  run = tf.function(lambda s: ra.randaugment(image, s, 1, 10))
  counts = dict.fromkeys(ra.OPS, 0.0)
  for s in range(1600):
    out = run(tf.constant([s, 1], tf.int64)).numpy().tobytes()
    matches = [n for n, o in outputs.items() if o == out]
    for n in matches:
      counts[n] += 1 / len(matches)
  signed = {'Rotate', 'ShearX', 'ShearY'}
  for name, count in counts.items():
    expected = 50 if name in signed else 100
    assert abs(count - expected) < 5 * np.sqrt(expected * (1 - expected / 1600)), counts

"""RandAugment (Cubuk et al., arXiv:1909.13719) in TensorFlow ops, with stateless randomness.

The operation set and magnitude scale of big_vision's `randaug(N, M)` (the TPU EfficientNet
`distort_image_with_randaugment` it forks): each of `num_layers` layers picks one of the 16
operations uniformly and always applies it, at the fixed magnitude M (L = M / 10; M > 10
extrapolates):

  AutoContrast, Equalize, Invert     no argument
  Rotate                             +-30 L degrees (random sign)
  ShearX, ShearY                     +-0.3 L
  TranslateX, TranslateY             +-100 L pixels
  Posterize                          keep int(4 L) bits
  Solarize                           invert pixels >= int(256 L)
  SolarizeAdd                        add int(110 L) to pixels < 128
  Color, Contrast, Brightness,       blend with the degenerate image by 1.8 L + 0.1
  Sharpness                          (1: the image itself)
  Cutout                             a grey square of side 2 int(40 L)

Geometric operations sample the nearest pixel and fill with grey (128). At M = 0 Rotate,
Shear, Translate, SolarizeAdd and Cutout are the identity; the others are not, by the
convention of this scale: Posterize keeps 0 bits (black), Solarize inverts every pixel, the
enhancements blend by 0.1 (toward grey, the mean, black or the blurred image), and
AutoContrast, Equalize and Invert take no magnitude. The enhancements are the identity at
M = 5, Solarize at M = 10, Posterize at M = 20.

One difference from the TensorFlow fork, on purpose: Contrast blends with the mean grey
level, as PIL (and timm) do; the fork used the pixel count / 256 in its place.

Images are uint8 (H, W, 3) in and out; `seed` (shape (2,)) fixes every choice, so an example
gets the same augmentation wherever the stream is resumed.
"""

import math

import tensorflow as tf

_MAX_LEVEL = 10.0
_FILL = 128
_CUTOUT = 40
_TRANSLATE = 100


def _uint8(x: tf.Tensor) -> tf.Tensor:
  """float pixels to uint8: clipped to [0, 255], then truncated (PIL's and the fork's cast)."""
  return tf.cast(tf.clip_by_value(x, 0.0, 255.0), tf.uint8)


def blend(degenerate: tf.Tensor, image: tf.Tensor, factor: tf.Tensor) -> tf.Tensor:
  """degenerate + factor (image - degenerate): PIL's ImageEnhance (factor 1 = `image`)."""
  d = tf.cast(degenerate, tf.float32)
  return _uint8(d + factor * (tf.cast(image, tf.float32) - d))


def _grey(image: tf.Tensor) -> tf.Tensor:
  """(H, W, 1) uint8 luma, as tf.image.rgb_to_grayscale on the uint8 image."""
  return tf.image.rgb_to_grayscale(image)


def color(image: tf.Tensor, factor: tf.Tensor) -> tf.Tensor:
  return blend(tf.image.grayscale_to_rgb(_grey(image)), image, factor)


def contrast(image: tf.Tensor, factor: tf.Tensor) -> tf.Tensor:
  mean = tf.reduce_mean(tf.cast(_grey(image), tf.float32))
  return blend(tf.fill(tf.shape(image), tf.floor(mean + 0.5)), image, factor)


def brightness(image: tf.Tensor, factor: tf.Tensor) -> tf.Tensor:
  return blend(tf.zeros_like(image), image, factor)


def sharpness(image: tf.Tensor, factor: tf.Tensor) -> tf.Tensor:
  """Blend with PIL's SMOOTH filter (3x3, centre 5, /13); the border pixels stay."""
  kernel = tf.constant([[1, 1, 1], [1, 5, 1], [1, 1, 1]], tf.float32) / 13.0
  kernel = tf.tile(kernel[:, :, None, None], [1, 1, 3, 1])
  smooth = tf.nn.depthwise_conv2d(
    tf.cast(image, tf.float32)[None], kernel, [1, 1, 1, 1], padding='VALID'
  )[0]
  smooth = tf.pad(_uint8(smooth), [[1, 1], [1, 1], [0, 0]])
  inner = tf.pad(tf.ones_like(smooth[1:-1, 1:-1]), [[1, 1], [1, 1], [0, 0]]) > 0
  return blend(tf.where(inner, smooth, image), image, factor)


def posterize(image: tf.Tensor, bits: tf.Tensor) -> tf.Tensor:
  """Keep the `bits` high bits of every pixel (0 bits: black)."""
  mask = tf.bitwise.bitwise_and(tf.bitwise.left_shift(255, 8 - bits), 255)
  return tf.bitwise.bitwise_and(image, tf.cast(mask, tf.uint8))


def solarize(image: tf.Tensor, threshold: tf.Tensor) -> tf.Tensor:
  return tf.where(tf.cast(image, tf.int32) < threshold, image, 255 - image)


def solarize_add(image: tf.Tensor, addition: tf.Tensor, threshold: int = 128) -> tf.Tensor:
  added = tf.cast(tf.clip_by_value(tf.cast(image, tf.int32) + addition, 0, 255), tf.uint8)
  return tf.where(image < threshold, added, image)


def invert(image: tf.Tensor) -> tf.Tensor:
  return 255 - image


def autocontrast(image: tf.Tensor) -> tf.Tensor:
  """Each channel stretched linearly to [0, 255] (a constant channel stays)."""
  x = tf.cast(image, tf.float64)  # PIL's arithmetic: x * scale - lo * scale, truncated
  lo = tf.reduce_min(x, axis=(0, 1), keepdims=True)
  hi = tf.reduce_max(x, axis=(0, 1), keepdims=True)
  scale = 255.0 / tf.maximum(hi - lo, 1.0)
  stretched = tf.cast(tf.clip_by_value(x * scale - lo * scale, 0.0, 255.0), tf.uint8)
  return tf.where(hi > lo, stretched, image)


def _equalize_channel(channel: tf.Tensor) -> tf.Tensor:
  """PIL's ImageOps.equalize of one (H, W) uint8 channel."""
  im = tf.cast(channel, tf.int32)
  histo = tf.histogram_fixed_width(im, [0, 255], nbins=256)
  nonzero = tf.boolean_mask(histo, histo > 0)
  step = (tf.reduce_sum(nonzero) - nonzero[-1]) // 255

  def equalized():
    lut = (tf.cumsum(histo) + step // 2) // tf.maximum(step, 1)
    lut = tf.clip_by_value(tf.concat([[0], lut[:-1]], 0), 0, 255)
    return tf.gather(lut, im)

  return tf.cast(tf.cond(step > 0, equalized, lambda: im), tf.uint8)


def equalize(image: tf.Tensor) -> tf.Tensor:
  return tf.stack([_equalize_channel(image[:, :, c]) for c in range(3)], axis=2)


def transform(image: tf.Tensor, matrix: list) -> tf.Tensor:
  """Output pixel (x, y) takes the input's nearest pixel at the projective map
  [a0 a1 a2; b0 b1 b2; c0 c1 1] of (x, y); outside the image: grey."""
  matrix = tf.cast(tf.stack(matrix)[None], tf.float32)
  out = tf.raw_ops.ImageProjectiveTransformV3(
    images=image[None],
    transforms=matrix,
    output_shape=tf.shape(image)[:2],
    fill_value=float(_FILL),
    interpolation='NEAREST',
    fill_mode='CONSTANT',
  )
  return out[0]


def rotate(image: tf.Tensor, degrees: tf.Tensor) -> tf.Tensor:
  """Rotation about the image centre (counter-clockwise for positive degrees)."""
  h = tf.cast(tf.shape(image)[0], tf.float32) - 1.0
  w = tf.cast(tf.shape(image)[1], tf.float32) - 1.0
  radians = degrees * math.pi / 180.0
  cos, sin = tf.cos(radians), tf.sin(radians)
  x_offset = (w - (cos * w - sin * h)) / 2.0
  y_offset = (h - (sin * w + cos * h)) / 2.0
  return transform(image, [cos, -sin, x_offset, sin, cos, y_offset, 0.0, 0.0])


def shear_x(image: tf.Tensor, level: tf.Tensor) -> tf.Tensor:
  return transform(image, [1.0, level, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])


def shear_y(image: tf.Tensor, level: tf.Tensor) -> tf.Tensor:
  return transform(image, [1.0, 0.0, 0.0, level, 1.0, 0.0, 0.0, 0.0])


def translate_x(image: tf.Tensor, pixels: tf.Tensor) -> tf.Tensor:
  """The content moves `pixels` to the left (the fork's `translate(image, [-pixels, 0])`)."""
  return transform(image, [1.0, 0.0, pixels, 0.0, 1.0, 0.0, 0.0, 0.0])


def translate_y(image: tf.Tensor, pixels: tf.Tensor) -> tf.Tensor:
  return transform(image, [1.0, 0.0, 0.0, 0.0, 1.0, pixels, 0.0, 0.0])


def cutout(image: tf.Tensor, pad: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
  """Grey over rows cy - pad ... cy + pad - 1 and the same columns around cx (clipped to the
  image), the centre (cy, cx) uniform over the pixels."""
  shape = tf.shape(image)
  seed_y, seed_x = tf.unstack(tf.random.experimental.stateless_split(seed, num=2))
  cy = tf.random.stateless_uniform([], seed_y, 0, shape[0], tf.int32)
  cx = tf.random.stateless_uniform([], seed_x, 0, shape[1], tf.int32)
  rows = tf.range(shape[0])[:, None]
  cols = tf.range(shape[1])[None, :]
  inside = (rows >= cy - pad) & (rows < cy + pad) & (cols >= cx - pad) & (cols < cx + pad)
  return tf.where(inside[:, :, None], tf.cast(_FILL, tf.uint8), image)


# name -> op(image, level L = M / 10, sign +-1, seed): the arguments of the scale above.
OPS = {
  'AutoContrast': lambda image, level, sign, seed: autocontrast(image),
  'Equalize': lambda image, level, sign, seed: equalize(image),
  'Invert': lambda image, level, sign, seed: invert(image),
  'Rotate': lambda image, level, sign, seed: rotate(image, sign * 30.0 * level),
  'Posterize': lambda image, level, sign, seed: posterize(image, int(4 * level)),
  'Solarize': lambda image, level, sign, seed: solarize(image, int(256 * level)),
  'Color': lambda image, level, sign, seed: color(image, 1.8 * level + 0.1),
  'Contrast': lambda image, level, sign, seed: contrast(image, 1.8 * level + 0.1),
  'Brightness': lambda image, level, sign, seed: brightness(image, 1.8 * level + 0.1),
  'Sharpness': lambda image, level, sign, seed: sharpness(image, 1.8 * level + 0.1),
  'ShearX': lambda image, level, sign, seed: shear_x(image, sign * 0.3 * level),
  'ShearY': lambda image, level, sign, seed: shear_y(image, sign * 0.3 * level),
  'TranslateX': lambda image, level, sign, seed: translate_x(image, sign * _TRANSLATE * level),
  'TranslateY': lambda image, level, sign, seed: translate_y(image, sign * _TRANSLATE * level),
  'Cutout': lambda image, level, sign, seed: cutout(image, int(_CUTOUT * level), seed),
  'SolarizeAdd': lambda image, level, sign, seed: solarize_add(image, int(110 * level)),
}


def apply_op(name: str, image: tf.Tensor, magnitude: float, seed: tf.Tensor) -> tf.Tensor:
  """Operation `name` at `magnitude`; `seed` draws the sign (1/2 each) and Cutout's centre."""
  sign_seed, op_seed = tf.unstack(tf.random.experimental.stateless_split(seed, num=2))
  sign = tf.where(tf.random.stateless_uniform([], sign_seed) < 0.5, -1.0, 1.0)
  out = OPS[name](image, magnitude / _MAX_LEVEL, sign, op_seed)
  out.set_shape(image.shape)
  return out


def randaugment(image: tf.Tensor, seed: tf.Tensor, num_layers: int, magnitude: float):
  """`num_layers` operations, each chosen uniformly from `OPS`, applied at `magnitude`."""
  names = list(OPS)
  for layer in range(num_layers):
    layer_seed = tf.random.experimental.stateless_fold_in(seed, layer)
    choice_seed, op_seed = tf.unstack(tf.random.experimental.stateless_split(layer_seed, 2))
    index = tf.random.stateless_uniform([], choice_seed, 0, len(names), tf.int32)
    branches = [
      lambda name=name, image=image, seed=op_seed: apply_op(name, image, magnitude, seed)
      for name in names
    ]
    image = tf.switch_case(index, branches)
  return image

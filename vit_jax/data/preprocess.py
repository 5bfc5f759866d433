"""Preprocessing of the original vit_jax input pipeline, with stateless (seeded) randomness.

Decoding: JPEG, PNG, GIF (first frame) or BMP bytes to uint8 RGB. Training: inception crop
(a random box covering `area_range` of the image, aspect ratio 3/4 to 4/3), resize to `crop` x
`crop`, random horizontal flip, pixels to [-1, 1].
Evaluation: resize to `crop` x `crop`, pixels to [-1, 1].

Every random op takes an explicit seed, so the same example at the same stream position
gets the same augmentation in an uninterrupted and in a resumed run.
"""

import math

import numpy as np
import tensorflow as tf


def decode(encoded: tf.Tensor) -> tf.Tensor:
  """Encoded image bytes to uint8 (H, W, 3): grey is repeated, alpha dropped."""
  return tf.io.decode_image(encoded, channels=3, expand_animations=False)


def decode_bytes(data: bytes) -> np.ndarray | None:
  """An encoded image decoded by `decode` (eagerly), or None when TensorFlow cannot decode it."""
  try:
    return decode(tf.constant(data)).numpy()
  except tf.errors.OpError:
    return None


def value_range(image: tf.Tensor) -> tf.Tensor:
  """uint8 (or float in [0, 255]) pixels to float32 in [-1, 1], as `(x - 127.5) / 127.5`."""
  return (tf.cast(image, tf.float32) - 127.5) / 127.5


def inception_crop(
  image: tf.Tensor,
  seed: tf.Tensor,
  area_range: tuple[float, float] = (0.05, 1.0),
  aspect_ratio_range: tuple[float, float] = (0.75, 1.33),
) -> tf.Tensor:
  """A random crop covering `area_range` of the image (Szegedy et al.'s inception crop)."""
  begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
    tf.shape(image),
    tf.zeros([0, 0, 4], tf.float32),
    seed=seed,
    min_object_covered=0.0,
    aspect_ratio_range=aspect_ratio_range,
    area_range=area_range,
    use_image_if_no_bounding_boxes=True,
  )
  channels = image.shape[-1]
  image = tf.slice(image, begin, size)
  image.set_shape([None, None, channels])
  return image


def subpixel_inception_crop(
  image: tf.Tensor,
  seed: tf.Tensor,
  size: int,
  area_range: tuple[float, float] = (0.05, 1.0),
  aspect_ratio_range: tuple[float, float] = (0.75, 1.33),
) -> tf.Tensor:
  """The inception crop with a box in continuous coordinates, resampled to `size` x `size`.

  For images of a few pixels (the bundled 8x8 digits) a box on the pixel grid allows only a
  handful of crops; here area and log aspect ratio are uniform, sides are capped at the image,
  and the box is sampled bilinearly (`tf.image.crop_and_resize`; the full box is the identity
  when `size` equals the image size).
  """
  area = tf.random.stateless_uniform([], seed, area_range[0], area_range[1])
  seeds = tf.random.experimental.stateless_split(seed, num=3)
  log_ratio = tf.random.stateless_uniform(
    [], seeds[0], math.log(aspect_ratio_range[0]), math.log(aspect_ratio_range[1])
  )
  h = tf.minimum(tf.sqrt(area / tf.exp(log_ratio)), 1.0)
  w = tf.minimum(tf.sqrt(area * tf.exp(log_ratio)), 1.0)
  y0 = tf.random.stateless_uniform([], seeds[1]) * (1.0 - h)
  x0 = tf.random.stateless_uniform([], seeds[2]) * (1.0 - w)
  box = tf.stack([y0, x0, y0 + h, x0 + w])[None]
  image = tf.cast(image, tf.float32)[None]
  return tf.image.crop_and_resize(image, box, tf.zeros([1], tf.int32), [size, size])[0]


def train_image(
  image: tf.Tensor,
  seed: tf.Tensor,
  crop: int,
  area_min: float = 0.05,
  flip: bool = True,
  subpixel: bool = False,
) -> tf.Tensor:
  """Inception crop, resize to `crop`, optional random flip, [-1, 1]; `seed` is shape (2,)."""
  crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, num=2))
  if subpixel:
    image = subpixel_inception_crop(image, crop_seed, crop, area_range=(area_min, 1.0))
  else:
    image = inception_crop(image, crop_seed, area_range=(area_min, 1.0))
    image = tf.image.resize(image, [crop, crop])
  if flip:
    image = tf.image.stateless_random_flip_left_right(image, flip_seed)
  return value_range(image)


def eval_image(image: tf.Tensor, crop: int) -> tf.Tensor:
  """Resize to `crop` x `crop`, [-1, 1]."""
  return value_range(tf.image.resize(image, [crop, crop]))

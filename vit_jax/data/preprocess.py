"""Preprocessing of the original vit_jax input pipeline, with stateless (seeded) randomness.

Decoding: JPEG, PNG, GIF (first frame) or BMP bytes to uint8 RGB. Training: inception crop
(a random box covering `area_range` of the image, aspect ratio 3/4 to 4/3; of a JPEG only
that window is decoded), resize to `crop` x `crop`, random horizontal flip, optionally
RandAugment (on the resized image rounded to uint8, as big_vision's
`inception_crop|flip_lr|randaug`), pixels to [-1, 1].
Evaluation: resize to `crop` x `crop`, pixels to [-1, 1].
Patch sequences (a model whose preprocessing spec says so): the whole image at its aspect
ratio as a sequence of patches (vit_jax/data/naflex.py), flipped at random in training, and
there with NaViT's resolution sampling and token dropping (vit_jax/data/packing.py) if `pp` asks.

One image on the host, decoded and made a model's input: vit_jax/data/images.py, which
computes the same numbers without TensorFlow where it can.

Every random op takes an explicit seed, so the same example at the same stream position
gets the same augmentation in an uninterrupted and in a resumed run.
"""

import dataclasses
import math
from collections.abc import Callable

import tensorflow as tf

from vit_jax import data
from vit_jax.data import naflex, packing, randaugment
from vit_jax.data.spec import Pp
from vit_jax.families import preprocessing
from vit_jax.families.preprocessing import Preprocessing

# fold_in data of an example's RandAugment, patch budget and token dropping seeds (its crop
# and flip seeds are split off).
_RANDAUG_SEED, _BUDGET_SEED, _DROP_SEED, _ASPECT_SEED = 7, 8, 9, 10
# Whichever path brought TensorFlow in (a command that decodes most images without it too).
data.hide_accelerators_from_tensorflow()

# The inception crop's range of aspect ratios (width / height), tf.image's and big_vision's.
ASPECT_RATIOS = (0.75, 1.33)


def decode(encoded: tf.Tensor) -> tf.Tensor:
  """Encoded image bytes to uint8 (H, W, 3): grey is repeated, alpha dropped."""
  return tf.io.decode_image(encoded, channels=3, expand_animations=False)


def value_range(image: tf.Tensor, offset: float = 127.5, scale: float = 127.5) -> tf.Tensor:
  """uint8 (or float in [0, 255]) pixels to float32 `(x - offset) / scale`: by default
  [-1, 1], as every released family expects."""
  return (tf.cast(image, tf.float32) - offset) / scale


def _crop_box(image_shape, seed, area_range) -> tuple[tf.Tensor, tf.Tensor]:
  """(begin, size) of an inception crop of an image of `image_shape` (H, W, C)."""
  begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
    image_shape,
    tf.zeros([0, 0, 4], tf.float32),
    seed=seed,
    min_object_covered=0.0,
    aspect_ratio_range=ASPECT_RATIOS,
    area_range=area_range,
    use_image_if_no_bounding_boxes=True,
  )
  return begin, size


def inception_crop(
  image: tf.Tensor,
  seed: tf.Tensor,
  area_range: tuple[float, float],
) -> tf.Tensor:
  """A random crop covering `area_range` of the image (Szegedy et al.'s inception crop)."""
  begin, size = _crop_box(tf.shape(image), seed, area_range)
  channels = image.shape[-1]
  image = tf.slice(image, begin, size)
  image.set_shape([None, None, channels])
  return image


def decode_and_inception_crop(
  encoded: tf.Tensor,
  seed: tf.Tensor,
  area_range: tuple[float, float],
) -> tf.Tensor:
  """`inception_crop(decode(encoded), ...)`, decoding only the crop window of a JPEG.

  The box is the same (it depends on the image's size, read from the JPEG header), and
  `tf.image.decode_and_crop_jpeg` skips the rest of the image, as big_vision's
  `decode_jpeg_and_inception_crop` does. It equals a full decode cropped, except that the
  window's outermost rows and columns may differ by a few grey levels (chroma upsampling
  without the neighbours outside the window). Other formats are decoded whole.
  """

  def jpeg():
    shape = tf.image.extract_jpeg_shape(encoded)
    begin, size = _crop_box(tf.concat([shape[:2], [3]], 0), seed, area_range)
    window = tf.stack([begin[0], begin[1], size[0], size[1]])
    return tf.image.decode_and_crop_jpeg(encoded, window, channels=3)

  def other():
    return inception_crop(decode(encoded), seed, area_range)

  image = tf.cond(tf.io.is_jpeg(encoded), jpeg, other)
  image.set_shape([None, None, 3])
  return image


def subpixel_inception_crop(
  image: tf.Tensor,
  seed: tf.Tensor,
  size: int,
  area_range: tuple[float, float],
  aspect_ratio_range: tuple[float, float] = ASPECT_RATIOS,
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


def _seeds(seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
  """The inception crop's and the flip's seeds of an example's seed."""
  crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, num=2))
  return crop_seed, flip_seed


def _finish(image: tf.Tensor, seed: tf.Tensor, flip_seed: tf.Tensor, pp: Pp) -> tf.Tensor:
  """Random flip, RandAugment (`pp.randaug_layers`, 0: none, at `pp.randaug_magnitude`),
  [-1, 1]."""
  if pp.flip:
    image = tf.image.stateless_random_flip_left_right(image, flip_seed)
  if pp.randaug_layers:
    image = tf.cast(tf.clip_by_value(tf.round(image), 0.0, 255.0), tf.uint8)
    ra_seed = tf.random.experimental.stateless_fold_in(seed, _RANDAUG_SEED)
    image = randaugment.randaugment(image, ra_seed, pp.randaug_layers, pp.randaug_magnitude)
  return value_range(image)


def train_image(image: tf.Tensor, seed: tf.Tensor, pp: Pp) -> tf.Tensor:
  """Inception crop (area `pp.area_min` to 1; between pixels with `pp.subpixel`), resize to
  `pp.crop`, optional random flip and RandAugment, [-1, 1]; `seed` is shape (2,)."""
  crop_seed, flip_seed = _seeds(seed)
  area_range = (pp.area_min, 1.0)
  if pp.subpixel:
    image = subpixel_inception_crop(image, crop_seed, pp.crop, area_range)
  else:
    image = inception_crop(image, crop_seed, area_range)
    image = tf.image.resize(image, [pp.crop, pp.crop])
  return _finish(image, seed, flip_seed, pp)


def train_image_from_bytes(
  encoded: tf.Tensor,
  seed: tf.Tensor,
  pp: Pp,
  adjust: Callable[[tf.Tensor], tf.Tensor] | None = None,
) -> tf.Tensor:
  """`train_image` of encoded bytes, decoding only the crop window of a JPEG
  (`decode_and_inception_crop`); `adjust` maps the decoded pixels (a source's own fix)."""
  crop_seed, flip_seed = _seeds(seed)
  image = decode_and_inception_crop(encoded, crop_seed, (pp.area_min, 1.0))
  if adjust is not None:
    image = adjust(image)
  return _finish(tf.image.resize(image, [pp.crop, pp.crop]), seed, flip_seed, pp)


def train_sequences(pp: Pp, spec: Preprocessing) -> Preprocessing:
  """The model's `spec` of patch sequences as training pads them: to the largest of
  `pp.pack_budgets` where resolution sampling draws each image's budget from them."""
  if not pp.pack_budgets:
    return spec
  return dataclasses.replace(spec, max_patches=max(pp.pack_budgets))


def stretched(image: tf.Tensor, seed: tf.Tensor, most: float) -> tf.Tensor:
  """`image` resized (antialiased bilinear) to its aspect ratio (width / height) times r, log r
  uniform in [-log most, log most], its area kept: sides h / sqrt(r), w * sqrt(r), rounded,
  at least a pixel."""
  log_r = tf.random.stateless_uniform([], seed, -math.log(most), math.log(most))
  scale = tf.exp(tf.stack([-log_r, log_r]) / 2)
  sides = tf.round(tf.cast(tf.shape(image)[:2], tf.float32) * scale)
  size = tf.maximum(tf.cast(sides, tf.int32), 1)
  return tf.image.resize(tf.cast(image, tf.float32), size, method='bilinear', antialias=True)


def train_patch_sequence(
  image: tf.Tensor, seed: tf.Tensor, pp: Pp, spec: Preprocessing
) -> tf.Tensor:
  """A training input of patch sequences: the image flipped at random (`pp.flip`) and
  stretched to another aspect ratio (`pp.aspect_range`, `stretched`), then as the model's
  `spec` says (no crop: the sequence keeps the whole image at its aspect
  ratio; the patch size is the spec's), at most as many patches as its budget (one of
  `pp.pack_budgets` drawn at random, else the spec's number), padded to `train_sequences`;
  then NaViT's token dropping (`pp.token_drop`, up to `pp.token_drop_max`)."""
  if pp.flip:
    image = tf.image.stateless_random_flip_left_right(image, _seeds(seed)[1])
  if pp.aspect_range > 1:
    aspect_seed = tf.random.experimental.stateless_fold_in(seed, _ASPECT_SEED)
    image = stretched(image, aspect_seed, pp.aspect_range)
  budget = None
  if pp.pack_budgets:
    budget_seed = tf.random.experimental.stateless_fold_in(seed, _BUDGET_SEED)
    pick = tf.random.stateless_uniform([], budget_seed, 0, len(pp.pack_budgets), tf.int32)
    budget = tf.gather(tf.constant(pp.pack_budgets, tf.int32), pick)
  sequence = input_op(train_sequences(pp, spec), image, budget)
  if not (pp.token_drop or pp.token_drop_max):
    return sequence
  drop_seed, rate_seed = tf.unstack(
    tf.random.experimental.stateless_split(
      tf.random.experimental.stateless_fold_in(seed, _DROP_SEED), num=2
    )
  )
  rate = pp.token_drop
  if pp.token_drop_max > pp.token_drop:
    rate = tf.random.stateless_uniform([], rate_seed, pp.token_drop, pp.token_drop_max)
  return packing.drop_tokens(sequence, rate, drop_seed)


def of_pp(pp: Pp) -> Preprocessing:
  """The evaluation preprocessing a run's `pp` alone implies, where no model says more: a
  `crop` square. Patch sequences are the model's (its patch size): a ValueError."""
  if pp.max_patches:
    raise ValueError(
      f'config.pp.max_patches={pp.max_patches}: patch sequences take the patch size of the'
      " model: give the run's preprocessing (families.run_preprocessing)"
    )
  return preprocessing.square(pp.crop)


def patch_sequence(image: tf.Tensor, patch: int, max_patches: int) -> tf.Tensor:
  """A patch-sequence input: the image at its own aspect ratio, resized to at most
  `max_patches` patches of `patch`, in [-1, 1], packed (max_patches, patch * patch * 3 + 3)."""
  return input_op(preprocessing.patches(patch, max_patches), image)


def eval_image(image: tf.Tensor, crop: int) -> tf.Tensor:
  """Resize to `crop` x `crop`, [-1, 1]: a classifier's evaluation input."""
  return input_op(preprocessing.square(crop), image)


def _central_crop(image: tf.Tensor, fraction: float) -> tf.Tensor:
  """The central `fraction` of each side (rounded to whole pixels, at least one)."""
  shape = tf.shape(image)
  keep = tf.maximum(tf.cast(tf.round(tf.cast(shape[:2], tf.float32) * fraction), tf.int32), 1)
  begin = (shape[:2] - keep) // 2
  return image[begin[0] : begin[0] + keep[0], begin[1] : begin[1] + keep[1]]


def input_op(spec: Preprocessing, image: tf.Tensor, budget: tf.Tensor | None = None) -> tf.Tensor:
  """Decoded pixels (H, W, 3) -> the model's image input, as the spec states: THE
  implementation of a model's preprocessing (the pipeline maps it; vit_jax/data/images.py
  computes it on the host). `budget`: a patch sequence's own number of patches (at most the
  spec's, which it is padded to: resolution sampling)."""
  if spec.crop < 1:
    image = _central_crop(image, spec.crop)
  if spec.kind == preprocessing.PATCHES:
    args = (spec.patch_size, spec.max_patches, spec.offset, spec.scale, budget)
    return naflex.packed_sequence(image, *args)
  resized = tf.image.resize(image, spec.size, method=spec.method, antialias=spec.antialias)
  if spec.round_to_uint8:  # the original LiT code's: the resized image cast to uint8
    resized = tf.cast(resized, tf.uint8)
  return value_range(resized, spec.offset, spec.scale)

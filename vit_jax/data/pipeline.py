"""Per-host input pipelines: a resumable training stream and an exact, padded evaluation pass.

Why tf.data with step-derived seeds (and not grain): tfds, image folders and the bundled
arrays all read through tf.data already, and when the shuffle order of epoch `e` is seeded
by `(seed, e)` and each example's augmentation by `(seed, host, stream position)`, the
stream is a pure function of its position, so a checkpoint only needs the position (an
integer) to resume exactly, with no iterator state to save and nothing more to install.

Training: epoch `e` is this host's share shuffled with seed `(seed, e)` (a buffer of
`shuffle_buffer` examples), epochs follow each other without a gap, and a run resumed at
position `p` skips to epoch `p // n`, offset `p % n`. Evaluation: this host's share once,
in order, padded with masked (mask = 0) examples to a whole number of batches that is the
same on every host, so every example counts exactly once.
"""

import dataclasses
import math

import tensorflow as tf

from vit_jax.data import preprocess
from vit_jax.data.sources import Source, per_host_max

_FOREVER = 2**62
# The mapped functions are plain graph code: no autograph conversion (it writes temporary files).
_graph_fn = tf.autograph.experimental.do_not_convert


@dataclasses.dataclass(frozen=True)
class Preprocessing:
  """What `config.pp` asks for: output size, inception-crop area floor, random flip, and
  whether the crop box may fall between pixels (for images of a few pixels)."""

  crop: int
  area_min: float = 0.05
  flip: bool = True
  subpixel: bool = False


def _options() -> tf.data.Options:
  options = tf.data.Options()
  options.deterministic = True
  options.experimental_optimization.map_parallelization = True
  options.threading.private_threadpool_size = 2
  return options


def train_dataset(
  source: Source,
  split: str,
  *,
  local_batch: int,
  pp: Preprocessing,
  seed: int,
  position: int = 0,
  shuffle_buffer: int = 50_000,
  process_index: int = 0,
  process_count: int = 1,
  prefetch: int = 2,
) -> tf.data.Dataset:
  """Endless batches `{'image': f32 (B, crop, crop, 3) in [-1, 1], 'label': int32 (B,)}`.

  `position` counts the examples this host has already consumed (step x local batch);
  the dataset then yields exactly what an uninterrupted stream would yield from there on.
  """
  n = source.num_examples(split, process_index, process_count)
  if n == 0:
    raise ValueError(f'Split {split!r} of {source.name!r} is empty on host {process_index}.')
  records = source.records(split, process_index, process_count)
  buffer = max(1, min(shuffle_buffer, n))
  first_epoch, offset = divmod(position, n)

  @_graph_fn
  def epoch(e):
    epoch_seed = tf.cast(seed, tf.int64) * 1_000_003 + tf.cast(e, tf.int64)
    return records.shuffle(buffer, seed=epoch_seed, reshuffle_each_iteration=False)

  stream = tf.data.Dataset.range(first_epoch, _FOREVER).flat_map(epoch).skip(offset)
  positions = tf.data.Dataset.range(position, _FOREVER)
  host_seed = tf.random.experimental.stateless_fold_in(
    tf.constant([seed, 0], tf.int64), process_index
  )

  @_graph_fn
  def process(i, record):
    example_seed = tf.random.experimental.stateless_fold_in(host_seed, i)
    image = preprocess.train_image(
      source.decode(record['image']),
      example_seed,
      pp.crop,
      area_min=pp.area_min,
      flip=pp.flip,
      subpixel=pp.subpixel,
    )
    return {'image': image, 'label': tf.cast(record['label'], tf.int32)}

  ds = tf.data.Dataset.zip(positions, stream).map(process, num_parallel_calls=tf.data.AUTOTUNE)
  ds = ds.batch(local_batch, drop_remainder=True).prefetch(prefetch)
  return ds.with_options(_options())


def check_data_shards(data_shards: int, global_batch: int, process_count: int) -> None:
  """A clear error when the data shards do not split over the hosts or the batch over them."""
  if data_shards <= 0 or data_shards % process_count:
    raise ValueError(
      f'config.data_shards={data_shards} does not split over {process_count} processes: use a '
      f'multiple of {process_count} (0 = one shard per process).'
    )
  if global_batch % data_shards:
    raise ValueError(
      f'config.batch={global_batch} does not split into config.data_shards={data_shards} '
      f'shards: use a batch that is a multiple of {data_shards}.'
    )


def host_train_dataset(
  source: Source,
  split: str,
  *,
  global_batch: int,
  data_shards: int,
  pp: Preprocessing,
  seed: int,
  step: int = 0,
  shuffle_buffer: int = 50_000,
  process_index: int = 0,
  process_count: int = 1,
  prefetch: int = 2,
) -> tf.data.Dataset:
  """This host's rows of every global batch, the same whatever the number of hosts.

  The training stream is `data_shards` streams (`train_dataset` over shard k of the split),
  each giving `global_batch // data_shards` consecutive rows of every global batch. Host p
  of P reads only its shards, p * S/P ... (p + 1) * S/P - 1, and concatenates their rows. So
  two hosts reading one shard each feed the step exactly the batches that one host reading
  both would, and a run resumes at `step` on any number of hosts that divides S.
  """
  check_data_shards(data_shards, global_batch, process_count)
  per_host = data_shards // process_count
  rows = global_batch // data_shards
  shards = [
    train_dataset(
      source,
      split,
      local_batch=rows,
      pp=pp,
      seed=seed,
      position=step * rows,
      shuffle_buffer=shuffle_buffer,
      process_index=k,
      process_count=data_shards,
      prefetch=prefetch,
    )
    for k in range(process_index * per_host, (process_index + 1) * per_host)
  ]
  if per_host == 1:
    return shards[0]

  def concat(*batches):
    return {key: tf.concat([b[key] for b in batches], axis=0) for key in batches[0]}

  ds = tf.data.Dataset.zip(tuple(shards)).map(concat).prefetch(prefetch)
  return ds.with_options(_options())


def num_eval_batches(source: Source, split: str, local_batch: int, process_count: int = 1) -> int:
  """Batches per evaluation pass; the same on every host (the largest share, rounded up)."""
  total = source.num_examples(split, 0, 1)
  return max(1, math.ceil(per_host_max(total, process_count) / local_batch))


def eval_dataset(
  source: Source,
  split: str,
  *,
  local_batch: int,
  pp: Preprocessing,
  process_index: int = 0,
  process_count: int = 1,
  prefetch: int = 2,
) -> tf.data.Dataset:
  """One pass of `{'image', 'label', 'mask'}` batches; padding examples have mask 0.

  Any other field of the source's records (ImageNet ReaL's label sets, a subset's example
  index) comes along unchanged, as zeros in the padding.
  """
  records = source.records(split, process_index, process_count)
  extras = {k: v for k, v in records.element_spec.items() if k not in ('image', 'label')}

  @_graph_fn
  def process(record):
    return {
      'image': preprocess.eval_image(source.decode(record['image']), pp.crop),
      'label': tf.cast(record['label'], tf.int32),
      'mask': tf.constant(1, tf.int32),
      **{k: record[k] for k in extras},
    }

  padding = tf.data.Dataset.from_tensors(
    {
      'image': tf.zeros([pp.crop, pp.crop, 3], tf.float32),
      'label': tf.constant(0, tf.int32),
      'mask': tf.constant(0, tf.int32),
      **{k: tf.zeros(v.shape, v.dtype) for k, v in extras.items()},
    }
  ).repeat()
  batches = num_eval_batches(source, split, local_batch, process_count)
  ds = records.map(process, num_parallel_calls=tf.data.AUTOTUNE).concatenate(padding)
  ds = ds.batch(local_batch, drop_remainder=True).take(batches).prefetch(prefetch)
  return ds.with_options(_options())

"""Per-host input pipelines: a training stream that starts at any position at no extra cost,
and an exact, padded evaluation pass.

Training. The stream of a shard k (the training split is read as `data_shards` shards, see
`host_train_dataset`) holding n records is a pure function of the position i: it is record
`index_shuffle(i mod n)` of the permutation keyed by (seed, k, epoch i div n), a new full
permutation each epoch computed per example (`tf.random.experimental.index_shuffle`: nothing
is materialised), augmented with the seed (seed, k, i). A checkpoint stores the position, and
a run resumed at position p reads from p on: the work before its first batch is the same at
any position. A source that can only be read in order (a tfds dataset stored as TFRecord)
falls back to a buffer shuffle seeded by (seed, epoch), and a resumed run then skips the
records before p in its epoch (a warning says so).

Evaluation: this host's share once, in order, padded with masked (mask = 0) examples to a
whole number of batches that is the same on every host, so every example counts once.

Unreadable examples (a truncated or corrupt image, an empty file, a file that is no image)
never stop the stream. The examples of a batch are decoded as groups (`group_size`); an
example that fails is flagged in its row (`bad` = 1, `name` = which file or record) and, in
training, replaced by a copy of another example of its group, so batches keep their size and
the stream its positions: a resumed run replaces the same examples. In evaluation the row
is masked out. Whether a flagged example is skipped or is an error is the caller's choice
(`BadExamples`, and the trainer's `skip_bad_images`).

Threads: `data.input_threads` workers (0: the cores this process may use) each decode one
group at a time, so that many groups are in flight; examples and batches come out in order.

Every option comes from the run spec's data section (`Data`, vit_jax/data/spec.py), which
each builder takes whole; the defaults are there.
"""

import dataclasses
import functools
import math
import re
import sys
from collections.abc import Callable, Iterator

import numpy as np
import tensorflow as tf

from vit_jax.data import captions, default_threads, packing, preprocess
from vit_jax.data.sources import Reader, Records, Source, per_host_max
from vit_jax.data.spec import Data, Pp
from vit_jax.families.preprocessing import PATCHES, Preprocessing
from vit_jax.text import Tokenizer

_FOREVER = 2**62
# The largest group of examples decoded together (it bounds the memory of the groups in flight).
_MAX_GROUP = 128
# The mapped functions are plain graph code: no autograph conversion (it writes temporary files).
_graph_fn = tf.autograph.experimental.do_not_convert


def _threads(data: Data) -> int:
  """The pipeline's threads: `data.input_threads`, 0 meaning every core this process may use."""
  return data.input_threads or default_threads()


def _options(threads: int) -> tf.data.Options:
  options = tf.data.Options()
  options.deterministic = True
  options.threading.private_threadpool_size = threads
  options.threading.max_intra_op_parallelism = 1  # an op on one core: `threads` cores in all
  options.autotune.cpu_budget = threads
  return options


def group_size(rows: int) -> int:
  """Examples decoded together, by one worker: a batch of `rows`, or the largest divisor of
  `rows` up to 128 (a group is copied once more into its batch then)."""
  if rows <= _MAX_GROUP:
    return rows
  return max(d for d in range(1, _MAX_GROUP + 1) if rows % d == 0)


# ----------------------------------------------------------------------------------------
# Groups: raw records -> examples, unreadable ones flagged.
# ----------------------------------------------------------------------------------------


def _decoded(raw: Records, first_position: tf.Tensor, process: Callable, size: int):
  """One element: the group's readable examples, stacked, each with its `slot` (row)."""
  rows = tf.shape(raw['name'], out_type=tf.int64)[0]

  @_graph_fn
  def one(slot, record):
    return {**process(first_position + slot, record), 'slot': slot}

  good = tf.data.Dataset.from_tensor_slices((tf.range(rows), raw)).map(one).ignore_errors()
  empty = tf.nest.map_structure(lambda s: tf.zeros([0, *s.shape], s.dtype), good.element_spec)
  return good.batch(size).concatenate(tf.data.Dataset.from_tensors(empty)).take(1)


def _slots(good: Records, size: int) -> tuple[tf.Tensor, tf.Tensor]:
  """(readable: bool per slot, the row of `good` holding each readable slot)."""
  slots = tf.cast(good['slot'][:, None], tf.int32)
  count = tf.shape(slots, out_type=tf.int64)[0]
  readable = tf.scatter_nd(slots, tf.ones([count], tf.int32), [size]) > 0
  return readable, tf.scatter_nd(slots, tf.range(count), [size])


def _flags(readable: tf.Tensor, names: tf.Tensor, size: int) -> Records:
  rows = tf.shape(names)[0]
  bad = tf.logical_and(tf.logical_not(readable), tf.range(size) < rows)
  names = tf.pad(names, [[0, size - rows]], constant_values='')
  return {'bad': tf.cast(bad, tf.int32), 'name': tf.where(bad, names, '')}


def _replace_unreadable(good: Records, names: tf.Tensor, size: int) -> Records:
  """Training: an unreadable slot gets a copy of a readable example of the group (the j-th
  unreadable one the (j mod count)-th readable one)."""
  count = tf.shape(good['slot'], out_type=tf.int64)[0]
  message = tf.strings.join(
    [f'all {size} examples decoded together are unreadable (the first: ', names[0], ')']
  )
  with tf.control_dependencies([tf.debugging.Assert(count > 0, [message])]):
    readable, row = _slots(good, size)
  missing = tf.cumsum(tf.cast(tf.logical_not(readable), tf.int64)) - 1
  rows = tf.where(readable, row, missing % tf.maximum(count, 1))
  keys = [k for k in good if k != 'slot']  # 'image', 'label' (and 'text')
  out = tf.cond(
    count == size,
    lambda: {k: good[k] for k in keys},
    lambda: {k: tf.gather(good[k], rows) for k in keys},
  )
  return {**out, **_flags(readable, names, size)}


def _mask_unreadable(good: Records, names: tf.Tensor, size: int) -> Records:
  """Evaluation: unreadable slots and the slots past the records are zeros with mask 0."""
  readable, _ = _slots(good, size)
  slots = tf.cast(good['slot'][:, None], tf.int32)
  keys = [k for k in good if k != 'slot']  # 'image', 'label' and any further fields
  out = tf.cond(
    tf.shape(slots)[0] == size,
    lambda: {k: good[k] for k in keys},
    lambda: {k: tf.scatter_nd(slots, good[k], [size, *good[k].shape[1:]]) for k in keys},
  )
  return {**out, 'mask': tf.cast(readable, tf.int32), **_flags(readable, names, size)}


def _merge_groups(batch: Records) -> Records:
  """[groups, size, ...] -> [groups * size, ...]."""
  return {k: tf.reshape(v, [-1, *v.shape[2:]]) for k, v in batch.items()}


def _batches(groups, to_batch: Callable, rows: int, size: int, threads: int, then=None):
  """Groups decoded by `threads` workers, in order (followed by the groups `then`), as
  batches of `rows`."""
  ds = groups.interleave(
    to_batch, cycle_length=threads, num_parallel_calls=threads, deterministic=True
  )
  if then is not None:
    ds = ds.concatenate(then)
  if size < rows:
    ds = ds.batch(rows // size).map(_merge_groups)
  return ds


# ----------------------------------------------------------------------------------------
# Training.
# ----------------------------------------------------------------------------------------


def _sequences(pp: Pp, images: Preprocessing | None) -> Preprocessing | None:
  """The model's spec where it takes patch sequences (their patch size is the model's, their
  number `pp.max_patches` or its own), else None: `pp.crop` squares."""
  spec = images or preprocess.of_pp(pp)  # without the model's: squares (or a ValueError)
  return spec if spec.kind == PATCHES else None


def _train_example(
  source: Source,
  pp: Pp,
  host_seed: tf.Tensor,
  tokenizer: Tokenizer | None,
  images: Preprocessing | None,
) -> Callable:
  """(position, raw record) -> {'image', 'label'} (and with a `tokenizer`, 'text': the tokens
  of a caption drawn from the example's captions), augmented with the position's seed; the
  model's `images` spec where it takes patch sequences."""
  sequences = _sequences(pp, images)
  whole = source.holds_pixels or pp.subpixel or not pp.decode_window or sequences is not None
  if tokenizer is not None:
    captions.check_captioned(source)

  def process(position, raw):
    example = source.example(raw)
    seed = tf.random.experimental.stateless_fold_in(host_seed, position)
    if sequences is not None:
      decoded = source.decode(example['image'])
      image = preprocess.train_patch_sequence(decoded, seed, pp, sequences)
    elif whole:
      image = preprocess.train_image(source.decode(example['image']), seed, pp)
    else:
      image = preprocess.train_image_from_bytes(
        source.encoded(example['image']), seed, pp, source.adjust
      )
    out = {'image': image, 'label': tf.cast(example['label'], tf.int32)}
    if tokenizer is not None:
      out['text'] = tokenizer.preprocess_tf(captions.draw(example['texts'], seed))
    return out

  return process


def _random_access_groups(reader: Reader, first: int, size: int, seed: int, shard: int):
  """(g, raw records of group g) from group `first` on: positions g * size ... + size - 1."""
  n = reader.size

  @_graph_fn
  def fetch(g):
    positions = g * size + tf.range(size, dtype=tf.int64)
    epochs, offsets = positions // n, positions % n
    key = tf.constant([seed, shard], tf.int64)
    keys = tf.concat([tf.tile(key[None], [size, 1]), epochs[:, None]], 1)
    indices = tf.raw_ops.RandomIndexShuffle(
      index=offsets, seed=keys, max_index=tf.constant(n - 1, tf.int64), rounds=4
    )
    return g, reader.fetch(indices)

  return tf.data.Dataset.range(first, _FOREVER).map(fetch)


def _in_order_groups(
  source: Source, split: str, first: int, size: int, seed: int, shard: int, shards: int, buffer
):
  """The same from a source read in order: epoch e shuffled by a buffer seeded (seed, e)."""
  records = source.records(split, shard, shards)
  n = source.num_examples(split, shard, shards)
  first_epoch, offset = divmod(first * size, n)

  @_graph_fn
  def epoch(e):
    epoch_seed = tf.cast(seed, tf.int64) * 1_000_003 + tf.cast(e, tf.int64)
    return records.shuffle(buffer, seed=epoch_seed, reshuffle_each_iteration=False)

  stream = tf.data.Dataset.range(first_epoch, _FOREVER).flat_map(epoch).skip(offset)
  groups = tf.data.Dataset.range(first, _FOREVER)
  return tf.data.Dataset.zip(groups, stream.batch(size, drop_remainder=True))


_warned: set[tuple[str, str]] = set()


def _warn_in_order(source: Source, split: str) -> None:
  if (source.name, split) not in _warned:
    _warned.add((source.name, split))
    print(f'Warning: {source.in_order_cost(split)}.', file=sys.stderr, flush=True)


def train_dataset(
  source: Source,
  split: str,
  data: Data,
  *,
  local_batch: int,
  seed: int,
  position: int = 0,
  process_index: int = 0,
  process_count: int = 1,
  tokenizer: Tokenizer | None = None,
  preprocessing: Preprocessing | None = None,
) -> tf.data.Dataset:
  """Endless batches `{'image': f32 (B, crop, crop, 3) in [-1, 1] (a model of patch
  sequences, its `preprocessing` spec says: (B, max_patches, patch_size ** 2 * 3 + 3) packed
  sequences), 'label': int32 (B,), 'bad': int32 (B,), 'name': string (B,)}` of shard
  `process_index` of `process_count`, augmented as `data.pp` says, by `data.input_threads`
  threads; with a `tokenizer` (of an image-text task), also `'text': int32 (B, max_len)`, a
  caption of each image.

  With `data.pp.pack_tokens` (NaViT's Patch n' Pack, vit_jax/data/packing.py) a batch is B
  packed rows of the C = B * `pp.pack_read` images read: 'image' (B, pack_tokens, P + 3),
  'label' (B, K) and 'text' (B, K, max_len) per slot, 'slots' (B, K), and per image read
  'bad', 'name' and 'dropped' (C,), 1 for an image that no row holds.

  `position` counts the examples this shard has already read (step x `images_per_batch`);
  the dataset yields exactly what an uninterrupted stream would from there on. `bad` flags
  the rows that replace an unreadable example, named in `name` ('' elsewhere).
  `data.shuffle_buffer` applies to sources read in order only.
  """
  n = source.num_examples(split, process_index, process_count)
  if n == 0:
    raise ValueError(f'Split {split!r} of {source.name!r} is empty on host {process_index}.')
  images = images_per_batch(data.pp, local_batch)
  if position % images:
    raise ValueError(f'position={position} is not a multiple of the {images} images a batch reads.')
  if data.pp.pack_tokens:
    _check_packing(data.pp, preprocessing)
  threads = _threads(data)
  size = group_size(images)
  first = position // size
  reader = source.reader(split, process_index, process_count)
  if reader is not None:
    groups = _random_access_groups(reader, first, size, seed, process_index)
  else:
    _warn_in_order(source, split)
    buffer = max(1, min(data.shuffle_buffer, n))
    groups = _in_order_groups(
      source, split, first, size, seed, process_index, process_count, buffer
    )
  host_seed = tf.random.experimental.stateless_fold_in(
    tf.constant([seed, 0], tf.int64), process_index
  )
  process = _train_example(source, data.pp, host_seed, tokenizer, preprocessing)

  @_graph_fn
  def to_batch(g, raw):
    decoded = _decoded(raw, g * size, process, size)
    return decoded.map(lambda good: _replace_unreadable(good, raw['name'], size))

  ds = _batches(groups, to_batch, images, size, threads)
  if data.pp.pack_tokens:
    ds = _packed_rows(ds, data.pp, local_batch, threads)
  return ds.prefetch(data.prefetch).with_options(_options(threads))


def _packed_rows(ds: tf.data.Dataset, pp: Pp, rows: int, threads: int) -> tf.data.Dataset:
  """Each batch of `ds` (a chunk of images) as `rows` packed rows (`packing.pack_batch`)."""
  pack = functools.partial(
    packing.pack_batch, tokens=pp.pack_tokens, max_images=pp.pack_images, rows=rows
  )
  return ds.map(_graph_fn(pack), num_parallel_calls=threads)


def images_per_batch(pp: Pp, rows: int) -> int:
  """The examples a batch of `rows` reads: `rows`, or `rows * pp.pack_read` packed."""
  return rows * pp.pack_read if pp.pack_tokens else rows


def _check_packing(pp: Pp, images: Preprocessing | None) -> None:
  """Packing takes patch sequences that fit a row: one-line ValueErrors."""
  sequences = _sequences(pp, images)
  if sequences is None:
    raise ValueError(
      f'config.pp.pack_tokens={pp.pack_tokens} packs patch sequences: train a model that '
      'takes them (a NaFlex model), or set config.pp.pack_tokens=0.'
    )
  longest = preprocess.train_sequences(pp, sequences).max_patches
  if longest > pp.pack_tokens:
    raise ValueError(
      f'config.pp.pack_tokens={pp.pack_tokens} is shorter than an image of {longest} patches: '
      f'use at least {longest}.'
    )


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
  data: Data,
  *,
  data_shards: int,
  seed: int,
  step: int = 0,
  process_index: int = 0,
  process_count: int = 1,
  tokenizer: Tokenizer | None = None,
  preprocessing: Preprocessing | None = None,
) -> tf.data.Dataset:
  """This host's rows of every global batch (`data.batch` rows of split `data.pp.train`),
  the same whatever the number of hosts; `preprocessing` the model's (`train_dataset`).

  The training stream is `data_shards` streams (`train_dataset` over shard k of the split),
  each giving `data.batch // data_shards` consecutive rows of every global batch. Host p
  of P reads only its shards, p * S/P ... (p + 1) * S/P - 1, and concatenates their rows. So
  two hosts reading one shard each feed the step exactly the batches that one host reading
  both would, and a run resumes at `step` on any number of hosts that divides S: each shard
  from position step x `images_per_batch` (its rows, or its rows x `pp.pack_read` packed).
  The host's `data.input_threads` are shared by its shards.
  """
  check_data_shards(data_shards, data.batch, process_count)
  per_host = data_shards // process_count
  rows = data.batch // data_shards
  threads = _threads(data)
  shard_data = dataclasses.replace(data, input_threads=max(1, math.ceil(threads / per_host)))
  shards = [
    train_dataset(
      source,
      data.pp.train,
      shard_data,
      local_batch=rows,
      seed=seed,
      position=step * images_per_batch(data.pp, rows),
      process_index=k,
      process_count=data_shards,
      tokenizer=tokenizer,
      preprocessing=preprocessing,
    )
    for k in range(process_index * per_host, (process_index + 1) * per_host)
  ]
  if per_host == 1:
    return shards[0]

  def concat(*batches):
    return {key: tf.concat([b[key] for b in batches], axis=0) for key in batches[0]}

  ds = tf.data.Dataset.zip(tuple(shards)).map(concat).prefetch(data.prefetch)
  return ds.with_options(_options(threads))


# ----------------------------------------------------------------------------------------
# Evaluation.
# ----------------------------------------------------------------------------------------


def num_eval_batches(source: Source, split: str, local_batch: int, process_count: int = 1) -> int:
  """Batches per evaluation pass; the same on every host (the largest share, rounded up)."""
  total = source.num_examples(split, 0, 1)
  return max(1, math.ceil(per_host_max(total, process_count) / local_batch))


def eval_dataset(
  source: Source,
  split: str,
  data: Data,
  *,
  local_batch: int,
  process_index: int = 0,
  process_count: int = 1,
  preprocessing: Preprocessing | None = None,
) -> tf.data.Dataset:
  """One pass of `{'image', 'label', 'mask', 'bad', 'name'}` batches, each image prepared by
  the model's `preprocessing` (None: as `data.pp` alone implies, `preprocess.of_pp`), by
  `data.input_threads` threads; padding and unreadable examples have mask 0, the unreadable
  ones `bad` = 1 and their `name`.

  Any other field of the source's examples (ImageNet ReaL's label sets, a subset's example
  index) comes along unchanged, as zeros where the mask is 0.
  """
  threads = _threads(data)
  size = group_size(local_batch)
  images = preprocessing or preprocess.of_pp(data.pp)

  @_graph_fn
  def process(_, raw):
    example = source.example(raw)
    image = preprocess.input_op(images, source.decode(example['image']))
    return {**example, 'image': image, 'label': tf.cast(example['label'], tf.int32)}

  @_graph_fn
  def to_batch(raw):
    decoded = _decoded(raw, tf.constant(0, tf.int64), process, size)
    return decoded.map(lambda good: _mask_unreadable(good, raw['name'], size))

  groups = source.chunks(split, size, process_index, process_count)
  spec = groups.flat_map(to_batch).element_spec  # the fields a batch of this source holds

  @_graph_fn
  def padding(_):
    zeros = {k: tf.zeros([size, *s.shape[1:]], s.dtype) for k, s in spec.items()}
    return {**zeros, 'name': tf.fill([size], '')}

  then = tf.data.Dataset.range(_FOREVER).map(padding)
  ds = _batches(groups, to_batch, local_batch, size, threads, then=then)
  batches = num_eval_batches(source, split, local_batch, process_count)
  return ds.take(batches).prefetch(data.prefetch).with_options(_options(threads))


# ----------------------------------------------------------------------------------------
# On the host: the names of unreadable examples.
# ----------------------------------------------------------------------------------------


def host_batches(ds: tf.data.Dataset) -> Iterator[dict[str, np.ndarray]]:
  """The batches of `ds` as numpy arrays; the pipeline's errors (e.g. a group of examples
  none of which can be read) as one-line ValueErrors."""
  try:
    yield from ds.as_numpy_iterator()
  except tf.errors.OpError as e:
    raise ValueError(f'Input pipeline: {_reason(e)}') from e


def _reason(error: tf.errors.OpError) -> str:
  """A TensorFlow error's first line without the names of graph nodes and functions."""
  line = next((x.strip() for x in error.message.splitlines() if x.strip()), repr(error))
  if 'assertion failed: [' in line:  # ours (tf.debugging.Assert): the message alone
    return line.split('assertion failed: [', 1)[1].removesuffix(']')
  return re.sub(r'\{\{[^}]*\}\}\s*', '', line)


class BadExamples:
  """The unreadable examples this process has met: a warning names each one the first time.

  `take(batch)` removes the batch's `name` strings (the rest goes to the devices) and warns.
  """

  def __init__(self, what: str):
    self.what = what
    self.names: list[str] = []
    self._seen: set[str] = set()

  def take(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = batch.pop('name')
    for name in names[batch['bad'] > 0]:
      name = name.decode()
      if name not in self._seen:
        self._seen.add(name)
        self.names.append(name)
        print(f'Warning: unreadable {self.what} image {name}', file=sys.stderr, flush=True)
    return batch

  def first(self) -> str:
    """The first name met here, or where to look for it."""
    return self.names[0] if self.names else 'read by another process: see its warnings'

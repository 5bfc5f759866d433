"""NaViT's Patch n' Pack on the data side: several NaFlex images in one row of tokens.

  plan(lengths, tokens, max_images, rows)    where each image goes: (row, offset, slot)
  pack_rows(sequences, tokens, max_images, rows, **fields)   the packed rows, numpy (the host)
  pack_batch(batch, tokens, max_images, rows)   the same in tf.data (the training stream)
  drop_tokens(sequence, rate, seed)          NaViT's token dropping, one image, in tf
  navit_lengths, padding_of_stream           the padding measurement of docs/naflex-packing.md

A packed row keeps the layout of one image's sequence (vit_jax/data/naflex.py `pack`): T slots
of (P + 3) floats, each a patch's values, then ptype, yidx, xidx. The ptype column becomes
the SEGMENT id: 0 padding, k + 1 for a token of the image in slot k (0 ... K - 1) of its row;
yidx and xidx stay the patch's row and column in its own image's grid. One image per row with
K = 1 is today's unpacked row, bit for bit. The images of a row lie one after another from its
first token, in the order they were placed, and fill its slots 0, 1, ... without a gap.

The plan is greedy first-fit decreasing: the longest image first (ties in stream order), each
into the first row with room for its tokens and a free slot, a new row where none has. For a
fixed number of rows R, the R fullest rows are kept and the images of the others left out
(`dropped`): so R rows hold any chunk, and they are a function of the chunk alone (the stream
stays index-addressed). Keeping the fullest rows, not filling R rows first-fit, is what brings
the padding down: first-fit into R rows fills them with the longest images, whatever room
they leave (docs/naflex-packing.md).
"""

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from vit_jax.data import naflex

# The ptype (segment id) column of a sequence's (P + 3) values.
PTYPE = -3
# The fields of a chunk that stay one per image READ (not per slot): its unreadable images.
PER_IMAGE_READ = ('bad', 'name')
# NaViT's resolution sampling as the issue measures it: budgets of patches of 16 pixels.
NAVIT_BUDGETS = tuple(range(64, 257, 16))


class Plan(NamedTuple):
  """Per image: its row, its first token in the row, its slot (0 ... K - 1); -1 if left out."""

  row: np.ndarray
  offset: np.ndarray
  slot: np.ndarray


def plan(lengths, tokens: int, max_images: int, rows: int | None = None) -> Plan:
  """Images of `lengths` tokens into rows of `tokens` tokens and at most `max_images` images:
  greedy first-fit decreasing into as many rows as it takes (a ValueError for an image
  longer than a row where rows=None), then, given `rows`, the `rows` fullest of them kept
  (ties: the earlier), in their order; the images of the others are left out."""
  lengths = np.asarray(lengths, np.int64)
  used = np.zeros(len(lengths), np.int64)  # at most one row per image
  count = np.zeros(len(lengths), np.int64)
  out = Plan(*(np.full(len(lengths), -1, np.int32) for _ in range(3)))
  for i in np.argsort(-lengths, kind='stable'):
    fits = np.flatnonzero((used + lengths[i] <= tokens) & (count < max_images))
    if not fits.size:  # longer than a row
      if rows is None:
        raise ValueError(f'an image of {lengths[i]} patches fits no row of {tokens} tokens')
      continue
    r = fits[0]
    out.row[i], out.offset[i], out.slot[i] = r, used[r], count[r]
    used[r] += lengths[i]
    count[r] += 1
  if rows is None:
    return out
  kept = np.sort(np.argsort(-used, kind='stable')[:rows])
  renumbered = np.full(len(lengths) + 1, -1, np.int32)  # [-1]: an image left out already
  renumbered[kept] = np.arange(len(kept))
  placed = renumbered[out.row] >= 0
  return Plan(renumbered[out.row], *(np.where(placed, x, -1) for x in out[1:]))


def sequence_lengths(sequences):
  """The patches of each unpacked sequence (..., N, P + 3): its slots with ptype > 0."""
  if isinstance(sequences, tf.Tensor):
    return tf.reduce_sum(tf.cast(sequences[..., PTYPE] > 0, tf.int32), -1)
  return np.sum(np.asarray(sequences)[..., PTYPE] > 0, -1).astype(np.int32)


def pack_rows(
  sequences: np.ndarray, tokens: int, max_images: int, rows: int | None = None, **fields
) -> dict[str, np.ndarray]:
  """Unpacked sequences (C, N, P + 3) -> {'image': (R, T, P + 3) packed rows, 'slots': int32
  (R, K) 1 where a slot holds an image, 'dropped': int32 (C,) 1 for an image left out, and
  each of `fields` (C, ...) as (R, K, ...), its image's value in its slot, zeros elsewhere};
  rows=None: as many rows as `plan` takes, nothing left out."""
  sequences = np.asarray(sequences, np.float32)
  lengths = sequence_lengths(sequences)
  where = plan(lengths, tokens, max_images, rows)
  count = int(where.row.max(initial=-1)) + 1 if rows is None else rows
  image = np.zeros((count, tokens, sequences.shape[-1]), np.float32)
  slots = np.zeros((count, max_images), np.int32)
  fields = {k: np.asarray(v) for k, v in fields.items()}
  packed = {k: np.zeros((count, max_images, *v.shape[1:]), v.dtype) for k, v in fields.items()}
  for i in np.flatnonzero(where.row >= 0):
    r, o, s, n = where.row[i], where.offset[i], where.slot[i], lengths[i]
    image[r, o : o + n] = sequences[i, :n]
    image[r, o : o + n, PTYPE] = s + 1
    slots[r, s] = 1
    for k, v in fields.items():
      packed[k][r, s] = v[i]
  dropped = (where.row < 0).astype(np.int32)
  return {'image': image, 'slots': slots, 'dropped': dropped, **packed}


def pack_batch(batch: dict, tokens: int, max_images: int, rows: int) -> dict:
  """`pack_rows` in tf.data: a chunk {'image': (C, N, P + 3), 'label': (C,), ...} -> its
  `rows` packed rows; 'bad' and 'name' stay one per image read. The plan is `plan` itself
  (tf.numpy_function), the rows put together by scatters: the same arrays as `pack_rows`."""
  sequences = batch['image']
  lengths = sequence_lengths(sequences)

  def planned(lengths):
    return tuple(plan(lengths, tokens, max_images, rows))

  where = tf.numpy_function(planned, [lengths], [tf.int32] * 3, stateful=False)
  row, offset, slot = (tf.ensure_shape(x, lengths.shape) for x in where)
  placed = row >= 0
  # Token j of image i goes to (row_i, offset_i + j) if the image is placed and j < length_i.
  j = tf.range(sequences.shape[1])
  valid = placed[:, None] & (j[None] < lengths[:, None])
  at = tf.stack([tf.broadcast_to(row[:, None], tf.shape(valid)), offset[:, None] + j[None]], -1)
  segment_id = tf.cast(slot + 1, tf.float32)[:, None, None]
  segment = tf.broadcast_to(segment_id, tf.shape(valid[..., None]))
  values = tf.concat([sequences[..., :PTYPE], segment, sequences[..., PTYPE + 1 :]], -1)
  shape = [rows, tokens, sequences.shape[-1]]
  image = tf.scatter_nd(tf.boolean_mask(at, valid), tf.boolean_mask(values, valid), shape)
  in_slot = tf.boolean_mask(tf.stack([row, slot], -1), placed)

  def to_slots(v):
    return tf.scatter_nd(in_slot, tf.boolean_mask(v, placed), [rows, max_images, *v.shape[1:]])

  out = {k: to_slots(v) for k, v in batch.items() if k not in ('image', *PER_IMAGE_READ)}
  out['slots'] = to_slots(tf.ones_like(row))
  dropped = tf.cast(tf.logical_not(placed), tf.int32)
  kept = {k: batch[k] for k in PER_IMAGE_READ if k in batch}
  return {'image': image, **out, **kept, 'dropped': dropped}


def drop_tokens(sequence: tf.Tensor, rate: tf.Tensor | float, seed: tf.Tensor) -> tf.Tensor:
  """NaViT's token dropping of one unpacked sequence (N, P + 3) of n patches: a random
  max(1, round(n * (1 - rate))) of them kept in their order, then padding. The last patch
  (the bottom-right one) is always kept, so the largest yidx and xidx, the image's grid
  extents, stay."""
  size = sequence.shape[0]
  n = sequence_lengths(sequence)
  kept_share = 1.0 - tf.cast(rate, tf.float64)
  keep = tf.maximum(1, tf.cast(tf.round(tf.cast(n, tf.float64) * kept_share), tf.int32))
  keys = tf.random.stateless_uniform([size], seed)
  keys = tf.where(tf.range(size) < n - 1, keys, 2.0)  # the last patch and padding: never drawn
  drawn = tf.argsort(keys, stable=True)[: keep - 1]
  kept = tf.sort(tf.concat([drawn, [n - 1]], 0))
  out = tf.pad(tf.gather(sequence, kept), [[0, size - keep], [0, 0]])
  return tf.ensure_shape(out, sequence.shape)


# ----------------------------------------------------------------------------------------
# The padding measurement (docs/naflex-packing.md).
# ----------------------------------------------------------------------------------------


def navit_lengths(
  count: int,
  seed: int = 0,
  budgets: tuple[int, ...] = NAVIT_BUDGETS,
  ratios: tuple[float, float] = (1 / 4, 4),
  patch: int = 16,
) -> np.ndarray:
  """Patches of `count` synthetic images under NaViT's resolution sampling: each a 512 x 512
  pixel area at an aspect ratio (width / height) log-uniform in `ratios`, resized by
  `naflex.sequence_size` to a budget drawn uniformly from `budgets`."""
  rng = np.random.default_rng(seed)
  budget = rng.choice(budgets, count)
  ratio = np.exp(rng.uniform(np.log(ratios[0]), np.log(ratios[1]), count))
  heights = np.maximum(1, np.round(512 / np.sqrt(ratio))).astype(int)
  widths = np.maximum(1, np.round(512 * np.sqrt(ratio))).astype(int)
  images = zip(heights, widths, budget, strict=True)
  sizes = [naflex.sequence_size(h, w, patch, b) for h, w, b in images]
  return np.array([h * w // patch**2 for h, w in sizes], np.int64)


class Padding(NamedTuple):
  """A packed stream's padding tokens / all tokens, images left out / images read, and the
  mean patches of an image kept (of one read: `navit_lengths`' mean)."""

  padding: float
  left_out: float
  kept_patches: float


def padding_of_stream(
  lengths: np.ndarray, tokens: int, max_images: int, rows: int, read: int
) -> Padding:
  """The `Padding` of a stream of images of `lengths` patches packed as the pipeline packs
  it: chunks of `rows * read` consecutive images into `rows` rows (whole chunks only)."""
  chunk = rows * read
  chunks = len(lengths) // chunk
  kept = []
  for c in range(chunks):
    part = np.asarray(lengths[c * chunk : (c + 1) * chunk])
    kept.append(part[plan(part, tokens, max_images, rows).row >= 0])
  kept = np.concatenate(kept)
  return Padding(
    padding=float(1 - kept.sum() / (chunks * rows * tokens)),
    left_out=float(1 - len(kept) / (chunks * chunk)),
    kept_patches=float(kept.mean()),
  )

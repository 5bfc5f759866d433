"""NaViT's Patch n' Pack on the data side (vit_jax/data/packing.py): the plan worked by hand and
its properties on random lengths, host rows == tf.data rows, token dropping, resolution
sampling, the padding on the issue's distribution, and the packed training stream: exact
resume, the packed batch equal to the unpacked images packed on the host, shards concatenated."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from vit_jax import data
from vit_jax.data import captions, packing, pipeline
from vit_jax.data import spec as data_spec
from vit_jax.families import preprocessing
from vit_jax.train import steps

# ----------------------------------------------------------------------------------------
# The plan.
# ----------------------------------------------------------------------------------------


def test_plan_is_first_fit_decreasing_worked_by_hand():
  """Lengths 3 5 2 5 4 1 into rows of 8 tokens, at most 3 images: 5 (image 1) opens row 0,
  5 (image 3, the tie after image 1) row 1, 4 row 2; 3 fills row 0 from token 5; 2 goes to
  row 1 at 5, and 1 to row 1 at 7 (row 0 is full). At most 2 images, 1 goes to row 2 at 4."""
  lengths = [3, 5, 2, 5, 4, 1]
  row, offset, slot = packing.plan(lengths, 8, 3)
  assert row.tolist() == [0, 0, 1, 1, 2, 1]
  assert offset.tolist() == [5, 0, 5, 0, 0, 7]
  assert slot.tolist() == [1, 0, 1, 0, 0, 2]
  row, offset, slot = packing.plan(lengths, 8, 2)
  assert row.tolist() == [0, 0, 1, 1, 2, 2]
  assert offset.tolist() == [5, 0, 5, 0, 0, 4]
  assert slot.tolist() == [1, 0, 1, 0, 0, 1]
  # Two rows: the fullest two (8 and 8 tokens) are kept, image 4 (row 2, 4 tokens) left out.
  row, offset, slot = packing.plan(lengths, 8, 3, rows=2)
  assert row.tolist() == [0, 0, 1, 1, -1, 1]
  assert offset.tolist() == [5, 0, 5, 0, -1, 7] and slot.tolist() == [1, 0, 1, 0, -1, 2]


def test_plan_keeps_the_fullest_rows_and_leaves_out_what_fits_none():
  """6 4 4 in rows of 8: 6 opens row 0, the 4s fill row 1; one row kept: row 1 (8 tokens,
  not the 6 that first-fit into one row would give), image 0 left out. An image longer than
  a row is left out, or with rows=None an error."""
  row, offset, slot = packing.plan([6, 4, 4], 8, 8, rows=1)
  assert row.tolist() == [-1, 0, 0] and offset.tolist() == [-1, 0, 4]
  assert slot.tolist() == [-1, 0, 1]
  assert packing.plan([9, 2], 8, 8, rows=1).row.tolist() == [-1, 0]
  with pytest.raises(ValueError, match='an image of 9 patches fits no row of 8 tokens'):
    packing.plan([9, 2], 8, 8)


def _check_plan(lengths, where, tokens, max_images, rows):
  """No two tokens in one place, every image within its row, at most `max_images` images a
  row in slots 0 ... n - 1, at most `rows` rows."""
  count = rows or len(lengths)
  occupied = np.zeros((count, tokens), int)
  images = [[] for _ in range(count)]
  for n, r, o, s in zip(lengths, *where, strict=True):
    if r < 0:
      assert o == s == -1
      continue
    assert o >= 0 and o + n <= tokens
    occupied[r, o : o + n] += 1
    images[r].append(s)
  assert occupied.max() <= 1
  for slots in images:
    assert sorted(slots) == list(range(len(slots))) and len(slots) <= max_images


@pytest.mark.parametrize('rows', [None, 3, 7])
def test_plan_properties_on_random_lengths(rows):
  rng = np.random.default_rng(rows or 0)
  for _ in range(20):
    lengths = rng.integers(1, 33, rng.integers(1, 25))
    where = packing.plan(lengths, 32, 4, rows)
    _check_plan(lengths, where, 32, 4, rows)
    if rows is None:
      assert (where.row >= 0).all()
    else:  # a row left empty or unused while an image that fits is left out: never
      used = np.bincount(where.row[where.row >= 0], minlength=rows)
      assert (where.row >= 0).all() or used.min() > 0


# ----------------------------------------------------------------------------------------
# Packed rows: the host's and tf.data's.
# ----------------------------------------------------------------------------------------


def _sequences(rng, lengths, width=16, values=5):
  """Unpacked sequences (C, width, values + 3) of `lengths` patches of random values and a
  3-column grid (ptype 1, yidx, xidx), zeros after."""
  out = np.zeros((len(lengths), width, values + 3), np.float32)
  for i, n in enumerate(lengths):
    out[i, :n, :values] = rng.standard_normal((n, values))
    out[i, :n, values:] = np.stack([np.ones(n), np.arange(n) // 3, np.arange(n) % 3], -1)
  return out


def test_packed_rows_hold_each_image_in_its_slot():
  """Each placed image's patches, yidx and xidx in its row from its offset, ptype its slot + 1;
  its label and text in its slot; every other token zeros."""
  rng = np.random.default_rng(1)
  lengths = [7, 16, 3, 9, 12, 5, 6, 16]
  seqs = _sequences(rng, lengths)
  labels, text = np.arange(10, 18, dtype=np.int32), rng.integers(1, 99, (8, 4)).astype(np.int32)
  out = packing.pack_rows(seqs, 24, 3, rows=3, label=labels, text=text)
  where = packing.plan(lengths, 24, 3, rows=3)
  assert out['image'].shape == (3, 24, 8) and out['label'].shape == (3, 3)
  assert out['text'].shape == (3, 3, 4) and out['slots'].shape == (3, 3)
  assert out['dropped'].tolist() == (where.row < 0).astype(int).tolist()
  filled = np.zeros((3, 24), bool)
  for i, (n, r, o, s) in enumerate(zip(lengths, *where, strict=True)):
    if r < 0:
      continue
    tokens = out['image'][r, o : o + n]
    np.testing.assert_array_equal(tokens[:, :5], seqs[i, :n, :5])
    np.testing.assert_array_equal(tokens[:, 6:], seqs[i, :n, 6:])
    assert (tokens[:, 5] == s + 1).all()
    assert out['label'][r, s] == 10 + i and (out['text'][r, s] == text[i]).all()
    filled[r, o : o + n] = True
  assert (out['image'][~filled] == 0).all()
  # 74 tokens in 3 rows of 24: rows of 16 + 7, 16 + 6, 12 + 9 + 3; the 5 opens a 4th, left out.
  assert out['dropped'].tolist() == [0, 0, 0, 0, 0, 1, 0, 0] and out['slots'].sum() == 7


def test_host_and_tf_data_pack_equal_rows():
  """pack_batch (tf.data) == pack_rows (numpy) exactly, on random chunks; 'bad' and 'name'
  pass through, one per image read."""
  rng = np.random.default_rng(2)
  for _ in range(5):
    lengths = rng.integers(1, 17, 12)
    seqs = _sequences(rng, lengths)
    label = rng.integers(0, 10, 12).astype(np.int32)
    text = rng.integers(0, 99, (12, 3)).astype(np.int32)
    bad = rng.integers(0, 2, 12).astype(np.int32)
    names = np.array([f'f{i}'.encode() for i in range(12)])
    batch = {'image': seqs, 'label': label, 'text': text, 'bad': bad, 'name': names}
    tf_out = packing.pack_batch({k: tf.constant(v) for k, v in batch.items()}, 32, 4, 4)
    host = packing.pack_rows(seqs, 32, 4, rows=4, label=label, text=text)
    assert set(tf_out) == {*host, 'bad', 'name'}
    for key, value in host.items():
      np.testing.assert_array_equal(tf_out[key].numpy(), value, err_msg=key)
    np.testing.assert_array_equal(tf_out['bad'].numpy(), bad)
    np.testing.assert_array_equal(tf_out['name'].numpy(), names)


# ----------------------------------------------------------------------------------------
# Token dropping and resolution sampling.
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
  ('grid', 'rate', 'kept'),
  [((3, 4), 0.5, 6), ((3, 4), 0.75, 3), ((1, 5), 0.5, 2), ((1, 3), 0.9, 1), ((4, 4), 0.0, 16)],
)
def test_token_dropping_keeps_the_bottom_right_patch_and_the_rounded_count(grid, rate, kept):
  """n patches keep max(1, round(n (1 - rate))) of them (5 x 0.5 = 2.5 rounds to even, 2), in
  their order, the last (bottom-right) always among them; the padding stays zeros."""
  rows, cols = grid
  n = rows * cols
  seq = _sequences(np.random.default_rng(0), [n], width=20)
  seq[0, :n, 5:] = np.stack([np.ones(n), np.arange(n) // cols, np.arange(n) % cols], -1)
  for s in range(4):
    out = packing.drop_tokens(tf.constant(seq[0]), rate, tf.constant([s, 1], tf.int64)).numpy()
    assert (out[kept:] == 0).all() and (out[:kept, 5] == 1).all()
    original = [int(np.flatnonzero((seq[0, :n] == row).all(-1))[0]) for row in out[:kept]]
    assert original == sorted(original) and original[-1] == n - 1
    assert out[:kept, 6].max() == rows - 1 and out[:kept, 7].max() == cols - 1


SPEC = preprocessing.patches(2, 16)  # the digits (8 x 8) as 2 x 2 patches: 4 x 4 at 16


def _stream(pp, rows, position=0, count=2, source=None, tokenizer=None, **kwargs):
  ds = data.train_dataset(
    source or data.DigitsSource(),
    'train',
    data.Data(pp=pp),
    local_batch=rows,
    seed=3,
    position=position,
    preprocessing=SPEC,
    tokenizer=tokenizer,
    **kwargs,
  )
  it = ds.as_numpy_iterator()
  return [next(it) for _ in range(count)]


def test_resolution_sampling_and_token_dropping_in_the_stream():
  """Budgets 4 and 16 give the 8 x 8 digits 2 x 2 or 4 x 4 patches (both drawn), padded to
  16; dropping half keeps 2 or 8 of them, each image's grid extents unchanged."""
  pp = data.Pp(pack_budgets=(4, 16))
  (batch,) = _stream(pp, 32, count=1)
  grids = batch['image'][..., -3:]
  lengths = (grids[..., 0] > 0).sum(-1)
  assert batch['image'].shape == (32, 16, 15) and set(lengths) == {4, 16}
  (dropped,) = _stream(dataclasses.replace(pp, token_drop=0.5), 32, count=1)
  np.testing.assert_array_equal((dropped['image'][..., -3] > 0).sum(-1), lengths // 2)
  extents = dropped['image'][..., -2:].max(1)
  np.testing.assert_array_equal(extents, np.where(lengths == 4, 1, 3)[:, None] * [1, 1])


# ----------------------------------------------------------------------------------------
# The padding on the distribution.
# ----------------------------------------------------------------------------------------


def test_packed_padding_on_navits_distribution_is_at_most_3_percent():
  """Budgets 64 ... 256 of 16-pixel patches, aspect ratios in [1/4, 4], rows of 256 tokens
  and at most 8 images, 32 rows a batch at the default pack_read: padding <= 3% (one image
  per row: 1 - mean length / 256, over a third)."""
  lengths = packing.navit_lengths(768, seed=1)
  assert lengths.min() >= 1 and lengths.max() <= 256
  alone = packing.padding_of_stream(lengths, 256, 1, 32, 1)
  assert alone.left_out == 0 and alone.padding == pytest.approx(1 - lengths.mean() / 256)
  assert alone.padding > 1 / 3
  packed = packing.padding_of_stream(lengths, 256, 8, 32, data.Pp().pack_read)
  assert packed.padding <= 0.03, packed


# ----------------------------------------------------------------------------------------
# The packed training stream.
# ----------------------------------------------------------------------------------------

PACKED = data.Pp(
  pack_tokens=16, pack_images=4, pack_read=3, pack_budgets=(4, 8, 16), token_drop=0.1,
  token_drop_max=0.5,
)  # fmt: skip


class Bytes:
  """A tokenizer: a caption's bytes, padded to 8."""

  def preprocess_tf(self, text):
    ids = tf.cast(tf.io.decode_raw(text, tf.uint8)[:8], tf.int32)
    return tf.ensure_shape(tf.pad(ids, [[0, 8 - tf.shape(ids)[0]]]), [8])


def test_the_packed_stream_resumes_equals_the_host_packing_and_concatenates_shards():
  """Shard 0 of 2 of captioned digits, 4 rows of 16 tokens reading 12 images a batch: the
  stream from position 12 (step 1) is the tail of the stream from 0; each batch is the same
  12 images read unpacked, packed on the host (captions (R, K, L) in their images' slots);
  host_train_dataset's batch at step 1 begins with it (its second shard's after)."""
  source = captions.ClassCaptions(data.DigitsSource(), ['digit {}'])
  kwargs = {'source': source, 'tokenizer': Bytes(), 'process_count': 2}
  full = _stream(PACKED, 4, count=3, **kwargs)
  resumed = _stream(PACKED, 4, position=12, **kwargs)
  for a, b in zip(resumed, full[1:], strict=True):
    assert a.keys() == b.keys() == {'image', 'label', 'text', 'slots', 'bad', 'name', 'dropped'}
    for key in a:
      np.testing.assert_array_equal(a[key], b[key], err_msg=key)
  unpacked = _stream(dataclasses.replace(PACKED, pack_tokens=0), 12, count=3, **kwargs)
  for packed, chunk in zip(full, unpacked, strict=True):
    host = packing.pack_rows(chunk['image'], 16, 4, 4, label=chunk['label'], text=chunk['text'])
    for key, value in host.items():
      np.testing.assert_array_equal(packed[key], value, err_msg=key)
    assert packed['bad'].shape == packed['name'].shape == (12,)
    occupied = packed['slots'] > 0
    digit = packed['text'][..., 6]  # 'digit N': byte 6 is N
    np.testing.assert_array_equal(digit[occupied] - ord('0'), packed['label'][occupied])
  assert sum(b['dropped'].sum() for b in full) > 0  # 12 images of 2 to 16 patches, 4 x 16
  whole = data.Data(pp=PACKED, batch=8)
  ds = pipeline.host_train_dataset(
    source, whole, data_shards=2, seed=3, step=1, tokenizer=Bytes(), preprocessing=SPEC
  )
  both = next(ds.as_numpy_iterator())
  for key, value in resumed[0].items():
    assert len(both[key]) == 2 * len(value)
    np.testing.assert_array_equal(both[key][: len(value)], value, err_msg=key)


def test_the_training_step_counts_images_unreadable_and_left_out():
  """bad_images and dropped_images: the sums of the batch's per-image flags; the task sees
  its own keys alone; an unpacked batch has no dropped_images."""
  seen = []

  def task_step(state, batch):
    seen.append(set(batch))
    return state, {'loss': 0.0}

  step = steps.counting_bad_examples(task_step, ('image', 'label', 'slots'))
  batch = {'image': np.zeros((2, 4, 7)), 'label': np.zeros((2, 3)), 'slots': np.ones((2, 3))}
  flags = {'bad': np.array([0, 1, 0, 1, 1, 0]), 'dropped': np.array([1, 0, 0, 0, 1, 0])}
  _, metrics = step(None, {**batch, **flags})
  assert (metrics['bad_images'], metrics['dropped_images']) == (3, 2)
  assert seen == [{'image', 'label', 'slots'}]
  _, metrics = step(None, {**batch, 'bad': flags['bad']})
  assert 'dropped_images' not in metrics


# ----------------------------------------------------------------------------------------
# Configuration.
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
  ('fields', 'message'),
  [
    ({'pack_tokens': 100, 'max_patches': 256}, 'pack_tokens=100; expected 0'),
    ({'pack_tokens': 200, 'pack_budgets': (64, 256)}, 'at least the patches of an image, 256'),
    ({'pack_images': 0}, 'pack_images=0; expected a positive'),
    ({'pack_read': 0}, 'pack_read=0; expected a positive'),
    ({'pack_budgets': (64, 0)}, 'expected positive patch counts'),
    ({'token_drop': 1.0}, 'fractions in'),
    ({'token_drop': 0.5, 'token_drop_max': 0.25}, 'token_drop_max=0.25 is below'),
  ],
)
def test_packing_options_are_checked(fields, message):
  with pytest.raises(ValueError, match=message):
    data_spec.check(data.Data(pp=data.Pp(**fields)))


def test_packing_takes_a_model_of_patch_sequences_that_fit_a_row():
  square = data.Data(pp=data.Pp(pack_tokens=64))
  with pytest.raises(ValueError, match='packs patch sequences: train a model that takes them'):
    data.train_dataset(data.DigitsSource(), 'train', square, local_batch=4, seed=0)
  short = data.Data(pp=data.Pp(pack_tokens=8))
  with pytest.raises(ValueError, match='shorter than an image of 16 patches'):
    data.train_dataset(data.DigitsSource(), 'train', short, local_batch=4, seed=0,
                       preprocessing=SPEC)  # fmt: skip


def test_a_stretched_image_keeps_its_area_at_aspect_ratios_within_the_range():
  """`preprocess.stretched` at aspect_range 2 on an 8 x 8 image over 40 seeds: the sides'
  ratio (width / height) lies in [1/2, 2] up to rounding a side, the area stays 64 pixels up
  to that rounding, both wider and taller images come out, and a constant image stays
  constant (a resize, no other change)."""
  from vit_jax.data import preprocess

  image = tf.fill([8, 8, 3], 100.0)
  sizes = []
  for s in range(40):
    out = preprocess.stretched(image, tf.constant([s, 1], tf.int64), 2.0).numpy()
    np.testing.assert_allclose(out, 100.0, atol=1e-3)
    h, w = out.shape[:2]
    assert (w + 0.5) / max(h - 0.5, 1) >= 1 / 2 and (w - 0.5) / (h + 0.5) <= 2, (h, w)
    assert abs(h * w - 64) <= 0.5 * (h + w) + 0.25, (h, w)
    sizes.append((h, w))
  assert any(w > h for h, w in sizes) and any(h > w for h, w in sizes)
  with pytest.raises(ValueError, match=r'aspect_range=0\.5'):
    data_spec.check(data_spec.Data(pp=data_spec.Pp(aspect_range=0.5)))

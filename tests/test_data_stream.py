"""The training stream of every source kind: exact resume at any position, unreadable images
skipped and counted, the thread count changing nothing, JPEG crops decoded alone."""

import dataclasses
import io
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from conftest import UNREADABLE, unreadable_files, write_image_folder
from PIL import Image

from vit_jax import data
from vit_jax.data import images, preprocess

PP = data.Pp(crop=8, area_min=0.5)
DATA = data.Data(pp=PP)


class TinyImages(tfds.core.GeneratorBasedBuilder):
  """30 train and 7 test JPEGs of 12x10 noise, labels i mod 3: a tfds dataset built here."""

  VERSION = tfds.core.Version('1.0.0')

  def _info(self):
    image = tfds.features.Image(shape=(None, None, 3), encoding_format='jpeg')
    features = {'image': image, 'label': tfds.features.ClassLabel(num_classes=3)}
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(features))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {'train': self._generate_examples(30), 'test': self._generate_examples(7)}

  def _generate_examples(self, n):
    rng = np.random.default_rng(n)
    for i in range(n):
      yield i, {'image': rng.integers(0, 255, (12, 10, 3), dtype=np.uint8), 'label': i % 3}


@pytest.fixture(scope='module')
def sources(tmp_path_factory):
  """One source of each kind, with its training split's size."""
  root = tmp_path_factory.mktemp('sources')
  out = {'digits': (data.DigitsSource(), 'train[:30]', 30)}  # the size is not the point
  out['folder'] = (data.get_source(write_image_folder(root / 'folder', {'train': 30})), 'train', 30)
  for file_format in ('array_record', 'tfrecord'):
    data_dir = str(root / file_format)
    TinyImages(data_dir=data_dir, file_format=file_format).download_and_prepare()
    out[file_format] = (data.get_source('tiny_images', data_dir), 'train[:26]', 26)
  return out


def _take(ds, n):
  it = ds.as_numpy_iterator()
  return [next(it) for _ in range(n)]


def _assert_batches_equal(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b, strict=True):
    assert x.keys() == y.keys()
    for key in x:
      np.testing.assert_array_equal(x[key], y[key], err_msg=key)


RANDAUG = dataclasses.replace(PP, randaug_layers=2, randaug_magnitude=10.0)


STREAMS = [
  ('digits', PP), ('folder', PP), ('array_record', PP), ('tfrecord', PP),
  ('digits', RANDAUG), ('array_record', RANDAUG),
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(('kind', 'pp'), STREAMS)
def test_resumed_stream_equals_the_uninterrupted_one(sources, kind, pp):
  """Batches of 4 resumed at position 8, at the batch that spans the end of the first epoch,
  at the batch after it and two batches later, equal the uninterrupted stream's (the next 3
  batches of each); with RandAugment too."""
  source, split, n = sources[kind]
  batch = 4
  spanning = n // batch * batch  # n is not a multiple of 4: this batch holds both epochs
  assert spanning < n < spanning + batch

  def stream(position, count):
    ds = data.train_dataset(
      source,
      split,
      local_batch=batch,
      data=data.Data(pp=pp, shuffle_buffer=8),
      seed=5,
      position=position,
    )
    return _take(ds, count)

  after = 3
  full = stream(0, spanning // batch + 3 + after)
  for position in (8, spanning, spanning + batch, spanning + 3 * batch):
    first = position // batch
    _assert_batches_equal(stream(position, after), full[first : first + after])
  assert all(b['bad'].sum() == 0 and set(b['name']) == {b''} for b in full)  # nothing flagged


@pytest.mark.parametrize('kind', ['digits', 'folder', 'array_record'])
def test_each_epoch_of_a_random_access_source_is_a_new_permutation(sources, kind):
  """Labels and images of an epoch are the split's, once each; the next epoch reorders them."""
  source, split, n = sources[kind]
  whole = data.Data(pp=data.Pp(crop=8, area_min=1.0, flip=False))  # area 1: the image, resized
  epochs = _take(data.train_dataset(source, split, local_batch=n, data=whole, seed=1), 2)
  evaluation = next(data.eval_dataset(source, split, local_batch=n, data=whole).as_numpy_iterator())
  for epoch in epochs:
    assert sorted(map(bytes, epoch['image'])) == sorted(map(bytes, evaluation['image']))
    assert sorted(epoch['label']) == sorted(evaluation['label'])
  assert not np.array_equal(epochs[0]['label'], epochs[1]['label'])


def test_a_source_read_in_order_warns_what_resuming_costs(sources, capsys):
  source, split, _ = sources['tfrecord']
  data.train_dataset(source, 'train[:13]', local_batch=4, data=DATA, seed=0)
  (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith('Warning:')]
  assert line.startswith("Warning: tfds 'tiny_images' is stored as tfrecord, which is read in")
  assert line.endswith('`tfds build tiny_images --file_format=array_record` makes resuming free.')
  assert sources['array_record'][0].reader(split) is not None
  assert source.reader(split) is None


def test_the_thread_count_changes_no_batch(sources):
  source, split, _ = sources['folder']
  a, b = (
    _take(data.train_dataset(source, split, local_batch=6, data=threads, seed=2), 6)
    for threads in (dataclasses.replace(DATA, input_threads=t) for t in (1, 2))
  )
  _assert_batches_equal(a, b)
  assert data.default_threads() == len(os.sched_getaffinity(0))


@pytest.fixture(scope='module')
def bad_folder(tmp_path_factory):
  """13 readable training images and 3 unreadable ones: 16 in all."""
  root = tmp_path_factory.mktemp('bad')
  write_image_folder(root, {'train': 13, 'test': 5}, unreadable_files())
  for name in UNREADABLE:  # TensorFlow cannot decode them
    assert images.decode_tensorflow((root / 'train' / 'a' / name).read_bytes()) is None
  return data.get_source(str(root))


def test_unreadable_images_are_replaced_flagged_and_named_the_same_way_on_resume(bad_folder):
  def stream(position, count):
    ds = data.train_dataset(bad_folder, 'train', DATA, local_batch=8, seed=0, position=position)
    return _take(ds, count)

  full = stream(0, 6)  # 48 examples: 3 epochs of 16
  for epoch in range(3):
    rows = full[2 * epoch : 2 * epoch + 2]
    names = sorted(os.path.basename(n.decode()) for b in rows for n in b['name'][b['bad'] > 0])
    assert names == sorted(UNREADABLE)
  for b in full:
    good = [bytes(x) for x in b['image'][b['bad'] == 0]]
    assert all(bytes(x) in good for x in b['image'][b['bad'] > 0])  # a copy of a readable one
  _assert_batches_equal(stream(24, 3), full[3:])


def test_unreadable_test_images_are_masked_and_named(tmp_path):
  root = write_image_folder(tmp_path, {'train': 3, 'test': 5}, unreadable_files(), bad_split='test')
  source = data.get_source(root)
  batches = list(data.eval_dataset(source, 'test', local_batch=6, data=DATA).as_numpy_iterator())
  assert len(batches) == 2  # 8 files in batches of 6
  assert sum(int(b['mask'].sum()) for b in batches) == 5
  assert sum(int(b['bad'].sum()) for b in batches) == 3
  names = [os.path.basename(n.decode()) for b in batches for n in b['name'][b['bad'] > 0]]
  assert sorted(names) == sorted(UNREADABLE)


def test_a_group_with_no_readable_image_is_a_one_line_error(tmp_path):
  root = write_image_folder(tmp_path, {'train': 0}, {f'{i}.jpg': b'' for i in range(4)})
  ds = data.train_dataset(data.get_source(root), 'train', local_batch=4, data=DATA, seed=0)
  with pytest.raises(ValueError, match=r'^Input pipeline: all 4 examples decoded together') as e:
    next(data.host_batches(ds))
  assert '\n' not in str(e.value) and str(e.value).endswith('.jpg)')


def test_bad_examples_warn_once_per_name(capsys):
  bad = data.BadExamples('training')
  batch = {'bad': np.array([0, 1, 1]), 'name': np.array([b'', b'x.jpg', b'y.jpg'], object)}
  out = bad.take(dict(batch))
  assert 'name' not in out and out['bad'].tolist() == [0, 1, 1]
  bad.take(dict(batch))
  err = capsys.readouterr().err.splitlines()
  assert err == [f'Warning: unreadable training image {n}.jpg' for n in 'xy']
  assert bad.first() == 'x.jpg'


@pytest.mark.parametrize(
  ('kwargs', 'exact'),
  [({}, False), ({'subsampling': 0}, True), ({'progressive': True}, False), ({'grey': True}, True)],
)
def test_jpeg_crop_decoded_alone_equals_the_crop_of_the_whole_image(kwargs, exact):
  """Away from the window's outermost rows and columns always; everywhere without chroma
  subsampling (4:4:4, grey)."""
  rng = np.random.default_rng(3)
  grey = kwargs.pop('grey', False)
  for i in range(12):
    h, w = rng.integers(40, 120, 2)
    pixels = rng.integers(0, 255, (h, w, 3), np.uint8)
    image = Image.fromarray(pixels).convert('L') if grey else Image.fromarray(pixels)
    buffer = io.BytesIO()
    image.save(buffer, 'JPEG', quality=90, **kwargs)
    encoded = tf.constant(buffer.getvalue())
    seed = tf.constant([i, 7], tf.int64)
    whole = preprocess.inception_crop(preprocess.decode(encoded), seed, (0.1, 1.0)).numpy()
    alone = preprocess.decode_and_inception_crop(encoded, seed, (0.1, 1.0)).numpy()
    assert whole.shape == alone.shape and whole.shape[-1] == 3
    inner = (slice(1, -1), slice(1, -1))
    np.testing.assert_array_equal(whole[inner], alone[inner])
    if exact:
      np.testing.assert_array_equal(whole, alone)


def test_randaugment_changes_the_training_images_and_keeps_their_range(sources):
  """The same positions with and without RandAugment(2, 10): the same labels, other pixels,
  still in [-1, 1] on the uint8 grid."""
  source, split, _ = sources['array_record']
  plain, augmented = (
    _take(data.train_dataset(source, split, local_batch=8, data=data.Data(pp=pp), seed=3), 2)
    for pp in (PP, RANDAUG)
  )
  for a, b in zip(plain, augmented, strict=True):
    np.testing.assert_array_equal(a['label'], b['label'])
    assert np.abs(a['image'] - b['image']).max() > 0.1
    pixels = b['image'] * 127.5 + 127.5
    np.testing.assert_allclose(pixels, np.round(pixels), atol=1e-4)
    assert pixels.min() >= -1e-4 and pixels.max() <= 255 + 1e-4

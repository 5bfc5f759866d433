"""Sources, preprocessing, the resumable training stream, the exact (padded, masked) eval pass."""

import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from PIL import Image

from vit_jax import data
from vit_jax.data import digits, preprocess

DATA = data.Data(pp=data.Pp(crop=16, area_min=0.5, flip=False))


def _batches(ds, n):
  it = ds.as_numpy_iterator()
  return [next(it) for _ in range(n)]


def test_digits_split_is_fixed_stratified_and_disjoint():
  x_train, y_train = digits.load('train')
  x_test, y_test = digits.load('test')
  assert x_train.shape == (1437, 8, 8, 3) and x_test.shape == (360, 8, 8, 3)
  assert x_train.dtype == np.uint8 and x_train.max() == 255 and x_train.min() == 0
  np.testing.assert_array_equal(x_train[..., 0], x_train[..., 2])  # grey copied to RGB
  per_class = np.bincount(np.concatenate([y_train, y_test]))
  assert np.all(np.abs(np.bincount(y_test) - 0.2 * per_class) < 1)  # stratified 80/20
  train_rows = {r.tobytes() for r in x_train[..., 0]}
  assert sum(r.tobytes() in train_rows for r in x_test[..., 0]) <= 5  # sklearn has a few duplicates
  again, _ = digits.load('test')
  np.testing.assert_array_equal(again, x_test)
  with pytest.raises(ValueError, match="Unknown digits split 'validation'"):
    digits.load('validation')


def test_digits_splits_join_like_tfds():
  """'train+test' is the 1,797 digits, train first; sliced parts join too; hosts share it."""
  source = data.DigitsSource()
  (x_train, y_train), (x_test, y_test) = digits.load('train'), digits.load('test')

  def read(split, index=0, count=1):
    reader = source.reader(split, index, count)
    records = reader.fetch(tf.range(reader.size, dtype=tf.int64))
    return records['image'].numpy(), records['label'].numpy()

  images, labels = read('train+test')
  assert source.num_examples('train+test') == len(labels) == 1437 + 360
  np.testing.assert_array_equal(images, np.concatenate([x_train, x_test]))
  np.testing.assert_array_equal(labels, np.concatenate([y_train, y_test]))
  images, labels = read('test[-5:] + train[:10%]')  # 5 + round(143.7)
  np.testing.assert_array_equal(images, np.concatenate([x_test[-5:], x_train[:144]]))
  np.testing.assert_array_equal(labels, np.concatenate([y_test[-5:], y_train[:144]]))
  odd = read('train+test', 1, 2)[1]  # the second of two hosts
  np.testing.assert_array_equal(odd, np.concatenate([y_train, y_test])[1::2])
  with pytest.raises(ValueError, match="Bad digits split 'train\\+'"):
    source.num_examples('train+')


def test_value_range_and_eval_resize():
  image = tf.constant(np.array([[[0, 255, 51]]], np.uint8))
  out = preprocess.eval_image(image, 2).numpy()
  assert out.shape == (2, 2, 3)
  np.testing.assert_allclose(out[0, 0], [-1.0, 1.0, (51 - 127.5) / 127.5], rtol=1e-6)


def test_inception_crop_area_is_within_range():
  image = tf.zeros((100, 100, 3), tf.uint8)
  areas = []
  for i in range(50):
    crop = preprocess.inception_crop(image, tf.constant([7, i], tf.int64), area_range=(0.3, 0.6))
    areas.append(crop.shape[0] * crop.shape[1] / 1e4)
  assert min(areas) >= 0.28 and max(areas) <= 0.62
  assert len(set(areas)) > 10  # really random across seeds


def test_subpixel_crop_of_the_whole_image_is_the_identity_and_crops_are_inside():
  image = tf.constant(np.arange(64, dtype=np.uint8).reshape(8, 8, 1).repeat(3, -1))
  whole = preprocess.subpixel_inception_crop(
    image, tf.constant([0, 1], tf.int64), 8, area_range=(1.0, 1.0), aspect_ratio_range=(1.0, 1.0)
  )
  np.testing.assert_allclose(whole.numpy(), image.numpy(), atol=1e-4)
  for i in range(20):
    crop = preprocess.subpixel_inception_crop(image, tf.constant([i, 2], tf.int64), 8, (0.25, 0.5))
    values = crop.numpy()[..., 0]
    assert values.min() >= 0 and values.max() <= 63
    # A box of at most half the area spans at most ~0.75 of the rows: not the whole range.
    assert values.max() - values.min() < 63


def test_train_stream_shapes_range_and_labels():
  batch = _batches(
    data.train_dataset(data.DigitsSource(), 'train', local_batch=32, data=DATA, seed=0), 1
  )[0]
  assert batch['image'].shape == (32, 16, 16, 3) and batch['image'].dtype == np.float32
  assert batch['label'].dtype == np.int32
  assert batch['image'].min() >= -1.0 and batch['image'].max() <= 1.0


def test_train_stream_resumes_exactly_from_a_position():
  source = data.DigitsSource()
  full = _batches(data.train_dataset(source, 'train', local_batch=100, data=DATA, seed=3), 20)
  # Position 1700 lies in the second epoch (1437 examples each): resume there.
  resumed = _batches(
    data.train_dataset(source, 'train', local_batch=100, data=DATA, seed=3, position=1700), 3
  )
  for a, b in zip(full[17:], resumed, strict=True):
    np.testing.assert_array_equal(a['image'], b['image'])
    np.testing.assert_array_equal(a['label'], b['label'])


def test_each_epoch_is_a_new_permutation_of_the_split():
  source = data.DigitsSource()
  whole = data.Data(pp=data.Pp(crop=8, area_min=1.0, flip=False))  # area 1: the image itself
  ds = data.train_dataset(source, 'train', local_batch=479, data=whole, seed=0)  # 3 x 479 = 1437
  batches = _batches(ds, 6)
  epoch0 = np.concatenate([b['label'] for b in batches[:3]])
  epoch1 = np.concatenate([b['label'] for b in batches[3:]])
  _, labels = digits.load('train')
  assert sorted(epoch0) == sorted(epoch1) == sorted(labels)
  assert not np.array_equal(epoch0, epoch1)
  images0 = np.concatenate([b['image'] for b in batches[:3]])
  expected = (digits.load('train')[0].astype(np.float32) - 127.5) / 127.5
  assert sorted(map(bytes, images0)) == sorted(map(bytes, expected))  # every image exactly once


def test_different_seeds_give_different_streams():
  source = data.DigitsSource()
  a = _batches(data.train_dataset(source, 'train', local_batch=16, data=DATA, seed=0), 1)[0]
  b = _batches(data.train_dataset(source, 'train', local_batch=16, data=DATA, seed=1), 1)[0]
  assert not np.array_equal(a['label'], b['label'])


def test_hosts_read_disjoint_shares():
  source = data.DigitsSource()
  shares = [source.num_examples('test', i, 3) for i in range(3)]
  assert shares == [120, 120, 120]
  firsts = [next(iter(source.records('test', i, 3)))['image'].numpy().tobytes() for i in range(3)]
  assert len(set(firsts)) == 3


def _write_folder(root, counts):
  """counts: {split: {class: n}}; image i of a class has red value 10 * i."""
  for split, classes in counts.items():
    for name, n in classes.items():
      os.makedirs(os.path.join(root, split, name))
      for i in range(n):
        pixels = np.full((6, 4, 3), 10 * i, np.uint8)
        Image.fromarray(pixels).save(os.path.join(root, split, name, f'{i:03d}.png'))


def test_eval_pass_pads_and_masks_the_last_batch(tmp_path):
  # 5 test images, batches of 2: 3 batches, the last one holding one padding example.
  _write_folder(tmp_path, {'train': {'a': 1, 'b': 1}, 'test': {'a': 2, 'b': 3}})
  source = data.get_source(str(tmp_path))
  assert source.num_classes == 2 and source.num_examples('test') == 5
  batches = list(
    data.eval_dataset(
      source, 'test', local_batch=2, data=data.Data(pp=data.Pp(crop=4))
    ).as_numpy_iterator()
  )
  assert [b['mask'].tolist() for b in batches] == [[1, 1], [1, 1], [1, 0]]
  assert [b['label'].tolist() for b in batches] == [[0, 0], [1, 1], [1, 0]]
  red = [np.round(b['image'][:, 0, 0, 0] * 127.5 + 127.5).tolist() for b in batches]
  assert red == [[0, 10], [0, 10], [20, 128]]  # the padding image is 0.0 (mid-grey)
  assert data.num_eval_batches(source, 'test', 2, process_count=2) == 2  # hosts: 3 and 2 -> 2 each


def test_folder_errors_are_one_line(tmp_path):
  with pytest.raises(ValueError, match='does not exist; expected'):
    data.get_source(str(tmp_path / 'missing'))
  (tmp_path / 'train').mkdir()
  with pytest.raises(ValueError, match='has no class folders'):
    data.get_source(str(tmp_path))


def test_unknown_dataset_name_suggests_close_ones():
  with pytest.raises(ValueError, match=r"Unknown dataset 'cifar1O'.*Did you mean: cifar10"):
    data.get_source('cifar1O')


@pytest.mark.parametrize(('name', 'classes'), [('cifar10', 10), ('imagenet2012', 1000)])
def test_tfds_source_under_mock_data(name, classes):
  with tfds.testing.mock_data(num_examples=12):
    source = data.get_source(name)
    assert source.num_classes == classes
    split = 'validation' if name == 'imagenet2012' else 'test'
    assert source.num_examples(split) == 12  # counted: mock_data leaves split sizes empty
    crop = data.Data(pp=data.Pp(crop=24))
    ds = data.train_dataset(source, split, local_batch=4, data=crop, seed=0)
    batch = _batches(ds, 4)[-1]  # past the end of the first 12-example epoch
    assert batch['image'].shape == (4, 24, 24, 3)
    evals = list(data.eval_dataset(source, split, local_batch=8, data=crop).as_numpy_iterator())
    assert [int(b['mask'].sum()) for b in evals] == [8, 4]

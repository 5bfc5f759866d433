"""NaFlex preprocessing (vit_jax/data/naflex.py): big_vision's `resize_to_sequence` sizes and
`patchify` layout."""

import numpy as np
import pytest
import tensorflow as tf

from vit_jax.data import naflex

# big_vision's ops_naflex_test.py: (image size, patch, max patches, the size it resizes to).
SIZES = [
  ((48, 48), 3, 121, (33, 33)),
  ((112, 109), 7, 225, (105, 105)),
  ((176, 176), 11, 64, (88, 88)),
  ((256, 64), 16, 12, (96, 32)),
  ((256, 64), 8, 15, (56, 16)),
  ((63, 241), 16, 16, (32, 128)),
  ((16, 512), 16, 16, (16, 256)),
]


@pytest.mark.parametrize('image_size, patch, max_len, expected', SIZES)
def test_resize_to_sequence_gives_big_visions_sizes(image_size, patch, max_len, expected):
  """The sizes of big_vision's op test, on the host and in a tf.data map."""
  assert naflex.sequence_size(*image_size, patch, max_len) == expected
  image = tf.cast(tf.random.uniform((*image_size, 3), 0, 255, tf.int32), tf.uint8)
  assert naflex.resize_to_sequence(image, patch, max_len).shape == (*expected, 3)
  ds = tf.data.Dataset.from_tensors(image).map(
    lambda x: naflex.resize_to_sequence(x, patch, max_len)
  )
  assert next(ds.as_numpy_iterator()).shape == (*expected, 3)


def test_patchify_rows_columns_channels_then_padding():
  """A 6 x 9 image in patches of 3: 2 x 3 patches, each flattened in (row, column, channel)
  order, row-major over the grid, then padding to 8 slots of type 0."""
  image = np.arange(6 * 9 * 3, dtype=np.float32).reshape(6, 9, 3)
  out = {k: v.numpy() for k, v in naflex.patchify(tf.constant(image), 3, 8).items()}
  assert out['patches'].shape == (8, 27)
  for i, (y, x) in enumerate((y, x) for y in range(2) for x in range(3)):
    np.testing.assert_array_equal(
      out['patches'][i], image[3 * y : 3 * y + 3, 3 * x : 3 * x + 3].ravel()
    )
  assert out['ptype'].tolist() == [1] * 6 + [0] * 2 and not out['patches'][6:].any()
  assert out['yidx'].tolist() == [0, 0, 0, 1, 1, 1, 0, 0]
  assert out['xidx'].tolist() == [0, 1, 2, 0, 1, 2, 0, 0]
  with pytest.raises(tf.errors.InvalidArgumentError, match='more than 5 patches'):
    naflex.patchify(tf.constant(image), 3, 5)

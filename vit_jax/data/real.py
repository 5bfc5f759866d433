"""ImageNet ReaL: the reassessed labels of the 50,000 ImageNet validation images.

tfds `imagenet2012_real` (split `validation`) holds each image with its original label and
`real_label`, the set of labels raters judged correct (empty for 3,163 images). Its records
here carry `real`, that set as a multi-hot int32 vector over the 1,000 classes: a prediction
counts as correct if it is in the set, and images with an empty set are left out of the
count, as the ReaL paper scores (Beyer et al. 2020, google-research/reassessed-imagenet).
"""

import tensorflow as tf
import tensorflow_datasets as tfds

from vit_jax.data.sources import TfdsSource

NAME = 'imagenet2012_real'
SPLIT = 'validation'


class RealSource(TfdsSource):
  """tfds imagenet2012_real: `label` is the original label, `real` the multi-hot ReaL set."""

  label_key = 'original_label'

  def __init__(self, data_dir: str | None = None):
    super().__init__(NAME, data_dir)

  def records(self, split: str, process_index: int = 0, process_count: int = 1) -> tf.data.Dataset:
    ds = self.builder.as_dataset(
      split=self._split(split, process_index, process_count),
      shuffle_files=False,
      decoders={'image': tfds.decode.SkipDecoding()},
    )
    num_classes = self.num_classes

    @tf.autograph.experimental.do_not_convert
    def with_real_set(record):
      hot = tf.one_hot(record['real_label'], num_classes, dtype=tf.int32)  # (n, classes)
      return {
        'image': record['image'],
        'label': record['original_label'],
        'real': tf.minimum(tf.reduce_sum(hot, axis=0), 1),
      }

    return ds.map(with_real_set)

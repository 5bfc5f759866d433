"""ImageNet ReaL: the reassessed labels of the 50,000 ImageNet validation images.

tfds `imagenet2012_real` (split `validation`) holds each image with its original label and
`real_label`, the set of labels raters judged correct (empty for 3,163 images). Its records
here carry `real`, that set as a multi-hot int32 vector over the 1,000 classes: a prediction
counts as correct if it is in the set, and images with an empty set are left out of the
count, as the ReaL paper scores (Beyer et al. 2020, google-research/reassessed-imagenet).
"""

import tensorflow as tf

from vit_jax.data.sources import TfdsSource

NAME = 'imagenet2012_real'
SPLIT = 'validation'


class RealSource(TfdsSource):
  """tfds imagenet2012_real: `label` is the original label, `real` the multi-hot ReaL set."""

  label_key = 'original_label'

  def __init__(self, data_dir: str | None = None):
    super().__init__(NAME, data_dir)

  def from_features(self, features):
    hot = tf.one_hot(features['real_label'], self.num_classes, dtype=tf.int32)  # (n, classes)
    return {
      'image': features['image'],
      'label': features[self.label_key],
      'real': tf.minimum(tf.reduce_sum(hot, axis=0), 1),
    }

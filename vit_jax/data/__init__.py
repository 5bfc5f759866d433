"""Input pipelines: tfds datasets, image folders and the bundled digits, per-host and resumable.

TensorFlow serves here as the host-side image pipeline only: its C++ start-up notices are off
unless asked for (TF_CPP_MIN_LOG_LEVEL), and so are its oneDNN rewrites, whose float results
vary with the machine (TF_ENABLE_ONEDNN_OPTS), so that training, evaluation and predict
preprocess an image to the same numbers.
"""

import contextlib
import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
os.environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '0')

from vit_jax.data.datasets import get_source
from vit_jax.data.pipeline import (
  BadExamples,
  Preprocessing,
  check_data_shards,
  default_threads,
  eval_dataset,
  host_batches,
  host_train_dataset,
  num_eval_batches,
  train_dataset,
)
from vit_jax.data.sources import (
  DigitsSource,
  FolderSource,
  Reader,
  Source,
  Subset,
  TfdsSource,
)

__all__ = [
  'BadExamples',
  'DigitsSource',
  'FolderSource',
  'Preprocessing',
  'Reader',
  'Source',
  'Subset',
  'TfdsSource',
  'check_data_shards',
  'default_threads',
  'eval_dataset',
  'get_source',
  'hide_accelerators_from_tensorflow',
  'host_batches',
  'host_train_dataset',
  'num_eval_batches',
  'train_dataset',
]


def hide_accelerators_from_tensorflow() -> None:
  """tf.data runs on the host; keep TensorFlow off the GPUs/TPUs that JAX uses."""
  import tensorflow as tf

  tf.config.set_visible_devices([], 'GPU')
  with contextlib.suppress(ValueError, RuntimeError):
    tf.config.set_visible_devices([], 'TPU')

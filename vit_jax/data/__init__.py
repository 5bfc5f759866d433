"""Input pipelines: tfds datasets, image folders and the bundled digits, per-host and resumable."""

from vit_jax.data.pipeline import (
  Preprocessing,
  check_data_shards,
  eval_dataset,
  host_train_dataset,
  num_eval_batches,
  train_dataset,
)
from vit_jax.data.sources import DigitsSource, FolderSource, Source, TfdsSource, get_source

__all__ = [
  'DigitsSource',
  'FolderSource',
  'Preprocessing',
  'Source',
  'TfdsSource',
  'check_data_shards',
  'eval_dataset',
  'get_source',
  'host_train_dataset',
  'num_eval_batches',
  'train_dataset',
]

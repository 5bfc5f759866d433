"""Input pipelines: tfds datasets, image folders and the bundled digits, per-host and resumable.

  spec.py        the data section of the run spec (`Data`, `Pp`): every input option and its
                 default; the builders below take it whole
  sources.py     datasets: tfds, image folders, the digits, subsets (`get_source`)
  preprocess.py  decoding, the inception crop, flip, RandAugment, resize
  images.py      one image file to a model's input on the host, without TensorFlow where it can
  pipeline.py    the training stream (index-addressed, resumable) and the exact evaluation pass
  embeddings.py  the sharded, resumable embeddings folder that `vit-embed` writes

TensorFlow serves here as the host-side image pipeline only: its C++ start-up notices are off
unless asked for (TF_CPP_MIN_LOG_LEVEL), and so are its oneDNN rewrites, whose float results
vary with the machine (TF_ENABLE_ONEDNN_OPTS), so that training, evaluation and predict
preprocess an image to the same numbers. The names below are loaded on first use, so that the
run spec (which holds `Data`) imports no TensorFlow: the benchmark reads it on machines
without it.
"""

import contextlib
import functools
import importlib
import os
from typing import Any

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
os.environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '0')

# Each public name, and the module that defines it.
_MODULES = {
  'BadExamples': 'pipeline',
  'check_data_shards': 'pipeline',
  'eval_dataset': 'pipeline',
  'host_batches': 'pipeline',
  'host_train_dataset': 'pipeline',
  'num_eval_batches': 'pipeline',
  'train_dataset': 'pipeline',
  'DigitsSource': 'sources',
  'FolderSource': 'sources',
  'Reader': 'sources',
  'Source': 'sources',
  'Subset': 'sources',
  'TfdsSource': 'sources',
  'get_source': 'datasets',
  'Data': 'spec',
  'Pp': 'spec',
}

__all__ = sorted([*_MODULES, 'default_threads', 'hide_accelerators_from_tensorflow'])


def __getattr__(name: str) -> Any:
  if name in _MODULES:
    return getattr(importlib.import_module(f'{__name__}.{_MODULES[name]}'), name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def default_threads() -> int:
  """The CPU cores this process may run on (its affinity: a container's or srun's share)."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not Linux
    return os.cpu_count() or 1


@functools.cache
def hide_accelerators_from_tensorflow() -> None:
  """tf.data runs on the host; keep TensorFlow off the GPUs/TPUs that JAX uses (once, before
  its first op: vit_jax/data/preprocess.py calls it as it imports TensorFlow)."""
  import tensorflow as tf

  tf.config.set_visible_devices([], 'GPU')
  with contextlib.suppress(ValueError, RuntimeError):
    tf.config.set_visible_devices([], 'TPU')

"""TensorBoard scalars written through the path layer, so a run directory in a bucket gets them.

clu's SummaryWriter writes through TensorFlow's own file system (tf.io.gfile), which reaches
gs:// by TensorFlow's GCS client, not by the path every other file of a run takes. This
writer frames TensorBoard's `Event` protos as TFRecords (tensorboard's RecordWriter) into a
`files.AppendFile`: `events.out.tfevents.<time>.<host>.<pid>.v2` in the run directory,
which TensorBoard reads like any other event file.
"""

import os
import socket
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
from clu import metric_writers
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

from vit_jax import files


class ScalarWriter(metric_writers.MetricWriter):
  """A clu MetricWriter that logs scalars only (`write_scalars`); other kinds are dropped."""

  def write_summaries(self, step, values, metadata=None):
    del step, values, metadata

  def write_images(self, step, images):
    del step, images

  def write_videos(self, step, videos):
    del step, videos

  def write_audios(self, step, audios, *, sample_rate):
    del step, audios, sample_rate

  def write_texts(self, step, texts):
    del step, texts

  def write_histograms(self, step, arrays, num_buckets=None):
    del step, arrays, num_buckets

  def write_hparams(self, hparams):
    del hparams

  def flush(self):
    pass


class EventsWriter(ScalarWriter):
  """Scalars to a TensorBoard event file in `logdir`."""

  def __init__(self, logdir: str):
    now = time.time()
    name = f'events.out.tfevents.{int(now):010d}.{socket.gethostname()}.{os.getpid()}.v2'
    self.path = files.join(logdir, name)
    self._records = RecordWriter(files.AppendFile(self.path))
    self._write(event_pb2.Event(wall_time=now, file_version='brain.Event:2'))

  def _write(self, event: event_pb2.Event) -> None:
    self._records.write(event.SerializeToString())

  def write_scalars(self, step: int, scalars: Mapping[str, Any]):
    value = summary_pb2.Summary.Value
    values = [value(tag=k, simple_value=float(np.asarray(v))) for k, v in scalars.items()]
    summary = summary_pb2.Summary(value=values)
    self._write(event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary))

  def flush(self):
    self._records.flush()

  def close(self):
    self._records.close()

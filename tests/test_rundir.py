"""The run directory's format: metrics.jsonl's one reader, config.json, class names of every
dataset kind, checkpoint steps through orbax's public API."""

import json
import logging
import os
import socket

import numpy as np
import pytest

from vit_jax import data, rundir

ocp = pytest.importorskip('orbax.checkpoint')


def _write(path, text):
  with open(path, 'w') as f:
    f.write(text)


LINES = '{"step": 1, "loss": 2.0}\n{"step": 1, "accuracy_test": 0.5}\n{"step": 2, "loss": 1.5}\n'


def test_metrics_are_read_in_order(tmp_path):
  _write(tmp_path / 'metrics.jsonl', LINES)
  assert [m['step'] for m in rundir.read_metrics(tmp_path)] == [1, 1, 2]
  assert rundir.last_evaluation(tmp_path) == {'step': 1, 'accuracy_test': 0.5}
  assert rundir.read_metrics(tmp_path / 'no_run_here') == []


def test_a_torn_last_line_is_ignored_with_a_warning(tmp_path, caplog):
  """What a process killed while writing leaves: a last line without its newline."""
  _write(tmp_path / 'metrics.jsonl', LINES + '{"step": 3, "lo')
  with caplog.at_level(logging.WARNING):
    metrics = rundir.read_metrics(tmp_path)
  assert [m['step'] for m in metrics] == [1, 1, 2]
  assert 'metrics.jsonl:4: a torn last line' in caplog.text


def test_a_corrupt_line_is_an_error_naming_file_and_line(tmp_path):
  _write(tmp_path / 'metrics.jsonl', LINES.replace('"loss": 1.5', '"loss": 1.5,,'))
  with pytest.raises(ValueError, match=r'metrics\.jsonl:3 is not JSON'):
    rundir.read_metrics(tmp_path)
  _write(tmp_path / 'metrics.jsonl', '{"step": 1}\n[1, 2]\n{"step": 2}\n')
  with pytest.raises(ValueError, match=r'metrics\.jsonl:2 is not a metrics line'):
    rundir.read_metrics(tmp_path)


def test_a_resumed_log_keeps_the_lines_up_to_its_checkpoint(tmp_path):
  _write(tmp_path / 'metrics.jsonl', LINES + '{"step": 3, "lo')
  log = rundir.MetricsLog(str(tmp_path), resume_step=1)
  log.write(2, {'loss': 1.25, 'num_test': 360})
  log.close()
  text = (tmp_path / 'metrics.jsonl').read_text()
  assert text.splitlines() == [
    '{"step": 1, "loss": 2.0}',
    '{"step": 1, "accuracy_test": 0.5}',
    '{"step": 2, "loss": 1.25, "num_test": 360}',
  ]
  fresh = rundir.MetricsLog(str(tmp_path), resume_step=None)  # a new run: an empty log
  fresh.close()
  assert rundir.read_metrics(tmp_path) == []


def test_curves_leave_matplotlib_backend_alone(tmp_path):
  """A training run started from a notebook keeps its inline plots: curves.png is drawn on a
  bare Figure, without switching the process's matplotlib backend."""
  import matplotlib
  from matplotlib import image as mpimg

  _write(tmp_path / 'metrics.jsonl', LINES)
  before = matplotlib.get_backend()
  matplotlib.use('svg')  # any backend but the Agg one a PNG is drawn with
  try:
    path = rundir.plot_curves(str(tmp_path))
    assert matplotlib.get_backend() == 'svg'
  finally:
    matplotlib.use(before)
  assert mpimg.imread(path).shape == (400, 1000, 4)  # 10 x 4 inches at 100 dpi


def test_config_json_and_the_run_it_belongs_to(tmp_path):
  run = tmp_path / 'run'
  (run / 'checkpoints' / '7' / 'state').mkdir(parents=True)
  _write(run / 'metrics.jsonl', LINES)
  rundir.write_config(
    str(run), {'total_steps': 0, 'pp': {'test': 'test'}}, {'total_steps': 5, 'class_names': ['a']}
  )
  config = rundir.read_config(run)
  assert config['pp'] == {'test': 'test'} and rundir.total_steps(config) == 5
  assert rundir.is_run(run) and not rundir.is_run(tmp_path)
  assert rundir.find_run(run / 'checkpoints' / '7' / 'state') == run
  assert rundir.find_run(tmp_path) is None
  assert rundir.class_names(run) == ['a']
  # A config.json written by another tool (a Hugging Face export) is no run directory.
  _write(tmp_path / 'config.json', json.dumps({'id2label': {'0': 'a'}}))
  assert rundir.find_run(tmp_path) is None and rundir.class_names(tmp_path) is None


def test_checkpoint_steps_are_the_finished_ones(tmp_path):
  manager = ocp.CheckpointManager(tmp_path / 'run' / 'checkpoints')
  for step in (3, 6):
    manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave({'w': np.ones(2)})))
  manager.wait_until_finished()
  manager.close()
  # What a save cut short leaves: a temporary step directory orbax has not renamed yet.
  (tmp_path / 'run' / 'checkpoints' / '9.orbax-checkpoint-tmp-1234').mkdir()
  directory = rundir.checkpoint_dir(tmp_path / 'run')
  assert rundir.checkpoint_steps(directory) == [3, 6]
  assert rundir.latest_step(tmp_path / 'run') == 6
  assert rundir.latest_step(tmp_path / 'empty') is None
  assert not os.path.exists(tmp_path / 'empty')  # looking creates nothing
  assert rundir.is_checkpoint_item(os.path.join(directory, '6', 'state'))
  assert not rundir.is_checkpoint_item(os.path.join(directory, '6'))


def test_every_dataset_kind_names_its_classes(tmp_path):
  assert data.get_source('digits').class_names() == [str(i) for i in range(10)]
  for split in ('train', 'test'):
    for name in ('cat', 'ant'):
      (tmp_path / split / name).mkdir(parents=True)
  assert data.get_source(str(tmp_path)).class_names() == ['ant', 'cat']
  pets = data.get_source('oxford_iiit_pet').class_names()  # the builder's declared labels
  assert pets[:2] == ['Abyssinian', 'american_bulldog'] and len(pets) == 37


def test_a_tfds_name_is_resolved_without_the_network(monkeypatch):
  """Checking a tfds name reads no community registry from a bucket (offline, gcsfs retried
  that for about two minutes on every run)."""
  attempts = []

  def refuse(sock, address):
    attempts.append(address)
    raise OSError('no network in this test')

  monkeypatch.setattr(socket.socket, 'connect', refuse)
  assert len(data.get_source('oxford_iiit_pet').class_names()) == 37
  assert attempts == []

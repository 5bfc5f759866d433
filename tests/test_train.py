"""Training end to end: accuracy, 1 vs 8 devices, exact resume, SIGKILL/SIGTERM, faults, errors."""

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import tensorflow_datasets as tfds
from conftest import (
  TINY,
  UNREADABLE,
  assert_trained_params_close,
  digest,
  randomize,
  tiny_config,
  train_error,
  unreadable_files,
  write_image_folder,
)

from configs import digits as digits_config
from configs import vit as vit_config
from vit_jax import data as data_lib
from vit_jax import families, parallel, rundir, train
from vit_jax.data import digits as digits_data
from vit_jax.evals import classification
from vit_jax.evals import common as evals_common
from vit_jax.train import setup, spec
from vit_jax.train import state as state_lib
from vit_jax.train.spec import with_overrides

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EVAL_KEYS = ('accuracy_test', 'accuracy_test_top5', 'loss_test', 'num_test')


def _metrics(workdir, keys=('loss', *EVAL_KEYS)):
  """The deterministic part of metrics.jsonl (no timings)."""
  return [{k: m[k] for k in ('step', *keys) if k in m} for m in rundir.read_metrics(workdir)]


def _flat(params):
  return {
    '/'.join(str(k.key) for k in path): np.asarray(x)
    for path, x in jax.tree_util.tree_flatten_with_path(jax.device_get(params))[0]
  }


def _assert_metrics_close(a, b, atol):
  assert [sorted(m) for m in a] == [sorted(m) for m in b]
  assert [m['step'] for m in a] == [m['step'] for m in b]
  for ma, mb in zip(a, b, strict=True):
    np.testing.assert_allclose([ma[k] for k in sorted(ma)], [mb[k] for k in sorted(mb)], atol=atol)


def _assert_trees_close(a, b, atol):
  fa, fb = _flat(a), _flat(b)
  assert fa.keys() == fb.keys()
  for k in fa:
    np.testing.assert_allclose(fa[k], fb[k], atol=atol, rtol=0, err_msg=k)


@pytest.mark.slow
def test_run_directory_holds_config_metrics_events_checkpoints_and_curves(reference_run):
  workdir, result = reference_run
  assert result['status'] == 'done' and result['step'] == 6
  with open(os.path.join(workdir, 'config.json')) as f:
    config = json.load(f)
  assert config['dataset'] == 'digits' and config['_resolved']['devices'] == 8
  lines = rundir.read_metrics(workdir)
  assert [m['step'] for m in lines if 'loss' in m] == [1, 2, 3, 4, 5, 6]
  evals = [m for m in lines if 'accuracy_test' in m]
  assert [m['step'] for m in evals] == [3, 6]
  assert all(m['num_test'] == 360 for m in evals)
  assert all(0.0 <= m['accuracy_test'] <= m['accuracy_test_top5'] <= 1.0 for m in evals)
  assert all(np.isfinite(m['loss']) for m in lines if 'loss' in m)
  # Step 1 includes compilation: img/s is measured from step 2 on.
  assert [m['step'] for m in lines if m.get('img_per_sec', 0) > 0] == [2, 3, 4, 5, 6]
  assert any(f.startswith('events.out.tfevents') for f in os.listdir(workdir))
  with open(os.path.join(workdir, 'curves.png'), 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['3', '6']
  # config.json holds every key of the run spec, and the class names of the dataset.
  assert set(config) - {'_resolved'} == spec.CONFIG_KEYS
  assert config['_resolved']['class_names'] == [str(i) for i in range(10)]
  # The profile of steps 3-4: a trace TensorBoard's profile plugin reads.
  traces = glob.glob(os.path.join(workdir, 'plugins', 'profile', '*', '*.xplane.pb'))
  assert len(traces) == 1 and os.path.getsize(traces[0]) > 1000


@pytest.mark.slow
def test_predict_names_the_classes_of_a_training_run(reference_run):
  import vit_jax

  workdir, _ = reference_run
  loaded = vit_jax.load(workdir)
  assert loaded.class_names == [str(i) for i in range(10)]
  assert loaded.class_names_source == os.path.join(workdir, 'config.json')


@pytest.mark.slow
def test_checkpoint_load_reads_the_final_params_of_a_run(reference_run):
  from vit_jax import checkpoint

  workdir, result = reference_run
  loaded = checkpoint.load(workdir)  # the run directory: its latest step (6)
  _assert_trees_close(loaded, jax.tree.map(np.asarray, result['params']), atol=0)
  with pytest.raises(checkpoint.CheckpointError, match='polyak_decay > 0'):
    checkpoint.fit(workdir, params_entry='polyak')


@pytest.mark.slow
def test_digits_trains_to_accuracy(tmp_path):
  """A CI-sized digits run: configs/digits.py with 2 blocks and 600 steps, on one device.

  Measured 96.9% (19.5 s); the full job (4 blocks, 3,000 steps) measured 98.3-99.7%.
  """
  config = ml_collections.ConfigDict(digits_config.get_config().to_dict())
  config.model.transformer.num_layers = 2
  config.total_steps = 600
  config.warmup_steps = 40
  config.eval_every = config.checkpoint_every = 600
  result = train.train_and_evaluate(config, str(tmp_path), devices=jax.devices()[:1])
  assert result['num_test'] == 360
  assert result['accuracy_test'] >= 0.93, result['accuracy_test']


# Dropout on, so the per-example keys matter, the Polyak average in the state, few-shot
# evaluations at steps 3 and 6 (which change no training number), FSDP sharding: one run on
# 1 device and one on 8, read by the 1-vs-8, accumulation and Polyak resume tests.
DROPOUT = dict(
  model__transformer__dropout_rate=0.1, polyak_decay=0.9, fewshot_every=3,
  fewshot__datasets=('digits',), sharding='fsdp',
)  # fmt: skip


@pytest.fixture(scope='module')
def dropout_one(tmp_path_factory):
  """The DROPOUT run on 1 device: (workdir, result)."""
  workdir = str(tmp_path_factory.mktemp('dropout_one'))
  return workdir, train.train_and_evaluate(tiny_config(**DROPOUT), workdir, jax.devices()[:1])


def _fsdp_everything(config, workdir):
  """`config` on all 8 devices, FSDP-sharding even the tiny model's leaves."""
  old = parallel.FSDP_MIN_SIZE
  parallel.FSDP_MIN_SIZE = 0
  try:
    return train.train_and_evaluate(config, workdir)
  finally:
    parallel.FSDP_MIN_SIZE = old


@pytest.fixture(scope='module')
def dropout_eight(tmp_path_factory):
  """The DROPOUT run on 8 devices, every leaf sharded, without few-shot: (workdir, result)."""
  workdir = str(tmp_path_factory.mktemp('dropout_eight'))
  return workdir, _fsdp_everything(tiny_config(**{**DROPOUT, 'fewshot_every': 0}), workdir)


def _losses(workdir):
  return [m['loss'] for m in _metrics(workdir, ('loss',)) if 'loss' in m]


@pytest.mark.slow
def test_one_and_eight_devices_agree(dropout_one, dropout_eight):
  """Same losses, parameters and Polyak average to 1e-5 on 1 device and on 8 (FSDP), with
  dropout on."""
  (one_dir, one), (eight_dir, eight) = dropout_one, dropout_eight
  sharded = [s.spec for s in jax.tree.leaves(jax.tree.map(lambda x: x.sharding, eight['params']))]
  assert any('data' in spec for spec in sharded)
  assert len(_losses(one_dir)) == 6
  np.testing.assert_allclose(_losses(one_dir), _losses(eight_dir), atol=1e-5, rtol=0)
  assert_trained_params_close(_flat(one['params']), _flat(eight['params']), atol=1e-5)
  assert_trained_params_close(_flat(one['polyak']), _flat(eight['polyak']), atol=1e-5)


@pytest.mark.slow
def test_gradient_accumulation_matches_the_full_batch(tmp_path, dropout_eight):
  """accum_steps=4 gives the same run as 1: equal micro-batches, per-example dropout keys."""
  full = dropout_eight[1]
  config = tiny_config(**{**DROPOUT, 'fewshot_every': 0}, accum_steps=4)
  accumulated = _fsdp_everything(config, str(tmp_path / 'accum'))
  assert_trained_params_close(_flat(full['params']), _flat(accumulated['params']), atol=1e-5)
  assert_trained_params_close(_flat(full['polyak']), _flat(accumulated['polyak']), atol=1e-5)


@pytest.mark.slow
def test_stop_and_resume_is_exact(tmp_path, reference_run):
  """6 steps in one go == 3 steps, stopped, then resumed for 3 more: parameters and metrics."""
  ref_dir, ref = reference_run
  workdir = str(tmp_path)
  first = train.train_and_evaluate(tiny_config(), workdir, stop_after=3)
  assert first['status'] == 'preempted' and first['step'] == 3
  second = train.train_and_evaluate(tiny_config(), workdir)
  assert second['status'] == 'done' and second['step'] == 6
  _assert_trees_close(ref['params'], second['params'], atol=0)
  assert _metrics(workdir) == _metrics(ref_dir)


# Every regularisation on: stochastic depth (two blocks), RandAugment, mixup or CutMix,
# label smoothing; one evaluation, at the end.
REGULARISED = dict(
  model__transformer__num_layers=2, model__transformer__drop_path_rate=0.2,
  pp__randaug_layers=2, pp__randaug_magnitude=10.0, mixup=0.2, cutmix=1.0, label_smoothing=0.1,
  eval_every=6,
)  # fmt: skip


@pytest.mark.slow
def test_regularised_run_resumes_exactly_and_agrees_on_one_and_eight_devices(
  tmp_path, reference_run, capsys
):
  """With every regularisation on: 6 steps in one go == a copy of the run resumed from its
  step-3 checkpoint for 3 more (bit for bit; the lines past step 3 are written again), and 1
  device == 8 devices (FSDP) to 1e-5; the losses are not the plain run's."""
  ref = train.train_and_evaluate(tiny_config(**REGULARISED), str(tmp_path / 'ref'))
  workdir = str(tmp_path / 'resumed')
  shutil.copytree(tmp_path / 'ref', workdir)
  shutil.rmtree(os.path.join(workdir, 'checkpoints', '6'))
  capsys.readouterr()
  second = train.train_and_evaluate(tiny_config(**REGULARISED), workdir)
  assert 'Resumed from checkpoint at step 3' in capsys.readouterr().out
  assert second['status'] == 'done' and second['step'] == 6
  _assert_trees_close(ref['params'], second['params'], atol=0)
  assert _metrics(workdir) == _metrics(str(tmp_path / 'ref'))
  config = tiny_config(**REGULARISED, sharding='fsdp')
  one = train.train_and_evaluate(config, str(tmp_path / 'one'), devices=jax.devices()[:1])
  assert_trained_params_close(_flat(one['params']), _flat(ref['params']), atol=1e-5)
  losses = [
    [m['loss'] for m in _metrics(d, ('loss',)) if 'loss' in m]
    for d in (workdir, str(tmp_path / 'one'))
  ]
  np.testing.assert_allclose(losses[0], losses[1], atol=1e-5, rtol=0)
  plain = [m['loss'] for m in _metrics(reference_run[0], ('loss',)) if 'loss' in m]
  # Step 1's loss is ln 10 for any targets (the head starts at zero); the others differ.
  assert np.abs(np.subtract(losses[0], plain))[1:].max() > 5e-3


@pytest.mark.slow
def test_stop_and_resume_is_exact_with_polyak_and_fewshot(tmp_path, dropout_one):
  """The same with the Polyak average in the state, dropout on and few-shot evaluations at
  steps 3 and 6 (the DROPOUT run on 1 device): the average is restored exactly, and every
  metric line (few-shot and Polyak ones included) is written again equal."""
  ref_dir, ref = dropout_one
  config = tiny_config(**DROPOUT)
  one = jax.devices()[:1]
  resumed = str(tmp_path / 'resumed')
  first = train.train_and_evaluate(config, resumed, devices=one, stop_after=3)
  assert first['status'] == 'preempted'
  second = train.train_and_evaluate(config, resumed, devices=one)
  for key in ('params', 'polyak'):
    _assert_trees_close(ref[key], second[key], atol=0)
  lines = [{k: v for k, v in m.items() if k != 'img_per_sec'} for m in rundir.read_metrics(resumed)]
  expected = [
    {k: v for k, v in m.items() if k != 'img_per_sec'} for m in rundir.read_metrics(ref_dir)
  ]
  assert lines == expected
  assert [m['step'] for m in lines if 'fewshot/digits/10shot' in m] == [3, 6]
  assert [m['step'] for m in lines if 'polyak/accuracy_test' in m] == [3, 6]
  last = rundir.last_evaluation(resumed)
  assert second['polyak/accuracy_test'] == last['polyak/accuracy_test']
  # The average exported as a file of its own, for predict and fine-tuning.
  from vit_jax import checkpoint
  from vit_jax.cli import convert

  npz = str(tmp_path / 'polyak.npz')
  convert.convert(resumed, npz, 'npz', params_entry='polyak', out=lambda line: None)
  _assert_trees_close(checkpoint.load(npz), second['polyak'], atol=0)


@pytest.fixture
def run_main(tmp_path):
  """Starts `python -m vit_jax.main` on the tiny digits config (this session's 8 CPU devices).

  Output goes to a file (a full pipe would block the child); returns (process, read_output).
  Processes still running at the end of the test are killed.
  """
  started = []

  def start(workdir, *flags):
    overrides = [f'--config.{k}={v}' for k, v in TINY.items()]
    command = [sys.executable, '-m', 'vit_jax.main', '--config=configs/digits.py']
    log = tmp_path / f'main_{len(started)}.log'
    with open(log, 'w') as out:
      process = subprocess.Popen(
        [*command, f'--workdir={workdir}', *overrides, *flags],
        cwd=REPO,
        stdout=out,
        stderr=subprocess.STDOUT,
        text=True,
      )
    started.append(process)
    return process, log.read_text

  yield start
  for process in started:
    if process.poll() is None:
      process.kill()
      process.wait()


def _wait_for(ready, process, output, timeout=240):
  start = time.monotonic()
  while not ready():
    assert process.poll() is None, output()
    assert time.monotonic() - start < timeout, f'{ready.__doc__} did not happen'
    time.sleep(0.05)


@pytest.mark.slow
def test_sigkill_at_any_moment_then_resume_is_exact(tmp_path, run_main, reference_run, capsys):
  """A run killed with SIGKILL resumes from its last complete checkpoint, exactly: the TINY
  run, saving every step (which changes no number) and killed once one at step 2 or later is
  complete, resumed (in this process) ends as the uninterrupted reference run."""
  flags = ['--config.checkpoint_every=1']
  workdir = str(tmp_path / 'killed')
  process, output = run_main(workdir, *flags)

  def saved_2():
    """a checkpoint at step 2 or later"""
    return max(rundir.checkpoint_steps(rundir.checkpoint_dir(workdir)) or [0]) >= 2

  _wait_for(saved_2, process, output)
  process.send_signal(signal.SIGKILL)
  process.wait()
  stopped = rundir.latest_step(workdir)
  assert 2 <= stopped < 6
  capsys.readouterr()
  resumed = train.train_and_evaluate(tiny_config(checkpoint_every=1), workdir)  # in this process
  assert resumed['status'] == 'done'
  assert f'Resumed from checkpoint at step {stopped}' in capsys.readouterr().out

  ref_dir, reference = reference_run
  _assert_metrics_close(_metrics(workdir), _metrics(ref_dir), atol=1e-6)
  from vit_jax.checkpoint import load

  assert rundir.latest_step(workdir) == 6
  _assert_trees_close(reference['params'], load(workdir), atol=1e-6)


@pytest.mark.slow
def test_sigterm_saves_and_exits_cleanly(tmp_path, run_main):
  workdir = str(tmp_path / 'run')
  flags = ['--config.total_steps=100000', '--config.checkpoint_every=100000']
  process, output = run_main(workdir, *flags)

  def training():
    """a metrics line"""
    return os.path.exists(os.path.join(workdir, rundir.METRICS_FILE))

  _wait_for(training, process, output)
  time.sleep(0.5)
  process.send_signal(signal.SIGTERM)
  assert process.wait(timeout=120) == 0, output()
  step = rundir.latest_step(workdir)
  assert step is not None and 0 < step < 100000
  assert f'Stopping at step {step}: checkpoint saved' in output()


@pytest.mark.slow
def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
  workdir = str(tmp_path)
  train.train_and_evaluate(tiny_config(checkpoint_every=100), workdir, stop_after=2)
  good = os.path.join(workdir, 'checkpoints', '2')
  before = digest(good)
  with pytest.raises(
    FloatingPointError,
    match=r'Non-finite \S.* at step [34].*checkpoint \(step 2\).*base_lr.*resume from it',
  ):
    train.train_and_evaluate(
      tiny_config(checkpoint_every=100, base_lr=1e30, warmup_steps=0), workdir
    )
  assert os.listdir(os.path.join(workdir, 'checkpoints')) == ['2']
  assert digest(good) == before


def _truncate_arrays(step_dir):
  """Every array data file of the step's state cut to half its size (OCDBT may keep a data file
  that no array reads: cutting only one could miss)."""
  files = glob.glob(os.path.join(step_dir, 'state', '**', 'd', '*'), recursive=True)
  assert files
  for path in files:
    os.truncate(path, os.path.getsize(path) // 2)


def _write_garbage(path):
  with open(path, 'wb') as f:
    f.write(b'\x00garbage\xff' * 7)


DAMAGE = {
  'truncated array files': _truncate_arrays,
  'missing state metadata': lambda d: os.remove(os.path.join(d, 'state', '_METADATA')),
  'corrupt state metadata': lambda d: _write_garbage(os.path.join(d, 'state', '_METADATA')),
  'corrupt meta item': lambda d: _write_garbage(os.path.join(d, 'meta', 'metadata')),
  'no commit marker': lambda d: os.remove(os.path.join(d, 'commit_success.txt')),
}


@pytest.mark.slow
@pytest.mark.parametrize('damage', [*DAMAGE, 'empty directory'])
def test_a_damaged_newest_checkpoint_is_set_aside_and_the_run_resumes_before_it(
  tmp_path, reference_run, damage, capsys
):
  """The newest step (6) damaged as a crash or a bad disk leaves it: the run says so in one
  line, keeps the damaged files as 6.damaged-1, resumes from step 3 and ends exactly as the
  uninterrupted run. An empty directory is a newer step (9) that holds nothing."""
  ref_dir, ref = reference_run
  workdir = str(tmp_path / 'run')
  shutil.copytree(ref_dir, workdir)
  checkpoints = os.path.join(workdir, 'checkpoints')
  step = 9 if damage == 'empty directory' else 6
  if damage == 'empty directory':
    shutil.rmtree(os.path.join(checkpoints, '6'))
    os.mkdir(os.path.join(checkpoints, '9'))
  else:
    DAMAGE[damage](os.path.join(checkpoints, '6'))
  damaged = digest(os.path.join(checkpoints, str(step)))
  capsys.readouterr()
  result = train.train_and_evaluate(tiny_config(total_steps=6), workdir)
  out = capsys.readouterr().out
  lines = [line for line in out.splitlines() if line.startswith('Checkpoint ')]
  assert len(lines) == 1 and lines[0].startswith(f'Checkpoint {checkpoints}/{step} is damaged ('), (
    out
  )
  assert lines[0].endswith(
    f'resuming from step 3; the damaged step is kept as {checkpoints}/{step}.damaged-1.'
  )
  assert 'Resumed from checkpoint at step 3' in out
  assert digest(os.path.join(checkpoints, f'{step}.damaged-1')) == damaged
  assert result['status'] == 'done' and rundir.latest_step(workdir) == 6
  _assert_trees_close(ref['params'], result['params'], atol=0)


@pytest.mark.slow
def test_converting_a_damaged_run_is_one_line_and_writes_nothing(tmp_path, reference_run):
  """The reads a failed orbax read abandons print nothing after the one-line error."""
  workdir = str(tmp_path / 'run')
  shutil.copytree(reference_run[0], workdir)
  _truncate_arrays(os.path.join(workdir, 'checkpoints', '6'))
  out = tmp_path / 'out.npz'
  command = [sys.executable, '-m', 'vit_jax.convert', workdir, str(out), '--to=npz']
  done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
  assert done.returncode == 1, done.stderr
  assert done.stdout == '' and done.stderr.startswith('error: ') and done.stderr.count('\n') == 1, (
    done.stderr
  )
  assert not out.exists()


@pytest.mark.slow
def test_no_good_checkpoint_left_is_a_one_line_error_and_changes_nothing(
  tmp_path, reference_run, run_main
):
  workdir = str(tmp_path / 'run')
  shutil.copytree(reference_run[0], workdir)
  checkpoints = os.path.join(workdir, 'checkpoints')
  _truncate_arrays(os.path.join(checkpoints, '6'))
  DAMAGE['no commit marker'](os.path.join(checkpoints, '3'))
  before = digest(workdir)
  process, output = run_main(workdir)
  assert process.wait(timeout=300) == 1, output()
  errors = [line for line in output().splitlines() if line.startswith('Error: ')]
  assert len(errors) == 1 and errors[0].startswith(
    f'Error: Cannot resume from {checkpoints}/6 ('
  ), output()
  assert f'{checkpoints}/3 (no commit_success.txt: the write was cut short)' in errors[0]
  assert errors[0].endswith('or use a new --workdir.')
  assert 'Traceback' not in output()  # nor the reads the failed restores abandoned
  assert digest(workdir) == before


def test_resuming_with_an_incompatible_config_is_a_one_line_error(tmp_path):
  workdir = str(tmp_path)
  # Stopped at step 2 of the TINY run: its compiled programs are the reference run's.
  train.train_and_evaluate(tiny_config(checkpoint_every=2), workdir, stop_after=2)
  with pytest.raises(
    ValueError, match=r'Cannot resume from .*/checkpoints/2 .*use a new --workdir'
  ):
    train.train_and_evaluate(tiny_config(total_steps=4, optimizer='sgd'), workdir)
  with pytest.raises(ValueError, match='written with batch 32, the config says 64'):
    train.train_and_evaluate(tiny_config(total_steps=4, batch=64), workdir)


@pytest.mark.slow
def test_fine_tuning_from_npz_at_another_resolution(tmp_path):
  """Pretrain at 8 px, save_npz, fine-tune at 16 px (posemb 4x4 -> 8x8): far above its start."""
  from vit_jax.checkpoint import save_npz

  one = jax.devices()[:1]
  pretrain = dict(total_steps=300, base_lr=1e-2, warmup_steps=20, pp__area_min=1.0)
  pre = train.train_and_evaluate(
    tiny_config(eval_every=300, checkpoint_every=300, progress_every=100, **pretrain),
    str(tmp_path / 'pretrain'),
    devices=one,
  )
  npz = str(tmp_path / 'tiny.npz')
  save_npz(jax.device_get(pre['params']), npz)

  finetune = dict(
    pp__crop=16, total_steps=20, eval_every=20, checkpoint_every=20, warmup_steps=2,
    progress_every=10, optimizer='sgd', base_lr=0.1, pp__area_min=1.0,
  )  # fmt: skip
  tuned = train.train_and_evaluate(
    tiny_config(pretrained_path=npz, **finetune), str(tmp_path / 'ft'), devices=one
  )
  with open(tmp_path / 'ft' / 'config.json') as f:
    config = json.load(f)
  assert config['_resolved']['pretrained_path'] == npz
  assert tuned['params']['Transformer']['posembed_input']['pos_embedding'].shape == (1, 64, 32)
  # Its start: the zero head gives every class the same logit, argmax picks class 0, so the
  # accuracy is the share of zeros (10%). The same 20 steps from scratch reached 19%.
  start = np.mean(digits_data.load('test')[1] == 0)
  assert start == pytest.approx(0.1, abs=0.01)
  assert pre['accuracy_test'] > 0.75, pre['accuracy_test']
  assert tuned['accuracy_test'] > start + 0.3, tuned['accuracy_test']  # measured: 0.50


def _write_npz_of_testing_model(path):
  """A file in the pretrained layout at 224 px (random values: the runs check shapes)."""
  from vit_jax.checkpoint import save_npz
  from vit_jax.models import get_model

  save_npz(randomize(families.param_shapes(get_model('testing', num_classes=21843), 224)), path)


@pytest.mark.slow
@pytest.mark.parametrize('dataset', ['cifar10', 'imagenet2012'])
def test_mock_data_fine_tuning_configs_run_end_to_end(tmp_path, dataset):
  _write_npz_of_testing_model(str(tmp_path / 'testing.npz'))
  config = ml_collections.ConfigDict(vit_config.get_config(f'testing,{dataset}').to_dict())
  config.pretrained_dir = str(tmp_path)
  config.pp.crop = 32
  config.batch = config.batch_eval = 16
  config.accum_steps = 2
  config.total_steps = 3
  config.warmup_steps = 1
  config.eval_every = 3
  with tfds.testing.mock_data(num_examples=20):  # one device: the config, not the mesh, is tested
    result = train.train_and_evaluate(config, str(tmp_path / 'run'), devices=jax.devices()[:1])
  assert result['status'] == 'done' and result['num_test'] == 20
  expected_classes = {'cifar10': 10, 'imagenet2012': 1000}[dataset]
  assert result['params']['head']['kernel'].shape == (10, expected_classes)
  assert result['params']['Transformer']['posembed_input']['pos_embedding'].shape == (1, 5, 10)


def test_pretraining_recipes_follow_table_3():
  from configs import pretrain

  i21k = pretrain.get_config('b16,imagenet21k')
  i1k = pretrain.get_config('b32,imagenet2012')
  for config in (i21k, i1k):
    assert (config.optimizer, config.b1, config.b2, config.batch) == ('adam', 0.9, 0.999, 4096)
    assert (config.warmup_steps, config.pp.crop, config.grad_norm_clip) == (10_000, 224, 1.0)
    assert config.model.transformer.dropout_rate == 0.1
    assert config.model.representation_size == config.model.hidden_size
  assert (i21k.base_lr, i21k.decay_type, i21k.weight_decay, i21k.total_epochs) == (
    1e-3,
    'linear',
    0.03,
    90,
  )
  assert (i1k.base_lr, i1k.decay_type, i1k.weight_decay, i1k.total_epochs) == (
    3e-3,
    'cosine',
    0.3,
    300,
  )
  assert (i21k.loss, i21k.model.head_bias_init) == ('sigmoid_xent', -10.0)


def _two_steps_on_mock_imagenet(config: ml_collections.ConfigDict, tmp_path) -> dict:
  """`config` at 32 px, batch 16, for 2 steps on 20 mock ImageNet examples."""
  config.pp.crop = 32
  config.batch = config.batch_eval = 16
  config.total_epochs = 1.6  # 20 mock examples -> ceil(1.6 * 20 / 16) = 2 steps
  config.warmup_steps = 1
  with tfds.testing.mock_data(num_examples=20):  # one device: the config, not the mesh, is tested
    result = train.train_and_evaluate(config, str(tmp_path), devices=jax.devices()[:1])
  assert result['step'] == 2 and result['num_test'] == 20
  return result


@pytest.mark.slow
def test_mock_data_pretraining_config_runs_end_to_end(tmp_path):
  """The i21k recipe (Adam, weight decay, pre_logits, sigmoid loss, head bias -10) on mock data."""
  from configs import pretrain

  config = ml_collections.ConfigDict(pretrain.get_config('testing,imagenet21k').to_dict())
  config.dataset = 'imagenet2012'  # ImageNet-21k is not in tfds; its mock stands in
  config.pp.train, config.pp.test = 'train', 'validation'
  result = _two_steps_on_mock_imagenet(config, tmp_path)
  params = result['params']
  assert params['pre_logits']['kernel'].shape == (10, 10)  # representation layer of width D
  head_bias = np.asarray(params['head']['bias'])
  assert head_bias.shape == (1000,)
  np.testing.assert_allclose(head_bias, -10.0, atol=0.01)  # initialised at -10, 2 small steps


@pytest.mark.slow
def test_mock_data_s16_imagenet_recipe_runs_end_to_end(tmp_path):
  """configs/vit_s16_i1k.py (RandAugment, mixup, gap, pre_logits, Adam with a bfloat16 first
  moment) for 2 steps on mock ImageNet, the model made tiny."""
  from configs import vit_s16_i1k

  config = ml_collections.ConfigDict(vit_s16_i1k.get_config().to_dict())
  config.model.hidden_size = config.model.representation_size = 16
  config.model.transformer.update(num_layers=2, mlp_dim=32, num_heads=2, drop_path_rate=0.1)
  result = _two_steps_on_mock_imagenet(config, tmp_path)
  assert np.isfinite([m['loss'] for m in _metrics(str(tmp_path), ('loss',)) if 'loss' in m]).all()
  assert result['params']['head']['kernel'].shape == (16, 1000)
  assert 'cls' not in result['params']  # global average pooling
  assert 'posembed_input' not in result['params']['Transformer']  # fixed sin-cos


@pytest.mark.slow
def test_bfloat16_compute_keeps_float32_parameters_and_optimizer_state(tmp_path):
  one = jax.devices()[:1]
  f32 = train.train_and_evaluate(tiny_config(total_steps=3), str(tmp_path / 'f32'), devices=one)
  bf16 = train.train_and_evaluate(
    tiny_config(total_steps=3, dtype='bfloat16'), str(tmp_path / 'bf16'), devices=one
  )
  assert {x.dtype for x in jax.tree.leaves(bf16['params'])} == {jnp.dtype('float32')}
  floats = [x for x in jax.tree.leaves(bf16['opt_state']) if jnp.issubdtype(x.dtype, jnp.floating)]
  assert floats and {x.dtype for x in floats} == {jnp.dtype('float32')}
  losses = [
    [m['loss'] for m in _metrics(str(tmp_path / d), ('loss',)) if 'loss' in m]
    for d in ('f32', 'bf16')
  ]
  np.testing.assert_allclose(losses[0], losses[1], rtol=0.02)
  assert not np.array_equal(losses[0], losses[1])  # it really computed in bfloat16
  _assert_trees_close(f32['params'], bf16['params'], atol=0.01)


class _RedChannelModel:
  """A stand-in model whose logits are (0, red value, -1): hand-checkable predictions."""

  def apply(self, variables, images, train):
    red = images[:, 0, 0, 0]
    return jnp.stack([jnp.zeros_like(red), red, -jnp.ones_like(red)], axis=-1)


def test_evaluation_counts_every_example_exactly_once(tmp_path):
  from PIL import Image

  # Class a: red 0 and 200; class b: red 0, 100, 255. Prediction: class b iff red > 127.5.
  for name, reds in {'a': (0, 200), 'b': (0, 100, 255)}.items():
    for split in ('train', 'test'):
      os.makedirs(tmp_path / split / name)
      for i, red in enumerate(reds):
        Image.fromarray(np.full((4, 4, 3), red, np.uint8)).save(
          tmp_path / split / name / f'{i}.png'
        )
  config = tiny_config(dataset=str(tmp_path), batch=8, batch_eval=2, pp__crop=4, num_classes=3)
  prepared = setup.prepare(config, str(tmp_path / 'run'), jax.devices()[:1])
  run = prepared.spec
  context = evals_common.Context(
    run.evals, run.data, _RedChannelModel(), prepared.mesh, prepared.source
  )
  metrics = classification.Evaluator(context).run(None)
  # a: 0 -> a (right), 200 -> b (wrong); b: 0 -> a, 100 -> a (wrong), 255 -> b (right): 2 of 5.
  # The padding example (image 0.0, label 0) would be "right" if it were counted: 3 of 6.
  assert metrics['num_test'] == 5
  assert metrics['accuracy_test'] == pytest.approx(2 / 5)
  # Top-5 of 3 classes: always right.
  assert metrics['accuracy_test_top5'] == pytest.approx(1.0)
  assert data_lib.num_eval_batches(prepared.source, 'test', 2) == 3


def _bad_image_config(tmp_path, bad_split: str, **overrides):
  """A folder of 13 readable training images (+ the 3 unreadable ones in `bad_split`) and 5
  test images, trained in batches of 16 (one epoch a step when the bad ones are in train)."""
  root = write_image_folder(
    tmp_path / 'images', {'train': 13, 'test': 5}, unreadable_files(), bad_split
  )
  defaults = {'dataset': root, 'batch': 16, 'batch_eval': 8, 'pp__subpixel': False}
  return tiny_config(**{**defaults, **overrides}), str(tmp_path / 'run')


@pytest.mark.slow
def test_unreadable_training_images_are_skipped_counted_and_resume_alike(tmp_path, capsys):
  config, workdir = _bad_image_config(tmp_path, 'train', total_steps=3, checkpoint_every=0)
  first = train.train_and_evaluate(config, workdir, stop_after=2)
  assert first['status'] == 'preempted'
  train.train_and_evaluate(config, workdir)
  # Each step's 16 examples are one epoch: the 3 unreadable files each once.
  counts = [m['bad_images'] for m in rundir.read_metrics(workdir) if 'loss' in m]
  assert counts == [3, 6, 9]
  warnings = [x for x in capsys.readouterr().err.splitlines() if 'unreadable' in x]
  # Named on first sight, by each of the two runs.
  assert sorted(os.path.basename(x) for x in warnings) == sorted(2 * UNREADABLE)
  assert all(x.startswith('Warning: unreadable training image ') for x in warnings)
  stop, workdir = _bad_image_config(
    tmp_path / 'stop', 'train', total_steps=3, checkpoint_every=0, skip_bad_images=False
  )
  with pytest.raises(ValueError, match=r'^Unreadable training image .*\.jpg at step 1: ') as e:
    train.train_and_evaluate(stop, workdir)
  assert '\n' not in str(e.value)


@pytest.mark.slow
def test_unreadable_test_images_are_a_one_line_error_unless_skipped(tmp_path):
  # The training test's schedule and batches: its compiled programs.
  config, workdir = _bad_image_config(tmp_path, 'test', total_steps=3, checkpoint_every=0)
  with pytest.raises(ValueError, match=r'^Unreadable test image .*\.jpg \(3 in all\): ') as e:
    train.train_and_evaluate(config, workdir)
  assert '\n' not in str(e.value) and str(tmp_path / 'images' / 'test' / 'a') in str(e.value)
  skipped = with_overrides(config, {'skip_bad_test_images': True})
  result = train.train_and_evaluate(skipped, str(tmp_path / 'skipped'))
  assert result['num_test'] == 5
  evaluation = rundir.last_evaluation(str(tmp_path / 'skipped'))
  assert (evaluation['num_test'], evaluation['bad_test_images']) == (5, 3)


def test_bad_inputs_give_one_line_errors(tmp_path):
  with pytest.raises(ValueError, match=r"Unknown model 'b17'\. Did you mean: b16"):
    vit_config.get_config('b17,cifar10')
  train_error(
    tiny_config(dataset='cifar1O'), tmp_path, "Unknown dataset 'cifar1O'.*Did you mean: cifar10"
  )
  train_error(tiny_config(batch=100), tmp_path, 'config.batch=100 does not divide over 8 devices')
  extra = tiny_config()
  extra.bathc = 64
  train_error(extra, tmp_path, "Unknown config key 'bathc'. Did you mean 'batch'")
  missing = ml_collections.ConfigDict(vit_config.get_config('b16,cifar10').to_dict())
  missing.pretrained_dir = str(tmp_path)
  train_error(
    missing,
    tmp_path,
    f'Pretrained checkpoint {tmp_path}/ViT-B_16.npz not found: download it with '
    '`gsutil cp gs://vit_models/imagenet21k/ViT-B_16.npz DIR/`',
  )
  train_error(tiny_config(pp__train='validation'), tmp_path, "split 'validation'")


def test_a_run_that_fails_at_its_start_leaves_no_folder(tmp_path, monkeypatch):
  """A run that stops while it builds its state (here as a pretrained file that does not fit
  stops it, past the checks above; without the 2-s compile of the initialisation before the
  fit) leaves no folder: no workdir, not the empty checkpoints/ it left."""
  message = 'teacher.npz: embedding/kernel has shape (4, 4, 3, 16) in the checkpoint but ...'

  def does_not_fit(*args):
    raise ValueError(message)

  monkeypatch.setattr(state_lib, 'initial_state', does_not_fit)
  teacher = tmp_path / 'teacher.npz'
  teacher.write_bytes(b'')  # there: the run's checks of its config pass
  train_error(tiny_config(pretrained_path=str(teacher)), tmp_path, re.escape(message))


@pytest.mark.slow
@pytest.mark.parametrize(
  ('flags', 'message'),
  [
    (['--config=configs/digits.py', '--config.bathc=64'], 'bathc'),
    (['--config=configs/vit.py:b17,cifar10'], "Unknown model 'b17'"),
  ],
)
def test_command_line_errors_are_one_line(tmp_path, flags, message):
  run = subprocess.run(
    [sys.executable, '-m', 'vit_jax.main', f'--workdir={tmp_path}/run', *flags],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert run.returncode == 2  # the command line's config: a usage error
  errors = [line for line in run.stderr.splitlines() if line.startswith('error:')]
  assert len(errors) == 1 and message in errors[0], run.stderr
  assert not os.path.exists(tmp_path / 'run')


@pytest.mark.slow
def test_bfloat16_activations_policy_is_recorded_and_resumes_exactly(tmp_path):
  """config.precision='activations' with the fused attention call: config.json records the
  policy, and a run resumed from its step-2 checkpoint ends at step 4 exactly as it did (one
  device: the policy against 8 is tests/test_steps.py)."""
  config = tiny_config(
    dtype='bfloat16', precision='activations', total_steps=4, eval_every=4, checkpoint_every=2
  )
  config.model.attention_impl = 'fused'
  one = jax.devices()[:1]
  whole = train.train_and_evaluate(config, str(tmp_path / 'whole'), devices=one)
  saved = rundir.read_config(str(tmp_path / 'whole'))
  assert (saved['precision'], saved['dtype']) == ('activations', 'bfloat16')
  workdir = str(tmp_path / 'resumed')
  shutil.copytree(tmp_path / 'whole', workdir)
  shutil.rmtree(os.path.join(workdir, 'checkpoints', '4'))
  resumed = train.train_and_evaluate(config, workdir, devices=one)
  assert resumed['status'] == 'done' and resumed['step'] == 4
  _assert_trees_close(whole['params'], resumed['params'], atol=0)


class _NoCheckpoints:
  """The guard's view of a run that has saved nothing yet (or step `last`)."""

  def __init__(self, last=None):
    self.last_saved, self.directory = last, '/run/checkpoints'

  def wait(self):
    pass


@pytest.mark.parametrize(
  'metrics, last, want, not_in',
  [
    (  # LiT's zero image head: a finite loss, a NaN gradient at the first step
      {'loss': 4.1588, 'grad_norm': np.nan, 'params_finite': False},
      None,
      r'^Non-finite gradient and parameters at step 1, with a finite loss \(4\.1588\): run '
      r'stopped\. No checkpoint was written yet; a finite loss with a non-finite gradient is '
      r'not the learning rate: .*rerun to start afresh\.$',
      ('base_lr', 'resume'),
    ),
    (  # a diverging learning rate after a checkpoint
      {'loss': np.inf, 'grad_norm': np.nan, 'params_finite': False},
      4,
      r'^Non-finite loss, gradient and parameters at step 1 \(loss inf\): run stopped\. '
      r'Last good checkpoint \(step 4\) in /run/checkpoints is untouched; lower '
      r'--config\.base_lr .*resume from it\.$',
      ('start afresh',),
    ),
  ],
)
def test_the_non_finite_line_names_what_is_non_finite_and_what_to_do(metrics, last, want, not_in):
  from vit_jax.train import actions

  guard = actions.NonFiniteGuard(_NoCheckpoints(last))
  guard.add(1, {k: np.asarray(v) for k, v in metrics.items()})
  with pytest.raises(FloatingPointError) as stop:
    guard.check()
  line = str(stop.value)
  assert re.match(want, line), line
  assert not any(word in line for word in not_in), line

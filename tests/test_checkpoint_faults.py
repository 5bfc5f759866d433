"""Checkpoint faults from outside: a write that fails (full disk, quota, permission, read-only)
at the periodic, preemption and final save, and the PRNG implementations (rbg, unsafe_rbg)."""

import contextlib
import errno
import glob
import os
import shutil
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from conftest import TINY, digest, full_tmpfs, tiny_config
from etils.epath import gpath

from vit_jax import distributed, rundir, train
from vit_jax.train import checkpoint_faults
from vit_jax.train.spec import with_overrides

pytestmark = pytest.mark.slow  # kills, full disks and processes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _same_params(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
  """The 6-step tiny run, checkpoints every 2 steps (saving changes no number)."""
  workdir = str(tmp_path_factory.mktemp('uninterrupted'))
  result = train.train_and_evaluate(tiny_config(checkpoint_every=2), workdir)
  result['workdir'] = workdir
  return result


@contextlib.contextmanager
def _full_disk_at(step: int):
  """Every file orbax opens for writing into `<step>.orbax-checkpoint-tmp` raises ENOSPC, as
  a full disk does (at etils.epath, the layer orbax writes its Python-side files through)."""
  original = gpath._GPath.open

  def open_(self, mode='r', **kwargs):
    if f'/{step}.orbax-checkpoint-tmp' in os.fspath(self) and set(mode) & set('wax'):
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(self))
    return original(self, mode, **kwargs)

  gpath._GPath.open = open_
  try:
    yield
  finally:
    gpath._GPath.open = original


def _wait_for_abandoned_writes(path: str, quiet_s: float = 0.5, limit_s: float = 20) -> None:
  """Until nothing in `path` changed for `quiet_s`: the failed write's other TensorStore
  writes go on in this process's threads (a process that exits on the error leaves none)."""

  def sizes():
    return sorted(
      (r, len(fs), sum(os.path.getsize(os.path.join(r, f)) for f in fs))
      for r, _, fs in os.walk(path)
    )

  deadline, last = time.monotonic() + limit_s, None
  while time.monotonic() < deadline and (now := sizes()) != last:
    last = now
    time.sleep(quiet_s)


# (the save that fails, config overrides, stop_after, the steps kept)
SAVES = {
  'periodic': (4, {'checkpoint_every': 2}, None, [2]),
  'preemption': (4, {'checkpoint_every': 100}, 4, []),
  'final': (6, {'checkpoint_every': 2}, None, [2, 4]),
}


@pytest.mark.parametrize('save', SAVES)
def test_a_failed_write_is_one_line_keeps_the_good_steps_and_resumes_exactly(
  tmp_path, uninterrupted, save
):
  step, overrides, stop_after, kept = SAVES[save]
  workdir = str(tmp_path / 'run')
  checkpoints = rundir.checkpoint_dir(workdir)
  with _full_disk_at(step), pytest.raises(checkpoint_faults.CheckpointWriteError) as failed:
    train.train_and_evaluate(tiny_config(**overrides), workdir, stop_after=stop_after)
  message = str(failed.value)
  assert failed.value.errno == errno.ENOSPC and '\n' not in message
  steps = checkpoint_faults.kept_steps(kept)
  assert message == (
    f'Cannot write checkpoint {checkpoints}/{step} (no space left on the device): free space '
    f'or grow the filesystem, then rerun the same command to resume ({steps} kept; the '
    'partial write is removed at the next start).'
  )
  assert rundir.checkpoint_steps(checkpoints) == kept
  _wait_for_abandoned_writes(os.path.join(checkpoints, f'{step}.orbax-checkpoint-tmp'))
  good = {s: digest(os.path.join(checkpoints, str(s))) for s in kept}
  result = train.train_and_evaluate(tiny_config(checkpoint_every=2), workdir)
  assert result['status'] == 'done'
  assert sorted(os.listdir(checkpoints)) == ['2', '4', '6']  # no tmp directory left
  assert {s: digest(os.path.join(checkpoints, str(s))) for s in kept} == good
  _same_params(uninterrupted['params'], result['params'])


@pytest.mark.parametrize(
  'text, number',
  [
    ('RESOURCE_EXHAUSTED: Error writing local file "x": No space left on device', errno.ENOSPC),
    ("Failed to write 3759 bytes to file 6 [os_error_code='122']", errno.EDQUOT),
    ('PERMISSION_DENIED: Error opening "gs://b/c"', errno.EACCES),
    ("[Errno 30] Read-only file system: '/mnt/x'", errno.EROFS),
    ('PERMISSION_DENIED: Error writing local file "x": Read-only file system', errno.EROFS),
    ('NOT_FOUND: no such bucket', None),
    # RESOURCE_EXHAUSTED alone is no full disk (a24f8ac took every one for ENOSPC):
    ('RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.50GiB.', errno.ENOMEM),
    (
      'RESOURCE_EXHAUSTED: Error writing "gs://b/run/checkpoints/6/d/1f": HTTP response code: '
      '429 with body: {"error": {"code": 429, "message": "rateLimitExceeded"}}',
      errno.EAGAIN,
    ),
    ('RESOURCE_EXHAUSTED: too many open requests', None),
  ],
)
def test_the_cause_of_a_write_failure_is_read_off_tensorstore_text(text, number):
  assert checkpoint_faults.storage_errno(ValueError(text)) == number


@pytest.mark.parametrize(
  'text, cause, fix',
  [
    ('RESOURCE_EXHAUSTED: Out of memory while trying to allocate', 'out of memory', 'batch'),
    ('RESOURCE_EXHAUSTED: HTTP response code: 429', 'rate limit', 'checkpoint_every'),
    ('RESOURCE_EXHAUSTED: too many open requests', 'too many open requests', 'filesystem'),
  ],
)
def test_exhausted_memory_and_a_rate_limit_each_have_their_line(text, cause, fix):
  line = str(checkpoint_faults.write_failure('/run/checkpoints/6', ValueError(text), [3]))
  assert line.startswith('Cannot write checkpoint /run/checkpoints/6 (') and cause in line
  assert fix in line and 'space' not in line and 'step 3 is kept' in line


def test_the_note_a_failed_process_sends_keeps_its_cause():
  """What another process sees of a failed write (its first line, cut short, through the
  barriers) still names the cause, and marks it as a peer's."""
  long = 'PERMISSION_DENIED: Error writing "' + 'x' * 400 + '": Read-only file system'
  seen = distributed.BarrierAborted(1, checkpoint_faults.failure_note(ValueError(long)))
  assert len(str(seen)) < 300 and checkpoint_faults.storage_errno(seen) == errno.EROFS
  assert checkpoint_faults.write_failure('/c/6', seen, [3]).from_peer
  assert not checkpoint_faults.write_failure('/c/6', ValueError(long), [3]).from_peer


@pytest.mark.parametrize(
  'error, collective',
  [
    # What gloo raised through orbax's sync of a save when the peer was killed (kill -9).
    (
      'UNKNOWN: Gloo AllGather failed: [external/gloo/gloo/transport/tcp/pair.cc:538] Read '
      'error [127.0.0.1]:44187: Connection reset by peer',
      True,
    ),
    ('RESOURCE_EXHAUSTED: Error writing local file "x": No space left on device', False),
  ],
)
def test_a_failed_sync_between_processes_is_not_taken_for_a_failed_write(error, collective):
  """A save whose device collective failed is a peer's death (the peer watch names it), not a
  disk to check; a runtime error that carries a storage cause stays a write failure."""
  assert checkpoint_faults.is_collective_failure(jax.errors.JaxRuntimeError(error)) is collective
  assert not checkpoint_faults.is_collective_failure(OSError(errno.ENOSPC, 'No space left'))


def _tiny_flags(**overrides):
  return [f'--config.{k}={v}' for k, v in {**TINY, **overrides}.items()]


@pytest.mark.skipif(os.geteuid() != 0, reason='mounting a tmpfs needs root (CI runs as root)')
def test_a_full_tmpfs_at_a_save_is_one_line_and_the_run_resumes_once_it_grows(
  tmp_path, uninterrupted
):
  """The workdir on a tmpfs, the run stopped after its step-2 checkpoint, then the disk filled
  by another file but for 200 KiB (less than a step; a tmpfs sized to hold two steps sometimes
  held three, as orbax's step sizes vary with the write's timing). The same
  command resumes and fails at the step-4 save with exit 1 and one line naming that step and
  step 2; the tmpfs grown, the same run resumes, removes the partial write, and ends exactly
  as an uninterrupted run."""
  mount = tmp_path / 'disk'
  with full_tmpfs(mount) as fill:
    workdir = str(mount / 'run')
    train.train_and_evaluate(tiny_config(checkpoint_every=2), workdir, stop_after=2)
    fill()
    flags = _tiny_flags(checkpoint_every=2)
    command = [sys.executable, '-m', 'vit_jax.main', '--config=configs/digits.py', '--workdir']
    run = subprocess.run(
      [*command, workdir, *flags], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 1, run.stderr
    checkpoints = rundir.checkpoint_dir(workdir)
    kept = rundir.checkpoint_steps(checkpoints)
    assert kept == [2], run.stderr
    failed = 4
    assert run.stderr == (
      f'Error: Cannot write checkpoint {checkpoints}/{failed} (no space left on the device): '
      'free space or grow the filesystem, then rerun the same command to resume '
      f'({checkpoint_faults.kept_steps(kept)} kept; the partial write is removed at the next '
      'start).\n'
    )
    assert f'{failed}.orbax-checkpoint-tmp' in os.listdir(checkpoints)
    good = {s: digest(os.path.join(checkpoints, str(s))) for s in kept}
    subprocess.run(['mount', '-o', 'remount,size=16m', str(mount)], check=True)
    resumed = train.train_and_evaluate(tiny_config(checkpoint_every=2), workdir)
    assert sorted(os.listdir(checkpoints)) == ['2', '4', '6']  # no tmp directory left
    _same_params(uninterrupted['params'], resumed['params'])
    assert {s: digest(os.path.join(checkpoints, str(s))) for s in good} == good


@contextlib.contextmanager
def _prng(impl: str):
  previous = jax.config.jax_default_prng_impl
  jax.config.update('jax_default_prng_impl', impl)
  try:
    yield
  finally:
    jax.config.update('jax_default_prng_impl', previous)


@pytest.mark.parametrize('impl', ['rbg', 'unsafe_rbg'])
def test_rbg_stop_and_resume_is_exact_and_another_prng_is_one_line(tmp_path, impl, capsys):
  """Dropout on, so the key matters: 4 steps in one go == a copy of the run resumed from its
  step-2 checkpoint for 2 more; the run resumed under threefry2x32 is refused in one line."""
  config = tiny_config(
    total_steps=4, checkpoint_every=2, eval_every=2, model__transformer__dropout_rate=0.1
  )
  workdir = str(tmp_path / 'run')
  with _prng(impl):
    full = train.train_and_evaluate(config, str(tmp_path / 'full'))
    shutil.copytree(tmp_path / 'full', workdir)
    shutil.rmtree(os.path.join(rundir.checkpoint_dir(workdir), '4'))
    capsys.readouterr()
    resumed = train.train_and_evaluate(config, workdir)
  assert 'Resumed from checkpoint at step 2' in capsys.readouterr().out
  assert resumed['status'] == 'done' and resumed['step'] == 4
  _same_params(full['params'], resumed['params'])
  with _prng('threefry2x32'), pytest.raises(ValueError) as refused:
    train.train_and_evaluate(with_overrides(config, {'total_steps': 6}), workdir)
  assert str(refused.value) == (
    f"{rundir.checkpoint_dir(workdir)}/4 was written under the PRNG implementation '{impl}', "
    f"this run uses 'threefry2x32': set JAX_DEFAULT_PRNG_IMPL={impl} to resume, or "
    'start afresh with a new --workdir.'
  )


@pytest.mark.parametrize('damage', ['corrupt', 'truncated'])
def test_converting_a_run_whose_newest_step_is_damaged_names_it_and_the_newest_good_one(
  tmp_path, uninterrupted, damage
):
  from vit_jax import checkpoint

  workdir = str(tmp_path / 'run')
  shutil.copytree(uninterrupted['workdir'], workdir)
  step_dir = os.path.join(rundir.checkpoint_dir(workdir), '6')
  if damage == 'corrupt':
    with open(os.path.join(step_dir, 'state', '_METADATA'), 'wb') as f:
      f.write(b'\x00garbage\xff' * 7)
  else:
    for path in glob.glob(os.path.join(step_dir, 'state', '**', 'd', '*'), recursive=True):
      os.truncate(path, os.path.getsize(path) // 2)
  with pytest.raises(checkpoint.CheckpointError) as failed:
    checkpoint.load(workdir)
  message = str(failed.value)
  assert message.startswith(f'{step_dir}: the orbax checkpoint is damaged (state: '), message
  assert message.endswith(
    f'; the newest good step is 4: convert {rundir.checkpoint_dir(workdir)}/4'
  ), message

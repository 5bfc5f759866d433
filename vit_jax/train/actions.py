"""The periodic actions of the training loop, built on clu's `periodic_actions`.

Called after every step, each action decides by itself whether it is due (every N steps,
and at the last step):
  Progress     clu's ReportProgress: writes the training line of metrics.jsonl (loss,
               learning rate, gradient norm, img/s without compilation, evaluation and
               checkpoint time) and draws the progress line.
  Evaluations  the run's evaluators (vit_jax/evals: the test split, ImageNet ReaL, few-shot,
               ...) due at the step, over the parameters and their Polyak average: one
               line of metrics.
  Saver        an orbax checkpoint of the state (PeriodicCallback).
  Profile      clu's Profile: a trace of `profile_steps` steps for TensorBoard's profile plugin.
Before anything reads or saves the state, `NonFiniteGuard` looks at the metrics of the
steps so far and stops the run at the first non-finite one, so no bad state is ever saved.
Every process stops together: the guard's verdicts and the stop after a SIGTERM are voted
on (distributed.Vote), so a fault seen by one process stops them all at the same step.
"""

import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from absl import logging
from clu import metric_writers, periodic_actions, profiler

from vit_jax import data as data_lib
from vit_jax import distributed, files, rundir
from vit_jax.evals import common as evals_common
from vit_jax.train import events
from vit_jax.train import state as state_lib


def _non_finite(metrics: dict) -> list[str]:
  """Which of a step's loss, gradient and parameters are not finite."""
  finite = {
    'loss': np.isfinite(metrics['loss']),
    'gradient': np.isfinite(metrics['grad_norm']),
    'parameters': bool(metrics['params_finite']),
  }
  return [name for name, ok in finite.items() if not ok]


class NonFiniteGuard:
  """Keeps each step's metrics on the device until they are needed (no sync per step).

  Every process checks at the same steps and votes: one process's non-finite value (its
  replica of the parameters, say) stops all of them, at the first bad step any one saw.
  It also adds up the steps' `bad_images` (unreadable training images replaced in the batch,
  over all hosts) into `bad_images`, from the count of the checkpoint the run resumed from;
  with `skip_bad=False` the first one stops the run, on every host alike.
  """

  def __init__(
    self,
    checkpoints: state_lib.Checkpoints,
    bad: data_lib.BadExamples | None = None,
    bad_images: int = 0,
    skip_bad: bool = True,
  ):
    self._pending: list[tuple[int, dict]] = []
    self._checkpoints = checkpoints
    self._bad, self._skip_bad = bad, skip_bad
    self.bad_images = bad_images
    self._vote = distributed.Vote('non_finite')

  def add(self, step: int, metrics: dict) -> None:
    self._pending.append((step, metrics))

  def check(self) -> dict | None:
    """The last step's metrics on the host; FloatingPointError at a non-finite step."""
    fetched = jax.device_get([m for _, m in self._pending])
    bad = next(
      (
        f'{step} {float(m["loss"])} {",".join(_non_finite(m))}'
        for (step, _), m in zip(self._pending, fetched, strict=True)
        if _non_finite(m)
      ),
      None,
    )
    seen = self._vote(bad)
    if seen:
      step, loss, what = min((int(s), loss, w) for s, loss, w in map(str.split, seen.values()))
      self._stop(step, loss, what.split(','), sorted(seen))
    for (step, _), m in zip(self._pending, fetched, strict=True):
      self._count_bad(step, int(m.get('bad_images', 0)))
    self._pending.clear()
    return fetched[-1] if fetched else None

  def _stop(self, step: int, loss: str, what: list[str], processes: list[int]) -> None:
    self._checkpoints.wait()
    last = self._checkpoints.last_saved
    where = ''
    if jax.process_count() > 1:
      where = f' (seen by process {", ".join(map(str, processes))})'
    listed = ' and '.join([', '.join(what[:-1]), what[-1]] if len(what) > 1 else what)
    head = f'Non-finite {listed} at step {step}{where}'
    head += f' (loss {loss})' if 'loss' in what else f', with a finite loss ({loss})'
    if 'loss' not in what and 'gradient' in what:
      fix = (
        'a finite loss with a non-finite gradient is not the learning rate: check the model '
        '(a zero vector normalised, say) and the data'
      )
    else:
      fix = 'lower --config.base_lr (or check the data)'
    if last is None:
      then = f'No checkpoint was written yet; {fix}, and rerun to start afresh.'
    else:
      then = (
        f'Last good checkpoint (step {last}) in {self._checkpoints.directory} is untouched; '
        f'{fix}, and rerun to resume from it.'
      )
    raise FloatingPointError(f'{head}: run stopped. {then}')

  def _count_bad(self, step: int, count: int) -> None:
    self.bad_images += count
    if count and not self._skip_bad:
      first = self._bad.first() if self._bad else 'see the warnings'
      raise ValueError(
        f'Unreadable training image {first} at step {step}: fix or remove it, or set '
        '--config.skip_bad_images=True to skip such images (counted in metrics.jsonl).'
      )


# ----------------------------------------------------------------------------------------
# Metric writers: metrics.jsonl and TensorBoard, on the first process.
# ----------------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
  return value if isinstance(value, int | float) else np.asarray(value).item()


class JsonlWriter(events.ScalarWriter):
  """A clu MetricWriter of scalars to the run's metrics.jsonl; other kinds are not logged."""

  def __init__(self, log: rundir.MetricsLog):
    self._log = log

  def write_scalars(self, step: int, scalars: Mapping[str, Any]):
    self._log.write(step, {k: _plain(v) for k, v in scalars.items()})

  def close(self):
    self._log.close()


def make_writer(workdir: str, resume_step: int | None) -> metric_writers.MetricWriter:
  """metrics.jsonl and TensorBoard events on process 0; nothing on the others."""
  if jax.process_index() != 0:
    return metric_writers.MultiWriter([])
  writers = [JsonlWriter(rundir.MetricsLog(workdir, resume_step))]
  writers.append(events.EventsWriter(workdir))
  return metric_writers.MultiWriter(writers)


# ----------------------------------------------------------------------------------------
# Progress: the training line of the metrics, and the progress line.
# ----------------------------------------------------------------------------------------


def _format_time(seconds: float) -> str:
  seconds = int(max(0, seconds))
  h, rest = divmod(seconds, 3600)
  return f'{h}h{rest // 60:02d}m' if h else f'{rest // 60}m{rest % 60:02d}s'


class Progress(periodic_actions.ReportProgress):
  """clu's ReportProgress that also writes each reported step's training metrics and draws
  `[####....] step S/T | loss L | R img/s | ETA E` (in place on a terminal), on process 0.

  It is first called right after the first step, which includes compilation: that step is
  reported without img/s, and img/s counts from there on, leaving out the time spent in
  `timed` parts (evaluation, checkpoints).
  """

  def __init__(self, *, total_steps, batch, every_steps, guard, writer, stream=None):
    super().__init__(num_train_steps=total_steps, every_steps=every_steps, every_secs=None)
    self._batch, self._guard, self._metrics = batch, guard, writer
    self._paused_at_last = 0.0
    self._rate: float | None = None
    self.stream = stream or sys.stdout
    self.enabled = jax.process_index() == 0
    self.tty = self.enabled and self.stream.isatty()

  def _should_trigger(self, step: int, t: float) -> bool:
    # ReportProgress never reports its first call; this one writes that step's metrics too.
    return periodic_actions.PeriodicAction._should_trigger(self, step, t)

  def _img_per_sec(self, step: int, t: float) -> float | None:
    paused = sum(self._time_per_part.values())
    since, self._paused_at_last = paused - self._paused_at_last, paused
    if step == self._previous_step:  # the first call: compilation is in its time
      return None
    elapsed = max(1e-9, t - self._previous_time - since)
    return (step - self._previous_step) * self._batch / elapsed

  def _apply(self, step: int, t: float):
    last = self._guard.check()
    img_per_sec = self._img_per_sec(step, t)
    if img_per_sec is not None:
      self._rate = img_per_sec
      super()._apply(step, t)  # clu: steps/s and ETA in the work unit's notes
    scalars = {
      'loss': float(last['loss']),
      'learning_rate': float(last['learning_rate']),
      'grad_norm': float(last['grad_norm']),
    }
    # The task's own metrics (the contrastive loss's temperature, accuracies, ...).
    extra = set(last) - {*scalars, 'params_finite', 'bad_images'}
    scalars.update({k: float(last[k]) for k in sorted(extra)})
    if img_per_sec is not None:
      scalars['img_per_sec'] = img_per_sec
    if self._guard.bad_images:
      scalars['bad_images'] = self._guard.bad_images
    self._metrics.write_scalars(step, scalars)
    self._draw(step, scalars['loss'])

  def _draw(self, step: int, loss: float) -> None:
    if not self.enabled:
      return
    total, rate = self._num_train_steps, self._rate
    filled = int(20 * step / total)
    bar = '#' * filled + '.' * (20 - filled)
    speed = f'{rate:.0f} img/s' if rate else '- img/s'
    eta = _format_time((total - step) * self._batch / rate) if rate else '-'
    line = f'[{bar}] step {step}/{total} | loss {loss:.4f} | {speed} | ETA {eta}'
    self.stream.write(('\r' + line) if self.tty else line + '\n')
    self.stream.flush()

  def message(self, text: str) -> None:
    """A line of its own (after the progress line on a terminal), on process 0."""
    if self.enabled:
      self.stream.write(('\n' if self.tty else '') + text + '\n')
      self.stream.flush()


# ----------------------------------------------------------------------------------------
# Evaluation and checkpoints: callbacks that receive the state.
# ----------------------------------------------------------------------------------------


def every(
  steps: int, total_steps: int, callback: Callable[..., Any]
) -> periodic_actions.PeriodicCallback:
  """`callback(step=, t=, state=)` every `steps` steps (0: never) and at the last step."""
  return periodic_actions.PeriodicCallback(
    every_steps=steps or None, on_steps=[total_steps], callback_fn=callback
  )


def parameter_sets(state: Mapping[str, Any]) -> dict[str, Any]:
  """The parameter sets the state keeps, by the prefix of their metrics: the parameters
  (''), and their Polyak average ('polyak/') where the run keeps one."""
  sets = {'': state['params']}
  if 'polyak' in state:
    sets['polyak/'] = state['polyak']
  return sets


class Evaluations:
  """After each step, the evaluators due then (`Evaluator.due`), each over every parameter
  set of the state: their metrics written as one line, and a line each on the progress output.

  `last` holds the latest value of every metric they wrote in this run.
  """

  def __init__(
    self,
    evaluators: Mapping[str, evals_common.Evaluator],
    total_steps: int,
    guard: NonFiniteGuard,
    writer: metric_writers.MetricWriter,
    progress: Progress,
  ):
    self._evaluators, self._total_steps = dict(evaluators), total_steps
    self._guard, self._writer, self._progress = guard, writer, progress
    self.last: dict[str, Any] = {}

  def __call__(self, step: int, state: Mapping[str, Any]) -> None:
    metrics = {}
    for name, evaluator in self._evaluators.items():
      if not evaluator.due(step, self._total_steps):
        continue
      with self._progress.timed(name, wait_jax_async_dispatch=False):
        self._guard.check()  # no evaluation of a state that went non-finite
        measured = evals_common.evaluate(evaluator, parameter_sets(state))
      self._progress.message(f'step {step}: {evaluator.describe(measured)}')
      metrics |= measured
    if metrics:
      self._writer.write_scalars(step, metrics)
      self.last |= metrics


class Saver:
  """Saves the state, with its meta (step, batch, data shards), once every earlier step has
  proved finite."""

  def __init__(self, checkpoints: state_lib.Checkpoints, guard, progress, batch, data_shards):
    self._checkpoints, self._guard, self._progress = checkpoints, guard, progress
    self._batch, self._data_shards = batch, data_shards

  def __call__(self, step: int, t: float, state: dict[str, Any]) -> None:
    del t
    with self._progress.timed('checkpoint', wait_jax_async_dispatch=False):
      self._guard.check()
      meta = state_lib.checkpoint_meta(step, self._batch, self._data_shards, self._guard.bad_images)
      self._checkpoints.save(step, state, meta)


# ----------------------------------------------------------------------------------------
# Profiling and preemption.
# ----------------------------------------------------------------------------------------


class Profile(periodic_actions.Profile):
  """clu's Profile, once: a trace of `num_profile_steps` steps after `first_profile`, in
  `logdir/plugins/profile/<time>/` (TensorBoard's profile plugin opens it). The profiler
  writes local files only: for a bucket `logdir` it traces to a local folder, copied up at
  the end of the trace."""

  def __init__(self, logdir: str, num_profile_steps: int, first_profile: int):
    self._bucket_logdir = None if files.is_local(logdir) else logdir
    super().__init__(
      logdir=logdir if files.is_local(logdir) else tempfile.mkdtemp(prefix='vit_jax_profile.'),
      num_profile_steps=num_profile_steps,
      profile_duration_ms=None,
      first_profile=first_profile,
      every_secs=None,
    )

  def _end_session(self, url: str | None):
    super()._end_session(url)
    if self._bucket_logdir is not None:
      files.copy_tree(self._logdir, self._bucket_logdir)
      shutil.rmtree(self._logdir, ignore_errors=True)

  def close(self) -> None:
    """Ends a trace the run stopped in the middle of (preemption, an error)."""
    if self._session_running:
      self._end_session(profiler.stop())


def make_profile(workdir: str, steps: int, start: int, total_steps: int) -> Profile | None:
  """A profile of `steps` steps after the first two of this run (fewer if the run is shorter)."""
  if not steps:
    return None
  first = max(start + 1, min(start + 2, total_steps - steps))
  steps = min(steps, total_steps - first)
  if steps < 1:
    logging.warning('No profile: %d step(s) left to train.', total_steps - start)
    return None
  return Profile(workdir, steps, first)


class Preemption:
  """Turns SIGTERM into a flag the loop checks after each step (main thread only)."""

  def __init__(self):
    self.requested = False
    self._previous = None

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    return self

  def _handle(self, signum, frame):
    del signum, frame
    self.requested = True

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)

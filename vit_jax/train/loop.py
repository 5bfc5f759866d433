"""`train_and_evaluate(config, workdir)`: the training loop, driven by periodic actions.

config -> Setup (setup.py: the config resolved once into the run spec, the data, devices,
files and evaluators checked) -> state restored from the run's last checkpoint or
initialised (state.py) -> compiled steps (steps.py) -> for each step: the step, then the
actions (actions.py: progress and metrics, the evaluators of vit_jax/evals, checkpoint,
profile) -> the run directory (vit_jax/rundir.py).

Running again with the same workdir resumes from the last complete checkpoint, and the
resumed run continues exactly as an uninterrupted one: the input stream is a function of
its position, dropout keys are a function of (seed, step, example), and metric lines past
the checkpoint are dropped. SIGTERM saves a checkpoint and returns; a non-finite loss
stops the run before any checkpoint of the bad state is written.
"""

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import ml_collections

from vit_jax import data as data_lib
from vit_jax import distributed, files, parallel, rundir
from vit_jax.train import actions, steps
from vit_jax.train import spec as spec_lib
from vit_jax.train import state as state_lib
from vit_jax.train.setup import Setup, prepare


def _say(text: str) -> None:
  if jax.process_index() == 0:
    print(text, flush=True)


def _train_batches(
  setup: Setup, start: int, data_shards: int, bad: data_lib.BadExamples
) -> Iterator[dict[str, jax.Array]]:
  """Global batches of the training stream from step `start` on."""
  ds = data_lib.host_train_dataset(
    setup.source,
    setup.spec.data,
    data_shards=data_shards,
    seed=setup.spec.init.seed,
    step=start,
    process_index=jax.process_index(),
    process_count=jax.process_count(),
    tokenizer=setup.task.tokenizer,
    preprocessing=setup.preprocessing,
  )
  sharding = parallel.batch_sharding(setup.mesh)
  return (parallel.global_batch(bad.take(local), sharding) for local in data_lib.host_batches(ds))


def _write_config(workdir: str, setup: Setup) -> None:
  """config.json: the resolved spec (every key), and what the run derived beside it."""
  if jax.process_index() != 0:
    return
  names = setup.source.class_names()
  resolved = {
    'total_steps': setup.total_steps,
    'num_classes': setup.num_classes,
    'class_names': names if len(names) == setup.num_classes else None,
    'devices': setup.mesh.size,
    'processes': jax.process_count(),
    'pretrained_path': setup.pretrained_path,
    **setup.task.resolved(),
  }
  rundir.write_config(workdir, spec_lib.to_dict(setup.spec), resolved)


@dataclasses.dataclass(frozen=True)
class _Parts:
  """The loop's parts: the compiled step, the data, and the actions after each step."""

  total_steps: int
  train_step: Callable
  batches: Iterator
  guard: actions.NonFiniteGuard
  progress: actions.Progress
  callbacks: tuple  # the actions that receive the state: evaluations, checkpoint
  profile: actions.Profile | None
  evaluations: actions.Evaluations
  saver: actions.Saver
  checkpoints: state_lib.Checkpoints


def _loop(
  parts: _Parts, state: dict, start: int, stop_after: int | None, preemption: actions.Preemption
):
  """Steps from `start` to the end; returns (state, last step, 'done' | 'preempted').

  After each step the processes vote on stopping, so a SIGTERM that reaches one of them
  stops all at the same step, with the same checkpoint.
  """
  step, total = start, parts.total_steps
  stop_vote = distributed.Vote('stop')
  for step in range(start + 1, total + 1):
    state, metrics = parts.train_step(state, next(parts.batches))
    parts.guard.add(step, metrics)
    if step == start + 1:
      jax.block_until_ready(metrics)  # compilation stays out of img/s
    parts.progress(step)
    for callback in parts.callbacks:
      callback(step, state=state)
    if parts.profile is not None:
      parts.profile(step)
    stop = preemption.requested or (stop_after is not None and step >= stop_after)
    notes = stop_vote('SIGTERM' if preemption.requested else 'stop' if stop else None)
    if notes and step < total:
      if parts.checkpoints.last_saved != step:
        parts.saver(step=step, t=None, state=state)
      parts.progress.message(
        f'Stopping at step {step}: checkpoint saved, rerun to resume{_why(notes)}.'
      )
      return state, step, 'preempted'
  if start < total:
    parts.progress.message(f'Done: {total} steps.')
  return state, step, 'done'


def _why(notes: dict[int, str]) -> str:
  """' (SIGTERM on process 1)' when a process was asked to stop by a signal."""
  signalled = sorted(p for p, note in notes.items() if note == 'SIGTERM')
  if not signalled:
    return ''
  return (
    f' (SIGTERM on process {", ".join(map(str, signalled))})'
    if jax.process_count() > 1
    else ' (SIGTERM)'
  )


def _parts(setup, workdir, lay, checkpoints, meta, data_shards, writer) -> _Parts:
  spec, mesh, total = setup.spec, setup.mesh, setup.total_steps
  start = int(meta['step'])
  if setup.task.describe():
    _say(setup.task.describe())
  train_step = steps.train_step_for(spec, setup.task, setup.tx, setup.schedule, mesh, lay.shardings)
  bad = data_lib.BadExamples('training')
  batches = _train_batches(setup, start, data_shards, bad)
  guard = actions.NonFiniteGuard(
    checkpoints, bad, int(meta.get('bad_images', 0)), spec.data.skip_bad_images
  )
  progress = actions.Progress(
    total_steps=total,
    batch=spec.data.batch,
    every_steps=spec.loop.progress_every or None,
    guard=guard,
    writer=writer,
  )
  evaluations = actions.Evaluations(setup.evaluators, total, guard, writer, progress)
  saver = actions.Saver(checkpoints, guard, progress, spec.data.batch, data_shards)
  callbacks = (evaluations, actions.every(spec.loop.checkpoint_every, total, saver))
  return _Parts(
    total_steps=total,
    train_step=train_step,
    batches=batches,
    guard=guard,
    progress=progress,
    callbacks=callbacks,
    profile=actions.make_profile(workdir, spec.loop.profile_steps, start, total),
    evaluations=evaluations,
    saver=saver,
    checkpoints=checkpoints,
  )


def _evaluation_of(parts: _Parts, workdir: str) -> dict[str, Any]:
  """The evaluations of this call, or the last of the run before it (an already finished run)."""
  last = parts.evaluations.last or rundir.last_evaluation(workdir) or {}
  return {k: v for k, v in last.items() if k != 'step'}


def _run(setup: Setup, workdir: str, checkpoints, stop_after, preemption) -> dict[str, Any]:
  """Restores or initialises the state, then trains with the actions; the result."""
  lay, state, meta, note = state_lib.start(setup, checkpoints)
  if note:
    _say(note)
  start, data = int(meta['step']), setup.spec.data
  data_shards, note = state_lib.data_shards_for(data.data_shards, data.batch, meta)
  if note:
    _say(note)
  files.makedirs(workdir)  # once the state stands: a run that fails before leaves no folder
  _write_config(workdir, setup)
  writer = actions.make_writer(workdir, checkpoints.last_saved)
  parts = _parts(setup, workdir, lay, checkpoints, meta, data_shards, writer)
  if start >= setup.total_steps:
    _say(f'Already trained for {setup.total_steps} steps.')
  try:
    state, step, status = _loop(parts, state, start, stop_after, preemption)
    checkpoints.settle()  # the last write finished on every process, or one line on each
  finally:
    if parts.profile is not None:
      parts.profile.close()
    parts.batches.close()  # stops the input pipeline now, not whenever it is collected
    checkpoints.close()
    writer.close()
  return {
    'status': status,
    'step': step,
    **{k: state[k] for k in ('params', 'opt_state', 'polyak') if k in state},
    **_evaluation_of(parts, workdir),
  }


def train_and_evaluate(
  config: spec_lib.RunSpec | ml_collections.ConfigDict | Mapping,
  workdir: str,
  devices: Sequence[jax.Device] | None = None,
  stop_after: int | None = None,
) -> dict[str, Any]:
  """Trains and evaluates as `config` says, in `workdir`; resumes from its last checkpoint.

  Args:
    config: an experiment config (configs/*.py), or its RunSpec.
    workdir: the run directory (vit_jax/rundir.py).
    devices: the devices of the mesh (default: all).
    stop_after: return after this step (saving a checkpoint), as if preempted; for tests.

  Returns:
    {'step': last step, 'status': 'done' | 'preempted', 'params' and 'opt_state' (final,
    on the mesh; and 'polyak', the parameters' average, with polyak_decay), and the metrics
    of the evaluators (each at its latest value; all of them from the last step of a
    finished run)}.
  """
  setup = prepare(config, workdir, devices)
  checkpoints = state_lib.Checkpoints(workdir, setup.spec.loop.keep_checkpoints)
  # A SIGTERM while restoring, compiling or building the input pipeline stops the run after
  # its first step, with a checkpoint, as one during training does.
  try:
    with actions.Preemption() as preemption:
      result = _run(setup, workdir, checkpoints, stop_after, preemption)
  finally:
    checkpoints.close()
  if result['status'] == 'done' and jax.process_index() == 0:
    rundir.plot_curves(workdir)
  return result

"""`train_and_evaluate(config, workdir)`: the training loop, driven by periodic actions.

config -> RunSpec (spec.py, once) -> Setup (setup.py: data, devices, files checked) ->
state restored from the run's last checkpoint or initialised (state.py) -> compiled steps
(steps.py) -> for each step: the step, then the actions (actions.py: progress and metrics,
evaluation, checkpoint, profile) -> the run directory (vit_jax/rundir.py).

Running again with the same workdir resumes from the last complete checkpoint, and the
resumed run continues exactly as an uninterrupted one: the input stream is a function of
its position, dropout keys are a function of (seed, step, example), and metric lines past
the checkpoint are dropped. SIGTERM saves a checkpoint and returns; a non-finite loss
stops the run before any checkpoint of the bad state is written.
"""

import dataclasses
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from vit_jax import data as data_lib
from vit_jax import distributed, fewshot, files, optim, parallel, rundir
from vit_jax.train import actions, distill, steps
from vit_jax.train import spec as spec_lib
from vit_jax.train import state as state_lib
from vit_jax.train.setup import Setup, prepare


def _say(text: str) -> None:
  if jax.process_index() == 0:
    print(text, flush=True)


def _eval_sums(eval_step, params, setup: Setup, source, split: str, batch_sharding, what: str):
  """(the eval step's sums over one exact pass of `split`, padding and unreadable images
  masked; an error naming the first unreadable image, unless `skip_bad_test_images`)."""
  data = setup.spec.data
  ds = data_lib.eval_dataset(
    source,
    split,
    local_batch=parallel.local_batch_size(data.batch_eval),
    pp=setup.pp_eval,
    process_index=jax.process_index(),
    process_count=jax.process_count(),
    prefetch=data.prefetch,
    threads=data.input_threads,
  )
  bad = data_lib.BadExamples(what)
  totals = None
  for local in data_lib.host_batches(ds):
    sums = eval_step(params, parallel.global_batch(bad.take(local), batch_sharding))
    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
  totals = jax.device_get(totals)
  unreadable = int(totals['bad'])
  if unreadable and not data.skip_bad_test_images:
    raise ValueError(
      f'Unreadable {what} image {bad.first()} ({unreadable} in all): evaluation counts every '
      f'{what} image; fix or remove it (or set --config.skip_bad_test_images=True to leave it '
      'out).'
    )
  return totals


def evaluate(eval_step, params, setup: Setup, batch_sharding) -> dict[str, float]:
  """One exact pass over the test split: every example counted once (padding is masked);
  and ImageNet ReaL when configured.

  An unreadable test image is an error naming it, or with `skip_bad_test_images` left out
  of the count (`bad_test_images`).
  """
  test = setup.spec.data.pp.test
  totals = _eval_sums(eval_step, params, setup, setup.source, test, batch_sharding, 'test')
  count = int(totals['count'])
  results = {
    'accuracy_test': float(totals['correct']) / count,
    'accuracy_test_top5': float(totals['correct_top5']) / count,
    'loss_test': float(totals['loss']) / count,
    'num_test': count,
  }
  if totals['bad']:
    results['bad_test_images'] = int(totals['bad'])
  if setup.real_source is not None:
    split = setup.spec.evals.real_split
    real = _eval_sums(eval_step, params, setup, setup.real_source, split, batch_sharding, 'ReaL')
    results['accuracy_real'] = float(real['real_correct']) / max(1, int(real['real_count']))
    results['num_real'] = int(real['real_count'])
  return results


def evaluate_state(evaluate_params: Callable, state: dict) -> dict[str, float]:
  """The parameters' evaluation, and the Polyak average's as `polyak/...` (counts aside)."""
  results = evaluate_params(state['params'])
  if 'polyak' in state:
    averaged = evaluate_params(state['polyak'])
    counts = ('num_test', 'num_real', 'bad_test_images')
    results |= {f'polyak/{k}': v for k, v in averaged.items() if k not in counts}
  return results


def _train_batches(
  setup: Setup, start: int, data_shards: int, bad: data_lib.BadExamples
) -> Iterator[dict[str, jax.Array]]:
  """Global batches of the training stream from step `start` on."""
  data = setup.spec.data
  ds = data_lib.host_train_dataset(
    setup.source,
    data.pp.train,
    global_batch=data.batch,
    data_shards=data_shards,
    pp=setup.pp_train,
    seed=setup.spec.init.seed,
    step=start,
    shuffle_buffer=data.shuffle_buffer,
    process_index=jax.process_index(),
    process_count=jax.process_count(),
    prefetch=data.prefetch,
    threads=data.input_threads,
  )
  sharding = parallel.batch_sharding(setup.mesh)
  return (parallel.global_batch(bad.take(local), sharding) for local in data_lib.host_batches(ds))


def _write_config(workdir: str, spec: spec_lib.RunSpec, setup: Setup) -> None:
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
    'teacher': setup.teacher.description if setup.teacher else None,
  }
  rundir.write_config(workdir, spec_lib.to_dict(spec), resolved)


def _start_state(setup: Setup, tx, lay, checkpoints) -> tuple[dict, dict]:
  """(state, checkpoint meta): the last checkpoint's, or a fresh state at step 0."""
  restored = checkpoints.restore_newest(lay)
  if restored is not None:
    latest, state, meta = restored
    _say(f'Resumed from checkpoint at step {latest} ({checkpoints.directory}).')
    state_lib.check_resumable(meta, setup.spec.data.batch)
    return state, meta
  init_rng, dropout_rng = jax.random.split(jax.random.key(setup.spec.init.seed))
  state = state_lib.initial_state(setup, tx, lay, init_rng, dropout_rng)
  if setup.pretrained_path:
    _say(f'Fine-tuning from {setup.pretrained_path}.')
  return state, {'step': 0, 'data_position': 0}


@dataclasses.dataclass(frozen=True)
class _Parts:
  """The loop's parts: the compiled step, the data, and the actions after each step."""

  total_steps: int
  train_step: Callable
  batches: Iterator
  guard: actions.NonFiniteGuard
  progress: actions.Progress
  callbacks: tuple  # clu PeriodicCallbacks that receive the state: evaluation, checkpoint
  profile: actions.Profile | None
  evaluator: actions.Evaluator
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


def _fewshot_action(setup: Setup, lay, guard, writer, progress) -> actions.Evaluator:
  """The few-shot linear evaluation of the state's parameters (vit_jax/fewshot.py)."""
  spec = setup.spec
  features = fewshot.compile_features(setup.model, lay.shardings['params'], setup.mesh)
  evaluate = fewshot.Evaluator(
    setup.fewshot_tasks,
    spec.evals.fewshot,
    features,
    setup.pp_eval,
    spec.data.batch_eval,
    setup.mesh,
    prefetch=spec.data.prefetch,
    threads=spec.data.input_threads,
  )
  return actions.Evaluator(
    lambda state: evaluate(state['params']),
    guard,
    writer,
    progress,
    name='fewshot',
    describe=fewshot.describe,
  )


def _evaluators(setup: Setup, lay, guard, writer, progress) -> tuple[actions.Evaluator, list]:
  """The test split's evaluator, and the evaluation callbacks (with the few-shot one)."""
  spec, mesh, total = setup.spec, setup.mesh, setup.total_steps
  eval_step = steps.compile_eval_step(setup.model, setup.num_classes, lay.shardings['params'], mesh)
  evaluate_params = functools.partial(
    evaluate, eval_step, setup=setup, batch_sharding=parallel.batch_sharding(mesh)
  )
  evaluator = actions.Evaluator(
    functools.partial(evaluate_state, evaluate_params), guard, writer, progress
  )
  callbacks = [actions.every(spec.loop.eval_every, total, evaluator)]
  if setup.fewshot_tasks:
    action = _fewshot_action(setup, lay, guard, writer, progress)
    callbacks.append(actions.every(spec.evals.fewshot_every, total, action))
  return evaluator, callbacks


def _parts(setup, workdir, tx, schedule, lay, checkpoints, meta, data_shards, writer) -> _Parts:
  spec, mesh, total = setup.spec, setup.mesh, setup.total_steps
  start = int(meta['step'])
  teacher_params = None
  if setup.teacher is not None:
    teacher_params = distill.place(setup.teacher_params, mesh, spec.step.sharding)
    _say(f'Distilling from {setup.teacher.description}.')
  train_step = steps.train_step_for(
    spec, setup.model, tx, schedule, setup.num_classes, mesh, lay.shardings,
    setup.teacher, teacher_params,
  )  # fmt: skip
  bad = data_lib.BadExamples('training')
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
  evaluator, callbacks = _evaluators(setup, lay, guard, writer, progress)
  saver = actions.Saver(checkpoints, guard, progress, spec.data.batch, data_shards)
  callbacks.append(actions.every(spec.loop.checkpoint_every, total, saver))
  return _Parts(
    total_steps=total,
    train_step=train_step,
    batches=_train_batches(setup, start, data_shards, bad),
    guard=guard,
    progress=progress,
    callbacks=tuple(callbacks),
    profile=actions.make_profile(workdir, spec.loop.profile_steps, start, total),
    evaluator=evaluator,
    saver=saver,
    checkpoints=checkpoints,
  )


def _evaluation_of(parts: _Parts, workdir: str) -> dict[str, Any]:
  """The last evaluation of this call, or of the run before it (an already finished run)."""
  last = parts.evaluator.last or rundir.last_evaluation(workdir) or {}
  return {k: v for k, v in last.items() if k != 'step'}


def _run(spec, setup: Setup, workdir: str, checkpoints, stop_after, preemption) -> dict[str, Any]:
  """Restores or initialises the state, then trains with the actions; the result."""
  tx, schedule = optim.for_training(setup.spec.optim, setup.total_steps)
  lay = state_lib.layout(setup, tx, jax.random.key(setup.spec.init.seed))
  state, meta = _start_state(setup, tx, lay, checkpoints)
  start, data = int(meta['step']), setup.spec.data
  data_shards, note = state_lib.data_shards_for(data.data_shards, data.batch, meta)
  if note:
    _say(note)
  _write_config(workdir, spec, setup)
  writer = actions.make_writer(workdir, checkpoints.last_saved)
  parts = _parts(setup, workdir, tx, schedule, lay, checkpoints, meta, data_shards, writer)
  if start >= setup.total_steps:
    _say(f'Already trained for {setup.total_steps} steps.')
  try:
    state, step, status = _loop(parts, state, start, stop_after, preemption)
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
    on the mesh; and 'polyak', the parameters' average, with polyak_decay), and the last
    evaluation's metrics}.
  """
  spec = config if isinstance(config, spec_lib.RunSpec) else spec_lib.from_config(config)
  setup = prepare(spec, workdir, devices)
  files.makedirs(workdir)
  checkpoints = state_lib.Checkpoints(workdir, spec.loop.keep_checkpoints)
  # A SIGTERM while restoring, compiling or building the input pipeline stops the run after
  # its first step, with a checkpoint, as one during training does.
  try:
    with actions.Preemption() as preemption:
      result = _run(spec, setup, workdir, checkpoints, stop_after, preemption)
  finally:
    checkpoints.close()
  if result['status'] == 'done' and jax.process_index() == 0:
    rundir.plot_curves(workdir)
  return result

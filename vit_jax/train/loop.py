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
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from vit_jax import data as data_lib
from vit_jax import fewshot, optim, parallel, rundir
from vit_jax.train import actions, steps
from vit_jax.train import spec as spec_lib
from vit_jax.train import state as state_lib
from vit_jax.train.setup import Setup, prepare


def _say(text: str) -> None:
  if jax.process_index() == 0:
    print(text, flush=True)


def _eval_sums(eval_step, params, setup: Setup, source, split: str, batch_sharding) -> dict:
  """The eval step's sums over one exact pass of `split` (padding is masked)."""
  data = setup.spec.data
  ds = data_lib.eval_dataset(
    source,
    split,
    local_batch=parallel.local_batch_size(data.batch_eval),
    pp=setup.pp_eval,
    process_index=jax.process_index(),
    process_count=jax.process_count(),
    prefetch=data.prefetch,
  )
  totals = None
  for local in ds.as_numpy_iterator():
    sums = eval_step(params, parallel.global_batch(local, batch_sharding))
    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
  return jax.device_get(totals)


def evaluate(eval_step, params, setup: Setup, batch_sharding) -> dict[str, float]:
  """The test split, every example counted once; and ImageNet ReaL when configured."""
  test = setup.spec.data.pp.test
  totals = _eval_sums(eval_step, params, setup, setup.source, test, batch_sharding)
  count = int(totals['count'])
  results = {
    'accuracy_test': float(totals['correct']) / count,
    'accuracy_test_top5': float(totals['correct_top5']) / count,
    'loss_test': float(totals['loss']) / count,
    'num_test': count,
  }
  if setup.real_source is not None:
    split = setup.spec.evals.real_split
    real = _eval_sums(eval_step, params, setup, setup.real_source, split, batch_sharding)
    results['accuracy_real'] = float(real['real_correct']) / max(1, int(real['real_count']))
    results['num_real'] = int(real['real_count'])
  return results


def evaluate_state(evaluate_params: Callable, state: dict) -> dict[str, float]:
  """The parameters' evaluation, and the Polyak average's as `polyak/...` (counts aside)."""
  results = evaluate_params(state['params'])
  if 'polyak' in state:
    averaged = evaluate_params(state['polyak'])
    results |= {f'polyak/{k}': v for k, v in averaged.items() if not k.startswith('num_')}
  return results


def _train_batches(setup: Setup, start: int, data_shards: int) -> Iterator[dict[str, jax.Array]]:
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
  )
  sharding = parallel.batch_sharding(setup.mesh)
  return (parallel.global_batch(local, sharding) for local in ds.as_numpy_iterator())


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
  }
  rundir.write_config(workdir, spec_lib.to_dict(spec), resolved)


def _start_state(setup: Setup, tx, lay, checkpoints) -> tuple[dict, dict]:
  """(state, checkpoint meta): the last checkpoint's, or a fresh state at step 0."""
  latest = checkpoints.last_saved
  if latest is not None:
    state, meta = checkpoints.restore(latest, lay)
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


def _loop(parts: _Parts, state: dict, start: int, stop_after: int | None):
  """Steps from `start` to the end; returns (state, last step, 'done' | 'preempted')."""
  step, total = start, parts.total_steps
  with actions.Preemption() as preemption:
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
      if preemption.requested or (stop_after is not None and step >= stop_after):
        if parts.checkpoints.last_saved != step:
          parts.saver(step=step, t=None, state=state)
        parts.progress.message(f'Stopping at step {step}: checkpoint saved, rerun to resume.')
        return state, step, 'preempted'
  if start < total:
    parts.progress.message(f'Done: {total} steps.')
  return state, step, 'done'


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
  )
  return actions.Evaluator(
    lambda state: evaluate(state['params']),
    guard,
    writer,
    progress,
    name='fewshot',
    describe=fewshot.describe,
  )


def _parts(setup, workdir, tx, schedule, lay, checkpoints, start, data_shards, writer) -> _Parts:
  spec, mesh, total = setup.spec, setup.mesh, setup.total_steps
  train_step = steps.train_step_for(
    spec, setup.model, tx, schedule, setup.num_classes, mesh, lay.shardings
  )
  eval_step = steps.compile_eval_step(setup.model, setup.num_classes, lay.shardings['params'], mesh)
  batch_sharding = parallel.batch_sharding(mesh)
  guard = actions.NonFiniteGuard(checkpoints)
  progress = actions.Progress(
    total_steps=total,
    batch=spec.data.batch,
    every_steps=spec.loop.progress_every or None,
    guard=guard,
    writer=writer,
  )
  evaluate_params = functools.partial(
    evaluate, eval_step, setup=setup, batch_sharding=batch_sharding
  )
  evaluator = actions.Evaluator(
    functools.partial(evaluate_state, evaluate_params), guard, writer, progress
  )
  saver = actions.Saver(checkpoints, guard, progress, spec.data.batch, data_shards)
  callbacks = [actions.every(spec.loop.eval_every, total, evaluator)]
  if setup.fewshot_tasks:
    action = _fewshot_action(setup, lay, guard, writer, progress)
    callbacks.append(actions.every(spec.evals.fewshot_every, total, action))
  callbacks.append(actions.every(spec.loop.checkpoint_every, total, saver))
  return _Parts(
    total_steps=total,
    train_step=train_step,
    batches=_train_batches(setup, start, data_shards),
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


def _run(spec, setup: Setup, workdir: str, checkpoints, stop_after) -> dict[str, Any]:
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
  parts = _parts(setup, workdir, tx, schedule, lay, checkpoints, start, data_shards, writer)
  if start >= setup.total_steps:
    _say(f'Already trained for {setup.total_steps} steps.')
  try:
    state, step, status = _loop(parts, state, start, stop_after)
  finally:
    if parts.profile is not None:
      parts.profile.close()
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
  os.makedirs(workdir, exist_ok=True)
  checkpoints = state_lib.Checkpoints(workdir, spec.loop.keep_checkpoints)
  try:
    result = _run(spec, setup, workdir, checkpoints, stop_after)
  finally:
    checkpoints.close()
  if result['status'] == 'done' and jax.process_index() == 0:
    rundir.plot_curves(workdir)
  return result

"""The train state: its shapes and shardings, a fresh start (scratch or pretrained), and the
orbax checkpoints it is saved to and restored from.

State: `{'params', 'opt_state', 'step': int32, 'rng': the dropout key's data (uint32[2] under
threefry2x32, uint32[4] under rbg and unsafe_rbg: `jax.random.key_data`)}`,
and with `polyak_decay` the parameters' average `'polyak'` (vit_jax/train/steps.py), shaped
and sharded like the parameters.
A checkpoint holds two items: `state`, and `meta` (JSON: the step, the global batch, the
number of data shards the training stream was read as, and the unreadable training images
replaced so far, and `prng_impl`: the PRNG implementation the key data belongs to).
"""

import contextlib
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import data as data_lib
from vit_jax import distributed, parallel, rundir
from vit_jax.checkpoint.orbax import drop_abandoned_read_tracebacks
from vit_jax.train import checkpoint_faults
from vit_jax.train.setup import Setup


@dataclasses.dataclass(frozen=True)
class Layout:
  """The state's abstract arrays (with their shardings), and the shardings alone."""

  abstract: dict[str, Any]
  shardings: dict[str, Any]


def layout(setup: Setup, tx, init_rng: jax.Array) -> Layout:
  """Shapes of the state under `jax.eval_shape`, placed by the spec's sharding rules."""
  mesh = setup.mesh
  params = jax.eval_shape(setup.task.init_fn(), init_rng)
  abstract = {
    'params': params,
    'opt_state': jax.eval_shape(tx.init, params),
    'step': jax.ShapeDtypeStruct((), jnp.int32),
    'rng': jax.eval_shape(jax.random.key_data, init_rng),
  }
  if setup.spec.step.polyak_decay:
    abstract['polyak'] = abstract['params']
  shardings = parallel.state_shardings(abstract, mesh, setup.spec.step.sharding)
  placed = jax.tree.map(
    lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
  )
  return Layout(abstract=placed, shardings=shardings)


def _pretrained_params(setup: Setup, init, init_rng, lay: Layout):
  """The pretrained file fitted to the model by the task (checkpoint surgery), placed on the
  mesh."""
  host_params = jax.device_get(jax.jit(init)(init_rng))
  loaded = setup.task.pretrained(setup.pretrained_path, host_params)
  abstract = lay.abstract['params']
  loaded = jax.tree.map(lambda x, a: np.asarray(x, dtype=a.dtype), loaded, abstract)
  return parallel.place(loaded, lay.shardings['params'])


def initial_state(setup: Setup, tx, lay: Layout, init_rng, dropout_rng) -> dict[str, Any]:
  """A fresh state on the mesh: initialised from scratch, or a pretrained file merged in."""
  shardings = lay.shardings
  init = setup.task.init_fn()

  if not setup.task.has_pretrained(setup.pretrained_path):

    def init_both(rng):
      params = init(rng)
      return params, tx.init(params)

    out = (shardings['params'], shardings['opt_state'])
    params, opt_state = jax.jit(init_both, out_shardings=out)(init_rng)
  else:
    params = _pretrained_params(setup, init, init_rng, lay)
    opt_state = jax.jit(tx.init, out_shardings=shardings['opt_state'])(params)
  state = {
    'params': params,
    'opt_state': opt_state,
    'step': jax.device_put(jnp.zeros((), jnp.int32), shardings['step']),
    'rng': jax.device_put(jax.random.key_data(dropout_rng), shardings['rng']),
  }
  if 'polyak' in shardings:  # its own buffers: the step donates the state
    copy = jax.jit(lambda p: jax.tree.map(jnp.copy, p), out_shardings=shardings['polyak'])
    state['polyak'] = copy(params)
  return state


def start(setup: Setup, checkpoints: 'Checkpoints') -> tuple[Layout, dict, dict, str]:
  """(layout, state, checkpoint meta, a line on where it came from): the newest checkpoint's
  state, or a fresh one at step 0 (initialised, or fine-tuned from the pretrained file)."""
  tx = setup.tx
  lay = layout(setup, tx, jax.random.key(setup.spec.init.seed))
  restored = checkpoints.restore_newest(lay)
  if restored is not None:
    latest, state, meta = restored
    check_resumable(meta, setup.spec.data.batch)
    return lay, state, meta, f'Resumed from checkpoint at step {latest} ({checkpoints.directory}).'
  init_rng, dropout_rng = jax.random.split(jax.random.key(setup.spec.init.seed))
  state = initial_state(setup, tx, lay, init_rng, dropout_rng)
  note = f'Fine-tuning from {setup.pretrained_path}.' if setup.pretrained_path else ''
  return lay, state, {'step': 0}, note


class Checkpoints:
  """The run's orbax CheckpointManager: async saves, the last `keep` kept. Its directory is
  made by the first save (orbax makes a step's parents), so a run that stops before it
  leaves none."""

  def __init__(self, workdir: str, keep: int):
    import orbax.checkpoint as ocp

    self._ocp = ocp
    self.directory = rundir.checkpoint_dir(workdir)
    options = ocp.CheckpointManagerOptions(
      max_to_keep=max(1, keep),
      create=False,
      enable_async_checkpointing=True,
      cleanup_tmp_directories=True,
      # A failed write ends every process's wait at once (not after orbax's 20 minutes).
      async_options=ocp.AsyncOptions(barrier_sync_fn=distributed.CheckpointBarrier())
      if jax.process_count() > 1
      else None,
    )
    self.manager = ocp.CheckpointManager(
      self.directory, options=options, item_names=('state', 'meta')
    )
    self.last_saved: int | None = self.manager.latest_step()
    self._writing: int | None = None  # the step being written
    self._closed = False
    checkpoint_faults.drop_write_failure_tracebacks(on_failure=self._write_failed)

  def _write_failed(self, error: BaseException) -> None:
    """This process's part of the write failed (seen in orbax's log): tell the others."""
    if self._writing is not None:
      distributed.abort_barriers(checkpoint_faults.failure_note(error))

  def save(self, step: int, state: dict[str, Any], meta: dict[str, Any]) -> None:
    """Starts writing `step` once the previous write has finished on every process."""
    self.settle()
    args = self._ocp.args
    items = args.Composite(state=args.StandardSave(state), meta=args.JsonSave(meta))
    self._writing = step
    with self._write_errors():
      self.manager.save(step, args=items, force=True)
    self.last_saved = step

  def settle(self) -> None:
    """Waits for the write in flight; the processes vote on its outcome, so a write that
    failed on any of them ends every process with the same one-line CheckpointWriteError."""
    own = None
    try:
      self.wait()
    except checkpoint_faults.CheckpointWriteError as e:
      own = e
    # A note is 'p' (a peer's failure seen here) or 'o' (this process's own) + the line.
    note = None if own is None else ('p' if own.from_peer else 'o') + str(own)
    problems = distributed.Vote('checkpoint_write')(note)
    if problems:  # the lowest process whose own write failed, else the lowest one
      process, note = min(problems.items(), key=lambda item: (item[1][0] == 'p', item[0]))
      message = note[1:]
      where = f'process {process}: ' if jax.process_count() > 1 else ''
      error = checkpoint_faults.CheckpointWriteError(where + message)
      error.errno = own.errno if own is not None else None
      raise error

  @contextlib.contextmanager
  def _write_errors(self):
    """orbax's and TensorStore's errors of a failed write as one CheckpointWriteError."""
    try:
      yield
    except checkpoint_faults.CheckpointWriteError:
      raise
    except Exception as e:
      step, self._writing = self._writing, None
      if checkpoint_faults.is_collective_failure(e):
        raise  # orbax's sync between the processes failed (a peer died): not the disk's fault
      self.last_saved = self._good_steps()[-1] if self._good_steps() else None
      path = f'{self.directory}/{step}'
      raise checkpoint_faults.write_failure(path, e, self._good_steps()) from None

  def _good_steps(self) -> list[int]:
    return rundir.checkpoint_steps(self.directory)

  def restore(self, step: int, lay: Layout) -> tuple[dict[str, Any], dict[str, Any]]:
    """(state, meta) of `step`; raises what orbax raises on a damaged or unfitting step."""
    args = self._ocp.args
    items = args.Composite(state=args.StandardRestore(lay.abstract), meta=args.JsonRestore())
    restored = self.manager.restore(step, args=items)
    return restored['state'], restored['meta']

  def restore_newest(self, lay: Layout) -> tuple[int, dict, dict] | None:
    """(step, state, meta) of the newest step every process restores; None without steps.

    A newer step that fails on any process (truncated or missing files, bad metadata, no
    commit marker, an empty directory) is reported in one line and set aside as
    `<step>.damaged-<n>`, nothing deleted. When no step restores, a one-line ValueError.
    """
    vote = distributed.Vote('restore')
    failed: list[tuple[int, str]] = []
    drop_abandoned_read_tracebacks()
    for step in sorted(self.manager.all_steps(), reverse=True):
      problem, restored = rundir.checkpoint_step_problem(self.directory, step), None
      if problem is None:
        self._check_prng(step)
        try:
          restored = self.restore(step, lay)
        except Exception as e:  # orbax and tensorstore raise many kinds on damaged files
          problem = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
      problems = vote(problem)
      if not problems:
        self._set_aside(failed, step)
        return (step, *restored)
      failed.append((step, next(iter(problems.values()))))
    if failed:
      reasons = '; '.join(f'{self.directory}/{s} ({why})' for s, why in failed)
      raise ValueError(
        f'Cannot resume from {reasons}: damaged, or written for another config (model, '
        'optimizer or dtype changed?); nothing was changed: move the steps away to start '
        'afresh, or use a new --workdir.'
      )
    return None

  def _check_prng(self, step: int) -> None:
    """A ValueError when `step`'s RNG key was made by another PRNG implementation than
    this run's (its key data has another shape: a restore would fail as if damaged)."""
    try:
      meta = self.manager.restore(
        step, args=self._ocp.args.Composite(meta=self._ocp.args.JsonRestore())
      )
      saved = meta['meta'].get('prng_impl', DEFAULT_PRNG_IMPL)
    except Exception:  # a damaged meta item: the full restore below names the damage
      return
    if saved != prng_impl():
      raise ValueError(
        f'{self.directory}/{step} was written under the PRNG implementation {saved!r}, this run '
        f'uses {prng_impl()!r}: set JAX_DEFAULT_PRNG_IMPL={saved} to '
        'resume, or start afresh with a new --workdir.'
      )

  def _set_aside(self, failed: list[tuple[int, str]], good: int) -> None:
    """Damaged steps newer than `good` renamed on process 0; orbax's list read again."""
    if not failed:
      return
    for step, why in failed:
      if jax.process_index() == 0:
        aside = rundir.set_aside_checkpoint(self.directory, step)
        print(
          f'Checkpoint {self.directory}/{step} is damaged ({why}): resuming from step {good}; '
          f'the damaged step is kept as {aside}.',
          flush=True,
        )
    distributed.Vote('set_aside')(None)  # every process waits for the renames
    self.manager.reload()
    self.last_saved = self.manager.latest_step()

  def wait(self) -> None:
    """Waits for the write in flight (this process); CheckpointWriteError if it failed."""
    with self._write_errors():
      self.manager.wait_until_finished()
    self._writing = None

  def close(self) -> None:
    """Waits for the write in flight and closes; a failed write raises once."""
    if self._closed:
      return
    self._closed = True
    try:
      self.wait()
    finally:
      with contextlib.suppress(Exception):  # its error was raised (or is being raised) above
        self.manager.close()


DEFAULT_PRNG_IMPL = 'threefry2x32'  # JAX's default, and that of checkpoints without prng_impl


def prng_impl() -> str:
  """The name of the PRNG implementation new keys are made by (jax_default_prng_impl)."""
  return str(jax.config.jax_default_prng_impl)


def checkpoint_meta(step: int, batch: int, data_shards: int, bad_images: int = 0) -> dict:
  return {
    'step': step,
    'prng_impl': prng_impl(),
    'global_batch': batch,
    'data_shards': data_shards,
    'bad_images': bad_images,
  }


def check_resumable(meta: dict[str, Any], batch: int) -> None:
  saved = int(meta.get('global_batch', batch))
  if saved != batch:
    raise ValueError(
      f'The checkpoint was written with batch {saved}, the config says {batch}: resume with '
      f'--config.batch={saved}.'
    )


def data_shards_for(configured: int, batch: int, meta: dict) -> tuple[int, str | None]:
  """How many shards the training stream has, and a note when a resumed stream changes.

  config.data_shards if set; else the checkpoint's, so a run resumed on another number of
  processes continues the same stream (if they divide it); else one shard per process.
  """
  processes = jax.process_count()
  saved = int(meta.get('data_shards') or 0)
  shards = configured
  if not shards:
    shards = saved if saved and saved % processes == 0 else processes
  data_lib.check_data_shards(shards, batch, processes)
  note = None
  if saved and saved != shards:
    note = (
      f'The checkpoint read its training data as {saved} shards, this run reads {shards} '
      f'({processes} processes): the example order differs from here on. Set '
      f'--config.data_shards={saved} with a process count that divides it to continue it exactly.'
    )
  return shards, note

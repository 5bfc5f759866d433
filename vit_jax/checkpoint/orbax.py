"""Orbax checkpoints, as a training run writes them: `WORKDIR/checkpoints/<step>/<item>/`.

Only the parameters are restored, as numpy arrays on the host whatever sharding they were saved
with (a partial restore: optimizer state is not read). `path` may be the run directory, its
`checkpoints/` directory (the latest finished step is taken), one step directory, or one item
directory. The parameters are the item named `params`, or the `params` entry of an item's tree
(e.g. a train state `{'params': ..., 'opt_state': ..., 'step': ...}`), or an item whose tree
is itself a parameter tree of a model family (ViT, Mixer, image-text). The layout is generic on
purpose: it assumes nothing of the training loop beyond orbax's own directory structure; a
training run's config.json adds what the shapes cannot say (`fields`).
"""

import json
import logging
import re
import sys
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from etils.epath import Path

from vit_jax import families, files, logs, rundir
from vit_jax.checkpoint.npz import check_arrays
from vit_jax.checkpoint.tree import CheckpointError, flatten

PREFERRED_ITEMS = ('params', 'state', 'train_state')


def _items(step: Path) -> list[Path]:
  if not step.is_dir():
    return []
  return sorted((c for c in step.iterdir() if rundir.is_checkpoint_item(c)), key=lambda c: c.name)


def _resolve(path: Path) -> tuple[list[Path], str]:
  """(candidate item directories, which step) for any of the accepted paths."""
  if rundir.is_checkpoint_item(path):
    return [path], path.parent.name
  if _items(path):
    return _items(path), path.name
  for directory in (path, path / rundir.CHECKPOINT_DIR):
    steps = [directory / str(s) for s in rundir.checkpoint_steps(directory)]
    steps = [s for s in steps if _items(s)]  # finished steps (orbax's own test) with items
    if steps:
      return _items(steps[-1]), steps[-1].name
  return [], ''


def detect(path: Path) -> bool:
  """A run, checkpoints, step or item directory of orbax checkpoints."""
  return path.is_dir() and bool(_resolve(path)[0])


def _is_params(tree: Any) -> bool:
  """A parameter tree of any model family (a training run's `params` entry is one by its
  place; a bare item is asked of the families)."""
  return isinstance(tree, Mapping) and families.of_tree(tree) is not None


def _find_params(name: str, tree: Any, entry: str = 'params') -> tuple[str, ...] | None:
  """The path of the parameter tree `entry` ('params', or a training state's 'polyak')
  inside an item's tree, or None."""
  if name == entry and _is_params(tree):
    return ()
  if isinstance(tree, Mapping) and entry in tree:
    sub = tree[entry]
    if _is_params(sub):
      return (entry,)
    if isinstance(sub, Mapping) and _is_params(sub.get('params')):  # {'params': {'params': ...}}
      return (entry, 'params')
  if _is_params(tree) and entry == 'params':
    return ()
  return None


def fields(path: Path) -> dict[str, Any]:
  """What a training run's config.json states of its model beyond the shapes (its family's
  `stated_fields`: an image-text model's text heads and tokenizer); {} outside a run."""
  run = rundir.find_run(path)
  if run is None:
    return {}
  model = rundir.read_config(run).get('model')
  if not isinstance(model, Mapping):  # a registered name: the registry states it
    return {}
  try:
    family = families.of_config(model)
  except ValueError:
    return {}
  return family.stated_fields(model)


def _abandoned_read_error(error: BaseException | None) -> bool:
  """A tensorstore read error ('OUT_OF_RANGE: Error reading ...'), as a damaged file gives."""
  return isinstance(error, ValueError) and bool(_TENSORSTORE_READ_ERROR.match(str(error)))


_TENSORSTORE_READ_ERROR = re.compile(r'[A-Z_]+: Error (opening|reading) ')
_NEVER_RETRIEVED = ('Task exception was never retrieved', 'Future exception was never retrieved')


class _AbandonedTasks(logging.Filter):
  """asyncio's 'Task (or Future) exception was never retrieved' for a read a failed restore
  abandoned; which of the two depends on when the collector finds it."""

  def filter(self, record: logging.LogRecord) -> bool:
    error = record.exc_info[1] if record.exc_info else None
    never_retrieved = record.getMessage().startswith(_NEVER_RETRIEVED)
    return not (never_retrieved and _abandoned_read_error(error))


def drop_abandoned_read_tracebacks() -> None:
  """Before an orbax read: one that fails (a damaged file) abandons its other reads; each
  finishing later reaches the event loop orbax has closed ('Event loop is closed', through
  `sys.unraisablehook`), or is collected with its error unread (asyncio's 'Task (or Future)
  exception was never retrieved', through its logger), and prints a traceback around the caller's
  one-line error until the process exits. From now on those, and only those, are dropped
  (installing it twice is a no-op)."""
  previous = sys.unraisablehook
  if getattr(previous, 'drops_abandoned_reads', False):
    return

  def hook(unraisable: Any) -> None:
    late = isinstance(unraisable.exc_value, RuntimeError) and (
      str(unraisable.exc_value) == 'Event loop is closed'
    )
    if not late:
      previous(unraisable)

  hook.drops_abandoned_reads = True
  sys.unraisablehook = hook
  logging.getLogger('asyncio').addFilter(_AbandonedTasks())


def _first_line(e: BaseException) -> str:
  return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def _tree_metadata(ocp, checkpointer, item: Path) -> Any:
  metadata = checkpointer.metadata(item)
  tree = getattr(getattr(metadata, 'item_metadata', metadata), 'tree', None)
  if tree is None:  # an item of a Composite save (our training runs) has no step metadata
    tree = getattr(ocp.PyTreeCheckpointHandler().metadata(item.resolve()), 'tree', None)
  if tree is None:
    raise CheckpointError(f'{item}: no PyTree metadata')
  return tree


def _readable_item(item: Path) -> bool:
  """A step's item whose tree metadata (`_METADATA`, JSON) reads, in a finished step."""
  try:
    json.loads((item / '_METADATA').read_text())
  except (OSError, ValueError):
    return False
  return rundir.checkpoint_step_problem(item.parent.parent, int(item.parent.name)) is None


def _damaged(item: Path, reason: str) -> str:
  """The damaged step of `item`, and the newest earlier step whose same item reads."""
  step_dir = item.parent
  message = f'{step_dir}: the orbax checkpoint is damaged ({item.name}: {reason})'
  if step_dir.name.isdigit():
    earlier = [s for s in rundir.checkpoint_steps(step_dir.parent) if s < int(step_dir.name)]
    for step in reversed(earlier):
      if _readable_item(step_dir.parent / str(step) / item.name):
        good = step_dir.parent / str(step)
        return f'{message}; the newest good step is {step}: convert {good}'
  return f'{message}; no earlier step of it reads'


def read(path: str | Path, *, params_entry: str = 'params', **unused: Any) -> tuple[dict, str]:
  """Restores the parameters of an orbax checkpoint; returns (tree, description).

  `params_entry='polyak'` restores a training run's Polyak average instead of its parameters.
  """
  del unused
  import orbax.checkpoint as ocp  # heavy (tensorstore): only when an orbax checkpoint is read

  path = files.path(files.absolute(path))  # orbax's tensorstore specs need absolute paths
  items, step = _resolve(path)
  if not items:
    raise CheckpointError(f'{path}: no finished orbax checkpoint here (no <step>/<item>/_METADATA)')
  rank = {name: i for i, name in enumerate(PREFERRED_ITEMS)}
  items.sort(key=lambda c: rank.get(c.name, len(rank)))  # stable: the rest by name
  checkpointer = ocp.PyTreeCheckpointer()
  drop_abandoned_read_tracebacks()
  damaged = None  # (item, reason): a parameter item whose metadata cannot be read
  with logs.errors_only('absl'):  # orbax: metadata files a partial restore does not need
    for item in items:
      try:
        tree = _tree_metadata(ocp, checkpointer, item)
      except Exception as e:  # not a PyTree item (e.g. JSON metadata), or a damaged one
        if item.name in PREFERRED_ITEMS and damaged is None:
          damaged = (item, _first_line(e))
        continue
      where = _find_params(item.name, tree, params_entry)
      if where is None:
        continue
      target = tree
      for key in where:
        target = target[key]
      for key in reversed(where):
        target = {key: target}
      restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), target)
      try:
        restored = checkpointer.restore(
          item,
          args=ocp.args.PyTreeRestore(item=target, restore_args=restore_args, partial_restore=True),
        )
      except Exception as e:
        raise CheckpointError(_damaged(item, _first_line(e))) from None
      for key in where:
        restored = restored[key]
      params = jax.tree.map(np.asarray, dict(restored))
      check_arrays(flatten(params), str(item))
      inside = '/'.join(where) or 'the whole item'
      return params, f'orbax (step {step}, item {item.name!r}, {inside})'
  if damaged is not None:
    raise CheckpointError(_damaged(*damaged))
  names = ', '.join(c.name for c in items)
  if params_entry != 'params':
    raise CheckpointError(
      f'{path}: no {params_entry!r} parameters in the orbax items ({names}); a training run '
      'keeps its Polyak average only with --config.polyak_decay > 0'
    )
  raise CheckpointError(
    f'{path}: no model parameters in the orbax items ({names}); expected an item named params or a'
    " tree with a 'params' entry"
  )

"""The run directory's format, defined once: training writes it; predict, reproduce read it.

  config.json              the resolved config (every key), and under `_resolved` what the
                           run derived: total_steps, num_classes, class_names, devices,
                           processes, pretrained_path
  metrics.jsonl            one JSON object per line with `step`: training lines (loss,
                           learning_rate, grad_norm, img_per_sec; bad_images, the unreadable
                           training images skipped so far, once there is one) and evaluation
                           lines (accuracy_test, accuracy_test_top5, loss_test, num_test;
                           bad_test_images where unreadable test images were left out)
  events.out.tfevents.*    the same scalars for TensorBoard (vit_jax/train/events.py)
  plugins/profile/         profiler traces (config.profile_steps) for TensorBoard
  checkpoints/<step>/      orbax: items `state` (params, optimizer state, step, RNG) and
                           `meta` (step, global batch, data shards, bad images); the folder
                           is made by the first save
  checkpoints/<step>.damaged-<n>/   a step found damaged at restore, set aside (kept)
  curves.png               loss and accuracy curves, written at the end

Any path may be a bucket URL (gs://...): every file goes through vit_jax.files.

metrics.jsonl is written a whole line at a time: a process killed while writing leaves at
most its last line without its newline (in a bucket, each write replaces the whole object).
Reading ignores such a torn last line (with a warning; a resumed run writes it again); any
other line that is not JSON is an error that names the file and the line.
"""

import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

from absl import logging
from etils.epath import Path

from vit_jax import files

CONFIG_FILE = 'config.json'
METRICS_FILE = 'metrics.jsonl'
CURVES_FILE = 'curves.png'
CHECKPOINT_DIR = 'checkpoints'
CHECKPOINT_COMMIT_MARKER = 'commit_success.txt'  # orbax's, written last into a finished step
RESOLVED = '_resolved'
# How far above a checkpoint path its run directory may be: RUN/checkpoints/<step>/<item>.
_RUN_DEPTH = 3


# ----------------------------------------------------------------------------------------
# config.json
# ----------------------------------------------------------------------------------------


def write_config(workdir: str, config: Mapping[str, Any], resolved: Mapping[str, Any]) -> None:
  """config.json: `config` (plain values) and, under `_resolved`, what the run derived."""
  text = json.dumps({**config, RESOLVED: dict(resolved)}, indent=2, sort_keys=True)
  files.atomic_write_text(files.join(workdir, CONFIG_FILE), text)


def read_config(workdir: str | os.PathLike) -> dict[str, Any]:
  return json.loads(files.path(workdir).joinpath(CONFIG_FILE).read_text())


def resolved(config: Mapping[str, Any]) -> dict[str, Any]:
  """The `_resolved` part of a config.json (empty for configs written by other tools)."""
  value = config.get(RESOLVED)
  return dict(value) if isinstance(value, Mapping) else {}


def total_steps(config: Mapping[str, Any]) -> int:
  """The steps the run trains for: resolved (from total_epochs), else as configured."""
  return int(resolved(config).get('total_steps') or config.get('total_steps') or 0)


def is_run(path: str | os.PathLike) -> bool:
  """A directory holding a run: config.json and metrics.jsonl."""
  path = files.path(path)
  return (path / CONFIG_FILE).is_file() and (path / METRICS_FILE).is_file()


def find_run(path: str | os.PathLike) -> Path | None:
  """The run directory `path` is in (itself, or a checkpoint below it), or None."""
  path = files.path(files.absolute(path))
  start = path if path.is_dir() else path.parent
  for directory in [start, *list(start.parents)[:_RUN_DEPTH]]:
    if (directory / CONFIG_FILE).is_file() and RESOLVED in _read_json_or_empty(directory):
      return directory
  return None


def _read_json_or_empty(directory: Path) -> dict:
  try:
    config = read_config(directory)
  except (OSError, ValueError):
    return {}
  return config if isinstance(config, dict) else {}


def class_names(workdir: str | os.PathLike) -> list[str] | None:
  """The names of the classes the run trained on, in label order (None if not recorded)."""
  names = resolved(_read_json_or_empty(files.path(workdir))).get('class_names')
  return [str(n) for n in names] if isinstance(names, list) else None


# ----------------------------------------------------------------------------------------
# metrics.jsonl
# ----------------------------------------------------------------------------------------


def _lines(path: Path) -> Iterator[tuple[int, str]]:
  with path.open('r') as f:
    yield from enumerate(f, 1)


def read_metrics(workdir: str | os.PathLike) -> list[dict[str, Any]]:
  """The metric lines of a run, in order ([] when there are none yet).

  A torn last line (no newline: the writer was killed) is left out with a warning; any
  other line that is not a JSON object raises a ValueError naming the file and line.
  """
  path = files.path(workdir) / METRICS_FILE
  if not path.exists():
    return []
  records = []
  for n, line in _lines(path):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except json.JSONDecodeError as e:
      if not line.endswith('\n'):
        logging.warning('%s:%d: a torn last line (the run was killed), ignored.', path, n)
        break
      raise ValueError(f'{path}:{n} is not JSON ({e.msg}); expected one object a line.') from e
    if not isinstance(record, dict) or 'step' not in record:
      raise ValueError(f'{path}:{n} is not a metrics line (a JSON object with "step").')
    records.append(record)
  return records


def last_evaluation(workdir: str | os.PathLike) -> dict[str, Any] | None:
  """The last evaluation line (the one with `accuracy_test`) of a run, or None."""
  evaluations = [m for m in read_metrics(workdir) if 'accuracy_test' in m]
  return evaluations[-1] if evaluations else None


class MetricsLog:
  """Appends metric lines to metrics.jsonl, one whole line at a time.

  A run resumed from the checkpoint at `resume_step` keeps the lines up to that step (the
  later ones will be written again); a fresh run (None) starts an empty file.
  """

  def __init__(self, workdir: str, resume_step: int | None):
    self.path = files.join(workdir, METRICS_FILE)
    kept = []
    if resume_step is not None:
      kept = [m for m in read_metrics(workdir) if m['step'] <= resume_step]
    self._file = files.AppendFile(self.path, ''.join(json.dumps(m) + '\n' for m in kept).encode())

  def write(self, step: int, scalars: Mapping[str, Any]) -> None:
    self._file.write((json.dumps({'step': int(step), **scalars}) + '\n').encode())

  def close(self) -> None:
    self._file.close()


# ----------------------------------------------------------------------------------------
# Checkpoint locations, through orbax's public API.
# ----------------------------------------------------------------------------------------


def checkpoint_dir(workdir: str | os.PathLike) -> str:
  """WORKDIR/checkpoints, absolute (orbax's tensorstore specs need absolute paths)."""
  return files.join(files.absolute(workdir), CHECKPOINT_DIR)


def checkpoint_steps(directory: str | os.PathLike) -> list[int]:
  """The finished (committed) checkpoint steps in an orbax checkpoints directory, sorted."""
  directory = files.path(directory)
  if not directory.is_dir():
    return []
  import orbax.checkpoint as ocp  # heavy (tensorstore): only when checkpoints are looked at

  return sorted(ocp.path.step.checkpoint_steps(directory))


def latest_step(workdir: str | os.PathLike) -> int | None:
  """The run's last finished checkpoint step, or None; creates nothing."""
  steps = checkpoint_steps(checkpoint_dir(workdir))
  return steps[-1] if steps else None


def checkpoint_step_problem(directory: str | os.PathLike, step: int) -> str | None:
  """What is visibly wrong with a step directory that orbax lists as finished, or None.

  orbax writes `commit_success.txt` last into every step it finishes; on a filesystem
  without atomic rename (Cloud Storage) a step directory without it was cut short.
  """
  path = files.path(directory) / str(step)
  if not any(path.iterdir()):
    return 'an empty directory'
  if not (path / CHECKPOINT_COMMIT_MARKER).exists():
    return f'no {CHECKPOINT_COMMIT_MARKER}: the write was cut short'
  return None


def set_aside_checkpoint(directory: str | os.PathLike, step: int) -> str:
  """Renames a damaged step to `<step>.damaged-<n>` (orbax no longer lists it); its path."""
  path = files.path(directory) / str(step)
  n = 1
  while (aside := path.parent / f'{step}.damaged-{n}').exists():
    n += 1
  path.rename(aside)
  return os.fspath(aside)


def is_checkpoint_item(path: str | os.PathLike) -> bool:
  """An orbax PyTree item directory (e.g. `checkpoints/<step>/state`)."""
  path = files.path(path)
  if not path.is_dir():
    return False
  import orbax.checkpoint as ocp

  return ocp.path.format_utils.is_pytree_checkpoint(path)


# ----------------------------------------------------------------------------------------
# Curves
# ----------------------------------------------------------------------------------------


def plot_curves(workdir: str) -> str | None:
  """curves.png: training loss and test accuracy against the step (from metrics.jsonl)."""
  metrics = read_metrics(workdir)
  if not metrics:
    return None
  from matplotlib.figure import Figure  # not pyplot: the caller's backend stays as it is

  train = [(m['step'], m['loss']) for m in metrics if 'loss' in m]
  test = [(m['step'], m['accuracy_test']) for m in metrics if 'accuracy_test' in m]
  fig = Figure(figsize=(10, 4))
  ax_loss, ax_acc = fig.subplots(1, 2)
  if train:
    ax_loss.plot(*zip(*train, strict=True), lw=1)
  ax_loss.set(xlabel='step', ylabel='training loss', yscale='log', title='Training loss')
  if test:
    ax_acc.plot(*zip(*test, strict=True), marker='o', ms=3)
    ax_acc.set_title(f'Test accuracy (final {test[-1][1]:.2%})')
  ax_acc.set(xlabel='step', ylabel='top-1 accuracy')
  ax_acc.grid(alpha=0.3)
  fig.tight_layout()
  path = files.join(workdir, CURVES_FILE)
  files.atomic_write(path, lambda f: fig.savefig(f, format='png', dpi=100))
  return path

r"""VTAB-1k: the 19 tasks of the Visual Task Adaptation Benchmark, their data and their report.

Each task is a tfds dataset, a label (some tasks derive it from annotations: object counts,
distances, positions binned into classes) and the standard splits of the benchmark's
reference code (google-research/task_adaptation): `train800` (800 training examples),
`val200` (200 development examples), `train800val200` (their union, the final training set)
and `test`. A task is read as the dataset `vtab/<task>`, e.g. `vtab/clevr_count`:

  python -m vit_jax.main --config=configs/vtab.py:b16,clevr_count --workdir=runs/vtab/clevr_count \
      --config.pretrained_dir=checkpoints

The paper's protocol (Table 4): 2500 steps at learning rate 0.01 for every task, trained on
train800val200 and evaluated on test; three runs give mean ± std. This module runs all 19
(`python -m vit_jax.reproduce vtab`), prints the commands for a cluster, and reports
per-task accuracy and the means of the natural, specialized and structured groups.
"""

import dataclasses
import json
import os
import statistics
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from vit_jax import files
from vit_jax.data.sources import TfdsSource

GROUPS = ('natural', 'specialized', 'structured')
SPLIT_ALIASES = ('train800', 'val200', 'train800val200', 'test')
DEV_EXAMPLES = 200
# Every task trains on the first 800 examples of tfds 'train'.
TRAIN800 = 'train[:800]'


def _label(record):
  return record['label']


def _clevr_count(record):
  # 3 to 10 objects -> classes 0..7.
  return tf.cast(tf.size(record['objects']['size']) - 3, tf.int64)


def _thresholded(value, thresholds) -> tf.Tensor:
  """Index of the last threshold below `value` (the bins of the reference code)."""
  below = tf.where(tf.constant(thresholds, tf.float32) - tf.cast(value, tf.float32) < 0)
  return tf.cast(tf.reduce_max(below), tf.int64)


def _clevr_distance(record):
  # Depth of the closest object, in 6 bins.
  depth = tf.reduce_min(record['objects']['pixel_coords'][:, 2])
  return _thresholded(depth, (0.0, 8.0, 8.5, 9.0, 9.5, 10.0, 100.0))


def _kitti_distance(record):
  # Depth of the closest car, van or truck (types 0-2): < 8 m, < 20 m, farther, or none.
  objects = record['objects']
  vehicles = tf.where(objects['type'] < 3)[:, 0]
  depths = tf.gather(objects['location'][:, 2], vehicles)
  depth = tf.reduce_min(tf.concat([depths, tf.constant([1000.0], depths.dtype)], 0))
  return _thresholded(depth, (-100.0, 8.0, 20.0, 999.0))


def _binned(key: str, original: int, classes: int):
  """dSprites: `original` integer values grouped into `classes` equal bins."""

  def label(record):
    value = tf.cast(record[key], tf.float32)
    return tf.cast(tf.math.floordiv(value, original / classes), tf.int64)

  return label


def _feature(key: str):
  return lambda record: tf.cast(record[key], tf.int64)


@dataclasses.dataclass(frozen=True)
class Task:
  """One VTAB-1k task: tfds name, label, class count and the tfds splits behind each alias."""

  name: str
  group: str
  tfds_name: str
  num_classes: int
  val200: str
  test: str
  label_fn: Callable = _label
  # The features `label_fn` reads (tfds.decode.PartialDecoding spec); None: {'label': True}.
  # Nothing else is decoded (e.g. Pets' segmentation masks).
  features: Mapping | None = None
  # dSprites stores pixels as 0/1: scaled to 0/255.
  pixel_scale: int = 1

  @property
  def decoders(self) -> tfds.decode.PartialDecoding:
    """Decode only the label's features; the image stays encoded until the pipeline decodes it."""
    features = {'image': True, **(self.features or {'label': True})}
    return tfds.decode.PartialDecoding(features, decoders={'image': tfds.decode.SkipDecoding()})

  @property
  def splits(self) -> dict[str, str]:
    """Alias -> tfds split string."""
    return {
      'train800': TRAIN800,
      'val200': self.val200,
      'train800val200': f'{TRAIN800}+{self.val200}',
      'test': self.test,
    }


def _from_train(train_count: int) -> str:
  """val200 of a dataset whose development split is cut from tfds 'train' at `train_count`."""
  return f'train[{train_count}:{train_count + DEV_EXAMPLES}]'


# Boundaries are the reference code's, computed from the tfds split sizes: e.g. CIFAR-100's
# train is the first 90% of tfds 'train' (45,000), so val200 starts at 45,000.
TASKS: dict[str, Task] = {
  t.name: t
  for t in (
    Task('caltech101', 'natural', 'caltech101', 102, _from_train(2754), 'test'),
    Task('cifar100', 'natural', 'cifar100', 100, _from_train(45000), 'test'),
    Task('dtd', 'natural', 'dtd', 47, 'validation[:200]', 'test'),
    Task('oxford_flowers102', 'natural', 'oxford_flowers102', 102, 'validation[:200]', 'test'),
    Task('oxford_iiit_pet', 'natural', 'oxford_iiit_pet', 37, _from_train(2944), 'test'),
    Task('sun397', 'natural', 'sun397/tfds', 397, 'validation[:200]', 'test'),
    Task('svhn', 'natural', 'svhn_cropped', 10, _from_train(65931), 'test'),
    Task('patch_camelyon', 'specialized', 'patch_camelyon', 2, 'validation[:200]', 'test'),
    Task('eurosat', 'specialized', 'eurosat/rgb', 10, _from_train(16200), 'train[21600:]'),
    Task('resisc45', 'specialized', 'resisc45', 45, _from_train(18900), 'train[25200:]'),
    Task(
      'diabetic_retinopathy',
      'specialized',
      'diabetic_retinopathy_detection/btgraham-300',
      5,
      'validation[:200]',
      'test',
    ),
    Task(
      'clevr_count',
      'structured',
      'clevr',
      8,
      _from_train(63000),
      'validation',
      label_fn=_clevr_count,
      features={'objects': {'size': True}},
    ),
    Task(
      'clevr_distance',
      'structured',
      'clevr',
      6,
      _from_train(63000),
      'validation',
      label_fn=_clevr_distance,
      features={'objects': {'pixel_coords': True}},
    ),
    Task('dmlab', 'structured', 'dmlab', 6, 'validation[:200]', 'test'),
    Task(
      'kitti_distance',
      'structured',
      'kitti',
      4,
      'validation[:200]',
      'test',
      label_fn=_kitti_distance,
      features={'objects': {'type': True, 'location': True}},
    ),
    Task(
      'dsprites_location',
      'structured',
      'dsprites',
      16,
      _from_train(589824),
      'train[663552:]',
      label_fn=_binned('label_x_position', 32, 16),
      features={'label_x_position': True},
      pixel_scale=255,
    ),
    Task(
      'dsprites_orientation',
      'structured',
      'dsprites',
      16,
      _from_train(589824),
      'train[663552:]',
      label_fn=_binned('label_orientation', 40, 16),
      features={'label_orientation': True},
      pixel_scale=255,
    ),
    Task(
      'smallnorb_azimuth',
      'structured',
      'smallnorb',
      18,
      'test[:200]',
      'test[50%:]',
      label_fn=_feature('label_azimuth'),
      features={'label_azimuth': True},
    ),
    Task(
      'smallnorb_elevation',
      'structured',
      'smallnorb',
      9,
      'test[:200]',
      'test[50%:]',
      label_fn=_feature('label_elevation'),
      features={'label_elevation': True},
    ),
  )
}


def tasks_in(selection: str | Sequence[str] = 'all') -> list[str]:
  """Task names for 'all', a group name, or a comma-separated list / sequence of task names."""
  names = selection.split(',') if isinstance(selection, str) else list(selection)
  out = []
  for name in (n.strip() for n in names):
    if name == 'all':
      out += list(TASKS)
    elif name in GROUPS:
      out += [t for t, task in TASKS.items() if task.group == name]
    elif name in TASKS:
      out.append(name)
    else:
      raise ValueError(
        f'Unknown VTAB task {name!r}; expected all, {", ".join(GROUPS)}, or one of '
        f'{", ".join(TASKS)}.'
      )
  return list(dict.fromkeys(out))


class VtabSource(TfdsSource):
  """A VTAB-1k task as a data source: its label, and split aliases (train800, val200, ...).

  Any other split string is passed to tfds unchanged (e.g. 'train' for full-data runs).
  """

  def __init__(self, task: str, data_dir: str | None = None):
    if task not in TASKS:
      raise ValueError(f'Unknown VTAB task {task!r}; expected one of {", ".join(TASKS)}.')
    self.task = TASKS[task]
    self.name = f'vtab/{task}'
    self.builder = tfds.builder(self.task.tfds_name, data_dir=data_dir)
    self.num_classes = self.task.num_classes
    self._counts: dict[tuple[str, int, int], int] = {}

  def tfds_split(self, split: str) -> str:
    """The tfds split string behind an alias ('val200' -> 'train[2754:2954]' for caltech101)."""
    return self.task.splits.get(split, split)

  def records(self, split: str, process_index: int = 0, process_count: int = 1) -> tf.data.Dataset:
    ds = self.builder.as_dataset(
      split=self._split(self.tfds_split(split), process_index, process_count),
      shuffle_files=False,
      decoders=self.task.decoders,
    )
    label_fn = self.task.label_fn
    return ds.map(lambda r: {'image': r['image'], 'label': label_fn(r)})

  def num_examples(self, split: str, process_index: int = 0, process_count: int = 1) -> int:
    return super().num_examples(self.tfds_split(split), process_index, process_count)

  def decode(self, image: tf.Tensor) -> tf.Tensor:
    image = tf.io.decode_image(image, channels=3, expand_animations=False)
    if self.task.pixel_scale != 1:
      image = image * tf.constant(self.task.pixel_scale, tf.uint8)
    return image


def source(task: str, data_dir: str | None = None) -> VtabSource:
  """`vit_jax.data.get_source('vtab/<task>')` lands here."""
  return VtabSource(task, data_dir)


# ----------------------------------------------------------------------------------------
# Results: per task, per group and overall, beside the paper's VTAB column of Table 2.
# ----------------------------------------------------------------------------------------


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
  mean = float(np.mean(values))
  std = statistics.stdev(values) if len(values) > 1 else 0.0
  return mean, std


def summarize(accuracies: dict[str, Sequence[float]]) -> dict:
  """Per-task mean/std (%), group means and the 19-task mean (only if every task has runs).

  The group and overall means average the per-task means, as VTAB does; the std of the
  overall mean is over seeds (the mean over tasks of each seed), as the paper's Table 2.
  """
  tasks = {}
  for name in TASKS:
    values = [100 * a for a in accuracies.get(name, [])]
    if values:
      mean, std = _mean_std(values)
      tasks[name] = {'mean': mean, 'std': std, 'runs': len(values)}
  groups = {}
  for group in GROUPS:
    names = [n for n, t in TASKS.items() if t.group == group]
    if all(n in tasks for n in names):
      groups[group] = float(np.mean([tasks[n]['mean'] for n in names]))
  summary = {'tasks': tasks, 'groups': groups, 'mean': None, 'std': None, 'complete': False}
  if len(tasks) == len(TASKS):
    summary['complete'] = True
    summary['mean'] = float(np.mean([t['mean'] for t in tasks.values()]))
    runs = min(t['runs'] for t in tasks.values())
    per_seed = [np.mean([100 * accuracies[n][i] for n in TASKS]) for i in range(runs)]
    summary['std'] = statistics.stdev(per_seed) if runs > 1 else 0.0
  return summary


def format_summary(summary: dict, paper: Sequence[tuple[str, float, float]] = ()) -> str:
  """Markdown: one row per task, the group means, the 19-task mean and the paper's figures."""
  lines = ['| group | task | runs | top-1 (%) |', '|---|---|---|---|']
  for name, task in TASKS.items():
    t = summary['tasks'].get(name)
    cell = f'{t["mean"]:.2f} ± {t["std"]:.2f}' if t else 'missing'
    lines.append(f'| {task.group} | {name} | {t["runs"] if t else 0} | {cell} |')
  for group in GROUPS:
    value = summary['groups'].get(group)
    cell = f'{value:.2f}' if value is not None else 'incomplete'
    lines.append(f'| {group} | **mean** | | {cell} |')
  if summary['complete']:
    lines.append(f'| all | **mean of 19** | | {summary["mean"]:.2f} ± {summary["std"]:.2f} |')
  else:
    missing = [n for n in TASKS if n not in summary['tasks']]
    lines.append(f'| all | **mean of 19** | | incomplete: {len(missing)} tasks missing |')
  for label, acc, std in paper:
    diff = f' (ours {summary["mean"] - acc:+.2f})' if summary['complete'] else ''
    lines.append(f'| paper | {label} | 3 | {acc:.2f} ± {std:.2f}{diff} |')
  return '\n'.join(lines)


def paper_rows(model: str, pretrain: str) -> list[tuple[str, float, float]]:
  """Table 2's VTAB figures for (model, pretraining), as (label, mean, std)."""
  from vit_jax.reproduce import paper

  return [
    (f'{r.source} {r.model} {r.pretrain}', r.accuracy, r.std or 0.0)
    for r in paper.references(model, pretrain, 'vtab')
  ]


# ----------------------------------------------------------------------------------------
# Running the 19 tasks here, or printing their commands.
# ----------------------------------------------------------------------------------------


def run_dir(workdir: str, task: str, seed: int) -> str:
  return os.path.join(workdir, task, f'seed_{seed}')


def task_overrides(task: str, seed: int, dev: bool = False) -> dict:
  """Config changes of one task's run; `dev` trains on train800 and evaluates on val200."""
  overrides = {'dataset': f'vtab/{task}', 'seed': seed}
  if dev:
    overrides.update({'pp.train': 'train800', 'pp.test': 'val200'})
  return overrides


def collect(workdir: str, tasks: Sequence[str], seeds: Sequence[int]) -> dict[str, list[float]]:
  """Test accuracies of the finished runs, by task."""
  from vit_jax.reproduce.sweep import run_result

  out: dict[str, list[float]] = {}
  for task in tasks:
    for seed in seeds:
      result = run_result(run_dir(workdir, task, seed))
      if result is not None:
        out.setdefault(task, []).append(result['accuracy'])
  return out


def run_tasks(
  config,
  workdir: str,
  tasks: Sequence[str],
  seeds: Sequence[int] = (0,),
  dev: bool = False,
  pretrain: str = 'imagenet21k',
  train_fn: Callable | None = None,
  log: Callable[[str], None] = print,
) -> dict:
  """Trains every (task, seed) not finished yet, then writes WORKDIR/vtab.md and vtab.json."""
  from vit_jax.reproduce import sweep
  from vit_jax.train.spec import with_overrides

  train_fn = train_fn or sweep._train_fn()
  specs = [(task, seed) for task in tasks for seed in seeds]
  for i, (task, seed) in enumerate(specs, 1):
    folder = run_dir(workdir, task, seed)
    if sweep.run_result(folder) is not None:
      log(f'[{i}/{len(specs)}] {folder}: finished earlier, kept.')
      continue
    log(f'[{i}/{len(specs)}] {folder}: {task}, seed {seed}.')
    result = train_fn(with_overrides(config, task_overrides(task, seed, dev)), folder)
    if isinstance(result, dict) and result.get('status') == 'preempted':
      log(f'{folder} was preempted: stopping here; run again to resume.')
      break
  return write_report(workdir, seeds, config.get('model_name', ''), pretrain, log=log)


def write_report(
  workdir: str,
  seeds: Sequence[int],
  model: str,
  pretrain: str,
  log: Callable[[str], None] = print,
) -> dict:
  """Per-task and grouped accuracies of the runs in `workdir` (vtab.md, vtab.json)."""

  summary = summarize(collect(workdir, list(TASKS), seeds))
  text = f'VTAB-1k, {model or "model"} ({pretrain}):\n\n' + format_summary(
    summary, paper_rows(model, pretrain)
  )
  files.atomic_write_text(os.path.join(workdir, 'vtab.json'), json.dumps(summary, indent=2) + '\n')
  files.atomic_write_text(os.path.join(workdir, 'vtab.md'), text + '\n')
  log(text)
  return summary


def commands(
  config_arg: str,
  user_overrides: dict,
  workdir: str,
  tasks: Sequence[str],
  seeds: Sequence[int] = (0,),
  dev: bool = False,
) -> list[str]:
  """`python -m vit_jax.main` lines of the (task, seed) runs not finished yet."""
  from vit_jax.reproduce import sweep

  return [
    sweep.command(
      config_arg, user_overrides, task_overrides(task, seed, dev), run_dir(workdir, task, seed)
    )
    for task in tasks
    for seed in seeds
    if sweep.run_result(run_dir(workdir, task, seed)) is None
  ]

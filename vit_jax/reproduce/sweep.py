r"""The paper's fine-tuning protocol (Table 4) as a sweep: learning rate chosen on a dev split.

For a model and a dataset:
  1. dev stage: for every learning rate of the grid (and every dev seed), fine-tune on the
     training split minus a held-out development part (2% of train for CIFAR, 10% for Pets
     and Flowers, 1% for ImageNet) and evaluate on that development part;
  2. selection: the learning rate with the best mean dev accuracy (ties: the first in the
     grid). Only dev runs are read; the test split is never looked at before this point;
  3. final stage: fine-tune again on the *full* training split at the chosen learning rate,
     once per seed, and evaluate on the test split (ImageNet: validation). This is what the
     paper does ("for final results we train on the entire training set"); reusing the dev
     models would have seen less data.
  4. summary: dev accuracy per learning rate, the choice, test top-1 per seed, mean ± std.

  # everything, here, one run after another (resumable: finished runs are skipped):
  python -m vit_jax.reproduce sweep --config=configs/vit.py:b16,cifar10 --workdir=runs/sweep \
      --config.pretrained_dir=checkpoints --seeds=0,1,2
  # the same on a cluster: print the dev commands, then (when they are done) the final ones:
  python -m vit_jax.reproduce sweep ... --stage=dev --print_commands
  python -m vit_jax.reproduce sweep ... --stage=final --print_commands
  python -m vit_jax.reproduce sweep ... --stage=summary

Layout: WORKDIR/dev/lr_<lr>/seed_<s>/ and WORKDIR/final/lr_<lr>/seed_<s>/ are ordinary run
directories (`python -m vit_jax.main` writes them); WORKDIR/sweep.json and summary.md hold
the result.
"""

import dataclasses
import json
import os
import shlex
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ml_collections
import numpy as np

from vit_jax import files, rundir
from vit_jax.train.spec import with_overrides

SWEEP_FILE, SUMMARY_FILE = 'sweep.json', 'summary.md'
STAGES = ('dev', 'final', 'all', 'summary')


@dataclasses.dataclass(frozen=True)
class Protocol:
  """Table 4 for one dataset: dev holdout (% of train), learning-rate grid, splits."""

  dev_percent: int
  lrs: tuple[float, ...]
  train: str = 'train'
  test: str = 'test'


_GRID = (0.001, 0.003, 0.01, 0.03)
PROTOCOLS = {
  'imagenet2012': Protocol(1, (0.003, 0.01, 0.03, 0.06), test='validation'),
  'cifar10': Protocol(2, _GRID),
  'cifar100': Protocol(2, _GRID),
  'oxford_iiit_pet': Protocol(10, _GRID),
  'oxford_flowers102': Protocol(10, _GRID),
  # Not in the paper: the bundled dataset, trained from scratch with Adam (configs/digits.py).
  'digits': Protocol(10, (0.0003, 0.001, 0.003)),
}


@dataclasses.dataclass(frozen=True)
class Sweep:
  """A resolved sweep: the grid, the seeds and the four splits it uses."""

  dataset: str
  lrs: tuple[float, ...]
  seeds: tuple[int, ...]
  dev_seeds: tuple[int, ...]
  fit_split: str  # training split minus the dev part: what dev runs train on
  dev_split: str  # the held-out part: what dev runs evaluate on
  train_split: str  # the full training split: what final runs train on
  test_split: str  # what final runs evaluate on

  def __post_init__(self):
    if not self.lrs:
      raise ValueError('The learning-rate grid is empty; give --lrs=0.01,0.03 (for example).')
    if not self.seeds or not self.dev_seeds:
      raise ValueError('No seeds: give --seeds=0 (final runs) and --dev_seeds=0 (dev runs).')
    if split_bases(self.dev_split) & split_bases(self.test_split):
      raise ValueError(
        f'The dev split {self.dev_split!r} and the test split {self.test_split!r} share data: the '
        'learning rate must be chosen on part of the training split.'
      )


def split_bases(split: str) -> set[str]:
  """tfds split names a split string reads from: 'train[:98%]+validation' -> {train, validation}."""
  return {part.split('[')[0].strip() for part in split.split('+') if part.strip()}


def make_sweep(
  dataset: str,
  lrs: Sequence[float] | None = None,
  seeds: Sequence[int] = (0,),
  dev_seeds: Sequence[int] = (0,),
  dev_percent: int | None = None,
  train_split: str | None = None,
  test_split: str | None = None,
) -> Sweep:
  """The Table 4 sweep of `dataset`; any argument given replaces the paper's value."""
  protocol = PROTOCOLS.get(dataset)
  if protocol is None and (lrs is None or dev_percent is None):
    raise ValueError(
      f'No Table 4 protocol for dataset {dataset!r} (known: {", ".join(PROTOCOLS)}): give '
      '--lrs and --dev_percent.'
    )
  percent = dev_percent if dev_percent is not None else protocol.dev_percent
  if not 0 < percent < 100:
    raise ValueError(f'dev_percent={percent}; expected a percentage of train between 1 and 99.')
  train = train_split or (protocol.train if protocol else 'train')
  if '[' in train or '+' in train:
    raise ValueError(f'train_split={train!r}: expected one whole tfds split name, e.g. "train".')
  return Sweep(
    dataset=dataset,
    lrs=tuple(float(lr) for lr in (lrs if lrs is not None else protocol.lrs)),
    seeds=tuple(int(s) for s in seeds),
    dev_seeds=tuple(int(s) for s in dev_seeds),
    fit_split=f'{train}[:{100 - percent}%]',
    dev_split=f'{train}[{100 - percent}%:]',
    train_split=train,
    test_split=test_split or (protocol.test if protocol else 'test'),
  )


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """One fine-tuning run of the sweep: where it lives and what it changes in the config."""

  stage: str  # 'dev' or 'final'
  lr: float
  seed: int
  workdir: str

  def overrides(self, sweep: Sweep) -> dict[str, Any]:
    train, test = (
      (sweep.fit_split, sweep.dev_split)
      if self.stage == 'dev'
      else (sweep.train_split, sweep.test_split)
    )
    return {'base_lr': self.lr, 'seed': self.seed, 'pp.train': train, 'pp.test': test}


def run_dir(workdir: str, stage: str, lr: float, seed: int) -> str:
  return os.path.join(workdir, stage, f'lr_{lr:g}', f'seed_{seed}')


def dev_runs(sweep: Sweep, workdir: str) -> list[RunSpec]:
  return [
    RunSpec('dev', lr, seed, run_dir(workdir, 'dev', lr, seed))
    for lr in sweep.lrs
    for seed in sweep.dev_seeds
  ]


def final_runs(sweep: Sweep, workdir: str, lr: float) -> list[RunSpec]:
  return [RunSpec('final', lr, seed, run_dir(workdir, 'final', lr, seed)) for seed in sweep.seeds]


# ----------------------------------------------------------------------------------------
# Reading results from run directories.
# ----------------------------------------------------------------------------------------


def run_result(workdir: str) -> dict | None:
  """{'accuracy', 'step', 'total_steps', 'split'} of a finished run, or None if unfinished."""
  if not rundir.is_run(workdir):
    return None
  config = rundir.read_config(workdir)
  total = rundir.total_steps(config)
  last = rundir.last_evaluation(workdir)
  if last is None or total <= 0 or int(last['step']) < total:
    return None
  return {
    'accuracy': float(last['accuracy_test']),
    'step': int(last['step']),
    'total_steps': total,
    'split': config['pp']['test'],
  }


def dev_results(sweep: Sweep, workdir: str) -> dict[float, list[float]]:
  """Dev accuracy of every finished dev run, by learning rate. Reads dev runs only.

  Each run's own config must say it evaluated on the dev split (a guard against a run
  directory that evaluated on test ending up in the selection).
  """
  results: dict[float, list[float]] = {}
  for spec in dev_runs(sweep, workdir):
    result = run_result(spec.workdir)
    if result is None:
      continue
    if result['split'] != sweep.dev_split:
      raise ValueError(
        f'{spec.workdir} evaluated on {result["split"]!r}, not the dev split {sweep.dev_split!r}: '
        'it cannot be used to choose the learning rate.'
      )
    results.setdefault(spec.lr, []).append(result['accuracy'])
  return results


def select_lr(results: Mapping[float, Sequence[float]], lrs: Sequence[float]) -> float:
  """The learning rate with the highest mean dev accuracy; ties go to the first in `lrs`."""
  missing = [lr for lr in lrs if not results.get(lr)]
  if missing:
    raise ValueError(
      f'Dev runs not finished for lr {", ".join(f"{lr:g}" for lr in missing)}: run --stage=dev '
      'first (or wait for the cluster jobs).'
    )
  means = [float(np.mean(results[lr])) for lr in lrs]
  return lrs[int(np.argmax(means))]


def summarize(sweep: Sweep, workdir: str, model: str = '') -> dict:
  """What the sweep has so far: dev accuracies, the choice, the final test accuracies."""
  dev = dev_results(sweep, workdir)
  summary: dict[str, Any] = {
    'model': model,
    'dataset': sweep.dataset,
    'splits': {
      'fit': sweep.fit_split,
      'dev': sweep.dev_split,
      'train': sweep.train_split,
      'test': sweep.test_split,
    },
    'final_training': 'retrained on the full training split at the selected learning rate',
    'dev': {f'{lr:g}': dev.get(lr, []) for lr in sweep.lrs},
    'selected_lr': None,
    'test': {},
    'test_mean': None,
    'test_std': None,
  }
  if all(dev.get(lr) for lr in sweep.lrs):
    lr = select_lr(dev, sweep.lrs)
    summary['selected_lr'] = lr
    for spec in final_runs(sweep, workdir, lr):
      result = run_result(spec.workdir)
      if result is not None:
        summary['test'][str(spec.seed)] = result['accuracy']
    values = list(summary['test'].values())
    if len(values) == len(sweep.seeds):
      summary['test_mean'] = float(np.mean(values))
      summary['test_std'] = statistics.stdev(values) if len(values) > 1 else 0.0
  return summary


def format_summary(summary: dict) -> str:
  """Markdown: one row per learning rate (dev accuracy, the choice), then the test result."""
  s = summary['splits']
  lines = [
    f'Sweep: {summary["model"] or "model"} on {summary["dataset"]}. LR chosen on {s["dev"]} '
    f'(trained on {s["fit"]}); final runs trained on {s["train"]}, evaluated on {s["test"]}.',
    '',
    '| lr | dev runs | dev top-1 (%) | selected |',
    '|---|---|---|---|',
  ]
  selected = summary['selected_lr']
  for lr, values in summary['dev'].items():
    mean = f'{100 * np.mean(values):.2f}' if values else 'not finished'
    mark = 'yes' if selected is not None and f'{selected:g}' == lr else ''
    lines.append(f'| {lr} | {len(values)} | {mean} | {mark} |')
  lines.append('')
  if selected is None:
    lines.append('Selected learning rate: none yet (dev runs not finished).')
    return '\n'.join(lines)
  lines.append(f'Selected learning rate: {selected:g} (best mean dev accuracy).')
  seeds = ', '.join(f'seed {k}: {100 * v:.2f}' for k, v in summary['test'].items())
  if summary['test_mean'] is not None:
    lines.append(
      f'Test top-1 at lr {selected:g}: {100 * summary["test_mean"]:.2f} ± '
      f'{100 * summary["test_std"]:.2f} % over {len(summary["test"])} seed(s) ({seeds}).'
    )
  else:
    lines.append(f'Test top-1 at lr {selected:g}: final runs not finished ({seeds or "none yet"}).')
  return '\n'.join(lines)


def write_summary(summary: dict, workdir: str) -> str:
  """WORKDIR/sweep.json and WORKDIR/summary.md; returns the markdown."""
  text = format_summary(summary)
  files.atomic_write_text(os.path.join(workdir, SWEEP_FILE), json.dumps(summary, indent=2) + '\n')
  files.atomic_write_text(os.path.join(workdir, SUMMARY_FILE), text + '\n')
  return text


# ----------------------------------------------------------------------------------------
# Running here, or printing the commands for a cluster.
# ----------------------------------------------------------------------------------------


def command(
  config_arg: str,
  user_overrides: Mapping[str, Any],
  spec_overrides: Mapping[str, Any],
  workdir: str,
) -> str:
  """The `python -m vit_jax.main` line of one run (the sweep's settings win over the user's)."""
  args = ['python', '-m', 'vit_jax.main', f'--config={config_arg}', f'--workdir={workdir}']
  for key, value in {**user_overrides, **spec_overrides}.items():
    args.append(f'--config.{key}={value}')
  return ' '.join(shlex.quote(a) for a in args)


TrainFn = Callable[[ml_collections.ConfigDict, str], Any]


def _train_fn() -> TrainFn:
  from vit_jax.train import train_and_evaluate

  return train_and_evaluate


def run_specs(
  config: ml_collections.ConfigDict,
  sweep: Sweep,
  specs: Sequence[RunSpec],
  train_fn: TrainFn | None = None,
  log: Callable[[str], None] = print,
) -> bool:
  """Trains every run not finished yet, one after another (an unfinished one resumes).

  Returns False when a run was preempted (SIGTERM): the sweep stops there; rerun to resume.
  """
  train_fn = train_fn or _train_fn()
  for i, spec in enumerate(specs, 1):
    if run_result(spec.workdir) is not None:
      log(f'[{i}/{len(specs)}] {spec.workdir}: finished earlier, kept.')
      continue
    log(f'[{i}/{len(specs)}] {spec.workdir}: {spec.stage} run, lr {spec.lr:g}, seed {spec.seed}.')
    result = train_fn(with_overrides(config, spec.overrides(sweep)), spec.workdir)
    if isinstance(result, dict) and result.get('status') == 'preempted':
      log(f'{spec.workdir} was preempted: the sweep stops here; run it again to resume.')
      return False
  return True


def run(
  config: ml_collections.ConfigDict,
  sweep: Sweep,
  workdir: str,
  stage: str = 'all',
  train_fn: TrainFn | None = None,
  log: Callable[[str], None] = print,
) -> dict:
  """Runs `stage` of the sweep here and writes the summary; returns it."""
  if stage not in STAGES:
    raise ValueError(f'stage={stage!r}; expected one of {STAGES}.')
  finished = True
  if stage in ('dev', 'all'):
    finished = run_specs(config, sweep, dev_runs(sweep, workdir), train_fn, log)
  if stage in ('final', 'all') and finished:
    lr = select_lr(dev_results(sweep, workdir), sweep.lrs)
    log(f'Selected lr {lr:g} on the dev split {sweep.dev_split}.')
    run_specs(config, sweep, final_runs(sweep, workdir, lr), train_fn, log)
  summary = summarize(sweep, workdir, config.get('model_name', ''))
  log(write_summary(summary, workdir))
  return summary


def commands(
  config_arg: str,
  user_overrides: Mapping[str, Any],
  sweep: Sweep,
  workdir: str,
  stage: str,
) -> list[str]:
  """The command lines of a stage, for a cluster; finished runs are left out.

  'final' needs the dev runs finished (it selects the learning rate from them).
  """
  if stage not in ('dev', 'final'):
    raise ValueError(
      f'Commands are printed per stage: --stage=dev or --stage=final, not {stage!r}.'
    )
  if stage == 'dev':
    specs = dev_runs(sweep, workdir)
  else:
    specs = final_runs(sweep, workdir, select_lr(dev_results(sweep, workdir), sweep.lrs))
  return [
    command(config_arg, user_overrides, spec.overrides(sweep), spec.workdir)
    for spec in specs
    if run_result(spec.workdir) is None
  ]

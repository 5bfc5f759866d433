r"""VTAB-1k: running the 19 tasks of the Visual Task Adaptation Benchmark, and their report.

The tasks (dataset, label, splits) are `vit_jax.data.vtab.TASKS`; a task is read as the
dataset `vtab/<task>`, e.g. `vtab/clevr_count`:

  python -m vit_jax.main --config=configs/vtab.py:b16,clevr_count --workdir=runs/vtab/clevr_count \
      --config.pretrained_dir=checkpoints

The paper's protocol (Table 4): 2500 steps at learning rate 0.01 for every task, trained on
train800val200 and evaluated on test; three runs give mean ± std. This module runs all 19
(`python -m vit_jax.reproduce vtab`), prints the commands for a cluster, and reports
per-task accuracy and the means of the natural, specialized and structured groups.
"""

import json
import os
import statistics
from collections.abc import Callable, Sequence

import numpy as np

from vit_jax import files
from vit_jax.data.vtab import GROUPS, TASKS


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

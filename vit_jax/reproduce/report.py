r"""Measured accuracies beside the paper's: markdown, CSV and a bar chart from run directories.

  python -m vit_jax.reproduce report runs/ [more dirs...] [--out=reports/ours] [--csv]

Every directory under the given paths that holds a run (`config.json` and `metrics.jsonl`)
is read: the model, the dataset, the pretraining checkpoint, the fine-tuning dropout, crop
and Polyak decay, and the last evaluation: `accuracy_test` (the Polyak average's,
`polyak/accuracy_test`, when the run kept one), ImageNet ReaL (`accuracy_real`) when the run
measured it, and the last few-shot accuracies (`fewshot/<dataset>/<n>shot`). Runs of the
same (model, pretraining, dataset, dropout) are one row: mean ± std over the runs (seeds).
Each row is printed beside every published number that applies (paper Tables 2, 5 and 8,
the original README's table; `vit_jax.reproduce.paper`), with the difference; a row whose
crop or Polyak averaging differs from the published setting (Table 2's ImageNet cells: 512
or 518 px and Polyak 0.9999) says so in its note. VTAB-1k runs (`vtab/<task>` datasets) are
averaged over the 19 tasks and compared with Table 2's VTAB column. Few-shot rows name the
data the features were trained on: the run's dataset for a run from scratch, else
`<pretraining>+<dataset>`.

Runs evaluated on a development split (part of the training data, e.g. the learning-rate
sweep's dev runs, or VTAB's val200) are never reported as test accuracy: they are counted
and listed apart.
"""

import csv
import dataclasses
import io
import os
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from etils import epath

from vit_jax import files, rundir
from vit_jax.reproduce import paper, sweep, vtab


@dataclasses.dataclass(frozen=True)
class Run:
  """What the report needs from one run directory."""

  path: str
  model: str
  dataset: str
  pretrain: str
  dropout: float
  # %, the last evaluation (the Polyak average's, if the run kept one); None for a run that
  # measured zero-shot accuracy alone (an image-text model's, `vit_jax.zeroshot --out`)
  accuracy: float | None
  step: int
  total_steps: int
  eval_split: str
  train_split: str
  crop: int
  seed: int
  base_lr: float
  polyak: float = 0.0  # the Polyak averaging decay (0: none)
  # Further measurements, %: 'imagenet2012_real', 'fewshot/<dataset>/<n>shot',
  # 'zeroshot/<dataset>'.
  extra: Mapping[str, float] = dataclasses.field(default_factory=dict)

  @property
  def complete(self) -> bool:
    return self.total_steps > 0 and self.step >= self.total_steps

  @property
  def is_dev(self) -> bool:
    """True when the evaluation split is part of the training data (a development split)."""
    if self.dataset.startswith('vtab/'):
      task = vtab.TASKS.get(self.dataset.split('/', 1)[1])
      return not (self.eval_split == 'test' or (task and self.eval_split == task.test))
    return bool(sweep.split_bases(self.eval_split) & sweep.split_bases(self.train_split))


def infer_pretrain(config: dict) -> str:
  """Which upstream data the fine-tuned checkpoint saw, from its path (or 'unknown').

  Files named like the original release (`ViT-B_16.npz`, `R50+ViT-B_16.npz`) with nothing else
  in their path are the `imagenet21k` checkpoints, the training code's default download.
  """
  resolved = rundir.resolved(config).get('pretrained_path')
  path = resolved or config.get('pretrained_path') or ''
  if not path and config.get('pretrained_dir'):
    path = os.path.join(config['pretrained_dir'], f'{config.get("model_name", "")}.npz')
  if config.get('model_or_filename'):
    return 'augreg'
  if not path:
    return 'scratch'
  lower = path.lower()
  if 'augreg' in lower:
    return 'augreg'
  if 'imagenet21k+imagenet2012' in lower or 'i21k+i1k' in lower:
    return 'imagenet21k+imagenet2012'
  if 'jft' in lower:
    return 'jft300m'
  if 'imagenet21k' in lower or 'i21k' in lower:
    return 'imagenet21k'
  if re.search(r'imagenet2012|imagenet1k|i1k|ilsvrc', lower):
    return 'imagenet2012'
  if os.path.basename(path).startswith('LiT-'):  # the released LiT files' names
    return paper.LIT_PRETRAIN
  if os.path.basename(path).removesuffix('.npz') == config.get('model_name'):
    return 'imagenet21k'
  return 'unknown'


def _measured(
  evaluation: Mapping, metrics: Sequence[Mapping], polyak: float
) -> tuple[float | None, dict[str, float]]:
  """(test accuracy, further measurements) in %, from the last evaluation, few-shot and
  zero-shot lines; the Polyak average's numbers where the run kept one."""
  prefix = 'polyak/' if polyak and 'polyak/accuracy_test' in evaluation else ''
  extra = {}
  if prefix + 'accuracy_real' in evaluation:
    extra['imagenet2012_real'] = 100 * float(evaluation[prefix + 'accuracy_real'])
  for kind in ('fewshot/', 'zeroshot/'):
    lines = [m for m in metrics if any(k.startswith(kind) for k in m)]
    for key, value in (lines[-1] if lines else {}).items():
      if key.startswith(kind) and '/l2_' not in key:
        extra[key] = 100 * float(value)
  if prefix + 'accuracy_test' not in evaluation:
    return None, extra
  return 100 * float(evaluation[prefix + 'accuracy_test']), extra


def read_run(path: str, pretrain: str | None = None) -> Run | None:
  """The run in `path`, or None when it has no evaluation yet."""
  config = rundir.read_config(path)
  metrics = rundir.read_metrics(path)
  evaluations = [m for m in metrics if 'accuracy_test' in m]
  evaluations = evaluations or [m for m in metrics if any(k.startswith('zeroshot/') for k in m)]
  if not evaluations:
    return None
  evaluation = evaluations[-1]
  model_config = config.get('model') or {}
  pp = config.get('pp') or {}
  polyak = float(config.get('polyak_decay') or 0.0)
  accuracy, extra = _measured(evaluation, metrics, polyak)
  return Run(
    path=path,
    model=config.get('model_name') or '?',
    dataset=config.get('dataset', '?'),
    pretrain=pretrain or infer_pretrain(config),
    dropout=float((model_config.get('transformer') or {}).get('dropout_rate', 0.0)),
    accuracy=accuracy,
    step=int(evaluation['step']),
    total_steps=rundir.total_steps(config),
    eval_split=str(pp.get('test', 'test')),
    train_split=str(pp.get('train', 'train')),
    crop=int(pp.get('crop', 0)),
    seed=int(config.get('seed', 0)),
    base_lr=float(config.get('base_lr', 0.0)),
    polyak=polyak,
    extra=extra,
  )


def find_runs(paths: Iterable[str]) -> list[str]:
  """Every directory under `paths` (or a path itself) that holds config.json and metrics.jsonl."""
  found = []
  for root in paths:
    top = files.path(root)
    if not top.is_dir():
      raise ValueError(
        f'{root!r} is not a directory; pass run directories or folders holding them.'
      )
    found += _runs_under(top)
  return sorted(found)


def _runs_under(folder: epath.Path) -> list[str]:
  """`folder` and the folders below it that are runs (checkpoint folders are not entered)."""
  found = [os.fspath(folder)] if rundir.is_run(folder) else []
  for child in sorted(folder.iterdir(), key=lambda c: c.name):
    if child.name != rundir.CHECKPOINT_DIR and child.is_dir():
      found += _runs_under(child)
  return found


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
  return float(np.mean(values)), (statistics.stdev(values) if len(values) > 1 else 0.0)


@dataclasses.dataclass
class Row:
  """One measured group beside one published number (or none)."""

  model: str
  pretrain: str
  dataset: str
  dropout: float
  runs: int
  ours: float
  ours_std: float | None  # None for a single run
  source: str = ''
  paper: float | None = None
  paper_std: float | None = None
  note: str = ''

  @property
  def diff(self) -> float | None:
    return None if self.paper is None else self.ours - self.paper


def _left_out(runs: Sequence[Run]) -> tuple[list[Run], list[str]]:
  """The runs a table reports (test-split evaluations), and notes on the others."""
  notes = []
  dev = [r for r in runs if r.is_dev]
  if dev:
    notes.append(
      f'{len(dev)} run(s) evaluated on a development split (part of the training data) '
      'are not test results and are left out: ' + ', '.join(sorted(r.path for r in dev))
    )
  test_runs = [r for r in runs if not r.is_dev]
  incomplete = [r for r in test_runs if not r.complete]
  if incomplete:
    notes.append(
      'Not finished (their last evaluation is used): '
      + ', '.join(f'{r.path} (step {r.step}/{r.total_steps})' for r in incomplete)
    )
  return test_runs, notes


def _setting(crops: Sequence[int], polyak: float) -> str:
  return f'{"/".join(map(str, sorted(set(crops))))} px' + (f', Polyak {polyak:g}' if polyak else '')


def _unlike(ref: paper.Reference, crops: Sequence[int], polyak: float) -> bool:
  """Whether runs at `crops` with Polyak decay `polyak` differ from the reference's setting."""
  other_crop = ref.crop is not None and set(crops) != {ref.crop}
  return other_crop or abs(polyak - ref.polyak) > 1e-12


def _beside_the_paper(
  base: dict, refs: Sequence[paper.Reference], note: str, paper_note: bool, setting=None
) -> list[Row]:
  """One row per paper reference of `base` (the note adds the reference's own with
  `paper_note`, and says when the runs' `setting`, (crops, polyak), is not the reference's),
  or one row without the paper when it has none."""
  if not refs:
    return [Row(**base, note=note)]
  rows = []
  for ref in refs:
    both = f'ours {note}' + (f'; paper {ref.note}' if ref.note else '') if paper_note else note
    if setting is not None and _unlike(ref, *setting):
      both = f'not like for like: {both}'
    rows.append(Row(**base, source=ref.source, paper=ref.accuracy, paper_std=ref.std, note=both))
  return rows


def _measurements(run: Run) -> dict[tuple[str, str], float]:
  """{(pretraining data, dataset key): %} of one run: its test accuracy, and the extra ones
  (few-shot features, and zero-shot accuracy after training steps, come from the run's own
  training, on top of its pretraining)."""
  out = {(run.pretrain, run.dataset): run.accuracy} if run.accuracy is not None else {}
  for key, value in run.extra.items():
    upstream = run.pretrain
    # Zero-shot accuracy of a released model evaluated alone (no training steps) is its own.
    trained = key.startswith('fewshot/') or (key.startswith('zeroshot/') and run.total_steps)
    if trained:
      scratch = run.pretrain == 'scratch'
      upstream = run.dataset if scratch else f'{run.pretrain}+{run.dataset}'
    out[upstream, key] = value
  return out


def _dataset_rows(runs: Sequence[Run]) -> list[Row]:
  """Runs of one (model, pretraining, dataset, dropout) averaged, beside the paper's."""
  groups: dict[tuple, list[tuple[Run, float]]] = {}
  for r in runs:
    for (pretrain, dataset), value in _measurements(r).items():
      groups.setdefault((r.model, pretrain, dataset, r.dropout), []).append((r, value))
  rows = []
  for (model, pretrain, dataset, dropout), members in sorted(groups.items()):
    mean, std = _mean_std([value for _, value in members])
    base = dict(
      model=model,
      pretrain=pretrain,
      dataset=dataset,
      dropout=dropout,
      runs=len(members),
      ours=mean,
      ours_std=std if len(members) > 1 else None,  # one run has no spread
    )
    crops = [m.crop for m, _ in members]
    polyak = max(m.polyak for m, _ in members)
    note = _setting(crops, polyak)
    if len({m.polyak for m, _ in members}) > 1:
      note += ' (some runs without)'
    refs = paper.references(model, pretrain, dataset, dropout)
    rows += _beside_the_paper(base, refs, note, paper_note=True, setting=(crops, polyak))
  return rows


def _vtab_rows(runs: Sequence[Run], notes: list[str]) -> list[Row]:
  """The mean of the 19 VTAB tasks per (model, pretraining, dropout), when all 19 ran."""
  groups: dict[tuple, dict[str, list[float]]] = {}
  for r in runs:
    task = r.dataset.split('/', 1)[1]
    groups.setdefault((r.model, r.pretrain, r.dropout), {}).setdefault(task, []).append(
      r.accuracy / 100
    )
  rows = []
  for (model, pretrain, dropout), accuracies in sorted(groups.items()):
    summary = vtab.summarize(accuracies)
    if not summary['complete']:
      notes.append(
        f'VTAB {model} ({pretrain}): {len(summary["tasks"])}/19 tasks; the mean needs all 19.'
      )
      continue
    runs_per_task = min(t['runs'] for t in summary['tasks'].values())
    base = dict(
      model=model,
      pretrain=pretrain,
      dataset='vtab',
      dropout=dropout,
      runs=runs_per_task,
      ours=summary['mean'],
      ours_std=summary['std'] if runs_per_task > 1 else None,
    )
    refs = paper.references(model, pretrain, 'vtab')
    rows += _beside_the_paper(base, refs, 'mean of 19 tasks', paper_note=False)
  return rows


def build_rows(runs: Sequence[Run]) -> tuple[list[Row], list[str]]:
  """Rows for the test-split runs; and notes on what was left out (dev runs, incomplete runs)."""
  test_runs, notes = _left_out(runs)
  vtab_runs = [r for r in test_runs if r.dataset.startswith('vtab/')]
  others = [r for r in test_runs if not r.dataset.startswith('vtab/')]
  return _dataset_rows(others) + _vtab_rows(vtab_runs, notes), notes


def _pm(mean: float | None, std: float | None) -> str:
  if mean is None:
    return '-'
  return f'{mean:.2f}' if std is None else f'{mean:.2f} ± {std:.2f}'


def format_markdown(rows: Sequence[Row]) -> str:
  """The table: model, pretraining, dataset, dropout, runs, ours, source, paper, difference."""
  lines = [
    '| model | pretrain | dataset | dropout | runs | ours (%) | source | paper (%) | diff | note |',
    '|---|---|---|---|---|---|---|---|---|---|',
  ]
  for r in rows:
    title = paper.title(r.dataset)
    diff = '-' if r.diff is None else f'{r.diff:+.2f}'
    lines.append(
      f'| {r.model} | {r.pretrain} | {title} | {r.dropout:g} | {r.runs} | '
      f'{_pm(r.ours, r.ours_std)} | {r.source or "-"} | {_pm(r.paper, r.paper_std)} | {diff} | '
      f'{r.note} |'
    )
  return '\n'.join(lines)


CSV_FIELDS = (
  'model',
  'pretrain',
  'dataset',
  'dropout',
  'runs',
  'ours',
  'ours_std',
  'source',
  'paper',
  'paper_std',
  'diff',
  'note',
)


def _csv_value(value):
  if value is None:
    return ''
  return round(value, 4) if isinstance(value, float) else value


def format_csv(rows: Sequence[Row]) -> str:
  """The same rows as CSV: numbers to 4 decimals, empty where there is none."""
  buffer = io.StringIO()
  writer = csv.writer(buffer, lineterminator='\n')
  writer.writerow(CSV_FIELDS)
  for r in rows:
    values = dataclasses.asdict(r) | {'diff': r.diff}
    writer.writerow([_csv_value(values[k]) for k in CSV_FIELDS])
  return buffer.getvalue()


def plot(rows: Sequence[Row], path: str) -> str | None:
  """A PNG bar chart, ours (with std) against the paper, one pair of bars per compared row."""
  compared = [r for r in rows if r.paper is not None]
  if not compared:
    return None
  from matplotlib.figure import Figure  # not pyplot: the caller's backend stays as it is

  labels = [f'{r.model}\n{paper.title(r.dataset)}\n{r.pretrain}\n{r.source}' for r in compared]
  x = np.arange(len(compared))
  fig = Figure(figsize=(max(6.0, 1.6 * len(compared) + 2), 5.5))
  ax = fig.subplots()
  for offset, label, color in ((-0.2, 'ours', 'tab:blue'), (0.2, 'paper', 'tab:gray')):
    values = [getattr(r, label) for r in compared]
    stds = [getattr(r, f'{label}_std') or 0 for r in compared]
    ax.bar(x + offset, values, 0.4, yerr=stds, label=label, color=color, capsize=3)
  for i, r in enumerate(compared):
    ax.annotate(
      f'{r.diff:+.2f}', (x[i], max(r.ours, r.paper)), ha='center', va='bottom', fontsize=8
    )
  low = min(min(r.ours, r.paper) for r in compared)
  ax.set_ylim(max(0.0, low - 5), 100.5)
  ax.set_xticks(x, labels, fontsize=7)
  ax.set_ylabel('top-1 accuracy (%)')
  ax.set_title('Fine-tuning accuracy: ours vs the paper')
  ax.legend()
  ax.grid(axis='y', alpha=0.3)
  fig.tight_layout()
  buffer = io.BytesIO()
  fig.savefig(buffer, format='png', dpi=100)
  files.atomic_write(path, lambda f: f.write(buffer.getvalue()))
  return path


def report(
  paths: Sequence[str], out: str = '', pretrain: str | None = None
) -> tuple[list[Row], list[str], str]:
  """Reads the runs under `paths`: rows, notes and the markdown; writes OUT.{md,csv,png}."""
  runs = [r for r in (read_run(p, pretrain) for p in find_runs(paths)) if r is not None]
  if not runs:
    raise ValueError(
      f'No evaluated runs under {", ".join(paths)}: expected directories with config.json and a '
      'metrics.jsonl holding accuracy_test.'
    )
  rows, notes = build_rows(runs)
  text = format_markdown(rows)
  if notes:
    text += '\n\n' + '\n'.join(f'- {n}' for n in notes)
  if out:
    files.atomic_write_text(out + '.md', text + '\n')
    files.atomic_write_text(out + '.csv', format_csv(rows))
    plot(rows, out + '.png')
  return rows, notes, text
